//! Models described by a spec plus settings: what the Python half reads off a LangChain chat
//! model object (`ChatOpenAI(model=…, base_url=…, api_key=…, temperature=…)`) becomes a native
//! client built with [`from_spec_with`](deepagents::models::from_spec_with), and its sampling
//! settings travel with the model ([`Sampled`]), so a subagent given a model object of its
//! own samples as that object says.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deepagents::core::model::InputModalities;
use deepagents::core::{
    Message, Model, ModelError, ModelProfile, ModelRequest, ModelResponse, ModelSettings,
    ModelStream, StopReason, Usage,
};
use deepagents::models::http::{HttpConfig, Secret};
use deepagents::models::{ModelOptions, ReasoningEffort, from_spec_with};
use pyo3::prelude::*;
use serde::Deserialize;
use serde_json::{Value, json};

/// A provider model with explicit settings (`{"spec": "openai_chat:gpt-4o", …}`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelObject {
    /// `provider:model`, as the CLI takes it.
    spec: String,
    /// Endpoint; unset falls back to the provider's `*_BASE_URL` variable, then its default.
    #[serde(default)]
    base_url: Option<String>,
    /// API key; unset falls back to the provider's key variable.
    #[serde(default)]
    api_key: Option<String>,
    #[serde(default)]
    max_retries: Option<u32>,
    /// Seconds allowed to connect, to wait for the answer's first byte, and between chunks.
    #[serde(default)]
    timeout: Option<f64>,
    /// Cap on one answer's tokens.
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    stop: Vec<String>,
    /// `low`, `medium` or `high`.
    #[serde(default)]
    reasoning_effort: Option<String>,
}

/// Builds the native client `object` describes.
pub fn from_object(object: &ModelObject) -> Result<Arc<dyn Model>, String> {
    let spec = &object.spec;
    let mut options = ModelOptions {
        base_url: object.base_url.clone(),
        api_key: object.api_key.clone().map(Secret::new),
        max_retries: object.max_retries,
        max_output_tokens: object.max_tokens,
        ..ModelOptions::default()
    };
    if let Some(seconds) = object.timeout {
        if !(seconds.is_finite() && seconds > 0.0) {
            return Err(format!(
                "model {spec:?}: timeout must be a positive number of seconds"
            ));
        }
        let timeout = Duration::from_secs_f64(seconds);
        options.http = Some(HttpConfig {
            connect_timeout: timeout,
            first_byte_timeout: timeout,
            idle_timeout: timeout,
            ..HttpConfig::default()
        });
    }
    options.reasoning = match object.reasoning_effort.as_deref() {
        None => None,
        Some("low" | "minimal") => Some(ReasoningEffort::Low),
        Some("medium") => Some(ReasoningEffort::Medium),
        Some("high" | "xhigh") => Some(ReasoningEffort::High),
        Some(other) => {
            return Err(format!(
                "model {spec:?}: reasoning effort {other:?} is not one of low, medium, high"
            ));
        }
    };
    let model = from_spec_with(spec, &options).map_err(|e| format!("model {spec:?}: {e}"))?;
    let settings = ModelSettings {
        temperature: object.temperature,
        top_p: object.top_p,
        max_output_tokens: None,
        stop_sequences: object.stop.clone(),
    };
    if settings == ModelSettings::default() {
        return Ok(model);
    }
    Ok(Arc::new(Sampled {
        inner: model,
        settings,
    }))
}

/// A model whose requests carry its own sampling settings where the agent's name none.
struct Sampled {
    inner: Arc<dyn Model>,
    settings: ModelSettings,
}

impl Sampled {
    fn request(&self, request: &ModelRequest) -> ModelRequest {
        let mut request = request.clone();
        let settings = &mut request.settings;
        settings.temperature = settings.temperature.or(self.settings.temperature);
        settings.top_p = settings.top_p.or(self.settings.top_p);
        if settings.stop_sequences.is_empty() {
            settings.stop_sequences = self.settings.stop_sequences.clone();
        }
        request
    }
}

