//! The model every HTTP provider shares: one [`Wire`] format per API, one retrying transport.

use std::fmt;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use deepagents_core::model::{
    InputModalities, Model, ModelError, ModelProfile, ModelRequest, ModelResponse, ModelStream,
    StreamEvent,
};
use futures::StreamExt;
use serde_json::Value;

use crate::encoded::{EncodeCache, encoding_failed};
use crate::http::sse::{SseEvent, SseParser};
use crate::http::{
    HttpConfig, HttpRequest, Secret, Transport, TransportError, read_body, send_with_retry,
    truncate, with_attempts,
};

/// How hard a reasoning model should think. Each wire maps it to its own setting: `reasoning`
/// effort for OpenAI, a thinking token budget for Anthropic and Gemini.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningEffort {
    /// Quick answers.
    Low,
    /// The default of most reasoning models.
    Medium,
    /// Hard problems.
    High,
}

impl ReasoningEffort {
    /// The OpenAI name: `low`, `medium` or `high`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
        }
    }

    /// A thinking budget in tokens, for APIs that take one.
    pub fn budget_tokens(self) -> u64 {
        match self {
            Self::Low => 2_048,
            Self::Medium => 8_192,
            Self::High => 24_576,
        }
    }
}

/// What a stream decoder made of one event.
#[derive(Debug, Default)]
pub struct Step {
    /// Deltas to pass on.
    pub deltas: Vec<StreamEvent>,
    /// The assembled response, once the completion marker arrived.
    pub done: Option<ModelResponse>,
}

/// Turns one provider's SSE events into stream events.
pub trait Decoder: Send {
    /// Handles one event.
    fn event(&mut self, event: &SseEvent) -> Result<Step, ModelError>;

    /// The body ended; formats whose last chunk is the marker finish here.
    fn end(&mut self) -> Result<ModelResponse, ModelError> {
        Err(ModelError::Transient {
            message: "the stream ended before its completion marker; the answer is incomplete"
                .to_owned(),
        })
    }
}

/// One provider API: how requests are written and responses read.
pub trait Wire: Send + Sync + fmt::Debug + 'static {
    /// Provider name for messages, e.g. `anthropic`.
    fn provider(&self) -> &str;

    /// The URL and the encoded body of a call: what is sent, written straight from the typed
    /// request, reusing from `cache` what the wire encoded for the messages of earlier
    /// requests.
    fn encode(
        &self,
        request: &ModelRequest,
        stream: bool,
        cache: &mut EncodeCache,
    ) -> Result<(String, Vec<u8>), ModelError>;

    /// The URL and the body of a call as JSON: [`encode`](Self::encode) read back, for tests
    /// and inspection.
    fn request(&self, request: &ModelRequest, stream: bool) -> Result<(String, Value), ModelError> {
        let (url, bytes) = self.encode(request, stream, &mut EncodeCache::default())?;
        let body = serde_json::from_slice(&bytes).map_err(encoding_failed)?;
        Ok((url, body))
    }

    /// Headers other than credentials.
    fn headers(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// Credential headers.
    fn secret_headers(&self, key: &Secret) -> Vec<(String, Secret)> {
        vec![(
            "authorization".to_owned(),
            Secret::new(format!("Bearer {}", key.expose())),
        )]
    }

    /// What the model reads besides text, when the wire knows.
    fn modalities(&self) -> Option<InputModalities> {
        None
    }

    /// Reads a complete (non-streamed) response body.
    fn parse(&self, body: &Value) -> Result<ModelResponse, ModelError>;

    /// A fresh decoder for one streamed response.
    fn decoder(&self) -> Box<dyn Decoder>;
}

/// A model served over HTTP by one [`Wire`] format.
pub struct HttpModel<W: Wire> {
    id: String,
    wire: W,
    key: Option<Secret>,
    config: HttpConfig,
    transport: Arc<dyn Transport>,
    profile: Option<ModelProfile>,
    /// Replays do not sleep between retries.
    wait: bool,
    /// What the wire encoded for recent requests.
    encoded: Mutex<EncodeCache>,
    /// How to ask the server for the window when no profile is known.
    discovery: Option<crate::discovery::Discovery>,
    /// What the server said, once asked.
    discovered: tokio::sync::OnceCell<Option<ModelProfile>>,
}

impl<W: Wire> fmt::Debug for HttpModel<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpModel")
            .field("id", &self.id)
            .field("wire", &self.wire)
            .field("key", &self.key)
            .field("config", &self.config)
            .field("transport", &self.transport)
            .finish()
    }
}

