//! The chat page `deepagents serve` shows at `/`, in headless Chromium driven by playwright-core
//! (tests/web/chat_page.mjs, where each flow is described): a conversation with a plan, an
//! approval, a subagent and files; several decisions and a question; a reload; a phone-sized
//! window; an API key asked for; Stop. Screenshots go to target/test-artifacts/chat-page/.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::server::Server;

fn call(id: &str, name: &str, args: Value) -> Value {
    json!({"id": id, "name": name, "args": args})
}

fn turn(text: &str, calls: &[Value]) -> Value {
    json!({"text": text, "tool_calls": calls})
}

fn script() -> Value {
    let write = |id: &str, path: &str, content: &str| {
        call(
            id,
            "write_file",
            json!({"file_path": path, "content": content}),
        )
    };
    json!({
        "turns": [{"text": "Default answer."}],
        "conversations": [
            {"when_task_contains": "plan the notes", "turns": [
                turn("Planning the notes.", &[call("t1", "write_todos", json!({"todos": [
                    {"content": "Write the notes", "status": "in_progress"},
                    {"content": "Have them reviewed", "status": "pending"}
                ]}))]),
                turn("Writing them.", &[write("w1", "/notes.md", "# Notes\nWritten by the agent.\n")]),
                turn("Asking a reviewer.", &[call("k1", "task", json!({"subagent_type": "general-purpose", "description": "Review /notes.md in one sentence"}))]),
                turn("All done: the notes are written and reviewed.", &[]),
            ]},
            {"when_task_contains": "Review /notes.md", "turns": [
                turn("Reading the notes.", &[call("r1", "read_file", json!({"file_path": "/notes.md"}))]),
                turn("The notes look fine to the reviewer.", &[]),
            ]},
            {"when_task_contains": "two drafts", "turns": [
                turn("Writing two drafts.", &[write("a1", "/a.md", "draft A\n"), write("b1", "/b.md", "draft B\n")]),
                turn("One question first.", &[call("q1", "ask_user", json!({"question": "Which title should the drafts have?", "options": ["Changelog", "What is new"]}))]),
                turn("Done with the drafts.", &[]),
            ]},
            {"when_task_contains": "sleep", "turns": [
                turn("Sleeping.", &[call("s1", "execute", json!({"command": "sleep 30"}))]),
                turn("Slept.", &[]),
            ]},
        ]
    })
}

/// Where the screenshots go: `test-artifacts/chat-page` of the cargo target directory.
fn artifacts() -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let dir = target.join("test-artifacts/chat-page");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn the_chat_page_chats_approves_reopens_fits_a_phone_asks_for_the_key_and_stops_runs() {
    let Some((modules, chromium)) = deepagents_test_support::browser() else {
        return;
    };
    let (main_data, keyed_data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let root = tempfile::tempdir().unwrap();
    // Files in the agent state (the page lists them), writes waiting for approval.
    let main = Server::spawn(
        main_data.path(),
        script(),
        &[
            "--todos",
            "--backend",
            "state",
            "--interrupt-on",
            "write_file",
        ],
        &[],
    );
    // A shell that may `sleep` (a run to stop), behind an API key.
    let keyed = Server::start(
        keyed_data.path(),
        root.path(),
        script(),
        &["--api-key", "k=team"],
    );

    let check = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/web/chat_page.mjs");
    let started = Instant::now();
    let mut child = std::process::Command::new("node")
        .arg(check)
        .arg(format!("http://{}", main.address))
        .arg(format!("http://{}", keyed.address))
        .arg(artifacts())
        .env("DEEPAGENTS_TEST_WEB", modules)
        .env("DEEPAGENTS_TEST_CHROMIUM", chromium)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("node runs");
    // Read as they come, so a long report never fills a pipe and stalls the check.
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = read(Box::new(child.stdout.take().unwrap()));
    let stderr = read(Box::new(child.stderr.take().unwrap()));
    // Every wait in the check has its own timeout; this one only keeps a hung browser from
    // hanging the suite.
    let deadline = started + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (stdout, stderr) = (stdout.join().unwrap(), stderr.join().unwrap());
    eprintln!(
        "{stdout}{stderr}chat page check: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        status.success() && stdout.contains("chat page check passed"),
        "the chat page check failed:\n{stdout}\n{stderr}"
    );
}
