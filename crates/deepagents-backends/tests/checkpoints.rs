//! Checkpoints in SQLite (and, through [`exercise_checkpointer`], every other checkpointer).

use deepagents_backends::{SqliteStore, Store as _};
use deepagents_core::{
    CheckpointError, CheckpointInfo, Checkpointer, InMemoryCheckpointer, Message, Run, RunDelta,
    ThreadInfo,
};
use serde_json::json;

fn step(run: &mut Run, i: usize) -> RunDelta {
    let message = Message::user(format!("message {i}"));
    run.state.messages.push(message.clone());
    run.state.custom.insert("counter".into(), json!(i));
    run.steps = u32::try_from(i).unwrap();
    RunDelta {
        messages: vec![message],
        custom: [("counter".to_owned(), json!(i))].into(),
        steps: Some(run.steps),
        usage: Some(run.usage),
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
    // A fork never writes into an existing thread: not the branch, not another, not itself.
    for taken in ["branch", "other", "t"] {
        let error = checkpointer.fork("t", 10, taken).await.unwrap_err();
        assert_eq!(
            error,
            CheckpointError::AlreadyExists {
                thread_id: taken.to_owned()
            },
            "fork into {taken}"
        );
        assert!(error.to_string().contains("new thread id"), "{error}");
    }
    assert_eq!(checkpointer.checkpoints("branch").await.unwrap().len(), 1);
    assert_eq!(
        checkpointer.load("branch", None).await.unwrap().unwrap(),
        history[59]
    );
    assert_eq!(checkpointer.checkpoints("other").await.unwrap().len(), 1);
    assert_eq!(checkpointer.checkpoints("t").await.unwrap().len(), 120);
    assert!(matches!(
        checkpointer.fork("t", 999, "new").await,
        Err(CheckpointError::NotFound { .. })
    ));
    assert!(checkpointer.load("new", None).await.unwrap().is_none());
    assert!(checkpointer.delete_thread("t").await.unwrap());
    assert!(checkpointer.load("t", None).await.unwrap().is_none());
}

/// Storage grows linearly: of the periodic snapshots only the newest is kept, and the deltas
/// hold only what each step added.
#[tokio::test]
async fn sqlite_keeps_only_the_newest_snapshot() {
    use sqlx::Connection as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.db");
    let checkpointer = SqliteStore::open(&path).await.unwrap().checkpointer();
    let mut run = Run::default();
    let mut history = Vec::new();
    for i in 1..=160 {
        let delta = step(&mut run, i);
        checkpointer.append("t", &delta, &run).await.unwrap();
        history.push(run.clone());
    }
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let snapshots: Vec<i64> =
        sqlx::query_scalar("SELECT id FROM checkpoints WHERE snapshot IS NOT NULL")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(snapshots, [112], "the newest of those at 50, 75 and 112");
    for at in [1u64, 50, 74, 75, 112, 113, 160] {
        let loaded = checkpointer.load("t", Some(at)).await.unwrap().unwrap();
        assert_eq!(loaded, history[at as usize - 1], "checkpoint {at}");
    }
}

/// The in-memory checkpointer behind a shared handle, so `exercise_checkpointer` can "reopen"
/// it; it keeps the trait's default `fork`.
struct SharedMemory(std::sync::Arc<InMemoryCheckpointer>);

#[async_trait::async_trait]
impl Checkpointer for SharedMemory {
    async fn append(&self, t: &str, d: &RunDelta, r: &Run) -> Result<u64, CheckpointError> {
        self.0.append(t, d, r).await
    }
    async fn load(&self, t: &str, at: Option<u64>) -> Result<Option<Run>, CheckpointError> {
        self.0.load(t, at).await
    }
    async fn checkpoints(&self, t: &str) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        self.0.checkpoints(t).await
    }
    async fn threads(&self) -> Result<Vec<ThreadInfo>, CheckpointError> {
        self.0.threads().await
    }
    async fn delete_thread(&self, t: &str) -> Result<bool, CheckpointError> {
        self.0.delete_thread(t).await
    }
    async fn try_lease(&self, t: &str) -> Result<deepagents_core::ThreadLease, CheckpointError> {
        self.0.try_lease(t).await
    }
}

#[tokio::test]
async fn the_in_memory_checkpointer_passes_the_same_checks() {
    let shared = std::sync::Arc::new(InMemoryCheckpointer::new());
    exercise_checkpointer(async || SharedMemory(shared.clone())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_forks_into_one_id_on_sqlite_let_exactly_one_win() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("data.db")).await.unwrap();
    concurrent_forks_let_exactly_one_win(store.checkpointer()).await;
}

