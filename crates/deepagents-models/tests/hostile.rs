//! Numbers a server controls, sent absurd: none may panic us. Retry hints too long to wait are
//! reported at once, token counts saturate, a streamed call's `index` is only a key, and a
//! missing file's OS error is printed once.

use std::time::{Duration, Instant};

use deepagents_core::model::{ModelError, StreamEvent};
use deepagents_models::http::{RETRY_AFTER_CEILING, retry_after, retry_delay_in_body};
use deepagents_models::{ModelOptions, from_spec_with};
use proptest::prelude::*;
use serde_json::{Value, json};
use wiremock::matchers::method;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::common::*;

const APIS: [Api; 4] = [Api::Responses, Api::Chat, Api::Anthropic, Api::Gemini];

fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

// --- retry_after over any header --------------------------------------------------------

/// Header values worth trying: anything, number-like text of any size, the float words Rust
/// parses, and IMF-fixdates with fields of any size.
fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[ ]?[-+]?[0-9]{0,40}(\\.[0-9]{0,12})?([eE][-+]?[0-9]{1,4})?[ ]?",
        "[-+]?(inf|infinity|Infinity|NaN|nan)",
        any::<f64>().prop_map(|x| x.to_string()),
        any::<f64>().prop_map(|x| format!("{x:e}")),
        any::<u128>().prop_map(|x| x.to_string()),
        (
            "(Mon|Wed|Sun)",
            "-?[0-9]{1,22}",
            "(Jan|Feb|Oct|Dec|Foo)",
            "-?[0-9]{1,22}",
            "-?[0-9]{1,22}",
            "-?[0-9]{1,22}",
            "-?[0-9]{1,22}",
        )
            .prop_map(|(w, d, mo, y, h, mi, s)| format!("{w}, {d} {mo} {y} {h}:{mi}:{s} GMT")),
    ]
}

fn header_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("retry-after".to_owned()),
        Just("Retry-After".to_owned()),
        Just("retry-after-ms".to_owned()),
        Just("RETRY-AFTER-MS".to_owned()),
        "[a-z-]{0,16}",
    ]
}

