//! Human approval: pausing before tool calls, and resuming with decisions.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use deepagents::backends::{Mode, Operation, PermissionRule, Permissions};
use deepagents::core::{Checkpointer, FileContent, InMemoryCheckpointer};
use deepagents::{
    Agent, AgentBuilder, Decision, DecisionKind, DynamicTool, InterruptConfig, Message, Run,
    RunError, RunOptions, ToolOutput, decide, open_thread,
};
use serde_json::json;

use crate::support::{assert_error_containing, scripted, text, tool_results};

fn write_then_done() -> serde_json::Value {
    json!([
        {"tool_calls": [
            {"id": "w", "name": "write_file", "args": {"file_path": "/secret/plan.md", "content": "v1\n"}},
            {"id": "c", "name": "count", "args": {}}
        ]},
        {"text": "done"}
    ])
}

fn counter(count: Arc<AtomicUsize>) -> Arc<DynamicTool> {
    Arc::new(
        DynamicTool::new(
            "count",
            "Counts its calls",
            json!({"type": "object"}),
            move |_, _| {
                let count = count.clone();
                async move {
                    count.fetch_add(1, Ordering::SeqCst);
                    Ok(ToolOutput::text("counted"))
                }
            },
        )
        .unwrap(),
    )
}

async fn pause_then(
    configure: impl Fn(AgentBuilder) -> AgentBuilder,
    decision: Decision,
) -> (deepagents::RunOutput, usize) {
    let count = Arc::new(AtomicUsize::new(0));
    let agent =
        configure(Agent::builder(scripted(write_then_done())).dyn_tool(counter(count.clone())))
            .build()
            .unwrap();
    let failure = agent.invoke("plan").await.unwrap();
    let actions = crate::support::paused(&failure);
    assert_eq!(actions.len(), 1);
    assert_eq!(actions[0].call_id, "w");
    assert_eq!(actions[0].arguments["file_path"], "/secret/plan.md");
    assert_eq!(count.load(Ordering::SeqCst), 0, "nothing of the step ran");
    assert!(failure.run.state.files.is_empty());
    let mut run = failure.run;
    decide(&mut run, vec![decision]).unwrap();
    let output = agent
        .run(run, RunOptions::default(), deepagents::EventSink::discard())
        .await
        .unwrap();
    (output, count.load(Ordering::SeqCst))
}

fn file(output: &deepagents::RunOutput, path: &str) -> Option<String> {
    output.run.state.files.get(path).map(|f| match &f.content {
        FileContent::Text { text } => text.clone(),
        other => panic!("{other:?}"),
    })
}

#[tokio::test]
async fn approve_runs_the_call() {
    let (output, count) = pause_then(
        |b| b.interrupt_on("write_file", InterruptConfig::default()),
        Decision::Approve,
    )
    .await;
    assert_eq!(file(&output, "/secret/plan.md").as_deref(), Some("v1\n"));
    assert_eq!(count, 1, "the sibling call ran exactly once");
    assert_eq!(output.text, "done");
}

#[tokio::test]
async fn edit_runs_the_call_with_new_arguments_and_the_history_shows_them() {
    let (output, _) = pause_then(
        |b| b.interrupt_on("write_file", InterruptConfig::default()),
        Decision::Edit {
            arguments: json!({"file_path": "/secret/plan.md", "content": "v2\n"}),
        },
    )
    .await;
    assert_eq!(file(&output, "/secret/plan.md").as_deref(), Some("v2\n"));
    let Message::Assistant(assistant) = &output.run.state.messages[1] else {
        panic!()
    };
    assert_eq!(assistant.tool_calls[0].arguments["content"], "v2\n");
}

