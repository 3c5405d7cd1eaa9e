//! Tests of the core types: serde round trips, merge rules, the run state machine.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod run;
mod serde_shapes;
mod state;
