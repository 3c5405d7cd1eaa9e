//! The one SQL implementation of the SQLite and PostgreSQL stores and checkpointers: every
//! query, row decoding and the delta/snapshot scheme, written once over a [`Dialect`] that
//! holds only what the two databases do differently.
//!
//! Placeholders are `$N` in both: SQLite reads `$1` as a parameter named `1`, which sqlx binds
//! by that number, so one query text serves both wherever their SQL agrees.

use std::future::Future;

use deepagents_core::checkpoint::CHILD_THREAD_SEPARATOR;
use deepagents_core::{CheckpointError, CheckpointInfo, Run, RunDelta, ThreadInfo};
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Row, Type};

use super::group_commit::{Append, GroupCommit, Put};
use super::{SearchQuery, StoreError, StoreItem, validate_item, validate_namespace};
use crate::memory::now_ms;

/// Stored JSON from this length on is compressed, when that makes it shorter: a snapshot, or a
/// delta with a long tool result (shorter ones gain too little to pay for the encoding).
const COMPRESS_FROM: usize = 512;

/// Starts a compressed value: DEFLATE, then base64, since the columns hold text. No JSON
/// starts with it.
const COMPRESSED: char = '~';

/// The most a compressed value may inflate to; a larger one is refused as damaged.
const INFLATED_LIMIT: usize = 1 << 30;

/// What is stored for `json`: itself, or its compressed form when that is shorter.
pub(super) fn pack(json: String) -> String {
    use base64::Engine as _;
    if json.len() < COMPRESS_FROM {
        return json;
    }
    let Some(deflated) = deflate(json.as_bytes()) else {
        return json;
    };
    let mut packed = String::with_capacity(deflated.len() * 4 / 3 + 4);
    packed.push(COMPRESSED);
    base64::engine::general_purpose::STANDARD_NO_PAD.encode_string(&deflated, &mut packed);
    if packed.len() < json.len() {
        packed
    } else {
        json
    }
}

thread_local! {
    /// This thread's compressor, reset for each value: a new one allocates and zeroes a few
    /// hundred kilobytes of tables, more work than compressing a checkpoint takes.
    static COMPRESSOR: std::cell::RefCell<Option<Box<miniz_oxide::deflate::core::CompressorOxide>>> =
        const { std::cell::RefCell::new(None) };
}

/// `input` as raw DEFLATE at level 6; `None` if the compressor fails (it is then stored as is).
fn deflate(mut input: &[u8]) -> Option<Vec<u8>> {
    use miniz_oxide::deflate::core::{
        CompressorOxide, TDEFLFlush, TDEFLStatus, compress, create_comp_flags_from_zip_params,
    };
    COMPRESSOR.with_borrow_mut(|slot| {
        let compressor = slot.get_or_insert_with(|| {
            Box::new(CompressorOxide::new(create_comp_flags_from_zip_params(
                6, 0, 0,
            )))
        });
        compressor.reset();
        let mut output = vec![0; (input.len() / 2).max(64)];
        let mut written = 0;
        loop {
            let (status, read, wrote) = compress(
                compressor,
                input,
                &mut output[written..],
                TDEFLFlush::Finish,
            );
            written += wrote;
            match status {
                TDEFLStatus::Done => {
                    output.truncate(written);
                    return Some(output);
                }
                TDEFLStatus::Okay if read <= input.len() => {
                    input = &input[read..];
                    if output.len() - written < 64 {
                        output.resize(output.len() * 2, 0);
                    }
                }
                _ => return None,
            }
        }
    })
}

/// The JSON of a stored value, compressed or not.
fn unpack(stored: &str) -> Result<std::borrow::Cow<'_, str>, CheckpointError> {
    use base64::Engine as _;
    let Some(encoded) = stored.strip_prefix(COMPRESSED) else {
        return Ok(std::borrow::Cow::Borrowed(stored));
    };
    let damaged =
        |why: String| CheckpointError::Storage(format!("damaged compressed checkpoint: {why}"));
    let deflated = base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(encoded)
        .map_err(|e| damaged(e.to_string()))?;
    let json = miniz_oxide::inflate::decompress_to_vec_with_limit(&deflated, INFLATED_LIMIT)
        .map_err(|e| damaged(format!("{:?}", e.status)))?;
    String::from_utf8(json)
        .map(std::borrow::Cow::Owned)
        .map_err(|e| damaged(e.to_string()))
}

