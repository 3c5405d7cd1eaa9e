//! `deepagents serve` driven by LangGraph web clients in a browser, each bundled with esbuild
//! and served from another origin, driven in headless Chromium by playwright-core: a page on
//! the official JS SDK's React `useStream` in the style of agent-chat-ui (tests/web/usestream,
//! its flows described in tests/web/usestream.cjs), and one on `@langchain/react`'s v2
//! `useStream`, which speaks the thread-centric protocol through the SDK it pins
//! (tests/web/react_v2, flows in tests/web/react_v2.cjs).

use std::path::Path;

use serde_json::{Value, json};

use crate::server::Server;

fn write_file(id: &str, path: &str, content: &str) -> Value {
    json!({"tool_calls": [{"id": id, "name": "write_file", "args": {"file_path": path, "content": content}}]})
}

fn text(text: &str) -> Value {
    json!({"text": text})
}

fn conversation(task: &str, turns: &[Value]) -> Value {
    json!({"when_task_contains": task, "turns": turns})
}

/// The conversations of the flows on the state backend, each keyed by its first message.
fn script() -> Value {
    json!({
        "turns": [text("Default answer.")],
        "conversations": [
            conversation("hello there", &[text("Hello from the scripted model."), text("Hello again.")]),
            conversation("list me", &[text("Listed.")]),
            conversation("approve the file", &[write_file("w_approve", "/approved.md", "approved\n"), text("Approved and written.")]),
            conversation("reload me", &[
                write_file("w_reload", "/reloaded.md", "before the reload\n"),
                text("Written before the reload."),
                text("Answered after the reload."),
            ]),
            conversation("edit the file", &[write_file("w_edit", "/edited.md", "original\n"), text("Edited and written.")]),
            conversation("reject the file", &[write_file("w_reject", "/rejected.md", "rejected\n"), text("Understood, not written.")]),
            conversation("resolve the file", &[write_file("w_resolve", "/resolved.md", "resolved\n"), text("A new turn.")]),
            conversation("wait for me", &[write_file("w_wait", "/waiting.md", "waiting\n"), text("Fine, nothing written.")]),
            conversation("plan the notes", &[
                json!({"text": "Planning.", "tool_calls": [{"id": "t_plan", "name": "write_todos", "args": {"todos": [
                    {"content": "Write the notes", "status": "in_progress"},
                    {"content": "Check them", "status": "pending"}
                ]}}]}),
                write_file("w_notes", "/notes.md", "# Notes\n"),
                text("Noted."),
            ]),
            // A regenerated answer forked from the question's checkpoint is asked for the
            // first turn again; a run continuing the head would get the second.
            conversation("regenerate this", &[text("An answer to regenerate."), text("A second answer, not a fork.")]),
            conversation("first version", &[text("Answer to the first version."), text("A second answer, not a fork.")]),
            conversation("second version", &[text("Answer to the second version.")]),
        ]
    })
}

/// The conversations of the flows that need a run to take time (`execute sleep`).
fn slow_script() -> Value {
    let sleep = |id: &str, seconds: u32| json!({"tool_calls": [{"id": id, "name": "execute", "args": {"command": format!("sleep {seconds}")}}]});
    json!({
        "turns": [text("Default answer.")],
        "conversations": [
            conversation("sleep long", &[sleep("s_long", 30), text("Slept.")]),
            conversation("sleep briefly", &[sleep("s_brief", 8), text("Woke up.")]),
        ]
    })
}

/// Where the agent's files are: in its state (as deep-agents-ui shows them), or on disk with
/// `execute` allowed to `sleep`.
enum Backend {
    State,
    Shell,
}

/// Starts a server with `script` on `backend`, `write_file` waiting for approval, then runs
/// the flows of the `useStream` page's driver against it; fails with the driver's report when
/// a flow fails.
fn drive(script: Value, backend: Backend, flows: &[&str]) {
    drive_page("usestream.cjs", script, backend, flows);
}

/// [`drive`] with the driver `driver` of tests/web.
fn drive_page(driver: &str, script: Value, backend: Backend, flows: &[&str]) {
    let Some((modules, chromium)) = deepagents_test_support::browser() else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let server = match backend {
        Backend::State => Server::spawn(
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
        ),
        Backend::Shell => Server::start(
            data.path(),
            root.path(),
            script,
            &["--interrupt-on", "write_file"],
        ),
    };
    let driver = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/web")
        .join(driver);
    let started = std::time::Instant::now();
    let output = std::process::Command::new("node")
        .arg(driver)
        .arg(format!("http://{}", server.address))
        .args(flows)
        .env("DEEPAGENTS_TEST_WEB", modules)
        .env("DEEPAGENTS_TEST_CHROMIUM", chromium)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!(
        "{stdout}{stderr}driver: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        output.status.success() && stdout.contains("all flows passed"),
        "the web client's flows failed:\n{stdout}\n{stderr}"
    );
}

#[test]
fn a_usestream_page_on_another_origin_connects_streams_lists_threads_and_reads_files_and_todos() {
    drive(
        script(),
        Backend::State,
        &[
            "connect",
            "send_and_stream",
            "thread_list",
            "files_and_todos",
        ],
    );
}

#[test]
fn a_usestream_page_approves_edits_rejects_resolves_and_answers_past_an_approval() {
    drive(
        script(),
        Backend::State,
        &[
            "approve",
            "edit",
            "reject",
            "mark_resolved",
            "type_while_waiting",
        ],
    );
}

#[test]
fn a_usestream_page_regenerates_and_edits_as_branches() {
    drive(script(), Backend::State, &["regenerate", "edit_message"]);
}

#[test]
fn a_usestream_page_stops_a_run_and_rejoins_one_after_a_reload() {
    drive(slow_script(), Backend::Shell, &["stop", "rejoin"]);
}

#[test]
fn a_langchain_react_v2_page_on_another_origin_streams_approves_and_reopens_a_thread() {
    drive_page(
        "react_v2.cjs",
        script(),
        Backend::State,
        &["send_and_stream", "approve", "reload"],
    );
}
