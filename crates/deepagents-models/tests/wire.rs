//! Wire formats against wiremock: what we send and how we read what comes back, for what the
//! mock servers do not cover (Gemini, prompt caching, reasoning round trips, images, schemas).

use deepagents_core::ContentBlock;
use deepagents_core::message::{AssistantMessage, Message, ToolCall, ToolResult, ToolStatus};
use deepagents_core::model::{ModelError, ModelRequest, StopReason, StreamEvent};
use deepagents_models::http::{Secret, retry_after};
use deepagents_models::{ModelOptions, from_spec_with};
use serde_json::{Value, json};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::common::*;

fn sse(events: &[(&str, Value)]) -> ResponseTemplate {
    let mut body = String::new();
    for (name, data) in events {
        if !name.is_empty() {
            body.push_str(&format!("event: {name}\n"));
        }
        body.push_str(&format!("data: {data}\n\n"));
    }
    ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")
}

async fn sent_bodies(server: &MockServer) -> Vec<Value> {
    server
        .received_requests()
        .await
        .unwrap()
        .iter()
        .map(|r| serde_json::from_slice(&r.body).unwrap())
        .collect()
}

const PNG: &[u8] = b"\x89PNG\r\n\x1a\nfake";

fn schema_with_refs() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "city": {"type": "string", "default": "Paris"},
            "unit": {"$ref": "#/$defs/Unit"},
            "note": {"type": ["string", "null"]},
        },
        "required": ["city"],
        "$defs": {"Unit": {"type": "string", "enum": ["c", "f"], "title": "Unit"}},
    })
}

fn image_request() -> ModelRequest {
    let call = ToolCall {
        id: "call_1".into(),
        name: "screenshot".into(),
        arguments: json!({}),
    };
    ModelRequest {
        system_prompt: Some("Be brief.".into()),
        messages: vec![
            Message::User {
                content: vec![
                    ContentBlock::text("What is this?"),
                    ContentBlock::data("image/png", PNG),
                ],
            },
            Message::Assistant(AssistantMessage {
                content: vec![],
                tool_calls: vec![call.clone()],
            }),
            Message::Tool(ToolResult {
                tool_call_id: "call_1".into(),
                name: "screenshot".into(),
                content: vec![
                    ContentBlock::text("Here it is."),
                    ContentBlock::data("image/png", PNG),
                ],
                status: ToolStatus::Ok,
                artifact: None,
            }),
        ]
        .into(),
        tools: vec![],
        ..ModelRequest::default()
    }
}

// --- Gemini -----------------------------------------------------------------------------

fn gemini(server: &MockServer) -> std::sync::Arc<dyn deepagents_core::Model> {
    model("google_genai:gemini-2.5-flash", server.uri(), 2)
}

#[tokio::test]
async fn gemini_generates_text_and_tool_calls_with_a_sanitized_schema() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1beta/models/gemini-2.5-flash:generateContent"))
        .and(header("x-goog-api-key", TEST_KEY))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "candidates": [{"content": {"role": "model", "parts": [
                {"text": "Checking.", },
                {"functionCall": {"name": "weather", "args": {"city": "Paris"}}, "thoughtSignature": "sig-1"},
            ]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 120, "candidatesTokenCount": 8, "thoughtsTokenCount": 4, "cachedContentTokenCount": 100},
        })))
        .mount(&server)
        .await;
    let model = gemini(&server);
    let mut request = ask("Weather in Paris?");
    request.tools[0].parameters = schema_with_refs().into();
    let response = model.generate(&request).await.unwrap();
    assert_eq!(text_of(&response), "Checking.");
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    let call = &response.message.tool_calls[0];
    assert_eq!(
        (call.name.as_str(), &call.arguments),
        ("weather", &json!({"city": "Paris"}))
    );
    assert!(!call.id.is_empty());
    assert_eq!(response.usage.input_tokens, 120);
    assert_eq!(response.usage.output_tokens, 12);
    assert_eq!(response.usage.cached_input_tokens, 100);

    let sent = &sent_bodies(&server).await[0];
    assert_eq!(
        sent["systemInstruction"]["parts"][0]["text"],
        "You are terse."
    );
    let params = &sent["tools"][0]["functionDeclarations"][0]["parameters"];
    assert_eq!(
        params["properties"]["unit"],
        json!({"type": "string", "enum": ["c", "f"]})
    );
    assert_eq!(
        params["properties"]["note"],
        json!({"type": "string", "nullable": true})
    );
    assert!(params.get("additionalProperties").is_none(), "{params}");
    assert!(
        params.get("$defs").is_none() && params.get("$schema").is_none(),
        "{params}"
    );
    assert!(
        params["properties"]["city"].get("default").is_none(),
        "{params}"
    );

    // The next turn sends the call back with its signature, and the result as a response.
    let next = with_tool_result(request.clone(), call, "Sunny");
    let mut next = next;
    if let Message::Assistant(turn) = &mut next.messages[1] {
        turn.content = response.message.content.clone();
    }
    let _ = model.generate(&next).await.unwrap();
    let sent = &sent_bodies(&server).await[1];
    let contents = sent["contents"].as_array().unwrap();
    assert_eq!(contents[1]["role"], "model");
    let call_part = contents[1]["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p.get("functionCall").is_some())
        .unwrap();
    assert_eq!(call_part["thoughtSignature"], "sig-1");
    assert_eq!(
        contents[2]["parts"][0]["functionResponse"],
        json!({"name": "weather", "response": {"result": "Sunny"}})
    );
}

#[tokio::test]
async fn gemini_streams_and_a_stream_without_finish_reason_is_an_error() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1beta/models/gemini-2.5-flash:streamGenerateContent"))
        .and(wiremock::matchers::query_param("alt", "sse"))
        .respond_with(sse(&[
            ("", json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}}]})),
            ("", json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "lo."}, {"functionCall": {"name": "weather", "args": {"city": "Oslo"}}}]}, "finishReason": "STOP"}],
                        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 3}})),
        ]))
        .up_to_n_times(1)
        .mount(&server)
        .await;
    let model = gemini(&server);
    let (deltas, outcome) = stream_all(model.as_ref(), &ask("hi")).await;
    let response = outcome.unwrap();
    assert_eq!(streamed_text(&deltas), "Hello.");
    assert_eq!(streamed_arguments(&deltas, 0), json!({"city": "Oslo"}));
    assert_eq!(response.message.tool_calls[0].name, "weather");
    assert_eq!(response.usage.input_tokens, 10);

    Mock::given(method("POST"))
        .respond_with(sse(&[(
            "",
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Cut"}]}}]}),
        )]))
        .mount(&server)
        .await;
    let (_, outcome) = stream_all(model.as_ref(), &ask("hi")).await;
    let error = outcome.unwrap_err();
    assert!(error.to_string().contains("finishReason"), "{error}");
}

