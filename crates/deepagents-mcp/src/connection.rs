//! One server's connection: starting it (a child process, a streamable HTTP endpoint or a
//! legacy SSE one), our
//! side of the protocol (tool list changes, progress, elicitation; sampling is not offered, so
//! rmcp refuses it), and the
//! one restart a crashed server gets.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use deepagents_core::{EventKind, EventSink};
use rmcp::model::{
    ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction, ProgressNotificationParam,
    ProgressToken,
};
use rmcp::service::{MaybeSendFuture, NotificationContext, RequestContext, RoleClient};
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

/// Our side of a connection, shared by the connection that replaces it after a crash.
#[derive(Clone)]
pub(crate) struct Handler {
    server: Arc<str>,
    /// `tools/list_changed` notifications so far.
    pub(crate) changes: Arc<AtomicU64>,
    /// Running calls by their progress token.
    pub(crate) progress: Arc<Mutex<ProgressRoutes>>,
    elicitor: Option<Arc<dyn Elicitor>>,
}

impl Handler {
    pub(crate) fn new(server: &str, elicitor: Option<Arc<dyn Elicitor>>) -> Self {
        Self {
            server: server.into(),
            changes: Arc::new(AtomicU64::new(0)),
            progress: Arc::default(),
            elicitor,
        }
    }
}

impl rmcp::ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        // Elicitation is offered only when someone can answer; sampling and roots never are
        // (a server then keeps to the directories its own arguments name).
        let capabilities = if self.elicitor.is_some() {
            serde_json::json!({"elicitation": {"form": {}, "url": {}}})
        } else {
            serde_json::json!({})
        };
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
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let Some(elicitor) = &self.elicitor else {
            return Ok(ElicitResult::new(ElicitationAction::Decline));
        };
        let kind = match request {
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
        Ok(match elicitor.elicit(kind).await {
            ElicitationAnswer::Accept(content) => {
                let result = ElicitResult::new(ElicitationAction::Accept);
                match content {
                    Some(content) => result.with_content(content),
                    None => result,
                }
            }
            ElicitationAnswer::Decline => ElicitResult::new(ElicitationAction::Decline),
            ElicitationAnswer::Cancel => ElicitResult::new(ElicitationAction::Cancel),
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
            handler
                .serve(transport)
                .await
                .map_err(|e| format!("the MCP handshake with {url} failed: {e}"))?
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
            handler
                .serve(transport)
                .await
                .map_err(|e| format!("the MCP handshake with {url} failed: {e}"))?
        }
    };
    let tools = list_tools(&service, config).await?;
    Ok(Opened {
        service,
        tools,
        group,
    })
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

/// A server's connection, which a crash replaces once.
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
    restarted: bool,
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
                tools: tools.clone(),
                seen: 0,
            }),
            group: Mutex::new(group),
            stopped: AtomicBool::new(false),
        });
        Ok((live, tools))
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

    pub(crate) async fn current(&self) -> Option<Arc<Service>> {
        self.state.lock().await.service.clone()
    }

    /// After `broken` stopped answering: starts the server again, once per session. Says
    /// what became of it, for the model.
    pub(crate) async fn recover(&self, broken: &Arc<Service>) -> String {
        let name = &self.config.name;
        let mut state = self.state.lock().await;
        match &state.service {
            // Another call already dealt with it.
            Some(current) if !Arc::ptr_eq(current, broken) => {
                return format!(
                    "the MCP server {name} stopped during this call and was restarted; call again if repeating it is safe"
                );
            }
            None => {
                return format!(
                    "the MCP server {name} has stopped; its tools are unavailable for the rest of the session"
                );
            }
            Some(_) => {}
        }
        if self.stopped.load(Ordering::Acquire) {
            state.service = None;
            return format!(
                "the MCP server {name} was stopped; its tools are unavailable for the rest of the session"
            );
        }
        if state.restarted {
            state.service = None;
            self.set_group(None);
            return format!(
                "the MCP server {name} stopped again; its tools are unavailable for the rest of the session"
            );
        }
        state.restarted = true;
        // What is left of the old server goes before the new one starts.
        self.set_group(None);
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
                state.service = Some(Arc::new(opened.service));
                self.set_group(opened.group);
                state.tools = opened.tools;
                // Stopped while it restarted: the new server goes too.
                if self.stopped.load(Ordering::Acquire) {
                    self.set_group(None);
                    state.service = None;
                }
                format!(
                    "the MCP server {name} stopped during this call and was restarted; call again if repeating it is safe"
                )
            }
            Ok(Err(why)) => {
                state.service = None;
                self.set_group(None);
                format!(
                    "the MCP server {name} stopped and could not be restarted ({why}); its tools are unavailable"
                )
            }
            Err(_) => {
                state.service = None;
                self.set_group(None);
                format!(
                    "the MCP server {name} stopped and did not come back within its startup_timeout; its tools are unavailable"
                )
            }
        }
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
