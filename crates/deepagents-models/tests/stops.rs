//! Stop reasons and tool-error results, per wire format, straight through each wire's response
//! parser and stream decoder (no server): every provider's spelling of "cut off at the token
//! cap", "stopped at a stop sequence" and "filtered" maps to its own [`StopReason`].

use deepagents_core::ContentBlock;
use deepagents_core::message::{Message, ToolCall, ToolResult, ToolStatus};
use deepagents_core::model::{ModelRequest, ModelResponse, StopReason};
use deepagents_models::anthropic::AnthropicWire;
use deepagents_models::gemini::GeminiWire;
use deepagents_models::http::sse::SseEvent;
use deepagents_models::openai_chat::ChatWire;
use deepagents_models::openai_responses::ResponsesWire;
use deepagents_models::provider::Wire;
use serde_json::{Value, json};

fn chat() -> ChatWire {
    ChatWire {
        provider: "openai_chat".into(),
        base_url: "http://127.0.0.1:1/v1".into(),
        model: "gpt-4o".into(),
        stream_usage: true,
        extra_headers: vec![],
        reasoning: None,
        modalities: deepagents_core::model::InputModalities::ALL,
        max_output_tokens: None,
        legacy_max_tokens: false,
    }
}

fn responses() -> ResponsesWire {
    ResponsesWire {
        provider: "openai".into(),
        base_url: "http://127.0.0.1:1/v1".into(),
        model: "gpt-4o".into(),
        reasoning: None,
        modalities: deepagents_core::model::InputModalities::ALL,
        max_output_tokens: None,
    }
}

fn anthropic() -> AnthropicWire {
    AnthropicWire {
        base_url: "http://127.0.0.1:1".into(),
        model: "claude-sonnet-4-5".into(),
        default_max_tokens: 1024,
        prompt_caching: true,
        reasoning: None,
        modalities: deepagents_core::model::InputModalities::ALL,
    }
}

fn gemini() -> GeminiWire {
    GeminiWire {
        base_url: "http://127.0.0.1:1".into(),
        model: "gemini-2.5-flash".into(),
        reasoning: None,
        modalities: deepagents_core::model::InputModalities::ALL,
        max_output_tokens: None,
    }
}

/// Feeds SSE events (name, data) to a fresh decoder of the wire, as a stream would.
fn decode(wire: &dyn Wire, events: &[(&str, String)]) -> ModelResponse {
    let mut decoder = wire.decoder();
    for (name, data) in events {
        let step = decoder
            .event(&SseEvent {
                event: (*name).to_owned(),
                data: data.clone(),
            })
            .unwrap();
        if let Some(done) = step.done {
            return done;
        }
    }
    decoder.end().unwrap()
}

fn data(events: &[Value]) -> Vec<(&'static str, String)> {
    events.iter().map(|e| ("", e.to_string())).collect()
}

const CALL: &str = r#"{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Par"}}"#;

#[test]
fn chat_stop_reasons() {
    let call: Value = serde_json::from_str(CALL).unwrap();
    // Chat has no separate stop-sequence reason: a stop sequence ends with "stop" too.
    for (finish, calls, expected) in [
        ("stop", false, StopReason::EndTurn),
        ("length", false, StopReason::MaxTokens),
        ("content_filter", false, StopReason::ContentFilter),
        ("tool_calls", true, StopReason::ToolUse),
        // Cut off inside a tool call: the truncation is what matters.
        ("length", true, StopReason::MaxTokens),
        (
            "insufficient_system_resource",
            false,
            StopReason::Other("insufficient_system_resource".into()),
        ),
    ] {
        let tool_calls = if calls { json!([call]) } else { json!(null) };
        let body = json!({"choices": [{"message": {"role": "assistant", "content": "Hi", "tool_calls": tool_calls}, "finish_reason": finish}]});
        assert_eq!(
            chat().parse(&body).unwrap().stop_reason,
            expected,
            "{finish}"
        );

        let mut delta = json!({"content": "Hi"});
        if calls {
            delta["tool_calls"] = json!([{"index": 0, "id": "call_1", "function": {"name": "weather", "arguments": "{\"city\": \"Par"}}]);
        }
        let mut events = data(&[
            json!({"choices": [{"index": 0, "delta": delta}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}),
        ]);
        events.push(("", "[DONE]".to_owned()));
        assert_eq!(
            decode(&chat(), &events).stop_reason,
            expected,
            "streamed {finish}"
        );
    }
}

#[test]
fn responses_stop_reasons() {
    let text = json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]});
    let call = json!({"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{\"city\": \"Par"});
    // The Responses API takes no stop sequences, so it has no such reason.
    for (status, reason, with_call, expected) in [
        ("completed", None, false, StopReason::EndTurn),
        (
            "incomplete",
            Some("max_output_tokens"),
            false,
            StopReason::MaxTokens,
        ),
        (
            "incomplete",
            Some("content_filter"),
            false,
            StopReason::ContentFilter,
        ),
        ("completed", None, true, StopReason::ToolUse),
        (
            "incomplete",
            Some("max_output_tokens"),
            true,
            StopReason::MaxTokens,
        ),
    ] {
        let mut output = vec![text.clone()];
        if with_call {
            output.push(call.clone());
        }
        let body = json!({
            "status": status,
            "incomplete_details": reason.map(|r| json!({"reason": r})),
            "output": output,
        });
        assert_eq!(
            responses().parse(&body).unwrap().stop_reason,
            expected,
            "{reason:?}"
        );
        let kind = if status == "completed" {
            "response.completed"
        } else {
            "response.incomplete"
        };
        let events = data(&[json!({"type": kind, "response": body})]);
        assert_eq!(
            decode(&responses(), &events).stop_reason,
            expected,
            "streamed {reason:?}"
        );
    }
}