#[tokio::test]
async fn gemini_context_overflow_is_its_own_kind() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(400).set_body_json(json!({"error": {
            "code": 400, "status": "INVALID_ARGUMENT",
            "message": "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
        }})))
        .mount(&server)
        .await;
    let error = gemini(&server).generate(&ask("hi")).await.unwrap_err();
    assert!(
        matches!(error, ModelError::ContextWindowExceeded { .. }),
        "{error:?}"
    );
    assert_eq!(server.received_requests().await.unwrap().len(), 1);
}

#[tokio::test]
async fn gemini_sends_images_inline() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "candidates": [{"content": {"role": "model", "parts": [{"text": "A cat."}]}, "finishReason": "STOP"}]})))
        .mount(&server)
        .await;
    gemini(&server).generate(&image_request()).await.unwrap();
    let sent = &sent_bodies(&server).await[0];
    let b64 = "iVBORw0KGgpmYWtl";
    assert_eq!(
        sent["contents"][0]["parts"][1]["inlineData"],
        json!({"mimeType": "image/png", "data": b64})
    );
    assert_eq!(sent["contents"][2]["parts"][1]["inlineData"]["data"], b64);
}

// --- Anthropic ----------------------------------------------------------------------------

fn anthropic(server: &MockServer) -> std::sync::Arc<dyn deepagents_core::Model> {
    model("anthropic:claude-sonnet-4-5", server.uri(), 2)
}

#[tokio::test]
async fn anthropic_marks_cache_breakpoints_and_keeps_thinking_with_its_signature() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .and(header("x-api-key", TEST_KEY))
        .and(header("anthropic-version", "2023-06-01"))
        .respond_with(sse(&[
            ("message_start", json!({"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 20, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 50, "output_tokens": 1}}})),
            ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}})),
            ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "The user wants "}})),
            ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "weather."}})),
            ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "EqQBsig"}})),
            ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
            ("ping", json!({"type": "ping"})),
            ("content_block_start", json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}})),
            ("content_block_delta", json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"city\": "}})),
            ("content_block_delta", json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"Rome\"}"}})),
            ("content_block_stop", json!({"type": "content_block_stop", "index": 1})),
            ("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 42}})),
            ("message_stop", json!({"type": "message_stop"})),
        ]))
        .mount(&server)
        .await;
    let model = anthropic(&server);
    let request = ask("Weather in Rome?");
    let (deltas, outcome) = stream_all(model.as_ref(), &request).await;
    let response = outcome.unwrap();
    assert_eq!(streamed_arguments(&deltas, 0), json!({"city": "Rome"}));
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    assert_eq!(
        response.usage.input_tokens, 1070,
        "prompt incl. cache reads and writes"
    );
    assert_eq!(response.usage.cached_input_tokens, 1000);
    assert_eq!(response.usage.output_tokens, 42);
    assert_eq!(
        response.message.content[0],
        ContentBlock::Reasoning {
            text: "The user wants weather.".into(),
            signature: Some("EqQBsig".into()),
            opaque: None,
        }
    );
    assert_eq!(text_of(&response), "", "reasoning is not answer text");

    let call = response.message.tool_calls[0].clone();
    let mut next = with_tool_result(request, &call, "Sunny");
    if let Message::Assistant(turn) = &mut next.messages[1] {
        turn.content = response.message.content.clone();
    }
    let _ = stream_all(model.as_ref(), &next).await;
    let bodies = sent_bodies(&server).await;
    let first = &bodies[0];
    let cache = json!({"type": "ephemeral"});
    assert_eq!(first["system"][0]["cache_control"], cache);
    assert_eq!(first["tools"][0]["cache_control"], cache);
    assert_eq!(first["messages"][0]["content"][0]["cache_control"], cache);
    assert_eq!(first["stream"], true);
    let second = &bodies[1];
    let assistant = &second["messages"][1]["content"];
    assert_eq!(
        assistant[0],
        json!({"type": "thinking", "thinking": "The user wants weather.", "signature": "EqQBsig"})
    );
    assert_eq!(assistant[1]["type"], "tool_use");
    assert_eq!(assistant[1]["input"], json!({"city": "Rome"}));
    assert!(
        second["messages"][0]["content"][0]
            .get("cache_control")
            .is_none(),
        "only the latest turn"
    );
    let result = &second["messages"][2]["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["tool_use_id"], "toolu_1");
    assert_eq!(result["cache_control"], cache);
}

#[tokio::test]
async fn anthropic_sends_images_in_user_and_tool_content_and_reads_overload_errors() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(529).set_body_json(json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})))
        .mount(&server)
        .await;
    let error = anthropic(&server)
        .generate(&image_request())
        .await
        .unwrap_err();
    assert!(matches!(error, ModelError::Transient { .. }), "{error:?}");
    let bodies = sent_bodies(&server).await;
    assert_eq!(bodies.len(), 3, "529 is retried");
    let messages = &bodies[0]["messages"];
    let image = json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgpmYWtl"}});
    assert_eq!(messages[0]["content"][1], image);
    assert_eq!(messages[2]["content"][0]["content"][1], image);
}

#[tokio::test]
async fn an_error_event_mid_stream_is_classified() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(sse(&[
            ("message_start", json!({"type": "message_start", "message": {"usage": {"input_tokens": 1}}})),
            ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
            ("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}})),
            ("error", json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})),
        ]))
        .mount(&server)
        .await;
    let (deltas, outcome) = stream_all(anthropic(&server).as_ref(), &ask("hi")).await;
    assert_eq!(streamed_text(&deltas), "Hi");
    let error = outcome.unwrap_err();
    assert!(matches!(error, ModelError::Transient { .. }), "{error:?}");
    assert!(error.to_string().contains("Overloaded"), "{error}");
}

// --- OpenAI -------------------------------------------------------------------------------

#[tokio::test]
async fn responses_keep_reasoning_items_and_send_them_back() {
    let server = MockServer::start().await;
    let reasoning = json!({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Need the weather."}], "encrypted_content": "gAAAA"});
    Mock::given(method("POST"))
        .and(path("/v1/responses"))
        .and(header("authorization", format!("Bearer {TEST_KEY}").as_str()))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "resp_1", "status": "completed",
            "output": [
                reasoning,
                {"type": "function_call", "id": "fc_1", "call_id": "call_9", "name": "weather", "arguments": "{\"city\":\"Kyiv\"}"},
            ],
            "usage": {"input_tokens": 50, "output_tokens": 9, "input_tokens_details": {"cached_tokens": 32}},
        })))
        .mount(&server)
        .await;
    let model = model("openai:o4-mini", format!("{}/v1", server.uri()), 0);
    let request = ask("Weather in Kyiv?");
    let response = model.generate(&request).await.unwrap();
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    assert_eq!(response.usage.cached_input_tokens, 32);
    assert!(
        matches!(&response.message.content[0], ContentBlock::Reasoning { text, .. } if text == "Need the weather.")
    );
    let call = response.message.tool_calls[0].clone();
    assert_eq!(call.id, "call_9");
    let mut next = with_tool_result(request, &call, "Cold");
    if let Message::Assistant(turn) = &mut next.messages[1] {
        turn.content = response.message.content.clone();
    }
    model.generate(&next).await.unwrap();
    let sent = &sent_bodies(&server).await[1];
    assert_eq!(sent["instructions"], "You are terse.");
    let input = sent["input"].as_array().unwrap();
    assert_eq!(input[1], reasoning, "the reasoning item goes back verbatim");
    assert_eq!(
        input[2],
        json!({"type": "function_call", "call_id": "call_9", "name": "weather", "arguments": "{\"city\":\"Kyiv\"}"})
    );
    assert_eq!(
        input[3],
        json!({"type": "function_call_output", "call_id": "call_9", "output": "Cold"})
    );
    assert_eq!(model.profile().unwrap().max_input_tokens, 200_000);
}

