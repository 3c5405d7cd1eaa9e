//! Subagents through the `task` tool: isolation, parallel runs, failures, custom agents.

use std::sync::Arc;

use deepagents::backends::{Mode, Operation, PermissionRule, Permissions};
use deepagents::models::ScriptedModel;
use deepagents::{Agent, EventKind, Model, SubAgent, ToolStatus};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::support::{assert_error_containing, text, tool_results};

fn model(script: Value) -> Arc<dyn Model> {
    Arc::new(ScriptedModel::from_json(&script.to_string()).unwrap())
}

fn task(id: &str, description: &str, kind: &str) -> Value {
    json!({"id": id, "name": "task", "args": {"description": description, "subagent_type": kind}})
}

fn write(path: &str, content: &str) -> Value {
    json!({"name": "write_file", "args": {"file_path": path, "content": content}})
}

#[tokio::test]
async fn a_subagent_works_in_a_fresh_context_and_returns_one_answer() {
    let script = json!({
        "turns": [
            {"tool_calls": [task("t1", "alpha: write the report", "general-purpose")]},
            {"text": "The report is written."}
        ],
        "conversations": [{
            "when_task_contains": "alpha:",
            "turns": [
                {"text": "Planning.", "tool_calls": [
                    write("/report.md", "# Report\n"),
                    {"name": "write_todos", "args": {"todos": [{"content": "write", "status": "completed"}]}}
                ]},
                {"text": "Wrote /report.md."}
            ]
        }]
    });
    let agent = Agent::builder(model(script)).todos(true).build().unwrap();
    let output = agent.invoke("go").await.unwrap();
    let results = tool_results(&output.run.state.messages);
    assert_eq!(results.len(), 1, "only the task result reaches the parent");
    assert_eq!(text(results[0]), "Wrote /report.md.");
    assert!(
        output.run.state.files.contains_key("/report.md"),
        "files flow back"
    );
    assert!(
        output.run.state.todos.is_empty(),
        "the subagent's plan stays private"
    );
    assert_eq!(output.run.state.messages.len(), 4);
}

#[tokio::test]
async fn parallel_subagents_merge_files_by_call_order_and_note_collisions() {
    let script = json!({
        "turns": [
            {"tool_calls": [
                task("t_a", "alpha: work", "general-purpose"),
                task("t_b", "beta: work", "general-purpose"),
                task("t_c", "gamma: work", "general-purpose")
            ]},
            {"text": "All done."}
        ],
        "conversations": [
            {"when_task_contains": "alpha:", "turns": [
                {"tool_calls": [write("/shared.txt", "from alpha\n"), write("/a.txt", "a\n")]},
                {"text": "alpha done"}
            ]},
            {"when_task_contains": "beta:", "turns": [
                {"tool_calls": [write("/shared.txt", "from beta\n"), write("/b.txt", "b\n")]},
                {"text": "beta done"}
            ]},
            {"when_task_contains": "gamma:", "turns": [
                {"tool_calls": [write("/c.txt", "c\n")]},
                {"text": "gamma done"}
            ]}
        ]
    });
    let agent = Agent::builder(model(script)).build().unwrap();
    let output = agent.invoke("go").await.unwrap();
    let files: Vec<_> = output.run.state.files.keys().cloned().collect();
    assert_eq!(files, ["/a.txt", "/b.txt", "/c.txt", "/shared.txt"]);
    let shared = &output.run.state.files["/shared.txt"].content;
    assert_eq!(
        *shared,
        deepagents::core::FileContent::Text {
            text: "from beta\n".into()
        },
        "the later call in call order wins"
    );
    let results = tool_results(&output.run.state.messages);
    assert!(text(results[0]).starts_with("alpha done"));
    assert!(
        text(results[0]).contains("changed again by call t_b"),
        "{}",
        text(results[0])
    );
    assert!(
        text(results[1]).contains("also changed by call t_a"),
        "{}",
        text(results[1])
    );
    assert_eq!(text(results[2]), "gamma done");
}

#[tokio::test]
async fn one_failing_subagent_does_not_stop_its_siblings() {
    let script = json!({
        "turns": [
            {"tool_calls": [
                task("t_a", "alpha: fine", "general-purpose"),
                task("t_b", "beta: breaks", "general-purpose"),
                task("t_c", "gamma: fine", "general-purpose")
            ]},
            {"text": "Two of three worked."}
        ],
        "conversations": [
            {"when_task_contains": "alpha:", "turns": [{"text": "alpha ok"}]},
            {"when_task_contains": "beta:", "turns": [
                {"error": {"kind": "authentication", "message": "key revoked"}}
            ]},
            {"when_task_contains": "gamma:", "turns": [{"text": "gamma ok"}]}
        ]
    });
    let agent = Agent::builder(model(script)).build().unwrap();
    let output = agent.invoke("go").await.unwrap();
    let results = tool_results(&output.run.state.messages);
    assert_eq!(text(results[0]), "alpha ok");
    assert_error_containing(
        results[1],
        "The general-purpose subagent failed: model call failed: authentication failed: key revoked",
    );
    assert_eq!(text(results[2]), "gamma ok");
    assert_eq!(output.text, "Two of three worked.");
}

