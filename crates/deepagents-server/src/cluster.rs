//! Several servers sharing the work. Runs are queued durably in PostgreSQL: any server
//! claims the next one whose thread is free (`FOR UPDATE SKIP LOCKED`), holds it with a
//! lease it renews, and another claims it when the lease runs out — its thread continues
//! from the last checkpoint (the journal settles what was in flight: nothing lost, no
//! mutating call run twice). Each run's frames go to a Redis stream, so a client joins it
//! on any server and resumes after the last frame it saw; cancellation is a mark on the
//! queued run that its server's heartbeat reads. Each server holds an advisory lock on a
//! connection of its own while it lives: PostgreSQL drops it the moment the server's
//! process dies, so its runs are taken over at once rather than when their leases run out.
//!
//! Nothing polls at speed: what changes the queue says so with a PostgreSQL `NOTIFY` on
//! [`CHANNEL`] in the statement that changes it (so only once it is committed), and each
//! server's one `LISTEN` connection turns those into [`Event`]s — a run became claimable
//! (admitted, handed back, its thread's earlier run ended), a run was asked to stop or taken
//! over, a run ended — which wake its dispatcher, the heartbeat of the run concerned, and the
//! `wait`s and `join`s of that run. A slow safety poll ([`Timings::poll`]) covers what sends
//! nothing (a server that died, a lease that ran out) and notifications lost while the
//! listener reconnects.

use std::time::Duration;

use redis::AsyncCommands as _;
use serde_json::Value;
use sqlx::Row as _;

use crate::stream::Frame;

/// How long a claimed run stays claimed without a heartbeat.
pub const LEASE: Duration = Duration::from_secs(10);
/// How often the server running a run renews its lease (a cancellation wakes it at once).
pub const HEARTBEAT: Duration = Duration::from_millis(2500);
/// How often a server looks at the queue unasked: for runs of servers that died or whose
/// lease ran out, and for what a lost notification would have said.
pub const POLL: Duration = Duration::from_secs(2);
/// The PostgreSQL channel of the queue's notifications: `c:CLUSTER` (a run of cluster
/// `CLUSTER` may be claimable), `x:RUN` (run `RUN` was asked to stop, or taken over),
/// `e:RUN` (run `RUN` ended).
pub const CHANNEL: &str = "deepagents_runs";
/// How long a run's frames stay in Redis after it ended.
const FRAMES_TTL_SECS: i64 = 3600;
/// How long a thread's shared protocol events stay in Redis after its latest one.
const TAPE_TTL_SECS: i64 = 3600;
/// The first key of the servers' liveness locks (`pg_advisory_lock(LIVENESS, key)`).
const LIVENESS: i32 = 7_460_294;

/// The shared queue and event fan-out.
pub struct Cluster {
    pool: sqlx::PgPool,
    connection: redis::aio::MultiplexedConnection,
    /// The deployment: servers of one name share runs; those of another, on the same
    /// database, do not.
    name: String,
    /// This server's name in the queue.
    pub worker: String,
    /// The second key of this server's liveness lock, recorded with the runs it holds.
    liveness_key: i32,
    /// The connection holding the liveness lock; `None` while it is being made again.
    liveness: tokio::sync::Mutex<Option<sqlx::PgConnection>>,
    database_url: String,
    /// How many runs this server drives at once; `None`: no limit.
    jobs: Option<usize>,
    /// Lease, heartbeat and safety poll.
    timings: Timings,
    /// What the listener heard.
    events: tokio::sync::broadcast::Sender<Event>,
    /// Stops the listener with the cluster.
    _listening: tokio_util::sync::DropGuard,
}

/// How long a claim lasts and how often a server looks unasked.
#[derive(Clone, Copy, Debug)]
pub struct Timings {
    /// How long a claimed run stays claimed without a heartbeat ([`LEASE`]).
    pub lease: Duration,
    /// How often a run's lease is renewed, and this server's liveness lock checked
    /// ([`HEARTBEAT`]); well under `lease`.
    pub heartbeat: Duration,
    /// The safety poll ([`POLL`]): how often the dispatcher, the `wait`s and the `join`s look
    /// without a notification.
    pub poll: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            lease: LEASE,
            heartbeat: HEARTBEAT,
            poll: POLL,
        }
    }
}

