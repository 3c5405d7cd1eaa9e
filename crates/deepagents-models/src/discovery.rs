//! Asking a local server for its context window, for models the built-in table does not know
//! and whose window was not configured: llama.cpp's `GET /props`
//! (`default_generation_settings.n_ctx`), vLLM's `GET /v1/models` (`max_model_len` on the
//! model's entry) and Ollama's `POST /api/show` (`num_ctx` among its parameters, else
//! `model_info["<arch>.context_length"]`). Asked once, with a short timeout; a server that
//! does not say leaves the window unknown (logged at debug level).

use std::time::Duration;

use deepagents_core::ModelProfile;
use serde_json::{Value, json};

use crate::http::Secret;

/// How long one question may take, connection included.
const TIMEOUT: Duration = Duration::from_secs(3);

/// The output limit a discovered profile reports when none was configured.
const OUTPUT_TOKENS: u64 = 8_192;

/// Which questions a server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Server {
    /// Ollama: `POST /api/show`.
    Ollama,
    /// vLLM, llama.cpp's server or another OpenAI-compatible one: `GET /v1/models`, then
    /// `GET /props`.
    OpenAiCompatible,
}

/// The questions to ask one model's server.
#[derive(Debug)]
pub(crate) struct Discovery {
    pub(crate) server: Server,
    /// The Chat Completions base URL, e.g. `http://localhost:8080/v1`.
    pub(crate) base_url: String,
    pub(crate) model: String,
    pub(crate) key: Option<Secret>,
    /// Bypass proxies (a server on this machine).
    pub(crate) local: bool,
    /// The configured output limit, reported in the profile.
    pub(crate) max_output_tokens: Option<u32>,
}

impl Discovery {
    /// The model's profile with the window its server reports, or `None`.
    pub(crate) async fn profile(&self) -> Option<ModelProfile> {
        let window = self.window().await?;
        tracing::debug!(model = %self.model, window, "context window from the server");
        Some(ModelProfile {
            max_input_tokens: window,
            max_output_tokens: self
                .max_output_tokens
                .map_or(OUTPUT_TOKENS.min(window), u64::from),
        })
    }

    async fn window(&self) -> Option<u64> {
        let mut builder = crate::http_client()
            .timeout(TIMEOUT)
            .connect_timeout(TIMEOUT);
        if self.local {
            builder = builder.no_proxy();
        }
        let client = match builder.build() {
            Ok(client) => client,
            Err(error) => {
                tracing::debug!(%error, "no client to ask the server for its context window");
                return None;
            }
        };
        let base = self.base_url.trim_end_matches('/');
        let root = base.strip_suffix("/v1").unwrap_or(base);
        match self.server {
            Server::Ollama => {
                let body = json!({"model": self.model, "name": self.model}).to_string();
                let request = client
                    .post(format!("{root}/api/show"))
                    .header("content-type", "application/json")
                    .body(body);
                self.ask(request).await.and_then(|show| from_show(&show))
            }
            Server::OpenAiCompatible => {
                if let Some(window) = self
                    .ask(client.get(format!("{base}/models")))
                    .await
                    .and_then(|models| from_models(&models, &self.model))
                {
                    return Some(window);
                }
                self.ask(client.get(format!("{root}/props")))
                    .await
                    .and_then(|props| from_props(&props))
            }
        }
    }

    /// The JSON answer to `request`, or `None` (logged) when there is none.
    async fn ask(&self, request: reqwest::RequestBuilder) -> Option<Value> {
        let request = match &self.key {
            Some(key) => request.bearer_auth(key.expose()),
            None => request,
        };
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                tracing::debug!(model = %self.model, %error, "asking the server for its context window failed");
                return None;
            }
        };
        let url = response.url().to_string();
        if !response.status().is_success() {
            tracing::debug!(%url, status = response.status().as_u16(), "the server did not say its context window");
            return None;
        }
        let body = response.bytes().await.ok()?;
        serde_json::from_slice(&body)
            .inspect_err(|error| tracing::debug!(%url, %error, "not JSON"))
            .ok()
    }
}

fn positive(value: &Value) -> Option<u64> {
    value.as_u64().filter(|&n| n > 0)
}

/// vLLM: `max_model_len` on the model's entry of `GET /v1/models` (the only entry will do).
fn from_models(models: &Value, model: &str) -> Option<u64> {
    let entries = models["data"].as_array()?;
    let entry = entries
        .iter()
        .find(|entry| entry["id"] == model)
        .or_else(|| (entries.len() == 1).then(|| &entries[0]))?;
    positive(&entry["max_model_len"])
}

/// llama.cpp: `default_generation_settings.n_ctx` of `GET /props` (older servers say `n_ctx`
/// at the top).
fn from_props(props: &Value) -> Option<u64> {
    positive(&props["default_generation_settings"]["n_ctx"]).or_else(|| positive(&props["n_ctx"]))
}

/// Ollama: `num_ctx` among the model's parameters (the window it runs with), else the
/// architecture's `context_length` in `model_info`.
fn from_show(show: &Value) -> Option<u64> {
    let num_ctx = show["parameters"].as_str().and_then(|parameters| {
        parameters.lines().find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("num_ctx"))
                .then(|| words.next()?.parse::<u64>().ok())
                .flatten()
                .filter(|&n| n > 0)
        })
    });
    num_ctx.or_else(|| {
        let info = &show["model_info"];
        let architecture = info["general.architecture"].as_str()?;
        positive(&info[format!("{architecture}.context_length").as_str()])
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn each_server_says_its_window_its_own_way() {
        let models = json!({"data": [
            {"id": "a", "max_model_len": 4096},
            {"id": "b", "max_model_len": 8192},
        ]});
        assert_eq!(from_models(&models, "b"), Some(8192));
        assert_eq!(from_models(&models, "c"), None);
        let one = json!({"data": [{"id": "/models/x.gguf", "max_model_len": 2048}]});
        assert_eq!(from_models(&one, "x"), Some(2048));
        assert_eq!(from_models(&json!({"data": [{"id": "x"}]}), "x"), None);
        assert_eq!(
            from_props(&json!({"default_generation_settings": {"n_ctx": 8192}})),
            Some(8192)
        );
        assert_eq!(from_props(&json!({"n_ctx": 0})), None);
        let show = json!({
            "parameters": "stop \"<|eot|>\"\nnum_ctx                        16384",
            "model_info": {"general.architecture": "llama", "llama.context_length": 131072},
        });
        assert_eq!(from_show(&show), Some(16384));
        let show =
            json!({"model_info": {"general.architecture": "qwen2", "qwen2.context_length": 32768}});
        assert_eq!(from_show(&show), Some(32768));
        assert_eq!(from_show(&json!({"parameters": "stop x"})), None);
    }
}