#[tokio::test]
async fn reject_and_respond_answer_without_running() {
    let (output, _) = pause_then(
        |b| b.interrupt_on("write_file", InterruptConfig::default()),
        Decision::Reject {
            message: Some("too risky".into()),
        },
    )
    .await;
    assert!(file(&output, "/secret/plan.md").is_none());
    let results = tool_results(&output.run.state.messages);
    let rejected = results.iter().find(|r| r.tool_call_id == "w").unwrap();
    assert_error_containing(rejected, "The user rejected this call: too risky");

    let (output, _) = pause_then(
        |b| b.interrupt_on("write_file", InterruptConfig::default()),
        Decision::Respond {
            message: "I wrote it myself.".into(),
        },
    )
    .await;
    let results = tool_results(&output.run.state.messages);
    let responded = results.iter().find(|r| r.tool_call_id == "w").unwrap();
    assert_eq!(responded.status, deepagents::ToolStatus::Ok);
    assert_eq!(text(responded), "I wrote it myself.");
}

#[tokio::test]
async fn permission_rules_in_interrupt_mode_pause_matching_paths_only() {
    let rules = Permissions::new(vec![PermissionRule {
        operations: vec![Operation::Write],
        paths: vec!["/secret/**".into()],
        mode: Mode::Interrupt,
    }])
    .unwrap();
    let (output, _) = pause_then(|b| b.permissions(rules.clone()), Decision::Approve).await;
    assert_eq!(file(&output, "/secret/plan.md").as_deref(), Some("v1\n"));

    // A predicate that does not match lets the call through without pausing.
    let agent = Agent::builder(scripted(write_then_done()))
        .dyn_tool(counter(Arc::new(AtomicUsize::new(0))))
        .interrupt_on(
            "write_file",
            InterruptConfig {
                predicate: Some(Arc::new(|args| args["file_path"] == "/other")),
                ..InterruptConfig::default()
            },
        )
        .build()
        .unwrap();
    assert_eq!(agent.invoke("plan").await.unwrap().text, "done");

    // A reason pauses only the calls it names, and is what the person is told.
    let reasoned = |path: &'static str| {
        Agent::builder(scripted(write_then_done()))
            .dyn_tool(counter(Arc::new(AtomicUsize::new(0))))
            .interrupt_on(
                "write_file",
                InterruptConfig {
                    description: Some("not shown".to_owned()),
                    reason: Some(Arc::new(move |args| {
                        (args["file_path"] != path)
                            .then(|| format!("{} is special", args["file_path"]))
                    })),
                    ..InterruptConfig::default()
                },
            )
            .build()
            .unwrap()
    };
    let paused = reasoned("/nothing").invoke("plan").await.unwrap();
    let pending = deepagents::pending_actions(&paused.run);
    assert_eq!(pending.len(), 1);
    assert!(
        pending[0]
            .description
            .as_deref()
            .is_some_and(|d| d.ends_with("is special")),
        "{pending:?}"
    );
    let through = reasoned("/secret/plan.md").invoke("plan").await.unwrap();
    assert_eq!(through.text, "done");
}

#[tokio::test]
async fn decisions_must_fit_the_pending_actions() {
    let agent = Agent::builder(scripted(write_then_done()))
        .dyn_tool(counter(Arc::new(AtomicUsize::new(0))))
        .interrupt_on(
            "write_file",
            InterruptConfig {
                allowed: vec![DecisionKind::Approve, DecisionKind::Reject],
                ..InterruptConfig::default()
            },
        )
        .build()
        .unwrap();
    let mut run = agent.invoke("plan").await.unwrap().run;
    assert!(decide(&mut run.clone(), vec![]).is_err());
    let error = decide(
        &mut run,
        vec![Decision::Respond {
            message: "x".into(),
        }],
    )
    .unwrap_err();
    assert!(error.to_string().contains("not allowed"), "{error}");
}

