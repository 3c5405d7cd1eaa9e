//! The driver: performs the IO a [`Run`] asks for, one action at a time.

use std::any::Any;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deepagents_core::{
    AgentState, ContentBlock, DynTool, EventKind, Extensions, ModelRequest, NextAction, PausedRun,
    Run, RunContext, StateUpdate, StopReason, ToolCall, ToolContext, ToolError, ToolOutput,
    ToolResult, ToolStatus,
};
use futures::stream::{self, FuturesUnordered};
use futures::{FutureExt as _, StreamExt as _};

use crate::approval::{self, Gate, PendingAction, gate};
use crate::config::AgentConfig;
use crate::error::{RunError, RunFailure};
use crate::journal::{ControlTouched, Journal};
use crate::middleware::{MiddlewareError, ModelNext, ToolNext, final_structured_answer};
use crate::registry::ToolRegistry;
use crate::run::{RunOptions, RunOutput, RunStatus};
use deepagents_core::EventSink;
use deepagents_core::Message;
use deepagents_core::message::AssistantMessage;

/// Advances `run` until it has a final answer or fails: a run of its own, described by
/// `options`.
pub(crate) async fn drive(
    agent: &Arc<AgentConfig>,
    run: Run,
    options: &RunOptions,
    events: &EventSink,
) -> Result<RunOutput, RunFailure> {
    let ctx = RunContext {
        thread_id: options.checkpoint.as_ref().map(|c| c.thread_id.clone()),
        assistant_id: options
            .assistant_id
            .clone()
            .unwrap_or_else(|| agent.name.clone()),
        agent: agent.name.clone(),
        // A top-level drive is a run of its own; a nested sink's events belong to its
        // parent's run.
        events: if events.path().is_empty() {
            events.for_new_run()
        } else {
            events.clone()
        },
        cancel: options.cancel.clone(),
        runtime: options.runtime.clone(),
        checkpoint: options.checkpoint.clone(),
        limits: options.limits.unwrap_or(agent.limits),
        // Seeded with what the run spent before a pause or a crash, so caps hold across them.
        budget: deepagents_core::Budget::new(
            options.spend_limits.unwrap_or(agent.spend_limits),
            Some(Arc::clone(&agent.prices)),
            run.spent,
        ),
        extensions: Extensions::default(),
    };
    if options.compact_first {
        ctx.extensions
            .insert(crate::middleware::CompactFirst::default());
    }
    drive_in(agent, run, &ctx, options.cancel_grace).await
}

/// Advances `run` as the run `ctx` describes (a subagent's run gets its context from the
/// `task` call that starts it). In-flight tools get `cancel_grace` to finish once cancelled.
pub(crate) async fn drive_in(
    agent: &Arc<AgentConfig>,
    mut run: Run,
    ctx: &RunContext,
    cancel_grace: Duration,
) -> Result<RunOutput, RunFailure> {
    let events = &ctx.events;
    events.emit(EventKind::RunStarted {
        protocol: deepagents_core::event::PROTOCOL_VERSION,
        agent: agent.name.clone(),
        model: agent.model.id().to_owned(),
        thread_id: ctx.checkpoint.as_ref().map(|c| c.thread_id.clone()),
    });
    let mut journal = Journal::new(ctx.checkpoint.clone(), &run, events.clone());
    let mut driver = Driver {
        agent,
        ctx,
        cancel_grace,
        tools: Arc::clone(&agent.tools),
        sources: agent.tool_sources.iter().map(|_| None).collect(),
        stop_reason: StopReason::EndTurn,
    };
    let outcome = driver.advance(&mut run, &mut journal).await;
    // Whatever happened, what the run did so far is kept.
    let outcome = match (outcome, journal.save(&run).await) {
        (Ok(_), Err(error)) => Err(error),
        (outcome, _) => outcome,
    };
    match outcome {
        Ok(Ended::Paused(pending)) => Ok(RunOutput {
            text: String::new(),
            stop_reason: StopReason::ToolUse,
            structured: None,
            run,
            changed_files: journal.take_changed_outside(),
            status: RunStatus::Interrupted,
            pending,
        }),
        Ok(Ended::Finished(text)) => {
            events.emit(EventKind::Final {
                text: text.clone(),
                usage: run.usage,
                steps: run.steps,
                spent: run.spent,
                total_spent: run.total_spent,
                stop_reason: driver.stop_reason.clone(),
                files: run
                    .state
                    .files
                    .iter()
                    .map(|(path, file)| (path.clone(), file.content.clone()))
                    .collect(),
            });
            let structured = final_structured_answer(&run);
            Ok(RunOutput {
                text,
                stop_reason: driver.stop_reason,
                structured,
                run,
                changed_files: journal.take_changed_outside(),
                status: RunStatus::Finished,
                pending: Vec::new(),
            })
        }
        Err(error) => {
            events.emit(EventKind::Error {
                kind: error.kind(),
                message: error.to_string(),
            });
            Err(RunFailure {
                error,
                run: Box::new(run),
            })
        }
    }
}

