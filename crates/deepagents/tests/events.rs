//! The event stream: order and content.

use deepagents::{Agent, EventKind};
use futures::StreamExt;
use serde_json::json;

use crate::support::scripted;

fn label(kind: &EventKind) -> String {
    match kind {
        EventKind::RunStarted { .. } => "run_started".into(),
        EventKind::ModelCallStarted { step } => format!("model_call_started {step}"),
        EventKind::TextDelta { text } => format!("text {text}"),
        EventKind::ModelCallFinished {
            step, tool_calls, ..
        } => {
            format!("model_call_finished {step} calls={tool_calls}")
        }
        EventKind::ToolCallStarted { name, .. } => format!("tool_call_started {name}"),
        EventKind::ToolCallFinished { name, .. } => format!("tool_call_finished {name}"),
        EventKind::StateUpdated { todos, .. } => {
            format!("state_updated todos={}", todos.as_ref().map_or(0, Vec::len))
        }
        EventKind::Final { text, steps, .. } => format!("final {text} steps={steps}"),
        EventKind::Error { kind, .. } => format!("error {kind}"),
        other => panic!("unexpected event {other:?}"),
    }
}

#[tokio::test]
async fn events_arrive_in_run_order() {
    let agent = Agent::builder(scripted(json!([
        {"text": "Planning now", "tool_calls": [
            {"name": "write_todos", "args": {"todos": [{"content": "Ship", "status": "pending"}]}}
        ]},
        {"text": "Shipped."}
    ])))
    .todos(true)
    .build()
    .unwrap();
    let mut stream = agent.stream("ship it");
    let mut labels = Vec::new();
    while let Some(event) = stream.next().await {
        assert!(
            event.path.is_empty(),
            "main agent events have an empty path"
        );
        labels.push(label(&event.kind));
    }
    let output = stream.outcome().await.unwrap();
    assert_eq!(
        labels,
        [
            "run_started",
            "model_call_started 1",
            "text Planning ",
            "text now",
            "model_call_finished 1 calls=1",
            "tool_call_started write_todos",
            "tool_call_finished write_todos",
            "state_updated todos=1",
            "model_call_started 2",
            "text Shipped.",
            "model_call_finished 2 calls=0",
            "final Shipped. steps=2",
        ]
    );
    assert_eq!(output.run.state.todos.len(), 1);
    assert!(output.run.usage.input_tokens > 0);
}

#[tokio::test]
async fn a_failed_run_ends_its_stream_with_an_error_event() {
    let agent = Agent::builder(scripted(json!([]))).build().unwrap();
    let mut stream = agent.stream("go");
    let mut last = None;
    while let Some(event) = stream.next().await {
        last = Some(event);
    }
    let last = last.unwrap();
    assert_eq!(label(&last.kind), "error model");
    assert!(stream.outcome().await.is_err());
}

#[test]
fn events_serialize_with_a_type_tag_and_path() {
    let event = deepagents::Event {
        path: vec!["call_1".into(), "researcher".into()],
        kind: EventKind::TextDelta { text: "hi".into() },
    };
    let value = serde_json::to_value(&event).unwrap();
    assert_eq!(
        value,
        json!({"path": ["call_1", "researcher"], "type": "text_delta", "text": "hi"})
    );
    let back: deepagents::Event = serde_json::from_value(value).unwrap();
    assert_eq!(back, event);
}
