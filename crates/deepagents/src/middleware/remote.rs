//! Remote subagents: agents served over the Agent Protocol (LangGraph API), run as background
//! tasks the model starts, checks, updates, cancels and lists.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deepagents_core::{
    AgentState, DynTool, ModelRequest, Reducer, RunContext, StateKey, StateUpdate, Tool,
    ToolContext, ToolError, ToolOutput, TypedTool,
};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Middleware, MiddlewareError};

/// The custom state key holding the background tasks, by task id.
pub const ASYNC_TASKS_KEY: &str = "async_tasks";

/// A remote agent: where it is served and how to call it.
#[derive(Clone, Debug)]
pub struct RemoteSubAgent {
    /// The name the model uses.
    pub name: String,
    /// When to use it.
    pub description: String,
    /// Base URL of the Agent Protocol server, e.g. `http://127.0.0.1:2024`.
    pub url: String,
    /// The graph (assistant) id on that server.
    pub graph_id: String,
    /// Extra headers, e.g. an API key.
    pub headers: Vec<(String, String)>,
}

/// A background task as the run remembers it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct AsyncTask {
    agent: String,
    thread_id: String,
    run_id: String,
    status: String,
    description: String,
}

/// A remote agent with its HTTP client.
struct Remote {
    spec: RemoteSubAgent,
    client: reqwest::Client,
}

/// Runs remote agents as background tasks. Its name is `remote_subagents`.
pub struct RemoteSubAgentsMiddleware {
    tools: Vec<Arc<dyn DynTool>>,
    section: String,
}

/// A remote agent's server could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("remote subagent `{name}`: {message}")]
pub struct RemoteSetupError {
    /// The subagent.
    pub name: String,
    /// What is wrong.
    pub message: String,
}

impl RemoteSubAgentsMiddleware {
    /// Background-task tools over `agents`.
    pub fn new(agents: Vec<RemoteSubAgent>) -> Result<Self, RemoteSetupError> {
        let mut remotes = BTreeMap::new();
        for spec in agents {
            let error = |message: String| RemoteSetupError {
                name: spec.name.clone(),
                message,
            };
            let mut headers = HeaderMap::new();
            for (name, value) in &spec.headers {
                let name = HeaderName::from_bytes(name.as_bytes())
                    .map_err(|e| error(format!("header `{name}`: {e}")))?;
                let mut value = HeaderValue::from_str(value)
                    .map_err(|e| error(format!("header `{name}` has an invalid value: {e}")))?;
                value.set_sensitive(true);
                headers.insert(name, value);
            }
            let client = deepagents_models::http_client()
                .default_headers(headers)
                .connect_timeout(Duration::from_secs(10))
                .timeout(Duration::from_secs(60))
                .build()
                .map_err(|e| error(e.to_string()))?;
            remotes.insert(spec.name.clone(), Arc::new(Remote { spec, client }));
        }
        let remotes = Arc::new(remotes);
        let mut section = String::from(
            "## Background tasks\nRemote agents work in the background. start_async_task returns a task id at once; check_async_task reports progress or the result, update_async_task sends more instructions, cancel_async_task stops a task, list_async_tasks shows them all. Do other work while they run; check before you rely on a result. Remote agents:",
        );
        for remote in remotes.values() {
            section.push_str(&format!(
                "\n- {}: {}",
                remote.spec.name, remote.spec.description
            ));
        }
        let tools: Vec<Arc<dyn DynTool>> = vec![
            Arc::new(TypedTool::new(StartTask(remotes.clone()))),
            Arc::new(TypedTool::new(CheckTask(remotes.clone()))),
            Arc::new(TypedTool::new(UpdateTask(remotes.clone()))),
            Arc::new(TypedTool::new(CancelTask(remotes.clone()))),
            Arc::new(TypedTool::new(ListTasks)),
        ];
        Ok(Self { tools, section })
    }
}

#[async_trait]
impl Middleware for RemoteSubAgentsMiddleware {
    fn name(&self) -> &str {
        "remote_subagents"
    }

    fn tools(&self) -> Vec<Arc<dyn DynTool>> {
        self.tools.clone()
    }

    fn state_values(&self) -> Vec<(String, Reducer)> {
        vec![(ASYNC_TASKS_KEY.to_owned(), Reducer::MergeMap)]
    }

    async fn before_model(
        &self,
        _ctx: &RunContext,
        request: &mut ModelRequest,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        request.push_system_section(&self.section);
        Ok(())
    }
}

type Remotes = Arc<BTreeMap<String, Arc<Remote>>>;

