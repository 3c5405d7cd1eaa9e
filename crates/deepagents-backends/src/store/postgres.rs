//! PostgreSQL: a store and checkpointer shared by every process that reaches the server,
//! and what the shared SQL ([`super::sql`]) needs done the PostgreSQL way.

use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;
use deepagents_core::{
    CheckpointError, CheckpointInfo, Checkpointer, LocalLeases, Run, RunDelta, ThreadInfo,
    ThreadLease, validate_thread_id,
};
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgQueryResult};
use sqlx::{PgConnection, Postgres, Transaction};

use super::group_commit::{GroupCommit, PostgresGroups};
use super::sql::{self, Access, Dialect, Sql, checkpoint_storage, storage};
use super::{SearchQuery, Store, StoreError, StoreItem, validate_item};

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
    // Checkpoints: one row per save holding its delta; rows at geometrically spaced ids
    // (`snapshot_due`) also hold the whole run, of which only the newest is kept.
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

/// The first key of the per-thread advisory locks taken while appending.
const APPEND_LOCK_CLASS: i32 = 0x6461_636b; // "dack"

/// How many groups of writes commit at once: while one waits on the database, the next is
/// written.
const GROUP_WRITERS: usize = 4;

/// The session lock that leases a thread: a 64-bit hash of the schema and the thread id.
/// Session locks belong to the connection, so a lease dies with its process.
const LEASE_LOCK: &str = "hashtextextended(current_schema() || '/' || $1, 7)";

/// How many connections a store's pool opens at most: its statements are short, and a
/// process's leases hold none of them (see [`Leases`]).
const POOL_SIZE: u32 = 16;

/// A [`Store`] in a PostgreSQL database. The same database also holds checkpoints: see
/// [`PostgresStore::checkpointer`].
#[derive(Clone, Debug)]
pub struct PostgresStore {
    pool: PgPool,
    leases: Arc<Leases>,
    writes: Arc<GroupCommit>,
}

/// The threads this process leases: session advisory locks, all held by one connection, so a
/// thousand running threads cost one connection rather than a thousand, and every lease still
/// dies with its process. A session lock is re-entrant within its session, so the process's
/// own runs are kept apart by [`LocalLeases`] first.
struct Leases {
    local: LocalLeases,
    /// The connection holding the locks; opened on first use, and again after it broke (the
    /// locks it held went with it: the database released them when it saw it close).
    session: tokio::sync::Mutex<Option<PgConnection>>,
}

impl std::fmt::Debug for Leases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leases").finish_non_exhaustive()
    }
}

impl Leases {
    fn new() -> Self {
        Self {
            local: LocalLeases::new(),
            session: tokio::sync::Mutex::new(None),
        }
    }

    /// Takes `thread_id`'s session lock if no other session holds it; whether it did.
    async fn try_lock(&self, pool: &PgPool, thread_id: &str) -> Result<bool, sqlx::Error> {
        let mut session = self.session.lock().await;
        let conn = match &mut *session {
            Some(conn) => conn,
            // Detached: the pool's statements never wait behind the leases, nor close it.
            empty => empty.insert(pool.acquire().await?.detach()),
        };
        let locked = sqlx::query_scalar(&format!("SELECT pg_try_advisory_lock({LEASE_LOCK})"))
            .bind(thread_id)
            .fetch_one(&mut *conn)
            .await;
        if locked.is_err() {
            *session = None;
        }
        locked
    }

    /// Releases `thread_id`'s session lock (a lock the session no longer holds, after it
    /// broke, is left as it is).
    async fn unlock(&self, thread_id: &str) {
        let mut session = self.session.lock().await;
        if let Some(conn) = &mut *session {
            let unlocked = sqlx::query(&format!("SELECT pg_advisory_unlock({LEASE_LOCK})"))
                .bind(thread_id)
                .execute(&mut *conn)
                .await;
            if unlocked.is_err() {
                *session = None;
            }
        }
    }
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

    /// The connection options `url` describes.
    fn options(url: &str) -> Result<PgConnectOptions, StoreError> {
        PgConnectOptions::from_str(url).map_err(|e| {
            StoreError::Storage(format!(
                "invalid PostgreSQL URL: {e}; expected postgres://user:password@host:port/database"
            ))
        })
    }