#[tokio::test]
async fn responses_and_chat_send_images() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/responses"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"status": "completed", "output": []})),
        )
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]})))
        .mount(&server)
        .await;
    let url = "data:image/png;base64,iVBORw0KGgpmYWtl";
    model("openai:gpt-4o", format!("{}/v1", server.uri()), 0)
        .generate(&image_request())
        .await
        .unwrap();
    model("openai_chat:gpt-4o", format!("{}/v1", server.uri()), 0)
        .generate(&image_request())
        .await
        .unwrap();
    let bodies = sent_bodies(&server).await;
    let responses = &bodies[0]["input"];
    assert_eq!(
        responses[0]["content"][1],
        json!({"type": "input_image", "image_url": url})
    );
    assert_eq!(
        responses[2]["output"][1],
        json!({"type": "input_image", "image_url": url})
    );
    let chat = bodies[1]["messages"].as_array().unwrap();
    assert_eq!(
        chat[1]["content"][1],
        json!({"type": "image_url", "image_url": {"url": url}})
    );
    assert_eq!(chat[3]["role"], "tool");
    // Chat tool messages take text only: the image follows in a user message.
    assert_eq!(chat[4]["role"], "user");
    assert_eq!(
        chat[4]["content"][1],
        json!({"type": "image_url", "image_url": {"url": url}})
    );
}

#[tokio::test]
async fn chat_keeps_malformed_arguments_verbatim_and_reads_cached_tokens() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(sse(&[
            ("", json!({"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": "}}]}}]})),
            ("", json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "oops"}}]}, "finish_reason": "tool_calls"}]})),
            ("", json!({"choices": [], "usage": {"prompt_tokens": 90, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 64}}})),
        ]).append_header("x-extra", "1"))
        .mount(&server)
        .await;
    // Without the [DONE] marker the stream is incomplete…
    let chat = model("openai_chat:gpt-4o", format!("{}/v1", server.uri()), 0);
    let (_, outcome) = stream_all(chat.as_ref(), &ask("hi")).await;
    assert!(
        outcome
            .unwrap_err()
            .to_string()
            .contains("completion marker")
    );
    server.reset().await;
    let mut body = String::new();
    for chunk in [
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": "}}]}}]}),
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "oops"}}]}, "finish_reason": "tool_calls"}]}),
        json!({"choices": [], "usage": {"prompt_tokens": 90, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 64}}}),
    ] {
        body.push_str(&format!("data: {chunk}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(body, "text/event-stream"))
        .mount(&server)
        .await;
    // …with it, the call is whole; arguments that are not JSON are kept as a string.
    let (deltas, outcome) = stream_all(chat.as_ref(), &ask("hi")).await;
    let response = outcome.unwrap();
    assert_eq!(
        response.message.tool_calls[0].arguments,
        json!("{\"city\": oops")
    );
    assert_eq!(response.usage.cached_input_tokens, 64);
    assert!(
        matches!(&deltas[0], StreamEvent::ToolCallDelta { id: Some(id), .. } if id == "call_1")
    );
    let sent = &sent_bodies(&server).await[0];
    assert_eq!(sent["stream_options"], json!({"include_usage": true}));
}

// --- Keys and retries ------------------------------------------------------------------------

#[test]
fn keys_never_show_in_debug_output() {
    use std::sync::Arc;

    use deepagents_models::anthropic::AnthropicWire;
    use deepagents_models::cassette::RecordingTransport;
    use deepagents_models::gemini::GeminiWire;
    use deepagents_models::http::{HttpConfig, HttpRequest, ReqwestTransport, Transport};
    use deepagents_models::openai_responses::ResponsesWire;
    use deepagents_models::provider::{HttpModel, Wire};

    fn shown<W: Wire>(wire: W, transport: Arc<dyn Transport>) -> String {
        let model = HttpModel::new(
            "test".into(),
            wire,
            Some(Secret::new(TEST_KEY)),
            HttpConfig::default(),
            transport,
            None,
            true,
        );
        format!("{model:?} {model:#?}")
    }

    let dir = tempfile::tempdir().unwrap();
    let config = HttpConfig::default();
    // A recording transport keeps the key too, to redact it from the cassette.
    let transport: Arc<dyn Transport> = Arc::new(
        RecordingTransport::new(
            Arc::new(ReqwestTransport::new(&config).unwrap()),
            dir.path().join("c.json"),
            "anthropic:claude-sonnet-4-5".into(),
            None,
            vec![Secret::new(TEST_KEY)],
        )
        .unwrap(),
    );
    let anthropic = AnthropicWire {
        base_url: "http://127.0.0.1:1".into(),
        model: "claude-sonnet-4-5".into(),
        default_max_tokens: 1024,
        prompt_caching: true,
        reasoning: None,
        modalities: deepagents_core::model::InputModalities::ALL,
    };
    let headers = anthropic.secret_headers(&Secret::new(TEST_KEY));
    let mut all = vec![
        shown(anthropic, Arc::clone(&transport)),
        shown(
            GeminiWire {
                base_url: "http://127.0.0.1:1".into(),
                model: "gemini-2.5-flash".into(),
                reasoning: None,
                modalities: deepagents_core::model::InputModalities::ALL,
                max_output_tokens: None,
            },
            Arc::clone(&transport),
        ),
        shown(
            ResponsesWire {
                provider: "openai".into(),
                base_url: "http://127.0.0.1:1/v1".into(),
                model: "gpt-4o".into(),
                reasoning: None,
                modalities: deepagents_core::model::InputModalities::ALL,
                max_output_tokens: None,
            },
            transport,
        ),
    ];
    let request = HttpRequest {
        url: "http://127.0.0.1:1/v1/messages".into(),
        headers: vec![],
        secret_headers: headers,
        body: bytes::Bytes::from_static(b"{}"),
    };
    all.push(format!("{request:?}"));
    let options = ModelOptions {
        api_key: Some(Secret::new(TEST_KEY)),
        ..ModelOptions::default()
    };
    all.push(format!("{options:?}"));
    for shown in all {
        assert!(!shown.contains(TEST_KEY), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }
}

#[test]
fn retry_after_reads_milliseconds_seconds_and_dates() {
    let headers = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    use std::time::Duration;
    assert_eq!(
        retry_after(&headers(&[("retry-after", "3"), ("retry-after-ms", "250")])),
        Some(Duration::from_millis(250)),
        "retry-after-ms is the more precise"
    );
    assert_eq!(
        retry_after(&headers(&[("Retry-After", "2")])),
        Some(Duration::from_secs(2))
    );
    assert_eq!(
        retry_after(&headers(&[(
            "retry-after",
            "Wed, 21 Oct 2015 07:28:00 GMT"
        )])),
        Some(Duration::ZERO),
        "a date in the past means now"
    );
    assert_eq!(retry_after(&headers(&[("retry-after", "soon")])), None);
}

#[tokio::test]
async fn a_record_then_replay_round_trip_needs_no_server_and_writes_no_key() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"choices": [{"message": {"role": "assistant", "content": "Recorded."}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}})))
        .mount(&server)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let cassette = dir.path().join("c.json");
    let recorder = from_spec_with(
        "openai_chat:gpt-4o",
        &ModelOptions {
            base_url: Some(format!("{}/v1", server.uri())),
            api_key: Some(Secret::new(TEST_KEY)),
            record: Some(cassette.clone()),
            ..ModelOptions::default()
        },
    )
    .unwrap();
    assert_eq!(
        text_of(&recorder.generate(&ask("hi")).await.unwrap()),
        "Recorded."
    );
    drop(server);
    let written = std::fs::read_to_string(&cassette).unwrap();
    assert!(!written.contains(TEST_KEY), "{written}");

    let replay = deepagents_models::from_spec(&format!("replay:{}", cassette.display())).unwrap();
    assert_eq!(
        text_of(&replay.generate(&ask("hi")).await.unwrap()),
        "Recorded."
    );
    let error = replay.generate(&ask("hi")).await.unwrap_err().to_string();
    assert!(error.contains("holds 1 exchanges"), "{error}");

    let replay = deepagents_models::from_spec(&format!("replay:{}", cassette.display())).unwrap();
    let error = replay
        .generate(&ask("hello"))
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("differs from cassette"), "{error}");
    assert!(error.contains("-") && error.contains("\"hi\""), "{error}");
    assert!(
        error.contains("+") && error.contains("\"hello\""),
        "{error}"
    );
}

