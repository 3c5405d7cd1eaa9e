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
        .filter(|e| e["path"] == json!([{"call_id": "t1", "name": "researcher"}]))
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

fn events_of(output: &std::process::Output) -> Vec<Value> {
    String::from_utf8(output.stdout.clone())
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn subagents_load_from_the_roots_deepagents_agents_with_their_own_model() {
    let root = tempfile::tempdir().unwrap();
    let agents = root.path().join(".deepagents/agents");
    std::fs::create_dir_all(&agents).unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let scout_model = scratch.path().join("scout.json");
    std::fs::write(
        &scout_model,
        json!({"turns": [{"text": "scouted the root"}]}).to_string(),
    )
    .unwrap();
    std::fs::write(
        agents.join("scout.md"),
        format!(
            "---\nname: scout\ndescription: Looks around.\nmodel: scripted:{}\n---\nYou scout.\n",
            scout_model.display()
        ),
    )
    .unwrap();
    // The current directory has definitions of its own, broken ones: with --root given they
    // must not be read.
    let cwd = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(cwd.path().join(".deepagents/agents")).unwrap();
    std::fs::write(
        cwd.path().join(".deepagents/agents/broken.md"),
        "---\nname: broken\n---\nno description\n",
    )
    .unwrap();
    let model = write_script(
        scratch.path(),
        json!({"turns": [
            {"tool_calls": [{"id": "t1", "name": "task", "args": {"subagent_type": "scout", "description": "look around"}}]},
            {"text": "The scout reported back."}
        ]}),
    );
    let output = bin()
        .args([
            "run",
            "--json",
            "--backend",
            "filesystem",
            "--model",
            &model,
            "--root",
        ])
        .arg(root.path())
        .arg("go")
        .current_dir(cwd.path())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let events = events_of(&output);
    let started = events
        .iter()
        .find(|e| {
            e["type"] == "run_started" && e["path"] == json!([{"call_id": "t1", "name": "scout"}])
        })
        .expect("the scout ran");
    assert_eq!(
        started["model"],
        format!("scripted:{}", scout_model.display()),
        "the frontmatter `model` drives the subagent"
    );
    let task_done = events
        .iter()
        .find(|e| e["type"] == "tool_call_finished" && e["name"] == "task")
        .unwrap();
    assert_eq!(task_done["status"], "ok");
    assert_eq!(task_done["content"][0]["text"], "scouted the root");
    assert_eq!(events.last().unwrap()["text"], "The scout reported back.");

    // Without --root the current directory is the root, and its broken definition is read.
    let output = bin()
        .args(["run", "--backend", "state", "--model", &model, "go"])
        .current_dir(cwd.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("broken.md"), "{stderr}");
}

#[test]
fn the_demo_hands_the_review_to_the_general_purpose_subagent() {
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/scripts/demo.json");
    let model = format!("scripted:{}", demo.display());
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
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let events = events_of(&output);
    let task_started = events
        .iter()
        .find(|e| e["type"] == "tool_call_started" && e["name"] == "task")
        .expect("the demo starts a subagent");
    assert_eq!(task_started["path"], json!([]));
    assert_eq!(
        task_started["arguments"]["subagent_type"],
        "general-purpose"
    );
    let id = task_started["call_id"].as_str().unwrap();
    let path = json!([{"call_id": id, "name": "general-purpose"}]);
    let nested: Vec<&Value> = events.iter().filter(|e| e["path"] == path).collect();
    assert!(
        nested.iter().any(|e| e["type"] == "run_started"),
        "{nested:?}"
    );
    let read = nested
        .iter()
        .find(|e| e["type"] == "tool_call_finished" && e["name"] == "read_file")
        .expect("the subagent reads the notes");
    assert_eq!(read["status"], "ok");
    assert!(
        read["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("Status: ready"),
        "the subagent sees the parent's files: {read}"
    );
    let answer = "Reviewed: status is ready and one highlight is listed.";
    assert!(
        nested
            .iter()
            .any(|e| e["type"] == "final" && e["text"] == answer),
        "{nested:?}"
    );
    let task_done = events
        .iter()
        .find(|e| e["type"] == "tool_call_finished" && e["call_id"] == id)
        .unwrap();
    assert_eq!(task_done["path"], json!([]));
    assert_eq!(task_done["status"], "ok");
    assert_eq!(
        task_done["content"][0]["text"], answer,
        "the subagent's answer is the main agent's task result"
    );
    let last = events.last().unwrap();
    assert_eq!(last["type"], "final");
    assert_eq!(last["path"], json!([]));
}

#[test]
fn hooks_see_a_subagent_start_and_its_tool_calls() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("hooks.log");
    let hooks = dir.path().join("hooks.json");
    let record = |tag: &str| {
        format!(
            "printf '{tag} ' >> {}; cat >> {}; echo >> {}",
            log.display(),
            log.display(),
            log.display()
        )
    };
    std::fs::write(
        &hooks,
        json!({"hooks": {
            "SubagentStart": [{"hooks": [{"command": record("start")}]}],
            "SubagentStop": [{"hooks": [{"command": record("stop")}]}],
            "PreToolUse": [{"matcher": "LS", "hooks": [{"command": "echo 'no listing in here' >&2; exit 2"}]}],
            "UserPromptSubmit": [{"hooks": [{"command": record("prompt")}]}]
        }})
        .to_string(),
    )
    .unwrap();
    let model = write_script(
        dir.path(),
        json!({
            "turns": [
                {"tool_calls": [{"id": "t1", "name": "task", "args": {"subagent_type": "general-purpose", "description": "find: the answer"}}]},
                {"text": "done"}
            ],
            "conversations": [{"when_task_contains": "find:", "turns": [
                {"tool_calls": [{"id": "l1", "name": "ls", "args": {}}]},
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
            "--hooks",
        ])
        .arg(&hooks)
        .arg("go")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    // The subagent's own `ls` was blocked by the hook, and its model was told why.
    let blocked = stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["type"] == "tool_call_finished" && e["call_id"] == "l1")
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        blocked["content"]
            .to_string()
            .contains("no listing in here"),
        "{blocked}"
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    let tags: Vec<&str> = logged.lines().filter_map(|l| l.split(' ').next()).collect();
    // One prompt (the user's, not the subagent's task), then the subagent around its task.
    assert_eq!(tags, ["prompt", "start", "stop"], "{logged}");
    assert!(
        logged.contains("\"agent_type\":\"general-purpose\""),
        "{logged}"
    );
}

/// `async: true` in a markdown subagent: `run` starts it in the background, answers, waits
/// for it, and its ending starts one more turn whose answer is printed too.
#[test]
fn a_headless_run_waits_for_its_async_subagent_and_runs_the_turn_it_wakes() {
    let dir = tempfile::tempdir().unwrap();
    let agents = dir.path().join("agents");
    std::fs::create_dir(&agents).unwrap();
    std::fs::write(
        agents.join("helper.md"),
        "---\nname: helper\ndescription: Computes answers.\nasync: true\n---\nYou compute.\n",
    )
    .unwrap();
    // The helper looks around for a while, so the parent has answered before it ends.
    let mut helper: Vec<Value> = (0..30)
        .map(|_| json!({"tool_calls": [{"name": "ls", "args": {}}]}))
        .collect();
    helper.push(json!({"text": "42"}));
    let model = write_script(
        dir.path(),
        json!({
            "turns": [
                {"tool_calls": [{"name": "start_async_task", "args": {"subagent_type": "helper", "description": "compute: the answer"}}]},
                {"text": "Started."},
                {"text": "The helper says 42."}
            ],
            "conversations": [{"when_task_contains": "compute:", "turns": helper}]
        }),
    );
    let output = bin()
        .args([
            "run",
            "--json",
            "--backend",
            "state",
            "--background-wait",
            "60",
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
    let finals: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "final" && e["path"] == json!([]))
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(finals, ["Started.", "The helper says 42."]);
    let endings: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "background_task_finished")
        .collect();
    assert_eq!(endings.len(), 1, "{endings:?}");
    assert_eq!(endings[0]["subagent"], "helper");
    assert_eq!(endings[0]["status"], "success");
    assert_eq!(endings[0]["answer"], "42");
}
