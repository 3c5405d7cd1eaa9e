//! Cassettes: every HTTP exchange with a real provider written to a JSON file
//! (`--record PATH`), and played back later (`replay:PATH`) with each request checked against
//! the recording, so a change in what we send fails with a readable diff.
//!
//! Credentials are never written: they travel in secret headers, which are not recorded, and
//! any occurrence of the key elsewhere is replaced before the file is written.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::http::{BodyStream, HttpRequest, HttpResponse, Secret, Transport, TransportError};

/// Version written in new cassettes.
pub const CASSETTE_VERSION: u32 = 1;

/// Response headers worth keeping: the ones the client acts on.
const KEPT_RESPONSE_HEADERS: &[&str] = &["content-type", "retry-after", "retry-after-ms"];

/// A recorded session.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Cassette {
    /// Format version.
    pub version: u32,
    /// The model spec the session used, e.g. `anthropic:claude-sonnet-4-5`.
    pub model: String,
    /// The base URL the session used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The exchanges, in order.
    pub exchanges: Vec<Exchange>,
}

/// One request and what came back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Exchange {
    /// What we sent.
    pub request: RecordedRequest,
    /// What came back.
    pub response: RecordedResponse,
}

/// A request without its credentials.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedRequest {
    /// The URL.
    pub url: String,
    /// Non-secret headers.
    pub headers: BTreeMap<String, String>,
    /// The JSON body.
    pub body: Value,
}

/// A response, or the transport failure in its place.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedResponse {
    /// HTTP status; 0 when no response arrived.
    pub status: u16,
    /// Headers the client acts on.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The body as received (an SSE stream is kept verbatim).
    #[serde(default)]
    pub body: String,
    /// The transport error that ended the exchange, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether that error was worth a retry.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retryable: bool,
}

/// A cassette that cannot be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CassetteError {
    /// The file cannot be read or written.
    // The OS error is the `source()`, not part of this message: error reports that walk the
    // chain (anyhow's `{:#}`) would print it twice.
    #[error("cannot access cassette {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why, as the error's `source()`.
        source: std::io::Error,
    },
    /// The file is not a cassette.
    #[error("{} is not a valid cassette: {message}; record a session into it first", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl Cassette {
    /// Reads a cassette file.
    pub fn load(path: &Path) -> Result<Self, CassetteError> {
        let text = std::fs::read_to_string(path).map_err(|source| CassetteError::Io {
            path: path.to_owned(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| CassetteError::Parse {
            path: path.to_owned(),
            message: e.to_string(),
        })
    }
}

fn recorded_request(request: &HttpRequest) -> RecordedRequest {
    RecordedRequest {
        url: request.url.clone(),
        headers: request
            .headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .collect(),
        // Recorded as JSON so a cassette stays readable and compares by meaning, not bytes.
        body: serde_json::from_slice(&request.body)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&request.body).into_owned())),
    }
}

/// Records every exchange of an inner transport to a file, rewritten after each exchange so
/// an interrupted run keeps what it recorded. Bodies are passed on as they arrive (streams
/// stay streams) and copied aside; an exchange is written when its body ends, fails, or is
/// dropped by the client.
#[derive(Debug)]
pub struct RecordingTransport {
    inner: Arc<dyn Transport>,
    recorder: Arc<Recorder>,
}

#[derive(Debug)]
struct Recorder {
    path: PathBuf,
    secrets: Vec<Secret>,
    cassette: Mutex<Cassette>,
}

impl RecordingTransport {
    /// Records `inner` into `path` (created or truncated now, so a bad path fails early).
    pub fn new(
        inner: Arc<dyn Transport>,
        path: PathBuf,
        model: String,
        base_url: Option<String>,
        secrets: Vec<Secret>,
    ) -> Result<Self, CassetteError> {
        let recorder = Recorder {
            path,
            secrets,
            cassette: Mutex::new(Cassette {
                version: CASSETTE_VERSION,
                model,
                base_url,
                exchanges: Vec::new(),
            }),
        };
        recorder.write()?;
        Ok(Self {
            inner,
            recorder: Arc::new(recorder),
        })
    }
}

