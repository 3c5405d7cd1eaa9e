//! Traces (the `otel` feature): runs' spans POSTed as OTLP JSON to a receiver on 127.0.0.1
//! that records what it got.

use super::call;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Request, StatusCode};
use deepagents::backends::InMemoryStore;
use deepagents::core::InMemoryCheckpointer;
use deepagents::models::ScriptedModel;
use deepagents_server::otel::TraceOptions;
use deepagents_server::{Assistant, ServerOptions, StepWatch};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tower::ServiceExt as _;

/// An export the receiver got.
struct Export {
    headers: HeaderMap,
    body: Value,
}

/// A receiver of `POST /v1/traces` on 127.0.0.1: its traces URL and what it got.
async fn receiver() -> (String, mpsc::UnboundedReceiver<Export>) {
    let (sender, received) = mpsc::unbounded_channel();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let sender = sender.clone();
            async move {
                let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                let _ = sender.send(Export { headers, body });
                StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}/v1/traces"), received)
}

fn options(script: Value, traces: Option<TraceOptions>) -> ServerOptions {
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::new()));
    let model = Arc::new(ScriptedModel::from_json(&script.to_string()).unwrap());
    let agent = deepagents::Agent::builder(model)
        .checkpointer(watch.clone())
        .build()
        .unwrap();
    let mut options = ServerOptions::new(
        vec![Assistant::new("agent", agent)],
        Arc::new(InMemoryStore::new()),
        watch,
    );
    options.traces = traces;
    options
}

/// The spans of `exports`, each with its attributes as a map.
fn spans(exports: &[Export]) -> Vec<Value> {
    let mut found = Vec::new();
    for export in exports {
        for resource in export.body["resourceSpans"].as_array().unwrap() {
            for scope in resource["scopeSpans"].as_array().unwrap() {
                for span in scope["spans"].as_array().unwrap() {
                    let mut span = span.clone();
                    let attributes: BTreeMap<String, Value> = span["attributes"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|a| (a["key"].as_str().unwrap().to_owned(), a["value"].clone()))
                        .collect();
                    span["attrs"] = json!(attributes);
                    found.push(span);
                }
            }
        }
    }
    found
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|span| span["name"] == name).collect()
}

fn string(span: &Value, key: &str) -> String {
    span["attrs"][key]["stringValue"]
        .as_str()
        .unwrap_or_else(|| panic!("no string {key} in {span}"))
        .to_owned()
}

fn int(span: &Value, key: &str) -> i64 {
    span["attrs"][key]["intValue"]
        .as_str()
        .unwrap_or_else(|| panic!("no int {key} in {span}"))
        .parse()
        .unwrap()
}

