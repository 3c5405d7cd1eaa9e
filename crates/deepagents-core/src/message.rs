//! Messages, tool calls, tool results and token usage.

use std::ops::AddAssign;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::content::{ContentBlock, joined_text};

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// Instructions from the application. The system prompt of a request is kept apart (see
    /// [`ModelRequest::system_prompt`](crate::model::ModelRequest::system_prompt)); this variant
    /// carries system text that belongs at a point in the history.
    System {
        /// The content.
        content: Vec<ContentBlock>,
    },
    /// Input from the user.
    User {
        /// The content.
        content: Vec<ContentBlock>,
    },
    /// A model turn: text and the tool calls it asked for.
    Assistant(AssistantMessage),
    /// The result of one tool call.
    Tool(ToolResult),
}

impl Message {
    /// A user message holding one text block.
    pub fn user(text: impl Into<String>) -> Self {
        Self::User {
            content: vec![ContentBlock::text(text)],
        }
    }

    /// A system message holding one text block.
    pub fn system(text: impl Into<String>) -> Self {
        Self::System {
            content: vec![ContentBlock::text(text)],
        }
    }

    /// The concatenated text blocks of this message.
    pub fn text(&self) -> String {
        match self {
            Self::System { content } | Self::User { content } => joined_text(content),
            Self::Assistant(message) => joined_text(&message.content),
            Self::Tool(result) => joined_text(&result.content),
        }
    }
}

/// What the model said in one turn.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    /// Text (and, for some providers, other blocks) the model produced.
    #[serde(default)]
    pub content: Vec<ContentBlock>,
    /// Tools the model asked to run, in the order it listed them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
}

impl AssistantMessage {
    /// An assistant message with only text.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            content: vec![ContentBlock::text(text)],
            tool_calls: Vec::new(),
        }
    }
}

/// A request from the model to run one tool.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Provider-assigned id that the result must echo.
    pub id: String,
    /// Name of the tool.
    pub name: String,
    /// Arguments as the model sent them. Normally a JSON object; when a provider delivered text
    /// that is not valid JSON, it is kept verbatim as a JSON string so the run can tell the model
    /// exactly what was wrong.
    pub arguments: Value,
}

/// Whether a tool call succeeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolStatus {
    /// The tool did its job.
    Ok,
    /// The tool failed; the content says why and what to do next.
    Error,
}

/// The result of one tool call, as the model will see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// Id of the [`ToolCall`] this answers.
    pub tool_call_id: String,
    /// Name of the tool that ran.
    pub name: String,
    /// What the model sees.
    pub content: Vec<ContentBlock>,
    /// Success or failure.
    pub status: ToolStatus,
    /// Machine-readable data for the application; never sent to the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact: Option<Value>,
}

impl ToolResult {
    /// An error result with a text message for the model.
    pub fn error(call: &ToolCall, message: impl Into<String>) -> Self {
        Self {
            tool_call_id: call.id.clone(),
            name: call.name.clone(),
            content: vec![ContentBlock::text(message)],
            status: ToolStatus::Error,
            artifact: None,
        }
    }
}

/// Tokens used by model calls.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Usage {
    /// Prompt tokens, including cached ones.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache (a subset of `input_tokens`).
    #[serde(default)]
    pub cached_input_tokens: u64,
    /// Prompt tokens written to the provider's cache (a subset of `input_tokens`; Anthropic
    /// reports them and charges extra).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_write_input_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl AddAssign for Usage {
    fn add_assign(&mut self, other: Self) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
        self.cache_write_input_tokens += other.cache_write_input_tokens;
    }
}

/// A conversation: the messages of a run or a request, shared rather than copied.
///
/// Cloning is O(1) (the messages sit behind one reference count), so the run hands its
/// history to each model request, and middleware keeps a request aside, without copying it.
/// It reads as a `Vec<Message>`; changing it (`push`, `&mut` access) copies the messages
/// first only while another clone still shares them (copy on write), so change a request's
/// messages only when you mean to. Serialized as a plain list.
///
/// Each list carries a [`MessagesVersion`]: appending with [`push`](Self::push) or
/// [`extend`](Extend::extend) keeps the messages already there recognizably the same, so a
/// model wire can reuse what it encoded for an earlier request; any other change (through
/// `&mut Vec<Message>`) starts a new version.
#[derive(Clone, Debug, Default)]
pub struct Messages {
    list: Arc<Vec<Message>>,
    version: Version,
}

