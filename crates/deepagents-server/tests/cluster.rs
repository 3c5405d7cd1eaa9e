//! Servers of one cluster in process, on the test PostgreSQL and Redis: what wakes what
//! (claims, cancellations, `wait`) and what the cluster costs the database.

use super::call;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use axum::http::StatusCode;
use deepagents::backends::PostgresStore;
use deepagents::models::ScriptedModel;
use deepagents::{Model, ModelError, ModelRequest, ModelResponse};
use deepagents_server::cluster::Cluster;
use deepagents_server::{Assistant, ServerOptions, StepWatch};
use serde_json::{Value, json};

/// A scripted model of `steps` calls (a `write_todos` call each but the last, an answer) that
/// takes `delay` per call and notes when each run's first call came.
struct Slow {
    script: ScriptedModel,
    /// How long each call takes, in milliseconds.
    delay: std::sync::atomic::AtomicU64,
    /// When a call without an assistant message yet (a run's first) came.
    starts: Mutex<Vec<Instant>>,
}

impl Slow {
    fn new(steps: usize, delay: Duration) -> Arc<Self> {
        let mut turns: Vec<Value> = (1..steps)
            .map(|_| json!({"tool_calls": [{"name": "write_todos", "args": {"todos": []}}]}))
            .collect();
        turns.push(json!({"text": "Done."}));
        let script = json!({ "turns": turns });
        Arc::new(Self {
            script: ScriptedModel::from_json(&script.to_string()).unwrap(),
            delay: std::sync::atomic::AtomicU64::new(delay.as_millis() as u64),
            starts: Mutex::new(Vec::new()),
        })
    }

