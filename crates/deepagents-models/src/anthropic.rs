//! The Anthropic Messages API (`POST {base}/v1/messages`), with prompt caching and thinking
//! blocks kept for the next turn.

use std::collections::BTreeMap;

use deepagents_core::ContentBlock;
use deepagents_core::message::{AssistantMessage, Message, ToolCall, ToolStatus};
use deepagents_core::model::{
    InputModalities, ModelError, ModelRequest, ModelResponse, StopReason, StreamEvent,
};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::convert::{
    ApiMedia, Carried, Formats, Media, arguments_object, base64, carry, inline_schema,
    parse_arguments, text_with_notes, tokens, unreadable, usage,
};
use crate::encoded::{EncodeCache, assemble, encoding_failed};
use crate::http::Secret;
use crate::http::sse::SseEvent;
use crate::provider::{Decoder, Step, Wire, event_json, malformed};

/// The API version header every request carries.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The Messages wire format.
#[derive(Clone, Debug)]
pub struct AnthropicWire {
    /// Base URL without `/v1`, e.g. `https://api.anthropic.com`.
    pub base_url: String,
    /// Model name.
    pub model: String,
    /// `max_tokens` when the request sets none (the API requires one).
    pub default_max_tokens: u64,
    /// Mark the stable prefix and the latest turn for prompt caching.
    pub prompt_caching: bool,
    /// Extended thinking, with the effort's token budget.
    pub reasoning: Option<crate::provider::ReasoningEffort>,
    /// What the model reads besides text; other content becomes a note.
    pub modalities: InputModalities,
}

impl AnthropicWire {
    /// The request body: model, thinking, token limit and system prompt, the messages (the
    /// turns the cache holds copied, the rest encoded), the tools, then the settings.
    fn body(
        &self,
        request: &ModelRequest,
        stream: bool,
        cache: &mut EncodeCache,
    ) -> Result<Vec<u8>, serde_json::Error> {
        let (prefix, tools) = cache.parts(request.messages.version());
        // Consecutive messages of one role merge into one turn (the tool results of a step
        // share a user turn).
        let last = prefix.merge_turns(&request.messages, "content", |message| {
            message_blocks(message, self.modalities)
        })?;
        if let Some((role, mut blocks)) = last {
            if self.prompt_caching {
                // The latest turn: the next call reads everything up to here from the cache.
                if let Some(last) = blocks
                    .iter_mut()
                    .rev()
                    .find(|b| !matches!(b["type"].as_str(), Some("thinking" | "redacted_thinking")))
                {
                    last["cache_control"] = cache_control();
                }
            }
            // Not settled: the next request may merge into it, and it carries the mark.
            prefix.write_turn(role, "content", blocks)?;
        }
        let tools = tools.get(&request.tools, |tools| {
            let mut tools: Vec<Value> = tools
                .iter()
                .map(|tool| {
                    json!({
                        "name": tool.name,
                        "description": tool.description,
                        "input_schema": inline_schema(&tool.parameters),
                    })
                })
                .collect();
            if self.prompt_caching
                && let Some(last) = tools.last_mut()
            {
                last["cache_control"] = cache_control();
            }
            serde_json::value::to_raw_value(&tools)
        })?;
        let settings = &request.settings;
        let mut max_tokens = settings
            .max_output_tokens
            .map_or(self.default_max_tokens, u64::from);
        let thinking = self.reasoning.map(|effort| {
            let budget = effort.budget_tokens();
            // The budget counts against max_tokens, which must leave room for the answer.
            max_tokens = max_tokens.max(budget + 4_096);
            json!({"type": "enabled", "budget_tokens": budget})
        });
        let system = request
            .system_prompt
            .as_deref()
            .filter(|s| !s.is_empty())
            .map(|system| {
                let mut block = json!({"type": "text", "text": system});
                if self.prompt_caching {
                    block["cache_control"] = cache_control();
                }
                [block]
            });
        // Thinking refuses sampling changes; the settings give way to it.
        let sampling = self.reasoning.is_none();
        assemble(
            &Head {
                model: &self.model,
                thinking,
                max_tokens,
                system,
            },
            "messages",
            None::<&Value>,
            prefix.bytes(),
            &Tail {
                tools,
                temperature: settings
                    .temperature
                    .filter(|_| sampling)
                    .map(crate::provider::sampling),
                top_p: settings
                    .top_p
                    .filter(|_| sampling)
                    .map(crate::provider::sampling),
                stop_sequences: &settings.stop_sequences,
                stream: stream.then_some(true),
            },
        )
    }
}

