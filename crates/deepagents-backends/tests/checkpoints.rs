//! Checkpoints in SQLite (and, through [`exercise_checkpointer`], every other checkpointer).

use deepagents_backends::SqliteStore;
use deepagents_core::{Checkpointer, Message, Run, RunDelta};
use serde_json::json;

fn step(run: &mut Run, i: usize) -> RunDelta {
    let message = Message::user(format!("message {i}"));
    run.state.messages.push(message.clone());
    run.state.custom.insert("counter".into(), json!(i));
    run.steps = u32::try_from(i).unwrap();
    RunDelta {
        messages: vec![message],
        custom: [("counter".to_owned(), json!(i))].into(),
        steps: run.steps,
        usage: run.usage,
        ..RunDelta::default()
    }
}

#[tokio::test]
async fn deltas_rebuild_the_run_at_any_checkpoint_and_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.db");
    exercise_checkpointer(async || SqliteStore::open(&path).await.unwrap().checkpointer()).await;
}

/// The checkpointer conformance: 120 steps on one thread (crossing snapshots), reopening,
/// loading every interesting checkpoint, listing, forking and deleting. `open` must return a
/// checkpointer over the same, initially empty, storage each time it is called.
pub async fn exercise_checkpointer<C: Checkpointer>(open: impl AsyncFn() -> C) {
    let mut run = Run::default();
    let mut history = Vec::new();
    {
        let checkpointer = open().await;
        for i in 1..=120 {
            let delta = step(&mut run, i);
            let id = checkpointer.append("t", &delta, &run).await.unwrap();
            assert_eq!(id, i as u64);
            history.push(run.clone());
        }
        checkpointer
            .append("other", &RunDelta::full(&run), &run)
            .await
            .unwrap();
    }
    let checkpointer = open().await;
    assert_eq!(checkpointer.load("t", None).await.unwrap().unwrap(), run);
    for at in [1u64, 49, 50, 51, 99, 100, 101, 120] {
        let loaded = checkpointer.load("t", Some(at)).await.unwrap().unwrap();
        assert_eq!(loaded, history[at as usize - 1], "checkpoint {at}");
    }
    let infos = checkpointer.checkpoints("t").await.unwrap();
    assert_eq!(infos.len(), 120);
    assert_eq!(infos[9].messages, 10);
    let threads = checkpointer.threads().await.unwrap();
    assert_eq!(threads.len(), 2);
    assert!(checkpointer.load("t", Some(121)).await.is_err());
    assert!(checkpointer.load("missing", None).await.unwrap().is_none());
    checkpointer.fork("t", 60, "branch").await.unwrap();
    assert_eq!(
        checkpointer.load("branch", None).await.unwrap().unwrap(),
        history[59]
    );
    assert!(checkpointer.delete_thread("t").await.unwrap());
    assert!(checkpointer.load("t", None).await.unwrap().is_none());
}
