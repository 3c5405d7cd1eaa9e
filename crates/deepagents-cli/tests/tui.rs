//! The interactive agent in a real terminal: tmux runs the binary with the scripted model,
//! keys go in with `send-keys`, the screen comes back with `capture-pane`.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A tmux session running the TUI, killed when dropped.
struct Tui {
    name: String,
}

fn tmux(args: &[&str]) -> std::process::Output {
    std::process::Command::new("tmux")
        .args(args)
        .output()
        .unwrap()
}

fn have_tmux() -> bool {
    let ok = std::process::Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        ok || std::env::var_os("CI").is_none(),
        "tmux is not installed"
    );
    if !ok {
        eprintln!("skipped: tmux is not installed");
    }
    ok
}

impl Tui {
    fn start(data: &Path, args: &[&str]) -> Self {
        let name = deepagents_test_support::unique_name("tui");
        let mut command = format!(
            "cd {} && env -u DEEPAGENTS_MODEL -u DEEPAGENTS_CONFIG DEEPAGENTS_DATA_DIR={} HOME={} {}",
            data.display(),
            data.display(),
            data.display(),
            env!("CARGO_BIN_EXE_deepagents")
        );
        for arg in args {
            command.push(' ');
            command.push_str(&format!("'{arg}'"));
        }
        // Keep the pane after the program exits, to read what it left.
        let status = tmux(&[
            "new-session",
            "-d",
            "-s",
            &name,
            "-x",
            "100",
            "-y",
            "32",
            &command,
        ]);
        assert!(status.status.success(), "{status:?}");
        tmux(&["set-option", "-t", &name, "remain-on-exit", "on"]);
        let tui = Self { name };
        tui.wait_for("message · /help");
        tui
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &self.name]).stdout)
            .into_owned()
    }

    fn wait_for(&self, text: &str) -> String {
        let start = Instant::now();
        loop {
            let screen = self.screen();
            if screen.contains(text) {
                return screen;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "`{text}` never appeared:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", &self.name];
        args.extend_from_slice(keys);
        tmux(&args);
    }

    fn type_line(&self, text: &str) {
        tmux(&["send-keys", "-t", &self.name, "-l", text]);
        self.keys(&["Enter"]);
    }

    fn exited(&self) -> bool {
        let dead = tmux(&["display-message", "-p", "-t", &self.name, "#{pane_dead}"]);
        String::from_utf8_lossy(&dead.stdout).trim() == "1"
    }
}

impl Drop for Tui {
    fn drop(&mut self) {
        tmux(&["kill-session", "-t", &self.name]);
    }
}

fn script(dir: &Path, turns: Value) -> String {
    let path = dir.join("script.json");
    std::fs::write(&path, json!({ "turns": turns }).to_string()).unwrap();
    format!("scripted:{}", path.display())
}

