//! The `.mcp.json` format (Claude Desktop and Claude Code): `{"mcpServers": {NAME: {…}}}`, a
//! server being `{"command", "args", "env", "cwd"}` (stdio) or `{"type": "http", "url",
//! "headers"}` (streamable HTTP; `bearer_token_env_var` names a variable holding a bearer
//! token), plus our keys `enabled`, `timeout` (seconds per call), `startup_timeout`
//! (seconds), `tools` (names to offer) and `disabled_tools`. Strings may use `${VAR}` and
//! `${VAR:-default}`. `"type": "sse"` is the legacy HTTP+SSE transport (same keys).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

/// A call to a server's tool fails after this long unless the server's `timeout` says.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// A server that has not answered `initialize` and `tools/list` by then is skipped.
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// How to reach a server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// A child process speaking MCP on stdin and stdout.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Variables added to its environment.
        env: BTreeMap<String, String>,
        /// Its working directory (default: the session's root).
        cwd: Option<PathBuf>,
    },
    /// A server on the legacy HTTP+SSE transport (MCP 2024-11-05).
    Sse {
        /// Its event stream's URL.
        url: String,
        /// Headers sent with each request.
        headers: BTreeMap<String, String>,
        /// Sent as `Authorization: Bearer TOKEN` (from `bearer_token_env_var`).
        bearer_token: Option<String>,
    },
    /// A streamable HTTP server.
    Http {
        /// Its URL.
        url: String,
        /// Headers sent with each request.
        headers: BTreeMap<String, String>,
        /// Sent as `Authorization: Bearer TOKEN` (from `bearer_token_env_var`).
        bearer_token: Option<String>,
    },
}

/// One configured server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Its name: the prefix of its tools' names.
    pub name: String,
    /// How to reach it.
    pub transport: Transport,
    /// Whether to use it (default `true`).
    pub enabled: bool,
    /// How long a call may take.
    pub call_timeout: Duration,
    /// How long connecting may take.
    pub startup_timeout: Duration,
    /// Only these tools, when given.
    pub tools: Option<Vec<String>>,
    /// Never these tools.
    pub disabled_tools: Vec<String>,
    /// The file it came from.
    pub origin: PathBuf,
}

/// A configuration file that cannot be used: the file, the server, the key, what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{}: {place}: {message}", file.display())]
pub struct ConfigError {
    /// The file.
    pub file: PathBuf,
    /// Where in it (`mcpServers.NAME.KEY`).
    pub place: String,
    /// What is wrong.
    pub message: String,
}

