//! The PostgreSQL store and checkpointer, against the server at `DEEPAGENTS_TEST_POSTGRES_URL`
//! (`.ci/run` starts one). Each test works in a fresh schema, so they run in parallel on one
//! database. Without a URL the tests skip, except under `CI=true`, where they fail.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use deepagents_backends::store::{SearchQuery, StoreError};
use deepagents_backends::{PostgresStore, Store, StoreBackend};
use deepagents_core::{Checkpointer, Message, Run, RunDelta};
use serde_json::json;

use crate::checkpoints::exercise_checkpointer;
use crate::conformance::check_backend;
use crate::memory_backends::exercise_store;

/// The server's URL, or `None` (after saying so) when there is none and this is not CI.
fn server_url() -> Option<String> {
    match std::env::var("DEEPAGENTS_TEST_POSTGRES_URL") {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CI=true but DEEPAGENTS_TEST_POSTGRES_URL is unset: start PostgreSQL (see .ci/run) \
                 and export its URL, e.g. postgres://postgres@127.0.0.1:55432/deepagents_test"
            );
            eprintln!("skipped: no PostgreSQL (set DEEPAGENTS_TEST_POSTGRES_URL)");
            None
        }
    }
}

/// A schema name no other test (in this or another process) uses.
fn fresh_schema(test: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!(
        "t_{test}_{}_{}_{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

#[tokio::test]
async fn postgres_store_namespaces_search_and_persistence() {
    let Some(url) = server_url() else { return };
    let schema = fresh_schema("store");
    let store = PostgresStore::connect_in_schema(&url, &schema)
        .await
        .unwrap();
    exercise_store(&store).await;
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