/// What a `Retry-After` of `seconds` must come to: nothing for a value that advises nothing,
/// else the wait itself up to the ceiling.
fn check_seconds(seconds: f64, got: Option<Duration>) -> Result<(), TestCaseError> {
    if seconds.is_nan() || seconds < 0.0 {
        prop_assert_eq!(got, None);
        return Ok(());
    }
    let Some(got) = got else {
        return Err(TestCaseError::fail(format!("{seconds} s gave no wait")));
    };
    if seconds >= RETRY_AFTER_CEILING.as_secs_f64() {
        prop_assert_eq!(got, RETRY_AFTER_CEILING);
    } else {
        // A Duration holds whole nanoseconds.
        prop_assert!(
            (got.as_secs_f64() - seconds).abs() <= 1e-9 * seconds.max(1.0),
            "{} s read as {:?}",
            seconds,
            got
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    /// Any headers at all: no panic, and never a wait beyond the ceiling.
    #[test]
    fn retry_after_never_panics_and_stays_bounded(
        pairs in proptest::collection::vec((header_name(), header_value()), 0..4),
    ) {
        if let Some(wait) = retry_after(&pairs) {
            prop_assert!(wait <= RETRY_AFTER_CEILING, "{:?} from {:?}", wait, pairs);
        }
    }

    /// A number of seconds reads as itself (capped), and a negative or non-finite one as none.
    #[test]
    fn retry_after_seconds_read_as_themselves(seconds in any::<f64>(), exponent in any::<bool>()) {
        let text = if exponent { format!("{seconds:e}") } else { seconds.to_string() };
        check_seconds(seconds, retry_after(&headers(&[("retry-after", &text)])))?;
    }

    /// `retry-after-ms` wins when it is usable; otherwise `Retry-After` decides.
    #[test]
    fn retry_after_ms_wins_only_when_usable(ms in any::<f64>(), seconds in 0u32..1_000) {
        let got = retry_after(&headers(&[
            ("retry-after", &seconds.to_string()),
            ("retry-after-ms", &ms.to_string()),
        ]));
        if ms >= 0.0 {
            check_seconds(ms / 1000.0, got)?;
        } else {
            prop_assert_eq!(got, Some(Duration::from_secs(u64::from(seconds))));
        }
    }

    /// Google's `RetryInfo` in an error body, with any delay text or numbers.
    #[test]
    fn retry_delay_in_a_body_never_panics(
        text in header_value(),
        seconds in any::<f64>(),
        nanos in any::<i64>(),
    ) {
        for delay in [json!(text), json!(format!("{text}s")), json!({"seconds": seconds, "nanos": nanos})] {
            let body = json!({"error": {"code": 429, "details": [
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay},
            ]}});
            if let Some(wait) = retry_delay_in_body(&body.to_string()) {
                prop_assert!(wait <= RETRY_AFTER_CEILING);
            }
        }
    }
}

#[test]
fn absurd_retry_after_values_are_capped_or_ignored() {
    for (name, value, expected) in [
        ("retry-after", "1e300", Some(RETRY_AFTER_CEILING)),
        (
            "retry-after",
            "18446744073709551616",
            Some(RETRY_AFTER_CEILING),
        ),
        ("retry-after-ms", "1e30", Some(RETRY_AFTER_CEILING)),
        (
            "retry-after-ms",
            "1.8446744073709552e22",
            Some(RETRY_AFTER_CEILING),
        ),
        ("retry-after", "inf", Some(RETRY_AFTER_CEILING)),
        ("retry-after", "-inf", None),
        ("retry-after", "NaN", None),
        ("retry-after", "-5", None),
        (
            "retry-after",
            "Wed, 21 Oct 9223372036854775807 07:28:00 GMT",
            Some(RETRY_AFTER_CEILING),
        ),
        (
            "retry-after",
            "Wed, 21 Oct -9223372036854775808 07:28:00 GMT",
            Some(Duration::ZERO),
        ),
        (
            "retry-after",
            "Wed, 21 Oct 2015 99999999999999999:00:00 GMT",
            None,
        ),
    ] {
        assert_eq!(
            retry_after(&headers(&[(name, value)])),
            expected,
            "{name}: {value}"
        );
    }
    let gemini = |delay: Value| {
        retry_delay_in_body(
            &json!({"error": {"details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}]}})
                .to_string(),
        )
    };
    assert_eq!(gemini(json!("1.5s")), Some(Duration::from_millis(1500)));
    assert_eq!(gemini(json!("1e300s")), Some(RETRY_AFTER_CEILING));
    assert_eq!(
        gemini(json!({"seconds": 2, "nanos": 500_000_000})),
        Some(Duration::from_millis(2500))
    );
    assert_eq!(gemini(json!("-3s")), None);
}

// --- A 429 asking for an absurd wait, on every wire ---------------------------------------

fn rate_limited(name: &str, value: &str) -> ResponseTemplate {
    ResponseTemplate::new(429)
        .insert_header(name, value)
        .set_body_json(
            json!({"error": {"message": "Too many requests", "type": "rate_limit_error"}}),
        )
}

/// The outcome must be a rate-limit error that says what to do, reached without waiting and
/// without a retry.
fn assert_reported(
    outcome: Result<deepagents_core::ModelResponse, ModelError>,
    elapsed: Duration,
    what: &str,
) {
    match outcome {
        Err(ModelError::RateLimited {
            retry_after,
            message,
        }) => {
            assert!(
                retry_after.is_some_and(|wait| wait > fast_config().max_retry_after),
                "{what}: {retry_after:?}"
            );
            assert!(message.contains("try again later"), "{what}: {message}");
            assert!(message.contains("max_retry_after"), "{what}: {message}");
        }
        other => panic!("{what}: expected a rate-limit error, got {other:?}"),
    }
    assert!(elapsed < Duration::from_secs(5), "{what}: took {elapsed:?}");
}

#[tokio::test]
async fn an_absurd_retry_after_is_reported_on_every_wire_not_waited_nor_a_panic() {
    for (name, value) in [
        ("retry-after", "1e300"),
        ("retry-after-ms", "1e30"),
        ("retry-after", "18446744073709551616"),
    ] {
        for api in APIS {
            let server = MockServer::start().await;
            Mock::given(method("POST"))
                .respond_with(rate_limited(name, value))
                .mount(&server)
                .await;
            let client = model(api.spec(), server.uri(), 2);
            let what = format!("{api:?} {name}: {value}");

            let started = Instant::now();
            let outcome = client.generate(&ask("Hi")).await;
            assert_reported(outcome, started.elapsed(), &format!("{what}, generate"));

            let started = Instant::now();
            let (deltas, outcome) = stream_all(client.as_ref(), &ask("Hi")).await;
            assert!(deltas.is_empty(), "{what}: {deltas:?}");
            assert_reported(outcome, started.elapsed(), &format!("{what}, stream"));

            let calls = server.received_requests().await.unwrap().len();
            assert_eq!(calls, 2, "{what}: one request per call, no retry");
        }
    }
}

#[tokio::test]
async fn a_gemini_retry_delay_in_the_body_is_honoured_or_reported() {
    let body = |delay: &str| {
        json!({"error": {"code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED", "details": [
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay},
        ]}})
    };
    // Absurd: reported at once.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(429).set_body_json(body("1e300s")))
        .mount(&server)
        .await;
    let gemini = model(Api::Gemini.spec(), server.uri(), 2);
    let started = Instant::now();
    let outcome = gemini.generate(&ask("Hi")).await;
    assert_reported(outcome, started.elapsed(), "gemini retryDelay 1e300s");
    assert_eq!(server.received_requests().await.unwrap().len(), 1);

    // Short: waited out, then retried.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(429).set_body_json(body("0.05s")))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": "Hello."}]}, "finishReason": "STOP"}],
        })))
        .mount(&server)
        .await;
    let gemini = model(Api::Gemini.spec(), server.uri(), 2);
    let response = gemini.generate(&ask("Hi")).await.unwrap();
    assert_eq!(text_of(&response), "Hello.");
    assert_eq!(server.received_requests().await.unwrap().len(), 2);
}