/// Three forks of thread `t` into one new id at once: exactly one wins, the others are told
/// the thread exists, and the branch holds one checkpoint.
pub async fn concurrent_forks_let_exactly_one_win<C: Checkpointer + Clone + 'static>(
    checkpointer: C,
) {
    let mut run = Run::default();
    for i in 1..=3 {
        let delta = step(&mut run, i);
        checkpointer.append("t", &delta, &run).await.unwrap();
    }
    let forks = (1..=3).map(|at| {
        let checkpointer = checkpointer.clone();
        tokio::spawn(async move { checkpointer.fork("t", at, "branch").await })
    });
    let results: Vec<_> = futures::future::join_all(forks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "{results:?}"
    );
    assert!(
        results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .all(|e| matches!(e, CheckpointError::AlreadyExists { .. })),
        "{results:?}"
    );
    assert_eq!(checkpointer.checkpoints("branch").await.unwrap().len(), 1);
}

/// `PRAGMA user_version` of the database at `path`, read without the store.
async fn user_version(path: &std::path::Path) -> i64 {
    use sqlx::Connection as _;
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(&mut conn)
        .await
        .unwrap()
}

/// Runs `statements` on the database at `path` (created if missing), without the store.
async fn raw_sqlite(path: &std::path::Path, statements: &[&str]) {
    use sqlx::Connection as _;
    let mut conn =
        sqlx::SqliteConnection::connect(&format!("sqlite://{}?mode=rwc", path.display()))
            .await
            .unwrap();
    for statement in statements {
        sqlx::query(statement).execute(&mut conn).await.unwrap();
    }
    conn.close().await.unwrap();
}

#[tokio::test]
async fn sqlite_records_its_schema_version_and_reopening_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let run = Run::from_task("kept");
    store
        .checkpointer()
        .append("t", &RunDelta::full(&run), &run)
        .await
        .unwrap();
    store.put(&["n".to_owned()], "k", json!(1)).await.unwrap();
    drop(store);
    assert_eq!(
        user_version(&path).await,
        i64::from(SqliteStore::SCHEMA_VERSION)
    );
    for _ in 0..2 {
        let again = SqliteStore::open(&path).await.unwrap();
        assert_eq!(
            again.checkpointer().load("t", None).await.unwrap().unwrap(),
            run
        );
        assert_eq!(
            again
                .get(&["n".to_owned()], "k")
                .await
                .unwrap()
                .unwrap()
                .value,
            json!(1)
        );
        drop(again);
        assert_eq!(
            user_version(&path).await,
            i64::from(SqliteStore::SCHEMA_VERSION)
        );
    }
}

#[tokio::test]
async fn a_version_1_sqlite_database_is_upgraded_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    // What the first release wrote: the store table only, user_version 1.
    raw_sqlite(
        &path,
        &[
            "CREATE TABLE store_items (
                namespace TEXT NOT NULL,
                key TEXT NOT NULL,
                value TEXT NOT NULL,
                created_at_ms INTEGER NOT NULL,
                updated_at_ms INTEGER NOT NULL,
                PRIMARY KEY (namespace, key)
            ) WITHOUT ROWID",
            "INSERT INTO store_items VALUES ('agents/agent', 'AGENTS.md', '\"old memory\"', 1, 2)",
            "PRAGMA user_version = 1",
        ],
    )
    .await;
    let store = SqliteStore::open(&path).await.unwrap();
    let item = store
        .get(&["agents".to_owned(), "agent".to_owned()], "AGENTS.md")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(item.value, json!("old memory"), "existing data survives");
    assert_eq!((item.created_at_ms, item.updated_at_ms), (1, 2));
    // The table the upgrade added works.
    let run = Run::from_task("new thread");
    store
        .checkpointer()
        .append("t", &RunDelta::full(&run), &run)
        .await
        .unwrap();
    assert_eq!(
        store.checkpointer().load("t", None).await.unwrap().unwrap(),
        run
    );
    drop(store);
    assert_eq!(
        user_version(&path).await,
        i64::from(SqliteStore::SCHEMA_VERSION)
    );
}

#[tokio::test]
async fn a_sqlite_database_from_a_newer_build_is_refused_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("future.db");
    let newer = i64::from(SqliteStore::SCHEMA_VERSION) + 1;
    raw_sqlite(
        &path,
        &[
            "CREATE TABLE future (x INTEGER)",
            &format!("PRAGMA user_version = {newer}"),
        ],
    )
    .await;
    let error = SqliteStore::open(&path).await.unwrap_err().to_string();
    assert!(
        error.contains(&format!("schema version {newer}")),
        "{error}"
    );
    assert!(error.contains(&path.display().to_string()), "{error}");
    assert!(error.contains("Upgrade deepagents"), "{error}");
    assert_eq!(
        user_version(&path).await,
        newer,
        "the version was not rewritten"
    );
    // Nothing was created in it either.
    use sqlx::Connection as _;
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    assert_eq!(tables, ["future"]);
}

