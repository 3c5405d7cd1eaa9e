//! One server's connection: starting it (a child process, a streamable HTTP endpoint or a
//! legacy SSE one), our
//! side of the protocol (tool list changes, progress, elicitation; sampling is not offered, so
//! rmcp refuses it), and
//! what happens when it breaks: an HTTP connection is re-established within a budget, a
//! crashed stdio server restarted once.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deepagents_core::{Answer, EventKind, EventSink};
use rmcp::model::{
    ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction, ProgressNotificationParam,
    ProgressToken, RequestId,
};
use rmcp::service::{
    InboundStreamOrigin, MaybeSendFuture, NotificationContext, RequestContext, RoleClient,
};
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
};
use rmcp::{ErrorData, ServiceExt as _, transport::TokioChildProcess};
use serde_json::Value;

use crate::config::{ServerConfig, Transport};
use crate::elicitation::{Elicitation, ElicitationAnswer, ElicitationRequest, Elicitor};
use crate::legacy_sse::LegacySse;

pub(crate) type Service = rmcp::service::RunningService<RoleClient, Handler>;

/// The largest complete JSON response accepted from an HTTP server (rmcp's default is 16
/// MiB); a bigger tool result is refused rather than held in memory.
const MAX_HTTP_RESPONSE: usize = 64 * 1024 * 1024;

/// Where the progress of a running call goes.
pub(crate) struct ProgressTarget {
    pub(crate) events: EventSink,
    pub(crate) call_id: String,
}

impl ProgressTarget {
    fn emit(&self, params: ProgressNotificationParam) {
        self.events.emit(EventKind::ToolProgress {
            call_id: self.call_id.clone(),
            progress: params.progress,
            total: params.total,
            message: params.message,
        });
    }
}

/// Progress notifications by the call they belong to. A call learns its progress token only
/// once its request is sent, and a fast server reports before that: such reports wait here
/// (a few per token, for a bounded number of tokens) until the call takes them.
#[derive(Default)]
pub(crate) struct ProgressRoutes {
    calls: HashMap<ProgressToken, Route>,
}

enum Route {
    /// `reported` is the progress last passed on: rmcp handles each notification in its own
    /// task, so they can arrive out of order, and progress only ever grows (the protocol says
    /// so), so a report below it is stale and dropped rather than shown going backwards.
    Call {
        target: ProgressTarget,
        reported: Option<f64>,
    },
    Early(Vec<ProgressNotificationParam>),
}

/// Early reports kept per token, and tokens with early reports kept.
const EARLY_REPORTS: usize = 32;
const EARLY_TOKENS: usize = 256;

impl ProgressRoutes {
    fn report(&mut self, params: ProgressNotificationParam) {
        let early = self.calls.len() < EARLY_TOKENS;
        match self.calls.get_mut(&params.progress_token) {
            Some(Route::Call { target, reported })
                if reported.is_none_or(|last| params.progress > last) =>
            {
                *reported = Some(params.progress);
                target.emit(params);
            }
            Some(Route::Call { .. }) => {}
            Some(Route::Early(reports)) if reports.len() < EARLY_REPORTS => reports.push(params),
            Some(Route::Early(_)) => {}
            None if early => {
                self.calls
                    .insert(params.progress_token.clone(), Route::Early(vec![params]));
            }
            None => {}
        }
    }

    /// The call with `token` reports to `target` from now on (early reports first).
    pub(crate) fn route(&mut self, token: ProgressToken, target: ProgressTarget) {
        let early = match self.calls.remove(&token) {
            Some(Route::Early(mut reports)) => {
                reports.sort_by(|a, b| a.progress.total_cmp(&b.progress));
                reports
            }
            _ => Vec::new(),
        };
        self.calls.insert(
            token.clone(),
            Route::Call {
                target,
                reported: None,
            },
        );
        for params in early {
            self.report(params);
        }
    }

    /// The call with `token` ended: what it reports now is dropped.
    pub(crate) fn end(&mut self, token: &ProgressToken) {
        self.calls.remove(token);
    }
}

