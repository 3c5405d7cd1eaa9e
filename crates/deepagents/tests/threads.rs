//! Threads and checkpoints: continuing, resuming after a crash, forking, and pausing for
//! approval across a restart — each on the in-memory, SQLite and (when
//! `DEEPAGENTS_TEST_POSTGRES_URL` is set) PostgreSQL checkpointers.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use deepagents::backends::{PostgresStore, SqliteStore};
use deepagents::core::message::{AssistantMessage, ToolCall};
use deepagents::core::{
    CheckpointError, Checkpointer, FileContent, InMemoryCheckpointer, RunDelta,
};
use deepagents::{
    Agent, Decision, DynamicTool, InterruptConfig, Message, Run, RunError, RunOptions, ToolOutput,
    decide, open_thread, pending_actions,
};
use serde_json::json;

use crate::support::{scripted, text, tool_results};

type Store = Arc<dyn Checkpointer>;

async fn turn(
    agent: &Agent,
    store: &Store,
    thread: &str,
    input: Option<&str>,
) -> Result<deepagents::RunOutput, deepagents::RunFailure> {
    let (run, checkpoint) = open_thread(store.clone(), thread, input.map(str::to_owned))
        .await
        .unwrap();
    let options = RunOptions {
        checkpoint: Some(checkpoint),
        ..RunOptions::default()
    };
    agent
        .run(run, options, deepagents::EventSink::discard())
        .await
}

/// Asserts that the stored run is the live one. A custom key the run removed is stored as
/// `null` (a delta cannot express removal), so those compare equal to absent keys.
#[track_caller]
fn assert_same_run(stored: &Run, live: &Run) {
    let normalized = |run: &Run| {
        let mut run = run.clone();
        run.state.custom.retain(|_, value| !value.is_null());
        run
    };
    assert_eq!(normalized(stored), normalized(live));
}

// ---- the checkpointers ------------------------------------------------------------------

/// The same in-memory store every time: a "restart" keeps the process.
fn memory() -> impl AsyncFn() -> Store {
    let store: Store = Arc::new(InMemoryCheckpointer::new());
    async move || store.clone()
}

/// A SQLite database file in `dir`, opened anew at every call (as a new process would).
fn sqlite(dir: &tempfile::TempDir) -> impl AsyncFn() -> Store {
    let path = dir.path().join("threads.db");
    async move || {
        let store: Store = Arc::new(SqliteStore::open(&path).await.unwrap().checkpointer());
        store
    }
}

/// A fresh schema of the PostgreSQL server at `DEEPAGENTS_TEST_POSTGRES_URL`, connected anew
/// at every call; `None` (after saying so) without a server, except under `CI=true`.
fn postgres(test: &str) -> Option<impl AsyncFn() -> Store> {
    let url = deepagents_test_support::postgres_url()?;
    let schema = deepagents_test_support::unique_name(&format!("threads_{test}"));
    Some(async move || {
        let store = PostgresStore::connect_in_schema(&url, &schema)
            .await
            .unwrap();
        let store: Store = Arc::new(store.checkpointer());
        store
    })
}

/// One test per scenario and checkpointer.
macro_rules! on_every_checkpointer {
    ($scenario:ident) => {
        mod $scenario {
            #[tokio::test]
            async fn in_memory() {
                super::$scenario(super::memory()).await;
            }

            #[tokio::test]
            async fn on_sqlite() {
                let dir = tempfile::tempdir().unwrap();
                super::$scenario(super::sqlite(&dir)).await;
            }

            #[tokio::test]
            async fn on_postgres() {
                let Some(open) = super::postgres(stringify!($scenario)) else {
                    return;
                };
                super::$scenario(open).await;
            }
        }
    };
}

on_every_checkpointer!(continues_where_it_left_off);
on_every_checkpointer!(resumes_after_a_crash_mid_step);
on_every_checkpointer!(resumes_an_earlier_format);
on_every_checkpointer!(corrupt_control_fails_loudly);
on_every_checkpointer!(forks_and_the_fork_continues);
on_every_checkpointer!(an_approval_survives_a_restart);
on_every_checkpointer!(an_edit_survives_a_restart);
on_every_checkpointer!(one_run_writes_a_thread_at_a_time);
on_every_checkpointer!(an_open_thread_holds_its_lease);
on_every_checkpointer!(subagent_resumes_after_crash);
on_every_checkpointer!(crashes_in_nested_parallel_subagents);
on_every_checkpointer!(redelivered_request_taken_once);
on_every_checkpointer!(crash_cut_request_one_input);
on_every_checkpointer!(redelivered_decisions_continue);

// ---- the scenarios ------------------------------------------------------------------------

