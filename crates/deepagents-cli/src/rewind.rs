//! Rewind in the CLI: a snapshot before every user turn of a thread (the TUI, `run
//! --thread`), `deepagents threads rewind` and the TUI's `/rewind`, all on
//! [`deepagents::rewind::Snapshots`] kept in `snapshots/` of the data directory.
//!
//! `DEEPAGENTS_REWIND=off` takes no snapshots; `DEEPAGENTS_REWIND_CAP_MB` bounds each
//! thread's snapshots (default 512 MiB; the oldest go first).

use std::io::Write as _;
use std::path::Path;
use std::process::ExitCode;

use deepagents::rewind::{RewindError, RewindOptions, Snapshots, next_turn, turns};
use deepagents::{Checkpointer, Thread};

/// The snapshots of the CLI's threads; `None` when turned off or without a data directory.
pub fn snapshots() -> Option<Snapshots> {
    if std::env::var("DEEPAGENTS_REWIND").is_ok_and(|v| v == "off" || v == "0") {
        return None;
    }
    let dir = crate::workspace::data_dir().ok()?.join("snapshots");
    let mut snapshots = Snapshots::new(dir);
    if let Some(mb) = std::env::var("DEEPAGENTS_REWIND_CAP_MB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        snapshots = snapshots.with_cap(mb.saturating_mul(1024 * 1024));
    }
    Some(snapshots)
}

/// Takes the snapshot before a user message `text` is sent on `thread`; returns the turn it
/// starts. A snapshot that cannot be taken is a warning, not a failed turn.
pub async fn before_turn(thread: &Thread, root: Option<&Path>, text: &str) -> Option<u64> {
    let snapshots = snapshots()?;
    let state = thread.state().await.ok()?;
    let turn = next_turn(state.as_ref());
    let files = state.map(|run| run.state.files).unwrap_or_default();
    let (id, root, text) = (
        thread.id().to_owned(),
        root.map(Path::to_path_buf),
        text.to_owned(),
    );
    let taken = tokio::task::spawn_blocking(move || {
        snapshots.record(&id, turn, &text, root.as_deref(), &files)
    })
    .await;
    match taken {
        Ok(Ok(_)) => Some(turn),
        Ok(Err(e)) => {
            eprintln!("warning: no snapshot of this turn, so it cannot be rewound: {e}");
            None
        }
        Err(_) => None,
    }
}

/// Records what turn `turn` of `thread` left when its run ended.
pub async fn after_turn(thread: &Thread, turn: Option<u64>, root: Option<&Path>) {
    let (Some(turn), Some(snapshots)) = (turn, snapshots()) else {
        return;
    };
    let Ok(Some(run)) = thread.state().await else {
        return;
    };
    let (id, root) = (thread.id().to_owned(), root.map(Path::to_path_buf));
    let _ = tokio::task::spawn_blocking(move || {
        snapshots.record_after(&id, turn, root.as_deref(), &run.state.files)
    })
    .await;
}

/// The turns of `thread` one can rewind to, a line each: `N  message` (`(conversation
/// only)` when the files have no snapshot).
pub async fn listing(checkpointer: &dyn Checkpointer, thread: &str) -> anyhow::Result<String> {
    let Some(run) = checkpointer.load(thread, None).await? else {
        anyhow::bail!("thread `{thread}` has no turns yet");
    };
    let recorded: Vec<u64> = snapshots()
        .and_then(|s| s.list(thread).ok())
        .unwrap_or_default()
        .iter()
        .map(|s| s.turn)
        .collect();
    let mut lines = Vec::new();
    for (turn, preview) in turns(&run) {
        let files = if recorded.contains(&turn) {
            ""
        } else {
            "  (conversation only)"
        };
        lines.push(format!("{turn:>3}  {preview}{files}"));
    }
    if lines.is_empty() {
        anyhow::bail!("thread `{thread}` has no turns yet");
    }
    Ok(lines.join("\n"))
}

/// Rewinds `thread` to before turn `turn`; the files go back to the root their snapshot was
/// taken in.
pub async fn rewind(
    checkpointer: &dyn Checkpointer,
    thread: &str,
    turn: u64,
    options: RewindOptions,
) -> Result<Vec<String>, RewindError> {
    let snapshots = snapshots().ok_or_else(|| {
        RewindError::Io(
            "snapshots are off (DEEPAGENTS_REWIND=off) or have no data directory".into(),
        )
    })?;
    let report = snapshots
        .rewind(checkpointer, thread, turn, None, options)
        .await?;
    Ok(report.lines())
}

/// `deepagents threads rewind THREAD TURN [--files-only|--conversation-only] [--force]`.
pub async fn command(
    checkpointer: &dyn Checkpointer,
    thread: &str,
    turn: Option<u64>,
    options: RewindOptions,
) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    let Some(turn) = turn else {
        writeln!(out, "{}", listing(checkpointer, thread).await?)?;
        return Ok(ExitCode::SUCCESS);
    };
    match rewind(checkpointer, thread, turn, options).await {
        Ok(lines) => {
            for line in lines {
                writeln!(out, "{line}")?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(RewindError::Conflicts(paths)) => {
            eprintln!(
                "error: these files were changed by hand since the snapshot of turn {turn}; nothing was changed. Pass --force to overwrite them:"
            );
            for path in paths {
                eprintln!("  {path}");
            }
            Ok(ExitCode::FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}
