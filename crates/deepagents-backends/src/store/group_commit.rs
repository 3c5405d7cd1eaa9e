//! Group commit on PostgreSQL: the checkpoint appends and store writes of every run that saves
//! while a commit is under way are written together by the next one — one transaction of at
//! most three statements for the whole group, however many runs are in it — instead of a
//! transaction each. A write is reported done only once its group committed.

use std::collections::HashMap;
use std::sync::Arc;

use sqlx::PgPool;
use tokio::sync::{Mutex, mpsc, oneshot};

/// The most writes one transaction carries.
const MAX_GROUP: usize = 512;

/// How many groups commit at once: while one waits on the database, the next is written.
/// Groups never wait on each other's locks in a cycle: each takes its threads' locks and
/// its items' rows in one sorted order.
const WRITERS: usize = 4;

/// A checkpoint to append: its id once saved.
pub(super) struct Append {
    pub(super) thread_id: String,
    /// The delta, as stored.
    pub(super) delta: String,
    pub(super) created_at_ms: i64,
    pub(super) messages: i64,
}

/// A store item to create or replace.
pub(super) struct Put {
    /// The namespace, encoded as the column holds it.
    pub(super) namespace: String,
    pub(super) key: String,
    /// The value's JSON.
    pub(super) value: String,
    pub(super) at_ms: i64,
}

/// One queued write and who waits for it.
enum Write {
    Append(Append, oneshot::Sender<Result<i64, String>>),
    Put(Put, oneshot::Sender<Result<i64, String>>),
}

impl Write {
    fn done(self, outcome: Result<i64, String>) {
        let (Self::Append(_, done) | Self::Put(_, done)) = self;
        let _ = done.send(outcome);
    }
}

/// The queue of a store's writes, written by one task in groups. The task ends when the
/// store (every clone of it) is dropped.
#[derive(Debug)]
pub(super) struct GroupCommit {
    queue: mpsc::UnboundedSender<Write>,
}

impl GroupCommit {
    /// Starts the task that writes the groups of `pool`'s store, appends under advisory locks
    /// of `lock_class` per thread (the loads' shared locks wait for them).
    pub(super) fn start(pool: PgPool, lock_class: i32) -> Self {
        let (queue, writes) = mpsc::unbounded_channel();
        let writes = Arc::new(Mutex::new(writes));
        for _ in 0..WRITERS {
            tokio::spawn(write_groups(pool.clone(), lock_class, Arc::clone(&writes)));
        }
        Self { queue }
    }

    /// Appends a checkpoint as its thread's next; its id once committed.
    pub(super) async fn append(&self, append: Append) -> Result<i64, String> {
        let (done, id) = oneshot::channel();
        self.send(Write::Append(append, done), id).await
    }

    /// Creates or replaces a store item; done once committed.
    pub(super) async fn put(&self, put: Put) -> Result<(), String> {
        let (done, written) = oneshot::channel();
        self.send(Write::Put(put, done), written).await.map(drop)
    }

    async fn send(
        &self,
        write: Write,
        done: oneshot::Receiver<Result<i64, String>>,
    ) -> Result<i64, String> {
        let stopped = || "the PostgreSQL store was closed while writing".to_owned();
        self.queue.send(write).map_err(|_| stopped())?;
        done.await.map_err(|_| stopped())?
    }
}

/// Writes the queued writes: whatever waits when a group starts goes into it.
async fn write_groups(
    pool: PgPool,
    lock_class: i32,
    writes: Arc<Mutex<mpsc::UnboundedReceiver<Write>>>,
) {
    loop {
        let mut taken = Vec::with_capacity(MAX_GROUP);
        if writes.lock().await.recv_many(&mut taken, MAX_GROUP).await == 0 {
            return;
        }
        match write(&pool, lock_class, &taken).await {
            Ok(outcomes) => {
                for (write, outcome) in taken.into_iter().zip(outcomes) {
                    write.done(Ok(outcome));
                }
            }
            // One bad write must not fail the others: each is tried again on its own, and
            // only its own error reaches its caller. (Only after the database refused a
            // statement, which rolled the group back: after a lost connection the group may
            // have committed, and writing it again would save its steps twice.)
            Err(sqlx::Error::Database(_)) if taken.len() > 1 => {
                for one in taken {
                    let alone = write(&pool, lock_class, std::slice::from_ref(&one)).await;
                    let outcome =
                        alone.and_then(|outcomes| outcomes.first().copied().ok_or_else(no_id));
                    one.done(outcome.map_err(|e| e.to_string()));
                }
            }
            Err(error) => {
                for write in taken {
                    write.done(Err(error.to_string()));
                }
            }
        }
    }
}

