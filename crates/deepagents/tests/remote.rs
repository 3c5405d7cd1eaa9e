//! Remote subagents over the Agent Protocol, against a wiremock server written from the
//! LangGraph API reference.

use deepagents::Agent;
use deepagents::middleware::{ASYNC_TASKS_KEY, RemoteSubAgent};
use serde_json::json;
use wiremock::matchers::{body_partial_json, header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::support::{assert_error_containing, scripted, text, tool_results};

fn call(name: &str, args: serde_json::Value) -> serde_json::Value {
    json!({"tool_calls": [{"name": name, "args": args}]})
}

#[tokio::test]
async fn background_tasks_start_check_update_list_and_cancel() {
    let server = MockServer::start().await;
    let ok = |body: serde_json::Value| ResponseTemplate::new(200).set_body_json(body);
    Mock::given(method("POST"))
        .and(path("/threads"))
        .and(header("x-api-key", "secret"))
        .respond_with(ok(json!({"thread_id": "th1"})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/threads/th1/runs"))
        .and(body_partial_json(json!({
            "assistant_id": "counter-graph",
            "input": {"messages": [{"role": "user", "content": "count the files"}]}
        })))
        .respond_with(ok(json!({"run_id": "r1", "status": "pending"})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/threads/th1/runs"))
        .and(body_partial_json(
            json!({"input": {"messages": [{"role": "user", "content": "only .rs files"}]}}),
        ))
        .respond_with(ok(json!({"run_id": "r2", "status": "pending"})))
        .expect(1)
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/threads/th1/runs/r1"))
        .respond_with(ok(json!({"run_id": "r1", "status": "running"})))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/threads/th1/runs/r2"))
        .respond_with(ok(json!({"run_id": "r2", "status": "success"})))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/threads/th1/state"))
        .respond_with(ok(json!({"values": {"messages": [
            {"type": "human", "content": "only .rs files"},
            {"type": "ai", "content": [{"type": "text", "text": "There are 7 .rs files."}]}
        ]}})))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/threads/th1/runs/r2/cancel"))
        .respond_with(ResponseTemplate::new(204))
        .expect(1)
        .mount(&server)
        .await;

    let agent = Agent::builder(scripted(json!([
        call("start_async_task", json!({"description": "count the files", "subagent_type": "counter"})),
        call("check_async_task", json!({"task_id": "th1"})),
        call("update_async_task", json!({"task_id": "th1", "message": "only .rs files"})),
        call("check_async_task", json!({"task_id": "th1"})),
        call("list_async_tasks", json!({})),
        call("cancel_async_task", json!({"task_id": "th1"})),
        {"tool_calls": [
            {"name": "check_async_task", "args": {"task_id": "nope"}},
            {"name": "start_async_task", "args": {"description": "x", "subagent_type": "ghost"}}
        ]},
        {"text": "done"}
    ])))
    .remote_subagent(RemoteSubAgent {
        name: "counter".into(),
        description: "Counts things in the repository.".into(),
        url: server.uri(),
        graph_id: "counter-graph".into(),
        headers: vec![("x-api-key".into(), "secret".into())],
    })
    .build()
    .unwrap();
    let output = agent.invoke("go").await.unwrap();
    let results = tool_results(&output.run.state.messages);
    assert_eq!(
        text(results[0]),
        "Started background task th1 on counter. Its answer will come to you as a message when it ends; go on meanwhile."
    );
    assert_eq!(text(results[1]), "Task th1 is still running.");
    assert_eq!(text(results[2]), "Task th1 received the new instructions.");
    assert_eq!(
        text(results[3]),
        "Task th1 finished:\nThere are 7 .rs files."
    );
    assert_eq!(text(results[4]), "th1 (counter): success: count the files");
    assert_eq!(text(results[5]), "Task th1 was cancelled.");
    assert_error_containing(results[6], "No background task `nope`");
    assert_error_containing(
        results[7],
        "Unknown background agent `ghost`. Use one of: counter.",
    );
    let tasks = &output.run.state.custom[ASYNC_TASKS_KEY];
    assert_eq!(tasks["th1"]["status"], "cancelled");
    assert_eq!(tasks["th1"]["run_id"], "r2");
}

#[tokio::test]
async fn an_unreachable_server_is_an_error_the_model_can_act_on() {
    let agent = Agent::builder(scripted(json!([
        call("start_async_task", json!({"description": "x", "subagent_type": "far"})),
        {"text": "done"}
    ])))
    .remote_subagent(RemoteSubAgent {
        name: "far".into(),
        description: "Far away.".into(),
        url: "http://127.0.0.1:9".into(),
        graph_id: "g".into(),
        headers: vec![],
    })
    .build()
    .unwrap();
    let output = agent.invoke("go").await.unwrap();
    assert_error_containing(
        tool_results(&output.run.state.messages)[0],
        "The remote agent `far` at http://127.0.0.1:9 could not be reached",
    );
}

#[tokio::test]
async fn a_remote_tasks_ending_wakes_its_parent_without_polling() {
    let server = MockServer::start().await;
    let ok = |body: serde_json::Value| ResponseTemplate::new(200).set_body_json(body);
    Mock::given(method("POST"))
        .and(path("/threads"))
        .respond_with(ok(json!({"thread_id": "th9"})))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/threads/th9/runs"))
        .respond_with(ok(json!({"run_id": "r9", "status": "pending"})))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/threads/th9/runs/r9/join"))
        .respond_with(ok(json!({})))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/threads/th9/runs/r9"))
        .respond_with(ok(json!({"run_id": "r9", "status": "success"})))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/threads/th9/state"))
        .respond_with(ok(json!({"values": {"messages": [
            {"type": "ai", "content": "There are 3 files."}
        ]}})))
        .mount(&server)
        .await;
    let agent = Agent::builder(scripted(json!([
        call("start_async_task", json!({"description": "count", "subagent_type": "counter"})),
        {"text": "Started."},
        {"text": "The counter found 3 files."}
    ])))
    .checkpointer(std::sync::Arc::new(
        deepagents::core::InMemoryCheckpointer::new(),
    ))
    .remote_subagent(RemoteSubAgent {
        name: "counter".into(),
        description: "Counts things.".into(),
        url: server.uri(),
        graph_id: "g".into(),
        headers: vec![],
    })
    .build()
    .unwrap();
    let thread = agent.thread("remote-wake").unwrap();
    assert_eq!(thread.run("go").await.unwrap().text, "Started.");
    let endings = tokio::time::timeout(std::time::Duration::from_secs(20), thread.next_wake())
        .await
        .unwrap()
        .unwrap()
        .expect("a wake");
    assert_eq!(endings[0].task_id, "th9");
    assert_eq!(endings[0].answer, "There are 3 files.");
    let woken = thread.run(deepagents::Input::Wake).await.unwrap();
    assert_eq!(woken.text, "The counter found 3 files.");
    assert!(
        woken
            .run
            .state
            .messages
            .iter()
            .any(|m| m.text().contains("There are 3 files."))
    );
    assert!(crate::support::nothing_to_wake(
        thread.run(deepagents::Input::Wake).await
    ));
}
