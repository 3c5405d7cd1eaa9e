//! Building an agent and starting runs.

use std::sync::Arc;
use std::time::Duration;

use deepagents_core::{
    DynTool, Model, ModelSettings, Reducer, Run, RuntimeContext, StateError, StateSchema, Tool,
    TypedTool,
};
use tokio_util::sync::CancellationToken;

use crate::error::RunFailure;
use crate::events::EventSink;
use crate::middleware::{
    DEFAULT_OFFLOAD_THRESHOLD, DanglingToolCallsMiddleware, FilesystemMiddleware,
    GuidanceMiddleware, LargeResultsMiddleware, Middleware, TodoListMiddleware, compose,
};
use crate::registry::{RegistryError, ToolRegistry};
use crate::stream::RunStream;
use deepagents_backends::{Backend, PermissionedBackend, Permissions, StateBackend};

/// Model calls a run may make per user input unless [`AgentBuilder::max_turns`] says otherwise.
pub const DEFAULT_MAX_TURNS: u32 = 100;

/// A built agent: immutable, cheap to clone, safe to share between tasks and runs.
#[derive(Clone)]
pub struct Agent {
    pub(crate) inner: Arc<AgentInner>,
}

pub(crate) struct AgentInner {
    pub(crate) name: String,
    pub(crate) model: Arc<dyn Model>,
    pub(crate) system_prompt: Option<String>,
    pub(crate) settings: ModelSettings,
    pub(crate) middleware: Vec<Arc<dyn Middleware>>,
    pub(crate) tools: ToolRegistry,
    pub(crate) schema: StateSchema,
    pub(crate) max_turns: u32,
}

/// Per-run options.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Application data the tools can read.
    pub runtime: RuntimeContext,
    /// Cancel this to stop the run; in-flight tools see it through their context.
    pub cancel: CancellationToken,
    /// How long in-flight tools may take to wind down after cancellation before they are
    /// aborted.
    pub cancel_grace: Duration,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            runtime: RuntimeContext::default(),
            cancel: CancellationToken::new(),
            cancel_grace: Duration::from_secs(5),
        }
    }
}

/// A run that reached its final answer.
#[derive(Clone, Debug)]
pub struct RunOutput {
    /// The final answer: the text of the last assistant message.
    pub text: String,
    /// The finished run, with the whole conversation and state.
    pub run: Run,
}

/// Why an agent could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// Two tools share a name.
    #[error(
        "two tools are named `{0}`; tool names must be unique (a user tool may not reuse a built-in tool's name)"
    )]
    DuplicateTool(String),
    /// A tool name that providers reject.
    #[error("tool name `{0}` is invalid; use 1-64 ASCII letters, digits, `_` or `-`")]
    InvalidToolName(String),
    /// Two user middleware share a name.
    #[error("two middleware are named `{0}`; give each a unique name")]
    DuplicateMiddleware(String),
    /// `max_turns(0)`.
    #[error("max_turns must be at least 1")]
    ZeroMaxTurns,
    /// Permission rules were given but the file tools are off.
    #[error(
        "permissions apply to the file tools, which are turned off; enable file_tools or drop the permissions"
    )]
    PermissionsWithoutFiles,
    /// Custom state declarations disagree.
    #[error(transparent)]
    State(#[from] StateError),
}

