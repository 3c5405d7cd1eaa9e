//! The PostgreSQL store and checkpointer, against the server at `DEEPAGENTS_TEST_POSTGRES_URL`
//! (`scripts/test` starts one). Each test works in a fresh schema, so they run in parallel on one
//! database. Without a URL the tests skip, except under `CI=true`, where they fail.

use std::sync::Arc;

use deepagents_backends::store::{SearchQuery, StoreError};
use deepagents_backends::{PostgresStore, Store, StoreBackend};
use deepagents_core::{Checkpointer, Message, Run, RunDelta};
use serde_json::json;

use crate::checkpoints::{concurrent_forks_let_exactly_one_win, exercise_checkpointer};
use crate::conformance::check_backend;
use crate::memory_backends::{exercise_merge, exercise_store};

/// The server's URL, or `None` (after saying so) when there is none and this is not CI.
fn server_url() -> Option<String> {
    deepagents_test_support::postgres_url()
}

/// A schema name no other test (in this or another process) uses.
fn fresh_schema(test: &str) -> String {
    deepagents_test_support::unique_name(&format!("t_{test}"))
}

#[tokio::test]
async fn postgres_store_namespaces_search_and_persistence() {
    let Some(url) = server_url() else { return };
    let schema = fresh_schema("store");
    let store = PostgresStore::connect_in_schema(&url, &schema)
        .await
        .unwrap();
    exercise_store(&store).await;
    exercise_merge(&store).await;
    store
        .put(&["n".to_owned()], "k", json!("kept"))
        .await
        .unwrap();
    drop(store);
    let reopened = PostgresStore::connect_in_schema(&url, &schema)
        .await
        .unwrap();
    let item = reopened.get(&["n".to_owned()], "k").await.unwrap().unwrap();
    assert_eq!(item.value, json!("kept"));
    crate::memory_backends::concurrent_merges_all_land(std::sync::Arc::new(reopened)).await;
}

#[tokio::test]
async fn store_backend_conforms_on_postgres() {
    let Some(url) = server_url() else { return };
    let store = PostgresStore::connect_in_schema(&url, &fresh_schema("backend"))
        .await
        .unwrap();
    check_backend(Arc::new(StoreBackend::new(Arc::new(store)))).await;
}