/// Which list a version's messages were appended to: the same id means the same shared
/// allocation, only ever appended to while it was not shared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Version {
    id: u64,
    /// Set when the list was copied to be appended to while shared: the id it was copied from
    /// and how many messages it had then.
    forked_from: Option<(u64, usize)>,
}

impl Default for Version {
    fn default() -> Self {
        Self::fresh()
    }
}

impl Version {
    fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Self {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            forked_from: None,
        }
    }
}

/// Where a [`Messages`] list stood when [`Messages::version`] was taken: compare two with
/// [`common_prefix`](Self::common_prefix) to know how many leading messages are unchanged
/// between them without looking at the messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessagesVersion {
    version: Version,
    len: usize,
}

impl MessagesVersion {
    /// How many leading messages the two lists surely have in common: those of the shorter
    /// one when one was appended to the other, those they had when one was copied from the
    /// other, 0 when they are not related (a list edited in place, summarized, or built
    /// anew). Never more than they share; possibly less.
    pub fn common_prefix(&self, other: &MessagesVersion) -> usize {
        let (a, b) = (self.version, other.version);
        let shared = if a.id == b.id {
            usize::MAX
        } else {
            match (a.forked_from, b.forked_from) {
                (Some((from, at)), _) if from == b.id => at,
                (_, Some((from, at))) if from == a.id => at,
                (Some((from_a, at_a)), Some((from_b, at_b))) if from_a == from_b => at_a.min(at_b),
                _ => 0,
            }
        };
        shared.min(self.len).min(other.len)
    }
}

impl PartialEq for Messages {
    fn eq(&self, other: &Self) -> bool {
        self.list == other.list
    }
}

impl Serialize for Messages {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.list.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Messages {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<Message>::deserialize(deserializer).map(Self::from)
    }
}

impl Messages {
    /// No messages.
    pub fn new() -> Self {
        Self::default()
    }

    /// The messages as a list of their own, copied only when shared.
    pub fn into_vec(self) -> Vec<Message> {
        Arc::try_unwrap(self.list).unwrap_or_else(|shared| (*shared).clone())
    }

    /// Where the list stands now (see [`MessagesVersion::common_prefix`]).
    pub fn version(&self) -> MessagesVersion {
        MessagesVersion {
            version: self.version,
            len: self.list.len(),
        }
    }

    /// Appends a message, keeping the version: the messages before it are unchanged.
    pub fn push(&mut self, message: Message) {
        self.appendable().push(message);
    }

    /// The list to append to: copied first, as a fork of this version, when shared.
    fn appendable(&mut self) -> &mut Vec<Message> {
        if Arc::get_mut(&mut self.list).is_none() {
            self.version = Version {
                forked_from: Some((self.version.id, self.list.len())),
                ..Version::fresh()
            };
        }
        Arc::make_mut(&mut self.list)
    }
}

impl std::ops::Deref for Messages {
    type Target = Vec<Message>;

    fn deref(&self) -> &Vec<Message> {
        &self.list
    }
}

impl std::ops::DerefMut for Messages {
    /// Any change but appending: a new version, unrelated to the earlier ones.
    fn deref_mut(&mut self) -> &mut Vec<Message> {
        self.version = Version::fresh();
        Arc::make_mut(&mut self.list)
    }
}

impl From<Vec<Message>> for Messages {
    fn from(messages: Vec<Message>) -> Self {
        Self {
            list: Arc::new(messages),
            version: Version::fresh(),
        }
    }
}

impl From<Messages> for Vec<Message> {
    fn from(messages: Messages) -> Self {
        messages.into_vec()
    }
}

impl FromIterator<Message> for Messages {
    fn from_iter<I: IntoIterator<Item = Message>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl<'a> IntoIterator for &'a Messages {
    type Item = &'a Message;
    type IntoIter = std::slice::Iter<'a, Message>;

    fn into_iter(self) -> Self::IntoIter {
        self.list.iter()
    }
}

impl PartialEq<Vec<Message>> for Messages {
    fn eq(&self, other: &Vec<Message>) -> bool {
        *self.list == *other
    }
}

impl PartialEq<[Message]> for Messages {
    fn eq(&self, other: &[Message]) -> bool {
        self.list.as_slice() == other
    }
}

impl Extend<Message> for Messages {
    fn extend<I: IntoIterator<Item = Message>>(&mut self, iter: I) {
        self.appendable().extend(iter);
    }
}
