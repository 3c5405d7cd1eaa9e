//! Runs that end without an answer: turn limit, model errors, script exhaustion.

use deepagents::{Agent, ModelError, RunError};
use serde_json::json;

use crate::support::scripted;

#[tokio::test]
async fn the_turn_limit_stops_a_looping_model_with_a_clear_error() {
    let looping: Vec<_> = (0..10)
        .map(|_| json!({"tool_calls": [{"name": "write_todos", "args": {"todos": []}}]}))
        .collect();
    let agent = Agent::builder(scripted(json!(looping)))
        .todos(true)
        .max_turns(3)
        .build()
        .unwrap();
    let failure = agent.invoke("loop forever").await.unwrap_err();
    assert!(matches!(failure.error, RunError::TurnLimit(ref limit) if limit.limit == 3));
    assert!(
        failure.to_string().contains("raise the turn limit"),
        "{failure}"
    );
    // The three calls and their results are all kept.
    assert_eq!(failure.run.steps, 3);
    assert_eq!(failure.run.state.messages.len(), 1 + 3 * 2);
}

#[tokio::test]
async fn running_out_of_script_is_a_model_error_naming_the_script() {
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"name": "write_todos", "args": {"todos": []}}]}
    ])))
    .todos(true)
    .build()
    .unwrap();
    let failure = agent.invoke("go").await.unwrap_err();
    let RunError::Model(ModelError::Other { message }) = &failure.error else {
        panic!("unexpected {:?}", failure.error);
    };
    assert!(message.contains("ran out of turns"), "{message}");
    assert!(message.contains("holds 1 turns"), "{message}");
}

#[tokio::test]
async fn a_model_error_keeps_its_kind() {
    let agent = Agent::builder(scripted(json!([
        {"error": {"kind": "context_window_exceeded", "message": "prompt is too long"}}
    ])))
    .build()
    .unwrap();
    let failure = agent.invoke("go").await.unwrap_err();
    assert_eq!(
        failure.error.kind(),
        deepagents::core::event::ErrorKind::Model
    );
    assert!(matches!(
        failure.error,
        RunError::Model(ModelError::ContextWindowExceeded { .. })
    ));
    // The user input is still there to retry with.
    assert_eq!(failure.run.state.messages.len(), 1);
}

#[tokio::test]
async fn undeclared_custom_state_is_a_fatal_state_error() {
    use deepagents::{StateUpdate, Tool, ToolContext, ToolError, ToolOutput};
    struct Sneaky;
    #[derive(serde::Deserialize, schemars::JsonSchema)]
    struct NoArgs {}
    impl Tool for Sneaky {
        type Args = NoArgs;
        fn name(&self) -> &str {
            "sneaky"
        }
        fn description(&self) -> String {
            "test".into()
        }
        async fn call(&self, _: NoArgs, _: ToolContext) -> Result<ToolOutput, ToolError> {
            Ok(ToolOutput::text("ok")
                .with_update(StateUpdate::default().with_custom("ghost", json!(1))))
        }
    }
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"name": "sneaky", "args": {}}]},
        {"text": "never"}
    ])))
    .tool(Sneaky)
    .build()
    .unwrap();
    let failure = agent.invoke("go").await.unwrap_err();
    assert_eq!(
        failure.error.kind(),
        deepagents::core::event::ErrorKind::State
    );
    assert!(
        failure.to_string().contains("`ghost` was never declared"),
        "{failure}"
    );
}
