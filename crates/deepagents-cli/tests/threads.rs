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
    kill_loop(
        &Database::Sqlite(data.path().to_owned()),
        "sqlite",
        &Scenario::main_agent(),
        50,
    );
}

#[test]
fn sigkill_at_random_moments_never_corrupts_a_thread_on_postgres() {
    let Some(database) = postgres() else {
        return;
    };
    kill_loop(&database, &unique("pg"), &Scenario::main_agent(), 50);
}

/// Kills during subagents — one, and two in parallel — never make a finished command of a
/// subagent run again: the resumed run continues each subagent where it stopped. (Nesting
/// needs subagents with subagents of their own, which the library builds: its threads tests
/// crash nested subagents the same way.)
#[test]
fn sigkill_during_subagents_never_repeats_their_finished_commands() {
    let data = tempfile::tempdir().unwrap();
    let database = Database::Sqlite(data.path().to_owned());
    for scenario in [Scenario::subagent(), Scenario::parallel_subagents()] {
        kill_loop(&database, scenario.name, &scenario, 15);
    }
}

#[test]
fn sigkill_during_subagents_never_repeats_their_finished_commands_on_postgres() {
    let Some(database) = postgres() else {
        return;
    };
    let scenario = Scenario::parallel_subagents();
    kill_loop(&database, &unique("pg-parallel"), &scenario, 10);
}

fn postgres() -> Option<Database> {
    deepagents_test_support::postgres_url().map(Database::Postgres)
}

