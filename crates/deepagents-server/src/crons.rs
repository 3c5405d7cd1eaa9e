//! Crons: runs made on a schedule. A cron's record (its schedule, the run payload, its next
//! due time) lives in the same [`Store`] as the threads' and runs' records — SQLite embedded,
//! PostgreSQL in a cluster — under `server-crons.<tenant>`. The scheduler (`api/crons.rs`)
//! fires a due cron by claiming its due time here, then creating the run as `POST /runs` or
//! `POST /threads/{id}/runs` does.
//!
//! A claim moves the record's `next_run_date` on from the time it was due. In one process a
//! lock orders claims and the API's writes; in a cluster each due time is also claimed once
//! in a PostgreSQL table (`deepagents_server_cron_fires`, its primary key the cron and the
//! due time), so of several servers on one database exactly one fires it. A firing missed
//! while no server ran happens once when one starts; the next is the first due time after
//! that.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, NaiveDateTime, TimeZone as _, Utc};
use deepagents::backends::Store;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::records::all_under;
use crate::time::rfc3339;

/// How often the scheduler looks for due crons at least (it also wakes when the next one
/// is due, and when a cron is made or changed here).
pub const DEFAULT_TICK: Duration = Duration::from_secs(5);

/// A schedule: a standard 5-field cron pattern (minute, hour, day of month, month, day of
/// week) in a time zone (UTC unless named).
pub struct Schedule {
    pattern: croner::Cron,
    zone: chrono_tz::Tz,
}

impl Schedule {
    /// `pattern` in `timezone` (an IANA name; `None`: UTC), or why it cannot be used.
    pub fn parse(pattern: &str, timezone: Option<&str>) -> Result<Self, String> {
        let fields = pattern.split_whitespace().count();
        if fields != 5 {
            return Err(format!(
                "`schedule` must be a standard cron pattern of 5 fields (minute hour day-of-month month day-of-week, e.g. \"*/5 * * * *\"), not {pattern:?} ({fields} fields)"
            ));
        }
        let parsed = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Disallowed)
            .year(croner::parser::Year::Disallowed)
            .build()
            .parse(pattern)
            .map_err(|error| {
                format!("`schedule` {pattern:?} is not a valid cron pattern: {error}")
            })?;
        let zone = match timezone {
            None => chrono_tz::Tz::UTC,
            Some(name) => name.parse().map_err(|_| {
                format!(
                    "`timezone` {name:?} is not an IANA time zone name (e.g. \"Europe/Paris\", \"UTC\")"
                )
            })?,
        };
        let schedule = Self {
            pattern: parsed,
            zone,
        };
        // A pattern that never matches (`0 0 31 2 *`) cannot be scheduled.
        if schedule.next_after(crate::time::now_ms()).is_none() {
            return Err(format!(
                "`schedule` {pattern:?} never comes due; give a pattern that matches a date"
            ));
        }
        Ok(schedule)
    }

    /// The first due time strictly after `ms` (milliseconds since the epoch).
    pub fn next_after(&self, ms: u64) -> Option<u64> {
        let at = self
            .zone
            .timestamp_millis_opt(i64::try_from(ms).ok()?)
            .single()?;
        let next = self.pattern.find_next_occurrence(&at, false).ok()?;
        u64::try_from(next.timestamp_millis()).ok()
    }
}

/// Milliseconds since the epoch of an RFC 3339 time, or of an ISO time without an offset
/// (taken as UTC: Python's `isoformat()` of a naive datetime).
pub fn parse_time(text: &str) -> Option<u64> {
    let ms = match DateTime::parse_from_rfc3339(text) {
        Ok(at) => at.timestamp_millis(),
        Err(_) => {
            let naive = NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f")
                .or_else(|_| NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f"))
                .ok()?;
            Utc.from_utc_datetime(&naive).timestamp_millis()
        }
    };
    u64::try_from(ms).ok()
}

/// A cron as the API shows it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CronRecord {
    /// Its id.
    pub cron_id: String,
    /// The assistant each firing runs (its id).
    pub assistant_id: String,
    /// The thread each firing runs on; `None`: each runs on a new thread.
    pub thread_id: Option<String>,
    /// What becomes of a stateless firing's thread: `delete` (the default) or `keep`.
    pub on_run_completed: Option<String>,
    /// RFC 3339: no firing after it.
    pub end_time: Option<String>,
    /// The 5-field cron pattern.
    pub schedule: String,
    /// Its IANA time zone; `None`: UTC.
    pub timezone: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339.
    pub updated_at: String,
    /// The run payload each firing creates its run from.
    pub payload: Value,
    /// Always `None` (API keys name tenants, not users).
    pub user_id: Option<String>,
    /// RFC 3339: when it fires next; `None`: never again (past its end, or disabled).
    pub next_run_date: Option<String>,
    /// What the client attached; each firing's run carries it, with `cron_id`.
    pub metadata: Value,
    /// Whether it fires.
    pub enabled: bool,
}

