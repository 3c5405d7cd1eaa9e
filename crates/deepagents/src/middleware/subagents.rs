//! The `task` tool: hand work to a subagent, which starts from a fresh context or from a
//! fork of the caller's conversation.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use async_trait::async_trait;
use deepagents_core::event::PathSegment;
use deepagents_core::{
    AgentState, Checkpointing, ContentBlock, DynTool, Extensions, Message, ModelRequest, PausedRun,
    Run, RunContext, RunLimits, StateUpdate, Tool, ToolContext, ToolError, ToolOutput, TypedTool,
};
use futures::FutureExt as _;
use schemars::JsonSchema;
use serde::Deserialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{Middleware, MiddlewareError};
use crate::agent::Agent;
use crate::run::RunStatus;
use crate::subagents::SubAgentMode;

const PROMPT: &str = "\
## Subagents
Use `task` to hand a self-contained piece of work to a subagent: it works in a fresh context and \
returns only its answer, which keeps your context small. It sees nothing of this conversation, \
so describe the task completely, including what to return. Independent tasks can run in \
parallel: call `task` several times in one turn.";

/// Added to [`PROMPT`] when some subagent is a fork.
const FORK_PROMPT: &str = "\
Subagents marked as continuing your conversation are the exception: they start from this \
conversation as you see it, so the task need not repeat what is already here.";

/// Marks a fork in the `task` tool's list of subagents.
const FORK_NOTE: &str = " (continues your conversation: it sees everything up to this call, so \
say only what to do and what to return)";

/// Put before the task of a fork: the conversation before it is the caller's, replayed.
const FORK_PREAMBLE: &str = "\
[You are a subagent, started by the agent whose conversation is above; its request to delegate \
has already been made, and you are the one it went to. Do the task below yourself, relying \
on the names, facts and figures already established above rather than generic answers. \
Only your final reply goes back to that agent, so make it complete.]

Your task:
";

/// Offers the `task` tool over a set of subagents. Its name is `subagents`.
pub struct SubAgentsMiddleware {
    tool: Arc<dyn DynTool>,
    /// Whether some subagent is a fork.
    forks: bool,
}

/// A built subagent and when to use it.
pub(crate) struct Registered {
    pub(crate) description: String,
    pub(crate) agent: Agent,
    pub(crate) mode: SubAgentMode,
    /// Started with `start_async_task`, not `task`.
    pub(crate) asynchronous: bool,
}

impl SubAgentsMiddleware {
    pub(crate) fn new(agents: BTreeMap<String, Registered>, shared_keys: BTreeSet<String>) -> Self {
        let forks = agents.values().any(|r| r.mode == SubAgentMode::Fork);
        let tool = Task {
            agents: Arc::new(agents),
            shared_keys,
        };
        Self {
            tool: Arc::new(TypedTool::new(tool)),
            forks,
        }
    }
}

#[async_trait]
impl Middleware for SubAgentsMiddleware {
    fn name(&self) -> &str {
        "subagents"
    }

    fn tools(&self) -> Vec<Arc<dyn DynTool>> {
        vec![self.tool.clone()]
    }

    async fn before_model(
        &self,
        _ctx: &RunContext,
        request: &mut ModelRequest,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        if self.forks {
            request.push_system_section(&format!("{PROMPT} {FORK_PROMPT}"));
        } else {
            request.push_system_section(PROMPT);
        }
        Ok(())
    }
}

struct Task {
    agents: Arc<BTreeMap<String, Registered>>,
    /// The owning agent's custom keys that subagent runs may receive.
    shared_keys: BTreeSet<String>,
}

/// The subagent places of one run, kept in its extensions: the limits are per run, so one
/// agent serving many threads never makes one thread's subagents wait for another's.
struct Places {
    /// Bounds this run's own `task` calls.
    own: Arc<Semaphore>,
    /// What the run inherited from the runs above it; `None` for a top-level run.
    chain: Option<Chain>,
}

