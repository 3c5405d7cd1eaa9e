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

/// The id of the pause `run` waits in; `None` when it waits for no decision.
///
/// It names that one pause. It stays the same while the same actions wait (loading, saving or
/// showing the run does not change it), and every later pause of the thread gets another one,
/// even when a model reuses call ids: besides the waiting calls' ids it covers where each was
/// made in the conversation (and, for a call inside a subagent, in the subagent's). Front ends
/// show it with the pause and take it back with the decisions ([`decide_pause`],
/// [`Input::DecidePause`](crate::Input::DecidePause)), so that decisions made for one pause
/// (a retried request, a screen showing an old pause) are refused rather than applied to
/// another pause nobody saw. It reads `interrupt-<first call id>-<16 hex digits>`; treat it as
/// opaque.
pub fn pause_id(run: &Run) -> Option<String> {
    let first = run.control.pending.first()?;
    let mut digest = Fnv64::default();
    for action in &run.control.pending {
        // Each level of the path is a call in the run above it; the last, the call itself.
        let mut level = Some(run);
        for segment in &action.path {
            digest.write_str(&segment.call_id);
            digest.write_u64(call_position(level, &segment.call_id));
            level = level
                .and_then(|run| run.control.paused_subagents.get(&segment.call_id))
                .map(|paused| paused.run.as_ref());
        }
        digest.write_str(&action.call_id);
        digest.write_u64(call_position(level, &action.call_id));
        digest.write_str(&action.name);
        // Ends the action, so two actions never read as one with a longer path.
        digest.write_u64(u64::MAX);
    }
    Some(format!(
        "interrupt-{}-{:016x}",
        first.call_id,
        digest.finish()
    ))
}

/// The index of the assistant message of `run` that made call `call_id` (the latest one, if
/// a model reused the id); `u64::MAX` when there is none. Messages are only ever appended, so
/// the index of a call stays put while it waits, and a later pause's calls sit further on.
fn call_position(run: Option<&Run>, call_id: &str) -> u64 {
    run.and_then(|run| {
        run.state.messages.iter().rposition(|message| {
            matches!(message, Message::Assistant(assistant)
                if assistant.tool_calls.iter().any(|call| call.id == call_id))
        })
    })
    .map_or(u64::MAX, |index| index as u64)
}

/// 64-bit FNV-1a: pause ids must come out the same in every process and build (servers of a
/// cluster compare ids another one made), which `std`'s hashers do not promise.
struct Fnv64(u64);

impl Default for Fnv64 {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv64 {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// A string, length first, so that fields never run into each other.
    fn write_str(&mut self, text: &str) {
        self.write_u64(text.len() as u64);
        self.write(text.as_bytes());
    }