impl CronRecord {
    /// `next_run_date` in milliseconds.
    pub fn next_run_ms(&self) -> Option<u64> {
        self.next_run_date.as_deref().and_then(parse_time)
    }

    /// `end_time` in milliseconds.
    pub fn end_ms(&self) -> Option<u64> {
        self.end_time.as_deref().and_then(parse_time)
    }

    /// Its schedule, parsed.
    pub fn parsed(&self) -> Result<Schedule, String> {
        Schedule::parse(&self.schedule, self.timezone.as_deref())
    }

    /// The first due time after `ms` that is not past its end, if it is enabled.
    pub fn due_after(&self, ms: u64) -> Option<u64> {
        if !self.enabled {
            return None;
        }
        let next = self.parsed().ok()?.next_after(ms)?;
        match self.end_ms() {
            Some(end) if next > end => None,
            _ => Some(next),
        }
    }

    /// Sets `next_run_date` to the first due time after `ms`.
    pub fn schedule_after(&mut self, ms: u64) {
        self.next_run_date = self.due_after(ms).map(rfc3339);
    }
}

fn crons_ns(tenant: &str) -> Vec<String> {
    vec!["server-crons".into(), tenant.into()]
}

/// Every tenant's crons, and the claims of their firings.
pub struct Crons {
    store: Arc<dyn Store>,
    /// Orders this process's writes of cron records (the API's and the scheduler's claims).
    pub lock: tokio::sync::Mutex<()>,
    /// Wakes the scheduler: a cron was made or changed.
    pub wake: tokio::sync::Notify,
    /// How often the scheduler looks at least.
    pub tick: Duration,
    #[cfg(feature = "cluster")]
    cluster: Option<Arc<crate::cluster::Cluster>>,
    #[cfg(feature = "cluster")]
    table: tokio::sync::OnceCell<()>,
}

impl Crons {
    /// The crons in `store`, looked at every `tick` at least.
    pub fn new(store: Arc<dyn Store>, tick: Duration) -> Self {
        Self {
            store,
            lock: tokio::sync::Mutex::new(()),
            wake: tokio::sync::Notify::new(),
            tick,
            #[cfg(feature = "cluster")]
            cluster: None,
            #[cfg(feature = "cluster")]
            table: tokio::sync::OnceCell::new(),
        }
    }

    /// Claims firings in `cluster`'s database too, so each fires on one server only.
    #[cfg(feature = "cluster")]
    pub fn clustered(mut self, cluster: Arc<crate::cluster::Cluster>) -> Self {
        self.cluster = Some(cluster);
        self
    }

    /// Cron `id` of `tenant`.
    pub async fn get(&self, tenant: &str, id: &str) -> ApiResult<Option<CronRecord>> {
        let item = self.store.get(&crons_ns(tenant), id).await?;
        item.map(|item| serde_json::from_value(item.value).map_err(ApiError::internal))
            .transpose()
    }

    /// Writes `cron` (hold [`lock`](Self::lock) around a read and this write).
    pub async fn put(&self, tenant: &str, cron: &CronRecord) -> ApiResult<()> {
        let value = serde_json::to_value(cron).map_err(ApiError::internal)?;
        self.store
            .put(&crons_ns(tenant), &cron.cron_id, value)
            .await?;
        Ok(())
    }

    /// Removes cron `id`; whether it was there.
    pub async fn delete(&self, tenant: &str, id: &str) -> ApiResult<bool> {
        Ok(self.store.delete(&crons_ns(tenant), id).await?)
    }

    /// The crons of `tenant`.
    pub async fn of(&self, tenant: &str) -> ApiResult<Vec<CronRecord>> {
        let namespace = crons_ns(tenant);
        Ok(all_under(&*self.store, &namespace)
            .await?
            .into_iter()
            .filter(|item| item.namespace == namespace)
            .filter_map(|item| serde_json::from_value(item.value).ok())
            .collect())
    }

