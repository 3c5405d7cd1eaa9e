//! The thread-centric streaming protocol (`POST /threads/{id}/commands`, `POST
//! /threads/{id}/stream/events`), checked in process: what `@langchain/react`'s v2
//! `useStream` relies on.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use deepagents::backends::InMemoryStore;
use deepagents::core::InMemoryCheckpointer;
use deepagents_server::{Assistant, ServerOptions, StepWatch};
use futures::StreamExt as _;
use serde_json::{Value, json};
use tower::ServiceExt as _;

fn app_with(
    agent: fn(Arc<dyn deepagents::core::Checkpointer>) -> deepagents::Agent,
) -> axum::Router {
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::new()));
    let options = ServerOptions::new(
        vec![Assistant::new("agent", agent(watch.clone()))],
        Arc::new(InMemoryStore::new()),
        watch,
    );
    deepagents_server::router(options).unwrap()
}

/// An agent that answers twice.
fn chatty(checkpointer: Arc<dyn deepagents::core::Checkpointer>) -> deepagents::Agent {
    let script = json!({"turns": [{"text": "Hello from the library."}, {"text": "Hello again."}]});
    let model =
        Arc::new(deepagents::models::ScriptedModel::from_json(&script.to_string()).unwrap());
    deepagents::Agent::builder(model)
        .checkpointer(checkpointer)
        .build()
        .unwrap()
}