/// A question a call is to suspend on: the suspension's request, and where the call says it
/// has given itself up on the server (only then is the question answered `cancel`, so the
/// server hears of the cancelled call first and does not go on with the tool).
pub(crate) struct Question {
    pub(crate) request: ElicitationRequest,
    pub(crate) given_up: tokio::sync::oneshot::Sender<()>,
}

/// A call in flight when nobody can answer during calls: the answers its resumed run gave
/// (answered in order to what the server asks), and where a new question goes.
struct Asking {
    key: u64,
    /// The call's request, once sent: an HTTP server's question names the request it belongs
    /// to (the response stream it came on); a stdio server's does not.
    request: Option<RequestId>,
    answers: VecDeque<Answer>,
    ask: Option<tokio::sync::oneshot::Sender<Question>>,
}

/// The calls in flight that suspend on questions.
#[derive(Default)]
pub(crate) struct Askings {
    next: u64,
    calls: Vec<Asking>,
}

/// What becomes of a server's question when nobody answers live.
enum Step {
    /// Answered from the resumed run's answers.
    Answer(Answer),
    /// The call suspends on it.
    Ask(tokio::sync::oneshot::Sender<Question>),
    /// No call to suspend (none in flight, or it already asked): declined.
    Nobody,
}

impl Askings {
    /// Registers a call with the answers its run gave so far; returns its key.
    pub(crate) fn start(
        &mut self,
        answers: Vec<Answer>,
    ) -> (u64, tokio::sync::oneshot::Receiver<Question>) {
        let (ask, asked) = tokio::sync::oneshot::channel();
        self.next += 1;
        self.calls.push(Asking {
            key: self.next,
            request: None,
            answers: answers.into(),
            ask: Some(ask),
        });
        (self.next, asked)
    }

    pub(crate) fn sent(&mut self, key: u64, request: RequestId) {
        if let Some(call) = self.calls.iter_mut().find(|call| call.key == key) {
            call.request = Some(request);
        }
    }

    pub(crate) fn end(&mut self, key: u64) {
        self.calls.retain(|call| call.key != key);
    }

    /// The call a question belongs to: the one whose request it names; without that (stdio,
    /// or asked before the call learnt its id) the oldest call with answers left, else the
    /// oldest that has not asked yet. Concurrent calls of one stdio server that both ask
    /// can thus be mixed up; one call at a time cannot.
    fn step(&mut self, origin: Option<&RequestId>) -> Step {
        let named = origin.and_then(|id| {
            self.calls
                .iter()
                .position(|call| call.request.as_ref() == Some(id))
        });
        let index = named
            .or_else(|| self.calls.iter().position(|call| !call.answers.is_empty()))
            .or_else(|| self.calls.iter().position(|call| call.ask.is_some()));
        let Some(call) = index.and_then(|index| self.calls.get_mut(index)) else {
            return Step::Nobody;
        };
        if let Some(answer) = call.answers.pop_front() {
            return Step::Answer(answer);
        }
        call.ask.take().map_or(Step::Nobody, Step::Ask)
    }
}

/// Our side of a connection, shared by the connection that replaces it when it breaks.
#[derive(Clone)]
pub(crate) struct Handler {
    server: Arc<str>,
    /// `tools/list_changed` notifications so far.
    pub(crate) changes: Arc<AtomicU64>,
    /// Running calls by their progress token.
    pub(crate) progress: Arc<Mutex<ProgressRoutes>>,
    elicitor: Option<Arc<dyn Elicitor>>,
    /// Without an elicitor: the calls in flight, which suspend on questions.
    pub(crate) asking: Arc<Mutex<Askings>>,
}

impl Handler {
    pub(crate) fn new(server: &str, elicitor: Option<Arc<dyn Elicitor>>) -> Self {
        Self {
            server: server.into(),
            changes: Arc::new(AtomicU64::new(0)),
            progress: Arc::default(),
            elicitor,
            asking: Arc::default(),
        }
    }

    /// Whether questions suspend calls (nobody answers them live).
    pub(crate) fn suspends(&self) -> bool {
        self.elicitor.is_none()
    }
}