/// The first checkpoint that also stores the whole run.
const FIRST_SNAPSHOT: i64 = 50;

/// Whether checkpoint `id` also stores the whole run: ids 50, 75, 112, 168, … (each half again
/// the one before). A snapshot costs the whole run, so spacing them geometrically keeps all
/// of them together within a small multiple of the last one (writing stays linear in the
/// conversation), while loading the latest state replays at most a third of the deltas.
pub(super) fn snapshot_due(id: i64) -> bool {
    let mut point = FIRST_SNAPSHOT;
    while point < id {
        point += point / 2;
    }
    point == id
}

/// What an operation on one thread's checkpoints does, so the dialect can isolate it.
#[derive(Clone, Copy, Debug)]
pub(super) enum Access {
    /// Reads the thread to load a run from it.
    Load,
    /// Appends a checkpoint: the read of the last id and the insert must not interleave with
    /// another append to the thread.
    Append,
    /// Deletes the thread and its children.
    Delete,
}

/// What the databases do differently; everything else is in [`Sql`].
pub(super) trait Dialect: Database {
    /// Where one operation on a thread's checkpoints runs (a transaction, or a connection
    /// where none is needed); dropping it unfinished rolls back what it began.
    type Session: Send;

    /// SQL true when the text expression `text` starts with the text expression `prefix`.
    /// Compared as text rather than with `LIKE`: `_` is legal in components, keys and ids.
    fn starts_with(text: &str, prefix: &str) -> String;

    /// SQL for the 1-based position of `part` in `text`, 0 when it is not there.
    fn position(text: &str, part: &str) -> String;

    /// How many rows a statement changed (sqlx has no trait for it).
    fn rows_affected(done: &Self::QueryResult) -> u64;

    /// Opens the session for `access` to thread `thread_id`.
    fn begin<'a>(
        pool: &'a Pool<Self>,
        thread_id: &'a str,
        access: Access,
    ) -> impl Future<Output = Result<Self::Session, sqlx::Error>> + Send + 'a;

    /// The session's connection.
    fn conn(session: &mut Self::Session) -> Result<&mut Self::Connection, sqlx::Error>;

    /// Ends the session, committing what it wrote or, with `commit` false, rolling it back.
    fn end(
        session: Self::Session,
        commit: bool,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

/// A storage failure of the store.
pub(super) fn storage(error: impl std::fmt::Display) -> StoreError {
    StoreError::Storage(error.to_string())
}

/// A storage failure of the checkpointer.
pub(super) fn checkpoint_storage(error: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Storage(error.to_string())
}

/// Components cannot contain `/` (see [`validate_namespace`]), so joining with it is lossless
/// and keeps namespace prefixes as string prefixes.
pub(super) fn encode(namespace: &[String]) -> String {
    namespace.join("/")
}

/// Milliseconds since the Unix epoch, as the columns hold them.
pub(super) fn now() -> i64 {
    i64::try_from(now_ms()).unwrap_or(i64::MAX)
}

/// The migrations a database at schema `version` still needs. A database that a newer build
/// migrated is refused: this build cannot know what the newer schema means, so writing to it
/// could corrupt it. `location` names the database in that refusal.
pub(super) fn pending<'m>(
    migrations: &'m [&'static str],
    version: i64,
    location: &str,
) -> Result<&'m [&'static str], StoreError> {
    usize::try_from(version)
        .ok()
        .and_then(|applied| migrations.get(applied..))
        .ok_or_else(|| {
            StoreError::Storage(format!(
                "{location} has schema version {version}, but this build of deepagents knows versions up to {}; \
                 it was written by a newer deepagents (or another program). Upgrade deepagents to use it, \
                 or point it at another database; it was left unchanged",
                migrations.len()
            ))
        })
}