#[tokio::test]
async fn a_malformed_event_names_the_provider_and_the_event() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(
            "data: {\"candidates\": [{\"content\": {\"parts\": [{\"text\": \"Hi\"}]}}]}\n\ndata: {\"candidates\": [{\"cont\n\n",
            "text/event-stream",
        ))
        .mount(&server)
        .await;
    let (deltas, outcome) = stream_all(gemini(&server).as_ref(), &ask("hi")).await;
    assert_eq!(streamed_text(&deltas), "Hi");
    let error = outcome.unwrap_err().to_string();
    assert!(
        error.contains("malformed google_genai stream event `message`"),
        "{error}"
    );
    assert_eq!(
        server.received_requests().await.unwrap().len(),
        1,
        "not retried after output"
    );
}

#[tokio::test]
async fn reasoning_effort_maps_to_each_api_setting() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(500))
        .mount(&server)
        .await;
    let uri = server.uri();
    for (spec, base) in [
        ("openai:o4-mini", format!("{uri}/v1")),
        ("openai_chat:o4-mini", format!("{uri}/v1")),
        ("anthropic:claude-sonnet-4-5", uri.clone()),
        ("google_genai:gemini-2.5-pro", uri.clone()),
    ] {
        let model = from_spec_with(
            spec,
            &ModelOptions {
                base_url: Some(base),
                api_key: Some(Secret::new(TEST_KEY)),
                max_retries: Some(0),
                reasoning: Some(deepagents_models::ReasoningEffort::High),
                ..ModelOptions::default()
            },
        )
        .unwrap();
        let mut request = ask("think");
        request.settings.temperature = Some(0.2);
        let _ = model.generate(&request).await;
    }
    let bodies = sent_bodies(&server).await;
    assert_eq!(
        bodies[0]["reasoning"],
        json!({"effort": "high", "summary": "auto"})
    );
    assert_eq!(bodies[0]["include"], json!(["reasoning.encrypted_content"]));
    assert_eq!(bodies[1]["reasoning_effort"], "high");
    assert_eq!(
        bodies[2]["thinking"],
        json!({"type": "enabled", "budget_tokens": 24576})
    );
    assert!(bodies[2]["max_tokens"].as_u64().unwrap() > 24576);
    assert!(
        bodies[2].get("temperature").is_none(),
        "thinking refuses temperature"
    );
    assert_eq!(
        bodies[3]["generationConfig"]["thinkingConfig"],
        json!({"thinkingBudget": 24576, "includeThoughts": true})
    );
}

#[tokio::test]
async fn a_key_echoed_in_a_url_or_body_never_reaches_the_cassette() {
    let server = MockServer::start().await;
    let echo = format!("Your key is {TEST_KEY}.");
    Mock::given(method("POST"))
        .and(path(format!("/proxy/{TEST_KEY}/v1/chat/completions")))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"choices": [{"message": {"role": "assistant", "content": echo}, "finish_reason": "stop"}]})))
        .mount(&server)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let cassette = dir.path().join("c.json");
    // A proxy that takes the key in its path, and a server that repeats it.
    let recorder = from_spec_with(
        "openai_chat:gpt-4o",
        &ModelOptions {
            base_url: Some(format!("{}/proxy/{TEST_KEY}/v1", server.uri())),
            api_key: Some(Secret::new(TEST_KEY)),
            record: Some(cassette.clone()),
            max_retries: Some(0),
            ..ModelOptions::default()
        },
    )
    .unwrap();
    let mut request = ask("hi");
    request
        .messages
        .push(Message::user(format!("My key is {TEST_KEY}")));
    let response = recorder.generate(&request).await.unwrap();
    assert_eq!(
        text_of(&response),
        echo,
        "the caller sees what the server said"
    );
    drop(recorder);

    let written = std::fs::read_to_string(&cassette).unwrap();
    assert!(!written.contains(TEST_KEY), "{written}");
    let recorded: Value = serde_json::from_str(&written).unwrap();
    let exchange = &recorded["exchanges"][0];
    assert_eq!(
        recorded["base_url"],
        format!("{}/proxy/<redacted>/v1", server.uri())
    );
    assert!(
        exchange["request"]["url"]
            .as_str()
            .unwrap()
            .contains("/proxy/<redacted>/v1/chat/completions"),
        "{exchange}"
    );
    assert!(
        exchange["request"]["body"]
            .to_string()
            .contains("My key is <redacted>"),
        "{exchange}"
    );
    assert!(
        exchange["response"]["body"]
            .as_str()
            .unwrap()
            .contains("Your key is <redacted>."),
        "{exchange}"
    );
}

// --- Reasoning round trips -------------------------------------------------------------------

/// The request after `response`: its turn (content and calls) and a result for its first call.
fn next_turn(request: ModelRequest, response: &deepagents_core::ModelResponse) -> ModelRequest {
    let call = response.message.tool_calls[0].clone();
    let mut next = with_tool_result(request, &call, "Cold");
    if let Message::Assistant(turn) = &mut next.messages[1] {
        turn.content = response.message.content.clone();
        turn.tool_calls = response.message.tool_calls.clone();
    }
    next
}

