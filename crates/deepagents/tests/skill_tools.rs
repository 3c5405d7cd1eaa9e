//! Skills that bring tools: offered only once the model has read the skill.

use std::sync::{Arc, Mutex};

use deepagents::backends::SqliteStore;
use deepagents::core::{Checkpointer, FileContent, FileData};
use deepagents::{
    Agent, AgentBuilder, DynamicTool, ModelRequest, Run, RunOptions, ToolOutput, open_thread,
};
use serde_json::{Value, json};

use crate::middleware_capture::Capture;
use crate::support::{assert_error_containing, scripted, text, tool_results};

fn file(text: &str) -> FileData {
    FileData {
        content: FileContent::Text { text: text.into() },
        modified_at_ms: 0,
        created_at_ms: 0,
    }
}

fn tool(name: &str) -> Arc<DynamicTool> {
    let answer = format!("{name} ran");
    Arc::new(
        DynamicTool::new(
            name,
            "A tool for the tests.",
            json!({"type": "object"}),
            move |_, _| {
                let answer = answer.clone();
                async move { Ok(ToolOutput::text(answer)) }
            },
        )
        .unwrap(),
    )
}

const DEPLOY: &str =
    "---\nname: deploy\ndescription: Deploy the service.\ntools: [my_tool]\n---\nCall my_tool.\n";
const REVIEW: &str = "---\nname: review\ndescription: Review the changes.\nallowed-tools: Read, Grep, Write, Bash(git status:*), review_notes\n---\nLook, then write notes.\n";
const GITHUB: &str = "---\nname: triage\ndescription: Triage issues.\nmetadata:\n  include_tools: mcp__github\n---\nUse the GitHub tools.\n";
const PLAIN: &str = "---\nname: plain\ndescription: Brings nothing.\n---\nJust text.\n";

fn skill_files(run: &mut Run) {
    for (path, text) in [
        ("/skills/deploy/SKILL.md", DEPLOY),
        ("/skills/review/SKILL.md", REVIEW),
        ("/skills/triage/SKILL.md", GITHUB),
        ("/skills/plain/SKILL.md", PLAIN),
    ] {
        run.state.files.insert(path.into(), file(text));
    }
}

fn builder(turns: Value, requests: &Arc<Mutex<Vec<ModelRequest>>>) -> AgentBuilder {
    Agent::builder(scripted(turns))
        .dyn_tool(tool("my_tool"))
        .dyn_tool(tool("other_tool"))
        .dyn_tool(tool("review_notes"))
        .dyn_tool(tool("github__create_issue"))
        .dyn_tool(tool("github__list_issues"))
        .dyn_tool(tool("gitlab__list_issues"))
        .skills(["/skills"])
        .middleware(Capture {
            requests: requests.clone(),
        })
}

fn offered(request: &ModelRequest) -> Vec<&str> {
    request.tools.iter().map(|t| t.name.as_str()).collect()
}

#[tokio::test]
async fn a_skills_tools_are_offered_only_once_it_is_read() {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let agent = builder(
        json!([
            {"tool_calls": [{"name": "my_tool", "args": {}}]},
            {"tool_calls": [{"name": "read_file", "args": {"file_path": "/skills/deploy/SKILL.md", "limit": 3}}]},
            {"tool_calls": [{"name": "my_tool", "args": {}}, {"name": "review_notes", "args": {}}]},
            {"tool_calls": [{"name": "read_file", "args": "{\"file_path\": \"/skills/review/SKILL.md\"}"}]},
            {"text": "done"}
        ]),
        &requests,
    )
    .build()
    .unwrap();
    let mut run = Run::from_task("deploy it");
    skill_files(&mut run);
    let output = agent
        .run(run, Default::default(), deepagents::EventSink::discard())
        .await
        .unwrap();
    let requests = requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 5);

    // Before: the skills' tools are withheld, the listing says what each skill brings.
    let first = offered(&requests[0]);
    for withheld in [
        "my_tool",
        "review_notes",
        "github__create_issue",
        "github__list_issues",
    ] {
        assert!(!first.contains(&withheld), "{withheld} offered: {first:?}");
    }
    for kept in [
        "other_tool",
        "gitlab__list_issues",
        "write_file",
        "read_file",
        "grep",
        "ls",
    ] {
        assert!(first.contains(&kept), "{kept} missing: {first:?}");
    }
    let prompt = requests[0].system_prompt.clone().unwrap();
    let section = &prompt[prompt.find("## Skills").unwrap()..];
    assert!(
        section.contains(
            "- deploy: Deploy the service. (/skills/deploy/SKILL.md) — brings tools: my_tool"
        ),
        "{section}"
    );
    // Claude's names in ours; the harness's own tools are always offered, so not brought.
    assert!(
        section.contains("(/skills/review/SKILL.md) — brings tools: review_notes\n"),
        "{section}"
    );
    assert!(
        section.contains("brings tools: github__create_issue, github__list_issues"),
        "{section}"
    );
    assert!(
        section.contains("- plain: Brings nothing. (/skills/plain/SKILL.md)\n"),
        "{section}"
    );
    assert!(section.contains("offered only once you have read the skill's SKILL.md"));

    // A call before the read is refused, saying which skill to read.
    let results = tool_results(&output.run.state.messages);
    assert_error_containing(results[0], "comes with the skill `deploy`");
    assert_error_containing(results[0], "/skills/deploy/SKILL.md");
    // The request right after the read offers the tool; the other skills' stay withheld.
    assert!(!offered(&requests[1]).contains(&"my_tool"));
    let after = offered(&requests[2]);
    assert!(after.contains(&"my_tool"), "{after:?}");
    assert!(!after.contains(&"review_notes") && !after.contains(&"github__list_issues"));
    assert_eq!(text(results[2]), "my_tool ran");
    assert_error_containing(results[3], "comes with the skill `review`");
    // Arguments sent as a JSON string count as a read too.
    assert!(offered(&requests[4]).contains(&"review_notes"));
    assert_eq!(
        output.run.state.custom["skills_loaded"],
        json!(["deploy", "review"])
    );
}

