//! Why a run stopped without an answer.

use std::fmt;

use deepagents_core::event::ErrorKind;
use deepagents_core::{ModelError, Run, StateError, TurnLimitReached};

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// The turn limit was reached.
    #[error(transparent)]
    TurnLimit(#[from] TurnLimitReached),
    /// The model call failed (after whatever retries middleware made).
    #[error("model call failed: {0}")]
    Model(#[from] ModelError),
    /// A tool reported an error the model cannot fix.
    #[error("tool `{tool}` failed fatally: {message}")]
    ToolFatal {
        /// The tool.
        tool: String,
        /// Its message.
        message: String,
    },
    /// A middleware hook failed.
    #[error("middleware `{middleware}` failed: {error}")]
    Middleware {
        /// The middleware's name.
        middleware: String,
        /// What it reported, with its cause.
        #[source]
        error: crate::middleware::MiddlewareError,
    },
    /// A state update could not be merged.
    #[error(transparent)]
    State(#[from] StateError),
    /// Decisions that do not fit the pending actions.
    #[error("invalid decisions: {0}")]
    InvalidDecision(String),
    /// Decisions given for a pause the run does not wait in: one decided already, or an id
    /// that names no pause of it (see [`pause_id`](crate::approval::pause_id)). Nothing was
    /// changed; whoever decided should look at what waits now.
    #[error("{}", stale_pause(given, current.as_deref()))]
    StalePause {
        /// The pause the decisions were given for.
        given: String,
        /// The pause the run waits in now; `None` when it waits for no decision.
        current: Option<String>,
    },
    /// A run of [`Input::Wake`](crate::Input::Wake) found no background task's ending for
    /// the thread to take; nothing ran.
    #[error("no background task's ending waits for this thread, so there is no turn to run")]
    NothingToWake,
    /// The run could not be checkpointed.
    #[error("checkpoint failed: {0}")]
    Checkpoint(deepagents_core::CheckpointError),
    /// The run's cancellation token fired.
    #[error("the run was cancelled")]
    Cancelled,
    /// The next model call would have gone past the run's spend cap, so it was not made; the
    /// run is saved as it was and resumes with a higher cap.
    #[error("{0}")]
    SpendCap(deepagents_core::SpendCapReached),
    /// The driver itself crashed; this is a bug in deepagents.
    #[error("the agent driver crashed (a bug; please report it): {0}")]
    Crashed(String),
}

impl RunError {
    /// The kind of failure, for events and exit reporting.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::TurnLimit(_) => ErrorKind::TurnLimit,
            Self::Model(_) => ErrorKind::Model,
            Self::ToolFatal { .. } => ErrorKind::ToolFatal,
            Self::Middleware { .. } => ErrorKind::Middleware,
            Self::State(_) => ErrorKind::State,
            Self::Checkpoint(_) => ErrorKind::Checkpoint,
            // The input does not fit the thread as it stands (never an event: nothing ran).
            Self::InvalidDecision(_) | Self::StalePause { .. } | Self::NothingToWake => {
                ErrorKind::InvalidDecision
            }
            Self::Cancelled => ErrorKind::Cancelled,
            Self::Crashed(_) => ErrorKind::Crashed,
            Self::SpendCap(_) => ErrorKind::SpendCap,
        }
    }
}

/// What [`RunError::StalePause`] says: which interrupt is pending now, and to look again.
fn stale_pause(given: &str, current: Option<&str>) -> String {
    match current {
        Some(current) => format!(
            "the decisions answer interrupt `{given}`, but interrupt `{current}` is pending now; nothing was applied: re-read the thread state and decide what it waits on now"
        ),
        None => format!(
            "the decisions answer interrupt `{given}`, but no interrupt is pending now (the thread waits for no decision); nothing was applied: re-read the thread state"
        ),
    }
}

/// A run that stopped on an error, with everything it had done up to then.
#[derive(Debug)]
pub struct RunFailure {
    /// Why it stopped.
    pub error: RunError,
    /// The run as it stood: persist it, inspect it, or resume it.
    pub run: Box<Run>,
}

impl fmt::Display for RunFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for RunFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}
