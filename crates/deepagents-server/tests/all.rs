//! The server as a library: set up in-process over an in-memory store and checkpointer, and
//! refusing setups that cannot work.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::{Read as _, Write as _};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use deepagents::Agent;
use deepagents::backends::InMemoryStore;
use deepagents::core::InMemoryCheckpointer;
use deepagents::models::ScriptedModel;
use deepagents_server::{Assistant, ServerError, ServerOptions, StepWatch};
use serde_json::{Value, json};
use tower::ServiceExt as _;

#[cfg(feature = "cluster")]
mod cluster;
mod connections;
mod cors;
mod crons;
mod events;
mod jwt;
#[cfg(feature = "otel")]
mod otel;
mod routes;
mod wakes;
mod webhooks;

/// Sends one request to `app` in process: its status and its JSON body (the text as a string
/// when it is not JSON, such as `/metrics`).
pub async fn call(
    app: &axum::Router,
    method: &str,
    path: &str,
    body: Value,
) -> (StatusCode, Value) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned())),
    )
}

fn agent(checkpointer: Arc<dyn deepagents::core::Checkpointer>) -> Agent {
    let script = json!({"turns": [{"text": "Hello from the library."}]});
    let model = Arc::new(ScriptedModel::from_json(&script.to_string()).unwrap());
    Agent::builder(model)
        .checkpointer(checkpointer)
        .build()
        .unwrap()
}

#[test]
fn setups_that_cannot_work_are_refused_with_the_fix() {
    let store = Arc::new(InMemoryStore::new());
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::new()));
    let none = ServerOptions::new(Vec::new(), store.clone(), watch.clone());
    assert!(matches!(
        deepagents_server::router(none),
        Err(ServerError::NoAssistants)
    ));
    // An agent that checkpoints elsewhere would run unseen by the server.
    let unwatched = agent(Arc::new(InMemoryCheckpointer::new()));
    let options = ServerOptions::new(
        vec![Assistant::new("agent", unwatched)],
        store.clone(),
        watch.clone(),
    );
    let error = deepagents_server::router(options).err().unwrap();
    assert!(
        error.to_string().contains(".checkpointer(watch.clone())"),
        "{error}"
    );
    let twice = ServerOptions::new(
        vec![
            Assistant::new("agent", agent(watch.clone())),
            Assistant::new("agent", agent(watch.clone())),
        ],
        store.clone(),
        watch.clone(),
    );
    assert!(matches!(
        deepagents_server::router(twice),
        Err(ServerError::DuplicateGraph(_))
    ));
    let mut bad_tenant = ServerOptions::new(
        vec![Assistant::new("agent", agent(watch.clone()))],
        store,
        watch,
    );
    bad_tenant.api_keys.insert("k".into(), "a/b".into());
    assert!(matches!(
        deepagents_server::router(bad_tenant),
        Err(ServerError::InvalidTenant(_))
    ));
}

fn request(
    address: std::net::SocketAddr,
    method: &str,
    path: &str,
    body: &serde_json::Value,
) -> (u16, String) {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let body = body.to_string();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    (
        head.split_whitespace().nth(1).unwrap().parse().unwrap(),
        if chunked {
            dechunk(body)
        } else {
            body.to_owned()
        },
    )
}

/// The body of a chunked response (waits answer so: their headers go out first).
fn dechunk(mut rest: &str) -> String {
    let mut body = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        body.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_server_answers_a_run_and_stops_on_its_signal() {
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::new()));
    let options = ServerOptions::new(
        vec![Assistant::new("agent", agent(watch.clone()))],
        Arc::new(InMemoryStore::new()),
        watch,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(deepagents_server::serve(listener, options, async {
        let _ = stopped.await;
    }));
    let (status, body) = tokio::task::spawn_blocking(move || {
        let (status, body) = request(address, "POST", "/threads", &json!({"thread_id": "t1"}));
        assert_eq!(status, 200, "{body}");
        request(
            address,
            "POST",
            "/threads/t1/runs/wait",
            &json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "hi"}]}}),
        )
    })
    .await
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let values: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        values["messages"][1]["content"], "Hello from the library.",
        "{values}"
    );
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// An agent that writes two files, each after an approval.
fn writer(checkpointer: Arc<dyn deepagents::core::Checkpointer>) -> Agent {
    let script = json!({"turns": [
        {"tool_calls": [{"name": "write_file", "args": {"file_path": "/one.md", "content": "one\n"}}]},
        {"tool_calls": [{"name": "write_file", "args": {"file_path": "/two.md", "content": "two\n"}}]},
        {"text": "Both written."}
    ]});
    let model = Arc::new(ScriptedModel::from_json(&script.to_string()).unwrap());
    Agent::builder(model)
        .checkpointer(checkpointer)
        .interrupt_on("write_file", deepagents::InterruptConfig::default())
        .build()
        .unwrap()
}