#[tokio::test]
async fn a_skill_naming_an_mcp_server_brings_all_its_tools() {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let agent = builder(
        json!([
            {"tool_calls": [{"name": "read_file", "args": {"file_path": "/skills/triage/SKILL.md"}}]},
            {"tool_calls": [{"name": "github__list_issues", "args": {}}]},
            {"text": "done"}
        ]),
        &requests,
    )
    .build()
    .unwrap();
    let mut run = Run::from_task("triage");
    skill_files(&mut run);
    let output = agent
        .run(run, Default::default(), deepagents::EventSink::discard())
        .await
        .unwrap();
    let requests = requests.lock().unwrap().clone();
    let after = offered(&requests[1]);
    assert!(after.contains(&"github__create_issue") && after.contains(&"github__list_issues"));
    assert!(!after.contains(&"my_tool"));
    let results = tool_results(&output.run.state.messages);
    assert_eq!(text(results[1]), "github__list_issues ran");
}

#[tokio::test]
async fn a_read_skill_keeps_its_tools_across_a_resume() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("threads.db");
    let open = async || {
        let store: Arc<dyn Checkpointer> =
            Arc::new(SqliteStore::open(&path).await.unwrap().checkpointer());
        store
    };
    // First process: the model reads the skill.
    let requests = Arc::new(Mutex::new(Vec::new()));
    let agent = builder(
        json!([
            {"tool_calls": [{"name": "read_file", "args": {"file_path": "/skills/deploy/SKILL.md"}}]},
            {"text": "read it"}
        ]),
        &requests,
    )
    .build()
    .unwrap();
    let (mut run, checkpoint) = open_thread(open().await, "t", Some("read deploy".to_owned()))
        .await
        .unwrap();
    skill_files(&mut run);
    let options = RunOptions {
        checkpoint: Some(checkpoint),
        ..RunOptions::default()
    };
    agent
        .run(run, options, deepagents::EventSink::discard())
        .await
        .unwrap();
    assert!(!offered(&requests.lock().unwrap()[0]).contains(&"my_tool"));

    // Second process, next turn: the tool is offered from the first request on.
    let requests = Arc::new(Mutex::new(Vec::new()));
    let agent = builder(
        json!([
            {"text": "(turn of the first run)"},
            {"text": "(turn of the first run)"},
            {"tool_calls": [{"name": "my_tool", "args": {}}]},
            {"text": "deployed"}
        ]),
        &requests,
    )
    .build()
    .unwrap();
    let (run, checkpoint) = open_thread(open().await, "t", Some("now deploy".to_owned()))
        .await
        .unwrap();
    let options = RunOptions {
        checkpoint: Some(checkpoint),
        ..RunOptions::default()
    };
    let output = agent
        .run(run, options, deepagents::EventSink::discard())
        .await
        .unwrap();
    assert!(offered(&requests.lock().unwrap()[0]).contains(&"my_tool"));
    let results = tool_results(&output.run.state.messages);
    assert_eq!(text(results.last().unwrap()), "my_tool ran");
}
