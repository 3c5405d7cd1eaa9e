//! Middleware: ordered hooks around the run.
//!
//! # Order
//! The stack is the built-in middleware in their fixed order — `guidance`, `todos`,
//! `filesystem`, `skills`, `subagents`, `remote_subagents`, `response_format`, `large_results`,
//! `shorten_old_edits`, `summarization`, `dangling_tool_calls`, `memory`, `human_in_the_loop`
//! (those enabled; memory and approvals last so that the stable part of the prompt comes
//! first and stays cacheable) — then the user's in the
//! order given; a user middleware whose [`name`](Middleware::name) equals a built-in one takes
//! that built-in's place instead of being appended. Then:
//!
//! - `before_run`, `prepare_model_call`, `before_model` and `before_finish` run first to last
//!   (`before_finish` stops at the first that asks for more);
//! - `wrap_model_call` and `wrap_tool_call` nest with the first middleware outermost, so it sees
//!   the call first and the result last;
//! - `after_model` and `after_run` run last to first.
//!
//! That onion order makes each middleware's "after" the mirror of its "before": a middleware
//! added later sits closer to the model and the tools, and sees the request after the earlier
//! ones shaped it. Built-ins come first so that user middleware can observe and adjust what
//! they produce (prompt sections, tool results).
//!
//! # One middleware, many runs
//! An agent's middleware serve all its runs at once. Each hook gets the run it is called for:
//! a [`RunContext`] (in [`Middleware::wrap_model_call`] through [`ModelNext::context`], in
//! [`Middleware::wrap_tool_call`] as `ctx.run`) with the thread and assistant ids, the event
//! sink, the cancellation token, the runtime data, the limits and typed per-run
//! [`extensions`](RunContext::extensions). Keep whatever a run must remember between hooks
//! there, under a type of your own, never in the middleware value.

mod approvals;
pub(crate) mod async_tasks;
mod dangling;
mod filesystem;
mod guidance;
mod hooks;
mod memory;
mod offload;
#[cfg(feature = "remote")]
pub(crate) mod remote;
mod response_format;
mod shorten;
mod skills;
mod subagents;
mod summarization;
mod todos;

use std::sync::Arc;

use async_trait::async_trait;
use deepagents_core::model::collect_stream;
use deepagents_core::{
    AgentState, DynTool, EventKind, Model, ModelError, ModelRequest, ModelResponse, Reducer,
    RunContext, StateUpdate, StreamEvent, ToolCall, ToolContext, ToolError, ToolOutput,
};

use crate::registry::ToolRegistry;

pub use crate::background::ASYNC_TASKS_KEY;
pub use approvals::HumanInTheLoopMiddleware;
pub use async_tasks::AsyncSubAgentsMiddleware;
pub use dangling::DanglingToolCallsMiddleware;
pub use filesystem::FilesystemMiddleware;
pub use guidance::GuidanceMiddleware;
pub use hooks::{DEFAULT_HOOK_TIMEOUT, HookApprover, Hooks, HooksError, HooksMiddleware};
pub use memory::{MEMORY_KEY, MemoryMiddleware};
pub use offload::{
    DEFAULT_OFFLOAD_THRESHOLD, LARGE_INPUT_THRESHOLD, LARGE_INPUTS_KEY, LARGE_RESULTS_DIR,
    LargeResultsMiddleware,
};
#[cfg(feature = "remote")]
pub use remote::{RemoteSetupError, RemoteSubAgent};
pub(crate) use response_format::final_structured_answer;
pub use response_format::{FINAL_ANSWER_TOOL, ResponseFormatMiddleware, STRUCTURED_RESPONSE_KEY};
pub use shorten::ShortenOldEditsMiddleware;
pub use skills::{
    LOADED_SKILLS_KEY, SKILL_WARNINGS_KEY, SKILLS_KEY, SkillInfo, SkillWarning, SkillsMiddleware,
};
pub(crate) use subagents::Registered;
pub use subagents::SubAgentsMiddleware;
pub(crate) use summarization::CompactFirst;
pub use summarization::{
    COMPACT_KEY, HISTORY_DIR, SUMMARY_KEY, SummarizationConfig, SummarizationMiddleware, Threshold,
};
pub use todos::TodoListMiddleware;

/// A middleware hook failed; the run stops with this error, its source kept.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct MiddlewareError {
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl MiddlewareError {
    /// An error with this message and no underlying cause.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            source: None,
        }
    }

    /// An error with this message, caused by `source`.
    pub fn with_source(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }

    /// The message, without its cause.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl From<String> for MiddlewareError {
    fn from(message: String) -> Self {
        Self::new(message)
    }
}

impl From<&str> for MiddlewareError {
    fn from(message: &str) -> Self {
        Self::new(message)
    }
}

impl From<deepagents_core::StateError> for MiddlewareError {
    fn from(error: deepagents_core::StateError) -> Self {
        Self::with_source(error.to_string(), error)
    }
}

