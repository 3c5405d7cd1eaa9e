//! Memory files and skills in the system prompt.

use std::sync::{Arc, Mutex};

use deepagents::backends::{CompositeBackend, InMemoryStore, StateBackend, StoreBackend};
use deepagents::core::{FileContent, FileData};
use deepagents::{Agent, AgentBuilder, ModelRequest, Run};
use serde_json::json;

use crate::middleware_capture::Capture;
use crate::support::scripted;

fn file(text: &str) -> FileData {
    FileData {
        content: FileContent::Text { text: text.into() },
        modified_at_ms: 0,
        created_at_ms: 0,
    }
}

async fn requests_of(
    turns: serde_json::Value,
    files: &[(&str, &str)],
    configure: impl FnOnce(AgentBuilder) -> AgentBuilder,
) -> Vec<ModelRequest> {
    let requests = Arc::new(Mutex::new(Vec::new()));
    let agent = configure(Agent::builder(scripted(turns)).middleware(Capture {
        requests: requests.clone(),
    }))
    .build()
    .unwrap();
    let mut run = Run::from_task("go");
    for (path, text) in files {
        run.state.files.insert((*path).into(), file(text));
    }
    agent
        .run(run, Default::default(), deepagents::EventSink::discard())
        .await
        .unwrap();
    requests.lock().unwrap().clone()
}

#[tokio::test]
async fn memory_is_read_once_in_order_without_comments_and_shown_last() {
    let requests = requests_of(
        json!([
            {"tool_calls": [{"name": "edit_file", "args": {"file_path": "/AGENTS.md", "old_string": "tabs", "new_string": "spaces"}}]},
            {"text": "ok"}
        ]),
        &[
            ("/AGENTS.md", "# Team\nUse tabs.<!-- hidden note -->\n<!--\nmulti\nline\n-->Be brief.\n"),
            ("/project/AGENTS.md", "Run tests before committing.\n"),
        ],
        |b| b.memory(["/AGENTS.md", "/missing/AGENTS.md", "/project/AGENTS.md"]),
    )
    .await;
    let prompt = requests[0].system_prompt.clone().unwrap();
    let memory = prompt.find("## Memory").unwrap();
    assert!(prompt[memory..].contains("data, not instructions"));
    let first = prompt
        .find("### /AGENTS.md\n# Team\nUse tabs.\nBe brief.")
        .unwrap();
    let second = prompt
        .find("### /project/AGENTS.md\nRun tests before committing.")
        .unwrap();
    assert!(memory < first && first < second, "{prompt}");
    assert!(!prompt.contains("hidden note") && !prompt.contains("multi"));
    assert!(!prompt.contains("/missing/"));
    assert!(
        prompt.find("## Subagents").unwrap() < memory,
        "memory comes last"
    );
    // Read once per thread: the edit shows up in the file, not in this thread's prompt.
    let second_prompt = requests[1].system_prompt.clone().unwrap();
    assert!(second_prompt.contains("Use tabs."));
}

#[tokio::test]
async fn memory_in_a_store_route_is_shared_across_threads() {
    let store = Arc::new(InMemoryStore::new());
    let backend = || {
        Arc::new(
            CompositeBackend::new(Arc::new(StateBackend::default()))
                .route("/memories/", Arc::new(StoreBackend::new(store.clone())))
                .unwrap(),
        )
    };
    // Thread A learns something and writes it down.
    requests_of(
        json!([
            {"tool_calls": [{"name": "write_file", "args": {"file_path": "/memories/AGENTS.md", "content": "The user prefers metric units.\n"}}]},
            {"text": "noted"}
        ]),
        &[],
        |b| b.backend(backend()).memory(["/memories/AGENTS.md"]),
    )
    .await;
    // Thread B starts fresh and already knows it.
    let requests = requests_of(json!([{"text": "ok"}]), &[], |b| {
        b.backend(backend()).memory(["/memories/AGENTS.md"])
    })
    .await;
    let prompt = requests[0].system_prompt.clone().unwrap();
    assert!(
        prompt.contains("### /memories/AGENTS.md\nThe user prefers metric units."),
        "{prompt}"
    );
}

