//! Async subagents: background tasks the model starts, checks, updates, cancels and lists —
//! local subagents declared async, and remote agents over the Agent Protocol. A task's
//! ending comes back on its own (see `background.rs`): this middleware adds it to the
//! conversation when a run of the parent starts and before each model call.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use deepagents_core::{
    AgentState, DynTool, EventKind, Message, ModelRequest, Reducer, RunContext, StateUpdate, Tool,
    ToolContext, ToolError, ToolOutput, TypedTool,
};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{Middleware, MiddlewareError};
use crate::background::{
    ASYNC_TASKS_KEY, AsyncTask, Background, Completion, child_thread, record, recorded,
};

/// Offers the background-task tools over the async subagents (local and remote) and delivers
/// their endings to the parent. Its name is `async_subagents`.
pub struct AsyncSubAgentsMiddleware {
    tools: Vec<Arc<dyn DynTool>>,
    section: String,
    background: Arc<Background>,
}

impl AsyncSubAgentsMiddleware {
    /// The middleware over `background`'s agents.
    pub(crate) fn new(background: Arc<Background>) -> Self {
        let mut section = String::from(
            "## Background tasks\nSome agents work in the background. start_async_task starts one on a task and returns its task id at once; go on with other work, or end your turn, meanwhile. When a task ends, its answer comes to you as a message on its own: do not poll for it. check_async_task reports a task's status, update_async_task sends it new instructions (its current run is replaced), cancel_async_task stops it, list_async_tasks shows them all. Background agents:",
        );
        for (name, description) in agents(&background) {
            section.push_str(&format!("\n- {name}: {description}"));
        }
        let tools: Vec<Arc<dyn DynTool>> = vec![
            Arc::new(TypedTool::new(StartTask(background.clone()))),
            Arc::new(TypedTool::new(CheckTask(background.clone()))),
            Arc::new(TypedTool::new(UpdateTask(background.clone()))),
            Arc::new(TypedTool::new(CancelTask(background.clone()))),
            Arc::new(TypedTool::new(ListTasks(background.clone()))),
        ];
        Self {
            tools,
            section,
            background,
        }
    }

    /// The endings to deliver to this run now, announced as events; `None` for runs that do
    /// not take them (subagents' runs, runs without a thread).
    fn deliver(&self, ctx: &RunContext, state: &AgentState) -> Option<StateUpdate> {
        if !ctx.events.path().is_empty() {
            return None;
        }
        let thread = ctx.thread_id.as_deref()?;
        let (update, endings) = self.background.deliveries(thread, state)?;
        for ending in endings {
            announce(ctx, ending);
        }
        Some(update)
    }
}

fn announce(ctx: &RunContext, ending: Completion) {
    ctx.events.emit(EventKind::BackgroundTaskFinished {
        task_id: ending.task_id,
        subagent: ending.subagent,
        status: ending.status,
        answer: ending.answer,
    });
}

/// Whether a message may follow the conversation as it stands: not while calls of the latest
/// turn wait for results (or for a decision).
pub(crate) fn takes_message(state: &AgentState) -> bool {
    !matches!(
        state.messages.last(),
        Some(Message::Assistant(turn)) if !turn.tool_calls.is_empty()
    ) && !matches!(state.messages.last(), Some(Message::Tool(_)))
}

/// The async subagents' names and descriptions, local ones first.
fn agents(background: &Background) -> Vec<(String, String)> {
    let locals = background
        .locals
        .iter()
        .map(|(name, local)| (name.clone(), local.description.clone()));
    #[cfg(feature = "remote")]
    let all = locals
        .chain(
            background
                .remotes
                .values()
                .map(|r| (r.spec.name.clone(), r.spec.description.clone())),
        )
        .collect();
    #[cfg(not(feature = "remote"))]
    let all = locals.collect();
    all
}

#[async_trait]
impl Middleware for AsyncSubAgentsMiddleware {
    fn name(&self) -> &str {
        "async_subagents"
    }

    fn tools(&self) -> Vec<Arc<dyn DynTool>> {
        self.tools.clone()
    }

    fn state_values(&self) -> Vec<(String, Reducer)> {
        vec![(ASYNC_TASKS_KEY.to_owned(), Reducer::MergeMap)]
    }

    async fn before_run(
        &self,
        ctx: &RunContext,
        state: &AgentState,
    ) -> Result<StateUpdate, MiddlewareError> {
        if !takes_message(state) {
            return Ok(StateUpdate::default());
        }
        Ok(self.deliver(ctx, state).unwrap_or_default())
    }

