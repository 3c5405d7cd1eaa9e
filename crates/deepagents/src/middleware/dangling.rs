//! Keeps the history valid: every tool call gets a result before the model sees it.

use std::collections::HashSet;

use async_trait::async_trait;
use deepagents_core::{AgentState, Message, ModelRequest, ToolResult};

use super::{Middleware, MiddlewareError};

/// Before each model call, gives every tool call that has no result (an interrupted run, a
/// crash between the model's answer and the tools) a "cancelled" result placed right after its
/// turn, in the request only. Providers reject histories with unanswered calls. Its name is
/// `dangling_tool_calls`.
#[derive(Debug, Default)]
pub struct DanglingToolCallsMiddleware;

#[async_trait]
impl Middleware for DanglingToolCallsMiddleware {
    fn name(&self) -> &str {
        "dangling_tool_calls"
    }

    async fn before_model(
        &self,
        request: &mut ModelRequest,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
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
        for message in std::mem::take(&mut request.messages) {
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
        request.messages = patched;
        Ok(())
    }
}
