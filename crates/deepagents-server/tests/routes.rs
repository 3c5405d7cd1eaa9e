//! Routes checked in process (`Router` + `oneshot`): what web clients rely on.

use super::call;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use deepagents::backends::InMemoryStore;
use deepagents::core::InMemoryCheckpointer;
use deepagents_server::{Assistant, ServerOptions, StepWatch};
use serde_json::{Value, json};
use tower::ServiceExt as _;

fn app() -> axum::Router {
    app_of(|watch| super::agent(watch))
}

/// The routes serving the agent `agent` builds over the server's watch, as assistant `agent`.
fn app_of(agent: impl FnOnce(Arc<StepWatch>) -> deepagents::Agent) -> axum::Router {
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::new()));
    let options = ServerOptions::new(
        vec![Assistant::new("agent", agent(watch.clone()))],
        Arc::new(InMemoryStore::new()),
        watch,
    );
    deepagents_server::router(options).unwrap()
}

/// A new thread's id.
async fn new_thread(app: &axum::Router) -> String {
    let (_, thread) = call(app, "POST", "/threads", json!({})).await;
    thread["thread_id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_records_its_assistant_on_the_thread_so_a_graphs_threads_can_be_listed() {
    let app = app();
    let (status, thread) = call(&app, "POST", "/threads", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let id = thread["thread_id"].as_str().unwrap().to_owned();
    let (status, _) = call(
        &app,
        "POST",
        &format!("/threads/{id}/runs/wait"),
        json!({"assistant_id": "agent", "input": {"messages": [{"type": "human", "content": "hi"}]}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, found) = call(
        &app,
        "POST",
        "/threads/search",
        json!({"metadata": {"graph_id": "agent"}, "limit": 100}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let found = found.as_array().unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0]["thread_id"], id.as_str());
    let assistant_id = found[0]["metadata"]["assistant_id"].as_str().unwrap();
    let (_, assistant) = call(
        &app,
        "GET",
        &format!("/assistants/{assistant_id}"),
        Value::Null,
    )
    .await;
    assert_eq!(assistant["graph_id"], "agent");
    // Assistants are dated when the server was set up, not at the epoch.
    assert!(
        !assistant["created_at"]
            .as_str()
            .unwrap()
            .starts_with("1970"),
        "{assistant}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn fields_the_server_does_not_act_on_are_refused_by_name() {
    let app = app();
    let id = new_thread(&app).await;
    for (field, value) in [
        ("webhook", json!("http://127.0.0.1:9/hook")),
        ("interrupt_before", json!(["tools"])),
        ("interrupt_after", json!("*")),
        ("after_seconds", json!(5)),
    ] {
        let mut body = json!({"assistant_id": "agent", "input": {"messages": [{"type": "human", "content": "hi"}]}});
        body[field] = value;
        let (status, answer) = call(&app, "POST", &format!("/threads/{id}/runs"), body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{field}");
        assert!(
            answer["detail"].as_str().unwrap().contains(field),
            "{answer}"
        );
    }
    // Their empty forms, which SDKs may send, ask for nothing.
    let (status, _) = call(
        &app,
        "POST",
        &format!("/threads/{id}/runs/wait"),
        json!({"assistant_id": "agent", "input": {"messages": [{"type": "human", "content": "hi"}]},
               "webhook": null, "interrupt_before": [], "after_seconds": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
}

/// "Mark as resolved" (`command.goto: "__end__"`): the paused turn ends without running the
/// call that waited, the thread is idle with nothing pending, and the next message starts a
/// new turn. Any other `goto` is refused by name.
#[tokio::test(flavor = "multi_thread")]
async fn goto_end_ends_a_paused_turn_without_running_what_waited() {
    let app = app_of(|watch| super::writer(watch));
    let id = new_thread(&app).await;
    let wait = format!("/threads/{id}/runs/wait");
    let (status, paused) = call(
        &app,
        "POST",
        &wait,
        json!({"assistant_id": "agent", "input": {"messages": [{"type": "human", "content": "write"}]}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(paused["__interrupt__"][0]["id"].is_string(), "{paused}");
    let (status, answer) = call(
        &app,
        "POST",
        &wait,
        json!({"assistant_id": "agent", "command": {"goto": "somewhere"}}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        answer["detail"].as_str().unwrap().contains("__end__"),
        "{answer}"
    );
    let (status, ended) = call(
        &app,
        "POST",
        &wait,
        json!({"assistant_id": "agent", "input": null, "command": {"goto": "__end__", "update": null}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{ended}");
    assert!(ended.get("__interrupt__").is_none(), "{ended}");
    assert!(
        ended["files"].get("/one.md").is_none(),
        "the waiting write did not run: {ended}"
    );
    let last = ended["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["type"], "tool", "{last}");
    let (_, thread) = call(&app, "GET", &format!("/threads/{id}"), Value::Null).await;
    assert_eq!(thread["status"], "idle", "{thread}");
    assert_eq!(thread["interrupts"], json!({}), "{thread}");
    // The next message is a new turn (the script's next turn asks for the second write).
    let (status, next) = call(
        &app,
        "POST",
        &wait,
        json!({"assistant_id": "agent", "input": {"messages": [{"type": "human", "content": "go on"}]}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{next}");
    assert_eq!(
        next["__interrupt__"][0]["value"]["action_requests"][0]["args"]["file_path"], "/two.md",
        "{next}"
    );
}

/// Typing while an approval waits: the UI sends a tool message answering the waiting call,
/// then the user's message. The call takes that result without running, and the run goes on
/// from both; a tool message for a call that does not wait is refused.
#[tokio::test(flavor = "multi_thread")]
async fn tool_messages_in_the_input_answer_the_waiting_calls() {
    let app = app_of(|watch| super::writer(watch));
    let id = new_thread(&app).await;
    let wait = format!("/threads/{id}/runs/wait");
    let (_, paused) = call(
        &app,
        "POST",
        &wait,
        json!({"assistant_id": "agent", "input": {"messages": [{"type": "human", "content": "write"}]}}),
    )
    .await;
    let call_id = paused["__interrupt__"][0]["value"]["action_requests"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, answer) = call(
        &app,
        "POST",
        &wait,
        json!({"assistant_id": "agent", "input": {"messages": [
            {"type": "tool", "tool_call_id": "call-that-does-not-wait", "content": "x"},
            {"type": "human", "content": "never mind"}
        ]}}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert!(
        answer["detail"]
            .as_str()
            .unwrap()
            .contains("call-that-does-not-wait"),
        "{answer}"
    );
    let (status, next) = call(
        &app,
        "POST",
        &wait,
        json!({"assistant_id": "agent", "input": {"messages": [
            {"type": "tool", "tool_call_id": call_id, "content": "The user cancelled this.", "name": "write_file"},
            {"type": "human", "content": "never mind, write the second"}
        ]}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{next}");
    assert!(
        next["files"].get("/one.md").is_none(),
        "the answered call did not run: {next}"
    );
    let messages = next["messages"].as_array().unwrap();
    let answered = messages
        .iter()
        .find(|m| m["type"] == "tool" && m["tool_call_id"] == call_id.as_str())
        .unwrap_or_else(|| panic!("no result for {call_id}: {next}"));
    assert_eq!(answered["content"], "The user cancelled this.");
    assert!(
        messages
            .iter()
            .any(|m| m["type"] == "human" && m["content"] == "never mind, write the second"),
        "{next}"
    );
    // The run went on: the model's next turn asks for the second write.
    assert_eq!(
        next["__interrupt__"][0]["value"]["action_requests"][0]["args"]["file_path"], "/two.md",
        "{next}"
    );
}

fn talker(watch: Arc<StepWatch>) -> deepagents::Agent {
    let turns: Vec<Value> = (1..=6).map(|n| json!({"text": format!("A{n}")})).collect();
    let model = Arc::new(
        deepagents::models::ScriptedModel::from_json(&json!({ "turns": turns }).to_string())
            .unwrap(),
    );
    deepagents::Agent::builder(model)
        .checkpointer(watch)
        .build()
        .unwrap()
}

fn texts(values: &Value) -> Vec<String> {
    values["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}:{}",
                m["type"].as_str().unwrap(),
                m["content"].as_str().unwrap()
            )
        })
        .collect()
}

/// The parent of the first state, on the branch the latest state is on, holding the message
/// with `content`: what the SDK's `getMessagesMetadata(...).firstSeenState.parent_checkpoint`
/// gives a UI.
fn first_seen_parent(history: &[Value], content: &str) -> String {
    let id = |state: &Value| {
        state["checkpoint"]["checkpoint_id"]
            .as_str()
            .map(str::to_owned)
    };
    let parent = |state: &Value| {
        state["parent_checkpoint"]["checkpoint_id"]
            .as_str()
            .map(str::to_owned)
    };
    // The latest state's ancestors, root last.
    let mut chain = vec![history[0].clone()];
    while let Some(up) = parent(chain.last().unwrap()) {
        let state = history
            .iter()
            .find(|state| id(state).as_deref() == Some(up.as_str()))
            .unwrap_or_else(|| panic!("checkpoint {up} is not in the history"));
        chain.push(state.clone());
    }
    let first = chain
        .iter()
        .rev()
        .find(|state| {
            state["values"]["messages"]
                .as_array()
                .is_some_and(|ms| ms.iter().any(|m| m["content"] == content))
        })
        .unwrap_or_else(|| panic!("{content} in no state of the branch: {chain:?}"));
    parent(first).unwrap_or_else(|| panic!("no parent: {first}"))
}

/// Edit and regenerate: a run from an earlier checkpoint starts from its state (a branch the
/// history shows through `parent_checkpoint`), the input checkpoint 0 closes the history so
/// the first message can be edited, and naming the latest checkpoint changes nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_from_a_checkpoint_forks_the_thread_there() {
    let app = app_of(talker);
    let id = new_thread(&app).await;
    let wait = format!("/threads/{id}/runs/wait");
    let say = |text: &str| json!({"assistant_id": "agent", "input": {"messages": [{"type": "human", "content": text}]}});
    let (_, values) = call(&app, "POST", &wait, say("one")).await;
    assert_eq!(texts(&values), ["human:one", "ai:A1"]);
    let history_path = format!("/threads/{id}/history");
    let (_, history) = call(&app, "POST", &history_path, json!({"limit": 100})).await;
    let history = history.as_array().unwrap().clone();
    let start = history.last().unwrap();
    assert_eq!(start["checkpoint"]["checkpoint_id"], "0", "{start}");
    assert_eq!(start["values"]["messages"], json!([]));
    assert!(start["parent_checkpoint"].is_null());

    // Edit the first message: from its parent, the input checkpoint.
    let parent = first_seen_parent(&history, "one");
    assert_eq!(parent, "0");
    let mut edit = say("uno");
    edit["checkpoint"] =
        json!({"checkpoint_id": parent, "checkpoint_ns": "", "checkpoint_map": null});
    let (status, values) = call(&app, "POST", &wait, edit).await;
    assert_eq!(status, StatusCode::OK, "{values}");
    // (The scripted model plays the turn after the conversation's latest answer: A1 again.)
    assert_eq!(texts(&values), ["human:uno", "ai:A1"]);

    // Regenerate the answer: from the parent of the state where it first appears.
    let (_, history) = call(&app, "POST", &history_path, json!({"limit": 100})).await;
    let history = history.as_array().unwrap().clone();
    let branch = history
        .iter()
        .find(|state| {
            state["parent_checkpoint"]["checkpoint_id"] == "0"
                && state["checkpoint"]["checkpoint_id"]
                    != history[history.len() - 2]["checkpoint"]["checkpoint_id"]
        })
        .unwrap_or_else(|| panic!("no branch from checkpoint 0: {history:?}"));
    // The edited message starts a branch from checkpoint 0, beside the original one.
    assert_eq!(texts(&branch["values"]), ["human:uno"]);
    let old_answer = history[0]["values"]["messages"][1]["id"].clone();
    let parent = first_seen_parent(&history, "A1");
    let regenerate = json!({"assistant_id": "agent", "input": null, "checkpoint": {"checkpoint_id": parent.clone()}});
    let (status, values) = call(&app, "POST", &wait, regenerate).await;
    assert_eq!(status, StatusCode::OK, "{values}");
    assert_eq!(texts(&values), ["human:uno", "ai:A1"]);
    // The regenerated answer sits where the old one did, under an id of its own; the message
    // before it keeps its id.
    assert_ne!(values["messages"][1]["id"], old_answer, "{values}");
    assert_eq!(
        values["messages"][0]["id"],
        history[0]["values"]["messages"][0]["id"]
    );
    let (_, after) = call(&app, "POST", &history_path, json!({"limit": 100})).await;
    let after = after.as_array().unwrap();
    assert!(after.len() > history.len());
    assert_eq!(
        first_seen_parent(after, "A1"),
        parent,
        "the new answer is a sibling of the old one"
    );

    // The latest checkpoint, as UIs send on every submit: the conversation goes on.
    let (_, state) = call(&app, "GET", &format!("/threads/{id}/state"), Value::Null).await;
    let mut next = say("two");
    next["checkpoint"] = state["checkpoint"].clone();
    let (_, values) = call(&app, "POST", &wait, next).await;
    assert_eq!(texts(&values), ["human:uno", "ai:A1", "human:two", "ai:A2"]);

    let mut unknown = say("three");
    unknown["checkpoint"] = json!({"checkpoint_id": "9999"});
    let (status, answer) = call(&app, "POST", &wait, unknown).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert!(
        answer["detail"].as_str().unwrap().contains("9999"),
        "{answer}"
    );
}

/// `wait` answers what the thread's state shows once the run ended (a forked thread's
/// message ids included), and `join` of an earlier run answers the thread as it is now.
#[tokio::test(flavor = "multi_thread")]
async fn wait_answers_the_threads_state_and_join_the_thread_as_it_is_now() {
    let app = app_of(talker);
    let id = new_thread(&app).await;
    let wait = format!("/threads/{id}/runs/wait");
    let state_path = format!("/threads/{id}/state");
    let say = |text: &str| json!({"assistant_id": "agent", "input": {"messages": [{"type": "human", "content": text}]}});
    let (status, values) = call(&app, "POST", &wait, say("one")).await;
    assert_eq!(status, StatusCode::OK, "{values}");
    let (_, state) = call(&app, "GET", &state_path, Value::Null).await;
    assert_eq!(values, state["values"]);
    // A regenerated answer (a fork) is named apart from the one it replaces, in `wait` too.
    let (_, history) = call(
        &app,
        "POST",
        &format!("/threads/{id}/history"),
        json!({"limit": 100}),
    )
    .await;
    let parent = first_seen_parent(history.as_array().unwrap(), "A1");
    let regenerate =
        json!({"assistant_id": "agent", "input": null, "checkpoint": {"checkpoint_id": parent}});
    let (status, values) = call(&app, "POST", &wait, regenerate).await;
    assert_eq!(status, StatusCode::OK, "{values}");
    let (_, state) = call(&app, "GET", &state_path, Value::Null).await;
    assert_eq!(values, state["values"]);
    // A run to join, then a later one: the join answers the thread after both.
    let (_, first) = call(&app, "POST", &format!("/threads/{id}/runs"), say("two")).await;
    let mut three = say("three");
    three["multitask_strategy"] = json!("enqueue");
    let (_, after) = call(&app, "POST", &wait, three).await;
    let first_id = first["run_id"].as_str().unwrap();
    let (status, joined) = call(
        &app,
        "GET",
        &format!("/threads/{id}/runs/{first_id}/join"),
        Value::Null,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{joined}");
    assert_eq!(joined, after);
    assert_eq!(
        texts(&joined)[2..],
        ["human:two", "ai:A2", "human:three", "ai:A3"],
        "{joined}"
    );
}

/// A run's `context` is the run's runtime context: the tools of the run read it.
#[tokio::test(flavor = "multi_thread")]
async fn a_runs_context_reaches_its_tools() {
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::new()));
    let script = json!({"turns": [
        {"tool_calls": [{"name": "whoami", "args": {}}]},
        {"text": "done"}
    ]});
    let model =
        Arc::new(deepagents::models::ScriptedModel::from_json(&script.to_string()).unwrap());
    let whoami = deepagents::core::DynamicTool::new(
        "whoami",
        "Who the run acts for.",
        json!({"type": "object", "properties": {}}),
        |_, ctx: deepagents::core::ToolContext| async move {
            let user = ctx
                .run
                .runtime
                .get::<Value>()
                .and_then(|context| context["user_id"].as_str().map(str::to_owned))
                .unwrap_or_else(|| "nobody".to_owned());
            Ok(deepagents::core::ToolOutput::text(user))
        },
    )
    .unwrap();
    let agent = deepagents::Agent::builder(model)
        .dyn_tool(Arc::new(whoami))
        .checkpointer(watch.clone())
        .build()
        .unwrap();
    let options = ServerOptions::new(
        vec![Assistant::new("agent", agent)],
        Arc::new(InMemoryStore::new()),
        watch,
    );
    let app = deepagents_server::router(options).unwrap();
    let id = new_thread(&app).await;
    let wait = format!("/threads/{id}/runs/wait");
    let (status, answer) = call(
        &app,
        "POST",
        &wait,
        json!({"assistant_id": "agent", "context": "alice"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    let (status, values) = call(
        &app,
        "POST",
        &wait,
        json!({"assistant_id": "agent", "context": {"user_id": "alice"},
               "input": {"messages": [{"type": "human", "content": "who am I?"}]}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{values}");
    let result = values["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["type"] == "tool")
        .unwrap();
    assert_eq!(result["content"], "alice", "{values}");
}

/// LangGraph Studio draws the assistant's graph; subagents are tools, not subgraphs.
#[tokio::test(flavor = "multi_thread")]
async fn an_assistants_graph_is_the_agent_loop() {
    let app = app();
    let (status, graph) = call(&app, "GET", "/assistants/agent/graph", Value::Null).await;
    assert_eq!(status, StatusCode::OK);
    let nodes: Vec<&str> = graph["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["id"].as_str().unwrap())
        .collect();
    assert_eq!(nodes, ["__start__", "model", "tools", "__end__"]);
    assert!(
        graph["edges"]
            .as_array()
            .unwrap()
            .contains(&json!({"source": "tools", "target": "model"}))
    );
    let (status, subgraphs) = call(&app, "GET", "/assistants/agent/subgraphs", Value::Null).await;
    assert_eq!((status, subgraphs), (StatusCode::OK, json!({})));
    let (status, _) = call(&app, "GET", "/assistants/nobody/graph", Value::Null).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A body over the limit is a 413 (too large), not a 422 (malformed).
#[tokio::test(flavor = "multi_thread")]
async fn a_body_over_the_limit_is_too_large() {
    let store = Arc::new(InMemoryStore::new());
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::new()));
    let mut options = ServerOptions::new(
        vec![Assistant::new("agent", super::agent(watch.clone()))],
        store,
        watch,
    );
    options.max_body_bytes = 1024;
    let app = deepagents_server::router(options).unwrap();
    let big = json!({"metadata": {"blob": "x".repeat(4096)}});
    let (status, answer) = call(&app, "POST", "/threads", big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    assert!(
        answer["detail"].as_str().unwrap().contains("too large"),
        "{answer}"
    );
}

/// A store item whose namespace could not be read back (a label with a dot, as GET joins
/// labels with dots) is refused when written; a valid one reads back.
#[tokio::test(flavor = "multi_thread")]
async fn store_items_are_written_only_where_they_can_be_read_back() {
    let app = app();
    let (status, answer) = call(
        &app,
        "PUT",
        "/store/items",
        json!({"namespace": ["users", "a.b"], "key": "k", "value": {"x": 1}}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert!(
        answer["detail"].as_str().unwrap().contains("a.b"),
        "{answer}"
    );
    let (status, _) = call(
        &app,
        "PUT",
        "/store/items",
        json!({"namespace": ["users", "ab"], "key": "k", "value": {"x": 1}}),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, item) = call(
        &app,
        "GET",
        "/store/items?namespace=users.ab&key=k",
        Value::Null,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{item}");
    assert_eq!(item["value"], json!({"x": 1}));
}

/// Payloads are typed: a field of the wrong shape or an unknown value is a 422 that names the
/// field and says what it should be; fields the server does not know, and `null`s, are fine.
#[tokio::test(flavor = "multi_thread")]
async fn a_field_of_the_wrong_shape_is_refused_by_name() {
    let app = app();
    let id = new_thread(&app).await;
    let runs = format!("/threads/{id}/runs");
    for (path, body, says) in [
        (
            runs.as_str(),
            json!({"assistant_id": "agent", "multitask_strategy": "bogus"}),
            vec![
                "multitask_strategy",
                "reject",
                "enqueue",
                "interrupt",
                "rollback",
                "bogus",
            ],
        ),
        (
            runs.as_str(),
            json!({"assistant_id": "agent", "stream_mode": 5}),
            vec!["`stream_mode` must be a string or a list of strings"],
        ),
        (
            runs.as_str(),
            json!({"assistant_id": "agent", "stream_mode": ["values", 5]}),
            vec!["`stream_mode` must be a string or a list of strings"],
        ),
        (
            runs.as_str(),
            json!({"assistant_id": "agent", "stream_mode": "telepathy"}),
            vec!["unknown stream mode `telepathy`"],
        ),
        (
            runs.as_str(),
            json!({"assistant_id": "agent", "if_not_exists": "maybe"}),
            vec!["if_not_exists", "create"],
        ),
        (
            runs.as_str(),
            json!({"assistant_id": "agent", "on_disconnect": 1}),
            vec!["`on_disconnect` must be a string"],
        ),
        (
            runs.as_str(),
            json!({"assistant_id": "agent", "checkpoint": true}),
            vec!["`checkpoint` must be a checkpoint id"],
        ),
        (
            runs.as_str(),
            json!({"assistant_id": "agent", "command": {"goto": "tools"}}),
            vec!["command.goto may only be"],
        ),
        (
            runs.as_str(),
            json!({"assistant_id": 5}),
            vec!["`assistant_id` must be a string"],
        ),
        (
            runs.as_str(),
            json!({"input": {}}),
            vec!["`assistant_id` is missing"],
        ),
        (
            "/threads",
            json!({"thread_id": 5}),
            vec!["`thread_id` must be a string"],
        ),
        (
            "/threads",
            json!({"metadata": [1]}),
            vec!["`metadata` must be an object"],
        ),
        (
            "/threads",
            json!({"if_exists": "overwrite"}),
            vec!["if_exists", "do_nothing"],
        ),
        (
            "/threads/search",
            json!({"limit": "ten"}),
            vec!["`limit` must be a non-negative integer"],
        ),
        (
            "/threads/search",
            json!({"offset": -1}),
            vec!["`offset` must be a non-negative integer"],
        ),
        (
            "/threads/search",
            json!({"status": "sleeping"}),
            vec!["status", "idle", "busy"],
        ),
        (
            "/threads/search",
            json!({"sort_order": "up"}),
            vec!["sort_order", "asc"],
        ),
        (
            "/assistants/search",
            json!({"graph_id": 1}),
            vec!["`graph_id` must be a string"],
        ),
        (
            "/store/items/search",
            json!({"namespace_prefix": ["a", 1]}),
            vec!["`namespace_prefix` must be a list of strings"],
        ),
        (
            "/store/namespaces",
            json!({"max_depth": "deep"}),
            vec!["`max_depth` must be a non-negative integer"],
        ),
    ] {
        let (status, answer) = call(&app, "POST", path, body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {answer}");
        let detail = answer["detail"].as_str().unwrap();
        for text in says {
            assert!(detail.contains(text), "{body}: {detail} lacks {text}");
        }
    }
    // Query strings too: a cancel action or a run status that does not exist.
    let (status, run) = call(
        &app,
        "POST",
        &format!("/threads/{id}/runs/wait"),
        json!({"assistant_id": "agent", "input": {"messages": [{"type": "human", "content": "hi"}]}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{run}");
    let (_, listed) = call(&app, "GET", &runs, Value::Null).await;
    let run_id = listed[0]["run_id"].as_str().unwrap().to_owned();
    let (status, answer) = call(
        &app,
        "POST",
        &format!("{runs}/{run_id}/cancel?action=explode"),
        Value::Null,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    let detail = answer["detail"].as_str().unwrap();
    assert!(
        detail.contains("action") && detail.contains("rollback"),
        "{detail}"
    );
    let (status, answer) = call(&app, "GET", &format!("{runs}?status=done"), Value::Null).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
    assert!(
        answer["detail"].as_str().unwrap().contains("status"),
        "{answer}"
    );
    let (status, listed) = call(
        &app,
        "GET",
        &format!("{runs}?status=success&limit=5"),
        Value::Null,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    // Unknown fields and nulls are accepted.
    let (status, answer) = call(
        &app,
        "POST",
        &format!("/threads/{id}/runs/wait"),
        json!({"assistant_id": "agent", "input": {"messages": [{"type": "human", "content": "again"}]},
               "some_new_field": {"x": 1}, "stream_mode": null, "metadata": null,
               "checkpoint": null, "multitask_strategy": null, "feedback_keys": null}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, found) = call(
        &app,
        "POST",
        "/threads/search",
        json!({"limit": null, "sort_by": "created_at", "sort_order": "asc", "values": {}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{found}");
}

/// A checkpointer whose next `fail` loads fail (a storage hiccup), over an in-memory one.
struct Flaky {
    inner: deepagents::core::InMemoryCheckpointer,
    fail: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl deepagents::core::Checkpointer for Flaky {
    async fn append(
        &self,
        thread_id: &str,
        delta: &deepagents::core::RunDelta,
        run: &deepagents::core::Run,
    ) -> Result<u64, deepagents::core::CheckpointError> {
        self.inner.append(thread_id, delta, run).await
    }

    async fn load(
        &self,
        thread_id: &str,
        at: Option<u64>,
    ) -> Result<Option<deepagents::core::Run>, deepagents::core::CheckpointError> {
        use std::sync::atomic::Ordering;
        if self
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(deepagents::core::CheckpointError::Storage(
                "the disk hiccupped".to_owned(),
            ));
        }
        self.inner.load(thread_id, at).await
    }

    async fn checkpoints(
        &self,
        thread_id: &str,
    ) -> Result<Vec<deepagents::core::CheckpointInfo>, deepagents::core::CheckpointError> {
        self.inner.checkpoints(thread_id).await
    }

    async fn threads(
        &self,
    ) -> Result<Vec<deepagents::core::ThreadInfo>, deepagents::core::CheckpointError> {
        self.inner.threads().await
    }

    async fn try_lease(
        &self,
        thread_id: &str,
    ) -> Result<deepagents::core::ThreadLease, deepagents::core::CheckpointError> {
        self.inner.try_lease(thread_id).await
    }

    async fn delete_thread(
        &self,
        thread_id: &str,
    ) -> Result<bool, deepagents::core::CheckpointError> {
        self.inner.delete_thread(thread_id).await
    }
}

/// The thread as it was before a run is what a rollback restores: when it cannot be read,
/// the run fails (taken as empty, a rollback would delete the thread) and says why.
#[tokio::test(flavor = "multi_thread")]
async fn a_run_whose_thread_cannot_be_read_first_fails() {
    let flaky = Arc::new(Flaky {
        inner: InMemoryCheckpointer::new(),
        fail: std::sync::atomic::AtomicUsize::new(0),
    });
    let watch = StepWatch::new(flaky.clone());
    let options = ServerOptions::new(
        vec![Assistant::new("agent", super::agent(watch.clone()))],
        Arc::new(InMemoryStore::new()),
        watch,
    );
    let app = deepagents_server::router(options).unwrap();
    let id = new_thread(&app).await;
    // The next load is the run's own, of the thread before it.
    flaky.fail.store(1, std::sync::atomic::Ordering::SeqCst);
    let (status, answer) = call(
        &app,
        "POST",
        &format!("/threads/{id}/runs/wait"),
        json!({"assistant_id": "agent", "input": {"messages": [{"type": "human", "content": "hi"}]}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(flaky.fail.load(std::sync::atomic::Ordering::SeqCst), 0);
    assert!(
        answer["__error__"]["message"]
            .as_str()
            .is_some_and(|message| message.contains("the disk hiccupped")),
        "{answer}"
    );
    let (_, runs) = call(&app, "GET", &format!("/threads/{id}/runs"), Value::Null).await;
    assert_eq!(runs[0]["status"], "error", "{runs}");
    // Nothing ran: the thread is as it was, and says the run failed.
    let (_, state) = call(&app, "GET", &format!("/threads/{id}/state"), Value::Null).await;
    assert!(state["checkpoint"].is_null(), "{state}");
    let (_, thread) = call(&app, "GET", &format!("/threads/{id}"), Value::Null).await;
    assert_eq!(thread["status"], "error", "{thread}");
}

/// The largest offsets and event ids a client can send are answered, not wrapped around.
#[tokio::test(flavor = "multi_thread")]
async fn the_largest_offsets_and_event_ids_do_not_wrap_around() {
    let app = app();
    let id = new_thread(&app).await;
    let request = Request::builder()
        .method("POST")
        .uri("/threads/search")
        .header("content-type", "application/json")
        .body(Body::from(
            json!({"offset": u64::MAX, "limit": 10}).to_string(),
        ))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers().get("x-pagination-next").is_none());
    let (status, run) = call(
        &app,
        "POST",
        &format!("/threads/{id}/runs/wait"),
        json!({"assistant_id": "agent", "input": {"messages": [{"type": "human", "content": "hi"}]}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{run}");
    let (_, runs) = call(&app, "GET", &format!("/threads/{id}/runs"), Value::Null).await;
    let run_id = runs[0]["run_id"].as_str().unwrap().to_owned();
    let request = Request::builder()
        .uri(format!("/threads/{id}/runs/{run_id}/stream"))
        .header("last-event-id", u64::MAX.to_string())
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        axum::body::to_bytes(response.into_body(), 1 << 20),
    )
    .await
    .expect("the stream of an ended run ends")
    .unwrap();
    // Nothing after the last id: no frame is sent twice.
    assert!(
        !String::from_utf8_lossy(&body).contains("event: values"),
        "{body:?}"
    );
}
