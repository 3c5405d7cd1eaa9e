//! Google's Gemini API (`POST {base}/v1beta/models/{model}:generateContent`, and
//! `:streamGenerateContent?alt=sse` for streams).

mod schema;

use deepagents_core::ContentBlock;
use deepagents_core::message::{AssistantMessage, Message, ToolCall};
use deepagents_core::model::{
    InputModalities, ModelError, ModelRequest, ModelResponse, StopReason, StreamEvent,
};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::convert::{
    ApiMedia, Carried, Formats, arguments_object, base64, carry, new_call_id, text_and_media,
    text_with_notes, tokens, usage,
};
use crate::encoded::{EncodeCache, assemble, encoding_failed};
use crate::http::Secret;
use crate::http::sse::SseEvent;
use crate::provider::{Decoder, Step, Wire, event_json, malformed};

use self::schema::gemini_parameters;

const PROVIDER: &str = "google_genai";

/// Prefix of the call ids we make up when Gemini gives none; those are never sent back, since
/// the API pairs such calls with their results by name and order.
const MADE_UP_ID: &str = "gemini_";

fn server_id(id: &str) -> Option<&str> {
    (!id.is_empty() && !id.starts_with(MADE_UP_ID)).then_some(id)
}

/// The Gemini wire format.
#[derive(Clone, Debug)]
pub struct GeminiWire {
    /// Base URL without the version, e.g. `https://generativelanguage.googleapis.com`.
    pub base_url: String,
    /// Model name, e.g. `gemini-2.5-pro`.
    pub model: String,
    /// A thinking budget, with thought summaries included in answers.
    pub reasoning: Option<crate::provider::ReasoningEffort>,
    /// What the model reads besides text; other content becomes a note.
    pub modalities: InputModalities,
    /// Cap on one answer's tokens for requests whose settings name none (the configured
    /// output limit); unset sends none.
    pub max_output_tokens: Option<u32>,
}

impl GeminiWire {
    /// The request body: the system instruction, the contents (the turns the cache holds
    /// copied, the rest encoded), the tools, then the generation settings.
    fn body(
        &self,
        request: &ModelRequest,
        cache: &mut EncodeCache,
    ) -> Result<Vec<u8>, serde_json::Error> {
        let (prefix, tools) = cache.parts(request.messages.version());
        // Not settled, the last turn is encoded anew with the next request, which may merge
        // into it.
        if let Some((role, parts)) = prefix.merge_turns(&request.messages, "parts", |message| {
            message_parts(message, self.modalities)
        })? {
            prefix.write_turn(role, "parts", parts)?;
        }
        let tools = tools.get(&request.tools, |tools| {
            let declarations: Vec<Value> = tools
                .iter()
                .map(|tool| {
                    let mut declaration = json!({
                        "name": tool.name,
                        "description": tool.description,
                    });
                    if let Some(parameters) = gemini_parameters(&tool.parameters) {
                        declaration["parameters"] = parameters;
                    }
                    declaration
                })
                .collect();
            serde_json::value::to_raw_value(&json!([{"functionDeclarations": declarations}]))
        })?;
        let settings = &request.settings;
        let config = GenerationConfig {
            temperature: settings.temperature.map(crate::provider::sampling),
            top_p: settings.top_p.map(crate::provider::sampling),
            max_output_tokens: settings.max_output_tokens.or(self.max_output_tokens),
            stop_sequences: &settings.stop_sequences,
            thinking_config: self.reasoning.map(
                |effort| json!({"thinkingBudget": effort.budget_tokens(), "includeThoughts": true}),
            ),
        };
        let empty = config.temperature.is_none()
            && config.top_p.is_none()
            && config.max_output_tokens.is_none()
            && config.stop_sequences.is_empty()
            && config.thinking_config.is_none();
        assemble(
            &Head {
                system_instruction: request
                    .system_prompt
                    .as_deref()
                    .filter(|s| !s.is_empty())
                    .map(|system| json!({"parts": [{"text": system}]})),
            },
            "contents",
            None::<&Value>,
            prefix.bytes(),
            &Tail {
                tools,
                generation_config: (!empty).then_some(config),
            },
        )
    }
}

