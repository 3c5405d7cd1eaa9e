//! Starts the third-party mock servers (llmock, aimock) on free ports for a test, and talks to
//! their admin APIs with a tiny blocking HTTP client (no dependencies, so the CLI tests can
//! include this file too).
//!
//! A missing server skips the test with a visible line on a developer machine and fails it in
//! CI (`CI=true`), where `scripts/test` installs both.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A running mock server, killed on drop.
pub struct MockServer {
    child: Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    log: PathBuf,
    _dir: Option<tempfile::TempDir>,
    _log_dir: tempfile::TempDir,
}

impl Drop for MockServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl MockServer {
    /// `http://127.0.0.1:PORT` followed by `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// What the server printed, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// POSTs JSON to the server's admin API and returns the parsed answer.
    pub fn post(&self, path: &str, body: &Value) -> Value {
        http("POST", self.port, path, Some(body))
    }

    /// GETs JSON from the server's admin API.
    pub fn get(&self, path: &str) -> Value {
        http("GET", self.port, path, None)
    }
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "false" && v != "0")
}

fn missing(what: &str, hint: &str) -> Option<MockServer> {
    assert!(
        !in_ci(),
        "{what} is not installed, and CI must run these tests; {hint}"
    );
    println!("skipped: {what} not installed ({hint})");
    eprintln!("skipped: {what} not installed ({hint})");
    None
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a server on a free port and waits until `ready_path` answers 2xx on it.
///
/// A port found free can be taken by a parallel test before the server binds it; the server
/// then exits (or another process answers the probe with something else), so the start is
/// retried on a new port. A plain TCP connect is not proof of readiness for the same reason.
fn start(
    command_for_port: impl Fn(u16) -> Command,
    what: &str,
    ready_path: &str,
    dir: Option<tempfile::TempDir>,
) -> MockServer {
    let log_dir = tempfile::tempdir().unwrap();
    let log = log_dir.path().join("server.log");
    for _attempt in 0..5 {
        let port = free_port();
        let out = std::fs::File::create(&log).unwrap();
        let mut child = command_for_port(port)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !matches!(child.try_wait(), Ok(Some(_))) {
            if probe(port, ready_path) {
                return MockServer {
                    child,
                    port,
                    log,
                    _dir: dir,
                    _log_dir: log_dir,
                };
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                panic!(
                    "{what} did not answer GET {ready_path} on port {port} within 30 s: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    panic!(
        "{what} did not start on any of 5 free ports: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

/// Whether `GET path` on the port answers with a 2xx status.
fn probe(port: u16, path: &str) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok()
        && (head.starts_with(b"HTTP/1.1 2") || head.starts_with(b"HTTP/1.0 2"))
}

/// llmock (PyPI, 0.2.2) with tool invention off, or `None` (after a visible skip line) when it
/// is not installed. `LLMOCK_BIN` overrides the binary.
pub fn llmock() -> Option<MockServer> {
    let bin = std::env::var_os("LLMOCK_BIN")
        .map(PathBuf::from)
        .or_else(|| on_path("llmock"));
    let Some(bin) = bin else {
        return missing("llmock", "pip install llmock==0.2.2");
    };
    let command = |port: u16| {
        let mut command = Command::new(&bin);
        command.args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--tool-mode",
            "off",
        ]);
        command
    };
    Some(start(command, "llmock", "/_llmock/requests", None))
}

/// Where `scripts/test` installs aimock, relative to the workspace.
fn default_aimock_cli() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/test-deps/aimock/node_modules/@copilotkit/aimock/dist/cli.js")
}

/// aimock (npm, 1.43.0) serving `fixtures` (the JSON of one fixture file), or `None` (after a
/// visible skip line) when it is not installed. `AIMOCK_CLI` points at its `dist/cli.js`.
pub fn aimock(fixtures: &Value) -> Option<MockServer> {
    let cli = std::env::var_os("AIMOCK_CLI")
        .map(PathBuf::from)
        .unwrap_or_else(default_aimock_cli);
    if !cli.is_file() {
        return missing(
            "aimock",
            "npm install @copilotkit/aimock@1.43.0 and set AIMOCK_CLI to its dist/cli.js",
        );
    }
    let Some(node) = on_path("node") else {
        return missing("aimock", "node (>= 20.15) is not on PATH");
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("fixtures.json"), fixtures.to_string()).unwrap();
    let fixtures_dir = dir.path().to_path_buf();
    let command = |port: u16| {
        let mut command = Command::new(&node);
        command
            .arg(&cli)
            .args(["-p", &port.to_string(), "-h", "127.0.0.1", "-f"])
            .arg(&fixtures_dir);
        command
    };
    Some(start(command, "aimock", "/__aimock/journal", Some(dir)))
}

/// One blocking HTTP/1.1 exchange with a JSON answer.
fn http(method: &str, port: u16, path: &str, body: Option<&Value>) -> Value {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    // One write: sent in pieces, a body could arrive after a server that ignores it (reset
    // takes none) has answered and closed, and the kernel then resets the connection.
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = rest;
        while let Some((size, tail)) = rest.split_once("\r\n") {
            let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if size == 0 {
                break;
            }
            out.push_str(&tail[..size]);
            rest = &tail[size + 2..];
        }
        out
    } else {
        rest.to_owned()
    };
    let status_ok = head.starts_with("HTTP/1.1 2") || head.starts_with("HTTP/1.0 2");
    assert!(status_ok, "{method} {path} failed: {head}\n{body}");
    serde_json::from_str(&body).unwrap_or(Value::String(body))
}
