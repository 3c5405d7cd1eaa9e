//! What the server keeps besides checkpoints — threads' metadata and status, runs — in the
//! same [`Store`] as long-term memory, under namespaces of the tenant (`server.<tenant>.…`), so
//! an embedded SQLite server and a PostgreSQL one keep them alike.

use std::sync::Arc;

use deepagents::backends::Store;
use deepagents::backends::store::{SearchQuery, StoreItem};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};

/// A thread as the API shows it, less its values (read from its checkpoints).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ThreadRecord {
    /// Its id.
    pub thread_id: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
    /// What the client attached.
    pub metadata: Value,
    /// `idle`, `busy`, `interrupted` or `error`.
    pub status: String,
    /// Where the thread was forked: each checkpoint that restored an earlier one (a run
    /// started from a `checkpoint`, to edit or regenerate), with the checkpoint it restored —
    /// its parent in the history, so clients see the branch.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub forks: std::collections::BTreeMap<u64, u64>,
}

impl ThreadRecord {
    /// How the messages of the thread's state at checkpoint `at` are named: by position,
    /// with the forks on the way to that state, oldest first (see
    /// [`MessageIds`](deepagents_langgraph::convert::MessageIds)). The latest fork at or
    /// before a checkpoint made its state, and the state that fork restored came the same way.
    pub fn message_ids(
        &self,
        checkpoints: &[deepagents::core::CheckpointInfo],
        mut at: u64,
    ) -> deepagents_langgraph::convert::MessageIds {
        let mut forks = Vec::new();
        while let Some((&fork, &restored)) = self.forks.range(..=at).next_back() {
            let kept = checkpoints
                .iter()
                .find(|checkpoint| checkpoint.id == fork)
                .map_or(0, |checkpoint| checkpoint.messages);
            forks.push((kept, fork));
            at = restored;
        }
        forks.reverse();
        deepagents_langgraph::convert::MessageIds::new(forks)
    }

    /// How the messages of the thread's latest state are named, its checkpoints read from
    /// `checkpointer` (under the storage id `storage`) only when the thread was ever forked.
    pub async fn head_message_ids(
        &self,
        checkpointer: &dyn deepagents::core::Checkpointer,
        storage: &str,
    ) -> Result<deepagents_langgraph::convert::MessageIds, deepagents::core::CheckpointError> {
        if self.forks.is_empty() {
            return Ok(deepagents_langgraph::convert::MessageIds::default());
        }
        let checkpoints = checkpointer.checkpoints(storage).await?;
        let head = checkpoints.last().map_or(0, |latest| latest.id);
        Ok(self.message_ids(&checkpoints, head))
    }
}

/// A run as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunRecord {
    /// Its id.
    pub run_id: String,
    /// Its thread.
    pub thread_id: String,
    /// The assistant it runs.
    pub assistant_id: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
    /// `pending`, `running`, `success`, `error`, `timeout` or `interrupted`.
    pub status: String,
    /// What the client attached.
    pub metadata: Value,
    /// What it does when its thread is busy: `reject`, `enqueue`, `interrupt`, `rollback`.
    pub multitask_strategy: String,
    /// The payload it was created with.
    #[serde(default)]
    pub kwargs: Value,
    /// Why it failed (`{error, message}`), once it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    /// A stateless run's final values (its thread is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<Value>,
    /// The server running it, in a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// Why the model ended the run's answer, once it finished: `max_tokens` means the answer
    /// was cut at the output limit and is not whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
}

impl RunRecord {
    /// Whether the run is over.
    pub fn ended(&self) -> bool {
        !matches!(self.status.as_str(), "pending" | "running")
    }
}

fn threads_ns(tenant: &str) -> Vec<String> {
    vec!["server".into(), tenant.into(), "threads".into()]
}

fn runs_ns(tenant: &str, thread_id: &str) -> Vec<String> {
    vec![
        "server".into(),
        tenant.into(),
        "runs".into(),
        thread_id.into(),
    ]
}

/// The records of one tenant.
#[derive(Clone)]
pub struct Records {
    store: Arc<dyn Store>,
    tenant: String,
}

impl Records {
    /// Records of `tenant` in `store`.
    pub fn new(store: Arc<dyn Store>, tenant: &str) -> Self {
        Self {
            store,
            tenant: tenant.to_owned(),
        }
    }

    /// Thread `id`, when it exists.
    pub async fn thread(&self, id: &str) -> ApiResult<Option<ThreadRecord>> {
        let item = self.store.get(&threads_ns(&self.tenant), id).await?;
        item.map(|item| serde_json::from_value(item.value).map_err(ApiError::internal))
            .transpose()
    }