#[tokio::test]
async fn skills_are_listed_with_later_sources_winning() {
    let skill = |name: &str, description: &str| {
        format!(
            "---\nname: {name}\ndescription: {description}\nlicense: MIT\nallowed-tools: [read_file]\n---\n# Steps\n1. Do it.\n"
        )
    };
    let deploy_base = skill("deploy", "Old way to deploy.");
    let deploy_project = skill("deploy", "Deploy with the release script.");
    let review = skill("code-review", "Review a diff for bugs.");
    let misnamed = skill("Bad_Name", "Still listed, with a warning.");
    let requests = requests_of(
        json!([{"text": "ok"}]),
        &[
            ("/base/deploy/SKILL.md", &deploy_base),
            ("/base/code-review/SKILL.md", &review),
            ("/project/deploy/SKILL.md", &deploy_project),
            ("/project/odd/SKILL.md", &misnamed),
            ("/project/broken/SKILL.md", "no frontmatter at all"),
            ("/project/nodesc/SKILL.md", "---\nname: nodesc\n---\nbody\n"),
            ("/project/notes.md", "not a skill"),
        ],
        |b| b.skills(["/base", "/project", "/absent"]),
    )
    .await;
    let prompt = requests[0].system_prompt.clone().unwrap();
    let section = &prompt[prompt.find("## Skills").unwrap()..];
    assert!(
        section.contains("- deploy: Deploy with the release script. (/project/deploy/SKILL.md)"),
        "{section}"
    );
    assert!(!section.contains("Old way"));
    assert!(
        section.contains("- code-review: Review a diff for bugs. (/base/code-review/SKILL.md)")
    );
    assert!(section.contains("- Bad_Name: Still listed"));
    assert!(!section.contains("nodesc") && !section.contains("broken"));
    assert!(
        !section.contains("# Steps"),
        "only the listing, not the body"
    );
}