#[test]
fn anthropic_stop_reasons() {
    for (reason, expected) in [
        ("end_turn", StopReason::EndTurn),
        ("max_tokens", StopReason::MaxTokens),
        ("stop_sequence", StopReason::StopSequence),
        ("refusal", StopReason::ContentFilter),
        ("tool_use", StopReason::ToolUse),
        ("pause_turn", StopReason::Other("pause_turn".into())),
    ] {
        let body = json!({"content": [{"type": "text", "text": "Hi"}], "stop_reason": reason, "stop_sequence": null, "usage": {"input_tokens": 1, "output_tokens": 1}});
        assert_eq!(
            anthropic().parse(&body).unwrap().stop_reason,
            expected,
            "{reason}"
        );
        let events: Vec<(&str, String)> = [
            json!({"type": "message_start", "message": {"usage": {"input_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hi"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null}, "usage": {"output_tokens": 1}}),
            json!({"type": "message_stop"}),
        ]
        .iter()
        .map(|e| ("", e.to_string()))
        .collect();
        assert_eq!(
            decode(&anthropic(), &events).stop_reason,
            expected,
            "streamed {reason}"
        );
    }
}

#[test]
fn gemini_stop_reasons() {
    let call = json!({"functionCall": {"name": "weather", "args": {"city": "Paris"}}});
    // Gemini ends at a stop sequence with STOP, like a finished turn.
    for (finish, with_call, expected) in [
        ("STOP", false, StopReason::EndTurn),
        ("MAX_TOKENS", false, StopReason::MaxTokens),
        ("SAFETY", false, StopReason::ContentFilter),
        ("RECITATION", false, StopReason::ContentFilter),
        ("PROHIBITED_CONTENT", false, StopReason::ContentFilter),
        ("STOP", true, StopReason::ToolUse),
        ("MAX_TOKENS", true, StopReason::MaxTokens),
        (
            "MALFORMED_FUNCTION_CALL",
            false,
            StopReason::Other("MALFORMED_FUNCTION_CALL".into()),
        ),
    ] {
        let mut parts = vec![json!({"text": "Hi"})];
        if with_call {
            parts.push(call.clone());
        }
        let body = json!({"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish}]});
        assert_eq!(
            gemini().parse(&body).unwrap().stop_reason,
            expected,
            "{finish}"
        );
        let events = data(&[
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "H"}]}}]}),
            body,
        ]);
        assert_eq!(
            decode(&gemini(), &events).stop_reason,
            expected,
            "streamed {finish}"
        );
    }
}

#[test]
fn anthropic_marks_failed_tool_results_as_errors() {
    let call = |id: &str| ToolCall {
        id: id.into(),
        name: "weather".into(),
        arguments: json!({}),
    };
    let result = |id: &str, status| {
        Message::Tool(ToolResult {
            tool_call_id: id.into(),
            name: "weather".into(),
            content: vec![ContentBlock::text("text")],
            status,
            artifact: None,
        })
    };
    let request = ModelRequest {
        messages: vec![
            Message::user("hi"),
            Message::Assistant(deepagents_core::message::AssistantMessage {
                content: vec![],
                tool_calls: vec![call("toolu_ok"), call("toolu_bad")],
            }),
            result("toolu_ok", ToolStatus::Ok),
            result("toolu_bad", ToolStatus::Error),
        ]
        .into(),
        ..ModelRequest::default()
    };
    let (_, body) = anthropic().request(&request, false).unwrap();
    let results = body["messages"][2]["content"].as_array().unwrap();
    assert_eq!(results.len(), 2, "one user turn holds both results: {body}");
    assert_eq!(results[0]["tool_use_id"], "toolu_ok");
    assert!(results[0].get("is_error").is_none(), "{}", results[0]);
    assert_eq!(results[1]["tool_use_id"], "toolu_bad");
    assert_eq!(results[1]["is_error"], true);
    assert_eq!(
        results[1]["content"],
        json!([{"type": "text", "text": "text"}])
    );
}
