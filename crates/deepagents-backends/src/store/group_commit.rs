//! Group commit: the checkpoint appends and store writes of every run that saves while a
//! commit is under way are written together by the next one — one transaction for the whole
//! group, however many runs are in it, and on SQLite one round trip to the database — instead
//! of a transaction each. A write is reported done only once its group committed. What a
//! group's transaction holds is the database's part ([`GroupWriter`]): PostgreSQL's takes
//! each thread's append lock and writes arrays with `unnest`, SQLite's writes JSON arrays with
//! `json_each` in one `BEGIN IMMEDIATE … COMMIT`.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::{Mutex, mpsc, oneshot};

/// The most writes one transaction carries.
const MAX_GROUP: usize = 512;

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

/// How one database writes a group: in one transaction, the puts (of two to one item, the
/// later wins: they were under way at once, as if the later came right after the earlier)
/// and the appends, each appended as its thread's next checkpoint after those of the same
/// thread before it in the group.
#[async_trait]
pub(super) trait GroupWriter: Send + Sync + 'static {
    /// Writes a group in one transaction; the appends' checkpoint ids, in order.
    async fn write(&self, appends: &[&Append], puts: &[&Put]) -> Result<Vec<i64>, sqlx::Error>;

    /// Whether `error` means the database refused one of the group's writes (and rolled the
    /// group back), so each alone may succeed; otherwise every write of the group gets it.
    fn refused_one(&self, error: &sqlx::Error) -> bool {
        matches!(error, sqlx::Error::Database(_))
    }
}

/// The queue of a store's writes, written in groups by `writers` tasks. The tasks end when
/// the store (every clone of it) is dropped.
#[derive(Debug)]
pub(super) struct GroupCommit {
    queue: mpsc::UnboundedSender<Write>,
}

