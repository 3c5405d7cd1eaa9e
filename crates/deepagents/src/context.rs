//! Context accounting: how big a request is, against the model's window.

use deepagents_core::{ContentBlock, Message, ModelRequest};

/// Window assumed when the model has no profile (the reference harness's fallback).
pub const FALLBACK_CONTEXT_TOKENS: u64 = 170_000;

/// A fast offline estimate of a request's tokens: four characters a token for text, tool
/// arguments and schemas; a flat 1,500 per image or document block.
pub fn estimate_tokens(request: &ModelRequest) -> u64 {
    estimate_fixed(request) + estimate_messages(&request.messages)
}

/// The estimate of a request's system prompt and tool schemas.
pub fn estimate_fixed(request: &ModelRequest) -> u64 {
    let mut chars = request.system_prompt.as_deref().map_or(0, str::len);
    for tool in &request.tools {
        chars += tool.name.len() + tool.description.len() + tool.parameters.to_string().len();
    }
    (chars as u64).div_ceil(4)
}

/// The estimate of `messages`.
pub fn estimate_messages(messages: &[Message]) -> u64 {
    let mut chars = 0usize;
    let mut flat = 0u64;
    for message in messages {
        let blocks: &[ContentBlock] = match message {
            Message::System { content } | Message::User { content } => content,
            Message::Assistant(assistant) => {
                for call in &assistant.tool_calls {
                    chars += call.name.len() + call.arguments.to_string().len();
                }
                &assistant.content
            }
            Message::Tool(result) => &result.content,
        };
        for block in blocks {
            match block.as_text() {
                Some(text) => chars += text.len(),
                None => flat += 1_500,
            }
        }
    }
    (chars as u64).div_ceil(4) + flat
}