    /// Connects with `options` and migrates the tables in `schema` (the default one without).
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
            .max_connections(POOL_SIZE)
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
        Ok(Self {
            writes: Arc::new(GroupCommit::start(
                Arc::new(PostgresGroups {
                    pool: pool.clone(),
                    lock_class: APPEND_LOCK_CLASS,
                }),
                GROUP_WRITERS,
            )),
            pool,
            leases: Arc::new(Leases::new()),
        })
    }

    /// The shared SQL over this store's database.
    fn sql(&self) -> Sql<'_, Postgres> {
        Sql {
            reader: &self.pool,
            writer: &self.pool,
        }
    }

    /// Checkpoints kept in this store's database.
    pub fn checkpointer(&self) -> PostgresCheckpointer {
        PostgresCheckpointer {
            store: self.clone(),
        }
    }

    /// The schema version this build writes: the number of migrations it knows. A connected
    /// database records it in its `deepagents_schema` table.
    pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

    /// Applies the migrations the database lacks, inside the caller's transaction.
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
        let pending = sql::pending(MIGRATIONS, version.unwrap_or(0), location)?;
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

#[async_trait]
impl Store for PostgresStore {
    async fn get(&self, namespace: &[String], key: &str) -> Result<Option<StoreItem>, StoreError> {
        self.sql().get(namespace, key).await
    }

    /// Written with the other writes under way at that moment, in one transaction (see
    /// [`GroupCommit`]).
    async fn put(&self, namespace: &[String], key: &str, value: Value) -> Result<(), StoreError> {
        self.sql().put(&self.writes, namespace, key, &value).await
    }

    /// One statement when the patch only sets top-level fields (PostgreSQL's `||` on
    /// objects is then RFC 7396's merge), else the item read and written under its row lock.
    async fn merge(
        &self,
        namespace: &[String],
        key: &str,
        patch: &Value,
    ) -> Result<Option<StoreItem>, StoreError> {
        validate_item(namespace, key)?;
        let flat = patch
            .as_object()
            .is_some_and(|fields| fields.values().all(|v| !v.is_null() && !v.is_object()));
        if flat {
            let row = sqlx::query(
                "UPDATE store_items SET updated_at_ms = $4, value = ((CASE
                     WHEN jsonb_typeof(value::jsonb) = 'object' THEN value::jsonb
                     ELSE '{}'::jsonb END) || $3::jsonb)::text
                 WHERE namespace = $1 AND key = $2
                 RETURNING *",
            )
            .bind(sql::encode(namespace))
            .bind(key)
            .bind(patch.to_string())
            .bind(sql::now())
            .fetch_optional(&self.pool)
            .await
            .map_err(storage)?;
            return row.as_ref().map(Sql::<Postgres>::item).transpose();
        }
        let mut tx = self.pool.begin().await.map_err(storage)?;
        let row =
            sqlx::query("SELECT * FROM store_items WHERE namespace = $1 AND key = $2 FOR UPDATE")
                .bind(sql::encode(namespace))
                .bind(key)
                .fetch_optional(&mut *tx)
                .await
                .map_err(storage)?;
        let Some(mut item) = row.as_ref().map(Sql::<Postgres>::item).transpose()? else {
            return Ok(None);
        };
        super::merge_patch(&mut item.value, patch);
        item.updated_at_ms = u64::try_from(sql::now()).unwrap_or(0);
        sqlx::query(
            "UPDATE store_items SET value = $3, updated_at_ms = $4
             WHERE namespace = $1 AND key = $2",
        )
        .bind(sql::encode(namespace))
        .bind(key)
        .bind(item.value.to_string())
        .bind(sql::now())
        .execute(&mut *tx)
        .await
        .map_err(storage)?;
        tx.commit().await.map_err(storage)?;
        Ok(Some(item))
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

    /// Closes the connection pool (and the checkpointer's, which is the same one).
    async fn close(&self) {
        self.pool.close().await;
    }
}

