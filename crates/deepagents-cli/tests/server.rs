//! `deepagents serve` driven by the official `langgraph-sdk` Python client, and by hand where
//! the client hides the wire (status codes, SSE framing, API keys).

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::Duration;

use serde_json::json;

/// A running `deepagents serve`, killed when dropped.
pub(crate) struct Server {
    child: Child,
    /// Where it listens (`127.0.0.1:PORT`).
    pub(crate) address: String,
    pid: u32,
    /// What it logged so far.
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    /// The server with the scripted model of `script`, its files under `root`.
    pub(crate) fn start(
        data: &Path,
        root: &Path,
        script: serde_json::Value,
        extra: &[&str],
    ) -> Self {
        Self::start_with(data, root, script, extra, &[])
    }

    /// [`start`](Self::start), with `envs` set.
    pub(crate) fn start_with(
        data: &Path,
        root: &Path,
        script: serde_json::Value,
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Self {
        let root = root.display().to_string();
        let mut args = vec![
            "--todos",
            "--backend",
            "shell",
            "--sandbox",
            "off",
            "--shell-allow",
            "sleep",
            "--root",
            &root,
        ];
        args.extend_from_slice(extra);
        Self::spawn(data, script, &args, envs)
    }

    /// The server with the scripted model of `script` and only `args` besides (no backend
    /// chosen), with `envs` set.
    pub(crate) fn spawn(
        data: &Path,
        script: serde_json::Value,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Self {
        let script_path = data.join("script.json");
        std::fs::write(&script_path, script.to_string()).unwrap();
        let mut command = crate::bin();
        command
            .env("DEEPAGENTS_DATA_DIR", data.join("data"))
            .env("HOME", data)
            .args(["serve", "--listen", "127.0.0.1:0", "--model"])
            .arg(format!("scripted:{}", script_path.display()))
            .args(args)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        let pid = child.id();
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        // Warnings may come first; the address is on the `listening on` line.
        let mut line = String::new();
        while !line.contains("listening on") {
            line.clear();
            assert!(
                stderr.read_line(&mut line).unwrap() > 0,
                "the server exited"
            );
        }
        let address = line
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        // Keep reading its log so it never blocks on a full pipe; kept for failure reports.
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        std::thread::spawn({
            let log = std::sync::Arc::clone(&log);
            move || {
                let mut line = String::new();
                while stderr.read_line(&mut line).is_ok_and(|read| read > 0) {
                    log.lock().unwrap().push_str(&line);
                    line.clear();
                }
            }
        });
        Self {
            child,
            address,
            pid,
            log,
        }
    }

    /// What the server logged so far (its stderr), for failure reports.
    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// One HTTP/1.1 request; the status, the headers and the body.
    fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&serde_json::Value>,
    ) -> (u16, String, String) {
        let answer = exchange(&self.address, method, path, headers, body)
            .filter(|answer| answer.whole)
            .unwrap_or_else(|| panic!("{method} {path}: no whole answer"));
        (answer.status(), answer.head.clone(), answer.body())
    }
}

/// What one HTTP/1.1 exchange brought back, as far as it came.
struct Answer {
    head: String,
    /// The body as sent (chunked when the head says so).
    raw: String,
    /// Whether the connection ended cleanly rather than being reset.
    whole: bool,
}

impl Answer {
    fn status(&self) -> u16 {
        self.head
            .split_whitespace()
            .nth(1)
            .and_then(|status| status.parse().ok())
            .unwrap_or(0)
    }

    /// The body, its chunks joined.
    fn body(&self) -> String {
        dechunk(&self.head, &self.raw)
    }

    /// Whether a chunked body's last chunk came (it was not cut).
    fn ended(&self) -> bool {
        self.raw.ends_with("0\r\n\r\n")
    }
}

/// One request on a new connection (`Connection: close`); `None` when the server could not
/// be reached or sent no head. A connection cut or reset keeps what came before.
fn exchange(
    address: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&serde_json::Value>,
) -> Option<Answer> {
    let mut stream = TcpStream::connect(address).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    let body = body.map(ToString::to_string).unwrap_or_default();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        request.push_str("Content-Type: application/json\r\n");
    }
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request.push_str(&body);
    stream.write_all(request.as_bytes()).ok()?;
    let mut response = Vec::new();
    let whole = stream.read_to_end(&mut response).is_ok();
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, raw) = response.split_once("\r\n\r\n")?;
    Some(Answer {
        head: head.to_owned(),
        raw: raw.to_owned(),
        whole,
    })
}

/// `GET path` read to the end: the head, the body (chunks joined) and whether the body
/// ended (its last chunk came) rather than being cut.
fn raw_get(address: &str, path: &str, headers: &[(&str, &str)]) -> (String, String, bool) {
    let answer = exchange(address, "GET", path, headers, None)
        .unwrap_or_else(|| panic!("GET {path}: no answer"));
    (answer.head.clone(), answer.body(), answer.ended())
}

/// The value of header `name` in a response's head.
fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        key.eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

/// The body of a response sent in chunks, joined.
fn dechunk(head: &str, body: &str) -> String {
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return body.to_owned();
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let Some(chunk) = after.get(..size) else {
            out.push_str(after);
            break;
        };
        out.push_str(chunk);
        rest = after.get(size + 2..).unwrap_or_default();
    }
    out
}

fn script() -> serde_json::Value {
    let sleep = json!([
        {"tool_calls": [{"id": "s1", "name": "execute", "args": {"command": "sleep 30"}}]},
        {"text": "Slept."}
    ]);
    json!({
        "turns": [{"text": "Default answer."}],
        "conversations": [
            {"when_task_contains": "plan the notes", "turns": [
                {"text": "Planning.", "tool_calls": [{"id": "t1", "name": "write_todos", "args": {"todos": [{"content": "Write the notes", "status": "in_progress"}]}}]},
                {"text": "Noted."}
            ]},
            {"when_task_contains": "write the file", "turns": [
                {"tool_calls": [{"id": "w1", "name": "write_file", "args": {"file_path": "/sdk.md", "content": "from the sdk\n"}}]},
                {"text": "Written."}
            ]},
            {"when_task_contains": "sleep", "turns": sleep},
            {"when_task_contains": "join me", "turns": [{"text": "Joined."}]}
        ]
    })
}