#[tokio::test]
async fn postgres_checkpoints_rebuild_runs_and_survive_reconnecting() {
    let Some(url) = server_url() else { return };
    let schema = fresh_schema("checkpoints");
    exercise_checkpointer(async || {
        PostgresStore::connect_in_schema(&url, &schema)
            .await
            .unwrap()
            .checkpointer()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_to_one_thread_get_distinct_ids() {
    let Some(url) = server_url() else { return };
    let store = PostgresStore::connect_in_schema(&url, &fresh_schema("appends"))
        .await
        .unwrap();
    let appends = (0..8).map(|task| {
        let checkpointer = store.checkpointer();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..5 {
                let run = Run::default();
                let delta = RunDelta {
                    messages: vec![Message::user(format!("task {task} step {i}"))],
                    ..RunDelta::default()
                };
                ids.push(checkpointer.append("shared", &delta, &run).await.unwrap());
            }
            ids
        })
    });
    let mut ids: Vec<u64> = futures::future::join_all(appends)
        .await
        .into_iter()
        .flat_map(Result::unwrap)
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (1..=40).collect::<Vec<u64>>());
    let run = store
        .checkpointer()
        .load("shared", None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run.state.messages.len(), 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn steps_of_many_threads_saved_at_once_each_land_in_order_and_one_bad_step_fails_alone() {
    let Some(url) = server_url() else { return };
    let store = PostgresStore::connect_in_schema(&url, &fresh_schema("groups"))
        .await
        .unwrap();
    let step = |text: String| RunDelta {
        messages: vec![Message::user(text)],
        ..RunDelta::default()
    };
    // Fifty runs saving at once are written in groups: each thread's steps keep their order
    // and their ids, and one step the database refuses (a NUL in its thread id) fails alone.
    let runs = (0..50).map(|thread| {
        let checkpointer = store.checkpointer();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..6 {
                let delta = step(format!("thread {thread} step {i}"));
                ids.push(
                    checkpointer
                        .append(&format!("t{thread}"), &delta, &Run::default())
                        .await
                        .unwrap(),
                );
            }
            ids
        })
    });
    let bad = {
        let checkpointer = store.checkpointer();
        tokio::spawn(async move {
            checkpointer
                .append("bad\0thread", &step("refused".to_owned()), &Run::default())
                .await
        })
    };
    for ids in futures::future::join_all(runs).await {
        assert_eq!(ids.unwrap(), (1..=6).collect::<Vec<u64>>());
    }
    assert!(bad.await.unwrap().is_err());
    for thread in 0..50 {
        let run = store
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
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_openers_of_one_postgres_store_all_succeed() {
    let Some(url) = server_url() else { return };
    // The schema does not exist yet: the openers race to create it and to migrate.
    let schema = fresh_schema("openers");
    let opens = (0..8).map(|i| {
        let (url, schema) = (url.clone(), schema.clone());
        tokio::spawn(async move {
            let store = PostgresStore::connect_in_schema(&url, &schema).await?;
            store
                .put(&["n".to_owned()], &format!("k{i}"), json!(i))
                .await?;
            Ok::<_, StoreError>(())
        })
    });
    for open in futures::future::join_all(opens).await {
        open.unwrap().unwrap();
    }
    let store = PostgresStore::connect_in_schema(&url, &schema)
        .await
        .unwrap();
    let all = store
        .search(&["n".to_owned()], &SearchQuery::default())
        .await
        .unwrap();
    assert_eq!(all.len(), 8);
}

#[tokio::test]
async fn bad_urls_and_schema_names_are_refused_with_a_hint() {
    let error = PostgresStore::connect("not a url").await.unwrap_err();
    assert!(error.to_string().contains("postgres://"), "{error}");
    let error = PostgresStore::connect_in_schema("postgres://127.0.0.1:1/x", "bad;name")
        .await
        .unwrap_err();
    assert!(error.to_string().contains("schema"), "{error}");
}

/// A connection of its own to `schema` (created if missing), without the store.
async fn raw_connection(url: &str, schema: &str) -> sqlx::PgConnection {
    use sqlx::Connection as _;
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query(&format!("SET search_path TO \"{schema}\""))
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

/// The rows of `deepagents_schema` in `schema`.
async fn recorded_versions(url: &str, schema: &str) -> Vec<i64> {
    let mut conn = raw_connection(url, schema).await;
    sqlx::query_scalar("SELECT version FROM deepagents_schema ORDER BY version")
        .fetch_all(&mut conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn postgres_records_its_schema_version_and_reconnecting_changes_nothing() {
    let Some(url) = server_url() else { return };
    let schema = fresh_schema("version");
    let current = i64::from(PostgresStore::SCHEMA_VERSION);
    let store = PostgresStore::connect_in_schema(&url, &schema)
        .await
        .unwrap();
    let run = Run::from_task("kept");
    store
        .checkpointer()
        .append("t", &RunDelta::full(&run), &run)
        .await
        .unwrap();
    drop(store);
    assert_eq!(recorded_versions(&url, &schema).await, [current]);
    for _ in 0..2 {
        let again = PostgresStore::connect_in_schema(&url, &schema)
            .await
            .unwrap();
        assert_eq!(
            again.checkpointer().load("t", None).await.unwrap().unwrap(),
            run
        );
        drop(again);
        assert_eq!(recorded_versions(&url, &schema).await, [current]);
    }
}

#[tokio::test]
async fn a_version_1_postgres_schema_is_upgraded_in_place() {
    let Some(url) = server_url() else { return };
    let schema = fresh_schema("upgrade");
    {
        // What the first release wrote: the store table only, version 1.
        let mut conn = raw_connection(&url, &schema).await;
        for statement in [
            "CREATE TABLE store_items (
                namespace TEXT COLLATE \"C\" NOT NULL,
                key TEXT COLLATE \"C\" NOT NULL,
                value TEXT NOT NULL,
                created_at_ms BIGINT NOT NULL,
                updated_at_ms BIGINT NOT NULL,
                PRIMARY KEY (namespace, key)
            )",
            "INSERT INTO store_items VALUES ('agents/agent', 'AGENTS.md', '\"old memory\"', 1, 2)",
            "CREATE TABLE deepagents_schema (version BIGINT NOT NULL)",
            "INSERT INTO deepagents_schema (version) VALUES (1)",
        ] {
            sqlx::query(statement).execute(&mut conn).await.unwrap();
        }
    }
    let store = PostgresStore::connect_in_schema(&url, &schema)
        .await
        .unwrap();
    let item = store
        .get(&["agents".to_owned(), "agent".to_owned()], "AGENTS.md")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(item.value, json!("old memory"), "existing data survives");
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
    assert_eq!(
        recorded_versions(&url, &schema).await,
        [i64::from(PostgresStore::SCHEMA_VERSION)]
    );
}

#[tokio::test]
async fn a_postgres_schema_from_a_newer_build_is_refused_and_left_alone() {
    let Some(url) = server_url() else { return };
    let schema = fresh_schema("future");
    let newer = i64::from(PostgresStore::SCHEMA_VERSION) + 1;
    {
        let mut conn = raw_connection(&url, &schema).await;
        sqlx::query("CREATE TABLE deepagents_schema (version BIGINT NOT NULL)")
            .execute(&mut conn)
            .await
            .unwrap();
        sqlx::query("INSERT INTO deepagents_schema (version) VALUES ($1)")
            .bind(newer)
            .execute(&mut conn)
            .await
            .unwrap();
    }
    let error = PostgresStore::connect_in_schema(&url, &schema)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains(&format!("schema version {newer}")),
        "{error}"
    );
    assert!(error.contains(&schema), "names the schema: {error}");
    assert!(error.contains("Upgrade deepagents"), "{error}");
    assert_eq!(recorded_versions(&url, &schema).await, [newer]);
    let mut conn = raw_connection(&url, &schema).await;
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 ORDER BY 1",
    )
    .bind(&schema)
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(tables, ["deepagents_schema"], "nothing was created");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_forks_into_one_id_on_postgres_let_exactly_one_win() {
    let Some(url) = server_url() else { return };
    let store = PostgresStore::connect_in_schema(&url, &fresh_schema("forks"))
        .await
        .unwrap();
    concurrent_forks_let_exactly_one_win(store.checkpointer()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_waits_for_an_append_that_is_still_committing() {
    let Some(url) = server_url() else { return };
    let schema = fresh_schema("committing");
    let store = PostgresStore::connect_in_schema(&url, &schema)
        .await
        .unwrap();
    let mut run = Run::from_task("first");
    store
        .checkpointer()
        .append("t", &RunDelta::full(&run), &run)
        .await
        .unwrap();
    // An append whose commit has not landed yet, as when its process was killed right after
    // sending COMMIT and the server is slow to finish it: it holds the thread's append lock
    // (class "dack", key hashtext(thread)) and its row is not yet visible.
    let mut writer = raw_connection(&url, &schema).await;
    sqlx::query("BEGIN").execute(&mut writer).await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
        .bind(0x6461_636b_i32)
        .bind("t")
        .execute(&mut writer)
        .await
        .unwrap();
    let late = Message::user("late");
    run.state.messages.push(late.clone());
    let delta = RunDelta {
        messages: vec![late],
        ..RunDelta::default()
    };
    sqlx::query(
        "INSERT INTO checkpoints (thread_id, id, delta, snapshot, created_at_ms, messages)
         VALUES ('t', 2, $1, NULL, 0, 2)",
    )
    .bind(serde_json::to_string(&delta).unwrap())
    .execute(&mut writer)
    .await
    .unwrap();

    let checkpointer = store.checkpointer();
    let load = tokio::spawn(async move { checkpointer.load("t", None).await });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(
        !load.is_finished(),
        "the load must not read the thread while an append to it is committing"
    );
    sqlx::query("COMMIT").execute(&mut writer).await.unwrap();
    let loaded = load.await.unwrap().unwrap().unwrap();
    assert_eq!(
        loaded.state.messages, run.state.messages,
        "the load sees the append"
    );
}

#[tokio::test]
async fn postgres_refuses_keys_it_could_not_hold_and_keeps_nul_in_values() {
    let Some(url) = server_url() else { return };
    let store = PostgresStore::connect_in_schema(&url, &fresh_schema("keys"))
        .await
        .unwrap();
    crate::memory_backends::refuse_unstorable_addresses(&store).await;
}

#[tokio::test]
async fn leases_exclude_other_processes_and_share_one_connection() {
    let Some(url) = server_url() else { return };
    let schema = fresh_schema("leases");
    let first = PostgresStore::connect_in_schema(&url, &schema)
        .await
        .unwrap()
        .checkpointer();
    // A second store is another process as far as the database can tell: its own sessions.
    let second = PostgresStore::connect_in_schema(&url, &schema)
        .await
        .unwrap()
        .checkpointer();
    let watcher = sqlx::PgPool::connect(&url).await.unwrap();
    let count = async || -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()",
        )
        .fetch_one(&watcher)
        .await
        .unwrap()
    };

    let lease = first.try_lease("a").await.unwrap();
    let error = second.try_lease("a").await.unwrap_err().to_string();
    assert!(error.contains("another database session"), "{error}");
    let error = first.try_lease("a").await.unwrap_err().to_string();
    assert!(error.contains("in this process"), "{error}");
    drop(lease);
    let taken = second.try_lease("a").await.unwrap();
    assert!(first.try_lease("a").await.is_err());
    drop(taken);

    // A hundred threads leased at once by one process hold one connection between them.
    let before = count().await;
    let mut held = Vec::new();
    for i in 0..100 {
        held.push(first.try_lease(&format!("t{i}")).await.unwrap());
    }
    let during = count().await;
    assert!(
        during - before <= 1,
        "{before} connections before, {during} during"
    );
    for i in (0..100).step_by(10) {
        assert!(second.try_lease(&format!("t{i}")).await.is_err());
    }
    drop(held);
    for i in 0..100 {
        drop(second.try_lease(&format!("t{i}")).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn items_written_at_once_are_all_kept() {
    let Some(url) = server_url() else { return };
    let store = Arc::new(
        PostgresStore::connect_in_schema(&url, &fresh_schema("puts"))
            .await
            .unwrap(),
    );
    let namespace = vec!["runs".to_owned()];
    // Written in groups: each item lands; of two writes to one item under way at once, one
    // wins whole.
    let writes = (0..100).map(|i| {
        let (store, namespace) = (Arc::clone(&store), namespace.clone());
        tokio::spawn(async move {
            store
                .put(&namespace, &format!("k{i}"), json!({"i": i}))
                .await
                .unwrap();
            store
                .put(&namespace, "shared", json!({"by": i}))
                .await
                .unwrap();
        })
    });
    for write in futures::future::join_all(writes).await {
        write.unwrap();
    }
    for i in 0..100 {
        let item = store
            .get(&namespace, &format!("k{i}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(item.value, json!({"i": i}));
    }
    let shared = store.get(&namespace, "shared").await.unwrap().unwrap();
    assert!(
        shared.value["by"]
            .as_i64()
            .is_some_and(|by| (0..100).contains(&by))
    );
}
