//! The stream modes built from a real run's events and saved steps.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use deepagents::models::ScriptedModel;
use deepagents::{Agent, InMemoryCheckpointer};
use deepagents_langgraph::{FrameSink, Framer, StepWatch};
use futures::StreamExt;
use serde_json::{Value, json};

#[derive(Default)]
struct Frames(Mutex<Vec<(String, Value)>>);

impl FrameSink for Frames {
    fn push(&self, mode: &str, data: &Value) {
        if let Ok(mut frames) = self.0.lock() {
            frames.push((mode.to_owned(), data.clone()));
        }
    }
}

/// However far behind the reader is, each step comes right after its events: a streamed
/// message chunk carries the id its message has in the state that follows.
#[tokio::test(flavor = "multi_thread")]
async fn a_reader_that_lags_still_sees_each_step_after_its_events() {
    let script = json!({"turns": [
        {"text": "Planning.", "tool_calls": [
            {"name": "write_todos", "args": {"todos": [{"content": "Write", "status": "pending"}]}}
        ]},
        {"text": "Noted."},
        {"text": "Again.", "tool_calls": [
            {"name": "write_todos", "args": {"todos": [{"content": "Write", "status": "completed"}]}}
        ]},
        {"text": "Done."}
    ]});
    let model = ScriptedModel::from_json(&script.to_string()).unwrap();
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::default()));
    let agent = Agent::builder(Arc::new(model))
        .todos(true)
        .checkpointer(watch.clone())
        .build()
        .unwrap();
    let frames = Frames::default();
    for turn in 0..2 {
        let thread = agent.thread("t").unwrap();
        let before = thread.state().await.unwrap();
        let mut steps = watch.subscribe("t");
        let modes = ["messages-tuple", "values"].map(str::to_owned);
        let mut framer = Framer::new(
            &frames,
            BTreeSet::from(modes),
            false,
            json!({}),
            before.as_ref(),
        );
        let mut stream = thread.stream("plan").await.unwrap();
        // The reader lags: the run has saved all its steps before the first event is read.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        while let Some(event) = stream.next().await {
            for step in steps.steps_before(&event) {
                framer.step(&step);
            }
            framer.event(&event);
        }
        for step in steps.remaining() {
            framer.step(&step);
        }
        stream.outcome().await.unwrap();
        // The last chunk before each `values` belongs to that state's last message.
        let frames = frames.0.lock().unwrap();
        let mut last_chunk: Option<String> = None;
        let mut checked = 0;
        for (mode, data) in frames.iter() {
            match mode.as_str() {
                "messages" if data[0]["type"] == "AIMessageChunk" => {
                    last_chunk = data[0]["id"].as_str().map(str::to_owned);
                }
                "values" => {
                    let messages = data["messages"].as_array().unwrap();
                    let last = messages.last().unwrap();
                    if let Some(id) = last_chunk.take() {
                        assert_eq!(last["type"], "ai", "turn {turn}: {data}");
                        assert_eq!(last["id"].as_str(), Some(id.as_str()), "turn {turn}");
                        checked += 1;
                    }
                }
                _ => {}
            }
        }
        assert_eq!(checked, 2 * (turn + 1), "every model answer was checked");
    }
}

/// A client that lists messages from both `messages` and `values` (the SDK's `useStream`)
/// must see each message once: a step's message frames come before its `values`, and
/// `custom` carries none of the harness's own events (they have the `deepagents` mode).
#[tokio::test(flavor = "multi_thread")]
async fn message_frames_precede_their_values_and_custom_stays_the_users() {
    let script = json!({"turns": [
        {"text": "Planning.", "tool_calls": [
            {"name": "write_todos", "args": {"todos": [{"content": "Write", "status": "pending"}]}}
        ]},
        {"text": "Done."}
    ]});
    let model = ScriptedModel::from_json(&script.to_string()).unwrap();
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::default()));
    let agent = Agent::builder(Arc::new(model))
        .todos(true)
        .checkpointer(watch.clone())
        .build()
        .unwrap();
    let frames = Frames::default();
    let thread = agent.thread("order").unwrap();
    let mut steps = watch.subscribe("order");
    let modes = ["messages-tuple", "values", "custom", "deepagents"].map(str::to_owned);
    let mut framer = Framer::new(&frames, BTreeSet::from(modes), false, json!({}), None);
    let mut stream = thread.stream("plan").await.unwrap();
    while let Some(event) = stream.next().await {
        for step in steps.steps_before(&event) {
            framer.step(&step);
        }
        framer.event(&event);
    }
    for step in steps.remaining() {
        framer.step(&step);
    }
    stream.outcome().await.unwrap();
    let frames = frames.0.lock().unwrap();
    assert!(
        frames.iter().all(|(mode, _)| mode != "custom"),
        "nothing of ours in custom"
    );
    assert!(frames.iter().any(|(mode, _)| mode == "deepagents"));
    // Every message a `values` frame holds was announced by a `messages` frame before it.
    let mut announced = BTreeSet::new();
    let mut tool_messages = 0;
    for (mode, data) in frames.iter() {
        match mode.as_str() {
            "messages" => {
                if let Some(id) = data[0]["id"].as_str() {
                    announced.insert(id.to_owned());
                }
            }
            "values" => {
                for message in data["messages"].as_array().unwrap() {
                    if message["type"] == "human" {
                        continue;
                    }
                    tool_messages += usize::from(message["type"] == "tool");
                    let id = message["id"].as_str().unwrap();
                    assert!(
                        announced.contains(id),
                        "{id} in values before its messages frame"
                    );
                }
            }
            _ => {}
        }
    }
    assert!(tool_messages > 0, "the tool result was checked");
}
