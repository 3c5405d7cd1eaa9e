//! Snapshots of what the model is told: system prompts and tool schemas per configuration.

use std::sync::{Arc, Mutex};

use deepagents::{Agent, AgentBuilder, ModelRequest};
use serde_json::json;

use crate::middleware_capture::Capture;
use crate::support::scripted;

async fn first_request(configure: impl FnOnce(AgentBuilder) -> AgentBuilder) -> ModelRequest {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let builder = Agent::builder(scripted(json!([{"text": "ok"}]))).middleware(Capture {
        requests: requests.clone(),
    });
    configure(builder)
        .build()
        .unwrap()
        .invoke("hi")
        .await
        .unwrap();
    requests.lock().unwrap().remove(0)
}

#[tokio::test]
async fn default_prompt() {
    let request = first_request(|b| b).await;
    insta::assert_snapshot!(request.system_prompt.unwrap());
}

#[tokio::test]
async fn prompt_with_user_prompt_and_planning() {
    let request =
        first_request(|b| b.system_prompt("You are a release manager.").todos(true)).await;
    insta::assert_snapshot!(request.system_prompt.unwrap());
}

#[tokio::test]
async fn bare_prompt_without_file_tools() {
    let request = first_request(|b| {
        b.system_prompt("Only this.")
            .base_prompt(false)
            .file_tools(false)
            .general_purpose_subagent(false)
    })
    .await;
    assert_eq!(request.system_prompt.as_deref(), Some("Only this."));
    assert!(request.tools.is_empty());
}

#[tokio::test]
async fn tool_schemas() {
    let request = first_request(|b| b.todos(true)).await;
    insta::assert_json_snapshot!(request.tools);
}