/// What a server's listener heard on [`CHANNEL`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A run of this cluster may be claimable.
    Claimable,
    /// A run was asked to stop, or was taken over: its server should look now.
    Cancel(String),
    /// A run ended: its record is final.
    Ended(String),
    /// The listener connected again: notifications may have been lost, look at everything.
    Resync,
}

/// A run this server claimed.
pub struct Claimed {
    /// The run.
    pub run_id: String,
    /// Its tenant.
    pub tenant: String,
    /// Whether the server that took it in queued it whole; `false` when it stopped before,
    /// so its record may be missing.
    pub admitted: bool,
    /// 1 for the first attempt.
    pub attempt: i32,
    /// How to run it (see `runs::QueuedJob`).
    pub job: Value,
    /// A cancellation asked before it was claimed.
    pub cancel: Option<String>,
}

/// Why the cluster could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// PostgreSQL failed.
    #[error("the run queue (PostgreSQL) failed: {0}")]
    Database(#[from] sqlx::Error),
    /// Redis failed.
    #[error("the event fan-out (Redis) failed: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Inserts a run taken in (`$1` run, `$2` tenant, `$3` thread, `$4` job, `$5` cluster,
/// `$6` the intake's lease in milliseconds, `$7` the liveness key of the server taking it in).
/// The statement that takes a run in; with `only_if_idle`, only when its thread has nothing
/// queued or running (no row written otherwise).
fn intake_sql(only_if_idle: bool) -> String {
    let idle = if only_if_idle {
        " WHERE NOT EXISTS (SELECT 1 FROM deepagents_server_queue WHERE tenant = $2 AND thread_id = $3 AND cluster = $5)"
    } else {
        ""
    };
    format!(
        "INSERT INTO deepagents_server_queue (run_id, cluster, tenant, thread_id, status, job, lease_until, worker_key) SELECT $1, $5, $2, $3, 'intake', $4, {NOW_MS} + $6, $7{idle}"
    )
}

/// A connection of its own holding this server's liveness lock.
async fn hold_liveness(database_url: &str, key: i32) -> Result<sqlx::PgConnection, sqlx::Error> {
    use sqlx::Connection as _;
    let mut connection = sqlx::PgConnection::connect(database_url).await?;
    sqlx::query("SELECT pg_advisory_lock($1, $2)")
        .bind(LIVENESS)
        .bind(key)
        .execute(&mut connection)
        .await?;
    Ok(connection)
}

fn frames_key(run_id: &str) -> String {
    format!("deepagents:frames:{run_id}")
}

const NOW_MS: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// The application name of the listener connection of worker `worker` (in
/// `pg_stat_activity`).
pub fn listener_name(worker: &str) -> String {
    format!("deepagents listen {worker}")
}

/// A listener on [`CHANNEL`], on a connection of `pool` (its own).
async fn listener(pool: &sqlx::PgPool) -> Result<sqlx::postgres::PgListener, sqlx::Error> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Turns the notifications `listener` hears into `events` for servers of cluster `name`,
/// until `stop`. A lost connection is made again (at once, then backing off up to `poll`),
/// followed by [`Event::Resync`]: what was sent meanwhile is lost.
async fn listen(
    mut listener: sqlx::postgres::PgListener,
    pool: sqlx::PgPool,
    name: String,
    events: tokio::sync::broadcast::Sender<Event>,
    poll: Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    let claimable = format!("c:{name}");
    loop {
        let received = tokio::select! {
            () = stop.cancelled() => return,
            received = listener.try_recv() => received,
        };
        match received {
            Ok(Some(notification)) => {
                let payload = notification.payload();
                let event = if payload == claimable {
                    Event::Claimable
                } else if let Some(run_id) = payload.strip_prefix("x:") {
                    Event::Cancel(run_id.to_owned())
                } else if let Some(run_id) = payload.strip_prefix("e:") {
                    Event::Ended(run_id.to_owned())
                } else {
                    continue;
                };
                let _ = events.send(event);
            }
            // Connected again already (listening again).
            Ok(None) => {
                tracing::warn!("the queue's listener lost its connection and made it again");
                let _ = events.send(Event::Resync);
            }
            Err(error) => {
                tracing::warn!(%error, "the queue's listener failed; connecting it again");
                drop(listener);
                let mut pause = Duration::from_millis(50);
                listener = loop {
                    tokio::select! {
                        () = stop.cancelled() => return,
                        () = tokio::time::sleep(pause) => {}
                    }
                    match self::listener(&pool).await {
                        Ok(listener) => break listener,
                        Err(error) => {
                            tracing::warn!(%error, "the queue's listener cannot connect; the safety poll goes on");
                            pause = (pause * 2).min(poll);
                        }
                    }
                };
                let _ = events.send(Event::Resync);
            }
        }
    }
}

impl Cluster {
    /// Joins cluster `name`: the queue at `database_url` and Redis at `redis_url`, creating
    /// the queue's table when missing.
    pub async fn connect(
        database_url: &str,
        redis_url: &str,
        name: &str,
    ) -> Result<Self, ClusterError> {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(8)
            .connect(database_url)
            .await?;
        // One server creates the table at a time (others wait on the lock, then see it).
        let mut tx = pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock(7460293)")
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS deepagents_server_queue (
                seq BIGSERIAL,
                run_id TEXT PRIMARY KEY,
                cluster TEXT NOT NULL,
                tenant TEXT NOT NULL,
                thread_id TEXT NOT NULL,
                status TEXT NOT NULL,
                worker TEXT,
                lease_until BIGINT NOT NULL DEFAULT 0,
                attempt INTEGER NOT NULL DEFAULT 0,
                cancel TEXT,
                job TEXT NOT NULL
            )",
        )
        .execute(&mut *tx)
        .await?;
        // The job is JSON text, not JSONB: JSONB refuses the escape of U+0000, which a run's
        // input may hold (the embedded server takes it). Queues made as JSONB are converted.
        sqlx::query(
            "DO $$ BEGIN
                IF (SELECT data_type FROM information_schema.columns
                    WHERE table_schema = current_schema()
                      AND table_name = 'deepagents_server_queue' AND column_name = 'job') = 'jsonb'
                THEN
                    ALTER TABLE deepagents_server_queue ALTER COLUMN job TYPE TEXT USING job::text;
                END IF;
            END $$",
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "ALTER TABLE deepagents_server_queue ADD COLUMN IF NOT EXISTS worker_key INTEGER",
        )
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "CREATE INDEX IF NOT EXISTS deepagents_server_queue_thread ON deepagents_server_queue (cluster, tenant, thread_id, seq)",
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        let connection = redis::Client::open(redis_url)?
            .get_multiplexed_async_connection()
            .await?;
        let id = uuid::Uuid::new_v4();
        // Non-negative, so it reads back the same from `pg_locks.objid` (an unsigned oid).
        let liveness_key = (id.as_u128() as u32 & 0x7fff_ffff) as i32;
        let liveness = hold_liveness(database_url, liveness_key).await?;
        let worker = format!("{}-{id}", std::process::id());
        // The listener's connection, on a pool of its own that makes it again when lost.
        let options: sqlx::postgres::PgConnectOptions = database_url.parse()?;
        let listener_pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(1)
            .max_lifetime(None)
            .idle_timeout(None)
            .connect_with(options.application_name(&listener_name(&worker)))
            .await?;
        let heard = listener(&listener_pool).await?;
        let (events, _) = tokio::sync::broadcast::channel(1024);
        let stop = tokio_util::sync::CancellationToken::new();
        tokio::spawn(listen(
            heard,
            listener_pool,
            name.to_owned(),
            events.clone(),
            POLL,
            stop.clone(),
        ));
        Ok(Self {
            pool,
            connection,
            name: name.to_owned(),
            worker,
            liveness_key,
            liveness: tokio::sync::Mutex::new(Some(liveness)),
            database_url: database_url.to_owned(),
            jobs: None,
            timings: Timings::default(),
            events,
            _listening: stop.drop_guard(),
        })
    }

    /// Drives at most `jobs` runs at once on this server; 0 serves the API only, leaving
    /// every run to the other servers.
    pub fn with_jobs(mut self, jobs: usize) -> Self {
        self.jobs = Some(jobs);
        self
    }

    /// How many runs this server drives at once; `None`: no limit.
    pub fn jobs(&self) -> Option<usize> {
        self.jobs
    }

    /// Claims last `timings.lease`, renewed every `timings.heartbeat`; the safety poll is
    /// `timings.poll` (see [`Timings`]).
    pub fn with_timings(mut self, timings: Timings) -> Self {
        self.timings = timings;
        self
    }

    /// Lease, heartbeat and safety poll.
    pub fn timings(&self) -> Timings {
        self.timings
    }

    /// What this server's listener hears from now on.
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Waits for an event `wanted` accepts, or one that says to look at everything
    /// ([`Event::Resync`], events missed), or the safety poll, whichever comes first.
    pub async fn woken(
        &self,
        events: &mut tokio::sync::broadcast::Receiver<Event>,
        wanted: impl Fn(&Event) -> bool,
    ) {
        use tokio::sync::broadcast::error::RecvError;
        let poll = tokio::time::sleep(self.timings.poll);
        tokio::pin!(poll);
        loop {
            tokio::select! {
                () = &mut poll => return,
                event = events.recv() => match event {
                    Ok(Event::Resync) | Err(RecvError::Lagged(_)) => return,
                    Ok(event) if wanted(&event) => return,
                    Ok(_) => {}
                    Err(RecvError::Closed) => {
                        poll.await;
                        return;
                    }
                },
            }
        }
    }

    /// The database, for the claims of crons' firings.
    pub(crate) fn pool(&self) -> &sqlx::PgPool {
        &self.pool
    }

    /// The deployment's name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Keeps this server's liveness lock held, making its connection again when it drops
    /// (until then, the server's runs may be taken over: their heartbeats then stop them).
    pub async fn keep_alive(&self) {
        loop {
            tokio::time::sleep(self.timings.heartbeat).await;
            let mut held = self.liveness.lock().await;
            let alive = match held.as_mut() {
                Some(connection) => sqlx::query("SELECT 1").execute(connection).await.is_ok(),
                None => false,
            };
            if !alive {
                *held = match hold_liveness(&self.database_url, self.liveness_key).await {
                    Ok(connection) => Some(connection),
                    Err(error) => {
                        tracing::warn!(%error, "this server's liveness lock is lost; others may take its runs over");
                        None
                    }
                };
            }
        }
    }

    /// Takes a run in: queued, but not claimed before [`admit`](Self::admit) unless the
    /// server taking it in stops for a lease's length first (then its record may be
    /// missing; see [`Claimed::admitted`]). With `only_if_idle`, only when its thread has
    /// nothing queued or running, in the same statement; `false` when it was not taken in.
    pub async fn enqueue(
        &self,
        run_id: &str,
        tenant: &str,
        thread_id: &str,
        job: &Value,
        only_if_idle: bool,
    ) -> Result<bool, ClusterError> {
        let done = sqlx::query(&intake_sql(only_if_idle))
            .bind(run_id)
            .bind(tenant)
            .bind(thread_id)
            .bind(job.to_string())
            .bind(&self.name)
            .bind(self.timings.lease.as_millis() as i64)
            .bind(self.liveness_key)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Takes a run in, as [`enqueue`](Self::enqueue), only when its thread has nothing queued
    /// or running and `ready` agrees.
    /// `ready` runs while the thread is locked against every other call of this for it, in
    /// every server of the cluster, so what it checks (the thread's pause) cannot be
    /// answered by another run so queued between the check and the queueing.
    pub async fn enqueue_alone<E>(
        &self,
        run_id: &str,
        tenant: &str,
        thread_id: &str,
        job: &Value,
        ready: impl std::future::Future<Output = Result<(), E>>,
    ) -> Result<Alone<E>, ClusterError> {
        let mut tx = self.pool.begin().await?;
        // Held until the transaction ends; a 64-bit hash of the thread, so other threads
        // rarely wait on it.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 7460293))")
            .bind(format!("{}\u{1f}{tenant}\u{1f}{thread_id}", self.name))
            .execute(&mut *tx)
            .await?;
        let busy = sqlx::query("SELECT EXISTS (SELECT 1 FROM deepagents_server_queue WHERE tenant = $1 AND thread_id = $2 AND cluster = $3)")
            .bind(tenant)
            .bind(thread_id)
            .bind(&self.name)
            .fetch_one(&mut *tx)
            .await?;
        if busy.try_get::<bool, _>(0)? {
            return Ok(Alone::Busy);
        }
        if let Err(error) = ready.await {
            return Ok(Alone::Refused(error));
        }
        sqlx::query(&intake_sql(false))
            .bind(run_id)
            .bind(tenant)
            .bind(thread_id)
            .bind(job.to_string())
            .bind(&self.name)
            .bind(self.timings.lease.as_millis() as i64)
            .bind(self.liveness_key)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Alone::Queued)
    }

    /// Whether thread `thread_id` of `tenant` has runs queued or running.
    pub async fn thread_busy(&self, tenant: &str, thread_id: &str) -> Result<bool, ClusterError> {
        let row = sqlx::query("SELECT EXISTS (SELECT 1 FROM deepagents_server_queue WHERE tenant = $1 AND thread_id = $2 AND cluster = $3)")
            .bind(tenant)
            .bind(thread_id)
            .bind(&self.name)
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get(0)?)
    }

    /// Asks every run of a thread to stop (`interrupt` or `rollback`).
    pub async fn cancel_thread(
        &self,
        tenant: &str,
        thread_id: &str,
        action: &str,
    ) -> Result<(), ClusterError> {
        sqlx::query(
            "WITH asked AS (UPDATE deepagents_server_queue SET cancel = $3 WHERE tenant = $1 AND thread_id = $2 AND cluster = $4 RETURNING run_id)
             SELECT pg_notify('deepagents_runs', 'x:' || run_id) FROM asked",
        )
        .bind(tenant)
        .bind(thread_id)
        .bind(action)
        .bind(&self.name)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Asks run `run_id` to stop, wherever it runs; `false` when it is not queued.
    pub async fn cancel(&self, run_id: &str, action: &str) -> Result<bool, ClusterError> {
        let done = sqlx::query(
            "WITH asked AS (UPDATE deepagents_server_queue SET cancel = $2 WHERE run_id = $1 RETURNING run_id)
             SELECT pg_notify('deepagents_runs', 'x:' || run_id) FROM asked",
        )
            .bind(run_id)
            .bind(action)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Claims the oldest run whose thread has nothing older queued: a pending one, or one
    /// whose server, running it or taking it in, died (its liveness lock is gone) or stopped
    /// renewing its lease.
    pub async fn claim(&self) -> Result<Option<Claimed>, ClusterError> {
        let sql = format!(
            "WITH alive AS MATERIALIZED (
                SELECT objid FROM pg_locks
                WHERE locktype = 'advisory' AND classid = $5::oid AND objsubid = 2 AND granted),
            next AS (
                SELECT q.run_id, q.status AS was FROM deepagents_server_queue q
                WHERE q.cluster = $3
                  AND (q.status = 'pending' OR (q.status IN ('running', 'intake') AND (
                    q.lease_until < {NOW_MS}
                    OR (q.worker_key IS NOT NULL AND q.worker_key::oid NOT IN (SELECT objid FROM alive)))))
                  AND NOT EXISTS (
                    SELECT 1 FROM deepagents_server_queue o
                    WHERE o.cluster = q.cluster AND o.tenant = q.tenant AND o.thread_id = q.thread_id AND o.seq < q.seq)
                ORDER BY q.seq
                LIMIT 1
                FOR UPDATE SKIP LOCKED)
            UPDATE deepagents_server_queue q
            SET status = 'running', worker = $1, worker_key = $4, lease_until = {NOW_MS} + $2, attempt = q.attempt + 1
            FROM next WHERE q.run_id = next.run_id
            RETURNING q.run_id, q.tenant, next.was, q.attempt, q.job, q.cancel"
        );
        let row = sqlx::query(&sql)
            .bind(&self.worker)
            .bind(self.timings.lease.as_millis() as i64)
            .bind(&self.name)
            .bind(self.liveness_key)
            .bind(LIVENESS)
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let run_id: String = row.try_get("run_id")?;
        let was: String = row.try_get("was")?;
        if was == "running" {
            // Taken over from a server that may still run it: it stops at once, not at its
            // next heartbeat.
            if let Err(error) = sqlx::query("SELECT pg_notify('deepagents_runs', 'x:' || $1)")
                .bind(&run_id)
                .execute(&self.pool)
                .await
            {
                tracing::warn!(%run_id, %error, "the server that ran a run taken over was not told");
            }
        }
        Ok(Some(Claimed {
            run_id,
            tenant: row.try_get("tenant")?,
            admitted: was != "intake",
            attempt: row.try_get("attempt")?,
            job: serde_json::from_str(&row.try_get::<String, _>("job")?)
                .map_err(|error| ClusterError::Database(sqlx::Error::Decode(Box::new(error))))?,
            cancel: row.try_get("cancel")?,
        }))
    }

    /// Admits run `run_id`, taken in by this server, as this server's running run (an
    /// [`admit`](Self::admit) and a [`claim`](Self::claim) in one statement, waking no other
    /// server); `None` when it is not this server's to run now — an older run of its thread
    /// is queued, or it is no longer taken in — and the caller admits it to the queue instead.
    pub async fn admit_here(&self, run_id: &str) -> Result<Option<Claimed>, ClusterError> {
        let sql = format!(
            "UPDATE deepagents_server_queue q
             SET status = 'running', worker = $2, worker_key = $3, lease_until = {NOW_MS} + $4,
                 attempt = q.attempt + 1
             WHERE q.run_id = $1 AND q.status = 'intake'
               AND NOT EXISTS (
                 SELECT 1 FROM deepagents_server_queue o
                 WHERE o.cluster = q.cluster AND o.tenant = q.tenant AND o.thread_id = q.thread_id AND o.seq < q.seq)
             RETURNING q.run_id, q.tenant, q.attempt, q.job, q.cancel"
        );
        let row = sqlx::query(&sql)
            .bind(run_id)
            .bind(&self.worker)
            .bind(self.liveness_key)
            .bind(self.timings.lease.as_millis() as i64)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|row| {
            Ok(Claimed {
                run_id: row.try_get("run_id")?,
                tenant: row.try_get("tenant")?,
                admitted: true,
                attempt: row.try_get("attempt")?,
                job: serde_json::from_str(&row.try_get::<String, _>("job")?).map_err(|error| {
                    ClusterError::Database(sqlx::Error::Decode(Box::new(error)))
                })?,
                cancel: row.try_get("cancel")?,
            })
        })
        .transpose()
    }

    /// Renews the lease of a run this server runs, learning the cancellation asked for it,
    /// if any, or that another server took it over.
    pub async fn heartbeat(&self, run_id: &str) -> Result<Heartbeat, ClusterError> {
        let sql = format!(
            "UPDATE deepagents_server_queue SET lease_until = {NOW_MS} + $3
             WHERE run_id = $1 AND worker = $2 RETURNING cancel"
        );
        let row = sqlx::query(&sql)
            .bind(run_id)
            .bind(&self.worker)
            .bind(self.timings.lease.as_millis() as i64)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            None => Heartbeat::Lost,
            Some(row) => Heartbeat::Held(row.try_get("cancel")?),
        })
    }

    /// The run taken in has its record: any server may claim it now. `false` when it is no
    /// longer queued (a server dropped it, finding no record after the intake's lease ran
    /// out): the caller should remove the record and refuse the run.
    pub async fn admit(&self, run_id: &str) -> Result<bool, ClusterError> {
        let done = sqlx::query(
            "WITH admitted AS (UPDATE deepagents_server_queue SET status = CASE WHEN status = 'intake' THEN 'pending' ELSE status END, lease_until = CASE WHEN status = 'intake' THEN 0 ELSE lease_until END WHERE run_id = $1 RETURNING cluster)
             SELECT pg_notify('deepagents_runs', 'c:' || cluster) FROM admitted",
        )
        .bind(run_id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Hands a run this server stopped back to the queue, for the next server to claim now.
    pub async fn release(&self, run_id: &str) -> Result<(), ClusterError> {
        sqlx::query(
            "WITH released AS (UPDATE deepagents_server_queue SET status = 'pending', worker = NULL, lease_until = 0 WHERE run_id = $1 AND worker = $2 RETURNING cluster)
             SELECT pg_notify('deepagents_runs', 'c:' || cluster) FROM released",
        )
            .bind(run_id)
            .bind(&self.worker)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The run ended: out of the queue. Its waiters are told, and the servers when its
    /// thread has another run queued (which may start now).
    pub async fn finish(&self, run_id: &str) -> Result<(), ClusterError> {
        // The statement sees the queue as it was before the deletion: hence `o.run_id <> …`.
        sqlx::query(
            "WITH ended AS (DELETE FROM deepagents_server_queue WHERE run_id = $1 AND (worker = $2 OR worker IS NULL) RETURNING run_id, cluster, tenant, thread_id)
             SELECT pg_notify('deepagents_runs', 'e:' || e.run_id),
                    CASE WHEN EXISTS (SELECT 1 FROM deepagents_server_queue o WHERE o.cluster = e.cluster AND o.tenant = e.tenant AND o.thread_id = e.thread_id AND o.run_id <> e.run_id)
                         THEN pg_notify('deepagents_runs', 'c:' || e.cluster) END
             FROM ended e",
        )
            .bind(run_id)
            .bind(&self.worker)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Runs queued and running, in the whole cluster.
    pub async fn depth(&self) -> Result<(i64, i64), ClusterError> {
        let row = sqlx::query("SELECT count(*) FILTER (WHERE status <> 'running'), count(*) FILTER (WHERE status = 'running') FROM deepagents_server_queue WHERE cluster = $1")
        .bind(&self.name)
            .fetch_one(&self.pool)
            .await?;
        Ok((row.try_get(0)?, row.try_get(1)?))
    }

    /// How many frames run `run_id` has published.
    pub async fn frame_count(&self, run_id: &str) -> Result<usize, ClusterError> {
        let mut connection = self.connection.clone();
        let len: usize = connection.xlen(frames_key(run_id)).await?;
        Ok(len)
    }

    /// Publishes frames of a run, each with its index, and, with `end`, that it ended, in
    /// one round trip: what the run's publisher found waiting at once.
    pub async fn publish_frames(
        &self,
        run_id: &str,
        frames: &[(usize, Frame)],
        end: bool,
    ) -> Result<(), ClusterError> {
        let key = frames_key(run_id);
        let mut pipe = redis::pipe();
        for (index, frame) in frames {
            let index = index.to_string();
            pipe.xadd(
                &key,
                "*",
                &[
                    ("i", index.as_str()),
                    ("e", frame.event.as_str()),
                    ("d", frame.data.as_str()),
                ],
            )
            .ignore();
        }
        if end {
            pipe.xadd(&key, "*", &[("i", "0"), ("e", END), ("d", "")])
                .ignore();
            pipe.expire(&key, FRAMES_TTL_SECS).ignore();
        }
        let mut connection = self.connection.clone();
        let () = pipe.query_async(&mut connection).await?;
        Ok(())
    }

    /// Frames of run `run_id` after Redis entry `after` (`0` for all), without waiting;
    /// each with its Redis entry id and index, `None` for the end marker.
    pub async fn read(
        &self,
        run_id: &str,
        after: &str,
    ) -> Result<Vec<(String, usize, Option<Frame>)>, ClusterError> {
        let mut connection = self.connection.clone();
        let reply: redis::streams::StreamReadReply = connection
            .xread_options(
                &[frames_key(run_id)],
                &[after],
                &redis::streams::StreamReadOptions::default().count(500),
            )
            .await?;
        let mut frames = Vec::new();
        for key in reply.keys {
            for entry in key.ids {
                let field = |name: &str| -> String {
                    entry
                        .map
                        .get(name)
                        .and_then(|value| redis::from_redis_value::<String>(value.clone()).ok())
                        .unwrap_or_default()
                };
                let index = field("i").parse().unwrap_or_default();
                let event = field("e");
                let frame = (event != END).then(|| Frame {
                    event,
                    data: field("d"),
                });
                frames.push((entry.id.clone(), index, frame));
            }
        }
        Ok(frames)
    }
}

/// The Redis stream of thread `storage`'s protocol events (the shared "v2" tape).
fn tape_key(storage: &str) -> String {
    format!("deepagents:tape:{storage}")
}

/// The Redis key of thread `storage`'s agent tree (`agent.getTree`).
fn tree_key(storage: &str) -> String {
    format!("deepagents:tree:{storage}")
}

/// The protocol events of every thread, shared: the server running a thread's run adds them,
/// any server's event streams read them, so a v2 client sees the thread's runs wherever they
/// run. (One run of a thread at a time, so one writer at a time numbers its events.)
impl Cluster {
    /// Appends a thread's events to its shared tape (at most `max` kept) and sets its latest
    /// agent tree, in one round trip: what a tape's mirror found waiting at once.
    pub async fn publish_events(
        &self,
        storage: &str,
        events: &[std::sync::Arc<crate::protocol::Recorded>],
        tree: Option<&Value>,
        max: usize,
    ) -> Result<(), ClusterError> {
        let mut pipe = redis::pipe();
        if !events.is_empty() {
            let key = tape_key(storage);
            for event in events {
                let seq = event.seq.to_string();
                let namespace = serde_json::to_string(&event.namespace).unwrap_or_default();
                pipe.xadd_maxlen(
                    &key,
                    redis::streams::StreamMaxlen::Approx(max),
                    "*",
                    &[
                        ("s", seq.as_str()),
                        ("m", event.method),
                        ("n", namespace.as_str()),
                        ("j", event.json.as_str()),
                    ],
                )
                .ignore();
            }
            pipe.expire(&key, TAPE_TTL_SECS).ignore();
        }
        if let Some(tree) = tree {
            pipe.set_ex(tree_key(storage), tree.to_string(), TAPE_TTL_SECS as u64)
                .ignore();
        }
        let mut connection = self.connection.clone();
        let () = pipe.query_async(&mut connection).await?;
        Ok(())
    }

    /// The `seq` of the latest event on thread `storage`'s shared tape.
    pub async fn last_event_seq(&self, storage: &str) -> Result<Option<u64>, ClusterError> {
        let mut connection = self.connection.clone();
        let reply: redis::streams::StreamRangeReply = connection
            .xrevrange_count(tape_key(storage), "+", "-", 1)
            .await?;
        Ok(reply
            .ids
            .first()
            .and_then(|entry| entry.get::<String>("s"))
            .and_then(|seq| seq.parse().ok()))
    }

    /// The events of thread `storage`'s shared tape after Redis entry `after` (`0` for all),
    /// without waiting; each with its Redis entry id.
    pub async fn read_events(
        &self,
        storage: &str,
        after: &str,
    ) -> Result<Vec<(String, crate::protocol::Recorded)>, ClusterError> {
        let mut connection = self.connection.clone();
        let reply: redis::streams::StreamReadReply = connection
            .xread_options(
                &[tape_key(storage)],
                &[after],
                &redis::streams::StreamReadOptions::default().count(500),
            )
            .await?;
        let mut events = Vec::new();
        for key in reply.keys {
            for entry in key.ids {
                let field = |name: &str| entry.get::<String>(name).unwrap_or_default();
                let recorded = crate::protocol::Recorded::restored(
                    field("s").parse().unwrap_or_default(),
                    &field("m"),
                    serde_json::from_str(&field("n")).unwrap_or_default(),
                    field("j"),
                );
                if let Some(recorded) = recorded {
                    events.push((entry.id.clone(), recorded));
                }
            }
        }
        Ok(events)
    }

    /// Thread `storage`'s agent tree, when a run stored one.
    pub async fn tree(&self, storage: &str) -> Result<Option<Value>, ClusterError> {
        let mut connection = self.connection.clone();
        let tree: Option<String> = connection.get(tree_key(storage)).await?;
        Ok(tree.and_then(|tree| serde_json::from_str(&tree).ok()))
    }
}

/// The end marker's event name in a run's Redis stream.
const END: &str = "__end__";

/// What [`Cluster::enqueue_alone`] did.
pub enum Alone<E> {
    /// The run is queued.
    Queued,
    /// The thread has runs queued or running: nothing was queued.
    Busy,
    /// The check refused the run: nothing was queued.
    Refused(E),
}

/// What a heartbeat learned.
pub enum Heartbeat {
    /// The run is still this server's; a cancellation was asked, or not.
    Held(Option<String>),
    /// Another server took the run over.
    Lost,
}
