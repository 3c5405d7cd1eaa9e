//! Python functions as agent tools.

use std::sync::Arc;

use async_trait::async_trait;
use deepagents::core::{
    AgentState, Answer, DynTool, Run, RunContext, ToolContext, ToolError, ToolOutput, ToolSpec,
};
use pyo3::prelude::*;
use serde_json::Value;

/// What a run hands the Python side besides its input: the `context` object of `invoke`
/// and the event loop async tools run on. Kept in the run's runtime context.
pub struct RunData {
    /// `invoke(…, context=…)`, `None` when not given.
    pub context: Py<PyAny>,
    /// The asyncio loop async tools are scheduled on (the caller's in `ainvoke`).
    pub event_loop: Py<PyAny>,
}

/// A Python function the model can call. `function` is the package's adapter: it takes
/// the arguments as JSON and a [`ToolCall`], and returns `{"content": str, "error": bool}`
/// as JSON (exceptions already turned into error results).
pub struct PyTool {
    pub spec: ToolSpec,
    pub function: Arc<Py<PyAny>>,
    pub mutating: bool,
}

#[async_trait]
impl DynTool for PyTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn is_mutating(&self) -> bool {
        self.mutating
    }

    async fn call(&self, args: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let mut call = ToolCall::of_run(&ctx.run, ctx.call_id.clone(), Arc::clone(&ctx.state));
        call.answers = ctx.answers(&self.spec.name);
        let function = Arc::clone(&self.function);
        let name = self.spec.name.clone();
        // Python runs on a blocking-pool thread, so the loop's workers never wait for the GIL.
        let answer = tokio::task::spawn_blocking(move || {
            Python::attach(|py| -> PyResult<String> {
                function.call1(py, (args.to_string(), call))?.extract(py)
            })
        })
        .await
        .map_err(|e| ToolError::Fatal(format!("the Python tool `{name}` crashed: {e}")))?
        .map_err(|e| {
            ToolError::Fatal(format!("the adapter of Python tool `{name}` failed: {e}"))
        })?;
        let answer: Value = serde_json::from_str(&answer).map_err(|e| {
            ToolError::Fatal(format!(
                "the Python tool `{}` answered badly: {e}",
                self.spec.name
            ))
        })?;
        if let Some(request) = answer.get("suspend") {
            let description = answer
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_owned);
            return Ok(ToolOutput::suspend(
                &ctx,
                &self.spec.name,
                request.clone(),
                description,
            ));
        }
        let content = answer
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if answer.get("error").and_then(Value::as_bool) == Some(true) {
            return Err(ToolError::RespondToModel(content));
        }
        let mut output = ToolOutput::text(content);
        if let Some(final_answer) = answer.get("final_answer").and_then(Value::as_str) {
            output = output.with_final_answer(final_answer);
        }
        Ok(output)
    }
}

/// The runtime a Python tool sees (`ToolRuntime` on the Python side wraps it): the call's
/// id, the thread, the `context` object, the event loop, and the state on request.
#[pyclass(frozen, module = "deepagents_rs._native")]
pub struct ToolCall {
    tool_call_id: String,
    thread_id: Option<String>,
    assistant_id: Option<String>,
    data: Option<Arc<RunData>>,
    state: Arc<AgentState>,
    /// What `interrupt(…)` calls of this tool call were answered, in order.
    answers: Vec<Answer>,
}

impl ToolCall {
    /// The runtime of `run` as a Python hook or tool sees it; `tool_call_id` is empty outside
    /// tool calls.
    pub fn of_run(run: &RunContext, tool_call_id: String, state: Arc<AgentState>) -> Self {
        Self {
            tool_call_id,
            thread_id: run.thread_id.clone(),
            assistant_id: Some(run.assistant_id.clone()),
            data: run.runtime.get::<Arc<RunData>>().cloned(),
            state,
            answers: Vec::new(),
        }
    }
}

#[pymethods]
impl ToolCall {
    /// The id of the model's call.
    #[getter]
    fn tool_call_id(&self) -> &str {
        &self.tool_call_id
    }

    /// The thread the run belongs to, when the caller gave one.
    #[getter]
    fn thread_id(&self) -> Option<&str> {
        self.thread_id.as_deref()
    }

    /// The agent's name (or the assistant the run acts for).
    #[getter]
    fn assistant_id(&self) -> Option<&str> {
        self.assistant_id.as_deref()
    }

    /// `invoke(…, context=…)`.
    #[getter]
    fn context(&self, py: Python<'_>) -> Py<PyAny> {
        match &self.data {
            Some(data) => data.context.clone_ref(py),
            None => py.None(),
        }
    }

    /// The asyncio loop async tools run on.
    #[getter]
    fn event_loop(&self, py: Python<'_>) -> Py<PyAny> {
        match &self.data {
            Some(data) => data.event_loop.clone_ref(py),
            None => py.None(),
        }
    }

    /// The answers to this call's earlier `interrupt(…)` calls, as a JSON list of
    /// `{"given": value}` or `{"declined": reason}`.
    fn answers_json(&self) -> String {
        Value::Array(
            self.answers
                .iter()
                .map(|answer| match answer {
                    Answer::Given(value) => serde_json::json!({"given": value}),
                    Answer::Declined(reason) => serde_json::json!({"declined": reason}),
                })
                .collect(),
        )
        .to_string()
    }

    /// The state as the step began (messages, todos, files), as JSON.
    fn state_json(&self) -> String {
        let run = Run {
            state: AgentState::clone(&self.state),
            ..Run::default()
        };
        deepagents_langgraph::convert::values(&run, "").to_string()
    }
}
