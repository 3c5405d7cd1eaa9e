//! Threads and checkpoints: continuing, resuming after a crash, forking.

use std::sync::Arc;

use deepagents::core::message::{AssistantMessage, ToolCall};
use deepagents::core::{Checkpointer, InMemoryCheckpointer, RunDelta};
use deepagents::{Agent, Message, Run, RunOptions, open_thread};
use serde_json::json;

use crate::support::{scripted, text, tool_results};

async fn turn(
    agent: &Agent,
    store: &Arc<InMemoryCheckpointer>,
    thread: &str,
    input: Option<&str>,
) -> deepagents::RunOutput {
    let (run, checkpoint) = open_thread(store.clone(), thread, input.map(str::to_owned))
        .await
        .unwrap();
    let options = RunOptions {
        checkpoint: Some(checkpoint),
        ..RunOptions::default()
    };
    agent
        .run(run, options, deepagents::EventSink::discard())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_thread_continues_where_it_left_off_and_stores_only_deltas() {
    let store = Arc::new(InMemoryCheckpointer::new());
    let agent = Agent::builder(scripted(json!([
        {"text": "one", "tool_calls": [{"id": "w", "name": "write_file", "args": {"file_path": "/a.txt", "content": "a\n"}}]},
        {"text": "first answer"},
        {"text": "second answer"}
    ])))
    .build()
    .unwrap();
    let first = turn(&agent, &store, "t1", Some("first question")).await;
    assert_eq!(first.text, "first answer");
    let second = turn(&agent, &store, "t1", Some("second question")).await;
    assert_eq!(second.text, "second answer");
    let loaded = store.load("t1", None).await.unwrap().unwrap();
    assert_eq!(loaded.state.messages, second.run.state.messages);
    assert_eq!(loaded.state.messages.len(), 6);
    assert!(
        loaded.state.files.contains_key("/a.txt"),
        "state files survive"
    );
    let checkpoints = store.checkpoints("t1").await.unwrap();
    assert!(checkpoints.len() >= 4);
    assert_eq!(checkpoints.last().unwrap().messages, 6);
    assert_eq!(store.threads().await.unwrap()[0].thread_id, "t1");
}

#[tokio::test]
async fn a_crash_mid_step_reruns_read_only_calls_and_marks_mutating_ones() {
    let store = Arc::new(InMemoryCheckpointer::new());
    // What a process killed in the middle of a tool step leaves behind.
    let mut run = Run::from_task("go");
    run.state
        .messages
        .push(Message::Assistant(AssistantMessage {
            content: vec![],
            tool_calls: vec![
                ToolCall {
                    id: "w".into(),
                    name: "write_file".into(),
                    arguments: json!({"file_path": "/x.txt", "content": "x"}),
                },
                ToolCall {
                    id: "l".into(),
                    name: "ls".into(),
                    arguments: json!({}),
                },
            ],
        }));
    run.state
        .custom
        .insert(deepagents::IN_FLIGHT_KEY.into(), json!(["w", "l"]));
    run.steps = 1;
    store
        .append("crashed", &RunDelta::full(&run), &run)
        .await
        .unwrap();

    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [
            {"id": "w", "name": "write_file", "args": {"file_path": "/x.txt", "content": "x"}},
            {"id": "l", "name": "ls", "args": {}}
        ]},
        {"text": "recovered"}
    ])))
    .build()
    .unwrap();
    let output = turn(&agent, &store, "crashed", None).await;
    assert_eq!(output.text, "recovered");
    let results = tool_results(&output.run.state.messages);
    assert_eq!(results.len(), 2, "each call has exactly one result");
    assert_eq!(results[0].tool_call_id, "w");
    assert!(text(results[0]).starts_with("Interrupted"));
    assert!(
        !output.run.state.files.contains_key("/x.txt"),
        "the mutating call did not run twice"
    );
    assert_eq!(results[1].tool_call_id, "l");
    assert_eq!(results[1].status, deepagents::ToolStatus::Ok);
    let in_flight = output.run.state.custom.get(deepagents::IN_FLIGHT_KEY);
    assert!(
        in_flight.is_none_or(serde_json::Value::is_null),
        "the step is settled"
    );
}

#[tokio::test]
async fn a_thread_forks_from_an_earlier_checkpoint() {
    let store = Arc::new(InMemoryCheckpointer::new());
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"name": "ls", "args": {}}]},
        {"text": "done"}
    ])))
    .build()
    .unwrap();
    turn(&agent, &store, "main", Some("go")).await;
    let checkpoints = store.checkpoints("main").await.unwrap();
    let early = checkpoints[0].id;
    store.fork("main", early, "branch").await.unwrap();
    let branch = store.load("branch", None).await.unwrap().unwrap();
    let original = store.load("main", Some(early)).await.unwrap().unwrap();
    assert_eq!(branch, original);
    assert!(
        branch.state.messages.len()
            < store
                .load("main", None)
                .await
                .unwrap()
                .unwrap()
                .state
                .messages
                .len()
    );
    assert!(store.delete_thread("branch").await.unwrap());
    assert!(store.load("branch", None).await.unwrap().is_none());
    assert!(store.fork("main", 999, "x").await.is_err());
}
