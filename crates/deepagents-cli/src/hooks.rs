//! Which `hooks.json` files a run uses: the user's (`~/.deepagents/hooks.json`), the
//! project's (`.deepagents/hooks.json` in the root, only when trusted: it runs commands
//! someone else may have written), then each `--hooks FILE`, all of them, in that order.

use std::io::{BufRead, IsTerminal as _, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use deepagents::core::ToolCall;
use deepagents::middleware::{HookApprover, Hooks};

/// The hooks of a run in `root`, and the notes to print about files skipped. Calls a hook
/// asks about go to `approver`; without one they do not run.
pub fn load(
    root: &Path,
    files: &[PathBuf],
    trust_project: bool,
    approver: Option<Arc<dyn HookApprover>>,
) -> anyhow::Result<(Hooks, Vec<String>)> {
    let mut hooks = Hooks::default();
    let mut notes = Vec::new();
    let user = std::env::var_os("HOME").map(|home| Path::new(&home).join(".deepagents/hooks.json"));
    if let Some(user) = user.filter(|path| path.is_file()) {
        hooks = hooks.merge(Hooks::load(&user)?);
    }
    let project = root.join(".deepagents/hooks.json");
    if project.is_file() {
        if trust_project {
            hooks = hooks.merge(Hooks::load(&project)?);
        } else {
            notes.push(format!(
                "note: the project's hooks ({}) were not run: they run commands from the project; pass --trust-project to run them",
                project.display()
            ));
        }
    }
    for file in files {
        hooks = hooks.merge(Hooks::load(file)?);
    }
    let hooks = match approver {
        Some(approver) => hooks.approver(approver),
        None => hooks,
    };
    Ok((hooks.in_dir(root), notes))
}

/// Who decides a hook's `ask` in a headless run: `--auto-approve` says yes, else the person
/// at the terminal when stdin is one, else nobody.
pub fn headless_approver(auto_approve: bool) -> Option<Arc<dyn HookApprover>> {
    if auto_approve {
        Some(always())
    } else if std::io::stdin().is_terminal() {
        Some(Arc::new(Approve::OnTerminal))
    } else {
        None
    }
}

/// An approver that says yes (`--auto-approve`).
pub fn always() -> Arc<dyn HookApprover> {
    Arc::new(Approve::Always)
}

/// Who decides the calls a hook asks about.
enum Approve {
    /// `--auto-approve`.
    Always,
    /// The person at the terminal.
    OnTerminal,
}

#[async_trait::async_trait]
impl HookApprover for Approve {
    async fn approve(&self, call: &ToolCall, reason: &str) -> bool {
        match self {
            Self::Always => true,
            Self::OnTerminal => {
                let (call, reason) = (call.clone(), reason.to_owned());
                crate::approvals::ask_on_terminal(move |input, out| ask(&call, &reason, input, out))
                    .await
                    .unwrap_or(false)
            }
        }
    }
}

/// Asks whether `call` may run; only `y` or `yes` approves (the end of input does not).
fn ask(
    call: &ToolCall,
    reason: &str,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> std::io::Result<bool> {
    writeln!(
        out,
        "\nA hook asks you to approve {} {}\n  {reason}",
        call.name, call.arguments
    )?;
    write!(out, "Run it? [y/N]: ")?;
    out.flush()?;
    let mut line = String::new();
    input.read_line(&mut line)?;
    Ok(matches!(
        line.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_yes_approves() {
        let call = ToolCall {
            id: "c".into(),
            name: "execute".into(),
            arguments: serde_json::json!({"command": "make deploy"}),
        };
        for (typed, approved) in [
            ("y\n", true),
            ("YES\n", true),
            ("n\n", false),
            ("\n", false),
            ("", false),
        ] {
            let mut out = Vec::new();
            assert_eq!(
                ask(&call, "deploys", &mut typed.as_bytes(), &mut out).ok(),
                Some(approved),
                "{typed:?}"
            );
            let shown = String::from_utf8_lossy(&out);
            assert!(
                shown.contains("make deploy") && shown.contains("deploys"),
                "{shown}"
            );
        }
    }
}
