//! The human-in-the-loop section: which calls wait for a person, and what their answers mean.

use async_trait::async_trait;
use deepagents_core::{AgentState, ModelRequest, RunContext};

use super::{Middleware, MiddlewareError};

/// Tells the model which of its tools wait for approval and how to take a rejection. Its name
/// is `human_in_the_loop`; the builder adds it, last, when calls of some tool wait for
/// approval. Only tools offered in the request are named.
#[derive(Debug)]
pub struct HumanInTheLoopMiddleware {
    tools: Vec<String>,
}

impl HumanInTheLoopMiddleware {
    /// The section for calls to `tools`.
    pub fn new(tools: Vec<String>) -> Self {
        Self { tools }
    }
}

#[async_trait]
impl Middleware for HumanInTheLoopMiddleware {
    fn name(&self) -> &str {
        "human_in_the_loop"
    }

    async fn before_model(
        &self,
        _ctx: &RunContext,
        request: &mut ModelRequest,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        let offered: Vec<&str> = self
            .tools
            .iter()
            .map(String::as_str)
            .filter(|name| request.tools.iter().any(|t| t.name == *name))
            .collect();
        if offered.is_empty() {
            return Ok(());
        }
        request.push_system_section(&format!(
            "## Approval\nCalls to {} may wait for a person's decision before they run: \
             approve, change the arguments, reject, or answer in the call's place; the call's \
             result tells you which. A rejected call did not run: do not repeat it unchanged \
             — follow the reason given, try another way, or ask.",
            offered
                .iter()
                .map(|name| format!("`{name}`"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        Ok(())
    }
}
