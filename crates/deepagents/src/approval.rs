//! Human approval: tool calls that pause the run until someone decides.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use deepagents_backends::{Mode, Operation, Permissions, VPath};
use deepagents_core::event::PathSegment;
pub use deepagents_core::interrupt::{Decision, DecisionKind, PendingAction};
use deepagents_core::{Message, PausedRun, Run, ToolCall, ToolResult, ToolStatus};
use serde_json::Value;

use crate::error::RunError;

/// Decides from a call's arguments whether it needs approval.
pub type ApprovalPredicate = dyn Fn(&Value) -> bool + Send + Sync;

/// Says from a call's arguments why it needs approval, or `None` when it does not.
pub type ApprovalReason = dyn Fn(&Value) -> Option<String> + Send + Sync;

/// When a tool's calls need approval, and what may be decided.
#[derive(Clone)]
pub struct InterruptConfig {
    /// Allowed decisions (default: all four).
    pub allowed: Vec<DecisionKind>,
    /// What to tell the person deciding.
    pub description: Option<String>,
    /// Only calls for which this holds pause (default: every call).
    pub predicate: Option<Arc<ApprovalPredicate>>,
    /// Only calls this gives a reason for pause, and the reason is what the person deciding
    /// is told, in place of `description` (default: none, every call the predicate lets
    /// through pauses).
    pub reason: Option<Arc<ApprovalReason>>,
}

impl Default for InterruptConfig {
    fn default() -> Self {
        Self {
            allowed: vec![
                DecisionKind::Approve,
                DecisionKind::Edit,
                DecisionKind::Reject,
                DecisionKind::Respond,
            ],
            description: None,
            predicate: None,
            reason: None,
        }
    }
}

impl std::fmt::Debug for InterruptConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InterruptConfig")
            .field("allowed", &self.allowed)
            .field("description", &self.description)
            .finish_non_exhaustive()
    }
}

impl InterruptConfig {
    fn applies(&self, arguments: &Value) -> bool {
        self.predicate.as_ref().is_none_or(|p| p(arguments))
            && self.reason.as_ref().is_none_or(|r| r(arguments).is_some())
    }

    fn description_for(&self, arguments: &Value) -> Option<String> {
        match &self.reason {
            Some(reason) => reason(arguments),
            None => self.description.clone(),
        }
    }
}

/// Interrupt configurations that permission rules in `interrupt` mode imply for the file tools.
pub(crate) fn from_permissions(permissions: &Permissions) -> BTreeMap<String, InterruptConfig> {
    let permissions = Arc::new(permissions.clone());
    let tools = [
        ("ls", Operation::Read, "path"),
        ("read_file", Operation::Read, "file_path"),
        ("glob", Operation::Read, "path"),
        ("grep", Operation::Read, "path"),
        ("write_file", Operation::Write, "file_path"),
        ("edit_file", Operation::Write, "file_path"),
        ("delete", Operation::Write, "path"),
    ];
    if !permissions.rules().any(|r| r.mode == Mode::Interrupt) {
        return BTreeMap::new();
    }
    tools
        .into_iter()
        .map(|(tool, operation, field)| {
            let permissions = Arc::clone(&permissions);
            let predicate = move |arguments: &Value| {
                let path = arguments[field].as_str().unwrap_or("/");
                VPath::parse(path)
                    .is_ok_and(|p| permissions.check(operation, &p) == Mode::Interrupt)
            };
            (
                tool.to_owned(),
                InterruptConfig {
                    description: Some(
                        "A permission rule asks for approval of this path.".to_owned(),
                    ),
                    predicate: Some(Arc::new(predicate)),
                    ..InterruptConfig::default()
                },
            )
        })
        .collect()
}

/// The actions a paused run waits on.
pub fn pending_actions(run: &Run) -> Vec<PendingAction> {
    run.control.pending.clone()
}

