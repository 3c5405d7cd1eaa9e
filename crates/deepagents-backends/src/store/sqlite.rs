//! SQLite: the embedded default store and its checkpointer, and what the shared SQL
//! ([`super::sql`]) needs done the SQLite way.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deepagents_core::{
    CheckpointError, CheckpointInfo, Checkpointer, LocalLeases, Run, RunDelta, ThreadInfo,
    ThreadLease,
};
use serde_json::Value;
use sqlx::pool::PoolConnection;
use sqlx::sqlite::{
    SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteQueryResult, SqliteSynchronous,
};
use sqlx::{Sqlite, SqliteConnection, SqlitePool as Pool};

use super::file_lock;
use super::group_commit::{GroupCommit, SqliteGroups};
use super::sql::{self, Access, Dialect, Sql, storage};
use super::{SearchQuery, Store, StoreError, StoreItem};

/// Schema migrations, applied in order; `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE store_items (
        namespace TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        created_at_ms INTEGER NOT NULL,
        updated_at_ms INTEGER NOT NULL,
        PRIMARY KEY (namespace, key)
    ) WITHOUT ROWID",
    // Checkpoints: one row per save holding its delta; rows at geometrically spaced ids
    // (`snapshot_due`) also hold the whole run, of which only the newest is kept.
    "CREATE TABLE checkpoints (
        thread_id TEXT NOT NULL,
        id INTEGER NOT NULL,
        delta TEXT NOT NULL,
        snapshot TEXT,
        created_at_ms INTEGER NOT NULL,
        messages INTEGER NOT NULL,
        PRIMARY KEY (thread_id, id)
    ) WITHOUT ROWID",
];

/// A [`Store`] in a SQLite database file (or in memory). The same database also holds
/// checkpoints: see [`SqliteStore::checkpointer`].
#[derive(Clone, Debug)]
pub struct SqliteStore {
    /// Readers: WAL lets them run beside the writer.
    pool: Pool,
    /// The one connection this process writes through. SQLite admits one writer at a time;
    /// writes of this process queue here, in order and without sleeping, instead of racing
    /// for the database's lock and backing off on `SQLITE_BUSY`.
    writer: Pool,
    /// Checkpoint appends and item writes, written in groups through `writer`: those that
    /// come while a group commits go together in the next.
    writes: Arc<GroupCommit>,
    leases: Leases,
}

/// Where a store's thread leases live.
#[derive(Clone, Debug)]
enum Leases {
    /// Lock files in this directory, shared by every process that opens the database.
    Files(PathBuf),
    /// In this process: nobody else can open an in-memory database.
    Local(LocalLeases),
}

