//! Structured final answers through `final_answer`.

use deepagents::{Agent, Message};
use serde_json::json;

use crate::support::{assert_error_containing, scripted, tool_results};

fn schema() -> serde_json::Value {
    json!({
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "score": {"type": "integer", "minimum": 0, "maximum": 10}
        },
        "required": ["title", "score"],
        "additionalProperties": false
    })
}

#[tokio::test]
async fn the_answer_is_validated_and_returned_as_json() {
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"name": "final_answer", "args": {"title": "Dune", "score": 11}}]},
        {"text": "Dune, 9 out of 10."},
        {"tool_calls": [{"name": "final_answer", "args": {"title": "Dune", "score": 9}}]},
        {"text": "never used"}
    ])))
    .response_format(schema())
    .build()
    .unwrap();
    let output = agent.invoke("Rate Dune").await.unwrap();
    assert_eq!(
        output.structured,
        Some(json!({"title": "Dune", "score": 9}))
    );
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&output.text).unwrap(),
        json!({"title": "Dune", "score": 9})
    );
    let messages = &output.run.state.messages;
    let results = tool_results(messages);
    assert_error_containing(results[0], "at /score");
    // The plain-text answer was sent back with a reminder.
    assert!(
        messages.iter().any(|m| matches!(m, Message::User { .. })
            && m.text().contains("Reply by calling final_answer"))
    );
    assert_eq!(output.run.steps, 3);
}

#[tokio::test]
async fn agents_without_a_format_have_no_structured_answer() {
    let agent = Agent::builder(scripted(json!([{"text": "plain"}])))
        .build()
        .unwrap();
    let output = agent.invoke("hi").await.unwrap();
    assert_eq!(output.structured, None);
    assert!(agent.tool_specs().iter().all(|t| t.name != "final_answer"));
}

#[test]
fn a_format_that_is_not_an_object_schema_is_refused() {
    let error = Agent::builder(scripted(json!([])))
        .response_format(json!({"type": "string"}))
        .build()
        .err()
        .unwrap();
    assert!(
        error.to_string().contains("must describe a JSON object"),
        "{error}"
    );
    let error = Agent::builder(scripted(json!([])))
        .response_format(json!({"type": "object", "properties": {"a": {"type": 5}}}))
        .build()
        .err()
        .unwrap();
    assert!(
        error.to_string().starts_with("invalid response format"),
        "{error}"
    );
}