impl Places {
    fn for_run(limits: &RunLimits, chain: Option<Chain>) -> Self {
        Self {
            own: Arc::new(Semaphore::new(limits.subagent_concurrency.max(1))),
            chain,
        }
    }
}

/// What a subagent run inherits from the chain of runs above it.
#[derive(Clone)]
struct Chain {
    /// The strictest depth limit along the chain.
    max_depth: usize,
    /// The concurrency limit of the run the tree started from.
    budget: Arc<Semaphore>,
    /// The place the running subagent holds, lent to one of its own subagents at a time: it
    /// only waits while they work, and lending keeps nesting from deadlocking on `budget`.
    lendable: Arc<Semaphore>,
}

/// Arguments of `task`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct TaskArgs {
    /// The complete task: everything the subagent needs and what it should return.
    description: String,
    /// Which subagent to use.
    subagent_type: String,
}

/// The files a child run changed, as an update for the parent.
fn file_changes(before: &AgentState, after: &AgentState) -> StateUpdate {
    let mut update = StateUpdate::default();
    for (path, file) in &after.files {
        if before.files.get(path) != Some(file) {
            update.files.insert(path.clone(), Some(file.clone()));
        }
    }
    for path in before.files.keys() {
        if !after.files.contains_key(path) {
            update.files.insert(path.clone(), None);
        }
    }
    update
}

