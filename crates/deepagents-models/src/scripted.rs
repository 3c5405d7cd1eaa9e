//! A deterministic model that replays assistant turns from a script, for tests and offline demos.
//!
//! ```json
//! {"turns": [
//!   {"text": "Planning first.", "tool_calls": [{"name": "write_todos", "args": {"todos": []}}]},
//!   {"text": "Done."}
//! ]}
//! ```
//!
//! Each turn has optional `text`, `tool_calls` (`name`, `args`, optional `id`; ids default to
//! `call_<turn>_<index>`), `usage` (estimated from the text when absent) and `error`
//! (`kind`, `message`, optional `retry_after_ms`) to make that call fail, and `stop_reason`
//! (`max_tokens` plays an answer cut at the output limit). `args` may be a string to simulate a
//! model that sent malformed JSON.
//!
//! A script may also hold `conversations`, each with `when_task_contains` and its own `turns`:
//! a request whose first user message contains that text plays those turns. Subagents, which
//! each start a conversation from their task description, get scripts of their own this way.
//!
//! The turn to play follows the script turn that produced the request's latest assistant
//! message (or, when none matches, the number of assistant messages), so a conversation resumed
//! from a checkpoint or shortened by summarization continues its script where it stopped. An `error` turn fails one
//! call and is then passed over. Asking for a turn past the end is an error naming the script.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use deepagents_core::ContentBlock;
use deepagents_core::message::{AssistantMessage, Message, ToolCall, Usage};
use deepagents_core::model::{
    InputModalities, Model, ModelError, ModelProfile, ModelRequest, ModelResponse, ModelStream,
    StopReason, StreamEvent,
};
use futures::stream;
use serde::Deserialize;
use serde_json::Value;

/// A script: the assistant turns to replay, in order.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// The turns of any conversation no entry of `conversations` claims.
    #[serde(default)]
    pub turns: Vec<ScriptedTurn>,
    /// Turns for conversations whose task contains a given text.
    #[serde(default)]
    pub conversations: Vec<ScriptedConversation>,
}

/// Turns for the conversations whose first user message contains `when_task_contains`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedConversation {
    /// Text the first user message must contain.
    pub when_task_contains: String,
    /// The turns.
    pub turns: Vec<ScriptedTurn>,
}

/// One scripted assistant turn.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedTurn {
    /// Assistant text.
    #[serde(default)]
    pub text: String,
    /// Tool calls.
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
    /// Reported usage; estimated at four characters a token when absent.
    #[serde(default)]
    pub usage: Option<Usage>,
    /// Makes this call fail instead.
    #[serde(default)]
    pub error: Option<ScriptedError>,
    /// Why the model stopped (`end_turn`, `max_tokens`, …); by default `tool_use` with tool
    /// calls and `end_turn` without. `max_tokens` plays an answer cut at the output limit.
    #[serde(default)]
    pub stop_reason: Option<StopReason>,
}

/// One scripted tool call.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    /// Call id; generated when absent.
    #[serde(default)]
    pub id: Option<String>,
    /// Tool name.
    pub name: String,
    /// Arguments: an object, or a string to simulate malformed JSON.
    #[serde(default = "empty_object")]
    pub args: Value,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// A scripted failure.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedError {
    /// `rate_limited`, `context_window_exceeded`, `transient`, `authentication`,
    /// `invalid_request` or `other`.
    pub kind: String,
    /// The message.
    #[serde(default)]
    pub message: String,
    /// For `rate_limited`: the advised wait.
    #[serde(default)]
    pub retry_after_ms: Option<u64>,
}

/// A script file could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScriptError {
    /// The file could not be read.
    // The OS error is the `source()`, not part of this message: error reports that walk the
    // chain (anyhow's `{:#}`) would print it twice.
    #[error("cannot read model script {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why, as the error's `source()`.
        source: std::io::Error,
    },
    /// The file is not a valid script.
    #[error("model script {} is invalid: {message}; expected {{\"turns\":[{{\"text\":\"…\",\"tool_calls\":[{{\"name\":\"…\",\"args\":{{…}}}}]}}]}}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong, with line and column.
        message: String,
    },
    /// A turn's error kind is unknown.
    #[error("model script {}: turn {turn} has unknown error kind `{kind}`; use rate_limited, context_window_exceeded, transient, authentication, invalid_request or other", path.display())]
    UnknownErrorKind {
        /// The file.
        path: PathBuf,
        /// 0-based turn.
        turn: usize,
        /// The kind given.
        kind: String,
    },
}