/// Records decisions for a paused run, one per pending action in order; then continue the run
/// with [`Agent::run`](crate::Agent::run). Fails, leaving the run unchanged, when the count or a
/// kind is not allowed. Decisions for actions inside a subagent go into that subagent's paused
/// run, which continues from them when the parent resumes.
pub fn decide(run: &mut Run, decisions: Vec<Decision>) -> Result<(), RunError> {
    deepagents_core::upgrade_legacy_control(run).map_err(RunError::State)?;
    let pending = &run.control.pending;
    if pending.len() != decisions.len() {
        return Err(RunError::InvalidDecision(format!(
            "{} actions wait for a decision but {} decisions were given; give one per action, in order",
            pending.len(),
            decisions.len()
        )));
    }
    let mut by_call = BTreeMap::new();
    let mut nested: BTreeMap<String, Vec<Decision>> = BTreeMap::new();
    for (action, decision) in pending.iter().zip(decisions) {
        if !action.allowed.contains(&decision.kind()) {
            return Err(RunError::InvalidDecision(format!(
                "`{:?}` is not allowed for {} ({}); allowed: {:?}",
                decision.kind(),
                action.call_id,
                action.name,
                action.allowed
            )));
        }
        match action.path.first() {
            Some(task_call) => nested
                .entry(task_call.call_id.clone())
                .or_default()
                .push(decision),
            None => {
                by_call.insert(action.call_id.clone(), decision);
            }
        }
    }
    let mut paused = run.control.paused_subagents.clone();
    for (task_call, decisions) in nested {
        let Some(child) = paused.get_mut(&task_call) else {
            return Err(RunError::InvalidDecision(format!(
                "no paused subagent of call {task_call} is stored in the run"
            )));
        };
        decide(&mut child.run, decisions)?;
    }
    // Everything is checked: only now does the run change.
    run.control.pending.clear();
    run.control.decisions = by_call;
    run.control.paused_subagents = paused;
    Ok(())
}

/// Whether the run holds subagents paused inside the step it is about to run.
pub(crate) fn has_paused_subagents(run: &Run) -> bool {
    !run.control.paused_subagents.is_empty()
}

/// Folds a step's outcome into the stored subagent runs: the subagents of `finished` calls are
/// done with, those in `paused` wait. Returns whether the stored runs changed and the actions
/// the paused ones wait on, marked with their path, in call order.
pub(crate) fn settle_subagents<'a>(
    run: &mut Run,
    finished: impl IntoIterator<Item = &'a str>,
    paused: Vec<(String, PausedRun)>,
) -> (bool, Vec<PendingAction>) {
    let stored = &mut run.control.paused_subagents;
    let mut changed = false;
    for id in finished {
        changed |= stored.remove(id).is_some();
    }
    let mut actions = Vec::new();
    for (call_id, entry) in paused {
        actions.extend(entry.run.control.pending.iter().cloned().map(|mut action| {
            let mut path = vec![PathSegment {
                call_id: call_id.clone(),
                name: entry.subagent.clone(),
            }];
            path.append(&mut action.path);
            action.path = path;
            action
        }));
        stored.insert(call_id, entry);
        changed = true;
    }
    (changed, actions)
}

/// Marks the run as waiting on `actions`.
pub(crate) fn record_pause(run: &mut Run, actions: &[PendingAction]) {
    run.control.pending = actions.to_vec();
}

/// What [`drop_stale`] changed.
#[derive(Default)]
pub(crate) struct Dropped {
    /// The pending actions and decisions.
    pub(crate) decisions: bool,
    /// The paused subagent runs.
    pub(crate) subagents: bool,
}

