//! Middleware order, replacement, and what hooks can change.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use deepagents::middleware::{Middleware, MiddlewareError, ModelNext, ToolNext};
use deepagents::models::ScriptedModel;
use deepagents::{
    Agent, AgentState, DynamicTool, Message, ModelError, ModelRequest, ModelResponse, RunOutput,
    StateUpdate, ToolCall, ToolContext, ToolError, ToolOutput,
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

// ---- messages in state updates ------------------------------------------------------------

type Store = Arc<dyn deepagents::Checkpointer>;

/// The same in-memory store at every call.
fn memory() -> impl AsyncFn() -> Store {
    let store: Store = Arc::new(deepagents::InMemoryCheckpointer::new());
    async move || store.clone()
}

/// A SQLite database in `dir`, opened anew at every call (as a new process would).
fn sqlite(dir: &tempfile::TempDir) -> impl AsyncFn() -> Store {
    let path = dir.path().join("threads.db");
    async move || {
        let store = deepagents::backends::SqliteStore::open(&path)
            .await
            .unwrap();
        let store: Store = Arc::new(store.checkpointer());
        store
    }
}

/// One turn of thread `thread` with `input`.
async fn thread_turn(agent: &Agent, store: Store, thread: &str, input: &str) -> RunOutput {
    let (run, checkpoint) = deepagents::open_thread(store, thread, Some(input.to_owned()))
        .await
        .unwrap();
    let options = deepagents::RunOptions {
        checkpoint: Some(checkpoint),
        ..deepagents::RunOptions::default()
    };
    agent
        .run(run, options, deepagents::EventSink::discard())
        .await
        .unwrap()
}

/// The thread as stored.
async fn stored(store: Store, thread: &str) -> deepagents::Run {
    store.load(thread, None).await.unwrap().unwrap()
}

fn texts(messages: &[Message]) -> Vec<String> {
    messages.iter().map(Message::text).collect()
}

/// Before every model call, keeps only the latest user message of the conversation.
struct KeepLastUserMessage;

#[async_trait]
impl Middleware for KeepLastUserMessage {
    fn name(&self) -> &str {
        "keep_last_user_message"
    }
    async fn prepare_model_call(
        &self,
        _ctx: &RunContext,
        _request: &ModelRequest,
        state: &AgentState,
    ) -> Result<StateUpdate, MiddlewareError> {
        let last = state
            .messages
            .iter()
            .rev()
            .find(|m| matches!(m, Message::User { .. }))
            .cloned();
        Ok(StateUpdate {
            messages_from: Some(0),
            messages: last.into_iter().collect(),
            ..StateUpdate::default()
        })
    }
}

async fn a_prepared_trim_reaches_the_request_and_the_thread(open: impl AsyncFn() -> Store) {
    // The trimmed second turn starts a conversation of its own for the scripted model.
    let script = json!({
        "turns": [{"text": "first answer"}],
        "conversations": [
            {"when_task_contains": "second", "turns": [{"text": "second answer"}]}
        ]
    });
    let model = Arc::new(ScriptedModel::from_json(&script.to_string()).unwrap());
    let requests = Arc::new(Mutex::new(Vec::new()));
    let agent = Agent::builder(model)
        .middleware(KeepLastUserMessage)
        .middleware(Capture {
            requests: requests.clone(),
        })
        .build()
        .unwrap();
    let first = thread_turn(&agent, open().await, "t", "first question").await;
    assert_eq!(first.text, "first answer");
    let second = thread_turn(&agent, open().await, "t", "second question").await;
    assert_eq!(second.text, "second answer");

    let requests = requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    assert_eq!(texts(&requests[0].messages), ["first question"]);
    assert_eq!(
        *requests[1].messages,
        [Message::user("second question")],
        "the request holds only the kept message"
    );
    let expected = ["second question", "second answer"];
    assert_eq!(texts(&second.run.state.messages), expected);
    let reloaded = stored(open().await, "t").await;
    assert_eq!(texts(&reloaded.state.messages), expected);
    assert!(matches!(reloaded.state.messages[1], Message::Assistant(_)));
    assert_eq!(reloaded, second.run, "the stored thread is the live run");
}

#[tokio::test]
async fn a_prepared_trim_reaches_the_request_and_the_thread_in_memory() {
    a_prepared_trim_reaches_the_request_and_the_thread(memory()).await;
}

#[tokio::test]
async fn a_prepared_trim_reaches_the_request_and_the_thread_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    a_prepared_trim_reaches_the_request_and_the_thread(sqlite(&dir)).await;
}

