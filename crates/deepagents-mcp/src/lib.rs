//! Tools of MCP servers as tools of a deep agent.
//!
//! [`config`] reads Claude-style `.mcp.json` files. [`connect`] starts every enabled stdio
//! server at once (in the session's root unless it says `cwd`, its stderr to a log file),
//! through the official Rust SDK's client, each within its start-up timeout; a server that
//! fails or is too slow is reported in [`Connections::failures`] and the rest go on without
//! it. [`Connections::tools`] are its tools as [`DynamicTool`]s: named `SERVER__TOOL`
//! (see [`tool_name`]), the server's input schema as given, each call bounded by the
//! server's timeout and answered with the server's content (text, images and audio as
//! blocks, resources as text or blocks, `structuredContent` as the artifact; `isError` as an
//! error the model sees).

pub mod config;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use base64::Engine as _;
use deepagents_core::{
    ContentBlock, DynTool, DynamicTool, RunContext, ToolError, ToolOutput, ToolSource,
    ToolSourceError,
};
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::{ServiceExt as _, transport::TokioChildProcess};
use serde_json::Value;

pub use config::{ConfigError, ServerConfig, Transport};

/// The longest tool name every provider accepts.
pub const MAX_TOOL_NAME: usize = 64;

/// The name a server's tool has for the model: `SERVER__TOOL`, every character but ASCII
/// letters, digits, `_` and `-` replaced by `_`; past 64 characters, cut to 55 and ended
/// with `_` and 8 hex digits of a hash of the full name, so it stays unique and stable.
pub fn tool_name(server: &str, tool: &str) -> String {
    let full = format!("{server}__{tool}");
    let clean: String = full
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.len() <= MAX_TOOL_NAME {
        return clean;
    }
    // FNV-1a: stable across runs and builds, unlike the standard hasher.
    let hash = full.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("{}_{hash:08x}", &clean[..55])
}

/// A server that answered, with its tools.
pub struct Server {
    /// Its configuration.
    pub config: ServerConfig,
    /// Its tools as the server described them (`name`, `description`, `inputSchema`,
    /// `annotations`), after the `tools` and `disabled_tools` filters.
    pub tools: Vec<Value>,
    /// Where its stderr goes.
    pub log: Option<PathBuf>,
    live: Arc<Live>,
}

type Service = RunningService<RoleClient, Watcher>;

/// Our side of a connection: counts the server's `tools/list_changed` notifications.
#[derive(Clone, Default)]
struct Watcher {
    changes: Arc<AtomicU64>,
}

impl rmcp::ClientHandler for Watcher {
    fn on_tool_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + rmcp::service::MaybeSendFuture + '_ {
        self.changes.fetch_add(1, Ordering::Release);
        std::future::ready(())
    }
}

/// A server's connection, which a crash replaces once.
struct Live {
    config: ServerConfig,
    root: PathBuf,
    log_dir: Option<PathBuf>,
    /// `tools/list_changed` notifications so far (kept across a restart).
    changes: Arc<AtomicU64>,
    state: tokio::sync::Mutex<LiveState>,
}

struct LiveState {
    /// `None` once it stopped for good.
    service: Option<Arc<Service>>,
    restarted: bool,
    /// Its tools as last listed, and the count of changes they reflect.
    tools: Vec<Value>,
    seen: u64,
}

impl Live {
    async fn current(&self) -> Option<Arc<Service>> {
        self.state.lock().await.service.clone()
    }

    /// After `broken` stopped answering: starts the server again, once per session. Says
    /// what became of it, for the model.
    async fn recover(&self, broken: &Arc<Service>) -> String {
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
        if state.restarted {
            state.service = None;
            return format!(
                "the MCP server {name} stopped again; its tools are unavailable for the rest of the session"
            );
        }
        state.restarted = true;
        let started = tokio::time::timeout(
            self.config.startup_timeout,
            spawn(
                &self.config,
                &self.root,
                self.log_dir.as_deref(),
                Arc::clone(&self.changes),
            ),
        )
        .await;
        match started {
            Ok(Ok((service, tools))) => {
                state.service = Some(Arc::new(service));
                state.tools = tools;
                format!(
                    "the MCP server {name} stopped during this call and was restarted; call again if repeating it is safe"
                )
            }
            Ok(Err(why)) => {
                state.service = None;
                format!(
                    "the MCP server {name} stopped and could not be restarted ({why}); its tools are unavailable"
                )
            }
            Err(_) => {
                state.service = None;
                format!(
                    "the MCP server {name} stopped and did not come back within its startup_timeout; its tools are unavailable"
                )
            }
        }
    }
}

