//! What a run is given and what it ends with.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use deepagents_core::{
    Checkpointing, EventSink, Extensions, Run, RunContext, RunLimits, RuntimeContext, SpendLimits,
    Spent, StopReason,
};
use tokio_util::sync::CancellationToken;

use crate::approval::PendingAction;
use crate::config::AgentConfig;

/// How long in-flight tools may wind down after cancellation unless
/// [`RunOptions::cancel_grace`] says otherwise.
pub const DEFAULT_CANCEL_GRACE: Duration = Duration::from_secs(5);

/// Per-run options.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Application data the tools can read.
    pub runtime: RuntimeContext,
    /// Cancel this to stop the run; in-flight tools see it through their context.
    pub cancel: CancellationToken,
    /// How long in-flight tools may take to wind down after cancellation before they are
    /// aborted.
    pub cancel_grace: Duration,
    /// Where to checkpoint the run after every step (see [`open_thread`](crate::open_thread)).
    pub checkpoint: Option<Checkpointing>,
    /// This run's limits (turns, subagent depth and concurrency); `None`: the agent's.
    pub limits: Option<RunLimits>,
    /// This run's spend caps (its subagents included); `None`: the agent's.
    pub spend_limits: Option<SpendLimits>,
    /// Summarize the older messages before the run's first model call, as the
    /// `compact_conversation` tool asks (a front end's `/compact`). Needs summarization;
    /// a conversation too small to gain from it is left as it is.
    pub compact_first: bool,
    /// Who the run acts for, as middleware, tools and store namespaces see it
    /// ([`RunContext::assistant_id`](deepagents_core::RunContext::assistant_id)); `None`: the agent's name.
    pub assistant_id: Option<String>,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            runtime: RuntimeContext::default(),
            cancel: CancellationToken::new(),
            cancel_grace: DEFAULT_CANCEL_GRACE,
            checkpoint: None,
            limits: None,
            spend_limits: None,
            compact_first: false,
            assistant_id: None,
        }
    }
}

/// How a run ended, short of failing: with its answer, or paused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunStatus {
    /// It reached its final answer.
    Finished,
    /// It paused: [`RunOutput::pending`] lists what it waits on. Give one decision per action
    /// ([`Input::Decide`](crate::Input::Decide), or [`decide`](crate::decide) on the run) to continue it.
    Interrupted,
}

/// What a run ended with: its final answer, or the actions it paused for.
#[derive(Clone, Debug)]
pub struct RunOutput {
    /// Finished or paused.
    pub status: RunStatus,
    /// The actions a paused run waits on, in the order decisions must be given; empty when
    /// it finished.
    pub pending: Vec<PendingAction>,
    /// The final answer: the text of the last assistant message (empty when paused).
    pub text: String,
    /// Why the model ended that answer; [`StopReason::MaxTokens`] means it was cut at the
    /// output limit and is not whole ([`cut`](Self::cut)).
    pub stop_reason: StopReason,
    /// The validated structured answer, when the agent has a response format.
    pub structured: Option<serde_json::Value>,
    /// The finished run, with the whole conversation and state.
    pub run: Run,
    /// Files this run's tools changed outside the agent state (on disk, in a store), by the
    /// path the agent sees; those in the state are in [`run`](Self::run).
    pub changed_files: BTreeSet<String>,
}

impl RunOutput {
    /// Whether the answer was cut at the model's output limit: what it says is not all it
    /// meant to say.
    pub fn cut(&self) -> bool {
        self.stop_reason == StopReason::MaxTokens
    }

    /// The id of the pause the run ended in (see [`pause_id`](crate::approval::pause_id));
    /// `None` when it finished. Give it back with the decisions
    /// ([`Input::DecidePause`](crate::Input::DecidePause)) so they answer this pause only.
    pub fn pause_id(&self) -> Option<String> {
        crate::approval::pause_id(&self.run)
    }
}

impl RunOptions {
    /// The context of a top-level run of `agent` with these options, sending events to
    /// `events`; `spent` is what the run spent before a pause or a crash.
    pub(crate) fn context(
        &self,
        agent: &Arc<AgentConfig>,
        spent: Spent,
        events: &EventSink,
    ) -> RunContext {
        let options = self;
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
                spent,
            ),
            extensions: Extensions::default(),
        };
        if options.compact_first {
            ctx.extensions
                .insert(crate::middleware::CompactFirst::default());
        }
        ctx
    }
}
