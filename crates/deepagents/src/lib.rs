//! Deep agents in Rust.
//!
//! Build an [`Agent`] from a model, tools and middleware, then [`invoke`](Agent::invoke) it for
//! the final answer or [`stream`](Agent::stream) it for [events](deepagents_core::event) as they
//! happen.
//!
//! ```
//! use std::sync::Arc;
//!
//! use deepagents::Agent;
//! use deepagents::models::ScriptedModel;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Any `Arc<dyn Model>` works; `models::from_spec("provider:model")` resolves a spec string.
//! let model = ScriptedModel::from_json(r#"{"turns": [
//!     {"tool_calls": [{"name": "write_todos",
//!                      "args": {"todos": [{"content": "Say hello", "status": "in_progress"}]}}]},
//!     {"text": "Hello!"}
//! ]}"#)?;
//! let agent = Agent::builder(Arc::new(model)).todos(true).build()?;
//! let output = agent.invoke("Greet me").await?;
//! assert_eq!(output.text, "Hello!");
//! assert_eq!(output.run.state.todos.len(), 1);
//! # Ok(()) }
//! ```
//!
//! The run itself is [`Run`], plain serializable data; this crate's driver
//! performs the model calls and tool executions it asks for. See `docs/ARCHITECTURE.md`.

mod agent;
pub mod approval;
mod background;
mod builder;
mod calls;
mod config;
pub mod context;
mod driver;
mod error;
pub mod frontmatter;
mod journal;
pub mod middleware;
mod registry;
pub mod rewind;
mod run;
mod stream;
pub mod subagents;
mod thread;
mod tools;

pub use agent::Agent;
pub use approval::{
    Decision, DecisionKind, InterruptConfig, PendingAction, check_pause, decide, decide_pause,
    pause_id, pending_actions,
};
pub use background::Completion;
pub use builder::{
    AgentBuilder, BuildError, DEFAULT_MAX_TURNS, MEMORIES_NAMESPACE, MEMORIES_PREFIX,
    RESERVED_KEY_PREFIX,
};
pub use error::{RunError, RunFailure};
pub use journal::{open_thread, open_thread_waiting, reload};
pub use run::{DEFAULT_CANCEL_GRACE, RunOptions, RunOutput, RunStatus};
pub use stream::RunStream;
pub use subagents::{InvalidSubAgentMode, SubAgent, SubAgentMode};
pub use thread::{Input, OpenThread, Thread, ThreadError};
pub use tools::ask_user::ASK_USER;
#[cfg(feature = "remote")]
pub use tools::web_fetch::WEB_FETCH;

/// The backends (where files live), re-exported.
pub use deepagents_backends as backends;
/// The core types, re-exported.
pub use deepagents_core as core;
pub use deepagents_core::{
    AgentState, CheckpointError, Checkpointer, Checkpointing, ContentBlock, DynTool, DynamicTool,
    Event, EventKind, EventSink, Extensions, InMemoryCheckpointer, Message, Model, ModelError,
    ModelRequest, ModelResponse, Reducer, Run, RunContext, RunLimits, RuntimeContext, StateKey,
    StateUpdate, Todo, TodoStatus, Tool, ToolCall, ToolContext, ToolError, ToolOutput, ToolResult,
    ToolSource, ToolSourceError, ToolStatus, Usage, validate_thread_id,
};
/// MCP servers' tools (the `mcp` feature).
#[cfg(feature = "mcp")]
pub use deepagents_mcp as mcp;
/// Model implementations and the spec resolver, re-exported.
pub use deepagents_models as models;

/// Compiles the README's Rust examples as doctests so they cannot rot.
#[doc = include_str!("../../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

/// The user guide's pages, compiled the same way: their Rust blocks must build, and every
/// other block must name its language so that rustdoc leaves it alone. Each page in `docs/`
/// is listed here (`deepagents-cli`'s `tests/docs.rs` checks that none is missing).
#[cfg(doctest)]
mod guide_doctests {
    #[doc = include_str!("../../../docs/terminal.md")]
    pub struct Terminal;
    #[doc = include_str!("../../../docs/headless.md")]
    pub struct Headless;
    #[doc = include_str!("../../../docs/configuration.md")]
    pub struct Configuration;
    #[doc = include_str!("../../../docs/providers.md")]
    pub struct Providers;
    #[doc = include_str!("../../../docs/backends.md")]
    pub struct Backends;
    #[doc = include_str!("../../../docs/sandbox.md")]
    pub struct Sandbox;
    #[doc = include_str!("../../../docs/mcp-and-hooks.md")]
    pub struct McpAndHooks;
    #[doc = include_str!("../../../docs/server.md")]
    pub struct Server;
    #[doc = include_str!("../../../docs/python.md")]
    pub struct Python;
    #[doc = include_str!("../../../docs/library.md")]
    pub struct Library;
    #[doc = include_str!("../../../docs/defaults.md")]
    pub struct Defaults;
    #[doc = include_str!("../../../docs/benchmarks.md")]
    pub struct Benchmarks;
    #[doc = include_str!("../../../docs/testing.md")]
    pub struct Testing;
    #[doc = include_str!("../../../docs/PROTOCOL.md")]
    pub struct Protocol;
    #[doc = include_str!("../../../docs/ARCHITECTURE.md")]
    pub struct Architecture;
}
