//! Threads: continuing conversations, listing them, and surviving SIGKILL at any moment.

use std::path::Path;
use std::time::Duration;

use deepagents::backends::SqliteStore;
use deepagents::{Checkpointer, Message};
use serde_json::{Value, json};

use crate::bin;

fn write_script(dir: &Path, script: &Value) -> String {
    let path = dir.join("script.json");
    std::fs::write(&path, script.to_string()).unwrap();
    format!("scripted:{}", path.display())
}

#[test]
fn a_thread_continues_across_processes_and_can_be_listed_shown_and_deleted() {
    let data = tempfile::tempdir().unwrap();
    let model = write_script(
        data.path(),
        &json!({"turns": [
            {"tool_calls": [{"name": "write_file", "args": {"file_path": "/note.txt", "content": "hi\n"}}]},
            {"text": "first done"},
            {"tool_calls": [{"name": "read_file", "args": {"file_path": "/note.txt"}}]},
            {"text": "second done"}
        ]}),
    );
    let run = |task: Option<&str>| {
        let mut command = bin();
        command
            .args([
                "run",
                "--backend",
                "state",
                "--model",
                &model,
                "--thread",
                "chat",
            ])
            .env("DEEPAGENTS_DATA_DIR", data.path());
        if let Some(task) = task {
            command.arg(task);
        }
        command.output().unwrap()
    };
    let first = run(Some("write a note"));
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&first.stdout).trim(), "first done");
    let second = run(Some("read it back"));
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&second.stdout).trim(),
        "second done"
    );

    let threads = |args: &[&str]| {
        bin()
            .arg("threads")
            .args(args)
            .env("DEEPAGENTS_DATA_DIR", data.path())
            .output()
            .unwrap()
    };
    let list = threads(&["list"]);
    assert!(String::from_utf8_lossy(&list.stdout).starts_with("chat\t"));
    let show = String::from_utf8(threads(&["show", "chat"]).stdout).unwrap();
    assert!(show.contains("user: write a note"), "{show}");
    assert!(show.contains("user: read it back"), "{show}");
    assert!(
        show.contains("tool:      1\thi"),
        "the state file survived the restart: {show}"
    );
    assert!(threads(&["delete", "chat"]).status.success());
    assert_eq!(threads(&["show", "chat"]).status.code(), Some(1));
    let resume_missing = run(None);
    assert_eq!(resume_missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&resume_missing.stderr).contains("does not exist yet"));
}

/// A tiny deterministic generator for kill delays.
struct Lcg(u64);

impl Lcg {
    fn next_ms(&mut self, max: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % max
    }
}

/// Where the CLI keeps its threads for a kill loop.
#[derive(Clone)]
enum Database {
    Sqlite(std::path::PathBuf),
    Postgres(String),
}

impl Database {
    fn configure(&self, command: &mut std::process::Command) {
        match self {
            Self::Sqlite(dir) => {
                command.env("DEEPAGENTS_DATA_DIR", dir);
            }
            Self::Postgres(url) => {
                command.env("DEEPAGENTS_DATABASE_URL", url);
            }
        }
    }

    fn load(&self, thread: &str) -> Option<deepagents::Run> {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            match self {
                Self::Sqlite(dir) => {
                    let store = SqliteStore::open(dir.join("store.db")).await.unwrap();
                    store.checkpointer().load(thread, None).await.unwrap()
                }
                Self::Postgres(url) => {
                    let store = deepagents::backends::PostgresStore::connect(url)
                        .await
                        .unwrap();
                    store.checkpointer().load(thread, None).await.unwrap()
                }
            }
        })
    }
}

#[test]
fn sigkill_at_random_moments_never_corrupts_a_thread_on_sqlite() {
    let data = tempfile::tempdir().unwrap();
    kill_loop(&Database::Sqlite(data.path().to_owned()), "sqlite");
}