/// One drive in progress: the agent, the run's context and the tools it is offered now.
struct Driver<'a> {
    agent: &'a Arc<AgentConfig>,
    ctx: &'a RunContext,
    cancel_grace: Duration,
    /// The agent's tools as of this step: its fixed ones and its sources'.
    tools: Arc<ToolRegistry>,
    /// Per tool source: the version last listed and its tools then (`None`: not listed yet).
    sources: Vec<Option<Listed>>,
    /// Why the latest model call of this drive stopped (a run resumed into its answer made
    /// none: it ended its turn).
    stop_reason: StopReason,
}

/// A tool source's tools as last listed, with the version they belong to.
type Listed = (u64, Vec<Arc<dyn DynTool>>);

impl Driver<'_> {
    /// Lists the tools of the sources whose version changed and rebuilds the offered set.
    async fn refresh_tools(&mut self) {
        let mut changed = false;
        for (source, seen) in self.agent.tool_sources.iter().zip(&mut self.sources) {
            let version = source.version();
            if seen.as_ref().is_some_and(|(v, _)| *v == version) {
                continue;
            }
            match source.tools(self.ctx).await {
                Ok(tools) => {
                    *seen = Some((version, tools));
                    changed = true;
                }
                Err(error) => tracing::warn!(
                    target: "deepagents::tools",
                    "{error}; the run keeps the tools it had"
                ),
            }
        }
        if !changed {
            return;
        }
        let listed: Vec<Arc<dyn DynTool>> = self
            .sources
            .iter()
            .flatten()
            .flat_map(|(_, tools)| tools.iter().cloned())
            .collect();
        let (tools, refused) = self.agent.tools.extended(listed);
        for name in refused {
            tracing::warn!(
                target: "deepagents::tools",
                "a tool source offered `{name}`, whose name is invalid or already taken; it is left out"
            );
        }
        self.tools = Arc::new(tools);
    }

    async fn advance(&mut self, run: &mut Run, journal: &mut Journal) -> Result<Ended, RunError> {
        let agent = self.agent;
        let ctx = self.ctx;
        let events = &ctx.events;
        self.refresh_tools().await;
        // A run handed over in the earlier format (its bookkeeping in custom keys).
        let legacy = deepagents_core::upgrade_legacy_control(run)?;
        if !legacy.is_empty() {
            journal.upgraded_legacy(&legacy);
        }
        journal.settle_interrupted(run, &self.tools);
        journal.remove_settled_children(run).await;
        let dropped = approval::drop_stale(run);
        if dropped.decisions {
            journal.touched_control(ControlTouched::PAUSE);
        }
        if dropped.subagents {
            journal.touched_control(ControlTouched::SUBAGENTS);
        }
        for middleware in agent.middleware.iter() {
            let update = middleware
                .before_run(ctx, &run.state)
                .await
                .map_err(|e| middleware_error(middleware.name(), e))?;
            if !update.is_empty() {
                agent.schema.apply_all(&mut run.state, [update.clone()])?;
                journal.applied(events, &run.state, &[update]);
            }
        }
        journal.save(run).await?;
        loop {
            let action = run.next_action(ctx.limits.max_turns);
            // Calls are saved with the mark that they started (`tools_started`), or with the
            // pause that holds them: one write for the model's answer and what follows it.
            if !matches!(action, Ok(NextAction::ExecuteTools(_))) {
                journal.save(run).await?;
            }
            if ctx.cancel.is_cancelled() {
                return Err(RunError::Cancelled);
            }
            match action? {
                NextAction::CallModel => self.call_model(run, journal).await?,
                NextAction::ExecuteTools(calls) => {
                    let resuming = approval::has_paused_subagents(run);
                    // Decisions without an interrupt configuration answer an earlier version's
                    // question gate (see `approval::gate`).
                    let calls = if agent.interrupts.is_empty()
                        && !resuming
                        && run.control.decisions.is_empty()
                    {
                        calls
                    } else {
                        // `decide` changed these since the last save. The paused subagent runs,
                        // with the decisions now in them, are saved only once the step is done:
                        // should the process die during it, the subagents ask again rather than
                        // repeat an approved call they may already have made.
                        let undecided = |run: &Run| {
                            run.control.pending.is_empty() && run.control.decisions.is_empty()
                        };
                        let was_undecided = undecided(run);
                        let gated = gate(run, calls, &agent.interrupts);
                        if !(was_undecided && undecided(run)) {
                            journal.touched_control(ControlTouched::PAUSE);
                        }
                        match gated {
                            Gate::Pause(actions) => return Ok(pause(events, actions)),
                            Gate::Proceed {
                                run: to_run,
                                settled,
                                rewritten,
                            } => {
                                if let Some(index) = rewritten {
                                    journal.rewrote_message(index);
                                }
                                for result in settled {
                                    finish_event(events, &result, 0);
                                    run.state.messages.push(Message::Tool(result));
                                }
                                to_run
                            }
                        }
                    };
                    if !calls.is_empty() {
                        let waiting = self.execute_tools(run, calls, journal).await?;
                        self.settle_spend(run);
                        if !waiting.is_empty() {
                            approval::record_pause(run, &waiting);
                            journal.touched_control(ControlTouched::PAUSE);
                            return Ok(pause(events, waiting));
                        }
                    }
                }
                NextAction::Finish { .. }
                    if agent.response_format && final_structured_answer(run).is_none() =>
                {
                    run.state.messages.push(Message::user(
                        "Reply by calling final_answer with your answer in its required structure.",
                    ));
                }
                NextAction::Finish { text } => {
                    let mut more = None;
                    for middleware in agent.middleware.iter() {
                        more = middleware
                            .before_finish(ctx, &run.state)
                            .await
                            .map_err(|e| middleware_error(middleware.name(), e))?;
                        if more.is_some() {
                            break;
                        }
                    }
                    if let Some(message) = more {
                        run.state.messages.push(Message::user(message));
                        continue;
                    }
                    for middleware in agent.middleware.iter().rev() {
                        middleware
                            .after_run(ctx, &run.state)
                            .await
                            .map_err(|e| middleware_error(middleware.name(), e))?;
                    }
                    return Ok(Ended::Finished(text));
                }
            }
        }
    }
}