#[tokio::test]
async fn streamed_responses_keep_reasoning_items_from_output_item_done_or_completed() {
    let reasoning = json!({"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Check the weather."}], "encrypted_content": "gAAAA-enc"});
    let call = json!({"type": "function_call", "id": "fc_1", "call_id": "call_7", "name": "weather", "arguments": "{\"city\":\"Kyiv\"}", "status": "completed"});
    let events = |completed_output: Value| {
        sse(&[
            (
                "response.created",
                json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
            ),
            (
                "response.output_item.added",
                json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": []}}),
            ),
            (
                "response.reasoning_summary_text.delta",
                json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "summary_index": 0, "delta": "Check the weather."}),
            ),
            (
                "response.output_item.done",
                json!({"type": "response.output_item.done", "output_index": 0, "item": reasoning}),
            ),
            (
                "response.output_item.added",
                json!({"type": "response.output_item.added", "output_index": 1, "item": {"type": "function_call", "id": "fc_1", "call_id": "call_7", "name": "weather", "arguments": ""}}),
            ),
            (
                "response.function_call_arguments.delta",
                json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 1, "delta": "{\"city\":\"Kyiv\"}"}),
            ),
            (
                "response.output_item.done",
                json!({"type": "response.output_item.done", "output_index": 1, "item": call}),
            ),
            (
                "response.completed",
                json!({"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "output": completed_output, "usage": {"input_tokens": 10, "output_tokens": 5}}}),
            ),
        ])
    };
    for (label, completed_output) in [
        ("items from response.completed", json!([reasoning, call])),
        ("items from response.output_item.done", json!([])),
    ] {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/v1/responses"))
            .respond_with(events(completed_output))
            .mount(&server)
            .await;
        let model = model("openai:o4-mini", format!("{}/v1", server.uri()), 0);
        let request = ask("Weather in Kyiv?");
        let (deltas, outcome) = stream_all(model.as_ref(), &request).await;
        let response = outcome.unwrap();
        assert_eq!(
            streamed_arguments(&deltas, 0),
            json!({"city": "Kyiv"}),
            "{label}"
        );
        assert_eq!(
            response.message.content,
            vec![ContentBlock::Reasoning {
                text: "Check the weather.".into(),
                signature: None,
                opaque: Some(reasoning.clone()),
            }],
            "{label}"
        );
        assert_eq!(
            text_of(&response),
            "",
            "{label}: reasoning is not answer text"
        );
        assert_eq!(response.message.tool_calls[0].id, "call_7", "{label}");
        assert_eq!(response.stop_reason, StopReason::ToolUse, "{label}");

        let _ = stream_all(model.as_ref(), &next_turn(request, &response)).await;
        let sent = &sent_bodies(&server).await[1];
        let input = sent["input"].as_array().unwrap();
        assert_eq!(input[1], reasoning, "{label}: the item goes back verbatim");
        assert_eq!(input[2]["type"], "function_call", "{label}");
        assert_eq!(input[2]["call_id"], "call_7", "{label}");
        assert_eq!(input[3]["type"], "function_call_output", "{label}");
    }
}

#[tokio::test]
async fn anthropic_redacted_thinking_goes_back_verbatim_whole_or_streamed() {
    let redacted = json!({"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"});
    let tool_use =
        json!({"type": "tool_use", "id": "toolu_3", "name": "weather", "input": {"city": "Oslo"}});
    let whole = ResponseTemplate::new(200).set_body_json(json!({
        "id": "msg_1", "type": "message", "role": "assistant",
        "content": [redacted, {"type": "thinking", "thinking": "Oslo it is.", "signature": "sig-2"}, tool_use],
        "stop_reason": "tool_use", "usage": {"input_tokens": 5, "output_tokens": 7},
    }));
    let streamed = sse(&[
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 5, "output_tokens": 1}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": redacted}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "thinking", "thinking": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "thinking_delta", "thinking": "Oslo it is."}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "signature_delta", "signature": "sig-2"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "toolu_3", "name": "weather", "input": {}}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"city\": \"Oslo\"}"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 2}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 7}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ]);
    for (label, template, stream) in [("whole", whole, false), ("streamed", streamed, true)] {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .respond_with(template)
            .mount(&server)
            .await;
        let model = anthropic(&server);
        let request = ask("Weather in Oslo?");
        let response = if stream {
            stream_all(model.as_ref(), &request).await.1.unwrap()
        } else {
            model.generate(&request).await.unwrap()
        };
        assert_eq!(
            response.message.content,
            vec![
                ContentBlock::Reasoning {
                    text: String::new(),
                    signature: None,
                    opaque: Some(redacted.clone()),
                },
                ContentBlock::Reasoning {
                    text: "Oslo it is.".into(),
                    signature: Some("sig-2".into()),
                    opaque: None,
                },
            ],
            "{label}"
        );
        assert_eq!(text_of(&response), "", "{label}");
        assert_eq!(
            response.message.tool_calls[0].arguments,
            json!({"city": "Oslo"})
        );

        let _ = model.generate(&next_turn(request, &response)).await;
        let sent = &sent_bodies(&server).await[1];
        let assistant = sent["messages"][1]["content"].as_array().unwrap();
        assert_eq!(assistant[0], redacted, "{label}: verbatim, no cache mark");
        assert_eq!(
            assistant[1],
            json!({"type": "thinking", "thinking": "Oslo it is.", "signature": "sig-2"}),
            "{label}"
        );
        assert_eq!(assistant[2], tool_use, "{label}");
    }
}

#[tokio::test]
async fn gemini_thought_parts_are_reasoning_and_only_their_signatures_go_back() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1beta/models/gemini-2.5-flash:generateContent"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "candidates": [{"content": {"role": "model", "parts": [
                {"text": "Pondering the forecast.", "thought": true},
                {"text": "It is cold.", "thoughtSignature": "sig-text"},
            ]}, "finishReason": "STOP"}],
        })))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1beta/models/gemini-2.5-flash:streamGenerateContent"))
        .respond_with(sse(&[
            ("", json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Streamed ", "thought": true}]}}]})),
            ("", json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "pondering.", "thought": true}]}}]})),
            ("", json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Cold."}]}}]})),
            ("", json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "", "thoughtSignature": "sig-stream"}]}, "finishReason": "STOP"}]})),
        ]))
        .mount(&server)
        .await;
    let model = gemini(&server);
    let response = model.generate(&ask("Weather?")).await.unwrap();
    assert_eq!(
        text_of(&response),
        "It is cold.",
        "thoughts are not answer text"
    );
    assert!(
        matches!(&response.message.content[0], ContentBlock::Reasoning { text, .. } if text == "Pondering the forecast."),
        "{:?}",
        response.message.content
    );
    let (deltas, outcome) = stream_all(model.as_ref(), &ask("Weather?")).await;
    let streamed = outcome.unwrap();
    assert_eq!(
        streamed_text(&deltas),
        "Cold.",
        "thoughts are not streamed as text"
    );
    assert_eq!(text_of(&streamed), "Cold.");
    assert!(
        matches!(&streamed.message.content[0], ContentBlock::Reasoning { text, .. } if text == "Streamed pondering."),
        "{:?}",
        streamed.message.content
    );

    for turn in [&response, &streamed] {
        let mut next = ask("Weather?");
        next.messages.push(Message::Assistant(turn.message.clone()));
        next.messages.push(Message::user("Thanks."));
        model.generate(&next).await.unwrap();
    }
    let bodies = sent_bodies(&server).await;
    for (body, text, signature) in [
        (&bodies[2], "It is cold.", "sig-text"),
        (&bodies[3], "Cold.", "sig-stream"),
    ] {
        let parts = &body["contents"][1]["parts"];
        assert_eq!(
            parts,
            &json!([{"text": text, "thoughtSignature": signature}]),
            "the thought text stays here; its signature goes back: {body}"
        );
    }
}

