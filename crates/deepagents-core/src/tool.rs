//! Tools: typed ones whose arguments are a Rust struct, and dynamic ones whose schema is known
//! only at run time.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::content::ContentBlock;
use crate::event::AgentPath;
use crate::run::PausedRun;
use crate::run_context::RunContext;
use crate::state::{AgentState, StateUpdate};

/// What a model is told about a tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Unique name the model calls it by.
    pub name: String,
    /// When and how to use it, with its limits.
    pub description: String,
    /// JSON schema of the arguments object, shared: a run offers the same tools at every
    /// model call, and a request is copied on its way through middleware.
    pub parameters: Arc<Value>,
}

/// What a tool hands back.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolOutput {
    /// What the model sees.
    pub content: Vec<ContentBlock>,
    /// Machine-readable data for the application, never sent to the model.
    pub artifact: Option<Value>,
    /// Changes to the agent state, merged after the step in call order.
    pub update: StateUpdate,
    /// Files the call changed outside the agent state (on disk, in a store), by the path the
    /// agent sees. When calls of one step change the same file, each is told which version
    /// stays, as for files in the state.
    pub changed_files: Vec<String>,
    /// The result is an error even though the call returned normally (its update still
    /// applies): a subagent that failed after changing files.
    pub is_error: bool,
    /// The run's final answer, given by the tool: once the step is done the turn closes with
    /// this text, without another model call (LangChain's `return_direct`). When several
    /// calls of a step give one, the first in call order wins; an error result gives none.
    pub final_answer: Option<String>,
    /// The call has not finished: an agent run it started paused for approval. The run keeps
    /// this in its control and pauses; once decided, the call runs again with it in
    /// [`ToolContext::paused`]. `content` and `update` are ignored.
    pub paused: Option<PausedRun>,
}

impl ToolOutput {
    /// Output made of one text block.
    pub fn text(text: impl Into<String>) -> Self {
        Self::blocks(vec![ContentBlock::text(text)])
    }

    /// Output made of content blocks.
    pub fn blocks(content: Vec<ContentBlock>) -> Self {
        Self {
            content,
            ..Self::default()
        }
    }

    /// Attaches a machine-readable artifact.
    pub fn with_artifact(mut self, artifact: Value) -> Self {
        self.artifact = Some(artifact);
        self
    }

    /// The call stops here and the run pauses until someone answers `request` (a question, a
    /// form: any JSON; `description` is what they are told). The answer resumes the same call:
    /// the tool `tool` runs again with the answers so far in [`ToolContext::answers`], so it
    /// asks only what is not answered yet. The pause is checkpointed like an approval: it
    /// survives a restart, and every front end shows it as an interrupt, answered with
    /// [`Decision::Respond`] or declined with [`Decision::Reject`].
    ///
    /// [`Decision::Respond`]: crate::interrupt::Decision::Respond
    /// [`Decision::Reject`]: crate::interrupt::Decision::Reject
    pub fn suspend(
        ctx: &ToolContext,
        tool: &str,
        request: Value,
        description: Option<String>,
    ) -> Self {
        let answers: Vec<Value> = ctx.answers(tool).iter().map(Answer::to_json).collect();
        let mut asked = crate::run::Run::default();
        let asked_so_far = answers.len();
        asked
            .state
            .custom
            .insert(ANSWERS_KEY.to_owned(), Value::Array(answers));
        asked.control.pending = vec![crate::interrupt::PendingAction {
            call_id: format!("{}-ask-{asked_so_far}", ctx.call_id),
            name: tool.to_owned(),
            arguments: request.clone(),
            description,
            allowed: vec![
                crate::interrupt::DecisionKind::Respond,
                crate::interrupt::DecisionKind::Reject,
            ],
            request: Some(request),
            path: AgentPath::default(),
        }];
        Self {
            paused: Some(PausedRun {
                subagent: tool.to_owned(),
                run: Box::new(asked),
                changed_files: Vec::new(),
            }),
            ..Self::default()
        }
    }

    /// Attaches a state update.
    pub fn with_update(mut self, update: StateUpdate) -> Self {
        self.update = update;
        self
    }

