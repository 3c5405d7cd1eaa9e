//! Configuring and building an agent.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use deepagents_backends::{
    Backend, CompositeBackend, PermissionedBackend, Permissions, StateBackend, Store, StoreBackend,
    VPath,
};
use deepagents_core::{
    Checkpointer, DynTool, Model, ModelSettings, Reducer, RunLimits, StateError, StateSchema, Tool,
    ToolSource, TypedTool,
};

use crate::agent::Agent;
use crate::approval::InterruptConfig;
use crate::background::{Background, LocalAgent};
use crate::config::AgentConfig;
use crate::context::FALLBACK_CONTEXT_TOKENS;
#[cfg(feature = "remote")]
use crate::middleware::RemoteSubAgent;
use crate::middleware::{AsyncSubAgentsMiddleware, Registered};
use crate::middleware::{
    DEFAULT_OFFLOAD_THRESHOLD, DanglingToolCallsMiddleware, FilesystemMiddleware,
    GuidanceMiddleware, HumanInTheLoopMiddleware, LargeResultsMiddleware, MemoryMiddleware,
    Middleware, ResponseFormatMiddleware, ShortenOldEditsMiddleware, SkillsMiddleware,
    SubAgentsMiddleware, SummarizationConfig, SummarizationMiddleware, TodoListMiddleware, compose,
};
use crate::middleware::{HISTORY_DIR, LARGE_RESULTS_DIR};
use crate::registry::{RegistryError, ToolRegistry};
use crate::subagents::{
    DEFAULT_MAX_CONCURRENT, DEFAULT_MAX_DEPTH, GENERAL_PURPOSE, GENERAL_PURPOSE_DESCRIPTION,
    GENERAL_PURPOSE_PROMPT, SubAgent, SubAgentKind, SubAgentMode,
};

/// Model calls a run may make per user input unless [`AgentBuilder::max_turns`] says otherwise.
pub const DEFAULT_MAX_TURNS: u32 = 100;

/// Custom state keys starting with this belong to the harness; the application cannot
/// declare them.
pub const RESERVED_KEY_PREFIX: &str = "deepagents.";

/// The owner of the keys declared with [`AgentBuilder::state_value`], as errors name it.
const APPLICATION: &str = "the application (AgentBuilder::state_value)";

/// Where [`AgentBuilder::store`] mounts long-term memory.
pub const MEMORIES_PREFIX: &str = "/memories/";