/// An answer as the result the server gets.
fn result_of(answer: ElicitationAnswer) -> ElicitResult {
    match answer {
        ElicitationAnswer::Accept(content) => {
            let result = ElicitResult::new(ElicitationAction::Accept);
            match content {
                Some(content) => result.with_content(content),
                None => result,
            }
        }
        ElicitationAnswer::Decline => ElicitResult::new(ElicitationAction::Decline),
        ElicitationAnswer::Cancel => ElicitResult::new(ElicitationAction::Cancel),
    }
}

impl rmcp::ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        // Elicitation is always offered: answered live by the elicitor, or else by suspending
        // the call until the run is resumed. Sampling and roots never are (a server then
        // keeps to the directories its own arguments name).
        let capabilities = serde_json::json!({"elicitation": {"form": {}, "url": {}}});
        serde_json::from_value(serde_json::json!({
            "protocolVersion": rmcp::model::ProtocolVersion::default(),
            "capabilities": capabilities,
            "clientInfo": {"name": "deepagents-rs", "version": env!("CARGO_PKG_VERSION")},
        }))
        .unwrap_or_default()
    }

    fn on_tool_list_changed(
        &self,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        self.changes.fetch_add(1, Ordering::Release);
        std::future::ready(())
    }

    fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + MaybeSendFuture + '_ {
        if let Ok(mut routes) = self.progress.lock() {
            routes.report(params);
        }
        std::future::ready(())
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let question = match request {
            ElicitRequestParams::FormElicitationParams {
                message,
                requested_schema,
                ..
            } => ElicitationRequest {
                server: self.server.to_string(),
                message,
                kind: Elicitation::Form {
                    schema: serde_json::to_value(&requested_schema).unwrap_or(Value::Null),
                },
            },
            ElicitRequestParams::UrlElicitationParams { message, url, .. } => ElicitationRequest {
                server: self.server.to_string(),
                message,
                kind: Elicitation::Url { url },
            },
            _ => return Ok(ElicitResult::new(ElicitationAction::Decline)),
        };
        if let Some(elicitor) = &self.elicitor {
            return Ok(result_of(elicitor.elicit(question).await));
        }
        let origin = match context.extensions.get::<InboundStreamOrigin>() {
            Some(InboundStreamOrigin::OutboundRequest(id)) => Some(id.clone()),
            _ => None,
        };
        let step = match self.asking.lock() {
            Ok(mut asking) => asking.step(origin.as_ref()),
            Err(_) => Step::Nobody,
        };
        Ok(match step {
            Step::Answer(answer) => result_of(ElicitationAnswer::from_answer(&answer)),
            Step::Ask(ask) => {
                let (given_up, done) = tokio::sync::oneshot::channel();
                if ask
                    .send(Question {
                        request: question,
                        given_up,
                    })
                    .is_ok()
                {
                    // The call tells the server it is cancelled, then says so (or ends).
                    let _ = done.await;
                }
                // Not answered now: the user has not chosen (MCP's `cancel`); the answer
                // comes with the same call, sent again when the run resumes.
                ElicitResult::new(ElicitationAction::Cancel)
            }
            Step::Nobody => ElicitResult::new(ElicitationAction::Decline),
        })
    }
}

/// A stdio server's process group (the server leads it): killed, with whatever the server
/// started, when dropped — when the session ends or is stopped, when a restart replaces the
/// server, or when its start is abandoned (a timeout, a signal dropping the start-up).
pub(crate) struct ProcessGroup(rustix::process::Pid);

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // Already gone is fine.
        let _ = rustix::process::kill_process_group(self.0, rustix::process::Signal::KILL);
    }
}

/// An open connection: the service, the tools it listed, and the process group of a stdio
/// server.
pub(crate) struct Opened {
    service: Service,
    tools: Vec<Value>,
    group: Option<ProcessGroup>,
}

