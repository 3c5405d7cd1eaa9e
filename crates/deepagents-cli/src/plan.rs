//! Plan mode: the agent may read and explore but not change anything until the user approves
//! its plan. Shift-Tab or `/plan` in the TUI, `--plan` for any run; `/approve` in the TUI ends
//! it and the approval mode in force before applies again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use deepagents::InterruptConfig;
use deepagents::approval::ApprovalReason;
use deepagents::core::{
    AgentState, ModelRequest, RunContext, ToolCall, ToolContext, ToolError, ToolOutput,
};
use deepagents::middleware::{Middleware, MiddlewareError, ToolNext};
use serde_json::Value;

/// Whether plan mode is on; read at every call, so a switch applies at once.
#[derive(Clone, Debug, Default)]
pub struct PlanSwitch(Arc<AtomicBool>);

impl PlanSwitch {
    /// A switch that starts `on` or off.
    pub fn new(on: bool) -> Self {
        Self(Arc::new(AtomicBool::new(on)))
    }

    /// Turns plan mode on or off.
    pub fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }

    /// Whether plan mode is on.
    pub fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The tools plan mode lets run: they read, or write only the plan. Everything else — file
/// changes, commands, subagents (which may change files), MCP tools (which may do anything) —
/// is refused with a message the model can act on.
const READ_ONLY: [&str; 7] = [
    "ls",
    "read_file",
    "glob",
    "grep",
    "write_todos",
    "ask_user",
    "web_fetch",
];

const PROMPT: &str = "## Plan mode\nPlan mode is on: explore and read as much as you need (ls, read_file, glob, grep), but change nothing — file changes, commands and subagents are refused until the user approves a plan. Finish your turn with a concrete plan: the steps in write_todos and a short summary of what you will change and why. The user approves it or asks for changes.";

const REFUSED: &str = "Refused: plan mode is on, so nothing may be changed yet (file changes, commands and subagents wait for the user's approval of a plan). Keep exploring with ls, read_file, glob and grep, then present the plan (write_todos and a summary) and end your turn.";

/// Refuses every call but reading while plan mode is on, and tells the model so.
pub struct PlanMode {
    switch: PlanSwitch,
}

impl PlanMode {
    /// Plan mode as `switch` says.
    pub fn new(switch: PlanSwitch) -> Self {
        Self { switch }
    }
}

#[async_trait]
impl Middleware for PlanMode {
    fn name(&self) -> &str {
        "plan_mode"
    }

    async fn before_model(
        &self,
        _ctx: &RunContext,
        request: &mut ModelRequest,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        if self.switch.is_on() {
            request.push_system_section(PROMPT);
        }
        Ok(())
    }

    async fn wrap_tool_call(
        &self,
        call: ToolCall,
        ctx: ToolContext,
        next: ToolNext,
    ) -> Result<ToolOutput, ToolError> {
        if self.switch.is_on() && !READ_ONLY.contains(&call.name.as_str()) {
            return Err(ToolError::RespondToModel(REFUSED.to_owned()));
        }
        next.call(call, ctx).await
    }
}

/// `config`, pausing nothing while plan mode is on: such a call is refused anyway, so asking
/// first would only ask for nothing.
pub fn unless_planning(config: InterruptConfig, plan: &PlanSwitch) -> InterruptConfig {
    let predicate = config.predicate.clone();
    let planning = plan.clone();
    let reason = config.reason.clone().map(|reason| {
        let planning = plan.clone();
        Arc::new(
            move |args: &Value| {
                if planning.is_on() { None } else { reason(args) }
            },
        ) as Arc<ApprovalReason>
    });
    InterruptConfig {
        predicate: Some(Arc::new(move |args: &Value| {
            !planning.is_on() && predicate.as_ref().is_none_or(|p| p(args))
        })),
        reason,
        ..config
    }
}
