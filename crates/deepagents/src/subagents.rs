//! Subagents: agents the main agent hands self-contained work to through the `task` tool.

use std::collections::BTreeMap;
use std::sync::Arc;

use deepagents_backends::Permissions;
use deepagents_core::{DynTool, Model, Tool, TypedTool};
use serde_json::Value;

use crate::agent::Agent;
use crate::approval::InterruptConfig;
use crate::frontmatter::{self, FrontmatterError};
use crate::middleware::Middleware;

/// The name of the subagent added by default.
pub const GENERAL_PURPOSE: &str = "general-purpose";

/// Subagents may nest this deep unless [`AgentBuilder::subagent_limits`](crate::AgentBuilder::subagent_limits) says otherwise.
/// Along a chain of nested agents the strictest depth limit applies.
pub const DEFAULT_MAX_DEPTH: usize = 3;
/// Subagents that may work at once unless configured otherwise; more wait their turn. The
/// limit of the agent a run starts from bounds its whole tree of subagents, nested ones
/// included (see [`AgentBuilder::subagent_limits`](crate::AgentBuilder::subagent_limits)).
pub const DEFAULT_MAX_CONCURRENT: usize = 8;

/// How a subagent's run begins.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SubAgentMode {
    /// A clean context holding only the task description (the default).
    #[default]
    Isolated,
    /// The conversation of the agent making the `task` call, as its model last saw it (after
    /// summarization), without the turn that made the call, then the task description. The
    /// subagent continues in a context of its own; only its final answer goes back.
    Fork,
}

impl SubAgentMode {
    /// `isolated` or `fork`, as configuration files spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Isolated => "isolated",
            Self::Fork => "fork",
        }
    }
}

impl std::fmt::Display for SubAgentMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A mode name other than `isolated` and `fork`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid subagent mode `{0}`; expected `isolated` or `fork`")]
pub struct InvalidSubAgentMode(pub String);

impl std::str::FromStr for SubAgentMode {
    type Err = InvalidSubAgentMode;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "isolated" => Ok(Self::Isolated),
            "fork" => Ok(Self::Fork),
            other => Err(InvalidSubAgentMode(other.to_owned())),
        }
    }
}

/// A subagent the `task` tool can start.
#[derive(Clone)]
pub struct SubAgent {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) kind: SubAgentKind,
    pub(crate) mode: SubAgentMode,
    /// Started in the background with `start_async_task` instead of `task`.
    pub(crate) asynchronous: bool,
}

#[derive(Clone)]
pub(crate) enum SubAgentKind {
    /// Built by the parent from this spec, inheriting what is not set.
    Spec(Box<SubAgentSpec>),
    /// A ready agent, used as is.
    Prebuilt(Agent),
}

/// What a spec sets; unset parts are inherited from the parent agent.
#[derive(Clone, Default)]
pub(crate) struct SubAgentSpec {
    pub(crate) system_prompt: String,
    pub(crate) tools: Option<Vec<Arc<dyn DynTool>>>,
    pub(crate) model: Option<Arc<dyn Model>>,
    pub(crate) middleware: Vec<Arc<dyn Middleware>>,
    pub(crate) permissions: Option<Permissions>,
    pub(crate) response_format: Option<Value>,
    /// Its own skill sources; the parent's are never inherited.
    pub(crate) skills: Vec<String>,
    /// Its own interrupt configuration, replacing the parent's; `None` inherits it.
    pub(crate) interrupts: Option<BTreeMap<String, InterruptConfig>>,
}

