//! Checkpointing during a run: what changed since the last save, written after every action.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use deepagents_core::interrupt::{Decision, PendingAction};
use deepagents_core::{
    AgentState, CHECKPOINT_SCHEMA, CheckpointError, Checkpointer, Checkpointing, Control,
    ControlDelta, EventKind, EventSink, Message, PausedRun, Run, RunDelta, StateUpdate,
    ThreadLease, ToolResult, Usage, upgrade_legacy_control, validate_thread_id,
};
use serde_json::Value;

use crate::error::RunError;
use crate::registry::ToolRegistry;

/// Loads thread `thread_id` (a new, empty run when it does not exist), appends `input` as user
/// input, and returns the run with the checkpointing to continue it under. The checkpointing
/// holds the thread's lease, so no other run writes the thread until it is dropped; a thread
/// another run holds is refused with [`CheckpointError::Busy`].
pub async fn open_thread(
    checkpointer: Arc<dyn Checkpointer>,
    thread_id: &str,
    input: Option<String>,
) -> Result<(Run, Checkpointing), CheckpointError> {
    open_thread_waiting(checkpointer, thread_id, input, Duration::ZERO).await
}

/// Like [`open_thread`], but waits up to `wait` for another run to release the thread
/// (`Duration::MAX`: for as long as it takes).
pub async fn open_thread_waiting(
    checkpointer: Arc<dyn Checkpointer>,
    thread_id: &str,
    input: Option<String>,
    wait: Duration,
) -> Result<(Run, Checkpointing), CheckpointError> {
    open_thread_with(
        checkpointer,
        thread_id,
        input.map(|text| vec![deepagents_core::ContentBlock::text(text)]),
        wait,
    )
    .await
}

/// Like [`open_thread_waiting`], with input of any content (text and images).
async fn open_thread_with(
    checkpointer: Arc<dyn Checkpointer>,
    thread_id: &str,
    input: Option<Vec<deepagents_core::ContentBlock>>,
    wait: Duration,
) -> Result<(Run, Checkpointing), CheckpointError> {
    let (run, checkpointing) = lease_and_load(checkpointer, thread_id, wait).await?;
    let mut run = run.unwrap_or_default();
    if let Some(input) = input {
        run.push_user_input(input);
    }
    Ok((run, checkpointing))
}

/// Takes the lease of `thread_id` (waiting up to `wait` for another run to release it) and
/// loads its latest run, `None` when it has no checkpoint yet.
pub(crate) async fn lease_and_load(
    checkpointer: Arc<dyn Checkpointer>,
    thread_id: &str,
    wait: Duration,
) -> Result<(Option<Run>, Checkpointing), CheckpointError> {
    validate_thread_id(thread_id)?;
    let lease = lease_thread(checkpointer.as_ref(), thread_id, wait).await?;
    let mut checkpointing = Checkpointing::new(checkpointer, lease, 0);
    let run = reload_stored(&mut checkpointing).await?;
    Ok((run, checkpointing))
}

/// The thread's latest run as the store holds it (empty when it has none), with
/// `checkpointing` set to continue it: what a run under an already held lease resumes from.
///
/// A thread stored in this project's earlier format is upgraded here, under the lease: its
/// bookkeeping moves from custom keys into [`Run::control`] and that is stored at once, so
/// every later load sees the new format.
pub async fn reload(checkpointing: &mut Checkpointing) -> Result<Run, CheckpointError> {
    Ok(reload_stored(checkpointing).await?.unwrap_or_default())
}

/// Like [`reload`], `None` when the thread has no checkpoint.
async fn reload_stored(checkpointing: &mut Checkpointing) -> Result<Option<Run>, CheckpointError> {
    let Some(mut run) = checkpointing
        .checkpointer
        .load(&checkpointing.thread_id, None)
        .await?
    else {
        return Ok(None);
    };
    let legacy = upgrade_legacy_control(&mut run)?;
    if !legacy.is_empty() {
        let upgrade = RunDelta {
            schema: CHECKPOINT_SCHEMA,
            custom: legacy
                .into_iter()
                .map(|key| (key.to_owned(), Value::Null))
                .collect(),
            control: ControlDelta::full(&run.control),
            steps: Some(run.steps),
            usage: Some(run.usage),
            ..RunDelta::default()
        };
        checkpointing
            .checkpointer
            .append(&checkpointing.thread_id, &upgrade, &run)
            .await?;
    }
    checkpointing.persisted_messages = run.state.messages.len();
    checkpointing
        .persisted_input_key
        .clone_from(&run.control.input_key);
    Ok(Some(run))
}

