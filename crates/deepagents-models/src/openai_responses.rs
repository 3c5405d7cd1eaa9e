//! The OpenAI Responses API (`POST {base}/responses`), OpenAI's default. Reasoning items are
//! kept and sent back so reasoning models keep their chain of thought across tool calls.

use std::collections::BTreeMap;

use deepagents_core::ContentBlock;
use deepagents_core::content::joined_text;
use deepagents_core::message::{AssistantMessage, Message, ToolCall};
use deepagents_core::model::{
    InputModalities, ModelError, ModelRequest, ModelResponse, StopReason, StreamEvent,
};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::convert::{
    ApiMedia, Carried, Media, OPENAI_IMAGES, arguments_text, carry, data_url, inline_schema,
    parse_arguments, text_with_notes, tokens, unreadable, usage,
};
use crate::encoded::{EncodeCache, assemble, encoding_failed};
use crate::http::sse::SseEvent;
use crate::provider::{Decoder, Step, Wire, event_json, malformed};

/// The Responses wire format.
#[derive(Clone, Debug)]
pub struct ResponsesWire {
    /// Provider name for messages.
    pub provider: String,
    /// Base URL, e.g. `https://api.openai.com/v1`.
    pub base_url: String,
    /// Model name.
    pub model: String,
    /// Reasoning effort; when set, reasoning summaries and encrypted reasoning are asked for
    /// so they can be kept and sent back.
    pub reasoning: Option<crate::provider::ReasoningEffort>,
    /// What the model reads besides text; other content becomes a note.
    pub modalities: InputModalities,
    /// Cap on one answer's tokens for requests whose settings name none (the configured
    /// output limit); unset sends none.
    pub max_output_tokens: Option<u32>,
}

impl ResponsesWire {
    /// The request body: model and instructions, the input items (those the cache holds
    /// copied, the rest encoded), the tools, then the settings.
    fn body(
        &self,
        request: &ModelRequest,
        stream: bool,
        cache: &mut EncodeCache,
    ) -> Result<Vec<u8>, serde_json::Error> {
        let (prefix, tools) = cache.parts(request.messages.version());
        let from = prefix.messages();
        let mut items = Vec::new();
        for (offset, message) in request.messages[from..].iter().enumerate() {
            items.clear();
            message_items(message, self.modalities, &mut items);
            for item in &items {
                prefix.buffer().push(b',');
                serde_json::to_writer(prefix.buffer(), item)?;
            }
            prefix.settle(from + offset + 1);
        }
        let tools = tools.get(&request.tools, |tools| {
            let tools: Vec<Value> = tools
                .iter()
                .map(|tool| {
                    json!({
                        "type": "function",
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": inline_schema(&tool.parameters),
                        "strict": false,
                    })
                })
                .collect();
            serde_json::value::to_raw_value(&tools)
        })?;
        let settings = &request.settings;
        let reasoning = self
            .reasoning
            .map(|effort| json!({"effort": effort.as_str(), "summary": "auto"}));
        assemble(
            &Head {
                model: &self.model,
                instructions: request.system_prompt.as_deref().filter(|s| !s.is_empty()),
            },
            "input",
            None::<&Value>,
            prefix.bytes(),
            &Tail {
                tool_choice: tools.map(|_| "auto"),
                tools,
                temperature: settings.temperature.map(crate::provider::sampling),
                top_p: settings.top_p.map(crate::provider::sampling),
                max_output_tokens: settings.max_output_tokens.or(self.max_output_tokens),
                include: reasoning.as_ref().map(|_| ["reasoning.encrypted_content"]),
                reasoning,
                stream: stream.then_some(true),
            },
        )
    }
}

/// What precedes the input items in a request body.
#[derive(Serialize)]
struct Head<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a str>,
}

/// What follows the input items in a request body.
#[derive(Serialize)]
struct Tail<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
    /// `"auto"` whenever tools go, never without them.
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    include: Option<[&'static str; 1]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream: Option<bool>,
}

impl Wire for ResponsesWire {
    fn provider(&self) -> &str {
        &self.provider
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
            format!("{}/responses", self.base_url.trim_end_matches('/')),
            body,
        ))
    }

    fn parse(&self, body: &Value) -> Result<ModelResponse, ModelError> {
        if let Some(error) = body.get("error").filter(|e| !e.is_null()) {
            return Err(crate::openai_chat::stream_error(&self.provider, error));
        }
        let Some(output) = body["output"].as_array() else {
            return Err(ModelError::Other {
                message: format!("{} sent a response without output: {body}", self.provider),
            });
        };
        Ok(response_from(body, output))
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(ResponsesDecoder {
            provider: self.provider.clone(),
            ..ResponsesDecoder::default()
        })
    }
}