/// How long a connection waits for another one's write to finish.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and migrates it.
    ///
    /// Processes may open one database at once: they take turns on a lock file beside it
    /// while one creates it, switches it to WAL mode and migrates it (SQLite refuses a
    /// concurrent switch at once rather than waiting), then share it.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let open_lock = file_lock::open_lock_path(path);
        let opening = file_lock::lock(&open_lock, Duration::from_secs(30))
            .await
            .map_err(|e| StoreError::Storage(open_error(path, &e.to_string(), e.kind())))?;
        // In WAL mode NORMAL syncs at checkpoints, not at every commit: a commit survives the
        // process being killed at any point; a power loss or OS crash may lose the last
        // commits before the log's latest sync (see docs/configuration.md).
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .busy_timeout(BUSY_TIMEOUT)
            .synchronous(SqliteSynchronous::Normal);
        let pool = SqlitePoolOptions::new()
            .connect_with(options.clone())
            .await
            .map_err(|e| StoreError::Storage(sqlite_open_error(path, &e)))?;
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await
            .map_err(|e| StoreError::Storage(sqlite_open_error(path, &e)))?;
        // WAL lets readers proceed during a write. The mode is stored in the file, so it is
        // set once, by whichever process finds it unset.
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&pool)
            .await
            .map_err(|e| StoreError::Storage(sqlite_open_error(path, &e)))?;
        if !mode.eq_ignore_ascii_case("wal") {
            sqlx::query("PRAGMA journal_mode = WAL")
                .execute(&pool)
                .await
                .map_err(|e| StoreError::Storage(sqlite_open_error(path, &e)))?;
        }
        let store = Self::migrated(
            pool,
            writer,
            &path.display().to_string(),
            Leases::Files(file_lock::lease_dir(path)),
        )
        .await?;
        drop(opening);
        Ok(store)
    }

    /// A private in-memory database.
    pub async fn in_memory() -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::from_str("sqlite::memory:").map_err(storage)?;
        // Every connection to `:memory:` is a separate database: keep exactly one.
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .idle_timeout(None)
            .max_lifetime(None)
            .connect_with(options)
            .await
            .map_err(storage)?;
        Self::migrated(
            pool.clone(),
            pool,
            ":memory:",
            Leases::Local(LocalLeases::new()),
        )
        .await
    }

    /// The schema version this build writes: the number of migrations it knows. An opened
    /// database records it in `PRAGMA user_version`.
    pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

    async fn migrated(
        pool: SqlitePool,
        writer: SqlitePool,
        location: &str,
        leases: Leases,
    ) -> Result<Self, StoreError> {
        // IMMEDIATE takes the write lock up front, so processes opening the store at once
        // queue on the busy timeout instead of failing on a lock upgrade; the transaction
        // object rolls back if the caller is cancelled.
        let mut conn = writer
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(storage)?;
        let migrated = Self::migrate(&mut conn, location).await;
        if migrated.is_ok() {
            conn.commit().await.map_err(storage)?;
        } else {
            conn.rollback().await.map_err(storage)?;
        }
        migrated?;
        let writes = GroupCommit::start(
            Arc::new(SqliteGroups {
                writer: writer.clone(),
            }),
            1,
        );
        Ok(Self {
            pool,
            writer,
            writes: Arc::new(writes),
            leases,
        })
    }

    /// Applies the migrations the database lacks, inside the caller's transaction.
    async fn migrate(conn: &mut SqliteConnection, location: &str) -> Result<(), StoreError> {
        let version: i64 = sqlx::query_scalar("PRAGMA user_version")
            .fetch_one(&mut *conn)
            .await
            .map_err(storage)?;
        let pending = sql::pending(MIGRATIONS, version, &format!("the SQLite store {location}"))?;
        if pending.is_empty() {
            return Ok(());
        }
        for migration in pending {
            sqlx::query(migration)
                .execute(&mut *conn)
                .await
                .map_err(storage)?;
        }
        sqlx::query(&format!("PRAGMA user_version = {}", MIGRATIONS.len()))
            .execute(&mut *conn)
            .await
            .map_err(storage)?;
        Ok(())
    }

    /// The shared SQL over this store's database.
    fn sql(&self) -> Sql<'_, Sqlite> {
        Sql {
            reader: &self.pool,
            writer: &self.writer,
        }
    }

    /// Checkpoints kept in this store's database.
    pub fn checkpointer(&self) -> SqliteCheckpointer {
        SqliteCheckpointer {
            store: self.clone(),
        }
    }
}

/// Why `path` could not be opened, with what to do about it.
fn sqlite_open_error(path: &Path, error: &sqlx::Error) -> String {
    let code = error
        .as_database_error()
        .and_then(|e| e.code())
        .and_then(|code| code.parse::<i32>().ok())
        // Extended result codes keep the primary code in their low byte.
        .map(|code| code & 0xff);
    let kind = match (code, error) {
        (Some(5 | 6), _) => std::io::ErrorKind::ResourceBusy,
        (Some(8 | 14 | 23), _) => std::io::ErrorKind::PermissionDenied,
        (_, sqlx::Error::Io(io)) => io.kind(),
        _ => std::io::ErrorKind::Other,
    };
    open_error(path, &error.to_string(), kind)
}

/// Why `path` could not be opened, from an error of the given kind.
fn open_error(path: &Path, error: &str, kind: std::io::ErrorKind) -> String {
    let hint = match kind {
        std::io::ErrorKind::ResourceBusy | std::io::ErrorKind::TimedOut => {
            "another process keeps the database busy; try again when it is done"
        }
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
            "the file or its directory is not writable; fix its permissions or use another directory"
        }
        std::io::ErrorKind::NotFound => "its directory does not exist",
        _ => "check that it is a SQLite database on a local disk",
    };
    format!(
        "cannot open SQLite store {}: {error}; {hint}",
        path.display()
    )
}

#[async_trait]
impl Store for SqliteStore {
    async fn get(&self, namespace: &[String], key: &str) -> Result<Option<StoreItem>, StoreError> {
        self.sql().get(namespace, key).await
    }

    /// Written with the other writes under way at that moment, in one transaction (see
    /// [`GroupCommit`]).
    async fn put(&self, namespace: &[String], key: &str, value: Value) -> Result<(), StoreError> {
        self.sql().put(&self.writes, namespace, key, &value).await
    }