/// The [`Store`] namespace of the files under [`MEMORIES_PREFIX`] when
/// [`AgentBuilder::store`] mounts them.
pub const MEMORIES_NAMESPACE: &str = "memories";

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
    /// The compaction tool was asked for with summarization off.
    #[error("compact_tool needs summarization; turn summarization on or drop compact_tool")]
    CompactWithoutSummarization,
    /// A memory or skills path is not a valid virtual path.
    #[error("invalid memory or skills path: {0}")]
    InvalidPath(#[from] deepagents_backends::PathError),
    /// A subagent could not be built.
    #[error("subagent `{name}` cannot be built: {message}")]
    Subagent {
        /// The subagent.
        name: String,
        /// Why.
        message: String,
    },
    /// Two subagents share a name.
    #[error("two subagents are named `{0}`; give each a unique name")]
    DuplicateSubagent(String),
    /// The response format is not a usable JSON schema.
    #[error("invalid response format: {0}")]
    InvalidResponseFormat(String),
    /// Custom state declarations disagree, or the application's key is one a built-in
    /// middleware uses.
    #[error(transparent)]
    State(#[from] StateError),
    /// The application declared a key in the harness's own namespace.
    #[error(
        "custom state key `{0}` starts with `{RESERVED_KEY_PREFIX}`, which is reserved for the harness; choose another name"
    )]
    ReservedKey(String),
    /// [`AgentBuilder::interrupt_on`] names a tool the agent does not offer.
    #[error(
        "interrupt_on names tool `{tool}`, which this agent does not offer; offered tools: {}",
        offered.join(", ")
    )]
    UnknownInterruptTool {
        /// The tool named.
        tool: String,
        /// The tools the agent offers, in order.
        offered: Vec<String>,
    },
    /// The long-term store could not be mounted at [`MEMORIES_PREFIX`].
    #[error("cannot mount the store at {MEMORIES_PREFIX}: {0}")]
    Store(String),
    /// The harness's own files (offloaded results, history) could not be kept in the state.
    #[error("cannot keep the harness's files in the agent state: {0}")]
    Artifacts(String),
    /// A built-in tool could not be made.
    #[error("{0}")]
    Tool(String),
    /// A cost cap on a model whose prices are unknown: it could never stop a run.
    #[error(
        "a cost cap needs the model's prices, and none are known for `{model}`: give them with AgentBuilder::prices, or cap tokens instead (SpendLimits::max_tokens)"
    )]
    UnpricedCostCap {
        /// The model's id.
        model: String,
    },
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
/// | context window | the model's profile, else 170,000 tokens; old long write/edit arguments are shortened in requests past 70 % |
/// | response format | none: the answer is the last assistant text |
/// | subagents | the general-purpose subagent, through the `task` tool; nesting ≤ 3, 8 at once |
/// | memory, skills | none |
/// | summarization | on: at 85 % of the window older messages are summarized, 10 % kept (170,000 tokens and 6 messages when the window is unknown); the transcript goes to `/conversation_history/` |
/// | tools | the user's, then those of enabled middleware |
/// | planning (`write_todos`) | off |
/// | middleware | built-ins, then the user's |
/// | model settings | the provider's defaults |
/// | max turns | [`DEFAULT_MAX_TURNS`] model calls per user input |
/// | interrupts | none: no call waits for approval (permission rules in `interrupt` mode add some) |
/// | checkpointer | none: runs are not saved and [`Agent::thread`] is refused |
/// | store | none: `/memories/` is an ordinary path of the backend |
///
/// [`build`](AgentBuilder::build) refuses invalid combinations with a [`BuildError`]: duplicate
/// tool, middleware or subagent names, `max_turns(0)`, permissions with the file tools off,
/// `compact_tool` without summarization, an interrupt for a tool that is not offered, invalid
/// memory or skills paths and an unusable response format.
pub struct AgentBuilder {
    name: String,
    model: Arc<dyn Model>,
    system_prompt: Option<String>,
    settings: ModelSettings,
    tools: Vec<Arc<dyn DynTool>>,
    tool_sources: Vec<Arc<dyn ToolSource>>,
    middleware: Vec<Arc<dyn Middleware>>,
    hooks: Option<crate::middleware::Hooks>,
    state_values: Vec<(String, Reducer)>,
    private_keys: BTreeSet<String>,
    todos: bool,
    max_turns: u32,
    spend_limits: deepagents_core::SpendLimits,
    prices: Arc<deepagents_core::PriceBook>,
    backend: Option<Arc<dyn Backend>>,
    permissions: Option<Permissions>,
    base_prompt: bool,
    file_tools: bool,
    offload_threshold: Option<usize>,
    response_format: Option<serde_json::Value>,
    context_window: Option<u64>,
    subagents: Vec<SubAgent>,
    general_purpose: bool,
    max_subagent_depth: usize,
    max_concurrent_subagents: usize,
    memory: Vec<String>,
    skills: Vec<String>,
    summarization: bool,
    summarization_config: Option<SummarizationConfig>,
    compact_tool: bool,
    ask_user: bool,
    #[cfg(feature = "remote")]
    /// `Some`: `web_fetch` is offered, reaching public hosts and these internal ones.
    web_fetch: Option<Vec<String>>,
    #[cfg(feature = "remote")]
    remote_subagents: Vec<RemoteSubAgent>,
    interrupts: BTreeMap<String, InterruptConfig>,
    /// Interrupts a subagent inherits from its parent: unlike its own, those for tools it does
    /// not offer are dropped, not refused.
    inherited_interrupts: BTreeMap<String, InterruptConfig>,
    checkpointer: Option<Arc<dyn Checkpointer>>,
    store: Option<Arc<dyn Store>>,
}

/// A fork's middleware: the parent's own (without the hooks middleware its builder added,
/// which the fork's builder adds again), each replaced in place by one of `own` with the same
/// name, then the rest of `own`.
fn inherited_middleware(
    parent: &[Arc<dyn Middleware>],
    parent_has_hooks: bool,
    own: Vec<Arc<dyn Middleware>>,
) -> Vec<Arc<dyn Middleware>> {
    let mut own: Vec<Option<Arc<dyn Middleware>>> = own.into_iter().map(Some).collect();
    let mut merged: Vec<Arc<dyn Middleware>> = parent
        .iter()
        .filter(|m| !(parent_has_hooks && m.name() == "hooks"))
        .map(|inherited| {
            own.iter_mut()
                .find(|m| m.as_ref().is_some_and(|m| m.name() == inherited.name()))
                .and_then(Option::take)
                .unwrap_or_else(|| Arc::clone(inherited))
        })
        .collect();
    merged.extend(own.into_iter().flatten());
    merged
}

/// Mounts a [`StoreBackend`] over `store` at [`MEMORIES_PREFIX`] on top of `backend`, unless
/// `backend` already routes that prefix or a path below it.
fn mount_memories(
    backend: Arc<dyn Backend>,
    store: &Arc<dyn Store>,
) -> Result<Arc<dyn Backend>, BuildError> {
    let prefix = VPath::parse(MEMORIES_PREFIX)?;
    let routed = backend
        .path_mappings()
        .iter()
        .any(|mapping| !mapping.prefix.is_root() && mapping.prefix.starts_with(&prefix));
    if routed {
        return Ok(backend);
    }
    let memories = StoreBackend::new(Arc::clone(store))
        .with_namespace(|_| vec![MEMORIES_NAMESPACE.to_owned()]);
    let composite = CompositeBackend::new(backend)
        .route(MEMORIES_PREFIX, Arc::new(memories))
        .map_err(|e| BuildError::Store(e.to_string()))?;
    Ok(Arc::new(composite))
}