/// What precedes the contents in a request body.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Head {
    #[serde(skip_serializing_if = "Option::is_none")]
    system_instruction: Option<Value>,
}

/// What follows the contents in a request body.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Tail<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    generation_config: Option<GenerationConfig<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerationConfig<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop_sequences: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking_config: Option<Value>,
}

impl Wire for GeminiWire {
    fn provider(&self) -> &str {
        PROVIDER
    }

    // The key goes in a header, not the `?key=` query, so it never lands in URLs or logs.
    fn secret_headers(&self, key: &Secret) -> Vec<(String, Secret)> {
        vec![("x-goog-api-key".to_owned(), key.clone())]
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
        let body = self.body(request, cache).map_err(encoding_failed)?;
        let base = self.base_url.trim_end_matches('/');
        let url = if stream {
            format!(
                "{base}/v1beta/models/{}:streamGenerateContent?alt=sse",
                self.model
            )
        } else {
            format!("{base}/v1beta/models/{}:generateContent", self.model)
        };
        Ok((url, body))
    }

    fn parse(&self, body: &Value) -> Result<ModelResponse, ModelError> {
        let mut acc = Accumulator::default();
        acc.chunk(body, &mut Vec::new())?;
        if acc.finish.is_none() && body["candidates"].as_array().is_none_or(Vec::is_empty) {
            let reason = body["promptFeedback"]["blockReason"]
                .as_str()
                .unwrap_or("no candidates");
            return Err(ModelError::Other {
                message: format!("gemini returned no answer: {reason}"),
            });
        }
        Ok(acc.finish())
    }

    fn decoder(&self) -> Box<dyn Decoder> {
        Box::new(GeminiDecoder::default())
    }
}

/// What Gemini takes as inline data, by the MIME types its documentation lists.
const MEDIA: ApiMedia = ApiMedia {
    images: Some(Formats {
        mime_types: &[
            "image/png",
            "image/jpeg",
            "image/webp",
            "image/heic",
            "image/heif",
        ],
        names: "PNG, JPEG, WebP, HEIC or HEIF",
    }),
    pdfs: true,
    audio: Some(Formats {
        mime_types: &[
            "audio/wav",
            "audio/mpeg",
            "audio/aiff",
            "audio/aac",
            "audio/ogg",
            "audio/flac",
        ],
        names: "WAV, MP3, AIFF, AAC, OGG or FLAC",
    }),
    video: Some(Formats {
        mime_types: &[
            "video/mp4",
            "video/mpeg",
            "video/mpg",
            "video/quicktime",
            "video/mov",
            "video/x-msvideo",
            "video/avi",
            "video/x-flv",
            "video/webm",
            "video/x-ms-wmv",
            "video/wmv",
            "video/3gpp",
        ],
        names: "MP4, MPEG, MOV, AVI, FLV, WebM, WMV or 3GPP",
    }),
};

/// The name Gemini's list gives a MIME type, where it differs from the registered one.
fn gemini_mime(mime_type: &str) -> &str {
    match mime_type {
        "audio/mpeg" => "audio/mp3",
        "video/quicktime" => "video/mov",
        "video/x-msvideo" => "video/avi",
        "video/x-ms-wmv" => "video/wmv",
        other => other,
    }
}

fn inline_data(mime_type: &str, data: &[u8]) -> Value {
    json!({"inlineData": {"mimeType": gemini_mime(mime_type), "data": base64(data)}})
}

fn parts_of(content: &[ContentBlock], modalities: InputModalities) -> Vec<Value> {
    content
        .iter()
        .filter_map(|block| carry(block, &MEDIA, modalities))
        .filter_map(|carried| match carried {
            Carried::Text(text) if text.is_empty() => None,
            Carried::Text(text) => Some(json!({ "text": text })),
            Carried::Media {
                mime_type, data, ..
            } => Some(inline_data(&mime_type, data)),
        })
        .collect()
}

