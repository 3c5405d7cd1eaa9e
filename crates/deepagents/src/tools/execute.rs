//! `execute`: run a shell command on a backend that has a shell.

use std::sync::Arc;
use std::time::Duration;

use deepagents_backends::Backend;
use deepagents_core::{EventKind, Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;

use super::filesystem::{backend_context, to_model};

/// Longest timeout the model may ask for.
pub(crate) const MAX_TIMEOUT_SECS: u64 = 3_600;

/// `execute`. Offered only when the backend is a sandbox.
pub(crate) struct Execute(pub(crate) Arc<dyn Backend>);

/// Arguments of `execute`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ExecuteArgs {
    /// Shell command, run in the workspace directory.
    command: String,
    /// Seconds before the command is killed (default 120, at most 3600).
    #[serde(default)]
    #[schemars(range(min = 1, max = 3600))]
    timeout: Option<u64>,
}

impl Tool for Execute {
    type Args = ExecuteArgs;

    fn name(&self) -> &str {
        "execute"
    }

    fn description(&self) -> String {
        "Run a shell command (`sh -c`) in the workspace directory and get its output and exit \
         code. stdin is closed, stderr lines are marked, output over 100,000 bytes is cut, and \
         the command is killed after `timeout` seconds (default 120, max 3600). Prefer the file \
         tools for reading and editing files."
            .to_owned()
    }

    fn is_mutating(&self) -> bool {
        true
    }

    async fn call(&self, args: ExecuteArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let Some(sandbox) = self.0.as_sandbox() else {
            return Err(ToolError::Fatal(format!(
                "the {} backend lost its shell",
                self.0.name()
            )));
        };
        if args.command.trim().is_empty() {
            return Err(ToolError::RespondToModel(
                "The command is empty; pass the shell command to run.".to_owned(),
            ));
        }
        if let Some(secs) = args.timeout
            && !(1..=MAX_TIMEOUT_SECS).contains(&secs)
        {
            return Err(ToolError::RespondToModel(format!(
                "timeout must be between 1 and {MAX_TIMEOUT_SECS} seconds, not {secs}."
            )));
        }
        // Output is shown as it arrives; the model gets it whole when the command ends.
        let on_output = |stream, text: &str| {
            ctx.run.events.emit(EventKind::ToolOutputDelta {
                call_id: ctx.call_id.clone(),
                stream,
                text: text.to_owned(),
            });
        };
        let context = backend_context(&ctx);
        let running = sandbox.execute_streaming(
            &context,
            &args.command,
            args.timeout.map(Duration::from_secs),
            &on_output,
        );
        // A cancelled run stops its command at once (dropping it kills the process group)
        // rather than after the grace period other tools get to finish.
        let result = tokio::select! {
            result = running => result.map_err(to_model)?,
            () = ctx.run.cancel.cancelled() => {
                return Err(ToolError::RespondToModel(
                    "The command was stopped before it finished: the run was interrupted (by the user, a time limit or the agent shutting down). It may have partly taken effect; check before running it again.".to_owned(),
                ));
            }
        };
        let mut text = result.output;
        let shown_bytes = text.len();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        // The one note on a cut output (backends only set `truncated`), saying how much is
        // shown and how to get the rest.
        if result.truncated {
            text.push_str(&format!(
                "[Output cut: only its first {} bytes are shown. To see the rest, redirect it to a file (`COMMAND > out.txt 2>&1`) and read or grep that file.]\n",
                shown_bytes
            ));
        }
        if result.timed_out {
            text.push_str("[Killed: the command ran past its timeout. Exit code 124.]");
        } else {
            match result.exit_code {
                Some(code) => text.push_str(&format!("[Exit code {code}]")),
                None => text.push_str("[Killed by a signal]"),
            }
        }
        Ok(ToolOutput::text(text))
    }
}