#[async_trait]
impl Model for Sampled {
    fn id(&self) -> &str {
        self.inner.id()
    }

    fn profile(&self) -> Option<ModelProfile> {
        self.inner.profile()
    }

    async fn resolve_profile(&self) -> Option<ModelProfile> {
        self.inner.resolve_profile().await
    }

    fn input_modalities(&self) -> Option<InputModalities> {
        self.inner.input_modalities()
    }

    async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        self.inner.generate(&self.request(request)).await
    }

    async fn stream(&self, request: &ModelRequest) -> Result<ModelStream, ModelError> {
        self.inner.stream(&self.request(request)).await
    }
}

/// A chat model object of a class the harness has no client for (`GenericFakeChatModel`,
/// `ChatBedrock`, a model of the user's own), called through its adapter on the Python side:
/// the request goes in as JSON with LangChain message dicts, the answer comes back as an AI
/// message dict with its usage.
pub struct PyModel {
    id: String,
    adapter: Arc<Py<PyAny>>,
}

impl PyModel {
    /// The model `adapter` calls; `id` names it in errors and spend records.
    pub fn new(id: String, adapter: Arc<Py<PyAny>>) -> Self {
        Self { id, adapter }
    }
}

/// A request as the Python side reads it.
pub fn request_json(request: &ModelRequest) -> Value {
    json!({
        "system": request.system_prompt,
        "messages": request
            .messages
            .iter()
            .enumerate()
            .map(|(index, message)| deepagents_langgraph::convert::message(index, message))
            .collect::<Vec<_>>(),
        "tools": request
            .tools
            .iter()
            .map(|tool| json!({"name": tool.name, "description": tool.description, "parameters": tool.parameters}))
            .collect::<Vec<_>>(),
        "settings": request.settings,
    })
}

/// A model's answer from the Python side: `{"message": {AI message dict}, "usage":
/// {"input_tokens", "output_tokens"}?, "stop_reason"?}`.
pub fn response_from_json(answer: &Value) -> Result<ModelResponse, String> {
    let message = answer.get("message").ok_or("the answer has no `message`")?;
    let Message::Assistant(message) = deepagents_langgraph::convert::message_from(message)? else {
        return Err("the answer is not an AI message".to_owned());
    };
    let count = |key: &str| {
        answer
            .pointer(&format!("/usage/{key}"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let usage = Usage {
        input_tokens: count("input_tokens"),
        output_tokens: count("output_tokens"),
        ..Usage::default()
    };
    let stop_reason = match answer.get("stop_reason").and_then(Value::as_str) {
        Some("max_tokens" | "length") => StopReason::MaxTokens,
        _ if !message.tool_calls.is_empty() => StopReason::ToolUse,
        _ => StopReason::EndTurn,
    };
    Ok(ModelResponse {
        message,
        usage,
        stop_reason,
    })
}

#[async_trait]
impl Model for PyModel {
    fn id(&self) -> &str {
        &self.id
    }

    async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let request = request_json(request).to_string();
        let adapter = Arc::clone(&self.adapter);
        let answer = tokio::task::spawn_blocking(move || {
            Python::attach(|py| -> PyResult<String> { adapter.call1(py, (request,))?.extract(py) })
        })
        .await
        .map_err(|e| ModelError::Transient {
            message: format!("the Python model {} crashed: {e}", self.id),
        })?
        .map_err(|e| ModelError::Other {
            message: format!("the adapter of Python model {} failed: {e}", self.id),
        })?;
        let answer: Value = serde_json::from_str(&answer).map_err(|e| ModelError::Other {
            message: format!("the Python model {} answered badly: {e}", self.id),
        })?;
        if let Some(error) = answer.get("error").and_then(Value::as_str) {
            return Err(ModelError::Other {
                message: format!("the Python model {} raised {error}", self.id),
            });
        }
        response_from_json(&answer).map_err(|e| ModelError::Other {
            message: format!("the Python model {} answered badly: {e}", self.id),
        })
    }
}