/// Replays a [`Script`].
#[derive(Debug)]
pub struct ScriptedModel {
    id: String,
    source: PathBuf,
    script: Script,
    /// Error turns already served, as (conversation, turn); the default conversation is last.
    errors_served: Mutex<HashSet<(usize, usize)>>,
    profile: Option<ModelProfile>,
    modalities: Option<InputModalities>,
}

impl ScriptedModel {
    /// Loads a script file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ScriptError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ScriptError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_json_at(&text, path)
    }

    /// Parses a script from JSON text.
    pub fn from_json(json: &str) -> Result<Self, ScriptError> {
        Self::from_json_at(json, Path::new("<inline>"))
    }

    /// Builds a model from a script value.
    pub fn new(script: Script) -> Result<Self, ScriptError> {
        Self::checked(script, Path::new("<inline>"))
    }

    fn from_json_at(json: &str, path: &Path) -> Result<Self, ScriptError> {
        let script: Script = serde_json::from_str(json).map_err(|e| ScriptError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        Self::checked(script, path)
    }

    fn checked(script: Script, path: &Path) -> Result<Self, ScriptError> {
        let all_turns = script
            .conversations
            .iter()
            .flat_map(|c| c.turns.iter())
            .chain(script.turns.iter());
        for (turn, scripted) in all_turns.enumerate() {
            if let Some(error) = &scripted.error
                && error_of_kind(&error.kind, String::new(), None).is_none()
            {
                return Err(ScriptError::UnknownErrorKind {
                    path: path.to_owned(),
                    turn,
                    kind: error.kind.clone(),
                });
            }
        }
        Ok(Self {
            id: format!("scripted:{}", path.display()),
            source: path.to_owned(),
            errors_served: Mutex::new(HashSet::new()),
            script,
            profile: None,
            modalities: None,
        })
    }

    /// Reports these limits as the model's profile (none by default), so context management
    /// sees the window a real model would have.
    #[must_use]
    pub fn with_profile(mut self, profile: ModelProfile) -> Self {
        self.profile = Some(profile);
        self
    }

    /// Reports these as what the model reads besides text (unknown by default).
    #[must_use]
    pub fn with_modalities(mut self, modalities: InputModalities) -> Self {
        self.modalities = Some(modalities);
        self
    }

    fn respond(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let assistant_turns = request
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant(_)))
            .count();
        let task = request
            .messages
            .iter()
            .find(|m| matches!(m, Message::User { .. }))
            .map(Message::text)
            .unwrap_or_default();
        let (conversation, turns, which) = match self
            .script
            .conversations
            .iter()
            .position(|c| task.contains(&c.when_task_contains))
        {
            Some(i) => (
                i,
                &self.script.conversations[i].turns,
                format!(
                    "the conversation for tasks containing `{}`",
                    self.script.conversations[i].when_task_contains
                ),
            ),
            None => (
                self.script.conversations.len(),
                &self.script.turns,
                "its default conversation".to_owned(),
            ),
        };
        let mut served = self
            .errors_served
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // Where the conversation stands: right after the script turn that produced its latest
        // assistant message. Counting assistant messages would break when history is
        // summarized away; it is only the fallback when no turn matches.
        let last_assistant = request.messages.iter().rev().find_map(|m| match m {
            Message::Assistant(assistant) => Some(assistant),
            _ => None,
        });
        let matched = last_assistant.and_then(|last| {
            let floor = assistant_turns.saturating_sub(1);
            let mut candidates = turns
                .iter()
                .enumerate()
                .filter(|(k, turn)| produced(turn, *k, last));
            candidates
                .clone()
                .find(|(k, _)| *k >= floor)
                .or_else(|| candidates.next())
                .map(|(k, _)| k + 1)
        });
        let mut index = matched.unwrap_or_else(|| {
            assistant_turns + served.iter().filter(|(c, _)| *c == conversation).count()
        });
        while served.contains(&(conversation, index)) {
            index += 1;
        }
        let Some(turn) = turns.get(index) else {
            return Err(ModelError::Other {
                message: format!(
                    "the scripted model ran out of turns: {} holds {} turns for {which} and the run asked for turn {}; add turns to the script or lower the turn limit",
                    self.source.display(),
                    turns.len(),
                    index + 1
                ),
            });
        };
        if let Some(error) = &turn.error {
            served.insert((conversation, index));
            let message = if error.message.is_empty() {
                format!("scripted {} error", error.kind)
            } else {
                error.message.clone()
            };
            let retry_after = error.retry_after_ms.map(std::time::Duration::from_millis);
            return Err(error_of_kind(&error.kind, message.clone(), retry_after)
                .unwrap_or(ModelError::Other { message }));
        }
        let tool_calls: Vec<ToolCall> = turn
            .tool_calls
            .iter()
            .enumerate()
            .map(|(i, call)| ToolCall {
                id: call
                    .id
                    .clone()
                    .unwrap_or_else(|| format!("call_{index}_{i}")),
                name: call.name.clone(),
                arguments: call.args.clone(),
            })
            .collect();
        let content = if turn.text.is_empty() {
            Vec::new()
        } else {
            vec![ContentBlock::text(&turn.text)]
        };
        let stop_reason = match &turn.stop_reason {
            Some(reason) => reason.clone(),
            None if tool_calls.is_empty() => StopReason::EndTurn,
            None => StopReason::ToolUse,
        };
        let message = AssistantMessage {
            content,
            tool_calls,
        };
        let usage = turn
            .usage
            .unwrap_or_else(|| estimate_usage(request, &message));
        Ok(ModelResponse {
            message,
            usage,
            stop_reason,
        })
    }
}