/// Processes opening a new database together used to fail with "database is locked" (SQLite
/// refuses a concurrent switch to WAL at once): opening now takes turns, so every open
/// succeeds and sees one migrated database.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_opens_of_a_new_database_at_once_all_succeed() {
    for round in 0..15 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let opens: Vec<_> = (0..8)
            .map(|_| tokio::spawn(deepagents_backends::SqliteStore::open(path.clone())))
            .collect();
        for (index, open) in opens.into_iter().enumerate() {
            let store = open
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("round {round}, open {index}: {e}"));
            let checkpointer = store.checkpointer();
            let thread = format!("t{index}");
            let run = Run::default();
            checkpointer
                .append(&thread, &RunDelta::full(&run), &run)
                .await
                .unwrap();
        }
        let store = deepagents_backends::SqliteStore::open(&path).await.unwrap();
        assert_eq!(store.checkpointer().threads().await.unwrap().len(), 8);
    }
}

/// A lease file left by a deleted thread is removed, and the id can be leased again.
#[tokio::test]
async fn deleting_a_thread_removes_its_lease_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = deepagents_backends::SqliteStore::open(dir.path().join("store.db"))
        .await
        .unwrap()
        .checkpointer();
    let run = Run::default();
    store
        .append("gone", &RunDelta::full(&run), &run)
        .await
        .unwrap();
    store
        .append("gone/call_1", &RunDelta::full(&run), &run)
        .await
        .unwrap();
    drop(store.try_lease("gone").await.unwrap());
    assert!(dir.path().join("store.db.threads/gone.lock").exists());
    assert!(store.delete_thread("gone").await.unwrap());
    assert!(!dir.path().join("store.db.threads/gone.lock").exists());
    assert!(store.checkpoints("gone/call_1").await.unwrap().is_empty());
    drop(store.try_lease("gone").await.unwrap());
}

/// Steps and item writes of many runs at once are written in groups: each thread's steps
/// keep their order and ids, appends to one thread from many tasks get distinct ids, every
/// item write lands, and a second process on the database (its own store) writes beside
/// this one's groups.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_of_many_runs_at_once_land_in_groups_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("groups.db");
    let store = SqliteStore::open(&path).await.unwrap();
    let other = SqliteStore::open(&path).await.unwrap();
    let user = |text: String| RunDelta {
        messages: vec![Message::user(text)],
        ..RunDelta::default()
    };
    let runs = (0..40).map(|thread| {
        let (store, other) = (store.clone(), other.clone());
        tokio::spawn(async move {
            // Half the runs write through the other process's store.
            let store = if thread % 2 == 0 { store } else { other };
            let mut ids = Vec::new();
            for i in 0..6 {
                let delta = user(format!("thread {thread} step {i}"));
                let (checkpointer, id) = (store.checkpointer(), format!("t{thread}"));
                ids.push(
                    checkpointer
                        .append(&id, &delta, &Run::default())
                        .await
                        .unwrap(),
                );
                let item = json!({"thread": thread, "step": i});
                store
                    .put(&["items".to_owned()], &format!("t{thread}"), item)
                    .await
                    .unwrap();
            }
            ids
        })
    });
    let shared = (0..8).map(|task| {
        let checkpointer = store.checkpointer();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..5 {
                let delta = user(format!("task {task} step {i}"));
                ids.push(
                    checkpointer
                        .append("shared", &delta, &Run::default())
                        .await
                        .unwrap(),
                );
            }
            ids
        })
    });
    for ids in futures::future::join_all(runs).await {
        assert_eq!(ids.unwrap(), (1..=6).collect::<Vec<u64>>());
    }
    let mut ids: Vec<u64> = futures::future::join_all(shared)
        .await
        .into_iter()
        .flat_map(Result::unwrap)
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (1..=40).collect::<Vec<u64>>());
    let reopened = SqliteStore::open(&path).await.unwrap();
    for thread in 0..40 {
        let run = reopened
            .checkpointer()
            .load(&format!("t{thread}"), None)
            .await
            .unwrap()
            .unwrap();
        let texts: Vec<String> = run.state.messages.iter().map(Message::text).collect();
        let expected: Vec<String> = (0..6)
            .map(|i| format!("thread {thread} step {i}"))
            .collect();
        assert_eq!(texts, expected);
        let item = reopened
            .get(&["items".to_owned()], &format!("t{thread}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(item.value, json!({"thread": thread, "step": 5}));
    }
    let shared = reopened
        .checkpointer()
        .load("shared", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(shared.state.messages.len(), 40);
}
