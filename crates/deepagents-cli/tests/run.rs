//! `deepagents run`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use serde_json::{Value, json};

use crate::bin;

fn demo_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/scripts/plan.json")
}

fn script(dir: &Path, turns: Value) -> String {
    let path = dir.join("script.json");
    std::fs::write(&path, json!({ "turns": turns }).to_string()).unwrap();
    format!("scripted:{}", path.display())
}

fn run(args: &[&str]) -> Output {
    bin().arg("run").args(args).output().unwrap()
}

use deepagents_test_support::{stderr, stdout};

#[test]
fn the_demo_prints_its_answer_on_stdout_and_progress_on_stderr() {
    let model = format!("scripted:{}", demo_script().display());
    let output = run(&["--todos", "--model", &model, "Plan the release"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(
        stdout(&output),
        "Release plan ready: changes collected, changelog written, tagging is the last step.\n"
    );
    let progress = stderr(&output);
    assert!(progress.contains("▸ write_todos"), "{progress}");
    assert!(progress.contains("◐ Tag and publish"), "{progress}");
}

#[test]
fn json_mode_prints_one_typed_event_per_line_ending_with_final() {
    let model = format!("scripted:{}", demo_script().display());
    let output = run(&["--json", "--todos", "--model", &model, "Plan the release"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let events: Vec<Value> = stdout(&output)
        .lines()
        .map(|line| serde_json::from_str(line).expect("each line is one JSON object"))
        .collect();
    assert!(
        events
            .iter()
            .all(|e| e["type"].is_string() && e["path"] == json!([]))
    );
    assert_eq!(events[0]["type"], "run_started");
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    for expected in [
        "model_call_started",
        "text_delta",
        "model_call_finished",
        "tool_call_started",
        "tool_call_finished",
        "state_updated",
    ] {
        assert!(types.contains(&expected), "missing {expected} in {types:?}");
    }
    let last = events.last().unwrap();
    assert_eq!(last["type"], "final");
    assert_eq!(
        last["text"],
        "Release plan ready: changes collected, changelog written, tagging is the last step."
    );
    assert_eq!(last["steps"], 3);
    assert!(last["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert!(last["usage"]["output_tokens"].as_u64().unwrap() > 0);
    assert!(stderr(&output).is_empty(), "{}", stderr(&output));
}

#[test]
fn the_task_can_come_from_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let model = script(dir.path(), json!([{"text": "read it"}]));
    let mut child = bin()
        .args(["run", "--json", "--model", &model, "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"a task from a pipe")
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output)
            .lines()
            .last()
            .unwrap()
            .contains(r#""text":"read it""#)
    );
}

#[test]
fn the_turn_limit_fails_with_one_line_on_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let turns: Vec<_> = (0..5)
        .map(|_| json!({"tool_calls": [{"name": "write_todos", "args": {"todos": []}}]}))
        .collect();
    let model = script(dir.path(), json!(turns));
    let output = run(&["--todos", "--max-turns", "2", "--model", &model, "loop"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stdout(&output).is_empty());
    let error = stderr(&output);
    let last = error.lines().last().unwrap();
    assert!(
        last.starts_with("error: the run made 2 model calls"),
        "{error}"
    );
    assert!(last.contains("--max-turns"), "{error}");
}

#[test]
fn a_model_error_in_json_mode_ends_with_an_error_event_and_a_non_zero_exit() {
    let dir = tempfile::tempdir().unwrap();
    let model = script(
        dir.path(),
        json!([{"error": {"kind": "authentication", "message": "bad key"}}]),
    );
    let output = run(&["--json", "--model", &model, "go"]);
    assert_eq!(output.status.code(), Some(1));
    let last: Value = serde_json::from_str(stdout(&output).lines().last().unwrap()).unwrap();
    assert_eq!(last["type"], "error");
    assert_eq!(last["kind"], "model");
    assert_eq!(
        stderr(&output).trim(),
        "error: model call failed: authentication failed: bad key"
    );
}

#[test]
fn unknown_or_missing_models_are_refused_up_front() {
    let output = run(&["--model", "acme:x", "go"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("unknown model provider `acme`"));

    let output = run(&["go"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("no model given"));

    let output = run(&["--model", "scripted:/no/such.json", "go"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("cannot read model script /no/such.json"));

    let output = run(&["--model", "scripted:x.json", "  "]);
    assert!(stderr(&output).contains("the task is empty"));

    let output = run(&["--max-turns", "0", "--model", "scripted:x.json", "go"]);
    assert_eq!(output.status.code(), Some(2), "clap rejects bad flags");
}

#[test]
fn the_model_can_come_from_the_environment() {
    let model = format!("scripted:{}", demo_script().display());
    let output = bin()
        .args(["run", "--todos", "Plan"])
        .env("DEEPAGENTS_MODEL", model)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
}

#[test]
fn version_prints_the_package_version() {
    let output = bin().arg("--version").output().unwrap();
    assert!(output.status.success());
    assert_eq!(
        stdout(&output).trim(),
        format!("deepagents {}", env!("CARGO_PKG_VERSION"))
    );
}

/// The CLI offers `ask_user`. With nobody at a terminal the question is declined with a note
/// the model can act on, and the run goes on to its answer; on a thread the question, like
/// any pause, waits in the thread for `--auto-approve`-less reruns to answer.
#[test]
fn ask_user_without_a_terminal_is_declined_and_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let model = script(
        dir.path(),
        json!([
            {"tool_calls": [{"id": "q", "name": "ask_user", "args": {"question": "Which colour?"}}]},
            {"text": "I picked blue."}
        ]),
    );
    let output = bin()
        .args([
            "run",
            "--json",
            "--backend",
            "state",
            "--model",
            &model,
            "paint",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let events: Vec<Value> = stdout(&output)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let asked = events
        .iter()
        .find(|e| e["type"] == "interrupted")
        .expect("the question pauses the run");
    assert_eq!(asked["actions"][0]["name"], "ask_user");
    assert_eq!(
        asked["actions"][0]["arguments"]["question"],
        "Which colour?"
    );
    let answer = events
        .iter()
        .find(|e| e["type"] == "tool_call_finished" && e["call_id"] == "q")
        .unwrap();
    assert!(
        answer["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("decide yourself"),
        "{answer}"
    );
    assert_eq!(events.last().unwrap()["text"], "I picked blue.");
}

/// `ask_user`, a Rust tool that suspends its call, asked at a terminal: the process stopped
/// while the question waits leaves it in the thread; the next process on the thread (`run
/// --thread` without a task) asks it again, and the typed answer is the call's result, after
/// which the model's next turn ends the run.
#[test]
fn a_question_left_by_a_stopped_process_is_answered_by_the_next_one_on_the_thread() {
    let tmux = |args: &[&str]| {
        std::process::Command::new("tmux")
            .args(args)
            .output()
            .unwrap()
    };
    if !std::process::Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        assert!(std::env::var_os("CI").is_none(), "tmux is not installed");
        eprintln!("skipped: tmux is not installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let model = script(
        dir.path(),
        json!([
            {"tool_calls": [{"id": "q", "name": "ask_user", "args": {"question": "Which colour for the door?"}}]},
            {"text": "Painted it blue."}
        ]),
    );
    // A process at a terminal (the question is asked only there), its stdout in `out` and
    // its exit status in `out.status`, written by the shell: tmux does not always reap a
    // pane's process in time to show its status.
    let start = |task: &str, out: &str| {
        let name = deepagents_test_support::unique_name("ask");
        let line = format!(
            "cd {dir} && env -u DEEPAGENTS_MODEL -u DEEPAGENTS_CONFIG DEEPAGENTS_DATA_DIR={dir}/data HOME={dir} {bin} run --json --backend state --model {model} --thread door {task} > {dir}/{out}; echo $? > {dir}/{out}.status",
            dir = dir.path().display(),
            bin = env!("CARGO_BIN_EXE_deepagents"),
        );
        let started = tmux(&[
            "new-session",
            "-d",
            "-s",
            &name,
            "-x",
            "120",
            "-y",
            "30",
            &line,
        ]);
        assert!(started.status.success(), "{started:?}");
        tmux(&["set-option", "-t", &name, "remain-on-exit", "on"]);
        name
    };
    let screen = |name: &str| stdout(&tmux(&["capture-pane", "-p", "-t", name]));
    let status = |out: &str| {
        std::fs::read_to_string(dir.path().join(format!("{out}.status")))
            .ok()
            .filter(|status| status.ends_with('\n'))
            .map(|status| status.trim().to_owned())
    };
    let wait = |name: &str, done: &dyn Fn() -> bool, what: &str| {
        let begun = std::time::Instant::now();
        while !done() {
            assert!(
                begun.elapsed() < std::time::Duration::from_secs(30),
                "{what} never came:\n{}",
                screen(name)
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };

    let first = start("'paint the door'", "first.jsonl");
    wait(
        &first,
        &|| screen(&first).contains("answer:"),
        "the question",
    );
    assert!(screen(&first).contains("Which colour for the door?"));
    // SIGINT (Ctrl-C) while the question waits: the process exits at once (130), the
    // question stays in the thread. Sent to the binary alone, so the shell writes its status.
    let shell = stdout(&tmux(&[
        "display-message",
        "-p",
        "-t",
        &first,
        "#{pane_pid}",
    ]));
    let shell = shell.trim();
    let children = std::fs::read_to_string(format!("/proc/{shell}/task/{shell}/children")).unwrap();
    let binary = children
        .split_whitespace()
        .next()
        .expect("the shell runs the binary");
    let sent = std::process::Command::new("kill")
        .args(["-INT", binary])
        .status()
        .unwrap();
    assert!(sent.success());
    wait(
        &first,
        &|| status("first.jsonl").is_some(),
        "the first process's exit",
    );
    assert_eq!(
        status("first.jsonl").as_deref(),
        Some("130"),
        "{}",
        screen(&first)
    );
    tmux(&["kill-session", "-t", &first]);

    let second = start("", "second.jsonl");
    wait(
        &second,
        &|| screen(&second).contains("answer:"),
        "the question again",
    );
    assert!(screen(&second).contains("Which colour for the door?"));
    tmux(&["send-keys", "-t", &second, "-l", "blue"]);
    tmux(&["send-keys", "-t", &second, "Enter"]);
    wait(
        &second,
        &|| status("second.jsonl").is_some(),
        "the second process's exit",
    );
    let shown = screen(&second);
    tmux(&["kill-session", "-t", &second]);
    assert_eq!(status("second.jsonl").as_deref(), Some("0"), "{shown}");
    let events: Vec<Value> = std::fs::read_to_string(dir.path().join("second.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let answer = events
        .iter()
        .find(|e| e["type"] == "tool_call_finished" && e["call_id"] == "q")
        .unwrap_or_else(|| panic!("no result of the question in {events:#?}"));
    assert_eq!(answer["content"][0]["text"], "blue", "{answer}");
    assert_eq!(events.last().unwrap()["text"], "Painted it blue.");
    // The model was asked once per turn: the question was not asked of it again.
    let turns = events
        .iter()
        .filter(|e| e["type"] == "model_call_started")
        .count();
    assert!(turns <= 1, "{events:#?}");
}

/// The library's errors name no flags; the CLI adds the flag that fixes them.
#[test]
fn a_missing_base_url_names_the_flag() {
    let output = bin()
        .args(["run", "--model", "openai_compatible:qwen3", "go"])
        .env_remove("OPENAI_COMPATIBLE_BASE_URL")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let error = stderr(&output);
    assert!(error.contains("needs a base URL"), "{error}");
    assert!(error.contains("--base-url URL"), "{error}");
}

#[test]
fn headless_flags_match_the_reference_terminal_agent() {
    let dir = tempfile::tempdir().unwrap();
    let model = script(dir.path(), json!([{"text": "the answer"}]));
    // -n TEXT runs headless; -q prints only the answer.
    let quiet = bin()
        .args(["-n", "a task", "-q", "--model", &model])
        .output()
        .unwrap();
    assert!(quiet.status.success(), "{}", stderr(&quiet));
    assert_eq!(stdout(&quiet), "the answer\n");
    assert_eq!(stderr(&quiet), "", "quiet means no progress");
    // --stdin reads the task.
    let mut child = bin()
        .args(["--stdin", "--model", &model])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"from stdin")
        .unwrap();
    let piped = child.wait_with_output().unwrap();
    assert!(piped.status.success(), "{}", stderr(&piped));
    assert_eq!(stdout(&piped), "the answer\n");
    // No terminal and nothing to run: it says what to do instead of hanging.
    let no_terminal = bin()
        .args(["--model", &model])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!no_terminal.status.success());
    assert!(
        stderr(&no_terminal).contains("deepagents -n TASK"),
        "{}",
        stderr(&no_terminal)
    );
    // --timeout stops a run that takes too long, with timeout(1)'s status.
    let slow = script(
        dir.path(),
        json!([
            {"tool_calls": [{"id": "s", "name": "execute", "args": {"command": "sleep 20"}}]},
            {"text": "woke"}
        ]),
    );
    let started = std::time::Instant::now();
    let timed = bin()
        .args([
            "run",
            "--backend",
            "shell",
            "--sandbox",
            "off",
            "--shell-allow",
            "sleep",
            "--timeout",
            "1",
            "--model",
            &slow,
            "--root",
        ])
        .arg(dir.path())
        .arg("sleep")
        .output()
        .unwrap();
    assert_eq!(timed.status.code(), Some(124), "{}", stderr(&timed));
    // Reported once, as the timeout it is, not also as a cancelled run.
    let errors: Vec<String> = stderr(&timed)
        .lines()
        .filter(|line| line.starts_with("error:"))
        .map(str::to_owned)
        .collect();
    assert_eq!(
        errors,
        ["error: the run timed out after 1 s (--timeout)"],
        "{}",
        stderr(&timed)
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
    // On a thread, it says the thread keeps what the run did; quiet, nothing else is said.
    let started = std::time::Instant::now();
    let thread = deepagents_test_support::unique_name("timeout");
    let timed = bin()
        .args([
            "run",
            "-q",
            "--backend",
            "shell",
            "--sandbox",
            "off",
            "--shell-allow",
            "sleep",
            "--timeout",
            "1",
            "--thread",
            &thread,
            "--model",
            &slow,
            "--root",
        ])
        .arg(dir.path())
        .arg("sleep")
        .output()
        .unwrap();
    assert_eq!(timed.status.code(), Some(124), "{}", stderr(&timed));
    let message = stderr(&timed);
    assert_eq!(
        message.matches("timed out after 1 s").count(),
        1,
        "{message}"
    );
    assert!(
        message.contains(&format!("thread `{thread}` keeps what it did")),
        "{message}"
    );
    assert!(!message.contains("cancelled"), "{message}");
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
}

/// An answer cut at the model's output limit is printed, but not passed off as whole: a
/// warning on stderr (even with -q and --json), exit status 4, and `stop_reason` in the
/// `final` event; a subagent's cut answer reaches its parent marked as cut.
#[test]
fn an_answer_cut_at_the_output_limit_is_said_to_be_cut() {
    let dir = tempfile::tempdir().unwrap();
    let model = script(
        dir.path(),
        json!([{"text": "The first half of", "stop_reason": "max_tokens"}]),
    );
    let quiet = bin()
        .args(["-n", "a task", "-q", "--model", &model])
        .output()
        .unwrap();
    assert_eq!(quiet.status.code(), Some(4), "{}", stderr(&quiet));
    assert_eq!(stdout(&quiet), "The first half of\n");
    assert!(
        stderr(&quiet).contains("cut at the model's output limit"),
        "{}",
        stderr(&quiet)
    );
    let json = bin()
        .args(["run", "--json", "--model", &model, "a task"])
        .output()
        .unwrap();
    assert_eq!(json.status.code(), Some(4));
    let last = stdout(&json)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|event| event["type"] == "final")
        .unwrap_or_else(|| panic!("no final event: {}", stdout(&json)));
    assert_eq!(last["stop_reason"], "max_tokens", "{last}");
    // A whole answer still exits 0 and says end_turn.
    let whole = script(dir.path(), json!([{"text": "All of it."}]));
    let json = bin()
        .args(["run", "--json", "--model", &whole, "a task"])
        .output()
        .unwrap();
    assert!(json.status.success());
    assert!(
        stdout(&json).contains("\"stop_reason\":\"end_turn\""),
        "{}",
        stdout(&json)
    );
    // A subagent's cut answer: the parent is told.
    let path = dir.path().join("nested.json");
    std::fs::write(
        &path,
        json!({
            "turns": [
                {"tool_calls": [{"name": "task", "args": {"subagent_type": "general-purpose", "description": "write a long report"}}]},
                {"text": "Noted."}
            ],
            "conversations": [{"when_task_contains": "long report", "turns": [
                {"text": "Half a report", "stop_reason": "max_tokens"}
            ]}]
        })
        .to_string(),
    )
    .unwrap();
    let nested = format!("scripted:{}", path.display());
    let json = bin()
        .args(["run", "--json", "--model", &nested, "delegate"])
        .output()
        .unwrap();
    let result = stdout(&json)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|event| {
            event["type"] == "tool_call_finished"
                && event["name"] == "task"
                && event["path"].as_array().is_none_or(Vec::is_empty)
        })
        .unwrap_or_else(|| panic!("no task result: {}", stdout(&json)));
    assert!(
        result
            .to_string()
            .contains("cut at the subagent's output limit"),
        "{result}"
    );
}

#[test]
fn a_plan_run_reads_but_changes_nothing_and_tells_the_model_why() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.md"), "keep\n").unwrap();
    let model = script(
        dir.path(),
        json!([
            {"tool_calls": [
                {"id": "r", "name": "read_file", "args": {"file_path": "/notes.md"}},
                {"id": "w", "name": "write_file", "args": {"file_path": "/new.md", "content": "x\n"}}
            ]},
            {"text": "Plan: add /new.md."}
        ]),
    );
    let root = dir.path().to_str().unwrap();
    let output = run(&[
        "--plan",
        "--json",
        "--model",
        &model,
        "--backend",
        "filesystem",
        "--root",
        root,
        "do it",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(!dir.path().join("new.md").exists());
    let events = stdout(&output);
    let results: Vec<Value> = events
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|e| e["type"] == "tool_call_finished")
        .collect();
    let refused = results
        .iter()
        .find(|e| e.to_string().contains("plan mode is on"))
        .unwrap_or_else(|| panic!("no refusal in {events}"));
    assert!(
        refused.to_string().contains("write_file") || refused["call_id"] == "w",
        "{refused}"
    );
    assert!(events.contains("Plan: add /new.md."), "{events}");
}

/// A receiver of OTLP exports on 127.0.0.1 (HTTP/1.1, one request a connection or more):
/// its address and the JSON bodies it got, as they come.
fn otlp_receiver() -> (String, std::sync::mpsc::Receiver<(String, Value)>) {
    use std::io::{BufRead as _, BufReader, Read as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let (sender, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let sender = sender.clone();
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let target = line
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or_default()
                        .to_owned();
                    let mut length = 0;
                    loop {
                        let mut header = String::new();
                        reader.read_line(&mut header).unwrap();
                        if header.trim().is_empty() {
                            break;
                        }
                        if let Some((name, value)) = header.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    let _ = sender.send((target, serde_json::from_slice(&body).unwrap()));
                    reader
                        .get_mut()
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                        .unwrap();
                }
            });
        }
    });
    (format!("http://{address}"), received)
}

/// With `OTEL_EXPORTER_OTLP_ENDPOINT` set, a headless run is a trace: its span, a span per
/// model call and per tool call under it, exported before the process exits.
#[test]
fn a_headless_run_exports_its_trace_when_an_otlp_endpoint_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let model = script(
        dir.path(),
        json!([
            {"tool_calls": [{"id": "c1", "name": "write_todos", "args": {"todos": [{"content": "look", "status": "in_progress"}]}}],
             "usage": {"input_tokens": 50, "output_tokens": 5}},
            {"text": "done", "usage": {"input_tokens": 70, "output_tokens": 2}}
        ]),
    );
    let (endpoint, received) = otlp_receiver();
    let output = bin()
        .args(["run", "--todos", "--model", &model, "go"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint)
        .env("OTEL_SERVICE_NAME", "headless-test")
        .env_remove("OTEL_SDK_DISABLED")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let mut spans = Vec::new();
    while let Ok((target, body)) = received.recv_timeout(std::time::Duration::from_secs(5)) {
        assert_eq!(target, "/v1/traces");
        let resource = body["resourceSpans"][0]["resource"].to_string();
        assert!(resource.contains("headless-test"), "{resource}");
        for scope in body["resourceSpans"][0]["scopeSpans"].as_array().unwrap() {
            spans.extend(scope["spans"].as_array().unwrap().iter().cloned());
        }
        if spans.len() >= 4 {
            break;
        }
    }
    let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();
    let count = |name: &str| names.iter().filter(|n| **n == name).count();
    assert_eq!(count("deepagents.run"), 1, "{names:?}");
    assert_eq!(count("deepagents.model_call"), 2, "{names:?}");
    assert_eq!(count("deepagents.tool_call"), 1, "{names:?}");
    let run = spans
        .iter()
        .find(|s| s["name"] == "deepagents.run")
        .unwrap();
    assert!(run.get("parentSpanId").is_none(), "{run}");
    assert!(
        run["attributes"].to_string().contains("deepagents.run_id"),
        "{run}"
    );
    for span in &spans {
        assert_eq!(span["traceId"], run["traceId"], "{span}");
        if span["name"] != "deepagents.run" {
            assert_eq!(span["parentSpanId"], run["spanId"], "{span}");
        }
    }
}
