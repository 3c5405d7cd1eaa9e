//! A streamable HTTP server with transient failures: HTTP errors are failed calls and a dropped
//! connection is re-established, so the server stays in use; one that stays down is given up
//! on after the reconnection budget. The server here answers MCP JSON-RPC by hand over plain
//! HTTP/1.1 (one request per connection), so it can fail exactly where a test wants.

use std::collections::VecDeque;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deepagents_core::{DynTool, ToolContext, ToolError, ToolOutput};
use deepagents_mcp::{ConnectOptions, config, connect};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// What the server does with a `tools/call`.
#[derive(Clone, Copy, Debug)]
enum Act {
    /// Answers with this HTTP status (and a plain-text body).
    Status(u16),
    /// Closes the connection without answering.
    Drop,
    /// Starts an event stream and closes it before the answer.
    DropStream,
}

#[derive(Default)]
struct Script {
    /// Acts for the next calls, in order; then calls are answered.
    plan: VecDeque<Act>,
    /// `tools/call` requests received.
    calls: usize,
    /// `initialize` requests received (one per session).
    sessions: usize,
    /// New sessions get no answer.
    hang_initialize: bool,
}

struct Flaky {
    url: String,
    script: Arc<Mutex<Script>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Flaky {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let script = Arc::new(Mutex::new(Script::default()));
        let shared = Arc::clone(&script);
        let accept = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                tokio::spawn(serve(socket, Arc::clone(&shared)));
            }
        });
        Self {
            url,
            script,
            accept,
        }
    }

    fn plan(&self, acts: &[Act]) {
        self.script.lock().unwrap().plan.extend(acts);
    }

    fn calls(&self) -> usize {
        self.script.lock().unwrap().calls
    }

    fn sessions(&self) -> usize {
        self.script.lock().unwrap().sessions
    }

    /// Goes down for good: new connections are refused.
    fn down(&self) {
        self.accept.abort();
    }
}