fn response_from(body: &Value, output: &[Value]) -> ModelResponse {
    let mut content = Vec::new();
    let mut tool_calls = Vec::new();
    for item in output {
        match item["type"].as_str() {
            Some("message") => {
                for part in item["content"].as_array().into_iter().flatten() {
                    match part["type"].as_str() {
                        Some("output_text") => {
                            let text = part["text"].as_str().unwrap_or_default();
                            if !text.is_empty() {
                                content.push(ContentBlock::text(text));
                            }
                        }
                        Some("refusal") => content.push(ContentBlock::text(
                            part["refusal"].as_str().unwrap_or_default(),
                        )),
                        _ => {}
                    }
                }
            }
            Some("function_call") => tool_calls.push(ToolCall {
                id: item["call_id"].as_str().unwrap_or_default().to_owned(),
                name: item["name"].as_str().unwrap_or_default().to_owned(),
                arguments: parse_arguments(item["arguments"].as_str().unwrap_or_default()),
            }),
            Some("reasoning") => {
                let summary: Vec<&str> = item["summary"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s["text"].as_str())
                    .collect();
                content.push(ContentBlock::Reasoning {
                    text: summary.join("\n\n"),
                    signature: None,
                    opaque: Some(item.clone()),
                });
            }
            _ => {}
        }
    }
    let u = &body["usage"];
    let stop_reason = match (
        body["status"].as_str(),
        body["incomplete_details"]["reason"].as_str(),
    ) {
        // A cut-off or filtered turn says so even when it holds (possibly partial) calls.
        (Some("incomplete"), Some("max_output_tokens")) => StopReason::MaxTokens,
        (Some("incomplete"), Some("content_filter")) => StopReason::ContentFilter,
        _ if !tool_calls.is_empty() => StopReason::ToolUse,
        (Some("incomplete"), Some(other)) => StopReason::Other(other.to_owned()),
        _ => StopReason::EndTurn,
    };
    ModelResponse {
        message: AssistantMessage {
            content,
            tool_calls,
        },
        usage: usage(
            tokens(u, "/input_tokens"),
            tokens(u, "/output_tokens"),
            tokens(u, "/input_tokens_details/cached_tokens"),
        ),
        stop_reason,
    }
}

/// What Responses input takes besides text, in messages and function call outputs alike.
const MEDIA: ApiMedia = ApiMedia {
    images: Some(OPENAI_IMAGES),
    pdfs: true,
    audio: None,
    video: None,
};

fn input_parts(content: &[ContentBlock], modalities: InputModalities) -> Vec<Value> {
    content
        .iter()
        .filter_map(|block| carry(block, &MEDIA, modalities))
        .map(|carried| match carried {
            Carried::Text(text) => json!({"type": "input_text", "text": text}),
            Carried::Media {
                kind: Media::Image,
                mime_type,
                data,
            } => json!({"type": "input_image", "image_url": data_url(&mime_type, data)}),
            Carried::Media {
                kind: Media::Pdf,
                mime_type,
                data,
            } => json!({
                "type": "input_file",
                "filename": "document.pdf",
                "file_data": data_url(&mime_type, data),
            }),
            // `MEDIA` lets no other kind through; a note beats a panic.
            Carried::Media {
                kind,
                mime_type,
                data,
            } => json!({"type": "input_text", "text": unreadable(kind, &mime_type, data.len())}),
        })
        .collect()
}

/// The input items of one message, appended to `out`: each message's items stand on their
/// own, so those of earlier requests are reused as encoded.
fn message_items(message: &Message, modalities: InputModalities, out: &mut Vec<Value>) {
    {
        match message {
            Message::System { content } => {
                out.push(
                    json!({"role": "system", "content": text_with_notes(content, modalities)}),
                );
            }
            Message::User { content } => {
                out.push(json!({"role": "user", "content": input_parts(content, modalities)}));
            }
            Message::Assistant(assistant) => {
                for block in &assistant.content {
                    match block {
                        ContentBlock::Reasoning {
                            opaque: Some(item), ..
                        } if item["type"] == "reasoning" => out.push(item.clone()),
                        ContentBlock::Text { text } if !text.is_empty() => {
                            out.push(json!({"role": "assistant", "content": text}));
                        }
                        _ => {}
                    }
                }
                for call in &assistant.tool_calls {
                    out.push(json!({
                        "type": "function_call",
                        "call_id": call.id,
                        "name": call.name,
                        "arguments": arguments_text(call),
                    }));
                }
            }
            Message::Tool(result) => {
                let output = if result.content.iter().all(|b| b.as_text().is_some()) {
                    json!(joined_text(&result.content))
                } else {
                    Value::Array(input_parts(&result.content, modalities))
                };
                out.push(json!({
                    "type": "function_call_output",
                    "call_id": result.tool_call_id,
                    "output": output,
                }));
            }
        }
    }
}