/// A thread continues where it left off, in a new process, and stores only deltas.
async fn continues_where_it_left_off(open: impl AsyncFn() -> Store) {
    let agent = Agent::builder(scripted(json!([
        {"text": "one", "tool_calls": [{"id": "w", "name": "write_file", "args": {"file_path": "/a.txt", "content": "a\n"}}]},
        {"text": "first answer"},
        {"text": "second answer"}
    ])))
    .build()
    .unwrap();
    let first = turn(&agent, &open().await, "t1", Some("first question"))
        .await
        .unwrap();
    assert_eq!(first.text, "first answer");
    let second = turn(&agent, &open().await, "t1", Some("second question"))
        .await
        .unwrap();
    assert_eq!(second.text, "second answer");
    let store = open().await;
    let loaded = store.load("t1", None).await.unwrap().unwrap();
    assert_same_run(&loaded, &second.run);
    assert_eq!(loaded.state.messages.len(), 6);
    assert!(
        loaded.state.files.contains_key("/a.txt"),
        "state files survive"
    );
    let checkpoints = store.checkpoints("t1").await.unwrap();
    assert!(checkpoints.len() >= 4);
    assert_eq!(checkpoints.last().unwrap().messages, 6);
    assert_eq!(store.threads().await.unwrap()[0].thread_id, "t1");
}

/// What a process killed in the middle of a tool step leaves behind is settled on resume:
/// read-only calls run again, mutating ones are marked interrupted and never run twice.
async fn resumes_after_a_crash_mid_step(open: impl AsyncFn() -> Store) {
    crash_mid_step(open, false).await;
}

/// The same crash, stored in this project's earlier format (the bookkeeping in a custom key,
/// no format version): it loads, is upgraded in the store, and settles the same way.
async fn resumes_an_earlier_format(open: impl AsyncFn() -> Store) {
    crash_mid_step(open, true).await;
}

async fn crash_mid_step(open: impl AsyncFn() -> Store, legacy: bool) {
    let mut run = Run::from_task("go");
    run.state
        .messages
        .push(Message::Assistant(AssistantMessage {
            content: vec![],
            tool_calls: vec![
                ToolCall {
                    id: "w".into(),
                    name: "write_file".into(),
                    arguments: json!({"file_path": "/x.txt", "content": "x"}),
                },
                ToolCall {
                    id: "l".into(),
                    name: "ls".into(),
                    arguments: json!({}),
                },
            ],
        }));
    let mut delta;
    if legacy {
        run.state
            .custom
            .insert("deepagents.in_flight".into(), json!(["w", "l"]));
        run.steps = 1;
        delta = RunDelta::full(&run);
        delta.schema = 0;
        delta.control = Default::default();
    } else {
        run.control.in_flight = vec!["w".into(), "l".into()];
        run.steps = 1;
        delta = RunDelta::full(&run);
    }
    open().await.append("crashed", &delta, &run).await.unwrap();

    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [
            {"id": "w", "name": "write_file", "args": {"file_path": "/x.txt", "content": "x"}},
            {"id": "l", "name": "ls", "args": {}}
        ]},
        {"text": "recovered"}
    ])))
    .build()
    .unwrap();
    let output = turn(&agent, &open().await, "crashed", None).await.unwrap();
    assert_eq!(output.text, "recovered");
    let results = tool_results(&output.run.state.messages);
    assert_eq!(results.len(), 2, "each call has exactly one result");
    assert_eq!(results[0].tool_call_id, "w");
    assert!(text(results[0]).starts_with("Interrupted"));
    assert!(
        !output.run.state.files.contains_key("/x.txt"),
        "the mutating call did not run twice"
    );
    assert_eq!(results[1].tool_call_id, "l");
    assert_eq!(results[1].status, deepagents::ToolStatus::Ok);
    let stored = open().await.load("crashed", None).await.unwrap().unwrap();
    assert!(stored.control.in_flight.is_empty(), "the step is settled");
    if legacy {
        assert_eq!(
            stored.state.custom.get("deepagents.in_flight"),
            Some(&serde_json::Value::Null),
            "the legacy key is cleared in the store"
        );
    } else {
        assert_same_run(&stored, &output.run);
    }
}

/// A control value that does not decode (a thread edited by hand, or written by a broken
/// version) stops the run with an error naming the key, instead of being dropped.
async fn corrupt_control_fails_loudly(open: impl AsyncFn() -> Store) {
    let mut run = Run::from_task("go");
    run.state.custom.insert(
        "deepagents.pending_approval".into(),
        json!({"not": "a list of actions"}),
    );
    let mut delta = RunDelta::full(&run);
    delta.schema = 0;
    delta.control = Default::default();
    open().await.append("broken", &delta, &run).await.unwrap();
    let agent = Agent::builder(scripted(json!([{"text": "never"}])))
        .checkpointer(open().await)
        .build()
        .unwrap();
    let error = agent
        .thread("broken")
        .unwrap()
        .run(deepagents::Input::Resume)
        .await
        .unwrap_err()
        .error
        .to_string();
    assert!(error.contains("deepagents.pending_approval"), "{error}");
    let pending = agent.thread("broken").unwrap().pending().await.unwrap_err();
    assert!(
        pending.to_string().contains("deepagents.pending_approval"),
        "{pending}"
    );
}

