//! Middleware order, replacement, and what hooks can change.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use deepagents::middleware::{Middleware, MiddlewareError, ModelNext, ToolNext};
use deepagents::{
    Agent, AgentState, ModelError, ModelRequest, ModelResponse, StateUpdate, ToolCall, ToolContext,
    ToolError, ToolOutput,
};
use deepagents_core::RunContext;
use serde_json::json;

use crate::support::{scripted, text, tool_results};

type Log = Arc<Mutex<Vec<String>>>;

struct Recording {
    name: String,
    log: Log,
}

impl Recording {
    fn push(&self, hook: &str) {
        self.log
            .lock()
            .unwrap()
            .push(format!("{} {hook}", self.name));
    }
}

#[async_trait]
impl Middleware for Recording {
    fn name(&self) -> &str {
        &self.name
    }
    async fn before_run(
        &self,
        _ctx: &RunContext,
        _: &AgentState,
    ) -> Result<StateUpdate, MiddlewareError> {
        self.push("before_run");
        Ok(StateUpdate::default())
    }
    async fn before_model(
        &self,
        _ctx: &RunContext,
        request: &mut ModelRequest,
        _: &AgentState,
    ) -> Result<(), MiddlewareError> {
        self.push("before_model");
        request.push_system_section(&format!("section from {}", self.name));
        Ok(())
    }
    async fn wrap_model_call(
        &self,
        request: ModelRequest,
        next: ModelNext,
    ) -> Result<ModelResponse, ModelError> {
        self.push("model enter");
        let response = next.call(request).await;
        self.push("model exit");
        response
    }
    async fn after_model(
        &self,
        _ctx: &RunContext,
        _: &mut ModelResponse,
        _: &AgentState,
    ) -> Result<(), MiddlewareError> {
        self.push("after_model");
        Ok(())
    }
    async fn wrap_tool_call(
        &self,
        call: ToolCall,
        ctx: ToolContext,
        next: ToolNext,
    ) -> Result<ToolOutput, ToolError> {
        self.push("tool enter");
        let output = next.call(call, ctx).await;
        self.push("tool exit");
        output
    }
    async fn after_run(&self, _ctx: &RunContext, _: &AgentState) -> Result<(), MiddlewareError> {
        self.push("after_run");
        Ok(())
    }
}

#[tokio::test]
async fn hooks_run_in_onion_order() {
    let log: Log = Arc::default();
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"name": "write_todos", "args": {"todos": []}}]},
        {"text": "done"}
    ])))
    .todos(true)
    .middleware(Recording {
        name: "a".into(),
        log: log.clone(),
    })
    .middleware(Recording {
        name: "b".into(),
        log: log.clone(),
    })
    .build()
    .unwrap();
    assert_eq!(
        agent.middleware_names(),
        [
            "guidance",
            "todos",
            "filesystem",
            "subagents",
            "large_results",
            "shorten_old_edits",
            "summarization",
            "dangling_tool_calls",
            "a",
            "b"
        ]
    );
    agent.invoke("go").await.unwrap();
    let model_round = [
        "a before_model",
        "b before_model",
        "a model enter",
        "b model enter",
        "b model exit",
        "a model exit",
        "b after_model",
        "a after_model",
    ];
    let mut expected = vec!["a before_run", "b before_run"];
    expected.extend(model_round);
    expected.extend(["a tool enter", "b tool enter", "b tool exit", "a tool exit"]);
    expected.extend(model_round);
    expected.extend(["b after_run", "a after_run"]);
    assert_eq!(*log.lock().unwrap(), expected);
}

/// Captures the request the model receives.
struct Capture {
    requests: Arc<Mutex<Vec<ModelRequest>>>,
}

#[async_trait]
impl Middleware for Capture {
    fn name(&self) -> &str {
        "capture"
    }
    async fn wrap_model_call(
        &self,
        request: ModelRequest,
        next: ModelNext,
    ) -> Result<ModelResponse, ModelError> {
        self.requests.lock().unwrap().push(request.clone());
        next.call(request).await
    }
}

#[tokio::test]
async fn system_prompt_sections_follow_the_user_prompt_in_stack_order() {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let log: Log = Arc::default();
    let agent = Agent::builder(scripted(json!([{"text": "hi"}])))
        .system_prompt("You are terse.")
        .todos(true)
        .middleware(Recording {
            name: "a".into(),
            log,
        })
        .middleware(Capture {
            requests: requests.clone(),
        })
        .build()
        .unwrap();
    agent.invoke("go").await.unwrap();
    let prompt = requests.lock().unwrap()[0].system_prompt.clone().unwrap();
    let user = prompt.find("You are terse.").unwrap();
    let guidance = prompt.find("Work through the task").unwrap();
    let planning = prompt.find("## Planning").unwrap();
    let files = prompt.find("## Files").unwrap();
    let section = prompt.find("section from a").unwrap();
    assert!(
        user < guidance && guidance < planning && planning < files && files < section,
        "{prompt}"
    );
}

