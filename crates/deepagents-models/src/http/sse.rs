//! An incremental Server-Sent Events parser (the WHATWG `text/event-stream` format).
//!
//! Bytes go in as they arrive, in chunks cut anywhere (even inside a UTF-8 character); complete
//! events come out. An event left without its terminating blank line when the body ends is
//! dropped, as the format requires: the provider's completion marker is what proves a stream
//! whole, never the last bytes received.

/// One dispatched event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field; empty means the default type, `message`.
    pub event: String,
    /// The `data:` lines, joined by `\n`.
    pub data: String,
}

impl SseEvent {
    /// The event name to show in messages: its type, or `message`.
    pub fn name(&self) -> &str {
        if self.event.is_empty() {
            "message"
        } else {
            &self.event
        }
    }
}

/// Parses a byte stream into [`SseEvent`]s.
#[derive(Debug, Default)]
pub struct SseParser {
    buffer: Vec<u8>,
    /// Where the unscanned part of `buffer` starts.
    scanned: usize,
    event: String,
    data: String,
    has_data: bool,
    /// A `\r` ended the previous chunk, so a leading `\n` of the next belongs to it.
    pending_cr: bool,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds a chunk, appending the events it completes to `out`.
    pub fn feed(&mut self, chunk: &[u8], out: &mut Vec<SseEvent>) {
        let mut chunk = chunk;
        if self.pending_cr {
            self.pending_cr = false;
            if let Some(rest) = chunk.strip_prefix(b"\n") {
                chunk = rest;
            }
        }
        self.buffer.extend_from_slice(chunk);
        // Taken out so lines can borrow it while the fields are updated.
        let mut buffer = std::mem::take(&mut self.buffer);
        let mut start = 0;
        let mut i = self.scanned;
        while let Some(offset) = buffer[i..].iter().position(|b| *b == b'\n' || *b == b'\r') {
            let line_end = i + offset;
            let mut next = line_end + 1;
            if buffer[line_end] == b'\r' {
                if next < buffer.len() {
                    if buffer[next] == b'\n' {
                        next += 1;
                    }
                } else {
                    self.pending_cr = true;
                }
            }
            let line = String::from_utf8_lossy(&buffer[start..line_end]);
            self.line(&line, out);
            start = next;
            i = next;
        }
        buffer.drain(..start);
        self.scanned = buffer.len();
        self.buffer = buffer;
    }

    fn line(&mut self, line: &str, out: &mut Vec<SseEvent>) {
        if line.is_empty() {
            if self.has_data {
                let mut data = std::mem::take(&mut self.data);
                if data.ends_with('\n') {
                    data.pop();
                }
                out.push(SseEvent {
                    event: std::mem::take(&mut self.event),
                    data,
                });
            }
            self.event.clear();
            self.data.clear();
            self.has_data = false;
            return;
        }
        if line.starts_with(':') {
            return;
        }
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        match field {
            "event" => value.clone_into(&mut self.event),
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
                self.has_data = true;
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parse_in_chunks(input: &[u8], size: usize) -> Vec<SseEvent> {
        let mut parser = SseParser::new();
        let mut out = Vec::new();
        for chunk in input.chunks(size) {
            parser.feed(chunk, &mut out);
        }
        out
    }

    #[test]
    fn events_survive_any_chunking_and_line_ending() {
        let input = "event: a\r\ndata: {\"x\":\"é\"}\r\n\r\n: comment\n\ndata: one\ndata: two\n\nevent: b\rdata:tight\r\r";
        let expected = vec![
            SseEvent {
                event: "a".into(),
                data: "{\"x\":\"é\"}".into(),
            },
            SseEvent {
                event: String::new(),
                data: "one\ntwo".into(),
            },
            SseEvent {
                event: "b".into(),
                data: "tight".into(),
            },
        ];
        for size in 1..input.len() {
            assert_eq!(parse_in_chunks(input.as_bytes(), size), expected, "{size}");
        }
    }

    #[test]
    fn an_unterminated_event_is_dropped() {
        assert!(parse_in_chunks(b"data: {\"half\"", 4).is_empty());
    }
}
