//! Reuse of encoded conversation prefixes between requests.
//!
//! Between summarizations a run's conversation only grows, and each model request carries all
//! of it again. A wire that encodes messages one by one keeps the bytes it wrote for the
//! messages of recent requests here, so the next request encodes only its new messages and
//! copies the rest ([`Messages::version`] tells which leading messages are unchanged without
//! comparing them).
//!
//! [`Messages::version`]: deepagents_core::Messages::version

use deepagents_core::model::ModelError;
use deepagents_core::tool::ToolSpec;
use deepagents_core::{Message, MessagesVersion};
use serde::Serialize;
use serde_json::value::RawValue;

/// Conversations kept: parallel subagents on one model each have their own.
const KEPT: usize = 4;

/// The encoded prefixes of a model's recent requests (most recently used last) and its
/// encoded tools.
#[derive(Debug, Default)]
pub struct EncodeCache {
    prefixes: Vec<EncodedPrefix>,
    tools: EncodedTools,
}

/// The encoding of the tools of the latest request.
#[derive(Debug, Default)]
pub struct EncodedTools(Option<(Vec<ToolSpec>, Box<RawValue>)>);

impl EncodedTools {
    /// The encoding of `tools` (`None` when there are none), written by `encode` only when
    /// they changed since the last request.
    pub fn get(
        &mut self,
        tools: &[ToolSpec],
        encode: impl FnOnce(&[ToolSpec]) -> Result<Box<RawValue>, serde_json::Error>,
    ) -> Result<Option<&RawValue>, serde_json::Error> {
        if tools.is_empty() {
            return Ok(None);
        }
        if !matches!(&self.0, Some((cached, _)) if cached.as_slice() == tools) {
            self.0 = Some((tools.to_vec(), encode(tools)?));
        }
        Ok(self.0.as_ref().map(|(_, encoded)| &**encoded))
    }
}

/// The encoding of a conversation's messages, written unit after unit, each preceded by a
/// comma (so it is pasted after the opening bracket, or after an element before it).
#[derive(Debug)]
pub struct EncodedPrefix {
    version: MessagesVersion,
    bytes: Vec<u8>,
    /// Increasing: the encoding of the first `messages` messages is complete and ends at
    /// `bytes`, as long as the first `needs` messages are unchanged.
    settled: Vec<Settled>,
}

#[derive(Debug, Clone, Copy)]
struct Settled {
    messages: usize,
    needs: usize,
    bytes: usize,
}

impl EncodedPrefix {
    /// The encoded messages, each preceded by a comma.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Where encoding must resume: how many messages are already encoded in
    /// [`bytes`](Self::bytes).
    pub fn messages(&self) -> usize {
        self.settled.last().map_or(0, |settled| settled.messages)
    }

    /// The buffer to append the encoding of the next messages to.
    pub fn buffer(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// Records that the first `messages` messages are encoded completely, up to the end of
    /// the buffer: nothing of theirs waits for a later message.
    pub fn settle(&mut self, messages: usize) {
        self.push_settled(messages, messages);
    }

    /// Records that the messages before message `next` are encoded completely, up to the end
    /// of the buffer, for as long as message `next` is the same: formats that merge
    /// neighbouring messages of one role close an entry only when the next one differs.
    pub fn settle_before(&mut self, next: usize) {
        self.push_settled(next, next + 1);
    }

    fn push_settled(&mut self, messages: usize, needs: usize) {
        self.settled.push(Settled {
            messages,
            needs,
            bytes: self.bytes.len(),
        });
    }

    /// Keeps only the encodings that hold while only the first `common` messages are the same.
    fn cut(&mut self, common: usize) {
        let keep = self
            .settled
            .partition_point(|settled| settled.needs <= common);
        self.settled.truncate(keep);
        let end = self.settled.last().map_or(0, |settled| settled.bytes);
        self.bytes.truncate(end);
    }
}

impl EncodeCache {
    /// The prefix to extend for a request whose messages stand at `version`: the kept one
    /// sharing the most leading messages with it, cut to those, or an empty one. Encode the
    /// messages from [`EncodedPrefix::messages`] on into it.
    pub fn prefix(&mut self, version: MessagesVersion) -> &mut EncodedPrefix {
        self.parts(version).0
    }

