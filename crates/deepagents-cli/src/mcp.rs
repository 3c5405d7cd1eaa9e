//! Which MCP servers a run uses, and `deepagents mcp list|tools`.
//!
//! Files, later ones winning by server name: `~/.deepagents/.mcp.json`, then the project's
//! `.deepagents/.mcp.json` and `.mcp.json` in the root (only with `--trust-project`: they start
//! programs from the project), then each `--mcp-config FILE`. `--no-mcp` uses none.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use deepagents_mcp::{Connections, ServerConfig, Transport, config};

/// The servers configured for a run in `root`, and notes about files skipped.
pub fn servers(
    root: &Path,
    files: &[PathBuf],
    trust_project: bool,
) -> anyhow::Result<(Vec<ServerConfig>, Vec<String>)> {
    let mut layers = Vec::new();
    let mut notes = Vec::new();
    if let Some(home) = std::env::var_os("HOME") {
        let user = Path::new(&home).join(".deepagents/.mcp.json");
        if user.is_file() {
            layers.push(config::load(&user)?);
        }
    }
    for project in [root.join(".deepagents/.mcp.json"), root.join(".mcp.json")] {
        if !project.is_file() {
            continue;
        }
        let servers = config::load(&project)?;
        if trust_project {
            layers.push(servers);
        } else if !servers.is_empty() {
            let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
            notes.push(format!(
                "note: the project's MCP servers in {} were skipped ({}): they start programs from the project; pass --trust-project to use them",
                project.display(),
                names.join(", ")
            ));
        }
    }
    for file in files {
        layers.push(config::load(file)?);
    }
    Ok((config::merge(layers), notes))
}

/// Connects to `servers`, printing on stderr each one that failed and why; their stderr
/// goes to `mcp-logs/` in the data directory.
pub async fn connect(servers: &[ServerConfig], root: &Path) -> Connections {
    let log_dir = crate::workspace::data_dir()
        .ok()
        .map(|dir| dir.join("mcp-logs"))
        .filter(|dir| std::fs::create_dir_all(dir).is_ok());
    let connections = deepagents_mcp::connect(servers, root, log_dir.as_deref()).await;
    for (name, reason) in &connections.failures {
        eprintln!(
            "warning: MCP server {name} is not available: {reason}; the run goes on without it"
        );
    }
    connections
}

/// `deepagents mcp list`: each server, its transport, and whether it answers.
pub async fn list(root: &Path, files: &[PathBuf], trust_project: bool) -> anyhow::Result<ExitCode> {
    let (servers, notes) = servers(root, files, trust_project)?;
    for note in notes {
        eprintln!("{note}");
    }
    let connections = deepagents_mcp::connect(&servers, root, None).await;
    for server in &servers {
        let transport = match &server.transport {
            Transport::Stdio { command, .. } => format!("stdio {command}"),
            Transport::Http { url, .. } => format!("http {url}"),
        };
        let status = if !server.enabled {
            "disabled".to_owned()
        } else if let Some(up) = connections
            .servers
            .iter()
            .find(|s| s.config.name == server.name)
        {
            format!("ok, {} tools", up.tools.len())
        } else {
            connections
                .failures
                .iter()
                .find(|(name, _)| *name == server.name)
                .map_or_else(|| "unknown".to_owned(), |(_, why)| format!("failed: {why}"))
        };
        println!("{}\t{transport}\t{status}", server.name);
    }
    Ok(ExitCode::SUCCESS)
}

/// `deepagents mcp tools [SERVER]`: one line per tool, the name the model sees and its
/// description, or with `json` an array of `{name, server, tool, description, input_schema}`.
pub async fn tools(
    root: &Path,
    files: &[PathBuf],
    trust_project: bool,
    only: Option<&str>,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let (servers, notes) = servers(root, files, trust_project)?;
    for note in notes {
        eprintln!("{note}");
    }
    let servers: Vec<ServerConfig> = servers
        .into_iter()
        .filter(|s| only.is_none_or(|name| s.name == name))
        .collect();
    let connections = connect(&servers, root).await;
    let mut listed = Vec::new();
    for server in &connections.servers {
        for tool in &server.tools {
            let remote = tool["name"].as_str().unwrap_or_default();
            listed.push(serde_json::json!({
                "name": deepagents_mcp::tool_name(&server.config.name, remote),
                "server": server.config.name,
                "tool": remote,
                "description": tool["description"].as_str().unwrap_or(""),
                "input_schema": tool["inputSchema"],
            }));
        }
    }
    if json {
        println!("{}", serde_json::Value::Array(listed));
    } else {
        for tool in &listed {
            let description = tool["description"].as_str().unwrap_or("");
            let first = description.lines().next().unwrap_or("");
            println!("{}\t{first}", tool["name"].as_str().unwrap_or(""));
        }
    }
    Ok(if connections.failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