#[tokio::test]
async fn a_pause_survives_a_restart_through_the_checkpointer() {
    let store = Arc::new(InMemoryCheckpointer::new());
    let count = Arc::new(AtomicUsize::new(0));
    let build = || {
        Agent::builder(scripted(write_then_done()))
            .dyn_tool(counter(count.clone()))
            .interrupt_on("write_file", InterruptConfig::default())
            .build()
            .unwrap()
    };
    let (run, checkpoint) = open_thread(store.clone(), "t", Some("plan".into()))
        .await
        .unwrap();
    let options = RunOptions {
        checkpoint: Some(checkpoint),
        ..RunOptions::default()
    };
    let failure = build()
        .run(run, options, deepagents::EventSink::discard())
        .await
        .unwrap();
    crate::support::paused(&failure);

    // A new process: load the thread, decide, continue.
    let (mut run, checkpoint): (Run, _) = open_thread(store.clone(), "t", None).await.unwrap();
    assert_eq!(deepagents::pending_actions(&run).len(), 1);
    decide(&mut run, vec![Decision::Approve]).unwrap();
    let options = RunOptions {
        checkpoint: Some(checkpoint),
        ..RunOptions::default()
    };
    let output = build()
        .run(run, options, deepagents::EventSink::discard())
        .await
        .unwrap();
    assert_eq!(output.text, "done");
    assert_eq!(count.load(Ordering::SeqCst), 1);
    let stored = store.load("t", None).await.unwrap().unwrap();
    assert_eq!(stored.state.messages, output.run.state.messages);
}

#[tokio::test]
async fn an_edit_survives_a_restart_in_the_stored_history() {
    let store = Arc::new(InMemoryCheckpointer::new());
    let build = || {
        Agent::builder(scripted(write_then_done()))
            .dyn_tool(counter(Arc::new(AtomicUsize::new(0))))
            .interrupt_on("write_file", InterruptConfig::default())
            .build()
            .unwrap()
    };
    let (run, checkpoint) = open_thread(store.clone(), "t", Some("plan".into()))
        .await
        .unwrap();
    let options = RunOptions {
        checkpoint: Some(checkpoint),
        ..RunOptions::default()
    };
    let paused = build()
        .run(run, options, deepagents::EventSink::discard())
        .await
        .unwrap();
    crate::support::paused(&paused);
    drop(paused);
    let (mut run, checkpoint): (Run, _) = open_thread(store.clone(), "t", None).await.unwrap();
    decide(
        &mut run,
        vec![Decision::Edit {
            arguments: json!({"file_path": "/secret/plan.md", "content": "v2\n"}),
        }],
    )
    .unwrap();
    let options = RunOptions {
        checkpoint: Some(checkpoint),
        ..RunOptions::default()
    };
    let output = build()
        .run(run, options, deepagents::EventSink::discard())
        .await
        .unwrap();
    assert_eq!(file(&output, "/secret/plan.md").as_deref(), Some("v2\n"));

    // Another restart: the stored thread shows the arguments that ran, once.
    let stored = store.load("t", None).await.unwrap().unwrap();
    assert_eq!(stored.state.messages, output.run.state.messages);
    let calls: Vec<&deepagents::ToolCall> = stored
        .state
        .messages
        .iter()
        .filter_map(|m| match m {
            Message::Assistant(a) => Some(&a.tool_calls),
            _ => None,
        })
        .flatten()
        .filter(|c| c.id == "w")
        .collect();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].arguments["content"], "v2\n");
    assert_eq!(tool_results(&stored.state.messages).len(), 2);
}

