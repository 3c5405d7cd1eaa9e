//! Custom middleware written in Python (LangChain's `AgentMiddleware`, and what its
//! decorators make), run from the core: each hook the object overrides is called through its
//! adapter (`deepagents_rs/_middleware.py`) with the state or the request as JSON; what the
//! hook returns comes back as a state update, a new request or a new result. Hooks the object
//! does not override cost nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use deepagents::core::{
    AgentState, AssistantMessage, FileContent, FileData, Message, ModelError, ModelRequest,
    ModelResponse, Reducer, RunContext, StateUpdate, StopReason, ToolCall, ToolContext, ToolError,
    ToolOutput, ToolSpec, Usage,
};
use deepagents::middleware::{Middleware, MiddlewareError, ModelNext, ToolNext};
use deepagents_langgraph::convert;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::model::{request_json, response_from_json};
use crate::tool::ToolCall as PyRuntime;

/// The hooks a Python middleware overrides, as the Python side found them.
#[derive(Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookSet {
    #[serde(default)]
    before_agent: bool,
    #[serde(default)]
    before_model: bool,
    #[serde(default)]
    after_model: bool,
    #[serde(default)]
    after_agent: bool,
    #[serde(default)]
    wrap_model_call: bool,
    #[serde(default)]
    wrap_tool_call: bool,
}

/// One Python middleware as `create_deep_agent` encodes it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MiddlewareConfig {
    pub name: String,
    /// Index of its adapter in the objects list.
    pub object: usize,
    pub hooks: HookSet,
    /// Keys of its `state_schema` beyond the agent's own (messages, todos, files…).
    #[serde(default)]
    pub state_keys: Vec<String>,
}

/// A Python middleware in the agent's stack.
pub struct PyMiddleware {
    name: String,
    adapter: Arc<Py<PyAny>>,
    hooks: HookSet,
    own_keys: Vec<String>,
    /// Every key the Python middleware declared: each hook sees all of them in the state.
    visible_keys: Arc<[String]>,
}

impl PyMiddleware {
    /// The middleware `config` describes, its adapter taken from `objects`.
    pub fn new(
        config: &MiddlewareConfig,
        objects: &[Arc<Py<PyAny>>],
        visible_keys: Arc<[String]>,
    ) -> Result<Self, String> {
        let adapter = objects
            .get(config.object)
            .ok_or_else(|| format!("middleware `{}` refers to no object", config.name))?;
        Ok(Self {
            // Prefixed: a built-in middleware of the same name would otherwise be replaced.
            name: format!("python:{}", config.name),
            adapter: Arc::clone(adapter),
            hooks: config.hooks,
            own_keys: config.state_keys.clone(),
            visible_keys,
        })
    }

    /// Calls `method` of the adapter with `payload` and the run's runtime, on a blocking-pool
    /// thread; its answer is JSON or `None`.
    async fn call(
        &self,
        method: &'static str,
        payload: Value,
        runtime: PyRuntime,
        handler: Option<Handler>,
    ) -> Result<Option<Value>, String> {
        let adapter = Arc::clone(&self.adapter);
        let name = self.name.clone();
        let answer = tokio::task::spawn_blocking(move || {
            Python::attach(|py| -> PyResult<Option<String>> {
                let runtime = Py::new(py, runtime)?;
                let bound = adapter.bind(py);
                let answer = match handler {
                    Some(Handler::Model(h)) => {
                        bound.call_method1(method, (payload.to_string(), runtime, h))?
                    }
                    Some(Handler::Tool(h)) => {
                        bound.call_method1(method, (payload.to_string(), runtime, h))?
                    }
                    None => bound.call_method1(method, (payload.to_string(), runtime))?,
                };
                answer.extract()
            })
        })
        .await
        .map_err(|e| format!("middleware `{name}` crashed in {method}: {e}"))?
        .map_err(|e| format!("middleware `{name}` failed in {method}: {e}"))?;
        answer
            .map(|text| {
                serde_json::from_str(&text)
                    .map_err(|e| format!("middleware `{name}` answered {method} badly: {e}"))
            })
            .transpose()
    }

    /// The state as the hooks see it: the thread's values plus the declared keys.
    fn state_json(&self, state: &AgentState) -> Value {
        state_json(state, &self.visible_keys)
    }
}

