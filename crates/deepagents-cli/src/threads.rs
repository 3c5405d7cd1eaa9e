//! `deepagents threads`: list, show, delete and rewind conversation threads.

use std::io::Write as _;
use std::process::ExitCode;

use anyhow::bail;
use deepagents::{Checkpointer, Message};

use crate::args::ThreadsCommand;
use crate::workspace::open_store;

/// Runs a `threads` subcommand.
pub async fn run(command: ThreadsCommand) -> anyhow::Result<ExitCode> {
    let (store, checkpointer) = open_store().await?;
    let outcome = command_on(command, checkpointer.as_ref()).await;
    store.close().await;
    outcome
}

async fn command_on(
    command: ThreadsCommand,
    checkpointer: &dyn Checkpointer,
) -> anyhow::Result<ExitCode> {
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
            writeln!(
                out,
                "spent: {}",
                crate::progress::spent_summary(&run.total_spent)
            )?;
        }
        ThreadsCommand::Delete { id } => {
            deepagents::validate_thread_id(&id)?;
            // A run in progress would write on into a thread that no longer exists.
            drop(checkpointer.try_lease(&id).await?);
            if !checkpointer.delete_thread(&id).await? {
                bail!("no thread `{id}`; `deepagents threads list` shows them");
            }
            if let Some(snapshots) = crate::rewind::snapshots() {
                let _ = snapshots.delete_thread(&id);
            }
            writeln!(out, "deleted {id}")?;
        }
        ThreadsCommand::Rewind {
            id,
            turn,
            files_only,
            conversation_only,
            force,
        } => {
            drop(out);
            let options = deepagents::rewind::RewindOptions {
                files: !conversation_only,
                conversation: !files_only,
                force,
            };
            return crate::rewind::command(checkpointer, &id, turn, options).await;
        }
    }
    Ok(ExitCode::SUCCESS)
}
