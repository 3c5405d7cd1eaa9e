//! Integration tests of the agent loop, driven by the scripted model.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

mod approval;
mod background;
mod builder;
mod cancellation;
mod context;
mod errors;
mod events;
mod fs_tools;
mod middleware;
mod middleware_capture;
mod prompts;
#[cfg(feature = "remote")]
mod remote;
mod rewind;
mod run_context;
mod skill_tools;
mod spend;
mod state_merge;
mod structured;
mod subagents;
mod summarization;
mod threads;
mod tools;
