//! A store in SQLite: the embedded default.

use std::path::Path;
use std::str::FromStr;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use sqlx::{Row, SqlitePool as Pool};

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
}

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
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path.as_ref())
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(std::time::Duration::from_secs(10));
        let pool = SqlitePoolOptions::new()
            .connect_with(options)
            .await
            .map_err(|e| {
                StoreError::Storage(format!(
                    "cannot open SQLite store {}: {e}",
                    path.as_ref().display()
                ))
            })?;
        Self::migrated(pool, &path.as_ref().display().to_string()).await
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
        Self::migrated(pool, ":memory:").await
    }

    /// The schema version this build writes: the number of migrations it knows. An opened
    /// database records it in `PRAGMA user_version`.
    pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

    async fn migrated(pool: SqlitePool, location: &str) -> Result<Self, StoreError> {
        let mut conn = pool.acquire().await.map_err(storage)?;
        // IMMEDIATE takes the write lock up front, so processes opening the store at once
        // queue on the busy timeout instead of failing on a lock upgrade.
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut *conn)
            .await
            .map_err(storage)?;
        let migrated = Self::migrate(&mut conn, location).await;
        let end = if migrated.is_ok() {
            "COMMIT"
        } else {
            "ROLLBACK"
        };
        sqlx::query(end)
            .execute(&mut *conn)
            .await
            .map_err(storage)?;
        migrated?;
        drop(conn);
        Ok(Self { pool })
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
}
