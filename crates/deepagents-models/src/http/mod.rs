//! The HTTP layer shared by every provider: transport, timeouts, retries with backoff and
//! jitter, error classification and secret handling.

pub mod sse;

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use deepagents_core::ModelError;
use futures::{Stream, StreamExt};
use serde_json::Value;

/// A secret such as an API key. Its `Debug` and `Display` never show the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value, for the one place that must send it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Timeouts and retry policy of a provider client.
#[derive(Clone, Debug, PartialEq)]
pub struct HttpConfig {
    /// Time allowed to open the TCP/TLS connection.
    pub connect_timeout: Duration,
    /// Time allowed from sending the request to receiving the response headers. Non-streaming
    /// calls only get headers once the whole answer is ready, so this is generous.
    pub first_byte_timeout: Duration,
    /// Longest silence allowed between two chunks of a response body.
    pub idle_timeout: Duration,
    /// Retries after the first attempt (0 disables retrying).
    pub max_retries: u32,
    /// Wait before the first retry; doubled for each further one, with jitter.
    pub backoff_base: Duration,
    /// Cap on one computed backoff wait.
    pub backoff_max: Duration,
    /// Longest `Retry-After` we wait for; a longer one is reported instead of waited out.
    pub max_retry_after: Duration,
}

impl Default for HttpConfig {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            first_byte_timeout: Duration::from_secs(600),
            idle_timeout: Duration::from_secs(120),
            max_retries: 2,
            backoff_base: Duration::from_millis(500),
            backoff_max: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(60),
        }
    }
}

/// One HTTP request to a provider.
#[derive(Clone, Debug)]
pub struct HttpRequest {
    /// Absolute URL.
    pub url: String,
    /// Headers that may be logged and recorded.
    pub headers: Vec<(String, String)>,
    /// Headers carrying credentials: sent, never logged nor recorded.
    pub secret_headers: Vec<(String, Secret)>,
    /// The JSON body, encoded (shared, so a retry resends it without a copy).
    pub body: bytes::Bytes,
}

/// A response body, chunk by chunk.
pub type BodyStream = Pin<Box<dyn Stream<Item = Result<Bytes, TransportError>> + Send>>;

/// One HTTP response.
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Headers, names lowercase.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: BodyStream,
}

impl fmt::Debug for HttpResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpResponse")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .finish_non_exhaustive()
    }
}

impl HttpResponse {
    /// A header's value, by lowercase name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A request that got no usable HTTP response.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TransportError {
    /// Whether sending it again may work (connection refused or reset, timeout).
    pub retryable: bool,
    /// What happened.
    pub message: String,
}

/// Sends requests. The real one speaks HTTP; cassettes record or replay.
#[async_trait]
pub trait Transport: Send + Sync + fmt::Debug {
    /// Sends one request and returns the response once its headers arrived.
    async fn send(&self, request: &HttpRequest) -> Result<HttpResponse, TransportError>;
}

/// The real HTTP transport (reqwest with rustls).
#[derive(Debug)]
pub struct ReqwestTransport {
    client: reqwest::Client,
}

impl ReqwestTransport {
    /// A client with the given connect timeout, using the proxy from the environment.
    pub fn new(config: &HttpConfig) -> Result<Self, ModelError> {
        Self::build(config, false)
    }

    /// A client that ignores proxy settings, for servers on this machine (a proxy from the
    /// environment could not reach them).
    pub fn direct(config: &HttpConfig) -> Result<Self, ModelError> {
        Self::build(config, true)
    }

    fn build(config: &HttpConfig, direct: bool) -> Result<Self, ModelError> {
        let mut builder = crate::http_client();
        if direct {
            builder = builder.no_proxy();
        }
        let client = builder
            .connect_timeout(config.connect_timeout)
            .user_agent(concat!("deepagents-rs/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ModelError::Other {
                message: format!("cannot build the HTTP client: {e}"),
            })?;
        Ok(Self { client })
    }
}