#[test]
fn a_conversation_streams_queues_shows_cost_and_reopens() {
    if !have_tmux() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let model = script(
        data.path(),
        json!([
            {"text": "Hello! **Ready** to help.", "usage": {"input_tokens": 1000, "output_tokens": 10}},
            {"tool_calls": [{"id": "w", "name": "write_file", "args": {"file_path": "/notes.md", "content": "# Notes\n"}}]},
            {"text": "Wrote the notes."}
        ]),
    );
    let tui = Tui::start(
        data.path(),
        &["--model", &model, "--backend", "state", "--thread", "talk"],
    );
    tui.type_line("hi there");
    let screen = tui.wait_for("Hello! Ready to help.");
    assert!(screen.contains("› hi there"), "{screen}");
    tui.type_line("write notes");
    let screen = tui.wait_for("Wrote the notes.");
    assert!(screen.contains("✓ write_file /notes.md"), "{screen}");
    tui.type_line("/cost");
    let screen = tui.wait_for("session: $");
    assert!(screen.contains("tokens ("), "{screen}");
    tui.type_line("/context");
    tui.wait_for("context: ");
    // A title and the approval mode are kept with the thread.
    tui.type_line("/rename Release notes");
    tui.type_line("/yolo");
    tui.wait_for(" YOLO ");
    tui.type_line("/quit");
    let start = Instant::now();
    while !tui.exited() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{}",
            tui.screen()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(tui);
    // Reopened, the conversation is there.
    let again = Tui::start(
        data.path(),
        &["--model", &model, "--backend", "state", "--resume", "talk"],
    );
    let screen = again.wait_for("Wrote the notes.");
    assert!(screen.contains("› hi there"), "{screen}");
    assert!(
        screen.contains("· Release notes") && screen.contains(" YOLO "),
        "{screen}"
    );
    // /model switches for the next turn.
    let other = data.path().join("other.json");
    std::fs::write(
        &other,
        // The scripted model answers by position: three turns are already in the thread.
        json!({"turns": [{"text": "-"}, {"text": "-"}, {"text": "-"}, {"text": "The other model speaking."}]})
            .to_string(),
    )
    .unwrap();
    again.type_line(&format!("/model scripted:{}", other.display()));
    again.wait_for("the next turns use scripted:");
    again.type_line("who is there?");
    let screen = again.wait_for("The other model speaking.");
    assert!(screen.contains("other.json"), "{screen}");
    again.type_line("/agents");
    again.wait_for("general-purpose: the built-in helper");
    again.type_line("/threads");
    let screen = again.wait_for("Enter open · d delete");
    assert!(
        screen.contains("talk  20") && screen.contains("8 messages  Release notes"),
        "{screen}"
    );
}

#[test]
fn approvals_are_answered_with_a_key_and_esc_interrupts_a_long_command() {
    if !have_tmux() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let model = script(
        data.path(),
        json!([
            {"tool_calls": [{"id": "t", "name": "execute", "args": {"command": "touch approved.txt"}}]},
            {"text": "Touched it."},
            {"tool_calls": [{"id": "s", "name": "execute", "args": {"command": "sleep 30"}}]},
            {"text": "Queued one answered."}
        ]),
    );
    let skill = data.path().join(".deepagents/skills/release");
    std::fs::create_dir_all(&skill).unwrap();
    std::fs::write(
        skill.join("SKILL.md"),
        "---\nname: release\ndescription: Cut a release of the project\n---\nBump, tag, publish.\n",
    )
    .unwrap();
    let tui = Tui::start(
        data.path(),
        &[
            "--model",
            &model,
            "--backend",
            "shell",
            "--sandbox",
            "off",
            "--shell-allow",
            "sleep",
            "--root",
            ".",
            "--thread",
            "ops",
        ],
    );
    tui.type_line("touch it");
    let screen = tui.wait_for("approval needed");
    assert!(screen.contains("$ touch approved.txt"), "{screen}");
    tui.keys(&["y"]);
    tui.wait_for("Touched it.");
    assert!(data.path().join("approved.txt").exists());
    // The skills the first run loaded are listed.
    tui.type_line("/skills");
    tui.wait_for("/release: Cut a release of the project");
    // /remember adds to the project's memory.
    tui.type_line("/remember Run the tests before a release.");
    tui.wait_for("added to");
    let memory = std::fs::read_to_string(data.path().join("AGENTS.md")).unwrap();
    assert_eq!(memory, "- Run the tests before a release.\n");

    tui.type_line("now sleep");
    tui.wait_for("execute sleep 30");
    // Typed while it works: queued, sent when the turn ends.
    tui.type_line("and then this");
    tui.wait_for("1 queued");
    let started = Instant::now();
    tui.keys(&["Escape"]);
    let screen = tui.wait_for("Queued one answered.");
    assert!(started.elapsed() < Duration::from_secs(15), "{screen}");
    assert!(screen.contains("interrupted"), "{screen}");
}

