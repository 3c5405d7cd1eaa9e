//! Against llmock (PyPI 0.2.2), a third-party mock that speaks the real wire formats: for each
//! of Responses, Chat Completions, Anthropic and Gemini, plain text, a tool-call round trip, a streamed
//! tool call, and every fault class with its documented outcome. The journal shows the retries.

use std::time::{Duration, Instant};

use deepagents_core::model::{ModelError, StopReason};
use serde_json::{Value, json};

use crate::common::*;
use crate::mock_servers::{MockServer, llmock};

fn base_url(server: &MockServer, api: Api) -> String {
    match api {
        Api::Anthropic => server.url("/anthropic"),
        Api::Gemini => server.url("/gemini"),
        _ => server.url("/v1"),
    }
}

fn script(server: &MockServer, behaviors: Value) {
    server.post("/_llmock/reset", &json!({}));
    server.post("/_llmock/scenario", &json!({ "behaviors": behaviors }));
}

/// The requests the server received for the API's endpoint.
fn journal(server: &MockServer, api: Api) -> Vec<Value> {
    let all = server.get("/_llmock/requests");
    all["requests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| api.is_call(r["path"].as_str().unwrap()))
        .cloned()
        .collect()
}

/// The request count once requests still in flight on the server are journaled: llmock
/// journals a request when it ends, and one we abandoned (a stall) ends a little later.
fn settle(server: &MockServer, api: Api, seen: usize, expected: usize) -> usize {
    let mut count = seen;
    for _ in 0..100 {
        if count >= expected {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        count = journal(server, api).len();
    }
    count
}

fn reply(text: &str) -> Value {
    json!({"type": "reply", "text": text})
}

async fn basics(api: Api) {
    let Some(server) = llmock() else { return };
    let model = model(api.spec(), base_url(&server, api), 2);

    // Plain text, whole and streamed.
    script(
        &server,
        json!([reply("Hello from the mock."), reply(LONG_TEXT)]),
    );
    let response = model.generate(&ask("hi")).await.unwrap();
    assert_eq!(text_of(&response), "Hello from the mock.");
    assert_eq!(response.stop_reason, StopReason::EndTurn);
    assert!(response.usage.input_tokens > 0, "{:?}", response.usage);
    assert!(response.usage.output_tokens > 0, "{:?}", response.usage);
    let (deltas, outcome) = stream_all(model.as_ref(), &ask("hi")).await;
    let response = outcome.unwrap();
    assert_eq!(streamed_text(&deltas), LONG_TEXT);
    assert_eq!(text_of(&response), LONG_TEXT);
    assert!(deltas.len() > 3, "text arrives in pieces: {deltas:?}");

    // A tool-call round trip.
    script(
        &server,
        json!([
            {"type": "reply", "tool_calls": [{"name": "weather", "arguments": {"city": "Paris"}}]},
            reply("It is sunny in Paris."),
        ]),
    );
    let request = ask("Weather in Paris?");
    let first = model.generate(&request).await.unwrap();
    assert_eq!(first.stop_reason, StopReason::ToolUse);
    let call = first.message.tool_calls[0].clone();
    assert_eq!(call.name, "weather");
    assert_eq!(call.arguments, json!({"city": "Paris"}));
    assert!(!call.id.is_empty());
    let second = model
        .generate(&with_tool_result(request, &call, "Sunny, 21 °C"))
        .await
        .unwrap();
    assert_eq!(text_of(&second), "It is sunny in Paris.");
    let sent = journal(&server, api);
    assert_eq!(sent.len(), 2);
    let body = sent[1]["body"].to_string();
    if api == Api::Gemini {
        // Gemini pairs a result with its call by name and position, not by id.
        assert!(body.contains("functionResponse"), "{body}");
    } else {
        assert!(
            body.contains(&call.id),
            "the result cites the call id: {body}"
        );
    }
    assert!(body.contains("Sunny, 21 °C"), "{body}");
    assert!(
        body.contains("You are terse."),
        "system prompt sent: {body}"
    );

    // A streamed tool call.
    script(
        &server,
        json!([{"type": "reply", "tool_calls": [{"name": "weather", "arguments": {"city": "Lyon", "days": 3}}]}]),
    );
    let (deltas, outcome) = stream_all(model.as_ref(), &ask("Weather in Lyon?")).await;
    let response = outcome.unwrap();
    assert_eq!(
        streamed_arguments(&deltas, 0),
        json!({"city": "Lyon", "days": 3})
    );
    assert_eq!(response.message.tool_calls.len(), 1);
    assert_eq!(
        response.message.tool_calls[0].arguments,
        json!({"city": "Lyon", "days": 3})
    );
    assert_eq!(response.stop_reason, StopReason::ToolUse);
}

/// One HTTP fault: what the call returns and how many requests the server saw.
async fn http_fault(
    server: &MockServer,
    api: Api,
    retries: u32,
    behaviors: Value,
) -> (Result<String, ModelError>, usize) {
    script(server, behaviors);
    let model = model(api.spec(), base_url(server, api), retries);
    let outcome = model.generate(&ask("hi")).await.map(|r| text_of(&r));
    (outcome, journal(server, api).len())
}

fn fail(status: u16) -> Value {
    json!({"type": "fail", "status": status, "retry_after": 0})
}

async fn http_faults(api: Api) {
    let Some(server) = llmock() else { return };
    let ok = reply("Recovered.");

    // Retried: 429 (honouring Retry-After), 408, 409, 5xx, 529.
    for status in [429, 408, 409, 500, 502, 503, 504, 529] {
        let (outcome, requests) = http_fault(&server, api, 2, json!([fail(status), ok])).await;
        assert_eq!(outcome.unwrap(), "Recovered.", "HTTP {status} is retried");
        assert_eq!(
            settle(&server, api, requests, 2),
            2,
            "HTTP {status}: one retry"
        );
    }
    let (outcome, requests) = http_fault(
        &server,
        api,
        2,
        json!([{"type": "fail", "status": 429, "retry_after": 0.2}, ok]),
    )
    .await;
    assert_eq!(outcome.unwrap(), "Recovered.");
    assert_eq!(settle(&server, api, requests, 2), 2);
    let sent = server.get("/_llmock/requests");
    let times: Vec<f64> = sent["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["started_at"].as_f64().unwrap())
        .collect();
    // llmock sends `retry-after: 1` beside `retry-after-ms: 200`: the precise one wins.
    assert!(
        times[1] - times[0] >= 0.19,
        "waited as retry-after-ms asked: {times:?}"
    );
    assert!(
        times[1] - times[0] < 0.9,
        "waited for retry-after-ms, not the rounded-up Retry-After: {times:?}"
    );

    // Retries run out: the last error, with the count.
    let (outcome, requests) = http_fault(
        &server,
        api,
        2,
        json!([{"type": "fail", "status": 503, "retry_after": 0, "times": 3}, ok]),
    )
    .await;
    let error = outcome.unwrap_err();
    assert!(matches!(error, ModelError::Transient { .. }), "{error:?}");
    assert!(
        error.to_string().contains("gave up after 2 retries"),
        "{error}"
    );
    assert_eq!(
        settle(&server, api, requests, 3),
        3,
        "first attempt and two retries"
    );

    // max_retries 0 disables retrying.
    let (outcome, requests) = http_fault(&server, api, 0, json!([fail(500), ok])).await;
    assert!(
        matches!(outcome, Err(ModelError::Transient { .. })),
        "{outcome:?}"
    );
    assert_eq!(settle(&server, api, requests, 1), 1);

    // A Retry-After beyond what we wait for is reported, not waited out.
    let (outcome, requests) = http_fault(
        &server,
        api,
        2,
        json!([{"type": "fail", "status": 429, "retry_after": 120}, ok]),
    )
    .await;
    match outcome {
        Err(ModelError::RateLimited { retry_after, .. }) => {
            assert_eq!(retry_after, Some(Duration::from_secs(120)));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(settle(&server, api, requests, 1), 1);

    // Not retried: other 4xx.
    let (outcome, requests) = http_fault(&server, api, 2, json!([fail(400), ok])).await;
    assert!(
        matches!(outcome, Err(ModelError::InvalidRequest { .. })),
        "{outcome:?}"
    );
    assert_eq!(settle(&server, api, requests, 1), 1);
    let (outcome, requests) = http_fault(&server, api, 2, json!([fail(401), ok])).await;
    let error = outcome.unwrap_err();
    assert!(
        matches!(error, ModelError::Authentication { .. }),
        "{error:?}"
    );
    assert!(!error.to_string().contains(TEST_KEY), "{error}");
    assert_eq!(settle(&server, api, requests, 1), 1);
    let (outcome, requests) = http_fault(&server, api, 2, json!([fail(404), ok])).await;
    assert!(
        matches!(outcome, Err(ModelError::InvalidRequest { .. })),
        "{outcome:?}"
    );
    assert_eq!(settle(&server, api, requests, 1), 1);

    // A context-window overflow, in the provider's own words, is its own kind.
    let overflow = match api {
        Api::Anthropic => json!({"type": "fail", "status": 400, "code": "invalid_request_error",
            "message": "prompt is too long: 210000 tokens > 200000 maximum"}),
        Api::Gemini => json!({"type": "fail", "status": 400, "code": "INVALID_ARGUMENT",
            "message": "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576)."}),
        _ => json!({"type": "fail", "status": 400, "code": "context_length_exceeded",
            "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens."}),
    };
    let (outcome, requests) = http_fault(&server, api, 2, json!([overflow, ok])).await;
    assert!(
        matches!(outcome, Err(ModelError::ContextWindowExceeded { .. })),
        "{outcome:?}"
    );
    assert_eq!(settle(&server, api, requests, 1), 1);
}

async fn stream_fault(
    server: &MockServer,
    api: Api,
    behaviors: Value,
) -> (Result<String, ModelError>, String, usize) {
    script(server, behaviors);
    let model = model(api.spec(), base_url(server, api), 2);
    let (deltas, outcome) = stream_all(model.as_ref(), &ask("hi")).await;
    (
        outcome.map(|r| text_of(&r)),
        streamed_text(&deltas),
        journal(server, api).len(),
    )
}

async fn stream_faults(api: Api) {
    let Some(server) = llmock() else { return };
    // Behaviours of different kinds apply to the same request, so the request that breaks
    // consumes a reply too; a retry needs its own.
    let ok = reply(LONG_TEXT);
    let fault = |kind: &str, after: u32| json!({"type": "stream_fault", "kind": kind, "after_chunks": after, "stall_seconds": 6});

    // Broken before any output reached the caller: sent again, transparently.
    for kind in ["truncate", "disconnect", "stall", "malformed"] {
        let (outcome, text, requests) =
            stream_fault(&server, api, json!([fault(kind, 0), ok, ok])).await;
        assert_eq!(outcome.unwrap(), LONG_TEXT, "{kind} before output");
        assert_eq!(text, LONG_TEXT, "{kind}: no duplicated deltas");
        assert_eq!(
            settle(&server, api, requests, 2),
            2,
            "{kind} before output: one retry"
        );
    }

    // Broken mid-answer: an error, never a silently short answer, and no retry (the caller
    // already showed part of the answer).
    let (outcome, text, requests) =
        stream_fault(&server, api, json!([fault("truncate", 6), ok])).await;
    let error = outcome.unwrap_err();
    assert!(matches!(error, ModelError::Transient { .. }), "{error:?}");
    assert!(error.to_string().contains("completion marker"), "{error}");
    assert!(!text.is_empty() && text != LONG_TEXT, "{text}");
    assert_eq!(settle(&server, api, requests, 1), 1);

    let (outcome, _, requests) =
        stream_fault(&server, api, json!([fault("malformed", 6), ok])).await;
    let error = outcome.unwrap_err().to_string();
    let provider = api.spec().split(':').next().unwrap();
    assert!(error.contains("malformed"), "{error}");
    assert!(error.contains(provider), "names the provider: {error}");
    assert_eq!(settle(&server, api, requests, 1), 1);

    let (outcome, _, requests) =
        stream_fault(&server, api, json!([fault("disconnect", 6), ok])).await;
    assert!(
        matches!(outcome, Err(ModelError::Transient { .. })),
        "{outcome:?}"
    );
    assert_eq!(settle(&server, api, requests, 1), 1);

    let (outcome, _, requests) = stream_fault(&server, api, json!([fault("stall", 6), ok])).await;
    let error = outcome.unwrap_err().to_string();
    assert!(error.contains("idle timeout"), "{error}");
    assert_eq!(settle(&server, api, requests, 1), 1);

    // An HTTP error before the stream starts is retried like any other.
    let (outcome, _, requests) = stream_fault(&server, api, json!([fail(503), ok])).await;
    assert_eq!(outcome.unwrap(), LONG_TEXT);
    assert_eq!(settle(&server, api, requests, 2), 2);

    // HTTP retries and stream retries share one budget: with one retry allowed, a 503 and then
    // a stream cut before output end the call after two requests.
    script(&server, json!([fail(503), fault("truncate", 0), ok, ok]));
    let one_retry = model(api.spec(), base_url(&server, api), 1);
    let (_, outcome) = stream_all(one_retry.as_ref(), &ask("hi")).await;
    let error = outcome.unwrap_err();
    assert!(
        error.to_string().contains("gave up after 1 retry)"),
        "{error}"
    );
    assert_eq!(settle(&server, api, journal(&server, api).len(), 2), 2);

    // No response headers within the first-byte timeout (3 s): abandoned and sent again. The
    // delayed request consumes the first reply, which a client without the timeout would show
    // after 6 s.
    let model = model(api.spec(), base_url(&server, api), 2);
    let delayed = |first_chunk: bool| {
        let kind = if first_chunk {
            "slow_first_token"
        } else {
            "delay"
        };
        json!([{"type": kind, "seconds": 6}, reply("Too late."), reply(LONG_TEXT)])
    };
    script(&server, delayed(false));
    let started = Instant::now();
    let response = model.generate(&ask("hi")).await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(text_of(&response), LONG_TEXT, "the retry's answer");
    assert!(
        elapsed >= Duration::from_millis(2900) && elapsed < Duration::from_millis(5500),
        "gave up at the first-byte timeout, well before the 6 s delay: {elapsed:?}"
    );
    assert_eq!(settle(&server, api, journal(&server, api).len(), 2), 2);

    // The same on a streamed call.
    script(&server, delayed(false));
    let started = Instant::now();
    let (deltas, outcome) = stream_all(model.as_ref(), &ask("hi")).await;
    let elapsed = started.elapsed();
    assert_eq!(text_of(&outcome.unwrap()), LONG_TEXT);
    assert_eq!(
        streamed_text(&deltas),
        LONG_TEXT,
        "nothing from the abandoned attempt"
    );
    assert!(
        elapsed >= Duration::from_millis(2900) && elapsed < Duration::from_millis(5500),
        "{elapsed:?}"
    );
    assert_eq!(settle(&server, api, journal(&server, api).len(), 2), 2);

    // Headers on time but no first event: the idle timeout (2 s) ends the attempt, and since
    // nothing reached the caller it is sent again.
    script(&server, delayed(true));
    let started = Instant::now();
    let (deltas, outcome) = stream_all(model.as_ref(), &ask("hi")).await;
    let elapsed = started.elapsed();
    assert_eq!(text_of(&outcome.unwrap()), LONG_TEXT);
    assert_eq!(streamed_text(&deltas), LONG_TEXT);
    assert!(
        elapsed >= Duration::from_millis(1900) && elapsed < Duration::from_millis(4500),
        "gave up at the idle timeout, well before the 6 s first token: {elapsed:?}"
    );
    assert_eq!(settle(&server, api, journal(&server, api).len(), 2), 2);
}

macro_rules! per_api {
    ($($name:ident => $api:expr),* $(,)?) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread")]
            async fn text_tool_round_trip_and_streamed_tool_call() {
                basics($api).await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn http_faults_are_retried_or_reported_by_class() {
                http_faults($api).await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn stream_faults_are_retried_before_output_and_errors_after() {
                stream_faults($api).await;
            }
        }
    )*};
}

per_api! {
    responses => Api::Responses,
    chat => Api::Chat,
    anthropic => Api::Anthropic,
    gemini => Api::Gemini,
}