/// Offloaded tool results and summarized history are the thread's own data: unless `backend`
/// is the agent state already, they are kept in the agent state, checkpointed with the thread,
/// rather than in the user's working tree, a shared store or a sandbox. A directory the backend
/// routes itself (at it or below) stays where it is routed.
fn keep_artifacts_off_disk(backend: Arc<dyn Backend>) -> Result<Arc<dyn Backend>, BuildError> {
    let mappings = backend.path_mappings();
    let mut composite: Option<CompositeBackend> = None;
    for dir in [LARGE_RESULTS_DIR, HISTORY_DIR] {
        let dir = VPath::parse(dir)?;
        let routed = mappings
            .iter()
            .any(|mapping| !mapping.prefix.is_root() && mapping.prefix.starts_with(&dir));
        // Only the agent state is the thread's own storage: a disk is the user's tree, and a
        // store, a sandbox or a per-run backend may be shared beyond the thread.
        if routed || backend.name() == "state" {
            continue;
        }
        let base = composite.unwrap_or_else(|| CompositeBackend::new(Arc::clone(&backend)));
        composite = Some(
            base.route_quiet(&format!("{dir}/"), Arc::new(StateBackend::default()))
                .map_err(|e| BuildError::Artifacts(e.to_string()))?,
        );
    }
    Ok(match composite {
        Some(composite) => Arc::new(composite),
        None => backend,
    })
}

impl AgentBuilder {
    /// A builder with every default (see [`Agent::builder`]).
    pub(crate) fn new(model: Arc<dyn Model>) -> Self {
        Self {
            name: "agent".to_owned(),
            model,
            system_prompt: None,
            settings: ModelSettings::default(),
            tools: Vec::new(),
            tool_sources: Vec::new(),
            middleware: Vec::new(),
            hooks: None,
            state_values: Vec::new(),
            private_keys: BTreeSet::new(),
            todos: false,
            max_turns: DEFAULT_MAX_TURNS,
            spend_limits: deepagents_core::SpendLimits::default(),
            prices: Arc::new(deepagents_models::prices::list_prices),
            backend: None,
            permissions: None,
            base_prompt: true,
            file_tools: true,
            offload_threshold: Some(DEFAULT_OFFLOAD_THRESHOLD),
            response_format: None,
            context_window: None,
            subagents: Vec::new(),
            general_purpose: true,
            max_subagent_depth: DEFAULT_MAX_DEPTH,
            max_concurrent_subagents: DEFAULT_MAX_CONCURRENT,
            memory: Vec::new(),
            skills: Vec::new(),
            summarization: true,
            summarization_config: None,
            compact_tool: false,
            ask_user: false,
            #[cfg(feature = "remote")]
            web_fetch: None,
            #[cfg(feature = "remote")]
            remote_subagents: Vec::new(),
            interrupts: BTreeMap::new(),
            inherited_interrupts: BTreeMap::new(),
            checkpointer: None,
            store: None,
        }
    }

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

    /// Adds a source of tools that may change while the agent runs (an MCP server): its
    /// tools are listed when a run starts and again whenever its version changes, and are
    /// offered after the fixed tools. A listed tool whose name is taken is left out (with a
    /// warning in the log); if listing fails, the run keeps the tools it had.
    pub fn tool_source(mut self, source: Arc<dyn ToolSource>) -> Self {
        self.tool_sources.push(source);
        self
    }

    /// Offers the tools of MCP servers (from [`mcp::config::load`](crate::mcp::config::load)
    /// or built in code), connected when a run first asks for tools, all at once, each within
    /// its start-up timeout; a server that fails is logged and left out. `options` says where
    /// stdio servers run, where their stderr goes and who answers their questions. To ask
    /// before the tools a server marks destructive, connect first
    /// ([`mcp::connect`](crate::mcp::connect)) and pass [`interrupt_on`](Self::interrupt_on)
    /// each of `Connections::destructive_tools`.
    #[cfg(feature = "mcp")]
    pub fn mcp_servers(
        self,
        servers: Vec<crate::mcp::ServerConfig>,
        options: crate::mcp::ConnectOptions,
    ) -> Self {
        self.tool_source(Arc::new(crate::mcp::lazy(servers, options)))
    }

    /// Offers the tools of the servers in a `.mcp.json` file (see
    /// [`mcp_servers`](Self::mcp_servers)); `${VAR}` expands from the environment. Fails with
    /// the file, the server and the key when the file cannot be used.
    #[cfg(feature = "mcp")]
    pub fn mcp_config_file(
        self,
        file: impl AsRef<std::path::Path>,
        options: crate::mcp::ConnectOptions,
    ) -> Result<Self, crate::mcp::ConfigError> {
        let servers = crate::mcp::config::load(file.as_ref())?;
        Ok(self.mcp_servers(servers, options))
    }