/// Runs the SDK check against `server`, its files under `root`.
fn sdk_check(python: &str, server: &Server, root: &Path) {
    let check = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/langgraph_sdk_check.py");
    let output = std::process::Command::new(python)
        .arg(check)
        .arg(format!("http://{}", server.address))
        .arg(root)
        .output()
        .unwrap();
    assert!(
        output.status.success()
            && String::from_utf8_lossy(&output.stdout).contains("sdk check passed"),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn the_official_sdk_drives_threads_runs_interrupts_cancellation_and_the_store() {
    let Some(python) = deepagents_test_support::langgraph_python() else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let server = Server::start(
        data.path(),
        root.path(),
        script(),
        &[
            "--interrupt-on",
            "write_file",
            "--api-key",
            "key-a=alpha",
            "--api-key",
            "key-b=beta",
        ],
    );
    sdk_check(&python, &server, root.path());
}

/// `ask_user` suspends its call: the SDK sees the question as the interrupt's value, the
/// server is restarted on the same data, and `Command(resume="blue")` from the SDK answers it
/// there: the answer is the call's result, as typed, and the model's next turn follows it.
#[test]
fn the_official_sdk_answers_ask_user_with_command_resume_after_a_restart() {
    let Some(python) = deepagents_test_support::langgraph_python() else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "ask1", "name": "ask_user", "args": {"question": "Which colour for the door?", "options": ["red", "blue"]}}]},
        {"text": "Painted it blue."}
    ]});
    let check =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/langgraph_sdk_ask_user.py");
    let step = |server: &Server, args: &[&str]| {
        let output = std::process::Command::new(&python)
            .arg(&check)
            .arg(format!("http://{}", server.address))
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        assert!(
            output.status.success(),
            "stdout:\n{stdout}\nstderr:\n{}\nserver:\n{}",
            String::from_utf8_lossy(&output.stderr),
            server.log()
        );
        stdout
    };
    let first = Server::start(data.path(), root.path(), script.clone(), &[]);
    let asked = step(&first, &["ask"]);
    let ids: Vec<&str> = asked.split_whitespace().collect();
    let [thread, interrupt] = ids.as_slice() else {
        panic!("no thread and interrupt id in {asked:?}");
    };
    drop(first);
    let second = Server::start(data.path(), root.path(), script, &[]);
    let answered = step(&second, &["answer", thread, interrupt]);
    assert!(answered.contains("ask_user answered"), "{answered}");
}

/// An MCP server's question (elicitation) has no live asker in the server: it suspends the
/// call, the SDK sees it (message and form) as the interrupt's value, `Command(resume=...)`
/// answers it, and the server's tool, called again with the answers, returns them; MCP's own
/// `{"action": "decline"}` declines.
#[test]
fn the_official_sdk_answers_an_mcp_server_s_question_with_command_resume() {
    let (Some(python), Some(mcp_python)) = (
        deepagents_test_support::langgraph_python(),
        deepagents_test_support::mcp_python(),
    ) else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deepagents-mcp/tests/fixtures/server.py");
    let config = data.path().join("servers.json");
    std::fs::write(
        &config,
        json!({"mcpServers": {"fixture": {"command": mcp_python, "args": [fixture.display().to_string()]}}})
            .to_string(),
    )
    .unwrap();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "s", "name": "fixture__survey", "args": {}}]},
        {"text": "Noted."}
    ]});
    let config = config.display().to_string();
    let server = Server::start(data.path(), root.path(), script, &["--mcp-config", &config]);
    let check =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/langgraph_sdk_mcp_question.py");
    let output = std::process::Command::new(&python)
        .arg(&check)
        .arg(format!("http://{}", server.address))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("mcp question answered"),
        "stdout:\n{stdout}\nstderr:\n{}\nserver:\n{}",
        String::from_utf8_lossy(&output.stderr),
        server.log()
    );
}

#[test]
fn the_official_sdk_passes_against_two_servers_sharing_postgres_and_redis() {
    let (Some(python), Some(database), Some(redis)) = (
        deepagents_test_support::langgraph_python(),
        deepagents_test_support::postgres_url(),
        deepagents_test_support::redis_url(),
    ) else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let cluster = deepagents_test_support::unique_name("sdk-cluster");
    // Tenants of their own: the database outlives the test.
    let unique = cluster.replace(['.', ':'], "-");
    let (alpha, beta) = (format!("key-a={unique}-a"), format!("key-b={unique}-b"));
    let envs = [
        ("DEEPAGENTS_DATABASE_URL", database.as_str()),
        ("DEEPAGENTS_REDIS_URL", redis.as_str()),
        ("DEEPAGENTS_CLUSTER", cluster.as_str()),
    ];
    let args = [
        "--interrupt-on",
        "write_file",
        "--api-key",
        &alpha,
        "--api-key",
        &beta,
    ];
    let start = |name: &str| {
        let dir = data.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        Server::start_with(&dir, root.path(), script(), &args, &envs)
    };
    // The client talks to one; either runs what it accepts.
    let (first, _second) = (start("a"), start("b"));
    sdk_check(&python, &first, root.path());
}

