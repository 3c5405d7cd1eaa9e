//! Structured final answers: the `final_answer` tool, validated against the user's schema.

use std::sync::Arc;

use async_trait::async_trait;
use deepagents_core::RunContext;
use deepagents_core::tool::InvalidSchema;
use deepagents_core::{
    AgentState, DynTool, DynamicTool, Message, ModelRequest, Reducer, Run, StateUpdate, ToolOutput,
    ToolStatus,
};
use serde_json::Value;

use super::{Middleware, MiddlewareError};

/// The tool the model calls with its structured answer.
pub const FINAL_ANSWER_TOOL: &str = "final_answer";
/// The custom state key holding the validated answer.
pub const STRUCTURED_RESPONSE_KEY: &str = "structured_response";

const PROMPT: &str = "\
## Final answer
When the task is done, call `final_answer` once with your answer in its required structure. \
The run ends when the answer is valid; an invalid answer comes back with what to fix.";

/// Asks for the final answer as JSON matching a schema. Its name is `response_format`.
pub struct ResponseFormatMiddleware {
    tool: Arc<DynamicTool>,
}

impl ResponseFormatMiddleware {
    /// Checks `schema` (a JSON schema of an object) and builds the `final_answer` tool.
    pub fn new(schema: Value) -> Result<Self, InvalidSchema> {
        if schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(InvalidSchema {
                tool: FINAL_ANSWER_TOOL.to_owned(),
                message: "the response format must describe a JSON object (\"type\": \"object\")"
                    .to_owned(),
            });
        }
        let tool = DynamicTool::new(
            FINAL_ANSWER_TOOL,
            "Give your final answer in the required structure. Call it once, when the task is \
             done; the arguments are the answer.",
            schema,
            |args, _ctx| async move {
                // The valid answer is the run's final answer: the turn closes with its JSON.
                let answer = args.to_string();
                Ok(ToolOutput::text("Answer recorded.")
                    .with_update(StateUpdate::default().with_custom(STRUCTURED_RESPONSE_KEY, args))
                    .with_final_answer(answer))
            },
        )?;
        Ok(Self {
            tool: Arc::new(tool),
        })
    }
}

#[async_trait]
impl Middleware for ResponseFormatMiddleware {
    fn name(&self) -> &str {
        "response_format"
    }

    fn tools(&self) -> Vec<Arc<dyn DynTool>> {
        vec![self.tool.clone()]
    }

    fn state_values(&self) -> Vec<(String, Reducer)> {
        vec![(STRUCTURED_RESPONSE_KEY.to_owned(), Reducer::Replace)]
    }

    async fn before_model(
        &self,
        _ctx: &RunContext,
        request: &mut ModelRequest,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        request.push_system_section(PROMPT);
        Ok(())
    }
}

/// The structured answer, when the conversation ends with one: a valid `final_answer` result
/// followed by the closing assistant turn.
pub(crate) fn final_structured_answer(run: &Run) -> Option<Value> {
    let messages = &run.state.messages;
    let before_last = messages.len().checked_sub(2)?;
    match &messages[before_last] {
        Message::Tool(result)
            if result.name == FINAL_ANSWER_TOOL && result.status == ToolStatus::Ok =>
        {
            run.state.custom.get(STRUCTURED_RESPONSE_KEY).cloned()
        }
        _ => None,
    }
}