/// A [`Checkpointer`] in the database of a [`PostgresStore`]. Each step writes only its delta,
/// so a step's cost does not grow with the conversation; checkpoints at geometrically spaced ids
/// (50, 75, 112, …) also hold the whole run, so loading replays at most a third of the
/// deltas. Only the newest snapshot is kept.
#[derive(Clone, Debug)]
pub struct PostgresCheckpointer {
    store: PostgresStore,
}

#[async_trait]
impl Checkpointer for PostgresCheckpointer {
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
        validate_thread_id(thread_id)?;
        let leases = &self.store.leases;
        // A lease this process just dropped is unlocked by a spawned task: give it a moment
        // before calling the thread busy.
        let mut holder = "in this process";
        for attempt in 0..10 {
            if let Ok(local) = leases.local.try_lease(thread_id) {
                let locked = leases
                    .try_lock(&self.store.pool, thread_id)
                    .await
                    .map_err(checkpoint_storage)?;
                if locked {
                    let lease = PgLease {
                        local: Some(local),
                        leases: Arc::clone(leases),
                        thread_id: thread_id.to_owned(),
                    };
                    return Ok(ThreadLease::new(thread_id, lease));
                }
                holder = "another database session";
            }
            if attempt < 9 {
                tokio::time::sleep(std::time::Duration::from_millis(25)).await;
            }
        }
        Err(CheckpointError::Busy {
            thread_id: thread_id.to_owned(),
            holder: Some(holder.to_owned()),
        })
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        self.store.sql().delete_thread(thread_id).await
    }
}

/// A lease: the thread's session lock on the process's lease connection, and its place
/// among the process's own leases.
struct PgLease {
    local: Option<ThreadLease>,
    leases: Arc<Leases>,
    thread_id: String,
}

impl Drop for PgLease {
    fn drop(&mut self) {
        let local = self.local.take();
        // Unlocking explicitly frees the thread for other processes at once. The process's
        // own runs may lease it again meanwhile: the lock is re-entrant in the session, so
        // their lock is counted and this unlock leaves it held for them. Without a runtime the
        // lock stays until the process ends (its connection closes).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let leases = Arc::clone(&self.leases);
            let thread_id = std::mem::take(&mut self.thread_id);
            runtime.spawn(async move {
                leases.unlock(&thread_id).await;
                drop(local);
            });
        }
    }
}

impl Dialect for Postgres {
    type Session = Transaction<'static, Postgres>;

    fn starts_with(text: &str, prefix: &str) -> String {
        format!("starts_with({text}, {prefix})")
    }

    fn position(text: &str, part: &str) -> String {
        format!("strpos({text}, {part})")
    }

    fn rows_affected(done: &PgQueryResult) -> u64 {
        done.rows_affected()
    }

    async fn begin(
        pool: &PgPool,
        thread_id: &str,
        access: Access,
    ) -> Result<Self::Session, sqlx::Error> {
        let mut tx = pool.begin().await?;
        let lock = match access {
            // One lock per thread, released at commit or rollback: concurrent appends to a
            // thread queue here and get distinct ids; other threads proceed.
            Access::Append => "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            // The thread's lock, shared: an append still committing — typically one whose
            // process was killed after it sent COMMIT, which the server completes on its own
            // time — holds it until its row is visible. Reading without it could return the
            // thread as it was before that checkpoint, and a run resumed from there would
            // append on top of it again (duplicated turns and results). It also keeps the
            // reads of the load consistent.
            Access::Load => "SELECT pg_advisory_xact_lock_shared($1, hashtext($2))",
            // One transaction, so a thread never loses its children without itself.
            Access::Delete => return Ok(tx),
        };
        sqlx::query(lock)
            .bind(APPEND_LOCK_CLASS)
            .bind(thread_id)
            .execute(&mut *tx)
            .await?;
        Ok(tx)
    }

    fn conn(session: &mut Self::Session) -> Result<&mut PgConnection, sqlx::Error> {
        Ok(session)
    }

    async fn end(session: Self::Session, commit: bool) -> Result<(), sqlx::Error> {
        if commit {
            session.commit().await
        } else {
            session.rollback().await
        }
    }
}