impl Recorder {
    fn write(&self) -> Result<(), CassetteError> {
        let mut text = {
            let cassette = self.cassette.lock().unwrap_or_else(|e| e.into_inner());
            serde_json::to_string_pretty(&*cassette).map_err(|e| CassetteError::Parse {
                path: self.path.clone(),
                message: e.to_string(),
            })?
        };
        for secret in &self.secrets {
            if !secret.expose().is_empty() {
                text = text.replace(secret.expose(), "<redacted>");
            }
        }
        std::fs::write(&self.path, text).map_err(|source| CassetteError::Io {
            path: self.path.clone(),
            source,
        })
    }

    fn record(&self, exchange: Exchange) {
        self.cassette
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .exchanges
            .push(exchange);
        if let Err(error) = self.write() {
            // The message leaves the OS error to `source()`; a log line needs both.
            let cause = std::error::Error::source(&error)
                .map(|cause| format!(": {cause}"))
                .unwrap_or_default();
            tracing::error!(error = %format_args!("{error}{cause}"), "cannot write the cassette");
        }
    }
}

#[async_trait]
impl Transport for RecordingTransport {
    async fn send(&self, request: &HttpRequest) -> Result<HttpResponse, TransportError> {
        let recorded = recorded_request(request);
        let response = match self.inner.send(request).await {
            Ok(response) => response,
            Err(error) => {
                self.recorder.record(Exchange {
                    request: recorded,
                    response: RecordedResponse {
                        status: 0,
                        headers: BTreeMap::new(),
                        body: String::new(),
                        error: Some(error.message.clone()),
                        retryable: error.retryable,
                    },
                });
                return Err(error);
            }
        };
        let headers: BTreeMap<String, String> = response
            .headers
            .iter()
            .filter(|(k, _)| KEPT_RESPONSE_HEADERS.contains(&k.as_str()))
            .cloned()
            .collect();
        let tee = Tee {
            inner: response.body,
            recorder: Arc::clone(&self.recorder),
            pending: Some((recorded, response.status, headers)),
            body: Vec::new(),
        };
        Ok(HttpResponse {
            status: response.status,
            headers: response.headers,
            body: Box::pin(tee),
        })
    }
}

/// Passes a body on while copying it; records the exchange once, when the body is over.
struct Tee {
    inner: BodyStream,
    recorder: Arc<Recorder>,
    pending: Option<(RecordedRequest, u16, BTreeMap<String, String>)>,
    body: Vec<u8>,
}

impl Tee {
    fn finish(&mut self, failure: Option<&TransportError>) {
        let Some((request, status, headers)) = self.pending.take() else {
            return;
        };
        self.recorder.record(Exchange {
            request,
            response: RecordedResponse {
                status,
                headers,
                body: String::from_utf8_lossy(&self.body).into_owned(),
                error: failure.map(|f| f.message.clone()),
                retryable: failure.is_some_and(|f| f.retryable),
            },
        });
    }
}

impl Stream for Tee {
    type Item = Result<Bytes, TransportError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.inner.as_mut().poll_next(cx);
        match &polled {
            Poll::Ready(Some(Ok(chunk))) => {
                let chunk = chunk.clone();
                self.body.extend_from_slice(&chunk);
            }
            Poll::Ready(Some(Err(error))) => {
                let error = error.clone();
                self.finish(Some(&error));
            }
            Poll::Ready(None) => self.finish(None),
            Poll::Pending => {}
        }
        polled
    }
}

impl Drop for Tee {
    fn drop(&mut self) {
        // The client stopped reading: it had what it needed (a completion marker) or gave up
        // (a timeout). A replay stops at the same point either way.
        let stopped = TransportError {
            retryable: true,
            message: "the client stopped reading the response here".to_owned(),
        };
        self.finish(Some(&stopped));
    }
}

fn replayed_response(
    status: u16,
    headers: BTreeMap<String, String>,
    body: Bytes,
    failure: Option<TransportError>,
) -> HttpResponse {
    let mut chunks: Vec<Result<Bytes, TransportError>> = Vec::new();
    if !body.is_empty() {
        chunks.push(Ok(body));
    }
    if let Some(failure) = failure {
        chunks.push(Err(failure));
    }
    HttpResponse {
        status,
        headers: headers.into_iter().collect(),
        body: Box::pin(futures::stream::iter(chunks)),
    }
}

