//! The pause as operations of the [`Run`]: which calls of a step wait for a person, the
//! decisions that answer them (checked against the pause they were given for), what is left
//! of a pause once new input came instead, and the subagent runs (and suspended calls) a step
//! leaves paused. Plain data in, plain data out: the driver only performs the IO around them.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::event::PathSegment;
use crate::interrupt::{Decision, DecisionKind, PendingAction};
use crate::message::{Message, ToolCall, ToolResult, ToolStatus};
use crate::run::{PausedRun, Run};

/// What a call that needs approval offers the person deciding.
#[derive(Clone, Debug, PartialEq)]
pub struct GateRule {
    /// The decisions allowed.
    pub allowed: Vec<DecisionKind>,
    /// What the person deciding is told.
    pub description: Option<String>,
}

/// How a step's calls were sorted by [`Run::gate`].
#[derive(Clone, Debug, PartialEq)]
pub enum Gate {
    /// Run these calls (arguments already edited); these results are settled without running.
    Proceed {
        /// The calls to execute, in call order.
        run: Vec<ToolCall>,
        /// Results of calls that were rejected or answered in place of running.
        settled: Vec<ToolResult>,
        /// The earliest message an edit rewrote (the journal stores it again).
        rewritten: Option<usize>,
    },
    /// The run waits for decisions on these actions (already recorded in its control).
    Pause(Vec<PendingAction>),
}

/// Decisions that cannot be applied to the run; it is left unchanged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecisionError {
    /// They do not fit the pending actions (count, kind, a subagent that is not stored).
    #[error("{0}")]
    Invalid(String),
    /// They answer a pause the run does not wait in.
    #[error("the decisions answer interrupt `{given}`, which is not pending")]
    Stale {
        /// The pause they were given for.
        given: String,
        /// The pause the run waits in now, if any.
        current: Option<String>,
    },
}

/// What the model is told about a call the person rejected (or a question they declined).
pub fn rejected(reason: Option<&str>) -> String {
    format!(
        "The user rejected this call{}. Do not retry it unchanged.",
        reason
            .map(|m| format!(": {}", m.trim_end_matches('.')))
            .unwrap_or_default()
    )
}

impl Run {
    /// Whether a step must go through [`gate`](Self::gate) even when no tool needs approval:
    /// it continues paused subagent runs, or decisions wait for its calls.
    pub fn needs_gate(&self) -> bool {
        !self.control.paused_subagents.is_empty() || !self.control.decisions.is_empty()
    }

