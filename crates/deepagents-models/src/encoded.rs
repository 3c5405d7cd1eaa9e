//! Reuse of encoded conversation prefixes between requests.
//!
//! Between summarizations a run's conversation only grows, and each model request carries all
//! of it again. A wire that encodes messages one by one keeps the bytes it wrote for the
//! messages of recent requests here, so the next request encodes only its new messages and
//! copies the rest ([`Messages::version`] tells which leading messages are unchanged without
//! comparing them).
//!
//! [`Messages::version`]: deepagents_core::Messages::version

use deepagents_core::MessagesVersion;
use deepagents_core::tool::ToolSpec;

/// Conversations kept: parallel subagents on one model each have their own.
const KEPT: usize = 4;

/// The encoded prefixes of a model's recent requests, most recently used last.
#[derive(Debug, Default)]
pub struct EncodeCache {
    prefixes: Vec<EncodedPrefix>,
    tools: Option<(Vec<ToolSpec>, Vec<u8>)>,
}

/// The encoding of a conversation's messages, written unit after unit, each preceded by a
/// comma (so it is pasted after the opening bracket, or after an element before it).
#[derive(Debug)]
pub struct EncodedPrefix {
    version: MessagesVersion,
    bytes: Vec<u8>,
    /// `(messages, bytes)`: after the first `messages` messages the encoding is complete
    /// (nothing of theirs waits for a later message) and ends at `bytes`; increasing.
    settled: Vec<(usize, usize)>,
}

impl EncodedPrefix {
    /// The encoded messages, each preceded by a comma.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Where encoding must resume: how many messages are already encoded in
    /// [`bytes`](Self::bytes).
    pub fn messages(&self) -> usize {
        self.settled.last().map_or(0, |&(messages, _)| messages)
    }

    /// The buffer to append the encoding of the next messages to.
    pub fn buffer(&mut self) -> &mut Vec<u8> {
        &mut self.bytes
    }

    /// Records that the first `messages` messages are encoded completely, up to the end of
    /// the buffer.
    pub fn settle(&mut self, messages: usize) {
        self.settled.push((messages, self.bytes.len()));
    }

    /// Keeps only the complete encodings of the first `common` messages (or fewer).
    fn cut(&mut self, common: usize) {
        let keep = self
            .settled
            .partition_point(|&(messages, _)| messages <= common);
        self.settled.truncate(keep);
        let end = self.settled.last().map_or(0, |&(_, bytes)| bytes);
        self.bytes.truncate(end);
    }
}

impl EncodeCache {
    /// The prefix to extend for a request whose messages stand at `version`: the kept one
    /// sharing the most leading messages with it, cut to those, or an empty one. Encode the
    /// messages from [`EncodedPrefix::messages`] on into it.
    pub fn prefix(&mut self, version: MessagesVersion) -> &mut EncodedPrefix {
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
        &mut self.prefixes[last]
    }

    /// The encoding of `tools`, written by `encode` only when the tools changed since the
    /// last request.
    pub fn tools<E>(
        &mut self,
        tools: &[ToolSpec],
        encode: impl FnOnce(&[ToolSpec]) -> Result<Vec<u8>, E>,
    ) -> Result<&[u8], E> {
        let fresh = !matches!(&self.tools, Some((cached, _)) if cached.as_slice() == tools);
        if fresh {
            self.tools = Some((tools.to_vec(), encode(tools)?));
        }
        Ok(self
            .tools
            .as_ref()
            .map_or(&[][..], |(_, bytes)| bytes.as_slice()))
    }
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
