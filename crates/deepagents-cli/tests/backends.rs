//! `deepagents run` on each backend, with permissions.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{Value, json};

use crate::bin;
use crate::stub::stub;

fn demo_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/scripts/demo.json")
}

fn script(dir: &Path, turns: Value) -> String {
    let path = dir.join("script.json");
    std::fs::write(&path, json!({ "turns": turns }).to_string()).unwrap();
    format!("scripted:{}", path.display())
}

fn final_line(output: &Output) -> Value {
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

use deepagents_test_support::stderr;

#[test]
fn the_demo_on_the_state_backend_lists_the_files_it_left() {
    let model = format!("scripted:{}", demo_script().display());
    let output = bin()
        .args([
            "run",
            "--json",
            "--todos",
            "--backend",
            "state",
            "--model",
            &model,
            "Prepare",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let last = final_line(&output);
    assert_eq!(last["type"], "final");
    // The files live only in the run, so the final line carries them whole.
    let files = last["files"].as_object().unwrap();
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        ["/notes/changes.md", "/notes/release.md"]
    );
    for file in files.values() {
        assert_eq!(file["encoding"], "text", "{file}");
        assert!(!file["text"].as_str().unwrap().is_empty(), "{file}");
    }
    let stdout = String::from_utf8(output.stdout).unwrap();
    // Every tool of the demo succeeded.
    for line in stdout.lines() {
        let event: Value = serde_json::from_str(line).unwrap();
        if event["type"] == "tool_call_finished" {
            assert_eq!(event["status"], "ok", "{event}");
        }
    }
}

#[test]
fn the_demo_on_the_filesystem_backend_writes_real_files_under_root() {
    let root = tempfile::tempdir().unwrap();
    let model = format!("scripted:{}", demo_script().display());
    let output = bin()
        .args(["run", "--todos", "--model", &model, "Prepare"])
        .current_dir(root.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let notes = std::fs::read_to_string(root.path().join("notes/release.md")).unwrap();
    assert!(notes.contains("Status: ready"), "{notes}");
    // --root wins over the current directory.
    let other = tempfile::tempdir().unwrap();
    let output = bin()
        .args(["run", "--todos", "--model", &model, "--root"])
        .arg(other.path())
        .arg("Prepare")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(other.path().join("notes/changes.md").exists());
}

#[test]
fn the_shell_backend_offers_execute_in_root() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("marker.txt"), "here").unwrap();
    let model = script(
        root.path(),
        json!([
            {"tool_calls": [{"name": "execute", "args": {"command": "cat marker.txt; exit 3"}}]},
            {"text": "ran"}
        ]),
    );
    // Unconfined, not interactive and not auto-approved: the command is refused, and the
    // model is told.
    let refused = bin()
        .args([
            "run",
            "--json",
            "--backend",
            "shell",
            "--sandbox",
            "off",
            "--model",
            &model,
            "--root",
        ])
        .arg(root.path())
        .arg("go")
        .output()
        .unwrap();
    assert!(refused.status.success(), "{}", stderr(&refused));
    let refused = String::from_utf8(refused.stdout).unwrap();
    assert!(refused.contains(r#""type":"interrupted""#), "{refused}");
    assert!(refused.contains("nobody can approve it here"), "{refused}");

    let output = bin()
        .args([
            "run",
            "--json",
            "--auto-approve",
            "--backend",
            "shell",
            "--model",
            &model,
        ])
        .arg("--root")
        .arg(root.path())
        .arg("go")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let finished: Value = stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["type"] == "tool_call_finished")
        .unwrap();
    let text = finished["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with("here"), "{text}");
    assert!(text.ends_with("[Exit code 3]"), "{text}");

    // Confined (the default), it runs without an approval.
    let confined = bin()
        .args([
            "run",
            "--json",
            "--backend",
            "shell",
            "--model",
            &model,
            "--root",
        ])
        .arg(root.path())
        .arg("go")
        .output()
        .unwrap();
    assert!(confined.status.success(), "{}", stderr(&confined));
    let confined_err = stderr(&confined);
    let confined_out = String::from_utf8(confined.stdout).unwrap();
    assert!(
        !confined_out.contains(r#""type":"interrupted""#),
        "{confined_out}"
    );
    assert!(confined_out.contains("[Exit code 3]"), "{confined_out}");
    assert!(
        confined_err.contains("sandbox: workspace-write"),
        "{confined_err}"
    );

    // Without the shell backend, execute is not offered.
    let output = bin()
        .args(["run", "--json", "--model", &model, "--root"])
        .arg(root.path())
        .arg("go")
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("Unknown tool `execute`"), "{stdout}");
}

#[test]
fn permission_files_are_enforced_and_checked() {
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("secrets")).unwrap();
    std::fs::write(root.path().join("secrets/key.txt"), "hunter2").unwrap();
    let rules = root.path().join("rules.toml");
    std::fs::write(
        &rules,
        "[[rules]]\noperations = [\"read\", \"write\"]\npaths = [\"/secrets/**\"]\nmode = \"deny\"\n",
    )
    .unwrap();
    let model = script(
        root.path(),
        json!([
            {"tool_calls": [{"name": "read_file", "args": {"file_path": "/secrets/key.txt"}}]},
            {"text": "refused"}
        ]),
    );
    let output = bin()
        .args(["run", "--json", "--model", &model, "--permissions"])
        .arg(&rules)
        .arg("--root")
        .arg(root.path())
        .arg("go")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains("permission denied for /secrets/key.txt"),
        "{stdout}"
    );
    assert!(!stdout.contains("hunter2"));

    std::fs::write(
        &rules,
        "[[rules]]\noperations = [\"read\"]\npaths = [\"relative\"]\nmode = \"deny\"\n",
    )
    .unwrap();
    let output = bin()
        .args(["run", "--model", &model, "--permissions"])
        .arg(&rules)
        .arg("go")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("must be absolute"),
        "{}",
        stderr(&output)
    );

    std::fs::write(&rules, "[[rules]]\nmode = \"maybe\"\n").unwrap();
    let output = bin()
        .args(["run", "--model", &model, "--permissions"])
        .arg(&rules)
        .arg("go")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("permissions file"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_missing_root_is_a_clear_error() {
    let model = format!("scripted:{}", demo_script().display());
    let output = bin()
        .args([
            "run",
            "--model",
            &model,
            "--root",
            "/definitely/not/here",
            "go",
        ])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("/definitely/not/here"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn user_and_extra_skill_directories_are_mounted_for_the_file_tools() {
    let home = tempfile::tempdir().unwrap();
    let user = home.path().join(".deepagents/agent");
    std::fs::create_dir_all(user.join("skills/deploy")).unwrap();
    std::fs::write(user.join("AGENTS.md"), "Prefer small commits.\n").unwrap();
    std::fs::write(
        user.join("skills/deploy/SKILL.md"),
        "---\nname: deploy\ndescription: Deploy safely.\n---\nSteps.\n",
    )
    .unwrap();
    let extra = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(extra.path().join("review")).unwrap();
    std::fs::write(
        extra.path().join("review/SKILL.md"),
        "---\nname: review\ndescription: Review diffs.\n---\nLook for bugs.\n",
    )
    .unwrap();
    let root = tempfile::tempdir().unwrap();
    let model = script(
        root.path(),
        json!([
            {"tool_calls": [
                {"name": "read_file", "args": {"file_path": "/.deepagents-user/AGENTS.md"}},
                {"name": "read_file", "args": {"file_path": "/.skills-1/review/SKILL.md", "offset": 4}}
            ]},
            {"text": "done"}
        ]),
    );
    let output = bin()
        .args([
            "run",
            "--json",
            "--model",
            &model,
            "--max-input-tokens",
            "50000",
            "--skills",
        ])
        .arg(extra.path())
        .arg("--root")
        .arg(root.path())
        .arg("go")
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("Prefer small commits."), "{stdout}");
    assert!(stdout.contains("Look for bugs."), "{stdout}");
}

#[test]
fn a_run_that_writes_no_memory_opens_no_database() {
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let model = script(
        dir.path(),
        json!([
            {"tool_calls": [{"name": "ls", "args": {"path": "/memories"}}]},
            {"text": "nothing there"}
        ]),
    );
    let output = bin()
        .args(["run", "--backend", "state", "--model", &model, "look"])
        .env("DEEPAGENTS_DATA_DIR", data.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    // Reading memory (AGENTS.md at the start, the listing) found nothing and created nothing.
    assert!(!data.path().join("store.db").exists());
}

#[test]
fn long_term_memory_persists_across_runs() {
    let data = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let first = script(
        dir.path(),
        json!([
            {"tool_calls": [{"name": "write_file", "args": {"file_path": "/memories/AGENTS.md", "content": "The user likes haiku.\n"}}]},
            {"text": "remembered"}
        ]),
    );
    let output = bin()
        .args([
            "run",
            "--json",
            "--backend",
            "state",
            "--model",
            &first,
            "remember",
        ])
        .env("DEEPAGENTS_DATA_DIR", data.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        final_line(&output).get("files").is_none(),
        "memories live in the store, not the run"
    );
    assert!(data.path().join("store.db").exists());

    let second = script(
        dir.path(),
        json!([
            {"tool_calls": [{"name": "read_file", "args": {"file_path": "/memories/AGENTS.md"}}]},
            {"text": "recalled"}
        ]),
    );
    let output = bin()
        .args([
            "run",
            "--json",
            "--backend",
            "state",
            "--model",
            &second,
            "recall",
        ])
        .env("DEEPAGENTS_DATA_DIR", data.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(stdout.contains("The user likes haiku."), "{stdout}");
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn skill(name: &str, description: &str) -> String {
    format!("---\nname: {name}\ndescription: {description}\n---\nSteps.\n")
}

#[test]
fn workspace_memory_and_skills_reach_the_system_prompt_with_later_sources_winning() {
    let home = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let root_path = root.path();
    write(
        &root_path.join(".deepagents/AGENTS.md"),
        "Project memory: run cargo fmt.\n",
    );
    write(
        &root_path.join("AGENTS.md"),
        "Root memory: be brief.<!-- not for the model -->\n",
    );
    write(
        &root_path.join(".deepagents/skills/deploy/SKILL.md"),
        &skill("deploy", "The old way to deploy."),
    );
    // A Claude skill naming the tools it uses: the harness's own (`Write`, `Bash`) are
    // offered anyway, so it brings none and nothing is withheld.
    write(
        &root_path.join(".deepagents/skills/lint/SKILL.md"),
        "---\nname: lint\ndescription: Lint the code.\nallowed-tools: Read, Write, Bash(cargo clippy:*)\n---\nRun clippy.\n",
    );
    write(
        &root_path.join(".agents/skills/deploy/SKILL.md"),
        &skill("deploy", "Deploy with the release script."),
    );
    write(
        &root_path.join(".agents/skills/odd/SKILL.md"),
        &skill("Odd_Name", "Listed despite its name."),
    );
    let server = stub("done", 200);
    let output = bin()
        .args([
            "run",
            "--model",
            "openai_chat:gpt-4o",
            "--base-url",
            &server.url,
        ])
        .arg("--root")
        .arg(root_path)
        .arg("go")
        .env("OPENAI_API_KEY", "sk-test")
        .env("HOME", home.path())
        .env("DEEPAGENTS_DATA_DIR", home.path().join("data"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(String::from_utf8(output.stdout.clone()).unwrap(), "done\n");

    let bodies = server.bodies.lock().unwrap();
    assert_eq!(bodies.len(), 1);
    let system = &bodies[0]["messages"][0];
    assert_eq!(system["role"], "system");
    let prompt = system["content"].as_str().unwrap();
    // Memory: the project's file, then the root's, last in the prompt and without comments.
    let project = prompt
        .find("### /.deepagents/AGENTS.md\nProject memory: run cargo fmt.")
        .unwrap_or_else(|| panic!("{prompt}"));
    let root_memory = prompt
        .find("### /AGENTS.md\nRoot memory: be brief.")
        .unwrap_or_else(|| panic!("{prompt}"));
    assert!(project < root_memory);
    assert!(!prompt.contains("not for the model"));
    // Skills: both directories, `.agents/skills` overriding `.deepagents/skills` by name.
    let skills = &prompt[prompt.find("## Skills").unwrap()..prompt.find("## Memory").unwrap()];
    assert!(
        skills.contains(
            "- deploy: Deploy with the release script. (/.agents/skills/deploy/SKILL.md)"
        ),
        "{skills}"
    );
    assert!(!skills.contains("The old way"), "{skills}");
    assert!(
        skills.contains("- lint: Lint the code. (/.deepagents/skills/lint/SKILL.md)\n"),
        "{skills}"
    );
    let tools: Vec<&str> = bodies[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        tools.contains(&"write_file") && tools.contains(&"read_file"),
        "{tools:?}"
    );
    // A skill breaking the naming rules is listed, and the user is told on stderr.
    assert!(
        skills.contains("- Odd_Name: Listed despite its name."),
        "{skills}"
    );
    let progress = stderr(&output);
    let warning = progress
        .lines()
        .find(|l| l.contains("⚠ skill `Odd_Name`") && l.contains("[name_format]"))
        .unwrap_or_else(|| panic!("{progress}"));
    assert!(
        warning.contains("/.agents/skills/odd/SKILL.md"),
        "{warning}"
    );
    assert!(
        progress.contains("[name_mismatch]"),
        "the folder differs too: {progress}"
    );
}

/// Eight reads of a file, then an answer; the summarizer gets its own turn.
pub(crate) fn reading_script(dir: &Path) -> String {
    let mut turns: Vec<Value> = (0..8)
        .map(|i| json!({"text": format!("reading {i}"), "tool_calls": [{"id": format!("r{i}"), "name": "read_file", "args": {"file_path": "/big.txt"}}]}))
        .collect();
    turns.push(json!({"text": "read it all"}));
    let script = json!({
        "turns": turns,
        "conversations": [{"when_task_contains": "Conversation to summarize", "turns": [
            {"text": "## Goal\nRead big.txt.\n## Decisions\nnone\n## Files and artifacts\n/big.txt\n## Open items\nnone\n## Next step\nread on"}
        ]}]
    });
    let path = dir.join("reading.json");
    std::fs::write(&path, script.to_string()).unwrap();
    format!("scripted:{}", path.display())
}

fn events(output: &Output) -> Vec<Value> {
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

#[test]
fn a_small_max_input_tokens_makes_the_run_summarize() {
    let root = tempfile::tempdir().unwrap();
    let line = "a line of the big file, long enough to count\n";
    // About 350 tokens a read: the tail kept (a tenth of the window) holds the latest one.
    std::fs::write(root.path().join("big.txt"), line.repeat(1_200 / line.len())).unwrap();
    let model = reading_script(root.path());
    let run = |extra: &[&str], json: bool| {
        let mut command = bin();
        command.args(["run", "--model", &model]).args(extra);
        if json {
            command.arg("--json");
        }
        let output = command
            .arg("--root")
            .arg(root.path())
            .arg("read big.txt")
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        output
    };
    // With the default window nothing is summarized.
    let roomy = events(&run(&[], true));
    assert!(roomy.iter().all(|e| e["type"] != "summarized"));
    assert!(!root.path().join("conversation_history").exists());

    let tight = events(&run(&["--max-input-tokens", "4000"], true));
    assert_eq!(tight.last().unwrap()["text"], "read it all");
    let summarized: Vec<&Value> = tight.iter().filter(|e| e["type"] == "summarized").collect();
    assert!(!summarized.is_empty(), "{tight:?}");
    let event = summarized[0];
    assert_eq!(event["trigger"], "threshold");
    assert!(event["replaced"].as_u64().unwrap() > 0);
    assert!(event["kept_from"].as_u64().unwrap() > 0);
    // The transcript is the run's own: where the event says, in the run's files, never in
    // the workspace.
    let file = event["history_file"].as_str().unwrap();
    assert!(file.starts_with("/conversation_history/"), "{file}");
    assert!(!root.path().join("conversation_history").exists());
    let history = tight.last().unwrap()["files"][file]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(history.contains("### [0] user\nread big.txt"), "{history}");

    // Without --json, progress shows one line for it.
    let progress = stderr(&run(&["--max-input-tokens", "4000"], false));
    let lines: Vec<&str> = progress
        .lines()
        .filter(|l| l.contains("⋯ summarized"))
        .collect();
    assert_eq!(lines.len(), summarized.len(), "{progress}");
    assert!(lines[0].contains("earlier messages (transcript in /conversation_history/"));
}

#[test]
fn compact_tool_offers_compact_conversation() {
    let root = tempfile::tempdir().unwrap();
    let model = script(
        root.path(),
        json!([
            {"tool_calls": [{"id": "k", "name": "compact_conversation", "args": {}}]},
            {"text": "done"}
        ]),
    );
    let result = |extra: &[&str]| {
        let output = bin()
            .args(["run", "--json", "--model", &model])
            .args(extra)
            .arg("--root")
            .arg(root.path())
            .arg("go")
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        events(&output)
            .into_iter()
            .find(|e| e["type"] == "tool_call_finished")
            .unwrap()["content"][0]["text"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let offered = result(&["--compact-tool"]);
    // Offered, and sensibly refused in a conversation this small.
    assert!(
        offered.contains("compacting now would save little"),
        "{offered}"
    );
    let absent = result(&[]);
    assert!(
        absent.contains("Unknown tool `compact_conversation`"),
        "{absent}"
    );
}

/// Tool results of a `--json` run, by call id.
fn tool_results(output: &Output) -> std::collections::BTreeMap<String, String> {
    events(output)
        .into_iter()
        .filter(|e| e["type"] == "tool_call_finished")
        .map(|e| {
            (
                e["call_id"].as_str().unwrap_or_default().to_owned(),
                e.to_string(),
            )
        })
        .collect()
}

/// Directories mounted from outside the root are read-only: the agent can neither plant a
/// user-level skill, nor rewrite or delete the user's skills, nor write through any other
/// mount. Only the user's memory file may change, and only by `edit_file` — unless
/// `--read-only-memory`, which also covers `/memories/`.
#[test]
fn directories_mounted_from_outside_the_root_are_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let user = home.join(".deepagents/agent");
    std::fs::create_dir_all(user.join("skills/deploy")).unwrap();
    std::fs::write(user.join("AGENTS.md"), "Prefer small commits.\n").unwrap();
    let deploy = "---\nname: deploy\ndescription: Deploy safely.\n---\nSteps.\n";
    std::fs::write(user.join("skills/deploy/SKILL.md"), deploy).unwrap();
    let skills = dir.path().join("skills");
    std::fs::create_dir_all(skills.join("notes")).unwrap();
    let notes = "---\nname: notes\ndescription: my notes skill\n---\nbody\n";
    std::fs::write(skills.join("notes/SKILL.md"), notes).unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let evil = "---\nname: evil\ndescription: loaded by every later run\n---\nobey\n";
    let model = script(
        dir.path(),
        json!([
            {"tool_calls": [
                {"id": "plant", "name": "write_file", "args": {"file_path": "/.deepagents-user/skills/evil/SKILL.md", "content": evil}},
                {"id": "rewrite", "name": "edit_file", "args": {"file_path": "/.deepagents-user/skills/deploy/SKILL.md", "old_string": "Steps.", "new_string": "obey"}},
                {"id": "clobber", "name": "write_file", "args": {"file_path": "/.deepagents-user/AGENTS.md", "content": "obey\n"}},
                {"id": "remove", "name": "delete", "args": {"path": "/.skills-1/notes"}},
                {"id": "retext", "name": "edit_file", "args": {"file_path": "/.skills-1/notes/SKILL.md", "old_string": "body", "new_string": "obey"}},
                {"id": "add", "name": "write_file", "args": {"file_path": "/.skills-1/new/SKILL.md", "content": evil}}
            ]},
            {"tool_calls": [
                {"id": "memory", "name": "edit_file", "args": {"file_path": "/.deepagents-user/AGENTS.md", "old_string": "small commits", "new_string": "tiny commits"}}
            ]},
            {"text": "done"}
        ]),
    );
    let run = |extra: &[&str]| {
        bin()
            .args(["run", "--json", "--model", &model, "--skills"])
            .arg(&skills)
            .arg("--root")
            .arg(&root)
            .args(extra)
            .arg("go")
            .env("HOME", &home)
            .env("DEEPAGENTS_DATA_DIR", dir.path().join("data"))
            .output()
            .unwrap()
    };
    let output = run(&[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let results = tool_results(&output);
    for id in ["plant", "rewrite", "clobber", "remove", "retext", "add"] {
        assert!(
            results[id].contains("read-only"),
            "{id} was not refused: {}",
            results[id]
        );
    }
    assert!(!user.join("skills/evil").exists());
    assert_eq!(
        std::fs::read_to_string(user.join("skills/deploy/SKILL.md")).unwrap(),
        deploy
    );
    assert_eq!(
        std::fs::read_to_string(skills.join("notes/SKILL.md")).unwrap(),
        notes
    );
    assert!(!skills.join("new").exists());
    // The documented exception: the memory file, by edit_file.
    assert!(
        !results["memory"].contains("read-only"),
        "{}",
        results["memory"]
    );
    assert_eq!(
        std::fs::read_to_string(user.join("AGENTS.md")).unwrap(),
        "Prefer tiny commits.\n"
    );

    // The exception can be turned off.
    std::fs::write(user.join("AGENTS.md"), "Prefer small commits.\n").unwrap();
    let output = run(&["--read-only-memory"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(tool_results(&output)["memory"].contains("read-only"));
    assert_eq!(
        std::fs::read_to_string(user.join("AGENTS.md")).unwrap(),
        "Prefer small commits.\n"
    );
}

/// `--read-only-memory` also keeps the agent from writing long-term memory.
#[test]
fn read_only_memory_covers_long_term_memory() {
    let dir = tempfile::tempdir().unwrap();
    let model = script(
        dir.path(),
        json!([
            {"tool_calls": [{"id": "w", "name": "write_file", "args": {"file_path": "/memories/AGENTS.md", "content": "obey\n"}}]},
            {"text": "done"}
        ]),
    );
    let output = bin()
        .args([
            "run",
            "--json",
            "--backend",
            "state",
            "--read-only-memory",
            "--model",
            &model,
            "go",
        ])
        .env("DEEPAGENTS_DATA_DIR", dir.path().join("data"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(tool_results(&output)["w"].contains("read-only"));
}

/// `execute` runs confined by default: the host beyond the root is invisible, the root's
/// `.git` read-only, the network off, and paths the permission rules deny hidden from
/// commands too.
#[test]
fn execute_is_confined_by_default_and_follows_the_permission_rules() {
    if !sandbox_works() {
        return;
    }
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "outside-secret").unwrap();
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(root.path().join(".git")).unwrap();
    std::fs::create_dir_all(root.path().join("secrets")).unwrap();
    std::fs::write(root.path().join("secrets/key.txt"), "hunter2").unwrap();
    let rules = root.path().join("rules.toml");
    std::fs::write(
        &rules,
        "[[rules]]\noperations = [\"read\"]\npaths = [\"/secrets/**\"]\nmode = \"deny\"\n\n[[rules]]\noperations = [\"read\"]\npaths = [\"/**/*.pem\"]\nmode = \"deny\"\n",
    )
    .unwrap();
    let commands = [
        (
            "outside",
            format!("cat {}/secret.txt", outside.path().display()),
        ),
        ("home", "ls /root".to_owned()),
        ("git", "touch .git/hook && echo wrote".to_owned()),
        ("denied", "cat secrets/key.txt".to_owned()),
        (
            "net",
            "python3 -c 'import socket; socket.socket()' && echo connected".to_owned(),
        ),
        ("works", "echo ok > made.txt && cat made.txt".to_owned()),
    ];
    let model = execute_script(root.path(), &commands);
    let output = bin()
        .args([
            "run",
            "--json",
            "--backend",
            "shell",
            "--model",
            &model,
            "--permissions",
        ])
        .arg(&rules)
        .arg("--root")
        .arg(root.path())
        .arg("go")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let shown = stderr(&output);
    let stdout = String::from_utf8(output.stdout).unwrap();
    let results = execute_results(&stdout);
    assert!(
        !results["outside"].contains("outside-secret"),
        "{}",
        results["outside"]
    );
    assert!(
        !results["home"].contains("[Exit code 0]"),
        "{}",
        results["home"]
    );
    assert!(!results["git"].contains("wrote"), "{}", results["git"]);
    assert!(!root.path().join(".git/hook").exists());
    assert!(
        !results["denied"].contains("hunter2"),
        "{}",
        results["denied"]
    );
    assert!(!results["net"].contains("connected"), "{}", results["net"]);
    assert!(results["works"].starts_with("ok"), "{}", results["works"]);
    // The rule that cannot become a mount is named.
    assert!(shown.contains("/**/*.pem"), "{shown}");
    // The run says how its commands were confined.
    let report = sandbox_event(&stdout);
    assert_eq!(report["confinement"]["engine"], "bubblewrap", "{report}");
    assert_eq!(report["confinement"]["network"], "off", "{report}");
}

fn sandbox_works() -> bool {
    if std::process::Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok()
    {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "bubblewrap is missing");
    eprintln!("skipped: bubblewrap is not installed");
    false
}

/// A scripted model that makes one `execute` call per `(id, command)`, then answers.
fn execute_script(dir: &Path, commands: &[(&str, String)]) -> String {
    script(
        dir,
        json!([
            {"tool_calls": commands.iter().map(|(id, command)| json!({"id": id, "name": "execute", "args": {"command": command}})).collect::<Vec<_>>()},
            {"text": "done"}
        ]),
    )
}

/// The `sandbox` event of a `--json` run.
fn sandbox_event(stdout: &str) -> Value {
    stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["type"] == "sandbox")
        .unwrap_or_else(|| panic!("no sandbox event: {stdout}"))
}

/// Each `execute` result of a `--json` run, by call id.
/// The JSON objects of a file with one per line (what the logging hooks of these tests
/// write), blank lines skipped.
fn json_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn execute_results(stdout: &str) -> std::collections::BTreeMap<String, String> {
    stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["type"] == "tool_call_finished")
        .map(|e| {
            (
                e["call_id"].as_str().unwrap().to_owned(),
                e["content"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_landlock_fallback_confines_execute_and_the_run_reports_what_it_cannot_enforce() {
    if !sandbox_works() {
        return;
    }
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "outside-secret").unwrap();
    let root = tempfile::tempdir().unwrap();
    let commands = [
        ("outside", format!("cat {}/secret.txt", outside.path().display())),
        ("system", "echo x > /usr/evil && echo wrote".to_owned()),
        ("net", "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 9))' && echo connected".to_owned()),
        ("works", "echo ok > made.txt && cat made.txt".to_owned()),
    ];
    let model = execute_script(root.path(), &commands);
    let output = bin()
        .args([
            "run",
            "--json",
            "--backend",
            "shell",
            "--sandbox-engine",
            "landlock",
            "--model",
            &model,
            "--root",
        ])
        .arg(root.path())
        .arg("go")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    let results = execute_results(&stdout);
    assert!(
        !results["outside"].contains("outside-secret"),
        "{}",
        results["outside"]
    );
    assert!(
        !results["system"].contains("wrote"),
        "{}",
        results["system"]
    );
    assert!(!results["net"].contains("connected"), "{}", results["net"]);
    assert!(results["works"].starts_with("ok"), "{}", results["works"]);
    let report = sandbox_event(&stdout);
    assert_eq!(report["confinement"]["engine"], "landlock", "{report}");
    let unenforced = report["confinement"]["unenforced"].to_string();
    assert!(unenforced.contains(".git"), "{report}");
    // And the terminal is told too.
    let shown = stderr(&output);
    assert!(
        shown.contains("landlock") && shown.contains("does not enforce"),
        "{shown}"
    );
}

#[test]
fn allowed_domains_are_reached_through_the_sandbox_proxy_only() {
    if !sandbox_works() {
        return;
    }
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head);
            let _ = stream.write_all(b"HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello");
        }
    });
    let root = tempfile::tempdir().unwrap();
    let config = root.path().join("config.toml");
    std::fs::write(&config, "[sandbox]\nallow_domains = [\"localhost\"]\n").unwrap();
    let fetch = |url: String| {
        bin()
            .args(["sandbox", "run", "--config"])
            .arg(&config)
            .arg("--root")
            .arg(root.path())
            .args(["--", &format!("curl -sS --max-time 5 {url}")])
            .output()
            .unwrap()
    };
    let allowed = fetch(format!("http://localhost:{port}/"));
    assert_eq!(
        String::from_utf8_lossy(&allowed.stdout),
        "hello",
        "{}",
        stderr(&allowed)
    );
    let refused = fetch(format!("http://127.0.0.1:{port}/"));
    assert!(!String::from_utf8_lossy(&refused.stdout).contains("hello"));
    assert!(
        stderr(&refused).contains("refused network access to 127.0.0.1"),
        "{}",
        stderr(&refused)
    );
}

#[test]
fn sandbox_run_passes_each_word_after_the_separator_as_one_argument() {
    if !sandbox_works() {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("listed.txt"), "").unwrap();
    let run = |words: &[&str]| {
        bin()
            .args(["sandbox", "run", "--root"])
            .arg(root.path())
            .arg("--")
            .args(words)
            .output()
            .unwrap()
    };
    // Several words: `sh -c` gets its whole script as one argument.
    let split = run(&["sh", "-c", "echo \"a b\"; ls"]);
    assert!(split.status.success(), "{}", stderr(&split));
    assert_eq!(
        String::from_utf8_lossy(&split.stdout),
        "a b\nlisted.txt\n",
        "{}",
        stderr(&split)
    );
    // Quotes and spaces inside a word reach the command unchanged.
    let quoted = run(&["printf", "%s|", "it's", "two  spaces", ""]);
    assert_eq!(
        String::from_utf8_lossy(&quoted.stdout),
        "it's|two  spaces||"
    );
    // One word is still a command line for the shell.
    let line = run(&["echo hi | wc -c"]);
    assert_eq!(String::from_utf8_lossy(&line.stdout).trim(), "3");
}

#[test]
fn with_the_sandbox_off_only_allow_listed_commands_skip_approval() {
    let root = tempfile::tempdir().unwrap();
    let model = script(
        root.path(),
        json!([
            {"tool_calls": [
                {"id": "listed", "name": "execute", "args": {"command": "echo listed-ran"}},
                {"id": "chained", "name": "execute", "args": {"command": "echo x; echo chained-ran"}},
                {"id": "other", "name": "execute", "args": {"command": "printf other-ran"}}
            ]},
            {"text": "done"}
        ]),
    );
    let output = bin()
        .args([
            "run",
            "--json",
            "--backend",
            "shell",
            "--sandbox",
            "off",
            "--shell-allow",
            "echo",
            "--model",
            &model,
            "--root",
        ])
        .arg(root.path())
        .arg("go")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8(output.stdout).unwrap();
    let results = execute_results(&stdout);
    assert!(results["listed"].contains("listed-ran"), "{stdout}");
    // Not on the list: they needed an approval nobody could give here.
    assert!(
        !results
            .get("chained")
            .is_some_and(|r| r.contains("chained-ran")),
        "{stdout}"
    );
    assert!(
        !results
            .get("other")
            .is_some_and(|r| r.contains("other-ran")),
        "{stdout}"
    );
    assert!(stdout.contains("needs approval"), "{stdout}");
}

#[test]
fn a_command_that_needs_a_path_outside_the_sandbox_asks_and_an_approval_grants_it() {
    if !sandbox_works()
        || std::process::Command::new("script")
            .arg("--version")
            .output()
            .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "script (util-linux) is missing"
        );
        return;
    }
    let granted = tempfile::tempdir().unwrap();
    let refused = tempfile::tempdir().unwrap();
    std::fs::write(granted.path().join("a.txt"), "granted-secret").unwrap();
    std::fs::write(refused.path().join("b.txt"), "refused-secret").unwrap();
    let root = tempfile::tempdir().unwrap();
    let (a, b) = (
        format!("cat {}/a.txt", granted.path().display()),
        format!("cat {}/b.txt", refused.path().display()),
    );
    let model = script(
        root.path(),
        json!([
            {"tool_calls": [
                {"id": "a", "name": "execute", "args": {"command": a}},
                {"id": "b", "name": "execute", "args": {"command": b}}
            ]},
            {"tool_calls": [{"id": "again", "name": "execute", "args": {"command": a}}]},
            {"text": "done"}
        ]),
    );
    let deepagents = env!("CARGO_BIN_EXE_deepagents");
    let command = format!(
        "{deepagents} run --json --backend shell --model {model} --root {} go",
        root.path().display()
    );
    // `script` gives the run a terminal, so it can ask; the answers wait in its input.
    let mut child = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut input = child.stdin.take().unwrap();
        input.write_all(b"y\nn\n").unwrap();
        std::thread::sleep(std::time::Duration::from_secs(3));
    }
    let output = child.wait_with_output().unwrap();
    let shown = String::from_utf8_lossy(&output.stdout).replace('\r', "");
    let results = execute_results(
        &shown
            .lines()
            .filter(|line| line.starts_with('{'))
            .collect::<Vec<_>>()
            .join("\n"),
    );
    assert!(shown.contains("outside the sandbox"), "{shown}");
    assert!(results["a"].contains("granted-secret"), "{shown}");
    assert!(!results["b"].contains("refused-secret"), "{shown}");
    // Granted for the session: the same command runs again without asking.
    assert!(results["again"].contains("granted-secret"), "{shown}");
    assert_eq!(shown.matches("approve? [y]es").count(), 2, "{shown}");
}

#[test]
fn hooks_block_rewrite_log_and_time_out_as_their_files_say() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let log = dir.join("hook-log.jsonl");
    let hooks = json!({"hooks": {
        "PreToolUse": [
            {"matcher": "Bash", "hooks": [{"type": "command", "command": "grep -q '\"command\":\"rm ' && { echo 'rm is not allowed here' >&2; exit 2; }; exit 0"}]},
            {"matcher": "Write", "hooks": [{"type": "command", "command": "cat >/dev/null; printf '%s' '{\"hookSpecificOutput\": {\"hookEventName\": \"PreToolUse\", \"permissionDecision\": \"allow\", \"updatedInput\": {\"file_path\": \"/rewritten.txt\", \"content\": \"rewritten\\n\"}}}'"}]},
            {"matcher": "read_file", "hooks": [{"type": "command", "command": "sleep 5; echo late", "timeout": 0.5}]}
        ],
        "PostToolUse": [
            {"matcher": "*", "hooks": [{"type": "command", "command": format!("cat >> {}; echo >> {}", log.display(), log.display())}]}
        ]
    }});
    let hooks_file = dir.join("my-hooks.json");
    std::fs::write(&hooks_file, hooks.to_string()).unwrap();
    std::fs::write(dir.join("keep.txt"), "kept\n").unwrap();
    let model = script(
        dir,
        json!([
            {"tool_calls": [
                {"id": "rm", "name": "execute", "args": {"command": "rm keep.txt"}},
                {"id": "ok", "name": "execute", "args": {"command": "echo fine"}},
                {"id": "w", "name": "write_file", "args": {"file_path": "/asked.txt", "content": "asked\n"}},
                {"id": "r", "name": "read_file", "args": {"file_path": "/keep.txt"}}
            ]},
            {"text": "done"}
        ]),
    );
    let output = bin()
        .args([
            "run",
            "--json",
            "--backend",
            "shell",
            "--sandbox",
            "off",
            "--auto-approve",
            "--model",
            &model,
            "--hooks",
        ])
        .arg(&hooks_file)
        .arg("--root")
        .arg(dir)
        .arg("go")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    let results = execute_results(&stdout);
    // Blocked: the model gets the hook's reason, and nothing ran.
    assert!(results["rm"].contains("rm is not allowed here"), "{stdout}");
    assert!(dir.join("keep.txt").exists());
    assert!(results["ok"].contains("fine"), "{stdout}");
    // Rewritten: the call ran with the hook's input.
    assert_eq!(
        std::fs::read_to_string(dir.join("rewritten.txt")).unwrap(),
        "rewritten\n"
    );
    assert!(!dir.join("asked.txt").exists());
    // Timed out: the hook was killed, the call ran, the user was told.
    assert!(results["r"].contains("kept"), "{stdout}");
    assert!(stderr(&output).contains("timed out"), "{}", stderr(&output));
    // Logged after each call that ran, in Claude Code's names, with the result.
    let logged: Vec<Value> = json_lines(&log);
    let names: Vec<&str> = logged
        .iter()
        .map(|e| e["tool_name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Bash", "Write", "Read"], "{logged:?}");
    assert_eq!(logged[0]["hook_event_name"], "PostToolUse");
    assert!(
        logged[0]["tool_response"]["output"]
            .as_str()
            .unwrap()
            .contains("fine")
    );
    assert_eq!(logged[0]["cwd"], dir.display().to_string());
}

#[test]
fn a_hook_that_asks_gets_a_real_decision() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let hooks_file = dir.join("ask-hooks.json");
    std::fs::write(
        &hooks_file,
        json!({"hooks": {"PreToolUse": [{"matcher": "Bash", "hooks": [{"command":
            "grep -q deploy && printf '%s' '{\"hookSpecificOutput\": {\"hookEventName\": \"PreToolUse\", \"permissionDecision\": \"ask\", \"permissionDecisionReason\": \"deploys need a person\"}}'; exit 0"}]}]}})
        .to_string(),
    )
    .unwrap();
    let model = script(
        dir,
        json!([
            {"tool_calls": [
                {"id": "d", "name": "execute", "args": {"command": "touch deployed.txt"}},
                {"id": "o", "name": "execute", "args": {"command": "touch other.txt"}}
            ]},
            {"text": "done"}
        ]),
    );
    let run = |extra: &[&str]| {
        let output = bin()
            .args([
                "run",
                "--json",
                "--backend",
                "shell",
                "--sandbox",
                "off",
                "--shell-allow",
                "touch",
                "--model",
                &model,
            ])
            .args(extra)
            .arg("--hooks")
            .arg(&hooks_file)
            .arg("--root")
            .arg(dir)
            .arg("go")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", stderr(&output));
        execute_results(&String::from_utf8(output.stdout).unwrap())
    };
    // Nobody to ask: the call does not run and the model is told why; others are untouched.
    let headless = run(&[]);
    assert!(
        headless["d"].contains("nobody can approve it here"),
        "{headless:?}"
    );
    assert!(
        headless["d"].contains("deploys need a person"),
        "{headless:?}"
    );
    assert!(!dir.join("deployed.txt").exists());
    assert!(dir.join("other.txt").exists());
    // --auto-approve is the user's standing yes.
    let approved = run(&["--auto-approve"]);
    assert!(!approved["d"].contains("approve"), "{approved:?}");
    assert!(dir.join("deployed.txt").exists());
}

#[test]
fn a_stop_hook_keeps_the_run_going_once_and_precompact_hears_of_summaries() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let stops = dir.join("stops.jsonl");
    let compacts = dir.join("compacts.jsonl");
    let marker = dir.join("stopped-once");
    let stop = format!(
        "cat >> {log}; echo >> {log}; if [ -f {marker} ]; then exit 0; fi; touch {marker}; echo 'run the tests first' >&2; exit 2",
        log = stops.display(),
        marker = marker.display()
    );
    let hooks_file = dir.join("stop-hooks.json");
    std::fs::write(
        &hooks_file,
        json!({"hooks": {"Stop": [{"hooks": [{"command": stop}]}]}}).to_string(),
    )
    .unwrap();
    let model = script(
        dir,
        json!([{"text": "first answer"}, {"text": "tests pass now"}]),
    );
    let output = bin()
        .args(["run", "--json", "--model", &model, "--hooks"])
        .arg(&hooks_file)
        .arg("--root")
        .arg(dir)
        .arg("go")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(final_line(&output)["text"], "tests pass now");
    let stopped: Vec<Value> = json_lines(&stops);
    assert_eq!(stopped.len(), 2, "{stopped:?}");
    assert_eq!(stopped[0]["stop_hook_active"], false);
    assert_eq!(stopped[1]["stop_hook_active"], true);
    assert_eq!(stopped[1]["hook_event_name"], "Stop");

    // A run that summarizes tells the PreCompact hooks first, once per summary.
    let line = "a line of the big file, long enough to count\n";
    std::fs::write(dir.join("big.txt"), line.repeat(1_200 / line.len())).unwrap();
    let hooks_file = dir.join("compact-hooks.json");
    std::fs::write(
        &hooks_file,
        json!({"hooks": {"PreCompact": [{"matcher": "auto", "hooks": [{"command": format!("cat >> {log}; echo >> {log}", log = compacts.display())}]}]}})
            .to_string(),
    )
    .unwrap();
    let output = bin()
        .args([
            "run",
            "--json",
            "--max-input-tokens",
            "4000",
            "--model",
            &reading_script(dir),
            "--hooks",
        ])
        .arg(&hooks_file)
        .arg("--root")
        .arg(dir)
        .arg("read big.txt")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let summaries = events(&output)
        .iter()
        .filter(|e| e["type"] == "summarized")
        .count();
    assert!(summaries > 0);
    let compacted: Vec<Value> = json_lines(&compacts);
    assert_eq!(compacted.len(), summaries, "{compacted:?}");
    assert_eq!(compacted[0]["hook_event_name"], "PreCompact");
    assert_eq!(compacted[0]["trigger"], "auto");
}

#[test]
fn project_hooks_run_only_when_trusted_and_a_prompt_hook_can_stop_the_run() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    std::fs::create_dir_all(dir.join(".deepagents")).unwrap();
    std::fs::write(
        dir.join(".deepagents/hooks.json"),
        json!({"hooks": {"UserPromptSubmit": [{"hooks": [{"type": "command", "command": "grep -q secret && { echo 'prompts may not mention secrets' >&2; exit 2; }; exit 0"}]}]}}).to_string(),
    )
    .unwrap();
    let model = script(dir, json!([{"text": "done"}]));
    let run = |trust: bool| {
        let mut command = bin();
        command
            .args([
                "run",
                "--backend",
                "filesystem",
                "--model",
                &model,
                "--root",
            ])
            .arg(dir);
        if trust {
            command.arg("--trust-project");
        }
        command.arg("tell me the secret").output().unwrap()
    };
    let untrusted = run(false);
    assert!(untrusted.status.success(), "{}", stderr(&untrusted));
    assert!(
        stderr(&untrusted).contains("--trust-project"),
        "{}",
        stderr(&untrusted)
    );
    let trusted = run(true);
    assert!(!trusted.status.success());
    assert!(
        stderr(&trusted).contains("prompts may not mention secrets"),
        "{}",
        stderr(&trusted)
    );
}

use deepagents_test_support::mcp_python;

#[test]
fn mcp_servers_tools_reach_the_model_and_a_broken_server_does_not_stop_the_run() {
    let Some(python) = mcp_python() else { return };
    let root = tempfile::tempdir().unwrap();
    let server =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deepagents-mcp/tests/fixtures/server.py");
    let config = root.path().join("servers.json");
    std::fs::write(
        &config,
        json!({"mcpServers": {
            "fixture": {"command": python, "args": [server.display().to_string()], "env": {"FIXTURE_GREETING": "${DEEPAGENTS_TEST_GREETING:-fallback}"}},
            "broken": {"command": "/nonexistent/mcp-server"}
        }})
        .to_string(),
    )
    .unwrap();
    // A project server is not started without trust.
    std::fs::write(
        root.path().join(".mcp.json"),
        json!({"mcpServers": {"project": {"command": "/nonexistent/project-server"}}}).to_string(),
    )
    .unwrap();
    let model = script(
        root.path(),
        json!([
            {"tool_calls": [
                {"id": "e", "name": "fixture__echo", "args": {"text": "over mcp"}},
                {"id": "w", "name": "fixture__where", "args": {}},
                {"id": "f", "name": "fixture__fail", "args": {"reason": "asked to"}}
            ]},
            {"text": "done"}
        ]),
    );
    let output = bin()
        .args([
            "run",
            "--json",
            "--backend",
            "filesystem",
            "--model",
            &model,
            "--mcp-config",
        ])
        .arg(&config)
        .arg("--root")
        .arg(root.path())
        .arg("go")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let shown = stderr(&output);
    assert!(
        shown.contains("MCP server broken is not available"),
        "{shown}"
    );
    assert!(
        shown.contains("project") && shown.contains("--trust-project"),
        "{shown}"
    );
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    let results = execute_results(&stdout);
    assert_eq!(results["e"], "echo: over mcp", "{stdout}");
    let root_path = root.path().canonicalize().unwrap();
    assert_eq!(
        results["w"],
        format!("{} fallback", root_path.display()),
        "{stdout}"
    );
    assert!(results["f"].contains("failed because asked to"), "{stdout}");
    // `mcp tools` lists what the model sees.
    let listed = bin()
        .args(["mcp", "tools", "fixture", "--mcp-config"])
        .arg(&config)
        .arg("--root")
        .arg(root.path())
        .output()
        .unwrap();
    let lines = String::from_utf8(listed.stdout).unwrap();
    assert!(
        lines
            .lines()
            .any(|l| l.starts_with("fixture__echo\tRepeats the text.")),
        "{lines}"
    );
}

/// An existing Claude Code `hooks.json` works unchanged: MCP tools matched and named as
/// `mcp__SERVER__TOOL`, and with a relative `--root` the hooks get an absolute `cwd` and
/// `CLAUDE_PROJECT_DIR`.
#[test]
fn claude_code_hooks_match_mcp_tools_by_their_claude_names_with_absolute_paths() {
    let Some(python) = mcp_python() else { return };
    let parent = tempfile::tempdir().unwrap();
    let root = parent.path().join("project");
    std::fs::create_dir(&root).unwrap();
    let server =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deepagents-mcp/tests/fixtures/server.py");
    let config = root.join("servers.json");
    std::fs::write(
        &config,
        json!({"mcpServers": {"fixture": {"command": python, "args": [server.display().to_string()]}}})
            .to_string(),
    )
    .unwrap();
    let log = root.join("hook-log.jsonl");
    let hooks = json!({"hooks": {
        "PreToolUse": [
            {"matcher": "mcp__fixture__fail", "hooks": [{"type": "command", "command": "echo 'not this one' >&2; exit 2"}]}
        ],
        "PostToolUse": [
            {"matcher": "mcp__fixture__.*", "hooks": [{"type": "command", "command": format!("cat >> {log}; printf '\\n%s\\n' \"$CLAUDE_PROJECT_DIR\" >> {log}", log = log.display())}]}
        ]
    }});
    let hooks_file = root.join("hooks.json");
    std::fs::write(&hooks_file, hooks.to_string()).unwrap();
    let model = script(
        &root,
        json!([
            {"tool_calls": [
                {"id": "e", "name": "fixture__echo", "args": {"text": "over mcp"}},
                {"id": "f", "name": "fixture__fail", "args": {"reason": "asked to"}}
            ]},
            {"text": "done"}
        ]),
    );
    let output = bin()
        .current_dir(parent.path())
        .args([
            "run",
            "--json",
            "--backend",
            "filesystem",
            "--model",
            &model,
            "--mcp-config",
        ])
        .arg(&config)
        .arg("--hooks")
        .arg(&hooks_file)
        .args(["--root", "project", "go"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8(output.stdout.clone()).unwrap();
    let results = execute_results(&stdout);
    assert_eq!(results["e"], "echo: over mcp", "{stdout}");
    assert!(results["f"].contains("not this one"), "blocked: {stdout}");
    let logged = std::fs::read_to_string(&log).unwrap();
    let mut lines = logged.lines().filter(|line| !line.is_empty());
    let event: Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(event["tool_name"], "mcp__fixture__echo", "{logged}");
    assert_eq!(event["agent_tool_name"], "fixture__echo");
    let absolute = root.canonicalize().unwrap();
    let cwd = Path::new(event["cwd"].as_str().unwrap());
    assert!(cwd.is_absolute(), "{logged}");
    assert_eq!(cwd.canonicalize().unwrap(), absolute);
    // The transcript as Claude Code writes it: the prompt, then the calls the model made.
    let transcript = Path::new(event["transcript_path"].as_str().unwrap());
    assert!(transcript.is_absolute(), "{logged}");
    let transcript: Vec<Value> = std::fs::read_to_string(transcript)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(transcript[0]["type"], "user", "{transcript:?}");
    assert_eq!(transcript[0]["message"]["content"][0]["text"], "go");
    let call = &transcript[1]["message"]["content"][0];
    assert_eq!(call["type"], "tool_use", "{transcript:?}");
    assert_eq!(call["name"], "fixture__echo");
    assert_eq!(call["input"]["text"], "over mcp");
    let project_dir = Path::new(lines.next().unwrap());
    assert!(project_dir.is_absolute(), "{logged}");
    assert_eq!(project_dir.canonicalize().unwrap(), absolute);
    assert!(
        lines.next().is_none(),
        "the blocked call logged nothing: {logged}"
    );
}

#[test]
fn mcp_tools_lists_the_servers_that_started_and_names_the_ones_that_failed() {
    let Some(python) = mcp_python() else { return };
    let root = tempfile::tempdir().unwrap();
    let server =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deepagents-mcp/tests/fixtures/server.py");
    let config = root.path().join("servers.json");
    std::fs::write(
        &config,
        json!({"mcpServers": {
            "fixture": {"command": python, "args": [server.display().to_string()]},
            "broken": {"command": "/nonexistent/mcp-server"}
        }})
        .to_string(),
    )
    .unwrap();
    let tools = |extra: &[&str]| {
        bin()
            .args(["mcp", "tools"])
            .args(extra)
            .arg("--mcp-config")
            .arg(&config)
            .arg("--root")
            .arg(root.path())
            .output()
            .unwrap()
    };
    // One server of two failing: the other's tools, the failure on stderr, exit 0.
    let output = tools(&[]);
    let (stdout, shown) = (String::from_utf8_lossy(&output.stdout), stderr(&output));
    assert!(output.status.success(), "{shown}");
    assert!(
        stdout.lines().any(|l| l.starts_with("fixture__echo\t")),
        "{stdout}"
    );
    assert!(
        shown.contains("MCP server broken failed") && shown.contains("/nonexistent/mcp-server"),
        "{shown}"
    );
    assert!(!shown.contains("the run goes on"), "{shown}");
    let output = tools(&["--json"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let listed: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["server"] == "fixture"),
        "{listed}"
    );
    // Every server asked for failing, or none by that name: exit 1, saying why.
    let output = tools(&["broken"]);
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("no MCP server started"),
        "{}",
        stderr(&output)
    );
    let output = tools(&["nosuch"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("no MCP server named nosuch"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn mcp_results_of_every_kind_progress_and_timeouts_reach_the_run_over_stdio_and_http() {
    let Some(python) = mcp_python() else { return };
    let Some(modules) = deepagents_test_support::mcp_node_modules() else {
        return;
    };
    let http = deepagents_test_support::EverythingHttp::start(&modules);
    let root = tempfile::tempdir().unwrap();
    let server =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deepagents-mcp/tests/fixtures/server.py");
    let config = root.path().join("servers.json");
    std::fs::write(
        &config,
        json!({"mcpServers": {
            "py": {"command": python, "args": [server.display().to_string()], "timeout": 1},
            "web": {"type": "http", "url": http.url}
        }})
        .to_string(),
    )
    .unwrap();
    let model = script(
        root.path(),
        json!([
            {"tool_calls": [
                {"id": "image", "name": "py__pixel", "args": {}},
                {"id": "structured", "name": "py__add", "args": {"a": 20, "b": 22}},
                {"id": "link", "name": "py__link", "args": {}},
                {"id": "slow", "name": "py__slow", "args": {"seconds": 5}},
                {"id": "progress", "name": "web__trigger-long-running-operation", "args": {"duration": 0.4, "steps": 2}},
                {"id": "echo", "name": "web__echo", "args": {"message": "over http"}}
            ]},
            {"text": "done"}
        ]),
    );
    let started = std::time::Instant::now();
    let output = bin()
        .args(["run", "--json", "--model", &model, "--mcp-config"])
        .arg(&config)
        .arg("--root")
        .arg(root.path())
        .arg("go")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let events = events(&output);
    let finished = |id: &str| {
        events
            .iter()
            .find(|e| e["type"] == "tool_call_finished" && e["call_id"] == id)
            .unwrap_or_else(|| panic!("no result for {id}: {events:?}"))
            .clone()
    };
    let image = finished("image");
    assert_eq!(image["status"], "ok");
    assert_eq!(image["content"][0]["type"], "data", "{image}");
    assert_eq!(image["content"][0]["mime_type"], "image/png", "{image}");
    let structured = finished("structured")["content"][0]["text"]
        .as_str()
        .map(|text| serde_json::from_str::<Value>(text).unwrap());
    assert_eq!(structured, Some(json!({"sum": 42})));
    let link = finished("link")["content"][0]["text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        link.contains("[resource link] file:///notes.txt notes"),
        "{link}"
    );
    let slow = finished("slow");
    assert_eq!(slow["status"], "error");
    assert!(
        slow["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("did not answer"),
        "{slow}"
    );
    assert_eq!(finished("echo")["content"][0]["text"], "Echo: over http");
    assert_eq!(finished("progress")["status"], "ok");
    let progress: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool_progress" && e["call_id"] == "progress")
        .collect();
    assert!(!progress.is_empty(), "{events:?}");
    assert_eq!(progress[0]["progress"], 1.0);
    assert_eq!(progress[0]["total"], 2.0);
    // `mcp list` names each server's transport and state.
    let listed = bin()
        .args(["mcp", "list", "--mcp-config"])
        .arg(&config)
        .arg("--root")
        .arg(root.path())
        .output()
        .unwrap();
    let lines = String::from_utf8(listed.stdout).unwrap();
    assert!(
        lines
            .lines()
            .any(|l| l.starts_with("web\thttp http://127.0.0.1:") && l.contains("\tok, ")),
        "{lines}"
    );
    assert!(
        lines.lines().any(|l| l.starts_with("py\tstdio ")),
        "{lines}"
    );
}

#[test]
fn notification_hooks_hear_about_approvals_and_session_end_about_the_exit() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path();
    let log = dir.join("notify.log");
    let record = format!("cat >> {}; echo >> {}", log.display(), log.display());
    let hooks = dir.join("hooks.json");
    std::fs::write(
        &hooks,
        json!({"hooks": {
            "Notification": [{"hooks": [{"command": record}]}],
            "SessionEnd": [{"hooks": [{"command": record}]}]
        }})
        .to_string(),
    )
    .unwrap();
    let model = script(
        dir,
        json!([
            {"tool_calls": [{"id": "x", "name": "execute", "args": {"command": "echo hi"}}]},
            {"text": "done"}
        ]),
    );
    let output = bin()
        .args([
            "run",
            "--backend",
            "shell",
            "--sandbox",
            "off",
            "--model",
            &model,
            "--hooks",
        ])
        .arg(&hooks)
        .arg("--root")
        .arg(dir)
        .arg("go")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let events: Vec<Value> = json_lines(&log);
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[0]["hook_event_name"], "Notification");
    assert!(
        events[0]["message"].as_str().unwrap().contains("execute"),
        "{events:?}"
    );
    assert_eq!(events[1]["hook_event_name"], "SessionEnd");
}

#[test]
fn trusting_a_project_on_the_terminal_is_remembered_until_its_files_change() {
    if std::process::Command::new("script")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(
            std::env::var_os("CI").is_none(),
            "script (util-linux) is missing"
        );
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let dir = root.path();
    let log = dir.join("prompts.log");
    std::fs::create_dir_all(dir.join(".deepagents")).unwrap();
    let hooks = json!({"hooks": {"UserPromptSubmit": [{"hooks": [{"command": format!("echo ran >> {}", log.display())}]}]}});
    std::fs::write(dir.join(".deepagents/hooks.json"), hooks.to_string()).unwrap();
    let model = script(
        dir,
        json!([{"text": "done"}, {"text": "done"}, {"text": "done"}]),
    );
    let runs = || std::fs::read_to_string(&log).map_or(0, |text| text.lines().count());
    // On a terminal: asked once, answered yes.
    let command = format!(
        "{} run --backend filesystem --model {model} --root {} go",
        env!("CARGO_BIN_EXE_deepagents"),
        dir.display()
    );
    let mut child = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("DEEPAGENTS_DATA_DIR", data.path())
        .env_remove("DEEPAGENTS_MODEL")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut input = child.stdin.take().unwrap();
        input.write_all(b"y\n").unwrap();
        std::thread::sleep(std::time::Duration::from_secs(2));
    }
    let output = child.wait_with_output().unwrap();
    let shown = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(shown.contains("Trust them?"), "{shown}");
    assert_eq!(runs(), 1, "{shown}");
    // Remembered: no terminal needed the next time.
    let plain = || {
        bin()
            .env("DEEPAGENTS_DATA_DIR", data.path())
            .args([
                "run",
                "--backend",
                "filesystem",
                "--model",
                &model,
                "--root",
            ])
            .arg(dir)
            .arg("go")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let again = plain();
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(runs(), 2);
    // A changed file is a new decision: not trusted without asking.
    std::fs::write(dir.join(".deepagents/hooks.json"), format!("{hooks}\n")).unwrap();
    let changed = plain();
    assert_eq!(runs(), 2);
    assert!(
        stderr(&changed).contains("--trust-project"),
        "{}",
        stderr(&changed)
    );
}
