//! Human approval: tool calls that pause the run until someone decides.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use deepagents_backends::{Mode, Operation, Permissions, VPath};
use deepagents_core::event::PathSegment;
pub use deepagents_core::interrupt::{Decision, DecisionKind, PendingAction};
use deepagents_core::{AgentState, Message, Run, ToolCall, ToolResult, ToolStatus};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::RunError;

/// The custom key holding the actions a paused run waits on.
pub const PENDING_KEY: &str = "deepagents.pending_approval";
/// The custom key holding the decisions given for them.
pub const DECISIONS_KEY: &str = "deepagents.decisions";
/// The custom key holding the paused runs of subagents, by the id of the `task` call that
/// started each. A subagent's pause is part of its parent's state, so it is checkpointed and
/// resumed with it.
pub const SUBAGENT_RUNS_KEY: &str = "deepagents.paused_subagents";
/// The artifact key by which the `task` tool hands a paused subagent to the driver instead of
/// a result.
pub(crate) const PAUSED_ARTIFACT_KEY: &str = "deepagents.paused_subagent";

/// A subagent run waiting for decisions, kept in its parent's state under
/// [`SUBAGENT_RUNS_KEY`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct PausedSubagent {
    /// The subagent type the `task` call asked for.
    pub(crate) subagent: String,
    /// Its run as it paused; its own pending actions and decisions live in it.
    pub(crate) run: Run,
    /// Files it changed before pausing, so they still flow back once it finishes.
    #[serde(default)]
    pub(crate) changed_files: Vec<String>,
}

/// Decides from a call's arguments whether it needs approval.
pub type ApprovalPredicate = dyn Fn(&Value) -> bool + Send + Sync;

/// When a tool's calls need approval, and what may be decided.
#[derive(Clone)]
pub struct InterruptConfig {
    /// Allowed decisions (default: all four).
    pub allowed: Vec<DecisionKind>,
    /// What to tell the person deciding.
    pub description: Option<String>,
    /// Only calls for which this holds pause (default: every call).
    pub predicate: Option<Arc<ApprovalPredicate>>,
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
    run.state
        .custom
        .get(PENDING_KEY)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

/// Records decisions for a paused run, one per pending action in order; then continue the run
/// with [`Agent::run`](crate::Agent::run). Fails, leaving the run unchanged, when the count or a
/// kind is not allowed. Decisions for actions inside a subagent go into that subagent's paused
/// run, which continues from them when the parent resumes.
pub fn decide(run: &mut Run, decisions: Vec<Decision>) -> Result<(), RunError> {
    let pending = pending_actions(run);
    if pending.len() != decisions.len() {
        return Err(RunError::InvalidDecision(format!(
            "{} actions wait for a decision but {} decisions were given; give one per action, in order",
            pending.len(),
            decisions.len()
        )));
    }
    let mut by_call = serde_json::Map::new();
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
                let value = serde_json::to_value(&decision)
                    .map_err(|e| RunError::InvalidDecision(e.to_string()))?;
                by_call.insert(action.call_id.clone(), value);
            }
        }
    }
    let mut paused = paused_subagents(run);
    for (task_call, decisions) in nested {
        let Some(entry) = paused.get_mut(&task_call) else {
            return Err(RunError::InvalidDecision(format!(
                "no paused subagent of call {task_call} is stored in the run"
            )));
        };
        let mut child: PausedSubagent = serde_json::from_value(entry.clone())
            .map_err(|e| RunError::InvalidDecision(format!("paused subagent {task_call}: {e}")))?;
        decide(&mut child.run, decisions)?;
        *entry =
            serde_json::to_value(&child).map_err(|e| RunError::InvalidDecision(e.to_string()))?;
    }
    // Everything is checked: only now does the run change.
    run.state.custom.remove(PENDING_KEY);
    run.state
        .custom
        .insert(DECISIONS_KEY.to_owned(), Value::Object(by_call));
    if !paused.is_empty() {
        run.state
            .custom
            .insert(SUBAGENT_RUNS_KEY.to_owned(), Value::Object(paused));
    }
    Ok(())
}

/// The stored paused subagent runs, by `task` call id (as JSON: they are only parsed where used).
fn paused_subagents(run: &Run) -> serde_json::Map<String, Value> {
    match run.state.custom.get(SUBAGENT_RUNS_KEY) {
        Some(Value::Object(map)) => map.clone(),
        _ => serde_json::Map::new(),
    }
}

/// Whether the run holds subagents paused inside the step it is about to run.
pub(crate) fn has_paused_subagents(run: &Run) -> bool {
    matches!(run.state.custom.get(SUBAGENT_RUNS_KEY), Some(Value::Object(map)) if !map.is_empty())
}

/// The paused run of the subagent started by call `call_id`, if it is one of `subagent`.
pub(crate) fn paused_subagent(
    state: &AgentState,
    call_id: &str,
    subagent: &str,
) -> Option<PausedSubagent> {
    let entry = state.custom.get(SUBAGENT_RUNS_KEY)?.get(call_id)?;
    serde_json::from_value::<PausedSubagent>(entry.clone())
        .ok()
        .filter(|paused| paused.subagent == subagent)
}

