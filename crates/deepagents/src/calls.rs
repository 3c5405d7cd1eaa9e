//! Executing a step's tool calls: mutating calls in call order, the others concurrently,
//! each through the middleware chain and the registry; their outcomes sorted out in call order,
//! with notes for calls that changed the same file.

use std::any::Any;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deepagents_core::{
    AgentState, ContentBlock, EventKind, EventSink, PausedRun, Run, RunContext, StateUpdate,
    ToolCall, ToolContext, ToolError, ToolOutput, ToolResult, ToolStatus,
};
use futures::stream::{self, FuturesUnordered};
use futures::{FutureExt as _, StreamExt as _};

use crate::config::AgentConfig;
use crate::middleware::ToolNext;
use crate::registry::ToolRegistry;

/// What executing a step needs from the drive.
#[derive(Clone, Copy)]
pub(crate) struct Execution<'a> {
    /// The agent.
    pub(crate) agent: &'a AgentConfig,
    /// The tools offered now.
    pub(crate) tools: &'a Arc<ToolRegistry>,
    /// The run's context.
    pub(crate) ctx: &'a RunContext,
    /// How long tools get to finish once cancelled.
    pub(crate) cancel_grace: Duration,
}

/// How one tool call ended.
pub(crate) enum CallOutcome {
    /// Finished, with its state changes, the files it changed outside the state and the
    /// answer it gave for the run, if any.
    Done(ToolResult, StateUpdate, Vec<String>, Option<String>),
    Fatal(ToolResult, String),
    /// A subagent it ran paused for approval: no result yet, the call runs again on resume
    /// and continues this stored subagent run.
    Paused(PausedRun),
}

/// Runs `calls` over the state `shared`: mutating ones in call order, the others
/// concurrently. Returns each call's outcome (`None`: cancelled before it finished) and
/// whether the run was cancelled meanwhile.
pub(crate) async fn run_calls(
    exec: Execution<'_>,
    run: &Run,
    calls: &[ToolCall],
    shared: &Arc<AgentState>,
) -> (Vec<Option<(CallOutcome, Option<u64>)>>, bool) {
    let Execution {
        agent,
        tools,
        ctx,
        cancel_grace,
    } = exec;
    let step = RunContext {
        cancel: ctx.cancel.child_token(),
        ..ctx.clone()
    };
    let paused_runs = paused_runs(run, calls);
    let start_call = |index: usize, state: Arc<AgentState>| {
        let call = calls[index].clone();
        let ctx = ToolContext {
            call_id: call.id.clone(),
            state,
            run: step.clone(),
            paused: paused_runs.get(&call.id).cloned(),
        };
        run_one(agent, tools, call, ctx).map(move |outcome| (index, outcome))
    };
    let mutating = mutating(tools, calls);
    let concurrent: FuturesUnordered<_> = (0..calls.len())
        .filter(|index| !mutating.contains(index))
        .map(|index| start_call(index, Arc::clone(shared)))
        .collect();
    // Mutating calls run one after another, each seeing what the earlier ones changed (a
    // write then an edit of the same file in one turn works). The state is copied only
    // when a call changed something and another mutating call follows.
    let sequential = stream::unfold(
        (mutating.into_iter(), Arc::clone(shared)),
        move |(mut rest, view)| async move {
            let index = rest.next()?;
            let (index, outcome) = start_call(index, Arc::clone(&view)).await;
            let view = match &outcome {
                (CallOutcome::Done(_, update, _, _), _) if !update.is_empty() && rest.len() > 0 => {
                    let mut next = AgentState::clone(&view);
                    // A failing merge is reported when the step's updates are applied.
                    match agent.schema.apply_all(&mut next, [update.clone()]) {
                        Ok(()) => Arc::new(next),
                        Err(_) => view,
                    }
                }
                _ => view,
            };
            Some(((index, outcome), (rest, view)))
        },
    );
    let mut outcomes: Vec<Option<(CallOutcome, Option<u64>)>> =
        calls.iter().map(|_| None).collect();
    let mut cancelled = false;
    let finished = stream::select(concurrent, sequential);
    let grace = tokio::time::sleep(cancel_grace);
    tokio::pin!(finished, grace);
    loop {
        tokio::select! {
            next = finished.next() => match next {
                Some((index, outcome)) => outcomes[index] = Some(outcome),
                None => break,
            },
            () = ctx.cancel.cancelled(), if !cancelled => {
                cancelled = true;
                grace.as_mut().reset(tokio::time::Instant::now() + cancel_grace);
            }
            () = &mut grace, if cancelled => break,
        }
    }
    // Every tool future, and its handle on the shared state, is dropped on return, before
    // the caller takes the state back.
    (outcomes, cancelled)
}

