//! Shared fixtures.

use std::sync::Arc;

use deepagents::models::ScriptedModel;
use deepagents::{Message, Model, ToolResult, ToolStatus};
use serde_json::Value;

/// A scripted model from a `turns` array.
pub fn scripted(turns: Value) -> Arc<dyn Model> {
    let script = serde_json::json!({ "turns": turns });
    Arc::new(ScriptedModel::from_json(&script.to_string()).unwrap())
}

/// The tool results of a conversation, in order.
pub fn tool_results(messages: &[Message]) -> Vec<&ToolResult> {
    messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool(result) => Some(result),
            _ => None,
        })
        .collect()
}

/// The text of a tool result.
pub fn text(result: &ToolResult) -> String {
    Message::Tool(result.clone()).text()
}

/// Asserts a result is an error whose text contains `needle`.
pub fn assert_error_containing(result: &ToolResult, needle: &str) {
    assert_eq!(
        result.status,
        ToolStatus::Error,
        "expected an error: {result:?}"
    );
    let text = text(result);
    assert!(text.contains(needle), "`{needle}` not in `{text}`");
}

/// An agent path as the flat list `[call id, name, call id, name, …]`, for comparisons.
pub fn flat(path: &deepagents::core::AgentPath) -> Vec<String> {
    path.iter()
        .flat_map(|segment| [segment.call_id.clone(), segment.name.clone()])
        .collect()
}

/// The actions of a run that must have paused.
#[track_caller]
pub fn paused(output: &deepagents::RunOutput) -> &[deepagents::PendingAction] {
    assert_eq!(
        output.status,
        deepagents::RunStatus::Interrupted,
        "expected a pause, got the answer {:?}",
        output.text
    );
    &output.pending
}

/// Whether a run of `Input::Wake` found nothing to deliver (and so ran nothing).
pub fn nothing_to_wake(outcome: Result<deepagents::RunOutput, deepagents::RunFailure>) -> bool {
    matches!(outcome, Err(failure) if matches!(failure.error, deepagents::RunError::NothingToWake))
}
