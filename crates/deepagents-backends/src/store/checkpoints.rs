//! Checkpoints in SQLite: a delta per step, a snapshot every 50 (only the newest kept).

use async_trait::async_trait;
use deepagents_core::checkpoint::CHILD_THREAD_SEPARATOR;
use deepagents_core::{
    CheckpointError, CheckpointInfo, Checkpointer, Run, RunDelta, ThreadInfo, ThreadLease,
};
use sqlx::Row;

use super::SqliteStore;
use super::file_lock;
use super::sqlite::Leases;
use crate::memory::now_ms;

/// How often a checkpoint also stores the whole run.
const SNAPSHOT_EVERY: i64 = 50;

/// A [`Checkpointer`] in the database of a [`SqliteStore`]. Each step writes only its delta,
/// so a step's cost does not grow with the conversation; every 50th checkpoint also holds the
/// whole run, so loading the latest state replays at most 49 deltas. Only the newest snapshot
/// is kept (an older checkpoint loads by replaying from the start), so storage grows linearly.
#[derive(Clone, Debug)]
pub struct SqliteCheckpointer {
    store: SqliteStore,
}

impl SqliteStore {
    /// Checkpoints kept in this store's database.
    pub fn checkpointer(&self) -> SqliteCheckpointer {
        SqliteCheckpointer {
            store: self.clone(),
        }
    }
}

fn storage(error: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Storage(error.to_string())
}

