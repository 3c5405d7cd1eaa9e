//! Deep agents in Rust.
//!
//! Build an [`Agent`] from a model, tools and middleware, then [`invoke`](Agent::invoke) it for
//! the final answer or [`stream`](Agent::stream) it for [events](deepagents_core::event) as they
//! happen.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use deepagents::{Agent, models};
//!
//! let model = models::from_spec("scripted:examples/scripts/plan.json")?;
//! let agent = Agent::builder(model).todos(true).build()?;
//! let output = agent.invoke("Plan the release").await?;
//! println!("{}", output.text);
//! # Ok(()) }
//! ```
//!
//! The run itself is [`Run`](deepagents_core::Run), plain serializable data; this crate's driver
//! performs the model calls and tool executions it asks for. See `docs/ARCHITECTURE.md`.

mod agent;
mod driver;
mod error;
mod events;
pub mod middleware;
mod registry;
mod stream;

pub use agent::{Agent, AgentBuilder, BuildError, DEFAULT_MAX_TURNS, RunOptions, RunOutput};
pub use error::{RunError, RunFailure};
pub use events::EventSink;
pub use stream::RunStream;

/// The core types, re-exported.
pub use deepagents_core as core;
pub use deepagents_core::{
    AgentState, ContentBlock, DynTool, DynamicTool, Event, EventKind, Message, Model, ModelError,
    ModelRequest, ModelResponse, Reducer, Run, RuntimeContext, StateUpdate, Todo, TodoStatus, Tool,
    ToolCall, ToolContext, ToolError, ToolOutput, ToolResult, ToolStatus, Usage,
};
/// Model implementations and the spec resolver, re-exported.
pub use deepagents_models as models;