    fn set_delay(&self, delay: Duration) {
        self.delay.store(
            delay.as_millis() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    fn starts(&self) -> Vec<Instant> {
        self.starts.lock().unwrap().clone()
    }
}

#[async_trait]
impl Model for Slow {
    fn id(&self) -> &str {
        "slow"
    }

    async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let first = !request
            .messages
            .iter()
            .any(|message| matches!(message, deepagents::Message::Assistant(_)));
        if first {
            self.starts.lock().unwrap().push(Instant::now());
        }
        let delay = self.delay.load(std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        self.script.generate(request).await
    }
}

/// The model behind a [`Slow`], as the agent holds it.
struct Shared(Arc<Slow>);

#[async_trait]
impl Model for Shared {
    fn id(&self) -> &str {
        "slow"
    }

    async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        self.0.generate(request).await
    }
}

/// A server of the cluster: its routes and its share of the queue.
struct Node {
    app: axum::Router,
    cluster: Arc<Cluster>,
}

async fn node(
    store: &Arc<PostgresStore>,
    model: &Arc<Slow>,
    cluster: Cluster,
    jobs: Option<usize>,
) -> Node {
    let cluster = match jobs {
        Some(jobs) => cluster.with_jobs(jobs),
        None => cluster,
    };
    let cluster = Arc::new(cluster);
    let watch = StepWatch::new(Arc::new(store.checkpointer()));
    let agent = deepagents::Agent::builder(Arc::new(Shared(Arc::clone(model))))
        .checkpointer(watch.clone())
        .build()
        .unwrap();
    let mut options =
        ServerOptions::new(vec![Assistant::new("agent", agent)], store.clone(), watch);
    options.cluster = Some(Arc::clone(&cluster));
    Node {
        app: deepagents_server::router(options).unwrap(),
        cluster,
    }
}

fn hi() -> Value {
    json!({"messages": [{"role": "user", "content": "hi"}]})
}

async fn new_thread(app: &axum::Router) -> String {
    let (status, thread) = call(app, "POST", "/threads", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{thread}");
    thread["thread_id"].as_str().unwrap().to_owned()
}

/// Starts a run of a new thread on `app`; its thread and run ids.
async fn start_run(app: &axum::Router) -> (String, String) {
    let thread_id = new_thread(app).await;
    let (status, run) = call(
        app,
        "POST",
        &format!("/threads/{thread_id}/runs"),
        json!({"assistant_id": "agent", "input": hi()}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{run}");
    (thread_id, run["run_id"].as_str().unwrap().to_owned())
}

/// The run's record as `app` reads it.
async fn run_record(app: &axum::Router, thread_id: &str, run_id: &str) -> Value {
    let (status, run) = call(
        app,
        "GET",
        &format!("/threads/{thread_id}/runs/{run_id}"),
        Value::Null,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{run}");
    run
}

/// The test database and Redis, or `None` (the test is skipped).
fn services() -> Option<(String, String)> {
    Some((
        deepagents_test_support::postgres_url()?,
        deepagents_test_support::redis_url()?,
    ))
}

/// `database`'s URL with the database `name` instead.
fn with_database(database: &str, name: &str) -> String {
    let (base, _) = database.rsplit_once('/').unwrap();
    format!("{base}/{name}")
}

/// Transactions committed or rolled back in the current database, all connections.
async fn xacts(pool: &sqlx::PgPool) -> i64 {
    use sqlx::Row as _;
    sqlx::query("SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = current_database()")
        .fetch_one(pool)
        .await
        .unwrap()
        .get(0)
}

/// What the cluster costs PostgreSQL, measured on a database of its own (other tests' and
/// engineers' transactions stay out of its counters): transactions a second with every
/// server idle, transactions per run step under a small load, and the time from a run's
/// POST to its first model call on another server. Prints its numbers; asserts nothing of
/// them. `cargo nextest run -p deepagents-server --features cluster --test all
/// --run-ignored only -E 'test(cluster_costs)' --no-capture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: tens of seconds, numbers printed"]
async fn cluster_costs() {
    let Some((database, redis)) = services() else {
        return;
    };
    let admin = sqlx::PgPool::connect(&database).await.unwrap();
    let name = "deepagents_cluster_costs";
    let _ = sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await;
    let database = with_database(&database, name);
    let counter = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(&database)
        .await
        .unwrap();
    let store = Arc::new(
        PostgresStore::connect_in_schema(&database, &deepagents_test_support::unique_name("costs"))
            .await
            .unwrap(),
    );
    let cluster_name = deepagents_test_support::unique_name("costs");
    let model = Slow::new(6, Duration::from_millis(50));
    // One API-only server taking runs in, two running them.
    let api = node(
        &store,
        &model,
        Cluster::connect(&database, &redis, &cluster_name)
            .await
            .unwrap(),
        Some(0),
    )
    .await;
    let mut workers = Vec::new();
    for _ in 0..2 {
        workers.push(
            node(
                &store,
                &model,
                Cluster::connect(&database, &redis, &cluster_name)
                    .await
                    .unwrap(),
                None,
            )
            .await,
        );
    }

    // Idle: three servers, nothing to run. The counters lag (backends report at most once a
    // second), the same at both ends of a steady state.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_secs = 20;
    let before = xacts(&counter).await;
    tokio::time::sleep(Duration::from_secs(idle_secs)).await;
    let after = xacts(&counter).await;
    let idle_rate = (after - before) as f64 / idle_secs as f64;
    println!("idle: {idle_rate:.1} transactions/s (3 servers)");

    // Latency: a run POSTed to the API-only server, first model call on a worker.
    let mut latencies = Vec::new();
    for _ in 0..20 {
        let thread_id = new_thread(&api.app).await;
        let seen = model.starts().len();
        let posted = Instant::now();
        let (status, run) = call(
            &api.app,
            "POST",
            &format!("/threads/{thread_id}/runs"),
            json!({"assistant_id": "agent", "input": hi()}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{run}");
        let started = loop {
            if let Some(started) = model.starts().get(seen) {
                break *started;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        latencies.push(started.duration_since(posted).as_secs_f64() * 1000.0);
        // Finished before the next: each starts on idle servers.
        let run_id = run["run_id"].as_str().unwrap();
        let (status, _) = call(
            &api.app,
            "GET",
            &format!("/threads/{thread_id}/runs/{run_id}/join"),
            Value::Null,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(137)).await;
    }
    latencies.sort_by(f64::total_cmp);
    println!(
        "POST to first model call on another server: p50 {:.1} ms, max {:.1} ms, mean {:.1} ms",
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1],
        latencies.iter().sum::<f64>() / latencies.len() as f64
    );

    // A small load: 40 runs of 6 model calls (200 ms each), waited on the API server.
    model.set_delay(Duration::from_millis(200));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let runs = 40;
    let before = xacts(&counter).await;
    let began = Instant::now();
    let mut waits = Vec::new();
    for _ in 0..runs {
        let app = api.app.clone();
        waits.push(tokio::spawn(async move {
            let thread_id = new_thread(&app).await;
            let (status, values) = call(
                &app,
                "POST",
                &format!("/threads/{thread_id}/runs/wait"),
                json!({"assistant_id": "agent", "input": hi()}),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{values}");
            assert!(values.to_string().contains("Done."), "{values}");
        }));
    }
    for wait in waits {
        wait.await.unwrap();
    }
    let busy = began.elapsed();
    // Until every backend reported (at most 10 s after going idle).
    tokio::time::sleep(Duration::from_secs(12)).await;
    let after = xacts(&counter).await;
    let total = (after - before) as f64;
    let load = total - idle_rate * (busy.as_secs_f64() + 12.0);
    let steps = (runs * 6) as f64;
    println!(
        "load: {runs} runs x 6 steps in {:.1} s; {:.0} transactions, {:.0} above idle: {:.1} per step",
        busy.as_secs_f64(),
        total,
        load,
        load / steps
    );
    drop((api, workers));
}

/// Timings whose safety poll (and heartbeat) would never answer within a test's bounds: what
/// happens in time was woken by a notification.
fn slow_polls() -> deepagents_server::cluster::Timings {
    deepagents_server::cluster::Timings {
        lease: Duration::from_secs(30),
        heartbeat: Duration::from_secs(10),
        poll: Duration::from_secs(10),
    }
}

/// An API-only server and one that runs the runs, with `timings`, over `model`.
async fn pair(
    model: &Arc<Slow>,
    timings: deepagents_server::cluster::Timings,
) -> Option<(Node, Node)> {
    let (database, redis) = services()?;
    let store = Arc::new(
        PostgresStore::connect_in_schema(&database, &deepagents_test_support::unique_name("wake"))
            .await
            .unwrap(),
    );
    let name = deepagents_test_support::unique_name("wake");
    let connect = || async {
        Cluster::connect(&database, &redis, &name)
            .await
            .unwrap()
            .with_timings(timings)
    };
    let api = node(&store, model, connect().await, Some(0)).await;
    let worker = node(&store, model, connect().await, None).await;
    // The worker's first claim found nothing: it waits.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Some((api, worker))
}

/// How long after its POST on `api` a run's first model call came (on the other server).
async fn claim_latency(api: &Node, model: &Slow) -> (Duration, String, String) {
    let seen = model.starts().len();
    let posted = Instant::now();
    let (thread_id, run_id) = start_run(&api.app).await;
    loop {
        if let Some(started) = model.starts().get(seen) {
            return (started.duration_since(posted), thread_id, run_id);
        }
        assert!(
            posted.elapsed() < Duration::from_secs(5),
            "the run did not start"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// A run POSTed to an API-only server starts on an idle one within milliseconds, though its
/// safety poll is 10 s: the admission's notification woke it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_posted_to_one_server_is_claimed_by_an_idle_other_when_notified() {
    let model = Slow::new(1, Duration::from_millis(10));
    let Some((api, _worker)) = pair(&model, slow_polls()).await else {
        return;
    };
    let mut latencies = Vec::new();
    for _ in 0..3 {
        let (latency, thread_id, run_id) = claim_latency(&api, &model).await;
        latencies.push(latency);
        let (status, _) = call(
            &api.app,
            "GET",
            &format!("/threads/{thread_id}/runs/{run_id}/join"),
            Value::Null,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    latencies.sort();
    assert!(
        latencies[1] < Duration::from_millis(150) && latencies[2] < Duration::from_secs(1),
        "{latencies:?}"
    );
}

/// A cancel sent to one server stops the run another server runs at once: the notification
/// wakes the run's heartbeat (10 s away), no poll waited for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_reaches_a_run_on_another_server_without_waiting_for_a_poll() {
    let model = Slow::new(2, Duration::from_secs(5));
    let Some((api, _worker)) = pair(&model, slow_polls()).await else {
        return;
    };
    let (_, thread_id, run_id) = claim_latency(&api, &model).await;
    let asked = Instant::now();
    let (status, body) = call(
        &api.app,
        "POST",
        &format!("/threads/{thread_id}/runs/{run_id}/cancel"),
        json!({}),
    )
    .await;
    assert!(status.is_success(), "{status} {body}");
    loop {
        let run = run_record(&api.app, &thread_id, &run_id).await;
        if run["status"] != "pending" && run["status"] != "running" {
            assert_eq!(run["status"], "interrupted", "{run}");
            break;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "the run still goes on: {run}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );
}

/// `wait` and `join` on one server answer as soon as the run ends on another, not at the
/// safety poll (10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_and_join_on_one_server_answer_when_the_run_ends_on_another() {
    let model = Slow::new(2, Duration::from_millis(200));
    let Some((api, _worker)) = pair(&model, slow_polls()).await else {
        return;
    };
    let thread_id = new_thread(&api.app).await;
    let began = Instant::now();
    let (status, values) = call(
        &api.app,
        "POST",
        &format!("/threads/{thread_id}/runs/wait"),
        json!({"assistant_id": "agent", "input": hi()}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{values}");
    assert!(values.to_string().contains("Done."), "{values}");
    assert!(
        began.elapsed() < Duration::from_secs(2),
        "{:?}",
        began.elapsed()
    );

    let (thread_id, run_id) = start_run(&api.app).await;
    let began = Instant::now();
    let (status, values) = call(
        &api.app,
        "GET",
        &format!("/threads/{thread_id}/runs/{run_id}/join"),
        Value::Null,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{values}");
    assert!(values.to_string().contains("Done."), "{values}");
    assert!(
        began.elapsed() < Duration::from_secs(2),
        "{:?}",
        began.elapsed()
    );
}

/// The backend of worker `worker`'s listener, when connected.
async fn listener_pid(admin: &sqlx::PgPool, worker: &str) -> Option<i32> {
    use sqlx::Row as _;
    sqlx::query("SELECT pid FROM pg_stat_activity WHERE application_name = $1")
        .bind(deepagents_server::cluster::listener_name(worker))
        .fetch_optional(admin)
        .await
        .unwrap()
        .map(|row| row.get(0))
}

/// The worker's listener connection killed: a run admitted meanwhile still runs (the listener
/// connected again says to look at everything, the safety poll otherwise), and once it listens
/// again runs start at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn work_goes_on_when_the_listener_is_killed_and_it_listens_again() {
    let model = Slow::new(1, Duration::from_millis(10));
    let timings = deepagents_server::cluster::Timings {
        poll: Duration::from_secs(1),
        ..slow_polls()
    };
    let Some((api, worker)) = pair(&model, timings).await else {
        return;
    };
    let admin = sqlx::PgPool::connect(&services().unwrap().0).await.unwrap();
    let before = listener_pid(&admin, &worker.cluster.worker).await.unwrap();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(before)
        .execute(&admin)
        .await
        .unwrap();
    let thread_id = new_thread(&api.app).await;
    let (status, values) = call(
        &api.app,
        "POST",
        &format!("/threads/{thread_id}/runs/wait"),
        json!({"assistant_id": "agent", "input": hi()}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{values}");
    assert!(values.to_string().contains("Done."), "{values}");
    let waited = Instant::now();
    let after = loop {
        match listener_pid(&admin, &worker.cluster.worker).await {
            Some(pid) if pid != before => break pid,
            _ => {}
        }
        assert!(
            waited.elapsed() < Duration::from_secs(5),
            "the listener did not connect again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_ne!(after, before);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut latencies = Vec::new();
    for _ in 0..3 {
        let (latency, thread_id, run_id) = claim_latency(&api, &model).await;
        latencies.push(latency);
        let (status, _) = call(
            &api.app,
            "GET",
            &format!("/threads/{thread_id}/runs/{run_id}/join"),
            Value::Null,
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    latencies.sort();
    assert!(latencies[1] < Duration::from_millis(150), "{latencies:?}");
}