#[test]
fn sigkill_at_random_moments_never_corrupts_a_thread_on_postgres() {
    let Ok(url) = std::env::var("DEEPAGENTS_TEST_POSTGRES_URL") else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI must provide PostgreSQL (DEEPAGENTS_TEST_POSTGRES_URL); see .ci/run"
        );
        eprintln!("skipped: no PostgreSQL (set DEEPAGENTS_TEST_POSTGRES_URL)");
        return;
    };
    let unique = format!(
        "pg-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    );
    kill_loop(&Database::Postgres(url), &unique);
}

fn kill_loop(database: &Database, prefix: &str) {
    let work = tempfile::tempdir().unwrap();
    let steps = 12;
    let mut turns: Vec<Value> = (0..steps)
        .map(|i| {
            json!({"text": format!("step {i}"), "tool_calls": [
                {"id": format!("x{i}"), "name": "execute", "args": {"command": format!("sleep 0.02; echo {i} >> log.txt")}},
                {"id": format!("l{i}"), "name": "ls", "args": {}}
            ]})
        })
        .collect();
    turns.push(json!({"text": "all steps done"}));
    let model = write_script(work.path(), &json!({"turns": turns}));
    let mut rng = Lcg(7);
    let mut kills = 0;
    let mut threads = 0;
    while kills < 50 {
        threads += 1;
        let thread = format!("{prefix}-crash-{threads}");
        // Each thread's commands append to the log.txt of its own workspace.
        let root = tempfile::tempdir().unwrap();
        let mut first = true;
        loop {
            let mut command = bin();
            command
                .args([
                    "run",
                    "--json",
                    "--auto-approve",
                    "--backend",
                    "shell",
                    "--model",
                    &model,
                    "--thread",
                    &thread,
                    "--root",
                ])
                .arg(root.path())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped());
            database.configure(&mut command);
            if first {
                command.arg("work through the steps");
            }
            let mut child = command.spawn().unwrap();
            let kill_this_one = kills < 50 && rng.next_ms(10) < 8;
            if kill_this_one {
                std::thread::sleep(Duration::from_millis(rng.next_ms(400)));
                if child.try_wait().unwrap().is_none() {
                    child.kill().unwrap();
                    kills += 1;
                }
                let _ = child.wait();
                // A kill before the first checkpoint leaves no thread; start it again.
                first = first && database.load(&thread).is_none();
                continue;
            }
            let output = child.wait_with_output().unwrap();
            assert!(
                output.status.success(),
                "resume of {thread} failed: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            break;
        }
        let run = check_consistent(database, &thread);
        check_side_effects(&run, &thread, &root.path().join("log.txt"), steps);
    }
    assert!(kills >= 50);
}

/// Every command that reported success wrote its line exactly once; a command reported as
/// interrupted by a kill wrote it at most once; no command ran twice.
fn check_side_effects(run: &deepagents::Run, thread: &str, log: &Path, steps: usize) {
    let log = std::fs::read_to_string(log).unwrap_or_default();
    let mut written = vec![0usize; steps];
    for line in log.lines() {
        let step: usize = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{thread}: stray line {line:?} in log.txt:\n{log}"));
        assert!(step < steps, "{thread}: stray line {line:?} in log.txt");
        written[step] += 1;
    }
    for (step, times) in written.iter().enumerate() {
        let id = format!("x{step}");
        let results: Vec<&deepagents::ToolResult> = run
            .state
            .messages
            .iter()
            .filter_map(|m| match m {
                Message::Tool(result) if result.tool_call_id == id => Some(result),
                _ => None,
            })
            .collect();
        assert_eq!(results.len(), 1, "{thread}: call {id} has one result");
        let text = Message::Tool(results[0].clone()).text();
        if text.starts_with("Interrupted") {
            assert!(
                *times <= 1,
                "{thread}: interrupted step {step} wrote {times} lines:\n{log}"
            );
        } else {
            assert_eq!(
                results[0].status,
                deepagents::ToolStatus::Ok,
                "{thread}: {id}: {text}"
            );
            assert!(text.contains("[Exit code 0]"), "{thread}: {id}: {text}");
            assert_eq!(
                *times, 1,
                "{thread}: step {step} succeeded, so its line is in log.txt exactly once:\n{log}"
            );
        }
    }
}

