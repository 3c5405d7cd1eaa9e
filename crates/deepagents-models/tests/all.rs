//! Tests of the model implementations and the spec resolver.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod scripted;
mod spec;