/// The runs paused inside `calls` (subagents', suspended calls'), by call id: those calls
/// continue them.
fn paused_runs(run: &Run, calls: &[ToolCall]) -> BTreeMap<String, Arc<PausedRun>> {
    run.control
        .paused_subagents
        .iter()
        .filter(|(id, _)| calls.iter().any(|c| &c.id == *id))
        .map(|(id, paused)| (id.clone(), Arc::new(paused.clone())))
        .collect()
}

/// The indexes of the calls to mutating tools, in call order.
pub(crate) fn mutating(tools: &ToolRegistry, calls: &[ToolCall]) -> Vec<usize> {
    (0..calls.len())
        .filter(|&i| tools.is_mutating(&calls[i].name))
        .collect()
}

/// A step's outcomes sorted out, in call order.
#[derive(Default)]
pub(crate) struct Folded {
    /// The results with their state changes.
    pub(crate) results: Vec<(ToolResult, StateUpdate)>,
    /// Per result: the files it changed outside the state.
    pub(crate) changed_outside: Vec<Vec<String>>,
    /// The calls whose subagent (or own question) paused, with what they paused in.
    pub(crate) paused: Vec<(String, PausedRun)>,
    /// The first fatal failure: the tool and its message.
    pub(crate) fatal: Option<(String, String)>,
    /// The first answer a call gave directly (`ToolOutput::final_answer`).
    pub(crate) final_answer: Option<String>,
    /// Calls whose finished event waits for the conflict notes: result index and duration.
    pub(crate) unannounced: Vec<(usize, u64)>,
}

impl Folded {
    pub(crate) fn of(
        events: &EventSink,
        calls: &[ToolCall],
        outcomes: Vec<Option<(CallOutcome, Option<u64>)>>,
    ) -> Self {
        let mut step = Self::default();
        for (call, outcome) in calls.iter().zip(outcomes) {
            let outcome = outcome.map(|(outcome, owed)| {
                if let Some(elapsed) = owed {
                    step.unannounced.push((step.results.len(), elapsed));
                }
                outcome
            });
            let (result, update, changed) = match outcome {
                Some(CallOutcome::Done(result, update, changed, answer)) => {
                    if step.final_answer.is_none() {
                        step.final_answer = answer;
                    }
                    (result, update, changed)
                }
                Some(CallOutcome::Paused(subagent)) => {
                    step.paused.push((call.id.clone(), subagent));
                    continue;
                }
                Some(CallOutcome::Fatal(result, message)) => {
                    step.fatal.get_or_insert((call.name.clone(), message));
                    (result, StateUpdate::default(), Vec::new())
                }
                None => {
                    let result = ToolResult::error(call, "Cancelled before it finished.");
                    finish_event(events, &result, 0);
                    (result, StateUpdate::default(), Vec::new())
                }
            };
            step.changed_outside.push(changed);
            step.results.push((result, update));
        }
        step
    }
}

/// When several calls of one step change the same file, the last in call order wins (the merge
/// rule); each of them is told, so no agent believes its version survived when it did not.
/// Two mutating calls (`sequential`, in call order) do not conflict: the later one saw the
/// earlier one's change.
pub(crate) fn note_file_conflicts(
    results: &mut [(ToolResult, StateUpdate)],
    changed_outside: &[Vec<String>],
    sequential: &[usize],
) {
    let mut last_writer: BTreeMap<String, usize> = BTreeMap::new();
    let mut notes: Vec<(usize, String)> = Vec::new();
    for (index, (_, update)) in results.iter().enumerate() {
        let outside: &[String] = changed_outside.get(index).map_or(&[], Vec::as_slice);
        let paths: std::collections::BTreeSet<&String> =
            update.files.keys().chain(outside).collect();
        for path in paths {
            if let Some(previous) = last_writer.insert(path.clone(), index) {
                if sequential.contains(&previous) && sequential.contains(&index) {
                    continue;
                }
                let earlier = &results[previous].0.tool_call_id;
                let later = &results[index].0.tool_call_id;
                let on_disk = outside.contains(path)
                    || changed_outside
                        .get(previous)
                        .is_some_and(|files| files.contains(path));
                if on_disk {
                    // Outside the state the calls raced: the file holds whichever came last.
                    for (this, other) in [(previous, later), (index, earlier)] {
                        notes.push((
                            this,
                            format!("Note: {path} was also changed by call {other} at the same time; it holds whichever change came last. Read it before relying on it."),
                        ));
                    }
                    continue;
                }
                notes.push((
                    previous,
                    format!("Note: {path} was changed again by call {later} in the same step; that later version is the one kept."),
                ));
                notes.push((
                    index,
                    format!("Note: {path} was also changed by call {earlier} in the same step; this call's version is the one kept."),
                ));
            }
        }
    }
    for (index, note) in notes {
        results[index].0.content.push(ContentBlock::text(note));
    }
}