fn cache_control() -> Value {
    json!({"type": "ephemeral"})
}

/// What precedes the messages in a request body.
#[derive(Serialize)]
struct Head<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<Value>,
    max_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<[Value; 1]>,
}

/// What follows the messages in a request body.
#[derive(Serialize)]
struct Tail<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop_sequences: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<bool>,
}

impl Wire for AnthropicWire {
    fn provider(&self) -> &str {
        "anthropic"
    }

    fn headers(&self) -> Vec<(String, String)> {
        vec![("anthropic-version".to_owned(), ANTHROPIC_VERSION.to_owned())]
    }

    fn secret_headers(&self, key: &Secret) -> Vec<(String, Secret)> {
        vec![("x-api-key".to_owned(), key.clone())]
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
        let body = self.body(request, stream, cache).map_err(encoding_failed)?;
        Ok((
            format!("{}/v1/messages", self.base_url.trim_end_matches('/')),
            body,
        ))
    }

    fn parse(&self, body: &Value) -> Result<ModelResponse, ModelError> {
        let Some(blocks) = body["content"].as_array() else {
            return Err(ModelError::Other {
                message: format!("anthropic sent a message without content: {body}"),
            });
        };
        let mut content = Vec::new();
        let mut tool_calls = Vec::new();
        for block in blocks {
            read_block(block, &mut content, &mut tool_calls);
        }
        Ok(ModelResponse {
            stop_reason: stop_reason(body["stop_reason"].as_str()),
            usage: anthropic_usage(&body["usage"], 0),
            message: AssistantMessage {
                content,
                tool_calls,
            },
        })
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(AnthropicDecoder::default())
    }
}

fn read_block(block: &Value, content: &mut Vec<ContentBlock>, calls: &mut Vec<ToolCall>) {
    match block["type"].as_str() {
        Some("text") => {
            let text = block["text"].as_str().unwrap_or_default();
            if !text.is_empty() {
                content.push(ContentBlock::text(text));
            }
        }
        Some("tool_use") => calls.push(ToolCall {
            id: block["id"].as_str().unwrap_or_default().to_owned(),
            name: block["name"].as_str().unwrap_or_default().to_owned(),
            arguments: block.get("input").cloned().unwrap_or_else(|| json!({})),
        }),
        Some("thinking") => content.push(ContentBlock::Reasoning {
            text: block["thinking"].as_str().unwrap_or_default().to_owned(),
            signature: block["signature"].as_str().map(str::to_owned),
            opaque: None,
        }),
        Some("redacted_thinking") => content.push(ContentBlock::Reasoning {
            text: String::new(),
            signature: None,
            opaque: Some(block.clone()),
        }),
        _ => {}
    }
}

/// Anthropic's `input_tokens` excludes cache reads and writes; ours includes them.
fn anthropic_usage(u: &Value, input_from_start: u64) -> deepagents_core::Usage {
    let read = tokens(u, "/cache_read_input_tokens");
    let written = tokens(u, "/cache_creation_input_tokens");
    let input = tokens(u, "/input_tokens").max(input_from_start);
    // Saturating: the counts are the server's, and their sum must not overflow.
    let input = input.saturating_add(read).saturating_add(written);
    deepagents_core::Usage {
        cache_write_input_tokens: written,
        ..usage(input, tokens(u, "/output_tokens"), read)
    }
}

fn stop_reason(reason: Option<&str>) -> StopReason {
    match reason {
        Some("end_turn") | None => StopReason::EndTurn,
        Some("tool_use") => StopReason::ToolUse,
        Some("max_tokens") => StopReason::MaxTokens,
        Some("stop_sequence") => StopReason::StopSequence,
        Some("refusal") => StopReason::ContentFilter,
        Some(other) => StopReason::Other(other.to_owned()),
    }
}

/// What Messages content takes besides text, in user turns and tool results alike.
const MEDIA: ApiMedia = ApiMedia {
    images: Some(Formats {
        mime_types: &["image/jpeg", "image/png", "image/gif", "image/webp"],
        names: "JPEG, PNG, GIF or WebP",
    }),
    pdfs: true,
    audio: None,
    video: None,
};