/// Reads the servers of a `.mcp.json` file, with `lookup` for `${VAR}`.
pub fn parse(
    text: &str,
    file: &Path,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<ServerConfig>, ConfigError> {
    let error = |place: String, message: String| ConfigError {
        file: file.to_owned(),
        place,
        message,
    };
    let value: Value = serde_json::from_str(text)
        .map_err(|e| error(format!("line {}", e.line()), format!("not valid JSON: {e}")))?;
    let Some(servers) = value.get("mcpServers") else {
        return Err(error(
            "mcpServers".to_owned(),
            "missing: the file must hold {\"mcpServers\": {NAME: {…}}}".to_owned(),
        ));
    };
    let servers = servers
        .as_object()
        .ok_or_else(|| error("mcpServers".to_owned(), "expected an object".to_owned()))?;
    let mut configs = Vec::new();
    for (name, server) in servers {
        let place = |key: &str| format!("mcpServers.{name}.{key}");
        let text = |key: &str, value: &Value| -> Result<String, ConfigError> {
            let raw = value
                .as_str()
                .ok_or_else(|| error(place(key), "expected a string".to_owned()))?;
            expand(raw, lookup).map_err(|message| error(place(key), message))
        };
        let map = |key: &str| -> Result<BTreeMap<String, String>, ConfigError> {
            match server.get(key) {
                None | Some(Value::Null) => Ok(BTreeMap::new()),
                Some(Value::Object(entries)) => entries
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), text(&format!("{key}.{k}"), v)?)))
                    .collect(),
                Some(_) => Err(error(
                    place(key),
                    "expected an object of strings".to_owned(),
                )),
            }
        };
        let seconds = |key: &str, default: Duration| -> Result<Duration, ConfigError> {
            match server.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v
                    .as_f64()
                    .filter(|s| *s > 0.0 && s.is_finite())
                    .map(Duration::from_secs_f64)
                    .ok_or_else(|| {
                        error(
                            place(key),
                            "expected a positive number of seconds".to_owned(),
                        )
                    }),
            }
        };
        let names = |key: &str| -> Result<Option<Vec<String>>, ConfigError> {
            match server.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|item| {
                        item.as_str().map(str::to_owned).ok_or_else(|| {
                            error(place(key), "expected a list of tool names".to_owned())
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Some),
                Some(_) => Err(error(
                    place(key),
                    "expected a list of tool names".to_owned(),
                )),
            }
        };
        if !server.is_object() {
            return Err(error(
                format!("mcpServers.{name}"),
                "expected an object".to_owned(),
            ));
        }
        let kind = server.get("type").and_then(Value::as_str);
        let transport = match (kind, server.get("command"), server.get("url")) {
            (None | Some("stdio"), Some(command), _) => Transport::Stdio {
                command: text("command", command)?,
                args: match server.get("args") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(args)) => args
                        .iter()
                        .enumerate()
                        .map(|(i, arg)| text(&format!("args[{i}]"), arg))
                        .collect::<Result<_, _>>()?,
                    Some(_) => {
                        return Err(error(
                            place("args"),
                            "expected a list of strings".to_owned(),
                        ));
                    }
                },
                env: map("env")?,
                cwd: server
                    .get("cwd")
                    .map(|cwd| text("cwd", cwd).map(PathBuf::from))
                    .transpose()?,
            },
            (None | Some("http" | "streamable-http" | "sse"), None, Some(url)) => {
                let url = text("url", url)?;
                let headers = map("headers")?;
                let bearer_token = match server.get("bearer_token_env_var") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(variable)) => Some(lookup(variable).ok_or_else(|| {
                        error(
                            place("bearer_token_env_var"),
                            format!("the variable {variable} is not set"),
                        )
                    })?),
                    Some(_) => {
                        return Err(error(
                            place("bearer_token_env_var"),
                            "expected the name of an environment variable".to_owned(),
                        ));
                    }
                };
                if kind == Some("sse") {
                    Transport::Sse {
                        url,
                        headers,
                        bearer_token,
                    }
                } else {
                    Transport::Http {
                        url,
                        headers,
                        bearer_token,
                    }
                }
            }
            (Some(other), _, _)
                if !["stdio", "http", "sse", "streamable-http"].contains(&other) =>
            {
                return Err(error(
                    place("type"),
                    format!("unknown transport {other:?}; use \"stdio\", \"http\" or \"sse\""),
                ));
            }
            _ => {
                return Err(error(
                    format!("mcpServers.{name}"),
                    "give either \"command\" (a stdio server) or \"url\" (an HTTP server)"
                        .to_owned(),
                ));
            }
        };
        configs.push(ServerConfig {
            name: name.clone(),
            transport,
            enabled: server
                .get("enabled")
                .and_then(Value::as_bool)
                .unwrap_or(true)
                && !server
                    .get("disabled")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
            call_timeout: seconds("timeout", DEFAULT_CALL_TIMEOUT)?,
            startup_timeout: seconds("startup_timeout", DEFAULT_STARTUP_TIMEOUT)?,
            tools: names("tools")?,
            disabled_tools: names("disabled_tools")?.unwrap_or_default(),
            origin: file.to_owned(),
        });
    }
    Ok(configs)
}

