//! The model interface: one async trait every provider implements.

use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use futures::{Stream, StreamExt, stream};
use serde::{Deserialize, Serialize};

use crate::message::{AssistantMessage, Messages, Usage};
use crate::tool::ToolSpec;

/// Everything a model needs for one call.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelRequest {
    /// The system prompt, sent the way each provider expects it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    /// The conversation so far, shared with the run it came from (see [`Messages`]).
    pub messages: Messages,
    /// Tools the model may call.
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    /// Sampling settings.
    #[serde(default)]
    pub settings: ModelSettings,
}

impl ModelRequest {
    /// Appends a section to the system prompt, separated from what is there by a blank line.
    pub fn push_system_section(&mut self, section: &str) {
        let section = section.trim();
        if section.is_empty() {
            return;
        }
        match &mut self.system_prompt {
            Some(prompt) if !prompt.is_empty() => {
                prompt.push_str("\n\n");
                prompt.push_str(section);
            }
            _ => self.system_prompt = Some(section.to_owned()),
        }
    }
}

/// Sampling settings; `None` leaves the provider's default.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelSettings {
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Cap on generated tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// Sequences that end generation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop_sequences: Vec<String>,
}

/// Why the model stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// Finished its turn.
    EndTurn,
    /// Wants tools to run.
    ToolUse,
    /// Hit the output token cap.
    MaxTokens,
    /// Produced a stop sequence.
    StopSequence,
    /// Refused or was filtered.
    ContentFilter,
    /// A provider-specific reason.
    Other(String),
}

/// A complete model answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// The assistant turn.
    pub message: AssistantMessage,
    /// Tokens used by this call.
    pub usage: Usage,
    /// Why generation stopped.
    pub stop_reason: StopReason,
}

/// One event of a streamed model call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum StreamEvent {
    /// A piece of assistant text.
    TextDelta {
        /// The new text.
        text: String,
    },
    /// A piece of the model's reasoning (thinking) text.
    ReasoningDelta {
        /// The new text.
        text: String,
    },
    /// A piece of a tool call; `id` and `name` arrive with its first delta.
    ToolCallDelta {
        /// Position of the call within the turn.
        index: usize,
        /// The call id, on the first delta.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// The tool name, on the first delta.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// The next piece of the JSON arguments.
        arguments_delta: String,
    },
    /// The call finished; carries the whole response assembled by the provider. A stream that
    /// ends without this event is broken.
    Completed(ModelResponse),
}

/// A streamed model call.
pub type ModelStream = Pin<Box<dyn Stream<Item = Result<StreamEvent, ModelError>> + Send>>;

/// Why a model call failed. Later layers act on the kind: retry, summarize, or give up.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    /// The provider asked us to slow down.
    #[error("rate limited by the provider{}: {message}", retry_hint(.retry_after))]
    RateLimited {
        /// How long the provider asked us to wait, when it said.
        retry_after: Option<Duration>,
        /// The provider's message.
        message: String,
    },
    /// The request does not fit the model's context window.
    #[error("the request exceeds the model's context window: {message}")]
    ContextWindowExceeded {
        /// The provider's message.
        message: String,
    },
    /// A failure that may pass on retry: network error, server error, broken stream.
    #[error("transient model error: {message}")]
    Transient {
        /// What happened.
        message: String,
    },
    /// The credentials were refused.
    #[error("authentication failed: {message}")]
    Authentication {
        /// The provider's message.
        message: String,
    },
    /// The provider rejected the request as malformed.
    #[error("invalid request: {message}")]
    InvalidRequest {
        /// The provider's message.
        message: String,
    },
    /// Anything else.
    #[error("{message}")]
    Other {
        /// What happened.
        message: String,
    },
}

fn retry_hint(retry_after: &Option<Duration>) -> String {
    match retry_after {
        Some(wait) => format!(" (retry after {} ms)", wait.as_millis()),
        None => String::new(),
    }
}