/// `[server.auth]` of the config file and the `--jwt-*` flags: each user's bearer JWT is its
/// own tenant, beside the API keys; a token that must not pass is a 401 saying why.
#[test]
fn bearer_jwts_from_the_config_file_make_each_user_a_tenant() {
    let data = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let config = data.path().join("config.toml");
    std::fs::write(
        &config,
        "[server.auth]\nhs256_secret_env = \"TEST_JWT_SECRET\"\naudience = \"deepagents\"\n",
    )
    .unwrap();
    let secret = "a-test-secret-of-more-than-32-bytes-0123456789";
    let config_arg = config.display().to_string();
    let server = Server::start_with(
        data.path(),
        root.path(),
        script(),
        &[
            "--config",
            &config_arg,
            "--jwt-issuer",
            "https://idp.test/",
            "--api-key",
            "k=team",
        ],
        &[("TEST_JWT_SECRET", secret)],
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let token = |sub: &str, exp: u64| {
        let claims =
            json!({"sub": sub, "iss": "https://idp.test/", "aud": "deepagents", "exp": exp});
        let key = jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()).unwrap();
        let token = jsonwebtoken::encode(&jsonwebtoken::Header::default(), &claims, &key).unwrap();
        format!("Bearer {token}")
    };
    let alice = token("alice", now + 600);
    let bob = token("bob", now + 600);
    let (status, _, body) = server.request(
        "POST",
        "/threads",
        &[("Authorization", &alice)],
        Some(&json!({})),
    );
    assert_eq!(status, 200, "{body}\n{}", server.log());
    let thread: serde_json::Value = serde_json::from_str(&body).unwrap();
    let path = format!("/threads/{}", thread["thread_id"].as_str().unwrap());
    assert_eq!(
        server
            .request("GET", &path, &[("Authorization", &alice)], None)
            .0,
        200
    );
    assert_eq!(
        server
            .request("GET", &path, &[("Authorization", &bob)], None)
            .0,
        404
    );
    assert_eq!(
        server.request("GET", &path, &[("x-api-key", "k")], None).0,
        404
    );
    let (status, _, body) = server.request(
        "GET",
        &path,
        &[("Authorization", &token("alice", now - 3600))],
        None,
    );
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("token expired"), "{body}");
    let (status, _, body) = server.request("GET", &path, &[], None);
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("Authorization: Bearer"), "{body}");
}

#[test]
fn the_wire_has_the_platform_s_status_codes_framing_and_keys() {
    let data = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let server = Server::start(
        data.path(),
        root.path(),
        script(),
        &["--api-key", "secret=team"],
    );
    let key = [("x-api-key", "secret")];
    // No key, a wrong key: 401 with what to do. Health needs none.
    let (status, _, body) = server.request("POST", "/threads", &[], Some(&json!({})));
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("x-api-key"), "{body}");
    let (status, _, _) = server.request(
        "POST",
        "/threads",
        &[("Authorization", "Bearer nope")],
        Some(&json!({})),
    );
    assert_eq!(status, 401);
    assert_eq!(server.request("GET", "/ok", &[], None).0, 200);
    // Bad input: 422 with the reason, never a crash.
    let (status, _, body) = server.request("POST", "/threads", &key, None);
    assert_eq!(status, 200, "{body}");
    let thread: serde_json::Value = serde_json::from_str(&body).unwrap();
    let tid = thread["thread_id"].as_str().unwrap();
    for (payload, says) in [
        (
            json!({"assistant_id": "agent", "stream_mode": "telepathy"}),
            "unknown stream mode",
        ),
        (
            json!({"assistant_id": "agent", "input": {"messages": [{"role": "assistant", "content": "x"}]}}),
            "only user messages",
        ),
        (
            json!({"assistant_id": "agent", "multitask_strategy": "maybe"}),
            "multitask_strategy",
        ),
        (json!({"input": {}}), "assistant_id"),
    ] {
        let (status, _, body) = server.request(
            "POST",
            &format!("/threads/{tid}/runs"),
            &key,
            Some(&payload),
        );
        assert_eq!(status, 422, "{payload}: {body}");
        assert!(body.contains(says), "{payload}: {body}");
    }
    let (status, _, body) = server.request(
        "POST",
        "/threads",
        &[
            ("x-api-key", "secret"),
            ("Content-Type", "application/json"),
        ],
        Some(&json!([1])),
    );
    assert_eq!(status, 422, "{body}");
    let (status, _, _) = server.request(
        "POST",
        &format!("/threads/{tid}/runs"),
        &key,
        Some(&json!({"assistant_id": "nobody"})),
    );
    assert_eq!(status, 404);
    let (status, _, body) = server.request(
        "POST",
        "/threads",
        &key,
        Some(&json!({"thread_id": "../../etc"})),
    );
    assert_eq!(status, 422, "{body}");
    // A stream: event-stream, the run's location, `metadata` first, ids in order.
    let (status, head, body) = server.request(
        "POST",
        &format!("/threads/{tid}/runs/stream"),
        &key,
        Some(&json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "join me"}]}, "stream_mode": ["values", "messages-tuple"]})),
    );
    assert_eq!(status, 200, "{body}");
    let head = head.to_ascii_lowercase();
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    assert!(
        head.contains(&format!("content-location: /threads/{tid}/runs/")),
        "{head}"
    );
    let frames: Vec<&str> = body
        .split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .collect();
    assert!(frames[0].starts_with("event: metadata\ndata: {"), "{body}");
    for (i, frame) in frames.iter().enumerate() {
        assert!(frame.ends_with(&format!("\nid: {i}")), "{frame}");
    }
    assert!(
        frames.iter().any(|f| f.starts_with("event: messages\n")),
        "{body}"
    );
    let last = frames
        .iter()
        .rev()
        .find(|f| f.starts_with("event: values"))
        .unwrap();
    assert!(last.contains("\"Joined.\""), "{last}");
    // A stateless run's thread is gone with it.
    let (status, _, body) = server.request("POST", "/runs/wait", &key, Some(&json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "join me"}]}})));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Joined."), "{body}");
    let (_, _, body) = server.request("POST", "/threads/search", &key, Some(&json!({})));
    let threads: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    assert_eq!(threads.len(), 1, "{body}");
    // State updates: messages added, todos set; a bad key is refused.
    let (status, _, body) = server.request("POST", &format!("/threads/{tid}/state"), &key, Some(&json!({"values": {"todos": [{"content": "Review", "status": "pending"}], "messages": [{"type": "human", "content": "added"}]}})));
    assert_eq!(status, 200, "{body}");
    let (_, _, body) = server.request("GET", &format!("/threads/{tid}/state"), &key, None);
    let state: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(state["values"]["todos"][0]["content"], "Review");
    assert_eq!(
        state["values"]["messages"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()["content"],
        "added"
    );
    let (status, _, body) = server.request(
        "POST",
        &format!("/threads/{tid}/state"),
        &key,
        Some(&json!({"values": {"mood": 1}})),
    );
    assert_eq!(status, 422, "{body}");
    let (status, _, body) = server.request("GET", "/metrics", &[], None);
    assert_eq!(status, 200);
    assert!(body.contains("deepagents_runs_active 0"), "{body}");
}