    async fn prepare_model_call(
        &self,
        ctx: &RunContext,
        _request: &ModelRequest,
        state: &AgentState,
    ) -> Result<StateUpdate, MiddlewareError> {
        Ok(self.deliver(ctx, state).unwrap_or_default())
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

fn known_task(state: &AgentState, task_id: &str) -> Result<AsyncTask, ToolError> {
    recorded(state).remove(task_id).ok_or_else(|| {
        ToolError::RespondToModel(format!(
            "No background task `{task_id}`; list_async_tasks shows the task ids."
        ))
    })
}

fn unknown_agent(background: &Background, name: &str) -> ToolError {
    let valid: Vec<String> = agents(background).into_iter().map(|(n, _)| n).collect();
    ToolError::RespondToModel(format!(
        "Unknown background agent `{name}`. Use one of: {}.",
        valid.join(", ")
    ))
}

#[cfg(feature = "remote")]
fn remote_of<'a>(
    background: &'a Background,
    name: &str,
) -> Result<&'a Arc<super::remote::Remote>, ToolError> {
    background
        .remotes
        .get(name)
        .ok_or_else(|| unknown_agent(background, name))
}

/// The parent thread a task started now reports to: the thread of a top-level run.
fn parent_thread(ctx: &ToolContext) -> Option<String> {
    ctx.agent_path()
        .is_empty()
        .then(|| ctx.run.thread_id.clone())
        .flatten()
}

struct StartTask(Arc<Background>);

/// Arguments of `start_async_task`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct StartArgs {
    /// The complete task for the background agent.
    description: String,
    /// Which background agent.
    subagent_type: String,
}

impl Tool for StartTask {
    type Args = StartArgs;
    fn name(&self) -> &str {
        "start_async_task"
    }
    fn description(&self) -> String {
        "Start a background agent on a task and get its task id at once; its answer comes to you when it ends.".to_owned()
    }
    async fn call(&self, args: StartArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let background = &self.0;
        let parent = parent_thread(&ctx);
        let (task_id, task) = if background.locals.contains_key(&args.subagent_type) {
            let (Some(parent), Some(checkpoint)) = (parent, ctx.run.checkpoint.as_ref()) else {
                return Err(ToolError::RespondToModel(format!(
                    "The background agent `{}` needs a saved conversation (a thread) to report to; do this task with `task` or yourself.",
                    args.subagent_type
                )));
            };
            let task_id = background.start_local(
                &parent,
                Arc::clone(&checkpoint.checkpointer),
                &args.subagent_type,
                args.description.clone(),
            );
            let task = AsyncTask {
                agent: args.subagent_type,
                thread_id: child_thread(&parent, &task_id),
                run_id: String::new(),
                status: "running".to_owned(),
                description: args.description,
                local: true,
                generation: 1,
                delivered: 0,
            };
            (task_id, task)
        } else {
            start_remote(background, args, parent).await?
        };
        Ok(ToolOutput::text(format!(
            "Started background task {task_id} on {}. Its answer will come to you as a message when it ends; go on meanwhile.",
            task.agent
        ))
        .with_update(record(&task_id, &task)))
    }
}

#[cfg(feature = "remote")]
async fn start_remote(
    background: &Arc<Background>,
    args: StartArgs,
    parent: Option<String>,
) -> Result<(String, AsyncTask), ToolError> {
    let remote = remote_of(background, &args.subagent_type)?;
    let (thread_id, run_id, status) = remote.start(&args.description).await?;
    let task = AsyncTask {
        agent: args.subagent_type,
        thread_id: thread_id.clone(),
        run_id,
        status,
        description: args.description,
        local: false,
        // Without a thread to report to, nobody is woken: the task is only checked.
        generation: u32::from(parent.is_some()),
        delivered: 0,
    };
    if let Some(parent) = parent {
        background.watch_remote(&parent, &thread_id, &task);
    }
    Ok((thread_id, task))
}

#[cfg(not(feature = "remote"))]
async fn start_remote(
    background: &Arc<Background>,
    args: StartArgs,
    _parent: Option<String>,
) -> Result<(String, AsyncTask), ToolError> {
    Err(unknown_agent(background, &args.subagent_type))
}

struct CheckTask(Arc<Background>);

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
        let id = &args.task_id;
        if task.local {
            let text = match (self.0.ending(id), self.0.is_running(id)) {
                (Some(ending), _) => {
                    task.status.clone_from(&ending.status);
                    format!(
                        "Task {id} {}:\n{}",
                        ended_phrase(&ending.status),
                        ending.answer
                    )
                }
                (None, Some(true)) => {
                    task.status = "running".to_owned();
                    format!("Task {id} is still running.")
                }
                _ => format!(
                    "Task {id} ended with status `{}`; its answer was delivered in this conversation.",
                    task.status
                ),
            };
            return Ok(ToolOutput::text(text).with_update(record(id, &task)));
        }
        check_remote(&self.0, id, task).await
    }
}