#[async_trait]
impl Transport for ReqwestTransport {
    async fn send(&self, request: &HttpRequest) -> Result<HttpResponse, TransportError> {
        let body = request.body.clone();
        let mut builder = self
            .client
            .post(&request.url)
            .header("content-type", "application/json");
        for (name, value) in &request.headers {
            builder = builder.header(name, value);
        }
        for (name, value) in &request.secret_headers {
            let mut value = reqwest::header::HeaderValue::from_str(value.expose()).map_err(|_| {
                TransportError {
                    retryable: false,
                    message: format!(
                        "the credential for header `{name}` holds characters not allowed in an HTTP header; check the API key"
                    ),
                }
            })?;
            value.set_sensitive(true);
            builder = builder.header(name, value);
        }
        let response = builder
            .body(body)
            .send()
            .await
            .map_err(|e| transport_error(&e))?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .filter_map(|(name, value)| {
                Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned()))
            })
            .collect();
        let body = response
            .bytes_stream()
            .map(|chunk| chunk.map_err(|e| transport_error(&e)));
        Ok(HttpResponse {
            status,
            headers,
            body: Box::pin(body),
        })
    }
}

fn transport_error(error: &reqwest::Error) -> TransportError {
    // reqwest's Display hides the cause (e.g. "connection refused"); walk the chain.
    let mut message = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    let retryable = error.is_connect()
        || error.is_timeout()
        || error.is_request()
        || error.is_body()
        || error.is_decode();
    TransportError { retryable, message }
}

/// Reads a whole body, with the idle timeout between chunks.
pub async fn read_body(
    body: &mut BodyStream,
    idle_timeout: Duration,
) -> Result<Vec<u8>, TransportError> {
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(idle_timeout, body.next()).await {
            Ok(Some(chunk)) => out.extend_from_slice(&chunk?),
            Ok(None) => return Ok(out),
            Err(_) => {
                return Err(TransportError {
                    retryable: true,
                    message: format!(
                        "the response body stalled for {} s (idle timeout)",
                        idle_timeout.as_secs_f64()
                    ),
                });
            }
        }
    }
}

/// The most of an error body we read: its message is all we use, and a server that sends an
/// endless error body must not fill our memory.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// What arrives of an error body until it ends, breaks, stalls for the idle timeout or passes
/// about `limit` bytes (whole chunks, so possibly a little more); the rest is left unread.
/// An error body only explains the error, so whatever part arrived is the best there is.
async fn read_error_body(body: &mut BodyStream, idle_timeout: Duration, limit: usize) -> Vec<u8> {
    let mut out = Vec::new();
    while out.len() < limit {
        match tokio::time::timeout(idle_timeout, body.next()).await {
            Ok(Some(Ok(chunk))) => out.extend_from_slice(&chunk),
            Ok(Some(Err(_)) | None) | Err(_) => break,
        }
    }
    out
}

/// Whether a status is worth retrying: throttling, timeouts, conflicts, server errors and
/// Anthropic's 529 "overloaded".
pub fn is_retryable_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 429) || status >= 500
}

/// The longest wait [`retry_after`] reports. Servers may send any number; beyond a year it
/// only means "not soon", and a bounded value is safe to add to an `Instant` downstream.
pub const RETRY_AFTER_CEILING: Duration = Duration::from_secs(366 * 86_400);

/// The wait a response asks for: `retry-after-ms`, then `Retry-After` in seconds or as an
/// HTTP date.
///
/// Every value a server sends is accepted without panicking: a wait too long to represent is
/// capped at [`RETRY_AFTER_CEILING`], a date in the past is no wait, and a negative, NaN or
/// unreadable value is ignored (`None`), as if the header were absent.
pub fn retry_after(headers: &[(String, String)]) -> Option<Duration> {
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
    };
    if let Some(wait) = find("retry-after-ms")
        .and_then(|v| v.parse::<f64>().ok())
        .and_then(|ms| seconds_to_wait(ms / 1000.0))
    {
        return Some(wait);
    }
    let value = find("retry-after")?;
    if let Ok(seconds) = value.parse::<f64>() {
        return seconds_to_wait(seconds);
    }
    http_date_from_now(value)
}