impl GroupCommit {
    /// Starts the tasks that write the groups through `writer`: more than one commit at once
    /// where the database lets them (while one waits on it, the next is written).
    pub(super) fn start(writer: Arc<dyn GroupWriter>, writers: usize) -> Self {
        let (queue, writes) = mpsc::unbounded_channel();
        let writes = Arc::new(Mutex::new(writes));
        for _ in 0..writers.max(1) {
            tokio::spawn(write_groups(Arc::clone(&writer), Arc::clone(&writes)));
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
        let stopped = || "the store was closed while writing".to_owned();
        self.queue.send(write).map_err(|_| stopped())?;
        done.await.map_err(|_| stopped())?
    }
}

/// Writes the queued writes: whatever waits when a group starts goes into it.
async fn write_groups(
    writer: Arc<dyn GroupWriter>,
    writes: Arc<Mutex<mpsc::UnboundedReceiver<Write>>>,
) {
    loop {
        let mut taken = Vec::with_capacity(MAX_GROUP);
        if writes.lock().await.recv_many(&mut taken, MAX_GROUP).await == 0 {
            return;
        }
        match write(writer.as_ref(), &taken).await {
            Ok(outcomes) => {
                for (write, outcome) in taken.into_iter().zip(outcomes) {
                    write.done(Ok(outcome));
                }
            }
            // One bad write must not fail the others: each is tried again on its own, and
            // only its own error reaches its caller. (Only after the database refused a
            // statement, which rolled the group back: after a lost connection the group may
            // have committed, and writing it again would save its steps twice.)
            Err(error) if taken.len() > 1 && writer.refused_one(&error) => {
                for one in taken {
                    let alone = write(writer.as_ref(), std::slice::from_ref(&one)).await;
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

/// Writes `group` through `writer`; for each write in order, its checkpoint id (0 for a put).
async fn write(writer: &dyn GroupWriter, group: &[Write]) -> Result<Vec<i64>, sqlx::Error> {
    let (mut appends, mut puts): (Vec<&Append>, Vec<&Put>) = (Vec::new(), Vec::new());
    for write in group {
        match write {
            Write::Append(append, _) => appends.push(append),
            Write::Put(put, _) => puts.push(put),
        }
    }
    let mut ids = writer.write(&appends, &puts).await?.into_iter();
    group
        .iter()
        .map(|write| match write {
            Write::Append(..) => ids.next().ok_or_else(no_id),
            Write::Put(..) => Ok(0),
        })
        .collect()
}

/// The group's puts, the later of two to one item only, sorted by item (one lock order for
/// every group).
fn last_puts<'a>(puts: &[&'a Put]) -> Vec<&'a Put> {
    let mut last: HashMap<(&str, &str), &Put> = HashMap::new();
    for put in puts {
        last.insert((put.namespace.as_str(), put.key.as_str()), put);
    }
    let mut puts: Vec<&Put> = last.into_values().collect();
    puts.sort_unstable_by(|a, b| (&a.namespace, &a.key).cmp(&(&b.namespace, &b.key)));
    puts
}

/// Each append's rank among the group's appends to its thread (1 for the first), and the
/// threads appended to.
fn ranks<'a>(appends: &[&'a Append]) -> (Vec<i64>, HashMap<&'a str, i64>) {
    let mut ranks = Vec::with_capacity(appends.len());
    let mut seen: HashMap<&str, i64> = HashMap::new();
    for append in appends {
        let rank = seen.entry(append.thread_id.as_str()).or_insert(0);
        *rank += 1;
        ranks.push(*rank);
    }
    (ranks, seen)
}

/// The appends' ids, in order, from the `(thread, id)` rows their insert returned in no set
/// order: a thread's ids, smallest first, go to its appends in rank order.
fn ids_in_order(
    appends: &[&Append],
    ranks: &[i64],
    seen: &HashMap<&str, i64>,
    rows: &[(String, i64)],
) -> Result<Vec<i64>, sqlx::Error> {
    let mut ids: HashMap<&str, Vec<i64>> = HashMap::new();
    for (thread_id, id) in rows {
        if let Some((thread, _)) = seen.get_key_value(thread_id.as_str()) {
            ids.entry(thread).or_default().push(*id);
        }
    }
    for thread in ids.values_mut() {
        thread.sort_unstable();
    }
    appends
        .iter()
        .zip(ranks)
        .map(|(append, rank)| {
            ids.get(append.thread_id.as_str())
                .and_then(|thread| thread.get(usize::try_from(rank - 1).ok()?))
                .copied()
                .ok_or_else(no_id)
        })
        .collect()
}

fn no_id() -> sqlx::Error {
    sqlx::Error::Protocol("the insert returned no id".to_owned())
}

/// PostgreSQL's groups: at most three statements in a transaction — each thread's append lock,
/// the puts, the appends — so several groups commit at once (`writers` of
/// [`GroupCommit::start`]). Groups never wait on each other's locks in a cycle: each takes its
/// threads' locks and its items' rows in one sorted order.
#[cfg(feature = "postgres")]
pub(super) struct PostgresGroups {
    pub(super) pool: sqlx::PgPool,
    /// The class of the threads' advisory append locks (the loads' shared locks wait for them).
    pub(super) lock_class: i32,
}

#[cfg(feature = "postgres")]
#[async_trait]
impl GroupWriter for PostgresGroups {
    async fn write(&self, appends: &[&Append], puts: &[&Put]) -> Result<Vec<i64>, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        if !puts.is_empty() {
            let puts = last_puts(puts);
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
        }
        let ids = if appends.is_empty() {
            Vec::new()
        } else {
            self.append(&mut tx, appends).await?
        };
        tx.commit().await?;
        Ok(ids)
    }
}

#[cfg(feature = "postgres")]
impl PostgresGroups {
    /// Appends the group's checkpoints; their ids in the group's order. Each thread's lock is
    /// taken first, in one order for every group; the next id of a thread is its newest plus
    /// the append's rank among the group's appends to it.
    async fn append(
        &self,
        tx: &mut sqlx::PgConnection,
        appends: &[&Append],
    ) -> Result<Vec<i64>, sqlx::Error> {
        let (ranks, seen) = ranks(appends);
        let mut threads: Vec<&str> = seen.keys().copied().collect();
        threads.sort_unstable();
        sqlx::query(
            "SELECT pg_advisory_xact_lock($1, hashtext(t.id))
             FROM unnest($2::text[]) WITH ORDINALITY AS t(id, n) ORDER BY t.n",
        )
        .bind(self.lock_class)
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
        ids_in_order(appends, &ranks, &seen, &rows)
    }
}