/// `ask_user` pauses the run like an approval; the person's answer (a `respond` decision) is
/// the call's result, also after a restart, and the decide step streams its events.
#[tokio::test]
async fn ask_user_pauses_until_the_answer_which_becomes_the_result() {
    use futures::StreamExt as _;
    let store: Arc<dyn deepagents::Checkpointer> =
        Arc::new(deepagents::InMemoryCheckpointer::new());
    let agent = || {
        Agent::builder(scripted(json!([
            {"tool_calls": [{"id": "q", "name": "ask_user", "args": {"question": "Which colour?", "options": ["red", "blue"]}}]},
            {"text": "Painting it."}
        ])))
        .ask_user(true)
        .checkpointer(store.clone())
        .build()
        .unwrap()
    };
    let paused = agent().thread("t").unwrap().run("paint").await.unwrap();
    let pending = crate::support::paused(&paused);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].name, deepagents::ASK_USER);
    assert_eq!(pending[0].arguments["question"], "Which colour?");
    // The question waits like any tool's own (a suspended call), shown on the call that
    // asked it, in no subagent.
    assert_eq!(pending[0].request.as_ref(), Some(&pending[0].arguments));
    assert_eq!(pending[0].tool_call_id(), "q");
    assert!(pending[0].agents().is_empty());
    assert_eq!(
        pending[0].allowed,
        [DecisionKind::Respond, DecisionKind::Reject]
    );
    assert!(
        agent()
            .thread("t")
            .unwrap()
            .run(deepagents::Input::Decide(vec![Decision::Approve]))
            .await
            .is_err(),
        "a question is answered, not approved"
    );

    // Another process answers; the events of the continued run stream.
    let thread = agent().thread("t").unwrap();
    let mut stream = thread
        .stream(deepagents::Input::Decide(vec![Decision::Respond {
            message: "blue".into(),
        }]))
        .await
        .unwrap();
    let mut answered = None;
    while let Some(event) = stream.next().await {
        if let deepagents::EventKind::ToolCallFinished {
            call_id, content, ..
        } = event.kind
        {
            answered = Some((call_id, content[0].as_text().unwrap_or_default().to_owned()));
        }
    }
    let output = stream.outcome().await.unwrap();
    assert_eq!(output.status, deepagents::RunStatus::Finished);
    assert_eq!(output.text, "Painting it.");
    assert_eq!(answered, Some(("q".to_owned(), "blue".to_owned())));
}

/// A thread an earlier version paused on `ask_user` as an approval gate before the call (the
/// question pending for the call itself, no suspended call stored) still loads, and the
/// answer given for it is the call's result; a refusal tells the model the user declined.
#[tokio::test]
async fn a_question_paused_as_a_gate_by_an_earlier_version_resumes() {
    use deepagents::core::{AssistantMessage, Message, Run, ToolCall};
    for (decision, expected) in [
        (
            Decision::Respond {
                message: "blue".into(),
            },
            "blue".to_owned(),
        ),
        (
            Decision::Reject {
                message: Some("no time".into()),
            },
            "The user rejected this call: no time. Do not retry it unchanged.".to_owned(),
        ),
    ] {
        let store: Arc<dyn deepagents::Checkpointer> =
            Arc::new(deepagents::InMemoryCheckpointer::new());
        let arguments = json!({"question": "Which colour?"});
        let mut old = Run::from_task("paint");
        let mut asking = AssistantMessage::text("");
        asking.tool_calls = vec![ToolCall {
            id: "q".into(),
            name: "ask_user".into(),
            arguments: arguments.clone(),
        }];
        old.state.messages.push(Message::Assistant(asking));
        old.control.pending = vec![deepagents::PendingAction {
            call_id: "q".into(),
            name: "ask_user".into(),
            arguments,
            description: None,
            allowed: vec![DecisionKind::Respond, DecisionKind::Reject],
            request: None,
            path: Vec::new(),
        }];
        store.create("t", &old).await.unwrap();
        let agent = Agent::builder(scripted(json!([
            {"tool_calls": [{"id": "q", "name": "ask_user", "args": {"question": "Which colour?"}}]},
            {"text": "Painting it."}
        ])))
        .ask_user(true)
        .checkpointer(store.clone())
        .build()
        .unwrap();
        let thread = agent.thread("t").unwrap();
        assert_eq!(thread.pending().await.unwrap().len(), 1);
        let output = thread
            .run(deepagents::Input::Decide(vec![decision]))
            .await
            .unwrap();
        assert_eq!(output.status, deepagents::RunStatus::Finished);
        let results = tool_results(&output.run.state.messages);
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].content[0].as_text(), Some(expected.as_str()));
    }
}