/// Adds a note to the conversation when a run starts.
struct NoteAtStart;

#[async_trait]
impl Middleware for NoteAtStart {
    fn name(&self) -> &str {
        "note_at_start"
    }
    async fn before_run(
        &self,
        _ctx: &RunContext,
        _: &AgentState,
    ) -> Result<StateUpdate, MiddlewareError> {
        Ok(StateUpdate {
            messages: vec![Message::user("note: answer briefly")],
            ..StateUpdate::default()
        })
    }
}

async fn a_message_added_before_the_run_is_kept(open: impl AsyncFn() -> Store) {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let agent = Agent::builder(scripted(json!([{"text": "brief"}])))
        .middleware(NoteAtStart)
        .middleware(Capture {
            requests: requests.clone(),
        })
        .build()
        .unwrap();
    let output = thread_turn(&agent, open().await, "t", "go").await;
    let expected = ["go", "note: answer briefly", "brief"];
    assert_eq!(texts(&output.run.state.messages), expected);
    assert_eq!(
        texts(&requests.lock().unwrap()[0].messages),
        ["go", "note: answer briefly"]
    );
    let reloaded = stored(open().await, "t").await;
    assert_eq!(reloaded, output.run);
}

#[tokio::test]
async fn a_message_added_before_the_run_is_kept_in_memory() {
    a_message_added_before_the_run_is_kept(memory()).await;
}

#[tokio::test]
async fn a_message_added_before_the_run_is_kept_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    a_message_added_before_the_run_is_kept(sqlite(&dir)).await;
}

/// A tool whose update adds a user message, or (`rewrite`) tries to rewrite history.
fn noting_tool(rewrite: bool) -> Arc<DynamicTool> {
    let tool = DynamicTool::new(
        "note",
        "Leaves a note.",
        json!({"type": "object"}),
        move |_, _| async move {
            let update = StateUpdate {
                messages_from: rewrite.then_some(0),
                messages: vec![Message::user("a note from the tool")],
                ..StateUpdate::default()
            };
            Ok(ToolOutput::text("noted").with_update(update))
        },
    )
    .unwrap();
    Arc::new(tool)
}

async fn a_message_a_tool_adds_follows_its_result(open: impl AsyncFn() -> Store) {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"id": "n", "name": "note", "args": {}}]},
        {"text": "done"}
    ])))
    .dyn_tool(noting_tool(false))
    .middleware(Capture {
        requests: requests.clone(),
    })
    .build()
    .unwrap();
    let output = thread_turn(&agent, open().await, "t", "go").await;
    assert_eq!(output.text, "done");
    let messages = &output.run.state.messages;
    assert_eq!(messages.len(), 5);
    assert!(matches!(&messages[2], Message::Tool(result) if result.tool_call_id == "n"));
    assert_eq!(messages[3], Message::user("a note from the tool"));
    let requests = requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    assert_eq!(*requests[1].messages, messages[..4]);
    let reloaded = stored(open().await, "t").await;
    assert_eq!(reloaded, output.run);
}

#[tokio::test]
async fn a_message_a_tool_adds_follows_its_result_in_memory() {
    a_message_a_tool_adds_follows_its_result(memory()).await;
}

#[tokio::test]
async fn a_message_a_tool_adds_follows_its_result_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    a_message_a_tool_adds_follows_its_result(sqlite(&dir)).await;
}

#[tokio::test]
async fn a_tool_that_rewrites_history_stops_the_run() {
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"id": "n", "name": "note", "args": {}}]},
        {"text": "never"}
    ])))
    .dyn_tool(noting_tool(true))
    .build()
    .unwrap();
    let failure = agent.invoke("go").await.unwrap_err();
    assert!(
        failure
            .to_string()
            .contains("cannot rewrite earlier messages"),
        "{failure}"
    );
}