fn is_hex(text: &Value, len: usize) -> bool {
    text.as_str()
        .is_some_and(|t| t.len() == len && t.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Exports until `enough` holds of their spans (or 20 s pass).
async fn exports_until(
    received: &mut mpsc::UnboundedReceiver<Export>,
    enough: impl Fn(&[Value]) -> bool,
) -> Vec<Export> {
    let mut exports = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !enough(&spans(&exports)) {
        match tokio::time::timeout_at(deadline, received.recv()).await {
            Ok(Some(export)) => exports.push(export),
            _ => panic!("the spans did not arrive: {:?}", spans(&exports)),
        }
    }
    exports
}

/// A run with one tool call is one trace: the run's span with its thread and run ids, two
/// model calls with their tokens and a tool call under it. They go out when the server
/// stops (the flush interval is an hour), with the configured headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_trace_holds_its_model_and_tool_calls_and_goes_out_at_shutdown() {
    let (endpoint, mut received) = receiver().await;
    let script = json!({"turns": [
        {"tool_calls": [{"id": "w1", "name": "write_file", "args": {"file_path": "/a.md", "content": "a\n"}}],
         "usage": {"input_tokens": 120, "output_tokens": 15}},
        {"text": "Written.", "usage": {"input_tokens": 180, "output_tokens": 4}}
    ]});
    let mut traces = TraceOptions::new(&endpoint);
    traces.headers = vec![("x-otlp-key".to_owned(), "k1".to_owned())];
    traces.flush_interval = Duration::from_secs(3600);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(deepagents_server::serve(
        listener,
        options(script, Some(traces)),
        async {
            let _ = stopped.await;
        },
    ));
    let run_id = tokio::task::spawn_blocking(move || {
        let (status, body) = super::request(address, "POST", "/threads", &json!({"thread_id": "t-otel"}));
        assert_eq!(status, 200, "{body}");
        let (status, body) = super::request(
            address,
            "POST",
            "/threads/t-otel/runs/wait",
            &json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "write"}]}}),
        );
        assert_eq!(status, 200, "{body}");
        let (status, body) = super::request(address, "GET", "/threads/t-otel/runs", &json!(null));
        assert_eq!(status, 200, "{body}");
        let runs: Value = serde_json::from_str(&body).unwrap();
        runs[0]["run_id"].as_str().unwrap().to_owned()
    })
    .await
    .unwrap();
    // Nothing is sent before the flush interval or the stop.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(received.try_recv().is_err(), "exported before the stop");
    stop.send(()).unwrap();
    server.await.unwrap().unwrap();
    let exports = exports_until(&mut received, |spans| spans.len() >= 4).await;

    let export = &exports[0];
    assert_eq!(export.headers["content-type"], "application/json");
    assert_eq!(export.headers["x-otlp-key"], "k1");
    let resource = &export.body["resourceSpans"][0]["resource"]["attributes"];
    assert!(
        resource
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["key"] == "service.name" && a["value"]["stringValue"] == "deepagents"),
        "{resource}"
    );
    let spans = spans(&exports);
    assert_eq!(spans.len(), 4, "{spans:#?}");
    let runs = named(&spans, "deepagents.run");
    assert_eq!(runs.len(), 1, "{spans:#?}");
    let run = runs[0];
    assert_eq!(string(run, "deepagents.thread_id"), "t-otel");
    assert_eq!(string(run, "deepagents.run_id"), run_id);
    assert_eq!(string(run, "deepagents.tenant"), "default");
    assert_eq!(string(run, "deepagents.graph_id"), "agent");
    assert!(!string(run, "deepagents.assistant_id").is_empty());
    assert_eq!(string(run, "deepagents.run.status"), "success");
    assert_eq!(int(run, "gen_ai.usage.input_tokens"), 300);
    assert_eq!(run["status"]["code"], 1);
    assert!(run.get("parentSpanId").is_none(), "{run}");
    let trace_id = &run["traceId"];
    assert!(is_hex(trace_id, 32), "{run}");
    for span in &spans {
        assert_eq!(&span["traceId"], trace_id, "one trace: {span}");
        assert!(is_hex(&span["spanId"], 16), "{span}");
        let start: u128 = span["startTimeUnixNano"].as_str().unwrap().parse().unwrap();
        let end: u128 = span["endTimeUnixNano"].as_str().unwrap().parse().unwrap();
        assert!(start > 0 && start <= end, "{span}");
        if span != run {
            assert_eq!(span["parentSpanId"], run["spanId"], "{span}");
        }
    }
    let mut models = named(&spans, "deepagents.model_call");
    models.sort_by_key(|span| int(span, "deepagents.step"));
    assert_eq!(models.len(), 2, "{spans:#?}");
    assert_eq!(
        models
            .iter()
            .map(|span| (
                int(span, "gen_ai.usage.input_tokens"),
                int(span, "gen_ai.usage.output_tokens")
            ))
            .collect::<Vec<_>>(),
        vec![(120, 15), (180, 4)]
    );
    assert_eq!(string(models[0], "gen_ai.operation.name"), "chat");
    assert!(!string(models[0], "gen_ai.request.model").is_empty());
    assert_eq!(string(models[0], "deepagents.stop_reason"), "tool_use");
    assert_eq!(string(models[1], "deepagents.stop_reason"), "end_turn");
    assert_eq!(models[0]["kind"], 3);
    let tools = named(&spans, "deepagents.tool_call");
    assert_eq!(tools.len(), 1, "{spans:#?}");
    assert_eq!(string(tools[0], "gen_ai.tool.name"), "write_file");
    assert_eq!(string(tools[0], "gen_ai.tool.call.id"), "w1");
    assert_eq!(tools[0]["status"]["code"], 1);
    // The tool ran between the two model calls.
    let at = |span: &Value, key: &str| -> u128 { span[key].as_str().unwrap().parse().unwrap() };
    assert!(at(tools[0], "startTimeUnixNano") >= at(models[0], "endTimeUnixNano"));
    assert!(at(tools[0], "endTimeUnixNano") <= at(models[1], "startTimeUnixNano"));
}

