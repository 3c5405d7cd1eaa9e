//! The core of deepagents: plain data and traits, no IO.
//!
//! Everything a run is made of lives here — [messages](message), [content blocks](content),
//! [tools](tool), the [model interface](model), the [agent state](state) with its merge rules,
//! the [run state machine](run) and the [events](event) a run emits. The harness crate
//! (`deepagents`) drives a [`Run`](run::Run) by doing the IO this crate only describes.

pub mod checkpoint;
pub mod content;
pub mod event;
pub mod interrupt;
pub mod message;
pub mod model;
pub mod pause;
pub mod run;
pub mod run_context;
pub mod spend;
pub mod state;
pub mod tool;

pub use checkpoint::{
    CHECKPOINT_SCHEMA, CheckpointError, CheckpointInfo, Checkpointer, Checkpointing, ControlDelta,
    InMemoryCheckpointer, LocalLeases, RunDelta, ThreadInfo, ThreadLease, upgrade_legacy_control,
    validate_thread_id,
};
pub use content::ContentBlock;
pub use event::{AgentPath, Event, EventKind, EventSink};
pub use message::{
    AssistantMessage, Message, Messages, MessagesVersion, ToolCall, ToolResult, ToolStatus, Usage,
};
pub use model::{
    Model, ModelError, ModelProfile, ModelRequest, ModelResponse, ModelSettings, ModelStream,
    StopReason, StreamEvent,
};
pub use pause::{DecisionError, Gate, GateRule};
pub use run::{Control, NextAction, PausedRun, Run, TurnLimitReached};
pub use run_context::{Extensions, RunContext, RunLimits};
pub use spend::{Budget, PriceBook, Prices, SpendCapReached, SpendLimits, Spent};
pub use state::{
    AgentState, FileContent, FileData, Reducer, StateError, StateKey, StateSchema, StateUpdate,
    Todo, TodoStatus,
};
pub use tool::{
    Answer, DynTool, DynamicTool, RuntimeContext, Tool, ToolContext, ToolError, ToolOutput,
    ToolSource, ToolSourceError, ToolSpec, TypedTool,
};