    fn write_u64(&mut self, value: u64) {
        self.write(&value.to_le_bytes());
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// Checks that `run` waits in the pause `pause` names (its [`pause_id`]): the one check every
/// front end makes before decisions given for a named pause are applied. Fails with
/// [`RunError::StalePause`] when the run waits in another pause or in none.
pub fn check_pause(run: &Run, pause: &str) -> Result<(), RunError> {
    let current = pause_id(run);
    if current.as_deref() == Some(pause) {
        return Ok(());
    }
    Err(RunError::StalePause {
        given: pause.to_owned(),
        current,
    })
}

/// Like [`decide`], for the pause `pause` names (see [`pause_id`]): fails, leaving the run
/// unchanged, with [`RunError::StalePause`] when the run does not wait in that pause (it was
/// decided already, or the id names no pause of this run), and as [`decide`] does otherwise.
pub fn decide_pause(run: &mut Run, pause: &str, decisions: Vec<Decision>) -> Result<(), RunError> {
    deepagents_core::upgrade_legacy_control(run).map_err(RunError::State)?;
    check_pause(run, pause)?;
    decide(run, decisions)
}

/// Records decisions for a paused run, one per pending action in order; then continue the run
/// with [`Agent::run`](crate::Agent::run). Fails, leaving the run unchanged, when the count or a
/// kind is not allowed. Decisions for actions inside a subagent go into that subagent's paused
/// run, which continues from them when the parent resumes. They answer whatever pause the run
/// waits in; to answer only the pause someone saw, use [`decide_pause`].
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
        let config = interrupts
            .get(&call.name)
            .filter(|c| c.applies(&call.arguments) && !resuming.contains(&call.id));
        // A decision without a configuration answers a pause this agent no longer makes:
        // a question (`ask_user`) that an earlier version asked as a gate before the call.
        match (config, decisions.get(&call.id)) {
            (None, None) => to_run.push(call),
            (Some(config), None) => pending.push(PendingAction {
                call_id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
                description: config.description_for(&call.arguments),
                allowed: config.allowed.clone(),
                request: None,
                path: Vec::new(),
            }),
            (_, Some(Decision::Approve)) => to_run.push(call),
            (_, Some(Decision::Edit { arguments })) => {
                if let Some(index) = edit_call(run, &call.id, arguments) {
                    rewritten = Some(rewritten.map_or(index, |i| i.min(index)));
                }
                call.arguments = arguments.clone();
                to_run.push(call);
            }
            (_, Some(Decision::Reject { message })) => {
                settled.push(ToolResult::error(&call, rejected(message.as_deref())));
            }
            (_, Some(Decision::Respond { message })) => settled.push(ToolResult {
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

/// What the model is told about a call the person rejected (or a question they declined).
pub(crate) fn rejected(reason: Option<&str>) -> String {
    format!(
        "The user rejected this call{}. Do not retry it unchanged.",
        reason
            .map(|m| format!(": {}", m.trim_end_matches('.')))
            .unwrap_or_default()
    )
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use deepagents_core::{AssistantMessage, ContentBlock};
    use serde_json::json;

    use super::*;

    fn call(id: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: "write_file".into(),
            arguments: json!({"file_path": "/a", "content": "x"}),
        }
    }

    fn asking(ids: &[&str]) -> Message {
        Message::Assistant(AssistantMessage {
            content: Vec::new(),
            tool_calls: ids.iter().map(|id| call(id)).collect(),
        })
    }

    fn action(id: &str) -> PendingAction {
        PendingAction {
            call_id: id.into(),
            name: "write_file".into(),
            arguments: json!({"file_path": "/a", "content": "x"}),
            description: None,
            allowed: vec![DecisionKind::Approve, DecisionKind::Reject],
            request: None,
            path: Vec::new(),
        }
    }

    /// A run that asked for `ids` after `before` earlier messages, and waits on them.
    fn paused_on(before: usize, ids: &[&str]) -> Run {
        let mut run = Run::default();
        for _ in 0..before {
            run.state.messages.push(Message::User {
                content: vec![ContentBlock::text("go")],
            });
        }
        run.state.messages.push(asking(ids));
        run.control.pending = ids.iter().map(|id| action(id)).collect();
        run
    }

    #[test]
    fn a_pause_id_is_stable_while_the_same_actions_wait() {
        assert_eq!(pause_id(&Run::default()), None);
        let mut run = paused_on(1, &["call_0_0"]);
        let id = pause_id(&run).unwrap();
        assert!(id.starts_with("interrupt-call_0_0-"), "{id}");
        let stored: Run = serde_json::from_value(serde_json::to_value(&run).unwrap()).unwrap();
        assert_eq!(pause_id(&stored).as_deref(), Some(id.as_str()));
        // Messages added behind the pause (a state update) do not make it another pause.
        run.state.messages.push(Message::User {
            content: vec![ContentBlock::text("note")],
        });
        assert_eq!(pause_id(&run).as_deref(), Some(id.as_str()));
        check_pause(&run, &id).unwrap();
    }

    #[test]
    fn a_later_pause_has_another_id_even_when_the_model_reuses_call_ids() {
        let first = paused_on(1, &["call_0_0"]);
        // The same call id, asked for further on in the conversation: another pause.
        let mut later = first.clone();
        later.control.pending.clear();
        later.state.messages.push(Message::User {
            content: vec![ContentBlock::text("and again")],
        });
        later.state.messages.push(asking(&["call_0_0"]));
        later.control.pending = vec![action("call_0_0")];
        let (first_id, later_id) = (pause_id(&first).unwrap(), pause_id(&later).unwrap());
        assert_ne!(first_id, later_id);
        let error = check_pause(&later, &first_id).unwrap_err();
        assert!(
            matches!(&error, RunError::StalePause { given, current } if *given == first_id && current.as_deref() == Some(later_id.as_str())),
            "{error:?}"
        );
        let message = error.to_string();
        assert!(
            message.contains(&later_id) && message.contains("re-read the thread state"),
            "{message}"
        );
        // A different set of actions, starting with the same call: another pause too.
        let both = paused_on(1, &["call_0_0", "call_0_1"]);
        assert_ne!(pause_id(&both).unwrap(), first_id);
        // An id that names nothing, and a run that waits for nothing.
        assert!(check_pause(&first, "interrupt-call_0_0").is_err());
        let done = Run::default();
        assert!(matches!(
            check_pause(&done, &first_id),
            Err(RunError::StalePause { current: None, .. })
        ));
    }

    #[test]
    fn a_subagent_s_later_pause_inside_one_call_has_another_id() {
        let mut parent = paused_on(1, &["task_1"]);
        parent.control.pending.clear();
        let mut child = paused_on(1, &["call_0_0"]);
        let segment = PathSegment {
            call_id: "task_1".into(),
            name: "writer".into(),
        };
        let nested = |child: &Run| {
            let mut run = parent.clone();
            run.control.paused_subagents.insert(
                "task_1".into(),
                PausedRun {
                    subagent: "writer".into(),
                    run: Box::new(child.clone()),
                    changed_files: Vec::new(),
                },
            );
            run.control.pending = child
                .control
                .pending
                .iter()
                .cloned()
                .map(|mut action| {
                    action.path = vec![segment.clone()];
                    action
                })
                .collect();
            run
        };
        let first = pause_id(&nested(&child)).unwrap();
        child.state.messages.push(Message::User {
            content: vec![ContentBlock::text("more")],
        });
        child.state.messages.push(asking(&["call_0_0"]));
        assert_ne!(pause_id(&nested(&child)).unwrap(), first);
    }

    #[test]
    fn decisions_for_another_pause_change_nothing() {
        let run = paused_on(1, &["call_0_0"]);
        let mut later = paused_on(3, &["call_0_0"]);
        let before = later.clone();
        let stale = pause_id(&run).unwrap();
        assert!(matches!(
            decide_pause(&mut later, &stale, vec![Decision::Approve]),
            Err(RunError::StalePause { .. })
        ));
        assert_eq!(later, before);
        let current = pause_id(&later).unwrap();
        // The right pause with the wrong count is still refused, and changes nothing.
        assert!(matches!(
            decide_pause(&mut later, &current, vec![]),
            Err(RunError::InvalidDecision(_))
        ));
        assert_eq!(later, before);
        decide_pause(&mut later, &current, vec![Decision::Approve]).unwrap();
        assert!(later.control.pending.is_empty());
        assert_eq!(later.control.decisions["call_0_0"], Decision::Approve);
    }
}