/// Whether script turn `k` produced `message`.
fn produced(turn: &ScriptedTurn, k: usize, message: &AssistantMessage) -> bool {
    turn.error.is_none()
        && Message::Assistant(message.clone()).text() == turn.text
        && message.tool_calls.len() == turn.tool_calls.len()
        && message
            .tool_calls
            .iter()
            .zip(&turn.tool_calls)
            .enumerate()
            .all(|(i, (sent, scripted))| {
                let id = scripted
                    .id
                    .clone()
                    .unwrap_or_else(|| format!("call_{k}_{i}"));
                sent.id == id && sent.name == scripted.name
            })
}

fn error_of_kind(
    kind: &str,
    message: String,
    retry_after: Option<std::time::Duration>,
) -> Option<ModelError> {
    Some(match kind {
        "rate_limited" => ModelError::RateLimited {
            retry_after,
            message,
        },
        "context_window_exceeded" => ModelError::ContextWindowExceeded { message },
        "transient" => ModelError::Transient { message },
        "authentication" => ModelError::Authentication { message },
        "invalid_request" => ModelError::InvalidRequest { message },
        "other" => ModelError::Other { message },
        _ => return None,
    })
}

/// Four characters a token: crude, deterministic, and enough for a scripted model.
fn estimate_usage(request: &ModelRequest, answer: &AssistantMessage) -> Usage {
    let tokens = |chars: usize| chars.div_ceil(4) as u64;
    let mut input_chars = request.system_prompt.as_deref().map_or(0, str::len);
    input_chars += request
        .messages
        .iter()
        .map(|m| m.text().len())
        .sum::<usize>();
    input_chars += request
        .tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
        .sum::<usize>();
    let mut output_chars = Message::Assistant(answer.clone()).text().len();
    output_chars += answer
        .tool_calls
        .iter()
        .map(|c| c.name.len() + c.arguments.to_string().len())
        .sum::<usize>();
    Usage {
        input_tokens: tokens(input_chars),
        output_tokens: tokens(output_chars),
        ..Usage::default()
    }
}

#[async_trait]
impl Model for ScriptedModel {
    fn id(&self) -> &str {
        &self.id
    }

    fn profile(&self) -> Option<ModelProfile> {
        self.profile
    }

    fn input_modalities(&self) -> Option<InputModalities> {
        self.modalities
    }

    async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        self.respond(request)
    }

    /// Streams the text word by word and each tool call as one delta, like a real provider.
    async fn stream(&self, request: &ModelRequest) -> Result<ModelStream, ModelError> {
        let response = self.respond(request)?;
        let mut events = Vec::new();
        let text = Message::Assistant(response.message.clone()).text();
        for word in text.split_inclusive(' ') {
            events.push(Ok(StreamEvent::TextDelta {
                text: word.to_owned(),
            }));
        }
        for (index, call) in response.message.tool_calls.iter().enumerate() {
            events.push(Ok(StreamEvent::ToolCallDelta {
                index,
                id: Some(call.id.clone()),
                name: Some(call.name.clone()),
                arguments_delta: call.arguments.to_string(),
            }));
        }
        events.push(Ok(StreamEvent::Completed(response)));
        Ok(Box::pin(stream::iter(events)))
    }
}