#[derive(Debug, Default)]
struct ResponsesDecoder {
    provider: String,
    /// Function-call position within the turn, by output index.
    calls: BTreeMap<u64, usize>,
    /// Finished items, by output index, for servers whose final event omits them.
    items: BTreeMap<u64, Value>,
    /// The reasoning summary part streaming last, as (output index, summary index).
    summary_part: Option<(u64, u64)>,
}

impl Decoder for ResponsesDecoder {
    fn event(&mut self, event: &SseEvent) -> Result<Step, ModelError> {
        let mut step = Step::default();
        let data = event_json(&self.provider, event)?;
        let kind = data["type"].as_str().unwrap_or(event.event.as_str());
        match kind {
            "response.output_text.delta" => {
                let delta = data["delta"]
                    .as_str()
                    .ok_or_else(|| malformed(&self.provider, event, "no `delta`"))?;
                step.deltas.push(StreamEvent::TextDelta {
                    text: delta.to_owned(),
                });
            }
            // Only shown, never assembled (the finished item is): an odd event is passed over.
            "response.reasoning_summary_text.delta" if data["delta"].is_string() => {
                let delta = data["delta"].as_str().unwrap_or_default();
                let part = (
                    data["output_index"].as_u64().unwrap_or_default(),
                    data["summary_index"].as_u64().unwrap_or_default(),
                );
                // The reasoning block joins an item's summary parts with a blank line; the
                // deltas do the same, so together they read as the block does.
                let text = match self.summary_part.replace(part) {
                    Some((item, index)) if item == part.0 && index != part.1 => {
                        format!("\n\n{delta}")
                    }
                    _ => delta.to_owned(),
                };
                if !text.is_empty() {
                    step.deltas.push(StreamEvent::ReasoningDelta { text });
                }
            }
            "response.output_item.added" => {
                let item = &data["item"];
                if item["type"] == "function_call" {
                    let output_index = data["output_index"].as_u64().unwrap_or_default();
                    let position = self.calls.len();
                    self.calls.insert(output_index, position);
                    step.deltas.push(StreamEvent::ToolCallDelta {
                        index: position,
                        id: item["call_id"].as_str().map(str::to_owned),
                        name: item["name"].as_str().map(str::to_owned),
                        arguments_delta: item["arguments"].as_str().unwrap_or_default().to_owned(),
                    });
                }
            }
            "response.function_call_arguments.delta" => {
                let output_index = data["output_index"].as_u64().unwrap_or_default();
                let Some(position) = self.calls.get(&output_index) else {
                    return Err(malformed(
                        &self.provider,
                        event,
                        "arguments for an unknown call",
                    ));
                };
                step.deltas.push(StreamEvent::ToolCallDelta {
                    index: *position,
                    id: None,
                    name: None,
                    arguments_delta: data["delta"].as_str().unwrap_or_default().to_owned(),
                });
            }
            "response.output_item.done" => {
                let output_index = data["output_index"]
                    .as_u64()
                    .unwrap_or(self.items.len() as u64);
                self.items.insert(output_index, data["item"].clone());
            }
            "response.completed" | "response.incomplete" => {
                let response = &data["response"];
                let output = match response["output"].as_array() {
                    Some(output) if !output.is_empty() => output.clone(),
                    _ => self.items.values().cloned().collect(),
                };
                step.done = Some(response_from(response, &output));
            }
            "response.failed" => {
                let error = &data["response"]["error"];
                return Err(crate::openai_chat::stream_error(&self.provider, error));
            }
            "error" => {
                let error = data.get("error").unwrap_or(&data);
                return Err(crate::openai_chat::stream_error(&self.provider, error));
            }
            _ => {}
        }
        Ok(step)
    }
}