#[tokio::test]
async fn a_custom_subagent_has_its_own_model_tools_permissions_and_structure() {
    let parent = json!({"turns": [
        {"tool_calls": [
            task("t_r", "look into the secrets", "reader"),
            task("t_x", "anything", "nobody")
        ]},
        {"text": "done"}
    ]});
    let reader_model = json!({"turns": [
        {"tool_calls": [
            {"name": "read_file", "args": {"file_path": "/secrets/key.txt"}},
            {"name": "shout", "args": {"text": "hi"}}
        ]},
        {"tool_calls": [{"name": "final_answer", "args": {"found": false}}]}
    ]});
    let shout = deepagents::DynamicTool::new(
        "shout",
        "Upper-case text",
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
        |args, _| async move {
            Ok(deepagents::ToolOutput::text(
                args["text"].as_str().unwrap_or("").to_uppercase(),
            ))
        },
    )
    .unwrap();
    let deny = Permissions::new(vec![PermissionRule {
        operations: vec![Operation::Read],
        paths: vec!["/secrets/**".into()],
        mode: Mode::Deny,
    }])
    .unwrap();
    let reader = SubAgent::new("reader", "Reads things carefully.", "You read.")
        .model(model(reader_model))
        .dyn_tool(Arc::new(shout))
        .permissions(deny)
        .response_format(json!({
            "type": "object",
            "properties": {"found": {"type": "boolean"}},
            "required": ["found"]
        }));
    let agent = Agent::builder(model(parent))
        .subagent(reader)
        .build()
        .unwrap();
    let task_tool = agent
        .tool_specs()
        .iter()
        .find(|t| t.name == "task")
        .unwrap();
    assert!(
        task_tool
            .description
            .contains("- reader: Reads things carefully.")
    );
    assert!(task_tool.description.contains("- general-purpose:"));

    let mut events = agent.stream("go");
    let mut nested = Vec::new();
    while let Some(event) = events.next().await {
        if let EventKind::ToolCallFinished { name, status, .. } = &event.kind
            && !event.path.is_empty()
        {
            nested.push((event.path.clone(), name.clone(), *status));
        }
    }
    let output = events.outcome().await.unwrap();
    let results = tool_results(&output.run.state.messages);
    assert_eq!(text(results[0]), r#"{"found":false}"#);
    assert_eq!(results[0].artifact, Some(json!({"found": false})));
    assert_error_containing(
        results[1],
        "Unknown subagent type `nobody`. Use one of: general-purpose, reader.",
    );
    let path = vec!["t_r".to_owned(), "reader".to_owned()];
    assert!(
        nested.contains(&(path.clone(), "read_file".into(), ToolStatus::Error)),
        "{nested:?}"
    );
    assert!(
        nested.contains(&(path.clone(), "shout".into(), ToolStatus::Ok)),
        "{nested:?}"
    );
    assert!(
        nested.contains(&(path, "final_answer".into(), ToolStatus::Ok)),
        "{nested:?}"
    );
}

#[tokio::test]
async fn nesting_is_limited_with_a_clear_error() {
    let script = json!({
        "turns": [
            {"tool_calls": [task("outer", "level one: delegate", "delegator")]},
            {"text": "done"}
        ],
        "conversations": [
            {"when_task_contains": "level one:", "turns": [
                {"tool_calls": [task("inner", "level two: work", "general-purpose")]},
                {"text": "delegation refused"}
            ]}
        ]
    });
    let shared = model(script);
    let delegator = Agent::builder(Arc::clone(&shared))
        .subagent_limits(1, 4)
        .build()
        .unwrap();
    let agent = Agent::builder(shared)
        .general_purpose_subagent(false)
        .subagent(SubAgent::from_agent("delegator", "Delegates.", delegator))
        .build()
        .unwrap();
    let mut events = agent.stream("go");
    let mut inner_error = None;
    while let Some(event) = events.next().await {
        if let EventKind::ToolCallFinished {
            call_id, content, ..
        } = &event.kind
            && call_id == "inner"
        {
            assert_eq!(event.path, ["outer", "delegator"]);
            inner_error = content.first().and_then(|c| c.as_text()).map(str::to_owned);
        }
    }
    let output = events.outcome().await.unwrap();
    let inner_error = inner_error.unwrap();
    assert!(
        inner_error.contains("nest at most 1 levels deep and this would be level 2"),
        "{inner_error}"
    );
    assert_eq!(
        text(tool_results(&output.run.state.messages)[0]),
        "delegation refused"
    );
}

#[test]
fn subagents_can_be_turned_off_and_names_must_be_unique() {
    let agent = Agent::builder(model(json!({"turns": []})))
        .general_purpose_subagent(false)
        .build()
        .unwrap();
    assert!(agent.tool_specs().iter().all(|t| t.name != "task"));
    let error = Agent::builder(model(json!({"turns": []})))
        .subagent(SubAgent::new("x", "x", "x"))
        .subagent(SubAgent::new("x", "y", "y"))
        .build()
        .err()
        .unwrap();
    assert!(
        error.to_string().contains("two subagents are named `x`"),
        "{error}"
    );
}
