//! `deepagents run` on each backend, with permissions.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::{Value, json};

use crate::bin;

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

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

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
    assert_eq!(
        last["files"],
        json!(["/notes/changes.md", "/notes/release.md"])
    );
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
    // Not interactive and not auto-approved: the command is refused, and the model is told.
    let refused = bin()
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