impl<W: Wire> HttpModel<W> {
    /// Assembles a model.
    pub fn new(
        id: String,
        wire: W,
        key: Option<Secret>,
        config: HttpConfig,
        transport: Arc<dyn Transport>,
        profile: Option<ModelProfile>,
        wait: bool,
    ) -> Self {
        Self {
            id,
            wire,
            key,
            config,
            transport,
            profile,
            wait,
            encoded: Mutex::default(),
            discovery: None,
            discovered: tokio::sync::OnceCell::new(),
        }
    }

    /// Asks the server for the window on [`Model::resolve_profile`] when no profile is known.
    pub(crate) fn with_discovery(mut self, discovery: Option<crate::discovery::Discovery>) -> Self {
        self.discovery = discovery;
        self
    }

    async fn pause(&self, attempt: u32) {
        if self.wait {
            tokio::time::sleep(crate::http::backoff(&self.config, attempt)).await;
        }
    }

    fn http_request(
        &self,
        request: &ModelRequest,
        stream: bool,
    ) -> Result<HttpRequest, ModelError> {
        // A panic while encoding leaves a cache that may be half written: start over.
        let mut cache = self.encoded.lock().unwrap_or_else(|poisoned| {
            self.encoded.clear_poison();
            let mut cache = poisoned.into_inner();
            *cache = EncodeCache::default();
            cache
        });
        let (url, body) = self.wire.encode(request, stream, &mut cache)?;
        drop(cache);
        let mut headers = self.wire.headers();
        if stream {
            headers.push(("accept".to_owned(), "text/event-stream".to_owned()));
        }
        Ok(HttpRequest {
            url,
            headers,
            secret_headers: self
                .key
                .as_ref()
                .map(|key| self.wire.secret_headers(key))
                .unwrap_or_default(),
            body: body.into(),
        })
    }
}

#[async_trait]
impl<W: Wire> Model for HttpModel<W> {
    fn id(&self) -> &str {
        &self.id
    }

    fn profile(&self) -> Option<ModelProfile> {
        self.profile
            .or_else(|| self.discovered.get().copied().flatten())
    }

    async fn resolve_profile(&self) -> Option<ModelProfile> {
        if self.profile.is_some() {
            return self.profile;
        }
        let discovery = self.discovery.as_ref()?;
        *self.discovered.get_or_init(|| discovery.profile()).await
    }

    fn input_modalities(&self) -> Option<InputModalities> {
        self.wire.modalities()
    }

    async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let http = self.http_request(request, false)?;
        let provider = self.wire.provider();
        let mut attempt = 0;
        loop {
            let mut response = send_with_retry(
                self.transport.as_ref(),
                &self.config,
                provider,
                &http,
                self.wait,
                &mut attempt,
            )
            .await?;
            let body = match read_body(&mut response.body, self.config.idle_timeout).await {
                Ok(body) => body,
                Err(error) if error.retryable && attempt < self.config.max_retries => {
                    tracing::warn!(provider, %error, "response body broke; retrying");
                    self.pause(attempt).await;
                    attempt += 1;
                    continue;
                }
                Err(error) => {
                    return Err(with_attempts(
                        ModelError::Transient {
                            message: format!("{provider} response broke off: {error}"),
                        },
                        attempt,
                    ));
                }
            };
            // A garbled body is a server glitch like a broken one: worth another attempt.
            let value: Value = match serde_json::from_slice(&body) {
                Ok(value) => value,
                Err(e) => {
                    let error = ModelError::Transient {
                        message: format!(
                            "{provider} sent a response that is not JSON ({e}): {}",
                            truncate(&String::from_utf8_lossy(&body), 300)
                        ),
                    };
                    if attempt < self.config.max_retries {
                        tracing::warn!(provider, %error, "retrying");
                        self.pause(attempt).await;
                        attempt += 1;
                        continue;
                    }
                    return Err(with_attempts(error, attempt));
                }
            };
            return self.wire.parse(&value);
        }
    }

    async fn stream(&self, request: &ModelRequest) -> Result<ModelStream, ModelError> {
        let http = self.http_request(request, true)?;
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        let job = StreamJob {
            provider: self.wire.provider().to_owned(),
            http,
            config: self.config.clone(),
            transport: Arc::clone(&self.transport),
            wait: self.wait,
        };
        // One fresh decoder per possible attempt: the wire itself stays with the model.
        let decoders: Vec<Box<dyn Decoder>> = (0..=self.config.max_retries)
            .map(|_| self.wire.decoder())
            .collect();
        tokio::spawn(job.run(decoders, sender));
        Ok(Box::pin(futures::stream::unfold(
            receiver,
            |mut receiver| async move { receiver.recv().await.map(|item| (item, receiver)) },
        )))
    }
}

type Sender = tokio::sync::mpsc::Sender<Result<StreamEvent, ModelError>>;

struct StreamJob {
    provider: String,
    http: HttpRequest,
    config: HttpConfig,
    transport: Arc<dyn Transport>,
    wait: bool,
}