/// Hooks around the run. Every hook has a default that does nothing, so implement only what
/// you need. See the [module docs](self) for the order.
///
/// One middleware value serves every run of its agent, concurrently: keep what a run needs
/// to remember in [`RunContext::extensions`], not in `self`.
#[async_trait]
pub trait Middleware: Send + Sync + 'static {
    /// A unique name; a user middleware with a built-in's name replaces that built-in.
    fn name(&self) -> &str;

    /// Tools this middleware contributes, offered after the user's tools.
    fn tools(&self) -> Vec<Arc<dyn DynTool>> {
        Vec::new()
    }

    /// Custom state keys this middleware uses, with their merge rules.
    fn state_values(&self) -> Vec<(String, Reducer)> {
        Vec::new()
    }

    /// Once when a run starts or resumes; the returned update is merged into the state.
    async fn before_run(
        &self,
        _ctx: &RunContext,
        _state: &AgentState,
    ) -> Result<StateUpdate, MiddlewareError> {
        Ok(StateUpdate::default())
    }

    /// Before each model call, ahead of every `before_model`: may propose state changes the
    /// request should reflect (compaction records its summary here). `request` is the request
    /// as built from the state, before any middleware shaped it.
    async fn prepare_model_call(
        &self,
        _ctx: &RunContext,
        _request: &ModelRequest,
        _state: &AgentState,
    ) -> Result<StateUpdate, MiddlewareError> {
        Ok(StateUpdate::default())
    }

    /// Before each model call: may change the system prompt, the tools offered and the
    /// messages sent. Changes affect this request only, never the stored conversation.
    async fn before_model(
        &self,
        _ctx: &RunContext,
        _request: &mut ModelRequest,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        Ok(())
    }

    /// Around each model call: retry, fall back, or answer without calling `next`. The run
    /// is [`ModelNext::context`].
    async fn wrap_model_call(
        &self,
        request: ModelRequest,
        next: ModelNext,
    ) -> Result<ModelResponse, ModelError> {
        next.call(request).await
    }

    /// After each model call, before its answer joins the conversation.
    async fn after_model(
        &self,
        _ctx: &RunContext,
        _response: &mut ModelResponse,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        Ok(())
    }

    /// Around each tool call: check permissions, ask for approval, rewrite the result. The
    /// run is `ctx.run`.
    async fn wrap_tool_call(
        &self,
        call: ToolCall,
        ctx: ToolContext,
        next: ToolNext,
    ) -> Result<ToolOutput, ToolError> {
        next.call(call, ctx).await
    }

    /// When the model answered without calling tools, before the run ends with that answer:
    /// return a message for the model and the run goes on instead (a check that finds the
    /// work unfinished). The turn limit still bounds the run.
    async fn before_finish(
        &self,
        _ctx: &RunContext,
        _state: &AgentState,
    ) -> Result<Option<String>, MiddlewareError> {
        Ok(None)
    }

    /// Once when the run has its final answer.
    async fn after_run(
        &self,
        _ctx: &RunContext,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        Ok(())
    }
}

/// The rest of the model-call chain, handed to [`Middleware::wrap_model_call`]. It owns what
/// it needs, so it can move into a task; call it as often as you like (for retries); each
/// call streams its deltas as events.
#[derive(Clone)]
pub struct ModelNext {
    pub(crate) stack: Arc<[Arc<dyn Middleware>]>,
    /// Index in `stack` of the next middleware to call.
    pub(crate) position: usize,
    pub(crate) model: Arc<dyn Model>,
    pub(crate) run: RunContext,
}

impl ModelNext {
    /// The run this call belongs to.
    pub fn context(&self) -> &RunContext {
        &self.run
    }

    /// Passes the request on to the next middleware, or to the model.
    pub async fn call(&self, request: ModelRequest) -> Result<ModelResponse, ModelError> {
        match self.stack.get(self.position) {
            Some(middleware) => {
                let next = ModelNext {
                    position: self.position + 1,
                    ..self.clone()
                };
                middleware.wrap_model_call(request, next).await
            }
            None => {
                let events = &self.run.events;
                let stream = self.model.stream(&request).await?;
                collect_stream(stream, |delta| match delta {
                    StreamEvent::TextDelta { text } => {
                        events.emit(EventKind::TextDelta { text: text.clone() })
                    }
                    StreamEvent::ReasoningDelta { text } => {
                        events.emit(EventKind::ReasoningDelta { text: text.clone() })
                    }
                    StreamEvent::ToolCallDelta {
                        index,
                        id,
                        name,
                        arguments_delta,
                    } => events.emit(EventKind::ToolCallDelta {
                        index: *index,
                        call_id: id.clone(),
                        name: name.clone(),
                        arguments_delta: arguments_delta.clone(),
                    }),
                    _ => {}
                })
                .await
            }
        }
    }
}

/// The rest of the tool-call chain, handed to [`Middleware::wrap_tool_call`]; it owns what
/// it needs, so it can move into a task.
#[derive(Clone)]
pub struct ToolNext {
    pub(crate) stack: Arc<[Arc<dyn Middleware>]>,
    /// Index in `stack` of the next middleware to call.
    pub(crate) position: usize,
    pub(crate) registry: Arc<ToolRegistry>,
}

impl ToolNext {
    /// Passes the call on to the next middleware, or to the tool.
    pub async fn call(&self, call: ToolCall, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        match self.stack.get(self.position) {
            Some(middleware) => {
                let next = ToolNext {
                    position: self.position + 1,
                    ..self.clone()
                };
                middleware.wrap_tool_call(call, ctx, next).await
            }
            None => self.registry.call(call, ctx).await,
        }
    }
}

/// Builds the stack: `built_ins` in order, each replaced in place by a user middleware of the
/// same name, then the remaining user middleware in order.
pub(crate) fn compose(
    built_ins: Vec<Arc<dyn Middleware>>,
    user: Vec<Arc<dyn Middleware>>,
) -> Vec<Arc<dyn Middleware>> {
    let mut user: Vec<Option<Arc<dyn Middleware>>> = user.into_iter().map(Some).collect();
    let mut stack: Vec<Arc<dyn Middleware>> = built_ins
        .into_iter()
        .map(|built_in| {
            user.iter_mut()
                .find(|m| m.as_ref().is_some_and(|m| m.name() == built_in.name()))
                .and_then(Option::take)
                .unwrap_or(built_in)
        })
        .collect();
    stack.extend(user.into_iter().flatten());
    stack
}