#[tokio::test]
async fn chat_reasoning_content_is_reasoning_not_text_and_is_not_sent_back() {
    let server = MockServer::start().await;
    let mut stream = String::new();
    for chunk in [
        json!({"choices": [{"index": 0, "delta": {"role": "assistant", "reasoning_content": "Think "}}]}),
        json!({"choices": [{"index": 0, "delta": {"reasoning_content": "hard."}}]}),
        json!({"choices": [{"index": 0, "delta": {"content": "Done."}, "finish_reason": "stop"}]}),
    ] {
        stream.push_str(&format!("data: {chunk}\n\n"));
    }
    stream.push_str("data: [DONE]\n\n");
    Mock::given(method("POST"))
        .and(wiremock::matchers::body_partial_json(
            json!({"stream": true}),
        ))
        .respond_with(ResponseTemplate::new(200).set_body_raw(stream, "text/event-stream"))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"choices": [{"message": {
            "role": "assistant", "reasoning_content": "Thought it through.", "content": "Done."}, "finish_reason": "stop"}]})))
        .mount(&server)
        .await;
    let model = model(
        "deepseek:deepseek-reasoner",
        format!("{}/v1", server.uri()),
        0,
    );
    let whole = model.generate(&ask("hi")).await.unwrap();
    assert_eq!(
        whole.message.content,
        vec![
            ContentBlock::Reasoning {
                text: "Thought it through.".into(),
                signature: None,
                opaque: None,
            },
            ContentBlock::text("Done."),
        ]
    );
    let (deltas, outcome) = stream_all(model.as_ref(), &ask("hi")).await;
    let streamed = outcome.unwrap();
    assert_eq!(streamed_text(&deltas), "Done.");
    assert_eq!(
        streamed.message.content,
        vec![
            ContentBlock::Reasoning {
                text: "Think hard.".into(),
                signature: None,
                opaque: None,
            },
            ContentBlock::text("Done."),
        ]
    );

    let mut next = ask("hi");
    next.messages
        .push(Message::Assistant(streamed.message.clone()));
    next.messages.push(Message::user("And?"));
    model.generate(&next).await.unwrap();
    let sent = &sent_bodies(&server).await[2];
    // DeepSeek refuses `reasoning_content` in input messages; the answer goes back alone.
    assert_eq!(
        sent["messages"][2],
        json!({"role": "assistant", "content": "Done."}),
        "{sent}"
    );
    assert!(!sent.to_string().contains("Think hard."), "{sent}");
}

#[test]
fn gemini_declares_a_tool_without_arguments_without_parameters() {
    use deepagents_models::gemini::GeminiWire;
    use deepagents_models::provider::Wire;

    let mut request = ask("What time is it?");
    request.tools.push(deepagents_core::tool::ToolSpec {
        name: "now".into(),
        description: "The current time.".into(),
        parameters: json!({"type": "object", "properties": {}, "additionalProperties": false})
            .into(),
    });
    let wire = GeminiWire {
        base_url: "http://127.0.0.1:1".into(),
        model: "gemini-2.5-flash".into(),
        reasoning: None,
        modalities: deepagents_core::model::InputModalities::ALL,
        max_output_tokens: None,
    };
    let (_, body) = wire.request(&request, false).unwrap();
    let declarations = &body["tools"][0]["functionDeclarations"];
    assert_eq!(declarations[0]["name"], "weather");
    assert!(declarations[0]["parameters"]["properties"]["city"].is_object());
    assert_eq!(
        declarations[1],
        json!({"name": "now", "description": "The current time."}),
        "Gemini refuses an object schema without properties"
    );
}