    /// Adds a dynamic tool (schema known at run time).
    pub fn dyn_tool(mut self, tool: Arc<dyn DynTool>) -> Self {
        self.tools.push(tool);
        self
    }

    /// Runs the user's hooks (see [`Hooks`](crate::middleware::Hooks)) in this agent and in
    /// every subagent it builds: tool hooks around each tool call, session and prompt hooks
    /// for the top-level run only.
    pub fn hooks(mut self, hooks: crate::middleware::Hooks) -> Self {
        self.hooks = Some(hooks);
        self
    }

    /// Adds a middleware; one named like a built-in replaces it in place.
    pub fn middleware(mut self, middleware: impl Middleware) -> Self {
        self.middleware.push(Arc::new(middleware));
        self
    }

    /// Declares a custom state key and how its updates merge.
    ///
    /// A subagent run starts with the values of these keys (those it declares too; subagents
    /// built from a spec inherit the declarations). What a subagent changes in them stays in
    /// its run: only file changes and its answer come back, so parallel subagents never
    /// collide on custom state. Keys declared only by middleware are private to each agent
    /// (skills, memory, the summary marker), as are those of
    /// [`private_state_value`](Self::private_state_value).
    pub fn state_value(mut self, key: impl Into<String>, reducer: Reducer) -> Self {
        self.state_values.push((key.into(), reducer));
        self
    }

