//! Helpers shared by the provider tests.

use std::sync::Arc;
use std::time::Duration;

use deepagents_core::ContentBlock;
use deepagents_core::message::{AssistantMessage, Message, ToolCall, ToolResult, ToolStatus};
use deepagents_core::model::{Model, ModelError, ModelRequest, ModelResponse, StreamEvent};
use deepagents_core::tool::ToolSpec;
use deepagents_models::http::{HttpConfig, Secret};
use deepagents_models::{ModelOptions, from_spec_with};
use futures::StreamExt;
use serde_json::{Value, json};

/// Which wire format a test drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Responses,
    Chat,
    Anthropic,
    Gemini,
}

impl Api {
    pub fn spec(self) -> &'static str {
        match self {
            Api::Responses => "openai:gpt-4o",
            Api::Chat => "openai_chat:gpt-4o",
            Api::Anthropic => "anthropic:claude-sonnet-4-5",
            Api::Gemini => "google_genai:gemini-2.5-flash",
        }
    }

    /// The path of the API's endpoint on the mock server.
    pub fn endpoint(self) -> &'static str {
        match self {
            Api::Responses => "/responses",
            Api::Chat => "/chat/completions",
            Api::Anthropic => "/v1/messages",
            Api::Gemini => "enerateContent",
        }
    }

    /// Whether a request path is a call of this API.
    pub fn is_call(self, path: &str) -> bool {
        let path = path.split('?').next().unwrap();
        match self {
            Api::Gemini => {
                path.ends_with(":generateContent") || path.ends_with(":streamGenerateContent")
            }
            _ => path.ends_with(self.endpoint()),
        }
    }
}

pub const TEST_KEY: &str = "sk-test-secret-key-0123456789";

/// Timeouts and backoff short enough for tests, generous enough for a loaded machine.
pub fn fast_config() -> HttpConfig {
    HttpConfig {
        connect_timeout: Duration::from_secs(5),
        first_byte_timeout: Duration::from_secs(3),
        idle_timeout: Duration::from_secs(2),
        max_retries: 2,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        max_retry_after: Duration::from_secs(5),
    }
}

pub fn model(spec: &str, base_url: String, retries: u32) -> Arc<dyn Model> {
    from_spec_with(
        spec,
        &ModelOptions {
            base_url: Some(base_url),
            api_key: Some(Secret::new(TEST_KEY)),
            http: Some(fast_config()),
            max_retries: Some(retries),
            ..ModelOptions::default()
        },
    )
    .unwrap()
}

pub fn weather_tool() -> ToolSpec {
    ToolSpec {
        name: "weather".into(),
        description: "Current weather for a city.".into(),
        parameters: json!({
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name."}},
            "required": ["city"],
        })
        .into(),
    }
}

pub fn ask(text: &str) -> ModelRequest {
    ModelRequest {
        system_prompt: Some("You are terse.".into()),
        messages: vec![Message::user(text)].into(),
        tools: vec![weather_tool()],
        ..ModelRequest::default()
    }
}

/// The request after the model asked for `call`: its turn and the tool's answer appended.
pub fn with_tool_result(mut request: ModelRequest, call: &ToolCall, answer: &str) -> ModelRequest {
    request.messages.push(Message::Assistant(AssistantMessage {
        content: vec![],
        tool_calls: vec![call.clone()],
    }));
    request.messages.push(Message::Tool(ToolResult {
        tool_call_id: call.id.clone(),
        name: call.name.clone(),
        content: vec![ContentBlock::text(answer)],
        status: ToolStatus::Ok,
        artifact: None,
    }));
    request
}

pub fn text_of(response: &ModelResponse) -> String {
    deepagents_core::content::joined_text(&response.message.content)
}

/// Streams a request, returning the deltas and the outcome.
pub async fn stream_all(
    model: &dyn Model,
    request: &ModelRequest,
) -> (Vec<StreamEvent>, Result<ModelResponse, ModelError>) {
    let mut stream = match model.stream(request).await {
        Ok(stream) => stream,
        Err(error) => return (Vec::new(), Err(error)),
    };
    let mut deltas = Vec::new();
    while let Some(event) = stream.next().await {
        match event {
            Ok(StreamEvent::Completed(response)) => {
                assert!(stream.next().await.is_none(), "events after Completed");
                return (deltas, Ok(response));
            }
            Ok(delta) => deltas.push(delta),
            Err(error) => return (deltas, Err(error)),
        }
    }
    panic!("the stream ended without Completed or an error");
}

pub fn streamed_text(deltas: &[StreamEvent]) -> String {
    deltas
        .iter()
        .filter_map(|d| match d {
            StreamEvent::TextDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// The arguments of call `index`, reassembled from the deltas.
pub fn streamed_arguments(deltas: &[StreamEvent], index: usize) -> Value {
    let text: String = deltas
        .iter()
        .filter_map(|d| match d {
            StreamEvent::ToolCallDelta {
                index: i,
                arguments_delta,
                ..
            } if *i == index => Some(arguments_delta.as_str()),
            _ => None,
        })
        .collect();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("streamed arguments {text:?}: {e}"))
}

/// A sentence long enough that a fault after a few chunks lands mid-text.
pub const LONG_TEXT: &str = "The quick brown fox jumps over the lazy dog while the patient river carries leaves past the old mill and the evening light fades slowly behind the distant hills.";
