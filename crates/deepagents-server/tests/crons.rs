//! Crons: made, searched, counted, updated and deleted with the SDK's shapes; fired by the
//! scheduler (a due time put in the past through the store, a tick of milliseconds) into
//! runs that finish on their threads; fired once by two servers on one PostgreSQL; driven by
//! the official Python SDK.

use super::call;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use deepagents::backends::{InMemoryStore, Store};
use deepagents::core::InMemoryCheckpointer;
use deepagents_server::{Assistant, ServerOptions, StepWatch};
use serde_json::{Value, json};

/// A server over an in-memory store (returned, to reach into), its scheduler ticking fast.
fn server() -> (axum::Router, Arc<InMemoryStore>) {
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::new()));
    let store = Arc::new(InMemoryStore::new());
    let mut options = ServerOptions::new(
        vec![Assistant::new("agent", super::agent(watch.clone()))],
        store.clone(),
        watch,
    );
    options.cron_tick = Duration::from_millis(50);
    (deepagents_server::router(options).unwrap(), store)
}

/// Makes cron `id` of tenant `default` due a minute ago, as if its time came while no
/// server ran: written straight into the store the records live in.
async fn make_due(store: &dyn Store, id: &str) {
    let namespace = vec!["server-crons".to_owned(), "default".to_owned()];
    let mut cron = store.get(&namespace, id).await.unwrap().unwrap().value;
    let past = std::time::SystemTime::now() - Duration::from_secs(60);
    let past: chrono::DateTime<chrono::Utc> = past.into();
    cron["next_run_date"] = json!(past.to_rfc3339_opts(chrono::SecondsFormat::Millis, true));
    store.put(&namespace, id, cron).await.unwrap();
}

