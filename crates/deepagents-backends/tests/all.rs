//! Tests of the backends: one conformance suite for all, then each backend's own behaviour.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod checkpoints;
mod conformance;
mod escape;
mod filesystem;
mod memory_backends;
mod mime;
mod paths;
mod permissions;
mod postgres;
mod protected;
mod repo;
mod shell;
mod text;