enum Handler {
    Model(ModelHandler),
    Tool(ToolHandler),
}

/// The state as LangGraph values (messages as LangChain dicts, todos, files) with the custom
/// keys `keys` names.
fn state_json(state: &AgentState, keys: &[String]) -> Value {
    let run = deepagents::core::Run {
        state: state.clone(),
        ..deepagents::core::Run::default()
    };
    let mut values = convert::values(&run, "");
    if let Value::Object(map) = &mut values {
        for key in keys {
            if let Some(value) = state.custom.get(key) {
                map.insert(key.clone(), value.clone());
            }
        }
    }
    values
}

/// A hook's update as the Python side computed it against the state it was given.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct HookUpdate {
    #[serde(default)]
    messages_from: Option<usize>,
    #[serde(default)]
    messages: Vec<Value>,
    #[serde(default)]
    todos: Option<Value>,
    #[serde(default)]
    files: Option<Map<String, Value>>,
    #[serde(default)]
    custom: BTreeMap<String, Value>,
    /// `"end"`: the run ends now (LangChain's `jump_to`).
    #[serde(default)]
    jump_to: Option<String>,
}

impl HookUpdate {
    fn state_update(self, state: &AgentState) -> Result<StateUpdate, String> {
        let mut update = StateUpdate {
            messages_from: self.messages_from,
            messages: self
                .messages
                .iter()
                .map(convert::message_from)
                .collect::<Result<_, _>>()?,
            custom: self.custom,
            ..StateUpdate::default()
        };
        if let Some(todos) = self.todos {
            update.todos = Some(
                serde_json::from_value(todos)
                    .map_err(|e| format!("`todos` must be a list of {{content, status}}: {e}"))?,
            );
        }
        for (path, file) in self.files.unwrap_or_default() {
            let file = match file {
                Value::Null => None,
                Value::String(text) => Some(text),
                other => Some(
                    other
                        .get("content")
                        .and_then(Value::as_str)
                        .ok_or_else(|| format!("file `{path}` needs a text `content`"))?
                        .to_owned(),
                ),
            };
            let file = file.map(|text| {
                let now = convert::now_ms();
                FileData {
                    content: FileContent::Text { text },
                    modified_at_ms: now,
                    created_at_ms: 0,
                }
                .replacing(state.files.get(&path))
            });
            update.files.insert(path, file);
        }
        Ok(update)
    }
}

/// What a run's Python middleware hand from their `before_model` to their
/// `wrap_model_call`, by middleware name.
#[derive(Default)]
struct CallPlan {
    /// Whose `before_model` said `jump_to: "end"`, with the AI message the hook gave as the
    /// answer.
    ending: Mutex<BTreeMap<String, Option<AssistantMessage>>>,
    /// The state a `wrap_model_call` hook sees as `request.state`.
    state: Mutex<BTreeMap<String, Value>>,
}

fn hook_error(error: String) -> MiddlewareError {
    MiddlewareError::new(error)
}

#[async_trait]
impl Middleware for PyMiddleware {
    fn name(&self) -> &str {
        &self.name
    }

    fn state_values(&self) -> Vec<(String, Reducer)> {
        self.own_keys
            .iter()
            .map(|key| (key.clone(), Reducer::Replace))
            .collect()
    }

    async fn before_run(
        &self,
        ctx: &RunContext,
        state: &AgentState,
    ) -> Result<StateUpdate, MiddlewareError> {
        if !self.hooks.before_agent {
            return Ok(StateUpdate::default());
        }
        let runtime = PyRuntime::of_run(ctx, String::new(), Arc::new(state.clone()));
        let answer = self
            .call("before_agent", self.state_json(state), runtime, None)
            .await
            .map_err(hook_error)?;
        let update: HookUpdate = parse(answer, "before_agent")?;
        if update.jump_to.is_some() {
            return Err(MiddlewareError::new(format!(
                "middleware `{}`: jump_to from before_agent is not supported; return it from before_model or after_model",
                self.name
            )));
        }
        update.state_update(state).map_err(hook_error)
    }