/// The store and checkpoint operations on a database: reads through one pool, writes through
/// another (the same one where the database takes concurrent writers).
pub(super) struct Sql<'a, D: Database> {
    pub(super) reader: &'a Pool<D>,
    pub(super) writer: &'a Pool<D>,
}

// The bounds say, once for every operation, that sqlx can run these queries on `D` and
// move their text and integer columns in and out; both databases meet them.
impl<D> Sql<'_, D>
where
    D: Dialect,
    for<'c> &'c mut D::Connection: Executor<'c, Database = D>,
    for<'q> D::Arguments<'q>: IntoArguments<'q, D>,
    for<'q> &'q str: Encode<'q, D> + Type<D>,
    for<'q> String: Encode<'q, D>,
    for<'q> Option<String>: Encode<'q, D>,
    for<'r> String: Decode<'r, D> + Type<D>,
    for<'q, 'r> i64: Encode<'q, D> + Decode<'r, D> + Type<D>,
    &'static str: ColumnIndex<D::Row>,
    usize: ColumnIndex<D::Row>,
{
    /// The item at `key` in `namespace`.
    pub(super) async fn get(
        &self,
        namespace: &[String],
        key: &str,
    ) -> Result<Option<StoreItem>, StoreError> {
        validate_item(namespace, key)?;
        let row = sqlx::query("SELECT * FROM store_items WHERE namespace = $1 AND key = $2")
            .bind(encode(namespace))
            .bind(key)
            .fetch_optional(self.reader)
            .await
            .map_err(storage)?;
        row.as_ref().map(Self::item).transpose()
    }

    /// Merges `patch` into the item at `key` in one statement (SQLite's `json_patch` is
    /// RFC 7396's merge); the item as it is now.
    #[cfg(feature = "sqlite")]
    pub(super) async fn merge(
        &self,
        namespace: &[String],
        key: &str,
        patch: &serde_json::Value,
    ) -> Result<Option<StoreItem>, StoreError> {
        validate_item(namespace, key)?;
        let row = sqlx::query(
            "UPDATE store_items SET value = json_patch(value, $3), updated_at_ms = $4
             WHERE namespace = $1 AND key = $2
             RETURNING *",
        )
        .bind(encode(namespace))
        .bind(key)
        .bind(patch.to_string())
        .bind(now())
        .fetch_optional(self.writer)
        .await
        .map_err(storage)?;
        row.as_ref().map(Self::item).transpose()
    }

    /// Removes the item at `key`; returns whether it existed.
    pub(super) async fn delete(&self, namespace: &[String], key: &str) -> Result<bool, StoreError> {
        validate_item(namespace, key)?;
        let done = sqlx::query("DELETE FROM store_items WHERE namespace = $1 AND key = $2")
            .bind(encode(namespace))
            .bind(key)
            .execute(self.writer)
            .await
            .map_err(storage)?;
        Ok(D::rows_affected(&done) > 0)
    }

    /// One page of the items under `namespace_prefix` whose key starts with the query's prefix.
    pub(super) async fn search(
        &self,
        namespace_prefix: &[String],
        query: &SearchQuery,
    ) -> Result<Vec<StoreItem>, StoreError> {
        if !namespace_prefix.is_empty() {
            validate_namespace(namespace_prefix)?;
        }
        // The namespace and those under it lie in one range of the primary key, from the
        // namespace up to it followed by '0' (the byte after '/'): bounded so, the search
        // reads that range of the index, not the whole table. (Both databases compare these
        // columns byte-wise.) What else lies in the range (`a-b` beside `a`) is filtered.
        // Without a namespace everything is searched (`$1` is bound either way).
        let within = if namespace_prefix.is_empty() {
            "$1 = ''".to_owned()
        } else {
            format!(
                "namespace >= $1 AND namespace < $1 || '0' AND (namespace = $1 OR {})",
                D::starts_with("namespace", "$1 || '/'")
            )
        };
        let sql = format!(
            "SELECT * FROM store_items
             WHERE {within} AND {}
             ORDER BY namespace, key
             LIMIT $3 OFFSET $4",
            D::starts_with("key", "$2"),
        );
        let rows = sqlx::query(&sql)
            .bind(encode(namespace_prefix))
            .bind(query.key_prefix.as_str())
            .bind(i64::try_from(query.limit).unwrap_or(i64::MAX))
            .bind(i64::try_from(query.offset).unwrap_or(i64::MAX))
            .fetch_all(self.reader)
            .await
            .map_err(storage)?;
        rows.iter().map(Self::item).collect()
    }

    /// A row of `store_items` as an item.
    pub(super) fn item(row: &D::Row) -> Result<StoreItem, StoreError> {
        let namespace: String = row.try_get("namespace").map_err(storage)?;
        let value: String = row.try_get("value").map_err(storage)?;
        let created: i64 = row.try_get("created_at_ms").map_err(storage)?;
        let updated: i64 = row.try_get("updated_at_ms").map_err(storage)?;
        Ok(StoreItem {
            namespace: namespace.split('/').map(str::to_owned).collect(),
            key: row.try_get("key").map_err(storage)?,
            value: serde_json::from_str(&value).map_err(storage)?,
            created_at_ms: u64::try_from(created).unwrap_or(0),
            updated_at_ms: u64::try_from(updated).unwrap_or(0),
        })
    }

    /// Creates or replaces the item at `key`, with the other writes under way at that moment
    /// in one transaction (see [`GroupCommit`]).
    pub(super) async fn put(
        &self,
        writes: &GroupCommit,
        namespace: &[String],
        key: &str,
        value: &serde_json::Value,
    ) -> Result<(), StoreError> {
        validate_item(namespace, key)?;
        let put = Put {
            namespace: encode(namespace),
            key: key.to_owned(),
            value: value.to_string(),
            at_ms: now(),
        };
        writes.put(put).await.map_err(StoreError::Storage)
    }

    /// Appends `delta` as the thread's next checkpoint, with the steps of the other runs
    /// saving at that moment in one transaction (see [`GroupCommit`]); the snapshot, when
    /// due, after it (the step is saved either way: a snapshot only shortens loads).
    pub(super) async fn append(
        &self,
        writes: &GroupCommit,
        thread_id: &str,
        delta: &RunDelta,
        run: &Run,
    ) -> Result<u64, CheckpointError> {
        let append = Append {
            thread_id: thread_id.to_owned(),
            delta: pack(serde_json::to_string(delta).map_err(checkpoint_storage)?),
            created_at_ms: now(),
            messages: i64::try_from(run.state.messages.len()).unwrap_or(i64::MAX),
        };
        let id = writes
            .append(append)
            .await
            .map_err(CheckpointError::Storage)?;
        if snapshot_due(id) {
            let written = match self.writer.acquire().await {
                Ok(mut conn) => Self::write_snapshot(&mut conn, thread_id, id, run).await,
                Err(error) => Err(checkpoint_storage(error)),
            };
            if let Err(error) = written {
                tracing::warn!(%thread_id, id, %error, "checkpoint saved without its snapshot");
            }
        }
        Ok(u64::try_from(id).unwrap_or(0))
    }

    /// Checks that the thread is absent and writes its first checkpoint in one statement, so
    /// two creations (forks) of the same id cannot both succeed.
    pub(super) async fn create(&self, thread_id: &str, run: &Run) -> Result<u64, CheckpointError> {
        let delta = pack(serde_json::to_string(&RunDelta::full(run)).map_err(checkpoint_storage)?);
        let mut session = D::begin(self.writer, thread_id, Access::Append)
            .await
            .map_err(checkpoint_storage)?;
        let conn = D::conn(&mut session).map_err(checkpoint_storage)?;
        let id: Result<Option<i64>, CheckpointError> = sqlx::query_scalar(
            "INSERT INTO checkpoints (thread_id, id, delta, snapshot, created_at_ms, messages)
             SELECT $1, 1, $2, NULL, $3, $4
             WHERE NOT EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = $1)
             RETURNING id",
        )
        .bind(thread_id)
        .bind(delta.as_str())
        .bind(now())
        .bind(i64::try_from(run.state.messages.len()).unwrap_or(i64::MAX))
        .fetch_optional(&mut *conn)
        .await
        .map_err(checkpoint_storage);
        D::end(session, id.is_ok())
            .await
            .map_err(checkpoint_storage)?;
        match id? {
            Some(id) => Ok(u64::try_from(id).unwrap_or(0)),
            None => Err(CheckpointError::AlreadyExists {
                thread_id: thread_id.to_owned(),
            }),
        }
    }

    /// Stores the whole run at checkpoint `id`, then drops the older snapshot. Only the newest
    /// is kept: older checkpoints load by replaying deltas from the start, and storage stays
    /// linear in the conversation's length. Where the dialect runs an append without a
    /// transaction, a failure before or between the two statements leaves a checkpoint without
    /// its snapshot (loads replay further) or two snapshots: both load the same run.
    pub(super) async fn write_snapshot(
        conn: &mut D::Connection,
        thread_id: &str,
        id: i64,
        run: &Run,
    ) -> Result<(), CheckpointError> {
        let snapshot = pack(deepagents_core::checkpoint::encode_snapshot(run)?);
        sqlx::query("UPDATE checkpoints SET snapshot = $3 WHERE thread_id = $1 AND id = $2")
            .bind(thread_id)
            .bind(id)
            .bind(snapshot)
            .execute(&mut *conn)
            .await
            .map_err(checkpoint_storage)?;
        sqlx::query(
            "UPDATE checkpoints SET snapshot = NULL
             WHERE thread_id = $1 AND id < $2 AND snapshot IS NOT NULL",
        )
        .bind(thread_id)
        .bind(id)
        .execute(&mut *conn)
        .await
        .map_err(checkpoint_storage)?;
        Ok(())
    }

    /// The id of the thread's newest checkpoint, 0 when it has none.
    async fn last_id(conn: &mut D::Connection, thread_id: &str) -> Result<i64, CheckpointError> {
        sqlx::query_scalar("SELECT COALESCE(MAX(id), 0) FROM checkpoints WHERE thread_id = $1")
            .bind(thread_id)
            .fetch_one(conn)
            .await
            .map_err(checkpoint_storage)
    }

    /// The run at checkpoint `at` of the thread (its newest without `at`): the newest snapshot
    /// at or before it, then the deltas after that snapshot replayed in order.
    pub(super) async fn load(
        &self,
        thread_id: &str,
        at: Option<u64>,
    ) -> Result<Option<Run>, CheckpointError> {
        let mut session = D::begin(self.reader, thread_id, Access::Load)
            .await
            .map_err(checkpoint_storage)?;
        let conn = D::conn(&mut session).map_err(checkpoint_storage)?;
        let last = Self::last_id(&mut *conn, thread_id).await?;
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
        .fetch_optional(&mut *conn)
        .await
        .map_err(checkpoint_storage)?;
        let (mut run, from) = match base {
            Some(row) => {
                let snapshot: String = row.try_get("snapshot").map_err(checkpoint_storage)?;
                let id: i64 = row.try_get("id").map_err(checkpoint_storage)?;
                (
                    deepagents_core::checkpoint::decode_snapshot(&unpack(&snapshot)?)?,
                    id,
                )
            }
            None => (Run::default(), 0),
        };
        let deltas = sqlx::query(
            "SELECT delta FROM checkpoints WHERE thread_id = $1 AND id > $2 AND id <= $3 ORDER BY id",
        )
        .bind(thread_id)
        .bind(from)
        .bind(target)
        .fetch_all(&mut *conn)
        .await
        .map_err(checkpoint_storage)?;
        D::end(session, true).await.map_err(checkpoint_storage)?;
        for row in deltas {
            let delta: String = row.try_get("delta").map_err(checkpoint_storage)?;
            RunDelta::decode(&unpack(&delta)?)?.apply(&mut run);
        }
        Ok(Some(run))
    }

    /// The thread's checkpoints, oldest first.
    pub(super) async fn checkpoints(
        &self,
        thread_id: &str,
    ) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        let rows = sqlx::query(
            "SELECT id, created_at_ms, messages FROM checkpoints WHERE thread_id = $1 ORDER BY id",
        )
        .bind(thread_id)
        .fetch_all(self.reader)
        .await
        .map_err(checkpoint_storage)?;
        rows.iter()
            .map(|row| {
                Ok(CheckpointInfo {
                    id: Self::count(row, "id")?,
                    created_at_ms: Self::count(row, "created_at_ms")?,
                    messages: usize::try_from(Self::count(row, "messages")?).unwrap_or(0),
                })
            })
            .collect()
    }

    /// The threads that are not children of another, most recently updated first.
    pub(super) async fn threads(&self) -> Result<Vec<ThreadInfo>, CheckpointError> {
        let sql = format!(
            "SELECT thread_id, COUNT(*) AS n, MAX(created_at_ms) AS updated FROM checkpoints
             WHERE {} = 0
             GROUP BY thread_id ORDER BY updated DESC, thread_id",
            D::position("thread_id", "$1"),
        );
        let rows = sqlx::query(&sql)
            .bind(CHILD_THREAD_SEPARATOR.to_string())
            .fetch_all(self.reader)
            .await
            .map_err(checkpoint_storage)?;
        rows.iter()
            .map(|row| {
                Ok(ThreadInfo {
                    thread_id: row.try_get("thread_id").map_err(checkpoint_storage)?,
                    checkpoints: Self::count(row, "n")?,
                    updated_at_ms: Self::count(row, "updated")?,
                })
            })
            .collect()
    }

    /// A non-negative integer column (a negative one, which this code never writes, as 0).
    fn count(row: &D::Row, column: &'static str) -> Result<u64, CheckpointError> {
        let value: i64 = row.try_get(column).map_err(checkpoint_storage)?;
        Ok(u64::try_from(value).unwrap_or(0))
    }

    /// Deletes the thread's checkpoints and its children's; returns whether it had any.
    pub(super) async fn delete_thread(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        let mut session = D::begin(self.writer, thread_id, Access::Delete)
            .await
            .map_err(checkpoint_storage)?;
        let conn = D::conn(&mut session).map_err(checkpoint_storage)?;
        sqlx::query(&format!(
            "DELETE FROM checkpoints WHERE {}",
            D::starts_with("thread_id", "$1")
        ))
        .bind(format!("{thread_id}{CHILD_THREAD_SEPARATOR}"))
        .execute(&mut *conn)
        .await
        .map_err(checkpoint_storage)?;
        let done = sqlx::query("DELETE FROM checkpoints WHERE thread_id = $1")
            .bind(thread_id)
            .execute(&mut *conn)
            .await
            .map_err(checkpoint_storage)?;
        D::end(session, true).await.map_err(checkpoint_storage)?;
        Ok(D::rows_affected(&done) > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::{COMPRESSED, pack, snapshot_due, unpack};

    #[test]
    fn long_values_are_stored_compressed_and_read_back() {
        let short = r#"{"schema":3}"#.to_owned();
        assert_eq!(pack(short.clone()), short);
        let long = format!(r#"{{"text":"{}"}}"#, "/f1.txt\\n".repeat(200));
        let packed = pack(long.clone());
        assert!(
            packed.starts_with(COMPRESSED) && packed.len() < long.len() / 4,
            "{packed}"
        );
        assert_eq!(unpack(&packed).unwrap(), long);
        assert_eq!(unpack(&long).unwrap(), long);
        // One compressor per thread, reset between values: each reads back as it was, an
        // output larger than first guessed (values that hardly compress) included.
        let noisy: String = (0..20_000u32)
            .map(|i| char::from(b'a' + (i.wrapping_mul(2_654_435_761) >> 27) as u8 % 26))
            .collect();
        for value in [long.clone(), format!(r#"{{"n":"{noisy}"}}"#), long.clone()] {
            assert_eq!(unpack(&pack(value.clone())).unwrap(), value);
        }
        let damaged = unpack("~not base64!").unwrap_err().to_string();
        assert!(
            damaged.contains("damaged compressed checkpoint"),
            "{damaged}"
        );
    }

    #[test]
    fn snapshots_are_spaced_geometrically() {
        let due: Vec<i64> = (1..=400).filter(|&id| snapshot_due(id)).collect();
        assert_eq!(due, [50, 75, 112, 168, 252, 378]);
    }
}