fn unreachable_server(remote: &Remote, error: impl std::fmt::Display) -> ToolError {
    ToolError::RespondToModel(format!(
        "The remote agent `{}` at {} could not be reached ({error}); try again later or do the work yourself.",
        remote.spec.name, remote.spec.url
    ))
}

impl Remote {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.spec.url.trim_end_matches('/'))
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, ToolError> {
        let response = request
            .send()
            .await
            .map_err(|e| unreachable_server(self, e))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| unreachable_server(self, e))?;
        if !status.is_success() {
            return Err(ToolError::RespondToModel(format!(
                "The remote agent `{}` answered {status}: {}",
                self.spec.name,
                crate::tools::output::truncate_chars(&body, 500)
            )));
        }
        if body.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&body)
            .map_err(|e| unreachable_server(self, format!("invalid JSON: {e}")))
    }

    /// Starts a run of the agent on `thread_id` with one user message.
    async fn start_run(
        &self,
        thread_id: &str,
        message: &str,
    ) -> Result<(String, String), ToolError> {
        let run = self
            .send(
                self.client
                    .post(self.url(&format!("/threads/{thread_id}/runs")))
                    .json(&json!({
                        "assistant_id": self.spec.graph_id,
                        "input": {"messages": [{"role": "user", "content": message}]},
                        "multitask_strategy": "interrupt"
                    })),
            )
            .await?;
        let run_id = run["run_id"].as_str().unwrap_or_default().to_owned();
        if run_id.is_empty() {
            return Err(unreachable_server(self, "the server returned no run_id"));
        }
        let status = run["status"].as_str().unwrap_or("pending").to_owned();
        Ok((run_id, status))
    }

    /// The last AI message of the thread.
    async fn answer(&self, thread_id: &str) -> Result<String, ToolError> {
        let state = self
            .send(
                self.client
                    .get(self.url(&format!("/threads/{thread_id}/state"))),
            )
            .await?;
        let messages = state["values"]["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let answer = messages
            .iter()
            .rev()
            .find(|m| {
                matches!(
                    m["type"].as_str().or(m["role"].as_str()),
                    Some("ai" | "assistant")
                )
            })
            .map(|m| match &m["content"] {
                Value::String(text) => text.clone(),
                Value::Array(blocks) => blocks
                    .iter()
                    .filter_map(|b| b["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(""),
                _ => String::new(),
            })
            .unwrap_or_default();
        Ok(answer)
    }
}

/// The background tasks, typed.
const TASKS: StateKey<BTreeMap<String, AsyncTask>> = StateKey::new(ASYNC_TASKS_KEY);

fn tasks(state: &AgentState) -> Result<BTreeMap<String, AsyncTask>, ToolError> {
    Ok(TASKS
        .get(state)
        .map_err(|e| ToolError::Fatal(e.to_string()))?
        .unwrap_or_default())
}

fn record(task_id: &str, task: &AsyncTask) -> StateUpdate {
    let value = serde_json::to_value(task).unwrap_or(Value::Null);
    StateUpdate::default().with_custom(ASYNC_TASKS_KEY, json!({ task_id: value }))
}

fn known_task(state: &AgentState, task_id: &str) -> Result<AsyncTask, ToolError> {
    tasks(state)?.remove(task_id).ok_or_else(|| {
        ToolError::RespondToModel(format!(
            "No background task `{task_id}`; list_async_tasks shows the task ids."
        ))
    })
}

fn remote_of<'a>(remotes: &'a Remotes, name: &str) -> Result<&'a Arc<Remote>, ToolError> {
    remotes.get(name).ok_or_else(|| {
        let valid: Vec<&str> = remotes.keys().map(String::as_str).collect();
        ToolError::RespondToModel(format!(
            "Unknown remote agent `{name}`. Use one of: {}.",
            valid.join(", ")
        ))
    })
}

struct StartTask(Remotes);

/// Arguments of `start_async_task`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct StartArgs {
    /// The complete task for the remote agent.
    description: String,
    /// Which remote agent.
    subagent_type: String,
}

