//! `deepagents threads`: list, show and delete conversation threads.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::bail;
use deepagents::Message;

use crate::ThreadsCommand;
use crate::workspace::open_store;

/// Runs a `threads` subcommand.
pub async fn run(command: ThreadsCommand) -> anyhow::Result<ExitCode> {
    let (_, checkpointer) = open_store().await?;
    let mut out = std::io::stdout().lock();
    match command {
        ThreadsCommand::List => {
            for thread in checkpointer.threads().await? {
                writeln!(
                    out,
                    "{}\t{} checkpoints",
                    thread.thread_id, thread.checkpoints
                )?;
            }
        }
        ThreadsCommand::Show { id } => {
            let Some(run) = checkpointer.load(&id, None).await? else {
                bail!("no thread `{id}`; `deepagents threads list` shows them");
            };
            for message in &run.state.messages {
                let role = match message {
                    Message::System { .. } => "system",
                    Message::User { .. } => "user",
                    Message::Assistant(_) => "assistant",
                    Message::Tool(_) => "tool",
                };
                let text = message.text();
                let first = text.lines().next().unwrap_or_default();
                writeln!(out, "{role}: {first}")?;
                if let Message::Assistant(assistant) = message {
                    for call in &assistant.tool_calls {
                        writeln!(out, "  → {} {}", call.name, call.arguments)?;
                    }
                }
            }
        }
        ThreadsCommand::Delete { id } => {
            if !checkpointer.delete_thread(&id).await? {
                bail!("no thread `{id}`; `deepagents threads list` shows them");
            }
            writeln!(out, "deleted {id}")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
