//! `deepagents serve` driven over the thread-centric ("v2") streaming protocol by the official
//! JS SDK's own clients: `client.threads.stream(…)` and the `StreamController` that
//! `@langchain/react` 1.1's `useStream` wraps (tests/fixtures/protocol_v2_check.mjs, where
//! each check is described), on Node: a message streamed, an approval given, a subagent's
//! work under its namespace, threads reopened as after a reload.

use std::path::Path;

use serde_json::json;

use crate::server::Server;

#[test]
fn the_js_sdks_v2_stream_client_sends_streams_approves_and_sees_the_end() {
    let Some(modules) = deepagents_test_support::web_node_modules() else {
        return;
    };
    let script = json!({
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
    });
    let data = tempfile::tempdir().unwrap();
    let server = Server::spawn(
        data.path(),
        script,
        &[
            "--todos",
            "--backend",
            "state",
            "--interrupt-on",
            "write_file",
        ],
        &[],
    );
    let check = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/protocol_v2_check.mjs");
    // Over the SDK's SSE transport, then over its WebSocket one (Node 20 has WebSocket
    // behind a flag).
    for transport in ["sse", "websocket"] {
        let output = std::process::Command::new("node")
            .arg("--experimental-websocket")
            .arg(&check)
            .arg(format!("http://{}", server.address))
            .arg(transport)
            .env("DEEPAGENTS_TEST_WEB", &modules)
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
