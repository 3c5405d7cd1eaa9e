//! The OpenAI Chat Completions API (`POST {base}/chat/completions`), also spoken by Ollama,
//! OpenRouter, vLLM, llama.cpp's server, LM Studio, DeepSeek, Groq and others.

use std::borrow::Cow;
use std::collections::BTreeMap;

use deepagents_core::ContentBlock;
use deepagents_core::message::{AssistantMessage, Message, ToolCall};
use deepagents_core::model::{
    InputModalities, ModelError, ModelRequest, ModelResponse, StopReason, StreamEvent,
};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::convert::{
    ApiMedia, Carried, Formats, Media, OPENAI_IMAGES, arguments_text, base64, carry, data_url,
    inline_schema, parse_arguments, text_and_media, text_with_notes, tokens, unreadable, usage,
};
use crate::encoded::{EncodeCache, assemble, encoding_failed};
use crate::http::sse::SseEvent;
use crate::provider::{Decoder, Step, Wire, event_json, malformed};

/// The Chat Completions wire format.
#[derive(Clone, Debug)]
pub struct ChatWire {
    /// Provider name for messages.
    pub provider: String,
    /// Base URL, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Model name.
    pub model: String,
    /// Ask for usage in streams (`stream_options.include_usage`).
    pub stream_usage: bool,
    /// Extra headers (OpenRouter's attribution headers).
    pub extra_headers: Vec<(String, String)>,
    /// `reasoning_effort` for reasoning models; unset leaves the server's default.
    pub reasoning: Option<crate::provider::ReasoningEffort>,
    /// What the model reads besides text; other content becomes a note.
    pub modalities: InputModalities,
    /// Cap on one answer's tokens for requests whose settings name none (the configured
    /// output limit); unset sends none and leaves the server's default.
    pub max_output_tokens: Option<u32>,
    /// Send the cap as `max_tokens`, the name llama.cpp's server, vLLM, Ollama, LM Studio,
    /// OpenRouter, DeepSeek and most other servers of this API read, instead of OpenAI's
    /// `max_completion_tokens` (which OpenAI's reasoning models require; `max_tokens` is
    /// deprecated there).
    pub legacy_max_tokens: bool,
}

impl ChatWire {
    fn url(&self) -> String {
        format!("{}/chat/completions", self.base_url.trim_end_matches('/'))
    }

    /// The request body: the model, the messages (those the cache holds copied, the rest
    /// encoded), the tools, then the settings.
    fn body(
        &self,
        request: &ModelRequest,
        stream: bool,
        cache: &mut EncodeCache,
    ) -> Result<Vec<u8>, serde_json::Error> {
        let (prefix, tools) = cache.parts(request.messages.version());
        let from = prefix.messages();
        for unit in conversation(&request.messages[from..], self.modalities) {
            match unit {
                Unit::Message(message) => {
                    prefix.buffer().push(b',');
                    serde_json::to_writer(prefix.buffer(), &message)?;
                }
                Unit::Settled(count) => prefix.settle(from + count),
            }
        }
        let tools = tools.get(&request.tools, |tools| {
            let tools: Vec<Value> = tools
                .iter()
                .map(|tool| {
                    json!({"type": "function", "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": inline_schema(&tool.parameters),
                    }})
                })
                .collect();
            serde_json::value::to_raw_value(&tools)
        })?;
        let settings = &request.settings;
        let limit = settings.max_output_tokens.or(self.max_output_tokens);
        let system = request
            .system_prompt
            .as_deref()
            .filter(|s| !s.is_empty())
            .map(|system| ChatMessage::System {
                content: Cow::Borrowed(system),
            });
        assemble(
            &Head { model: &self.model },
            "messages",
            system.as_ref(),
            prefix.bytes(),
            &Tail {
                tool_choice: tools.map(|_| "auto"),
                tools,
                temperature: settings.temperature.map(crate::provider::sampling),
                top_p: settings.top_p.map(crate::provider::sampling),
                max_completion_tokens: limit.filter(|_| !self.legacy_max_tokens),
                max_tokens: limit.filter(|_| self.legacy_max_tokens),
                stop: &settings.stop_sequences,
                reasoning_effort: self.reasoning.map(|effort| effort.as_str()),
                stream: stream.then_some(true),
                stream_options: (stream && self.stream_usage).then_some(StreamOptions {
                    include_usage: true,
                }),
            },
        )
    }
}

/// What precedes the messages in a request body.
#[derive(Serialize)]
struct Head<'a> {
    model: &'a str,
}