fn hi() -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test(flavor = "multi_thread")]
async fn crons_are_made_searched_counted_updated_and_deleted_with_the_sdks_shapes() {
    let (app, _) = server();
    let (_, info) = call(&app, "GET", "/info", Value::Null).await;
    assert_eq!(info["flags"]["crons"], true, "{info}");
    let (_, thread) = call(&app, "POST", "/threads", json!({})).await;
    let thread_id = thread["thread_id"].as_str().unwrap().to_owned();

    // As `crons.create_for_thread` sends it.
    let (status, on_thread) = call(
        &app,
        "POST",
        &format!("/threads/{thread_id}/runs/crons"),
        json!({"schedule": "*/5 * * * *", "input": hi(), "metadata": {"kind": "report"}, "assistant_id": "agent", "multitask_strategy": "enqueue"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{on_thread}");
    let keys = [
        "cron_id",
        "assistant_id",
        "thread_id",
        "on_run_completed",
        "end_time",
        "schedule",
        "timezone",
        "created_at",
        "updated_at",
        "payload",
        "user_id",
        "next_run_date",
        "metadata",
        "enabled",
    ];
    for key in keys {
        assert!(on_thread.get(key).is_some(), "{key} in {on_thread}");
    }
    assert_eq!(on_thread["thread_id"], thread_id.as_str());
    assert_eq!(on_thread["enabled"], true);
    assert_eq!(on_thread["metadata"], json!({"kind": "report"}));
    assert_eq!(on_thread["payload"]["input"], hi());
    let next = on_thread["next_run_date"].as_str().unwrap();
    assert!(
        next.ends_with(":00.000Z") && next > on_thread["created_at"].as_str().unwrap(),
        "{on_thread}"
    );
    // Made a moment later, so it sorts after by `created_at` (milliseconds).
    tokio::time::sleep(Duration::from_millis(5)).await;
    // As `crons.create` sends it: stateless, in a time zone, with an end.
    let (status, stateless) = call(
        &app,
        "POST",
        "/runs/crons",
        json!({"schedule": "0 9 * * 1-5", "timezone": "Europe/Paris", "input": hi(), "assistant_id": "agent", "on_run_completed": "keep", "end_time": "2100-01-01T00:00:00+00:00", "enabled": true}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{stateless}");
    assert_eq!(stateless["thread_id"], Value::Null);
    assert_eq!(stateless["on_run_completed"], "keep");
    assert_eq!(stateless["timezone"], "Europe/Paris");
    assert_eq!(stateless["end_time"], "2100-01-01T00:00:00.000Z");
    let paris = stateless["next_run_date"].as_str().unwrap();
    assert!(
        paris.ends_with("T07:00:00.000Z") || paris.ends_with("T08:00:00.000Z"),
        "{paris}"
    );

    // Refused, with a message: schedules, zones, times, assistants, threads, run fields.
    for (path, body, status, says) in [
        (
            "/runs/crons",
            json!({"assistant_id": "agent", "schedule": "every minute"}),
            422,
            "schedule",
        ),
        (
            "/runs/crons",
            json!({"assistant_id": "agent", "schedule": "* * * * * *"}),
            422,
            "5 fields",
        ),
        (
            "/runs/crons",
            json!({"assistant_id": "agent", "schedule": "61 * * * *"}),
            422,
            "not a valid cron pattern",
        ),
        (
            "/runs/crons",
            json!({"assistant_id": "agent"}),
            422,
            "`schedule` is missing",
        ),
        (
            "/runs/crons",
            json!({"assistant_id": "agent", "schedule": "* * * * *", "timezone": "Mars/Olympus"}),
            422,
            "timezone",
        ),
        (
            "/runs/crons",
            json!({"assistant_id": "agent", "schedule": "* * * * *", "end_time": "soon"}),
            422,
            "end_time",
        ),
        (
            "/runs/crons",
            json!({"assistant_id": "agent", "schedule": "* * * * *", "on_run_completed": "archive"}),
            422,
            "on_run_completed",
        ),
        (
            "/runs/crons",
            json!({"assistant_id": "nobody", "schedule": "* * * * *"}),
            404,
            "nobody",
        ),
        (
            "/runs/crons",
            json!({"assistant_id": "agent", "schedule": "* * * * *", "interrupt_before": ["tools"]}),
            422,
            "interrupt_before",
        ),
        (
            "/threads/missing/runs/crons",
            json!({"assistant_id": "agent", "schedule": "* * * * *"}),
            404,
            "missing",
        ),
    ] {
        let (got, answer) = call(&app, "POST", path, body.clone()).await;
        assert_eq!(got.as_u16(), status, "{body}: {answer}");
        assert!(
            answer["detail"].as_str().unwrap().contains(says),
            "{body}: {answer}"
        );
    }

    // Search and count, as `crons.search` and `crons.count` send them.
    let (status, found) = call(
        &app,
        "POST",
        "/runs/crons/search",
        json!({"assistant_id": "agent", "thread_id": thread_id, "limit": 10, "offset": 0}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{found}");
    assert_eq!(found.as_array().unwrap().len(), 1, "{found}");
    assert_eq!(found[0]["cron_id"], on_thread["cron_id"]);
    let (_, all) = call(
        &app,
        "POST",
        "/runs/crons/search",
        json!({"sort_by": "created_at", "sort_order": "asc", "select": ["cron_id", "schedule"]}),
    )
    .await;
    assert_eq!(
        all,
        json!([
            {"cron_id": on_thread["cron_id"], "schedule": "*/5 * * * *"},
            {"cron_id": stateless["cron_id"], "schedule": "0 9 * * 1-5"},
        ])
    );
    let (_, by_metadata) = call(
        &app,
        "POST",
        "/runs/crons/search",
        json!({"metadata": {"kind": "report"}}),
    )
    .await;
    assert_eq!(by_metadata.as_array().unwrap().len(), 1, "{by_metadata}");
    for (filter, count) in [
        (json!({}), 2),
        (json!({"assistant_id": "agent"}), 2),
        (json!({"thread_id": thread_id}), 1),
        (json!({"metadata": {"kind": "other"}}), 0),
    ] {
        let (status, got) = call(&app, "POST", "/runs/crons/count", filter.clone()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(got, json!(count), "{filter}");
    }

    // Update, as `crons.update` sends it: disabled, its end cleared, a new schedule.
    let stateless_id = stateless["cron_id"].as_str().unwrap();
    let (status, updated) = call(
        &app,
        "PATCH",
        &format!("/runs/crons/{stateless_id}"),
        json!({"schedule": "30 6 * * *", "enabled": false, "end_time": null, "input": {"messages": [{"role": "user", "content": "later"}]}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{updated}");
    assert_eq!(updated["enabled"], false);
    assert_eq!(updated["end_time"], Value::Null);
    assert_eq!(updated["schedule"], "30 6 * * *");
    assert_eq!(updated["next_run_date"], Value::Null, "disabled: never");
    assert_eq!(
        updated["payload"]["input"]["messages"][0]["content"],
        "later"
    );
    assert_eq!(updated["created_at"], stateless["created_at"]);
    let (_, enabled) = call(
        &app,
        "POST",
        "/runs/crons/search",
        json!({"enabled": false}),
    )
    .await;
    assert_eq!(enabled.as_array().unwrap().len(), 1);
    let (status, _) = call(
        &app,
        "PATCH",
        &format!("/runs/crons/{stateless_id}"),
        json!({"schedule": "0 0 31 2 *"}),
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, _) = call(&app, "PATCH", "/runs/crons/missing", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Delete, as `crons.delete` does.
    let (status, _) = call(
        &app,
        "DELETE",
        &format!("/runs/crons/{stateless_id}"),
        Value::Null,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = call(
        &app,
        "DELETE",
        &format!("/runs/crons/{stateless_id}"),
        Value::Null,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, count) = call(&app, "POST", "/runs/crons/count", json!({})).await;
    assert_eq!(count, json!(1));
}

/// The runs of `thread_id` once one has finished (waits up to 10 s).
async fn finished_runs(app: &axum::Router, thread_id: &str) -> Vec<Value> {
    for _ in 0..200 {
        let (status, runs) = call(
            app,
            "GET",
            &format!("/threads/{thread_id}/runs"),
            Value::Null,
        )
        .await;
        if status == StatusCode::OK
            && let Some(runs) = runs.as_array()
            && runs.iter().any(|run| run["status"] == "success")
        {
            return runs.clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no run of thread {thread_id} finished");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_due_cron_fires_a_run_through_the_run_path_once_then_waits_for_its_next_time() {
    let (app, store) = server();
    let (_, thread) = call(&app, "POST", "/threads", json!({})).await;
    let thread_id = thread["thread_id"].as_str().unwrap().to_owned();
    let (_, cron) = call(
        &app,
        "POST",
        &format!("/threads/{thread_id}/runs/crons"),
        json!({"assistant_id": "agent", "schedule": "* * * * *", "input": hi(), "metadata": {"kind": "report"}}),
    )
    .await;
    let cron_id = cron["cron_id"].as_str().unwrap().to_owned();
    // A disabled cron that is due never fires; nor does a deleted one.
    let (_, idle) = call(&app, "POST", "/threads", json!({})).await;
    let idle_id = idle["thread_id"].as_str().unwrap().to_owned();
    let (_, disabled) = call(
        &app,
        "POST",
        &format!("/threads/{idle_id}/runs/crons"),
        json!({"assistant_id": "agent", "schedule": "* * * * *", "input": hi(), "enabled": false}),
    )
    .await;
    let (_, deleted) = call(
        &app,
        "POST",
        &format!("/threads/{idle_id}/runs/crons"),
        json!({"assistant_id": "agent", "schedule": "* * * * *", "input": hi()}),
    )
    .await;
    let deleted_id = deleted["cron_id"].as_str().unwrap();
    make_due(&*store, deleted_id).await;
    let (status, _) = call(
        &app,
        "DELETE",
        &format!("/runs/crons/{deleted_id}"),
        Value::Null,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    make_due(&*store, &cron_id).await;

    let runs = finished_runs(&app, &thread_id).await;
    assert_eq!(runs.len(), 1, "one firing, however late: {runs:?}");
    assert_eq!(runs[0]["metadata"]["cron_id"], cron_id.as_str());
    assert_eq!(runs[0]["metadata"]["kind"], "report");
    let (_, state) = call(
        &app,
        "GET",
        &format!("/threads/{thread_id}/state"),
        Value::Null,
    )
    .await;
    let messages = state["values"]["messages"].as_array().unwrap();
    assert_eq!(messages[0]["content"], "hi", "{state}");
    assert_eq!(
        messages.last().unwrap()["content"],
        "Hello from the library.",
        "{state}"
    );
    // Its next time is in the future, and nothing more fires before it.
    let (_, found) = call(
        &app,
        "POST",
        "/runs/crons/search",
        json!({"thread_id": thread_id}),
    )
    .await;
    let next = found[0]["next_run_date"].as_str().unwrap().to_owned();
    let now: chrono::DateTime<chrono::Utc> = std::time::SystemTime::now().into();
    assert!(
        next > now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "{next}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, runs) = call(
        &app,
        "GET",
        &format!("/threads/{thread_id}/runs"),
        Value::Null,
    )
    .await;
    assert_eq!(runs.as_array().unwrap().len(), 1, "{runs}");
    let (_, runs) = call(
        &app,
        "GET",
        &format!("/threads/{idle_id}/runs"),
        Value::Null,
    )
    .await;
    assert_eq!(runs, json!([]), "disabled and deleted crons never fire");
    assert_eq!(disabled["next_run_date"], Value::Null);

    // A stateless cron runs each firing on a new thread, kept when asked.
    let (_, stateless) = call(
        &app,
        "POST",
        "/runs/crons",
        json!({"assistant_id": "agent", "schedule": "0 0 1 1 *", "input": hi(), "on_run_completed": "keep"}),
    )
    .await;
    let stateless_id = stateless["cron_id"].as_str().unwrap().to_owned();
    make_due(&*store, &stateless_id).await;
    let mut found = None;
    for _ in 0..200 {
        let (_, threads) = call(&app, "POST", "/threads/search", json!({"limit": 100})).await;
        found = threads.as_array().unwrap().iter().find_map(|thread| {
            let id = thread["thread_id"].as_str().unwrap();
            (id != thread_id && id != idle_id && thread["status"] == "idle").then(|| id.to_owned())
        });
        if found.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let new_thread = found.expect("the stateless firing's thread is kept");
    let runs = finished_runs(&app, &new_thread).await;
    assert_eq!(runs[0]["metadata"]["cron_id"], stateless_id.as_str());
}

/// The official Python SDK makes, searches, counts, updates and deletes crons.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdk_drives_crons() {
    let Some(python) = deepagents_test_support::langgraph_python() else {
        return;
    };
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::new()));
    let options = ServerOptions::new(
        vec![Assistant::new("agent", super::agent(watch.clone()))],
        Arc::new(InMemoryStore::new()),
        watch,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(deepagents_server::serve(listener, options, async {
        let _ = stopped.await;
    }));
    let script = r#"
import sys
from datetime import datetime, timezone
import httpx
from langgraph_sdk import get_sync_client

client = get_sync_client(url=sys.argv[1])
thread = client.threads.create()
hi = {"messages": [{"role": "user", "content": "hi"}]}
on_thread = client.crons.create_for_thread(
    thread["thread_id"], "agent", schedule="*/5 * * * *", input=hi, metadata={"kind": "report"}
)
assert on_thread["thread_id"] == thread["thread_id"], on_thread
assert on_thread["next_run_date"], on_thread
stateless = client.crons.create(
    "agent", schedule="0 9 * * *", input=hi, timezone="Europe/Paris",
    on_run_completed="keep", end_time=datetime(2100, 1, 1, tzinfo=timezone.utc),
)
assert stateless["thread_id"] is None and stateless["end_time"].startswith("2100-01-01"), stateless
found = client.crons.search(assistant_id="agent", thread_id=thread["thread_id"])
assert [c["cron_id"] for c in found] == [on_thread["cron_id"]], found
assert client.crons.count(assistant_id="agent") == 2
assert client.crons.count(metadata={"kind": "report"}) == 1
updated = client.crons.update(stateless["cron_id"], enabled=False, end_time=None)
assert updated["enabled"] is False and updated["end_time"] is None, updated
try:
    client.crons.create("agent", schedule="every minute")
    raise AssertionError("an invalid schedule was taken")
except httpx.HTTPStatusError as error:
    assert error.response.status_code == 422, error.response.text
    assert "schedule" in error.response.json()["detail"]
client.crons.delete(on_thread["cron_id"])
assert client.crons.count() == 1
print("sdk crons passed")
"#;
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg("-c")
            .arg(script)
            .arg(format!("http://{address}"))
            .output()
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        output.status.success()
            && String::from_utf8_lossy(&output.stdout).contains("sdk crons passed"),
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// Two servers of one cluster on one PostgreSQL: each due firing happens once.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_database_fire_each_due_cron_once() {
    let Some(database) = deepagents_test_support::postgres_url() else {
        return;
    };
    let Some(redis) = deepagents_test_support::redis_url() else {
        return;
    };
    let schema = deepagents_test_support::unique_name("crons");
    let cluster_name = deepagents_test_support::unique_name("crons");
    let store = Arc::new(
        deepagents::backends::PostgresStore::connect_in_schema(&database, &schema)
            .await
            .unwrap(),
    );
    let mut apps = Vec::new();
    for _ in 0..2 {
        let watch = StepWatch::new(Arc::new(store.checkpointer()));
        let cluster =
            deepagents_server::cluster::Cluster::connect(&database, &redis, &cluster_name)
                .await
                .unwrap();
        let mut options = ServerOptions::new(
            vec![Assistant::new("agent", super::agent(watch.clone()))],
            store.clone(),
            watch,
        );
        options.cron_tick = Duration::from_millis(20);
        options.cluster = Some(Arc::new(cluster));
        apps.push(deepagents_server::router(options).unwrap());
    }
    let mut threads = Vec::new();
    for i in 0..3 {
        let (status, thread) = call(&apps[i % 2], "POST", "/threads", json!({})).await;
        assert_eq!(status, StatusCode::OK, "{thread}");
        let thread_id = thread["thread_id"].as_str().unwrap().to_owned();
        let (status, cron) = call(
            &apps[(i + 1) % 2],
            "POST",
            &format!("/threads/{thread_id}/runs/crons"),
            json!({"assistant_id": "agent", "schedule": "* * * * *", "input": hi(), "multitask_strategy": "enqueue"}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{cron}");
        threads.push((thread_id, cron["cron_id"].as_str().unwrap().to_owned()));
    }
    for (_, cron_id) in &threads {
        make_due(&*store, cron_id).await;
    }
    for (thread_id, cron_id) in &threads {
        finished_runs(&apps[0], thread_id).await;
        // Both schedulers have looked many times since.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (_, runs) = call(
            &apps[1],
            "GET",
            &format!("/threads/{thread_id}/runs"),
            Value::Null,
        )
        .await;
        let runs = runs.as_array().unwrap();
        assert_eq!(runs.len(), 1, "fired once: {runs:?}");
        assert_eq!(runs[0]["metadata"]["cron_id"], cron_id.as_str());
    }
}
