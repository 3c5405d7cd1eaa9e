//! The events a run emits. Every front end (the CLI's `--json`, a terminal UI, a server)
//! consumes this one stream.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::content::ContentBlock;
use crate::message::{ToolStatus, Usage};
use crate::model::StopReason;
use crate::state::{FileContent, Todo};

/// Where in the agent tree an event comes from: `[]` for the main agent; a subagent appends
/// the id of the tool call that started it and its name.
pub type AgentPath = Vec<String>;

/// One event, tagged with the agent that produced it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The producing agent.
    pub path: AgentPath,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What happened. Serialized with a `type` field in snake_case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// The run began (or resumed).
    RunStarted {
        /// Name of the agent.
        agent: String,
        /// The model spec.
        model: String,
    },
    /// A model call is about to be made.
    ModelCallStarted {
        /// 1-based number of the call since the latest user input.
        step: u32,
    },
    /// A piece of assistant text, as it streams.
    TextDelta {
        /// The new text.
        text: String,
    },
    /// A model call finished.
    ModelCallFinished {
        /// Same as in [`EventKind::ModelCallStarted`].
        step: u32,
        /// Tokens used by this call.
        usage: Usage,
        /// Why the model stopped.
        stop_reason: StopReason,
        /// How many tool calls it asked for.
        tool_calls: usize,
    },
    /// A tool call is starting.
    ToolCallStarted {
        /// The call id.
        call_id: String,
        /// The tool.
        name: String,
        /// The arguments as the model sent them.
        arguments: Value,
    },
    /// A tool call finished.
    ToolCallFinished {
        /// The call id.
        call_id: String,
        /// The tool.
        name: String,
        /// Success or failure.
        status: ToolStatus,
        /// What the model will see.
        content: Vec<ContentBlock>,
        /// Wall time of the call.
        duration_ms: u64,
    },
    /// The agent state changed.
    StateUpdated {
        /// The new plan, when it changed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        todos: Option<Vec<Todo>>,
        /// Paths of files written or deleted.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        files_changed: Vec<String>,
        /// Custom keys that changed, with their new values.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        custom: BTreeMap<String, Value>,
    },
    /// The run paused: these tool calls wait for a human decision.
    Interrupted {
        /// The pending actions (call id, tool, arguments, description, allowed decisions).
        actions: Vec<Value>,
    },
    /// Older messages were replaced by a summary in what the model sees. The run still holds
    /// them all, and their transcript was appended to `history_file`.
    Summarized {
        /// How many messages this summarization replaced.
        replaced: usize,
        /// Index in the conversation of the first message still sent verbatim (everything
        /// before it is summarized), when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kept_from: Option<usize>,
        /// The file holding the replaced transcripts.
        history_file: String,
        /// What caused it: `threshold` (the context filled up), `requested` (the model called
        /// `compact_conversation`) or `context_overflow` (the provider refused the request).
        trigger: String,
    },
    /// The run ended with an answer.
    Final {
        /// The answer: the text of the last assistant message.
        text: String,
        /// Tokens used since the latest user input.
        usage: Usage,
        /// Model calls made since the latest user input.
        steps: u32,
        /// The files kept in the agent state (the state backend's), by path, with their
        /// contents: `{"encoding": "text", "text": …}` or `{"encoding": "binary", "mime_type":
        /// …, "data": base64}`. Files on disk or in a store are not repeated here.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        files: BTreeMap<String, FileContent>,
    },
    /// The run stopped on an error.
    Error {
        /// A snake_case kind, e.g. `turn_limit` or `model`.
        kind: String,
        /// A one-line reason.
        message: String,
    },
}

/// Where a run sends its events; cheap to clone.
///
/// Delivery never blocks the run: the channel is unbounded, and a listener that went away is
/// ignored.
#[derive(Clone, Debug, Default)]
pub struct EventSink {
    sender: Option<mpsc::UnboundedSender<Event>>,
    path: AgentPath,
}

impl EventSink {
    /// A sink that drops every event.
    pub fn discard() -> Self {
        Self::default()
    }

    /// A sink for the main agent and the receiver of its events.
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<Event>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let sink = Self {
            sender: Some(sender),
            path: AgentPath::new(),
        };
        (sink, receiver)
    }

    /// A sink for a nested agent: its events carry this path plus `segments`.
    pub fn nested(&self, segments: impl IntoIterator<Item = String>) -> Self {
        let mut path = self.path.clone();
        path.extend(segments);
        Self {
            sender: self.sender.clone(),
            path,
        }
    }

    /// The path stamped on this sink's events.
    pub fn path(&self) -> &AgentPath {
        &self.path
    }

    /// Sends one event.
    pub fn emit(&self, kind: EventKind) {
        if let Some(sender) = &self.sender {
            // A closed channel means nobody listens any more; the run goes on regardless.
            let _ = sender.send(Event {
                path: self.path.clone(),
                kind,
            });
        }
    }
}