    async fn prepare_model_call(
        &self,
        ctx: &RunContext,
        _request: &ModelRequest,
        state: &AgentState,
    ) -> Result<StateUpdate, MiddlewareError> {
        if !self.hooks.before_model {
            return Ok(StateUpdate::default());
        }
        let runtime = PyRuntime::of_run(ctx, String::new(), Arc::new(state.clone()));
        let answer = self
            .call("before_model", self.state_json(state), runtime, None)
            .await
            .map_err(hook_error)?;
        let mut update: HookUpdate = parse(answer, "before_model")?;
        match update.jump_to.as_deref() {
            None => {}
            Some("end") => {
                // The hook's own answer, when it ends with one, is the run's answer: it joins
                // the conversation as the model's turn rather than twice.
                let reply = match update.messages.last().map(convert::message_from) {
                    Some(Ok(Message::Assistant(reply))) => {
                        update.messages.pop();
                        Some(reply)
                    }
                    _ => None,
                };
                ctx.extensions
                    .get_or_insert_with(CallPlan::default)
                    .ending
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(self.name.clone(), reply);
            }
            Some(other) => return Err(unsupported_jump(&self.name, other)),
        }
        update.state_update(state).map_err(hook_error)
    }

    async fn before_model(
        &self,
        ctx: &RunContext,
        _request: &mut ModelRequest,
        state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        if self.hooks.wrap_model_call {
            ctx.extensions
                .get_or_insert_with(CallPlan::default)
                .state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(self.name.clone(), self.state_json(state));
        }
        Ok(())
    }

