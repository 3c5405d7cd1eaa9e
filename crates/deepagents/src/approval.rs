//! Human approval: tool calls that pause the run until someone decides.

use std::collections::BTreeMap;
use std::sync::Arc;

use deepagents_backends::{Mode, Operation, Permissions, VPath};
use deepagents_core::{Message, Run, ToolCall, ToolResult, ToolStatus};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::RunError;

/// The custom key holding the actions a paused run waits on.
pub const PENDING_KEY: &str = "deepagents.pending_approval";
/// The custom key holding the decisions given for them.
pub const DECISIONS_KEY: &str = "deepagents.decisions";

/// What a person may decide about a paused call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// Run it as asked.
    Approve,
    /// Run it with other arguments.
    Edit,
    /// Do not run it; tell the model why.
    Reject,
    /// Do not run it; answer in its place.
    Respond,
}

/// A decision about one paused call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Decision {
    /// Run it as asked.
    Approve,
    /// Run it with these arguments instead.
    Edit {
        /// The new arguments.
        arguments: Value,
    },
    /// Do not run it.
    Reject {
        /// Why, for the model.
        #[serde(default)]
        message: Option<String>,
    },
    /// Do not run it; this is its result.
    Respond {
        /// The answer the model gets.
        message: String,
    },
}

impl Decision {
    fn kind(&self) -> DecisionKind {
        match self {
            Self::Approve => DecisionKind::Approve,
            Self::Edit { .. } => DecisionKind::Edit,
            Self::Reject { .. } => DecisionKind::Reject,
            Self::Respond { .. } => DecisionKind::Respond,
        }
    }
}

/// A call waiting for a decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PendingAction {
    /// The call id.
    pub call_id: String,
    /// The tool.
    pub name: String,
    /// The arguments the model gave.
    pub arguments: Value,
    /// What to tell the person deciding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The decisions allowed.
    pub allowed: Vec<DecisionKind>,
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
/// with [`Agent::run`](crate::Agent::run). Fails when the count or a kind is not allowed.
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
        let value = serde_json::to_value(&decision)
            .map_err(|e| RunError::InvalidDecision(e.to_string()))?;
        by_call.insert(action.call_id.clone(), value);
    }
    run.state.custom.remove(PENDING_KEY);
    run.state
        .custom
        .insert(DECISIONS_KEY.to_owned(), Value::Object(by_call));
    Ok(())
}

/// How the driver should treat a step's calls.
pub(crate) enum Gate {
    /// Run these calls (arguments already edited); these results are settled without running.
    Proceed {
        run: Vec<ToolCall>,
        settled: Vec<ToolResult>,
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
    let mut to_run = Vec::new();
    let mut settled = Vec::new();
    let mut pending = Vec::new();
    for mut call in calls {
        let Some(config) = interrupts
            .get(&call.name)
            .filter(|c| c.applies(&call.arguments))
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
            }),
            Some(Decision::Approve) => to_run.push(call),
            Some(Decision::Edit { arguments }) => {
                edit_call(run, &call.id, arguments);
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
        run.state.custom.insert(
            PENDING_KEY.to_owned(),
            serde_json::to_value(&pending).unwrap_or(Value::Null),
        );
        Gate::Pause(pending)
    }
}

/// The history shows the arguments that actually ran.
fn edit_call(run: &mut Run, call_id: &str, arguments: &Value) {
    for message in run.state.messages.iter_mut().rev() {
        if let Message::Assistant(assistant) = message
            && let Some(call) = assistant.tool_calls.iter_mut().find(|c| c.id == call_id)
        {
            call.arguments = arguments.clone();
            return;
        }
    }
}