fn get_json(server: &Server, path: &str, key: &[(&str, &str)]) -> serde_json::Value {
    let (status, _, body) = server.request("GET", path, key, None);
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// A new cluster on the test PostgreSQL and Redis: its servers share one root for files and
/// take API key `k` for a tenant of the cluster's own. `None` (the test is skipped) without
/// PostgreSQL and Redis.
struct KeyedCluster {
    data: tempfile::TempDir,
    root: tempfile::TempDir,
    database: String,
    redis: String,
    name: String,
    key_arg: String,
}

impl KeyedCluster {
    fn new(prefix: &str) -> Option<Self> {
        let (Some(database), Some(redis)) = (
            deepagents_test_support::postgres_url(),
            deepagents_test_support::redis_url(),
        ) else {
            return None;
        };
        let name = deepagents_test_support::unique_name(prefix);
        let key_arg = format!("k={}", name.replace(['.', ':'], "-"));
        Some(Self {
            data: tempfile::tempdir().unwrap(),
            root: tempfile::tempdir().unwrap(),
            database,
            redis,
            name,
            key_arg,
        })
    }

    /// Server `server` of the cluster (its data directory of that name), with `script` and
    /// `extra` flags.
    fn start(&self, server: &str, script: serde_json::Value, extra: &[&str]) -> Server {
        let dir = self.data.path().join(server);
        std::fs::create_dir_all(&dir).unwrap();
        let mut args = vec!["--api-key", self.key_arg.as_str()];
        args.extend_from_slice(extra);
        let envs = [
            ("DEEPAGENTS_DATABASE_URL", self.database.as_str()),
            ("DEEPAGENTS_REDIS_URL", self.redis.as_str()),
            ("DEEPAGENTS_CLUSTER", self.name.as_str()),
        ];
        Server::start_with(&dir, self.root.path(), script, &args, &envs)
    }
}

#[test]
fn two_servers_share_runs_and_one_finishes_what_a_killed_one_was_running() {
    let Some(cluster) = KeyedCluster::new("cluster") else {
        return;
    };
    let script = json!({
        "turns": [{"text": "Default answer."}],
        "conversations": [
            {"when_task_contains": "sleep", "turns": [
                {"tool_calls": [{"id": "s1", "name": "execute", "args": {"command": "sleep 30"}}]},
                {"text": "Slept."}
            ]},
            {"when_task_contains": "count", "turns": [
                {"text": "One."}, {"text": "Two."}, {"text": "Three."}, {"text": "Four."}
            ]}
        ]
    });
    let start = |name: &str| cluster.start(name, script.clone(), &[]);
    let mut servers = vec![start("a"), start("b")];
    let key = [("x-api-key", "k")];

    // Runs created on either server run one at a time per thread, in order.
    let (_, _, body) = servers[0].request("POST", "/threads", &key, Some(&json!({})));
    let counted: serde_json::Value = serde_json::from_str(&body).unwrap();
    let counted = counted["thread_id"].as_str().unwrap().to_owned();
    let mut runs = Vec::new();
    for (i, text) in ["count", "more", "again", "last"].iter().enumerate() {
        let payload = json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": text}]}, "multitask_strategy": "enqueue"});
        let (status, _, body) = servers[i % 2].request(
            "POST",
            &format!("/threads/{counted}/runs"),
            &key,
            Some(&payload),
        );
        assert_eq!(status, 200, "{body}");
        let run: serde_json::Value = serde_json::from_str(&body).unwrap();
        runs.push(run["run_id"].as_str().unwrap().to_owned());
    }
    for run in &runs {
        let (status, _, body) = servers[1].request(
            "GET",
            &format!("/threads/{counted}/runs/{run}/join"),
            &key,
            None,
        );
        assert_eq!(status, 200, "{body}");
    }
    let state = get_json(&servers[0], &format!("/threads/{counted}/state"), &key);
    let texts: Vec<&str> = state["values"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(
        texts,
        [
            "count", "One.", "more", "Two.", "again", "Three.", "last", "Four."
        ]
    );

    // A long run, created on the first server, is run by one of them.
    let (_, _, body) = servers[0].request("POST", "/threads", &key, Some(&json!({})));
    let thread: serde_json::Value = serde_json::from_str(&body).unwrap();
    let tid = thread["thread_id"].as_str().unwrap().to_owned();
    let payload = json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "sleep please"}]}, "stream_mode": ["values", "updates"]});
    let (status, _, body) = servers[0].request(
        "POST",
        &format!("/threads/{tid}/runs"),
        &key,
        Some(&payload),
    );
    assert_eq!(status, 200, "{body}");
    let run: serde_json::Value = serde_json::from_str(&body).unwrap();
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let owner = loop {
        let run = get_json(&servers[1], &format!("/threads/{tid}/runs/{run_id}"), &key);
        if run["status"] == "running" && run["worker"].is_string() {
            let worker = run["worker"].as_str().unwrap().to_owned();
            break servers
                .iter()
                .position(|s| worker.starts_with(&format!("{}-", s.pid)))
                .unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "{run}");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Wait until the command runs, then kill the server running it.
    loop {
        let state = get_json(&servers[1], &format!("/threads/{tid}/state"), &key);
        if state["values"]["messages"]
            .as_array()
            .is_some_and(|m| m.len() >= 2)
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{state}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let survivor = servers.remove(1 - owner);
    // A client joins the run's stream on the survivor before the crash.
    let joined = {
        let address = survivor.address.clone();
        let path = format!("/threads/{tid}/runs/{run_id}/stream");
        std::thread::spawn(move || {
            let server = Server {
                child: std::process::Command::new("true").spawn().unwrap(),
                address,
                pid: 0,
                log: std::sync::Arc::default(),
            };
            server.request("GET", &path, &[("x-api-key", "k")], None)
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    drop(servers); // SIGKILL
    let killed = std::time::Instant::now();
    let (status, _, stream) = joined.join().unwrap();
    assert_eq!(status, 200);
    // Its liveness lock went with its connection: taken over at once, not after the lease.
    let taken_over = killed.elapsed();
    eprintln!("taken over and finished {taken_over:?} after the SIGKILL");
    assert!(taken_over < crate_lease() / 2, "{taken_over:?}");
    assert!(stream.contains("event: metadata"), "{stream}");
    assert!(
        stream.contains("\"attempt\":2"),
        "the survivor resumed it: {stream}"
    );
    assert!(stream.contains("Slept."), "{stream}");
    let run = get_json(&survivor, &format!("/threads/{tid}/runs/{run_id}"), &key);
    assert_eq!(run["status"], "success", "{run}");
    // One result for the command, none repeated: the history is consistent.
    let state = get_json(&survivor, &format!("/threads/{tid}/state"), &key);
    let messages = state["values"]["messages"].as_array().unwrap();
    let results: Vec<&serde_json::Value> = messages
        .iter()
        .filter(|m| m["tool_call_id"] == "s1")
        .collect();
    assert_eq!(results.len(), 1, "{messages:?}");
    assert_eq!(messages.last().unwrap()["content"], "Slept.");
}

#[test]
fn a_server_stopped_with_sigterm_hands_its_run_to_another_at_once() {
    let Some(cluster) = KeyedCluster::new("sigterm") else {
        return;
    };
    let start = |name: &str| cluster.start(name, script(), &[]);
    let mut servers = vec![start("a"), start("b")];
    let key = [("x-api-key", "k")];
    let (_, _, body) = servers[0].request("POST", "/threads", &key, Some(&json!({})));
    let thread: serde_json::Value = serde_json::from_str(&body).unwrap();
    let tid = thread["thread_id"].as_str().unwrap().to_owned();
    let payload = json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "sleep please"}]}});
    let (_, _, body) = servers[0].request(
        "POST",
        &format!("/threads/{tid}/runs"),
        &key,
        Some(&payload),
    );
    let run: serde_json::Value = serde_json::from_str(&body).unwrap();
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let owner = loop {
        let run = get_json(&servers[0], &format!("/threads/{tid}/runs/{run_id}"), &key);
        let state = get_json(&servers[0], &format!("/threads/{tid}/state"), &key);
        let sleeping = state["values"]["messages"]
            .as_array()
            .is_some_and(|m| m.len() >= 2);
        if let (true, Some(worker)) = (sleeping, run["worker"].as_str()) {
            break servers
                .iter()
                .position(|s| worker.starts_with(&format!("{}-", s.pid)))
                .unwrap();
        }
        assert!(std::time::Instant::now() < deadline, "{run}");
        std::thread::sleep(Duration::from_millis(50));
    };
    // Clients following the run on the server that stops: a stream and a join.
    let follow = |path: String| {
        let address = servers[owner].address.clone();
        std::thread::spawn(move || raw_get(&address, &path, &[("x-api-key", "k")]))
    };
    let streamed = follow(format!("/threads/{tid}/runs/{run_id}/stream"));
    let joined = follow(format!("/threads/{tid}/runs/{run_id}/join"));
    std::thread::sleep(Duration::from_millis(300));
    let stopped = std::process::Command::new("kill")
        .args(["-TERM", &servers[owner].pid.to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let started = std::time::Instant::now();
    // It exits promptly, and the other server finishes the run well before a lease would
    // have run out.
    let status = loop {
        if let Some(status) = servers[owner].child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "the server did not stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
    let survivor = servers.remove(1 - owner);
    loop {
        let run = get_json(&survivor, &format!("/threads/{tid}/runs/{run_id}"), &key);
        if run["status"] == "success" {
            eprintln!(
                "taken over and finished {:?} after the SIGTERM",
                started.elapsed()
            );
            break;
        }
        assert!(
            started.elapsed() < crate_lease() - Duration::from_secs(2),
            "not taken over at once: {run}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let state = get_json(&survivor, &format!("/threads/{tid}/state"), &key);
    let messages = state["values"]["messages"].as_array().unwrap();
    assert_eq!(
        messages.last().unwrap()["content"],
        "Slept.",
        "{messages:?}"
    );
    // Each was cut, not ended: the SDKs reconnect to `Location` (through a load balancer,
    // another server) and go on after the last event they saw. (Unless the other server
    // finished the run before this one noticed its own stop: then it was answered whole.)
    let (head, body, ended) = streamed.join().unwrap();
    let location = header(&head, "location").unwrap();
    assert_eq!(location, format!("/threads/{tid}/runs/{run_id}/stream"));
    if ended {
        assert!(
            body.contains("Slept."),
            "ended without the run's end: {body}"
        );
    } else {
        assert!(
            body.contains("retry: "),
            "no reconnect hint before the cut: {body}"
        );
        let last = body
            .lines()
            .rev()
            .find_map(|line| line.strip_prefix("id: "))
            .unwrap()
            .to_owned();
        let (_, rest, ended) = raw_get(
            &survivor.address,
            &location,
            &[("x-api-key", "k"), ("last-event-id", &last)],
        );
        assert!(ended && rest.contains("Slept."), "{rest}");
        let first = rest
            .lines()
            .find_map(|line| line.strip_prefix("id: "))
            .unwrap();
        assert_eq!(
            first.parse::<usize>().unwrap(),
            last.parse::<usize>().unwrap() + 1
        );
    }
    let (head, body, ended) = joined.join().unwrap();
    let location = header(&head, "location").unwrap();
    assert_eq!(location, format!("/threads/{tid}/runs/{run_id}/join"));
    let values = if ended {
        body
    } else {
        let (_, values, ended) = raw_get(&survivor.address, &location, &[("x-api-key", "k")]);
        assert!(ended, "{values}");
        values
    };
    let values: serde_json::Value = serde_json::from_str(values.trim()).unwrap();
    assert_eq!(
        values["messages"].as_array().unwrap().last().unwrap()["content"],
        "Slept."
    );
    assert_eq!(
        messages
            .iter()
            .filter(|m| m["tool_call_id"] == "s1")
            .count(),
        1
    );
}

/// Runs `sql` on the cluster's database with `psql` (what a server stopping mid-intake leaves
/// is made by hand: a kill cannot be timed to the millisecond).
fn psql(database: &str, sql: &str) -> String {
    let output = std::process::Command::new("psql")
        .args([database, "-At", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{sql}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A server stopped while taking a run in leaves it queued but not admitted: once the
/// intake's lease runs out another server runs it when its record was saved, and drops it
/// when not (its client was refused); nothing stays `pending` forever and the input is
/// added once.
#[test]
fn a_run_whose_server_stopped_while_taking_it_in_is_run_or_dropped() {
    let Some(cluster) = KeyedCluster::new("intake") else {
        return;
    };
    let server = cluster.start("server", script(), &[]);
    let key = [("x-api-key", "k")];
    let (_, _, body) = server.request("POST", "/threads", &key, Some(&json!({})));
    let thread: serde_json::Value = serde_json::from_str(&body).unwrap();
    let tid = thread["thread_id"].as_str().unwrap().to_owned();
    let post = |text: &str| {
        let payload = json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": text}]}, "multitask_strategy": "enqueue"});
        let (status, _, body) = server.request(
            "POST",
            &format!("/threads/{tid}/runs"),
            &key,
            Some(&payload),
        );
        assert_eq!(status, 200, "{body}");
        let run: serde_json::Value = serde_json::from_str(&body).unwrap();
        run["run_id"].as_str().unwrap().to_owned()
    };
    // A long run holds the thread, so the next one waits in the queue.
    let sleeping = post("sleep please");
    let waiting = post("join me");
    // As if the server had stopped after saving `waiting`'s record, before admitting it; and
    // had stopped before saving the record of a copy of it.
    psql(
        &cluster.database,
        &format!(
            "INSERT INTO deepagents_server_queue (run_id, cluster, tenant, thread_id, status, job, lease_until)
             SELECT 'ghost-{waiting}', cluster, tenant, thread_id, 'intake', replace(job, '{waiting}', 'ghost-{waiting}'), 0
             FROM deepagents_server_queue WHERE run_id = '{waiting}';
             UPDATE deepagents_server_queue SET status = 'intake', lease_until = 0 WHERE run_id = '{waiting}'"
        ),
    );
    let (status, _, body) = server.request(
        "POST",
        &format!("/threads/{tid}/runs/{sleeping}/cancel"),
        &key,
        None,
    );
    assert!(
        status == 200 || status == 202 || status == 204,
        "{status} {body}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let run = get_json(&server, &format!("/threads/{tid}/runs/{waiting}"), &key);
        if run["status"] == "success" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{run}\nthe server's log:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    loop {
        let queued = psql(
            &cluster.database,
            &format!(
                "SELECT count(*) FROM deepagents_server_queue WHERE cluster = '{}'",
                cluster.name
            ),
        );
        if queued == "0" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{queued} still queued"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, _, _) = server.request(
        "GET",
        &format!("/threads/{tid}/runs/ghost-{waiting}"),
        &key,
        None,
    );
    assert_eq!(status, 404, "a run never recorded is not shown");
    let state = get_json(&server, &format!("/threads/{tid}/state"), &key);
    let joined: Vec<&serde_json::Value> = state["values"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["content"] == "join me")
        .collect();
    assert_eq!(joined.len(), 1, "{state}");
}

/// `POST path` with `body`, `None` when the server went away before answering whole.
fn try_post(address: &str, path: &str, body: &serde_json::Value) -> Option<(u16, String)> {
    exchange(address, "POST", path, &[("x-api-key", "k")], Some(body))
        .filter(|answer| answer.whole)
        .map(|answer| (answer.status(), answer.body()))
}

/// Servers SIGKILLed 0–50 ms after a burst of concurrent runs reach them: every run a client
/// was told of ends (none stays `pending`), no run ends without its client having been told
/// or its record kept, and no input is added twice. Rounds: `DEEPAGENTS_KILL_ROUNDS`
/// (default 6); the counts are printed for the measurement in the notes.
#[test]
fn servers_killed_while_taking_runs_in_lose_none() {
    let Some(cluster) = KeyedCluster::new("killloop") else {
        return;
    };
    let rounds: u64 = std::env::var("DEEPAGENTS_KILL_ROUNDS")
        .ok()
        .and_then(|rounds| rounds.parse().ok())
        .unwrap_or(6);
    let start = |name: &str| cluster.start(name, script(), &[]);
    let survivor = start("survivor");
    let key = [("x-api-key", "k")];
    let mut threads = Vec::new();
    let mut told = Vec::new();
    let mut unanswered = 0;
    // A fixed sequence of delays, so a failure can be replayed.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for round in 0..rounds {
        let victim = start(&format!("victim-{round}"));
        let mut posts = Vec::new();
        for i in 0..8 {
            let (_, _, body) = survivor.request("POST", "/threads", &key, Some(&json!({})));
            let thread: serde_json::Value = serde_json::from_str(&body).unwrap();
            let tid = thread["thread_id"].as_str().unwrap().to_owned();
            threads.push(tid.clone());
            let address = victim.address.clone();
            posts.push(std::thread::spawn(move || {
                let payload = json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": format!("hello {round}-{i}")}]}});
                (tid.clone(), try_post(&address, &format!("/threads/{tid}/runs"), &payload))
            }));
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(seed % 51));
        drop(victim); // SIGKILL
        for post in posts {
            match post.join().unwrap() {
                (tid, Some((200, body))) => {
                    let run: serde_json::Value = serde_json::from_str(&body).unwrap();
                    told.push((tid, run["run_id"].as_str().unwrap().to_owned()));
                }
                (_, Some((status, body))) => panic!("{status}: {body}"),
                (_, None) => unanswered += 1,
            }
        }
    }
    // Every run ends; the ones clients were told of are among them.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut ended = 0;
    for tid in &threads {
        loop {
            let runs = get_json(&survivor, &format!("/threads/{tid}/runs"), &key);
            let runs = runs.as_array().unwrap();
            if runs.iter().all(|run| run["status"] == "success") {
                ended += runs.len();
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "runs of thread {tid} never ended: {runs:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let state = get_json(&survivor, &format!("/threads/{tid}/state"), &key);
        let inputs = state["values"]["messages"]
            .as_array()
            .map_or(0, |messages| {
                messages.iter().filter(|m| m["type"] == "human").count()
            });
        assert!(inputs <= 1, "input added twice: {state}");
    }
    for (tid, run_id) in &told {
        let run = get_json(&survivor, &format!("/threads/{tid}/runs/{run_id}"), &key);
        assert_eq!(run["status"], "success", "{run}");
    }
    eprintln!(
        "kill loop: {rounds} servers killed, {} runs posted, {} acknowledged, {unanswered} cut off unanswered, {ended} ran, 0 lost",
        threads.len(),
        told.len()
    );
}

/// A resume keyed by an interrupt id answers that interrupt only, on whichever server of a
/// cluster it reaches: the first approval sent again once the run paused on the next write is
/// a 409 naming the pending interrupt and the next file is not written; of two resumes of one
/// interrupt sent to both servers at once, one applies and the other is a 409.
#[test]
fn every_server_of_a_cluster_refuses_a_resume_for_an_interrupt_no_longer_pending() {
    let Some(cluster) = KeyedCluster::new("stale-resume") else {
        return;
    };
    let script = json!({
        "turns": [{"text": "Default answer."}],
        "conversations": [
            {"when_task_contains": "write both", "turns": [
                {"tool_calls": [{"name": "write_file", "args": {"file_path": "/one.md", "content": "one\n"}}]},
                {"tool_calls": [{"name": "write_file", "args": {"file_path": "/two.md", "content": "two\n"}}]},
                {"text": "Both written."}
            ]}
        ]
    });
    let start = |name: &str| cluster.start(name, script.clone(), &["--interrupt-on", "write_file"]);
    let servers = [start("a"), start("b")];
    let key = [("x-api-key", "k")];
    let parse = |body: &str| -> serde_json::Value { serde_json::from_str(body).unwrap() };
    let (_, _, body) = servers[0].request("POST", "/threads", &key, Some(&json!({})));
    let tid = parse(&body)["thread_id"].as_str().unwrap().to_owned();
    let wait = format!("/threads/{tid}/runs/wait");
    let approve = json!({"decisions": [{"type": "approve"}]});
    let resume =
        |id: &str| json!({"assistant_id": "agent", "command": {"resume": { id: approve.clone() }}});
    let (status, _, body) = servers[0].request(
        "POST",
        &wait,
        &key,
        Some(&json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "write both"}]}})),
    );
    assert_eq!(status, 200, "{body}");
    let first = parse(&body)["__interrupt__"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, _, body) = servers[1].request("POST", &wait, &key, Some(&resume(&first)));
    assert_eq!(status, 200, "{body}");
    let second = parse(&body)["__interrupt__"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(first, second);
    assert!(cluster.root.path().join("one.md").exists());

    for server in &servers {
        for stale in [first.as_str(), "interrupt-unknown"] {
            let (status, _, body) = server.request("POST", &wait, &key, Some(&resume(stale)));
            assert_eq!(status, 409, "{stale}: {body}");
            let detail = parse(&body)["detail"].as_str().unwrap().to_owned();
            assert!(
                detail.contains(&second) && detail.contains("re-read the thread state"),
                "{detail}"
            );
        }
        let state = get_json(server, &format!("/threads/{tid}/state"), &key);
        assert_eq!(state["interrupts"][0]["id"], second.as_str(), "{state}");
    }
    assert!(
        !cluster.root.path().join("two.md").exists(),
        "written on a stale approval"
    );

    // Two resumes of the pending interrupt at once, one per server, even asking to queue.
    let answers: Vec<(u16, String)> = std::thread::scope(|scope| {
        let racers: Vec<_> = servers
            .iter()
            .map(|server| {
                let mut payload = resume(&second);
                payload["multitask_strategy"] = json!("enqueue");
                let wait = &wait;
                scope.spawn(move || {
                    let (status, _, body) = server.request("POST", wait, &key, Some(&payload));
                    (status, body)
                })
            })
            .collect();
        racers
            .into_iter()
            .map(|racer| racer.join().unwrap())
            .collect()
    });
    let mut statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 409], "{answers:?}");
    assert_eq!(
        std::fs::read_to_string(cluster.root.path().join("two.md")).unwrap(),
        "two\n"
    );
    let state = get_json(&servers[0], &format!("/threads/{tid}/state"), &key);
    let messages = state["values"]["messages"].as_array().unwrap();
    assert_eq!(
        messages.last().unwrap()["content"],
        "Both written.",
        "{messages:?}"
    );
    assert_eq!(
        messages
            .iter()
            .filter(|m| m["tool_call_id"] == "call_1_0")
            .count(),
        1,
        "the second write ran once: {messages:?}"
    );
}

/// How long a claimed run stays claimed without a heartbeat (the server's `LEASE`).
fn crate_lease() -> Duration {
    Duration::from_secs(10)
}

#[test]
fn assistants_of_the_config_file_are_served_beside_the_flags_one() {
    let data = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let config = data.path().join("config.toml");
    std::fs::write(
        &config,
        "[server]\napi_keys = { \"team-key\" = \"team\" }\n\n[[assistants]]\nname = \"reviewer\"\ndescription = \"Reviews changes\"\nsystem_prompt = \"You review.\"\ninterrupt_on = [\"write_file\"]\n",
    )
    .unwrap();
    let server = Server::start(
        data.path(),
        root.path(),
        script(),
        &["--config", config.to_str().unwrap()],
    );
    let key = [("x-api-key", "team-key")];
    let (status, _, body) = server.request("POST", "/assistants/search", &key, Some(&json!({})));
    assert_eq!(status, 200, "{body}");
    let found: Vec<serde_json::Value> = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = found
        .iter()
        .map(|a| a["graph_id"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["agent", "reviewer"]);
    assert_eq!(found[1]["description"], "Reviews changes");
    // The reviewer pauses before writing; the flags' agent does not.
    for (assistant, paused) in [("reviewer", true), ("agent", false)] {
        let (_, _, body) = server.request("POST", "/threads", &key, Some(&json!({})));
        let thread: serde_json::Value = serde_json::from_str(&body).unwrap();
        let tid = thread["thread_id"].as_str().unwrap();
        let payload = json!({"assistant_id": assistant, "input": {"messages": [{"role": "user", "content": "write the file"}]}});
        let (status, _, body) = server.request(
            "POST",
            &format!("/threads/{tid}/runs/wait"),
            &key,
            Some(&payload),
        );
        assert_eq!(status, 200, "{body}");
        let values: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            values.get("__interrupt__").is_some(),
            paused,
            "{assistant}: {values}"
        );
    }
}

/// A browser page on another origin can use a local server without keys out of the box;
/// with API keys, only the origins `--cors` names; `--cors none` turns it off; an origin
/// that could never match is refused at start with the fix.
#[test]
fn serve_allows_browser_pages_by_default_only_on_loopback_without_keys() {
    let preflight = [
        ("Origin", "http://localhost:3000"),
        ("Access-Control-Request-Method", "POST"),
        ("Access-Control-Request-Headers", "content-type,x-api-key"),
    ];
    let allowed = |server: &Server| {
        let (_, head, _) = server.request("OPTIONS", "/threads", &preflight, None);
        head.lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("access-control-allow-origin")
                    .then(|| value.trim().to_owned())
            })
            .unwrap_or_default()
    };
    for (extra, expected) in [
        (&[][..], "*"),
        (&["--api-key", "k=team"][..], ""),
        (
            &["--api-key", "k=team", "--cors", "http://localhost:3000"][..],
            "http://localhost:3000",
        ),
        (&["--cors", "none"][..], ""),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        std::fs::create_dir_all(&root).unwrap();
        let server = Server::start(dir.path(), &root, script(), extra);
        assert_eq!(allowed(&server), expected, "{extra:?}");
    }
    let dir = tempfile::tempdir().unwrap();
    let script_path = dir.path().join("script.json");
    std::fs::write(&script_path, script().to_string()).unwrap();
    let output = crate::bin()
        .env("DEEPAGENTS_DATA_DIR", dir.path().join("data"))
        .env("HOME", dir.path())
        .args(["serve", "--listen", "127.0.0.1:0", "--model"])
        .arg(format!("scripted:{}", script_path.display()))
        .args(["--cors", "localhost:3000"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("scheme://host[:port]"), "{stderr}");
}

/// A run's payload may hold U+0000 (in its input, its metadata): the cluster takes it as the
/// embedded server does; thread ids and store keys that no store can hold are a 422, never a
/// 500.
#[test]
fn a_cluster_takes_nul_in_payloads_and_refuses_unstorable_keys() {
    let (Some(database), Some(redis)) = (
        deepagents_test_support::postgres_url(),
        deepagents_test_support::redis_url(),
    ) else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let cluster = deepagents_test_support::unique_name("nul-cluster");
    let envs = [
        ("DEEPAGENTS_DATABASE_URL", database.as_str()),
        ("DEEPAGENTS_REDIS_URL", redis.as_str()),
        ("DEEPAGENTS_CLUSTER", cluster.as_str()),
    ];
    let server = Server::start_with(data.path(), data.path(), script(), &[], &envs);
    let (status, _, body) = server.request(
        "POST",
        "/threads",
        &[],
        Some(&json!({"metadata": {"note": "a\u{0}b"}})),
    );
    assert_eq!(status, 200, "{body}");
    let thread: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = thread["thread_id"].as_str().unwrap();
    let (status, _, body) = server.request(
        "POST",
        &format!("/threads/{id}/runs/wait"),
        &[],
        Some(
            &json!({"assistant_id": "agent", "metadata": {"tag": "x\u{0}y"},
                     "input": {"messages": [{"role": "user", "content": "nul \u{0} inside"}]}}),
        ),
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("nul \\u0000 inside"), "{body}");
    let long_key = "k".repeat(5000);
    for (key, namespace) in [
        ("a\u{0}b", json!(["users"])),
        (long_key.as_str(), json!(["users"])),
    ] {
        let (status, _, body) = server.request(
            "PUT",
            "/store/items",
            &[],
            Some(&json!({"namespace": namespace, "key": key, "value": {"x": 1}})),
        );
        assert_eq!(status, 422, "{body}");
    }
    let (status, _, body) = server.request(
        "POST",
        "/threads",
        &[],
        Some(&json!({"thread_id": "bad\u{0}id"})),
    );
    assert_eq!(status, 422, "{body}");
}