enum Attempt {
    /// Finished, successfully or with an error already sent.
    Finished,
    /// Broke before anything reached the caller: safe to send again.
    Retry(ModelError),
}

impl StreamJob {
    async fn run(self, mut decoders: Vec<Box<dyn Decoder>>, sender: Sender) {
        let mut retries = 0;
        while let Some(decoder) = decoders.pop() {
            // A caller that dropped the stream (a cancelled run) stops the work, even mid-wait.
            let outcome = tokio::select! {
                () = sender.closed() => return,
                outcome = self.attempt(decoder, &sender, &mut retries) => outcome,
            };
            match outcome {
                Attempt::Finished => return,
                Attempt::Retry(error) => {
                    if decoders.is_empty() || retries >= self.config.max_retries {
                        let _ = sender.send(Err(with_attempts(error, retries))).await;
                        return;
                    }
                    tracing::warn!(provider = %self.provider, %error, "stream broke before any output; retrying");
                    if self.wait {
                        tokio::time::sleep(crate::http::backoff(&self.config, retries)).await;
                    }
                    retries += 1;
                }
            }
        }
    }

    async fn attempt(
        &self,
        mut decoder: Box<dyn Decoder>,
        sender: &Sender,
        retries: &mut u32,
    ) -> Attempt {
        let provider = self.provider.as_str();
        let mut response = match send_with_retry(
            self.transport.as_ref(),
            &self.config,
            provider,
            &self.http,
            self.wait,
            retries,
        )
        .await
        {
            Ok(response) => response,
            Err(error) => {
                let _ = sender.send(Err(error)).await;
                return Attempt::Finished;
            }
        };
        let mut parser = SseParser::new();
        let mut events = Vec::new();
        let mut sent_any = false;
        loop {
            let chunk =
                match tokio::time::timeout(self.config.idle_timeout, response.body.next()).await {
                    Ok(Some(Ok(chunk))) => chunk,
                    Ok(Some(Err(error))) => {
                        return self.broken(sent_any, sender, broke(provider, &error)).await;
                    }
                    Ok(None) => {
                        let result = decoder.end().map_err(|error| match error {
                            ModelError::Transient { message } => ModelError::Transient {
                                message: format!("{provider}: {message}"),
                            },
                            other => other,
                        });
                        return match result {
                            Ok(done) => {
                                let _ = sender.send(Ok(StreamEvent::Completed(done))).await;
                                Attempt::Finished
                            }
                            Err(error) => self.broken(sent_any, sender, error).await,
                        };
                    }
                    Err(_) => {
                        let error = ModelError::Transient {
                            message: format!(
                                "the {provider} stream stalled for {} s (idle timeout)",
                                self.config.idle_timeout.as_secs_f64()
                            ),
                        };
                        return self.broken(sent_any, sender, error).await;
                    }
                };
            parser.feed(&chunk, &mut events);
            for event in events.drain(..) {
                let step = match decoder.event(&event) {
                    Ok(step) => step,
                    Err(error) => return self.broken(sent_any, sender, error).await,
                };
                for delta in step.deltas {
                    sent_any = true;
                    if sender.send(Ok(delta)).await.is_err() {
                        return Attempt::Finished;
                    }
                }
                if let Some(done) = step.done {
                    let _ = sender.send(Ok(StreamEvent::Completed(done))).await;
                    return Attempt::Finished;
                }
            }
        }
    }

    async fn broken(&self, sent_any: bool, sender: &Sender, error: ModelError) -> Attempt {
        if !sent_any && error.is_retryable() {
            return Attempt::Retry(error);
        }
        let _ = sender.send(Err(error)).await;
        Attempt::Finished
    }
}

/// A sampling setting (`temperature`, `top_p`) as the JSON number it was written as: `0.2`
/// kept in an `f32` widens to `0.20000000298023224`, which is what a plain `f64::from` would
/// send.
pub(crate) fn sampling(value: f32) -> f64 {
    value.to_string().parse().unwrap_or(f64::from(value))
}

fn broke(provider: &str, error: &TransportError) -> ModelError {
    ModelError::Transient {
        message: format!("the {provider} stream broke before its completion marker: {error}"),
    }
}

/// The error for an event that is not what the provider documents.
pub fn malformed(provider: &str, event: &SseEvent, why: impl fmt::Display) -> ModelError {
    ModelError::Transient {
        message: format!(
            "malformed {provider} stream event `{}` ({why}): {}",
            event.name(),
            truncate(&event.data, 200)
        ),
    }
}

/// Parses an event's data as JSON, or names the provider and event in the error.
pub fn event_json(provider: &str, event: &SseEvent) -> Result<Value, ModelError> {
    serde_json::from_str(&event.data).map_err(|e| malformed(provider, event, e))
}
