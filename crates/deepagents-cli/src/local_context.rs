//! The local-context prompt section: where the agent works, as a terminal agent should know.

use std::path::Path;
use std::process::Command;

use async_trait::async_trait;
use deepagents::middleware::{Middleware, MiddlewareError};
use deepagents::{AgentState, ModelRequest, RunContext};

/// Tells the model about its surroundings: the working directory, the git branch and a
/// summary of uncommitted changes, the OS and today's date. The section is computed once per
/// process, so every request of a session carries the same text (cacheable).
pub struct LocalContext {
    section: String,
}

impl LocalContext {
    /// The context of `root`, the workspace directory; `virtual_mode` tells whether file
    /// paths are confined to it (it is then file path `/`) or are the host's own.
    pub fn new(root: &Path, virtual_mode: bool) -> Self {
        let root = root.canonicalize().unwrap_or_else(|_| root.to_owned());
        let paths = if virtual_mode {
            "file path `/`; the shell starts there"
        } else {
            "the shell starts there; file paths are the host's own"
        };
        let mut section = format!(
            "## Environment\n- Working directory: `{}` ({paths})",
            root.display()
        );
        if let Some(git) = git_summary(&root) {
            section.push_str(&format!("\n- Git: {git}"));
        }
        section.push_str(&format!(
            "\n- OS: {} {}\n- Date: {}",
            std::env::consts::OS,
            std::env::consts::ARCH,
            today()
        ));
        Self { section }
    }
}

#[async_trait]
impl Middleware for LocalContext {
    fn name(&self) -> &str {
        "local_context"
    }

    async fn before_model(
        &self,
        _ctx: &RunContext,
        request: &mut ModelRequest,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        request.push_system_section(&self.section);
        Ok(())
    }
}

/// `branch `main`, 2 changed and 1 untracked file(s)`, or `None` outside a repository or
/// without git.
fn git_summary(root: &Path) -> Option<String> {
    let git = |args: &[&str]| {
        let output = Command::new("git")
            .arg("-C")
            .arg(root)
            .args(args)
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let branch = git(&["rev-parse", "--abbrev-ref", "HEAD"])
        .or_else(|| git(&["symbolic-ref", "--short", "HEAD"]))?;
    let branch = branch.trim();
    let status = git(&["status", "--porcelain"]).unwrap_or_default();
    let untracked = status.lines().filter(|l| l.starts_with("??")).count();
    let changed = status.lines().count() - untracked;
    Some(if changed + untracked == 0 {
        format!("branch `{branch}`, no uncommitted changes")
    } else {
        format!("branch `{branch}`, {changed} changed and {untracked} untracked file(s)")
    })
}

/// Today's date (UTC) as `YYYY-MM-DD`.
fn today() -> String {
    let days = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400);
    let (year, month, day) = civil_from_days(i64::try_from(days).unwrap_or(0));
    format!("{year:04}-{month:02}-{day:02}")
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let month = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    #[test]
    fn civil_dates() {
        assert_eq!(super::civil_from_days(0), (1970, 1, 1));
        assert_eq!(super::civil_from_days(20_788), (2026, 12, 1));
        assert_eq!(super::civil_from_days(11_016), (2000, 2, 29));
    }
}
