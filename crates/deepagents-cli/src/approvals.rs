//! Asking the person at the terminal to approve tool calls.

use std::io::{BufRead as _, IsTerminal as _, Write as _};

use deepagents::{Decision, DecisionKind, InterruptConfig, PendingAction};

/// Shell commands ask first.
pub fn execute_config() -> InterruptConfig {
    InterruptConfig {
        allowed: vec![
            DecisionKind::Approve,
            DecisionKind::Reject,
            DecisionKind::Respond,
        ],
        description: Some("A shell command wants to run.".to_owned()),
        predicate: None,
    }
}

const NOT_INTERACTIVE: &str = "This call needs approval and nobody can approve it here (the run is not interactive). Do without it, or ask the user to rerun interactively or with --auto-approve.";

/// One decision per action: asked on the terminal, or refused when stdin is not a terminal.
pub fn ask(actions: &[PendingAction]) -> anyhow::Result<Vec<Decision>> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Ok(actions
            .iter()
            .map(|_| Decision::Reject {
                message: Some(NOT_INTERACTIVE.to_owned()),
            })
            .collect());
    }
    let mut decisions = Vec::with_capacity(actions.len());
    let mut stderr = std::io::stderr();
    for action in actions {
        let shown = describe(action);
        writeln!(stderr, "\n{}{}: {shown}", origin(action), action.name)?;
        if let Some(description) = &action.description {
            writeln!(stderr, "  {description}")?;
        }
        let decision = loop {
            write!(stderr, "  approve? [y]es / [n]o / [r]espond instead: ")?;
            stderr.flush()?;
            let mut line = String::new();
            if stdin.lock().read_line(&mut line)? == 0 {
                break Decision::Reject {
                    message: Some(NOT_INTERACTIVE.to_owned()),
                };
            }
            match line.trim() {
                "y" | "yes" | "" => break Decision::Approve,
                "n" | "no" => {
                    write!(stderr, "  reason (optional): ")?;
                    stderr.flush()?;
                    let mut reason = String::new();
                    stdin.lock().read_line(&mut reason)?;
                    let reason = reason.trim();
                    break Decision::Reject {
                        message: (!reason.is_empty()).then(|| reason.to_owned()),
                    };
                }
                "r" | "respond" => {
                    write!(stderr, "  answer for the agent: ")?;
                    stderr.flush()?;
                    let mut answer = String::new();
                    stdin.lock().read_line(&mut answer)?;
                    break Decision::Respond {
                        message: answer.trim().to_owned(),
                    };
                }
                _ => continue,
            }
        };
        decisions.push(decision);
    }
    Ok(decisions)
}

/// Which subagent asks, for calls made inside one: "[general-purpose] ", nested ones joined
/// with " › ".
fn origin(action: &PendingAction) -> String {
    // The path alternates task call ids and subagent names.
    let names: Vec<&str> = action
        .path
        .iter()
        .skip(1)
        .step_by(2)
        .map(String::as_str)
        .collect();
    if names.is_empty() {
        String::new()
    } else {
        format!("[{}] ", names.join(" › "))
    }
}

/// What the person should see: the command for `execute`, a diff for edits, the content for
/// writes, the arguments otherwise.
fn describe(action: &PendingAction) -> String {
    let arg = |name: &str| action.arguments.get(name).and_then(|v| v.as_str());
    match action.name.as_str() {
        "execute" => format!("$ {}", arg("command").unwrap_or_default()),
        "edit_file" => {
            let mut out = format!("{}\n", arg("file_path").unwrap_or_default());
            for line in arg("old_string").unwrap_or_default().lines() {
                out.push_str(&format!("  - {line}\n"));
            }
            for line in arg("new_string").unwrap_or_default().lines() {
                out.push_str(&format!("  + {line}\n"));
            }
            out
        }
        "write_file" => {
            let content = arg("content").unwrap_or_default();
            let mut out = format!(
                "{} ({} lines)\n",
                arg("file_path").unwrap_or_default(),
                content.lines().count()
            );
            for line in content.lines().take(20) {
                out.push_str(&format!("  + {line}\n"));
            }
            out
        }
        _ => action.arguments.to_string(),
    }
}
