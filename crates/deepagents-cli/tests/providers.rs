//! `deepagents run` against real wire formats served by the third-party mock servers: a
//! multi-step tool-calling task per provider API, keys from the environment, `--base-url`,
//! `--record` and `replay:`.

use std::process::Output;

use serde_json::{Value, json};

#[path = "../../deepagents-models/tests/mock_servers.rs"]
mod mock_servers;

use mock_servers::{MockServer, aimock, llmock};

const KEY: &str = "sk-cli-test-secret-0123456789";

fn run(args: &[&str]) -> Output {
    run_with_env(args, &[])
}

fn run_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = super::bin();
    command
        .env("OPENAI_API_KEY", KEY)
        .env("ANTHROPIC_API_KEY", KEY)
        .env("GOOGLE_API_KEY", KEY)
        .env_remove("OPENAI_BASE_URL")
        .env_remove("GOOGLE_GEMINI_BASE_URL")
        .env_remove("GEMINI_BASE_URL")
        .env_remove("ANTHROPIC_BASE_URL")
        .envs(env.iter().copied());
    command.arg("run").args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Each provider API with where llmock serves it.
const SPECS: [(&str, &str); 4] = [
    ("openai:gpt-4o", "/v1"),
    ("openai_chat:gpt-4o", "/v1"),
    ("anthropic:claude-sonnet-4-5", "/anthropic"),
    ("google_genai:gemini-2.5-flash", "/gemini"),
];

fn plan(statuses: [&str; 2]) -> Value {
    json!({"todos": [
        {"content": "Collect the changes", "status": statuses[0]},
        {"content": "Write the changelog", "status": statuses[1]},
    ]})
}

const FINAL: &str = "Release plan ready.";

fn assert_finished(output: &Output, spec: &str) {
    assert!(
        output.status.success(),
        "{spec}: {}\n{}",
        text(&output.stderr),
        text(&output.stdout)
    );
    assert_eq!(text(&output.stdout), format!("{FINAL}\n"), "{spec}");
    let progress = text(&output.stderr);
    assert!(progress.contains("▸ write_todos"), "{spec}: {progress}");
    assert!(
        progress.contains("Write the changelog"),
        "{spec}: {progress}"
    );
}

#[test]
fn a_multi_step_tool_task_completes_against_llmock() {
    let Some(server) = llmock() else { return };
    for (spec, path) in SPECS {
        server.post("/_llmock/reset", &json!({}));
        server.post(
            "/_llmock/scenario",
            &json!({"behaviors": [
                {"type": "reply", "text": "Planning first.", "tool_calls": [{"name": "write_todos", "arguments": plan(["in_progress", "pending"])}]},
                {"type": "reply", "tool_calls": [{"name": "write_todos", "arguments": plan(["completed", "in_progress"])}]},
                {"type": "reply", "text": FINAL},
            ]}),
        );
        // The base URL comes from the flag, or for Anthropic from its environment variable.
        let base = server.url(path);
        let output = if spec.starts_with("anthropic") {
            run_with_env(
                &["--todos", "--model", spec, "Plan the release"],
                &[("ANTHROPIC_BASE_URL", &base)],
            )
        } else {
            run(&[
                "--todos",
                "--model",
                spec,
                "--base-url",
                &base,
                "Plan the release",
            ])
        };
        assert_finished(&output, spec);
        let journal = server.get("/_llmock/requests");
        let requests = journal["requests"].as_array().unwrap();
        assert_eq!(requests.len(), 3, "{spec}: one request per step");
        assert!(
            requests[2]["body"].to_string().contains("Plan updated"),
            "{spec}: the tool result went back: {}",
            requests[2]["body"]
        );
    }
}

/// Steps are told apart by the id of the tool result that ends the request: stateless, and
/// independent of how each API splits an assistant turn into items.
fn aimock_fixtures() -> Value {
    json!({"fixtures": [
        {"match": {"userMessage": "Plan the release", "hasToolResult": false},
         "response": {"content": "Planning first.", "toolCalls": [{"id": "call_p1", "name": "write_todos", "arguments": plan(["in_progress", "pending"]).to_string()}]}},
        {"match": {"toolCallId": "call_p1"},
         "response": {"toolCalls": [{"id": "call_p2", "name": "write_todos", "arguments": plan(["completed", "in_progress"]).to_string()}]}},
        {"match": {"toolCallId": "call_p2"},
         "response": {"content": FINAL}},
    ]})
}

#[test]
fn a_multi_step_tool_task_completes_against_aimock() {
    let Some(server) = aimock(&aimock_fixtures()) else {
        return;
    };
    for (spec, _) in SPECS {
        let output = run(&[
            "--todos",
            "--model",
            spec,
            "--base-url",
            &server.url(if spec.starts_with("openai") {
                "/v1"
            } else {
                ""
            }),
            "Plan the release",
        ]);
        assert_finished(&output, spec);
    }
    // The server journals a streamed request once its response is done, which can be just
    // after the client has what it needs; give it a moment.
    let mut count = 0;
    for _ in 0..50 {
        count = server.get("/__aimock/journal").as_array().unwrap().len();
        if count >= 12 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(count, 12, "three steps per provider");
}

#[test]
fn a_missing_key_names_the_variable() {
    let output = super::bin()
        .env_remove("ANTHROPIC_API_KEY")
        .args(["run", "--model", "anthropic:claude-sonnet-4-5", "hi"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("ANTHROPIC_API_KEY"), "{stderr}");
}

fn record_session(server: &MockServer, cassette: &str) {
    server.post("/_llmock/reset", &json!({}));
    server.post(
        "/_llmock/scenario",
        &json!({"behaviors": [
            {"type": "fail", "status": 503, "retry_after": 0},
            {"type": "reply", "text": "Planning.", "tool_calls": [{"name": "write_todos", "arguments": plan(["in_progress", "pending"])}]},
            {"type": "reply", "text": FINAL},
        ]}),
    );
    let output = run(&[
        "--todos",
        "--model",
        "anthropic:claude-sonnet-4-5",
        "--base-url",
        &server.url("/anthropic"),
        "--record",
        cassette,
        "Plan the release",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
}

#[test]
fn a_recorded_session_replays_offline_and_a_changed_request_fails_with_a_diff() {
    let Some(server) = llmock() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cassette = dir.path().join("session.json");
    let cassette = cassette.to_str().unwrap();
    record_session(&server, cassette);
    drop(server);

    let recorded = std::fs::read_to_string(cassette).unwrap();
    assert!(!recorded.contains(KEY), "the key was written: {recorded}");
    let parsed: Value = serde_json::from_str(&recorded).unwrap();
    assert_eq!(
        parsed["exchanges"].as_array().unwrap().len(),
        3,
        "the 503 too"
    );

    // The server is gone: the replay needs no network and no key.
    let replay = format!("replay:{cassette}");
    let output = super::bin()
        .env_remove("ANTHROPIC_API_KEY")
        .args(["run", "--todos", "--model", &replay, "Plan the release"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), format!("{FINAL}\n"));

    let output = super::bin()
        .args(["run", "--todos", "--model", &replay, "Plan the launch"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("differs from cassette"), "{stderr}");
    assert!(
        stderr.contains("-") && stderr.contains("Plan the release"),
        "{stderr}"
    );
    assert!(
        stderr.contains("+") && stderr.contains("Plan the launch"),
        "{stderr}"
    );
}