#[test]
fn a_spend_cap_stops_a_turn_in_the_tui() {
    if !have_tmux() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let model = script(data.path(), json!([{"text": "never said"}]));
    let tui = Tui::start(
        data.path(),
        &[
            "--model",
            &model,
            "--backend",
            "state",
            "--max-tokens",
            "10",
        ],
    );
    tui.type_line("go");
    let screen = tui.wait_for("--max-tokens");
    assert!(screen.contains("token cap"), "{screen}");
    assert!(!screen.contains("never said"), "{screen}");
    // Ctrl-C twice leaves.
    tui.keys(&["C-c"]);
    tui.wait_for("Ctrl-C again to quit");
    tui.keys(&["C-c"]);
    let start = Instant::now();
    while !tui.exited() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{}",
            tui.screen()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_hook_s_ask_and_a_server_s_question_are_answered_in_the_tui() {
    if !have_tmux() {
        return;
    }
    let Some(python) = deepagents_test_support::mcp_python() else {
        return;
    };
    let data = tempfile::tempdir().unwrap();
    let server =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deepagents-mcp/tests/fixtures/server.py");
    let mcp = data.path().join("servers.json");
    std::fs::write(
        &mcp,
        json!({"mcpServers": {"fixture": {"command": python, "args": [server.display().to_string()]}}})
            .to_string(),
    )
    .unwrap();
    let hooks = data.path().join("hooks.json");
    std::fs::write(
        &hooks,
        json!({"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"command":
            "printf '%s' '{\"hookSpecificOutput\": {\"permissionDecision\": \"ask\", \"permissionDecisionReason\": \"touching needs a person\"}}'"}]}]}})
        .to_string(),
    )
    .unwrap();
    let model = script(
        data.path(),
        json!([
            {"tool_calls": [{"id": "t", "name": "execute", "args": {"command": "touch asked.txt"}}]},
            {"tool_calls": [{"id": "q", "name": "fixture__ask", "args": {}}]},
            {"text": "All answered."}
        ]),
    );
    let tui = Tui::start(
        data.path(),
        &[
            "--model",
            &model,
            "--backend",
            "shell",
            "--sandbox",
            "off",
            "--shell-allow",
            "touch",
            "--root",
            ".",
            "--hooks",
            &hooks.display().to_string(),
            "--mcp-config",
            &mcp.display().to_string(),
        ],
    );
    tui.type_line("go");
    let screen = tui.wait_for("A hook asks you to approve");
    assert!(screen.contains("touching needs a person"), "{screen}");
    tui.keys(&["y"]);
    let screen = tui.wait_for("The MCP server fixture asks: Who are you?");
    assert!(data.path().join("asked.txt").exists(), "{screen}");
    // The fields in the order the server's schema gives them.
    assert!(screen.contains("[1/2] name (string)"), "{screen}");
    tui.type_line("Ada");
    tui.wait_for("[2/2] age (integer)");
    tui.type_line("36");
    let screen = tui.wait_for("All answered.");
    assert!(screen.contains("hello Ada, 36"), "{screen}");
}

#[test]
fn manual_mode_asks_before_changes_auto_does_not_and_the_thread_keeps_its_mode() {
    if !have_tmux() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let model = script(
        data.path(),
        json!([
            {"tool_calls": [{"id": "a", "name": "write_file", "args": {"file_path": "/asked.md", "content": "no\n"}}]},
            {"text": "It was refused."},
            {"tool_calls": [{"id": "b", "name": "write_file", "args": {"file_path": "/free.md", "content": "yes\n"}}]},
            {"text": "Written freely.", "usage": {"input_tokens": 4000, "output_tokens": 10}}
        ]),
    );
    let args = [
        "--model",
        &model,
        "--backend",
        "filesystem",
        "--root",
        ".",
        "--thread",
        "modes",
    ];
    let tui = Tui::start(data.path(), &args);
    assert!(tui.screen().contains("· auto"), "{}", tui.screen());
    tui.type_line("/manual");
    tui.wait_for("· manual");
    tui.type_line("write it");
    let screen = tui.wait_for("approval needed");
    assert!(screen.contains("write_file"), "{screen}");
    tui.keys(&["n"]);
    tui.keys(&["Enter"]);
    tui.wait_for("It was refused.");
    assert!(!data.path().join("asked.md").exists());

    tui.type_line("/auto");
    tui.wait_for("what the sandbox contains runs");
    tui.type_line("write again");
    tui.wait_for("Written freely.");
    assert_eq!(
        std::fs::read_to_string(data.path().join("free.md")).unwrap(),
        "yes\n"
    );
    tui.type_line("/context");
    let screen = tui.wait_for("messages (");
    assert!(screen.contains("tools ("), "{screen}");
    assert!(screen.contains("context: 4,000"), "{screen}");
    tui.type_line("/manual");
    tui.wait_for("· manual");
    tui.type_line("/quit");
    let start = Instant::now();
    while !tui.exited() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{}",
            tui.screen()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(tui);
    // Reopened, the thread is in the mode it was left in.
    let tui = Tui::start(data.path(), &args);
    assert!(tui.screen().contains("· manual"), "{}", tui.screen());
}

