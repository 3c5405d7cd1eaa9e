//! The no-op tool the loop benchmarks call, so they time the harness, not a tool.

use deepagents::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

pub struct Noop;

#[derive(Deserialize, JsonSchema)]
pub struct NoopArgs {
    #[allow(dead_code)]
    pub n: usize,
}

impl Tool for Noop {
    type Args = NoopArgs;
    fn name(&self) -> &str {
        "noop"
    }
    fn description(&self) -> String {
        "Does nothing".into()
    }
    async fn call(&self, _: NoopArgs, _: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::text("ok"))
    }
}
