//! Pauses for a human: the calls a run waits on and the decisions that answer them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::AgentPath;

/// What a person may decide about a paused call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// Which kind of decision this is.
    pub fn kind(&self) -> DecisionKind {
        match self {
            Self::Approve => DecisionKind::Approve,
            Self::Edit { .. } => DecisionKind::Edit,
            Self::Reject { .. } => DecisionKind::Reject,
            Self::Respond { .. } => DecisionKind::Respond,
        }
    }
}

/// A call waiting for a decision.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
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
    /// What a tool that suspended itself asks ([`ToolOutput::suspend`]): a question, a form,
    /// anything JSON; answered with [`Decision::Respond`] (or declined with
    /// [`Decision::Reject`]). `None` for a call paused before it ran, for approval.
    ///
    /// [`ToolOutput::suspend`]: crate::ToolOutput::suspend
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<Value>,
    /// Which agent waits: empty for the run's own calls; for a call inside a subagent, the
    /// `task` call that started it and the subagent's name, once per level (as in events).
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::event::agent_path_compat"
    )]
    pub path: AgentPath,
}

impl PendingAction {
    /// The tool call's own path segment when this action is a question that call asked
    /// ([`ToolOutput::suspend`](crate::ToolOutput::suspend)): the run records a suspended call
    /// like a subagent paused inside it, one level down, so decisions reach it the same way.
    fn asking_segment(&self) -> Option<&crate::event::PathSegment> {
        let last = self.path.last()?;
        let asks = self.request.is_some()
            && last.name == self.name
            && self
                .call_id
                .strip_prefix(last.call_id.as_str())
                .is_some_and(|rest| rest.starts_with("-ask-"));
        asks.then_some(last)
    }

    /// The id of the model's tool call this action is about: for a question a tool asked
    /// mid-call, the call that asked it (front ends attach the question to that call);
    /// otherwise [`call_id`](Self::call_id).
    pub fn tool_call_id(&self) -> &str {
        self.asking_segment()
            .map_or(self.call_id.as_str(), |segment| segment.call_id.as_str())
    }

    /// The subagents the action waits in, outermost first: [`path`](Self::path) without the
    /// level a question adds for the call that asked it. Empty for the run's own calls and
    /// their questions.
    pub fn agents(&self) -> &[crate::event::PathSegment] {
        match self.asking_segment() {
            Some(_) => &self.path[..self.path.len() - 1],
            None => &self.path,
        }
    }
}