/// A paused thread resumed without decisions stays paused, through the streaming resume too.
#[tokio::test]
async fn stream_resume_of_a_paused_thread_reports_the_pause_again() {
    use futures::StreamExt as _;
    let agent = Agent::builder(scripted(write_then_done()))
        .interrupt_on("write_file", InterruptConfig::default())
        .checkpointer(Arc::new(deepagents::InMemoryCheckpointer::new()))
        .build()
        .unwrap();
    let thread = agent.thread("t").unwrap();
    crate::support::paused(&thread.run("plan").await.unwrap());
    let mut stream = thread.stream(deepagents::Input::Resume).await.unwrap();
    let mut interrupted = 0;
    while let Some(event) = stream.next().await {
        if matches!(event.kind, deepagents::EventKind::Interrupted { .. }) {
            interrupted += 1;
        }
    }
    let output = stream.outcome().await.unwrap();
    assert_eq!(crate::support::paused(&output).len(), 1);
    assert_eq!(interrupted, 1);
}

/// Decisions name the pause they were made for: sent again for a pause already decided, they
/// are refused and nothing runs, even when the model gave the next call the same id.
#[tokio::test]
async fn decisions_for_an_earlier_pause_are_refused_even_when_call_ids_repeat() {
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"id": "w", "name": "write_file", "args": {"file_path": "/one.md", "content": "1\n"}}]},
        {"tool_calls": [{"id": "w", "name": "write_file", "args": {"file_path": "/two.md", "content": "2\n"}}]},
        {"text": "done"}
    ])))
    .interrupt_on("write_file", InterruptConfig::default())
    .checkpointer(Arc::new(InMemoryCheckpointer::new()))
    .build()
    .unwrap();
    let thread = agent.thread("t").unwrap();
    let first = thread.run("write both").await.unwrap();
    crate::support::paused(&first);
    let first_id = first.pause_id().unwrap();
    let second = thread
        .run(deepagents::Input::DecidePause {
            pause: String::from(&first_id),
            decisions: vec![Decision::Approve],
        })
        .await
        .unwrap();
    assert_eq!(
        crate::support::paused(&second)[0].arguments["file_path"],
        "/two.md"
    );
    assert_eq!(file(&second, "/one.md").as_deref(), Some("1\n"));
    let second_id = second.pause_id().unwrap();
    assert_ne!(first_id, second_id, "same call id, another pause");

    // The first pause's decisions again: refused, through either door, and nothing changes.
    let failure = thread
        .run(deepagents::Input::DecidePause {
            pause: String::from(&first_id),
            decisions: vec![Decision::Approve],
        })
        .await
        .unwrap_err();
    match &failure.error {
        RunError::StalePause { given, current } => {
            assert_eq!(given, &first_id);
            assert_eq!(current.as_deref(), Some(second_id.as_str()));
        }
        other => panic!("{other:?}"),
    }
    assert!(failure.to_string().contains(&second_id), "{failure}");
    assert!(matches!(
        thread
            .stream(deepagents::Input::DecidePause {
                pause: String::from(&first_id),
                decisions: vec![Decision::Approve]
            })
            .await
            .err()
            .map(|failure| failure.error),
        Some(RunError::StalePause { .. })
    ));
    let state = thread.state().await.unwrap().unwrap();
    assert!(!state.state.files.contains_key("/two.md"));
    assert_eq!(
        deepagents::pause_id(&state).as_deref(),
        Some(second_id.as_str())
    );
    assert_eq!(thread.pending().await.unwrap().len(), 1);

    let done = thread
        .run(deepagents::Input::DecidePause {
            pause: String::from(&second_id),
            decisions: vec![Decision::Approve],
        })
        .await
        .unwrap();
    assert_eq!(done.text, "done");
    assert_eq!(file(&done, "/two.md").as_deref(), Some("2\n"));
    assert_eq!(done.pause_id(), None);
    // Nothing waits now: the last pause's id is stale too.
    assert!(matches!(
        thread
            .run(deepagents::Input::DecidePause {
                pause: String::from(&second_id),
                decisions: vec![Decision::Approve]
            })
            .await
            .unwrap_err()
            .error,
        RunError::StalePause { current: None, .. }
    ));
}

