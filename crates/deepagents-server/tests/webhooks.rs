//! Webhooks: a run created with `webhook` has its final record POSTed there once it ends, to
//! a receiver on 127.0.0.1 that records what it got.

use super::call;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use deepagents::backends::InMemoryStore;
use deepagents::core::InMemoryCheckpointer;
use deepagents::models::ScriptedModel;
use deepagents_server::{Assistant, ServerOptions, StepWatch, WebhookOptions};
use hmac::{Hmac, Mac as _};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// A request the receiver got.
struct Delivery {
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Delivery {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// A receiver on 127.0.0.1 answering each request with the next of `statuses` (200 once they
/// run out); its address and what it got.
async fn receiver(statuses: Vec<u16>) -> (String, mpsc::UnboundedReceiver<Delivery>) {
    let (sender, received) = mpsc::unbounded_channel();
    let statuses = Arc::new(Mutex::new(statuses.into_iter()));
    let app = axum::Router::new().fallback(move |headers: HeaderMap, body: axum::body::Bytes| {
        let sender = sender.clone();
        let statuses = Arc::clone(&statuses);
        async move {
            let _ = sender.send(Delivery {
                headers,
                body: body.to_vec(),
            });
            let status = statuses.lock().unwrap().next().unwrap_or(200);
            StatusCode::from_u16(status).unwrap()
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (address.to_string(), received)
}

/// The next delivery (a run takes well under the bound; nothing is timed by it).
async fn next(received: &mut mpsc::UnboundedReceiver<Delivery>) -> Delivery {
    tokio::time::timeout(Duration::from_secs(20), received.recv())
        .await
        .expect("no webhook delivery arrived")
        .unwrap()
}

/// That nothing more arrives for a while.
async fn nothing_more(received: &mut mpsc::UnboundedReceiver<Delivery>) {
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(received.try_recv().is_err(), "an unexpected delivery");
}

fn agent_of(script: Value, watch: Arc<StepWatch>) -> deepagents::Agent {
    let model = Arc::new(ScriptedModel::from_json(&script.to_string()).unwrap());
    deepagents::Agent::builder(model)
        .checkpointer(watch)
        .build()
        .unwrap()
}

/// The routes over an agent answering `script`, with webhooks to `allowed` hosts, retried
/// after 10 ms.
fn app(script: Value, allowed: &[&str], secret: Option<&str>) -> axum::Router {
    let watch = StepWatch::new(Arc::new(InMemoryCheckpointer::new()));
    let mut options = ServerOptions::new(
        vec![Assistant::new("agent", agent_of(script, watch.clone()))],
        Arc::new(InMemoryStore::new()),
        watch,
    );
    options.webhooks = WebhookOptions {
        allowed_hosts: allowed.iter().map(|host| (*host).to_owned()).collect(),
        secret: secret.map(str::to_owned),
        attempts: 3,
        backoff: Duration::from_millis(10),
        timeout: Duration::from_secs(5),
    };
    deepagents_server::router(options).unwrap()
}

fn hello() -> Value {
    json!({"turns": [{"text": "Hello from the hook."}]})
}

fn run_body(webhook: &str) -> Value {
    json!({"assistant_id": "agent", "webhook": webhook,
           "input": {"messages": [{"role": "user", "content": "hi"}]}})
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_gets_the_runs_final_record_once_it_ends() {
    let (address, mut received) = receiver(Vec::new()).await;
    let app = app(hello(), &[&address], None);
    let hook = format!("http://{address}/hooks/run?token=abc");
    let (status, thread) = call(&app, "POST", "/threads", json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let thread_id = thread["thread_id"].as_str().unwrap().to_owned();
    let (status, run) = call(
        &app,
        "POST",
        &format!("/threads/{thread_id}/runs"),
        run_body(&hook),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{run}");
    let delivery = next(&mut received).await;
    let body = delivery.json();
    assert_eq!(body["run_id"], run["run_id"], "{body}");
    assert_eq!(body["thread_id"], thread_id.as_str(), "{body}");
    assert_eq!(body["status"], "success", "{body}");
    assert_eq!(body["kwargs"]["webhook"], hook.as_str(), "{body}");
    assert_eq!(
        body["values"]["messages"][1]["content"], "Hello from the hook.",
        "{body}"
    );
    assert_eq!(delivery.headers["content-type"], "application/json");
    assert!(
        delivery.headers["user-agent"]
            .to_str()
            .unwrap()
            .starts_with("deepagents-server/")
    );
    assert!(delivery.headers.get("x-deepagents-signature").is_none());
    // What the record says now is what was sent.
    let (_, record) = call(
        &app,
        "GET",
        &format!(
            "/threads/{thread_id}/runs/{}",
            run["run_id"].as_str().unwrap()
        ),
        Value::Null,
    )
    .await;
    assert_eq!(record["status"], body["status"]);
    assert_eq!(record["updated_at"], body["updated_at"]);
    nothing_more(&mut received).await;

    // Stateless, waited and streamed runs report too; a run without a webhook does not.
    let (status, values) = call(&app, "POST", "/runs/wait", run_body(&hook)).await;
    assert_eq!(status, StatusCode::OK, "{values}");
    let body = next(&mut received).await.json();
    assert_eq!(body["status"], "success", "{body}");
    assert_eq!(
        body["values"]["messages"][1]["content"],
        "Hello from the hook."
    );
    let (status, _) = call(
        &app,
        "POST",
        &format!("/threads/{thread_id}/runs/stream"),
        run_body(&hook),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let body = next(&mut received).await.json();
    assert_eq!(body["thread_id"], thread_id.as_str(), "{body}");
    let (status, _) = call(
        &app,
        "POST",
        &format!("/threads/{thread_id}/runs/wait"),
        json!({"assistant_id": "agent", "webhook": null,
               "input": {"messages": [{"role": "user", "content": "again"}]}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    nothing_more(&mut received).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_is_retried_after_a_server_error_and_not_after_a_client_error() {
    let (address, mut received) = receiver(vec![500, 503]).await;
    let app = app(hello(), &[&address], None);
    let hook = format!("http://{address}/hook");
    let (status, _) = call(&app, "POST", "/runs/wait", run_body(&hook)).await;
    assert_eq!(status, StatusCode::OK);
    let first = next(&mut received).await;
    let second = next(&mut received).await;
    let third = next(&mut received).await;
    assert_eq!(first.body, second.body);
    assert_eq!(second.body, third.body);
    assert_eq!(third.json()["status"], "success");
    // Delivered at the third attempt: no fourth.
    nothing_more(&mut received).await;

    let (address, mut received) = receiver(vec![404, 200]).await;
    let app = self::app(hello(), &[&address], None);
    let (status, _) = call(
        &app,
        "POST",
        "/runs/wait",
        run_body(&format!("http://{address}/gone")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    next(&mut received).await;
    nothing_more(&mut received).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_is_signed_with_the_configured_secret() {
    let (address, mut received) = receiver(Vec::new()).await;
    let app = app(hello(), &[&address], Some("s3cret"));
    let (status, _) = call(
        &app,
        "POST",
        "/runs/wait",
        run_body(&format!("http://{address}/hook")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let delivery = next(&mut received).await;
    let signature = delivery.headers["x-deepagents-signature"].to_str().unwrap();
    let hex = signature.strip_prefix("sha256=").unwrap();
    let expected: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(b"s3cret").unwrap();
    mac.update(&delivery.body);
    mac.verify_slice(&expected).unwrap();
    let mut wrong = Hmac::<sha2::Sha256>::new_from_slice(b"other").unwrap();
    wrong.update(&delivery.body);
    assert!(wrong.verify_slice(&expected).is_err());
    let timestamp: u64 = delivery.headers["x-deepagents-timestamp"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(timestamp > 1_700_000_000, "{timestamp}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_webhook_to_a_host_not_allowed_is_refused_before_the_run_exists() {
    let (address, mut received) = receiver(Vec::new()).await;
    let port = address.rsplit_once(':').unwrap().1.to_owned();
    // Another port of the same host, and no list at all.
    for app in [
        app(hello(), &["127.0.0.1:1"], None),
        app(hello(), &[], None),
        app(hello(), &["*"], None),
    ] {
        let (_, thread) = call(&app, "POST", "/threads", json!({})).await;
        let thread_id = thread["thread_id"].as_str().unwrap().to_owned();
        for path in [
            format!("/threads/{thread_id}/runs"),
            format!("/threads/{thread_id}/runs/wait"),
            format!("/threads/{thread_id}/runs/stream"),
            "/runs".to_owned(),
            "/runs/wait".to_owned(),
            "/runs/stream".to_owned(),
        ] {
            let (status, answer) = call(
                &app,
                "POST",
                &path,
                run_body(&format!("http://{address}/hook")),
            )
            .await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {answer}");
            let detail = answer["detail"].as_str().unwrap();
            assert!(detail.contains("webhook_allowed_hosts"), "{detail}");
            assert!(detail.contains(&address), "{detail}");
        }
        let (_, runs) = call(
            &app,
            "GET",
            &format!("/threads/{thread_id}/runs"),
            Value::Null,
        )
        .await;
        assert_eq!(runs, json!([]), "no run was made");
        let (_, threads) = call(&app, "POST", "/threads/search", json!({})).await;
        assert_eq!(threads.as_array().unwrap().len(), 1, "{threads}");
        // Not a URL, not http.
        for bad in [json!("file:///etc/passwd"), json!("nowhere"), json!(7)] {
            let mut body = run_body("");
            body["webhook"] = bad;
            let (status, answer) = call(&app, "POST", "/runs/wait", body).await;
            assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
            assert!(answer["detail"].as_str().unwrap().contains("webhook"));
        }
    }
    // A name that is listed but resolves to a loopback address not listed by address is
    // accepted (the name is allowed) and refused when delivered: the address decides.
    let app = app(hello(), &[&format!("localhost:{port}")], None);
    let (status, _) = call(
        &app,
        "POST",
        "/runs/wait",
        run_body(&format!("http://localhost:{port}/hook")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    nothing_more(&mut received).await;
    // Listing the address too lets the name through.
    let app = self::app(hello(), &[&format!("localhost:{port}"), "127.0.0.1"], None);
    let (status, _) = call(
        &app,
        "POST",
        "/runs/wait",
        run_body(&format!("http://localhost:{port}/hook")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(next(&mut received).await.json()["status"], "success");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_run_that_fails_still_reports_to_its_webhook_with_its_error() {
    let (address, mut received) = receiver(Vec::new()).await;
    let failing = json!({"turns": [{"error": {"kind": "authentication", "message": "bad key"}}]});
    let app = app(failing, &[&address], None);
    let (status, answer) = call(
        &app,
        "POST",
        "/runs/wait",
        run_body(&format!("http://{address}/hook")),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(answer["__error__"].is_object(), "{answer}");
    let body = next(&mut received).await.json();
    assert_eq!(body["status"], "error", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("bad key"),
        "{body}"
    );
}