// --- Token counts and error codes ---------------------------------------------------------

#[tokio::test]
async fn huge_token_counts_saturate_instead_of_overflowing() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
            "content": [{"type": "text", "text": "Hi."}], "stop_reason": "end_turn",
            "usage": {"input_tokens": u64::MAX, "cache_read_input_tokens": u64::MAX, "cache_creation_input_tokens": 7, "output_tokens": 1},
        })))
        .mount(&server)
        .await;
    let response = model(Api::Anthropic.spec(), server.uri(), 0)
        .generate(&ask("Hi"))
        .await
        .unwrap();
    assert_eq!(response.usage.input_tokens, u64::MAX);

    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": "Hi."}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": u64::MAX, "thoughtsTokenCount": u64::MAX},
        })))
        .mount(&server)
        .await;
    let response = model(Api::Gemini.spec(), server.uri(), 0)
        .generate(&ask("Hi"))
        .await
        .unwrap();
    assert_eq!(response.usage.output_tokens, u64::MAX);
}

#[tokio::test]
async fn a_gemini_error_code_beyond_u16_is_not_truncated_into_another_status() {
    // 65_965 is 429 + 65_536: cast to u16 it would read as a rate limit.
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"error": {"code": 65_965, "message": "odd"}})),
        )
        .mount(&server)
        .await;
    let outcome = model(Api::Gemini.spec(), server.uri(), 0)
        .generate(&ask("Hi"))
        .await;
    assert!(
        matches!(outcome, Err(ModelError::Transient { .. })),
        "{outcome:?}"
    );
}

// --- Streamed tool-call indices -----------------------------------------------------------

#[tokio::test]
async fn a_streamed_chat_call_index_is_only_a_key() {
    let chunk = |index: Value, id: Option<&str>, arguments: &str| {
        let mut call = json!({"index": index, "function": {"arguments": arguments}});
        if let Some(id) = id {
            call["id"] = json!(id);
            call["type"] = json!("function");
            call["function"]["name"] = json!("weather");
        }
        json!({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]})
    };
    // Huge, out of order and non-integer indices (the last falls back to the next free key);
    // the deltas of the first call resume after the second call started.
    let events = [
        chunk(json!(u64::MAX), Some("call_a"), "{\"city\":"),
        chunk(json!(5), Some("call_b"), "{\"city\":\"Oslo\"}"),
        chunk(json!(u64::MAX), None, "\"Paris\"}"),
        chunk(json!(1e300), Some("call_c"), "{}"),
        json!({"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}),
    ];
    let mut body = String::new();
    for event in &events {
        body.push_str(&format!("data: {event}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(body, "text/event-stream"))
        .mount(&server)
        .await;
    let chat = model(Api::Chat.spec(), server.uri(), 0);
    let (deltas, outcome) = stream_all(chat.as_ref(), &ask("Weather?")).await;
    let response = outcome.unwrap();
    let ids: Vec<&str> = response
        .message
        .tool_calls
        .iter()
        .map(|c| c.id.as_str())
        .collect();
    assert_eq!(ids, ["call_a", "call_b", "call_c"]);
    for (i, call) in response.message.tool_calls.iter().enumerate() {
        assert_eq!(
            streamed_arguments(&deltas, i),
            call.arguments,
            "delta index {i} is call {i}"
        );
    }
    assert_eq!(
        response.message.tool_calls[0].arguments,
        json!({"city": "Paris"})
    );
    assert!(deltas.iter().all(|d| match d {
        StreamEvent::ToolCallDelta { index, .. } => *index < 3,
        _ => true,
    }));
}

// --- A missing file's OS error, once --------------------------------------------------------

use crate::scripted::chain;

#[test]
fn a_missing_cassette_prints_its_os_error_once() {
    // The text this platform gives the error, e.g. "No such file or directory (os error 2)".
    let os_error = std::fs::read("/no/such/cassette.json")
        .unwrap_err()
        .to_string();
    let error = from_spec_with("replay:/no/such/cassette.json", &ModelOptions::default())
        .err()
        .unwrap();
    let text = chain(&error);
    assert_eq!(text.matches(&os_error).count(), 1, "{text}");
    assert!(
        text.contains("cannot access cassette /no/such/cassette.json"),
        "{text}"
    );
}
