//! Tests of the model implementations and the spec resolver.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod scripted;
mod spec;

#[cfg(feature = "providers")]
mod aimock;
#[cfg(feature = "providers")]
mod common;
#[cfg(feature = "providers")]
mod hostile;
#[cfg(feature = "providers")]
mod llmock;
#[cfg(feature = "providers")]
mod media;
#[cfg(feature = "providers")]
mod mock_servers;
#[cfg(feature = "providers")]
mod network;
#[cfg(feature = "providers")]
mod reasoning;
#[cfg(feature = "providers")]
mod stops;
#[cfg(feature = "providers")]
mod wire;
