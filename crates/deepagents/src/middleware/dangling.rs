//! Keeps the history valid: every tool call gets a result before the model sees it.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use async_trait::async_trait;
use deepagents_core::RunContext;
use deepagents_core::{AgentState, Message, MessagesVersion, ModelRequest, ToolResult};

use super::{Middleware, MiddlewareError};

/// Before each model call, gives every tool call that has no result (an interrupted run, a
/// crash between the model's answer and the tools) a "cancelled" result placed right after its
/// turn, in the request only. Providers reject histories with unanswered calls. Its name is
/// `dangling_tool_calls`.
#[derive(Debug, Default)]
pub struct DanglingToolCallsMiddleware;

/// The run's last checked request: its version and the index of its last assistant turn,
/// before which every call is known to be answered in place. The next request, which
/// extends it, is checked from that turn on, so a step's check does not grow with the history.
#[derive(Default)]
struct Checked(Mutex<Option<(MessagesVersion, usize)>>);

#[async_trait]
impl Middleware for DanglingToolCallsMiddleware {
    fn name(&self) -> &str {
        "dangling_tool_calls"
    }

    async fn before_model(
        &self,
        ctx: &RunContext,
        request: &mut ModelRequest,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        let checked = ctx.extensions.get_or_insert_with(Checked::default);
        let mut checked = checked.0.lock().unwrap_or_else(PoisonError::into_inner);
        let version = request.messages.version();
        let from = match *checked {
            // Unchanged up to the turn checked last: the turns before it stay answered.
            Some((before, turn)) if before.common_prefix(&version) >= turn => turn,
            _ => 0,
        };
        if answered_in_place(&request.messages, from) {
            let last_turn = request
                .messages
                .iter()
                .rposition(|m| matches!(m, Message::Assistant(_)))
                .map_or(from, |turn| turn.max(from));
            *checked = Some((version, last_turn));
            return Ok(());
        }
        *checked = None;
        let answered: HashSet<&str> = request
            .messages
            .iter()
            .filter_map(|m| match m {
                Message::Tool(result) => Some(result.tool_call_id.as_str()),
                _ => None,
            })
            .collect();
        let has_dangling = request.messages.iter().any(|m| match m {
            Message::Assistant(a) => a
                .tool_calls
                .iter()
                .any(|c| !answered.contains(c.id.as_str())),
            _ => false,
        });
        if !has_dangling {
            return Ok(());
        }
        let answered: HashSet<String> = answered.into_iter().map(str::to_owned).collect();
        let mut patched = Vec::with_capacity(request.messages.len() + 1);
        for message in std::mem::take(&mut request.messages).into_vec() {
            let missing: Vec<ToolResult> = match &message {
                Message::Assistant(a) => a
                    .tool_calls
                    .iter()
                    .filter(|c| !answered.contains(&c.id))
                    .map(|c| {
                        ToolResult::error(
                            c,
                            "Cancelled: this call never ran because the run was interrupted. Call it again if it is still needed.",
                        )
                    })
                    .collect(),
                _ => Vec::new(),
            };
            patched.push(message);
            patched.extend(missing.into_iter().map(Message::Tool));
        }
        request.messages = patched.into();
        Ok(())
    }
}

/// Whether every tool call from message `from` on is answered by one of the tool results
/// that directly follow its turn — the shape of every history the driver builds. A linear
/// check without hashing or allocation; when it fails, the full scan decides (a result may
/// sit elsewhere).
fn answered_in_place(messages: &[Message], from: usize) -> bool {
    messages
        .iter()
        .enumerate()
        .skip(from)
        .all(|(index, message)| {
            let Message::Assistant(assistant) = message else {
                return true;
            };
            let results = messages[index + 1..]
                .iter()
                .take_while(|m| matches!(m, Message::Tool(_)));
            assistant.tool_calls.iter().all(|call| {
                results
                    .clone()
                    .any(|m| matches!(m, Message::Tool(r) if r.tool_call_id == call.id))
            })
        })
}

#[cfg(test)]
mod tests {
    use deepagents_core::message::AssistantMessage;
    use deepagents_core::{ContentBlock, ToolCall};
    use serde_json::json;

    use super::*;

    fn turn(ids: &[&str]) -> Message {
        Message::Assistant(AssistantMessage {
            content: vec![ContentBlock::text("working")],
            tool_calls: ids
                .iter()
                .map(|id| ToolCall {
                    id: (*id).to_owned(),
                    name: "noop".into(),
                    arguments: json!({}),
                })
                .collect(),
        })
    }

    fn result(id: &str) -> Message {
        Message::Tool(ToolResult::error(
            &ToolCall {
                id: id.to_owned(),
                name: "noop".into(),
                arguments: json!({}),
            },
            "ok",
        ))
    }

    async fn patched(messages: Vec<Message>) -> Vec<Message> {
        let mut request = ModelRequest {
            messages: messages.into(),
            ..ModelRequest::default()
        };
        DanglingToolCallsMiddleware
            .before_model(
                &RunContext::detached("agent"),
                &mut request,
                &AgentState::default(),
            )
            .await
            .unwrap();
        request.messages.into_vec()
    }

    #[tokio::test]
    async fn answered_histories_pass_unchanged_in_any_result_order() {
        let messages = vec![
            Message::user("go"),
            turn(&["a", "b"]),
            result("b"),
            result("a"),
            turn(&[]),
        ];
        assert!(answered_in_place(&messages, 0));
        assert_eq!(patched(messages.clone()).await, messages);
    }

    #[tokio::test]
    async fn a_result_away_from_its_turn_still_counts_and_a_missing_one_is_added() {
        // "a" is answered later in the history: not in place, yet not dangling either.
        let messages = vec![
            Message::user("go"),
            turn(&["a"]),
            Message::user("more"),
            result("a"),
            turn(&["b"]),
        ];
        assert!(!answered_in_place(&messages, 0));
        let out = patched(messages.clone()).await;
        assert_eq!(out.len(), messages.len() + 1);
        assert!(matches!(&out[5], Message::Tool(r) if r.tool_call_id == "b"));
    }

    /// Within a run each request is checked only from the turn checked last; a call left
    /// unanswered later, or a history rewritten in place, is still found.
    #[tokio::test]
    async fn later_requests_of_a_run_are_checked_from_the_last_turn() {
        let ctx = RunContext::detached("agent");
        let mut conversation =
            deepagents_core::Messages::from(vec![Message::user("go"), turn(&["a"]), result("a")]);
        let send = |messages: &deepagents_core::Messages| {
            let mut request = ModelRequest {
                messages: messages.clone(),
                ..ModelRequest::default()
            };
            let ctx = &ctx;
            async move {
                DanglingToolCallsMiddleware
                    .before_model(ctx, &mut request, &AgentState::default())
                    .await
                    .unwrap();
                request.messages.into_vec()
            }
        };
        assert_eq!(send(&conversation).await.len(), 3);
        conversation.push(turn(&["b"]));
        conversation.push(result("b"));
        assert_eq!(send(&conversation).await.len(), 5);
        conversation.push(turn(&["c"]));
        let out = send(&conversation).await;
        assert!(matches!(&out[6], Message::Tool(r) if r.tool_call_id == "c"));
        // The answer to "a" removed in place: the earlier turns are checked again.
        conversation.pop();
        conversation.remove(2);
        let out = send(&conversation).await;
        assert_eq!(out.len(), 5);
        assert!(matches!(&out[2], Message::Tool(r) if r.tool_call_id == "a"));
    }
}
