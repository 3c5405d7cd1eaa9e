//! Our base guidance, the first section after the application's own prompt.

use async_trait::async_trait;
use deepagents_core::RunContext;
use deepagents_core::{AgentState, ModelRequest};

use super::{Middleware, MiddlewareError};

const GUIDANCE: &str = "\
Work through the task with your tools: find out what you need, act, then check the result. \
Prefer tools over guesses. When a tool reports an error, read it and adjust instead of \
repeating the same call. When the task is done, reply with the outcome in a few sentences.";

/// Adds the base guidance section. Its name is `guidance`; turn it off with
/// [`AgentBuilder::base_prompt`](crate::AgentBuilder::base_prompt) or replace it with a
/// middleware of the same name.
#[derive(Debug, Default)]
pub struct GuidanceMiddleware;

#[async_trait]
impl Middleware for GuidanceMiddleware {
    fn name(&self) -> &str {
        "guidance"
    }

    async fn before_model(
        &self,
        _ctx: &RunContext,
        request: &mut ModelRequest,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        request.push_system_section(GUIDANCE);
        Ok(())
    }
}
