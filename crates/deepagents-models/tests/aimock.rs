//! Against aimock (npm @copilotkit/aimock 1.43.0), a second, independent mock that speaks the
//! real wire formats: for each of Responses, Chat Completions, Anthropic and Gemini, plain text, a
//! tool-call round trip, a streamed tool call, the headers we send, and each fault class.

use deepagents_core::model::{ModelError, StopReason};
use serde_json::{Value, json};

use crate::common::*;
use crate::mock_servers::{MockServer, aimock};

fn base_url(server: &MockServer, api: Api) -> String {
    match api {
        Api::Anthropic | Api::Gemini => server.url(""),
        _ => server.url("/v1"),
    }
}

fn journal(server: &MockServer, api: Api) -> Vec<Value> {
    server
        .get("/__aimock/journal")
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| api.is_call(r["path"].as_str().unwrap()))
        .cloned()
        .collect()
}

fn requests_for(server: &MockServer, api: Api, marker: &str) -> usize {
    journal(server, api)
        .iter()
        .filter(|r| r["body"].to_string().contains(marker))
        .count()
}

fn basic_fixtures() -> Value {
    json!({"fixtures": [
        {"match": {"userMessage": "hello"}, "response": {"content": "Hello from aimock."}},
        {"match": {"userMessage": "long story"}, "response": {"content": LONG_TEXT}},
        {"match": {"userMessage": "weather", "hasToolResult": false},
         "response": {"toolCalls": [{"id": "call_w1", "name": "weather", "arguments": "{\"city\":\"Paris\",\"days\":2}"}]}},
        {"match": {"userMessage": "weather", "hasToolResult": true},
         "response": {"content": "It is sunny in Paris."}},
    ]})
}

async fn basics(api: Api) {
    let Some(server) = aimock(&basic_fixtures()) else {
        return;
    };
    let model = model(api.spec(), base_url(&server, api), 2);

    let response = model.generate(&ask("hello there")).await.unwrap();
    assert_eq!(text_of(&response), "Hello from aimock.");
    assert_eq!(response.stop_reason, StopReason::EndTurn);

    let (deltas, outcome) = stream_all(model.as_ref(), &ask("tell me a long story")).await;
    assert_eq!(text_of(&outcome.unwrap()), LONG_TEXT);
    assert_eq!(streamed_text(&deltas), LONG_TEXT);

    let request = ask("weather in Paris?");
    let first = model.generate(&request).await.unwrap();
    assert_eq!(first.stop_reason, StopReason::ToolUse);
    let call = first.message.tool_calls[0].clone();
    assert_eq!(call.name, "weather");
    assert_eq!(call.arguments, json!({"city": "Paris", "days": 2}));
    let second = model
        .generate(&with_tool_result(request.clone(), &call, "Sunny, 21 °C"))
        .await
        .unwrap();
    assert_eq!(text_of(&second), "It is sunny in Paris.");

    let (deltas, outcome) = stream_all(model.as_ref(), &request).await;
    let streamed = outcome.unwrap();
    assert_eq!(
        streamed_arguments(&deltas, 0),
        json!({"city": "Paris", "days": 2})
    );
    assert_eq!(
        streamed.message.tool_calls[0].arguments,
        json!({"city": "Paris", "days": 2})
    );
    let (_, outcome) = stream_all(
        model.as_ref(),
        &with_tool_result(request, &streamed.message.tool_calls[0], "Sunny"),
    )
    .await;
    assert_eq!(text_of(&outcome.unwrap()), "It is sunny in Paris.");

    // The headers we send: credentials in the provider's header (the journal redacts them),
    // JSON, SSE on streams, and Anthropic's version.
    let sent = journal(&server, api);
    assert_eq!(sent.len(), 6, "one request per call, no retries");
    for entry in &sent {
        let headers = &entry["headers"];
        assert_eq!(headers["content-type"], "application/json", "{headers}");
        match api {
            Api::Anthropic => {
                assert!(headers["x-api-key"].is_string(), "{headers}");
                assert_eq!(headers["anthropic-version"], "2023-06-01");
                assert!(headers.get("authorization").is_none(), "{headers}");
            }
            Api::Gemini => {
                assert!(headers["x-goog-api-key"].is_string(), "{headers}");
                assert!(headers.get("authorization").is_none(), "{headers}");
            }
            _ => assert!(headers["authorization"].is_string(), "{headers}"),
        }
        let streamed = entry["body"]["stream"] == json!(true)
            || entry["path"]
                .as_str()
                .unwrap()
                .contains("streamGenerateContent");
        assert_eq!(
            headers["accept"] == "text/event-stream",
            streamed,
            "{headers}"
        );
        assert!(
            !entry.to_string().contains(TEST_KEY),
            "the key leaked: {entry}"
        );
    }
}