fn no_id() -> sqlx::Error {
    sqlx::Error::Protocol("the insert returned no id".to_owned())
}

/// Writes `group` in one transaction; for each write in order, its checkpoint id (0 for a
/// put).
async fn write(pool: &PgPool, lock_class: i32, group: &[Write]) -> Result<Vec<i64>, sqlx::Error> {
    let (mut appends, mut puts): (Vec<&Append>, Vec<&Put>) = (Vec::new(), Vec::new());
    for write in group {
        match write {
            Write::Append(append, _) => appends.push(append),
            Write::Put(put, _) => puts.push(put),
        }
    }
    let mut tx = pool.begin().await?;
    if !puts.is_empty() {
        put(&mut tx, &puts).await?;
    }
    let mut ids = if appends.is_empty() {
        Vec::new()
    } else {
        append(&mut tx, lock_class, &appends).await?
    }
    .into_iter();
    tx.commit().await?;
    group
        .iter()
        .map(|write| match write {
            Write::Append(..) => ids.next().ok_or_else(no_id),
            Write::Put(..) => Ok(0),
        })
        .collect()
}

/// Writes the group's puts in one statement; of two to one item, the later wins (they were
/// under way at once, as if the later came right after the earlier).
async fn put(tx: &mut sqlx::PgConnection, puts: &[&Put]) -> Result<(), sqlx::Error> {
    let mut last: HashMap<(&str, &str), &Put> = HashMap::new();
    for put in puts {
        last.insert((put.namespace.as_str(), put.key.as_str()), put);
    }
    let mut puts: Vec<&Put> = last.into_values().collect();
    puts.sort_unstable_by(|a, b| (&a.namespace, &a.key).cmp(&(&b.namespace, &b.key)));
    sqlx::query(
        "INSERT INTO store_items (namespace, key, value, created_at_ms, updated_at_ms)
         SELECT p.namespace, p.key, p.value, p.at_ms, p.at_ms
         FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[]) AS p(namespace, key, value, at_ms)
         ON CONFLICT (namespace, key)
         DO UPDATE SET value = EXCLUDED.value, updated_at_ms = EXCLUDED.updated_at_ms",
    )
    .bind(puts.iter().map(|p| p.namespace.as_str()).collect::<Vec<_>>())
    .bind(puts.iter().map(|p| p.key.as_str()).collect::<Vec<_>>())
    .bind(puts.iter().map(|p| p.value.as_str()).collect::<Vec<_>>())
    .bind(puts.iter().map(|p| p.at_ms).collect::<Vec<_>>())
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Appends the group's checkpoints; their ids in the group's order. Each thread's lock is
/// taken first, in one order for every group, so concurrent writers never deadlock; the next
/// id of a thread is its newest plus the append's rank among the group's appends to it.
async fn append(
    tx: &mut sqlx::PgConnection,
    lock_class: i32,
    appends: &[&Append],
) -> Result<Vec<i64>, sqlx::Error> {
    let mut ranks = Vec::with_capacity(appends.len());
    let mut seen: HashMap<&str, i64> = HashMap::new();
    for append in appends {
        let rank = seen.entry(append.thread_id.as_str()).or_insert(0);
        *rank += 1;
        ranks.push(*rank);
    }
    let mut threads: Vec<&str> = seen.keys().copied().collect();
    threads.sort_unstable();
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
        appends
            .iter()
            .map(|a| a.thread_id.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(appends.iter().map(|a| a.delta.as_str()).collect::<Vec<_>>())
    .bind(appends.iter().map(|a| a.created_at_ms).collect::<Vec<_>>())
    .bind(appends.iter().map(|a| a.messages).collect::<Vec<_>>())
    .bind(&ranks)
    .fetch_all(&mut *tx)
    .await?;
    // The rows come back in no set order: a thread's ids, smallest first, go to its appends
    // in rank order.
    let mut ids: HashMap<&str, Vec<i64>> = HashMap::new();
    for (thread_id, id) in &rows {
        if let Some((thread, _)) = seen.get_key_value(thread_id.as_str()) {
            ids.entry(thread).or_default().push(*id);
        }
    }
    for thread in ids.values_mut() {
        thread.sort_unstable();
    }
    appends
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