impl ModelError {
    /// Whether the same request may succeed if sent again.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::RateLimited { .. } | Self::Transient { .. })
    }

    /// A short snake_case name of the kind, for events and logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::RateLimited { .. } => "rate_limited",
            Self::ContextWindowExceeded { .. } => "context_window_exceeded",
            Self::Transient { .. } => "transient",
            Self::Authentication { .. } => "authentication",
            Self::InvalidRequest { .. } => "invalid_request",
            Self::Other { .. } => "other",
        }
    }
}

/// Limits of a model, so context management can compute its thresholds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelProfile {
    /// The context window: most tokens a request may hold (prompt, tools and history).
    pub max_input_tokens: u64,
    /// Most tokens the model may generate in one answer.
    pub max_output_tokens: u64,
}

/// Kinds of content besides text a model reads. Providers send each kind the model reads in
/// the shape its API takes and replace the others with a short note, so nothing vanishes
/// silently and the model can ask for the content another way.
///
/// Kept apart from [`ModelProfile`] so profiles written field by field stay valid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct InputModalities {
    /// Images (PNG, JPEG…).
    #[serde(default)]
    pub images: bool,
    /// PDF documents.
    #[serde(default)]
    pub pdfs: bool,
    /// Audio recordings.
    #[serde(default)]
    pub audio: bool,
    /// Video.
    #[serde(default)]
    pub video: bool,
}

impl InputModalities {
    /// Text only: every other kind becomes a note.
    pub const TEXT: Self = Self {
        images: false,
        pdfs: false,
        audio: false,
        video: false,
    };

    /// Every kind; what the API refuses still becomes a note.
    pub const ALL: Self = Self {
        images: true,
        pdfs: true,
        audio: true,
        video: true,
    };

    /// Images and PDFs, what most current hosted models read.
    pub const IMAGES_AND_PDFS: Self = Self {
        images: true,
        pdfs: true,
        audio: false,
        video: false,
    };
}

/// A language model.
///
/// Implement [`generate`](Model::generate); override [`stream`](Model::stream) when the provider
/// streams. The default `stream` emits the generated text as one delta, then the response.
#[async_trait]
pub trait Model: Send + Sync {
    /// The spec this model was made from, e.g. `anthropic:claude-sonnet-4-6`.
    fn id(&self) -> &str;

    /// The model's limits, when known.
    fn profile(&self) -> Option<ModelProfile> {
        None
    }

    /// The model's limits, asking its server when they are not known up front (a local
    /// server may say its context window). Asked once; the answer is kept and
    /// [`profile`](Model::profile) returns it from then on, so call this before building an
    /// agent whose thresholds should use it.
    async fn resolve_profile(&self) -> Option<ModelProfile> {
        self.profile()
    }

    /// The kinds of content besides text the model reads, when known. Providers already
    /// replace the others with notes; callers may use this to avoid producing them.
    fn input_modalities(&self) -> Option<InputModalities> {
        None
    }

    /// Answers a request in one piece.
    async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError>;

    /// Answers a request as a stream that ends with [`StreamEvent::Completed`].
    async fn stream(&self, request: &ModelRequest) -> Result<ModelStream, ModelError> {
        let response = self.generate(request).await?;
        let text = crate::content::joined_text(&response.message.content);
        let mut events = Vec::with_capacity(2);
        if !text.is_empty() {
            events.push(Ok(StreamEvent::TextDelta { text }));
        }
        events.push(Ok(StreamEvent::Completed(response)));
        Ok(Box::pin(stream::iter(events)))
    }
}

/// Drains a model stream, handing each delta to `on_delta`, and returns the completed response.
///
/// A stream that ends without [`StreamEvent::Completed`] is a [`ModelError::Transient`] error:
/// a silently truncated answer must never pass for a whole one.
pub async fn collect_stream(
    mut stream: ModelStream,
    mut on_delta: impl FnMut(&StreamEvent),
) -> Result<ModelResponse, ModelError> {
    while let Some(event) = stream.next().await {
        match event? {
            StreamEvent::Completed(response) => return Ok(response),
            delta => on_delta(&delta),
        }
    }
    Err(ModelError::Transient {
        message: "the model stream ended before its completion event; the answer is incomplete"
            .to_owned(),
    })
}