/// Connects to the server and lists its tools (filtered as configured).
pub(crate) async fn open(
    config: &ServerConfig,
    root: &Path,
    log_dir: Option<&Path>,
    handler: Handler,
) -> Result<Opened, String> {
    let mut group = None;
    let service = match &config.transport {
        Transport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut process = tokio::process::Command::new(command);
            process.args(args).envs(env).current_dir(match cwd {
                Some(cwd) if cwd.is_relative() => root.join(cwd),
                Some(cwd) => cwd.clone(),
                None => root.to_owned(),
            });
            let log = log_dir.map(|dir| dir.join(format!("{}.log", config.name)));
            let stderr = match &log {
                Some(path) => std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map(Stdio::from)
                    .map_err(|e| format!("cannot open its log {}: {e}", path.display()))?,
                None => Stdio::null(),
            };
            let mut process = process_wrap::tokio::CommandWrap::from(process);
            process.wrap(process_wrap::tokio::ProcessGroup::leader());
            let (transport, _) = TokioChildProcess::builder(process)
                .stderr(stderr)
                .spawn()
                .map_err(|e| format!("cannot start {command}: {e}"))?;
            group = transport
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .and_then(rustix::process::Pid::from_raw)
                .map(ProcessGroup);
            handler
                .serve(transport)
                .await
                .map_err(|e| format!("the MCP handshake failed: {e}"))?
        }
        Transport::Http {
            url,
            headers,
            bearer_token,
        } => {
            let mut http = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                .custom_headers(
                    header_map(headers)?
                        .iter()
                        .map(|(name, value)| (name.clone(), value.clone()))
                        .collect(),
                )
                .max_json_response_size(MAX_HTTP_RESPONSE)
                .max_sse_event_size(MAX_HTTP_RESPONSE);
            if let Some(token) = bearer_token {
                http = http.auth_header(token.clone());
            }
            let transport = StreamableHttpClientTransport::with_client(http_client(config)?, http);
            handler.serve(transport).await.map_err(|e| {
                format!(
                    "the MCP handshake with {url} failed: {}",
                    handshake_error(&e)
                )
            })?
        }
        Transport::Sse {
            url,
            headers,
            bearer_token,
        } => {
            let mut headers = header_map(headers)?;
            if let Some(token) = bearer_token {
                let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                    .map_err(|_| "the bearer token is not valid in an HTTP header".to_owned())?;
                value.set_sensitive(true);
                headers.insert(reqwest::header::AUTHORIZATION, value);
            }
            let transport = LegacySse::connect(http_client(config)?, url, headers).await?;
            handler.serve(transport).await.map_err(|e| {
                format!(
                    "the MCP handshake with {url} failed: {}",
                    handshake_error(&e)
                )
            })?
        }
    };
    let tools = list_tools(&service, config).await?;
    Ok(Opened {
        service,
        tools,
        group,
    })
}