/// Configures an [`Agent`]. Every setting has a default:
///
/// | setting | default |
/// |---|---|
/// | name | `agent` |
/// | system prompt | none; our base guidance and middleware sections follow it |
/// | base guidance | on ([`base_prompt`](AgentBuilder::base_prompt)) |
/// | backend | [`StateBackend`]: files live in the agent state |
/// | file tools | on: ls, read_file, write_file, edit_file, delete, glob, grep, and execute when the backend has a shell |
/// | permissions | none: everything allowed |
/// | large results | offloaded above [`DEFAULT_OFFLOAD_THRESHOLD`] characters |
/// | tools | the user's, then those of enabled middleware |
/// | planning (`write_todos`) | off |
/// | middleware | built-ins, then the user's |
/// | model settings | the provider's defaults |
/// | max turns | [`DEFAULT_MAX_TURNS`] model calls per user input |
pub struct AgentBuilder {
    name: String,
    model: Arc<dyn Model>,
    system_prompt: Option<String>,
    settings: ModelSettings,
    tools: Vec<Arc<dyn DynTool>>,
    middleware: Vec<Arc<dyn Middleware>>,
    state_values: Vec<(String, Reducer)>,
    todos: bool,
    max_turns: u32,
    backend: Option<Arc<dyn Backend>>,
    permissions: Option<Permissions>,
    base_prompt: bool,
    file_tools: bool,
    offload_threshold: Option<usize>,
}

impl Agent {
    /// Starts configuring an agent around `model`.
    pub fn builder(model: Arc<dyn Model>) -> AgentBuilder {
        AgentBuilder {
            name: "agent".to_owned(),
            model,
            system_prompt: None,
            settings: ModelSettings::default(),
            tools: Vec::new(),
            middleware: Vec::new(),
            state_values: Vec::new(),
            todos: false,
            max_turns: DEFAULT_MAX_TURNS,
            backend: None,
            permissions: None,
            base_prompt: true,
            file_tools: true,
            offload_threshold: Some(DEFAULT_OFFLOAD_THRESHOLD),
        }
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The names of the middleware stack, in order.
    pub fn middleware_names(&self) -> Vec<String> {
        self.inner
            .middleware
            .iter()
            .map(|m| m.name().to_owned())
            .collect()
    }

    /// The tools offered to the model, in order.
    pub fn tool_specs(&self) -> &[deepagents_core::ToolSpec] {
        self.inner.tools.specs()
    }

    /// Runs `task` as a fresh conversation and returns the final answer.
    pub async fn invoke(&self, task: impl Into<String>) -> Result<RunOutput, RunFailure> {
        self.run(
            Run::from_task(task),
            RunOptions::default(),
            EventSink::discard(),
        )
        .await
    }

    /// Runs `task` as a fresh conversation, streaming events.
    pub fn stream(&self, task: impl Into<String>) -> RunStream {
        self.stream_run(Run::from_task(task), RunOptions::default())
    }

    /// Continues `run` (for example one loaded from a checkpoint, with new user input pushed)
    /// on a background task, streaming events.
    pub fn stream_run(&self, run: Run, options: RunOptions) -> RunStream {
        RunStream::spawn(self.clone(), run, options)
    }

    /// Continues `run` until it has a final answer or fails, sending events to `events`.
    pub async fn run(
        &self,
        run: Run,
        options: RunOptions,
        events: EventSink,
    ) -> Result<RunOutput, RunFailure> {
        crate::driver::drive(&self.inner, run, &options, &events).await
    }
}

impl AgentBuilder {
    /// Names the agent (shown in events and, later, subagent listings).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The application's system prompt; middleware sections follow it.
    pub fn system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = Some(prompt.into());
        self
    }