/// Reads a `.mcp.json` file, expanding variables from the environment.
pub fn load(file: &Path) -> Result<Vec<ServerConfig>, ConfigError> {
    let text = std::fs::read_to_string(file).map_err(|e| ConfigError {
        file: file.to_owned(),
        place: "file".to_owned(),
        message: format!("cannot read it: {e}"),
    })?;
    parse(&text, file, &|name| std::env::var(name).ok())
}

/// `${VAR}` and `${VAR:-default}` replaced; an unset variable without a default is an error.
fn expand(raw: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("an unclosed ${{ in {raw:?}"))?;
        let inner = &after[..end];
        let (name, default) = match inner.split_once(":-") {
            Some((name, default)) => (name, Some(default)),
            None => (inner, None),
        };
        match (
            lookup(name).filter(|v| !v.is_empty() || default.is_none()),
            default,
        ) {
            (Some(value), _) => out.push_str(&value),
            (None, Some(default)) => out.push_str(default),
            (None, None) => {
                return Err(format!(
                    "the variable {name} is not set (set it, or write ${{{name}:-default}})"
                ));
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Later servers replace earlier ones of the same name, keeping the first one's position.
pub fn merge(layers: impl IntoIterator<Item = Vec<ServerConfig>>) -> Vec<ServerConfig> {
    let mut merged: Vec<ServerConfig> = Vec::new();
    for server in layers.into_iter().flatten() {
        match merged.iter_mut().find(|s| s.name == server.name) {
            Some(existing) => *existing = server,
            None => merged.push(server),
        }
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_parse_expand_and_name_their_errors() {
        let lookup = |name: &str| (name == "TOKEN").then(|| "s3".to_owned());
        let servers = parse(
            r#"{"mcpServers": {
                "files": {"command": "npx", "args": ["-y", "server", "${HOME_DIR:-/srv}"], "env": {"KEY": "${TOKEN}"}, "timeout": 5},
                "web": {"type": "http", "url": "https://x/${TOKEN}", "headers": {"Authorization": "Bearer ${TOKEN}"}, "enabled": false},
                "api": {"type": "http", "url": "https://y/mcp", "bearer_token_env_var": "TOKEN"}
            }}"#,
            Path::new("a.json"),
            &lookup,
        )
        .unwrap_or_default();
        assert_eq!(servers.len(), 3);
        let files = servers.iter().find(|s| s.name == "files");
        assert_eq!(
            files.map(|s| s.transport.clone()),
            Some(Transport::Stdio {
                command: "npx".into(),
                args: vec!["-y".into(), "server".into(), "/srv".into()],
                env: [("KEY".to_owned(), "s3".to_owned())].into(),
                cwd: None
            })
        );
        assert_eq!(files.map(|s| s.call_timeout), Some(Duration::from_secs(5)));
        assert!(servers.iter().any(|s| s.name == "web" && !s.enabled));
        assert!(servers.iter().any(|s| s.transport
            == Transport::Http {
                url: "https://y/mcp".into(),
                headers: BTreeMap::new(),
                bearer_token: Some("s3".into())
            }));
        for (text, expected) in [
            (
                r#"{"mcpServers": {"a": {"command": "${NOPE}"}}}"#,
                "a.json: mcpServers.a.command: the variable NOPE is not set",
            ),
            (
                r#"{"mcpServers": {"a": {"args": []}}}"#,
                "a.json: mcpServers.a: give either",
            ),
            (
                r#"{"mcpServers": {"a": {"command": "x", "timeout": "soon"}}}"#,
                "a.json: mcpServers.a.timeout:",
            ),
            (r#"{"servers": {}}"#, "a.json: mcpServers: missing"),
            (
                r#"{"mcpServers": {"a": {"type": "http", "url": "http://h", "bearer_token_env_var": "NOPE"}}}"#,
                "a.json: mcpServers.a.bearer_token_env_var: the variable NOPE is not set",
            ),
        ] {
            let error = parse(text, Path::new("a.json"), &lookup)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(error.starts_with(expected), "{error}");
        }
    }
}
