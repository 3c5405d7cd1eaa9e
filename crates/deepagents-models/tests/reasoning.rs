//! Reasoning text streams as `ReasoningDelta`s on every wire format, in order with the text and
//! tool-call deltas, while the assembled response keeps its reasoning blocks as before.

use deepagents_core::ContentBlock;
use deepagents_core::model::StreamEvent;
use serde_json::{Value, json};
use wiremock::matchers::method;
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

/// The deltas as `kind:payload` lines, to compare their order at a glance.
fn shape(deltas: &[StreamEvent]) -> Vec<String> {
    deltas
        .iter()
        .map(|d| match d {
            StreamEvent::ReasoningDelta { text } => format!("reasoning:{text}"),
            StreamEvent::TextDelta { text } => format!("text:{text}"),
            StreamEvent::ToolCallDelta {
                index,
                arguments_delta,
                ..
            } => format!("call{index}:{arguments_delta}"),
            other => panic!("unexpected delta {other:?}"),
        })
        .collect()
}

fn streamed_reasoning(deltas: &[StreamEvent]) -> String {
    deltas
        .iter()
        .filter_map(|d| match d {
            StreamEvent::ReasoningDelta { text } => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// Every reasoning delta comes before the first text or tool-call delta.
fn assert_reasoning_first(deltas: &[StreamEvent]) {
    let first_other = deltas
        .iter()
        .position(|d| !matches!(d, StreamEvent::ReasoningDelta { .. }))
        .unwrap_or(deltas.len());
    assert!(
        deltas[first_other..]
            .iter()
            .all(|d| !matches!(d, StreamEvent::ReasoningDelta { .. })),
        "reasoning after the answer began: {deltas:?}"
    );
    assert!(first_other > 0, "no reasoning delta first: {deltas:?}");
}

async fn serve(response: ResponseTemplate) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(response)
        .mount(&server)
        .await;
    server
}

#[tokio::test]
async fn responses_stream_reasoning_summaries_before_the_text() {
    let item = json!({"type": "reasoning", "id": "rs_1", "summary": [
        {"type": "summary_text", "text": "Check the sky."},
        {"type": "summary_text", "text": "Then answer."},
    ], "encrypted_content": "gAAAA-enc"});
    let message = json!({"type": "message", "id": "msg_1", "role": "assistant", "content": [
        {"type": "output_text", "text": "It is sunny."},
    ]});
    let summary = |index: u64, delta: &str| {
        (
            "response.reasoning_summary_text.delta",
            json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0, "summary_index": index, "delta": delta}),
        )
    };
    let server = serve(sse(&[
        ("response.created", json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}})),
        ("response.output_item.added", json!({"type": "response.output_item.added", "output_index": 0, "item": {"type": "reasoning", "id": "rs_1", "summary": []}})),
        ("response.reasoning_summary_part.added", json!({"type": "response.reasoning_summary_part.added", "item_id": "rs_1", "output_index": 0, "summary_index": 0, "part": {"type": "summary_text", "text": ""}})),
        summary(0, "Check "),
        summary(0, "the sky."),
        ("response.reasoning_summary_text.done", json!({"type": "response.reasoning_summary_text.done", "item_id": "rs_1", "output_index": 0, "summary_index": 0, "text": "Check the sky."})),
        ("response.reasoning_summary_part.added", json!({"type": "response.reasoning_summary_part.added", "item_id": "rs_1", "output_index": 0, "summary_index": 1, "part": {"type": "summary_text", "text": ""}})),
        summary(1, "Then answer."),
        ("response.output_item.done", json!({"type": "response.output_item.done", "output_index": 0, "item": item})),
        ("response.output_item.added", json!({"type": "response.output_item.added", "output_index": 1, "item": {"type": "message", "id": "msg_1", "role": "assistant", "content": []}})),
        ("response.output_text.delta", json!({"type": "response.output_text.delta", "output_index": 1, "content_index": 0, "delta": "It is "})),
        ("response.output_text.delta", json!({"type": "response.output_text.delta", "output_index": 1, "content_index": 0, "delta": "sunny."})),
        ("response.output_item.done", json!({"type": "response.output_item.done", "output_index": 1, "item": message})),
        ("response.completed", json!({"type": "response.completed", "response": {"id": "resp_1", "status": "completed", "output": [item, message], "usage": {"input_tokens": 10, "output_tokens": 5}}})),
    ]))
    .await;
    let model = model(Api::Responses.spec(), server.uri(), 0);
    let (deltas, outcome) = stream_all(model.as_ref(), &ask("Weather?")).await;
    let response = outcome.unwrap();
    assert_eq!(
        shape(&deltas),
        [
            "reasoning:Check ",
            "reasoning:the sky.",
            "reasoning:\n\nThen answer.",
            "text:It is ",
            "text:sunny.",
        ]
    );
    assert_reasoning_first(&deltas);
    assert_eq!(
        response.message.content,
        vec![
            ContentBlock::Reasoning {
                text: "Check the sky.\n\nThen answer.".into(),
                signature: None,
                opaque: Some(item),
            },
            ContentBlock::text("It is sunny."),
        ]
    );
    assert_eq!(
        streamed_reasoning(&deltas),
        "Check the sky.\n\nThen answer.",
        "the deltas read as the block does"
    );
}