/// What follows the messages in a request body.
#[derive(Serialize)]
struct Tail<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
    /// `"auto"` whenever tools go: the API's default, but some OpenAI-compatible servers
    /// ignore the tools unless it is said.
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_completion_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_effort: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// One message of the conversation as the API takes it, borrowing what it can.
#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum ChatMessage<'a> {
    System {
        content: Cow<'a, str>,
    },
    User {
        content: UserContent<'a>,
    },
    Assistant {
        /// `null` when the message is only tool calls.
        content: Option<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ChatCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: String,
    },
}

/// Plain text goes as a string, which every server speaking this API takes; anything else
/// as content parts.
#[derive(Serialize)]
#[serde(untagged)]
enum UserContent<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<Value>),
}

#[derive(Serialize)]
struct ChatCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: ChatFunction<'a>,
}

#[derive(Serialize)]
struct ChatFunction<'a> {
    name: &'a str,
    arguments: Cow<'a, str>,
}

impl<'a> ChatCall<'a> {
    fn of(call: &'a ToolCall) -> Self {
        Self {
            id: &call.id,
            kind: "function",
            function: ChatFunction {
                name: &call.name,
                arguments: arguments_text(call),
            },
        }
    }
}

impl Wire for ChatWire {
    fn provider(&self) -> &str {
        &self.provider
    }

    fn headers(&self) -> Vec<(String, String)> {
        self.extra_headers.clone()
    }

    fn modalities(&self) -> Option<InputModalities> {
        Some(self.modalities)
    }

    fn encode(
        &self,
        request: &ModelRequest,
        stream: bool,
        cache: &mut EncodeCache,
    ) -> Result<(String, Vec<u8>), ModelError> {
        // Straight from the typed messages, and only those the cache does not hold.
        let body = self.body(request, stream, cache).map_err(encoding_failed)?;
        Ok((self.url(), body))
    }