/// Takes the lease of `thread_id`, retrying for up to `wait` while another run holds it.
async fn lease_thread(
    checkpointer: &dyn Checkpointer,
    thread_id: &str,
    wait: Duration,
) -> Result<ThreadLease, CheckpointError> {
    let deadline = tokio::time::Instant::now().checked_add(wait);
    loop {
        match checkpointer.try_lease(thread_id).await {
            Err(CheckpointError::Busy { .. })
                if deadline.is_none_or(|deadline| tokio::time::Instant::now() < deadline) =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            outcome => return outcome,
        }
    }
}

/// Which parts of a run's [`Control`] a save writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct ControlTouched {
    pending: bool,
    decisions: bool,
    paused_subagents: bool,
    in_flight: bool,
}

impl ControlTouched {
    fn all() -> Self {
        Self {
            pending: true,
            decisions: true,
            paused_subagents: true,
            in_flight: true,
        }
    }
}

/// A run's control as the store holds it, which a save compares with the run's to write what
/// changed. The paused subagent runs are the exception: they are taken as the drive got them,
/// so decisions recorded in them before the drive are saved with the step that uses them
/// (should the process die during it, the subagents ask again rather than repeat an approved
/// call they may already have made).
#[derive(Clone, Default)]
struct SavedControl {
    pending: Vec<PendingAction>,
    decisions: BTreeMap<String, Decision>,
    paused_subagents: BTreeMap<String, PausedRun>,
    in_flight: Vec<String>,
}

impl SavedControl {
    fn of(control: &Control) -> Self {
        Self {
            pending: control.pending.clone(),
            decisions: control.decisions.clone(),
            paused_subagents: control.paused_subagents.clone(),
            in_flight: control.in_flight.clone(),
        }
    }
}

/// Tracks what a run changed since it was last saved.
pub(crate) struct Journal {
    target: Option<Checkpointing>,
    todos: bool,
    files: BTreeSet<String>,
    custom: BTreeSet<String>,
    /// The run's control as last saved.
    saved_control: SavedControl,
    /// Nothing of the control is stored yet (a fresh run, one upgraded from the earlier
    /// format): the next save writes all of it.
    control_unsaved: bool,
    /// Decisions were recorded before the drive (the run waits for none, and has decisions or
    /// subagent runs they went into): the stored pause is stale and is written once the step
    /// uses them.
    decided: bool,
    /// The earliest already-stored message that was changed in place since the last save.
    rewritten_from: Option<usize>,
    /// Step count, usage and spending at the last save: a save writes them only when they
    /// changed, and is skipped when nothing did.
    saved_progress: Progress,
    /// Files the run's tools changed outside the state (they are not in any delta).
    changed_outside: BTreeSet<String>,
    /// Where each save is announced (`Checkpointed`).
    events: EventSink,
}

/// The counters a save writes only when they changed.
#[derive(Clone, Copy, PartialEq)]
struct Progress {
    steps: u32,
    usage: Usage,
    spent: deepagents_core::Spent,
    total_spent: deepagents_core::Spent,
}

impl Progress {
    fn of(run: &Run) -> Self {
        Self {
            steps: run.steps,
            usage: run.usage,
            spent: run.spent,
            total_spent: run.total_spent,
        }
    }
}

