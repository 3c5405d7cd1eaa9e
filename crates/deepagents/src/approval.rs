//! Human approval: tool calls that pause the run until someone decides.

use std::collections::BTreeMap;
use std::sync::Arc;

use deepagents_backends::{Mode, Operation, Permissions, VPath};
pub use deepagents_core::interrupt::{Decision, DecisionKind, PendingAction};
use deepagents_core::{DecisionError, GateRule, Run, ToolCall};
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

/// The id of the pause `run` waits in; `None` when it waits for no decision
/// ([`Run::pause_id`]).
///
/// It names that one pause: it stays the same while the same actions wait, and every later
/// pause of the thread gets another one, even when a model reuses call ids. Front ends show it
/// with the pause and take it back with the decisions ([`decide_pause`],
/// [`Input::DecidePause`](crate::Input::DecidePause)), so that decisions made for one pause
/// (a retried request, a screen showing an old pause) are refused rather than applied to
/// another pause nobody saw. Treat it as opaque.
pub fn pause_id(run: &Run) -> Option<String> {
    run.pause_id()
}

/// The error a front end sees for decisions the run refused.
fn decision_error(error: DecisionError) -> RunError {
    match error {
        DecisionError::Invalid(message) => RunError::InvalidDecision(message),
        DecisionError::Stale { given, current } => RunError::StalePause { given, current },
    }
}

/// Checks that `run` waits in the pause `pause` names (its [`pause_id`]): the one check every
/// front end makes before decisions given for a named pause are applied. Fails with
/// [`RunError::StalePause`] when the run waits in another pause or in none.
pub fn check_pause(run: &Run, pause: &str) -> Result<(), RunError> {
    run.check_pause(pause).map_err(decision_error)
}

/// Like [`decide`], for the pause `pause` names (see [`pause_id`]): fails, leaving the run
/// unchanged, with [`RunError::StalePause`] when the run does not wait in that pause (it was
/// decided already, or the id names no pause of this run), and as [`decide`] does otherwise.
pub fn decide_pause(run: &mut Run, pause: &str, decisions: Vec<Decision>) -> Result<(), RunError> {
    deepagents_core::upgrade_legacy_control(run).map_err(RunError::State)?;
    run.decide_pause(pause, decisions).map_err(decision_error)
}

/// Records decisions for a paused run, one per pending action in order; then continue the run
/// with [`Agent::run`](crate::Agent::run). Fails, leaving the run unchanged, when the count or a
/// kind is not allowed. Decisions for actions inside a subagent go into that subagent's paused
/// run, which continues from them when the parent resumes. They answer whatever pause the run
/// waits in; to answer only the pause someone saw, use [`decide_pause`].
pub fn decide(run: &mut Run, decisions: Vec<Decision>) -> Result<(), RunError> {
    deepagents_core::upgrade_legacy_control(run).map_err(RunError::State)?;
    run.decide(decisions).map_err(decision_error)
}

/// The approval rule `interrupts` give `call`, if it needs one.
pub(crate) fn rule_for(
    interrupts: &BTreeMap<String, InterruptConfig>,
    call: &ToolCall,
) -> Option<GateRule> {
    let config = interrupts
        .get(&call.name)
        .filter(|c| c.applies(&call.arguments))?;
    Some(GateRule {
        allowed: config.allowed.clone(),
        description: config.description_for(&call.arguments),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use deepagents_core::event::PathSegment;
    use deepagents_core::{AssistantMessage, ContentBlock, Message, PausedRun};
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