/// Runs one call through the middleware chain and the registry, emitting its events.
/// Runs one call; the duration comes back when its `tool_call_finished` event is still owed.
async fn run_one(
    agent: &AgentConfig,
    tools: &Arc<ToolRegistry>,
    call: ToolCall,
    ctx: ToolContext,
) -> (CallOutcome, Option<u64>) {
    let events = &ctx.run.events.clone();
    events.emit(EventKind::ToolCallStarted {
        call_id: call.id.clone(),
        name: call.name.clone(),
        arguments: call.arguments.clone(),
    });
    let started = Instant::now();
    let chain = ToolNext {
        stack: Arc::clone(&agent.middleware),
        position: 0,
        registry: Arc::clone(tools),
    };
    let outcome = match AssertUnwindSafe(chain.call(call.clone(), ctx))
        .catch_unwind()
        .await
    {
        Ok(Ok(mut output)) => {
            if let Some(paused) = output.paused.take() {
                // The call has not finished: no `tool_call_finished` until it does.
                return (CallOutcome::Paused(paused), None);
            }
            done(&call, output)
        }
        Ok(Err(ToolError::RespondToModel(message))) => CallOutcome::Done(
            ToolResult::error(&call, message),
            StateUpdate::default(),
            Vec::new(),
            None,
        ),
        Ok(Err(ToolError::Fatal(message))) => CallOutcome::Fatal(
            ToolResult::error(
                &call,
                format!("The tool failed and the run stopped: {message}"),
            ),
            message,
        ),
        Err(panic) => CallOutcome::Done(
            ToolResult::error(
                &call,
                format!(
                    "The tool `{}` crashed ({}); its effects are unknown. Check what it may have changed before retrying, or carry on without it.",
                    call.name,
                    panic_message(panic.as_ref())
                ),
            ),
            StateUpdate::default(),
            Vec::new(),
            None,
        ),
    };
    let elapsed = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    match &outcome {
        // A call that changed files may still get a note about a same-step conflict: it is
        // announced once the step's results are settled, with what the model sees.
        CallOutcome::Done(_, update, changed, _)
            if !update.files.is_empty() || !changed.is_empty() =>
        {
            return (outcome, Some(elapsed));
        }
        CallOutcome::Done(result, ..) | CallOutcome::Fatal(result, _) => {
            finish_event(events, result, elapsed);
        }
        CallOutcome::Paused(_) => {}
    }
    (outcome, None)
}

/// The outcome of a call that returned `output`.
fn done(call: &ToolCall, output: ToolOutput) -> CallOutcome {
    let ToolOutput {
        mut content,
        artifact,
        update,
        changed_files,
        is_error,
        final_answer,
        paused: _,
    } = output;
    if content.is_empty() {
        // Some providers reject empty tool results.
        content.push(ContentBlock::text("(no output)"));
    }
    let result = ToolResult {
        tool_call_id: call.id.clone(),
        name: call.name.clone(),
        content,
        status: if is_error {
            ToolStatus::Error
        } else {
            ToolStatus::Ok
        },
        artifact,
    };
    let final_answer = final_answer.filter(|_| !is_error);
    CallOutcome::Done(result, update, changed_files, final_answer)
}

pub(crate) fn finish_event(events: &EventSink, result: &ToolResult, duration_ms: u64) {
    events.emit(EventKind::ToolCallFinished {
        call_id: result.tool_call_id.clone(),
        name: result.name.clone(),
        status: result.status,
        content: result.content.clone(),
        duration_ms,
    });
}

pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .map_or_else(|| "panic".to_owned(), |s| format!("panic: {s}"))
}
