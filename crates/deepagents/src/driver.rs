//! The driver: performs the IO a [`Run`] asks for, one action at a time.

use std::sync::Arc;
use std::time::Duration;

use deepagents_core::message::AssistantMessage;
use deepagents_core::{
    AgentState, EventKind, EventSink, Gate, Message, ModelRequest, NextAction, Run, RunContext,
    StateUpdate, StopReason, ToolCall,
};

use crate::approval::{self, PendingAction};
use crate::calls::{Execution, Folded, finish_event, mutating, note_file_conflicts, run_calls};
use crate::config::AgentConfig;
use crate::error::{RunError, RunFailure};
use crate::journal::Journal;
use crate::middleware::{MiddlewareError, ModelNext, final_structured_answer};
use crate::registry::OfferedTools;
use crate::run::{RunOptions, RunOutput, RunStatus};

/// Advances `run` until it has a final answer or fails: a run of its own, described by
/// `options`.
pub(crate) async fn drive(
    agent: &Arc<AgentConfig>,
    run: Run,
    options: &RunOptions,
    events: &EventSink,
) -> Result<RunOutput, RunFailure> {
    let ctx = options.context(agent, run.spent, events);
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
        tools: OfferedTools::new(agent),
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
    tools: OfferedTools,
    /// Why the latest model call of this drive stopped (a run resumed into its answer made
    /// none: it ended its turn).
    stop_reason: StopReason,
}