fn fault_fixtures() -> Value {
    json!({"fixtures": [
        {"match": {"userMessage": "ratelimited"},
         "response": {"error": {"message": "Rate limit exceeded", "type": "rate_limit_error", "code": "rate_limit_exceeded"}, "status": 429}},
        {"match": {"userMessage": "servererror"},
         "response": {"error": {"message": "Internal error", "type": "server_error"}, "status": 500}},
        {"match": {"userMessage": "overloaded"},
         "response": {"error": {"message": "Overloaded", "type": "overloaded_error"}, "status": 529}},
        {"match": {"userMessage": "badrequest"},
         "response": {"error": {"message": "Unknown parameter", "type": "invalid_request_error"}, "status": 400}},
        {"match": {"userMessage": "badkey"},
         "response": {"error": {"message": "Invalid API key", "type": "authentication_error"}, "status": 401}},
        {"match": {"userMessage": "overflow"},
         "response": {"error": {"message": "This model's maximum context length is 128000 tokens.", "type": "invalid_request_error", "code": "context_length_exceeded"}, "status": 400}},
        // Small chunks, so the cut lands mid-text in every format (Responses sends several
        // events before its first text delta).
        {"match": {"userMessage": "truncated"}, "response": {"content": LONG_TEXT},
         "truncateAfterChunks": 12, "chunkSize": 4, "latency": 10},
        {"match": {"userMessage": "disconnected"}, "response": {"content": LONG_TEXT},
         "disconnectAfterMs": 600, "chunkSize": 4, "latency": 40},
        {"match": {"userMessage": "garbled"}, "response": {"content": LONG_TEXT},
         "chaos": {"malformedRate": 1}},
    ]})
}

async fn faults(api: Api) {
    let Some(server) = aimock(&fault_fixtures()) else {
        return;
    };
    let model = model(api.spec(), base_url(&server, api), 2);

    // Retried until the retries run out: 429, 5xx, 529.
    for (marker, expect_rate_limit) in [
        ("ratelimited", true),
        ("servererror", false),
        ("overloaded", false),
    ] {
        let error = model.generate(&ask(marker)).await.unwrap_err();
        if expect_rate_limit {
            assert!(matches!(error, ModelError::RateLimited { .. }), "{error:?}");
        } else {
            assert!(matches!(error, ModelError::Transient { .. }), "{error:?}");
        }
        assert!(
            error.to_string().contains("gave up after 2 retries"),
            "{error}"
        );
        assert_eq!(
            requests_for(&server, api, marker),
            3,
            "{marker}: 1 + 2 retries"
        );
    }

    // Not retried.
    let error = model.generate(&ask("badrequest")).await.unwrap_err();
    assert!(
        matches!(error, ModelError::InvalidRequest { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("Unknown parameter"), "{error}");
    assert_eq!(requests_for(&server, api, "badrequest"), 1);
    let error = model.generate(&ask("badkey")).await.unwrap_err();
    assert!(
        matches!(error, ModelError::Authentication { .. }),
        "{error:?}"
    );
    assert_eq!(requests_for(&server, api, "badkey"), 1);
    let error = model.generate(&ask("overflow")).await.unwrap_err();
    assert!(
        matches!(error, ModelError::ContextWindowExceeded { .. }),
        "{error:?}"
    );
    assert_eq!(requests_for(&server, api, "overflow"), 1);

    // Streams cut mid-answer are errors, not short answers, and are not sent again: part of
    // the answer already reached the caller.
    let provider = api.spec().split(':').next().unwrap();
    for marker in ["truncated", "disconnected"] {
        let (deltas, outcome) = stream_all(model.as_ref(), &ask(marker)).await;
        let error = outcome.unwrap_err();
        assert!(matches!(error, ModelError::Transient { .. }), "{error:?}");
        assert!(
            error.to_string().contains(provider),
            "names the provider: {error}"
        );
        let text = streamed_text(&deltas);
        assert!(
            !text.is_empty(),
            "{marker}: output reached the caller first"
        );
        assert!(
            LONG_TEXT.starts_with(&text) && text != LONG_TEXT,
            "{marker}: {text}"
        );
        assert_eq!(requests_for(&server, api, marker), 1, "{marker}: no retry");
    }

    // A garbled body is an error naming the provider, retried since nothing reached the caller.
    let (deltas, outcome) = stream_all(model.as_ref(), &ask("garbled")).await;
    let error = outcome.unwrap_err();
    assert!(matches!(error, ModelError::Transient { .. }), "{error:?}");
    assert!(
        error.to_string().contains(provider),
        "names the provider: {error}"
    );
    assert!(deltas.is_empty(), "{deltas:?}");
    assert_eq!(requests_for(&server, api, "garbled"), 3);
    // Not streamed, the same garbled body is a non-JSON answer, retried alike.
    let error = model.generate(&ask("garbled twice")).await.unwrap_err();
    assert!(matches!(error, ModelError::Transient { .. }), "{error:?}");
    assert!(
        error.to_string().contains(provider),
        "names the provider: {error}"
    );
    assert!(error.to_string().contains("not JSON"), "{error}");
    assert_eq!(requests_for(&server, api, "garbled twice"), 3);
}

macro_rules! per_api {
    ($($name:ident => $api:expr),* $(,)?) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread")]
            async fn text_tool_round_trip_streamed_tool_call_and_headers() {
                basics($api).await;
            }

            #[tokio::test(flavor = "multi_thread")]
            async fn faults_are_retried_or_reported_by_class() {
                faults($api).await;
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