    /// Output for a call whose nested run paused (see [`paused`](Self::paused)).
    pub fn paused(run: PausedRun) -> Self {
        Self {
            paused: Some(run),
            ..Self::default()
        }
    }

    /// Ends the run with `answer` after this step (see [`final_answer`](Self::final_answer)).
    pub fn with_final_answer(mut self, answer: impl Into<String>) -> Self {
        self.final_answer = Some(answer.into());
        self
    }

    /// Marks the result as an error (see [`is_error`](Self::is_error)).
    pub fn as_error(mut self) -> Self {
        self.is_error = true;
        self
    }

    /// Records files changed outside the agent state (see [`changed_files`](Self::changed_files)).
    pub fn with_changed_files(mut self, files: impl IntoIterator<Item = String>) -> Self {
        self.changed_files.extend(files);
        self
    }
}

/// How a tool failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    /// The model can act on this: it becomes an error result and the run goes on. Say what went
    /// wrong and what to do next.
    #[error("{0}")]
    RespondToModel(String),
    /// Nothing the model does can help (a broken invariant, a lost connection the application
    /// must fix): the run stops with this error.
    #[error("{0}")]
    Fatal(String),
}

/// Read-only data the application passes to a run, such as a user id or an API handle.
/// Middleware and tools get it through [`RunContext::runtime`].
#[derive(Clone)]
pub struct RuntimeContext(Arc<dyn Any + Send + Sync>);

impl RuntimeContext {
    /// Wraps any value.
    pub fn new<T: Any + Send + Sync>(value: T) -> Self {
        Self(Arc::new(value))
    }

    /// The value, if it is a `T`.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.0.downcast_ref()
    }
}

impl Default for RuntimeContext {
    fn default() -> Self {
        Self::new(())
    }
}

impl fmt::Debug for RuntimeContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RuntimeContext(..)")
    }
}

/// Where a suspended call's stored run keeps the answers it got before the latest question.
const ANSWERS_KEY: &str = "answers";

/// An answer to what a tool asked with [`ToolOutput::suspend`].
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// The answer: the JSON a client resumed with, or the text a person typed (read as JSON
    /// when it is JSON).
    Given(Value),
    /// They declined; the reason, when given.
    Declined(Option<String>),
}

impl Answer {
    /// The answer a decision gives.
    fn of(decision: &crate::interrupt::Decision) -> Self {
        use crate::interrupt::Decision;
        match decision {
            Decision::Respond { message } => Self::Given(
                serde_json::from_str(message).unwrap_or_else(|_| Value::String(message.clone())),
            ),
            Decision::Reject { message } => Self::Declined(message.clone()),
            // Approval and edits are not offered for a question; read them as consent.
            Decision::Approve => Self::Given(Value::Bool(true)),
            Decision::Edit { arguments } => Self::Given(arguments.clone()),
        }
    }

    fn to_json(&self) -> Value {
        match self {
            Self::Given(value) => serde_json::json!({"given": value}),
            Self::Declined(reason) => serde_json::json!({"declined": reason}),
        }
    }

    fn from_json(value: &Value) -> Self {
        match value.get("given") {
            Some(given) => Self::Given(given.clone()),
            None => Self::Declined(
                value
                    .get("declined")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
            ),
        }
    }
}

/// What a tool gets besides its arguments.
#[derive(Clone, Debug)]
pub struct ToolContext {
    /// Id of the call being executed.
    pub call_id: String,
    /// The agent state as it was when the step began. Propose changes through
    /// [`ToolOutput::update`]; they are merged after the step.
    pub state: Arc<AgentState>,
    /// The run making the call: thread, ids, events (its path names the agent running the
    /// tool), cancellation (long tools should watch it and stop early), runtime data, the
    /// checkpoint a tool that runs an agent of its own puts that run under
    /// ([`Checkpointing::child`](crate::checkpoint::Checkpointing::child)), limits and per-run extensions.
    pub run: RunContext,
    /// When this call paused before ([`ToolOutput::paused`]), the run it paused in, with the
    /// decisions now in it: continue it instead of starting over.
    pub paused: Option<Arc<PausedRun>>,
}

