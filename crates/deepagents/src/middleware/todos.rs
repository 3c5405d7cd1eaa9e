//! Planning: the `write_todos` tool and its prompt section.

use std::sync::Arc;

use async_trait::async_trait;
use deepagents_core::RunContext;
use deepagents_core::{
    AgentState, DynTool, ModelRequest, StateUpdate, Todo, TodoStatus, Tool, ToolContext, ToolError,
    ToolOutput, TypedTool,
};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{Middleware, MiddlewareError};

const PROMPT: &str = "\
## Planning
For a task of three or more steps, keep a plan with `write_todos`: list the steps, keep exactly \
one `in_progress` while you work on it, and mark each `completed` as soon as it is done. Each \
call replaces the whole list. Skip the plan for quick, single-step requests.";

/// Keeps a plan in the agent state through the `write_todos` tool. Opt-in
/// ([`AgentBuilder::todos`](crate::AgentBuilder::todos)); its name is `todos`.
#[derive(Debug, Default)]
pub struct TodoListMiddleware;

#[async_trait]
impl Middleware for TodoListMiddleware {
    fn name(&self) -> &str {
        "todos"
    }

    fn tools(&self) -> Vec<Arc<dyn DynTool>> {
        vec![Arc::new(TypedTool::new(WriteTodos))]
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

struct WriteTodos;

/// Arguments of `write_todos`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct WriteTodosArgs {
    /// The complete plan, in order. Replaces the previous list.
    todos: Vec<Todo>,
}

impl Tool for WriteTodos {
    type Args = WriteTodosArgs;

    fn name(&self) -> &str {
        "write_todos"
    }

    fn description(&self) -> String {
        "Replace the plan with this list of steps. Each item has `content` (one short imperative \
         sentence) and `status`: pending, in_progress or completed. Send the whole list every \
         time; at most one item should be in_progress."
            .to_owned()
    }

    async fn call(&self, args: WriteTodosArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        if let Some(position) = args.todos.iter().position(|t| t.content.trim().is_empty()) {
            return Err(ToolError::RespondToModel(format!(
                "Todo {} has empty content; give every item a short description.",
                position + 1
            )));
        }
        let count = |status| args.todos.iter().filter(|t| t.status == status).count();
        let summary = format!(
            "Plan updated: {} pending, {} in progress, {} completed.",
            count(TodoStatus::Pending),
            count(TodoStatus::InProgress),
            count(TodoStatus::Completed)
        );
        Ok(ToolOutput::text(summary).with_update(StateUpdate::todos(args.todos)))
    }
}
