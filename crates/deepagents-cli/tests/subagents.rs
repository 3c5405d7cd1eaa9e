//! Subagents from markdown files, seen through `--json`.

use std::path::Path;

use serde_json::{Value, json};

use crate::bin;

fn write_script(dir: &Path, script: Value) -> String {
    let path = dir.join("script.json");
    std::fs::write(&path, script.to_string()).unwrap();
    format!("scripted:{}", path.display())
}

#[test]
fn markdown_subagents_run_and_their_events_are_namespaced() {
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("agents");
    std::fs::create_dir(&agents).unwrap();
    std::fs::write(
        agents.join("researcher.md"),
        "---\nname: researcher\ndescription: Finds facts in the notes.\n---\nYou research. Answer briefly.\n",
    )
    .unwrap();
    let model = write_script(
        dir.path(),
        json!({
            "turns": [
                {"tool_calls": [{"id": "t1", "name": "task", "args": {"subagent_type": "researcher", "description": "find: the answer"}}]},
                {"text": "The researcher says 42."}
            ],
            "conversations": [{"when_task_contains": "find:", "turns": [
                {"tool_calls": [{"name": "ls", "args": {}}]},
                {"text": "42"}
            ]}]
        }),
    );
    let output = bin()
        .args([
            "run",
            "--json",
            "--backend",
            "state",
            "--model",
            &model,
            "--agents",
        ])
        .arg(&agents)
        .arg("go")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let events: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let nested: Vec<&Value> = events
        .iter()
        .filter(|e| e["path"] == json!(["t1", "researcher"]))
        .collect();
    assert!(
        nested
            .iter()
            .any(|e| e["type"] == "tool_call_finished" && e["name"] == "ls")
    );
    assert!(
        nested
            .iter()
            .any(|e| e["type"] == "final" && e["text"] == "42")
    );
    let task_done = events
        .iter()
        .find(|e| e["type"] == "tool_call_finished" && e["name"] == "task")
        .unwrap();
    assert_eq!(task_done["path"], json!([]));
    assert_eq!(task_done["content"][0]["text"], "42");
    assert_eq!(events.last().unwrap()["text"], "The researcher says 42.");
}

#[test]
fn a_broken_subagent_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.md"),
        "---\nname: x\n---\nno description\n",
    )
    .unwrap();
    let model = write_script(dir.path(), json!({"turns": [{"text": "unused"}]}));
    let output = bin()
        .args(["run", "--backend", "state", "--model", &model, "--agents"])
        .arg(dir.path())
        .arg("go")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("bad.md"), "{stderr}");
    assert!(stderr.contains("description"), "{stderr}");
}