impl Journal {
    pub(crate) fn new(target: Option<Checkpointing>, run: &Run, events: EventSink) -> Self {
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
            saved_control: SavedControl::of(&run.control),
            control_unsaved: fresh,
            decided: run.control.pending.is_empty()
                && !(run.control.decisions.is_empty() && run.control.paused_subagents.is_empty()),
            rewritten_from: None,
            // A fresh run writes them in its first save.
            saved_progress: if fresh {
                Progress {
                    steps: u32::MAX,
                    usage: Usage::default(),
                    spent: deepagents_core::Spent::default(),
                    total_spent: deepagents_core::Spent::default(),
                }
            } else {
                Progress::of(run)
            },
            changed_outside: BTreeSet::new(),
            target,
            events,
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
            if let Some(from) = update.messages_from {
                self.rewrote_message(from);
            }
            self.todos |= update.todos.is_some();
            self.files.extend(update.files.keys().cloned());
            self.custom.extend(update.custom.keys().cloned());
        }
        emit_state_updated(events, state, updates);
    }

    /// Records files a step's tools changed outside the state.
    pub(crate) fn changed_outside(&mut self, files: impl IntoIterator<Item = String>) {
        self.changed_outside.extend(files);
    }

    /// The files the run changed outside the state, for [`RunOutput::changed_files`].
    ///
    /// [`RunOutput::changed_files`]: crate::RunOutput::changed_files
    pub(crate) fn take_changed_outside(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.changed_outside)
    }

    /// Records that the run was upgraded from the earlier format: its legacy `keys` are stored
    /// as `null` and its control whole.
    pub(crate) fn upgraded_legacy(&mut self, keys: &[&str]) {
        self.custom.extend(keys.iter().map(|key| (*key).to_owned()));
        self.control_unsaved = true;
    }

    /// The parts of `control` that differ from what is stored.
    fn touched(&self, control: &Control) -> ControlTouched {
        if self.control_unsaved {
            return ControlTouched::all();
        }
        let saved = &self.saved_control;
        let decisions = control.decisions != saved.decisions;
        let paused_subagents = control.paused_subagents != saved.paused_subagents;
        ControlTouched {
            pending: control.pending != saved.pending
                || (self.decided && (decisions || paused_subagents)),
            decisions,
            paused_subagents,
            in_flight: control.in_flight != saved.in_flight,
        }
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
        let Some(target) = &self.target else {
            return Ok(());
        };
        let (persisted_messages, persisted_key) = (
            target.persisted_messages,
            target.persisted_input_key.clone(),
        );
        let progress = Progress::of(run);
        let touched = self.touched(&run.control);
        if run.state.messages.len() <= persisted_messages
            && run.control.input_key == persisted_key
            && self.rewritten_from.is_none()
            && !self.todos
            && self.files.is_empty()
            && self.custom.is_empty()
            && touched == ControlTouched::default()
            && progress == self.saved_progress
        {
            return Ok(());
        }
        let delta = self.delta(run, persisted_messages, persisted_key.as_ref());
        let Some(target) = &mut self.target else {
            return Ok(());
        };
        let checkpoint = target
            .checkpointer
            .append(&target.thread_id, &delta, run)
            .await
            .map_err(RunError::Checkpoint)?;
        self.events.emit(EventKind::Checkpointed { checkpoint });
        target.persisted_messages = run.state.messages.len();
        target
            .persisted_input_key
            .clone_from(&run.control.input_key);
        // The results of finished subagent runs are stored now; their child threads can go.
        for child in target.take_finished_children() {
            if let Err(error) = target.checkpointer.delete_thread(&child).await {
                tracing::warn!(%child, %error, "a finished subagent's checkpoints stay behind");
            }
        }
        self.rewritten_from = None;
        self.todos = false;
        self.files.clear();
        self.custom.clear();
        if touched.pending {
            self.decided = false;
        }
        self.saved_control = SavedControl::of(&run.control);
        self.control_unsaved = false;
        self.saved_progress = progress;
        Ok(())
    }

    /// What changed since the last save, as a delta: the messages after the `persisted_messages`
    /// stored ones (or from the earliest rewritten one), the state keys and control parts
    /// touched, and the progress that moved.
    fn delta(
        &self,
        run: &Run,
        persisted_messages: usize,
        persisted_key: Option<&String>,
    ) -> RunDelta {
        let new_key = run.control.input_key.as_ref() != persisted_key;
        let replace_from = self.rewritten_from.map(|i| i.min(run.state.messages.len()));
        let start = replace_from
            .unwrap_or(persisted_messages)
            .min(run.state.messages.len());
        let mut touched = self.touched(&run.control);
        if new_key {
            // The key is stored with what its request brought: the input is in the new
            // messages, decisions in the control.
            touched.pending = true;
            touched.decisions = true;
        }
        let control = &run.control;
        RunDelta {
            schema: CHECKPOINT_SCHEMA,
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
            control: ControlDelta {
                pending: touched.pending.then(|| control.pending.clone()),
                decisions: touched.decisions.then(|| control.decisions.clone()),
                paused_subagents: touched
                    .paused_subagents
                    .then(|| control.paused_subagents.clone()),
                in_flight: touched.in_flight.then(|| control.in_flight.clone()),
                input_key: control
                    .input_key
                    .clone()
                    .filter(|key| persisted_key != Some(key)),
            },
            steps: (run.steps != self.saved_progress.steps).then_some(run.steps),
            usage: (run.usage != self.saved_progress.usage).then_some(run.usage),
            spent: (run.spent != self.saved_progress.spent).then_some(run.spent),
            total_spent: (run.total_spent != self.saved_progress.total_spent)
                .then_some(run.total_spent),
        }
    }

    /// Removes the child threads of the latest turn's calls that have their results: a crash
    /// after a step's results were stored and before its finished subagents' checkpoints were
    /// removed leaves those behind.
    pub(crate) async fn remove_settled_children(&self, run: &Run) {
        let Some(target) = &self.target else {
            return;
        };
        if target.persisted_messages == 0 {
            return;
        }
        let Some(turn) = run
            .state
            .messages
            .iter()
            .rposition(|m| matches!(m, Message::Assistant(_)))
        else {
            return;
        };
        for message in &run.state.messages[turn..] {
            if let Message::Tool(result) = message {
                let child = target.child(&result.tool_call_id).thread_id;
                // Looking up one thread is an indexed read; deleting one (with its children)
                // scans, so it is done only for the rare leftover.
                let left = target.checkpointer.checkpoints(&child).await;
                if left.is_ok_and(|checkpoints| checkpoints.is_empty()) {
                    continue;
                }
                if let Err(error) = target.checkpointer.delete_thread(&child).await {
                    tracing::warn!(%child, %error, "a finished subagent's checkpoints stay behind");
                }
            }
        }
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
        run.control.in_flight = ids;
        self.save(run).await
    }

    /// Clears the started calls once their results are in the run.
    pub(crate) fn tools_finished(&mut self, run: &mut Run) {
        run.control.in_flight.clear();
    }

    /// Settles calls a crash interrupted: calls to mutating tools get an "interrupted" result
    /// (they may have partly taken effect, so running them again could do it twice); calls to
    /// other tools are left pending and simply run again.
    pub(crate) fn settle_interrupted(&mut self, run: &mut Run, tools: &ToolRegistry) {
        if run.control.in_flight.is_empty() {
            return;
        }
        let ids = std::mem::take(&mut run.control.in_flight);
        let started: BTreeSet<&str> = ids.iter().map(String::as_str).collect();
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

/// Emits one `state_updated` event summarizing `updates`, with values as merged in `state`.
fn emit_state_updated(events: &EventSink, state: &AgentState, updates: &[StateUpdate]) {
    if updates.is_empty() {
        return;
    }
    let todos = updates
        .iter()
        .any(|u| u.todos.is_some())
        .then(|| state.todos.clone());
    let mut files_changed: Vec<String> = updates
        .iter()
        .flat_map(|u| u.files.keys().cloned())
        .collect();
    files_changed.sort();
    files_changed.dedup();
    let custom: BTreeMap<_, _> = updates
        .iter()
        .flat_map(|u| u.custom.keys())
        .filter_map(|key| Some((key.clone(), state.custom.get(key)?.clone())))
        .collect();
    events.emit(EventKind::StateUpdated {
        todos,
        files_changed,
        custom,
    });
}