impl Tool for StartTask {
    type Args = StartArgs;
    fn name(&self) -> &str {
        "start_async_task"
    }
    fn description(&self) -> String {
        "Start a remote agent on a task in the background and get its task id at once.".to_owned()
    }
    async fn call(&self, args: StartArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let remote = remote_of(&self.0, &args.subagent_type)?;
        let thread = remote
            .send(remote.client.post(remote.url("/threads")).json(&json!({})))
            .await?;
        let thread_id = thread["thread_id"].as_str().unwrap_or_default().to_owned();
        if thread_id.is_empty() {
            return Err(unreachable_server(
                remote,
                "the server returned no thread_id",
            ));
        }
        let (run_id, status) = remote.start_run(&thread_id, &args.description).await?;
        let task = AsyncTask {
            agent: args.subagent_type,
            thread_id: thread_id.clone(),
            run_id,
            status,
            description: args.description,
        };
        Ok(ToolOutput::text(format!(
            "Started background task {thread_id} on {}. Check it with check_async_task.",
            task.agent
        ))
        .with_update(record(&thread_id, &task)))
    }
}

struct CheckTask(Remotes);

/// Arguments of tools that name one task.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct TaskIdArgs {
    /// The task id start_async_task returned.
    task_id: String,
}

impl Tool for CheckTask {
    type Args = TaskIdArgs;
    fn name(&self) -> &str {
        "check_async_task"
    }
    fn description(&self) -> String {
        "Report a background task's status, and its answer once it has finished.".to_owned()
    }
    async fn call(&self, args: TaskIdArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let mut task = known_task(&ctx.state, &args.task_id)?;
        let remote = remote_of(&self.0, &task.agent)?;
        let run = remote
            .send(
                remote
                    .client
                    .get(remote.url(&format!("/threads/{}/runs/{}", task.thread_id, task.run_id))),
            )
            .await?;
        task.status = run["status"].as_str().unwrap_or("unknown").to_owned();
        let text = match task.status.as_str() {
            "success" => {
                let answer = remote.answer(&task.thread_id).await?;
                format!("Task {} finished:\n{answer}", args.task_id)
            }
            "pending" | "running" => format!("Task {} is still {}.", args.task_id, task.status),
            other => format!("Task {} ended with status `{other}`.", args.task_id),
        };
        Ok(ToolOutput::text(text).with_update(record(&args.task_id, &task)))
    }
}

struct UpdateTask(Remotes);

/// Arguments of `update_async_task`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct UpdateArgs {
    /// The task id.
    task_id: String,
    /// New instructions for the remote agent; its current run is replaced.
    message: String,
}

impl Tool for UpdateTask {
    type Args = UpdateArgs;
    fn name(&self) -> &str {
        "update_async_task"
    }
    fn description(&self) -> String {
        "Send new instructions to a background task; it continues in the same conversation."
            .to_owned()
    }
    async fn call(&self, args: UpdateArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let mut task = known_task(&ctx.state, &args.task_id)?;
        let remote = remote_of(&self.0, &task.agent)?;
        let (run_id, status) = remote.start_run(&task.thread_id, &args.message).await?;
        task.run_id = run_id;
        task.status = status;
        Ok(ToolOutput::text(format!(
            "Task {} received the new instructions.",
            args.task_id
        ))
        .with_update(record(&args.task_id, &task)))
    }
}

struct CancelTask(Remotes);

impl Tool for CancelTask {
    type Args = TaskIdArgs;
    fn name(&self) -> &str {
        "cancel_async_task"
    }
    fn description(&self) -> String {
        "Stop a background task.".to_owned()
    }
    async fn call(&self, args: TaskIdArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let mut task = known_task(&ctx.state, &args.task_id)?;
        let remote = remote_of(&self.0, &task.agent)?;
        remote
            .send(remote.client.post(remote.url(&format!(
                "/threads/{}/runs/{}/cancel",
                task.thread_id, task.run_id
            ))))
            .await?;
        task.status = "cancelled".to_owned();
        Ok(
            ToolOutput::text(format!("Task {} was cancelled.", args.task_id))
                .with_update(record(&args.task_id, &task)),
        )
    }
}

struct ListTasks;

/// Arguments of `list_async_tasks` (none).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

impl Tool for ListTasks {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "list_async_tasks"
    }
    fn description(&self) -> String {
        "List the background tasks of this conversation with their last known status.".to_owned()
    }
    async fn call(&self, _args: NoArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let tasks = tasks(&ctx.state)?;
        if tasks.is_empty() {
            return Ok(ToolOutput::text("No background tasks."));
        }
        let lines: Vec<String> = tasks
            .iter()
            .map(|(id, t)| {
                format!(
                    "{id} ({}): {}: {}",
                    t.agent,
                    t.status,
                    crate::tools::output::truncate_chars(&t.description, 120)
                )
            })
            .collect();
        Ok(ToolOutput::text(lines.join("\n")))
    }
}
