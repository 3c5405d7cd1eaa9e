//! `ask_user`: the model asks the person it works for a question and waits for the answer.
//!
//! The tool suspends its call ([`ToolOutput::suspend`]), the mechanism any tool uses to ask
//! mid-call: the question waits in the run (and in its checkpoint, across restarts) until the
//! person answers with a `respond` decision, whose message becomes the call's result, or
//! declines with `reject`. Threads paused by an earlier version, where the question was an
//! approval gate before the call, still resume: the decision given for the call itself is
//! settled as its result (see `Run::gate`).

use deepagents_core::interrupt::Decision;
use deepagents_core::{Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

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
    options: Vec<String>,
}

/// What the person is told about a question.
const DESCRIPTION: &str = "The agent asks you a question; your answer is its result.";

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

    async fn call(&self, args: AskUserArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        // The decision itself rather than `ctx.answers`: the answer is the text the person
        // typed, exactly, even when it reads as JSON.
        let decision = ctx
            .paused
            .as_deref()
            .filter(|paused| paused.subagent == ASK_USER)
            .and_then(|paused| paused.run.control.decisions.values().next());
        match decision {
            Some(Decision::Respond { message }) => Ok(ToolOutput::text(message.clone())),
            Some(Decision::Reject { message }) => Err(ToolError::RespondToModel(
                deepagents_core::pause::rejected(message.as_deref()),
            )),
            // Approval and edits are not offered for a question; ask again.
            Some(Decision::Approve | Decision::Edit { .. }) | None => {
                let mut request = serde_json::json!({"question": args.question});
                if !args.options.is_empty() {
                    request["options"] = serde_json::json!(args.options);
                }
                Ok(ToolOutput::suspend(
                    &ctx,
                    ASK_USER,
                    request,
                    Some(DESCRIPTION.to_owned()),
                ))
            }
        }
    }
}