/// The warnings of `output`'s skills, as (skill, rule, skipped) with their messages.
fn skill_warnings(state: &deepagents::AgentState) -> Vec<(String, String, bool, String)> {
    state
        .custom
        .get("skill_warnings")
        .and_then(|w| w.as_array().cloned())
        .unwrap_or_default()
        .iter()
        .map(|w| {
            (
                w["skill"].as_str().unwrap().to_owned(),
                w["rule"].as_str().unwrap().to_owned(),
                w["skipped"].as_bool().unwrap(),
                w["message"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn broken_skill_rules_become_warnings_in_the_event_stream() {
    let long = "d".repeat(1_100);
    let compatibility = "c".repeat(600);
    let files = [
        (
            "/skills/odd/SKILL.md",
            "---\nname: Bad_Name\ndescription: Still listed.\n---\nbody\n".to_owned(),
        ),
        (
            "/skills/wordy/SKILL.md",
            format!("---\nname: wordy\ndescription: {long}\ncompatibility: {compatibility}\n---\n"),
        ),
        (
            "/skills/nodesc/SKILL.md",
            "---\nname: nodesc\n---\nbody\n".to_owned(),
        ),
        (
            "/skills/clean/SKILL.md",
            "---\nname: clean\ndescription: Fine.\n---\n".to_owned(),
        ),
    ];
    let requests = Arc::new(Mutex::new(Vec::new()));
    let agent = Agent::builder(scripted(json!([{"text": "ok"}])))
        .middleware(Capture {
            requests: requests.clone(),
        })
        .skills(["/skills"])
        .build()
        .unwrap();
    let mut run = Run::from_task("go");
    for (path, text) in &files {
        run.state.files.insert((*path).into(), file(text));
    }
    let (sink, mut events) = deepagents::EventSink::channel();
    let output = agent.run(run, Default::default(), sink).await.unwrap();

    let warnings = skill_warnings(&output.run.state);
    let has = |skill: &str, rule: &str, skipped: bool| {
        warnings
            .iter()
            .any(|(s, r, k, _)| s == skill && r == rule && *k == skipped)
    };
    assert!(has("Bad_Name", "name_format", false), "{warnings:?}");
    assert!(has("Bad_Name", "name_mismatch", false), "{warnings:?}");
    assert!(has("wordy", "description_length", false), "{warnings:?}");
    assert!(has("wordy", "compatibility_length", false), "{warnings:?}");
    assert!(has("nodesc", "description_missing", true), "{warnings:?}");
    assert!(
        warnings.iter().all(|(s, ..)| s != "clean"),
        "a good skill has no warning"
    );
    let (_, _, _, message) = warnings.iter().find(|w| w.1 == "name_format").unwrap();
    assert!(message.contains("lowercase"), "{message}");
    // Warned about, and still listed (the description cut to its limit).
    let prompt = requests.lock().unwrap()[0].system_prompt.clone().unwrap();
    assert!(
        prompt.contains("- Bad_Name: Still listed. (/skills/odd/SKILL.md)"),
        "{prompt}"
    );
    assert!(prompt.contains(&format!("- wordy: {} (", &long[..1_024])));
    assert!(!prompt.contains("nodesc"));
    // The warnings reach the event stream with the listing.
    let mut seen = false;
    while let Ok(event) = events.try_recv() {
        if let deepagents::EventKind::StateUpdated { custom, .. } = &event.kind
            && let Some(value) = custom.get("skill_warnings")
        {
            assert_eq!(value, &output.run.state.custom["skill_warnings"]);
            seen = true;
        }
    }
    assert!(seen, "a state_updated event carries the skill warnings");
}

#[tokio::test]
async fn a_skill_file_over_the_size_limit_is_a_warning_on_disk_too() {
    let root = tempfile::tempdir().unwrap();
    for (name, size) in [("huge", 5_000), ("small", 0)] {
        let dir = root.path().join("skills").join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let text = format!(
            "---\nname: {name}\ndescription: The {name} one.\n---\n{}",
            "x".repeat(size)
        );
        std::fs::write(dir.join("SKILL.md"), text).unwrap();
    }
    // A folder without SKILL.md is not a skill, and not worth a warning.
    std::fs::create_dir_all(root.path().join("skills/assets")).unwrap();
    let backend = deepagents::backends::FilesystemBackend::builder(root.path())
        .max_file_size(1_000)
        .build()
        .unwrap();
    let agent = Agent::builder(scripted(json!([{"text": "ok"}])))
        .backend(Arc::new(backend))
        .skills(["/skills"])
        .build()
        .unwrap();
    let output = agent.invoke("go").await.unwrap();
    let warnings = skill_warnings(&output.run.state);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let (skill, rule, skipped, message) = &warnings[0];
    assert_eq!(
        (skill.as_str(), rule.as_str(), *skipped),
        ("huge", "file_size", true)
    );
    assert!(message.contains("skipped"), "{message}");
    let listed = &output.run.state.custom["skills"];
    assert_eq!(listed.as_array().unwrap().len(), 1);
    assert_eq!(listed[0]["name"], "small");
}

#[test]
fn invalid_memory_paths_are_refused_at_build_time() {
    let error = Agent::builder(scripted(json!([])))
        .memory(["relative/AGENTS.md"])
        .build()
        .err()
        .unwrap();
    assert!(
        error.to_string().contains("invalid memory or skills path"),
        "{error}"
    );
}

#[tokio::test]
async fn a_repository_gives_memory_and_linked_skills_and_keeps_what_the_agent_learns() {
    use deepagents::backends::RepoBackend;
    use deepagents_test_support::{bare_repo, git};
    let tmp = tempfile::tempdir().unwrap();
    let skill = "---\nname: review\ndescription: Reviews a change line by line\n---\nBe picky.\n";
    bare_repo(tmp.path(), "review", &[("SKILL.md", skill)]);
    let agent_repo = bare_repo(
        tmp.path(),
        "agent",
        &[
            ("AGENTS.md", "Answer in French.\n"),
            (
                "deepagents.json",
                r#"{"skills": {"review": "../review.git"}}"#,
            ),
        ],
    );
    let backend = || Arc::new(RepoBackend::new(agent_repo.to_str().unwrap()).unwrap());
    let requests = requests_of(
        json!([
            {"tool_calls": [{"name": "edit_file", "args": {"file_path": "/AGENTS.md", "old_string": "French.", "new_string": "French. Use metric units."}}]},
            {"text": "noted"}
        ]),
        &[],
        |b| b.backend(backend()).memory(["/AGENTS.md"]).skills(["/skills"]),
    )
    .await;
    let prompt = requests[0].system_prompt.clone().unwrap();
    assert!(prompt.contains("Answer in French."), "{prompt}");
    assert!(prompt.contains("Reviews a change line by line"), "{prompt}");
    assert!(prompt.contains("/skills/review/SKILL.md"), "{prompt}");
    // What the agent wrote down is a commit, so the next run (another process) starts with it.
    assert_eq!(
        git(&agent_repo, &["show", "main:AGENTS.md"]),
        "Answer in French. Use metric units.\n"
    );
    let requests = requests_of(json!([{"text": "ok"}]), &[], |b| {
        b.backend(backend()).memory(["/AGENTS.md"])
    })
    .await;
    let prompt = requests[0].system_prompt.clone().unwrap();
    assert!(prompt.contains("Use metric units."), "{prompt}");
}

/// The harness only appends to the conversation between model calls (the default middleware
/// included), so each request's messages are known to extend the previous request's and a
/// wire re-encodes only the new ones.
#[tokio::test]
async fn each_request_extends_the_previous_one_without_a_rewrite() {
    let requests = requests_of(
        json!([
            {"tool_calls": [{"name": "write_file", "args": {"file_path": "/a.txt", "content": "a"}}]},
            {"tool_calls": [{"name": "read_file", "args": {"file_path": "/a.txt"}}, {"name": "ls", "args": {}}]},
            {"tool_calls": [{"name": "write_todos", "args": {"todos": [{"content": "x", "status": "pending"}]}}]},
            {"text": "done"}
        ]),
        &[],
        |b| b,
    )
    .await;
    assert_eq!(requests.len(), 4);
    for pair in requests.windows(2) {
        let (before, after) = (&pair[0].messages, &pair[1].messages);
        assert!(after.len() > before.len());
        assert_eq!(
            after.version().common_prefix(&before.version()),
            before.len(),
            "a request's messages were rewritten since the previous request"
        );
    }
}
