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

mod approvals_inside_subagents {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use deepagents::core::{Checkpointer, InMemoryCheckpointer};
    use deepagents::{
        Agent, Decision, DynamicTool, EventSink, InterruptConfig, Message, Run, RunError,
        RunOptions, SubAgent, ToolOutput, decide, open_thread, pending_actions,
    };
    use serde_json::{Value, json};

    use super::{model, task};
    use crate::middleware_capture::Capture;
    use crate::support::{text, tool_results};

    /// A tool that counts its calls.
    fn counting(name: &str, count: &Arc<AtomicUsize>) -> Arc<DynamicTool> {
        let count = Arc::clone(count);
        Arc::new(
            DynamicTool::new(
                name,
                "Counts its calls",
                json!({"type": "object"}),
                move |_, _| {
                    let count = Arc::clone(&count);
                    async move {
                        count.fetch_add(1, Ordering::SeqCst);
                        Ok(ToolOutput::text("counted"))
                    }
                },
            )
            .unwrap(),
        )
    }

    /// The parent starts two subagents in one step: alpha ticks, then calls `guarded` (which
    /// needs approval), then answers; beta ticks and answers.
    fn script() -> Value {
        json!({
            "turns": [
                {"tool_calls": [
                    task("t_a", "alpha: guarded work", "general-purpose"),
                    task("t_b", "beta: plain work", "general-purpose")
                ]},
                {"text": "all done"}
            ],
            "conversations": [
                {"when_task_contains": "alpha:", "turns": [
                    {"tool_calls": [{"id": "tick_a", "name": "tick", "args": {}}]},
                    {"tool_calls": [{"id": "g", "name": "guarded", "args": {"why": "needed"}}]},
                    {"text": "alpha done"}
                ]},
                {"when_task_contains": "beta:", "turns": [
                    {"tool_calls": [{"id": "tick_b", "name": "tick", "args": {}}]},
                    {"text": "beta done"}
                ]}
            ]
        })
    }

    struct Counts {
        guarded: Arc<AtomicUsize>,
        ticks: Arc<AtomicUsize>,
    }

    impl Counts {
        fn new() -> Self {
            Self {
                guarded: Arc::new(AtomicUsize::new(0)),
                ticks: Arc::new(AtomicUsize::new(0)),
            }
        }
        fn get(&self) -> (usize, usize) {
            (
                self.guarded.load(Ordering::SeqCst),
                self.ticks.load(Ordering::SeqCst),
            )
        }
        fn agent(&self) -> Agent {
            Agent::builder(model(script()))
                .dyn_tool(counting("guarded", &self.guarded))
                .dyn_tool(counting("tick", &self.ticks))
                .interrupt_on("guarded", InterruptConfig::default())
                .build()
                .unwrap()
        }
    }

    fn assert_paused_in_alpha(error: &RunError) {
        let RunError::Interrupted(actions) = error else {
            panic!("expected a pause, got {error:?}");
        };
        assert_eq!(actions.len(), 1, "{actions:?}");
        assert_eq!(actions[0].call_id, "g");
        assert_eq!(actions[0].name, "guarded");
        assert_eq!(actions[0].arguments, json!({"why": "needed"}));
        assert_eq!(actions[0].path, ["t_a", "general-purpose"]);
    }

    #[tokio::test]
    async fn a_subagent_needing_approval_pauses_the_parent_and_approval_finishes_it() {
        let counts = Counts::new();
        let agent = counts.agent();
        let (sink, mut events) = EventSink::channel();
        let failure = agent
            .run(Run::from_task("go"), RunOptions::default(), sink)
            .await
            .unwrap_err();
        assert_paused_in_alpha(&failure.error);
        assert_eq!(counts.get(), (0, 2), "both ticked; nothing guarded ran");
        let mut top_level_pause = None;
        while let Ok(event) = events.try_recv() {
            if let deepagents::EventKind::Interrupted { actions } = event.kind
                && event.path.is_empty()
            {
                top_level_pause = Some(actions);
            }
        }
        let announced = top_level_pause.expect("the parent announces the pause");
        assert_eq!(announced[0]["path"], json!(["t_a", "general-purpose"]));

        let mut run = *failure.run;
        let finished = tool_results(&run.state.messages);
        assert_eq!(
            finished.len(),
            1,
            "the sibling's result is kept, alpha has none"
        );
        assert_eq!(finished[0].tool_call_id, "t_b");
        assert_eq!(text(finished[0]), "beta done");
        assert_eq!(pending_actions(&run).len(), 1);

        decide(&mut run, vec![Decision::Approve]).unwrap();
        let output = agent
            .run(run, RunOptions::default(), EventSink::discard())
            .await
            .unwrap();
        assert_eq!(output.text, "all done");
        assert_eq!(
            counts.get(),
            (1, 2),
            "the approved call ran once; neither alpha's earlier tick nor beta ran again"
        );
        let results = tool_results(&output.run.state.messages);
        let ids: Vec<&str> = results.iter().map(|r| r.tool_call_id.as_str()).collect();
        assert_eq!(ids, ["t_b", "t_a"]);
        assert_eq!(text(results[1]), "alpha done");
        assert!(
            !output
                .run
                .state
                .custom
                .contains_key(deepagents::approval::SUBAGENT_RUNS_KEY),
            "the finished subagent's run is dropped from the parent's state"
        );
        assert!(pending_actions(&output.run).is_empty());
    }

