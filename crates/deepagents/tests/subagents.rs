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
            nested.push((crate::support::flat(&event.path), name.clone(), *status));
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
            assert_eq!(crate::support::flat(&event.path), ["outer", "delegator"]);
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
        Agent, Decision, EventSink, InterruptConfig, Message, Run, RunOptions, SubAgent, decide,
        open_thread, pending_actions,
    };
    use serde_json::{Value, json};

    use super::fixtures::counting;
    use super::{model, task};
    use crate::middleware_capture::Capture;
    use crate::support::{text, tool_results};

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

    fn assert_paused_in_alpha(output: &deepagents::RunOutput) {
        let actions = crate::support::paused(output);
        assert_eq!(actions.len(), 1, "{actions:?}");
        assert_eq!(actions[0].call_id, "g");
        assert_eq!(actions[0].name, "guarded");
        assert_eq!(actions[0].arguments, json!({"why": "needed"}));
        assert_eq!(
            crate::support::flat(&actions[0].path),
            ["t_a", "general-purpose"]
        );
    }

    #[tokio::test]
    async fn a_subagent_needing_approval_pauses_the_parent_and_approval_finishes_it() {
        let counts = Counts::new();
        let agent = counts.agent();
        let (sink, mut events) = EventSink::channel();
        let failure = agent
            .run(Run::from_task("go"), RunOptions::default(), sink)
            .await
            .unwrap();
        assert_paused_in_alpha(&failure);
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
        assert_eq!(
            crate::support::flat(&announced[0].path),
            ["t_a", "general-purpose"]
        );

        let mut run = failure.run;
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
            output.run.control.paused_subagents.is_empty(),
            "the finished subagent's run is dropped from the parent's control"
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
        let failure = agent.invoke("go").await.unwrap();
        let actions = crate::support::paused(&failure);
        assert_eq!(crate::support::flat(&actions[0].path), ["t_w", "worker"]);
        let mut run = failure.run;
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
            .unwrap();
        assert_paused_in_alpha(&failure);
        drop(failure);

        // A new process: the thread is all there is.
        let (mut run, checkpoint): (Run, _) = open_thread(store.clone(), "t", None).await.unwrap();
        let waiting = pending_actions(&run);
        assert_eq!(waiting.len(), 1);
        assert_eq!(
            crate::support::flat(&waiting[0].path),
            ["t_a", "general-purpose"]
        );
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
        assert!(stored.control.paused_subagents.is_empty());
        // The pause the decisions answered is not left behind in the store.
        assert!(stored.control.pending.is_empty(), "{:?}", stored.control);
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
        let failure = agent.invoke("go").await.unwrap();
        let actions = crate::support::paused(&failure);
        assert_eq!(
            crate::support::flat(&actions[0].path),
            ["outer", "delegator", "inner", "general-purpose"]
        );
        let mut run = failure.run;
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

/// Shared helpers of the tests below.
mod fixtures {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use deepagents::core::{FileContent, FileData};
    use deepagents::{DynamicTool, EventKind, Run, ToolOutput, ToolStatus};
    use serde_json::{Value, json};

    /// A tool that counts its calls.
    pub fn counting(name: &str, count: &Arc<AtomicUsize>) -> Arc<DynamicTool> {
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

    /// How many `work` calls ran at once, at most, and how many finished.
    #[derive(Clone, Default)]
    pub struct Overlap {
        running: Arc<AtomicUsize>,
        pub max: Arc<AtomicUsize>,
        pub done: Arc<AtomicUsize>,
    }

    impl Overlap {
        /// A `work` tool that takes a while and records how many of its calls overlap.
        pub fn tool(&self) -> Arc<DynamicTool> {
            let me = self.clone();
            Arc::new(
                DynamicTool::new(
                    "work",
                    "Works a while",
                    json!({"type": "object"}),
                    move |_, _| {
                        let me = me.clone();
                        async move {
                            let now = me.running.fetch_add(1, Ordering::SeqCst) + 1;
                            me.max.fetch_max(now, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(40)).await;
                            me.running.fetch_sub(1, Ordering::SeqCst);
                            me.done.fetch_add(1, Ordering::SeqCst);
                            Ok(ToolOutput::text("worked"))
                        }
                    },
                )
                .unwrap(),
            )
        }

        pub fn max(&self) -> usize {
            self.max.load(Ordering::SeqCst)
        }

        pub fn done(&self) -> usize {
            self.done.load(Ordering::SeqCst)
        }
    }

    /// A subagent conversation that calls `work` once, then answers `answer`.
    pub fn working(marker: &str, answer: &str) -> Value {
        json!({"when_task_contains": marker, "turns": [
            {"tool_calls": [{"name": "work", "args": {}}]},
            {"text": answer}
        ]})
    }

    /// A run of `task` whose state already holds `files`.
    pub fn run_with_files(task: &str, files: &[(&str, &str)]) -> Run {
        let mut run = Run::from_task(task);
        for (path, text) in files {
            run.state.files.insert(
                (*path).to_owned(),
                FileData {
                    content: FileContent::Text {
                        text: (*text).to_owned(),
                    },
                    modified_at_ms: 0,
                    created_at_ms: 0,
                },
            );
        }
        run
    }

    /// The `tool_call_finished` events of subagents: (path, tool, status, text).
    pub fn nested_results(
        events: &mut tokio::sync::mpsc::UnboundedReceiver<deepagents::Event>,
    ) -> Vec<(Vec<String>, String, ToolStatus, String)> {
        let mut found = Vec::new();
        while let Ok(event) = events.try_recv() {
            if let EventKind::ToolCallFinished {
                name,
                status,
                content,
                ..
            } = &event.kind
                && !event.path.is_empty()
            {
                let text = content
                    .iter()
                    .filter_map(|c| c.as_text())
                    .collect::<Vec<_>>()
                    .join("");
                found.push((
                    crate::support::flat(&event.path),
                    name.clone(),
                    *status,
                    text,
                ));
            }
        }
        found
    }
}

mod configuration {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use deepagents::middleware::Middleware;
    use deepagents::{
        Agent, AgentState, Decision, DynamicTool, EventSink, InterruptConfig, ModelRequest,
        RunOptions, RuntimeContext, SubAgent, ToolOutput, ToolStatus, decide,
    };
    use deepagents_core::RunContext;
    use serde_json::json;

    use super::fixtures::{counting, nested_results, run_with_files};
    use super::{model, task};
    use crate::middleware_capture::Capture;
    use crate::support::{text, tool_results};

    #[tokio::test]
    async fn subagents_inherit_the_interrupt_configuration_unless_they_set_their_own() {
        let guarded = Arc::new(AtomicUsize::new(0));
        let ticks = Arc::new(AtomicUsize::new(0));
        let guarded_call = json!({"tool_calls": [{"id": "g", "name": "guarded", "args": {}}]});
        let shared = model(json!({
            "turns": [
                {"tool_calls": [
                    task("t_i", "inherit: work", "inheritor"),
                    task("t_f", "free: work", "free"),
                    task("t_s", "strict: work", "strict")
                ]},
                {"text": "all done"}
            ],
            "conversations": [
                {"when_task_contains": "inherit:", "turns": [guarded_call, {"text": "inheritor done"}]},
                {"when_task_contains": "free:", "turns": [guarded_call, {"text": "free done"}]},
                {"when_task_contains": "strict:", "turns": [
                    guarded_call,
                    {"tool_calls": [{"id": "k", "name": "tick", "args": {}}]},
                    {"text": "strict done"}
                ]}
            ]
        }));
        let agent = Agent::builder(shared)
            .dyn_tool(counting("guarded", &guarded))
            .dyn_tool(counting("tick", &ticks))
            .interrupt_on("guarded", InterruptConfig::default())
            .general_purpose_subagent(false)
            .subagent(SubAgent::new("inheritor", "Inherits.", "You work."))
            .subagent(SubAgent::new("free", "Never asks.", "You work.").no_interrupts())
            .subagent(
                SubAgent::new("strict", "Asks about ticks.", "You work.")
                    .interrupt_on("tick", InterruptConfig::default()),
            )
            .build()
            .unwrap();
        let failure = agent.invoke("go").await.unwrap();
        let actions = crate::support::paused(&failure);
        let waiting: Vec<(&str, Vec<String>)> = actions
            .iter()
            .map(|a| (a.name.as_str(), crate::support::flat(&a.path)))
            .collect();
        assert_eq!(
            waiting,
            [
                ("guarded", vec!["t_i".to_owned(), "inheritor".to_owned()]),
                ("tick", vec!["t_s".to_owned(), "strict".to_owned()]),
            ],
            "the inheritor asks about `guarded`; `strict` asks only about `tick`; `free` never asks"
        );
        assert_eq!(
            guarded.load(Ordering::SeqCst),
            2,
            "free and strict ran `guarded` without asking"
        );
        assert_eq!(ticks.load(Ordering::SeqCst), 0);
        let mut run = failure.run;
        assert_eq!(
            text(tool_results(&run.state.messages)[0]),
            "free done",
            "the subagent without interrupts finished"
        );
        decide(&mut run, vec![Decision::Approve, Decision::Approve]).unwrap();
        let output = agent
            .run(run, RunOptions::default(), EventSink::discard())
            .await
            .unwrap();
        assert_eq!(output.text, "all done");
        assert_eq!(guarded.load(Ordering::SeqCst), 3);
        assert_eq!(ticks.load(Ordering::SeqCst), 1);
    }

    fn skill(name: &str, description: &str) -> String {
        format!("---\nname: {name}\ndescription: {description}\n---\nSteps.\n")
    }

    #[tokio::test]
    async fn a_subagent_lists_its_own_skills_and_not_the_parents() {
        let parent_requests = Arc::new(Mutex::new(Vec::new()));
        let child_requests = Arc::new(Mutex::new(Vec::new()));
        let skilled = SubAgent::new("skilled", "Has skills.", "You use skills.")
            .skills(["/skills/child"])
            .middleware(Capture {
                requests: Arc::clone(&child_requests),
            });
        let agent = Agent::builder(model(json!({
            "turns": [
                {"tool_calls": [task("t1", "skill: do it", "skilled")]},
                {"text": "done"}
            ],
            "conversations": [{"when_task_contains": "skill:", "turns": [{"text": "did it"}]}]
        })))
        .skills(["/skills/parent"])
        .subagent(skilled)
        .middleware(Capture {
            requests: Arc::clone(&parent_requests),
        })
        .build()
        .unwrap();
        let run = run_with_files(
            "go",
            &[
                (
                    "/skills/parent/release-notes/SKILL.md",
                    &skill("release-notes", "Writes release notes."),
                ),
                (
                    "/skills/child/code-review/SKILL.md",
                    &skill("code-review", "Reviews code."),
                ),
            ],
        );
        let output = agent
            .run(run, RunOptions::default(), EventSink::discard())
            .await
            .unwrap();
        assert_eq!(text(tool_results(&output.run.state.messages)[0]), "did it");
        let prompt = |requests: &Arc<Mutex<Vec<ModelRequest>>>| {
            requests.lock().unwrap()[0]
                .system_prompt
                .clone()
                .unwrap_or_default()
        };
        let child = prompt(&child_requests);
        assert!(child.contains("code-review"), "{child}");
        assert!(
            child.contains("/skills/child/code-review/SKILL.md"),
            "{child}"
        );
        assert!(!child.contains("release-notes"), "{child}");
        let parent = prompt(&parent_requests);
        assert!(parent.contains("release-notes"), "{parent}");
        assert!(!parent.contains("code-review"), "{parent}");
    }

    #[tokio::test]
    async fn a_subagent_named_general_purpose_replaces_the_default_one() {
        let own = SubAgent::new("general-purpose", "My own helper.", "You help.")
            .model(model(json!({"turns": [{"text": "from my own helper"}]})));
        let agent = Agent::builder(model(json!({"turns": [
            {"tool_calls": [task("t1", "anything", "general-purpose")]},
            {"text": "done"}
        ]})))
        .subagent(own)
        .build()
        .unwrap();
        let description = &agent
            .tool_specs()
            .iter()
            .find(|t| t.name == "task")
            .unwrap()
            .description;
        assert_eq!(
            description.matches("- general-purpose:").count(),
            1,
            "{description}"
        );
        assert!(description.contains("- general-purpose: My own helper."));
        assert!(!description.contains("An agent with the same tools as you"));
        let output = agent.invoke("go").await.unwrap();
        assert_eq!(
            text(tool_results(&output.run.state.messages)[0]),
            "from my own helper"
        );
    }

    fn shout() -> Arc<DynamicTool> {
        Arc::new(
            DynamicTool::new(
                "shout",
                "Upper-case text",
                json!({"type": "object", "properties": {"text": {"type": "string"}}}),
                |args, _| async move {
                    Ok(ToolOutput::text(
                        args["text"].as_str().unwrap_or("").to_uppercase(),
                    ))
                },
            )
            .unwrap(),
        )
    }

    #[tokio::test]
    async fn subagents_inherit_the_parents_tools_unless_they_set_their_own() {
        let shout_call = json!({"tool_calls": [{"name": "shout", "args": {"text": "hi"}}]});
        let whisper = DynamicTool::new(
            "whisper",
            "Lower-case text",
            json!({"type": "object"}),
            |_, _| async move { Ok(ToolOutput::text("psst")) },
        )
        .unwrap();
        let agent = Agent::builder(model(json!({
            "turns": [
                {"tool_calls": [
                    task("t_g", "inherit: shout", "general-purpose"),
                    task("t_o", "own: shout", "own-tools")
                ]},
                {"text": "done"}
            ],
            "conversations": [
                {"when_task_contains": "inherit:", "turns": [shout_call, {"text": "shouted"}]},
                {"when_task_contains": "own:", "turns": [shout_call, {"text": "could not shout"}]}
            ]
        })))
        .dyn_tool(shout())
        .subagent(
            SubAgent::new("own-tools", "Has its own tools.", "You whisper.")
                .dyn_tool(Arc::new(whisper)),
        )
        .build()
        .unwrap();
        let (sink, mut events) = EventSink::channel();
        agent
            .run(
                deepagents::Run::from_task("go"),
                RunOptions::default(),
                sink,
            )
            .await
            .unwrap();
        let results = nested_results(&mut events);
        let shouts: Vec<(String, ToolStatus, String)> = results
            .into_iter()
            .filter(|(_, name, _, _)| name == "shout")
            .map(|(path, _, status, text)| (path[1].clone(), status, text))
            .collect();
        assert_eq!(shouts.len(), 2, "{shouts:?}");
        assert!(
            shouts.contains(&("general-purpose".into(), ToolStatus::Ok, "HI".into())),
            "{shouts:?}"
        );
        let own = shouts.iter().find(|(who, ..)| who == "own-tools").unwrap();
        assert_eq!(own.1, ToolStatus::Error);
        assert!(own.2.contains("Unknown tool `shout`"), "{}", own.2);
        assert!(own.2.contains("whisper"), "{}", own.2);
    }

    /// Adds a line to the system prompt.
    struct Pirate;

    #[async_trait]
    impl Middleware for Pirate {
        fn name(&self) -> &str {
            "pirate"
        }
        async fn before_model(
            &self,
            _ctx: &RunContext,
            request: &mut ModelRequest,
            _state: &AgentState,
        ) -> Result<(), deepagents::middleware::MiddlewareError> {
            request.push_system_section("Speak like a pirate.");
            Ok(())
        }
    }

    #[tokio::test]
    async fn a_subagents_own_middleware_shapes_only_its_requests() {
        let parent_requests = Arc::new(Mutex::new(Vec::new()));
        let child_requests = Arc::new(Mutex::new(Vec::new()));
        let pirate = SubAgent::new("pirate", "Talks like a pirate.", "You are a pirate.")
            .middleware(Pirate)
            .middleware(Capture {
                requests: Arc::clone(&child_requests),
            });
        let agent = Agent::builder(model(json!({
            "turns": [
                {"tool_calls": [
                    task("t_p", "arr: greet", "pirate"),
                    task("t_g", "plain: greet", "general-purpose")
                ]},
                {"text": "done"}
            ],
            "conversations": [
                {"when_task_contains": "arr:", "turns": [{"text": "Ahoy"}]},
                {"when_task_contains": "plain:", "turns": [{"text": "Hello"}]}
            ]
        })))
        .subagent(pirate)
        .middleware(Capture {
            requests: Arc::clone(&parent_requests),
        })
        .build()
        .unwrap();
        let output = agent.invoke("go").await.unwrap();
        let results = tool_results(&output.run.state.messages);
        assert_eq!(text(results[0]), "Ahoy");
        assert_eq!(text(results[1]), "Hello");
        let child = child_requests.lock().unwrap();
        assert_eq!(
            child.len(),
            1,
            "the middleware saw only the pirate's request"
        );
        assert_eq!(child[0].messages[0].text(), "arr: greet");
        let prompt = child[0].system_prompt.clone().unwrap_or_default();
        assert!(prompt.starts_with("You are a pirate."), "{prompt}");
        assert!(prompt.contains("Speak like a pirate."), "{prompt}");
        let parent = parent_requests.lock().unwrap();
        assert_eq!(parent.len(), 2);
        assert!(
            parent.iter().all(|r| !r
                .system_prompt
                .clone()
                .unwrap_or_default()
                .contains("pirate.")),
            "the parent's requests are not touched"
        );
    }

    #[tokio::test]
    async fn the_runtime_context_reaches_the_tools_of_subagents() {
        let whoami = DynamicTool::new(
            "whoami",
            "The current user",
            json!({"type": "object"}),
            |_, ctx| async move {
                let user = ctx
                    .run
                    .runtime
                    .get::<String>()
                    .cloned()
                    .unwrap_or_else(|| "nobody".to_owned());
                Ok(ToolOutput::text(user))
            },
        )
        .unwrap();
        let agent = Agent::builder(model(json!({
            "turns": [
                {"tool_calls": [task("t1", "who: ask", "general-purpose")]},
                {"text": "done"}
            ],
            "conversations": [{"when_task_contains": "who:", "turns": [
                {"tool_calls": [{"name": "whoami", "args": {}}]},
                {"text": "asked"}
            ]}]
        })))
        .dyn_tool(Arc::new(whoami))
        .build()
        .unwrap();
        let (sink, mut events) = EventSink::channel();
        let options = RunOptions {
            runtime: RuntimeContext::new("user-42".to_owned()),
            ..RunOptions::default()
        };
        agent
            .run(deepagents::Run::from_task("go"), options, sink)
            .await
            .unwrap();
        let results = nested_results(&mut events);
        let whoami = results
            .iter()
            .find(|(_, name, ..)| name == "whoami")
            .unwrap();
        assert_eq!(whoami.0, ["t1", "general-purpose"]);
        assert_eq!(whoami.3, "user-42");
    }

    #[tokio::test]
    async fn the_answer_is_the_last_non_empty_assistant_text() {
        let agent = Agent::builder(model(json!({
            "turns": [
                {"tool_calls": [
                    task("t_a", "alpha: look", "general-purpose"),
                    task("t_b", "beta: say nothing", "general-purpose")
                ]},
                {"text": "done"}
            ],
            "conversations": [
                {"when_task_contains": "alpha:", "turns": [
                    {"text": "Found it: 42.", "tool_calls": [{"name": "ls", "args": {}}]},
                    {"text": "  \n"}
                ]},
                {"when_task_contains": "beta:", "turns": [{"text": ""}]}
            ]
        })))
        .build()
        .unwrap();
        let output = agent.invoke("go").await.unwrap();
        let results = tool_results(&output.run.state.messages);
        assert_eq!(text(results[0]), "Found it: 42.");
        assert_eq!(
            text(results[1]),
            "(the subagent finished without an answer)"
        );
    }
}

mod state_and_failures {
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;
    use deepagents::core::{FileContent, ModelResponse};
    use deepagents::{
        Agent, DynamicTool, EventSink, Model, ModelError, ModelRequest, Reducer, RunOptions,
        StateUpdate, SubAgent, ToolOutput, ToolStatus,
    };
    use serde_json::{Value, json};

    use super::fixtures::run_with_files;
    use super::{model, task, write};
    use crate::support::{assert_error_containing, text, tool_results};

    /// A tool that records the custom state it sees and proposes new values for every key.
    fn peek(seen: &Arc<Mutex<Vec<(String, Value)>>>, who: &str) -> Arc<DynamicTool> {
        let seen = Arc::clone(seen);
        let who = who.to_owned();
        Arc::new(
            DynamicTool::new(
                "peek",
                "Looks at the state",
                json!({"type": "object"}),
                move |_, ctx| {
                    let seen = Arc::clone(&seen);
                    let who = who.clone();
                    async move {
                        let custom = serde_json::to_value(&ctx.state.custom).unwrap();
                        seen.lock().unwrap().push((who.clone(), custom));
                        let mut update = StateUpdate::default();
                        for key in ["project", "secret", "child_only"] {
                            update = update.with_custom(key, json!(format!("changed by {who}")));
                        }
                        Ok(ToolOutput::text("peeked").with_update(update))
                    }
                },
            )
            .unwrap(),
        )
    }

    #[tokio::test]
    async fn shared_custom_values_reach_subagents_and_private_ones_never_leak() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let peek_turns = json!([
            {"tool_calls": [{"name": "peek", "args": {}}]},
            {"text": "peeked"}
        ]);
        let shared = model(json!({
            "turns": [
                {"tool_calls": [
                    task("t_g", "spec: peek", "general-purpose"),
                    task("t_in", "insider: peek", "insider"),
                    task("t_out", "outsider: peek", "outsider")
                ]},
                {"text": "done"}
            ],
            "conversations": [
                {"when_task_contains": "spec:", "turns": peek_turns},
                {"when_task_contains": "insider:", "turns": peek_turns},
                {"when_task_contains": "outsider:", "turns": peek_turns}
            ]
        }));
        // Pre-built subagents receive only the keys they declare as shared too.
        let insider = Agent::builder(Arc::clone(&shared))
            .dyn_tool(peek(&seen, "insider"))
            .state_value("project", Reducer::Replace)
            .private_state_value("secret", Reducer::Replace)
            .private_state_value("child_only", Reducer::Replace)
            .general_purpose_subagent(false)
            .build()
            .unwrap();
        let outsider = Agent::builder(Arc::clone(&shared))
            .dyn_tool(peek(&seen, "outsider"))
            .private_state_value("project", Reducer::Replace)
            .state_value("secret", Reducer::Replace)
            .state_value("child_only", Reducer::Replace)
            .general_purpose_subagent(false)
            .build()
            .unwrap();
        let agent = Agent::builder(shared)
            .dyn_tool(peek(&seen, "spec"))
            .state_value("project", Reducer::Replace)
            .private_state_value("secret", Reducer::Replace)
            .state_value("child_only", Reducer::Replace)
            .skills(["/skills"])
            .subagent(SubAgent::from_agent(
                "insider",
                "Shares the project.",
                insider,
            ))
            .subagent(SubAgent::from_agent(
                "outsider",
                "Keeps the project private.",
                outsider,
            ))
            .build()
            .unwrap();
        let mut run = run_with_files(
            "go",
            &[(
                "/skills/notes/SKILL.md",
                "---\nname: notes\ndescription: Notes.\n---\nx\n",
            )],
        );
        run.state.custom.insert("project".into(), json!("apollo"));
        run.state.custom.insert("secret".into(), json!("hunter2"));
        let output = agent
            .run(run, RunOptions::default(), EventSink::discard())
            .await
            .unwrap();
        let results = tool_results(&output.run.state.messages);
        assert!(
            results.iter().all(|r| r.status == ToolStatus::Ok),
            "{results:?}"
        );

        let seen = seen.lock().unwrap();
        let custom_of = |who: &str| {
            seen.iter()
                .find(|(name, _)| name == who)
                .map(|(_, custom)| custom.clone())
                .unwrap()
        };
        // The spec subagent inherits the declarations: the shared key arrives, the private
        // one and the parent's middleware state (its skill listing) do not.
        let spec = custom_of("spec");
        assert_eq!(spec["project"], "apollo", "{spec}");
        assert!(spec.get("secret").is_none(), "{spec}");
        assert!(spec.get("skills").is_none(), "{spec}");
        let insider = custom_of("insider");
        assert_eq!(insider["project"], "apollo", "{insider}");
        assert!(insider.get("secret").is_none(), "{insider}");
        let outsider = custom_of("outsider");
        assert!(
            outsider.get("project").is_none(),
            "a key the subagent keeps private is not handed to it: {outsider}"
        );
        assert!(
            outsider.get("secret").is_none(),
            "a key the parent keeps private is not handed down: {outsider}"
        );

        // Nothing a subagent changed in custom state comes back: only files and the answer do.
        let custom = &output.run.state.custom;
        assert_eq!(custom["project"], "apollo");
        assert_eq!(custom["secret"], "hunter2");
        assert!(custom.get("child_only").is_none(), "{custom:?}");
        assert!(
            custom.contains_key("skills"),
            "the parent keeps its own listing"
        );
    }

    #[tokio::test]
    async fn a_failed_subagent_keeps_its_file_changes_and_its_result_says_it_failed() {
        let agent = Agent::builder(model(json!({
            "turns": [
                {"tool_calls": [task("t1", "draft: then break", "general-purpose")]},
                {"text": "noted"}
            ],
            "conversations": [{"when_task_contains": "draft:", "turns": [
                {"tool_calls": [write("/draft.md", "half done\n"), {"name": "delete", "args": {"path": "/old.md"}}]},
                {"error": {"kind": "authentication", "message": "key revoked"}}
            ]}]
        })))
        .build()
        .unwrap();
        let run = run_with_files("go", &[("/old.md", "old\n")]);
        let output = agent
            .run(run, RunOptions::default(), EventSink::discard())
            .await
            .unwrap();
        let result = tool_results(&output.run.state.messages)[0];
        assert_error_containing(
            result,
            "The general-purpose subagent failed: model call failed: authentication failed: key revoked.",
        );
        assert!(
            text(result).contains("Its file changes are kept: /draft.md, /old.md."),
            "{}",
            text(result)
        );
        assert_eq!(
            output.run.state.files["/draft.md"].content,
            FileContent::Text {
                text: "half done\n".into()
            },
            "on the state backend, as on disk, what it wrote before failing stays"
        );
        assert!(!output.run.state.files.contains_key("/old.md"));
    }

    /// A model that panics.
    struct Exploding;

    #[async_trait]
    impl Model for Exploding {
        fn id(&self) -> &str {
            "exploding"
        }
        async fn generate(&self, _request: &ModelRequest) -> Result<ModelResponse, ModelError> {
            panic!("model exploded");
        }
    }

    #[tokio::test]
    async fn a_panicking_subagent_fails_only_its_own_call() {
        let agent = Agent::builder(model(json!({
            "turns": [
                {"tool_calls": [
                    task("t_a", "alpha: work", "general-purpose"),
                    task("t_b", "boom", "crasher"),
                    task("t_c", "gamma: work", "general-purpose")
                ]},
                {"text": "two of three"}
            ],
            "conversations": [
                {"when_task_contains": "alpha:", "turns": [
                    {"tool_calls": [write("/a.txt", "a\n")]},
                    {"text": "alpha ok"}
                ]},
                {"when_task_contains": "gamma:", "turns": [{"text": "gamma ok"}]}
            ]
        })))
        .subagent(SubAgent::new("crasher", "Crashes.", "You crash.").model(Arc::new(Exploding)))
        .build()
        .unwrap();
        let output = agent.invoke("go").await.unwrap();
        let results = tool_results(&output.run.state.messages);
        assert_eq!(results.len(), 3);
        assert_eq!(text(results[0]), "alpha ok");
        assert_error_containing(
            results[1],
            "The crasher subagent crashed (panic: model exploded)",
        );
        assert_eq!(text(results[2]), "gamma ok");
        assert!(output.run.state.files.contains_key("/a.txt"));
        assert_eq!(output.text, "two of three");
    }
}

mod limits {
    use std::sync::Arc;
    use std::time::Duration;

    use deepagents::{Agent, EventKind, SubAgent};
    use futures::StreamExt;
    use serde_json::json;

    use super::fixtures::{Overlap, working};
    use super::{model, task};
    use crate::support::{text, tool_results};

    /// A parent that starts three subagents in one step, each calling `work` once.
    fn three_workers() -> serde_json::Value {
        json!({
            "turns": [
                {"tool_calls": [
                    task("t_a", "alpha: work", "general-purpose"),
                    task("t_b", "beta: work", "general-purpose"),
                    task("t_c", "gamma: work", "general-purpose")
                ]},
                {"text": "all done"}
            ],
            "conversations": [
                working("alpha:", "alpha done"),
                working("beta:", "beta done"),
                working("gamma:", "gamma done")
            ]
        })
    }

    async fn run_three(agent: Agent) {
        let output = tokio::time::timeout(Duration::from_secs(20), agent.invoke("go"))
            .await
            .expect("the subagents finished")
            .unwrap();
        let answers: Vec<String> = tool_results(&output.run.state.messages)
            .into_iter()
            .map(text)
            .collect();
        assert_eq!(answers, ["alpha done", "beta done", "gamma done"]);
    }

    #[tokio::test]
    async fn parallel_subagents_really_overlap() {
        let overlap = Overlap::default();
        let agent = Agent::builder(model(three_workers()))
            .dyn_tool(overlap.tool())
            .build()
            .unwrap();
        run_three(agent).await;
        assert_eq!(overlap.done(), 3);
        assert_eq!(overlap.max(), 3, "all three worked at the same time");
    }

    #[tokio::test]
    async fn with_a_limit_of_two_three_subagents_never_run_more_than_two_at_once() {
        let overlap = Overlap::default();
        let agent = Agent::builder(model(three_workers()))
            .dyn_tool(overlap.tool())
            .subagent_limits(3, 2)
            .build()
            .unwrap();
        run_three(agent).await;
        assert_eq!(overlap.done(), 3, "the third waited its turn, then ran");
        assert_eq!(overlap.max(), 2);
    }

    #[tokio::test]
    async fn the_concurrency_limit_of_the_top_agent_bounds_nested_agents() {
        let overlap = Overlap::default();
        let shared = model(json!({
            "turns": [
                {"tool_calls": [task("outer", "delegate: three at once", "delegator")]},
                {"text": "top done"}
            ],
            "conversations": [
                {"when_task_contains": "delegate:", "turns": [
                    {"tool_calls": [
                        task("t_a", "alpha: work", "general-purpose"),
                        task("t_b", "beta: work", "general-purpose"),
                        task("t_c", "gamma: work", "general-purpose")
                    ]},
                    {"text": "delegated"}
                ]},
                working("alpha:", "alpha done"),
                working("beta:", "beta done"),
                working("gamma:", "gamma done")
            ]
        }));
        // The delegator on its own would run all three at once (its limit is 8).
        let delegator = Agent::builder(Arc::clone(&shared))
            .dyn_tool(overlap.tool())
            .build()
            .unwrap();
        let agent = Agent::builder(shared)
            .general_purpose_subagent(false)
            .subagent(SubAgent::from_agent("delegator", "Delegates.", delegator))
            .subagent_limits(3, 1)
            .build()
            .unwrap();
        let output = tokio::time::timeout(Duration::from_secs(20), agent.invoke("go"))
            .await
            .expect("nesting under a limit of one does not deadlock")
            .unwrap();
        assert_eq!(output.text, "top done");
        assert_eq!(
            text(tool_results(&output.run.state.messages)[0]),
            "delegated"
        );
        assert_eq!(overlap.done(), 3);
        assert_eq!(
            overlap.max(),
            1,
            "the top agent's limit of one holds inside the delegator"
        );
    }

    #[tokio::test]
    async fn the_strictest_depth_limit_along_the_chain_applies() {
        let shared = model(json!({
            "turns": [
                {"tool_calls": [task("outer", "level one: delegate", "delegator")]},
                {"text": "done"}
            ],
            "conversations": [
                {"when_task_contains": "level one:", "turns": [
                    {"tool_calls": [task("inner", "level two: work", "general-purpose")]},
                    {"text": "delegation refused"}
                ]},
                {"when_task_contains": "level two:", "turns": [{"text": "should not run"}]}
            ]
        }));
        // The child on default limits (depth 3) under a parent that allows one level.
        let delegator = Agent::builder(Arc::clone(&shared)).build().unwrap();
        let agent = Agent::builder(shared)
            .general_purpose_subagent(false)
            .subagent(SubAgent::from_agent("delegator", "Delegates.", delegator))
            .subagent_limits(1, 4)
            .build()
            .unwrap();
        let mut events = agent.stream("go");
        let mut inner_error = None;
        let mut level_two_ran = false;
        while let Some(event) = events.next().await {
            if event.path.len() > 2 {
                level_two_ran = true;
            }
            if let EventKind::ToolCallFinished {
                call_id, content, ..
            } = &event.kind
                && call_id == "inner"
            {
                inner_error = content.first().and_then(|c| c.as_text()).map(str::to_owned);
            }
        }
        let output = events.outcome().await.unwrap();
        let inner_error = inner_error.unwrap();
        assert!(
            inner_error.contains("nest at most 1 levels deep and this would be level 2"),
            "{inner_error}"
        );
        assert!(!level_two_ran, "no second-level subagent started");
        assert_eq!(
            text(tool_results(&output.run.state.messages)[0]),
            "delegation refused"
        );
    }
}

/// Two parallel subagents that create the same file on disk: `write_file` only creates, so
/// exactly one of them writes it (whole, never a mix) and the other is refused, leaving it as
/// it is; with only one change there is nothing to note.
#[tokio::test]
async fn parallel_subagents_creating_one_file_on_disk_leave_one_version_whole() {
    let root = tempfile::tempdir().unwrap();
    let a = "A".repeat(100_000);
    let b = "B".repeat(100_000);
    let script = json!({
        "turns": [
            {"tool_calls": [task("ta", "LEFT: write", "general-purpose"), task("tb", "RIGHT: write", "general-purpose")]},
            {"text": "done"}
        ],
        "conversations": [
            {"when_task_contains": "LEFT", "turns": [{"tool_calls": [write("/shared.txt", &a)]}, {"text": "left wrote"}]},
            {"when_task_contains": "RIGHT", "turns": [{"tool_calls": [write("/shared.txt", &b)]}, {"text": "right wrote"}]}
        ]
    });
    let backend = deepagents::backends::FilesystemBackend::new(root.path()).unwrap();
    let agent = Agent::builder(model(script))
        .backend(Arc::new(backend))
        .build()
        .unwrap();
    let output = agent.invoke("go").await.unwrap();
    let on_disk = std::fs::read_to_string(root.path().join("shared.txt")).unwrap();
    assert!(on_disk == a || on_disk == b, "a torn file");
    let results = tool_results(&output.run.state.messages);
    assert_eq!(results.len(), 2);
    for result in &results {
        assert!(
            !text(result).contains("at the same time"),
            "only one call changed the file: {}",
            text(result)
        );
    }
    assert_eq!(
        output.changed_files.into_iter().collect::<Vec<_>>(),
        ["/shared.txt"]
    );
}

/// Two parallel subagents that edit the same file on disk: the edits apply one after the other
/// (both kept), and each `task` result says the other call changed the file too.
#[tokio::test]
async fn parallel_subagents_editing_one_file_on_disk_are_told_of_each_other() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("shared.txt"), "left\nright\n").unwrap();
    let a = "A".repeat(100_000);
    let b = "B".repeat(100_000);
    let edit = |old: &str, new: &str| json!({"name": "edit_file", "args": {"file_path": "/shared.txt", "old_string": old, "new_string": new}});
    let script = json!({
        "turns": [
            {"tool_calls": [task("ta", "LEFT: edit", "general-purpose"), task("tb", "RIGHT: edit", "general-purpose")]},
            {"text": "done"}
        ],
        "conversations": [
            {"when_task_contains": "LEFT", "turns": [{"tool_calls": [edit("left", &a)]}, {"text": "left edited"}]},
            {"when_task_contains": "RIGHT", "turns": [{"tool_calls": [edit("right", &b)]}, {"text": "right edited"}]}
        ]
    });
    let backend = deepagents::backends::FilesystemBackend::new(root.path()).unwrap();
    let agent = Agent::builder(model(script))
        .backend(Arc::new(backend))
        .build()
        .unwrap();
    let output = agent.invoke("go").await.unwrap();
    let on_disk = std::fs::read_to_string(root.path().join("shared.txt")).unwrap();
    assert_eq!(on_disk, format!("{a}\n{b}\n"), "both edits are kept");
    let results = tool_results(&output.run.state.messages);
    assert_eq!(results.len(), 2);
    assert!(
        text(results[0]).contains("/shared.txt was also changed by call tb at the same time"),
        "{}",
        text(results[0])
    );
    assert!(
        text(results[1]).contains("/shared.txt was also changed by call ta at the same time"),
        "{}",
        text(results[1])
    );
    assert_eq!(
        output.changed_files.into_iter().collect::<Vec<_>>(),
        ["/shared.txt"]
    );
}