    /// One statement: SQLite's `json_patch` is RFC 7396's merge.
    async fn merge(
        &self,
        namespace: &[String],
        key: &str,
        patch: &Value,
    ) -> Result<Option<StoreItem>, StoreError> {
        self.sql().merge(namespace, key, patch).await
    }

    async fn delete(&self, namespace: &[String], key: &str) -> Result<bool, StoreError> {
        self.sql().delete(namespace, key).await
    }

    async fn search(
        &self,
        namespace_prefix: &[String],
        query: &SearchQuery,
    ) -> Result<Vec<StoreItem>, StoreError> {
        self.sql().search(namespace_prefix, query).await
    }

    /// Waits for connections in use to be returned, then closes them all, which folds the
    /// write-ahead log into the database file and removes it. Clones of the store (and its
    /// checkpointer) are closed too.
    async fn close(&self) {
        // Closing the last connection folds the log in too, but connections of a pool close
        // concurrently and none may find itself last; truncating first makes sure.
        let _ = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&self.writer)
            .await;
        self.pool.close().await;
        self.writer.close().await;
    }
}

/// A [`Checkpointer`] in the database of a [`SqliteStore`]. Each step writes only its delta,
/// so a step's cost does not grow with the conversation; checkpoints at geometrically spaced ids
/// (50, 75, 112, …) also hold the whole run, so loading the latest state replays at most a
/// third of the deltas. Only the newest snapshot is kept (an older checkpoint loads by
/// replaying from the start), so storage grows linearly.
#[derive(Clone, Debug)]
pub struct SqliteCheckpointer {
    store: SqliteStore,
}

#[async_trait]
impl Checkpointer for SqliteCheckpointer {
    /// Saved with the steps of the other runs saving at that moment, in one transaction
    /// (see [`GroupCommit`]); the snapshot, when due, after it.
    async fn append(
        &self,
        thread_id: &str,
        delta: &RunDelta,
        run: &Run,
    ) -> Result<u64, CheckpointError> {
        let store = &self.store;
        store
            .sql()
            .append(&store.writes, thread_id, delta, run)
            .await
    }

    /// Checks that the thread is absent and writes its first checkpoint in one transaction,
    /// so two creations (forks) of the same id cannot both succeed.
    async fn create(&self, thread_id: &str, run: &Run) -> Result<u64, CheckpointError> {
        self.store.sql().create(thread_id, run).await
    }

    async fn load(&self, thread_id: &str, at: Option<u64>) -> Result<Option<Run>, CheckpointError> {
        self.store.sql().load(thread_id, at).await
    }

    async fn checkpoints(&self, thread_id: &str) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        self.store.sql().checkpoints(thread_id).await
    }

    async fn threads(&self) -> Result<Vec<ThreadInfo>, CheckpointError> {
        self.store.sql().threads().await
    }

    async fn try_lease(&self, thread_id: &str) -> Result<ThreadLease, CheckpointError> {
        match &self.store.leases {
            Leases::Files(dir) => file_lock::try_lease(dir, thread_id),
            Leases::Local(leases) => leases.try_lease(thread_id),
        }
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        let deleted = self.store.sql().delete_thread(thread_id).await?;
        if let Leases::Files(dir) = &self.store.leases {
            file_lock::remove_lease(dir, thread_id);
        }
        Ok(deleted)
    }
}

/// Where an operation on a thread's checkpoints runs in SQLite: a pooled connection, each
/// statement its own transaction. An append is one statement (SQLite runs one writer at a
/// time, so the id it picks is still the last at its insert); a load reads only rows up to
/// the last id it found first, which later appends leave alone; a delete removes the
/// children before the thread, so a failure half-way leaves a thread that still loads.
pub(super) type SqliteSession = PoolConnection<Sqlite>;

impl Dialect for Sqlite {
    type Session = SqliteSession;

    fn starts_with(text: &str, prefix: &str) -> String {
        format!("substr({text}, 1, length({prefix})) = {prefix}")
    }

    fn position(text: &str, part: &str) -> String {
        format!("instr({text}, {part})")
    }

    fn rows_affected(done: &SqliteQueryResult) -> u64 {
        done.rows_affected()
    }

    async fn begin(
        pool: &Pool,
        _thread_id: &str,
        _access: Access,
    ) -> Result<SqliteSession, sqlx::Error> {
        pool.acquire().await
    }

    fn conn(session: &mut SqliteSession) -> Result<&mut SqliteConnection, sqlx::Error> {
        Ok(session)
    }

    async fn end(_session: SqliteSession, _commit: bool) -> Result<(), sqlx::Error> {
        Ok(())
    }
}