/// Every tool call has exactly one result, results follow their call, and the run ended.
fn check_consistent(database: &Database, thread: &str) -> deepagents::Run {
    let run = database.load(thread).unwrap();
    let messages = &run.state.messages;
    let mut open: Vec<String> = Vec::new();
    let mut answered = std::collections::HashSet::new();
    for message in messages {
        match message {
            Message::Assistant(assistant) => {
                assert!(
                    open.is_empty(),
                    "{thread}: calls {open:?} never got results"
                );
                open = assistant.tool_calls.iter().map(|c| c.id.clone()).collect();
            }
            Message::Tool(result) => {
                assert!(
                    open.contains(&result.tool_call_id),
                    "{thread}: stray result {}",
                    result.tool_call_id
                );
                assert!(
                    answered.insert(result.tool_call_id.clone()),
                    "{thread}: {} answered twice",
                    result.tool_call_id
                );
                open.retain(|id| id != &result.tool_call_id);
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "{thread}: unanswered calls {open:?}");
    assert_eq!(
        messages.last().unwrap().text(),
        "all steps done",
        "{thread} did not finish"
    );
    run
}

/// `--auto-approve` approves every pause, not only shell commands: calls held by permission
/// rules in `interrupt` mode run too, with and without a thread; without the flag a
/// non-interactive run refuses them.
#[test]
fn auto_approve_approves_permission_rule_interrupts_too() {
    let data = tempfile::tempdir().unwrap();
    let model = write_script(
        data.path(),
        &json!({"turns": [
            {"tool_calls": [
                {"id": "w", "name": "write_file", "args": {"file_path": "/guarded/plan.md", "content": "v1\n"}},
                {"id": "x", "name": "execute", "args": {"command": "echo ran > ran.txt"}}
            ]},
            {"text": "done"}
        ]}),
    );
    let rules = data.path().join("rules.toml");
    std::fs::write(
        &rules,
        "[[rules]]\noperations = [\"write\"]\npaths = [\"/guarded/**\"]\nmode = \"interrupt\"\n",
    )
    .unwrap();
    let run = |root: &Path, extra: &[&str]| {
        let output = bin()
            .args(["run", "--json", "--backend", "shell", "--model", &model])
            .arg("--permissions")
            .arg(&rules)
            .arg("--root")
            .arg(root)
            .args(extra)
            .arg("go")
            .env("DEEPAGENTS_DATA_DIR", data.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8(output.stdout).unwrap();
        assert!(
            output.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let last: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert_eq!(last["type"], "final", "{stdout}");
        assert_eq!(last["text"], "done", "{stdout}");
        stdout
    };

    let refused = tempfile::tempdir().unwrap();
    let stdout = run(refused.path(), &[]);
    assert!(stdout.contains("nobody can approve it here"), "{stdout}");
    assert!(!refused.path().join("guarded/plan.md").exists());
    assert!(!refused.path().join("ran.txt").exists());

    for extra in [
        &["--auto-approve"][..],
        &["--auto-approve", "--thread", "auto"],
    ] {
        let root = tempfile::tempdir().unwrap();
        let stdout = run(root.path(), extra);
        assert!(!stdout.contains("nobody can approve it here"), "{stdout}");
        assert_eq!(
            std::fs::read_to_string(root.path().join("guarded/plan.md")).unwrap(),
            "v1\n",
            "{extra:?}: the held write ran"
        );
        assert!(root.path().join("ran.txt").exists(), "{extra:?}: {stdout}");
    }
    let stored = Database::Sqlite(data.path().to_owned())
        .load("auto")
        .unwrap();
    let results: Vec<_> = stored
        .state
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool(result) => Some(result),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 2, "each call answered once in the thread");
    assert!(
        results
            .iter()
            .all(|r| r.status == deepagents::ToolStatus::Ok),
        "{results:?}"
    );
}