/// Every wire reuses what it encoded for earlier requests of a conversation; whatever
/// happened to the conversation in between, the bytes are those a fresh encoding writes.
#[test]
fn wires_reuse_encoded_messages_and_send_what_a_fresh_encoding_sends() {
    use deepagents_core::model::InputModalities;
    use deepagents_models::anthropic::AnthropicWire;
    use deepagents_models::encoded::EncodeCache;
    use deepagents_models::gemini::GeminiWire;
    use deepagents_models::openai_chat::ChatWire;
    use deepagents_models::openai_responses::ResponsesWire;
    use deepagents_models::provider::{ReasoningEffort, Wire};

    let wires: Vec<(Box<dyn Wire>, bool)> = vec![
        (
            Box::new(ChatWire {
                provider: "openai_chat".into(),
                base_url: "http://127.0.0.1:1/v1".into(),
                model: "gpt-4o".into(),
                stream_usage: true,
                extra_headers: Vec::new(),
                reasoning: None,
                modalities: InputModalities::ALL,
                max_output_tokens: None,
                legacy_max_tokens: false,
            }),
            false,
        ),
        (
            Box::new(ResponsesWire {
                provider: "openai".into(),
                base_url: "http://127.0.0.1:1/v1".into(),
                model: "gpt-5".into(),
                reasoning: Some(ReasoningEffort::Low),
                modalities: InputModalities::ALL,
                max_output_tokens: None,
            }),
            false,
        ),
        // Anthropic and Gemini merge neighbouring messages of one role into one turn.
        (
            Box::new(AnthropicWire {
                base_url: "http://127.0.0.1:1".into(),
                model: "claude-sonnet-4-5".into(),
                default_max_tokens: 1024,
                prompt_caching: true,
                reasoning: None,
                modalities: InputModalities::ALL,
            }),
            true,
        ),
        (
            Box::new(GeminiWire {
                base_url: "http://127.0.0.1:1".into(),
                model: "gemini-2.5-flash".into(),
                reasoning: Some(ReasoningEffort::Low),
                modalities: InputModalities::ALL,
                max_output_tokens: None,
            }),
            true,
        ),
    ];
    for (wire, merges) in wires {
        let mut cache = EncodeCache::default();
        let mut request = image_request();
        request.settings.temperature = Some(0.2);
        request.settings.stop_sequences = vec!["STOP".into()];
        request.tools.push(deepagents_core::tool::ToolSpec {
            name: "weather".into(),
            description: "The weather.".into(),
            parameters: schema_with_refs().into(),
        });
        let check = |request: &ModelRequest, cache: &mut EncodeCache, reused: bool| {
            // What the cache offers this request: its leading messages already encoded.
            let reusable = cache.prefix(request.messages.version()).messages();
            assert_eq!(
                reusable > 0,
                reused,
                "{}: reusable {reusable}",
                wire.provider()
            );
            let fresh = wire
                .encode(request, true, &mut EncodeCache::default())
                .unwrap();
            let again = wire.encode(request, true, cache).unwrap();
            assert_eq!(again.0, fresh.0);
            assert_eq!(
                String::from_utf8_lossy(&again.1),
                String::from_utf8_lossy(&fresh.1)
            );
            let body: Value = serde_json::from_slice(&again.1).unwrap();
            assert_eq!(body, wire.request(request, true).unwrap().1);
        };
        // The tool's image waits for the next message; the next user message carries it.
        check(&request, &mut cache, false);
        for turn in 0..3 {
            let call = ToolCall {
                id: format!("call_w{turn}"),
                name: "weather".into(),
                arguments: if turn == 1 {
                    Value::String("{\"city\": \"Oslo\"}".into())
                } else {
                    json!({"city": "Paris", "note": "\"quoted\" ünïcode"})
                },
            };
            request
                .messages
                .push(Message::user(format!("again {turn}")));
            check(&request, &mut cache, true);
            let kept = request.clone();
            request.messages.push(Message::Assistant(AssistantMessage {
                content: vec![ContentBlock::text("Checking.")],
                tool_calls: vec![call.clone()],
            }));
            for result in ["Sunny", "{\"sky\": \"clear\"}"] {
                request.messages.push(Message::Tool(ToolResult {
                    tool_call_id: call.id.clone(),
                    name: call.name.clone(),
                    content: vec![ContentBlock::text(format!("{result} {turn}"))],
                    status: ToolStatus::Ok,
                    artifact: None,
                }));
                check(&request, &mut cache, true);
            }
            // A request kept from before (summarization's retry) still encodes as it was.
            check(&kept, &mut cache, true);
        }
        // Edited in place, summarized, or with other tools: encoded anew where it changed.
        request.messages[1] = Message::user("edited");
        check(&request, &mut cache, false);
        request.messages.truncate(2);
        check(&request, &mut cache, false);
        request.tools.clear();
        request.system_prompt = None;
        request
            .messages
            .push(Message::Assistant(AssistantMessage::text("Noted.")));
        // A turn that may still merge with the next message is not reused before it is closed.
        check(&request, &mut cache, !merges);
        request.messages.push(Message::user("last"));
        check(&request, &mut cache, true);
    }
}

/// A tool call cut mid-arguments (kept as the model's raw text) goes back in later requests as
/// a valid JSON object holding that text, on both OpenAI wires: servers that parse the history
/// (llama.cpp's `llama-server`) refuse invalid JSON, which would make every later request of
/// the thread fail.
#[tokio::test]
async fn cut_tool_call_arguments_go_back_as_valid_json_on_the_openai_wires() {
    let cut = "{\"file_path\": \"/notes.md\", \"content\": \"half";
    let request = ModelRequest {
        messages: vec![
            Message::User {
                content: vec![ContentBlock::text("write it")],
            },
            Message::Assistant(AssistantMessage {
                content: vec![],
                tool_calls: vec![
                    ToolCall {
                        id: "call_cut".into(),
                        name: "write_file".into(),
                        arguments: json!(cut),
                    },
                    ToolCall {
                        id: "call_ok".into(),
                        name: "ls".into(),
                        arguments: json!("{\"path\": \"/\"}"),
                    },
                ],
            }),
            Message::Tool(ToolResult {
                tool_call_id: "call_cut".into(),
                name: "write_file".into(),
                content: vec![ContentBlock::text("The arguments are not valid JSON.")],
                status: ToolStatus::Error,
                artifact: None,
            }),
            Message::Tool(ToolResult {
                tool_call_id: "call_ok".into(),
                name: "ls".into(),
                content: vec![ContentBlock::text("/notes.md")],
                status: ToolStatus::Ok,
                artifact: None,
            }),
        ]
        .into(),
        ..ModelRequest::default()
    };
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1}
        })))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/responses"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "id": "r1", "status": "completed",
            "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}],
            "usage": {"input_tokens": 1, "output_tokens": 1}
        })))
        .mount(&server)
        .await;
    let base = format!("{}/v1", server.uri());
    model("openai_chat:gpt-4o", base.clone(), 0)
        .generate(&request)
        .await
        .unwrap();
    model("openai:gpt-4o", base, 0)
        .generate(&request)
        .await
        .unwrap();
    let bodies = sent_bodies(&server).await;
    let chat_calls = &bodies[0]["messages"][1]["tool_calls"];
    let responses_calls: Vec<&Value> = bodies[1]["input"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "function_call")
        .collect();
    for (wire, cut_text, ok_text) in [
        (
            "chat",
            chat_calls[0]["function"]["arguments"].as_str().unwrap(),
            chat_calls[1]["function"]["arguments"].as_str().unwrap(),
        ),
        (
            "responses",
            responses_calls[0]["arguments"].as_str().unwrap(),
            responses_calls[1]["arguments"].as_str().unwrap(),
        ),
    ] {
        let parsed: Value = serde_json::from_str(cut_text)
            .unwrap_or_else(|e| panic!("{wire}: not JSON ({e}): {cut_text}"));
        assert_eq!(parsed, json!({"_raw_arguments": cut}), "{wire}");
        assert_eq!(
            ok_text, "{\"path\": \"/\"}",
            "{wire}: well-formed text goes back as it was"
        );
    }
}

// --- Small local models ----------------------------------------------------------------------