/// A fork starts from an earlier checkpoint, a run continues it on its own, and the original
/// thread is untouched; forking onto an existing thread is refused.
async fn forks_and_the_fork_continues(open: impl AsyncFn() -> Store) {
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"name": "ls", "args": {}}]},
        {"text": "first answer"},
        {"text": "second answer"}
    ])))
    .build()
    .unwrap();
    turn(&agent, &open().await, "main", Some("first question"))
        .await
        .unwrap();
    let main = turn(&agent, &open().await, "main", Some("on main"))
        .await
        .unwrap();
    assert_eq!(main.run.state.messages.len(), 6);

    let store = open().await;
    // The checkpoint right after the first answer.
    let at = store
        .checkpoints("main")
        .await
        .unwrap()
        .iter()
        .rfind(|c| c.messages == 4)
        .unwrap()
        .id;
    store.fork("main", at, "branch").await.unwrap();
    let forked = open().await.load("branch", None).await.unwrap().unwrap();
    assert_eq!(forked, store.load("main", Some(at)).await.unwrap().unwrap());
    assert_eq!(forked.state.messages[..], main.run.state.messages[..4]);

    let branch = turn(&agent, &open().await, "branch", Some("on the branch"))
        .await
        .unwrap();
    assert_eq!(branch.text, "second answer");
    let messages = &branch.run.state.messages;
    assert_eq!(messages.len(), 6);
    assert_eq!(messages[..4], main.run.state.messages[..4]);
    assert_eq!(messages[4].text(), "on the branch");

    let store = open().await;
    assert_same_run(
        &store.load("branch", None).await.unwrap().unwrap(),
        &branch.run,
    );
    assert!(store.checkpoints("branch").await.unwrap().len() >= 2);
    let main_now = store.load("main", None).await.unwrap().unwrap();
    assert_same_run(&main_now, &main.run);
    assert_eq!(main_now.state.messages[4].text(), "on main");

    for taken in ["branch", "main"] {
        let error = store.fork("main", 1, taken).await.unwrap_err();
        assert!(
            matches!(error, CheckpointError::AlreadyExists { .. }),
            "{error}"
        );
    }
    assert_same_run(
        &store.load("branch", None).await.unwrap().unwrap(),
        &branch.run,
    );
    assert!(matches!(
        store.fork("main", 999, "x").await,
        Err(CheckpointError::NotFound { .. })
    ));
    assert!(store.delete_thread("branch").await.unwrap());
    assert!(store.load("branch", None).await.unwrap().is_none());
}

fn write_then_done() -> serde_json::Value {
    json!([
        {"tool_calls": [
            {"id": "w", "name": "write_file", "args": {"file_path": "/plan.md", "content": "v1\n"}},
            {"id": "c", "name": "count", "args": {}}
        ]},
        {"text": "done"}
    ])
}

/// An agent whose `write_file` asks first, with a `count` tool counting its calls.
fn approving_agent(count: &Arc<AtomicUsize>) -> Agent {
    approving_builder(count).build().unwrap()
}

