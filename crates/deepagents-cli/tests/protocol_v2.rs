//! `deepagents serve` driven over the thread-centric ("v2") streaming protocol by the official
//! JS SDK's own clients: `client.threads.stream(…)` and the `StreamController` that
//! `@langchain/react` 1.1's `useStream` wraps (tests/fixtures/protocol_v2_check.mjs, where
//! each check is described), on Node: a message streamed, an approval given, a subagent's
//! work under its namespace, threads reopened as after a reload.

use std::path::Path;

use serde_json::json;

use crate::server::Server;

/// The scripted conversations of the check's parts, each keyed by its first message.
fn script() -> serde_json::Value {
    json!({
        "turns": [{"text": "Default answer."}],
        "conversations": [
            {"when_task_contains": "hello there", "turns": [{"text": "Hello from the scripted model."}, {"text": "Hello again."}]},
            {"when_task_contains": "delegate the notes", "turns": [
                {"tool_calls": [{"id": "t1", "name": "task", "args": {"subagent_type": "general-purpose", "description": "take notes: the plan"}}]},
                {"text": "The helper took notes."}
            ]},
            {"when_task_contains": "take notes:", "turns": [{"text": "Notes taken."}]},
            {"when_task_contains": "write the file", "turns": [
                {"text": "Writing it.", "tool_calls": [{"id": "w1", "name": "write_file", "args": {"file_path": "/sdk.md", "content": "from the sdk\n"}}]},
                {"text": "Written."},
                {"text": "Also done."}
            ]}
        ]
    })
}

/// The agent's flags: files in its state, writes waiting for approval.
const AGENT: [&str; 5] = [
    "--todos",
    "--backend",
    "state",
    "--interrupt-on",
    "write_file",
];

/// Runs tests/fixtures/protocol_v2_check.mjs against the server at `address`, over the SDK's
/// SSE transport, then over its WebSocket one (Node 20 has WebSocket behind a flag).
fn check(modules: &Path, address: &str) {
    let check = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/protocol_v2_check.mjs");
    for transport in ["sse", "websocket"] {
        let output = std::process::Command::new("node")
            .arg("--experimental-websocket")
            .arg(&check)
            .arg(format!("http://{address}"))
            .arg(transport)
            .env("DEEPAGENTS_TEST_WEB", modules)
            .output()
            .expect("node runs");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success()
                && stdout.contains(&format!("protocol v2 check passed ({transport})")),
            "the v2 protocol check over {transport} failed:\n{stdout}\n{stderr}"
        );
    }
}

#[test]
fn the_js_sdks_v2_stream_client_sends_streams_approves_and_sees_the_end() {
    let Some(modules) = deepagents_test_support::web_node_modules() else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let server = Server::spawn(data.path(), script(), &AGENT, &[]);
    check(modules.as_ref(), &server.address);
}

/// In a cluster, the same checks against an API-only server (`--jobs 0`) while another server
/// runs every run: its streams and sockets follow the thread's events from the cluster.
#[test]
fn the_v2_protocol_follows_runs_another_server_of_the_cluster_drives() {
    let (Some(modules), Some(database), Some(redis)) = (
        deepagents_test_support::web_node_modules(),
        deepagents_test_support::postgres_url(),
        deepagents_test_support::redis_url(),
    ) else {
        return;
    };
    let cluster = deepagents_test_support::unique_name("v2cluster");
    let envs = [
        ("DEEPAGENTS_DATABASE_URL", database.as_str()),
        ("DEEPAGENTS_REDIS_URL", redis.as_str()),
        ("DEEPAGENTS_CLUSTER", cluster.as_str()),
    ];
    let data = tempfile::tempdir().unwrap();
    let start = |name: &str, extra: &[&str]| {
        let dir = data.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let args: Vec<&str> = AGENT.iter().copied().chain(extra.iter().copied()).collect();
        Server::spawn(&dir, script(), &args, &envs)
    };
    let _runner = start("runner", &[]);
    let api = start("api", &["--jobs", "0"]);
    check(modules.as_ref(), &api.address);
}