    async fn wrap_model_call(
        &self,
        request: ModelRequest,
        next: ModelNext,
    ) -> Result<ModelResponse, ModelError> {
        let plan = next
            .context()
            .extensions
            .get_or_insert_with(CallPlan::default);
        let ending = plan
            .ending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.name);
        if let Some(reply) = ending {
            return Ok(ModelResponse {
                message: reply.unwrap_or_else(|| AssistantMessage::text("")),
                usage: Usage::default(),
                stop_reason: StopReason::EndTurn,
            });
        }
        if !self.hooks.wrap_model_call {
            return next.call(request).await;
        }
        let run = next.context().clone();
        let handler = ModelHandler {
            next,
            request: request.clone(),
            last: Arc::default(),
        };
        let last = Arc::clone(&handler.last);
        let state = Arc::new(AgentState {
            messages: request.messages.clone(),
            ..AgentState::default()
        });
        let runtime = PyRuntime::of_run(&run, String::new(), state);
        let mut payload = request_json(&request);
        if let Some(state) = plan
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.name)
        {
            payload["state"] = state;
        }
        let answer = self
            .call(
                "wrap_model_call",
                payload,
                runtime,
                Some(Handler::Model(handler)),
            )
            .await
            .map_err(|message| ModelError::Other { message })?;
        let answer = answer.ok_or_else(|| ModelError::Other {
            message: format!(
                "middleware `{}`: wrap_model_call returned nothing",
                self.name
            ),
        })?;
        let mut response = response_from_json(&answer).map_err(|e| ModelError::Other {
            message: format!("middleware `{}`: wrap_model_call: {e}", self.name),
        })?;
        // What the calls it made spent is spent, whatever answer it returns.
        if let Some(made) = last.lock().unwrap_or_else(PoisonError::into_inner).take() {
            response.usage = made.usage;
            if response.message.tool_calls.is_empty() && made.stop_reason == StopReason::MaxTokens {
                response.stop_reason = made.stop_reason;
            }
        }
        Ok(response)
    }

    async fn after_model(
        &self,
        ctx: &RunContext,
        response: &mut ModelResponse,
        state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        if !self.hooks.after_model {
            return Ok(());
        }
        let mut with_answer = state.clone();
        with_answer
            .messages
            .push(Message::Assistant(response.message.clone()));
        let answer_index = state.messages.len();
        let runtime = PyRuntime::of_run(ctx, String::new(), Arc::new(with_answer.clone()));
        let answer = self
            .call("after_model", self.state_json(&with_answer), runtime, None)
            .await
            .map_err(hook_error)?;
        let update: HookUpdate = parse(answer, "after_model")?;
        let unsupported = |what: &str| {
            MiddlewareError::new(format!(
                "middleware `{}`: after_model can replace the model's message or end the run (jump_to \"end\"), not {what}; change other state from before_model",
                self.name
            ))
        };
        if update.todos.is_some() || update.files.is_some() || !update.custom.is_empty() {
            return Err(unsupported("change todos, files or custom keys"));
        }
        match (update.messages_from, update.messages.as_slice()) {
            (None, []) => {}
            (Some(from), [replacement]) if from == answer_index => {
                match convert::message_from(replacement).map_err(hook_error)? {
                    Message::Assistant(message) => response.message = message,
                    _ => return Err(unsupported("replace it with a message of another kind")),
                }
            }
            _ => return Err(unsupported("add or remove messages")),
        }
        match update.jump_to.as_deref() {
            None => {}
            Some("end") => response.message.tool_calls.clear(),
            Some(other) => return Err(unsupported_jump(&self.name, other)),
        }
        Ok(())
    }

    async fn wrap_tool_call(
        &self,
        call: ToolCall,
        ctx: ToolContext,
        next: ToolNext,
    ) -> Result<ToolOutput, ToolError> {
        if !self.hooks.wrap_tool_call {
            return next.call(call, ctx).await;
        }
        let payload = json!({"name": call.name, "args": call.arguments, "id": call.id});
        let runtime = PyRuntime::of_run(&ctx.run, ctx.call_id.clone(), Arc::clone(&ctx.state));
        let handler = ToolHandler {
            next,
            ctx,
            call,
            last: Arc::default(),
        };
        let last = Arc::clone(&handler.last);
        let answer = self
            .call(
                "wrap_tool_call",
                payload,
                runtime,
                Some(Handler::Tool(handler)),
            )
            .await
            .map_err(ToolError::Fatal)?
            .ok_or_else(|| {
                ToolError::Fatal(format!(
                    "middleware `{}`: wrap_tool_call returned nothing",
                    self.name
                ))
            })?;
        let made = last.lock().unwrap_or_else(PoisonError::into_inner).take();
        if answer.get("unchanged").and_then(Value::as_bool) == Some(true) {
            return made.unwrap_or_else(|| {
                Err(ToolError::Fatal(format!(
                    "middleware `{}`: wrap_tool_call returned a result it did not get",
                    self.name
                )))
            });
        }
        let content = answer
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if answer.get("status").and_then(Value::as_str) == Some("error") {
            return Err(ToolError::RespondToModel(content));
        }
        // A result rewritten from the tool's keeps what the tool changed.
        let mut output = match made {
            Some(Ok(output)) => output,
            _ => ToolOutput::text(""),
        };
        output.content = vec![deepagents::core::ContentBlock::text(content)];
        output.is_error = false;
        Ok(output)
    }

    async fn after_run(&self, ctx: &RunContext, state: &AgentState) -> Result<(), MiddlewareError> {
        if !self.hooks.after_agent {
            return Ok(());
        }
        let runtime = PyRuntime::of_run(ctx, String::new(), Arc::new(state.clone()));
        let answer = self
            .call("after_agent", self.state_json(state), runtime, None)
            .await
            .map_err(hook_error)?;
        let update: HookUpdate = parse(answer, "after_agent")?;
        if update.messages_from.is_some()
            || !update.messages.is_empty()
            || update.todos.is_some()
            || update.files.is_some()
            || !update.custom.is_empty()
            || update.jump_to.is_some()
        {
            return Err(MiddlewareError::new(format!(
                "middleware `{}`: after_agent cannot change the state (the run has ended); return the change from after_model or before_model",
                self.name
            )));
        }
        Ok(())
    }
}

fn parse(answer: Option<Value>, hook: &str) -> Result<HookUpdate, MiddlewareError> {
    match answer {
        None => Ok(HookUpdate::default()),
        Some(value) => serde_json::from_value(value)
            .map_err(|e| MiddlewareError::new(format!("{hook} returned a bad update: {e}"))),
    }
}

fn unsupported_jump(name: &str, target: &str) -> MiddlewareError {
    MiddlewareError::new(format!(
        "middleware `{name}`: jump_to {target:?} is not supported; only \"end\" is"
    ))
}

