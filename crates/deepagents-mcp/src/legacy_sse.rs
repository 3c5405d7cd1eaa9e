//! The legacy HTTP+SSE transport (MCP 2024-11-05), which the official SDK no longer ships but
//! servers still serve: a `GET` opens an event stream whose first `endpoint` event names
//! where to `POST` our messages; the server's messages come back as `message` events.

use std::future::Future;

use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderValue};
use rmcp::service::{RoleClient, RxJsonRpcMessage, TxJsonRpcMessage};
use tokio::sync::mpsc;

/// The largest event accepted from the server (a tool result included).
const MAX_EVENT: usize = 64 * 1024 * 1024;

/// An open legacy SSE session.
pub(crate) struct LegacySse {
    client: reqwest::Client,
    endpoint: reqwest::Url,
    headers: HeaderMap,
    incoming: mpsc::Receiver<RxJsonRpcMessage<RoleClient>>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for LegacySse {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// One server-sent event.
struct SseEvent {
    name: String,
    data: String,
}

/// Splits server-sent events out of the bytes received so far.
#[derive(Default)]
struct SseParser {
    buffer: Vec<u8>,
    /// How much of `buffer` is known to hold no event end (so a large event arriving in
    /// many chunks is scanned once).
    scanned: usize,
}

impl SseParser {
    /// The events completed by `chunk`; an event larger than [`MAX_EVENT`] is an error.
    fn push(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, String> {
        self.buffer.extend_from_slice(chunk);
        let mut events = Vec::new();
        while let Some((end, gap)) = event_end(&self.buffer, self.scanned) {
            self.scanned = 0;
            let raw: Vec<u8> = self.buffer.drain(..end + gap).collect();
            let text = String::from_utf8_lossy(&raw[..end]);
            let mut event = SseEvent {
                name: "message".to_owned(),
                data: String::new(),
            };
            for line in text.lines() {
                let (field, value) = line.split_once(':').unwrap_or((line, ""));
                let value = value.strip_prefix(' ').unwrap_or(value);
                match field {
                    "event" => event.name = value.to_owned(),
                    "data" => {
                        if !event.data.is_empty() {
                            event.data.push('\n');
                        }
                        event.data.push_str(value);
                    }
                    _ => {}
                }
            }
            if !event.data.is_empty() {
                events.push(event);
            }
        }
        // An end may straddle chunks: rescan its first bytes next time.
        self.scanned = self.buffer.len().saturating_sub(3);
        if self.buffer.len() > MAX_EVENT {
            return Err(format!(
                "the server sent an event larger than {} MiB",
                MAX_EVENT >> 20
            ));
        }
        Ok(events)
    }
}

/// Where the first event in `buffer` ends (searching from `from`), and the length of the blank
/// line after it.
fn event_end(buffer: &[u8], from: usize) -> Option<(usize, usize)> {
    (from..buffer.len()).find_map(|i| {
        if buffer[i..].starts_with(b"\r\n\r\n") {
            Some((i, 4))
        } else if buffer[i..].starts_with(b"\n\n") {
            Some((i, 2))
        } else {
            None
        }
    })
}

impl LegacySse {
    /// Opens the event stream at `url` and waits for its endpoint.
    pub(crate) async fn connect(
        client: reqwest::Client,
        url: &str,
        headers: HeaderMap,
    ) -> Result<Self, String> {
        let base = reqwest::Url::parse(url).map_err(|e| format!("{url} is not a URL: {e}"))?;
        let response = client
            .get(base.clone())
            .headers(headers.clone())
            .header(ACCEPT, HeaderValue::from_static("text/event-stream"))
            .send()
            .await
            .map_err(|e| format!("cannot open the event stream at {url}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!(
                "{url} answered {} to the event stream request",
                response.status()
            ));
        }
        let mut stream = response.bytes_stream();
        let mut parser = SseParser::default();
        let (sender, incoming) = mpsc::channel(64);
        use futures::StreamExt as _;
        // The endpoint comes first; messages that arrive with it are kept.
        let mut early = Vec::new();
        let endpoint = loop {
            let chunk = stream
                .next()
                .await
                .ok_or_else(|| format!("{url} closed the event stream before naming its endpoint"))?
                .map_err(|e| format!("reading the event stream of {url} failed: {e}"))?;
            let mut endpoint = None;
            for event in parser.push(&chunk)? {
                if event.name == "endpoint" && endpoint.is_none() {
                    endpoint =
                        Some(base.join(event.data.trim()).map_err(|e| {
                            format!("{url} named an endpoint that is not a URL ({e})")
                        })?);
                } else {
                    early.push(event);
                }
            }
            if let Some(endpoint) = endpoint {
                break endpoint;
            }
        };
        let reader = tokio::spawn(async move {
            let deliver = |event: SseEvent| {
                if event.name != "message" {
                    return None;
                }
                match serde_json::from_str::<RxJsonRpcMessage<RoleClient>>(&event.data) {
                    Ok(message) => Some(message),
                    Err(e) => {
                        tracing::warn!("an SSE message that is not JSON-RPC was ignored: {e}");
                        None
                    }
                }
            };
            for event in early {
                if let Some(message) = deliver(event)
                    && sender.send(message).await.is_err()
                {
                    return;
                }
            }
            while let Some(Ok(chunk)) = stream.next().await {
                let Ok(events) = parser.push(&chunk) else {
                    return;
                };
                for event in events {
                    if let Some(message) = deliver(event)
                        && sender.send(message).await.is_err()
                    {
                        return;
                    }
                }
            }
            // The stream ended: dropping the sender tells the client the transport closed.
        });
        Ok(Self {
            client,
            endpoint,
            headers,
            incoming,
            reader,
        })
    }
}

impl rmcp::transport::Transport<RoleClient> for LegacySse {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        let request = serde_json::to_vec(&item).map(|body| {
            self.client
                .post(self.endpoint.clone())
                .headers(self.headers.clone())
                .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
                .body(body)
        });
        async move {
            let response = request?.send().await.map_err(std::io::Error::other)?;
            if response.status().is_success() {
                Ok(())
            } else {
                // The status, for telling a failed call from a broken connection.
                let retry_after = response
                    .headers()
                    .get(reqwest::header::RETRY_AFTER)
                    .and_then(|value| value.to_str().ok())
                    .map(str::to_owned);
                Err(std::io::Error::other(
                    rmcp::transport::streamable_http_client::HttpStatusError::new(
                        response.status().as_u16(),
                        retry_after,
                    ),
                ))
            }
        }
    }

    fn receive(&mut self) -> impl Future<Output = Option<RxJsonRpcMessage<RoleClient>>> {
        self.incoming.recv()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.reader.abort();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::SseParser;

    #[test]
    fn events_are_split_across_chunks_and_line_endings() {
        let mut parser = SseParser::default();
        assert!(
            parser
                .push(b"event: endpoint\ndata: /mess")
                .unwrap_or_default()
                .is_empty()
        );
        let events = parser
            .push(b"age?s=1\n\n: a comment\r\n\r\ndata: {\"a\":\ndata: 1}\r\n\r\n")
            .unwrap_or_default();
        assert_eq!(events.len(), 2);
        assert_eq!(
            (events[0].name.as_str(), events[0].data.as_str()),
            ("endpoint", "/message?s=1")
        );
        assert_eq!(
            (events[1].name.as_str(), events[1].data.as_str()),
            ("message", "{\"a\":\n1}")
        );
    }
}
