//! `deepagents run --backend repo` and `deepagents repo log` on real git repositories.

use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};

use crate::bin;
use deepagents_test_support::{bare_repo, git, stderr};

fn script(dir: &Path, turns: Value) -> String {
    let path = dir.join("script.json");
    std::fs::write(&path, json!({ "turns": turns }).to_string()).unwrap();
    format!("scripted:{}", path.display())
}

fn finished_tools(output: &Output) -> Vec<Value> {
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|event| event["type"] == "tool_call_finished")
        .collect()
}

#[test]
fn a_run_on_a_repository_commits_each_change_and_reads_linked_skills() {
    let tmp = tempfile::tempdir().unwrap();
    let skill = "---\nname: review\ndescription: Reviews a change\n---\nRead the diff twice.\n";
    let review = bare_repo(tmp.path(), "review", &[("SKILL.md", skill)]);
    let agent = bare_repo(
        tmp.path(),
        "agent",
        &[
            ("AGENTS.md", "Keep notes short.\n"),
            (
                "deepagents.json",
                r#"{"skills": {"review": "../review.git"}}"#,
            ),
        ],
    );
    let model = script(
        tmp.path(),
        json!([
            {"tool_calls": [
                {"name": "read_file", "args": {"file_path": "/skills/review/SKILL.md"}}
            ]},
            {"tool_calls": [
                {"name": "write_file", "args": {"file_path": "/notes.md", "content": "one\n"}}
            ]},
            {"tool_calls": [
                {"name": "edit_file", "args": {"file_path": "/notes.md", "old_string": "one", "new_string": "two"}}
            ]},
            {"text": "done"}
        ]),
    );
    let output = bin()
        .args(["run", "--json", "--model", &model, "--repo"])
        .arg(&agent)
        .arg("Take notes")
        .current_dir(tmp.path())
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let tools = finished_tools(&output);
    assert_eq!(tools.len(), 3);
    for tool in &tools {
        assert_eq!(tool["status"], "ok", "{tool}");
    }
    assert!(
        tools[0].to_string().contains("Read the diff twice."),
        "{}",
        tools[0]
    );
    assert_eq!(git(&agent, &["show", "main:notes.md"]), "two\n");
    let log = git(&agent, &["log", "--format=%s", "main"]);
    assert_eq!(
        log.lines().collect::<Vec<_>>(),
        [
            "deepagents: edit /notes.md",
            "deepagents: write /notes.md",
            "seed"
        ]
    );
    // Harness files (offloaded results, history) never land in the repository.
    let tree = git(&agent, &["ls-tree", "-r", "--name-only", "main"]);
    assert_eq!(
        tree.lines().collect::<Vec<_>>(),
        ["AGENTS.md", "deepagents.json", "notes.md"]
    );
    assert_eq!(
        git(&review, &["log", "--format=%s", "main"])
            .lines()
            .count(),
        1
    );

    let log = bin()
        .args(["repo", "log", "/notes.md", "--repo"])
        .arg(&agent)
        .output()
        .unwrap();
    assert!(log.status.success(), "{}", stderr(&log));
    let lines: Vec<String> = String::from_utf8(log.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].ends_with("deepagents deepagents: edit /notes.md"),
        "{lines:?}"
    );

    let json_log = bin()
        .args(["repo", "log", "/skills/review/SKILL.md", "--json", "--repo"])
        .arg(&agent)
        .output()
        .unwrap();
    assert!(json_log.status.success(), "{}", stderr(&json_log));
    let commit: Value =
        serde_json::from_str(String::from_utf8(json_log.stdout).unwrap().trim()).unwrap();
    assert_eq!(commit["author"], "Someone");
    assert_eq!(commit["summary"], "seed");
}

#[test]
fn a_write_over_an_existing_file_is_refused_and_the_model_is_told_why() {
    let tmp = tempfile::tempdir().unwrap();
    let agent = bare_repo(tmp.path(), "agent", &[("notes.md", "keep me\n")]);
    let model = script(
        tmp.path(),
        json!([
            {"tool_calls": [
                {"name": "write_file", "args": {"file_path": "/notes.md", "content": "lost\n"}}
            ]},
            {"text": "done"}
        ]),
    );
    let output = bin()
        .args([
            "run",
            "--json",
            "--backend",
            "repo",
            "--model",
            &model,
            "--repo",
        ])
        .arg(&agent)
        .arg("Write")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    let tools = finished_tools(&output);
    assert_eq!(tools[0]["status"], "error", "{}", tools[0]);
    assert!(
        tools[0].to_string().contains("already exists"),
        "{}",
        tools[0]
    );
    assert_eq!(git(&agent, &["show", "main:notes.md"]), "keep me\n");
}

#[test]
fn repository_flags_that_do_not_fit_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let model = script(tmp.path(), json!([{"text": "done"}]));
    let output = bin()
        .args(["run", "--backend", "repo", "--model", &model, "Hi"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("--repo PATH_OR_URL"),
        "{}",
        stderr(&output)
    );
    let output = bin()
        .args([
            "run",
            "--backend",
            "state",
            "--repo",
            "/tmp/x.git",
            "--model",
            &model,
            "Hi",
        ])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("--repo is for --backend repo"),
        "{}",
        stderr(&output)
    );
    let output = bin()
        .args(["run", "--repo=--upload-pack=evil", "--model", &model, "Hi"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("starts with `-`"),
        "{}",
        stderr(&output)
    );
}
