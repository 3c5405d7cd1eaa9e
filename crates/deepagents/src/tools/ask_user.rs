//! `ask_user`: the model asks the person it works for a question and waits for the answer.
//!
//! The question is a pause like an approval: the call waits in the run (and in its
//! checkpoint, across restarts) until the person answers with a `respond` decision, whose
//! message becomes the call's result, or declines with `reject`.

use deepagents_core::interrupt::DecisionKind;
use deepagents_core::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

use crate::approval::InterruptConfig;

/// The tool's name.
pub const ASK_USER: &str = "ask_user";

/// `ask_user`.
pub(crate) struct AskUser;

/// Arguments of `ask_user`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct AskUserArgs {
    /// One clear question, with the context the person needs to answer it.
    question: String,
    /// Suggested answers, if the question has a few likely ones.
    #[serde(default)]
    #[expect(
        dead_code,
        reason = "front ends read the options from the call's arguments while it waits"
    )]
    options: Vec<String>,
}

/// The pause every `ask_user` call makes: only the person's answer or refusal continue it.
pub(crate) fn interrupt() -> InterruptConfig {
    InterruptConfig {
        allowed: vec![DecisionKind::Respond, DecisionKind::Reject],
        description: Some("The agent asks you a question; your answer is its result.".to_owned()),
        ..InterruptConfig::default()
    }
}

impl Tool for AskUser {
    type Args = AskUserArgs;

    fn name(&self) -> &str {
        ASK_USER
    }

    fn description(&self) -> String {
        "Ask the user a question and wait for the answer, which is this call's result. Use it \
         only when you cannot proceed well without their input (a choice only they can make, \
         missing information); otherwise decide yourself. Ask one question per call."
            .to_owned()
    }

    async fn call(&self, args: AskUserArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        // Reached only where nothing pauses for the answer (an agent without the pause).
        Err(ToolError::RespondToModel(format!(
            "Nobody can answer here, so \"{}\" stays open: decide yourself and say what you assumed.",
            args.question
        )))
    }
}