/// The role and parts of one message; neighbouring messages of one role merge into one
/// turn.
fn message_parts(message: &Message, modalities: InputModalities) -> (&'static str, Vec<Value>) {
    match message {
        Message::System { content } => (
            "user",
            vec![
                json!({"text": format!("<system>{}</system>", text_with_notes(content, modalities))}),
            ],
        ),
        Message::User { content } => ("user", parts_of(content, modalities)),
        Message::Assistant(assistant) => {
            let mut parts = Vec::new();
            let mut call_signatures = Vec::new();
            let mut text_signature = None;
            for block in &assistant.content {
                match block {
                    ContentBlock::Text { text } if !text.is_empty() => {
                        parts.push(json!({"text": text}));
                    }
                    ContentBlock::Reasoning {
                        signature: Some(signature),
                        opaque,
                        ..
                    } => match opaque.as_ref().and_then(|o| o["gemini_call"].as_u64()) {
                        // An index no call can have (too big for usize) matches no call.
                        Some(call) => call_signatures.push((
                            usize::try_from(call).unwrap_or(usize::MAX),
                            signature.clone(),
                        )),
                        None => text_signature = Some(signature.clone()),
                    },
                    _ => {}
                }
            }
            if let (Some(signature), Some(first)) = (text_signature, parts.first_mut()) {
                first["thoughtSignature"] = json!(signature);
            }
            for (i, call) in assistant.tool_calls.iter().enumerate() {
                let mut part =
                    json!({"functionCall": {"name": call.name, "args": arguments_object(call)}});
                if let Some(id) = server_id(&call.id) {
                    part["functionCall"]["id"] = json!(id);
                }
                if let Some((_, signature)) = call_signatures.iter().find(|(c, _)| *c == i) {
                    part["thoughtSignature"] = json!(signature);
                }
                parts.push(part);
            }
            ("model", parts)
        }
        Message::Tool(result) => {
            // The response holds the text and the notes; media the model reads ride along
            // as inline data in the same turn, since older models take no media inside a
            // function response.
            let (text, media) = text_and_media(&result.content, &MEDIA, modalities, false);
            let response = match serde_json::from_str::<Value>(&text) {
                Ok(value @ Value::Object(_)) => value,
                _ => json!({ "result": text }),
            };
            let mut call = json!({"name": result.name, "response": response});
            if let Some(id) = server_id(&result.tool_call_id) {
                call["id"] = json!(id);
            }
            let mut parts = vec![json!({ "functionResponse": call })];
            parts.extend(media.into_iter().filter_map(|carried| match carried {
                Carried::Media {
                    mime_type, data, ..
                } => Some(inline_data(&mime_type, data)),
                Carried::Text(_) => None,
            }));
            ("user", parts)
        }
    }
}

#[derive(Debug, Default)]
struct Accumulator {
    text: String,
    thoughts: String,
    signatures: Vec<(Option<usize>, String)>,
    calls: Vec<ToolCall>,
    finish: Option<String>,
    usage: Value,
}

