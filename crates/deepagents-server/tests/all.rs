//! The server as a library: set up in-process over an in-memory store and checkpointer, and
//! refusing setups that cannot work.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::{Read as _, Write as _};
use std::sync::Arc;

use deepagents::Agent;
use deepagents::backends::InMemoryStore;
use deepagents::core::InMemoryCheckpointer;
use deepagents::models::ScriptedModel;
use deepagents_server::{Assistant, ServerError, ServerOptions, StepWatch};
use serde_json::json;

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
    (
        head.split_whitespace().nth(1).unwrap().parse().unwrap(),
        body.to_owned(),
    )
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
