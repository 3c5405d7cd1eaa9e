//! The scripted model.

use deepagents_core::message::{AssistantMessage, Message};
use deepagents_core::model::{
    Model, ModelError, ModelRequest, StopReason, StreamEvent, collect_stream,
};
use deepagents_models::{ScriptError, ScriptedModel};
use futures::StreamExt;
use serde_json::json;

fn request(assistant_turns: usize) -> ModelRequest {
    let mut messages = vec![Message::user("go")];
    for _ in 0..assistant_turns {
        messages.push(Message::Assistant(AssistantMessage::text("earlier")));
    }
    ModelRequest {
        messages: messages.into(),
        ..ModelRequest::default()
    }
}

#[tokio::test]
async fn replays_turns_by_position_in_the_conversation() {
    let model = ScriptedModel::from_json(
        &json!({"turns": [
            {"text": "first", "tool_calls": [
                {"name": "ls", "args": {"path": "/"}},
                {"id": "mine", "name": "grep"}
            ]},
            {"text": "second", "usage": {"input_tokens": 7, "output_tokens": 3}}
        ]})
        .to_string(),
    )
    .unwrap();
    let first = model.generate(&request(0)).await.unwrap();
    assert_eq!(first.stop_reason, StopReason::ToolUse);
    let ids: Vec<_> = first
        .message
        .tool_calls
        .iter()
        .map(|c| c.id.as_str())
        .collect();
    assert_eq!(ids, ["call_0_0", "mine"]);
    assert_eq!(first.message.tool_calls[1].arguments, json!({}));
    assert!(first.usage.input_tokens > 0 && first.usage.output_tokens > 0);

    // The same request gives the same answer: the script position comes from the request.
    assert_eq!(model.generate(&request(0)).await.unwrap(), first);

    let second = model.generate(&request(1)).await.unwrap();
    assert_eq!(second.stop_reason, StopReason::EndTurn);
    assert_eq!(second.usage.input_tokens, 7);
    assert_eq!(second.usage.output_tokens, 3);
}

#[tokio::test]
async fn running_out_of_turns_names_the_script_and_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.json");
    std::fs::write(&path, r#"{"turns": [{"text": "only"}]}"#).unwrap();
    let model = ScriptedModel::from_file(&path).unwrap();
    let error = model.generate(&request(1)).await.unwrap_err();
    let message = error.to_string();
    assert!(message.contains("short.json holds 1 turns"), "{message}");
    assert!(message.contains("asked for turn 2"), "{message}");
    assert!(message.contains("add turns"), "{message}");
}

#[tokio::test]
async fn an_error_turn_fails_once_then_the_script_moves_on() {
    let model = ScriptedModel::from_json(
        r#"{"turns": [
            {"error": {"kind": "rate_limited", "message": "slow", "retry_after_ms": 250}},
            {"text": "recovered"}
        ]}"#,
    )
    .unwrap();
    let error = model.generate(&request(0)).await.unwrap_err();
    assert_eq!(
        error,
        ModelError::RateLimited {
            retry_after: Some(std::time::Duration::from_millis(250)),
            message: "slow".into()
        }
    );
    let answer = model.generate(&request(0)).await.unwrap();
    assert_eq!(Message::Assistant(answer.message).text(), "recovered");
}

#[tokio::test]
async fn streams_text_and_tool_calls_then_completes() {
    let model = ScriptedModel::from_json(
        r#"{"turns": [{"text": "two words", "tool_calls": [{"name": "t", "args": {"a": 1}}]}]}"#,
    )
    .unwrap();
    let events: Vec<_> = model
        .stream(&request(0))
        .await
        .unwrap()
        .map(Result::unwrap)
        .collect()
        .await;
    assert_eq!(
        events[0],
        StreamEvent::TextDelta {
            text: "two ".into()
        }
    );
    assert_eq!(
        events[1],
        StreamEvent::TextDelta {
            text: "words".into()
        }
    );
    assert!(matches!(&events[2], StreamEvent::ToolCallDelta { name: Some(n), .. } if n == "t"));
    assert!(matches!(events[3], StreamEvent::Completed(_)));

    let mut deltas = 0;
    let response = collect_stream(model.stream(&request(0)).await.unwrap(), |_| deltas += 1)
        .await
        .unwrap();
    assert_eq!(deltas, 3);
    assert_eq!(response.message.tool_calls.len(), 1);
}

#[tokio::test]
async fn a_stream_without_completion_is_an_error() {
    let stream = futures::stream::iter(vec![Ok(StreamEvent::TextDelta { text: "cut".into() })]);
    let error = collect_stream(Box::pin(stream), |_| {}).await.unwrap_err();
    assert!(matches!(error, ModelError::Transient { .. }));
    assert!(error.to_string().contains("incomplete"), "{error}");
}

#[test]
fn broken_scripts_are_refused_with_the_reason() {
    let error = ScriptedModel::from_json(r#"{"turns": [{"txt": "typo"}]}"#).unwrap_err();
    let message = error.to_string();
    assert!(message.contains("unknown field `txt`"), "{message}");
    assert!(message.contains("expected {\"turns\""), "{message}");

    let error =
        ScriptedModel::from_json(r#"{"turns": [{"error": {"kind": "meltdown"}}]}"#).unwrap_err();
    assert!(matches!(
        error,
        ScriptError::UnknownErrorKind { turn: 0, .. }
    ));

    let error = ScriptedModel::from_file("/no/such/script.json").unwrap_err();
    assert!(
        error
            .to_string()
            .contains("cannot read model script /no/such/script.json")
    );
}

/// The whole chain the way anyhow's `{:#}` prints it: each message, then each `source()`.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[test]
fn a_missing_script_prints_its_os_error_once() {
    // The text this platform gives the error, e.g. "No such file or directory (os error 2)".
    let os_error = std::fs::read("/no/such/script.json")
        .unwrap_err()
        .to_string();
    let error = ScriptedModel::from_file("/no/such/script.json").unwrap_err();
    let text = chain(&error);
    assert_eq!(text.matches(&os_error).count(), 1, "{text}");
    assert!(
        text.starts_with("cannot read model script /no/such/script.json"),
        "{text}"
    );
    // Through the spec resolver, as the CLI sees it.
    let error = deepagents_models::from_spec("scripted:/no/such/script.json")
        .err()
        .unwrap();
    let text = chain(&error);
    assert_eq!(text.matches(&os_error).count(), 1, "{text}");
}