#[tokio::test]
async fn chat_streams_reasoning_content_and_reasoning_before_text_and_calls() {
    // DeepSeek and vLLM say `reasoning_content`; OpenRouter and Ollama say `reasoning`.
    for field in ["reasoning_content", "reasoning"] {
        let mut body = String::new();
        for chunk in [
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", field: "Think "}}]}),
            json!({"choices": [{"index": 0, "delta": {field: "hard."}}]}),
            json!({"choices": [{"index": 0, "delta": {field: ""}}]}),
            json!({"choices": [{"index": 0, "delta": {"content": "Asking."}}]}),
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]}, "finish_reason": "tool_calls"}]}),
        ] {
            body.push_str(&format!("data: {chunk}\n\n"));
        }
        body.push_str("data: [DONE]\n\n");
        let server =
            serve(ResponseTemplate::new(200).set_body_raw(body, "text/event-stream")).await;
        let model = model(Api::Chat.spec(), server.uri(), 0);
        let (deltas, outcome) = stream_all(model.as_ref(), &ask("Weather?")).await;
        let response = outcome.unwrap();
        assert_eq!(
            shape(&deltas),
            [
                "reasoning:Think ",
                "reasoning:hard.",
                "text:Asking.",
                "call0:{\"city\":\"Oslo\"}",
            ],
            "{field}"
        );
        assert_reasoning_first(&deltas);
        assert_eq!(
            response.message.content,
            vec![
                ContentBlock::Reasoning {
                    text: "Think hard.".into(),
                    signature: None,
                    opaque: None,
                },
                ContentBlock::text("Asking."),
            ],
            "{field}"
        );
        assert_eq!(streamed_reasoning(&deltas), "Think hard.", "{field}");
        assert_eq!(response.message.tool_calls[0].name, "weather");
    }
}

#[tokio::test]
async fn anthropic_streams_thinking_but_not_signatures_or_redacted_thinking() {
    let redacted = json!({"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"});
    let delta = |index: u64, delta: Value| {
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": index, "delta": delta}),
        )
    };
    let server = serve(sse(&[
        ("message_start", json!({"type": "message_start", "message": {"id": "msg_1", "usage": {"input_tokens": 20, "output_tokens": 1}}})),
        ("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "", "signature": ""}})),
        delta(0, json!({"type": "thinking_delta", "thinking": "The user wants "})),
        delta(0, json!({"type": "thinking_delta", "thinking": "weather."})),
        delta(0, json!({"type": "signature_delta", "signature": "EqQBsig"})),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
        ("content_block_start", json!({"type": "content_block_start", "index": 1, "content_block": redacted})),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 1})),
        ("content_block_start", json!({"type": "content_block_start", "index": 2, "content_block": {"type": "text", "text": ""}})),
        delta(2, json!({"type": "text_delta", "text": "Checking "})),
        delta(2, json!({"type": "text_delta", "text": "Rome."})),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 2})),
        ("content_block_start", json!({"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}})),
        delta(3, json!({"type": "input_json_delta", "partial_json": "{\"city\": \"Rome\"}"})),
        ("content_block_stop", json!({"type": "content_block_stop", "index": 3})),
        ("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 42}})),
        ("message_stop", json!({"type": "message_stop"})),
    ]))
    .await;
    let model = model(Api::Anthropic.spec(), server.uri(), 0);
    let (deltas, outcome) = stream_all(model.as_ref(), &ask("Weather in Rome?")).await;
    let response = outcome.unwrap();
    assert_eq!(
        shape(&deltas),
        [
            "reasoning:The user wants ",
            "reasoning:weather.",
            "text:Checking ",
            "text:Rome.",
            "call0:",
            "call0:{\"city\": \"Rome\"}",
        ]
    );
    assert_reasoning_first(&deltas);
    assert_eq!(streamed_reasoning(&deltas), "The user wants weather.");
    assert_eq!(
        response.message.content,
        vec![
            ContentBlock::Reasoning {
                text: "The user wants weather.".into(),
                signature: Some("EqQBsig".into()),
                opaque: None,
            },
            ContentBlock::Reasoning {
                text: String::new(),
                signature: None,
                opaque: Some(redacted),
            },
            ContentBlock::text("Checking Rome."),
        ]
    );
}

#[tokio::test]
async fn gemini_streams_thought_parts_before_the_text_and_calls() {
    let chunk =
        |parts: Value| json!({"candidates": [{"content": {"role": "model", "parts": parts}}]});
    let server = serve(sse(&[
        ("", chunk(json!([{"text": "Pondering ", "thought": true}]))),
        ("", chunk(json!([{"text": "the forecast.", "thought": true}, {"text": "", "thought": true}]))),
        ("", chunk(json!([{"text": "Looking it up."}]))),
        ("", json!({"candidates": [{"content": {"role": "model", "parts": [
            {"functionCall": {"name": "weather", "args": {"city": "Paris"}}, "thoughtSignature": "sig-call"},
        ]}, "finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 4}})),
    ]))
    .await;
    let model = model(Api::Gemini.spec(), server.uri(), 0);
    let (deltas, outcome) = stream_all(model.as_ref(), &ask("Weather in Paris?")).await;
    let response = outcome.unwrap();
    assert_eq!(
        shape(&deltas),
        [
            "reasoning:Pondering ",
            "reasoning:the forecast.",
            "text:Looking it up.",
            "call0:{\"city\":\"Paris\"}",
        ]
    );
    assert_reasoning_first(&deltas);
    assert_eq!(streamed_reasoning(&deltas), "Pondering the forecast.");
    assert_eq!(
        response.message.content,
        vec![
            ContentBlock::Reasoning {
                text: "Pondering the forecast.".into(),
                signature: None,
                opaque: None,
            },
            ContentBlock::Reasoning {
                text: String::new(),
                signature: Some("sig-call".into()),
                opaque: Some(json!({"gemini_call": 0})),
            },
            ContentBlock::text("Looking it up."),
        ]
    );
    assert_eq!(response.message.tool_calls[0].name, "weather");
}