/// The custom values a subagent run starts with: those both sides share, never private ones.
fn shared_custom(
    parent: &AgentState,
    parent_keys: &BTreeSet<String>,
    child: &Agent,
) -> BTreeMap<String, serde_json::Value> {
    parent
        .custom
        .iter()
        .filter(|(key, _)| parent_keys.contains(*key) && child.inner.shared_keys.contains(*key))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// The files a child run changed since `start`, plus those it changed before pausing.
fn changes_since(start: &AgentState, end: &AgentState, changed_before: Vec<String>) -> StateUpdate {
    let mut changes = file_changes(start, end);
    for path in changed_before {
        let file = end.files.get(&path).cloned();
        changes.files.entry(path).or_insert(file);
    }
    changes
}

/// What a fork starts from: the conversation of the agent making the call `call_id`, up to
/// the assistant turn that made it (left out: its calls have no results yet, and the task
/// message that follows says what it asked), as that agent's model saw it — long user
/// messages shown as saved and summarized messages replaced by their summary.
fn forked_history(state: &AgentState, call_id: &str) -> Vec<Message> {
    let messages: &[Message] = &state.messages;
    let made_call = |m: &Message| match m {
        Message::Assistant(turn) => turn.tool_calls.iter().any(|c| c.id == call_id),
        _ => false,
    };
    let end = match messages.iter().rposition(made_call) {
        Some(index) => index,
        // Not found (a call made outside a model turn): drop a trailing turn with calls.
        None => match messages.last() {
            Some(Message::Assistant(a)) if !a.tool_calls.is_empty() => messages.len() - 1,
            _ => messages.len(),
        },
    };
    let history = super::offload::with_saved_inputs(state, messages[..end].to_vec());
    super::summarization::summarized_view(state, history)
}

/// The last non-empty assistant text of a run.
fn last_answer(run: &Run) -> String {
    run.state
        .messages
        .iter()
        .rev()
        .find_map(|m| match m {
            Message::Assistant(_) => Some(m.text()).filter(|t| !t.trim().is_empty()),
            _ => None,
        })
        .unwrap_or_default()
}

impl Tool for Task {
    type Args = TaskArgs;

    fn name(&self) -> &str {
        "task"
    }

    fn description(&self) -> String {
        let mut text = String::from(
            "Start a subagent on a self-contained task. It works in a fresh context with its own \
             tools and returns one answer. It shares your files. Subagent types:",
        );
        for (name, registered) in self.agents.iter() {
            text.push_str(&format!("\n- {name}: {}", registered.description));
            if registered.mode == SubAgentMode::Fork {
                text.push_str(FORK_NOTE);
            }
        }
        text
    }

    async fn call(&self, args: TaskArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let Some(registered) = self.agents.get(&args.subagent_type) else {
            let valid: Vec<&str> = self.agents.keys().map(String::as_str).collect();
            return Err(ToolError::RespondToModel(format!(
                "Unknown subagent type `{}`. Use one of: {}.",
                args.subagent_type,
                valid.join(", ")
            )));
        };
        let limits = ctx.run.limits;
        let places = ctx
            .run
            .extensions
            .get_or_insert_with(|| Places::for_run(&limits, None));
        let max_depth = places.chain.as_ref().map_or(limits.subagent_depth, |c| {
            c.max_depth.min(limits.subagent_depth)
        });
        let depth = ctx.agent_path().len() + 1;
        if depth > max_depth {
            return Err(ToolError::RespondToModel(format!(
                "Subagents may nest at most {max_depth} levels deep and this would be level {depth}; do this part yourself."
            )));
        }
        if args.description.trim().is_empty() {
            return Err(ToolError::RespondToModel(
                "The task description is empty; say what the subagent should do and return."
                    .to_owned(),
            ));
        }
        let _permits = acquire(&places).await?;
        // A subagent that paused for approval inside this call continues its stored run (the
        // decisions are in it) instead of starting over.
        let (initial, start, changed_before) = match ctx
            .paused
            .as_deref()
            .filter(|p| p.subagent == args.subagent_type)
        {
            Some(paused) => {
                let start = AgentState {
                    files: paused.run.state.files.clone(),
                    ..AgentState::default()
                };
                (Run::clone(&paused.run), start, paused.changed_files.clone())
            }
            None => {
                // The parent's files and shared custom values travel; its structured answer,
                // private values and summarization records do not. An isolated subagent gets
                // neither its messages nor its plan; a fork gets both (the plan is part of the
                // conversation it continues), but its own changes to them stay its own.
                let fork = registered.mode == SubAgentMode::Fork;
                let start = AgentState {
                    files: ctx.state.files.clone(),
                    custom: shared_custom(&ctx.state, &self.shared_keys, &registered.agent),
                    todos: if fork {
                        ctx.state.todos.clone()
                    } else {
                        Vec::new()
                    },
                    ..AgentState::default()
                };
                let run = if fork {
                    let mut run = Run::default();
                    run.state.messages = forked_history(&ctx.state, &ctx.call_id).into();
                    run.push_user_input(vec![ContentBlock::text(format!(
                        "{FORK_PREAMBLE}{}",
                        args.description
                    ))]);
                    run
                } else {
                    Run::from_task(args.description)
                };
                let run = Run {
                    state: AgentState {
                        messages: run.state.messages,
                        ..start.clone()
                    },
                    ..run
                };
                (run, start, Vec::new())
            }
        };
        // A checkpointed parent checkpoints the subagent's run in a child thread as it goes: a
        // crash resumes it from there (its interrupted calls settled like the parent's), so
        // finished work is not redone. The child thread is removed once the parent has
        // stored this call's result.
        let mut checkpoint = ctx.run.checkpoint.as_ref().map(|c| c.child(&ctx.call_id));
        let _finished = checkpoint.clone().map(FinishChild);
        let run = match &mut checkpoint {
            Some(child) => match crate::journal::reload(child).await {
                Ok(stored) if !stored.state.messages.is_empty() => stored,
                Ok(_) => initial,
                Err(error) => {
                    return Err(ToolError::Fatal(format!(
                        "the {} subagent's checkpoints could not be read: {error}",
                        args.subagent_type
                    )));
                }
            },
            None => initial,
        };
        let child = &registered.agent.inner;
        let run_context = RunContext {
            thread_id: ctx.run.thread_id.clone(),
            assistant_id: ctx.run.assistant_id.clone(),
            agent: child.name.clone(),
            events: ctx.run.events.nested(PathSegment {
                call_id: ctx.call_id.clone(),
                name: args.subagent_type.clone(),
            }),
            cancel: ctx.run.cancel.child_token(),
            runtime: ctx.run.runtime.clone(),
            checkpoint,
            limits: child.limits,
            // The parent's caps and total: subagents spend from the same purse.
            budget: ctx.run.budget.clone(),
            extensions: Extensions::default(),
        };
        let budget = match &places.chain {
            Some(chain) => Arc::clone(&chain.budget),
            // A top-level run's own limit bounds its whole tree.
            None => Arc::clone(&places.own),
        };
        run_context.extensions.insert(Places::for_run(
            &child.limits,
            Some(Chain {
                max_depth,
                budget,
                lendable: Arc::new(Semaphore::new(1)),
            }),
        ));
        let outcome = AssertUnwindSafe(crate::driver::drive_in(
            child,
            run,
            &run_context,
            crate::run::DEFAULT_CANCEL_GRACE,
        ))
        .catch_unwind()
        .await;
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(panic) => {
                return Err(ToolError::RespondToModel(format!(
                    "The {} subagent crashed ({}); whatever it changed in the agent state is lost \
                     (files on disk stay as it left them). Check before retrying, or do it yourself.",
                    args.subagent_type,
                    crate::calls::panic_message(panic.as_ref())
                )));
            }
        };
        match outcome {
            Ok(output) if output.status == RunStatus::Interrupted => {
                let mut changed_files = changed_before;
                changed_files.extend(file_changes(&start, &output.run.state).files.into_keys());
                changed_files.sort();
                changed_files.dedup();
                // The driver keeps the paused run in the parent's control and pauses the parent.
                Ok(ToolOutput::paused(PausedRun {
                    subagent: args.subagent_type,
                    run: Box::new(output.run),
                    changed_files,
                }))
            }
            Ok(output) => {
                let answer = match &output.structured {
                    Some(json) => json.to_string(),
                    None => last_answer(&output.run),
                };
                let mut answer = if answer.is_empty() {
                    "(the subagent finished without an answer)".to_owned()
                } else {
                    answer
                };
                if output.cut() {
                    answer.push_str(
                        "\n\n[This answer was cut at the subagent's output limit: it is not \
                         complete. Ask for the rest, or for a shorter answer.]",
                    );
                }
                let changes = changes_since(&start, &output.run.state, changed_before);
                let mut result = ToolOutput::text(answer)
                    .with_update(changes)
                    .with_changed_files(output.changed_files);
                result.artifact = output.structured;
                Ok(result)
            }
            Err(failure) => {
                // What it wrote before failing is kept, as it would be on disk.
                let changes = changes_since(&start, &failure.run.state, changed_before);
                let kept = if changes.files.is_empty() {
                    String::new()
                } else {
                    let paths: Vec<&str> = changes.files.keys().map(String::as_str).collect();
                    format!(" Its file changes are kept: {}.", paths.join(", "))
                };
                Ok(ToolOutput::text(format!(
                    "The {} subagent failed: {}.{kept} Retry with a clearer or smaller task, or do it yourself.",
                    args.subagent_type, failure.error
                ))
                .with_update(changes)
                .as_error())
            }
        }
    }
}

/// Marks a subagent's child thread finished when the call ends, however it ends (a call
/// dropped on cancellation gets its result from the parent).
struct FinishChild(Checkpointing);

impl Drop for FinishChild {
    fn drop(&mut self) {
        self.0.finish_child();
    }
}

/// Waits for a place to run a subagent: one of the run's own, and for a nested run also one
/// of the tree's (or the place of the subagent making the call, lent to it).
async fn acquire(places: &Places) -> Result<Vec<OwnedSemaphorePermit>, ToolError> {
    let closed = |_| ToolError::Fatal("the subagent limiter was closed".to_owned());
    let mut permits = Vec::with_capacity(2);
    permits.push(
        Arc::clone(&places.own)
            .acquire_owned()
            .await
            .map_err(closed)?,
    );
    if let Some(chain) = &places.chain {
        let shared = tokio::select! {
            biased;
            permit = Arc::clone(&chain.budget).acquire_owned() => permit,
            permit = Arc::clone(&chain.lendable).acquire_owned() => permit,
        };
        permits.push(shared.map_err(closed)?);
    }
    Ok(permits)
}