/// The servers of a session: those that answered, and why the others did not.
#[derive(Default)]
pub struct Connections {
    /// The servers that answered.
    pub servers: Vec<Server>,
    /// Servers that did not, by name, with the reason.
    pub failures: Vec<(String, String)>,
}

/// Starts the enabled servers at once; `root` is the working directory of servers without
/// `cwd`, `log_dir` where their stderr is written (`NAME.log`; discarded without one).
pub async fn connect(servers: &[ServerConfig], root: &Path, log_dir: Option<&Path>) -> Connections {
    let attempts = servers
        .iter()
        .filter(|s| s.enabled)
        .map(|config| async move {
            let outcome =
                tokio::time::timeout(config.startup_timeout, start(config, root, log_dir)).await;
            match outcome {
                Ok(Ok(server)) => Ok(server),
                Ok(Err(reason)) => Err((config.name.clone(), reason)),
                Err(_) => Err((
                    config.name.clone(),
                    format!(
                        "it did not answer within {} s (startup_timeout)",
                        config.startup_timeout.as_secs_f64()
                    ),
                )),
            }
        });
    let mut connections = Connections::default();
    for outcome in futures::future::join_all(attempts).await {
        match outcome {
            Ok(server) => connections.servers.push(server),
            Err(failure) => connections.failures.push(failure),
        }
    }
    connections
}

async fn start(
    config: &ServerConfig,
    root: &Path,
    log_dir: Option<&Path>,
) -> Result<Server, String> {
    let changes = Arc::new(AtomicU64::new(0));
    let (service, tools) = spawn(config, root, log_dir, Arc::clone(&changes)).await?;
    Ok(Server {
        config: config.clone(),
        tools: tools.clone(),
        log: log_dir.map(|dir| dir.join(format!("{}.log", config.name))),
        live: Arc::new(Live {
            config: config.clone(),
            root: root.to_owned(),
            log_dir: log_dir.map(Path::to_path_buf),
            changes,
            state: tokio::sync::Mutex::new(LiveState {
                service: Some(Arc::new(service)),
                restarted: false,
                tools,
                seen: 0,
            }),
        }),
    })
}

/// Starts the server and lists its tools (filtered as configured).
async fn spawn(
    config: &ServerConfig,
    root: &Path,
    log_dir: Option<&Path>,
    changes: Arc<AtomicU64>,
) -> Result<(Service, Vec<Value>), String> {
    let Transport::Stdio {
        command,
        args,
        env,
        cwd,
    } = &config.transport
    else {
        return Err("HTTP servers are not supported by this build yet".to_owned());
    };
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
    let (transport, _) = TokioChildProcess::builder(process)
        .stderr(stderr)
        .spawn()
        .map_err(|e| format!("cannot start {command}: {e}"))?;
    let service = Watcher { changes }
        .serve(transport)
        .await
        .map_err(|e| format!("the MCP handshake failed: {e}"))?;
    let tools = list_tools(&service, config).await?;
    Ok((service, tools))
}