impl ToolContext {
    /// A context for calling a tool outside a run (tests, direct use): a detached run.
    pub fn detached(call_id: impl Into<String>, state: Arc<AgentState>) -> Self {
        Self {
            call_id: call_id.into(),
            state,
            run: RunContext::detached("agent"),
            paused: None,
        }
    }

    /// The agent running the tool (`[]` for the main agent).
    pub fn agent_path(&self) -> &AgentPath {
        self.run.agent_path()
    }

    /// The answers this call of `tool` got to what it asked with [`ToolOutput::suspend`], in
    /// the order it asked; empty on its first run.
    pub fn answers(&self, tool: &str) -> Vec<Answer> {
        let Some(paused) = self.paused.as_deref().filter(|p| p.subagent == tool) else {
            return Vec::new();
        };
        let run = &paused.run;
        let mut answers: Vec<Answer> = run
            .state
            .custom
            .get(ANSWERS_KEY)
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(Answer::from_json)
            .collect();
        // The latest question's decision, once given.
        if let Some(decision) = run.control.decisions.values().next() {
            answers.push(Answer::of(decision));
        }
        answers
    }
}

/// A tool whose arguments are a typed struct; the JSON schema comes from [`JsonSchema`].
///
/// Arguments that do not deserialize are reported to the model by the run, so `call` only ever
/// sees well-formed input. Register it with `AgentBuilder::tool`.
pub trait Tool: Send + Sync + 'static {
    /// The arguments.
    type Args: DeserializeOwned + JsonSchema + Send;

    /// Unique name the model calls the tool by.
    fn name(&self) -> &str;

    /// When and how to use the tool, with its limits.
    fn description(&self) -> String;

    /// Whether the tool changes things outside the agent state (files, processes). Mutating
    /// calls of one step run one after another in call order; the others run concurrently.
    fn is_mutating(&self) -> bool {
        false
    }

    /// Runs the tool.
    fn call(
        &self,
        args: Self::Args,
        ctx: ToolContext,
    ) -> impl Future<Output = Result<ToolOutput, ToolError>> + Send;
}

/// A tool as the run sees it: arguments as JSON, schema as data.
///
/// Implement it directly for tools whose schema is known only at run time (MCP), or use
/// [`DynamicTool`], which also validates the arguments against the schema.
#[async_trait]
pub trait DynTool: Send + Sync {
    /// Name, description and schema.
    fn spec(&self) -> ToolSpec;

    /// See [`Tool::is_mutating`].
    fn is_mutating(&self) -> bool {
        false
    }

    /// Runs the tool. `args` is a JSON object; checking it against the schema is the
    /// implementation's job.
    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError>;
}

/// Adapts a [`Tool`] to [`DynTool`].
pub struct TypedTool<T: Tool> {
    tool: T,
    parameters: Arc<Value>,
    /// Checks arguments first, so a bad call is told the JSON path and the expected type of
    /// each wrong field (serde names neither). `None` if the generated schema does not compile.
    validator: Option<jsonschema::Validator>,
}

impl<T: Tool> TypedTool<T> {
    /// Wraps `tool`, generating its schema once.
    pub fn new(tool: T) -> Self {
        let parameters = parameters_schema::<T::Args>();
        let validator = jsonschema::validator_for(&parameters).ok();
        Self {
            tool,
            parameters: Arc::new(parameters),
            validator,
        }
    }
}

/// What is wrong with `args` by `validator`, for the model: up to five problems, each with
/// the JSON path of the field it concerns (`/todos/0/status`), or `None` when they are valid.
fn schema_problems(tool: &str, validator: &jsonschema::Validator, args: &Value) -> Option<String> {
    let problems: Vec<String> = validator
        .iter_errors(args)
        .take(5)
        .map(|e| {
            let mut text = e.to_string();
            // The message quotes the offending value, which may be a whole file.
            if text.len() > 300 {
                let cut = (0..=300)
                    .rev()
                    .find(|&i| text.is_char_boundary(i))
                    .unwrap_or(0);
                text.truncate(cut);
                text.push('…');
            }
            let at = e.instance_path().to_string();
            if at.is_empty() {
                text
            } else {
                format!("at {at}: {text}")
            }
        })
        .collect();
    (!problems.is_empty()).then(|| {
        format!(
            "Invalid arguments for `{tool}`: {}. Call it again with arguments that match its parameters schema.",
            problems.join("; ")
        )
    })
}