    /// Thread `id`, or a 404.
    pub async fn existing_thread(&self, id: &str) -> ApiResult<ThreadRecord> {
        self.thread(id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("thread `{id}`")))
    }

    /// Writes `thread`.
    pub async fn put_thread(&self, thread: &ThreadRecord) -> ApiResult<()> {
        let value = serde_json::to_value(thread).map_err(ApiError::internal)?;
        self.store
            .put(&threads_ns(&self.tenant), &thread.thread_id, value)
            .await?;
        Ok(())
    }

    /// Sets thread `id`'s status (a thread deleted meanwhile stays deleted), in one write
    /// that keeps whatever else changed in the record meanwhile; the thread as saved.
    pub async fn set_thread_status(
        &self,
        id: &str,
        status: &str,
    ) -> ApiResult<Option<ThreadRecord>> {
        let patch = json!({
            "status": status,
            "updated_at": crate::time::rfc3339(crate::time::now_ms()),
        });
        let item = self
            .store
            .merge(&threads_ns(&self.tenant), id, &patch)
            .await?;
        item.map(|item| serde_json::from_value(item.value).map_err(ApiError::internal))
            .transpose()
    }

    /// Every thread of the tenant.
    pub async fn threads(&self) -> ApiResult<Vec<ThreadRecord>> {
        let items = all(&*self.store, &threads_ns(&self.tenant)).await?;
        Ok(items
            .into_iter()
            .filter_map(|value| serde_json::from_value(value).ok())
            .collect())
    }

    /// Removes thread `id`, and its runs unless `keep_runs` (a stateless run's record
    /// outlives its thread, for whoever waits on it).
    pub async fn delete_thread(&self, id: &str, keep_runs: bool) -> ApiResult<bool> {
        if !keep_runs {
            for run in self.runs(id).await? {
                self.store
                    .delete(&runs_ns(&self.tenant, id), &run.run_id)
                    .await?;
            }
        }
        Ok(self.store.delete(&threads_ns(&self.tenant), id).await?)
    }

    /// Run `run_id` of thread `thread_id`.
    pub async fn run(&self, thread_id: &str, run_id: &str) -> ApiResult<Option<RunRecord>> {
        let item = self
            .store
            .get(&runs_ns(&self.tenant, thread_id), run_id)
            .await?;
        item.map(|item| serde_json::from_value(item.value).map_err(ApiError::internal))
            .transpose()
    }

    /// Writes `run`.
    pub async fn put_run(&self, run: &RunRecord) -> ApiResult<()> {
        let value = serde_json::to_value(run).map_err(ApiError::internal)?;
        self.store
            .put(&runs_ns(&self.tenant, &run.thread_id), &run.run_id, value)
            .await?;
        Ok(())
    }

    /// Removes a run's record.
    pub async fn delete_run(&self, thread_id: &str, run_id: &str) -> ApiResult<()> {
        self.store
            .delete(&runs_ns(&self.tenant, thread_id), run_id)
            .await?;
        Ok(())
    }

    /// The runs of thread `thread_id`, newest first.
    pub async fn runs(&self, thread_id: &str) -> ApiResult<Vec<RunRecord>> {
        let items = all(&*self.store, &runs_ns(&self.tenant, thread_id)).await?;
        let mut runs: Vec<RunRecord> = items
            .into_iter()
            .filter_map(|value| serde_json::from_value(value).ok())
            .collect();
        runs.sort_by(|a, b| {
            b.created_at
                .cmp(&a.created_at)
                .then(b.run_id.cmp(&a.run_id))
        });
        Ok(runs)
    }
}

/// Every item whose namespace starts with `prefix`, page by page.
pub async fn all_under(store: &dyn Store, prefix: &[String]) -> ApiResult<Vec<StoreItem>> {
    let mut items = Vec::new();
    loop {
        let page = store
            .search(
                prefix,
                &SearchQuery {
                    offset: items.len(),
                    limit: 500,
                    ..SearchQuery::default()
                },
            )
            .await?;
        let full = page.len() == 500;
        items.extend(page);
        if !full {
            return Ok(items);
        }
    }
}

/// Every value directly in `namespace`.
async fn all(store: &dyn Store, namespace: &[String]) -> ApiResult<Vec<Value>> {
    Ok(all_under(store, namespace)
        .await?
        .into_iter()
        .filter(|item| item.namespace == namespace)
        .map(|item| item.value)
        .collect())
}