/// A thread-id prefix no other test run uses (the PostgreSQL database is shared).
fn unique(prefix: &str) -> String {
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// A scripted run whose shell commands each append one line to `log.txt`.
struct Scenario {
    name: &'static str,
    script: Value,
    /// The line each command writes.
    lines: Vec<String>,
    /// Whether the commands are the main agent's, so their results are in the thread.
    main_agent: bool,
    /// How long a run takes at most, to spread the kills over it.
    span_ms: u64,
    /// Commands that run at once (one per parallel subagent): a kill interrupts up to that
    /// many, since a sandboxed command dies with the process that started it.
    in_flight: usize,
}

/// Subagent turns that run `lines` one command at a time, then answer.
fn command_turns(lines: &[String], answer: &str) -> Vec<Value> {
    let mut turns: Vec<Value> = lines
        .iter()
        .map(|line| {
            json!({"text": format!("running {line}"), "tool_calls": [
                {"name": "execute", "args": {"command": format!("sleep 0.02; echo {line} >> log.txt")}}
            ]})
        })
        .collect();
    turns.push(json!({"text": answer}));
    turns
}

fn task(id: &str, description: &str) -> Value {
    json!({"id": id, "name": "task", "args": {"description": description, "subagent_type": "general-purpose"}})
}

impl Scenario {
    fn main_agent() -> Self {
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
        Self {
            name: "main",
            script: json!({"turns": turns}),
            lines: (0..steps).map(|i| i.to_string()).collect(),
            main_agent: true,
            span_ms: 400,
            in_flight: 1,
        }
    }

    fn subagent() -> Self {
        let lines: Vec<String> = (0..8).map(|i| format!("s{i}")).collect();
        Self {
            name: "one-subagent",
            script: json!({
                "turns": [
                    {"text": "delegating", "tool_calls": [task("t1", "SUBTASK: run the steps")]},
                    {"text": "all steps done"}
                ],
                "conversations": [{"when_task_contains": "SUBTASK", "turns": command_turns(&lines, "SUB-ANSWER")}]
            }),
            lines,
            main_agent: false,
            span_ms: 600,
            in_flight: 1,
        }
    }

    fn parallel_subagents() -> Self {
        let left: Vec<String> = (0..6).map(|i| format!("a{i}")).collect();
        let right: Vec<String> = (0..6).map(|i| format!("b{i}")).collect();
        let mut lines = left.clone();
        lines.extend(right.iter().cloned());
        Self {
            name: "parallel-subagents",
            script: json!({
                "turns": [
                    {"text": "delegating both", "tool_calls": [task("ta", "LEFT: run a"), task("tb", "RIGHT: run b")]},
                    {"text": "all steps done"}
                ],
                "conversations": [
                    {"when_task_contains": "LEFT", "turns": command_turns(&left, "LEFT-ANSWER")},
                    {"when_task_contains": "RIGHT", "turns": command_turns(&right, "RIGHT-ANSWER")}
                ]
            }),
            lines,
            main_agent: false,
            span_ms: 600,
            in_flight: 2,
        }
    }
}

/// Runs threads of `scenario` to the end, SIGKILLing and resuming them at random moments until
/// `wanted` kills happened, and checks each thread and its side effects.
fn kill_loop(database: &Database, prefix: &str, scenario: &Scenario, wanted: usize) {
    let work = tempfile::tempdir().unwrap();
    let model = write_script(work.path(), &scenario.script);
    let mut rng = Lcg(7);
    let mut kills = 0;
    let mut threads = 0;
    while kills < wanted {
        threads += 1;
        let thread = format!("{prefix}-crash-{threads}");
        // Each thread's commands append to the log.txt of its own workspace.
        let root = tempfile::tempdir().unwrap();
        let mut first = true;
        let mut killed_here = 0;
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
            let kill_this_one = kills < wanted && rng.next_ms(10) < 8;
            if kill_this_one {
                std::thread::sleep(Duration::from_millis(rng.next_ms(scenario.span_ms)));
                if child.try_wait().unwrap().is_none() {
                    child.kill().unwrap();
                    kills += 1;
                    killed_here += 1;
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
        let log = std::fs::read_to_string(root.path().join("log.txt")).unwrap_or_default();
        let written = count_lines(&thread, &log, &scenario.lines);
        if scenario.main_agent {
            check_side_effects(&run, &thread, &log, &written);
        } else {
            // A finished command ran once; only commands a kill interrupted may be missing.
            let missing = written.iter().filter(|&&times| times == 0).count();
            assert!(
                missing <= killed_here * scenario.in_flight,
                "{thread}: {missing} commands never ran after {killed_here} kills:\n{log}"
            );
            for call in ["t1", "ta", "tb"] {
                assert!(
                    database.load(&format!("{thread}/{call}")).is_none(),
                    "{thread}: the finished subagent of {call} left its checkpoints behind"
                );
            }
        }
    }
    assert!(kills >= wanted);
}

/// How often each of `lines` is in `log`; no line twice, no stray lines.
fn count_lines(thread: &str, log: &str, lines: &[String]) -> Vec<usize> {
    let mut written = vec![0usize; lines.len()];
    for line in log.lines() {
        let index = lines
            .iter()
            .position(|l| l == line.trim())
            .unwrap_or_else(|| panic!("{thread}: stray line {line:?} in log.txt:\n{log}"));
        written[index] += 1;
        assert!(
            written[index] == 1,
            "{thread}: the command writing {line:?} ran twice:\n{log}"
        );
    }
    written
}

/// Every command that reported success wrote its line exactly once; a command reported as
/// interrupted by a kill wrote it at most once.
fn check_side_effects(run: &deepagents::Run, thread: &str, log: &str, written: &[usize]) {
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
        if !text.starts_with("Interrupted") {
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

    // Unconfined, the command asks too (confined, it would not need to).
    let refused = tempfile::tempdir().unwrap();
    let stdout = run(refused.path(), &["--sandbox", "off"]);
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

/// The script: eight slow commands, an answer, eight more, another answer.
fn two_task_script(dir: &Path) -> String {
    let batch = |prefix: &str| -> Vec<Value> {
        (0..8)
            .map(|i| {
                json!({"text": format!("{prefix}{i}"), "tool_calls": [{"name": "execute", "args": {
                    "command": format!("sleep 0.05; echo {prefix}{i} >> log.txt")
                }}]})
            })
            .collect()
    };
    let mut turns = batch("S");
    turns.push(json!({"text": "DONE-1"}));
    turns.extend(batch("T"));
    turns.push(json!({"text": "DONE-2"}));
    write_script(dir, &json!({ "turns": turns }))
}

fn thread_run(
    database: &Database,
    model: &str,
    root: &Path,
    thread: &str,
    extra: &[&str],
) -> std::process::Command {
    let mut command = bin();
    command
        .args([
            "run",
            "--auto-approve",
            "--backend",
            "shell",
            "--model",
            model,
            "--thread",
            thread,
            "--root",
        ])
        .arg(root)
        .args(extra);
    database.configure(&mut command);
    command
}

/// Waits until the thread has its first checkpoint (the first process holds it then).
fn wait_for_thread(database: &Database, thread: &str) {
    for _ in 0..200 {
        if database.load(thread).is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("thread {thread} never started");
}

/// Starts the script on `thread` with task A and waits until it holds the thread:
/// the scratch directory (keep it alive), the model spec, the workspace and the process.
fn start_first(
    database: &Database,
    thread: &str,
) -> (
    tempfile::TempDir,
    String,
    std::path::PathBuf,
    std::process::Child,
) {
    let work = tempfile::tempdir().unwrap();
    let model = two_task_script(work.path());
    let root = work.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let first = thread_run(database, &model, &root, thread, &["task-A"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_thread(database, thread);
    (work, model, root, first)
}

/// A second process on a thread in use is refused, naming the thread and `--wait`; the first
/// finishes untouched, and the refused task can run afterwards. Nothing is lost or repeated.
fn second_process_is_refused(database: &Database, thread: &str) {
    let (_work, model, root, first) = start_first(database, thread);
    let second = thread_run(database, &model, &root, thread, &["task-B"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("thread `{thread}` is in use by another run")),
        "{stderr}"
    );
    assert!(stderr.contains("--wait"), "{stderr}");
    let first = first.wait_with_output().unwrap();
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&first.stdout).trim(), "DONE-1");
    let log = std::fs::read_to_string(root.join("log.txt")).unwrap();
    let expected: Vec<String> = (0..8).map(|i| format!("S{i}")).collect();
    assert_eq!(log.lines().collect::<Vec<_>>(), expected, "{log}");

    let again = thread_run(database, &model, &root, thread, &["task-B"])
        .output()
        .unwrap();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&again.stdout).trim(), "DONE-2");
    let run = database.load(thread).unwrap();
    let users: Vec<String> = run
        .state
        .messages
        .iter()
        .filter(|m| matches!(m, Message::User { .. }))
        .map(Message::text)
        .collect();
    assert_eq!(users, ["task-A", "task-B"]);
}

/// With `--wait` the second process waits for the first and then continues the thread: both
/// tasks run once each, in order.
fn second_process_waits(database: &Database, thread: &str) {
    let (_work, model, root, first) = start_first(database, thread);
    let second = thread_run(database, &model, &root, thread, &["--wait", "task-B"])
        .output()
        .unwrap();
    let first = first.wait_with_output().unwrap();
    assert!(first.status.success());
    assert_eq!(String::from_utf8_lossy(&first.stdout).trim(), "DONE-1");
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert!(String::from_utf8_lossy(&second.stderr).contains("waiting:"));
    assert_eq!(String::from_utf8_lossy(&second.stdout).trim(), "DONE-2");
    let log = std::fs::read_to_string(root.join("log.txt")).unwrap();
    let expected: Vec<String> = (0..8)
        .map(|i| format!("S{i}"))
        .chain((0..8).map(|i| format!("T{i}")))
        .collect();
    assert_eq!(log.lines().collect::<Vec<_>>(), expected, "{log}");
    check_consistent_answers(database, thread, &["DONE-1", "DONE-2"]);
}

/// Two resumes of a crashed run at once: one continues it, the other is refused or finds it
/// finished; no command runs twice.
fn two_resumes_of_a_crash(database: &Database, thread: &str) {
    let (_work, model, root, mut first) = start_first(database, thread);
    std::thread::sleep(Duration::from_millis(150));
    first.kill().unwrap();
    first.wait().unwrap();
    let resumes: Vec<_> = (0..2)
        .map(|_| {
            thread_run(database, &model, &root, thread, &[])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<_> = resumes
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let finished = outputs.iter().filter(|o| o.status.success()).count();
    assert!(finished >= 1, "no resume finished");
    for output in outputs.iter().filter(|o| !o.status.success()) {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("is in use by another run"), "{stderr}");
    }
    let log = std::fs::read_to_string(root.join("log.txt")).unwrap();
    let mut seen = std::collections::HashSet::new();
    for line in log.lines() {
        assert!(seen.insert(line), "{line} ran twice:\n{log}");
    }
    check_consistent_answers(database, thread, &["DONE-1"]);
}

/// Every call has one result right after its turn, and the answers are `answers`, in order.
fn check_consistent_answers(database: &Database, thread: &str, answers: &[&str]) {
    let run = database.load(thread).unwrap();
    let mut open: Vec<String> = Vec::new();
    let mut finals = Vec::new();
    for message in &run.state.messages {
        match message {
            Message::Assistant(assistant) => {
                assert!(
                    open.is_empty(),
                    "{thread}: calls {open:?} never got results"
                );
                open = assistant.tool_calls.iter().map(|c| c.id.clone()).collect();
                if assistant.tool_calls.is_empty() {
                    finals.push(message.text());
                }
            }
            Message::Tool(result) => {
                assert!(
                    open.contains(&result.tool_call_id),
                    "{thread}: stray result"
                );
                open.retain(|id| id != &result.tool_call_id);
            }
            _ => {}
        }
    }
    assert_eq!(finals, answers, "{thread}");
}

#[test]
fn two_processes_on_one_thread_are_refused_or_serialized_on_sqlite() {
    let data = tempfile::tempdir().unwrap();
    let database = Database::Sqlite(data.path().to_owned());
    second_process_is_refused(&database, "busy");
    second_process_waits(&database, "waits");
    two_resumes_of_a_crash(&database, "crashed");
}

#[test]
fn two_processes_on_one_thread_are_refused_or_serialized_on_postgres() {
    let Some(database) = postgres() else {
        return;
    };
    second_process_is_refused(&database, &unique("busy"));
    second_process_waits(&database, &unique("waits"));
    two_resumes_of_a_crash(&database, &unique("crashed"));
}

#[test]
fn thread_ids_that_cannot_be_stored_are_refused() {
    let data = tempfile::tempdir().unwrap();
    let model = write_script(data.path(), &json!({"turns": [{"text": "hi"}]}));
    for id in ["", "../../x", "a/b", "..", "has space", &"x".repeat(129)] {
        let output = bin()
            .args([
                "run",
                "--backend",
                "state",
                "--model",
                &model,
                "--thread",
                id,
                "go",
            ])
            .env("DEEPAGENTS_DATA_DIR", data.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{id:?}: {stderr}");
        assert!(stderr.contains("invalid thread id"), "{id:?}: {stderr}");
    }
    // Nothing was written for them, inside the data directory or beside it.
    let leases = std::fs::read_dir(data.path().join("store.db.threads"))
        .map(Iterator::count)
        .unwrap_or(0);
    assert_eq!(leases, 0);
    assert!(!data.path().parent().unwrap().join("x.lock").exists());
}

/// Processes that open a fresh data directory together all start: none fails with "database
/// is locked" (they used to, about one run in twenty with two processes).
#[test]
fn processes_opening_a_new_data_directory_together_all_start() {
    let work = tempfile::tempdir().unwrap();
    let model = write_script(work.path(), &json!({"turns": [{"text": "hi"}]}));
    for round in 0..8 {
        let data = work.path().join(format!("data-{round}"));
        let children: Vec<_> = (0..6)
            .map(|i| {
                bin()
                    .args(["run", "--backend", "state", "--model", &model, "--thread"])
                    .arg(format!("t{i}"))
                    .arg("go")
                    .env("DEEPAGENTS_DATA_DIR", &data)
                    .env("HOME", work.path())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for child in children {
            let output = child.wait_with_output().unwrap();
            assert!(
                output.status.success(),
                "round {round}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

/// A run closes its database: SQLite's write-ahead log is folded back, not left behind.
#[test]
fn a_run_leaves_no_write_ahead_log() {
    let data = tempfile::tempdir().unwrap();
    let model = write_script(data.path(), &json!({"turns": [{"text": "hi"}]}));
    let output = bin()
        .args([
            "run",
            "--backend",
            "state",
            "--model",
            &model,
            "--thread",
            "w",
            "go",
        ])
        .env("DEEPAGENTS_DATA_DIR", data.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(data.path().join("store.db").exists());
    let wal = std::fs::metadata(data.path().join("store.db-wal")).map_or(0, |m| m.len());
    assert_eq!(wal, 0, "the write-ahead log was left at {wal} bytes");
}

#[test]
fn a_spend_cap_stops_a_run_before_it_is_crossed_and_a_higher_cap_resumes_it() {
    let data = tempfile::tempdir().unwrap();
    let turn = |extra: Value| {
        let mut turn = json!({"usage": {"input_tokens": 1000, "output_tokens": 100}});
        turn.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        turn
    };
    let ls = |id: &str| turn(json!({"tool_calls": [{"id": id, "name": "ls", "args": {}}]}));
    let model = write_script(
        data.path(),
        &json!({"turns": [ls("a"), ls("b"), ls("c"), ls("d"), turn(json!({"text": "done"}))]}),
    );
    // $1 per million prompt tokens, $10 per million answer tokens: $0.002 a turn.
    let config = data.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[models.\"{model}\"]\nprices = {{ input = 1.0, output = 10.0 }}\n"),
    )
    .unwrap();
    let run = |cap: &str, task: Option<&str>| {
        let mut command = bin();
        command
            .args(["run", "--json", "--backend", "state", "--model", &model])
            .args(["--thread", "budget", "--max-cost", cap, "--config"])
            .arg(&config)
            .env("DEEPAGENTS_DATA_DIR", data.path());
        if let Some(task) = task {
            command.arg(task);
        }
        command.output().unwrap()
    };
    let last = |output: &std::process::Output| -> Value {
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
    };
    let stopped = run("0.0065", Some("go"));
    assert_eq!(
        stopped.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&stopped.stderr)
    );
    let error = last(&stopped);
    assert_eq!(error["type"], "error");
    assert_eq!(error["kind"], "spend_cap");
    assert!(
        error["message"]
            .as_str()
            .unwrap()
            .contains("higher cost cap"),
        "{error}"
    );
    let stderr = String::from_utf8_lossy(&stopped.stderr);
    assert!(stderr.contains("$0.0060 spent of $0.0065"), "{stderr}");
    // The terminal names the flag; the library's message does not.
    assert!(stderr.contains("(--max-cost)"), "{stderr}");

    // The same cap stops it again at once; a higher one lets it finish, nothing repeated.
    let again = run("0.0065", None);
    assert_eq!(again.status.code(), Some(3));
    let resumed = run("1", None);
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let finished = last(&resumed);
    assert_eq!(finished["type"], "final");
    assert_eq!(finished["text"], "done");
    assert_eq!(finished["steps"], 5);
    let cost = finished["spent"]["cost_usd"].as_f64().unwrap();
    assert!((cost - 0.010).abs() < 1e-9, "{finished}");
    assert_eq!(finished["total_spent"]["usage"]["output_tokens"], 500);

    let shown = bin()
        .args(["threads", "show", "budget"])
        .env("DEEPAGENTS_DATA_DIR", data.path())
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("spent: $0.0100 · 5500 tokens"), "{shown}");

    // A cost cap on a model without known prices would never stop anything: refused, with
    // the fix, before anything runs.
    let unpriced = bin()
        .args([
            "run",
            "--backend",
            "state",
            "--model",
            &model,
            "--max-cost",
            "1",
            "go",
        ])
        .env("DEEPAGENTS_DATA_DIR", data.path())
        .output()
        .unwrap();
    assert!(!unpriced.status.success());
    let said = String::from_utf8_lossy(&unpriced.stderr);
    assert!(
        said.contains("needs the model's prices") && said.contains("prices = {"),
        "{said}"
    );
    assert!(said.contains("--max-tokens"), "{said}");

    // A token cap needs no prices.
    let capped = bin()
        .args([
            "run",
            "--backend",
            "state",
            "--model",
            &model,
            "--max-tokens",
            "10",
            "go",
        ])
        .env("DEEPAGENTS_DATA_DIR", data.path())
        .output()
        .unwrap();
    assert_eq!(capped.status.code(), Some(3));
    assert!(
        String::from_utf8_lossy(&capped.stderr).contains("--max-tokens"),
        "{}",
        String::from_utf8_lossy(&capped.stderr)
    );
    // Caps and prices that make no sense are refused with the place.
    std::fs::write(&config, "[limits]\nmax_cost = 0\n").unwrap();
    let refused = bin()
        .args(["run", "--model", &model, "--config"])
        .arg(&config)
        .arg("go")
        .env("DEEPAGENTS_DATA_DIR", data.path())
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr)
            .contains("max_cost and max_tokens must be above 0"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}