/// The server's tools now, filtered as configured.
async fn list_tools(service: &Service, config: &ServerConfig) -> Result<Vec<Value>, String> {
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

impl Server {
    /// Its tools as agent tools.
    pub fn agent_tools(&self) -> Vec<Result<DynamicTool, String>> {
        agent_tools(&self.live, &self.tools)
    }
}

/// `tools` (as a server describes them) as agent tools calling through `live`.
fn agent_tools(live: &Arc<Live>, tools: &[Value]) -> Vec<Result<DynamicTool, String>> {
    tools
        .iter()
        .map(|tool| {
            let remote = tool["name"].as_str().unwrap_or_default().to_owned();
            let name = tool_name(&live.config.name, &remote);
            let description = tool["description"].as_str().unwrap_or("").to_owned();
            let schema = match tool.get("inputSchema") {
                Some(schema @ Value::Object(_)) => schema.clone(),
                _ => serde_json::json!({"type": "object"}),
            };
            let read_only = tool["annotations"]["readOnlyHint"].as_bool() == Some(true);
            let live = Arc::clone(live);
            let made = DynamicTool::new(name, description, schema, move |args, _ctx| {
                let (live, remote) = (Arc::clone(&live), remote.clone());
                async move { call(&live, &remote, args).await }
            })
            .map_err(|e| e.to_string())?;
            Ok(if read_only { made } else { made.mutating() })
        })
        .collect()
}

/// Every server's tools as a [`ToolSource`]: when a server announces `tools/list_changed`,
/// its tools are listed again before the next model call.
pub struct McpToolSource {
    servers: Vec<Arc<Live>>,
}

#[async_trait::async_trait]
impl ToolSource for McpToolSource {
    fn name(&self) -> &str {
        "mcp"
    }

    fn version(&self) -> u64 {
        self.servers
            .iter()
            .map(|live| live.changes.load(Ordering::Acquire))
            .sum()
    }

    async fn tools(&self, _run: &RunContext) -> Result<Vec<Arc<dyn DynTool>>, ToolSourceError> {
        let mut all: Vec<Arc<dyn DynTool>> = Vec::new();
        for live in &self.servers {
            let mut state = live.state.lock().await;
            let changes = live.changes.load(Ordering::Acquire);
            if changes != state.seen
                && let Some(service) = state.service.clone()
            {
                // Keep the old list when listing fails: the tools may still answer.
                let listed = tokio::time::timeout(
                    live.config.startup_timeout,
                    list_tools(&service, &live.config),
                )
                .await;
                match listed {
                    Ok(Ok(tools)) => state.tools = tools,
                    Ok(Err(why)) => tracing::warn!(server = %live.config.name, "{why}"),
                    Err(_) => {
                        tracing::warn!(server = %live.config.name, "listing its tools timed out")
                    }
                }
                state.seen = changes;
            }
            for tool in agent_tools(live, &state.tools) {
                match tool {
                    Ok(tool) => all.push(Arc::new(tool)),
                    Err(why) => {
                        tracing::warn!(server = %live.config.name, "a tool was left out: {why}")
                    }
                }
            }
        }
        Ok(all)
    }
}

/// A [`ToolSource`] over servers not yet started: they are connected the first time a run
/// asks for tools (so an agent can be built without awaiting them), then behave as
/// [`Connections::tool_source`]. Servers that fail are logged (`tracing`) and left out.
pub struct LazyMcpTools {
    servers: Vec<ServerConfig>,
    root: PathBuf,
    log_dir: Option<PathBuf>,
    connected: tokio::sync::OnceCell<Connections>,
}

/// The tools of `servers` (started in `root`, their stderr in `log_dir`), connected on first
/// use: `AgentBuilder::tool_source(Arc::new(deepagents_mcp::lazy(servers, root, None)))`.
pub fn lazy(
    servers: Vec<ServerConfig>,
    root: impl Into<PathBuf>,
    log_dir: Option<PathBuf>,
) -> LazyMcpTools {
    LazyMcpTools {
        servers,
        root: root.into(),
        log_dir,
        connected: tokio::sync::OnceCell::new(),
    }
}

impl LazyMcpTools {
    /// The connections, once a run asked for tools.
    pub fn connections(&self) -> Option<&Connections> {
        self.connected.get()
    }
}

#[async_trait::async_trait]
impl ToolSource for LazyMcpTools {
    fn name(&self) -> &str {
        "mcp"
    }

    fn version(&self) -> u64 {
        self.connected
            .get()
            .map_or(0, |connections| connections.tool_source().version())
    }

    async fn tools(&self, run: &RunContext) -> Result<Vec<Arc<dyn DynTool>>, ToolSourceError> {
        let connections = self
            .connected
            .get_or_init(|| async {
                let connections = connect(&self.servers, &self.root, self.log_dir.as_deref()).await;
                for (name, why) in &connections.failures {
                    tracing::warn!(server = %name, "MCP server left out: {why}");
                }
                connections
            })
            .await;
        connections.tool_source().tools(run).await
    }
}

impl Connections {
    /// Every server's tools as one tool source that follows their changes.
    pub fn tool_source(&self) -> Arc<McpToolSource> {
        Arc::new(McpToolSource {
            servers: self.servers.iter().map(|s| Arc::clone(&s.live)).collect(),
        })
    }

    /// The agent-side names of the tools their server marks `destructiveHint` (and not
    /// `readOnlyHint`): the ones a front end should ask about before they run.
    pub fn destructive_tools(&self) -> Vec<String> {
        self.servers
            .iter()
            .flat_map(|server| {
                server
                    .tools
                    .iter()
                    .filter(|tool| {
                        tool["annotations"]["destructiveHint"].as_bool() == Some(true)
                            && tool["annotations"]["readOnlyHint"].as_bool() != Some(true)
                    })
                    .map(|tool| {
                        tool_name(
                            &server.config.name,
                            tool["name"].as_str().unwrap_or_default(),
                        )
                    })
            })
            .collect()
    }

    /// Every server's tools as agent tools; a tool whose schema is unusable is left out and
    /// named in the second list.
    pub fn tools(&self) -> (Vec<Arc<DynamicTool>>, Vec<String>) {
        let mut tools = Vec::new();
        let mut broken = Vec::new();
        for server in &self.servers {
            for tool in server.agent_tools() {
                match tool {
                    Ok(tool) => tools.push(Arc::new(tool)),
                    Err(e) => broken.push(format!("{}: {e}", server.config.name)),
                }
            }
        }
        (tools, broken)
    }
}

async fn call(live: &Live, tool: &str, args: Value) -> Result<ToolOutput, ToolError> {
    let server = live.config.name.as_str();
    let timeout = live.config.call_timeout;
    let Some(service) = live.current().await else {
        return Err(ToolError::RespondToModel(format!(
            "the MCP server {server} has stopped; its tools are unavailable for the rest of the session"
        )));
    };
    let arguments = match args {
        Value::Object(map) => map,
        Value::Null => serde_json::Map::new(),
        other => {
            return Err(ToolError::RespondToModel(format!(
                "the arguments must be an object, not {other}"
            )));
        }
    };
    let request = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
    let result = match tokio::time::timeout(timeout, service.peer().call_tool(request)).await {
        Err(_) => {
            return Err(ToolError::RespondToModel(format!(
                "the MCP server {server} did not answer {tool} within {} s; try again later or do without it",
                timeout.as_secs_f64()
            )));
        }
        Ok(Err(e)) => {
            if service.is_closed()
                || matches!(
                    e,
                    rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_)
                )
            {
                return Err(ToolError::RespondToModel(live.recover(&service).await));
            }
            return Err(ToolError::RespondToModel(format!(
                "the MCP server {server} failed on {tool}: {e}"
            )));
        }
        Ok(Ok(result)) => result,
    };
    let result = serde_json::to_value(&result).unwrap_or_default();
    let mut blocks: Vec<ContentBlock> = result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(block)
        .collect();
    let structured = result
        .get("structuredContent")
        .cloned()
        .filter(|v| !v.is_null());
    if blocks.is_empty()
        && let Some(structured) = &structured
    {
        blocks.push(ContentBlock::text(structured.to_string()));
    }
    if result["isError"].as_bool() == Some(true) {
        let text = blocks
            .iter()
            .filter_map(ContentBlock::as_text)
            .collect::<Vec<_>>()
            .join("\n");
        return Err(ToolError::RespondToModel(if text.is_empty() {
            format!("{tool} failed on the MCP server {server}")
        } else {
            text
        }));
    }
    let output = ToolOutput::blocks(blocks);
    Ok(match structured {
        Some(structured) => output.with_artifact(structured),
        None => output,
    })
}