/// How a drive ended, short of failing.
enum Ended {
    /// With this answer.
    Finished(String),
    /// Paused: these actions wait for decisions.
    Paused(Vec<PendingAction>),
}

/// Announces a pause; the actions are already recorded in the run.
fn pause(events: &EventSink, actions: Vec<PendingAction>) -> Ended {
    events.emit(EventKind::Interrupted {
        actions: actions.clone(),
    });
    Ended::Paused(actions)
}

fn middleware_error(name: &str, error: MiddlewareError) -> RunError {
    RunError::Middleware {
        middleware: name.to_owned(),
        error,
    }
}

/// How one tool call ended.
enum CallOutcome {
    /// Finished, with its state changes, the files it changed outside the state and the
    /// answer it gave for the run, if any.
    Done(ToolResult, StateUpdate, Vec<String>, Option<String>),
    Fatal(ToolResult, String),
    /// A subagent it ran paused for approval: no result yet, the call runs again on resume
    /// and continues this stored subagent run.
    Paused(PausedRun),
}

impl Driver<'_> {
    async fn call_model(&mut self, run: &mut Run, journal: &mut Journal) -> Result<(), RunError> {
        self.refresh_tools().await;
        let agent = self.agent;
        let ctx = self.ctx;
        let events = &ctx.events;
        let step = run.steps + 1;
        let mut request = ModelRequest {
            system_prompt: agent.system_prompt.clone(),
            messages: run.state.messages.clone(),
            tools: self.tools.specs().to_vec(),
            settings: agent.settings.clone(),
        };
        for middleware in agent.middleware.iter() {
            let update = middleware
                .prepare_model_call(ctx, &request, &run.state)
                .await
                .map_err(|e| middleware_error(middleware.name(), e))?;
            if !update.is_empty() {
                let rewrites = update.messages_from.is_some() || !update.messages.is_empty();
                agent.schema.apply_all(&mut run.state, [update.clone()])?;
                journal.applied(events, &run.state, &[update]);
                if rewrites {
                    request.messages = run.state.messages.clone();
                }
            }
        }
        for middleware in agent.middleware.iter() {
            middleware
                .before_model(ctx, &mut request, &run.state)
                .await
                .map_err(|e| middleware_error(middleware.name(), e))?;
        }
        ctx.budget
            .check(agent.model.id(), crate::context::estimate_tokens(&request))
            .map_err(RunError::SpendCap)?;
        events.emit(EventKind::ModelCallStarted { step });
        let chain = ModelNext {
            stack: Arc::clone(&agent.middleware),
            position: 0,
            model: Arc::clone(&agent.model),
            run: ctx.clone(),
        };
        let mut response = tokio::select! {
            response = chain.call(request) => response?,
            () = ctx.cancel.cancelled() => return Err(RunError::Cancelled),
        };
        for middleware in agent.middleware.iter().rev() {
            middleware
                .after_model(ctx, &mut response, &run.state)
                .await
                .map_err(|e| middleware_error(middleware.name(), e))?;
        }
        events.emit(EventKind::ModelCallFinished {
            step,
            usage: response.usage,
            stop_reason: response.stop_reason.clone(),
            tool_calls: response.message.tool_calls.len(),
        });
        self.stop_reason = response.stop_reason.clone();
        ctx.budget.charge(agent.model.id(), response.usage);
        run.apply_model_response(response);
        self.settle_spend(run);
        Ok(())
    }

    /// The top-level run's record of what its tree spent, from the shared budget (its
    /// subagents charge it during tool calls). Subagent runs leave theirs alone.
    fn settle_spend(&self, run: &mut Run) {
        if !self.ctx.events.path().is_empty() {
            return;
        }
        let now = self.ctx.budget.spent();
        let mut added = now;
        added.subtract(&run.spent);
        run.spent = now;
        run.total_spent.add(&added);
    }

    /// Executes `calls` and folds their results into `run` in call order.
    ///
    /// The calls run inside the driver's task rather than on spawned ones: no scheduling hops per
    /// step, and dropping the futures aborts them. Calls to non-mutating tools run concurrently;
    /// calls to mutating tools run one after another in call order, alongside the others. A
    /// panicking tool yields an error result for its own call only. On cancellation the tools are
    /// told through their token, get `cancel_grace` to finish, and are then dropped; whatever
    /// finished is kept. Calls whose subagent paused get no result; the actions those subagents
    /// wait on are returned (empty when none paused).
    async fn execute_tools(
        &mut self,
        run: &mut Run,
        calls: Vec<ToolCall>,
        journal: &mut Journal,
    ) -> Result<Vec<PendingAction>, RunError> {
        let agent = self.agent;
        let events = &self.ctx.events;
        let tools = &self.tools;
        let cancel_grace = self.cancel_grace;
        journal
            .tools_started(run, calls.iter().map(|c| c.id.clone()).collect())
            .await?;
        // Tools read the state through an `Arc`; moving it out (rather than cloning) keeps a step's
        // cost independent of the conversation's length. It is moved back once every tool is done.
        let shared = Arc::new(std::mem::take(&mut run.state));
        let step = RunContext {
            cancel: self.ctx.cancel.child_token(),
            ..self.ctx.clone()
        };
        // Calls whose subagent paused inside them continue that run.
        let paused_runs: BTreeMap<String, Arc<PausedRun>> = run
            .control
            .paused_subagents
            .iter()
            .filter(|(id, _)| calls.iter().any(|c| &c.id == *id))
            .map(|(id, paused)| (id.clone(), Arc::new(paused.clone())))
            .collect();
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
        let (mutating, concurrent): (Vec<usize>, Vec<usize>) =
            (0..calls.len()).partition(|&i| tools.is_mutating(&calls[i].name));
        let sequential_calls = mutating.clone();
        let mut outcomes: Vec<Option<(CallOutcome, Option<u64>)>> =
            calls.iter().map(|_| None).collect();
        let mut cancelled = false;
        {
            // Scoped so that every tool future, and its handle on the shared state, is dropped
            // before the state is taken back.
            let concurrent: FuturesUnordered<_> = concurrent
                .into_iter()
                .map(|index| start_call(index, Arc::clone(&shared)))
                .collect();
            // Mutating calls run one after another, each seeing what the earlier ones changed (a
            // write then an edit of the same file in one turn works). The state is copied only
            // when a call changed something and another mutating call follows.
            let sequential = stream::unfold(
                (mutating.into_iter(), Arc::clone(&shared)),
                move |(mut rest, view)| async move {
                    let index = rest.next()?;
                    let (index, outcome) = start_call(index, Arc::clone(&view)).await;
                    let view = match &outcome {
                        (CallOutcome::Done(_, update, _, _), _)
                            if !update.is_empty() && rest.len() > 0 =>
                        {
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
            let finished = stream::select(concurrent, sequential);
            let grace = tokio::time::sleep(cancel_grace);
            tokio::pin!(finished, grace);
            loop {
                tokio::select! {
                    next = finished.next() => match next {
                        Some((index, outcome)) => outcomes[index] = Some(outcome),
                        None => break,
                    },
                    () = self.ctx.cancel.cancelled(), if !cancelled => {
                        cancelled = true;
                        grace.as_mut().reset(tokio::time::Instant::now() + cancel_grace);
                    }
                    () = &mut grace, if cancelled => break,
                }
            }
        }

        let mut results = Vec::with_capacity(calls.len());
        // Per result: the files it changed outside the state.
        let mut changed_outside: Vec<Vec<String>> = Vec::with_capacity(calls.len());
        let mut paused = Vec::new();
        let mut fatal = None;
        // The first answer a call of this step gave directly (`ToolOutput::final_answer`).
        let mut final_answer: Option<String> = None;
        // Calls whose finished event waits for the conflict notes, by result index.
        let mut unannounced: Vec<(usize, u64)> = Vec::new();
        for (call, outcome) in calls.iter().zip(outcomes) {
            let outcome = outcome.map(|(outcome, owed)| {
                if let Some(elapsed) = owed {
                    unannounced.push((results.len(), elapsed));
                }
                outcome
            });
            match outcome {
                Some(CallOutcome::Done(result, update, changed, answer)) => {
                    if answer.is_some() && final_answer.is_none() {
                        final_answer = answer;
                    }
                    changed_outside.push(changed);
                    results.push((result, update));
                }
                Some(CallOutcome::Paused(subagent)) => paused.push((call.id.clone(), subagent)),
                Some(CallOutcome::Fatal(result, message)) => {
                    fatal.get_or_insert((call.name.clone(), message));
                    changed_outside.push(Vec::new());
                    results.push((result, StateUpdate::default()));
                }
                None => {
                    let result = ToolResult::error(call, "Cancelled before it finished.");
                    finish_event(events, &result, 0);
                    changed_outside.push(Vec::new());
                    results.push((result, StateUpdate::default()));
                }
            }
        }

        note_file_conflicts(&mut results, &changed_outside, &sequential_calls);
        for (index, elapsed) in unannounced {
            if let Some((result, _)) = results.get(index) {
                finish_event(events, result, elapsed);
            }
        }
        journal.changed_outside(changed_outside.into_iter().flatten());
        run.state = Arc::try_unwrap(shared).unwrap_or_else(|leaked| AgentState::clone(&leaked));
        let updates: Vec<StateUpdate> = results
            .iter()
            .map(|(_, update)| update.clone())
            .filter(|update| !update.is_empty())
            .collect();
        let finished: Vec<String> = results
            .iter()
            .map(|(result, _)| result.tool_call_id.clone())
            .collect();
        run.apply_tool_results(results, &agent.schema)?;
        journal.tools_finished(run);
        journal.applied(events, &run.state, &updates);
        let mut waiting = Vec::new();
        if !paused.is_empty() || approval::has_paused_subagents(run) {
            let (changed, actions) =
                approval::settle_subagents(run, finished.iter().map(String::as_str), paused);
            if changed {
                journal.touched_control(ControlTouched::SUBAGENTS);
            }
            waiting = actions;
        }

        if let Some((tool, message)) = fatal {
            return Err(RunError::ToolFatal { tool, message });
        }
        if cancelled {
            return Err(RunError::Cancelled);
        }
        if let Some(answer) = final_answer.filter(|_| waiting.is_empty()) {
            // A tool answered for the run: close the turn with it, without another model call.
            run.state
                .messages
                .push(Message::Assistant(AssistantMessage::text(answer)));
        }
        Ok(waiting)
    }
}

/// When several calls of one step change the same file, the last in call order wins (the merge
/// rule); each of them is told, so no agent believes its version survived when it did not.
/// Two mutating calls (`sequential`, in call order) do not conflict: the later one saw the
/// earlier one's change.
fn note_file_conflicts(
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

fn finish_event(events: &EventSink, result: &ToolResult, duration_ms: u64) {
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