fn media_blocks(content: &[ContentBlock], modalities: InputModalities) -> Vec<Value> {
    content
        .iter()
        .filter_map(|block| carry(block, &MEDIA, modalities))
        .filter_map(|carried| match carried {
            // An empty text block is refused.
            Carried::Text(text) if text.is_empty() => None,
            Carried::Text(text) => Some(json!({"type": "text", "text": text})),
            Carried::Media {
                kind: kind @ (Media::Image | Media::Pdf),
                mime_type,
                data,
            } => Some(json!({
                "type": if kind == Media::Image { "image" } else { "document" },
                "source": {"type": "base64", "media_type": mime_type, "data": base64(data)},
            })),
            // `MEDIA` lets no other kind through; a note beats a panic.
            Carried::Media {
                kind,
                mime_type,
                data,
            } => Some(json!({"type": "text", "text": unreadable(kind, &mime_type, data.len())})),
        })
        .collect()
}

/// The role and content blocks of one message; neighbouring messages of one role merge
/// into one turn.
fn message_blocks(message: &Message, modalities: InputModalities) -> (&'static str, Vec<Value>) {
    match message {
        // Messages has no system role mid-conversation; the text goes in a user turn.
        Message::System { content } => (
            "user",
            vec![
                json!({"type": "text", "text": format!("<system>{}</system>", text_with_notes(content, modalities))}),
            ],
        ),
        Message::User { content } => ("user", media_blocks(content, modalities)),
        Message::Assistant(assistant) => {
            let mut blocks = Vec::new();
            for block in &assistant.content {
                match block {
                    ContentBlock::Reasoning {
                        text,
                        signature: Some(signature),
                        ..
                    } => blocks.push(
                        json!({"type": "thinking", "thinking": text, "signature": signature}),
                    ),
                    ContentBlock::Reasoning {
                        opaque: Some(item), ..
                    } if item["type"] == "redacted_thinking" => blocks.push(item.clone()),
                    ContentBlock::Text { text } if !text.is_empty() => {
                        blocks.push(json!({"type": "text", "text": text}));
                    }
                    _ => {}
                }
            }
            for call in &assistant.tool_calls {
                blocks.push(json!({
                    "type": "tool_use", "id": call.id, "name": call.name,
                    "input": arguments_object(call),
                }));
            }
            ("assistant", blocks)
        }
        Message::Tool(result) => {
            let mut block = json!({
                "type": "tool_result",
                "tool_use_id": result.tool_call_id,
            });
            // An empty text block is refused; an empty result simply has no content.
            let content = media_blocks(&result.content, modalities);
            if !content.is_empty() {
                block["content"] = Value::Array(content);
            }
            if result.status == ToolStatus::Error {
                block["is_error"] = json!(true);
            }
            ("user", vec![block])
        }
    }
}

#[derive(Debug)]
enum Partial {
    Text(String),
    Tool {
        id: String,
        name: String,
        json: String,
        position: usize,
    },
    Thinking {
        text: String,
        signature: String,
    },
    Other(Value),
}

#[derive(Debug, Default)]
struct AnthropicDecoder {
    blocks: BTreeMap<u64, Partial>,
    tools: usize,
    start_usage: Value,
    end_usage: Value,
    stop_reason: Option<String>,
}

const PROVIDER: &str = "anthropic";