/// A tool asks mid-call (`ToolOutput::suspend`): the run pauses on its question, survives a
/// restart, and each answer runs the same call again with the answers so far, until it
/// finishes; a declined question reaches the tool too.
#[tokio::test]
async fn a_tool_that_asks_pauses_and_the_answers_resume_the_same_call() {
    let store: Arc<dyn deepagents::Checkpointer> =
        Arc::new(deepagents::InMemoryCheckpointer::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let book = {
        let runs = runs.clone();
        Arc::new(
            DynamicTool::new(
                "book",
                "Books a trip, asking where and when",
                json!({"type": "object"}),
                move |_, ctx| {
                    let runs = runs.clone();
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let answers = ctx.answers("book");
                        Ok(match answers.as_slice() {
                            [] => ToolOutput::suspend(
                                &ctx,
                                "book",
                                json!({"question": "Where to?"}),
                                Some("Where to?".into()),
                            ),
                            [deepagents::core::Answer::Given(city)] => ToolOutput::suspend(
                                &ctx,
                                "book",
                                json!({"question": format!("When to {city}?")}),
                                None,
                            ),
                            [
                                deepagents::core::Answer::Given(city),
                                deepagents::core::Answer::Given(day),
                            ] => ToolOutput::text(format!("booked {city} on {day}")),
                            other => ToolOutput::text(format!("not booked: {other:?}")),
                        })
                    }
                },
            )
            .unwrap(),
        )
    };
    let agent = || {
        Agent::builder(scripted(json!([
            {"tool_calls": [{"id": "b", "name": "book", "args": {}}]},
            {"text": "Done."}
        ])))
        .dyn_tool(book.clone())
        .checkpointer(store.clone())
        .build()
        .unwrap()
    };
    let paused = agent()
        .thread("trip")
        .unwrap()
        .run("book me")
        .await
        .unwrap();
    let pending = crate::support::paused(&paused);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].request, Some(json!({"question": "Where to?"})));
    assert_eq!(pending[0].description.as_deref(), Some("Where to?"));
    assert_eq!(
        pending[0].allowed,
        [DecisionKind::Respond, DecisionKind::Reject]
    );
    // A new process answers (JSON text, as a client's resume value arrives).
    let second = agent()
        .thread("trip")
        .unwrap()
        .run(deepagents::Input::Decide(vec![Decision::Respond {
            message: "\"Paris\"".into(),
        }]))
        .await
        .unwrap();
    let pending = crate::support::paused(&second);
    assert_eq!(
        pending[0].request,
        Some(json!({"question": "When to \"Paris\"?"}))
    );
    let done = agent()
        .thread("trip")
        .unwrap()
        .run(deepagents::Input::Decide(vec![Decision::Respond {
            message: "Friday".into(),
        }]))
        .await
        .unwrap();
    assert_eq!(done.status, deepagents::RunStatus::Finished);
    assert_eq!(done.text, "Done.");
    let results = tool_results(&done.run.state.messages);
    assert_eq!(text(results[0]), "booked \"Paris\" on \"Friday\"");
    assert_eq!(runs.load(Ordering::SeqCst), 3);

    // Declining reaches the tool, which decides what that means.
    let declined_store: Arc<dyn deepagents::Checkpointer> =
        Arc::new(deepagents::InMemoryCheckpointer::new());
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"id": "b", "name": "book", "args": {}}]},
        {"text": "Not booked."}
    ])))
    .dyn_tool(book.clone())
    .checkpointer(declined_store)
    .build()
    .unwrap();
    agent.thread("no").unwrap().run("book").await.unwrap();
    let done = agent
        .thread("no")
        .unwrap()
        .run(deepagents::Input::Decide(vec![Decision::Reject {
            message: Some("not now".into()),
        }]))
        .await
        .unwrap();
    let results = tool_results(&done.run.state.messages);
    assert!(
        text(results[0]).contains("Declined(Some(\"not now\"))"),
        "{}",
        text(results[0])
    );
}
