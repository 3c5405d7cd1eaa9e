//! Checkpointing during a run: what changed since the last save, written after every action.

use std::collections::BTreeSet;
use std::sync::Arc;

use deepagents_core::{
    AgentState, Checkpointer, EventSink, Message, Run, RunDelta, StateUpdate, ToolResult,
};
use serde_json::Value;

use crate::error::RunError;
use crate::registry::ToolRegistry;

/// The custom key naming the tool calls of a step that started but has not finished.
pub const IN_FLIGHT_KEY: &str = "deepagents.in_flight";

/// Where a run is checkpointed.
#[derive(Clone)]
pub struct Checkpointing {
    /// The store.
    pub checkpointer: Arc<dyn Checkpointer>,
    /// The thread the run belongs to.
    pub thread_id: String,
    /// How many of the run's messages the store already holds.
    pub persisted_messages: usize,
}

impl std::fmt::Debug for Checkpointing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpointing")
            .field("thread_id", &self.thread_id)
            .field("persisted_messages", &self.persisted_messages)
            .finish_non_exhaustive()
    }
}

/// Loads thread `thread_id` (a new, empty run when it does not exist), appends `input` as user
/// input, and returns the run with the checkpointing to continue it under.
pub async fn open_thread(
    checkpointer: Arc<dyn Checkpointer>,
    thread_id: &str,
    input: Option<String>,
) -> Result<(Run, Checkpointing), deepagents_core::CheckpointError> {
    let mut run = checkpointer
        .load(thread_id, None)
        .await?
        .unwrap_or_default();
    let persisted_messages = run.state.messages.len();
    if let Some(input) = input {
        run.push_user_input(vec![deepagents_core::ContentBlock::text(input)]);
    }
    Ok((
        run,
        Checkpointing {
            checkpointer,
            thread_id: thread_id.to_owned(),
            persisted_messages,
        },
    ))
}

/// Tracks what a run changed since it was last saved.
pub(crate) struct Journal {
    target: Option<Checkpointing>,
    todos: bool,
    files: BTreeSet<String>,
    custom: BTreeSet<String>,
    /// The earliest already-stored message that was changed in place since the last save.
    rewritten_from: Option<usize>,
    /// Step count and usage at the last save, to skip saves that would change nothing.
    saved_progress: (u32, u64),
}

impl Journal {
    pub(crate) fn new(target: Option<Checkpointing>, run: &Run) -> Self {
        // A fresh run (nothing persisted) is saved whole, custom values and files included.
        let fresh = target.as_ref().is_some_and(|t| t.persisted_messages == 0);
        Self {
            todos: fresh,
            files: if fresh {
                run.state.files.keys().cloned().collect()
            } else {
                BTreeSet::new()
            },
            custom: if fresh {
                run.state.custom.keys().cloned().collect()
            } else {
                BTreeSet::new()
            },
            rewritten_from: None,
            saved_progress: (run.steps, run.usage.input_tokens + run.usage.output_tokens),
            target,
        }
    }

    /// Records updates that were applied to the state and announces them.
    pub(crate) fn applied(
        &mut self,
        events: &EventSink,
        state: &AgentState,
        updates: &[StateUpdate],
    ) {
        for update in updates {
            self.todos |= update.todos.is_some();
            self.files.extend(update.files.keys().cloned());
            self.custom.extend(update.custom.keys().cloned());
        }
        crate::driver::emit_state_updated(events, state, updates);
    }

    pub(crate) fn touched_custom(&mut self, key: &str) {
        self.custom.insert(key.to_owned());
    }

    /// Records that message `index` was changed in place. Appending deltas cannot express
    /// that, so the next save rewrites the stored history from there on; the rewritten
    /// message is normally the latest assistant turn, so the write stays a few messages long.
    pub(crate) fn rewrote_message(&mut self, index: usize) {
        let Some(target) = &self.target else {
            return;
        };
        if index < target.persisted_messages {
            self.rewritten_from = Some(self.rewritten_from.map_or(index, |i| i.min(index)));
        }
    }

    /// Writes what changed since the last save, if anything did.
    pub(crate) async fn save(&mut self, run: &Run) -> Result<(), RunError> {
        let Some(target) = &mut self.target else {
            return Ok(());
        };
        let progress = (run.steps, run.usage.input_tokens + run.usage.output_tokens);
        let new_messages = run.state.messages.len() > target.persisted_messages;
        if !new_messages
            && self.rewritten_from.is_none()
            && !self.todos
            && self.files.is_empty()
            && self.custom.is_empty()
            && progress == self.saved_progress
        {
            return Ok(());
        }
        let replace_from = self.rewritten_from.map(|i| i.min(run.state.messages.len()));
        let start = replace_from
            .unwrap_or(target.persisted_messages)
            .min(run.state.messages.len());
        let delta = RunDelta {
            messages: run.state.messages[start..].to_vec(),
            replace_from,
            todos: self.todos.then(|| run.state.todos.clone()),
            files: self
                .files
                .iter()
                .map(|path| (path.clone(), run.state.files.get(path).cloned()))
                .collect(),
            custom: self
                .custom
                .iter()
                .map(|key| {
                    (
                        key.clone(),
                        run.state.custom.get(key).cloned().unwrap_or(Value::Null),
                    )
                })
                .collect(),
            steps: run.steps,
            usage: run.usage,
        };
        target
            .checkpointer
            .append(&target.thread_id, &delta, run)
            .await
            .map_err(RunError::Checkpoint)?;
        target.persisted_messages = run.state.messages.len();
        self.rewritten_from = None;
        self.todos = false;
        self.files.clear();
        self.custom.clear();
        self.saved_progress = progress;
        Ok(())
    }

    /// Marks the calls of a step as started (and saves), so a crash during the step is seen on
    /// resume.
    pub(crate) async fn tools_started(
        &mut self,
        run: &mut Run,
        ids: Vec<String>,
    ) -> Result<(), RunError> {
        if self.target.is_none() {
            return Ok(());
        }
        run.state
            .custom
            .insert(IN_FLIGHT_KEY.to_owned(), Value::from(ids));
        self.touched_custom(IN_FLIGHT_KEY);
        self.save(run).await
    }

    /// Clears the started calls once their results are in the run.
    pub(crate) fn tools_finished(&mut self, run: &mut Run) {
        if run.state.custom.remove(IN_FLIGHT_KEY).is_some() {
            self.touched_custom(IN_FLIGHT_KEY);
        }
    }

    /// Settles calls a crash interrupted: calls to mutating tools get an "interrupted" result
    /// (they may have partly taken effect, so running them again could do it twice); calls to
    /// other tools are left pending and simply run again.
    pub(crate) fn settle_interrupted(&mut self, run: &mut Run, tools: &ToolRegistry) {
        let Some(Value::Array(ids)) = run.state.custom.remove(IN_FLIGHT_KEY) else {
            return;
        };
        self.touched_custom(IN_FLIGHT_KEY);
        let started: BTreeSet<&str> = ids.iter().filter_map(Value::as_str).collect();
        for call in run.pending_tool_calls() {
            if started.contains(call.id.as_str()) && tools.is_mutating(&call.name) {
                run.state.messages.push(Message::Tool(ToolResult::error(
                    &call,
                    "Interrupted: the process stopped while this call was running, so it may have partly taken effect. Check its effects before running it again.",
                )));
            }
        }
    }
}
