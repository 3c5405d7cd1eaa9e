//! A store in PostgreSQL: shared by every process that reaches the server.

use std::str::FromStr;

use async_trait::async_trait;
use serde_json::Value;
use sqlx::Row;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};

use super::{SearchQuery, Store, StoreError, StoreItem, validate_namespace};
use crate::memory::now_ms;

/// Schema migrations, applied in order; the `deepagents_schema` table records how many ran.
/// Text columns use the `C` collation so ordering and prefixes are bytewise, as in SQLite.
const MIGRATIONS: &[&str] = &[
    "CREATE TABLE store_items (
        namespace TEXT COLLATE \"C\" NOT NULL,
        key TEXT COLLATE \"C\" NOT NULL,
        value TEXT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        updated_at_ms BIGINT NOT NULL,
        PRIMARY KEY (namespace, key)
    )",
    // Checkpoints: one row per step holding its delta; every SNAPSHOT_EVERY-th row also holds
    // the whole run, so loading replays at most that many deltas.
    "CREATE TABLE checkpoints (
        thread_id TEXT COLLATE \"C\" NOT NULL,
        id BIGINT NOT NULL,
        delta TEXT NOT NULL,
        snapshot TEXT,
        created_at_ms BIGINT NOT NULL,
        messages BIGINT NOT NULL,
        PRIMARY KEY (thread_id, id)
    )",
];

/// The advisory lock held while migrating, so concurrent openers apply migrations once.
const MIGRATION_LOCK: i64 = 0x6465_6570_6167_6e74; // "deepagnt"

/// A [`Store`] in a PostgreSQL database. The same database also holds checkpoints: see
/// [`PostgresStore::checkpointer`].
#[derive(Clone, Debug)]
pub struct PostgresStore {
    pub(super) pool: PgPool,
}

fn storage(error: impl std::fmt::Display) -> StoreError {
    StoreError::Storage(error.to_string())
}

/// Components cannot contain `/` (see [`validate_namespace`]), so joining with it is lossless
/// and keeps namespace prefixes as string prefixes.
fn encode(namespace: &[String]) -> String {
    namespace.join("/")
}

/// Checks a schema name: letters, digits and `_`, not starting with a digit, at most 63 bytes.
fn validate_schema(schema: &str) -> Result<(), StoreError> {
    let valid = !schema.is_empty()
        && schema.len() <= 63
        && !schema.starts_with(|c: char| c.is_ascii_digit())
        && schema
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(StoreError::Storage(format!(
            "invalid PostgreSQL schema name `{schema}`; use up to 63 letters, digits and _, not starting with a digit"
        )))
    }
}

impl PostgresStore {
    /// Connects to the database at `url` (e.g. `postgres://user:pass@host:5432/db`) and
    /// migrates it; tables go in the connection's default schema (normally `public`).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(Self::options(url)?, None).await
    }

    /// Like [`PostgresStore::connect`], but keeps every table in `schema` (created if
    /// missing), so several independent stores can share one database. `schema` is made of
    /// letters, digits and `_`.
    pub async fn connect_in_schema(url: &str, schema: &str) -> Result<Self, StoreError> {
        validate_schema(schema)?;
        let options = Self::options(url)?.options([("search_path", schema)]);
        Self::connect_with(options, Some(schema)).await
    }

    fn options(url: &str) -> Result<PgConnectOptions, StoreError> {
        PgConnectOptions::from_str(url).map_err(|e| {
            StoreError::Storage(format!(
                "invalid PostgreSQL URL: {e}; expected postgres://user:password@host:port/database"
            ))
        })
    }

    async fn connect_with(
        options: PgConnectOptions,
        schema: Option<&str>,
    ) -> Result<Self, StoreError> {
        let (host, port, database) = (
            options.get_host().to_owned(),
            options.get_port(),
            options.get_database().unwrap_or("(default)").to_owned(),
        );
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(std::time::Duration::from_secs(30))
            .connect_with(options)
            .await
            .map_err(|e| {
                StoreError::Storage(format!(
                    "cannot connect to the PostgreSQL store at {host}:{port}/{database}: {e}; check that the server is running and the URL's credentials"
                ))
            })?;
        let mut tx = pool.begin().await.map_err(storage)?;
        // The lock is released at commit or rollback, so concurrent openers queue here.
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(storage)?;
        let location = format!(
            "the PostgreSQL store at {host}:{port}/{database}{}",
            schema
                .map(|s| format!(" (schema `{s}`)"))
                .unwrap_or_default()
        );
        Self::migrate(&mut tx, schema, &location).await?;
        tx.commit().await.map_err(storage)?;
        Ok(Self { pool })
    }

    /// The schema version this build writes: the number of migrations it knows. A connected
    /// database records it in its `deepagents_schema` table.
    pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

    async fn migrate(
        conn: &mut sqlx::PgConnection,
        schema: Option<&str>,
        location: &str,
    ) -> Result<(), StoreError> {
        if let Some(schema) = schema {
            // Validated by the caller: an identifier that needs no quoting beyond this.
            sqlx::query(&format!("CREATE SCHEMA IF NOT EXISTS \"{schema}\""))
                .execute(&mut *conn)
                .await
                .map_err(storage)?;
        }
        sqlx::query("CREATE TABLE IF NOT EXISTS deepagents_schema (version BIGINT NOT NULL)")
            .execute(&mut *conn)
            .await
            .map_err(storage)?;
        let version: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM deepagents_schema")
            .fetch_one(&mut *conn)
            .await
            .map_err(storage)?;
        let version = version.unwrap_or(0);
        let Some(pending) = usize::try_from(version)
            .ok()
            .and_then(|applied| MIGRATIONS.get(applied..))
        else {
            return Err(StoreError::Storage(newer_schema(
                location,
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
        sqlx::query("DELETE FROM deepagents_schema")
            .execute(&mut *conn)
            .await
            .map_err(storage)?;
        sqlx::query("INSERT INTO deepagents_schema (version) VALUES ($1)")
            .bind(i64::try_from(MIGRATIONS.len()).unwrap_or(i64::MAX))
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

fn item(row: &PgRow) -> Result<StoreItem, StoreError> {
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
impl Store for PostgresStore {
    async fn get(&self, namespace: &[String], key: &str) -> Result<Option<StoreItem>, StoreError> {
        validate_namespace(namespace)?;
        let row = sqlx::query("SELECT * FROM store_items WHERE namespace = $1 AND key = $2")
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
             VALUES ($1, $2, $3, $4, $4)
             ON CONFLICT (namespace, key) DO UPDATE SET value = $3, updated_at_ms = $4",
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
        let done = sqlx::query("DELETE FROM store_items WHERE namespace = $1 AND key = $2")
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
        // starts_with instead of LIKE: `_` is legal in components and keys.
        let rows = sqlx::query(
            "SELECT * FROM store_items
             WHERE ($1 = '' OR namespace = $1 OR starts_with(namespace, $1 || '/'))
               AND starts_with(key, $2)
             ORDER BY namespace, key
             LIMIT $3 OFFSET $4",
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

    /// Closes the connection pool (and the checkpointer's, which is the same one).
    async fn close(&self) {
        self.pool.close().await;
    }
}
