//! Tools of MCP servers as tools of a deep agent.
//!
//! [`config`] reads Claude-style `.mcp.json` files. [`connect`] starts every enabled server at
//! once — stdio servers as child processes in the session's root unless they say `cwd`, their
//! stderr to a log file; HTTP servers over streamable HTTP or the legacy HTTP+SSE transport —
//! through the official Rust SDK's client, each within its start-up timeout; a server that fails or is too slow is reported in
//! [`Connections::failures`] and the rest go on without it. [`Connections::tools`] are its
//! tools as [`DynamicTool`]s: named `SERVER__TOOL` (see [`tool_name`]), the server's input
//! schema as given, each call bounded by the server's timeout, its progress reported as
//! `tool_progress` events, cancelled on the server when the run gives it up, and answered with
//! the server's content (text, images and audio as blocks, resources as text or blocks,
//! `structuredContent` as the artifact; `isError` as an error the model sees). A server's
//! questions to the user (elicitation) go to the [`Elicitor`] given in [`ConnectOptions`]
//! while the call waits; without one they suspend the call like any tool's question (the run
//! pauses; the answer resumes it by sending the same call again — see [`elicitation`]).
//! Requests to sample the agent's model are refused.

pub mod config;
mod connection;
pub mod elicitation;
mod legacy_sse;
mod tools;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use deepagents_core::{DynTool, DynamicTool, RunContext, ToolSource, ToolSourceError};
use serde_json::Value;

pub use config::{ConfigError, ServerConfig, Transport};
pub use elicitation::{Elicitation, ElicitationAnswer, ElicitationRequest, Elicitor};
pub use tools::{MAX_TOOL_NAME, tool_name};

use connection::Live;
use tools::agent_tools;

/// How to connect: where stdio servers run, where their stderr goes, who answers their
/// questions.
#[derive(Clone)]
pub struct ConnectOptions {
    /// The working directory of stdio servers without `cwd` (the session's root).
    pub root: PathBuf,
    /// Where stdio servers' stderr is written (`NAME.log`); discarded without one.
    pub log_dir: Option<PathBuf>,
    /// Who answers servers' elicitation requests during the call; without one, a question
    /// suspends the call and pauses the run (see [`elicitation`]).
    pub elicitor: Option<Arc<dyn Elicitor>>,
}

impl ConnectOptions {
    /// Servers run in `root`, their stderr discarded, their questions suspending calls.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            log_dir: None,
            elicitor: None,
        }
    }

    /// Stdio servers' stderr goes to `DIR/NAME.log`.
    pub fn log_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.log_dir = Some(dir.into());
        self
    }

    /// Servers' questions go to `elicitor` while their call waits.
    pub fn elicitor(mut self, elicitor: Arc<dyn Elicitor>) -> Self {
        self.elicitor = Some(elicitor);
        self
    }
}

/// A server that answered, with its tools.
pub struct Server {
    /// Its configuration.
    pub config: ServerConfig,
    /// Its tools as the server described them (`name`, `description`, `inputSchema`,
    /// `annotations`), after the `tools` and `disabled_tools` filters.
    pub tools: Vec<Value>,
    /// Where its stderr goes (stdio servers with a log directory).
    pub log: Option<PathBuf>,
    live: Arc<Live>,
}

/// The servers of a session: those that answered, and why the others did not. Dropping it
/// stops the servers (as [`Connections::stop`]), whatever still holds their tools.
#[derive(Default)]
pub struct Connections {
    /// The servers that answered.
    pub servers: Vec<Server>,
    /// Servers that did not, by name, with the reason.
    pub failures: Vec<(String, String)>,
}

/// Connects to the enabled servers at once. Dropping the future abandons the start: the
/// stdio servers started so far are killed with their process groups.
pub async fn connect(servers: &[ServerConfig], options: &ConnectOptions) -> Connections {
    let attempts = servers
        .iter()
        .filter(|s| s.enabled)
        .map(|config| async move {
            let outcome =
                tokio::time::timeout(config.startup_timeout, start(config, options)).await;
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

async fn start(config: &ServerConfig, options: &ConnectOptions) -> Result<Server, String> {
    let log_dir = options.log_dir.as_deref();
    let (live, tools) =
        Live::start(config, &options.root, log_dir, options.elicitor.clone()).await?;
    Ok(Server {
        config: config.clone(),
        tools,
        log: match config.transport {
            Transport::Stdio { .. } => log_dir.map(|dir| dir.join(format!("{}.log", config.name))),
            Transport::Http { .. } | Transport::Sse { .. } => None,
        },
        live,
    })
}

impl Server {
    /// Its tools as agent tools.
    pub fn agent_tools(&self) -> Vec<Result<DynamicTool, String>> {
        agent_tools(&self.live, &self.tools)
    }
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
            .map(|live| live.handler.changes.load(Ordering::Acquire))
            .sum()
    }

    async fn tools(&self, _run: &RunContext) -> Result<Vec<Arc<dyn DynTool>>, ToolSourceError> {
        let mut all: Vec<Arc<dyn DynTool>> = Vec::new();
        for live in &self.servers {
            let mut state = live.state.lock().await;
            let changes = live.handler.changes.load(Ordering::Acquire);
            if changes != state.seen
                && let Some(service) = state.service.clone()
            {
                // Keep the old list when listing fails: the tools may still answer.
                let listed = tokio::time::timeout(
                    live.config.startup_timeout,
                    connection::list_tools(&service, &live.config),
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
    options: ConnectOptions,
    connected: tokio::sync::OnceCell<Connections>,
}

/// The tools of `servers`, connected on first use: `AgentBuilder::tool_source(Arc::new(
/// deepagents_mcp::lazy(servers, ConnectOptions::new(root))))`.
pub fn lazy(servers: Vec<ServerConfig>, options: ConnectOptions) -> LazyMcpTools {
    LazyMcpTools {
        servers,
        options,
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
                let connections = connect(&self.servers, &self.options).await;
                for (name, why) in &connections.failures {
                    tracing::warn!(server = %name, "MCP server left out: {why}");
                }
                connections
            })
            .await;
        connections.tool_source().tools(run).await
    }
}

impl Drop for Connections {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Connections {
    /// Stops every server now: a stdio server's whole process group is killed (what it
    /// started goes with it), and no server is restarted afterwards, so their tools fail from
    /// now on. For a front end on its way out; dropping does the same.
    pub fn stop(&self) {
        for server in &self.servers {
            server.live.stop();
        }
    }

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