fn post(path: &str, body: &Value) -> Request<Body> {
    Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

/// Sends a command; the HTTP status and the protocol response.
async fn command(app: &axum::Router, thread: &str, body: Value) -> (StatusCode, Value) {
    let response = app
        .clone()
        .oneshot(post(&format!("/threads/{thread}/commands"), &body))
        .await
        .unwrap();
    let status = response.status();
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// An open event stream, read event by event.
struct Events {
    body: axum::body::BodyDataStream,
    buffer: String,
}

impl Events {
    async fn open(app: &axum::Router, thread: &str, filter: Value) -> Self {
        let response = app
            .clone()
            .oneshot(post(&format!("/threads/{thread}/stream/events"), &filter))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(
            response.headers()["content-type"],
            "text/event-stream",
            "{response:?}"
        );
        Self {
            body: response.into_body().into_data_stream(),
            buffer: String::new(),
        }
    }

    /// The next event; comments (heartbeats) are skipped. Checks that the SSE `event:` is
    /// the method and `id:` the `seq`.
    async fn next(&mut self) -> Value {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let frame: String = self.buffer.drain(..end + 2).collect();
                if frame.starts_with(':') {
                    continue;
                }
                let field = |name: &str| {
                    frame
                        .lines()
                        .find_map(|line| line.strip_prefix(&format!("{name}: ")))
                        .unwrap_or_else(|| panic!("no {name} in {frame:?}"))
                        .to_owned()
                };
                let event: Value = serde_json::from_str(&field("data")).unwrap();
                assert_eq!(event["method"], field("event").as_str(), "{frame}");
                assert_eq!(event["seq"].to_string(), field("id"), "{frame}");
                assert_eq!(event["type"], "event");
                return event;
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.body.next())
                .await
                .unwrap_or_else(|_| panic!("no event in 10 s; buffered: {:?}", self.buffer))
                .expect("the stream goes on")
                .unwrap();
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    /// Events up to and including the root's lifecycle event `status`.
    async fn until_root(&mut self, status: &str) -> Vec<Value> {
        let mut events = Vec::new();
        loop {
            let event = self.next().await;
            let done = is_root_lifecycle(&event, status);
            events.push(event);
            if done {
                return events;
            }
        }
    }
}

fn is_root_lifecycle(event: &Value, status: &str) -> bool {
    event["method"] == "lifecycle"
        && event["params"]["namespace"] == json!([])
        && event["params"]["data"]["event"] == status
}

const ALL: [&str; 7] = [
    "lifecycle",
    "messages",
    "values",
    "updates",
    "checkpoints",
    "tools",
    "input",
];

fn hello(thread_message: &str) -> Value {
    json!({"messages": [{"type": "human", "content": thread_message}]})
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_started_by_command_streams_its_lifecycle_messages_and_values_and_resumes_after_since()
 {
    let app = app_with(chatty);
    let (status, answer) = command(
        &app,
        "v2",
        json!({"id": 1, "method": "run.start", "params": {"assistant_id": "agent", "input": {"messages": [{"type": "human", "content": "hi", "id": "mine-1"}]}}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["type"], "success", "{answer}");
    assert_eq!(answer["id"], 1);
    let run_id = answer["result"]["run_id"].as_str().unwrap().to_owned();
    let applied = answer["meta"]["applied_through_seq"].as_u64().unwrap();

    let mut stream = Events::open(&app, "v2", json!({"channels": ALL})).await;
    let events = stream.until_root("completed").await;
    // Numbered on from what the command reported, without gaps; the run named by its root
    // lifecycle events' ids.
    let seq = |event: &Value| event["seq"].as_u64().unwrap();
    for (i, event) in events.iter().enumerate() {
        assert_eq!(seq(event), applied + 1 + i as u64, "{events:#?}");
    }
    assert!(is_root_lifecycle(&events[0], "running"), "{:#}", events[0]);
    assert_eq!(
        events[0]["event_id"],
        format!("synth:{run_id}:lc||running"),
        "{:#}",
        events[0]
    );
    assert_eq!(events[0]["params"]["data"]["graph_name"], "agent");
    let position = |pred: &dyn Fn(&Value) -> bool| {
        events
            .iter()
            .position(pred)
            .unwrap_or_else(|| panic!("missing in {events:#?}"))
    };
    let data = |event: &Value| event["params"]["data"].clone();
    // The answer streams as one AI message: start, a text block, its delta, finish.
    let start = position(&|e| e["method"] == "messages" && data(e)["event"] == "message-start");
    let start_data = data(&events[start]);
    assert_eq!(start_data["role"], "ai");
    assert_eq!(
        start_data["id"], "msg-1",
        "the id its message has in values"
    );
    assert_eq!(events[start]["params"]["node"], "model");
    assert_eq!(
        data(&events[start + 1]),
        json!({"event": "content-block-start", "index": 0, "content": {"type": "text", "text": ""}})
    );
    let deltas: String = events
        .iter()
        .filter(|e| data(e)["event"] == "content-block-delta")
        .map(|e| data(e)["delta"]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(deltas, "Hello from the library.");
    let finish = position(&|e| data(e)["event"] == "message-finish");
    assert_eq!(
        data(&events[finish])["reason"],
        "stop",
        "{:#}",
        events[finish]
    );
    assert!(data(&events[finish])["usage"]["output_tokens"].is_u64());
    assert_eq!(
        data(&events[finish - 1])["content"],
        json!({"type": "text", "text": "Hello from the library."})
    );
    // The state after the step that saved the answer, with its checkpoint just before.
    let values = events
        .iter()
        .rposition(|e| e["method"] == "values")
        .unwrap();
    assert!(values > finish);
    let state = data(&events[values]);
    assert_eq!(state["messages"][0]["content"], "hi");
    // The id the client gave its message names it, so the SDK matches it with what it shows.
    assert_eq!(state["messages"][0]["id"], "mine-1");
    assert_eq!(state["messages"][1]["content"], "Hello from the library.");
    assert_eq!(state["messages"][1]["id"], "msg-1");
    assert!(state.get("__interrupt__").is_none());
    assert_eq!(events[values - 1]["method"], "checkpoints");
    assert!(data(&events[values - 1])["id"].is_string());
    assert!(
        events
            .iter()
            .any(|e| e["method"] == "updates" && data(e)["node"] == "model"),
        "{events:#?}"
    );
    let last = events.last().unwrap();
    assert_eq!(last["event_id"], format!("synth:{run_id}:lc||completed"));

    // A stream opened with `since` replays exactly what came after it.
    let cut = 3;
    let mut resumed = Events::open(
        &app,
        "v2",
        json!({"channels": ALL, "since": seq(&events[cut - 1])}),
    )
    .await;
    let replayed = resumed.until_root("completed").await;
    assert_eq!(replayed, events[cut..].to_vec());

    // The next run goes on the same tape, numbered on; a stream still open sees it.
    let (_, answer) = command(
        &app,
        "v2",
        json!({"id": 2, "method": "run.start", "params": {"assistant_id": "agent", "input": hello("again")}}),
    )
    .await;
    assert_eq!(answer["type"], "success", "{answer}");
    let last = seq(events.last().unwrap());
    assert_eq!(answer["meta"]["applied_through_seq"], last, "{answer}");
    let second = stream.until_root("completed").await;
    assert_eq!(seq(&second[0]), last + 1);
    assert!(is_root_lifecycle(&second[0], "running"));
    let start = second
        .iter()
        .find(|e| data(e)["event"] == "message-start")
        .unwrap();
    assert_eq!(data(start)["id"], "msg-3", "{start}");
    let values = second
        .iter()
        .rev()
        .find(|e| e["method"] == "values")
        .unwrap();
    let ids: Vec<Value> = data(values)["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].clone())
        .collect();
    assert_eq!(
        ids,
        [
            json!("mine-1"),
            json!("msg-1"),
            json!("msg-2"),
            json!("msg-3")
        ]
    );

    // A filter: only root lifecycle events, replayed from the start.
    let mut lifecycle = Events::open(
        &app,
        "v2",
        json!({"channels": ["lifecycle"], "namespaces": [[]], "depth": 0}),
    )
    .await;
    let statuses: Vec<Value> = [
        lifecycle.next().await,
        lifecycle.next().await,
        lifecycle.next().await,
        lifecycle.next().await,
    ]
    .iter()
    .map(|e| data(e)["event"].clone())
    .collect();
    assert_eq!(
        statuses,
        [
            json!("running"),
            json!("completed"),
            json!("running"),
            json!("completed")
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interrupt_is_an_input_event_and_input_respond_continues_the_run() {
    let app = app_with(super::writer);
    let (_, answer) = command(
        &app,
        "hitl",
        json!({"id": 1, "method": "run.start", "params": {"assistant_id": "agent", "input": hello("write both")}}),
    )
    .await;
    assert_eq!(answer["type"], "success", "{answer}");
    let mut stream = Events::open(&app, "hitl", json!({"channels": ALL})).await;
    let data = |event: &Value| event["params"]["data"].clone();
    let mut files = Vec::new();
    for expected in ["/one.md", "/two.md"] {
        let events = stream.until_root("interrupted").await;
        // The call streamed as a tool-call block, finished with its parsed arguments.
        let call = events
            .iter()
            .find(|e| {
                data(e)["event"] == "content-block-finish" && e["params"]["namespace"] == json!([])
            })
            .unwrap_or_else(|| panic!("{events:#?}"));
        assert_eq!(data(call)["content"]["type"], "tool_call", "{call}");
        assert_eq!(data(call)["content"]["name"], "write_file");
        assert_eq!(data(call)["content"]["args"]["file_path"], expected);
        let request = events
            .iter()
            .find(|e| e["method"] == "input.requested")
            .unwrap_or_else(|| panic!("{events:#?}"));
        assert_eq!(request["params"]["namespace"], json!([]));
        let interrupt = data(request)["interrupt_id"].as_str().unwrap().to_owned();
        let payload = data(request)["payload"].clone();
        assert_eq!(
            payload["action_requests"][0]["name"], "write_file",
            "{payload}"
        );
        assert_eq!(payload["action_requests"][0]["args"]["file_path"], expected);
        assert_eq!(
            payload["review_configs"][0]["allowed_decisions"],
            json!(["approve", "edit", "reject"])
        );
        // Nothing ran yet: no tool event before the approval.
        assert!(
            !events.iter().any(|e| e["method"] == "tools"),
            "{events:#?}"
        );
        // A stale or unknown interrupt is refused by its protocol code, and nothing runs.
        let (status, refused) = command(
            &app,
            "hitl",
            json!({"id": 7, "method": "input.respond", "params": {"namespace": [], "interrupt_id": "interrupt-unknown", "response": {"decisions": [{"type": "approve"}]}}}),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(refused["type"], "error", "{refused}");
        assert_eq!(refused["error"], "no_such_interrupt", "{refused}");
        assert_eq!(refused["id"], 7);
        // The first pause is answered by input.respond; the second by run.start with the
        // answer as its input, which the reference server also takes as a resume.
        let resume = if expected == "/one.md" {
            json!({"id": 2, "method": "input.respond", "params": {"namespace": [], "interrupt_id": interrupt, "response": {"decisions": [{"type": "approve"}]}}})
        } else {
            json!({"id": 2, "method": "run.start", "params": {"assistant_id": "agent", "input": {"decisions": [{"type": "approve"}]}}})
        };
        let (_, answer) = command(&app, "hitl", resume).await;
        assert_eq!(answer["type"], "success", "{answer}");
        // The resumed run says which interrupt it answers, then runs the approved call.
        let running = stream.next().await;
        assert!(is_root_lifecycle(&running, "running"), "{running}");
        let answered = stream.next().await;
        assert_eq!(answered["method"], "input.answered");
        assert_eq!(data(&answered)["interrupt_ids"], json!([interrupt]));
        // The approval is saved as a step first, then the call runs.
        let started = loop {
            let event = stream.next().await;
            assert!(!is_root_lifecycle(&event, "completed"), "{event}");
            if event["method"] == "tools" {
                break event;
            }
        };
        assert_eq!(data(&started)["event"], "tool-started");
        assert_eq!(data(&started)["tool_name"], "write_file");
        let call_id = data(&started)["tool_call_id"].as_str().unwrap().to_owned();
        assert_eq!(
            started["params"]["namespace"],
            json!([format!("tools:{call_id}")])
        );
        let finished = stream.next().await;
        assert_eq!(data(&finished)["event"], "tool-finished", "{finished}");
        files.push(expected);
    }
    let rest = stream.until_root("completed").await;
    let values = rest.iter().rev().find(|e| e["method"] == "values").unwrap();
    let state = data(values);
    assert_eq!(state["files"]["/one.md"]["content"], "one\n");
    assert_eq!(state["files"]["/two.md"]["content"], "two\n");
    assert_eq!(
        state["messages"].as_array().unwrap().last().unwrap()["content"],
        "Both written."
    );
    assert_eq!(files, ["/one.md", "/two.md"]);

    // The tree of the latest run, and its state by command.
    let (_, tree) = command(&app, "hitl", json!({"id": 3, "method": "agent.getTree"})).await;
    assert_eq!(tree["result"]["tree"]["namespace"], json!([]), "{tree}");
    assert_eq!(tree["result"]["tree"]["status"], "completed", "{tree}");
    let (_, state) = command(
        &app,
        "hitl",
        json!({"id": 4, "method": "state.get", "params": {"namespace": [], "keys": ["files"]}}),
    )
    .await;
    assert_eq!(state["type"], "success", "{state}");
    assert!(
        state["result"]["values"].get("messages").is_none(),
        "{state}"
    );
    assert_eq!(
        state["result"]["values"]["files"]["/two.md"]["content"],
        "two\n"
    );
    let (_, list) = command(
        &app,
        "hitl",
        json!({"id": 5, "method": "state.listCheckpoints", "params": {"limit": 2}}),
    )
    .await;
    assert_eq!(
        list["result"]["checkpoints"].as_array().unwrap().len(),
        2,
        "{list}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn commands_it_does_not_know_or_cannot_read_are_protocol_errors_never_500s() {
    let app = app_with(super::agent);
    let cases = [
        (
            json!({"id": 1, "method": "run.teleport", "params": {}}),
            StatusCode::OK,
            "unknown_command",
        ),
        (
            json!({"id": 2, "method": "subscription.subscribe", "params": {"channels": ["values"]}}),
            StatusCode::OK,
            "not_supported",
        ),
        (
            json!({"id": 3, "method": "input.inject", "params": {"namespace": [], "message": {"role": "user", "content": "hi"}}}),
            StatusCode::OK,
            "not_supported",
        ),
        (
            json!({"id": 4, "method": "run.start", "params": {"input": null}}),
            StatusCode::OK,
            "invalid_argument",
        ),
        (
            json!({"id": 5, "method": "run.start", "params": {"assistant_id": "nobody", "input": null}}),
            StatusCode::OK,
            "invalid_argument",
        ),
        (
            json!({"id": 6, "method": "input.respond", "params": {"interrupt_id": "x", "response": true}}),
            StatusCode::OK,
            "no_such_run",
        ),
        (
            json!({"method": "run.start"}),
            StatusCode::BAD_REQUEST,
            "invalid_argument",
        ),
        (
            json!({"id": 8, "method": "state.get", "params": {"namespace": ["tools:x"]}}),
            StatusCode::OK,
            "no_such_namespace",
        ),
    ];
    for (body, status, code) in cases {
        let (got, answer) = command(&app, "errors", body.clone()).await;
        assert_eq!(got, status, "{body}: {answer}");
        assert_eq!(answer["type"], "error", "{body}: {answer}");
        assert_eq!(answer["error"], code, "{body}: {answer}");
        assert_eq!(answer["id"], body.get("id").cloned().unwrap_or(Value::Null));
        assert!(!answer["message"].as_str().unwrap().is_empty());
    }
    // Not JSON at all.
    let response = app
        .clone()
        .oneshot(
            Request::builder()
                .method("POST")
                .uri("/threads/errors/commands")
                .body(Body::from("not json"))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);

    // Event streams: an unknown channel is refused by name; a thread that does not exist is a
    // 404 (run.start makes it).
    let response = app
        .clone()
        .oneshot(post(
            "/threads/errors/stream/events",
            &json!({"channels": ["values", "debug"]}),
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&bytes).contains("unknown channel"));
    let response = app
        .clone()
        .oneshot(post(
            "/threads/nowhere/stream/events",
            &json!({"channels": ["values"]}),
        ))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

/// An event stream follows its thread until the client goes; a server that stops ends it,
/// so the server can stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_event_stream_ends_when_the_server_stops() {
    use std::io::{Read as _, Write as _};
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
    let (open_tx, open_rx) = std::sync::mpsc::channel();
    let reader = tokio::task::spawn_blocking(move || {
        let (status, body) =
            super::request(address, "POST", "/threads", &json!({"thread_id": "s"}));
        assert_eq!(status, 200, "{body}");
        let mut stream = std::net::TcpStream::connect(address).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let body = json!({"channels": ["lifecycle"]}).to_string();
        write!(
            stream,
            "POST /threads/s/stream/events HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut seen = Vec::new();
        let mut buffer = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains(": connected") {
            let read = stream
                .read(&mut buffer)
                .unwrap_or_else(|error| panic!("{error}: {}", String::from_utf8_lossy(&seen)));
            assert!(read > 0, "closed early: {}", String::from_utf8_lossy(&seen));
            seen.extend_from_slice(&buffer[..read]);
        }
        open_tx.send(()).unwrap();
        // Then nothing more, until the server stops and the stream ends.
        loop {
            match stream.read(&mut buffer) {
                Ok(0) => return String::from_utf8_lossy(&seen).into_owned(),
                Ok(read) => seen.extend_from_slice(&buffer[..read]),
                Err(error) => panic!("the stream did not end: {error}"),
            }
        }
    });
    tokio::task::spawn_blocking(move || open_rx.recv().unwrap())
        .await
        .unwrap();
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the server stops with a stream open")
        .unwrap()
        .unwrap();
    let seen = reader.await.unwrap();
    assert!(seen.contains("text/event-stream"), "{seen}");
}

/// Command params and stream bodies are typed: a field of the wrong shape is refused, named.
#[tokio::test(flavor = "multi_thread")]
async fn params_of_the_wrong_shape_are_refused_by_name() {
    let app = app_with(chatty);
    for (params, says) in [
        (
            json!({"assistant_id": "agent", "multitask_strategy": "bogus"}),
            "`multitask_strategy` must be one of",
        ),
        (
            json!({"assistant_id": "agent", "multitaskStrategy": 3}),
            "`multitaskStrategy` must be a string",
        ),
        (
            json!({"assistant_id": 7}),
            "`assistant_id` must be a string",
        ),
    ] {
        let body = json!({"id": 1, "method": "run.start", "params": params});
        let (status, answer) = command(&app, "typed", body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["error"], "invalid_argument", "{answer}");
        let message = answer["message"].as_str().unwrap();
        assert!(message.contains(says), "{message} lacks {says}");
    }
    let body = json!({"id": 2, "method": "state.get", "params": {"keys": "messages"}});
    let (_, answer) = command(&app, "typed", body).await;
    assert_eq!(answer["error"], "invalid_argument", "{answer}");
    assert!(
        answer["message"].as_str().unwrap().contains("`keys`"),
        "{answer}"
    );
    for (filter, says) in [
        (
            json!({"channels": 5}),
            "`channels` must be a non-empty list",
        ),
        (json!({}), "`channels` must be a non-empty list"),
        (
            json!({"channels": ["values"], "namespaces": "root"}),
            "`namespaces` must be a list of namespaces",
        ),
        (
            json!({"channels": ["values"], "since": "later"}),
            "`since` must be a non-negative integer",
        ),
    ] {
        let response = app
            .clone()
            .oneshot(post("/threads/typed/stream/events", &filter))
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "{filter}"
        );
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains(says), "{filter}: {text} lacks {says}");
    }
}
