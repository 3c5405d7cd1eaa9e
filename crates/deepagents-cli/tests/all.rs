//! End-to-end tests of the `deepagents` binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

#[cfg(feature = "acp")]
mod acp;
mod backends;
mod chat_page;
mod completions;
mod config;
mod docs;
mod escape;
mod protocol_v2;
mod providers;
mod repo;
mod rewind;
mod run;
mod server;
mod signals;
mod stub;
mod subagents;
mod threads;
mod tui;
mod web_clients;

/// The binary, with no model chosen by the environment and its data (the long-term memory
/// store) in a scratch directory rather than the user's.
pub fn bin() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_deepagents"));
    command.env_remove("DEEPAGENTS_MODEL");
    command.env_remove("DEEPAGENTS_CONFIG");
    // Traces only where a test asks for them.
    for name in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ] {
        command.env_remove(name);
    }
    command.env(
        "DEEPAGENTS_DATA_DIR",
        std::env::temp_dir().join("deepagents-cli-tests"),
    );
    command
}