    /// Sorts a step's calls by `rule` (the approval a call needs, if any) and the decisions
    /// given: approved and edited calls run, rejected and answered ones are settled, and
    /// undecided ones make the run pause (recorded in [`Control::pending`], the decisions
    /// given so far kept). A call whose subagent paused inside it was let through before; its
    /// decisions belong to the subagent. A decision for a call `rule` does not gate answers a
    /// pause the agent no longer makes (a question an earlier version asked as a gate before
    /// the call) and is applied all the same.
    ///
    /// [`Control::pending`]: crate::run::Control::pending
    pub fn gate(
        &mut self,
        calls: Vec<ToolCall>,
        rule: impl Fn(&ToolCall) -> Option<GateRule>,
    ) -> Gate {
        let decisions = std::mem::take(&mut self.control.decisions);
        let resuming: BTreeSet<&String> = self.control.paused_subagents.keys().collect();
        let mut to_run = Vec::new();
        let mut settled = Vec::new();
        let mut pending = Vec::new();
        let mut edits = Vec::new();
        for mut call in calls {
            let rule = (!resuming.contains(&call.id))
                .then(|| rule(&call))
                .flatten();
            match (rule, decisions.get(&call.id)) {
                (None, None) | (_, Some(Decision::Approve)) => to_run.push(call),
                (Some(rule), None) => pending.push(PendingAction {
                    call_id: call.id.clone(),
                    name: call.name.clone(),
                    arguments: call.arguments.clone(),
                    description: rule.description,
                    allowed: rule.allowed,
                    request: None,
                    path: Vec::new(),
                }),
                (_, Some(Decision::Edit { arguments })) => {
                    edits.push((call.id.clone(), arguments.clone()));
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
        if !pending.is_empty() {
            // Nothing of this step has run: the decisions given so far are kept for the resume.
            self.control.decisions = decisions;
            self.control.pending = pending.clone();
            return Gate::Pause(pending);
        }
        let rewritten = edits
            .iter()
            .filter_map(|(id, arguments)| self.edit_call(id, arguments))
            .min();
        Gate::Proceed {
            run: to_run,
            settled,
            rewritten,
        }
    }

    /// The history shows the arguments that actually ran. Returns the index of the message it
    /// rewrote.
    fn edit_call(&mut self, call_id: &str, arguments: &Value) -> Option<usize> {
        for (index, message) in self.state.messages.iter_mut().enumerate().rev() {
            if let Message::Assistant(assistant) = message
                && let Some(call) = assistant.tool_calls.iter_mut().find(|c| c.id == call_id)
            {
                call.arguments = arguments.clone();
                return Some(index);
            }
        }
        None
    }

    /// Drops what is left of a pause whose step will never run (new input came instead of
    /// decisions), so stale actions are not reported and paused subagent runs do not linger
    /// in every later checkpoint. Returns whether anything was dropped.
    pub fn drop_stale(&mut self) -> bool {
        let control = &self.control;
        if control.pending.is_empty()
            && control.decisions.is_empty()
            && control.paused_subagents.is_empty()
        {
            return false;
        }
        let waiting: BTreeSet<String> = self
            .pending_tool_calls()
            .into_iter()
            .map(|c| c.id)
            .collect();
        let control = &mut self.control;
        let mut dropped = false;
        if waiting.is_empty() && !(control.pending.is_empty() && control.decisions.is_empty()) {
            control.pending.clear();
            control.decisions.clear();
            dropped = true;
        }
        let before = control.paused_subagents.len();
        control
            .paused_subagents
            .retain(|id, _| waiting.contains(id));
        dropped || control.paused_subagents.len() != before
    }

    /// Folds a step's outcome into the stored subagent runs: those of `finished` calls are
    /// done with, those in `paused` wait. When any waits, the run pauses on what they wait
    /// for, each action marked with its path, in call order (recorded in its control and
    /// returned); otherwise nothing is returned.
    pub fn settle_subagents<'a>(
        &mut self,
        finished: impl IntoIterator<Item = &'a str>,
        paused: Vec<(String, PausedRun)>,
    ) -> Vec<PendingAction> {
        let stored = &mut self.control.paused_subagents;
        for id in finished {
            stored.remove(id);
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
        }
        if !actions.is_empty() {
            self.control.pending.clone_from(&actions);
        }
        actions
    }

    /// Records decisions for the paused run, one per pending action in order. Fails, leaving
    /// the run unchanged, when the count or a kind is not allowed. Decisions for actions inside
    /// a subagent (or a suspended call) go into its stored run, which continues from them when
    /// the parent resumes.
    pub fn decide(&mut self, decisions: Vec<Decision>) -> Result<(), DecisionError> {
        let pending = &self.control.pending;
        if pending.len() != decisions.len() {
            return Err(DecisionError::Invalid(format!(
                "{} actions wait for a decision but {} decisions were given; give one per action, in order",
                pending.len(),
                decisions.len()
            )));
        }
        let mut by_call = BTreeMap::new();
        let mut nested: BTreeMap<String, Vec<Decision>> = BTreeMap::new();
        for (action, decision) in pending.iter().zip(decisions) {
            if !action.allowed.contains(&decision.kind()) {
                return Err(DecisionError::Invalid(format!(
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
        let mut paused = self.control.paused_subagents.clone();
        for (task_call, decisions) in nested {
            let Some(child) = paused.get_mut(&task_call) else {
                return Err(DecisionError::Invalid(format!(
                    "no paused subagent of call {task_call} is stored in the run"
                )));
            };
            child.run.decide(decisions)?;
        }
        // Everything is checked: only now does the run change.
        self.control.pending.clear();
        self.control.decisions = by_call;
        self.control.paused_subagents = paused;
        Ok(())
    }

    /// Like [`decide`](Self::decide), for the pause `pause` names ([`pause_id`](Self::pause_id)):
    /// fails with [`DecisionError::Stale`], leaving the run unchanged, when the run does not
    /// wait in that pause.
    pub fn decide_pause(
        &mut self,
        pause: &str,
        decisions: Vec<Decision>,
    ) -> Result<(), DecisionError> {
        self.check_pause(pause)?;
        self.decide(decisions)
    }

    /// Checks that the run waits in the pause `pause` names.
    pub fn check_pause(&self, pause: &str) -> Result<(), DecisionError> {
        let current = self.pause_id();
        if current.as_deref() == Some(pause) {
            return Ok(());
        }
        Err(DecisionError::Stale {
            given: pause.to_owned(),
            current,
        })
    }

    /// The id of the pause the run waits in; `None` when it waits for no decision.
    ///
    /// It stays the same while the same actions wait (loading, saving or showing the run does
    /// not change it), and every later pause gets another one, even when a model reuses call
    /// ids: besides the waiting calls' ids it covers where each was made in the conversation
    /// (and, for a call inside a subagent, in the subagent's). It reads
    /// `interrupt-<first call id>-<16 hex digits>`; treat it as opaque.
    pub fn pause_id(&self) -> Option<String> {
        let first = self.control.pending.first()?;
        let mut digest = Fnv64::default();
        for action in &self.control.pending {
            // Each level of the path is a call in the run above it; the last, the call itself.
            let mut level = Some(self);
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

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::message::AssistantMessage;
    use crate::run::NextAction;

    fn asking() -> Run {
        let mut run = Run::from_task("go");
        let mut message = AssistantMessage::text("");
        message.tool_calls = vec![ToolCall {
            id: "w".into(),
            name: "write_file".into(),
            arguments: json!({"file_path": "/a"}),
        }];
        run.state.messages.push(Message::Assistant(message));
        run
    }

    fn rule(_: &ToolCall) -> Option<GateRule> {
        Some(GateRule {
            allowed: vec![DecisionKind::Approve, DecisionKind::Reject],
            description: None,
        })
    }

    #[test]
    fn a_gated_call_waits_until_decided_then_runs_or_is_settled() {
        let mut run = asking();
        let NextAction::ExecuteTools(calls) = run.next_action(10).unwrap() else {
            panic!("calls wait")
        };
        let Gate::Pause(actions) = run.gate(calls, rule) else {
            panic!("the call pauses")
        };
        // Without decisions the pause stands.
        assert_eq!(
            run.next_action(10).unwrap(),
            NextAction::AwaitDecisions(actions)
        );
        assert!(matches!(
            run.decide(vec![Decision::Respond {
                message: "x".into()
            }]),
            Err(DecisionError::Invalid(_))
        ));
        let stale = run.pause_id().unwrap();
        run.decide_pause(&stale, vec![Decision::Reject { message: None }])
            .unwrap();
        assert!(matches!(
            run.check_pause(&stale),
            Err(DecisionError::Stale { current: None, .. })
        ));
        let NextAction::ExecuteTools(calls) = run.next_action(10).unwrap() else {
            panic!("decided calls run")
        };
        let Gate::Proceed {
            run: to_run,
            settled,
            ..
        } = run.gate(calls, rule)
        else {
            panic!("decided")
        };
        assert!(to_run.is_empty());
        assert_eq!(settled[0].status, ToolStatus::Error);
        // New input instead of decisions drops what is left of a pause.
        let mut other = asking();
        let NextAction::ExecuteTools(calls) = other.next_action(10).unwrap() else {
            panic!("calls wait")
        };
        other.gate(calls, rule);
        other.push_user_input(vec![crate::ContentBlock::text("never mind")]);
        assert!(other.drop_stale());
        assert!(other.control.pending.is_empty());
    }
}