#[test]
fn plan_mode_refuses_changes_until_the_plan_is_approved_then_they_run() {
    if !have_tmux() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let model = script(
        data.path(),
        json!([
            {"tool_calls": [{"id": "a", "name": "write_file", "args": {"file_path": "/early.md", "content": "too soon\n"}}]},
            {"text": "Plan: write /plan.md with the result."},
            {"tool_calls": [{"id": "b", "name": "write_file", "args": {"file_path": "/plan.md", "content": "done\n"}}]},
            {"text": "Carried out."}
        ]),
    );
    let args = [
        "--model",
        &model,
        "--backend",
        "filesystem",
        "--root",
        ".",
        "--thread",
        "planning",
    ];
    let tui = Tui::start(data.path(), &args);
    // Shift-Tab turns plan mode on; the status bar says so.
    tui.keys(&["BTab"]);
    let screen = tui.wait_for("PLAN");
    assert!(screen.contains("changes nothing"), "{screen}");
    tui.type_line("change things");
    tui.wait_for("Plan: write /plan.md");
    let screen = tui.wait_for("approves this plan");
    assert!(screen.contains("plan mode is on"), "{screen}");
    assert!(!data.path().join("early.md").exists());
    // Approving starts the work, with changes allowed again.
    tui.type_line("/approve");
    tui.wait_for("Carried out.");
    assert_eq!(
        std::fs::read_to_string(data.path().join("plan.md")).unwrap(),
        "done\n"
    );
    assert!(!tui.screen().contains(" PLAN "), "{}", tui.screen());
}

#[test]
fn an_async_subagent_ending_while_idle_starts_the_next_turn_in_the_tui() {
    if !have_tmux() {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let agents = data.path().join("agents");
    std::fs::create_dir(&agents).unwrap();
    std::fs::write(
        agents.join("helper.md"),
        "---\nname: helper\ndescription: Computes answers.\nasync: true\n---\nYou compute.\n",
    )
    .unwrap();
    // The helper looks around for a while, so the turn that started it has ended first.
    let mut helper: Vec<Value> = (0..30)
        .map(|_| json!({"tool_calls": [{"name": "ls", "args": {}}]}))
        .collect();
    helper.push(json!({"text": "42"}));
    let path = data.path().join("script.json");
    std::fs::write(
        &path,
        json!({
            "turns": [
                {"tool_calls": [{"name": "start_async_task", "args": {"subagent_type": "helper", "description": "compute: the answer"}}]},
                {"text": "Started in the background."},
                {"text": "The helper says 42."}
            ],
            "conversations": [{"when_task_contains": "compute:", "turns": helper}]
        })
        .to_string(),
    )
    .unwrap();
    let model = format!("scripted:{}", path.display());
    let agents = agents.display().to_string();
    let tui = Tui::start(
        data.path(),
        &["--model", &model, "--backend", "state", "--agents", &agents],
    );
    tui.type_line("go");
    tui.wait_for("Started in the background.");
    // Nobody types: the ending starts the turn.
    let screen = tui.wait_for("The helper says 42.");
    assert!(screen.contains("(helper) ended: success"), "{screen}");
}
