//! Checkpoints in PostgreSQL: a delta per step, a snapshot every 50 (only the newest kept).

use async_trait::async_trait;
use deepagents_core::checkpoint::CHILD_THREAD_SEPARATOR;
use deepagents_core::{
    CheckpointError, CheckpointInfo, Checkpointer, Run, RunDelta, ThreadInfo, ThreadLease,
    validate_thread_id,
};
use sqlx::{Connection as _, PgConnection, Row};

use super::PostgresStore;
use crate::memory::now_ms;

/// How often a checkpoint also stores the whole run.
const SNAPSHOT_EVERY: i64 = 50;

/// The first key of the per-thread advisory locks taken while appending.
const APPEND_LOCK_CLASS: i32 = 0x6461_636b; // "dack"

/// The session lock that leases a thread: a 64-bit hash of the schema and the thread id.
/// Session locks belong to the connection, so a lease dies with its process.
const LEASE_LOCK: &str = "hashtextextended(current_schema() || '/' || $1, 7)";

/// A lease: the connection holding the thread's session lock.
struct PgLease {
    conn: Option<PgConnection>,
}

impl Drop for PgLease {
    fn drop(&mut self) {
        let Some(mut conn) = self.conn.take() else {
            return;
        };
        // Unlocking explicitly frees the thread at once; a dropped connection would free it
        // only once the server noticed. Without a runtime, dropping it is all there is.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = sqlx::query("SELECT pg_advisory_unlock_all()")
                    .execute(&mut conn)
                    .await;
                let _ = conn.close().await;
            });
        }
    }
}

/// A [`Checkpointer`] in the database of a [`PostgresStore`]. Each step writes only its delta,
/// so a step's cost does not grow with the conversation; every 50th checkpoint also holds the
/// whole run, so loading replays at most 49 deltas.
#[derive(Clone, Debug)]
pub struct PostgresCheckpointer {
    store: PostgresStore,
}

impl PostgresStore {
    /// Checkpoints kept in this store's database.
    pub fn checkpointer(&self) -> PostgresCheckpointer {
        PostgresCheckpointer {
            store: self.clone(),
        }
    }
}

fn storage(error: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Storage(error.to_string())
}

impl PostgresCheckpointer {
    /// Appends `delta` as the thread's next checkpoint; with `new_thread`, refuses a thread
    /// that already has checkpoints. One transaction under the thread's lock, so the check
    /// holds at the insert.
    async fn write(
        &self,
        thread_id: &str,
        delta: &RunDelta,
        run: &Run,
        new_thread: bool,
    ) -> Result<u64, CheckpointError> {
        let delta_json = serde_json::to_string(delta).map_err(storage)?;
        let mut tx = self.store.pool.begin().await.map_err(storage)?;
        // One lock per thread, released at commit or rollback: concurrent appends to a thread
        // queue here and get distinct ids; other threads proceed.
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2))")
            .bind(APPEND_LOCK_CLASS)
            .bind(thread_id)
            .execute(&mut *tx)
            .await
            .map_err(storage)?;
        let last: i64 =
            sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM checkpoints WHERE thread_id = $1")
                .bind(thread_id)
                .fetch_one(&mut *tx)
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
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(thread_id)
        .bind(id)
        .bind(&delta_json)
        .bind(snapshot)
        .bind(i64::try_from(now_ms()).unwrap_or(i64::MAX))
        .bind(i64::try_from(run.state.messages.len()).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await
        .map_err(storage)?;
        if snapshot_written {
            // Only the newest snapshot is kept: older checkpoints load by replaying deltas from
            // the start, and storage stays linear in the conversation's length.
            sqlx::query(
                "UPDATE checkpoints SET snapshot = NULL
                 WHERE thread_id = $1 AND id < $2 AND snapshot IS NOT NULL",
            )
            .bind(thread_id)
            .bind(id)
            .execute(&mut *tx)
            .await
            .map_err(storage)?;
        }
        tx.commit().await.map_err(storage)?;
        Ok(u64::try_from(id).unwrap_or(0))
    }
}

#[async_trait]
impl Checkpointer for PostgresCheckpointer {
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
        let mut tx = self.store.pool.begin().await.map_err(storage)?;
        // The thread's lock, shared: an append still committing — typically one whose process
        // was killed after it sent COMMIT, which the server completes on its own time — holds
        // it until its row is visible. Reading without it could return the thread as it was
        // before that checkpoint, and a run resumed from there would append on top of it
        // again (duplicated turns and results). It also keeps the reads below consistent.
        sqlx::query("SELECT pg_advisory_xact_lock_shared($1, hashtext($2))")
            .bind(APPEND_LOCK_CLASS)
            .bind(thread_id)
            .execute(&mut *tx)
            .await
            .map_err(storage)?;
        let last: i64 =
            sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM checkpoints WHERE thread_id = $1")
                .bind(thread_id)
                .fetch_one(&mut *tx)
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
             WHERE thread_id = $1 AND id <= $2 AND snapshot IS NOT NULL
             ORDER BY id DESC LIMIT 1",
        )
        .bind(thread_id)
        .bind(target)
        .fetch_optional(&mut *tx)
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
            "SELECT delta FROM checkpoints WHERE thread_id = $1 AND id > $2 AND id <= $3 ORDER BY id",
        )
        .bind(thread_id)
        .bind(from)
        .bind(target)
        .fetch_all(&mut *tx)
        .await
        .map_err(storage)?;
        tx.commit().await.map_err(storage)?;
        for row in deltas {
            let delta: String = row.try_get("delta").map_err(storage)?;
            RunDelta::decode(&delta)?.apply(&mut run);
        }
        Ok(Some(run))
    }

    async fn checkpoints(&self, thread_id: &str) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        let rows = sqlx::query(
            "SELECT id, created_at_ms, messages FROM checkpoints WHERE thread_id = $1 ORDER BY id",
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
             WHERE strpos(thread_id, $1) = 0
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
        validate_thread_id(thread_id)?;
        let mut conn = self.store.pool.acquire().await.map_err(storage)?.detach();
        // A lease this process just dropped is unlocked by a spawned task: give it a moment
        // before calling the thread busy.
        for attempt in 0..10 {
            let locked: bool =
                sqlx::query_scalar(&format!("SELECT pg_try_advisory_lock({LEASE_LOCK})"))
                    .bind(thread_id)
                    .fetch_one(&mut conn)
                    .await
                    .map_err(storage)?;
            if locked {
                return Ok(ThreadLease::new(thread_id, PgLease { conn: Some(conn) }));
            }
            if attempt < 9 {
                tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            }
        }
        let _ = conn.close().await;
        Err(CheckpointError::Busy {
            thread_id: thread_id.to_owned(),
            holder: Some("another database session".to_owned()),
        })
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        let mut tx = self.store.pool.begin().await.map_err(storage)?;
        sqlx::query("DELETE FROM checkpoints WHERE starts_with(thread_id, $1)")
            .bind(format!("{thread_id}{CHILD_THREAD_SEPARATOR}"))
            .execute(&mut *tx)
            .await
            .map_err(storage)?;
        let done = sqlx::query("DELETE FROM checkpoints WHERE thread_id = $1")
            .bind(thread_id)
            .execute(&mut *tx)
            .await
            .map_err(storage)?;
        tx.commit().await.map_err(storage)?;
        Ok(done.rows_affected() > 0)
    }
}
