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
        chars += tool.name.len() + tool.description.len() + json_len(&tool.parameters);
    }
    (chars as u64).div_ceil(4)
}

/// The length of `value` as compact JSON (what `to_string` gives), without building the text.
fn json_len(value: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a `Value` to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
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
                    chars += call.name.len() + json_len(&call.arguments);
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

/// A running estimate of `messages[start..]` for a conversation that only grows, so a step
/// costs what the new messages cost, not what the whole history does.
///
/// Keep one per run (in its extensions). The count is reused only when the start is unchanged
/// and the last counted message is still where it was (a fingerprint of it is kept): a
/// summary moves the start and a request shaped by middleware may differ from the last one,
/// and then it is recomputed.
#[derive(Debug, Default)]
pub struct RunningEstimate {
    /// (start, messages counted, fingerprint of the last one, their tokens).
    counted: std::sync::Mutex<(usize, usize, u64, u64)>,
}

impl RunningEstimate {
    /// The estimate of `messages[start..]`.
    pub fn messages_from(&self, messages: &[Message], start: usize) -> u64 {
        use std::hash::{Hash, Hasher};
        let start = start.min(messages.len());
        let fingerprint = |len: usize| {
            let mut hasher = std::collections::hash_map::DefaultHasher::new();
            len.hash(&mut hasher);
            if let Some(message) = len.checked_sub(1).and_then(|i| messages.get(i)) {
                message.text().hash(&mut hasher);
            }
            hasher.finish()
        };
        let mut counted = self
            .counted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (from, len, print, tokens) = *counted;
        let reusable =
            from == start && len >= start && len <= messages.len() && print == fingerprint(len);
        let tokens = if reusable {
            tokens + estimate_messages(&messages[len..])
        } else {
            estimate_messages(&messages[start..])
        };
        *counted = (start, messages.len(), fingerprint(messages.len()), tokens);
        tokens
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::json_len;

    #[test]
    fn json_len_is_the_length_of_the_compact_text() {
        for value in [
            json!(null),
            json!({"a": [1, 2.5, "x\"y\n\u{1F600}"], "b": {"c": true}}),
            json!("é\\\t"),
        ] {
            assert_eq!(json_len(&value), value.to_string().len());
        }
    }
}