/// A server's wait in seconds as a [`Duration`], capped at [`RETRY_AFTER_CEILING`] (infinity
/// included: it is just the longest wait); `None` for a negative or NaN number, which advises
/// nothing usable.
fn seconds_to_wait(seconds: f64) -> Option<Duration> {
    if seconds.is_nan() || seconds < 0.0 {
        return None;
    }
    // Not negative, so the only failure left is overflow: a very long wait.
    Some(
        Duration::try_from_secs_f64(seconds)
            .map_or(RETRY_AFTER_CEILING, |wait| wait.min(RETRY_AFTER_CEILING)),
    )
}

/// Seconds until an IMF-fixdate such as `Wed, 21 Oct 2015 07:28:00 GMT`.
fn http_date_from_now(value: &str) -> Option<Duration> {
    let parts: Vec<&str> = value.split_whitespace().collect();
    let [_, day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let day: i128 = day.parse().ok().filter(|d| (1..=31).contains(d))?;
    let month = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ]
    .iter()
    .position(|m| m == month)
    .and_then(|m| i128::try_from(m).ok())?
        + 1;
    // i128 throughout: the year is the server's and may be any i64, and every product
    // below then stays far inside i128, so nothing can overflow.
    let year = i128::from(year.parse::<i64>().ok()?);
    let mut hms = time.split(':').map(|p| p.parse::<i128>().ok());
    let (h, m, s) = (hms.next()??, hms.next()??, hms.next()??);
    if hms.next().is_some()
        || !(0..24).contains(&h)
        || !(0..60).contains(&m)
        || !(0..=60).contains(&s)
    {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let target = days * 86_400 + h * 3600 + m * 60 + s;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs();
    let wait = target - i128::from(now);
    let ceiling = i128::from(RETRY_AFTER_CEILING.as_secs());
    // Clamped into 0..=ceiling, which fits u64.
    let wait = u64::try_from(wait.clamp(0, ceiling)).unwrap_or(RETRY_AFTER_CEILING.as_secs());
    Some(Duration::from_secs(wait))
}

/// The wait a Google error body advises: `retryDelay` of a `google.rpc.RetryInfo` in
/// `error.details`, e.g. `"30s"` or `"1.5s"` (Gemini sends no `Retry-After` header).
/// Bounded like [`retry_after`]; `None` when the body holds no usable hint.
pub fn retry_delay_in_body(body: &str) -> Option<Duration> {
    let value: Value = serde_json::from_str(body).ok()?;
    let details = value.pointer("/error/details")?.as_array()?;
    details
        .iter()
        .filter(|d| {
            d.get("@type")
                .and_then(Value::as_str)
                .is_some_and(|t| t.ends_with("google.rpc.RetryInfo"))
        })
        .find_map(|d| match d.get("retryDelay")? {
            // The protobuf JSON form of a Duration: decimal seconds and an `s`.
            Value::String(text) => seconds_to_wait(text.trim().strip_suffix('s')?.parse().ok()?),
            // The structured form, `{"seconds": 30, "nanos": 0}`; the numbers may be anything.
            Value::Object(parts) => {
                let seconds = parts.get("seconds").map_or(Some(0.0), Value::as_f64)?;
                let nanos = parts.get("nanos").map_or(Some(0.0), Value::as_f64)?;
                seconds_to_wait(seconds + nanos / 1e9)
            }
            _ => None,
        })
}

/// A wait for people: `250 ms`, `42 s`, `15 min`, `3 h` or `2 days`.
pub fn describe_wait(wait: Duration) -> String {
    let secs = wait.as_secs();
    if wait >= RETRY_AFTER_CEILING {
        format!("{} days or more", RETRY_AFTER_CEILING.as_secs() / 86_400)
    } else if secs < 1 {
        format!("{} ms", wait.as_millis())
    } else if secs < 120 {
        format!("{:.1} s", wait.as_secs_f64())
    } else if secs < 2 * 3600 {
        format!("{} min", secs.div_ceil(60))
    } else if secs < 2 * 86_400 {
        format!("{} h", secs.div_ceil(3600))
    } else {
        format!("{} days", secs.div_ceil(86_400))
    }
}

/// The wait before retry number `attempt` (0-based): exponential, capped, with full jitter in
/// its upper half so clients that failed together do not retry together.
pub fn backoff(config: &HttpConfig, attempt: u32) -> Duration {
    let factor = 2u32.saturating_pow(attempt.min(16));
    let wait = config
        .backoff_base
        .saturating_mul(factor)
        .min(config.backoff_max);
    let jitter = (random_u64() % 1000) as f64 / 1000.0;
    wait.mul_f64(0.5 + 0.5 * jitter)
}

/// A random number from the standard library's per-instance hash keys; good enough for jitter
/// and ids, and needs no extra dependency.
pub fn random_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.finish()
}