impl Decoder for AnthropicDecoder {
    fn event(&mut self, event: &SseEvent) -> Result<Step, ModelError> {
        let mut step = Step::default();
        let data = event_json(PROVIDER, event)?;
        let kind = data["type"].as_str().unwrap_or(event.event.as_str());
        match kind {
            "message_start" => {
                self.start_usage = data["message"]["usage"].clone();
            }
            "content_block_start" => {
                let index = data["index"]
                    .as_u64()
                    .ok_or_else(|| malformed(PROVIDER, event, "no `index`"))?;
                let block = &data["content_block"];
                let partial = match block["type"].as_str() {
                    Some("text") => {
                        let text = block["text"].as_str().unwrap_or_default().to_owned();
                        if !text.is_empty() {
                            step.deltas
                                .push(StreamEvent::TextDelta { text: text.clone() });
                        }
                        Partial::Text(text)
                    }
                    Some("tool_use") => {
                        let position = self.tools;
                        self.tools += 1;
                        let id = block["id"].as_str().unwrap_or_default().to_owned();
                        let name = block["name"].as_str().unwrap_or_default().to_owned();
                        step.deltas.push(StreamEvent::ToolCallDelta {
                            index: position,
                            id: Some(id.clone()),
                            name: Some(name.clone()),
                            arguments_delta: String::new(),
                        });
                        Partial::Tool {
                            id,
                            name,
                            json: String::new(),
                            position,
                        }
                    }
                    Some("thinking") => {
                        let text = block["thinking"].as_str().unwrap_or_default().to_owned();
                        if !text.is_empty() {
                            step.deltas
                                .push(StreamEvent::ReasoningDelta { text: text.clone() });
                        }
                        Partial::Thinking {
                            text,
                            signature: block["signature"].as_str().unwrap_or_default().to_owned(),
                        }
                    }
                    _ => Partial::Other(block.clone()),
                };
                self.blocks.insert(index, partial);
            }
            "content_block_delta" => {
                let index = data["index"].as_u64().unwrap_or_default();
                let delta = &data["delta"];
                let Some(partial) = self.blocks.get_mut(&index) else {
                    return Err(malformed(
                        PROVIDER,
                        event,
                        "delta for a block that never started",
                    ));
                };
                match (delta["type"].as_str(), partial) {
                    (Some("text_delta"), Partial::Text(text)) => {
                        let piece = delta["text"].as_str().unwrap_or_default();
                        text.push_str(piece);
                        step.deltas.push(StreamEvent::TextDelta {
                            text: piece.to_owned(),
                        });
                    }
                    (Some("input_json_delta"), Partial::Tool { json, position, .. }) => {
                        let piece = delta["partial_json"].as_str().unwrap_or_default();
                        json.push_str(piece);
                        step.deltas.push(StreamEvent::ToolCallDelta {
                            index: *position,
                            id: None,
                            name: None,
                            arguments_delta: piece.to_owned(),
                        });
                    }
                    (Some("thinking_delta"), Partial::Thinking { text, .. }) => {
                        let piece = delta["thinking"].as_str().unwrap_or_default();
                        text.push_str(piece);
                        if !piece.is_empty() {
                            step.deltas.push(StreamEvent::ReasoningDelta {
                                text: piece.to_owned(),
                            });
                        }
                    }
                    // The signature only verifies the thinking; it is not text to show.
                    (Some("signature_delta"), Partial::Thinking { signature, .. }) => {
                        signature.push_str(delta["signature"].as_str().unwrap_or_default());
                    }
                    (Some("citations_delta"), _) => {}
                    (other, _) => {
                        return Err(malformed(
                            PROVIDER,
                            event,
                            format!("delta type {other:?} does not fit its block"),
                        ));
                    }
                }
            }
            "content_block_stop" | "ping" => {}
            "message_delta" => {
                if let Some(reason) = data["delta"]["stop_reason"].as_str() {
                    self.stop_reason = Some(reason.to_owned());
                }
                self.end_usage = data["usage"].clone();
            }
            "message_stop" => {
                step.done = Some(self.finish());
            }
            "error" => {
                let error = &data["error"];
                let text = error.to_string().to_ascii_lowercase();
                let status = match error["type"].as_str() {
                    Some("overloaded_error") => 529,
                    Some("rate_limit_error") => 429,
                    Some("api_error") => 500,
                    Some("invalid_request_error") => 400,
                    _ if crate::http::is_context_overflow(&text) => 400,
                    _ => 500,
                };
                return Err(crate::http::classify_error(
                    PROVIDER,
                    status,
                    &[],
                    &data.to_string(),
                ));
            }
            _ => {}
        }
        Ok(step)
    }
}

impl AnthropicDecoder {
    fn finish(&mut self) -> ModelResponse {
        let mut content = Vec::new();
        let mut tool_calls = Vec::new();
        for partial in std::mem::take(&mut self.blocks).into_values() {
            match partial {
                Partial::Text(text) if !text.is_empty() => content.push(ContentBlock::text(text)),
                Partial::Tool { id, name, json, .. } => tool_calls.push(ToolCall {
                    id,
                    name,
                    arguments: parse_arguments(&json),
                }),
                Partial::Thinking { text, signature } => content.push(ContentBlock::Reasoning {
                    text,
                    signature: (!signature.is_empty()).then_some(signature),
                    opaque: None,
                }),
                Partial::Other(block) if block["type"] == "redacted_thinking" => {
                    content.push(ContentBlock::Reasoning {
                        text: String::new(),
                        signature: None,
                        opaque: Some(block),
                    });
                }
                _ => {}
            }
        }
        // message_start carries the prompt side, message_delta the cumulative output side.
        let mut merged = self.start_usage.clone();
        if let (Some(merged), Some(end)) = (merged.as_object_mut(), self.end_usage.as_object()) {
            for (k, v) in end {
                if !v.is_null() {
                    merged.insert(k.clone(), v.clone());
                }
            }
        }
        ModelResponse {
            message: AssistantMessage {
                content,
                tool_calls,
            },
            usage: anthropic_usage(&merged, 0),
            stop_reason: stop_reason(self.stop_reason.as_deref()),
        }
    }
}
