//! The run state machine: next actions are derived from the conversation.

use deepagents_core::message::{AssistantMessage, Message, ToolCall, ToolResult, ToolStatus};
use deepagents_core::model::{ModelResponse, StopReason};
use deepagents_core::{ContentBlock, NextAction, Run, StateSchema, StateUpdate, Usage};
use serde_json::json;

fn call(id: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "t".into(),
        arguments: json!({}),
    }
}

fn result(id: &str) -> ToolResult {
    ToolResult {
        tool_call_id: id.into(),
        name: "t".into(),
        content: vec![ContentBlock::text("ok")],
        status: ToolStatus::Ok,
        artifact: None,
    }
}

fn response(text: &str, calls: Vec<ToolCall>) -> ModelResponse {
    ModelResponse {
        message: AssistantMessage {
            content: vec![ContentBlock::text(text)],
            tool_calls: calls,
        },
        usage: Usage {
            input_tokens: 5,
            output_tokens: 1,
            ..Default::default()
        },
        stop_reason: StopReason::ToolUse,
    }
}

#[test]
fn a_run_walks_model_tools_model_finish() {
    let mut run = Run::default();
    run.push_user_input(vec![ContentBlock::text("go")]);
    assert_eq!(run.next_action(10).unwrap(), NextAction::CallModel);
    run.apply_model_response(response("working", vec![call("a"), call("b")]));
    assert_eq!(
        run.next_action(10).unwrap(),
        NextAction::ExecuteTools(vec![call("a"), call("b")])
    );
    run.apply_tool_results(
        vec![
            (result("a"), StateUpdate::default()),
            (result("b"), StateUpdate::default()),
        ],
        &StateSchema::default(),
    )
    .unwrap();
    assert_eq!(run.next_action(10).unwrap(), NextAction::CallModel);
    run.apply_model_response(response("all done", vec![]));
    assert_eq!(
        run.next_action(10).unwrap(),
        NextAction::Finish {
            text: "all done".into()
        }
    );
    assert_eq!(run.steps, 2);
    assert_eq!(run.usage.input_tokens, 10);
}

#[test]
fn a_resumed_run_executes_only_calls_without_results() {
    let mut run = Run::default();
    run.push_user_input(vec![ContentBlock::text("go")]);
    run.apply_model_response(response("", vec![call("a"), call("b"), call("c")]));
    // As if the process died after one result was persisted.
    run.state.messages.push(Message::Tool(result("b")));
    let restored: Run = serde_json::from_value(serde_json::to_value(&run).unwrap()).unwrap();
    assert_eq!(
        restored.next_action(10).unwrap(),
        NextAction::ExecuteTools(vec![call("a"), call("c")])
    );
}

#[test]
fn the_turn_limit_counts_model_calls_since_the_latest_input() {
    let mut run = Run::default();
    run.push_user_input(vec![ContentBlock::text("go")]);
    run.apply_model_response(response("", vec![call("a")]));
    run.apply_tool_results(
        vec![(result("a"), StateUpdate::default())],
        &StateSchema::default(),
    )
    .unwrap();
    let error = run.next_action(1).unwrap_err();
    assert_eq!(error.limit, 1);
    assert!(error.to_string().contains("turn limit"));
    // New input starts a new budget.
    run.push_user_input(vec![ContentBlock::text("again")]);
    assert_eq!(run.next_action(1).unwrap(), NextAction::CallModel);
    assert_eq!(run.usage, Usage::default());
}

#[test]
fn a_finished_run_stays_finished_whatever_the_limit() {
    let mut run = Run::default();
    run.push_user_input(vec![ContentBlock::text("go")]);
    run.apply_model_response(response("answer", vec![]));
    assert_eq!(
        run.next_action(1).unwrap(),
        NextAction::Finish {
            text: "answer".into()
        }
    );
}

/// Format 3 writes the step count and usage only when they changed; a delta of format 2,
/// which always wrote them, reads the same, and one of a newer format is refused.
#[test]
fn deltas_of_format_2_and_3_rebuild_the_same_run() {
    use deepagents_core::{CheckpointError, RunDelta};
    let format_2 = r#"{"schema":2,"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"steps":3,"usage":{"input_tokens":10,"output_tokens":2,"cached_input_tokens":0}}"#;
    let format_3 =
        r#"{"schema":3,"messages":[{"role":"user","content":[{"type":"text","text":"more"}]}]}"#;
    let mut run = Run::default();
    RunDelta::decode(format_2).unwrap().apply(&mut run);
    RunDelta::decode(format_3).unwrap().apply(&mut run);
    assert_eq!(run.steps, 3);
    assert_eq!(
        run.usage,
        Usage {
            input_tokens: 10,
            output_tokens: 2,
            ..Usage::default()
        }
    );
    assert_eq!(run.state.messages.len(), 2);
    let unchanged = RunDelta {
        schema: 3,
        ..RunDelta::default()
    };
    let json = serde_json::to_string(&unchanged).unwrap();
    assert!(!json.contains("steps") && !json.contains("usage"), "{json}");
    let newer = RunDelta::decode(r#"{"schema":99}"#).unwrap_err();
    assert!(
        matches!(newer, CheckpointError::Incompatible { found: 99, .. }),
        "{newer}"
    );
}

/// A run after a model turn that called `a` and `b`.
fn run_awaiting_results() -> Run {
    let mut run = Run::default();
    run.push_user_input(vec![ContentBlock::text("go")]);
    run.apply_model_response(response("working", vec![call("a"), call("b")]));
    run
}

#[test]
fn messages_a_tool_adds_follow_the_steps_results() {
    let mut run = run_awaiting_results();
    let note = |text: &str| StateUpdate {
        messages: vec![Message::user(text)],
        ..StateUpdate::default()
    };
    run.apply_tool_results(
        vec![(result("a"), note("from a")), (result("b"), note("from b"))],
        &StateSchema::default(),
    )
    .unwrap();
    let messages = &run.state.messages;
    assert_eq!(messages.len(), 6);
    assert_eq!(messages[2], Message::Tool(result("a")));
    assert_eq!(messages[3], Message::Tool(result("b")));
    assert_eq!(messages[4], Message::user("from a"));
    assert_eq!(messages[5], Message::user("from b"));
    // The calls are answered, and the added user message asks for another model call.
    assert_eq!(run.next_action(10).unwrap(), NextAction::CallModel);
}

#[test]
fn a_tool_cannot_rewrite_earlier_messages() {
    use deepagents_core::StateError;
    let mut run = run_awaiting_results();
    let before = run.clone();
    let rewrite = StateUpdate {
        messages_from: Some(0),
        messages: vec![Message::user("history, rewritten")],
        ..StateUpdate::default()
    };
    let error = run
        .apply_tool_results(
            vec![
                (result("a"), StateUpdate::todos(vec![])),
                (result("b"), rewrite),
            ],
            &StateSchema::default(),
        )
        .unwrap_err();
    assert_eq!(error, StateError::ToolRewroteMessages);
    assert!(error.to_string().contains("messages_from"), "{error}");
    assert_eq!(run, before, "the run is unchanged");
}