impl Accumulator {
    /// Folds one response chunk in, collecting its deltas.
    fn chunk(&mut self, chunk: &Value, deltas: &mut Vec<StreamEvent>) -> Result<(), ModelError> {
        if let Some(error) = chunk.get("error") {
            // The code is the server's: anything but an HTTP error status counts as a server
            // failure, rather than being truncated into some other status.
            let status = error["code"]
                .as_u64()
                .and_then(|code| u16::try_from(code).ok())
                .filter(|code| (400..600).contains(code))
                .unwrap_or(500);
            return Err(crate::http::classify_error(
                PROVIDER,
                status,
                &[],
                &chunk.to_string(),
            ));
        }
        if chunk.get("usageMetadata").is_some() {
            self.usage = chunk["usageMetadata"].clone();
        }
        let Some(candidate) = chunk.pointer("/candidates/0") else {
            return Ok(());
        };
        for part in candidate["content"]["parts"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let signature = part["thoughtSignature"].as_str().map(str::to_owned);
            if let Some(call) = part.get("functionCall") {
                let index = self.calls.len();
                let id = call["id"]
                    .as_str()
                    .filter(|id| !id.is_empty())
                    .map_or_else(|| format!("{MADE_UP_ID}{}", new_call_id()), str::to_owned);
                let name = call["name"].as_str().unwrap_or_default().to_owned();
                let arguments = call.get("args").cloned().unwrap_or_else(|| json!({}));
                deltas.push(StreamEvent::ToolCallDelta {
                    index,
                    id: Some(id.clone()),
                    name: Some(name.clone()),
                    arguments_delta: arguments.to_string(),
                });
                self.calls.push(ToolCall {
                    id,
                    name,
                    arguments,
                });
                if let Some(signature) = signature {
                    self.signatures.push((Some(index), signature));
                }
            } else if let Some(text) = part["text"].as_str() {
                if part["thought"].as_bool() == Some(true) {
                    self.thoughts.push_str(text);
                    if !text.is_empty() {
                        deltas.push(StreamEvent::ReasoningDelta {
                            text: text.to_owned(),
                        });
                    }
                } else if !text.is_empty() {
                    self.text.push_str(text);
                    deltas.push(StreamEvent::TextDelta {
                        text: text.to_owned(),
                    });
                }
                if let Some(signature) = signature {
                    self.signatures.push((None, signature));
                }
            }
        }
        if let Some(reason) = candidate["finishReason"].as_str() {
            self.finish = Some(reason.to_owned());
        }
        Ok(())
    }

    fn finish(&mut self) -> ModelResponse {
        let mut content = Vec::new();
        if !self.thoughts.is_empty() {
            content.push(ContentBlock::Reasoning {
                text: std::mem::take(&mut self.thoughts),
                signature: None,
                opaque: None,
            });
        }
        for (call, signature) in self.signatures.drain(..) {
            content.push(ContentBlock::Reasoning {
                text: String::new(),
                signature: Some(signature),
                opaque: Some(match call {
                    Some(index) => json!({"gemini_call": index}),
                    None => json!({"gemini_text": true}),
                }),
            });
        }
        if !self.text.is_empty() {
            content.push(ContentBlock::text(std::mem::take(&mut self.text)));
        }
        let calls = std::mem::take(&mut self.calls);
        let stop_reason = match self.finish.as_deref() {
            // A cut-off or filtered turn says so even when it holds tool calls.
            Some("MAX_TOKENS") => StopReason::MaxTokens,
            Some(
                "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII"
                | "IMAGE_SAFETY",
            ) => StopReason::ContentFilter,
            _ if !calls.is_empty() => StopReason::ToolUse,
            Some("STOP") | None => StopReason::EndTurn,
            Some(other) => StopReason::Other(other.to_owned()),
        };
        let u = &self.usage;
        ModelResponse {
            message: AssistantMessage {
                content,
                tool_calls: calls,
            },
            usage: usage(
                tokens(u, "/promptTokenCount"),
                // Saturating: the counts are the server's, and their sum must not overflow.
                tokens(u, "/candidatesTokenCount").saturating_add(tokens(u, "/thoughtsTokenCount")),
                tokens(u, "/cachedContentTokenCount"),
            ),
            stop_reason,
        }
    }
}

/// Gemini streams have no end marker: the chunk carrying `finishReason` is the last one, so a
/// body that ends without one was cut short.
#[derive(Debug, Default)]
struct GeminiDecoder {
    acc: Accumulator,
}

impl Decoder for GeminiDecoder {
    fn event(&mut self, event: &SseEvent) -> Result<Step, ModelError> {
        let chunk = event_json(PROVIDER, event)?;
        if !chunk.is_object() {
            return Err(malformed(PROVIDER, event, "not an object"));
        }
        let mut step = Step::default();
        self.acc.chunk(&chunk, &mut step.deltas)?;
        Ok(step)
    }

    fn end(&mut self) -> Result<ModelResponse, ModelError> {
        if self.acc.finish.is_none() {
            return Err(ModelError::Transient {
                message: "the stream ended before its completion marker (a chunk with a finishReason); the answer is incomplete".to_owned(),
            });
        }
        Ok(self.acc.finish())
    }
}