fn approving_builder(count: &Arc<AtomicUsize>) -> deepagents::AgentBuilder {
    let count = count.clone();
    let counter = DynamicTool::new(
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
    .unwrap();
    Agent::builder(scripted(write_then_done()))
        .dyn_tool(Arc::new(counter))
        .interrupt_on("write_file", InterruptConfig::default())
}

/// Pauses thread `t` before its write, in one "process"; returns the run a new process loads.
async fn pause(open: &impl AsyncFn() -> Store, count: &Arc<AtomicUsize>) -> Run {
    let failure = turn(&approving_agent(count), &open().await, "t", Some("plan"))
        .await
        .unwrap();
    crate::support::paused(&failure);
    assert_eq!(count.load(Ordering::SeqCst), 0, "nothing of the step ran");
    let run = open().await.load("t", None).await.unwrap().unwrap();
    let pending = pending_actions(&run);
    assert_eq!(pending.len(), 1, "the pause is stored");
    assert_eq!(pending[0].call_id, "w");
    run
}

/// Decides on the loaded run and continues it under a fresh agent and store.
async fn decide_and_continue(
    open: &impl AsyncFn() -> Store,
    count: &Arc<AtomicUsize>,
    decision: Decision,
) -> deepagents::RunOutput {
    let (mut run, checkpoint) = open_thread(open().await, "t", None).await.unwrap();
    decide(&mut run, vec![decision]).unwrap();
    let options = RunOptions {
        checkpoint: Some(checkpoint),
        ..RunOptions::default()
    };
    approving_agent(count)
        .run(run, options, deepagents::EventSink::discard())
        .await
        .unwrap()
}

fn file(run: &Run, path: &str) -> Option<String> {
    run.state.files.get(path).map(|f| match &f.content {
        FileContent::Text { text } => text.clone(),
        other => panic!("{other:?}"),
    })
}

/// A pause survives a restart: a new process approves and the step runs once.
async fn an_approval_survives_a_restart(open: impl AsyncFn() -> Store) {
    let count = Arc::new(AtomicUsize::new(0));
    pause(&open, &count).await;
    let output = decide_and_continue(&open, &count, Decision::Approve).await;
    assert_eq!(output.text, "done");
    assert_eq!(count.load(Ordering::SeqCst), 1, "the step ran once");
    assert_eq!(file(&output.run, "/plan.md").as_deref(), Some("v1\n"));
    let stored = open().await.load("t", None).await.unwrap().unwrap();
    assert_same_run(&stored, &output.run);
    assert!(pending_actions(&stored).is_empty());
}

/// An edit decided after a restart reaches the stored history: a later restart sees the
/// arguments that ran, once.
async fn an_edit_survives_a_restart(open: impl AsyncFn() -> Store) {
    let count = Arc::new(AtomicUsize::new(0));
    pause(&open, &count).await;
    let output = decide_and_continue(
        &open,
        &count,
        Decision::Edit {
            arguments: json!({"file_path": "/plan.md", "content": "v2\n"}),
        },
    )
    .await;
    assert_eq!(file(&output.run, "/plan.md").as_deref(), Some("v2\n"));
    let stored = open().await.load("t", None).await.unwrap().unwrap();
    assert_same_run(&stored, &output.run);
    let calls: Vec<&ToolCall> = stored
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

// ---- one writer per thread -------------------------------------------------------------

/// A tool that waits until `release` is notified, so a run stays in progress.
fn gate_tool(entered: Arc<tokio::sync::Notify>, release: Arc<tokio::sync::Notify>) -> DynamicTool {
    DynamicTool::new(
        "hold",
        "Waits.",
        json!({"type": "object"}),
        move |_args, _ctx| {
            let (entered, release) = (entered.clone(), release.clone());
            async move {
                entered.notify_one();
                release.notified().await;
                Ok(ToolOutput::text("held"))
            }
        },
    )
    .unwrap()
}

/// Leases: a second store (another process) is refused while the first holds a thread and
/// gets it once released; a run holds its thread's lease from start to end, so a second run
/// of the thread is refused, or waits for it with `with_lease_wait`.
async fn one_run_writes_a_thread_at_a_time(open: impl AsyncFn() -> Store) {
    let first = open().await;
    let second = open().await;
    let lease = first.try_lease("t").await.unwrap();
    assert_eq!(lease.thread_id(), "t");
    let refused = second.try_lease("t").await.unwrap_err();
    assert!(
        matches!(&refused, CheckpointError::Busy { thread_id, .. } if thread_id == "t"),
        "{refused:?}"
    );
    assert!(
        refused
            .to_string()
            .contains("thread `t` is in use by another run")
    );
    drop(second.try_lease("other").await.unwrap());
    drop(lease);
    drop(second.try_lease("t").await.unwrap());

    let (entered, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let agent = |store: Store| {
        Agent::builder(scripted(json!([
            {"tool_calls": [{"name": "hold", "args": {}}]},
            {"text": "first done"},
            {"text": "second done"}
        ])))
        .dyn_tool(Arc::new(gate_tool(entered.clone(), release.clone())))
        .checkpointer(store)
        .build()
        .unwrap()
    };
    let running = agent(first.clone()).thread("chat").unwrap();
    let task = tokio::spawn(async move { running.run("one").await });
    entered.notified().await;
    let other = agent(second.clone()).thread("chat").unwrap();
    let failure = other.run("two").await.unwrap_err();
    assert!(
        matches!(
            failure.error,
            RunError::Checkpoint(CheckpointError::Busy { .. })
        ),
        "{:?}",
        failure.error
    );
    // Waiting gets the thread once the first run ends, and continues after it.
    let waiting = other.with_lease_wait(std::time::Duration::from_secs(20));
    let waiter = tokio::spawn(async move { waiting.run("two").await });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(!waiter.is_finished());
    release.notify_one();
    assert_eq!(task.await.unwrap().unwrap().text, "first done");
    assert_eq!(waiter.await.unwrap().unwrap().text, "second done");
    let run = second.load("chat", None).await.unwrap().unwrap();
    let users: Vec<String> = run
        .state
        .messages
        .iter()
        .filter(|m| matches!(m, Message::User { .. }))
        .map(Message::text)
        .collect();
    assert_eq!(users, ["one", "two"]);
}

/// `Thread::open` takes the lease and shows the state the run will start from: nobody else
/// runs the thread until the opened run ends or the opened thread is dropped.
async fn an_open_thread_holds_its_lease(open: impl AsyncFn() -> Store) {
    let (first, second) = (open().await, open().await);
    let agent = |store: Store| {
        Agent::builder(scripted(json!([{"text": "one"}, {"text": "two"}])))
            .checkpointer(store)
            .build()
            .unwrap()
    };
    let thread = agent(first.clone()).thread("t").unwrap();
    let opened = thread.open().await.unwrap();
    assert!(opened.state().is_none(), "a new thread has no state");
    let other = agent(second.clone()).thread("t").unwrap();
    let refused = other.run("meanwhile").await.unwrap_err();
    assert!(
        matches!(
            refused.error,
            RunError::Checkpoint(CheckpointError::Busy { .. })
        ),
        "{:?}",
        refused.error
    );
    assert_eq!(opened.run("hi").await.unwrap().text, "one");

    let opened = thread.open().await.unwrap();
    let state = opened.state().expect("the first run's state");
    assert_eq!(state.state.messages.len(), 2);
    assert!(matches!(
        other.open().await.unwrap_err().error,
        RunError::Checkpoint(CheckpointError::Busy { .. })
    ));
    drop(opened);
    let output = agent(second)
        .thread("t")
        .unwrap()
        .run("again")
        .await
        .unwrap();
    assert_eq!(output.run.state.messages.len(), 4);
}

/// A run killed while its subagent works resumes the subagent where it stopped: finished
/// calls of the subagent are not made again, the one in flight is reported as interrupted,
/// and the subagent's checkpoints are removed once the parent has its answer.
async fn subagent_resumes_after_crash(open: impl AsyncFn() -> Store) {
    let script = json!({
        "turns": [
            {"tool_calls": [{"id": "task1", "name": "task", "args": {"description": "SUB: count", "subagent_type": "general-purpose"}}]},
            {"text": "parent done"}
        ],
        "conversations": [{"when_task_contains": "SUB", "turns": [
            {"tool_calls": [{"name": "step", "args": {"n": 0}}]},
            {"tool_calls": [{"name": "step", "args": {"n": 1}}]},
            {"tool_calls": [{"name": "step", "args": {"n": 2}}]},
            {"tool_calls": [{"name": "step", "args": {"n": 3}}]},
            {"text": "sub done"}
        ]}]
    });
    let calls = Arc::new(std::sync::Mutex::new(Vec::<u64>::new()));
    let entered = Arc::new(tokio::sync::Notify::new());
    let agent = |store: Store, block_at: Option<u64>| {
        let (calls, entered) = (calls.clone(), entered.clone());
        let step = DynamicTool::new(
            "step",
            "Counts.",
            json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
            move |args, _ctx| {
                let (calls, entered) = (calls.clone(), entered.clone());
                async move {
                    let n = args["n"].as_u64().unwrap();
                    calls.lock().unwrap().push(n);
                    if Some(n) == block_at {
                        entered.notify_one();
                        std::future::pending::<()>().await;
                    }
                    Ok(ToolOutput::text(format!("counted {n}")))
                }
            },
        )
        .unwrap()
        .mutating();
        let model: Arc<dyn deepagents::Model> =
            Arc::new(deepagents::models::ScriptedModel::from_json(&script.to_string()).unwrap());
        Agent::builder(model)
            .dyn_tool(Arc::new(step))
            .checkpointer(store)
            .build()
            .unwrap()
    };
    let crashing = agent(open().await, Some(2)).thread("t").unwrap();
    let task = tokio::spawn(async move { crashing.run("go").await });
    entered.notified().await;
    // The process dies: the run's future is dropped where it stands.
    task.abort();
    let _ = task.await;
    assert_eq!(*calls.lock().unwrap(), [0, 1, 2]);

    let store = open().await;
    let output = agent(store.clone(), None)
        .thread("t")
        .unwrap()
        .run(deepagents::Input::Resume)
        .await
        .unwrap();
    assert_eq!(output.text, "parent done");
    // 0 and 1 finished before the crash and did not run again; 2 was in flight, so it is
    // reported as interrupted instead of made twice; 3 ran after the resume.
    assert_eq!(*calls.lock().unwrap(), [0, 1, 2, 3]);
    assert!(store.checkpoints("t/task1").await.unwrap().is_empty());
    let threads: Vec<String> = store
        .threads()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.thread_id)
        .collect();
    assert_eq!(threads, ["t"]);
}

#[tokio::test]
async fn thread_ids_that_cannot_be_stored_are_refused() {
    let agent = Agent::builder(scripted(json!([{"text": "hi"}])))
        .checkpointer(Arc::new(InMemoryCheckpointer::new()))
        .build()
        .unwrap();
    for id in [
        "",
        "../../x",
        "a/b",
        ".",
        "..",
        "tab\there",
        &"x".repeat(129),
    ] {
        let error = agent.thread(id).unwrap_err();
        assert!(
            error.to_string().contains("invalid thread id"),
            "{id:?}: {error}"
        );
        let store: Store = Arc::new(InMemoryCheckpointer::new());
        assert!(matches!(
            open_thread(store, id, None).await,
            Err(CheckpointError::InvalidThreadId { .. })
        ));
    }
    for id in [
        "chat",
        "user@example.com:1",
        "a.b-c_d+e~f",
        &"x".repeat(128),
    ] {
        assert!(agent.thread(id).is_ok(), "{id:?}");
    }
}

/// Crashes (the run's future dropped) at random moments while nested and parallel subagents
/// work: after each, the thread resumes in a "new process"; in the end every finished call ran
/// exactly once, only calls in flight at a crash may be missing, and no subagent checkpoints
/// are left.
async fn crashes_in_nested_parallel_subagents(open: impl AsyncFn() -> Store) {
    let calls = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let recorded = calls.clone();
    let record: Arc<dyn Fn(String) + Send + Sync> =
        Arc::new(move |name| recorded.lock().unwrap().push(name));
    let agent = |store: Store| nested_agent(store, record.clone());
    let mut seed: u64 = 11;
    let mut crashes = 0;
    let mut started = false;
    let output = loop {
        let thread = agent(open().await).thread("t").unwrap();
        let run = tokio::spawn(async move {
            if started {
                thread.run(deepagents::Input::Resume).await
            } else {
                thread.run("go").await
            }
        });
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let delay = (seed >> 33) % 40;
        tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
        if crashes < 12 && !run.is_finished() {
            run.abort();
            let _ = run.await;
            crashes += 1;
            started = started || open().await.load("t", None).await.unwrap().is_some();
            continue;
        }
        break run.await.unwrap().unwrap();
    };
    assert_eq!(output.text, "parent done");
    let calls = calls.lock().unwrap().clone();
    let names = nested_step_names();
    for name in &names {
        let times = calls.iter().filter(|c| *c == name).count();
        assert!(times <= 1, "{name} ran {times} times: {calls:?}");
    }
    let missing = names.iter().filter(|n| !calls.contains(n)).count();
    assert!(
        missing <= crashes,
        "{missing} calls missing after {crashes} crashes: {calls:?}"
    );
    let store = open().await;
    for child in ["t/t1", "t/t1/t2", "t/t1/t3"] {
        assert!(
            store.checkpoints(child).await.unwrap().is_empty(),
            "{child} left behind"
        );
    }
}

/// The names of the `step` calls of [`nested_agent`]'s script, each made once.
fn nested_step_names() -> Vec<String> {
    (0..3)
        .map(|i| format!("o{i}"))
        .chain((0..4).map(|i| format!("a{i}")))
        .chain((0..4).map(|i| format!("b{i}")))
        .collect()
}

/// An agent whose `task` call t1 starts a delegator subagent; it makes steps o0 and o1, then
/// runs two general-purpose subagents in parallel (t2: a0–a3, t3: b0–b3), then step o2. Each
/// `step` (a mutating tool) passes its name to `record` and takes 3 ms.
fn nested_agent(store: Store, record: Arc<dyn Fn(String) + Send + Sync>) -> Agent {
    let steps = |prefix: &str, count: usize, answer: &str| {
        let mut turns: Vec<serde_json::Value> = (0..count)
            .map(|i| json!({"tool_calls": [{"name": "step", "args": {"n": format!("{prefix}{i}")}}]}))
            .collect();
        turns.push(json!({"text": answer}));
        turns
    };
    let task = |id: &str, description: &str, kind: &str| json!({"id": id, "name": "task", "args": {"description": description, "subagent_type": kind}});
    let mut outer = steps("o", 3, "outer done");
    outer.insert(
        2,
        json!({"tool_calls": [task("t2", "LEFT: count", "general-purpose"), task("t3", "RIGHT: count", "general-purpose")]}),
    );
    let script = json!({
        "turns": [
            {"tool_calls": [task("t1", "OUTER: count", "delegator")]},
            {"text": "parent done"}
        ],
        "conversations": [
            {"when_task_contains": "OUTER", "turns": outer},
            {"when_task_contains": "LEFT", "turns": steps("a", 4, "left done")},
            {"when_task_contains": "RIGHT", "turns": steps("b", 4, "right done")}
        ]
    });
    let step = DynamicTool::new(
        "step",
        "Counts.",
        json!({"type": "object", "properties": {"n": {"type": "string"}}}),
        move |args, _ctx| {
            let record = record.clone();
            async move {
                record(args["n"].as_str().unwrap().to_owned());
                tokio::time::sleep(std::time::Duration::from_millis(3)).await;
                Ok(ToolOutput::text("counted"))
            }
        },
    )
    .unwrap()
    .mutating();
    let step: Arc<dyn deepagents::DynTool> = Arc::new(step);
    let model: Arc<dyn deepagents::Model> =
        Arc::new(deepagents::models::ScriptedModel::from_json(&script.to_string()).unwrap());
    let delegator = Agent::builder(model.clone())
        .dyn_tool(step.clone())
        .build()
        .unwrap();
    Agent::builder(model)
        .dyn_tool(step)
        .subagent(deepagents::SubAgent::from_agent(
            "delegator",
            "Delegates.",
            delegator,
        ))
        .checkpointer(store)
        .build()
        .unwrap()
}

/// Where the SIGKILL loop below tells its worker process to work.
const KILL_WORKER_DIR: &str = "DEEPAGENTS_TEST_KILL_WORKER_DIR";

/// The worker of the SIGKILL loop below, run in a child process of this test binary: it
/// starts (or resumes) thread `t` of [`nested_agent`] on SQLite, appending each step's name
/// to `log.txt`. In a normal test run it does nothing.
#[tokio::test]
async fn nested_subagents_kill_worker() {
    let Some(dir) = std::env::var_os(KILL_WORKER_DIR) else {
        return;
    };
    let dir = std::path::PathBuf::from(dir);
    let store: Store = Arc::new(
        SqliteStore::open(dir.join("threads.db"))
            .await
            .unwrap()
            .checkpointer(),
    );
    let log = dir.join("log.txt");
    let record: Arc<dyn Fn(String) + Send + Sync> = Arc::new(move |name| {
        use std::io::Write as _;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        writeln!(file, "{name}").unwrap();
    });
    let started = store.load("t", None).await.unwrap().is_some();
    let thread = nested_agent(store, record).thread("t").unwrap();
    let output = if started {
        thread.run(deepagents::Input::Resume).await
    } else {
        thread.run("go").await
    };
    assert_eq!(output.unwrap().text, "parent done");
}

/// SIGKILLs at random moments while nested subagents and parallel ones work (the worker above,
/// a real process): after each, the thread resumes in a new process; in the end every step
/// ran at most once, only steps in flight at a kill may be missing, and no subagent
/// checkpoints are left.
#[test]
fn sigkill_during_nested_and_parallel_subagents_never_repeats_a_finished_step() {
    let mut seed: u64 = 5;
    let mut kills = 0;
    // A round is one thread in its own database, run to its end through kills and resumes.
    for _round in 0..60 {
        if kills >= 12 {
            break;
        }
        let dir = tempfile::tempdir().unwrap();
        let worker = || {
            let mut command = std::process::Command::new(std::env::current_exe().unwrap());
            command
                .args(["--exact", "threads::nested_subagents_kill_worker"])
                .args(["--test-threads", "1"])
                .env(KILL_WORKER_DIR, dir.path())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped());
            command
        };
        let mut killed_here = 0;
        loop {
            let mut child = worker().spawn().unwrap();
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if (seed >> 33) % 10 < 8 {
                std::thread::sleep(std::time::Duration::from_millis((seed >> 40) % 150));
                if child.try_wait().unwrap().is_none() {
                    child.kill().unwrap();
                    child.wait().unwrap();
                    killed_here += 1;
                    continue;
                }
            }
            let output = child.wait_with_output().unwrap();
            assert!(
                output.status.success(),
                "{}",
                String::from_utf8_lossy(&output.stderr)
            );
            break;
        }
        kills += killed_here;
        check_nested_round(dir.path(), killed_here);
    }
    assert!(kills >= 12, "only {kills} kills landed while runs worked");
}

/// After a round of the SIGKILL loop: every step ran at most once, only steps in flight at a
/// kill may be missing, the thread ended, and no subagent checkpoints are left.
fn check_nested_round(dir: &std::path::Path, kills: usize) {
    let log = std::fs::read_to_string(dir.join("log.txt")).unwrap_or_default();
    let names = nested_step_names();
    for name in &names {
        let times = log.lines().filter(|line| line == name).count();
        assert!(times <= 1, "{name} ran {times} times:\n{log}");
    }
    let missing = names
        .iter()
        .filter(|n| !log.lines().any(|l| l == *n))
        .count();
    assert!(
        missing <= kills,
        "{missing} steps missing after {kills} kills:\n{log}"
    );
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = SqliteStore::open(dir.join("threads.db"))
            .await
            .unwrap()
            .checkpointer();
        let run = store.load("t", None).await.unwrap().unwrap();
        assert_eq!(run.state.messages.last().unwrap().text(), "parent done");
        for child in ["t/t1", "t/t1/t2", "t/t1/t3"] {
            assert!(
                store.checkpoints(child).await.unwrap().is_empty(),
                "{child} left behind"
            );
        }
    });
}