    /// Sampling settings for every model call.
    pub fn settings(mut self, settings: ModelSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Adds a typed tool.
    pub fn tool(mut self, tool: impl Tool) -> Self {
        self.tools.push(Arc::new(TypedTool::new(tool)));
        self
    }

    /// Adds a dynamic tool (schema known at run time).
    pub fn dyn_tool(mut self, tool: Arc<dyn DynTool>) -> Self {
        self.tools.push(tool);
        self
    }

    /// Adds a middleware; one named like a built-in replaces it in place.
    pub fn middleware(mut self, middleware: impl Middleware) -> Self {
        self.middleware.push(Arc::new(middleware));
        self
    }

    /// Declares a custom state key and how its updates merge.
    pub fn state_value(mut self, key: impl Into<String>, reducer: Reducer) -> Self {
        self.state_values.push((key.into(), reducer));
        self
    }

    /// Offers the `write_todos` planning tool (off by default).
    pub fn todos(mut self, enabled: bool) -> Self {
        self.todos = enabled;
        self
    }

    /// Bounds model calls per user input; reaching it fails the run with a turn-limit error.
    pub fn max_turns(mut self, max_turns: u32) -> Self {
        self.max_turns = max_turns;
        self
    }

    /// Where files live (default: the [`StateBackend`]).
    pub fn backend(mut self, backend: Arc<dyn Backend>) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Permission rules enforced on every file operation; denied paths also vanish from ls,
    /// glob and grep results.
    pub fn permissions(mut self, permissions: Permissions) -> Self {
        self.permissions = Some(permissions);
        self
    }

    /// Whether our base guidance follows the system prompt (default on). Turn it off for a
    /// bare prompt: the application's prompt plus middleware sections only.
    pub fn base_prompt(mut self, enabled: bool) -> Self {
        self.base_prompt = enabled;
        self
    }

    /// Whether the file tools are offered (default on).
    pub fn file_tools(mut self, enabled: bool) -> Self {
        self.file_tools = enabled;
        self
    }

    /// Tool results longer than this many characters are saved to the backend and replaced by
    /// a preview; `None` keeps every result whole.
    pub fn offload_threshold(mut self, threshold: Option<usize>) -> Self {
        self.offload_threshold = threshold;
        self
    }

    /// Checks the configuration and builds the agent.
    pub fn build(self) -> Result<Agent, BuildError> {
        if self.max_turns == 0 {
            return Err(BuildError::ZeroMaxTurns);
        }
        let mut seen = std::collections::HashSet::new();
        for middleware in &self.middleware {
            if !seen.insert(middleware.name().to_owned()) {
                return Err(BuildError::DuplicateMiddleware(
                    middleware.name().to_owned(),
                ));
            }
        }
        if self.permissions.is_some() && !self.file_tools {
            return Err(BuildError::PermissionsWithoutFiles);
        }
        let mut backend: Arc<dyn Backend> = self.backend.unwrap_or_else(|| Arc::new(StateBackend));
        if let Some(permissions) = self.permissions {
            backend = Arc::new(PermissionedBackend::new(backend, permissions));
        }
        let mut built_ins: Vec<Arc<dyn Middleware>> = Vec::new();
        if self.base_prompt {
            built_ins.push(Arc::new(GuidanceMiddleware));
        }
        if self.todos {
            built_ins.push(Arc::new(TodoListMiddleware));
        }
        if self.file_tools {
            built_ins.push(Arc::new(FilesystemMiddleware::new(Arc::clone(&backend))));
        }
        if let Some(threshold) = self.offload_threshold {
            built_ins.push(Arc::new(LargeResultsMiddleware::new(
                Arc::clone(&backend),
                threshold,
            )));
        }
        built_ins.push(Arc::new(DanglingToolCallsMiddleware));
        let middleware = compose(built_ins, self.middleware);

        let mut schema = StateSchema::default();
        for (key, reducer) in self.state_values {
            schema.declare(key, reducer)?;
        }
        let mut tools = self.tools;
        for m in &middleware {
            for (key, reducer) in m.state_values() {
                schema.declare(key, reducer)?;
            }
            tools.extend(m.tools());
        }
        let tools = ToolRegistry::new(tools).map_err(|e| match e {
            RegistryError::Duplicate(name) => BuildError::DuplicateTool(name),
            RegistryError::InvalidName(name) => BuildError::InvalidToolName(name),
        })?;
        Ok(Agent {
            inner: Arc::new(AgentInner {
                name: self.name,
                model: self.model,
                system_prompt: self.system_prompt,
                settings: self.settings,
                middleware,
                tools,
                schema,
                max_turns: self.max_turns,
            }),
        })
    }
}
