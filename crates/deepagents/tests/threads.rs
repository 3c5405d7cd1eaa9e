//! Threads and checkpoints: continuing, resuming after a crash, forking, and pausing for
//! approval across a restart — each on the in-memory, SQLite and (when
//! `DEEPAGENTS_TEST_POSTGRES_URL` is set) PostgreSQL checkpointers.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

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
    let url = match std::env::var("DEEPAGENTS_TEST_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true but DEEPAGENTS_TEST_POSTGRES_URL is unset: start PostgreSQL (see .ci/run) \
                 and export its URL, e.g. postgres://postgres@127.0.0.1:55432/deepagents_test"
            );
            eprintln!("skipped: no PostgreSQL (set DEEPAGENTS_TEST_POSTGRES_URL)");
            return None;
        }
    };
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    let schema = format!(
        "threads_{test}_{}_{}_{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
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
on_every_checkpointer!(forks_and_the_fork_continues);
on_every_checkpointer!(an_approval_survives_a_restart);
on_every_checkpointer!(an_edit_survives_a_restart);

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
    run.state
        .custom
        .insert(deepagents::IN_FLIGHT_KEY.into(), json!(["w", "l"]));
    run.steps = 1;
    open()
        .await
        .append("crashed", &RunDelta::full(&run), &run)
        .await
        .unwrap();

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
    assert_same_run(&stored, &output.run);
    let in_flight = stored.state.custom.get(deepagents::IN_FLIGHT_KEY);
    assert!(
        in_flight.is_none_or(serde_json::Value::is_null),
        "the step is settled"
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
        .build()
        .unwrap()
}

/// Pauses thread `t` before its write, in one "process"; returns the run a new process loads.
async fn pause(open: &impl AsyncFn() -> Store, count: &Arc<AtomicUsize>) -> Run {
    let failure = turn(&approving_agent(count), &open().await, "t", Some("plan"))
        .await
        .unwrap_err();
    assert!(matches!(failure.error, RunError::Interrupted(_)));
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