/// The `handler` a Python `wrap_model_call` gets: calls the rest of the chain with the
/// request it is given (JSON) and answers the model's response (JSON). Blocks its thread,
/// with the GIL released, until the model answers.
#[pyclass(frozen, module = "deepagents_rs._native")]
pub struct ModelHandler {
    next: ModelNext,
    /// The request as the hook got it: what the Python side leaves out stays as it was.
    request: ModelRequest,
    /// The response of the latest call, for its usage.
    last: Arc<Mutex<Option<ModelResponse>>>,
}

#[pymethods]
impl ModelHandler {
    fn __call__(&self, py: Python<'_>, request_json: String) -> PyResult<String> {
        let request = self
            .request_from(&request_json)
            .map_err(|e| PyRuntimeError::new_err(format!("bad model request: {e}")))?;
        let runtime = crate::runtime()?;
        let response = py
            .detach(|| runtime.block_on(self.next.call(request)))
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let answer = json!({
            "message": convert::message(usize::MAX, &Message::Assistant(response.message.clone())),
            "usage": {"input_tokens": response.usage.input_tokens, "output_tokens": response.usage.output_tokens},
        });
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(response);
        Ok(answer.to_string())
    }
}

impl ModelHandler {
    /// The request the hook passed on: system prompt, messages, tools (by name, or new ones
    /// as `{name, description, parameters}`) and settings.
    fn request_from(&self, text: &str) -> Result<ModelRequest, String> {
        let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let mut request = self.request.clone();
        if let Some(system) = value.get("system") {
            request.system_prompt = system.as_str().map(str::to_owned);
        }
        if let Some(Value::Array(messages)) = value.get("messages") {
            request.messages = messages
                .iter()
                .map(convert::message_from)
                .collect::<Result<Vec<_>, _>>()?
                .into();
        }
        if let Some(Value::Array(tools)) = value.get("tools") {
            let mut kept = Vec::with_capacity(tools.len());
            for tool in tools {
                match tool {
                    Value::String(name) => kept.push(
                        self.request
                            .tools
                            .iter()
                            .find(|spec| &spec.name == name)
                            .cloned()
                            .ok_or_else(|| format!("no tool `{name}` in the request"))?,
                    ),
                    spec => kept.push(serde_json::from_value::<ToolSpec>(spec.clone()).map_err(
                        |e| {
                            format!(
                                "a tool must be a name or {{name, description, parameters}}: {e}"
                            )
                        },
                    )?),
                }
            }
            request.tools = kept;
        }
        if let Some(settings) = value.get("settings") {
            request.settings = serde_json::from_value(settings.clone())
                .map_err(|e| format!("bad model settings: {e}"))?;
        }
        Ok(request)
    }
}

/// The `handler` a Python `wrap_tool_call` gets: runs the call (JSON `{name, args, id}`)
/// through the rest of the chain and answers `{content, status}`.
#[pyclass(frozen, module = "deepagents_rs._native")]
pub struct ToolHandler {
    next: ToolNext,
    ctx: ToolContext,
    call: ToolCall,
    last: Arc<Mutex<Option<Result<ToolOutput, ToolError>>>>,
}

#[pymethods]
impl ToolHandler {
    fn __call__(&self, py: Python<'_>, call_json: String) -> PyResult<String> {
        let value: Value = serde_json::from_str(&call_json)
            .map_err(|e| PyRuntimeError::new_err(format!("bad tool call: {e}")))?;
        let mut call = self.call.clone();
        if let Some(name) = value.get("name").and_then(Value::as_str) {
            call.name = name.to_owned();
        }
        if let Some(args) = value.get("args") {
            call.arguments = args.clone();
        }
        let runtime = crate::runtime()?;
        let outcome = py.detach(|| runtime.block_on(self.next.call(call, self.ctx.clone())));
        let answer = match &outcome {
            Ok(output) => json!({
                "content": deepagents::core::content::joined_text(&output.content),
                "status": if output.is_error { "error" } else { "success" },
            }),
            Err(ToolError::RespondToModel(message)) => {
                json!({"content": message, "status": "error"})
            }
            Err(ToolError::Fatal(message)) => {
                return Err(PyRuntimeError::new_err(message.clone()));
            }
        };
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Some(outcome);
        Ok(answer.to_string())
    }
}