/// One request on `socket`, answered as the script says.
async fn serve(mut socket: TcpStream, script: Arc<Mutex<Script>>) {
    let mut buffer = Vec::new();
    let mut chunk = [0_u8; 4096];
    let head_end = loop {
        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
    let method = head.split(' ').next().unwrap_or_default().to_owned();
    let length: usize = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    while buffer.len() < head_end + length {
        match socket.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
    if method != "POST" {
        // No stream of its own for the client, and sessions end when the connection goes.
        let status = if method == "DELETE" {
            "200 OK"
        } else {
            "405 Method Not Allowed"
        };
        respond(&mut socket, status, "text/plain", &[], "").await;
        return;
    }
    let message: Value = serde_json::from_slice(&buffer[head_end..head_end + length]).unwrap();
    let Some(id) = message.get("id").cloned() else {
        respond(&mut socket, "202 Accepted", "text/plain", &[], "").await;
        return;
    };
    let mut session = None;
    let result = match message["method"].as_str().unwrap_or_default() {
        "initialize" => {
            let hang = script.lock().unwrap().hang_initialize;
            if hang {
                tokio::time::sleep(Duration::from_secs(60)).await;
                return;
            }
            let mut script = script.lock().unwrap();
            script.sessions += 1;
            session = Some(format!("session-{}", script.sessions));
            json!({
                "protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "flaky", "version": "1"}
            })
        }
        "tools/list" => json!({"tools": [{
            "name": "ping", "description": "Ping.", "inputSchema": {"type": "object"}
        }]}),
        "tools/call" => {
            let act = {
                let mut script = script.lock().unwrap();
                script.calls += 1;
                script.plan.pop_front()
            };
            match act {
                None => json!({"content": [{"type": "text", "text": "pong"}]}),
                Some(Act::Drop) => return,
                Some(Act::DropStream) => {
                    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n";
                    let _ = socket.write_all(head.as_bytes()).await;
                    let _ = socket.write_all(b": started\n\n").await;
                    let _ = socket.flush().await;
                    return;
                }
                Some(Act::Status(status)) => {
                    let line = match status {
                        400 => "400 Bad Request",
                        429 => "429 Too Many Requests",
                        502 => "502 Bad Gateway",
                        _ => "500 Internal Server Error",
                    };
                    let extra: &[(&str, &str)] = if status == 429 {
                        &[("retry-after", "1")]
                    } else {
                        &[]
                    };
                    respond(&mut socket, line, "text/plain", extra, "it broke").await;
                    return;
                }
            }
        }
        "ping" => json!({}),
        _ => {
            let error = json!({"jsonrpc": "2.0", "id": id,
                "error": {"code": -32601, "message": "Method not found"}});
            respond(
                &mut socket,
                "200 OK",
                "application/json",
                &[],
                &error.to_string(),
            )
            .await;
            return;
        }
    };
    let body = json!({"jsonrpc": "2.0", "id": id, "result": result}).to_string();
    let headers: Vec<(&str, &str)> = session
        .as_deref()
        .map(|s| vec![("mcp-session-id", s)])
        .unwrap_or_default();
    respond(&mut socket, "200 OK", "application/json", &headers, &body).await;
}

async fn respond(
    socket: &mut TcpStream,
    status: &str,
    content_type: &str,
    headers: &[(&str, &str)],
    body: &str,
) {
    let mut text = format!(
        "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text.push_str("\r\n");
    text.push_str(body);
    let _ = socket.write_all(text.as_bytes()).await;
    let _ = socket.shutdown().await;
}

fn cx() -> ToolContext {
    ToolContext::detached("c1", Arc::new(deepagents_core::AgentState::default()))
}

fn failed(outcome: Result<ToolOutput, ToolError>) -> String {
    match outcome {
        Err(ToolError::RespondToModel(message)) => message,
        other => panic!("{other:?}"),
    }
}

/// Connects to `server`: the connections (kept for the session) and its `ping` tool.
async fn ping_tool(
    server: &Flaky,
    root: &Path,
) -> (
    deepagents_mcp::Connections,
    Arc<deepagents_core::DynamicTool>,
) {
    let servers = config::parse(
        &json!({"mcpServers": {"flaky": {"type": "http", "url": server.url, "timeout": 10, "startup_timeout": 5}}})
            .to_string(),
        Path::new("test.mcp.json"),
        &|_| None,
    )
    .unwrap();
    let connections = connect(&servers, &ConnectOptions::new(root)).await;
    assert!(
        connections.failures.is_empty(),
        "{:?}",
        connections.failures
    );
    let (tools, _) = connections.tools();
    let ping = tools
        .iter()
        .find(|t| t.spec().name == "flaky__ping")
        .unwrap()
        .clone();
    (connections, ping)
}

#[tokio::test(flavor = "multi_thread")]
async fn transient_http_failures_fail_calls_but_keep_the_server() {
    let server = Flaky::start().await;
    let root = tempfile::tempdir().unwrap();
    let (_connections, ping) = ping_tool(&server, root.path()).await;
    assert_eq!(server.sessions(), 1);

    // Two server errors: failed calls naming the status, on the same session.
    server.plan(&[Act::Status(500), Act::Status(502)]);
    for status in ["HTTP 500", "HTTP 502"] {
        let message = failed(ping.call(json!({}), cx()).await);
        assert!(message.contains(status), "{message}");
        assert!(message.contains("flaky"), "{message}");
        assert!(message.contains("try again"), "{message}");
    }
    assert_eq!(server.sessions(), 1);

    // A dropped connection and a dropped event stream: re-established, not a spent restart.
    server.plan(&[Act::Drop, Act::DropStream]);
    for _ in 0..2 {
        let message = failed(ping.call(json!({}), cx()).await);
        assert!(message.contains("re-established"), "{message}");
        assert!(message.contains("call it again"), "{message}");
    }
    // The next call is sent and answered.
    let answered = ping.call(json!({}), cx()).await.unwrap();
    assert_eq!(super::text_of(&answered), "pong");

    // Refusals are failed calls too, with what to do about them.
    server.plan(&[Act::Status(429), Act::Status(400), Act::Status(500)]);
    let limited = failed(ping.call(json!({}), cx()).await);
    assert!(
        limited.contains("HTTP 429") && limited.contains("retry after 1"),
        "{limited}"
    );
    let rejected = failed(ping.call(json!({}), cx()).await);
    assert!(
        rejected.contains("HTTP 400") && rejected.contains("it broke"),
        "{rejected}"
    );
    let broke = failed(ping.call(json!({}), cx()).await);
    assert!(broke.contains("HTTP 500"), "{broke}");
    let answered = ping.call(json!({}), cx()).await.unwrap();
    assert_eq!(super::text_of(&answered), "pong");
    // Every call reached the server; none was refused unsent.
    assert_eq!(server.calls(), 9);

    // A server that stays down is given up on after the budget, with what to check.
    server.down();
    let started = Instant::now();
    let given_up = failed(ping.call(json!({}), cx()).await);
    assert!(started.elapsed() < Duration::from_secs(20));
    for part in [
        "flaky",
        "could not be reached again after 5 attempts",
        "last error",
        "unavailable for the rest of the session",
        "deepagents mcp tools flaky",
    ] {
        assert!(given_up.contains(part), "{part}: {given_up}");
    }
    // Later calls say so at once.
    let started = Instant::now();
    let later = failed(ping.call(json!({}), cx()).await);
    assert_eq!(later, given_up);
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancelled_run_stops_waiting_for_a_reconnection() {
    let server = Flaky::start().await;
    let root = tempfile::tempdir().unwrap();
    let (_connections, ping) = ping_tool(&server, root.path()).await;
    // The connection drops and new sessions get no answer: the call waits for the
    // reconnection until the run is cancelled.
    server.plan(&[Act::Drop]);
    server.script.lock().unwrap().hang_initialize = true;
    let run = cx();
    let cancel = run.run.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let message = failed(ping.call(json!({}), run).await);
    assert!(
        message.contains("cancelled") && message.contains("to come back"),
        "{message}"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    // The server answers again: the next call is sent, not refused.
    server.script.lock().unwrap().hang_initialize = false;
    let answered = ping.call(json!({}), cx()).await.unwrap();
    assert_eq!(super::text_of(&answered), "pong");
    assert_eq!(server.calls(), 2);
}
