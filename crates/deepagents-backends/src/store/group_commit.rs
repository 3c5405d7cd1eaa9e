//! Group commit of checkpoint appends on PostgreSQL: the steps of every run that saves while
//! a commit is under way are written together by the next one — one transaction and two
//! statements for the whole group, however many runs are in it — instead of a transaction
//! per step. A step is reported saved only once its group committed.

use std::collections::HashMap;

use deepagents_core::CheckpointError;
use sqlx::PgPool;
use tokio::sync::{mpsc, oneshot};

/// The most appends one transaction carries.
const MAX_GROUP: usize = 512;

/// One checkpoint to append, and who waits for its id.
struct Append {
    thread_id: String,
    delta: String,
    created_at_ms: i64,
    messages: i64,
    saved: oneshot::Sender<Result<i64, String>>,
}

/// The queue of a store's appends, written by one task in groups. The task ends when the
/// store (every clone of it) is dropped.
#[derive(Debug)]
pub(super) struct GroupCommit {
    queue: mpsc::UnboundedSender<Append>,
}

impl GroupCommit {
    /// Starts the task that writes the appends of `pool`'s store, under advisory locks of
    /// `lock_class` per thread (the loads' shared locks wait for them).
    pub(super) fn start(pool: PgPool, lock_class: i32) -> Self {
        let (queue, appends) = mpsc::unbounded_channel();
        tokio::spawn(write_groups(pool, lock_class, appends));
        Self { queue }
    }

    /// Appends `delta` (stored form) as the thread's next checkpoint; its id once committed.
    pub(super) async fn append(
        &self,
        thread_id: &str,
        delta: String,
        created_at_ms: i64,
        messages: i64,
    ) -> Result<i64, CheckpointError> {
        let (saved, id) = oneshot::channel();
        self.queue
            .send(Append {
                thread_id: thread_id.to_owned(),
                delta,
                created_at_ms,
                messages,
                saved,
            })
            .map_err(|_| stopped())?;
        id.await
            .map_err(|_| stopped())?
            .map_err(CheckpointError::Storage)
    }
}

fn stopped() -> CheckpointError {
    CheckpointError::Storage("the PostgreSQL store was closed while saving a step".to_owned())
}

/// Writes the queued appends: whatever waits when a group starts goes into it.
async fn write_groups(pool: PgPool, lock_class: i32, mut appends: mpsc::UnboundedReceiver<Append>) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    while appends.recv_many(&mut group, MAX_GROUP).await > 0 {
        let taken = std::mem::take(&mut group);
        match insert(&pool, lock_class, &taken).await {
            Ok(ids) => {
                for (append, id) in taken.into_iter().zip(ids) {
                    let _ = append.saved.send(Ok(id));
                }
            }
            // One bad append must not fail the others: each is tried again on its own, and
            // only its own error reaches its run. (Only after the database refused a
            // statement, which rolled the group back: after a lost connection the group may
            // have committed, and writing it again would save its steps twice.)
            Err(sqlx::Error::Database(_)) if taken.len() > 1 => {
                for append in taken {
                    let alone = insert(&pool, lock_class, std::slice::from_ref(&append)).await;
                    let id = alone.and_then(|ids| ids.first().copied().ok_or_else(no_id));
                    let _ = append.saved.send(id.map_err(|e| e.to_string()));
                }
            }
            Err(error) => {
                for append in taken {
                    let _ = append.saved.send(Err(error.to_string()));
                }
            }
        }
    }
}

fn no_id() -> sqlx::Error {
    sqlx::Error::Protocol("the insert returned no id".to_owned())
}

/// Inserts `group` in one transaction; the ids in the group's order. Each thread's lock is
/// taken first, in one order for every group, so concurrent writers never deadlock; the next
/// id of a thread is its newest plus the append's rank among the group's appends to it.
async fn insert(pool: &PgPool, lock_class: i32, group: &[Append]) -> Result<Vec<i64>, sqlx::Error> {
    let mut ranks = Vec::with_capacity(group.len());
    let mut seen: HashMap<&str, i64> = HashMap::new();
    for append in group {
        let rank = seen.entry(append.thread_id.as_str()).or_insert(0);
        *rank += 1;
        ranks.push(*rank);
    }
    let mut threads: Vec<&str> = seen.keys().copied().collect();
    threads.sort_unstable();
    let mut tx = pool.begin().await?;
    sqlx::query(
        "SELECT pg_advisory_xact_lock($1, hashtext(t.id))
         FROM unnest($2::text[]) WITH ORDINALITY AS t(id, n) ORDER BY t.n",
    )
    .bind(lock_class)
    .bind(&threads)
    .execute(&mut *tx)
    .await?;
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "INSERT INTO checkpoints (thread_id, id, delta, snapshot, created_at_ms, messages)
         SELECT a.thread_id,
                COALESCE((SELECT MAX(c.id) FROM checkpoints c WHERE c.thread_id = a.thread_id), 0)
                    + a.rank,
                a.delta, NULL, a.created_at_ms, a.messages
         FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[], $5::bigint[])
              AS a(thread_id, delta, created_at_ms, messages, rank)
         RETURNING thread_id, id",
    )
    .bind(
        group
            .iter()
            .map(|a| a.thread_id.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(group.iter().map(|a| a.delta.as_str()).collect::<Vec<_>>())
    .bind(group.iter().map(|a| a.created_at_ms).collect::<Vec<_>>())
    .bind(group.iter().map(|a| a.messages).collect::<Vec<_>>())
    .bind(&ranks)
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    // The rows come back in no set order: a thread's ids, smallest first, go to its appends
    // in rank order.
    let mut ids: HashMap<&str, Vec<i64>> = HashMap::new();
    for (thread_id, id) in &rows {
        if let Some(thread) = seen.get_key_value(thread_id.as_str()) {
            ids.entry(thread.0).or_default().push(*id);
        }
    }
    for thread in ids.values_mut() {
        thread.sort_unstable();
    }
    group
        .iter()
        .zip(&ranks)
        .map(|(append, rank)| {
            ids.get(append.thread_id.as_str())
                .and_then(|thread| thread.get(usize::try_from(rank - 1).ok()?))
                .copied()
                .ok_or_else(no_id)
        })
        .collect()
}
