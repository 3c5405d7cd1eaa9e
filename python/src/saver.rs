//! A checkpointer written in Python: LangGraph's checkpoint savers (`SqliteSaver`,
//! `PostgresSaver`, `InMemorySaver` and the rest of `BaseCheckpointSaver`) keep the agent's
//! threads, so the user's saver holds them where the user looks (each checkpoint's
//! `messages`, `todos` and `files` channels), and a thread the saver already held — one
//! LangGraph's deepagents wrote — continues here. The package's adapter
//! (`deepagents_rs._backends.LangGraphSaverAdapter`) answers every operation as JSON:
//! `{"ok": …}` or `{"error": "…"}`.

use std::sync::Arc;

use async_trait::async_trait;
use deepagents::core::checkpoint::CHILD_THREAD_SEPARATOR;
use deepagents::core::{
    CheckpointError, CheckpointInfo, Checkpointer, LocalLeases, Run, RunDelta, ThreadInfo,
    ThreadLease,
};
use pyo3::prelude::*;
use serde_json::{Value, json};

/// The adapter around a Python checkpoint saver.
pub struct PyCheckpointer {
    pub adapter: Arc<Py<PyAny>>,
    /// Leases are this process's: a LangGraph saver has no lease of its own.
    pub leases: LocalLeases,
}

impl PyCheckpointer {
    /// Runs `op` on the Python object, on a blocking-pool thread.
    async fn call(&self, op: &'static str, args: Value) -> Result<Value, CheckpointError> {
        crate::call_adapter(&self.adapter, op, args)
            .await
            .and_then(crate::adapter_ok)
            .map_err(|why| CheckpointError::Storage(format!("the Python saver's {op}: {why}")))
    }
}

fn storage(what: &str, error: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Storage(format!(
        "the Python saver gave an unreadable {what}: {error}"
    ))
}

#[async_trait]
impl Checkpointer for PyCheckpointer {
    async fn append(
        &self,
        thread_id: &str,
        _delta: &RunDelta,
        run: &Run,
    ) -> Result<u64, CheckpointError> {
        // Each checkpoint holds the whole run: a LangGraph saver reads one checkpoint at a
        // time, and its channels show the thread as it is.
        let full = serde_json::to_string(&RunDelta::full(run)).map_err(|e| storage("run", e))?;
        let values = deepagents_langgraph::convert::values(run, "");
        let answer = self
            .call(
                "append",
                json!({"thread_id": thread_id, "run": full, "values": values}),
            )
            .await?;
        answer
            .as_u64()
            .ok_or_else(|| storage("checkpoint id", &answer))
    }

    async fn load(&self, thread_id: &str, at: Option<u64>) -> Result<Option<Run>, CheckpointError> {
        let answer = self
            .call("load", json!({"thread_id": thread_id, "at": at}))
            .await?;
        if answer.is_null() {
            return Ok(None);
        }
        if let Some(full) = answer.get("run").and_then(Value::as_str) {
            let delta = RunDelta::decode(full)?;
            let mut run = Run::default();
            delta.apply(&mut run);
            return Ok(Some(run));
        }
        // A thread LangGraph's deepagents wrote: its values are the state.
        let values = answer.get("values").cloned().unwrap_or(Value::Null);
        let mut run = Run::default();
        deepagents_langgraph::convert::apply_values(&mut run, &values)
            .map_err(|e| storage("thread", e))?;
        Ok(Some(run))
    }

    async fn checkpoints(&self, thread_id: &str) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        let answer = self
            .call("checkpoints", json!({"thread_id": thread_id}))
            .await?;
        serde_json::from_value(answer).map_err(|e| storage("checkpoint list", e))
    }

    async fn threads(&self) -> Result<Vec<ThreadInfo>, CheckpointError> {
        let answer = self.call("threads", json!({})).await?;
        let mut threads: Vec<ThreadInfo> =
            serde_json::from_value(answer).map_err(|e| storage("thread list", e))?;
        threads.retain(|t| !t.thread_id.contains(CHILD_THREAD_SEPARATOR));
        threads.sort_by_key(|t| std::cmp::Reverse(t.updated_at_ms));
        Ok(threads)
    }

    async fn try_lease(&self, thread_id: &str) -> Result<ThreadLease, CheckpointError> {
        self.leases.try_lease(thread_id)
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        let answer = self
            .call("delete_thread", json!({"thread_id": thread_id}))
            .await?;
        Ok(answer.as_bool().unwrap_or(false))
    }
}