impl Driver<'_> {
    async fn advance(&mut self, run: &mut Run, journal: &mut Journal) -> Result<Ended, RunError> {
        self.prepare(run, journal).await?;
        let events = &self.ctx.events;
        loop {
            let action = run.next_action(self.ctx.limits.max_turns);
            // Calls are saved with the mark that they started (`tools_started`), or with the
            // pause that holds them: one write for the model's answer and what follows it.
            if !matches!(action, Ok(NextAction::ExecuteTools(_))) {
                journal.save(run).await?;
            }
            if self.ctx.cancel.is_cancelled() {
                return Err(RunError::Cancelled);
            }
            match action? {
                NextAction::CallModel => self.call_model(run, journal).await?,
                NextAction::AwaitDecisions(actions) => return Ok(pause(events, actions)),
                NextAction::ExecuteTools(calls) => {
                    let waiting = self.step(run, calls, journal).await?;
                    if !waiting.is_empty() {
                        return Ok(pause(events, waiting));
                    }
                }
                NextAction::Finish { text } => {
                    if let Some(ended) = self.finish(run, text).await? {
                        return Ok(ended);
                    }
                }
            }
        }
    }

    /// What a run does before its first action: the tools listed, a run of the earlier format
    /// upgraded, what a crash left settled, what is left of a pause new input replaced
    /// dropped, and the middleware's `before_run`; then it is saved.
    async fn prepare(&mut self, run: &mut Run, journal: &mut Journal) -> Result<(), RunError> {
        let agent = self.agent;
        let ctx = self.ctx;
        self.tools.refresh(self.agent, self.ctx).await;
        let legacy = deepagents_core::upgrade_legacy_control(run)?;
        if !legacy.is_empty() {
            journal.upgraded_legacy(&legacy);
        }
        journal.settle_interrupted(run, &self.tools.registry);
        journal.remove_settled_children(run).await;
        run.drop_stale();
        for middleware in agent.middleware.iter() {
            let update = middleware
                .before_run(ctx, &run.state)
                .await
                .map_err(|e| middleware_error(middleware.name(), e))?;
            if !update.is_empty() {
                agent.schema.apply_all(&mut run.state, [update.clone()])?;
                journal.applied(&ctx.events, &run.state, &[update]);
            }
        }
        journal.save(run).await
    }

    /// One step of tool calls: gated by the approval rules and the decisions given, then the
    /// calls that may run are executed. Returns the actions the run now waits on (empty when
    /// it goes on).
    async fn step(
        &mut self,
        run: &mut Run,
        calls: Vec<ToolCall>,
        journal: &mut Journal,
    ) -> Result<Vec<PendingAction>, RunError> {
        let agent = self.agent;
        let calls = if agent.interrupts.is_empty() && !run.needs_gate() {
            calls
        } else {
            match run.gate(calls, |call| approval::rule_for(&agent.interrupts, call)) {
                Gate::Pause(actions) => return Ok(actions),
                Gate::Proceed {
                    run: to_run,
                    settled,
                    rewritten,
                } => {
                    if let Some(index) = rewritten {
                        journal.rewrote_message(index);
                    }
                    for result in settled {
                        finish_event(&self.ctx.events, &result, 0);
                        run.state.messages.push(Message::Tool(result));
                    }
                    to_run
                }
            }
        };
        if calls.is_empty() {
            return Ok(Vec::new());
        }
        let waiting = self.execute_tools(run, calls, journal).await?;
        self.settle_spend(run);
        Ok(waiting)
    }

    /// The model answered without tool calls: the run ends with `text`, unless a structured
    /// answer is missing or a middleware keeps it going (`None`: go on).
    async fn finish(&self, run: &mut Run, text: String) -> Result<Option<Ended>, RunError> {
        let agent = self.agent;
        let ctx = self.ctx;
        if agent.response_format && final_structured_answer(run).is_none() {
            run.state.messages.push(Message::user(
                "Reply by calling final_answer with your answer in its required structure.",
            ));
            return Ok(None);
        }
        for middleware in agent.middleware.iter() {
            let more = middleware
                .before_finish(ctx, &run.state)
                .await
                .map_err(|e| middleware_error(middleware.name(), e))?;
            if let Some(message) = more {
                run.state.messages.push(Message::user(message));
                return Ok(None);
            }
        }
        for middleware in agent.middleware.iter().rev() {
            middleware
                .after_run(ctx, &run.state)
                .await
                .map_err(|e| middleware_error(middleware.name(), e))?;
        }
        Ok(Some(Ended::Finished(text)))
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

impl Driver<'_> {
    async fn call_model(&mut self, run: &mut Run, journal: &mut Journal) -> Result<(), RunError> {
        self.tools.refresh(self.agent, self.ctx).await;
        let agent = self.agent;
        let ctx = self.ctx;
        let events = &ctx.events;
        let step = run.steps + 1;
        let mut request = ModelRequest {
            system_prompt: agent.system_prompt.clone(),
            messages: run.state.messages.clone(),
            tools: self.tools.registry.specs().to_vec(),
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
        let events = &self.ctx.events;
        journal
            .tools_started(run, calls.iter().map(|c| c.id.clone()).collect())
            .await?;
        // Tools read the state through an `Arc`; moving it out (rather than cloning) keeps a step's
        // cost independent of the conversation's length. It is moved back once every tool is done.
        let shared = Arc::new(std::mem::take(&mut run.state));
        let exec = Execution {
            agent: self.agent,
            tools: &self.tools.registry,
            ctx: self.ctx,
            cancel_grace: self.cancel_grace,
        };
        let (outcomes, cancelled) = run_calls(exec, run, &calls, &shared).await;
        let mut step = Folded::of(events, &calls, outcomes);
        note_file_conflicts(
            &mut step.results,
            &step.changed_outside,
            &mutating(&self.tools.registry, &calls),
        );
        for (index, elapsed) in step.unannounced {
            if let Some((result, _)) = step.results.get(index) {
                finish_event(events, result, elapsed);
            }
        }
        journal.changed_outside(step.changed_outside.into_iter().flatten());
        run.state = Arc::try_unwrap(shared).unwrap_or_else(|leaked| AgentState::clone(&leaked));
        let updates: Vec<StateUpdate> = step
            .results
            .iter()
            .map(|(_, update)| update.clone())
            .filter(|update| !update.is_empty())
            .collect();
        let finished: Vec<String> = step
            .results
            .iter()
            .map(|(result, _)| result.tool_call_id.clone())
            .collect();
        run.apply_tool_results(step.results, &self.agent.schema)?;
        journal.tools_finished(run);
        journal.applied(events, &run.state, &updates);
        let waiting = run.settle_subagents(finished.iter().map(String::as_str), step.paused);
        if let Some((tool, message)) = step.fatal {
            return Err(RunError::ToolFatal { tool, message });
        }
        if cancelled {
            return Err(RunError::Cancelled);
        }
        if let Some(answer) = step.final_answer.filter(|_| waiting.is_empty()) {
            // A tool answered for the run: close the turn with it, without another model call.
            run.state
                .messages
                .push(Message::Assistant(AssistantMessage::text(answer)));
        }
        Ok(waiting)
    }
}