#[tokio::test]
async fn a_thread_takes_images_with_a_message() {
    use futures::StreamExt as _;
    let store: Store = Arc::new(InMemoryCheckpointer::new());
    let agent = Agent::builder(scripted(json!([{"text": "a red pixel"}])))
        .checkpointer(store.clone())
        .build()
        .unwrap();
    let thread = agent.thread("pictures").unwrap();
    let mut stream = thread
        .stream(deepagents::Input::Content(vec![
            deepagents::ContentBlock::text("what is this?"),
            deepagents::ContentBlock::data("image/png", b"\x89PNG".to_vec()),
        ]))
        .await
        .unwrap();
    while stream.next().await.is_some() {}
    assert_eq!(stream.outcome().await.unwrap().text, "a red pixel");
    let stored = store.load("pictures", None).await.unwrap().unwrap();
    let Message::User { content } = &stored.state.messages[0] else {
        panic!("{:?}", stored.state.messages)
    };
    assert!(
        matches!(&content[1], deepagents::ContentBlock::Data { mime_type, .. } if mime_type == "image/png"),
        "{content:?}"
    );
}

// ---- requests delivered more than once (a queue retrying after a crash) -----------------

fn user_messages(run: &Run) -> usize {
    run.state
        .messages
        .iter()
        .filter(|m| matches!(m, Message::User { .. }))
        .count()
}