/// A user middleware named like the built-in `todos` takes its place.
struct QuietTodos;

#[async_trait]
impl Middleware for QuietTodos {
    fn name(&self) -> &str {
        "todos"
    }
}

#[test]
fn a_user_middleware_replaces_the_built_in_of_the_same_name_in_place() {
    let log: Log = Arc::default();
    let agent = Agent::builder(scripted(json!([])))
        .todos(true)
        .middleware(Recording {
            name: "first".into(),
            log,
        })
        .middleware(QuietTodos)
        .build()
        .unwrap();
    assert_eq!(
        agent.middleware_names(),
        [
            "guidance",
            "todos",
            "filesystem",
            "subagents",
            "large_results",
            "shorten_old_edits",
            "summarization",
            "dangling_tool_calls",
            "first"
        ]
    );
    // The replacement contributes no tool, so write_todos is gone.
    assert!(agent.tool_specs().iter().all(|s| s.name != "write_todos"));
}

#[test]
fn two_user_middleware_with_one_name_are_refused() {
    let error = Agent::builder(scripted(json!([])))
        .middleware(QuietTodos)
        .middleware(QuietTodos)
        .build()
        .err()
        .unwrap();
    assert!(
        error
            .to_string()
            .contains("two middleware are named `todos`"),
        "{error}"
    );
}

/// Retries a model call once on a transient error.
struct RetryOnce;

#[async_trait]
impl Middleware for RetryOnce {
    fn name(&self) -> &str {
        "retry"
    }
    async fn wrap_model_call(
        &self,
        request: ModelRequest,
        next: ModelNext,
    ) -> Result<ModelResponse, ModelError> {
        match next.call(request.clone()).await {
            Err(error) if error.is_retryable() => next.call(request).await,
            other => other,
        }
    }
}

#[tokio::test]
async fn wrap_model_call_can_retry() {
    let agent = Agent::builder(scripted(json!([
        {"error": {"kind": "transient", "message": "connection reset"}},
        {"text": "second time lucky"}
    ])))
    .middleware(RetryOnce)
    .build()
    .unwrap();
    assert_eq!(agent.invoke("go").await.unwrap().text, "second time lucky");
}

/// Rewrites tool results and short-circuits a forbidden tool.
struct Guard;

#[async_trait]
impl Middleware for Guard {
    fn name(&self) -> &str {
        "guard"
    }
    async fn wrap_tool_call(
        &self,
        call: ToolCall,
        ctx: ToolContext,
        next: ToolNext,
    ) -> Result<ToolOutput, ToolError> {
        if call.arguments["todos"]
            .as_array()
            .is_some_and(Vec::is_empty)
        {
            return Err(ToolError::RespondToModel(
                "An empty plan is not allowed here.".into(),
            ));
        }
        let mut output = next.call(call, ctx).await?;
        output
            .content
            .push(deepagents::ContentBlock::text(" [checked]"));
        Ok(output)
    }
}

#[tokio::test]
async fn wrap_tool_call_can_refuse_and_rewrite() {
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [
            {"name": "write_todos", "args": {"todos": []}},
            {"name": "write_todos", "args": {"todos": [{"content": "x", "status": "pending"}]}}
        ]},
        {"text": "ok"}
    ])))
    .todos(true)
    .middleware(Guard)
    .build()
    .unwrap();
    let output = agent.invoke("go").await.unwrap();
    let results = tool_results(&output.run.state.messages);
    assert!(text(results[0]).contains("empty plan is not allowed"));
    assert!(text(results[1]).ends_with(" [checked]"));
    // Only the allowed call changed the plan.
    assert_eq!(output.run.state.todos.len(), 1);
}

struct FailsBeforeModel;

#[async_trait]
impl Middleware for FailsBeforeModel {
    fn name(&self) -> &str {
        "broken"
    }
    async fn before_model(
        &self,
        _ctx: &RunContext,
        _: &mut ModelRequest,
        _: &AgentState,
    ) -> Result<(), MiddlewareError> {
        Err("quota store unreachable".into())
    }
}

#[tokio::test]
async fn a_failing_hook_stops_the_run_naming_the_middleware() {
    let agent = Agent::builder(scripted(json!([{"text": "never"}])))
        .middleware(FailsBeforeModel)
        .build()
        .unwrap();
    let failure = agent.invoke("go").await.unwrap_err();
    assert_eq!(
        failure.to_string(),
        "middleware `broken` failed: quota store unreachable"
    );
}