/// What went wrong, for people and the model: from the transport's own error on (rmcp's
/// wrapper names the transport's Rust type), with its causes (`connection refused`).
pub(crate) fn plain_error(error: &(dyn std::error::Error + 'static)) -> String {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(error);
    let mut start = error;
    while let Some(e) = current {
        if let Some(transport) = e.downcast_ref::<rmcp::transport::DynamicTransportError>() {
            start = transport.error.as_ref();
            // The HTTP client's error does not name its causes as its source.
            if let Some(
                rmcp::transport::streamable_http_client::StreamableHttpError::Client(client),
            ) = start.downcast_ref::<rmcp::transport::streamable_http_client::StreamableHttpError<
                reqwest::Error,
            >>() {
                start = client;
            }
            break;
        }
        current = e.source();
    }
    let mut parts: Vec<String> = Vec::new();
    let mut current = Some(start);
    while let Some(e) = current {
        let text = e.to_string();
        if !parts.iter().any(|part| part.contains(&text)) {
            parts.push(text);
        }
        current = e.source();
    }
    parts.join(": ")
}

/// Why a handshake failed, without the transport's Rust type.
fn handshake_error(error: &rmcp::service::ClientInitializeError) -> String {
    match error {
        rmcp::service::ClientInitializeError::TransportError { error, context } => {
            let during = match context.strip_prefix("send ") {
                Some(what) => format!("while sending the {what}"),
                None => context.to_string(),
            };
            format!("{} ({during})", plain_error(error))
        }
        other => plain_error(other),
    }
}

fn http_client(config: &ServerConfig) -> Result<reqwest::Client, String> {
    deepagents_models::http_client()
        .connect_timeout(config.startup_timeout)
        .user_agent(concat!("deepagents-rs/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

/// The configured headers, checked, their values kept out of logs.
fn header_map(headers: &BTreeMap<String, String>) -> Result<reqwest::header::HeaderMap, String> {
    let mut map = reqwest::header::HeaderMap::new();
    for (name, value) in headers {
        let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("the header name {name:?} is not valid HTTP"))?;
        let mut value = reqwest::header::HeaderValue::from_str(value)
            .map_err(|_| format!("the value of header {name} is not valid HTTP"))?;
        value.set_sensitive(true);
        map.insert(name, value);
    }
    Ok(map)
}

/// The server's tools now, filtered as configured.
pub(crate) async fn list_tools(
    service: &Service,
    config: &ServerConfig,
) -> Result<Vec<Value>, String> {
    let listed = service
        .peer()
        .list_all_tools()
        .await
        .map_err(|e| format!("listing its tools failed: {e}"))?;
    Ok(listed
        .iter()
        .filter_map(|tool| serde_json::to_value(tool).ok())
        .filter(|tool| {
            let name = tool["name"].as_str().unwrap_or_default();
            config
                .tools
                .as_ref()
                .is_none_or(|only| only.iter().any(|t| t == name))
                && !config.disabled_tools.iter().any(|t| t == name)
        })
        .collect())
}

/// Reconnection attempts an HTTP server gets each time its connection breaks, before it is
/// given up on for the session. A success ends the count: the next break starts afresh.
pub(crate) const RECONNECT_ATTEMPTS: u32 = 5;
/// The pause before the second attempt; it doubles for each later one, up to
/// [`BACKOFF_CAP`], and each pause is shortened by a random part of up to half (jitter, so
/// clients that lost the same server do not come back in step).
const BACKOFF_BASE: Duration = Duration::from_millis(250);
const BACKOFF_CAP: Duration = Duration::from_secs(8);

/// The pause after `failed` failed attempts (at least 1).
fn backoff(failed: u32) -> Duration {
    use std::hash::{BuildHasher as _, Hasher as _};
    let full = BACKOFF_BASE
        .saturating_mul(1 << failed.saturating_sub(1).min(16))
        .min(BACKOFF_CAP);
    // Each `RandomState` is keyed afresh: random enough for jitter, without a dependency.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(failed);
    let fraction = (hasher.finish() % 1000) as f64 / 1000.0;
    full.mul_f64(1.0 - fraction / 2.0)
}

/// A server's connection, replaced when it breaks: an HTTP server's is re-established (a new
/// session) within [`RECONNECT_ATTEMPTS`]; a stdio server that dies is started again once.
pub(crate) struct Live {
    pub(crate) config: ServerConfig,
    root: std::path::PathBuf,
    log_dir: Option<std::path::PathBuf>,
    pub(crate) handler: Handler,
    pub(crate) state: tokio::sync::Mutex<LiveState>,
    /// The stdio server's processes, killed when replaced, stopped or dropped. Outside
    /// `state`, so stopping never waits for a call or a restart holding that lock.
    group: Mutex<Option<ProcessGroup>>,
    /// Set by [`Live::stop`]: the server is not restarted after it.
    stopped: AtomicBool,
}

pub(crate) struct LiveState {
    /// `None` once it stopped for good.
    pub(crate) service: Option<Arc<Service>>,
    /// A stdio server was started again (it gets one restart).
    restarted: bool,
    /// Why the server was given up on, for the calls after that.
    given_up: Option<String>,
    /// Its tools as last listed, and the count of changes they reflect.
    pub(crate) tools: Vec<Value>,
    pub(crate) seen: u64,
}

impl Live {
    /// Connects to the server: the connection and the tools it listed.
    pub(crate) async fn start(
        config: &ServerConfig,
        root: &Path,
        log_dir: Option<&Path>,
        elicitor: Option<Arc<dyn Elicitor>>,
    ) -> Result<(Arc<Self>, Vec<Value>), String> {
        let handler = Handler::new(&config.name, elicitor);
        let Opened {
            service,
            tools,
            group,
        } = open(config, root, log_dir, handler.clone()).await?;
        let live = Arc::new(Self {
            config: config.clone(),
            root: root.to_owned(),
            log_dir: log_dir.map(Path::to_path_buf),
            handler,
            state: tokio::sync::Mutex::new(LiveState {
                service: Some(Arc::new(service)),
                restarted: false,
                given_up: None,
                tools: tools.clone(),
                seen: 0,
            }),
            group: Mutex::new(group),
            stopped: AtomicBool::new(false),
        });
        Ok((live, tools))
    }

    /// Whether the server is reached over HTTP (streamable or legacy SSE), where a broken
    /// connection is re-established rather than the server restarted.
    pub(crate) fn is_http(&self) -> bool {
        !matches!(self.config.transport, Transport::Stdio { .. })
    }

    /// Kills the stdio server's process group (whatever it started goes with it); the server
    /// is not restarted afterwards, so its calls fail from now on.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Release);
        self.set_group(None);
        // Calls from now on fail at once; one holding the lock finds `stopped` when it fails.
        if let Ok(mut state) = self.state.try_lock() {
            state.service = None;
        }
    }

    /// Replaces the process group: the old one is killed.
    fn set_group(&self, group: Option<ProcessGroup>) {
        let old = match self.group.lock() {
            Ok(mut slot) => std::mem::replace(&mut *slot, group),
            Err(poisoned) => std::mem::replace(&mut *poisoned.into_inner(), group),
        };
        drop(old);
    }

    /// The connection to send on, or what the model is told when there is none.
    pub(crate) async fn current(&self) -> Result<Arc<Service>, String> {
        let state = self.state.lock().await;
        match (&state.service, &state.given_up) {
            (Some(service), _) => Ok(Arc::clone(service)),
            (None, Some(why)) => Err(why.clone()),
            (None, None) => Err(self.unavailable("has stopped")),
        }
    }

    fn unavailable(&self, what: &str) -> String {
        let name = &self.config.name;
        format!(
            "the MCP server {name} {what}; its tools are unavailable for the rest of the session (check the server with `deepagents mcp tools {name}`)"
        )
    }

    /// After `broken` stopped answering (`why`): connects again — an HTTP server within its
    /// reconnection budget, a stdio server started once per session. The connection to use
    /// now, or what the model is told when there is none.
    pub(crate) async fn recover(
        &self,
        broken: &Arc<Service>,
        why: &str,
    ) -> Result<Arc<Service>, String> {
        let mut state = self.state.lock().await;
        match &state.service {
            // Another call already dealt with it.
            Some(current) if !Arc::ptr_eq(current, broken) => return Ok(Arc::clone(current)),
            None => {
                return Err(state
                    .given_up
                    .clone()
                    .unwrap_or_else(|| self.unavailable("has stopped")));
            }
            Some(_) => {}
        }
        if self.stopped.load(Ordering::Acquire) {
            state.service = None;
            return Err(self.unavailable("was stopped"));
        }
        if self.is_http() {
            return self.reconnect(&mut state, why).await;
        }
        if state.restarted {
            state.service = None;
            self.set_group(None);
            let message = self.unavailable(&format!("stopped again ({why})"));
            tracing::warn!(server = %self.config.name, "{message}");
            state.given_up = Some(message.clone());
            return Err(message);
        }
        state.restarted = true;
        // What is left of the old server goes before the new one starts.
        self.set_group(None);
        let failed = match self.open_again(&mut state).await {
            Ok(service) => return Ok(service),
            Err(failed) => failed,
        };
        state.service = None;
        self.set_group(None);
        let message = self.unavailable(&format!("stopped and could not be restarted ({failed})"));
        tracing::warn!(server = %self.config.name, "{message}");
        state.given_up = Some(message.clone());
        Err(message)
    }

    /// Opens a new connection in place of the old one, within the server's startup_timeout.
    async fn open_again(&self, state: &mut LiveState) -> Result<Arc<Service>, String> {
        let started = tokio::time::timeout(
            self.config.startup_timeout,
            open(
                &self.config,
                &self.root,
                self.log_dir.as_deref(),
                self.handler.clone(),
            ),
        )
        .await;
        match started {
            Ok(Ok(opened)) => {
                let service = Arc::new(opened.service);
                state.service = Some(Arc::clone(&service));
                self.set_group(opened.group);
                state.tools = opened.tools;
                // Stopped while it restarted: the new server goes too.
                if self.stopped.load(Ordering::Acquire) {
                    self.set_group(None);
                    state.service = None;
                    return Err("it was stopped".to_owned());
                }
                Ok(service)
            }
            Ok(Err(why)) => Err(why),
            Err(_) => Err(format!(
                "no answer within its startup_timeout of {} s",
                self.config.startup_timeout.as_secs_f64()
            )),
        }
    }

    /// An HTTP server's connection broke: a new session, tried up to [`RECONNECT_ATTEMPTS`]
    /// times with growing pauses; the server is given up on when none succeeds. Calls wait
    /// for the outcome (they need `state`), so none is sent on the broken connection.
    async fn reconnect(&self, state: &mut LiveState, why: &str) -> Result<Arc<Service>, String> {
        let name = &self.config.name;
        tracing::info!(server = %name, "the connection broke ({why}); reconnecting");
        let mut last = why.to_owned();
        for attempt in 1..=RECONNECT_ATTEMPTS {
            if attempt > 1 {
                tokio::time::sleep(backoff(attempt - 1)).await;
            }
            if self.stopped.load(Ordering::Acquire) {
                state.service = None;
                return Err(self.unavailable("was stopped"));
            }
            match self.open_again(state).await {
                Ok(service) => {
                    tracing::info!(server = %name, attempt, "reconnected");
                    return Ok(service);
                }
                Err(failed) => {
                    tracing::warn!(server = %name, attempt, "reconnecting failed: {failed}");
                    last = failed;
                }
            }
        }
        state.service = None;
        let message = self.unavailable(&format!(
            "could not be reached again after {RECONNECT_ATTEMPTS} attempts (last error: {last})"
        ));
        tracing::error!(server = %name, "{message}");
        state.given_up = Some(message.clone());
        Err(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(token: u32, progress: f64) -> ProgressNotificationParam {
        serde_json::from_value(serde_json::json!({"progressToken": token, "progress": progress}))
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn reconnection_pauses_grow_to_a_cap_with_jitter() {
        for failed in 1..=12 {
            let full = BACKOFF_BASE
                .saturating_mul(1 << (failed - 1).min(16))
                .min(BACKOFF_CAP);
            let pause = backoff(failed);
            assert!(pause <= full && pause >= full / 2, "{failed}: {pause:?}");
        }
        assert!(backoff(20) <= BACKOFF_CAP);
        // The pauses before giving up stay short enough for a call to wait through.
        let total: Duration = (1..RECONNECT_ATTEMPTS).map(backoff).sum();
        assert!(total < Duration::from_secs(4), "{total:?}");
    }

    #[test]
    fn progress_is_passed_on_in_order_and_early_reports_are_not_lost() {
        let mut routes = ProgressRoutes::default();
        routes.report(report(7, 1.0));
        routes.report(report(7, 2.0));
        routes.report(report(7, 1.5));
        let (events, mut received) = EventSink::channel();
        let token = report(7, 0.0).progress_token;
        routes.route(
            token.clone(),
            ProgressTarget {
                events,
                call_id: "c".into(),
            },
        );
        routes.report(report(7, 3.0));
        // Out of order: older than what was shown, so dropped.
        routes.report(report(7, 2.5));
        routes.report(report(7, 3.5));
        routes.end(&token);
        routes.report(report(7, 4.0));
        let mut seen = Vec::new();
        while let Ok(event) = received.try_recv() {
            if let EventKind::ToolProgress { progress, .. } = event.kind {
                seen.push(progress);
            }
        }
        assert_eq!(seen, [1.0, 1.5, 2.0, 3.0, 3.5]);
    }
}