impl SubAgent {
    /// A subagent named `name` (what the model passes as `subagent_type`), described by
    /// `description` (when to use it, shown in the `task` tool), driven by `system_prompt`.
    /// It inherits the parent's model, tools, backend, permissions, interrupt configuration
    /// and custom state declarations unless set here; it never inherits the parent's skills,
    /// memory, middleware or subagents.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        system_prompt: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            kind: SubAgentKind::Spec(Box::new(SubAgentSpec {
                system_prompt: system_prompt.into(),
                ..SubAgentSpec::default()
            })),
            mode: SubAgentMode::Isolated,
            asynchronous: false,
        }
    }

    /// A ready-made agent as a subagent: it runs exactly as built (the settings of a spec have
    /// no effect on it), except that the parent's depth and concurrency limits still bound it.
    pub fn from_agent(
        name: impl Into<String>,
        description: impl Into<String>,
        agent: Agent,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            kind: SubAgentKind::Prebuilt(agent),
            mode: SubAgentMode::Isolated,
            asynchronous: false,
        }
    }

    fn spec(&mut self) -> Option<&mut SubAgentSpec> {
        match &mut self.kind {
            SubAgentKind::Spec(spec) => Some(spec),
            SubAgentKind::Prebuilt(_) => None,
        }
    }

    /// When to use it, as the model is told.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// How its runs begin (default [`SubAgentMode::Isolated`]).
    ///
    /// A [`Fork`](SubAgentMode::Fork) built from a spec also inherits the parent's system
    /// prompt (its own [`system_prompt`](Self::new) is appended to it), middleware (one of its
    /// own with the same name replaces the inherited one), skills, memory and summarization
    /// settings; setting [`skills`](Self::skills) on a fork is refused when the agent is
    /// built. It does not inherit the parent's subagents: it cannot start subagents itself.
    /// A fork made [`from_agent`](Self::from_agent) receives the forked conversation but
    /// keeps its own prompt and middleware.
    pub fn mode(mut self, mode: SubAgentMode) -> Self {
        self.mode = mode;
        self
    }

    /// Makes it an async subagent (the reference's `async: true`): the model starts it in
    /// the background with `start_async_task` instead of waiting on `task`, goes on with
    /// its own work, and can check, update, cancel and list it like a remote agent's task.
    /// It runs in a clean context (the mode is ignored) in a child thread of the parent's
    /// thread, so the parent needs a checkpointer. When it ends, its answer is delivered to
    /// the parent as a message: at the parent's next model call when a run is going, and as
    /// a new turn when the thread is idle ([`Input::Wake`](crate::Input::Wake)).
    pub fn asynchronous(mut self, asynchronous: bool) -> Self {
        self.asynchronous = asynchronous;
        self
    }

    /// Whether it is an async subagent ([`asynchronous`](Self::asynchronous)).
    pub fn is_async(&self) -> bool {
        self.asynchronous
    }

    /// The mode set with [`mode`](Self::mode).
    pub fn context_mode(&self) -> SubAgentMode {
        self.mode
    }

    /// Its own model instead of the parent's. No effect on [`from_agent`](Self::from_agent).
    pub fn model(mut self, model: Arc<dyn Model>) -> Self {
        if let Some(spec) = self.spec() {
            spec.model = Some(model);
        }
        self
    }

    /// Adds a typed tool; once any tool is given, the parent's own tools are not inherited
    /// (the file tools always are).
    pub fn tool(mut self, tool: impl Tool) -> Self {
        if let Some(spec) = self.spec() {
            spec.tools
                .get_or_insert_with(Vec::new)
                .push(Arc::new(TypedTool::new(tool)));
        }
        self
    }

    /// Adds a dynamic tool (see [`tool`](Self::tool)).
    pub fn dyn_tool(mut self, tool: Arc<dyn DynTool>) -> Self {
        if let Some(spec) = self.spec() {
            spec.tools.get_or_insert_with(Vec::new).push(tool);
        }
        self
    }

    /// Adds a middleware.
    pub fn middleware(mut self, middleware: impl Middleware) -> Self {
        if let Some(spec) = self.spec() {
            spec.middleware.push(Arc::new(middleware));
        }
        self
    }

    /// Permission rules replacing the parent's.
    pub fn permissions(mut self, permissions: Permissions) -> Self {
        if let Some(spec) = self.spec() {
            spec.permissions = Some(permissions);
        }
        self
    }

    /// Makes calls to `tool` inside this subagent pause for a human decision (see
    /// [`AgentBuilder::interrupt_on`](crate::AgentBuilder::interrupt_on)). The first call
    /// replaces the parent's whole configuration, which the subagent otherwise inherits.
    /// Interrupt-mode permission rules still ask for approval; set
    /// [`permissions`](Self::permissions) to change those.
    pub fn interrupt_on(mut self, tool: impl Into<String>, config: InterruptConfig) -> Self {
        if let Some(spec) = self.spec() {
            spec.interrupts
                .get_or_insert_with(BTreeMap::new)
                .insert(tool.into(), config);
        }
        self
    }

    /// Drops the parent's interrupt configuration: none of this subagent's calls pause
    /// (except those of interrupt-mode permission rules; see [`interrupt_on`](Self::interrupt_on)).
    pub fn no_interrupts(mut self) -> Self {
        if let Some(spec) = self.spec() {
            spec.interrupts = Some(BTreeMap::new());
        }
        self
    }

    /// Skill directories (absolute backend paths, lowest precedence first) listed in this
    /// subagent's prompt. The parent's skills are not inherited.
    pub fn skills<S: Into<String>>(mut self, dirs: impl IntoIterator<Item = S>) -> Self {
        if let Some(spec) = self.spec() {
            spec.skills.extend(dirs.into_iter().map(Into::into));
        }
        self
    }

    /// Requires a structured answer; the `task` result is then that JSON.
    pub fn response_format(mut self, schema: Value) -> Self {
        if let Some(spec) = self.spec() {
            spec.response_format = Some(schema);
        }
        self
    }

    /// The name the model uses.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A subagent defined in markdown: YAML frontmatter with `name`, `description`, an
    /// optional `model` spec, an optional `mode` (`isolated` or `fork`, see
    /// [`mode`](Self::mode)) and an optional `async` (`true` makes it an async subagent, see
    /// [`asynchronous`](Self::asynchronous)), then the system prompt as the body. `source_name` (usually the
    /// file path) appears in errors.
    pub fn from_markdown(source_name: &str, text: &str) -> Result<Self, FrontmatterError> {
        let (meta, body): (MarkdownMeta, String) = frontmatter::parse(source_name, text)?;
        let error = |message: String| FrontmatterError {
            source_name: source_name.to_owned(),
            message,
        };
        if meta.name.trim().is_empty() || meta.description.trim().is_empty() {
            return Err(error(
                "`name` and `description` must not be empty".to_owned(),
            ));
        }
        let mode = match &meta.mode {
            Some(mode) => mode
                .trim()
                .parse::<SubAgentMode>()
                .map_err(|e| error(e.to_string()))?,
            None => SubAgentMode::Isolated,
        };
        // A fork's body is only an addendum to the inherited prompt, so it may be empty.
        if body.is_empty() && mode == SubAgentMode::Isolated {
            return Err(error(
                "the body (the subagent's system prompt) is empty".to_owned(),
            ));
        }
        let mut subagent = Self::new(meta.name, meta.description, body)
            .mode(mode)
            .asynchronous(meta.asynchronous);
        if let Some(spec) = meta.model {
            let model = deepagents_models::from_spec(&spec)
                .map_err(|e| error(format!("model `{spec}`: {}", error_chain(&e))))?;
            subagent = subagent.model(model);
        }
        Ok(subagent)
    }
}

/// Frontmatter of a markdown subagent.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct MarkdownMeta {
    name: String,
    description: String,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    mode: Option<String>,
    /// The reference's spelling of an async subagent.
    #[serde(default, rename = "async")]
    asynchronous: bool,
}

/// The general-purpose subagent's prompt.
pub(crate) const GENERAL_PURPOSE_PROMPT: &str = "\
You are a subagent: you were handed one task by another agent, which sees only your final \
answer. Do the task completely with your tools, then reply with exactly what the other agent \
needs: the result, the files you changed, and anything left undone. Be concise.";

/// The general-purpose subagent's description.
pub(crate) const GENERAL_PURPOSE_DESCRIPTION: &str = "\
An agent with the same tools as you, for any self-contained piece of work (research across many \
files, a multi-step change) whose details you do not need in your own context.";

/// `error` and its sources, one after another (the OS reason of a missing script is a source).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