/// Phrases providers use for a prompt that does not fit the context window.
const CONTEXT_OVERFLOW_MARKERS: &[&str] = &[
    "context_length_exceeded",
    "maximum context length",
    "context window",
    "context_window_exceeded",
    "prompt is too long",
    "exceed context limit",
    "exceeds the context",
    "exceeds the maximum number of tokens",
    "exceeds the available context size",
    "input token count",
    "too many input tokens",
    "reduce the length of the messages",
];

/// Whether lowercase error text says the prompt does not fit the context window.
pub fn is_context_overflow(lowercase: &str) -> bool {
    CONTEXT_OVERFLOW_MARKERS
        .iter()
        .any(|m| lowercase.contains(m))
}

/// Turns an error response into a [`ModelError`], recognising context-window overflows in the
/// wording of every supported provider.
pub fn classify_error(
    provider: &str,
    status: u16,
    headers: &[(String, String)],
    body: &str,
) -> ModelError {
    let message = error_message(provider, status, body);
    let overflow = is_context_overflow(&body.to_ascii_lowercase());
    match status {
        429 => ModelError::RateLimited {
            retry_after: retry_after(headers).or_else(|| retry_delay_in_body(body)),
            message,
        },
        401 | 403 => ModelError::Authentication {
            message: format!("{message}; check the API key"),
        },
        _ if overflow && status < 500 => ModelError::ContextWindowExceeded { message },
        _ if is_retryable_status(status) => ModelError::Transient { message },
        _ => ModelError::InvalidRequest { message },
    }
}

/// `provider returned HTTP 400: <the provider's own message>`.
fn error_message(provider: &str, status: u16, body: &str) -> String {
    let detail = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| {
            let error = v.get("error").unwrap_or(&v);
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .or_else(|| error.as_str())
                .or_else(|| v.get("detail").and_then(Value::as_str))?;
            let code = error
                .get("code")
                .and_then(Value::as_str)
                .or_else(|| error.get("type").and_then(Value::as_str))
                .or_else(|| error.get("status").and_then(Value::as_str));
            Some(match code {
                Some(code) => format!("{message} ({code})"),
                None => message.to_owned(),
            })
        })
        .unwrap_or_else(|| truncate(body.trim(), 500).to_owned());
    format!("{provider} returned HTTP {status}: {detail}")
}

