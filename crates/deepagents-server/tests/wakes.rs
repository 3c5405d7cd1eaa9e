//! An async subagent's ending on an idle thread creates a run on that thread, listed and
//! read through the LangGraph API like any other.

use super::call;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use deepagents::Agent;
use deepagents::backends::InMemoryStore;
use deepagents::core::message::AssistantMessage;
use deepagents::core::{
    InMemoryCheckpointer, Model, ModelError, ModelRequest, ModelResponse, StopReason, Usage,
};
use deepagents::models::ScriptedModel;
use deepagents::subagents::SubAgent;
use deepagents_server::{Assistant, ServerOptions, StepWatch};
use serde_json::{Value, json};
use tokio::sync::Semaphore;

/// A subagent's model that answers once let through.
struct Gated(Arc<Semaphore>);

#[async_trait::async_trait]
impl Model for Gated {
    fn id(&self) -> &str {
        "gated"
    }

    async fn generate(&self, _request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        self.0.acquire().await.unwrap().forget();
        Ok(ModelResponse {
            message: AssistantMessage {
                content: vec![deepagents::ContentBlock::text("The answer is 42.")],
                tool_calls: vec![],
            },
            usage: Usage::default(),
            stop_reason: StopReason::EndTurn,
        })
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ending_on_an_idle_thread_creates_a_run_on_it() {
    let gate = Arc::new(Semaphore::new(0));
    let script = json!({"turns": [
        {"tool_calls": [{"name": "start_async_task", "args": {"subagent_type": "helper", "description": "compute the answer"}}]},
        {"text": "Started."},
        {"text": "The helper says 42."}
    ]});
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::new()));
    let agent = Agent::builder(Arc::new(
        ScriptedModel::from_json(&script.to_string()).unwrap(),
    ))
    .checkpointer(watch.clone())
    .general_purpose_subagent(false)
    .subagent(
        SubAgent::new("helper", "Computes answers.", "You compute.")
            .model(Arc::new(Gated(gate.clone())))
            .asynchronous(true),
    )
    .build()
    .unwrap();
    let options = ServerOptions::new(
        vec![Assistant::new("agent", agent)],
        Arc::new(InMemoryStore::new()),
        watch,
    );
    let app = deepagents_server::router(options).unwrap();
    let (_, thread) = call(&app, "POST", "/threads", json!({})).await;
    let thread_id = thread["thread_id"].as_str().unwrap().to_owned();
    let (status, first) = call(
        &app,
        "POST",
        &format!("/threads/{thread_id}/runs/wait"),
        json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "go"}]}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{first}");

    gate.add_permits(1);
    let start = Instant::now();
    let runs = loop {
        let (_, runs) = call(
            &app,
            "GET",
            &format!("/threads/{thread_id}/runs"),
            Value::Null,
        )
        .await;
        let runs = runs.as_array().cloned().unwrap_or_default();
        if runs.len() == 2 && runs.iter().all(|r| r["status"] == "success") {
            break runs;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{runs:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(
        runs.iter()
            .any(|r| r["metadata"]["woken_by"] == "background_task"),
        "{runs:?}"
    );
    let (_, state) = call(
        &app,
        "GET",
        &format!("/threads/{thread_id}/state"),
        Value::Null,
    )
    .await;
    let messages = state["values"]["messages"].as_array().unwrap();
    let text = |m: &Value| m["content"].to_string();
    assert!(
        text(messages.last().unwrap()).contains("The helper says 42."),
        "{messages:?}"
    );
    let notices = messages
        .iter()
        .filter(|m| text(m).contains("[Background task "))
        .count();
    assert_eq!(notices, 1, "{messages:?}");
    assert!(
        messages
            .iter()
            .any(|m| text(m).contains("The answer is 42."))
    );
}