/// The artifact by which the `task` tool reports a pause.
pub(crate) fn paused_artifact(paused: &PausedSubagent) -> Result<Value, serde_json::Error> {
    let mut artifact = serde_json::Map::new();
    artifact.insert(
        PAUSED_ARTIFACT_KEY.to_owned(),
        serde_json::to_value(paused)?,
    );
    Ok(Value::Object(artifact))
}

/// Takes the paused subagent out of a tool's artifact, if the artifact reports one.
pub(crate) fn take_paused(artifact: &mut Option<Value>) -> Option<Value> {
    let reports_pause = matches!(
        artifact,
        Some(Value::Object(map)) if map.len() == 1 && map.contains_key(PAUSED_ARTIFACT_KEY)
    );
    if !reports_pause {
        return None;
    }
    artifact
        .take()
        .and_then(|mut value| value.get_mut(PAUSED_ARTIFACT_KEY).map(Value::take))
}

/// Folds a step's outcome into the stored subagent runs: the subagents of `finished` calls are
/// done with, those in `paused` wait. Returns whether the stored value changed and the actions
/// the paused ones wait on, marked with their path, in call order.
pub(crate) fn settle_subagents<'a>(
    run: &mut Run,
    finished: impl IntoIterator<Item = &'a str>,
    paused: Vec<(String, Value)>,
) -> (bool, Vec<PendingAction>) {
    let mut stored = paused_subagents(run);
    let mut changed = false;
    for id in finished {
        changed |= stored.remove(id).is_some();
    }
    let mut actions = Vec::new();
    for (call_id, entry) in paused {
        let subagent = entry
            .get("subagent")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let waiting: Vec<PendingAction> = entry
            .pointer("/run/state/custom")
            .and_then(|custom| custom.get(PENDING_KEY))
            .and_then(|v| serde_json::from_value(v.clone()).ok())
            .unwrap_or_default();
        actions.extend(waiting.into_iter().map(|mut action| {
            let mut path = vec![PathSegment {
                call_id: call_id.clone(),
                name: subagent.clone(),
            }];
            path.append(&mut action.path);
            action.path = path;
            action
        }));
        stored.insert(call_id, entry);
        changed = true;
    }
    if changed {
        if stored.is_empty() {
            run.state.custom.remove(SUBAGENT_RUNS_KEY);
        } else {
            run.state
                .custom
                .insert(SUBAGENT_RUNS_KEY.to_owned(), Value::Object(stored));
        }
    }
    (changed, actions)
}

/// Marks the run as waiting on `actions`.
pub(crate) fn record_pause(run: &mut Run, actions: &[PendingAction]) {
    run.state.custom.insert(
        PENDING_KEY.to_owned(),
        serde_json::to_value(actions).unwrap_or(Value::Null),
    );
}

/// Drops approval state left from a step that will never run (new input came instead of
/// decisions), so stale actions are not reported and paused subagent runs do not linger in
/// every later checkpoint. Returns the keys it changed.
pub(crate) fn drop_stale(run: &mut Run) -> Vec<&'static str> {
    let keys = [PENDING_KEY, DECISIONS_KEY, SUBAGENT_RUNS_KEY];
    let present = |run: &Run, key: &str| run.state.custom.get(key).is_some_and(|v| !v.is_null());
    if !keys.iter().any(|key| present(run, key)) {
        return Vec::new();
    }
    let waiting: BTreeSet<String> = run.pending_tool_calls().into_iter().map(|c| c.id).collect();
    let mut changed = Vec::new();
    if waiting.is_empty() {
        for key in [PENDING_KEY, DECISIONS_KEY] {
            if run.state.custom.remove(key).is_some() {
                changed.push(key);
            }
        }
    }
    let mut stored = paused_subagents(run);
    let before = stored.len();
    stored.retain(|id, _| waiting.contains(id));
    if stored.len() != before {
        if stored.is_empty() {
            run.state.custom.remove(SUBAGENT_RUNS_KEY);
        } else {
            run.state
                .custom
                .insert(SUBAGENT_RUNS_KEY.to_owned(), Value::Object(stored));
        }
        changed.push(SUBAGENT_RUNS_KEY);
    }
    changed
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
    let decisions: BTreeMap<String, Decision> = run
        .state
        .custom
        .remove(DECISIONS_KEY)
        .and_then(|v| serde_json::from_value(v).ok())
        .unwrap_or_default();
    // A call whose subagent paused inside it was let through before; its decisions now belong
    // to the subagent.
    let resuming: BTreeSet<String> = match run.state.custom.get(SUBAGENT_RUNS_KEY) {
        Some(Value::Object(map)) => map.keys().cloned().collect(),
        _ => BTreeSet::new(),
    };
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
                description: config.description.clone(),
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
        let kept: serde_json::Map<String, Value> = decisions
            .into_iter()
            .filter_map(|(id, d)| serde_json::to_value(d).ok().map(|v| (id, v)))
            .collect();
        if !kept.is_empty() {
            run.state
                .custom
                .insert(DECISIONS_KEY.to_owned(), Value::Object(kept));
        }
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