fn ended_phrase(status: &str) -> String {
    match status {
        "success" => "finished".to_owned(),
        other => format!("ended with status `{other}`"),
    }
}

#[cfg(feature = "remote")]
async fn check_remote(
    background: &Background,
    task_id: &str,
    mut task: AsyncTask,
) -> Result<ToolOutput, ToolError> {
    let remote = remote_of(background, &task.agent)?;
    task.status = remote.status(&task.thread_id, &task.run_id).await?;
    let text = match task.status.as_str() {
        "success" => {
            let answer = remote.answer(&task.thread_id).await?;
            format!("Task {task_id} finished:\n{answer}")
        }
        "pending" | "running" => format!("Task {task_id} is still {}.", task.status),
        other => format!("Task {task_id} ended with status `{other}`."),
    };
    Ok(ToolOutput::text(text).with_update(record(task_id, &task)))
}

#[cfg(not(feature = "remote"))]
async fn check_remote(
    background: &Background,
    _task_id: &str,
    task: AsyncTask,
) -> Result<ToolOutput, ToolError> {
    Err(unknown_agent(background, &task.agent))
}

struct UpdateTask(Arc<Background>);

/// Arguments of `update_async_task`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct UpdateArgs {
    /// The task id.
    task_id: String,
    /// New instructions for the background agent; its current run is replaced.
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
        if task.local {
            task.generation = match self.0.update_local(&args.task_id, args.message.clone()) {
                Some(generation) => generation,
                // Ended before a restart: its child thread goes on with the new message.
                None => {
                    let (Some(parent), Some(checkpoint)) =
                        (parent_thread(&ctx), ctx.run.checkpoint.as_ref())
                    else {
                        return Err(ToolError::RespondToModel(format!(
                            "Task {} cannot be continued from here; start a new one.",
                            args.task_id
                        )));
                    };
                    let generation = task.generation + 1;
                    self.0.restart_local(
                        &parent,
                        Arc::clone(&checkpoint.checkpointer),
                        &args.task_id,
                        &task.agent,
                        args.message,
                        generation,
                    );
                    generation
                }
            };
            task.status = "running".to_owned();
        } else {
            update_remote(&self.0, &args, &mut task, parent_thread(&ctx)).await?;
        }
        Ok(ToolOutput::text(format!(
            "Task {} received the new instructions.",
            args.task_id
        ))
        .with_update(record(&args.task_id, &task)))
    }
}

#[cfg(feature = "remote")]
async fn update_remote(
    background: &Arc<Background>,
    args: &UpdateArgs,
    task: &mut AsyncTask,
    parent: Option<String>,
) -> Result<(), ToolError> {
    let remote = remote_of(background, &task.agent)?;
    let (run_id, status) = remote.start_run(&task.thread_id, &args.message).await?;
    task.run_id = run_id;
    task.status = status;
    if let Some(parent) = parent.filter(|_| task.generation > 0) {
        task.generation += 1;
        background.watch_remote(&parent, &args.task_id, task);
    }
    Ok(())
}

#[cfg(not(feature = "remote"))]
async fn update_remote(
    background: &Arc<Background>,
    _args: &UpdateArgs,
    task: &mut AsyncTask,
    _parent: Option<String>,
) -> Result<(), ToolError> {
    Err(unknown_agent(background, &task.agent))
}

struct CancelTask(Arc<Background>);

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
        #[cfg(feature = "remote")]
        if !task.local {
            let remote = remote_of(&self.0, &task.agent)?;
            remote.cancel(&task.thread_id, &task.run_id).await?;
        }
        self.0.cancel(&args.task_id);
        task.status = "cancelled".to_owned();
        // A cancelled task reports nothing more.
        task.delivered = task.generation;
        Ok(
            ToolOutput::text(format!("Task {} was cancelled.", args.task_id))
                .with_update(record(&args.task_id, &task)),
        )
    }
}

struct ListTasks(Arc<Background>);

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
        let tasks: BTreeMap<String, AsyncTask> = recorded(&ctx.state);
        if tasks.is_empty() {
            return Ok(ToolOutput::text("No background tasks."));
        }
        let lines: Vec<String> = tasks
            .iter()
            .map(|(id, t)| {
                // What this process knows now is newer than the record.
                let status = match (self.0.ending(id), self.0.is_running(id)) {
                    (Some(ending), _) => ending.status,
                    (None, Some(true)) => "running".to_owned(),
                    _ => t.status.clone(),
                };
                format!(
                    "{id} ({}): {status}: {}",
                    t.agent,
                    crate::tools::output::truncate_chars(&t.description, 120)
                )
            })
            .collect();
        Ok(ToolOutput::text(lines.join("\n")))
    }
}
