//! Wire shapes and round trips of the core types.

use deepagents_core::message::{AssistantMessage, Message, ToolCall, ToolResult, ToolStatus};
use deepagents_core::model::{ModelError, ModelResponse, StopReason};
use deepagents_core::{ContentBlock, FileContent, FileData, Run, Usage};
use serde_json::json;

fn round_trip<T>(value: &T) -> T
where
    T: serde::Serialize + serde::de::DeserializeOwned,
{
    serde_json::from_str(&serde_json::to_string(value).unwrap()).unwrap()
}

#[test]
fn every_message_kind_round_trips() {
    let messages = vec![
        Message::system("be brief"),
        Message::User {
            content: vec![
                ContentBlock::text("what is this?"),
                ContentBlock::data("image/png", vec![0x89, b'P', b'N', b'G', 0, 255]),
            ],
        },
        Message::Assistant(AssistantMessage {
            content: vec![ContentBlock::text("let me look")],
            tool_calls: vec![ToolCall {
                id: "call_1".into(),
                name: "read_file".into(),
                arguments: json!({"path": "/a.txt", "offset": 0}),
            }],
        }),
        Message::Tool(ToolResult {
            tool_call_id: "call_1".into(),
            name: "read_file".into(),
            content: vec![ContentBlock::text("1\thello")],
            status: ToolStatus::Ok,
            artifact: Some(json!({"lines": 1})),
        }),
    ];
    assert_eq!(round_trip(&messages), messages);
}

#[test]
fn binary_content_is_base64_with_its_mime_type() {
    let block = ContentBlock::data("application/pdf", b"%PDF-1.7".to_vec());
    let value = serde_json::to_value(&block).unwrap();
    assert_eq!(
        value,
        json!({"type": "data", "mime_type": "application/pdf", "data": "JVBERi0xLjc="})
    );
    assert!(!block.is_image());
    assert!(ContentBlock::data("image/webp", vec![1]).is_image());
}

#[test]
fn corrupt_base64_is_a_clear_error() {
    let error = serde_json::from_value::<ContentBlock>(
        json!({"type": "data", "mime_type": "image/png", "data": "not base64!"}),
    )
    .unwrap_err();
    assert!(error.to_string().contains("invalid base64 data"), "{error}");
}

#[test]
fn messages_are_tagged_by_role() {
    let value = serde_json::to_value(Message::user("hi")).unwrap();
    assert_eq!(
        value,
        json!({"role": "user", "content": [{"type": "text", "text": "hi"}]})
    );
    let tool = serde_json::to_value(Message::Tool(ToolResult {
        tool_call_id: "c".into(),
        name: "t".into(),
        content: vec![],
        status: ToolStatus::Error,
        artifact: None,
    }))
    .unwrap();
    assert_eq!(
        tool,
        json!({"role": "tool", "tool_call_id": "c", "name": "t", "content": [], "status": "error"})
    );
}

#[test]
fn responses_usage_and_runs_round_trip() {
    let response = ModelResponse {
        message: AssistantMessage::text("done"),
        usage: Usage {
            input_tokens: 10,
            output_tokens: 2,
            cached_input_tokens: 8,
            ..Usage::default()
        },
        stop_reason: StopReason::Other("pause_turn".into()),
    };
    assert_eq!(round_trip(&response), response);

    let mut run = Run::default();
    run.push_user_input(vec![ContentBlock::text("go")]);
    run.apply_model_response(response);
    run.state.files.insert(
        "/img.png".into(),
        FileData {
            content: FileContent::Binary {
                mime_type: "image/png".into(),
                data: vec![1, 2, 3],
            },
            modified_at_ms: 1,
            created_at_ms: 0,
        },
    );
    run.state.custom.insert("k".into(), json!([1]));
    assert_eq!(round_trip(&run), run);
}

#[test]
fn model_errors_say_what_happened() {
    let error = ModelError::RateLimited {
        retry_after: Some(std::time::Duration::from_millis(1500)),
        message: "slow down".into(),
    };
    assert_eq!(
        error.to_string(),
        "rate limited by the provider (retry after 1500 ms): slow down"
    );
    assert!(error.is_retryable());
    assert_eq!(error.kind(), "rate_limited");
    let overflow = ModelError::ContextWindowExceeded {
        message: "too long".into(),
    };
    assert!(!overflow.is_retryable());
    assert!(
        !ModelError::Authentication {
            message: "bad key".into()
        }
        .is_retryable()
    );
}