/// The parent's permission rules bind the subagents built from its configuration: the
/// general-purpose subagent can neither read nor write what the parent may not, and sees
/// the file it may.
#[tokio::test]
async fn subagents_inherit_the_parents_permissions() {
    let parent = json!({"turns": [
        {"tool_calls": [{"id": "t", "name": "task", "args": {"description": "look", "subagent_type": "general-purpose"}}]},
        {"text": "done"}
    ]});
    let child = json!({"turns": [
        {"tool_calls": [
            {"id": "r", "name": "read_file", "args": {"file_path": "/secrets/key.txt"}},
            {"id": "w", "name": "write_file", "args": {"file_path": "/secrets/new.txt", "content": "x"}},
            {"id": "o", "name": "read_file", "args": {"file_path": "/open.txt"}}
        ]},
        {"text": "tried"}
    ]});
    // One script per conversation: the scripted model picks by assistant turns, so the
    // parent's and the subagent's turns come from the same list, told apart by the task.
    let model = Arc::new(Router {
        parent: ScriptedModel::from_json(&parent.to_string()).unwrap(),
        child: ScriptedModel::from_json(&child.to_string()).unwrap(),
    });
    let rules = Permissions::new(vec![PermissionRule {
        operations: vec![Operation::Read, Operation::Write],
        paths: vec!["/secrets/**".into()],
        mode: Mode::Deny,
    }])
    .unwrap();
    let agent = Agent::builder(model).permissions(rules).build().unwrap();
    let run = fixtures::run_with_files(
        "go",
        &[("/secrets/key.txt", "hunter2"), ("/open.txt", "hello")],
    );
    let mut events = agent.stream_run(run, deepagents::RunOptions::default());
    let mut nested = Vec::new();
    while let Some(event) = events.next().await {
        if let EventKind::ToolCallFinished {
            call_id,
            status,
            content,
            ..
        } = &event.kind
            && !event.path.is_empty()
        {
            let shown: String = content.iter().filter_map(|b| b.as_text()).collect();
            nested.push((call_id.clone(), *status, shown));
        }
    }
    let output = events.outcome().await.unwrap();
    let status_of = |id: &str| nested.iter().find(|(c, ..)| c == id).cloned().unwrap();
    let (_, read, shown) = status_of("r");
    assert_eq!(read, ToolStatus::Error, "{shown}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert_eq!(status_of("w").1, ToolStatus::Error);
    let (_, open, shown) = status_of("o");
    assert_eq!(open, ToolStatus::Ok);
    assert!(shown.contains("hello"), "{shown}");
    assert!(!output.run.state.files.contains_key("/secrets/new.txt"));
}

/// Answers the parent's conversation from one script and subagents' from another.
struct Router {
    parent: ScriptedModel,
    child: ScriptedModel,
}

#[async_trait::async_trait]
impl Model for Router {
    fn id(&self) -> &str {
        "router"
    }

    async fn generate(
        &self,
        request: &deepagents::ModelRequest,
    ) -> Result<deepagents::ModelResponse, deepagents::ModelError> {
        let first = request
            .messages
            .iter()
            .find(|m| matches!(m, deepagents::Message::User { .. }))
            .map(deepagents::Message::text)
            .unwrap_or_default();
        if first == "look" {
            self.child.generate(request).await
        } else {
            self.parent.generate(request).await
        }
    }
}

/// Subagent modes: an isolated subagent starts from its task alone, a fork from the parent's
/// conversation as the parent's model saw it.
mod forks {
    use std::sync::{Arc, Mutex};

    use deepagents::core::message::{AssistantMessage, ToolCall};
    use deepagents::core::{ModelRequest, ModelResponse, StopReason, Usage};
    use deepagents::{
        Agent, Decision, EventSink, InterruptConfig, Message, Model, ModelError, Run, RunOptions,
        SubAgent, SubAgentMode, decide,
    };
    use serde_json::json;

    use super::{model, task, write};
    use crate::support::{text, tool_results};

    /// A subagent's model: records each request and answers with the next turn.
    struct Recorder {
        turns: Vec<AssistantMessage>,
        requests: Mutex<Vec<ModelRequest>>,
    }

    impl Recorder {
        fn new(turns: Vec<AssistantMessage>) -> Arc<Self> {
            Arc::new(Self {
                turns,
                requests: Mutex::new(Vec::new()),
            })
        }

        fn requests(&self) -> Vec<ModelRequest> {
            self.requests.lock().unwrap().clone()
        }
    }

    #[async_trait::async_trait]
    impl Model for Recorder {
        fn id(&self) -> &str {
            "recorder"
        }

        async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
            let mut requests = self.requests.lock().unwrap();
            requests.push(request.clone());
            let message = self.turns[(requests.len() - 1).min(self.turns.len() - 1)].clone();
            let stop_reason = if message.tool_calls.is_empty() {
                StopReason::EndTurn
            } else {
                StopReason::ToolUse
            };
            Ok(ModelResponse {
                message,
                usage: Usage::default(),
                stop_reason,
            })
        }
    }

    fn call(id: &str, name: &str, arguments: serde_json::Value) -> AssistantMessage {
        AssistantMessage {
            content: vec![deepagents::core::ContentBlock::text("child working")],
            tool_calls: vec![ToolCall {
                id: id.to_owned(),
                name: name.to_owned(),
                arguments,
            }],
        }
    }

    /// Adds `text` to the system prompt.
    struct Section {
        name: &'static str,
        text: &'static str,
    }

    #[async_trait::async_trait]
    impl deepagents::middleware::Middleware for Section {
        fn name(&self) -> &str {
            self.name
        }
        async fn before_model(
            &self,
            _ctx: &deepagents::core::RunContext,
            request: &mut ModelRequest,
            _state: &deepagents::core::AgentState,
        ) -> Result<(), deepagents::middleware::MiddlewareError> {
            request.push_system_section(self.text);
            Ok(())
        }
    }

    fn is_user(message: &Message, needle: &str) -> bool {
        matches!(message, Message::User { .. }) && message.text().contains(needle)
    }

    #[tokio::test]
    async fn a_fork_starts_from_the_parents_conversation_an_isolated_subagent_from_its_task() {
        let script = json!({"turns": [
            {"text": "Looking around first.", "tool_calls": [
                {"id": "w1", "name": "write_file", "args": {"file_path": "/notes.md", "content": "code word: PELICAN\n"}}
            ]},
            {"text": "Delegating.", "tool_calls": [
                task("t_iso", "alpha: report the code word", "loner"),
                task("t_fork", "beta: report the code word", "twin")
            ]},
            {"text": "All done."}
        ]});
        let loner = Recorder::new(vec![AssistantMessage::text("loner answer")]);
        let twin = Recorder::new(vec![
            call(
                "c1",
                "write_file",
                json!({"file_path": "/fork.md", "content": "forked\n"}),
            ),
            AssistantMessage::text("twin answer: PELICAN"),
        ]);
        let agent = Agent::builder(model(script))
            .system_prompt("You are the PARENT.")
            .middleware(Section {
                name: "banner",
                text: "PARENT BANNER",
            })
            .middleware(Section {
                name: "section",
                text: "PARENT SECTION",
            })
            .general_purpose_subagent(false)
            .subagent(SubAgent::new("loner", "Works alone.", "You are LONER.").model(loner.clone()))
            .subagent(
                SubAgent::new("twin", "Continues the conversation.", "You are the FORK.")
                    .model(twin.clone())
                    .middleware(Section {
                        name: "section",
                        text: "FORK SECTION",
                    })
                    .mode(SubAgentMode::Fork),
            )
            .build()
            .unwrap();
        let output = agent.invoke("find the code word").await.unwrap();

        // Isolated: the task description is the whole conversation.
        let first = &loner.requests()[0];
        assert_eq!(first.messages.len(), 1, "{:?}", first.messages);
        assert!(is_user(&first.messages[0], "alpha: report the code word"));
        assert_eq!(first.messages[0].text(), "alpha: report the code word");
        let prompt = first.system_prompt.clone().unwrap_or_default();
        assert!(
            prompt.contains("You are LONER.") && !prompt.contains("PARENT"),
            "{prompt}"
        );

        // Fork: the parent's conversation before the turn that called `task`, then the task.
        let requests = twin.requests();
        let first = &requests[0];
        let messages: Vec<Message> = first.messages.iter().cloned().collect();
        assert_eq!(messages.len(), 4, "{messages:?}");
        assert!(is_user(&messages[0], "find the code word"));
        match &messages[1] {
            Message::Assistant(turn) => {
                assert_eq!(turn.tool_calls[0].id, "w1");
                assert!(messages[1].text().contains("Looking around first."));
            }
            other => panic!("expected the parent's first turn, got {other:?}"),
        }
        assert!(matches!(&messages[2], Message::Tool(result) if result.tool_call_id == "w1"));
        assert!(is_user(&messages[3], "beta: report the code word"));
        assert!(
            messages[3].text().ends_with("beta: report the code word"),
            "the task comes last: {}",
            messages[3].text()
        );
        assert!(
            !messages.iter().any(|m| m.text().contains("Delegating.")),
            "the turn that made the call is left out"
        );
        let prompt = first.system_prompt.clone().unwrap_or_default();
        let (parent_at, own_at) = (
            prompt
                .find("You are the PARENT.")
                .expect("inherits the prompt"),
            prompt.find("You are the FORK.").expect("keeps its own"),
        );
        assert!(parent_at < own_at, "its own prompt is appended: {prompt}");
        assert!(
            prompt.contains("PARENT BANNER"),
            "inherits the middleware: {prompt}"
        );
        assert!(
            prompt.contains("FORK SECTION") && !prompt.contains("PARENT SECTION"),
            "its own middleware replaces the inherited one of the same name: {prompt}"
        );
        // The fork's next request continues its own context.
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[1].messages.len(), 6);

        // The parent gets each child's final answer and nothing else.
        let results = tool_results(&output.run.state.messages);
        let answers: Vec<(String, String)> = results
            .iter()
            .map(|r| (r.tool_call_id.clone(), text(r)))
            .collect();
        assert_eq!(
            answers,
            [
                ("w1".to_owned(), answers[0].1.clone()),
                ("t_iso".to_owned(), "loner answer".to_owned()),
                ("t_fork".to_owned(), "twin answer: PELICAN".to_owned()),
            ]
        );
        assert_eq!(
            output.run.state.messages.len(),
            7,
            "user, 3 turns, 3 results"
        );
        assert!(
            !output
                .run
                .state
                .messages
                .iter()
                .any(|m| m.text().contains("child working")
                    || m.text().contains("You are a subagent")),
            "the fork's own messages stay in its context"
        );
        assert!(
            output.run.state.files.contains_key("/fork.md"),
            "files flow back"
        );
        assert_eq!(output.text, "All done.");
    }

    #[tokio::test]
    async fn a_fork_sees_the_summary_in_place_of_summarized_messages() {
        let script = json!({"turns": [
            {"tool_calls": [task("t1", "gamma: carry on", "twin")]},
            {"text": "done"}
        ]});
        let twin = Recorder::new(vec![AssistantMessage::text("twin done")]);
        let agent = Agent::builder(model(script))
            .general_purpose_subagent(false)
            .subagent(
                SubAgent::new("twin", "Continues.", "")
                    .model(twin.clone())
                    .mode(SubAgentMode::Fork),
            )
            .build()
            .unwrap();
        // An earlier exchange, the first two messages of which were summarized.
        let mut run = Run::from_task("old question");
        run.state
            .messages
            .push(Message::Assistant(AssistantMessage::text("old answer")));
        run.push_user_input(vec![deepagents::core::ContentBlock::text("new question")]);
        run.state.custom.insert(
            deepagents::middleware::SUMMARY_KEY.to_owned(),
            json!({"upto": 2, "text": "SUMMARY OF THE OLD EXCHANGE", "history_file": "/conversation_history/t.md", "count": 1}),
        );
        let output = agent
            .run(run, RunOptions::default(), EventSink::discard())
            .await
            .unwrap();
        assert_eq!(output.text, "done");
        let messages: Vec<Message> = twin.requests()[0].messages.iter().cloned().collect();
        assert_eq!(messages.len(), 3, "{messages:?}");
        assert!(is_user(&messages[0], "SUMMARY OF THE OLD EXCHANGE"));
        assert!(is_user(&messages[1], "new question"));
        assert!(is_user(&messages[2], "gamma: carry on"));
        assert!(
            !messages
                .iter()
                .any(|m| m.text().contains("old question") || m.text().contains("old answer")),
            "summarized messages stay replaced"
        );
    }

    #[tokio::test]
    async fn a_paused_fork_resumes_with_its_forked_history() {
        let script = json!({"turns": [
            {"tool_calls": [write("/a.md", "a\n")]},
            {"tool_calls": [task("t1", "delta: guarded work", "twin")]},
            {"text": "all done"}
        ]});
        let twin = Recorder::new(vec![
            call("g", "guarded", json!({})),
            AssistantMessage::text("twin finished"),
        ]);
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let agent = Agent::builder(model(script))
            .general_purpose_subagent(false)
            .dyn_tool(super::fixtures::counting("guarded", &ran))
            .interrupt_on("guarded", InterruptConfig::default())
            .subagent(
                SubAgent::new("twin", "Continues.", "")
                    .model(twin.clone())
                    .mode(SubAgentMode::Fork),
            )
            .build()
            .unwrap();
        let paused = agent
            .run(
                Run::from_task("start"),
                RunOptions::default(),
                EventSink::discard(),
            )
            .await
            .unwrap();
        assert_eq!(crate::support::paused(&paused).len(), 1);
        let mut run = paused.run;
        decide(&mut run, vec![Decision::Approve]).unwrap();
        let output = agent
            .run(run, RunOptions::default(), EventSink::discard())
            .await
            .unwrap();
        assert_eq!(output.text, "all done");
        assert_eq!(ran.load(std::sync::atomic::Ordering::SeqCst), 1);
        let requests = twin.requests();
        assert_eq!(requests.len(), 2);
        let resumed: Vec<Message> = requests[1].messages.iter().cloned().collect();
        assert!(is_user(&resumed[0], "start"), "{resumed:?}");
        assert!(resumed.iter().any(|m| is_user(m, "delta: guarded work")));
        assert!(matches!(resumed.last(), Some(Message::Tool(r)) if r.tool_call_id == "g"));
        let results = tool_results(&output.run.state.messages);
        assert_eq!(text(results.last().unwrap()), "twin finished");
    }

    #[test]
    fn fork_mode_refuses_skills_and_mode_names_are_checked() {
        let error = Agent::builder(model(json!({"turns": [{"text": "x"}]})))
            .subagent(
                SubAgent::new("twin", "Continues.", "")
                    .skills(["/skills"])
                    .mode(SubAgentMode::Fork),
            )
            .build()
            .err()
            .expect("skills under fork are refused")
            .to_string();
        assert!(
            error.contains("twin") && error.contains("skills"),
            "{error}"
        );
        assert!(error.contains("fork"), "{error}");

        assert_eq!("fork".parse::<SubAgentMode>().unwrap(), SubAgentMode::Fork);
        assert_eq!(
            "isolated".parse::<SubAgentMode>().unwrap(),
            SubAgentMode::Isolated
        );
        let error = "forked".parse::<SubAgentMode>().unwrap_err().to_string();
        assert!(
            error.contains("`forked`") && error.contains("isolated"),
            "{error}"
        );
        assert_eq!(
            SubAgent::new("a", "b", "c").context_mode(),
            SubAgentMode::Isolated
        );

        let fork = SubAgent::from_markdown(
            "twin.md",
            "---\nname: twin\ndescription: Continues.\nmode: fork\n---\n",
        )
        .unwrap();
        assert_eq!(fork.context_mode(), SubAgentMode::Fork);
        let error = SubAgent::from_markdown(
            "bad.md",
            "---\nname: bad\ndescription: d\nmode: clone\n---\nPrompt.\n",
        )
        .err()
        .unwrap()
        .to_string();
        assert!(
            error.contains("bad.md") && error.contains("`clone`"),
            "{error}"
        );
    }

    #[test]
    fn the_task_tool_marks_forks() {
        let agent = Agent::builder(model(json!({"turns": [{"text": "x"}]})))
            .subagent(SubAgent::new("twin", "Continues.", "").mode(SubAgentMode::Fork))
            .build()
            .unwrap();
        let spec = agent
            .tool_specs()
            .iter()
            .find(|s| s.name == "task")
            .unwrap();
        assert!(
            spec.description
                .contains("- twin: Continues. (continues your conversation"),
            "{}",
            spec.description
        );
        assert_eq!(
            spec.description
                .matches("continues your conversation")
                .count(),
            1,
            "only the fork is marked"
        );
    }
}