    /// The prefix to extend (as [`prefix`](Self::prefix)) and the tools, together.
    pub fn parts(&mut self, version: MessagesVersion) -> (&mut EncodedPrefix, &mut EncodedTools) {
        let best = self
            .prefixes
            .iter()
            .enumerate()
            .map(|(index, prefix)| (index, prefix.version.common_prefix(&version)))
            .filter(|&(_, common)| common > 0)
            .max_by_key(|&(_, common)| common);
        let mut prefix = match best {
            Some((index, common)) => {
                let mut prefix = self.prefixes.remove(index);
                prefix.cut(common);
                prefix
            }
            None => {
                if self.prefixes.len() >= KEPT {
                    self.prefixes.remove(0);
                }
                EncodedPrefix {
                    version,
                    bytes: Vec::new(),
                    settled: Vec::new(),
                }
            }
        };
        prefix.version = version;
        self.prefixes.push(prefix);
        let last = self.prefixes.len() - 1;
        (&mut self.prefixes[last], &mut self.tools)
    }
}

/// A turn of a format that merges neighbouring messages of one role: the role and its parts.
pub(crate) type Turn = (&'static str, Vec<serde_json::Value>);

impl EncodedPrefix {
    /// For formats that merge neighbouring messages of one role into one turn (Anthropic,
    /// Gemini): encodes the turns of `messages` from where the prefix stopped, each as
    /// `{"role": …, content_key: [parts]}`, settling a turn when the next one starts, and
    /// returns the last turn, still open (a later message may merge into it), for the caller
    /// to finish and [`write_turn`](Self::write_turn).
    pub(crate) fn merge_turns(
        &mut self,
        messages: &[Message],
        content_key: &str,
        turn_of: impl Fn(&Message) -> Turn,
    ) -> Result<Option<Turn>, serde_json::Error> {
        let from = self.messages();
        let mut turn: Option<Turn> = None;
        for (offset, message) in messages.iter().enumerate().skip(from) {
            let (role, parts) = turn_of(message);
            if parts.is_empty() {
                continue;
            }
            match &mut turn {
                Some((current, existing)) if *current == role => existing.extend(parts),
                _ => {
                    if let Some((role, parts)) = turn.replace((role, parts)) {
                        self.write_turn(role, content_key, parts)?;
                        self.settle_before(offset);
                    }
                }
            }
        }
        Ok(turn)
    }

    /// Appends one turn, `{"role": role, content_key: parts}`.
    pub(crate) fn write_turn(
        &mut self,
        role: &str,
        content_key: &str,
        parts: Vec<serde_json::Value>,
    ) -> Result<(), serde_json::Error> {
        let mut turn = serde_json::Map::new();
        turn.insert("role".to_owned(), role.into());
        turn.insert(content_key.to_owned(), parts.into());
        self.bytes.push(b',');
        serde_json::to_writer(&mut self.bytes, &turn)
    }
}

/// The error of a body that cannot be encoded.
pub(crate) fn encoding_failed(error: serde_json::Error) -> ModelError {
    ModelError::Other {
        message: format!("cannot encode the request body: {error}"),
    }
}

/// A request body: the fields of `head`, then `key` holding the array of `first` (when
/// given) and the `items` of an [`EncodedPrefix`], then the fields of `tail`. `head` and
/// `tail` must serialize as JSON objects. The items are copied once, into the body.
pub fn assemble(
    head: &impl Serialize,
    key: &str,
    first: Option<&impl Serialize>,
    items: &[u8],
    tail: &impl Serialize,
) -> Result<Vec<u8>, serde_json::Error> {
    let head = serde_json::to_vec(head)?;
    let tail = serde_json::to_vec(tail)?;
    let mut body = Vec::with_capacity(head.len() + items.len() + tail.len() + 64);
    // `{"a":1}` → `{"a":1`, then `,"key":[`; `{}` → `{`, then `"key":[`.
    let head_fields = head
        .get(1..head.len().saturating_sub(1))
        .unwrap_or_default();
    body.push(b'{');
    if !head_fields.is_empty() {
        body.extend_from_slice(head_fields);
        body.push(b',');
    }
    serde_json::to_writer(&mut body, key)?;
    body.extend_from_slice(b":[");
    let mut items = items;
    match first {
        Some(first) => serde_json::to_writer(&mut body, first)?,
        // The first item's comma, with nothing before it.
        None => items = items.get(1..).unwrap_or_default(),
    }
    body.extend_from_slice(items);
    body.push(b']');
    let tail_fields = tail
        .get(1..tail.len().saturating_sub(1))
        .unwrap_or_default();
    if !tail_fields.is_empty() {
        body.push(b',');
        body.extend_from_slice(tail_fields);
    }
    body.push(b'}');
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use deepagents_core::{Message, Messages};

    fn encode_into(cache: &mut EncodeCache, messages: &Messages) -> (usize, Vec<u8>) {
        let prefix = cache.prefix(messages.version());
        let reused = prefix.messages();
        for (index, message) in messages.iter().enumerate().skip(reused) {
            prefix.buffer().push(b',');
            prefix.buffer().extend(message.text().as_bytes());
            prefix.settle(index + 1);
        }
        (reused, prefix.bytes().to_vec())
    }

    #[test]
    fn appended_messages_reuse_the_prefix_and_edits_do_not() {
        let mut cache = EncodeCache::default();
        let mut messages = Messages::from(vec![Message::user("a"), Message::user("b")]);
        assert_eq!(encode_into(&mut cache, &messages), (0, b",a,b".to_vec()));
        let request = messages.clone();
        messages.push(Message::user("c"));
        assert_eq!(encode_into(&mut cache, &messages), (2, b",a,b,c".to_vec()));
        // The older request, copied from before the append, still finds its two.
        assert_eq!(encode_into(&mut cache, &request), (2, b",a,b".to_vec()));
        messages[0] = Message::user("z");
        assert_eq!(encode_into(&mut cache, &messages), (0, b",z,b,c".to_vec()));
    }

    #[test]
    fn a_fork_shares_only_what_it_was_copied_with() {
        let mut cache = EncodeCache::default();
        let mut left = Messages::from(vec![Message::user("a")]);
        let mut right = left.clone();
        left.push(Message::user("l"));
        right.push(Message::user("r"));
        assert_eq!(encode_into(&mut cache, &left), (0, b",a,l".to_vec()));
        assert_eq!(encode_into(&mut cache, &right), (1, b",a,r".to_vec()));
        assert_eq!(encode_into(&mut cache, &left), (1, b",a,l".to_vec()));
    }
}