/// The JSON schema of `T` as a model expects it: self-contained, without `$schema` or `title`.
pub fn parameters_schema<T: JsonSchema>() -> Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|settings| settings.inline_subschemas = true)
        .into_generator();
    let mut schema = generator.into_root_schema_for::<T>().to_value();
    if let Value::Object(map) = &mut schema {
        map.remove("$schema");
        map.remove("title");
    }
    schema
}

#[async_trait]
impl<T: Tool> DynTool for TypedTool<T> {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: self.tool.name().to_owned(),
            description: self.tool.description(),
            parameters: Arc::clone(&self.parameters),
        }
    }

    fn is_mutating(&self) -> bool {
        self.tool.is_mutating()
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        if let Some(validator) = &self.validator
            && let Some(problems) = schema_problems(self.tool.name(), validator, &args)
        {
            return Err(ToolError::RespondToModel(problems));
        }
        let args: T::Args = serde_json::from_value(args).map_err(|e| {
            ToolError::RespondToModel(format!(
                "Invalid arguments for `{}`: {e}. Call it again with arguments that match its parameters schema.",
                self.tool.name()
            ))
        })?;
        self.tool.call(args, ctx).await
    }
}

type DynamicHandler = dyn Fn(Value, ToolContext) -> futures::future::BoxFuture<'static, Result<ToolOutput, ToolError>>
    + Send
    + Sync;

/// A tool defined at run time by a name, a description, a JSON schema and an async closure.
/// Arguments are validated against the schema before the closure runs.
pub struct DynamicTool {
    spec: ToolSpec,
    validator: jsonschema::Validator,
    mutating: bool,
    handler: Box<DynamicHandler>,
}

/// The schema given to [`DynamicTool::new`] is not a valid JSON schema.
#[derive(Debug, thiserror::Error)]
#[error("the parameters schema of tool `{tool}` is invalid: {message}")]
pub struct InvalidSchema {
    /// The tool.
    pub tool: String,
    /// What is wrong.
    pub message: String,
}

impl DynamicTool {
    /// Builds the tool; fails when `parameters` is not a valid JSON schema.
    pub fn new<F, Fut>(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: Value,
        handler: F,
    ) -> Result<Self, InvalidSchema>
    where
        F: Fn(Value, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
    {
        let name = name.into();
        let validator = jsonschema::validator_for(&parameters).map_err(|e| InvalidSchema {
            tool: name.clone(),
            message: e.to_string(),
        })?;
        Ok(Self {
            spec: ToolSpec {
                name,
                description: description.into(),
                parameters: Arc::new(parameters),
            },
            validator,
            mutating: false,
            handler: Box::new(move |args, ctx| Box::pin(handler(args, ctx))),
        })
    }

    /// Marks the tool as mutating (see [`Tool::is_mutating`]).
    pub fn mutating(mut self) -> Self {
        self.mutating = true;
        self
    }
}

#[async_trait]
impl DynTool for DynamicTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn is_mutating(&self) -> bool {
        self.mutating
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        if let Some(problems) = schema_problems(&self.spec.name, &self.validator, &args) {
            return Err(ToolError::RespondToModel(problems));
        }
        (self.handler)(args, ctx).await
    }
}

/// Tools that may change while an agent runs, such as those of an MCP server that announces
/// `list_changed`. Before each model call the run compares [`version`](Self::version) with the
/// one it last saw and, when it differs, asks for the tools again; the model is offered the
/// new set from that call on.
#[async_trait]
pub trait ToolSource: Send + Sync + 'static {
    /// A short name for logs and errors.
    fn name(&self) -> &str;

    /// A number that changes whenever the tools change.
    fn version(&self) -> u64;

    /// The tools as they are now.
    async fn tools(&self, run: &RunContext) -> Result<Vec<Arc<dyn DynTool>>, ToolSourceError>;
}

/// A [`ToolSource`] could not list its tools; the run keeps the tools it had.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("tool source `{source_name}` cannot list its tools: {message}")]
pub struct ToolSourceError {
    /// The source.
    pub source_name: String,
    /// What went wrong.
    pub message: String,
}
