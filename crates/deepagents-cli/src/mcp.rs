//! Which MCP servers a run uses, and `deepagents mcp list|tools`.
//!
//! Files, later ones winning by server name: `~/.deepagents/.mcp.json`, then the project's
//! `.deepagents/.mcp.json` and `.mcp.json` in the root (only with `--trust-project`: they start
//! programs from the project), then each `--mcp-config FILE`. `--no-mcp` uses none.

use std::io::{BufRead, IsTerminal as _, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use deepagents_mcp::elicitation::{form_fields, parse_field};
use deepagents_mcp::{
    ConnectOptions, Connections, Elicitation, ElicitationAnswer, ElicitationRequest, Elicitor,
    ServerConfig, Transport, config,
};

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
/// goes to `mcp-logs/` in the data directory. Servers' questions go to `elicitor` while the
/// call waits (none: a question suspends the call, and the run pauses on it).
pub async fn connect(
    servers: &[ServerConfig],
    root: &Path,
    elicitor: Option<Arc<dyn Elicitor>>,
) -> Connections {
    let connections = start(servers, root, elicitor).await;
    for (name, reason) in &connections.failures {
        eprintln!(
            "warning: MCP server {name} is not available: {reason}; the run goes on without it"
        );
    }
    connections
}

/// [`connect`] without saying anything about the servers that failed.
async fn start(
    servers: &[ServerConfig],
    root: &Path,
    elicitor: Option<Arc<dyn Elicitor>>,
) -> Connections {
    let mut options = ConnectOptions::new(root);
    if let Some(dir) = crate::workspace::data_dir()
        .ok()
        .map(|dir| dir.join("mcp-logs"))
        .filter(|dir| std::fs::create_dir_all(dir).is_ok())
    {
        options = options.log_dir(dir);
    }
    if let Some(elicitor) = elicitor {
        options = options.elicitor(elicitor);
    }
    deepagents_mcp::connect(servers, &options).await
}

/// `deepagents mcp list`: each server, its transport, and whether it answers.
pub async fn list(root: &Path, files: &[PathBuf], trust_project: bool) -> anyhow::Result<ExitCode> {
    let (servers, notes) = servers(root, files, trust_project)?;
    for note in notes {
        eprintln!("{note}");
    }
    let connections = deepagents_mcp::connect(&servers, &ConnectOptions::new(root)).await;
    for server in &servers {
        let transport = match &server.transport {
            Transport::Stdio { command, .. } => format!("stdio {command}"),
            Transport::Http { url, .. } => format!("http {url}"),
            Transport::Sse { url, .. } => format!("sse {url}"),
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
///
/// Like `mcp list`, a server that fails does not hide the others: their tools are printed,
/// each failure is named on stderr with its reason, and the exit status is 0 when at least one
/// server started (or none is enabled). It is 1 when every enabled server failed, when `only`
/// names no configured server, or when a config file is broken.
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
    if let Some(name) = only
        && servers.is_empty()
    {
        anyhow::bail!(
            "no MCP server named {name} is configured; `deepagents mcp list` shows the servers and the files they come from"
        );
    }
    for server in servers.iter().filter(|s| !s.enabled) {
        eprintln!(
            "note: MCP server {} is disabled in its config; its tools are not listed",
            server.name
        );
    }
    let connections = start(&servers, root, None).await;
    // Not `connect`'s warning: there is no run here to go on without the server.
    for (name, reason) in &connections.failures {
        eprintln!("error: MCP server {name} failed: {reason}");
    }
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
    if connections.servers.is_empty() && !connections.failures.is_empty() {
        eprintln!(
            "error: no MCP server started; fix the failures above (`deepagents mcp list` shows every server's state)"
        );
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Who answers servers' questions in a headless run: the person at the terminal, when stdin
/// is one and approvals are not automatic. Otherwise a question suspends the call and the
/// run's pause declines it (nobody can answer), so the server's tool runs again, declined.
pub fn headless_elicitor(auto_approve: bool) -> Option<Arc<dyn Elicitor>> {
    (!auto_approve && std::io::stdin().is_terminal())
        .then(|| Arc::new(TerminalElicitor) as Arc<dyn Elicitor>)
}

/// Servers' questions asked on the terminal while their call waits.
struct TerminalElicitor;

#[async_trait::async_trait]
impl Elicitor for TerminalElicitor {
    async fn elicit(&self, request: ElicitationRequest) -> ElicitationAnswer {
        crate::approvals::ask_on_terminal(move |input, out| ask(&request, input, out))
            .await
            .unwrap_or(ElicitationAnswer::Decline)
    }
}

/// Asks `request` on `out`, reading the answers from `input`: first whether to answer at all
/// (yes, no = decline, cancel), then each field of a form, again until its value fits (an
/// empty line skips an optional field). The end of input declines.
pub fn ask(
    request: &ElicitationRequest,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> std::io::Result<ElicitationAnswer> {
    let mut line = String::new();
    let mut read = |input: &mut dyn BufRead| -> std::io::Result<Option<String>> {
        line.clear();
        if input.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        Ok(Some(line.trim_end_matches(['\r', '\n']).to_owned()))
    };
    writeln!(
        out,
        "\nThe MCP server {} asks: {}",
        request.server, request.message
    )?;
    if let Elicitation::Url { url } = &request.kind {
        writeln!(out, "  Open {url}")?;
    }
    write!(out, "Answer? [y]es, [n]o (decline), [c]ancel the call: ")?;
    out.flush()?;
    let Some(choice) = read(input)? else {
        return Ok(ElicitationAnswer::Decline);
    };
    match choice.trim().to_ascii_lowercase().as_str() {
        "" | "y" | "yes" => {}
        "c" | "cancel" => return Ok(ElicitationAnswer::Cancel),
        _ => return Ok(ElicitationAnswer::Decline),
    }
    let Elicitation::Form { schema } = &request.kind else {
        return Ok(ElicitationAnswer::Accept(None));
    };
    let mut content = serde_json::Map::new();
    for (name, field, required) in form_fields(schema) {
        loop {
            let about = field["description"]
                .as_str()
                .or_else(|| field["title"].as_str())
                .map(|d| format!(" — {d}"))
                .unwrap_or_default();
            let kind = field["type"].as_str().unwrap_or("string");
            let optional = if required { "" } else { ", optional" };
            write!(out, "  {name} ({kind}{optional}){about}: ")?;
            out.flush()?;
            let Some(text) = read(input)? else {
                return Ok(ElicitationAnswer::Decline);
            };
            if text.trim().is_empty() && !required {
                break;
            }
            match parse_field(&field, &text) {
                Ok(value) => {
                    content.insert(name.clone(), value);
                    break;
                }
                Err(why) => writeln!(out, "    {why}")?,
            }
        }
    }
    Ok(ElicitationAnswer::Accept(Some(serde_json::Value::Object(
        content,
    ))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn questions_are_asked_field_by_field_until_the_answers_fit() {
        let request = ElicitationRequest {
            server: "shop".into(),
            message: "Your details".into(),
            kind: Elicitation::Form {
                schema: serde_json::json!({"type": "object", "properties": {
                    "age": {"type": "integer", "description": "How old"},
                    "name": {"type": "string"}, "nick": {"type": "string"}},
                    "required": ["age", "name"]}),
            },
        };
        let mut out = Vec::new();
        let answer = ask(&request, &mut "y\nold\n41\nAda\n\n".as_bytes(), &mut out);
        assert_eq!(
            answer.ok(),
            Some(ElicitationAnswer::Accept(Some(
                serde_json::json!({"age": 41, "name": "Ada"})
            )))
        );
        let shown = String::from_utf8_lossy(&out);
        assert!(
            shown.contains("The MCP server shop asks: Your details"),
            "{shown}"
        );
        assert!(shown.contains("a whole number, please"), "{shown}");
        for (typed, expected) in [
            ("n\n", ElicitationAnswer::Decline),
            ("c\n", ElicitationAnswer::Cancel),
            ("", ElicitationAnswer::Decline),
            ("y\n", ElicitationAnswer::Decline),
        ] {
            let answer = ask(&request, &mut typed.as_bytes(), &mut Vec::new());
            assert_eq!(answer.ok(), Some(expected), "{typed:?}");
        }
    }
}