/// The same request, delivered twice with its key, adds its input once and calls the model
/// once; a new request adds its own.
async fn redelivered_request_taken_once(open: impl AsyncFn() -> Store) {
    let agent = |store: Store| {
        Agent::builder(scripted(
            json!([{"text": "first answer"}, {"text": "second answer"}]),
        ))
        .checkpointer(store)
        .build()
        .unwrap()
    };
    let first = agent(open().await)
        .thread("t")
        .unwrap()
        .with_input_key("request-1")
        .run("hello")
        .await
        .unwrap();
    assert_eq!(first.text, "first answer");
    // A new process, as a server taking over the run would be.
    let again = agent(open().await)
        .thread("t")
        .unwrap()
        .with_input_key("request-1")
        .run("hello")
        .await
        .unwrap();
    assert_eq!(
        user_messages(&again.run),
        1,
        "{:?}",
        again.run.state.messages
    );
    assert_eq!(again.text, "first answer", "the model was not called again");
    let stored = open().await.load("t", None).await.unwrap().unwrap();
    assert_eq!(stored.state.messages.len(), 2);
    assert_eq!(stored.control.input_key.as_deref(), Some("request-1"));

    let next = agent(open().await)
        .thread("t")
        .unwrap()
        .with_input_key("request-2")
        .run("and now?")
        .await
        .unwrap();
    assert_eq!(user_messages(&next.run), 2);
    assert_eq!(next.text, "second answer");
}