/// A subagent's calls sit under the span of the `task` call that started it; a failed tool
/// call is an error span; a run that fails is an error span with the reason. Exported on
/// the flush interval, while the server goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subagents_nest_under_their_task_call_and_failures_are_errors() {
    let (endpoint, mut received) = receiver().await;
    let script = json!({
        "turns": [
            {"tool_calls": [{"id": "t", "name": "task", "args": {"description": "alpha: look", "subagent_type": "general-purpose"}}]},
            {"text": "done"},
            {"error": {"kind": "authentication", "message": "the key was revoked"}}
        ],
        "conversations": [{"when_task_contains": "alpha:", "turns": [
            {"tool_calls": [{"id": "s1", "name": "read_file", "args": {"file_path": "/missing.md"}}]},
            {"text": "looked"}
        ]}]
    });
    let mut traces = TraceOptions::new(&endpoint);
    traces.flush_interval = Duration::from_millis(50);
    let app = deepagents_server::router(options(script, Some(traces))).unwrap();
    let (status, thread) = call(&app, "POST", "/threads", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let thread_id = thread["thread_id"].as_str().unwrap().to_owned();
    let wait = format!("/threads/{thread_id}/runs/wait");
    let input = |text: &str| json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": text}]}});
    let (status, body) = call(&app, "POST", &wait, input("go")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, body) = call(&app, "POST", &wait, input("again")).await;
    let (_, runs) = call(
        &app,
        "GET",
        &format!("/threads/{thread_id}/runs"),
        Value::Null,
    )
    .await;
    assert!(
        runs.as_array()
            .unwrap()
            .iter()
            .any(|run| run["status"] == "error"),
        "the second run failed: {runs} {body}"
    );
    let exports = exports_until(&mut received, |spans| {
        named(spans, "deepagents.run").len() >= 2
    })
    .await;
    let spans = spans(&exports);

    let runs = named(&spans, "deepagents.run");
    let (ok, failed): (Vec<&Value>, Vec<&Value>) = runs
        .iter()
        .partition(|span| string(span, "deepagents.run.status") == "success");
    assert_eq!((ok.len(), failed.len()), (1, 1), "{runs:#?}");
    let (ok, failed) = (ok[0], failed[0]);
    assert_ne!(ok["traceId"], failed["traceId"], "a trace per run");
    assert_eq!(failed["status"]["code"], 2, "{failed}");
    assert!(
        failed["status"]["message"]
            .as_str()
            .unwrap()
            .contains("the key was revoked"),
        "{failed}"
    );
    assert_eq!(string(failed, "deepagents.run.status"), "error");
    assert_eq!(string(failed, "deepagents.error.kind"), "model");
    assert_eq!(ok["status"]["code"], 1);

    let of_run = |run: &Value| -> Vec<Value> {
        spans
            .iter()
            .filter(|span| span["traceId"] == run["traceId"])
            .cloned()
            .collect()
    };
    let first = of_run(ok);
    let task = named(&first, "deepagents.tool_call")
        .into_iter()
        .find(|span| string(span, "gen_ai.tool.name") == "task")
        .expect("the task call's span")
        .clone();
    assert_eq!(task["parentSpanId"], ok["spanId"]);
    let nested: Vec<&Value> = first
        .iter()
        .filter(|span| span["parentSpanId"] == task["spanId"])
        .collect();
    assert_eq!(
        nested
            .iter()
            .map(|span| span["name"].as_str().unwrap())
            .collect::<std::collections::BTreeSet<_>>(),
        ["deepagents.model_call", "deepagents.tool_call"].into(),
        "{nested:#?}"
    );
    assert_eq!(nested.len(), 3, "two model calls and a read: {nested:#?}");
    for span in &nested {
        assert_eq!(string(span, "deepagents.agent"), "general-purpose");
    }
    let read = nested
        .iter()
        .find(|span| span["name"] == "deepagents.tool_call")
        .unwrap();
    assert_eq!(string(read, "gen_ai.tool.name"), "read_file");
    assert_eq!(string(read, "deepagents.tool.status"), "error");
    assert_eq!(read["status"]["code"], 2, "{read}");
    // The main agent's own calls are the run's children.
    let main_models = named(&first, "deepagents.model_call")
        .into_iter()
        .filter(|span| span["parentSpanId"] == ok["spanId"])
        .count();
    assert_eq!(main_models, 2);
    // /metrics counts what the exporter dropped.
    let metrics = app
        .clone()
        .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let text = axum::body::to_bytes(metrics.into_body(), 1 << 20)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&text);
    assert!(
        text.contains("deepagents_trace_spans_dropped_total 0"),
        "{text}"
    );
}

/// Without an endpoint nothing is exported: the standard variables unset give no options,
/// and a server without them has no exporter.
#[tokio::test(flavor = "multi_thread")]
async fn nothing_is_exported_without_an_endpoint() {
    assert!(TraceOptions::from_vars(|_| None).unwrap().is_none());
    let options = options(json!({"turns": [{"text": "hi"}]}), None);
    assert!(options.traces.is_none());
    let app = deepagents_server::router(options).unwrap();
    let (status, thread) = call(&app, "POST", "/threads", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let thread_id = thread["thread_id"].as_str().unwrap();
    let (status, _) = call(
        &app,
        "POST",
        &format!("/threads/{thread_id}/runs/wait"),
        json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "hi"}]}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (_, metrics) = call(&app, "GET", "/metrics", Value::Null).await;
    let text = metrics.as_str().unwrap();
    assert!(!text.contains("deepagents_trace_spans"), "{text}");
}