/// Plays a cassette back, checking each request against the recording.
#[derive(Debug)]
pub struct ReplayTransport {
    path: PathBuf,
    exchanges: Vec<Exchange>,
    next: Mutex<usize>,
}

impl ReplayTransport {
    /// Replays `cassette`, read from `path`.
    pub fn new(path: PathBuf, cassette: Cassette) -> Self {
        Self {
            path,
            exchanges: cassette.exchanges,
            next: Mutex::new(0),
        }
    }
}

#[async_trait]
impl Transport for ReplayTransport {
    async fn send(&self, request: &HttpRequest) -> Result<HttpResponse, TransportError> {
        let index = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let index = *next;
            *next += 1;
            index
        };
        let Some(exchange) = self.exchanges.get(index) else {
            return Err(TransportError {
                retryable: false,
                message: format!(
                    "cassette {} holds {} exchanges and the run sent request {}; record it again",
                    self.path.display(),
                    self.exchanges.len(),
                    index + 1
                ),
            });
        };
        let sent = recorded_request(request);
        if sent != exchange.request {
            return Err(TransportError {
                retryable: false,
                message: format!(
                    "request {} differs from cassette {} (- recorded, + sent):\n{}",
                    index + 1,
                    self.path.display(),
                    diff(&exchange.request, &sent)
                ),
            });
        }
        let response = &exchange.response;
        if response.status == 0 {
            return Err(TransportError {
                retryable: response.retryable,
                message: response.error.clone().unwrap_or_default(),
            });
        }
        let failure = response.error.as_ref().map(|message| TransportError {
            retryable: response.retryable,
            message: message.clone(),
        });
        Ok(replayed_response(
            response.status,
            response.headers.clone(),
            Bytes::from(response.body.clone()),
            failure,
        ))
    }
}

/// A line diff of two requests as pretty JSON, with a little context around each change.
pub fn diff(recorded: &RecordedRequest, sent: &RecordedRequest) -> String {
    let pretty = |r: &RecordedRequest| {
        serde_json::to_string_pretty(&serde_json::json!({
            "url": r.url, "headers": r.headers, "body": r.body,
        }))
        .unwrap_or_default()
    };
    let (a, b) = (pretty(recorded), pretty(sent));
    let a: Vec<&str> = a.lines().collect();
    let b: Vec<&str> = b.lines().collect();
    // Trim the common head and tail so the quadratic part only sees the changed middle.
    let head = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let tail = a[head..]
        .iter()
        .rev()
        .zip(b[head..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (mid_a, mid_b) = (&a[head..a.len() - tail], &b[head..b.len() - tail]);
    let mut lines: Vec<(char, &str)> = Vec::new();
    if mid_a
        .len()
        .checked_mul(mid_b.len())
        .is_some_and(|cells| cells <= 4_000_000)
    {
        let mut lcs = vec![vec![0u32; mid_b.len() + 1]; mid_a.len() + 1];
        for i in (0..mid_a.len()).rev() {
            for j in (0..mid_b.len()).rev() {
                lcs[i][j] = if mid_a[i] == mid_b[j] {
                    lcs[i + 1][j + 1] + 1
                } else {
                    lcs[i + 1][j].max(lcs[i][j + 1])
                };
            }
        }
        let (mut i, mut j) = (0, 0);
        while i < mid_a.len() || j < mid_b.len() {
            if i < mid_a.len() && j < mid_b.len() && mid_a[i] == mid_b[j] {
                lines.push((' ', mid_a[i]));
                i += 1;
                j += 1;
            } else if j < mid_b.len() && (i == mid_a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
                lines.push(('+', mid_b[j]));
                j += 1;
            } else {
                lines.push(('-', mid_a[i]));
                i += 1;
            }
        }
    } else {
        lines.extend(mid_a.iter().map(|l| ('-', *l)));
        lines.extend(mid_b.iter().map(|l| ('+', *l)));
    }
    let mut out = String::new();
    let context = 3;
    for line in &a[head.saturating_sub(context)..head] {
        let _ = writeln!(out, "  {line}");
    }
    for (mark, line) in lines {
        let _ = writeln!(out, "{mark} {line}");
    }
    for line in &a[a.len() - tail..(a.len() - tail + context.min(tail))] {
        let _ = writeln!(out, "  {line}");
    }
    out
}