/// A process stopped after storing the request's input and the model's calls: delivered
/// again, the request does not add its input a second time; the run settles the calls and
/// goes on.
async fn crash_cut_request_one_input(open: impl AsyncFn() -> Store) {
    let mut run = Run::from_task("write it");
    run.control.input_key = Some("request-1".into());
    run.state
        .messages
        .push(Message::Assistant(AssistantMessage {
            content: vec![],
            tool_calls: vec![ToolCall {
                id: "w".into(),
                name: "write_file".into(),
                arguments: json!({"file_path": "/x.txt", "content": "x"}),
            }],
        }));
    run.control.in_flight = vec!["w".into()];
    run.steps = 1;
    open()
        .await
        .append("t", &RunDelta::full(&run), &run)
        .await
        .unwrap();

    // The script answers by turn: the stored conversation already holds the first.
    let output = Agent::builder(scripted(json!([{"text": "unused"}, {"text": "done"}])))
        .checkpointer(open().await)
        .build()
        .unwrap()
        .thread("t")
        .unwrap()
        .with_input_key("request-1")
        .run("write it")
        .await
        .unwrap();
    assert_eq!(output.text, "done");
    assert_eq!(
        user_messages(&output.run),
        1,
        "{:?}",
        output.run.state.messages
    );
    assert_eq!(tool_results(&output.run.state.messages).len(), 1);
}