/// One MCP content item as a block the model can use.
fn block(item: &Value) -> Option<ContentBlock> {
    let binary = |data: &Value, mime: &Value| {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.as_str()?)
            .ok()?;
        Some(ContentBlock::data(
            mime.as_str().unwrap_or("application/octet-stream"),
            bytes,
        ))
    };
    match item["type"].as_str()? {
        "text" => Some(ContentBlock::text(item["text"].as_str()?)),
        "image" | "audio" => binary(&item["data"], &item["mimeType"]),
        "resource" => {
            let resource = &item["resource"];
            match resource["text"].as_str() {
                Some(text) => Some(ContentBlock::text(format!(
                    "[resource {}]\n{text}",
                    resource["uri"].as_str().unwrap_or("")
                ))),
                None => binary(&resource["blob"], &resource["mimeType"]),
            }
        }
        "resource_link" => Some(ContentBlock::text(format!(
            "[resource link] {} {}{}",
            item["uri"].as_str().unwrap_or(""),
            item["name"].as_str().unwrap_or(""),
            item["description"]
                .as_str()
                .map(|d| format!(": {d}"))
                .unwrap_or_default()
        ))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::tool_name;

    #[test]
    fn tool_names_are_valid_everywhere_and_stable() {
        assert_eq!(tool_name("files", "read_file"), "files__read_file");
        assert_eq!(tool_name("my server", "get.thing"), "my_server__get_thing");
        let long = tool_name("server", &"x".repeat(100));
        assert_eq!(long.len(), 64);
        assert_eq!(long, tool_name("server", &"x".repeat(100)));
        assert_ne!(long, tool_name("server", &format!("{}y", "x".repeat(99))));
    }
}
