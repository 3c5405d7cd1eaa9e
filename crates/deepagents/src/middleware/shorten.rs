//! Near the context limit, long arguments of old write/edit calls are shortened in requests.

use async_trait::async_trait;
use deepagents_core::RunContext;
use deepagents_core::{AgentState, Message, ModelRequest};
use serde_json::Value;

use super::{Middleware, MiddlewareError};
use crate::context::{RunningEstimate, estimate_fixed};
use crate::tools::output::truncate_chars;

/// Arguments longer than this are shortened.
const LONG_ARGUMENT_CHARS: usize = 2_000;
/// What is kept of a shortened argument.
const KEPT_CHARS: usize = 500;
/// The latest assistant turns are always sent whole.
const RECENT_TURNS: usize = 2;
/// Fraction of the window at which shortening starts.
const TRIGGER: f64 = 0.7;

/// Once a request passes 70 % of the context window, shortens the `content`, `old_string` and
/// `new_string` arguments (over 2,000 characters) of `write_file` and `edit_file` calls older
/// than the last two assistant turns — the files hold the full text. Only the request changes;
/// the run keeps every argument whole. Its name is `shorten_old_edits`.
#[derive(Debug)]
pub struct ShortenOldEditsMiddleware {
    window_tokens: u64,
}

/// The run's running estimate of its requests, which keeps the per-step check independent of
/// the history's length.
#[derive(Default)]
struct RequestEstimate(RunningEstimate);

impl ShortenOldEditsMiddleware {
    /// Shortening for a model whose context window holds `window_tokens`.
    pub fn new(window_tokens: u64) -> Self {
        Self { window_tokens }
    }
}

fn shorten(value: &mut Value) -> bool {
    let Value::String(text) = value else {
        return false;
    };
    if text.chars().count() <= LONG_ARGUMENT_CHARS {
        return false;
    }
    let omitted = text.chars().count() - KEPT_CHARS;
    *text = format!(
        "{}… [{omitted} characters omitted from this earlier call; the file has the full text]",
        truncate_chars(text, KEPT_CHARS)
    );
    true
}

#[async_trait]
impl Middleware for ShortenOldEditsMiddleware {
    fn name(&self) -> &str {
        "shorten_old_edits"
    }

    async fn before_model(
        &self,
        ctx: &RunContext,
        request: &mut ModelRequest,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        let trigger = (self.window_tokens as f64 * TRIGGER) as u64;
        let counted = ctx.extensions.get_or_insert_with(RequestEstimate::default);
        let tokens = estimate_fixed(request) + counted.0.messages_from(&request.messages, 0);
        if tokens < trigger {
            return Ok(());
        }
        let assistant_turns = request
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant(_)))
            .count();
        let old_turns = assistant_turns.saturating_sub(RECENT_TURNS);
        let mut seen = 0;
        for message in request.messages.iter_mut() {
            let Message::Assistant(assistant) = message else {
                continue;
            };
            seen += 1;
            if seen > old_turns {
                break;
            }
            for call in &mut assistant.tool_calls {
                if call.name != "write_file" && call.name != "edit_file" {
                    continue;
                }
                if let Value::Object(args) = &mut call.arguments {
                    for key in ["content", "old_string", "new_string"] {
                        if let Some(value) = args.get_mut(key) {
                            shorten(value);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