/// Drops approval state left from a step that will never run (new input came instead of
/// decisions), so stale actions are not reported and paused subagent runs do not linger in
/// every later checkpoint.
pub(crate) fn drop_stale(run: &mut Run) -> Dropped {
    let control = &run.control;
    if control.pending.is_empty()
        && control.decisions.is_empty()
        && control.paused_subagents.is_empty()
    {
        return Dropped::default();
    }
    let waiting: BTreeSet<String> = run.pending_tool_calls().into_iter().map(|c| c.id).collect();
    let mut dropped = Dropped::default();
    let control = &mut run.control;
    if waiting.is_empty() && !(control.pending.is_empty() && control.decisions.is_empty()) {
        control.pending.clear();
        control.decisions.clear();
        dropped.decisions = true;
    }
    let before = control.paused_subagents.len();
    control
        .paused_subagents
        .retain(|id, _| waiting.contains(id));
    dropped.subagents = control.paused_subagents.len() != before;
    dropped
}

/// How the driver should treat a step's calls.
pub(crate) enum Gate {
    /// Run these calls (arguments already edited); these results are settled without running.
    Proceed {
        run: Vec<ToolCall>,
        settled: Vec<ToolResult>,
        /// The earliest message an edit rewrote.
        rewritten: Option<usize>,
    },
    /// Pause for these actions.
    Pause(Vec<PendingAction>),
}

/// Sorts a step's calls by their interrupt configuration and the decisions given.
pub(crate) fn gate(
    run: &mut Run,
    calls: Vec<ToolCall>,
    interrupts: &BTreeMap<String, InterruptConfig>,
) -> Gate {
    let decisions = std::mem::take(&mut run.control.decisions);
    // A call whose subagent paused inside it was let through before; its decisions now belong
    // to the subagent.
    let resuming: BTreeSet<String> = run.control.paused_subagents.keys().cloned().collect();
    let mut to_run = Vec::new();
    let mut settled = Vec::new();
    let mut pending = Vec::new();
    let mut rewritten: Option<usize> = None;
    for mut call in calls {
        let Some(config) = interrupts
            .get(&call.name)
            .filter(|c| c.applies(&call.arguments) && !resuming.contains(&call.id))
        else {
            to_run.push(call);
            continue;
        };
        match decisions.get(&call.id) {
            None => pending.push(PendingAction {
                call_id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
                description: config.description_for(&call.arguments),
                allowed: config.allowed.clone(),
                path: Vec::new(),
            }),
            Some(Decision::Approve) => to_run.push(call),
            Some(Decision::Edit { arguments }) => {
                if let Some(index) = edit_call(run, &call.id, arguments) {
                    rewritten = Some(rewritten.map_or(index, |i| i.min(index)));
                }
                call.arguments = arguments.clone();
                to_run.push(call);
            }
            Some(Decision::Reject { message }) => settled.push(ToolResult::error(
                &call,
                format!(
                    "The user rejected this call{}. Do not retry it unchanged.",
                    message
                        .as_deref()
                        .map(|m| format!(": {}", m.trim_end_matches('.')))
                        .unwrap_or_default()
                ),
            )),
            Some(Decision::Respond { message }) => settled.push(ToolResult {
                status: ToolStatus::Ok,
                ..ToolResult::error(&call, message.clone())
            }),
        }
    }
    if pending.is_empty() {
        Gate::Proceed {
            run: to_run,
            settled,
            rewritten,
        }
    } else {
        // Nothing of this step has run: the decisions given so far are kept for the resume.
        run.control.decisions = decisions;
        record_pause(run, &pending);
        Gate::Pause(pending)
    }
}

/// The history shows the arguments that actually ran. Returns the index of the message it
/// rewrote, which the journal must store again.
fn edit_call(run: &mut Run, call_id: &str, arguments: &Value) -> Option<usize> {
    for (index, message) in run.state.messages.iter_mut().enumerate().rev() {
        if let Message::Assistant(assistant) = message
            && let Some(call) = assistant.tool_calls.iter_mut().find(|c| c.id == call_id)
        {
            call.arguments = arguments.clone();
            return Some(index);
        }
    }
    None
}