/// At most `max` bytes of `text`, cut on a character boundary.
pub fn truncate(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Sends a request until it gets a successful response, retrying what is worth retrying.
///
/// Returns the response with its headers read and its body unread. `retries` counts the
/// retries spent so far on this call, so a caller that retries a broken body too shares one
/// budget of `config.max_retries`.
pub async fn send_with_retry(
    transport: &dyn Transport,
    config: &HttpConfig,
    provider: &str,
    request: &HttpRequest,
    wait: bool,
    retries: &mut u32,
) -> Result<HttpResponse, ModelError> {
    loop {
        let attempt = *retries;
        let error = match send_once(transport, config, provider, request).await {
            Ok(response) => return Ok(response),
            Err(error) => error,
        };
        let (error, advised) = error;
        if !error.is_retryable() || attempt >= config.max_retries {
            return Err(with_attempts(error, attempt));
        }
        let delay = match advised {
            Some(advised) if advised > config.max_retry_after => {
                return Err(with_attempts(
                    too_long_to_wait(error, advised, config.max_retry_after),
                    attempt,
                ));
            }
            Some(advised) => advised,
            None => backoff(config, attempt),
        };
        tracing::warn!(
            provider,
            attempt = attempt + 1,
            delay_ms = delay.as_millis() as u64,
            error = %error,
            "retrying model request"
        );
        if wait {
            tokio::time::sleep(delay).await;
        }
        *retries += 1;
    }
}

/// Says in the error's message that the server's advised wait is longer than we wait for, and
/// what to do about it, since the call then fails at once instead of being retried.
fn too_long_to_wait(error: ModelError, advised: Duration, max: Duration) -> ModelError {
    let note = format!(
        "; the provider asks to wait {}, longer than the {} this client waits for \
         (HttpConfig::max_retry_after), so the request was not retried: try again later, \
         check the account's rate limits and quota, or raise max_retry_after",
        describe_wait(advised),
        describe_wait(max)
    );
    append_note(error, &note)
}

/// Appends `note` to the message of a retryable error (the kinds whose retries ran out).
fn append_note(error: ModelError, note: &str) -> ModelError {
    match error {
        ModelError::RateLimited {
            retry_after,
            message,
        } => ModelError::RateLimited {
            retry_after,
            message: message + note,
        },
        ModelError::Transient { message } => ModelError::Transient {
            message: message + note,
        },
        other => other,
    }
}

/// Adds how many retries were spent to the error's message.
pub fn with_attempts(error: ModelError, retries: u32) -> ModelError {
    if retries == 0 {
        return error;
    }
    let plural = if retries == 1 { "retry" } else { "retries" };
    append_note(error, &format!(" (gave up after {retries} {plural})"))
}

async fn send_once(
    transport: &dyn Transport,
    config: &HttpConfig,
    provider: &str,
    request: &HttpRequest,
) -> Result<HttpResponse, (ModelError, Option<Duration>)> {
    let sent = tokio::time::timeout(config.first_byte_timeout, transport.send(request)).await;
    let mut response = match sent {
        Err(_) => {
            return Err((
                ModelError::Transient {
                    message: format!(
                        "{provider} sent no response within {} s (first-byte timeout)",
                        config.first_byte_timeout.as_secs_f64()
                    ),
                },
                None,
            ));
        }
        Ok(Err(error)) => {
            let error = if error.retryable {
                ModelError::Transient {
                    message: format!("cannot reach {provider} at {}: {error}", request.url),
                }
            } else {
                ModelError::Other {
                    message: format!("{provider} request to {} failed: {error}", request.url),
                }
            };
            return Err((error, None));
        }
        Ok(Ok(response)) => response,
    };
    if (200..300).contains(&response.status) {
        return Ok(response);
    }
    let body = read_error_body(&mut response.body, config.idle_timeout, ERROR_BODY_LIMIT).await;
    let body = String::from_utf8_lossy(&body);
    let mut error = classify_error(provider, response.status, &response.headers, &body);
    if is_retryable_status(response.status)
        && !matches!(
            error,
            ModelError::RateLimited { .. } | ModelError::Transient { .. }
        )
    {
        // A 5xx whose text mentions the context is still a server failure.
        error = ModelError::Transient {
            message: error.to_string(),
        };
    }
    let advised = retry_after(&response.headers).or_else(|| retry_delay_in_body(&body));
    Err((error, advised))
}