    #[tokio::test]
    async fn rejecting_a_subagent_call_tells_the_subagents_model() {
        let guarded = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let worker = SubAgent::new("worker", "Works.", "You work.")
            .model(model(json!({"turns": [
                {"tool_calls": [{"id": "g", "name": "guarded", "args": {}}]},
                {"text": "gave up"}
            ]})))
            .dyn_tool(counting("guarded", &guarded))
            .middleware(Capture {
                requests: Arc::clone(&requests),
            });
        let agent = Agent::builder(model(json!({"turns": [
            {"tool_calls": [task("t_w", "do it", "worker")]},
            {"text": "parent done"}
        ]})))
        .dyn_tool(counting("guarded", &guarded))
        .subagent(worker)
        .interrupt_on("guarded", InterruptConfig::default())
        .build()
        .unwrap();
        let failure = agent.invoke("go").await.unwrap_err();
        let RunError::Interrupted(actions) = &failure.error else {
            panic!("{:?}", failure.error);
        };
        assert_eq!(actions[0].path, ["t_w", "worker"]);
        let mut run = *failure.run;
        decide(
            &mut run,
            vec![Decision::Reject {
                message: Some("not on a Friday".into()),
            }],
        )
        .unwrap();
        let output = agent
            .run(run, RunOptions::default(), EventSink::discard())
            .await
            .unwrap();
        assert_eq!(output.text, "parent done");
        assert_eq!(
            guarded.load(Ordering::SeqCst),
            0,
            "the rejected call never ran"
        );
        assert_eq!(text(tool_results(&output.run.state.messages)[0]), "gave up");
        let requests = requests.lock().unwrap();
        let last = requests.last().expect("the subagent's model was called");
        let rejection = tool_results(&last.messages)
            .into_iter()
            .find(|r| r.tool_call_id == "g")
            .expect("the subagent's model sees a result for the rejected call");
        assert!(
            text(rejection).contains("The user rejected this call: not on a Friday"),
            "{}",
            text(rejection)
        );
        assert_eq!(
            requests.len(),
            2,
            "the subagent's first turn was not asked again"
        );
    }

    #[tokio::test]
    async fn a_pause_inside_a_subagent_survives_a_restart_through_the_checkpointer() {
        let store = Arc::new(InMemoryCheckpointer::new());
        let counts = Counts::new();
        let (run, checkpoint) = open_thread(store.clone(), "t", Some("go".into()))
            .await
            .unwrap();
        let options = RunOptions {
            checkpoint: Some(checkpoint),
            ..RunOptions::default()
        };
        let failure = counts
            .agent()
            .run(run, options, EventSink::discard())
            .await
            .unwrap_err();
        assert_paused_in_alpha(&failure.error);
        drop(failure);

        // A new process: the thread is all there is.
        let (mut run, checkpoint): (Run, _) = open_thread(store.clone(), "t", None).await.unwrap();
        let waiting = pending_actions(&run);
        assert_eq!(waiting.len(), 1);
        assert_eq!(waiting[0].path, ["t_a", "general-purpose"]);
        decide(&mut run, vec![Decision::Approve]).unwrap();
        let options = RunOptions {
            checkpoint: Some(checkpoint),
            ..RunOptions::default()
        };
        let output = counts
            .agent()
            .run(run, options, EventSink::discard())
            .await
            .unwrap();
        assert_eq!(output.text, "all done");
        assert_eq!(counts.get(), (1, 2), "nothing that had run ran again");
        let stored = store.load("t", None).await.unwrap().unwrap();
        assert_eq!(stored.state.messages, output.run.state.messages);
        assert!(
            stored
                .state
                .custom
                .get(deepagents::approval::SUBAGENT_RUNS_KEY)
                .is_none_or(Value::is_null)
        );
        let assistant_turns = stored
            .state
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant(_)))
            .count();
        assert_eq!(assistant_turns, 2, "the parent's model was not asked again");
    }

    #[tokio::test]
    async fn a_pause_two_subagents_deep_resumes_every_level() {
        let guarded = Arc::new(AtomicUsize::new(0));
        let shared = model(json!({
            "turns": [
                {"tool_calls": [task("outer", "level one: delegate", "delegator")]},
                {"text": "top done"}
            ],
            "conversations": [
                {"when_task_contains": "level one:", "turns": [
                    {"tool_calls": [task("inner", "level two: work", "general-purpose")]},
                    {"text": "delegated"}
                ]},
                {"when_task_contains": "level two:", "turns": [
                    {"tool_calls": [{"id": "g", "name": "guarded", "args": {}}]},
                    {"text": "worked"}
                ]}
            ]
        }));
        let delegator = Agent::builder(Arc::clone(&shared))
            .dyn_tool(counting("guarded", &guarded))
            .interrupt_on("guarded", InterruptConfig::default())
            .build()
            .unwrap();
        // The top agent has no interrupt configuration of its own.
        let agent = Agent::builder(shared)
            .general_purpose_subagent(false)
            .subagent(SubAgent::from_agent("delegator", "Delegates.", delegator))
            .build()
            .unwrap();
        let failure = agent.invoke("go").await.unwrap_err();
        let RunError::Interrupted(actions) = &failure.error else {
            panic!("{:?}", failure.error);
        };
        assert_eq!(
            actions[0].path,
            ["outer", "delegator", "inner", "general-purpose"]
        );
        let mut run = *failure.run;
        assert!(decide(&mut run.clone(), vec![]).is_err());
        decide(&mut run, vec![Decision::Approve]).unwrap();
        let output = agent
            .run(run, RunOptions::default(), EventSink::discard())
            .await
            .unwrap();
        assert_eq!(output.text, "top done");
        assert_eq!(guarded.load(Ordering::SeqCst), 1);
        assert_eq!(
            text(tool_results(&output.run.state.messages)[0]),
            "delegated"
        );
    }
}