    fn parse(&self, body: &Value) -> Result<ModelResponse, ModelError> {
        let Some(choice) = body.pointer("/choices/0") else {
            return Err(ModelError::Other {
                message: format!("{} sent a response without choices: {body}", self.provider),
            });
        };
        let message = &choice["message"];
        let mut content = Vec::new();
        if let Some(reasoning) = reasoning_text(message) {
            content.push(ContentBlock::Reasoning {
                text: reasoning.to_owned(),
                signature: None,
                opaque: None,
            });
        }
        if let Some(text) = message["content"].as_str()
            && !text.is_empty()
        {
            content.push(ContentBlock::text(text));
        }
        let tool_calls = message["tool_calls"]
            .as_array()
            .map(|calls| {
                calls
                    .iter()
                    .map(|call| ToolCall {
                        id: call["id"].as_str().unwrap_or_default().to_owned(),
                        name: call["function"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        arguments: parse_arguments(
                            call["function"]["arguments"].as_str().unwrap_or_default(),
                        ),
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        let stop_reason = stop_reason(choice["finish_reason"].as_str(), !tool_calls.is_empty());
        Ok(ModelResponse {
            message: AssistantMessage {
                content,
                tool_calls,
            },
            usage: chat_usage(&body["usage"]),
            stop_reason,
        })
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(ChatDecoder {
            provider: self.provider.clone(),
            ..ChatDecoder::default()
        })
    }
}

fn reasoning_text(message: &Value) -> Option<&str> {
    // DeepSeek and vLLM say `reasoning_content`, OpenRouter and Ollama `reasoning`.
    message["reasoning_content"]
        .as_str()
        .or_else(|| message["reasoning"].as_str())
        .filter(|t| !t.is_empty())
}

fn chat_usage(usage_json: &Value) -> deepagents_core::Usage {
    usage(
        tokens(usage_json, "/prompt_tokens"),
        tokens(usage_json, "/completion_tokens"),
        tokens(usage_json, "/prompt_tokens_details/cached_tokens"),
    )
}

fn stop_reason(finish: Option<&str>, has_calls: bool) -> StopReason {
    // A cut-off or filtered turn says so even when it holds (possibly partial) tool calls.
    match finish {
        Some("length") => StopReason::MaxTokens,
        Some("content_filter") => StopReason::ContentFilter,
        _ if has_calls => StopReason::ToolUse,
        Some("stop") | None => StopReason::EndTurn,
        Some("tool_calls" | "function_call") => StopReason::ToolUse,
        Some(other) => StopReason::Other(other.to_owned()),
    }
}

/// What a Chat Completions user message takes besides text; tool messages take text only.
const MEDIA: ApiMedia = ApiMedia {
    images: Some(OPENAI_IMAGES),
    pdfs: true,
    audio: Some(Formats {
        mime_types: &["audio/wav", "audio/mpeg"],
        names: "WAV or MP3",
    }),
    video: None,
};

fn part(carried: Carried<'_>) -> Value {
    match carried {
        Carried::Text(text) => json!({"type": "text", "text": text}),
        Carried::Media {
            kind: Media::Image,
            mime_type,
            data,
        } => json!({"type": "image_url", "image_url": {"url": data_url(&mime_type, data)}}),
        Carried::Media {
            kind: Media::Pdf,
            mime_type,
            data,
        } => json!({"type": "file", "file": {
            "filename": "document.pdf",
            "file_data": data_url(&mime_type, data),
        }}),
        Carried::Media {
            kind: Media::Audio,
            mime_type,
            data,
        } => {
            let format = if mime_type == "audio/wav" {
                "wav"
            } else {
                "mp3"
            };
            json!({"type": "input_audio", "input_audio": {"data": base64(data), "format": format}})
        }
        // No video part exists; `MEDIA` never lets one through, but a note beats a panic.
        Carried::Media {
            kind,
            mime_type,
            data,
        } => json!({"type": "text", "text": unreadable(kind, &mime_type, data.len())}),
    }
}

fn user_parts(content: &[ContentBlock], modalities: InputModalities) -> UserContent<'_> {
    let mut carried: Vec<Carried<'_>> = content
        .iter()
        .filter_map(|block| carry(block, &MEDIA, modalities))
        .collect();
    if let [Carried::Text(_)] = carried.as_slice()
        && let Some(Carried::Text(text)) = carried.pop()
    {
        return UserContent::Text(text);
    }
    UserContent::Parts(carried.into_iter().map(part).collect())
}

/// Media tool results returned, waiting for the user message that carries it: `(tool name,
/// call id, media)` per result that had any.
type Attachments<'a> = Vec<(&'a str, &'a str, Vec<Carried<'a>>)>;

/// A step of encoding a conversation: a message to send, or the count of conversation
/// messages whose encoding is complete (nothing of theirs waits for a later message).
enum Unit<'a> {
    Message(ChatMessage<'a>),
    Settled(usize),
}

/// The messages to send for `messages`, in order, with a [`Unit::Settled`] after each
/// message that leaves nothing waiting.
fn conversation(messages: &[Message], modalities: InputModalities) -> Vec<Unit<'_>> {
    let mut out = Vec::with_capacity(messages.len() * 2);
    // Tool messages take text only. Rather than replace a tool's image, PDF or audio with a
    // note (the reference harness's way), it follows in a user message right after the step's
    // tool messages, where the API takes it: a model that reads it still gets to. The tool
    // message keeps a line saying so, and kinds the model cannot read become notes there.
    let mut pending: Attachments<'_> = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        if !matches!(message, Message::Tool(_)) && !pending.is_empty() {
            out.push(Unit::Message(attachments(&mut pending)));
        }
        let unit = match message {
            Message::System { content } => ChatMessage::System {
                content: Cow::Owned(text_with_notes(content, modalities)),
            },
            Message::User { content } => ChatMessage::User {
                content: user_parts(content, modalities),
            },
            Message::Assistant(assistant) => {
                let text = deepagents_core::content::joined_text(&assistant.content);
                ChatMessage::Assistant {
                    content: (!text.is_empty() || assistant.tool_calls.is_empty()).then_some(text),
                    tool_calls: assistant.tool_calls.iter().map(ChatCall::of).collect(),
                }
            }
            Message::Tool(result) => {
                let (text, media) = text_and_media(&result.content, &MEDIA, modalities, true);
                if !media.is_empty() {
                    pending.push((&result.name, &result.tool_call_id, media));
                }
                ChatMessage::Tool {
                    tool_call_id: &result.tool_call_id,
                    content: text,
                }
            }
        };
        out.push(Unit::Message(unit));
        if pending.is_empty() {
            out.push(Unit::Settled(index + 1));
        }
    }
    if !pending.is_empty() {
        out.push(Unit::Message(attachments(&mut pending)));
    }
    out
}

/// The user message that carries the media of the tool results before it.
fn attachments<'a>(pending: &mut Attachments<'a>) -> ChatMessage<'a> {
    let mut parts = Vec::new();
    for (name, id, media) in pending.drain(..) {
        parts.push(
            json!({"type": "text", "text": format!("Attachments of the {name} result ({id}):")}),
        );
        parts.extend(media.into_iter().map(part));
    }
    ChatMessage::User {
        content: UserContent::Parts(parts),
    }
}