    /// Every tenant's crons, with their tenants.
    pub async fn all(&self) -> ApiResult<Vec<(String, CronRecord)>> {
        Ok(all_under(&*self.store, &["server-crons".to_owned()])
            .await?
            .into_iter()
            .filter(|item| item.namespace.len() == 2)
            .filter_map(|item| {
                let cron = serde_json::from_value(item.value).ok()?;
                Some((item.namespace[1].clone(), cron))
            })
            .collect())
    }

    /// Claims the firing of `cron` due at `due`: its record's next due time moves on to
    /// `next`. `false` when it is not this server's to fire: the cron changed, went, was
    /// disabled, or (in a cluster) another server claimed that firing.
    pub async fn claim(
        &self,
        tenant: &str,
        cron: &CronRecord,
        due: u64,
        next: Option<u64>,
    ) -> ApiResult<bool> {
        #[cfg(feature = "cluster")]
        if let Some(cluster) = &self.cluster
            && !self.claim_in(cluster, tenant, &cron.cron_id, due).await?
        {
            return Ok(false);
        }
        let _held = self.lock.lock().await;
        let Some(mut current) = self.get(tenant, &cron.cron_id).await? else {
            return Ok(false);
        };
        if !current.enabled || current.next_run_ms() != Some(due) {
            return Ok(false);
        }
        current.next_run_date = next.map(rfc3339);
        self.put(tenant, &current).await?;
        #[cfg(feature = "cluster")]
        if let Some(cluster) = &self.cluster {
            self.claimed(cluster, tenant, &cron.cron_id, due).await?;
        }
        Ok(true)
    }