    /// Declares a custom state key that never reaches a subagent: subagent runs start without
    /// it, even when they declare it too.
    pub fn private_state_value(mut self, key: impl Into<String>, reducer: Reducer) -> Self {
        let key = key.into();
        self.private_keys.insert(key.clone());
        self.state_values.push((key, reducer));
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

    /// Requires the final answer as JSON matching `schema` (a JSON schema of an object): the
    /// model answers through a `final_answer` tool whose arguments are validated, and
    /// [`RunOutput::structured`](crate::RunOutput::structured) holds the answer.
    pub fn response_format(mut self, schema: serde_json::Value) -> Self {
        self.response_format = Some(schema);
        self
    }

    /// The model's context window in tokens, overriding its profile (default: the profile, or
    /// 170,000 when the model has none). Context management computes its thresholds from it.
    pub fn context_window(mut self, tokens: u64) -> Self {
        self.context_window = Some(tokens);
        self
    }

    /// Memory files (absolute backend paths such as `/AGENTS.md`), read when a thread starts
    /// and shown last in the system prompt. Missing files are skipped.
    pub fn memory<S: Into<String>>(mut self, paths: impl IntoIterator<Item = S>) -> Self {
        self.memory.extend(paths.into_iter().map(Into::into));
        self
    }

    /// Skill directories (absolute backend paths), lowest precedence first. Skills are not
    /// inherited by subagents.
    pub fn skills<S: Into<String>>(mut self, dirs: impl IntoIterator<Item = S>) -> Self {
        self.skills.extend(dirs.into_iter().map(Into::into));
        self
    }

    /// Whether older messages are summarized as the context window fills (default on).
    pub fn summarization(mut self, enabled: bool) -> Self {
        self.summarization = enabled;
        self
    }

    /// When to summarize and what to keep (default: 85 % of a known window, keeping 10 %;
    /// 170,000 tokens and 6 messages when the window is unknown).
    pub fn summarization_config(mut self, config: SummarizationConfig) -> Self {
        self.summarization_config = Some(config);
        self
    }

    /// Offers the `ask_user` tool (off by default): the model asks a question and the run
    /// pauses like an approval, with the call in [`RunOutput::pending`](crate::RunOutput::pending) (its question in the
    /// arguments, decisions `respond` or `reject`); the answer, given with
    /// [`Decision::Respond`](crate::Decision::Respond), is the call's result. The question survives restarts.
    pub fn ask_user(mut self, enabled: bool) -> Self {
        self.ask_user = enabled;
        self
    }

    /// Offers the `compact_conversation` tool, so the model can summarize on demand (off by
    /// default; needs summarization).
    pub fn compact_tool(mut self, enabled: bool) -> Self {
        self.compact_tool = enabled;
        self
    }

    /// Offers the `web_fetch` tool (off by default): the model reads a web page or text file
    /// by its http(s) URL, HTML as Markdown, capped. It reaches public addresses only, plus
    /// the internal hosts [`web_fetch_allowed_hosts`](Self::web_fetch_allowed_hosts) lists;
    /// put it behind [`interrupt_on`](Self::interrupt_on) where each fetch should be asked.
    #[cfg(feature = "remote")]
    pub fn web_fetch(mut self, enabled: bool) -> Self {
        self.web_fetch = match (enabled, self.web_fetch.take()) {
            (false, _) => None,
            (true, hosts) => Some(hosts.unwrap_or_default()),
        };
        self
    }

    /// Private, loopback or link-local hosts `web_fetch` may reach too, each `host`,
    /// `host:port`, `ip` or `ip:port` (an intranet wiki, a local docs server); a name is
    /// reached only at the addresses listed. Offers the tool.
    #[cfg(feature = "remote")]
    pub fn web_fetch_allowed_hosts(mut self, hosts: impl IntoIterator<Item = String>) -> Self {
        self.web_fetch.get_or_insert_with(Vec::new).extend(hosts);
        self
    }

    #[cfg(feature = "remote")]
    /// Adds a remote agent (Agent Protocol / LangGraph API) the model can run as a background
    /// task with `start_async_task`, `check_async_task`, `update_async_task`,
    /// `cancel_async_task` and `list_async_tasks`.
    pub fn remote_subagent(mut self, subagent: RemoteSubAgent) -> Self {
        self.remote_subagents.push(subagent);
        self
    }

    /// Makes calls to `tool` pause the run for a human decision (see [`crate::decide`]).
    /// Permission rules in `interrupt` mode add such configurations for the file tools; one
    /// given here wins. Subagents built from a spec inherit them; when a subagent pauses, this
    /// agent's run pauses too, with the subagent's actions marked by
    /// [`PendingAction::path`](crate::PendingAction::path), and resumes it where it stopped.
    ///
    /// `tool` must be a tool the agent offers (its own, a built-in one, or one of its
    /// middleware); [`build`](Self::build) refuses any other with
    /// [`BuildError::UnknownInterruptTool`]. `execute` is offered only when the backend has a
    /// shell ([`Backend::as_sandbox`]).
    pub fn interrupt_on(mut self, tool: impl Into<String>, config: InterruptConfig) -> Self {
        self.interrupts.insert(tool.into(), config);
        self
    }

    /// Where threads are saved: with it, [`Agent::thread`] gives a [`Thread`](crate::Thread) handle that
    /// continues a conversation, pauses and resumes it across restarts. Runs started with
    /// [`Agent::invoke`], [`Agent::stream`] or [`Agent::run`] are still not saved unless their
    /// [`RunOptions::checkpoint`](crate::RunOptions::checkpoint) says so. Subagents' runs live inside their parent's, so they
    /// need none.
    pub fn checkpointer(mut self, checkpointer: Arc<dyn Checkpointer>) -> Self {
        self.checkpointer = Some(checkpointer);
        self
    }

    /// Long-term memory shared by every thread: files under [`MEMORIES_PREFIX`] (`/memories/`)
    /// are kept in `store` (a [`StoreBackend`] in namespace `["memories"]`,
    /// [`MEMORIES_NAMESPACE`]) mounted on top of the backend with a [`CompositeBackend`];
    /// everything else stays on the backend. Subagents see the same mount. When the backend
    /// already routes `/memories/` (or a path below it) somewhere of its own, as its
    /// [`Backend::path_mappings`] show, it is left as it is and the store is not mounted.
    /// Permission rules apply to the memories like to any other path. Combine with
    /// [`memory`](Self::memory)(`["/memories/AGENTS.md"]`) to show a memory file in the prompt.
    pub fn store(mut self, store: Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    /// Adds a subagent the `task` tool can start.
    pub fn subagent(mut self, subagent: SubAgent) -> Self {
        self.subagents.push(subagent);
        self
    }

    /// Whether the general-purpose subagent is offered (default on). A subagent of your own
    /// named `general-purpose` replaces it.
    pub fn general_purpose_subagent(mut self, enabled: bool) -> Self {
        self.general_purpose = enabled;
        self
    }

    /// Hard caps on what a run may spend, its subagents included: dollars at the models'
    /// prices and tokens. Checked before each model call with the request's estimated size,
    /// so a run stops before a call that would cross a cap (`RunError::SpendCap`, resumable
    /// with a higher cap) — past it by at most one answer's output. These are the defaults of
    /// every run; a run may set its own ([`RunOptions::spend_limits`](crate::RunOptions::spend_limits)).
    pub fn spend_limits(mut self, limits: deepagents_core::SpendLimits) -> Self {
        self.spend_limits = limits;
        self
    }

    /// The prices model calls are charged at, by model id (default: the providers' list
    /// prices, [`deepagents_models::prices::list_prices`]). Calls to a model without prices
    /// count in tokens only.
    pub fn prices(
        mut self,
        prices: impl Fn(&str) -> Option<deepagents_core::Prices> + Send + Sync + 'static,
    ) -> Self {
        self.prices = Arc::new(prices);
        self
    }

    /// How deep subagents may nest (default 3) and how many may work at once (default 8; more
    /// wait their turn). These are the defaults of every run; a run may set its own
    /// ([`RunOptions::limits`](crate::RunOptions::limits)).
    ///
    /// Both hold across nesting. The strictest depth limit along a chain of agents applies, so a
    /// pre-built subagent with looser limits cannot nest deeper than its parent allows. The
    /// concurrency limit of the agent a run starts from bounds every subagent of that run's
    /// tree; a nested agent's own limit additionally bounds its own `task` calls. A subagent
    /// waiting for its own subagents lends its place to one of them at a time, so nesting never
    /// deadlocks on the limit.
    pub fn subagent_limits(mut self, max_depth: usize, max_concurrent: usize) -> Self {
        self.max_subagent_depth = max_depth;
        self.max_concurrent_subagents = max_concurrent;
        self
    }

    /// Parses memory and skills paths.
    fn parse_paths(paths: &[String]) -> Result<Vec<deepagents_backends::VPath>, BuildError> {
        paths
            .iter()
            .map(|p| deepagents_backends::VPath::parse(p).map_err(BuildError::from))
            .collect()
    }

    /// Builds the subagents: each inherits the model, tools, backend, permissions, interrupt
    /// configuration, hooks, custom state declarations, settings and planning of this builder
    /// unless its spec says otherwise. Skills, memory, middleware and subagents are not inherited,
    /// except by a fork, which inherits the system prompt, middleware, skills, memory and
    /// summarization settings too (never the subagents).
    fn build_subagents(
        &self,
        raw_backend: &Arc<dyn Backend>,
    ) -> Result<BTreeMap<String, Registered>, BuildError> {
        let mut subagents = self.subagents.clone();
        if self.general_purpose && !subagents.iter().any(|s| s.name == GENERAL_PURPOSE) {
            subagents.insert(
                0,
                SubAgent::new(
                    GENERAL_PURPOSE,
                    GENERAL_PURPOSE_DESCRIPTION,
                    GENERAL_PURPOSE_PROMPT,
                ),
            );
        }
        let mut built = BTreeMap::new();
        for subagent in subagents {
            let fork = subagent.mode == SubAgentMode::Fork;
            let agent = match subagent.kind {
                SubAgentKind::Prebuilt(agent) => agent,
                SubAgentKind::Spec(spec) => {
                    if fork && !spec.skills.is_empty() {
                        return Err(BuildError::Subagent {
                            name: subagent.name.clone(),
                            message: "skills cannot be set on a subagent in fork mode; a fork \
                                      inherits the parent's skills"
                                .to_owned(),
                        });
                    }
                    // A fork continues the parent's conversation under the parent's prompt:
                    // its own prompt is an addendum.
                    let system_prompt = if fork {
                        [
                            self.system_prompt.as_deref(),
                            Some(spec.system_prompt.as_str()),
                        ]
                        .into_iter()
                        .flatten()
                        .map(str::trim)
                        .filter(|part| !part.is_empty())
                        .collect::<Vec<_>>()
                        .join("\n\n")
                    } else {
                        spec.system_prompt
                    };
                    let mut builder =
                        Agent::builder(spec.model.unwrap_or_else(|| Arc::clone(&self.model)))
                            .name(subagent.name.clone())
                            .system_prompt(system_prompt)
                            .settings(self.settings.clone())
                            .todos(self.todos)
                            .max_turns(self.max_turns)
                            .backend(Arc::clone(raw_backend))
                            .file_tools(self.file_tools)
                            .base_prompt(self.base_prompt)
                            .offload_threshold(self.offload_threshold)
                            .general_purpose_subagent(false);
                    builder.context_window = self.context_window;
                    if spec.tools.is_none() {
                        builder.tool_sources = self.tool_sources.clone();
                    }
                    builder.tools = spec.tools.unwrap_or_else(|| self.tools.clone());
                    builder.middleware = if fork {
                        inherited_middleware(
                            &self.middleware,
                            self.hooks.as_ref().is_some_and(|h| !h.is_empty()),
                            spec.middleware,
                        )
                    } else {
                        spec.middleware
                    };
                    builder.hooks = self.hooks.clone();
                    builder.permissions = spec.permissions.or_else(|| self.permissions.clone());
                    builder.response_format = spec.response_format;
                    match spec.interrupts {
                        Some(own) => builder.interrupts = own,
                        // Inherited interrupts for tools this subagent lacks are dropped.
                        None => {
                            builder.inherited_interrupts = self.inherited_interrupts.clone();
                            builder.inherited_interrupts.extend(self.interrupts.clone());
                        }
                    }
                    if fork {
                        builder.skills = self.skills.clone();
                        builder.memory = self.memory.clone();
                        builder.summarization = self.summarization;
                        builder.summarization_config = self.summarization_config;
                        builder.compact_tool = self.compact_tool;
                    } else {
                        builder.skills = spec.skills;
                    }
                    // Inherited tools may update the parent's custom keys.
                    builder.state_values = self.state_values.clone();
                    builder.private_keys = self.private_keys.clone();
                    builder.build().map_err(|e| match e {
                        // The subagent inherits the application's keys: a clash is the
                        // application's, reported as such.
                        BuildError::State(error) => BuildError::State(error),
                        BuildError::ReservedKey(key) => BuildError::ReservedKey(key),
                        other => BuildError::Subagent {
                            name: subagent.name.clone(),
                            message: other.to_string(),
                        },
                    })?
                }
            };
            if built
                .insert(
                    subagent.name.clone(),
                    Registered {
                        description: subagent.description,
                        agent,
                        mode: subagent.mode,
                        asynchronous: subagent.asynchronous,
                    },
                )
                .is_some()
            {
                return Err(BuildError::DuplicateSubagent(subagent.name));
            }
        }
        Ok(built)
    }

    /// The registry of the async subagents (`locals`) and remote agents; `None` when there
    /// are neither.
    fn background(
        &self,
        locals: BTreeMap<String, Registered>,
    ) -> Result<Option<Arc<Background>>, BuildError> {
        let locals: BTreeMap<String, LocalAgent> = locals
            .into_iter()
            .map(|(name, r)| {
                let local = LocalAgent {
                    description: r.description,
                    agent: r.agent,
                };
                (name, local)
            })
            .collect();
        #[cfg(feature = "remote")]
        {
            if locals.is_empty() && self.remote_subagents.is_empty() {
                return Ok(None);
            }
            let remotes = crate::middleware::remote::clients(self.remote_subagents.clone())
                .map_err(|e| BuildError::Subagent {
                    name: e.name.clone(),
                    message: e.message.clone(),
                })?;
            if let Some(name) = remotes.keys().find(|name| locals.contains_key(*name)) {
                return Err(BuildError::DuplicateSubagent(name.clone()));
            }
            Ok(Some(Arc::new(Background::new(locals, remotes))))
        }
        #[cfg(not(feature = "remote"))]
        {
            Ok((!locals.is_empty()).then(|| Arc::new(Background::new(locals))))
        }
    }

    /// Checks the configuration and builds the agent.
    pub fn build(mut self) -> Result<Agent, BuildError> {
        if let Some(hooks) = self.hooks.clone().filter(|h| !h.is_empty()) {
            self.middleware
                .push(Arc::new(crate::middleware::HooksMiddleware::new(hooks)));
        }
        #[cfg(feature = "remote")]
        if let Some(hosts) = &self.web_fetch {
            let tool = crate::tools::web_fetch::WebFetch::new(hosts).map_err(BuildError::Tool)?;
            self.tools.push(Arc::new(TypedTool::new(tool)));
        }
        if self.ask_user {
            self.tools
                .push(Arc::new(TypedTool::new(crate::tools::ask_user::AskUser)));
        }
        if self.max_turns == 0 {
            return Err(BuildError::ZeroMaxTurns);
        }
        if self.spend_limits.max_cost_usd.is_some() && (self.prices)(self.model.id()).is_none() {
            return Err(BuildError::UnpricedCostCap {
                model: self.model.id().to_owned(),
            });
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
        // Interrupts implied by permission rules and inherited ones apply to the tools offered;
        // the user's own must name one.
        let mut implied = self
            .permissions
            .as_ref()
            .map(crate::approval::from_permissions)
            .unwrap_or_default();
        implied.extend(self.inherited_interrupts.clone());
        let explicit = self.interrupts.clone();
        let mut raw_backend: Arc<dyn Backend> = self
            .backend
            .clone()
            .unwrap_or_else(|| Arc::new(StateBackend::default()));
        if let Some(store) = &self.store {
            raw_backend = mount_memories(raw_backend, store)?;
        }
        raw_backend = keep_artifacts_off_disk(raw_backend)?;
        let subagents = if self.general_purpose || !self.subagents.is_empty() {
            Some(self.build_subagents(&raw_backend)?)
        } else {
            None
        };
        let (subagents, asynchronous) = split_async(subagents.unwrap_or_default());
        let background = self.background(asynchronous)?;
        let mut backend = raw_backend;
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
        let known_window = self
            .context_window
            .or_else(|| self.model.profile().map(|p| p.max_input_tokens));
        if self.file_tools {
            built_ins.push(Arc::new(
                FilesystemMiddleware::new(Arc::clone(&backend))
                    .with_context_window(known_window.unwrap_or(FALLBACK_CONTEXT_TOKENS)),
            ));
        }
        if !self.skills.is_empty() {
            built_ins.push(Arc::new(SkillsMiddleware::new(
                Arc::clone(&backend),
                Self::parse_paths(&self.skills)?,
            )));
        }
        let shared_keys: BTreeSet<String> = self
            .state_values
            .iter()
            .map(|(key, _)| key.clone())
            .filter(|key| !self.private_keys.contains(key))
            .collect();
        if !subagents.is_empty() {
            built_ins.push(Arc::new(SubAgentsMiddleware::new(
                subagents,
                shared_keys.clone(),
            )));
        }
        if let Some(background) = &background {
            built_ins.push(Arc::new(AsyncSubAgentsMiddleware::new(Arc::clone(
                background,
            ))));
        }
        let mut structured: Option<Arc<dyn Middleware>> = None;
        if let Some(schema) = self.response_format {
            let middleware: Arc<dyn Middleware> = Arc::new(
                ResponseFormatMiddleware::new(schema)
                    .map_err(|e| BuildError::InvalidResponseFormat(e.message))?,
            );
            structured = Some(Arc::clone(&middleware));
            built_ins.push(middleware);
        }
        if let Some(threshold) = self.offload_threshold {
            built_ins.push(Arc::new(LargeResultsMiddleware::new(
                Arc::clone(&backend),
                threshold,
            )));
        }
        if self.file_tools {
            let window = known_window.unwrap_or(FALLBACK_CONTEXT_TOKENS);
            built_ins.push(Arc::new(ShortenOldEditsMiddleware::new(window)));
        }
        if self.summarization {
            let mut middleware = SummarizationMiddleware::new(
                Arc::clone(&self.model),
                Arc::clone(&backend),
                known_window,
                self.summarization_config,
            );
            if self.compact_tool {
                middleware = middleware.with_compact_tool();
            }
            if let Some(hooks) = self.hooks.clone().filter(|h| !h.is_empty()) {
                middleware = middleware.with_hooks(hooks);
            }
            built_ins.push(Arc::new(middleware));
        } else if self.compact_tool {
            return Err(BuildError::CompactWithoutSummarization);
        }
        built_ins.push(Arc::new(DanglingToolCallsMiddleware));
        if !self.memory.is_empty() {
            built_ins.push(Arc::new(MemoryMiddleware::new(
                Arc::clone(&backend),
                Self::parse_paths(&self.memory)?,
            )));
        }
        // Questions (`ask_user`) are not approvals, even where an application gates the tool.
        let approved: Vec<String> = explicit
            .keys()
            .chain(implied.keys())
            .filter(|name| *name != crate::tools::ask_user::ASK_USER)
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if !approved.is_empty() {
            built_ins.push(Arc::new(HumanInTheLoopMiddleware::new(approved)));
        }
        let middleware = compose(built_ins, self.middleware);
        // A user middleware that replaced the built-in one owns structured answers: the loop
        // then asks for `final_answer` only when the built-in is in the stack.
        let response_format =
            structured.is_some_and(|built_in| middleware.iter().any(|m| Arc::ptr_eq(m, &built_in)));

        let mut schema = StateSchema::default();
        for (key, reducer) in self.state_values {
            if key.starts_with(RESERVED_KEY_PREFIX) {
                return Err(BuildError::ReservedKey(key));
            }
            schema.declare_for(APPLICATION, key, reducer)?;
        }
        let mut tools = self.tools;
        for m in middleware.iter() {
            let owner = format!("middleware `{}`", m.name());
            for (key, reducer) in m.state_values() {
                schema.declare_for(&owner, key, reducer)?;
            }
            tools.extend(m.tools());
        }
        let tools = ToolRegistry::new(tools).map_err(|e| match e {
            RegistryError::Duplicate(name) => BuildError::DuplicateTool(name),
            RegistryError::InvalidName(name) => BuildError::InvalidToolName(name),
        })?;
        let offered = |name: &str| tools.specs().iter().any(|spec| spec.name == name);
        // Tools of a source are known only at run time, so with sources any name may be one.
        if let Some(tool) = explicit
            .keys()
            .find(|name| !offered(name) && self.tool_sources.is_empty())
        {
            return Err(BuildError::UnknownInterruptTool {
                tool: tool.clone(),
                offered: tools.specs().iter().map(|spec| spec.name.clone()).collect(),
            });
        }
        // A call to a tool that is not offered is answered as unknown, never held for approval.
        implied.retain(|name, _| offered(name));
        let mut interrupts = implied;
        interrupts.extend(explicit);
        Ok(Agent {
            inner: Arc::new(AgentConfig {
                name: self.name,
                model: self.model,
                system_prompt: self.system_prompt,
                settings: self.settings,
                middleware: middleware.into(),
                tools: Arc::new(tools),
                tool_sources: self.tool_sources,
                schema,
                limits: RunLimits {
                    max_turns: self.max_turns,
                    subagent_depth: self.max_subagent_depth,
                    subagent_concurrency: self.max_concurrent_subagents,
                },
                spend_limits: self.spend_limits,
                prices: self.prices,
                response_format,
                interrupts,
                shared_keys,
                checkpointer: self.checkpointer,
                background,
            }),
        })
    }
}

/// Splits built subagents into those `task` runs and the async ones.
fn split_async(
    all: BTreeMap<String, Registered>,
) -> (BTreeMap<String, Registered>, BTreeMap<String, Registered>) {
    all.into_iter().partition(|(_, r)| !r.asynchronous)
}