fn chat_ok() -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({"choices": [{"message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]}))
}

#[tokio::test]
async fn tool_choice_auto_goes_with_tools_and_never_without() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/responses"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"status": "completed", "output": []})),
        )
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(chat_ok())
        .mount(&server)
        .await;
    let without_tools = ModelRequest {
        tools: Vec::new(),
        ..ask("hi")
    };
    for spec in ["openai_compatible:local", "openai:gpt-5"] {
        let model = model(spec, format!("{}/v1", server.uri()), 0);
        model.generate(&ask("hi")).await.unwrap();
        model.generate(&without_tools).await.unwrap();
    }
    let bodies = sent_bodies(&server).await;
    assert_eq!(bodies.len(), 4);
    for pair in bodies.chunks(2) {
        assert_eq!(pair[0]["tool_choice"], "auto", "{}", pair[0]);
        assert!(pair[0]["tools"].is_array());
        assert!(pair[1].get("tool_choice").is_none(), "{}", pair[1]);
        assert!(pair[1].get("tools").is_none(), "{}", pair[1]);
    }
}

#[tokio::test]
async fn the_configured_output_limit_reaches_every_wire_under_its_name() {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/responses"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"status": "completed", "output": []})),
        )
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(chat_ok())
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/messages"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "usage": {"input_tokens": 1, "output_tokens": 1}})))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "ok"}]}, "finishReason": "STOP"}]})))
        .mount(&server)
        .await;
    let specs = [
        ("openai_chat:gpt-4o", "/max_completion_tokens"),
        ("openai_compatible:local", "/max_tokens"),
        ("ollama:llama3.2", "/max_tokens"),
        ("vllm:local", "/max_tokens"),
        ("llamacpp:local", "/max_tokens"),
        ("openai:gpt-5", "/max_output_tokens"),
        ("anthropic:claude-sonnet-4-5", "/max_tokens"),
        (
            "google_genai:gemini-2.5-flash",
            "/generationConfig/maxOutputTokens",
        ),
    ];
    for (spec, _) in specs {
        let with_limit = |limit| {
            from_spec_with(
                spec,
                &ModelOptions {
                    base_url: Some(format!("{}/v1", server.uri())),
                    api_key: Some(Secret::new(TEST_KEY)),
                    http: Some(fast_config()),
                    max_retries: Some(0),
                    max_output_tokens: limit,
                    ..ModelOptions::default()
                },
            )
            .unwrap()
        };
        with_limit(Some(1234)).generate(&ask("hi")).await.unwrap();
        // A request's own setting beats the configured one.
        let mut own = ask("hi");
        own.settings.max_output_tokens = Some(99);
        with_limit(Some(1234)).generate(&own).await.unwrap();
        with_limit(None).generate(&ask("hi")).await.unwrap();
    }
    let bodies = sent_bodies(&server).await;
    for ((spec, pointer), sent) in specs.iter().zip(bodies.chunks(3)) {
        assert_eq!(
            sent[0].pointer(pointer),
            Some(&json!(1234)),
            "{spec}: {}",
            sent[0]
        );
        assert_eq!(
            sent[1].pointer(pointer),
            Some(&json!(99)),
            "{spec}: {}",
            sent[1]
        );
        for other in [
            "/max_tokens",
            "/max_completion_tokens",
            "/max_output_tokens",
        ] {
            if other != *pointer {
                assert!(sent[0].pointer(other).is_none(), "{spec}: {}", sent[0]);
            }
        }
        if !spec.starts_with("anthropic") {
            // Unset, nothing is sent and the server's default holds.
            assert!(sent[2].pointer(pointer).is_none(), "{spec}: {}", sent[2]);
        }
    }
}

fn local(spec: &str, server: &MockServer) -> std::sync::Arc<dyn deepagents_core::Model> {
    from_spec_with(
        spec,
        &ModelOptions {
            base_url: Some(format!("{}/v1", server.uri())),
            http: Some(fast_config()),
            max_retries: Some(0),
            ..ModelOptions::default()
        },
    )
    .unwrap()
}

/// The window `spec` resolves to against `server`, asked twice; the server is asked once.
async fn discovered(spec: &str, server: &MockServer) -> Option<u64> {
    let model = local(spec, server);
    assert_eq!(model.profile(), None);
    let window = model.resolve_profile().await.map(|p| p.max_input_tokens);
    let asked = server.received_requests().await.unwrap().len();
    assert_eq!(
        model.resolve_profile().await.map(|p| p.max_input_tokens),
        window
    );
    assert_eq!(server.received_requests().await.unwrap().len(), asked);
    // From then on it is the model's profile.
    assert_eq!(model.profile().map(|p| p.max_input_tokens), window);
    window
}

#[tokio::test]
async fn vllm_says_its_window_as_max_model_len_on_the_model_entry() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/models"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"object": "list", "data": [
                {"id": "other", "object": "model", "max_model_len": 32768},
                {"id": "small", "object": "model", "max_model_len": 8192},
            ]})),
        )
        .expect(1)
        .mount(&server)
        .await;
    assert_eq!(
        discovered("openai_compatible:small", &server).await,
        Some(8192)
    );
}

#[tokio::test]
async fn llama_cpp_says_its_window_in_props() {
    let server = MockServer::start().await;
    // llama.cpp lists the model without max_model_len (n_ctx_train is not the window).
    Mock::given(method("GET"))
        .and(path("/v1/models"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({"object": "list", "data": [
                {"id": "model.gguf", "object": "model", "meta": {"n_ctx_train": 131072}},
            ]})),
        )
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/props"))
        .respond_with(ResponseTemplate::new(200).set_body_json(
            json!({"default_generation_settings": {"n_ctx": 8192}, "total_slots": 1}),
        ))
        .expect(1)
        .mount(&server)
        .await;
    assert_eq!(
        discovered("openai_compatible:model.gguf", &server).await,
        Some(8192)
    );
}

#[tokio::test]
async fn ollama_says_its_window_in_api_show() {
    use wiremock::matchers::body_partial_json;

    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api/show"))
        .and(body_partial_json(json!({"model": "tinyllama:1.1b"})))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "parameters": "stop \"</s>\"",
            "model_info": {"general.architecture": "llama", "llama.context_length": 2048},
        })))
        .expect(1)
        .mount(&server)
        .await;
    assert_eq!(
        discovered("ollama:tinyllama:1.1b", &server).await,
        Some(2048)
    );
}

#[tokio::test]
async fn a_server_that_does_not_say_or_a_known_window_leaves_the_profile_as_it_was() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(404))
        .mount(&server)
        .await;
    Mock::given(method("POST"))
        .and(path("/api/show"))
        .respond_with(ResponseTemplate::new(200).set_body_string("not json"))
        .mount(&server)
        .await;
    assert_eq!(discovered("openai_compatible:mystery", &server).await, None);
    assert_eq!(discovered("ollama:mystery", &server).await, None);
    server.reset().await;
    // A known model, a configured window, or a hosted provider: nobody is asked.
    let known = local("ollama:qwen3:8b", &server);
    assert_eq!(
        known.resolve_profile().await.map(|p| p.max_input_tokens),
        Some(131_072)
    );
    let configured = from_spec_with(
        "openai_compatible:mystery",
        &ModelOptions {
            base_url: Some(format!("{}/v1", server.uri())),
            profile: Some(deepagents_core::ModelProfile {
                max_input_tokens: 4096,
                max_output_tokens: 1024,
            }),
            ..ModelOptions::default()
        },
    )
    .unwrap();
    assert_eq!(
        configured
            .resolve_profile()
            .await
            .map(|p| p.max_input_tokens),
        Some(4096)
    );
    let hosted = model("openai_chat:mystery", format!("{}/v1", server.uri()), 0);
    assert_eq!(hosted.resolve_profile().await, None);
    assert!(server.received_requests().await.unwrap().is_empty());
    // An unreachable server fails fast and quietly.
    let gone = from_spec_with(
        "openai_compatible:mystery",
        &ModelOptions {
            base_url: Some("http://127.0.0.1:1/v1".into()),
            ..ModelOptions::default()
        },
    )
    .unwrap();
    assert_eq!(gone.resolve_profile().await, None);
}
