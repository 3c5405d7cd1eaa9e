//! A store in SQLite: the embedded default.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use deepagents_core::LocalLeases;
use serde_json::Value;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use sqlx::{Row, SqlitePool as Pool};

use super::file_lock;
use super::{SearchQuery, Store, StoreError, StoreItem, validate_namespace};
use crate::memory::now_ms;

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
    // Checkpoints: one row per step holding its delta; every SNAPSHOT_EVERY-th row also holds
    // the whole run, so loading replays at most that many deltas.
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
    pub(super) pool: Pool,
    pub(super) leases: Leases,
}

/// Where a store's thread leases live.
#[derive(Clone, Debug)]
pub(super) enum Leases {
    /// Lock files in this directory, shared by every process that opens the database.
    Files(PathBuf),
    /// In this process: nobody else can open an in-memory database.
    Local(LocalLeases),
}

/// A pooled connection for one write transaction. If the future using it is dropped before
/// [`done`](Self::done) — a cancelled caller, an aborted task — the connection is closed
/// instead of returned to the pool: closing ends its open transaction, whereas a pooled
/// connection would keep the database's write lock for as long as it lives.
pub(super) struct WriteConnection {
    conn: Option<sqlx::pool::PoolConnection<sqlx::Sqlite>>,
}

impl WriteConnection {
    pub(super) async fn acquire(pool: &Pool) -> Result<Self, sqlx::Error> {
        Ok(Self {
            conn: Some(pool.acquire().await?),
        })
    }

    /// The connection (always there until [`done`](Self::done) consumes the guard).
    pub(super) fn conn(&mut self) -> Result<&mut sqlx::SqliteConnection, sqlx::Error> {
        self.conn.as_deref_mut().ok_or(sqlx::Error::PoolClosed)
    }

    /// The transaction ended: the connection may go back to the pool.
    pub(super) fn done(mut self) {
        self.conn.take();
    }
}

impl Drop for WriteConnection {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            drop(conn.detach());
        }
    }
}

/// How long a connection waits for another one's write to finish.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

fn storage(error: impl std::fmt::Display) -> StoreError {
    StoreError::Storage(error.to_string())
}

/// Components cannot contain `/` (see [`validate_namespace`]), so joining with it is lossless
/// and keeps namespace prefixes as string prefixes.
fn encode(namespace: &[String]) -> String {
    namespace.join("/")
}

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
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .busy_timeout(BUSY_TIMEOUT);
        let pool = SqlitePoolOptions::new()
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
        Self::migrated(pool, ":memory:", Leases::Local(LocalLeases::new())).await
    }

    /// The schema version this build writes: the number of migrations it knows. An opened
    /// database records it in `PRAGMA user_version`.
    pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

    async fn migrated(
        pool: SqlitePool,
        location: &str,
        leases: Leases,
    ) -> Result<Self, StoreError> {
        // IMMEDIATE takes the write lock up front, so processes opening the store at once
        // queue on the busy timeout instead of failing on a lock upgrade; the transaction
        // object rolls back if the caller is cancelled.
        let mut conn = pool.begin_with("BEGIN IMMEDIATE").await.map_err(storage)?;
        let migrated = Self::migrate(&mut conn, location).await;
        if migrated.is_ok() {
            conn.commit().await.map_err(storage)?;
        } else {
            conn.rollback().await.map_err(storage)?;
        }
        migrated?;
        Ok(Self { pool, leases })
    }

    async fn migrate(conn: &mut sqlx::SqliteConnection, location: &str) -> Result<(), StoreError> {
        let version: i64 = sqlx::query_scalar("PRAGMA user_version")
            .fetch_one(&mut *conn)
            .await
            .map_err(storage)?;
        let Some(pending) = usize::try_from(version)
            .ok()
            .and_then(|applied| MIGRATIONS.get(applied..))
        else {
            return Err(StoreError::Storage(newer_schema(
                &format!("the SQLite store {location}"),
                version,
                MIGRATIONS.len(),
            )));
        };
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

/// The refusal to open a database that a newer build migrated: this build cannot know what
/// the newer schema means, so writing to it could corrupt it.
fn newer_schema(what: &str, found: i64, known: usize) -> String {
    format!(
        "{what} has schema version {found}, but this build of deepagents knows versions up to {known}; \
         it was written by a newer deepagents (or another program). Upgrade deepagents to use it, \
         or point it at another database; it was left unchanged"
    )
}

fn item(row: &sqlx::sqlite::SqliteRow) -> Result<StoreItem, StoreError> {
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

#[async_trait]
impl Store for SqliteStore {
    async fn get(&self, namespace: &[String], key: &str) -> Result<Option<StoreItem>, StoreError> {
        validate_namespace(namespace)?;
        let row = sqlx::query("SELECT * FROM store_items WHERE namespace = ?1 AND key = ?2")
            .bind(encode(namespace))
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(storage)?;
        row.as_ref().map(item).transpose()
    }

    async fn put(&self, namespace: &[String], key: &str, value: Value) -> Result<(), StoreError> {
        validate_namespace(namespace)?;
        let now = i64::try_from(now_ms()).unwrap_or(i64::MAX);
        sqlx::query(
            "INSERT INTO store_items (namespace, key, value, created_at_ms, updated_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?4)
             ON CONFLICT (namespace, key) DO UPDATE SET value = ?3, updated_at_ms = ?4",
        )
        .bind(encode(namespace))
        .bind(key)
        .bind(value.to_string())
        .bind(now)
        .execute(&self.pool)
        .await
        .map_err(storage)?;
        Ok(())
    }

    async fn delete(&self, namespace: &[String], key: &str) -> Result<bool, StoreError> {
        validate_namespace(namespace)?;
        let done = sqlx::query("DELETE FROM store_items WHERE namespace = ?1 AND key = ?2")
            .bind(encode(namespace))
            .bind(key)
            .execute(&self.pool)
            .await
            .map_err(storage)?;
        Ok(done.rows_affected() > 0)
    }

    async fn search(
        &self,
        namespace_prefix: &[String],
        query: &SearchQuery,
    ) -> Result<Vec<StoreItem>, StoreError> {
        if !namespace_prefix.is_empty() {
            validate_namespace(namespace_prefix)?;
        }
        let prefix = encode(namespace_prefix);
        // substr comparisons instead of LIKE: `_` is legal in components and keys.
        let rows = sqlx::query(
            "SELECT * FROM store_items
             WHERE (?1 = '' OR namespace = ?1 OR substr(namespace, 1, length(?1) + 1) = ?1 || '/')
               AND substr(key, 1, length(?2)) = ?2
             ORDER BY namespace, key
             LIMIT ?3 OFFSET ?4",
        )
        .bind(prefix)
        .bind(&query.key_prefix)
        .bind(i64::try_from(query.limit).unwrap_or(i64::MAX))
        .bind(i64::try_from(query.offset).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await
        .map_err(storage)?;
        rows.iter().map(item).collect()
    }

    /// Waits for connections in use to be returned, then closes them all, which folds the
    /// write-ahead log into the database file and removes it. Clones of the store (and its
    /// checkpointer) are closed too.
    async fn close(&self) {
        // Closing the last connection folds the log in too, but connections of a pool close
        // concurrently and none may find itself last; truncating first makes sure.
        let _ = sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&self.pool)
            .await;
        self.pool.close().await;
    }
}
