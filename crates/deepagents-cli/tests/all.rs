//! End-to-end tests of the `deepagents` binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod backends;
mod providers;
mod run;
mod subagents;

/// The binary, with no model chosen by the environment.
pub fn bin() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_deepagents"));
    command.env_remove("DEEPAGENTS_MODEL");
    command
}
