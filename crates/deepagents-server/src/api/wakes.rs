//! Background tasks that wake their thread: when an async subagent started by a run of a
//! thread ends and the thread is idle, a run is created on it, as `POST /threads/{id}/runs`
//! would (no input: its first step takes the task's answer), so clients see it like any run.
//! A thread that is busy takes the answer in its running run, or gets the run once idle.

use std::sync::{Arc, Weak};
use std::time::Duration;

use serde_json::json;
use tokio::sync::broadcast::error::RecvError;

use super::runs::create_run;
use super::{Shared, Tenant};
use crate::Assistant;

/// How often a busy thread is looked at again for a wake-up it still owes.
const BUSY_RECHECK: Duration = Duration::from_millis(500);

/// Starts a listener per assistant with async subagents, when there is a runtime; each ends
/// with the server.
pub(super) fn start_listeners(shared: &Arc<Shared>) {
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    for assistant in &shared.assistants {
        if let Some(endings) = assistant.agent.background_endings() {
            tokio::spawn(listen(
                Arc::downgrade(shared),
                Arc::clone(assistant),
                endings,
            ));
        }
    }
}

async fn listen(
    weak: Weak<Shared>,
    assistant: Arc<Assistant>,
    mut endings: tokio::sync::broadcast::Receiver<String>,
) {
    loop {
        let storage = match endings.recv().await {
            Ok(storage) => storage,
            // Missed endings stay in the threads: their next run takes them.
            Err(RecvError::Lagged(_)) => continue,
            Err(RecvError::Closed) => return,
        };
        if weak
            .upgrade()
            .is_none_or(|shared| shared.runs.is_stopping())
        {
            return;
        }
        tokio::spawn(wake(weak.clone(), Arc::clone(&assistant), storage));
    }
}

/// Creates the run that wakes the thread stored as `storage` (`tenant:thread`), once it is
/// idle, if it still has endings to take by then.
async fn wake(weak: Weak<Shared>, assistant: Arc<Assistant>, storage: String) {
    let Some((tenant, thread_id)) = storage.split_once(':') else {
        return;
    };
    let Ok(thread) = assistant.agent.thread(storage.as_str()) else {
        return;
    };
    loop {
        let Some(shared) = weak.upgrade() else {
            return;
        };
        if shared.runs.is_stopping() {
            return;
        }
        match shared.runs.busy(tenant, thread_id).await {
            Ok(false) => {}
            // Its running run may take the answer at its next model call; if not, the
            // thread owes a run once idle.
            Ok(true) => {
                drop(shared);
                tokio::time::sleep(BUSY_RECHECK).await;
                continue;
            }
            Err(error) => {
                tracing::warn!(thread_id, detail = %error.detail, "cannot wake a thread");
                return;
            }
        }
        match thread.pending_wake().await {
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(error) => {
                tracing::warn!(thread_id, %error, "cannot wake a thread");
                return;
            }
        }
        let body = json!({
            "assistant_id": assistant.graph_id,
            "metadata": {"woken_by": "background_task"},
        });
        let tenant = Tenant(tenant.to_owned());
        match create_run(&shared, &tenant, thread_id, body, false).await {
            Ok(run) => {
                tracing::info!(run_id = %run.run_id, thread_id, "a background task woke its thread")
            }
            Err(error) => tracing::warn!(
                thread_id,
                status = %error.status,
                detail = %error.detail,
                "the run a background task's ending asked for was refused; the thread's next run takes the answer"
            ),
        }
        return;
    }
}