#[derive(Debug, Default)]
struct PartialCall {
    /// The call's position in the turn: the order its first delta arrived in.
    position: usize,
    id: String,
    name: String,
    arguments: String,
}

#[derive(Debug, Default)]
struct ChatDecoder {
    provider: String,
    text: String,
    reasoning: String,
    /// Calls by the server's `index`, which is only a key: it may be any number, so it is
    /// never used to size or index anything.
    calls: BTreeMap<u64, PartialCall>,
    finish: Option<String>,
    usage: Option<Value>,
}

impl Decoder for ChatDecoder {
    fn event(&mut self, event: &SseEvent) -> Result<Step, ModelError> {
        let mut step = Step::default();
        if event.data.trim() == "[DONE]" {
            let mut partials: Vec<PartialCall> =
                std::mem::take(&mut self.calls).into_values().collect();
            // In the order the deltas numbered them, so delta `index` i is call i.
            partials.sort_by_key(|c| c.position);
            let calls: Vec<ToolCall> = partials
                .into_iter()
                .map(|c| ToolCall {
                    id: c.id,
                    name: c.name,
                    arguments: parse_arguments(&c.arguments),
                })
                .collect();
            let mut content = Vec::new();
            if !self.reasoning.is_empty() {
                content.push(ContentBlock::Reasoning {
                    text: std::mem::take(&mut self.reasoning),
                    signature: None,
                    opaque: None,
                });
            }
            if !self.text.is_empty() {
                content.push(ContentBlock::text(std::mem::take(&mut self.text)));
            }
            let stop_reason = stop_reason(self.finish.as_deref(), !calls.is_empty());
            step.done = Some(ModelResponse {
                message: AssistantMessage {
                    content,
                    tool_calls: calls,
                },
                usage: chat_usage(self.usage.as_ref().unwrap_or(&Value::Null)),
                stop_reason,
            });
            return Ok(step);
        }
        let chunk = event_json(&self.provider, event)?;
        if let Some(error) = chunk.get("error") {
            return Err(stream_error(&self.provider, error));
        }
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(u.clone());
        }
        let Some(choices) = chunk.get("choices").and_then(Value::as_array) else {
            if chunk.get("usage").is_some() || chunk.get("id").is_some() {
                return Ok(step);
            }
            return Err(malformed(&self.provider, event, "no `choices`"));
        };
        for choice in choices {
            let delta = &choice["delta"];
            if let Some(reasoning) = reasoning_text(delta) {
                self.reasoning.push_str(reasoning);
                step.deltas.push(StreamEvent::ReasoningDelta {
                    text: reasoning.to_owned(),
                });
            }
            if let Some(text) = delta["content"].as_str()
                && !text.is_empty()
            {
                self.text.push_str(text);
                step.deltas.push(StreamEvent::TextDelta {
                    text: text.to_owned(),
                });
            }
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                let count = self.calls.len();
                let wire_index = call["index"]
                    .as_u64()
                    .unwrap_or_else(|| u64::try_from(count).unwrap_or(u64::MAX));
                let partial = self.calls.entry(wire_index).or_insert_with(|| PartialCall {
                    position: count,
                    ..PartialCall::default()
                });
                let position = partial.position;
                let id = call["id"].as_str().filter(|s| !s.is_empty());
                let name = call["function"]["name"].as_str().filter(|s| !s.is_empty());
                if let Some(id) = id {
                    id.clone_into(&mut partial.id);
                }
                if let Some(name) = name {
                    partial.name.push_str(name);
                }
                let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
                partial.arguments.push_str(arguments);
                step.deltas.push(StreamEvent::ToolCallDelta {
                    index: position,
                    id: id.map(str::to_owned),
                    name: name.map(str::to_owned),
                    arguments_delta: arguments.to_owned(),
                });
            }
            if let Some(finish) = choice["finish_reason"].as_str() {
                self.finish = Some(finish.to_owned());
            }
        }
        Ok(step)
    }
}

/// An error object sent inside a stream.
pub fn stream_error(provider: &str, error: &Value) -> ModelError {
    let body = json!({ "error": error }).to_string();
    let lower = body.to_ascii_lowercase();
    let status = match error["code"].as_u64() {
        Some(code) if (400..600).contains(&code) => code as u16,
        _ if lower.contains("rate_limit") => 429,
        _ if crate::http::is_context_overflow(&lower) => 400,
        _ if lower.contains("invalid_request") => 400,
        _ => 500,
    };
    crate::http::classify_error(provider, status, &[], &body)
}