/// SQLite's groups: the whole group is one query of four statements sent to the database's
/// one writing connection at once (SQLite runs them without a round trip between them): the
/// write lock taken, the puts and the appends each from a JSON array, the commit.
#[cfg(feature = "sqlite")]
pub(super) struct SqliteGroups {
    /// The pool of the one connection this process writes through.
    pub(super) writer: sqlx::SqlitePool,
}

/// The group's query. In an `INSERT … SELECT` SQLite reads the rows to insert before it
/// writes any, so a thread's newest id is the one before the group and the rank orders the
/// group's own; `WHERE true` lets the upsert's `ON CONFLICT` parse after a `SELECT`.
#[cfg(feature = "sqlite")]
const SQLITE_GROUP: &str = "BEGIN IMMEDIATE;
INSERT INTO store_items (namespace, key, value, created_at_ms, updated_at_ms)
    SELECT p.value ->> 'n', p.value ->> 'k', p.value ->> 'v', p.value ->> 'a', p.value ->> 'a'
    FROM json_each($1) AS p WHERE true
    ON CONFLICT (namespace, key) DO UPDATE SET value = excluded.value, updated_at_ms = excluded.updated_at_ms;
INSERT INTO checkpoints (thread_id, id, delta, snapshot, created_at_ms, messages)
    SELECT a.value ->> 't',
           COALESCE((SELECT MAX(c.id) FROM checkpoints c WHERE c.thread_id = a.value ->> 't'), 0)
               + (a.value ->> 'r'),
           a.value ->> 'd', NULL, a.value ->> 'c', a.value ->> 'm'
    FROM json_each($2) AS a
    RETURNING thread_id, id;
COMMIT;";

/// A put as the group's JSON array holds it.
#[cfg(feature = "sqlite")]
#[derive(serde::Serialize)]
struct PutRow<'a> {
    n: &'a str,
    k: &'a str,
    v: &'a str,
    a: i64,
}

/// An append as the group's JSON array holds it.
#[cfg(feature = "sqlite")]
#[derive(serde::Serialize)]
struct AppendRow<'a> {
    t: &'a str,
    d: &'a str,
    c: i64,
    m: i64,
    r: i64,
}

#[cfg(feature = "sqlite")]
#[async_trait]
impl GroupWriter for SqliteGroups {
    async fn write(&self, appends: &[&Append], puts: &[&Put]) -> Result<Vec<i64>, sqlx::Error> {
        use sqlx::Row as _;
        let encode = |error: serde_json::Error| sqlx::Error::Encode(Box::new(error));
        let puts: Vec<PutRow<'_>> = last_puts(puts)
            .into_iter()
            .map(|p| PutRow {
                n: &p.namespace,
                k: &p.key,
                v: &p.value,
                a: p.at_ms,
            })
            .collect();
        let (ranks, seen) = ranks(appends);
        let rows: Vec<AppendRow<'_>> = appends
            .iter()
            .zip(&ranks)
            .map(|(a, rank)| AppendRow {
                t: &a.thread_id,
                d: &a.delta,
                c: a.created_at_ms,
                m: a.messages,
                r: *rank,
            })
            .collect();
        let mut conn = self.writer.acquire().await?;
        let written = sqlx::query(SQLITE_GROUP)
            .bind(serde_json::to_string(&puts).map_err(encode)?)
            .bind(serde_json::to_string(&rows).map_err(encode)?)
            .fetch_all(&mut *conn)
            .await;
        let returned = match written {
            Ok(returned) => returned,
            Err(error) => {
                // A statement failed after `BEGIN`: nothing of the group stays. (Without a
                // transaction open this fails too, harmlessly.)
                let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                return Err(error);
            }
        };
        let rows = returned
            .iter()
            .map(|row| Ok((row.try_get("thread_id")?, row.try_get("id")?)))
            .collect::<Result<Vec<(String, i64)>, sqlx::Error>>()?;
        ids_in_order(appends, &ranks, &seen, &rows)
    }

    /// Not when the database was busy or locked (another process writing for longer than the
    /// busy timeout): each write alone would wait as long again.
    fn refused_one(&self, error: &sqlx::Error) -> bool {
        let sqlx::Error::Database(error) = error else {
            return false;
        };
        let code = error.code().and_then(|code| code.parse::<i32>().ok());
        // The primary result code is the extended one's low byte.
        !matches!(code.map(|code| code & 0xff), Some(5 | 6))
    }
}
