//! Remote subagents: agents served over the Agent Protocol (LangGraph API), run as background
//! tasks. The tools are in `async_tasks.rs`; this is the HTTP side.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use deepagents_core::ToolError;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};

/// A remote agent: where it is served and how to call it.
#[derive(Clone, Debug)]
pub struct RemoteSubAgent {
    /// The name the model uses.
    pub name: String,
    /// When to use it.
    pub description: String,
    /// Base URL of the Agent Protocol server, e.g. `http://127.0.0.1:2024`.
    pub url: String,
    /// The graph (assistant) id on that server.
    pub graph_id: String,
    /// Extra headers, e.g. an API key.
    pub headers: Vec<(String, String)>,
}

/// A remote agent with its HTTP client.
pub(crate) struct Remote {
    pub(crate) spec: RemoteSubAgent,
    client: reqwest::Client,
}

/// A remote agent's server could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("remote subagent `{name}`: {message}")]
pub struct RemoteSetupError {
    /// The subagent.
    pub name: String,
    /// What is wrong.
    pub message: String,
}

/// Remote agents by name.
pub(crate) type Remotes = Arc<BTreeMap<String, Arc<Remote>>>;

/// The HTTP clients of `agents`, by name.
pub(crate) fn clients(agents: Vec<RemoteSubAgent>) -> Result<Remotes, RemoteSetupError> {
    let mut remotes = BTreeMap::new();
    for spec in agents {
        let error = |message: String| RemoteSetupError {
            name: spec.name.clone(),
            message,
        };
        let mut headers = HeaderMap::new();
        for (name, value) in &spec.headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|e| error(format!("header `{name}`: {e}")))?;
            let mut value = HeaderValue::from_str(value)
                .map_err(|e| error(format!("header `{name}` has an invalid value: {e}")))?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        let client = deepagents_models::http_client()
            .default_headers(headers)
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| error(e.to_string()))?;
        remotes.insert(spec.name.clone(), Arc::new(Remote { spec, client }));
    }
    Ok(Arc::new(remotes))
}

fn unreachable_server(remote: &Remote, error: impl std::fmt::Display) -> ToolError {
    ToolError::RespondToModel(format!(
        "The remote agent `{}` at {} could not be reached ({error}); try again later or do the work yourself.",
        remote.spec.name, remote.spec.url
    ))
}

impl Remote {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.spec.url.trim_end_matches('/'))
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, ToolError> {
        let response = request
            .send()
            .await
            .map_err(|e| unreachable_server(self, e))?;
        let status = response.status();
        let body = response
            .text()
            .await
            .map_err(|e| unreachable_server(self, e))?;
        if !status.is_success() {
            return Err(ToolError::RespondToModel(format!(
                "The remote agent `{}` answered {status}: {}",
                self.spec.name,
                crate::tools::output::truncate_chars(&body, 500)
            )));
        }
        if body.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&body)
            .map_err(|e| unreachable_server(self, format!("invalid JSON: {e}")))
    }

    /// Starts a run of the agent on `thread_id` with one user message.
    pub(crate) async fn start_run(
        &self,
        thread_id: &str,
        message: &str,
    ) -> Result<(String, String), ToolError> {
        let run = self
            .send(
                self.client
                    .post(self.url(&format!("/threads/{thread_id}/runs")))
                    .json(&json!({
                        "assistant_id": self.spec.graph_id,
                        "input": {"messages": [{"role": "user", "content": message}]},
                        "multitask_strategy": "interrupt"
                    })),
            )
            .await?;
        let run_id = run["run_id"].as_str().unwrap_or_default().to_owned();
        if run_id.is_empty() {
            return Err(unreachable_server(self, "the server returned no run_id"));
        }
        let status = run["status"].as_str().unwrap_or("pending").to_owned();
        Ok((run_id, status))
    }

    /// The last AI message of the thread.
    pub(crate) async fn answer(&self, thread_id: &str) -> Result<String, ToolError> {
        let state = self
            .send(
                self.client
                    .get(self.url(&format!("/threads/{thread_id}/state"))),
            )
            .await?;
        let messages = state["values"]["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let answer = messages
            .iter()
            .rev()
            .find(|m| {
                matches!(
                    m["type"].as_str().or(m["role"].as_str()),
                    Some("ai" | "assistant")
                )
            })
            .map(|m| match &m["content"] {
                Value::String(text) => text.clone(),
                Value::Array(blocks) => blocks
                    .iter()
                    .filter_map(|b| b["text"].as_str())
                    .collect::<Vec<_>>()
                    .join(""),
                _ => String::new(),
            })
            .unwrap_or_default();
        Ok(answer)
    }
}

impl Remote {
    /// Starts the agent on a new thread of its server; `(thread id, run id, status)`.
    pub(crate) async fn start(&self, message: &str) -> Result<(String, String, String), ToolError> {
        let thread = self
            .send(self.client.post(self.url("/threads")).json(&json!({})))
            .await?;
        let thread_id = thread["thread_id"].as_str().unwrap_or_default().to_owned();
        if thread_id.is_empty() {
            return Err(unreachable_server(self, "the server returned no thread_id"));
        }
        let (run_id, status) = self.start_run(&thread_id, message).await?;
        Ok((thread_id, run_id, status))
    }

    /// The status of run `run_id` of `thread_id` (`pending`, `running`, `success`, …).
    pub(crate) async fn status(&self, thread_id: &str, run_id: &str) -> Result<String, ToolError> {
        let run = self
            .send(
                self.client
                    .get(self.url(&format!("/threads/{thread_id}/runs/{run_id}"))),
            )
            .await?;
        Ok(run["status"].as_str().unwrap_or("unknown").to_owned())
    }

    /// Waits (up to the client's timeout) for run `run_id` to end, through the server's
    /// `join`; errors are left to the caller's next status check.
    pub(crate) async fn join(&self, thread_id: &str, run_id: &str) {
        let url = self.url(&format!("/threads/{thread_id}/runs/{run_id}/join"));
        let _ = self.send(self.client.get(url)).await;
    }

    /// Cancels run `run_id` of `thread_id`.
    pub(crate) async fn cancel(&self, thread_id: &str, run_id: &str) -> Result<(), ToolError> {
        self.send(
            self.client
                .post(self.url(&format!("/threads/{thread_id}/runs/{run_id}/cancel"))),
        )
        .await?;
        Ok(())
    }
}