    /// Claims the firing at `due` in the cluster's table: `true` for the one server that
    /// inserts it — or that takes over a claim left unsettled for a minute, when the server
    /// that made it died before moving the cron's record on (so nothing fired).
    #[cfg(feature = "cluster")]
    async fn claim_in(
        &self,
        cluster: &crate::cluster::Cluster,
        tenant: &str,
        cron_id: &str,
        due: u64,
    ) -> ApiResult<bool> {
        let pool = cluster.pool();
        self.table
            .get_or_try_init(|| async {
                sqlx::query(
                    "CREATE TABLE IF NOT EXISTS deepagents_server_cron_fires (
                        cluster TEXT NOT NULL,
                        tenant TEXT NOT NULL,
                        cron_id TEXT NOT NULL,
                        due BIGINT NOT NULL,
                        worker TEXT NOT NULL,
                        claimed_at BIGINT NOT NULL,
                        settled BOOLEAN NOT NULL DEFAULT false,
                        PRIMARY KEY (cluster, tenant, cron_id, due)
                    )",
                )
                .execute(pool)
                .await
                .map(|_| ())
            })
            .await
            .map_err(ApiError::internal)?;
        let now = i64::try_from(crate::time::now_ms()).unwrap_or(i64::MAX);
        let claimed = sqlx::query(
            "INSERT INTO deepagents_server_cron_fires AS f (cluster, tenant, cron_id, due, worker, claimed_at)
             VALUES ($1, $2, $3, $4, $5, $6)
             ON CONFLICT (cluster, tenant, cron_id, due) DO UPDATE
                SET worker = excluded.worker, claimed_at = excluded.claimed_at
                WHERE NOT f.settled AND f.claimed_at < excluded.claimed_at - 60000
             RETURNING 1",
        )
        .bind(cluster.name())
        .bind(tenant)
        .bind(cron_id)
        .bind(i64::try_from(due).unwrap_or(i64::MAX))
        .bind(&cluster.worker)
        .bind(now)
        .fetch_optional(pool)
        .await
        .map_err(ApiError::internal)?;
        // Claims a day old are of no use: their crons have moved on.
        sqlx::query("DELETE FROM deepagents_server_cron_fires WHERE claimed_at < $1")
            .bind(now - 86_400_000)
            .execute(pool)
            .await
            .map_err(ApiError::internal)?;
        Ok(claimed.is_some())
    }

    /// The claim of the firing at `due` is settled: the cron's record has moved on.
    #[cfg(feature = "cluster")]
    async fn claimed(
        &self,
        cluster: &crate::cluster::Cluster,
        tenant: &str,
        cron_id: &str,
        due: u64,
    ) -> ApiResult<()> {
        sqlx::query(
            "UPDATE deepagents_server_cron_fires SET settled = true WHERE cluster = $1 AND tenant = $2 AND cron_id = $3 AND due = $4",
        )
        .bind(cluster.name())
        .bind(tenant)
        .bind(cron_id)
        .bind(i64::try_from(due).unwrap_or(i64::MAX))
        .execute(cluster.pool())
        .await
        .map_err(ApiError::internal)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_are_five_fields_in_a_zone() {
        let every_minute = Schedule::parse("* * * * *", None).unwrap();
        // 2000-01-01T00:00:30Z → 00:01:00Z.
        assert_eq!(
            every_minute.next_after(946_684_830_000),
            Some(946_684_860_000)
        );
        let nine = Schedule::parse("0 9 * * *", Some("Europe/Paris")).unwrap();
        // 09:00 in Paris in winter is 08:00 UTC.
        assert_eq!(
            nine.next_after(946_684_800_000).map(rfc3339).as_deref(),
            Some("2000-01-01T08:00:00.000Z")
        );
        for bad in ["* * * *", "0 * * * * *", "61 * * * *", "x y z a b", ""] {
            assert!(Schedule::parse(bad, None).is_err(), "{bad}");
        }
        assert!(Schedule::parse("0 0 31 2 *", None).is_err());
        let error = Schedule::parse("* * * * *", Some("Mars/Olympus"))
            .err()
            .unwrap();
        assert!(error.contains("timezone"), "{error}");
    }

    /// Two servers claiming the same firings at the same moment: each is claimed once.
    #[cfg(feature = "cluster")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn of_two_servers_claiming_a_firing_at_once_one_gets_it() {
        let Some(database) = deepagents_test_support::postgres_url() else {
            return;
        };
        let Some(redis) = deepagents_test_support::redis_url() else {
            return;
        };
        let schema = deepagents_test_support::unique_name("cron_claims");
        let name = deepagents_test_support::unique_name("cron_claims");
        let store: Arc<dyn Store> = Arc::new(
            deepagents::backends::PostgresStore::connect_in_schema(&database, &schema)
                .await
                .unwrap(),
        );
        let mut servers = Vec::new();
        for _ in 0..2 {
            let cluster = crate::cluster::Cluster::connect(&database, &redis, &name)
                .await
                .unwrap();
            servers.push(Crons::new(Arc::clone(&store), DEFAULT_TICK).clustered(Arc::new(cluster)));
        }
        let due = 946_684_800_000;
        let mut crons = Vec::new();
        for i in 0..20 {
            let cron = CronRecord {
                cron_id: format!("cron-{i}"),
                assistant_id: "a".into(),
                thread_id: None,
                on_run_completed: None,
                end_time: None,
                schedule: "* * * * *".into(),
                timezone: None,
                created_at: rfc3339(due),
                updated_at: rfc3339(due),
                payload: Value::Null,
                user_id: None,
                next_run_date: Some(rfc3339(due)),
                metadata: Value::Null,
                enabled: true,
            };
            servers[0].put("t", &cron).await.unwrap();
            crons.push(cron);
        }
        let next = Some(due + 60_000);
        let claims = crons.iter().map(|cron| async {
            let (a, b) = tokio::join!(
                servers[0].claim("t", cron, due, next),
                servers[1].claim("t", cron, due, next)
            );
            u8::from(a.unwrap()) + u8::from(b.unwrap())
        });
        let won = futures::future::join_all(claims).await;
        assert_eq!(
            won,
            vec![1; 20],
            "each firing claimed by exactly one server"
        );
        for cron in &crons {
            let stored = servers[1].get("t", &cron.cron_id).await.unwrap().unwrap();
            assert_eq!(stored.next_run_ms(), next);
        }
    }

    #[test]
    fn times_with_or_without_an_offset() {
        assert_eq!(parse_time("2000-01-01T00:00:00Z"), Some(946_684_800_000));
        assert_eq!(
            parse_time("2000-01-01T01:00:00+01:00"),
            Some(946_684_800_000)
        );
        assert_eq!(parse_time("2000-01-01T00:00:00.5"), Some(946_684_800_500));
        assert_eq!(parse_time("tomorrow"), None);
    }
}