impl SqliteCheckpointer {
    /// Appends `delta` as the thread's next checkpoint; with `new_thread`, refuses a thread
    /// that already has checkpoints. One write transaction, so the check holds at the insert.
    async fn write(
        &self,
        thread_id: &str,
        delta: &RunDelta,
        run: &Run,
        new_thread: bool,
    ) -> Result<u64, CheckpointError> {
        let delta_json = serde_json::to_string(delta).map_err(storage)?;
        // IMMEDIATE takes the write lock up front. Should the caller be cancelled mid-way, the
        // guard closes the connection, which ends the transaction and frees the lock.
        let mut guard = super::sqlite::WriteConnection::acquire(&self.store.pool)
            .await
            .map_err(storage)?;
        let conn = guard.conn().map_err(storage)?;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .map_err(storage)?;
        let written = async {
            let last: i64 = sqlx::query_scalar(
                "SELECT COALESCE(MAX(id), 0) FROM checkpoints WHERE thread_id = ?1",
            )
            .bind(thread_id)
            .fetch_one(&mut *conn)
            .await
            .map_err(storage)?;
            if new_thread && last > 0 {
                return Err(CheckpointError::AlreadyExists {
                    thread_id: thread_id.to_owned(),
                });
            }
            let id = last + 1;
            let snapshot = if id % SNAPSHOT_EVERY == 0 {
                Some(deepagents_core::checkpoint::encode_snapshot(run)?)
            } else {
                None
            };
            let snapshot_written = snapshot.is_some();
            sqlx::query(
                "INSERT INTO checkpoints (thread_id, id, delta, snapshot, created_at_ms, messages)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .bind(thread_id)
            .bind(id)
            .bind(&delta_json)
            .bind(snapshot)
            .bind(i64::try_from(now_ms()).unwrap_or(i64::MAX))
            .bind(i64::try_from(run.state.messages.len()).unwrap_or(i64::MAX))
            .execute(&mut *conn)
            .await
            .map_err(storage)?;
            if snapshot_written {
                // Only the newest snapshot is kept: older checkpoints load by replaying deltas
                // from the start, and storage stays linear in the conversation's length.
                sqlx::query(
                    "UPDATE checkpoints SET snapshot = NULL
                     WHERE thread_id = ?1 AND id < ?2 AND snapshot IS NOT NULL",
                )
                .bind(thread_id)
                .bind(id)
                .execute(&mut *conn)
                .await
                .map_err(storage)?;
            }
            Ok::<i64, CheckpointError>(id)
        }
        .await;
        let end = if written.is_ok() {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        sqlx::query(end)
            .execute(&mut *conn)
            .await
            .map_err(storage)?;
        guard.done();
        Ok(u64::try_from(written?).unwrap_or(0))
    }
}

#[async_trait]
impl Checkpointer for SqliteCheckpointer {
    async fn append(
        &self,
        thread_id: &str,
        delta: &RunDelta,
        run: &Run,
    ) -> Result<u64, CheckpointError> {
        self.write(thread_id, delta, run, false).await
    }

    /// Checks that the thread is absent and writes its first checkpoint in one transaction,
    /// so two creations (forks) of the same id cannot both succeed.
    async fn create(&self, thread_id: &str, run: &Run) -> Result<u64, CheckpointError> {
        self.write(thread_id, &RunDelta::full(run), run, true).await
    }

    async fn load(&self, thread_id: &str, at: Option<u64>) -> Result<Option<Run>, CheckpointError> {
        let pool = &self.store.pool;
        let last: i64 =
            sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM checkpoints WHERE thread_id = ?1")
                .bind(thread_id)
                .fetch_one(pool)
                .await
                .map_err(storage)?;
        if last == 0 {
            return Ok(None);
        }
        let target = match at {
            None => last,
            Some(at) => {
                let at = i64::try_from(at).unwrap_or(i64::MAX);
                if at < 1 || at > last {
                    return Err(CheckpointError::NotFound {
                        what: format!("{at} in thread `{thread_id}` (it has 1 to {last})"),
                    });
                }
                at
            }
        };
        let base = sqlx::query(
            "SELECT id, snapshot FROM checkpoints
             WHERE thread_id = ?1 AND id <= ?2 AND snapshot IS NOT NULL
             ORDER BY id DESC LIMIT 1",
        )
        .bind(thread_id)
        .bind(target)
        .fetch_optional(pool)
        .await
        .map_err(storage)?;
        let (mut run, from) = match base {
            Some(row) => {
                let snapshot: String = row.try_get("snapshot").map_err(storage)?;
                let id: i64 = row.try_get("id").map_err(storage)?;
                (deepagents_core::checkpoint::decode_snapshot(&snapshot)?, id)
            }
            None => (Run::default(), 0),
        };
        let deltas = sqlx::query(
            "SELECT delta FROM checkpoints WHERE thread_id = ?1 AND id > ?2 AND id <= ?3 ORDER BY id",
        )
        .bind(thread_id)
        .bind(from)
        .bind(target)
        .fetch_all(pool)
        .await
        .map_err(storage)?;
        for row in deltas {
            let delta: String = row.try_get("delta").map_err(storage)?;
            RunDelta::decode(&delta)?.apply(&mut run);
        }
        Ok(Some(run))
    }

    async fn checkpoints(&self, thread_id: &str) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        let rows = sqlx::query(
            "SELECT id, created_at_ms, messages FROM checkpoints WHERE thread_id = ?1 ORDER BY id",
        )
        .bind(thread_id)
        .fetch_all(&self.store.pool)
        .await
        .map_err(storage)?;
        rows.iter()
            .map(|row| {
                Ok(CheckpointInfo {
                    id: u64::try_from(row.try_get::<i64, _>("id").map_err(storage)?).unwrap_or(0),
                    created_at_ms: u64::try_from(
                        row.try_get::<i64, _>("created_at_ms").map_err(storage)?,
                    )
                    .unwrap_or(0),
                    messages: usize::try_from(row.try_get::<i64, _>("messages").map_err(storage)?)
                        .unwrap_or(0),
                })
            })
            .collect()
    }

    async fn threads(&self) -> Result<Vec<ThreadInfo>, CheckpointError> {
        let rows = sqlx::query(
            "SELECT thread_id, COUNT(*) AS n, MAX(created_at_ms) AS updated FROM checkpoints
             WHERE instr(thread_id, ?1) = 0
             GROUP BY thread_id ORDER BY updated DESC, thread_id",
        )
        .bind(CHILD_THREAD_SEPARATOR.to_string())
        .fetch_all(&self.store.pool)
        .await
        .map_err(storage)?;
        rows.iter()
            .map(|row| {
                Ok(ThreadInfo {
                    thread_id: row.try_get("thread_id").map_err(storage)?,
                    checkpoints: u64::try_from(row.try_get::<i64, _>("n").map_err(storage)?)
                        .unwrap_or(0),
                    updated_at_ms: u64::try_from(
                        row.try_get::<i64, _>("updated").map_err(storage)?,
                    )
                    .unwrap_or(0),
                })
            })
            .collect()
    }

    async fn try_lease(&self, thread_id: &str) -> Result<ThreadLease, CheckpointError> {
        match &self.store.leases {
            Leases::Files(dir) => file_lock::try_lease(dir, thread_id),
            Leases::Local(leases) => leases.try_lease(thread_id),
        }
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        let children = format!("{thread_id}{CHILD_THREAD_SEPARATOR}");
        sqlx::query("DELETE FROM checkpoints WHERE substr(thread_id, 1, length(?1)) = ?1")
            .bind(&children)
            .execute(&self.store.pool)
            .await
            .map_err(storage)?;
        let done = sqlx::query("DELETE FROM checkpoints WHERE thread_id = ?1")
            .bind(thread_id)
            .execute(&self.store.pool)
            .await
            .map_err(storage)?;
        if let Leases::Files(dir) = &self.store.leases {
            file_lock::remove_lease(dir, thread_id);
        }
        Ok(done.rows_affected() > 0)
    }
}