/// A resume keyed by an interrupt id answers that interrupt only: the first approval sent
/// again once the run paused on the next write is a 409 naming the pending interrupt, and the
/// next write does not happen until it is approved by its own id; of two resumes of one
/// interrupt sent at once, one applies and the other is a 409.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_answers_only_the_interrupt_it_names() {
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::new()));
    let options = ServerOptions::new(
        vec![Assistant::new("agent", writer(watch.clone()))],
        Arc::new(InMemoryStore::new()),
        watch,
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(deepagents_server::serve(listener, options, async {
        let _ = stopped.await;
    }));
    tokio::task::spawn_blocking(move || {
        let post = |path: &str, body: serde_json::Value| request(address, "POST", path, &body);
        let parse = |body: &str| -> serde_json::Value { serde_json::from_str(body).unwrap() };
        let approve = json!({"decisions": [{"type": "approve"}]});
        let resume = |id: &str| json!({"assistant_id": "agent", "command": {"resume": { id: approve.clone() }}});
        assert_eq!(post("/threads", json!({"thread_id": "t"})).0, 200);
        let (status, body) = post(
            "/threads/t/runs/wait",
            json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "write both"}]}}),
        );
        assert_eq!(status, 200, "{body}");
        let first = parse(&body)["__interrupt__"][0]["id"].as_str().unwrap().to_owned();
        let (status, body) = post("/threads/t/runs/wait", resume(&first));
        assert_eq!(status, 200, "{body}");
        let values = parse(&body);
        assert_eq!(values["files"]["/one.md"]["content"], "one\n", "{values}");
        let second = values["__interrupt__"][0]["id"].as_str().unwrap().to_owned();
        assert_ne!(first, second);
        assert_eq!(
            values["__interrupt__"][0]["value"]["action_requests"][0]["args"]["file_path"],
            "/two.md"
        );

        // The first approval again, an unknown id, a tool call's id: 409 on every door, with
        // the pending interrupt named, and nothing runs.
        for stale in [first.as_str(), "interrupt-unknown", "call_1_0"] {
            for path in ["/threads/t/runs/wait", "/threads/t/runs/stream", "/threads/t/runs"] {
                let (status, body) = post(path, resume(stale));
                assert_eq!(status, 409, "{stale} on {path}: {body}");
                let detail = parse(&body)["detail"].as_str().unwrap().to_owned();
                assert!(detail.contains(&second), "{detail}");
                assert!(detail.contains("re-read the thread state"), "{detail}");
            }
        }
        let (status, body) = request(address, "GET", "/threads/t/state", &json!(null));
        assert_eq!(status, 200, "{body}");
        let state = parse(&body);
        assert!(state["values"]["files"].get("/two.md").is_none(), "{state}");
        assert_eq!(state["values"]["files"]["/one.md"]["content"], "one\n");
        assert_eq!(state["interrupts"][0]["id"], second.as_str(), "{state}");
        assert_eq!(state["next"], json!(["tools"]));
        let (_, body) = request(address, "GET", "/threads/t", &json!(null));
        assert_eq!(parse(&body)["status"], "interrupted", "{body}");
        // The pending interrupt's id with decisions that do not fit: a 422, as before.
        let (status, body) = post(
            "/threads/t/runs/wait",
            json!({"assistant_id": "agent", "command": {"resume": { second.clone(): {"decisions": []} }}}),
        );
        assert_eq!(status, 422, "{body}");
        assert!(body.contains("0 decisions for 1"), "{body}");

        // Two resumes of the pending interrupt at once, even asking to queue: one applies.
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let mut payload = resume(&second);
                payload["multitask_strategy"] = json!("enqueue");
                std::thread::spawn(move || request(address, "POST", "/threads/t/runs/wait", &payload))
            })
            .collect();
        let mut answers: Vec<(u16, String)> =
            racers.into_iter().map(|racer| racer.join().unwrap()).collect();
        answers.sort();
        assert_eq!(answers[0].0, 200, "{answers:?}");
        assert_eq!(answers[1].0, 409, "{answers:?}");
        let values = parse(&answers[0].1);
        assert_eq!(values["files"]["/two.md"]["content"], "two\n", "{values}");
        assert!(values.get("__interrupt__").is_none(), "{values}");
        let (_, body) = request(address, "GET", "/threads/t/state", &json!(null));
        let state = parse(&body);
        let messages = state["values"]["messages"].as_array().unwrap();
        assert_eq!(messages.last().unwrap()["content"], "Both written.");
        assert_eq!(
            messages.iter().filter(|m| m["tool_call_id"] == "call_1_0").count(),
            1,
            "the second write ran once: {messages:?}"
        );
        // Nothing is pending now: the last good id is stale too.
        let (status, body) = post("/threads/t/runs/wait", resume(&second));
        assert_eq!(status, 409, "{body}");
        assert!(body.contains("no interrupt is pending"), "{body}");
    })
    .await
    .unwrap();
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
}