/// Decisions delivered again for a pause their first delivery answered continue the thread
/// rather than fail as stale: the step they approved ran once.
async fn redelivered_decisions_continue(open: impl AsyncFn() -> Store) {
    let count = Arc::new(AtomicUsize::new(0));
    let paused = pause(&open, &count).await;
    let pause_id = deepagents::pause_id(&paused).unwrap();
    let agent = async || {
        approving_builder(&count)
            .checkpointer(open().await)
            .build()
            .unwrap()
    };
    let first = agent()
        .await
        .thread("t")
        .unwrap()
        .with_input_key("decision-1")
        .run(deepagents::Input::DecidePause {
            pause: String::from(&pause_id),
            decisions: vec![Decision::Approve],
        })
        .await
        .unwrap();
    assert_eq!(first.text, "done");
    let again = agent()
        .await
        .thread("t")
        .unwrap()
        .with_input_key("decision-1")
        .run(deepagents::Input::DecidePause {
            pause: String::from(&pause_id),
            decisions: vec![Decision::Approve],
        })
        .await
        .unwrap();
    assert_eq!(again.text, "done");
    assert_eq!(
        count.load(Ordering::SeqCst),
        1,
        "the approved step ran once"
    );
    let stale = agent()
        .await
        .thread("t")
        .unwrap()
        .with_input_key("decision-2")
        .run(deepagents::Input::DecidePause {
            pause: String::from(&pause_id),
            decisions: vec![Decision::Approve],
        })
        .await;
    assert!(
        matches!(stale, Err(ref failure) if matches!(failure.error, RunError::StalePause { .. })),
        "another request for the same pause is still stale"
    );
}
