//! The run as a state machine that performs no IO.
//!
//! A [`Run`] is plain data. [`Run::next_action`] says what to do next — call the model, execute
//! tool calls, or finish — and `apply_*` fold the outcome in. The driver in the `deepagents`
//! crate does the IO in between. Because the next action is derived from the conversation
//! itself, a run loaded from a checkpoint continues exactly where it stopped: tool calls that
//! already have results are never executed again.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::content::{ContentBlock, joined_text};
use crate::interrupt::{Decision, PendingAction};
use crate::message::{Message, ToolCall, ToolResult, Usage};
use crate::model::ModelResponse;
use crate::spend::Spent;
use crate::state::{AgentState, StateError, StateSchema, StateUpdate};

/// The whole state of a run; persist it and you can resume it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// The agent state.
    pub state: AgentState,
    /// Model calls made since the latest user input.
    #[serde(default)]
    pub steps: u32,
    /// Tokens used since the latest user input.
    #[serde(default)]
    pub usage: Usage,
    /// What the run and its subagents spent since the latest user input (what spend caps
    /// count; kept across pauses and crashes).
    #[serde(default)]
    pub spent: Spent,
    /// What the conversation has spent in all its runs.
    #[serde(default)]
    pub total_spent: Spent,
    /// The harness's bookkeeping: pauses, decisions, in-flight calls.
    #[serde(default, skip_serializing_if = "Control::is_empty")]
    pub control: Control,
}

/// The harness's own bookkeeping of a run, apart from the agent state so no application key
/// can collide with it: what a pause waits on, the decisions given, subagent runs paused
/// inside a call, and the calls of a step in progress.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Control {
    /// The actions the paused run waits on, in the order decisions must be given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<PendingAction>,
    /// Decisions given for the run's own calls, by call id, until the step uses them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub decisions: BTreeMap<String, Decision>,
    /// Subagent runs paused inside a call of this run, by the id of that call.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub paused_subagents: BTreeMap<String, PausedRun>,
    /// The ids of the calls of a step that started but has not finished.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub in_flight: Vec<String>,
    /// The key of the request whose input or decisions the run took last (see
    /// `Thread::with_input_key`): the same request delivered again, after a crash, continues
    /// the run instead of adding them twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_key: Option<String>,
}

impl Control {
    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// A subagent run paused inside a tool call, kept in its parent's [`Control`] so it is
/// checkpointed and resumed with the parent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PausedRun {
    /// The subagent type the call asked for.
    pub subagent: String,
    /// Its run as it paused; its own pending actions and decisions live in it.
    pub run: Box<Run>,
    /// Files it changed before pausing, so they still flow back once it finishes.
    #[serde(default)]
    pub changed_files: Vec<String>,
}

/// What the driver must do next.
///
/// A paused run ([`Control::pending`] not empty) whose calls still wait gets
/// [`AwaitDecisions`](Self::AwaitDecisions) until decisions are recorded
/// ([`Run::decide`]).
#[derive(Clone, Debug, PartialEq)]
pub enum NextAction {
    /// Call the model with the conversation.
    CallModel,
    /// Execute these calls of the latest assistant turn (the ones without a result yet).
    ExecuteTools(Vec<ToolCall>),
    /// The run is paused and no decisions came: it waits on these actions again.
    AwaitDecisions(Vec<PendingAction>),
    /// The model answered without tool calls: the run is complete.
    Finish {
        /// The answer.
        text: String,
    },
}

/// The run needs another model call but has used all it may.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the run made {limit} model calls without reaching a final answer (the turn limit); raise the turn limit or narrow the task"
)]
pub struct TurnLimitReached {
    /// The limit that was reached.
    pub limit: u32,
}

impl Run {
    /// A run over an existing state.
    pub fn new(state: AgentState) -> Self {
        Self {
            state,
            ..Self::default()
        }
    }

    /// A fresh run whose conversation is one user message.
    pub fn from_task(task: impl Into<String>) -> Self {
        let mut run = Self::default();
        run.push_user_input(vec![ContentBlock::text(task)]);
        run
    }

    /// Appends user input and starts counting steps and usage afresh.
    pub fn push_user_input(&mut self, content: Vec<ContentBlock>) {
        self.state.messages.push(Message::User { content });
        self.steps = 0;
        self.usage = Usage::default();
        self.spent = Spent::default();
    }

    /// What to do next, derived from the conversation; `max_steps` bounds model calls since
    /// the latest user input.
    pub fn next_action(&self, max_steps: u32) -> Result<NextAction, TurnLimitReached> {
        let pending = self.pending_tool_calls();
        if !pending.is_empty() {
            // Decisions clear the pending actions; without them the pause stands.
            if !self.control.pending.is_empty() {
                return Ok(NextAction::AwaitDecisions(self.control.pending.clone()));
            }
            return Ok(NextAction::ExecuteTools(pending));
        }
        if let Some(Message::Assistant(message)) = self.state.messages.last()
            && message.tool_calls.is_empty()
        {
            return Ok(NextAction::Finish {
                text: joined_text(&message.content),
            });
        }
        if self.steps >= max_steps {
            return Err(TurnLimitReached { limit: max_steps });
        }
        Ok(NextAction::CallModel)
    }

    /// Tool calls of the latest assistant turn that have no result yet, in call order.
    pub fn pending_tool_calls(&self) -> Vec<ToolCall> {
        let messages = &self.state.messages;
        let mut answered = HashSet::new();
        for message in messages.iter().rev() {
            match message {
                Message::Tool(result) => {
                    answered.insert(result.tool_call_id.as_str());
                }
                Message::Assistant(assistant) => {
                    return assistant
                        .tool_calls
                        .iter()
                        .filter(|call| !answered.contains(call.id.as_str()))
                        .cloned()
                        .collect();
                }
                Message::User { .. } | Message::System { .. } => return Vec::new(),
            }
        }
        Vec::new()
    }

    /// Folds in a model answer.
    pub fn apply_model_response(&mut self, response: ModelResponse) {
        self.steps += 1;
        self.usage += response.usage;
        self.state
            .messages
            .push(Message::Assistant(response.message));
    }

    /// Folds in tool results (already in call order) and merges their state updates in the
    /// same order. All-or-nothing: on error the run is unchanged.
    pub fn apply_tool_results(
        &mut self,
        results: Vec<(ToolResult, StateUpdate)>,
        schema: &StateSchema,
    ) -> Result<(), StateError> {
        let (results, mut updates): (Vec<_>, Vec<_>) = results.into_iter().unzip();
        if updates.iter().any(|update| update.messages_from.is_some()) {
            return Err(StateError::ToolRewroteMessages);
        }
        // Messages a tool adds follow the step's results, which must come right after the
        // calls they answer.
        let added: Vec<Message> = updates
            .iter_mut()
            .flat_map(|update| std::mem::take(&mut update.messages))
            .collect();
        schema.apply_all(&mut self.state, updates)?;
        self.state
            .messages
            .extend(results.into_iter().map(Message::Tool));
        self.state.messages.extend(added);
        Ok(())
    }
}
