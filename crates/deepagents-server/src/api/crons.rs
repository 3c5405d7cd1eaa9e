//! Crons: `/runs/crons` (each firing on a new thread), `/threads/{id}/runs/crons` (each on that
//! thread), their search, count, update and delete; and the scheduler that fires them through
//! the same path as `POST /runs` and `POST /threads/{id}/runs` ([`create_run`]).

use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::request::{Count, Object, Typed, api_enum, count_or, parse};
use super::runs::{OnCompletion, RunCreate, create_run, refuse_unhonoured};
use super::{AppState, Body0, Shared, Tenant, matches, new_id};
use crate::crons::{CronRecord, Schedule, parse_time};
use crate::error::{ApiError, ApiResult};
use crate::time::{now_ms, rfc3339};

/// Fields of a cron's payload that are the cron's, not its runs'.
const CRON_FIELDS: [&str; 5] = [
    "schedule",
    "end_time",
    "enabled",
    "timezone",
    "on_run_completed",
];

/// The cron's fields of `POST /runs/crons` and `POST /threads/{id}/runs/crons`.
#[derive(Default, Deserialize)]
#[serde(default)]
struct CronCreate {
    schedule: Option<String>,
    assistant_id: Option<String>,
    end_time: Option<String>,
    enabled: Option<bool>,
    timezone: Option<String>,
    on_run_completed: Option<OnCompletion>,
    metadata: Option<Object>,
}

/// `PATCH /runs/crons/{id}`: what changes (`end_time: null` clears the end).
#[derive(Default, Deserialize)]
#[serde(default)]
struct CronPatch {
    schedule: Option<String>,
    enabled: Option<bool>,
    timezone: Option<String>,
    on_run_completed: Option<OnCompletion>,
    metadata: Option<Object>,
}

api_enum! {
    /// What crons are sorted by.
    CronSortBy {
        CreatedAt = "created_at",
        CronId = "cron_id",
        AssistantId = "assistant_id",
        ThreadId = "thread_id",
        UpdatedAt = "updated_at",
        NextRunDate = "next_run_date",
        EndTime = "end_time",
    }
}

api_enum! {
    /// Which way.
    CronSortOrder { Desc = "desc", Asc = "asc" }
}

/// `POST /runs/crons/search` and `/count`.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct CronSearch {
    assistant_id: Option<String>,
    thread_id: Option<String>,
    enabled: Option<bool>,
    metadata: Option<Object>,
    limit: Option<Count>,
    offset: Option<Count>,
    sort_by: Option<CronSortBy>,
    sort_order: Option<CronSortOrder>,
    select: Option<Vec<String>>,
}

fn cron_json(cron: &CronRecord) -> Value {
    serde_json::to_value(cron).unwrap_or(Value::Null)
}

/// An `end_time` as RFC 3339, or a 422.
fn end_time(text: &str) -> ApiResult<String> {
    parse_time(text).map(rfc3339).ok_or_else(|| {
        ApiError::invalid(format!(
            "`end_time` must be an ISO 8601 date and time (e.g. 2030-01-01T00:00:00Z), not {text:?}"
        ))
    })
}

/// The body a firing of `cron` creates its run from: its payload less the cron's own
/// fields, its metadata with `cron_id`, and `on_completion` for a stateless one.
fn run_body(cron: &CronRecord) -> Value {
    let mut body = match &cron.payload {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    for field in CRON_FIELDS {
        body.remove(field);
    }
    body.insert("assistant_id".into(), json!(cron.assistant_id));
    let mut metadata = match &cron.metadata {
        Value::Object(map) => map.clone(),
        _ => Map::new(),
    };
    metadata.insert("cron_id".into(), json!(cron.cron_id));
    body.insert("metadata".into(), Value::Object(metadata));
    if cron.thread_id.is_none() {
        body.insert(
            "on_completion".into(),
            json!(cron.on_run_completed.as_deref().unwrap_or("delete")),
        );
    }
    Value::Object(body)
}

/// Checks that a firing's run body would be taken: what `create_run` refuses before
/// anything runs is refused when the cron is made.
fn check_run_body(body: &Value) -> ApiResult<()> {
    let request: RunCreate = parse(body)?;
    refuse_unhonoured(&request)
}

async fn create(
    shared: &AppState,
    tenant: &Tenant,
    thread_id: Option<String>,
    body: Value,
) -> ApiResult<Json<Value>> {
    let request: CronCreate = parse(&body)?;
    let pattern = request
        .schedule
        .as_deref()
        .ok_or_else(|| ApiError::invalid("`schedule` is missing"))?;
    Schedule::parse(pattern, request.timezone.as_deref()).map_err(ApiError::invalid)?;
    let assistant_id = request
        .assistant_id
        .as_deref()
        .ok_or_else(|| ApiError::invalid("`assistant_id` is missing"))?;
    let assistant = shared.assistant(assistant_id)?;
    let end = request.end_time.as_deref().map(end_time).transpose()?;
    if let Some(thread_id) = &thread_id {
        shared.records(tenant).existing_thread(thread_id).await?;
    }
    let now = now_ms();
    let mut cron = CronRecord {
        cron_id: new_id(),
        assistant_id: assistant.id(),
        on_run_completed: match (&thread_id, request.on_run_completed) {
            (None, strategy) => Some(strategy.unwrap_or_default().as_str().to_owned()),
            (Some(_), _) => None,
        },
        thread_id,
        end_time: end,
        schedule: pattern.trim().to_owned(),
        timezone: request.timezone,
        created_at: rfc3339(now),
        updated_at: rfc3339(now),
        payload: body,
        user_id: None,
        next_run_date: None,
        metadata: Value::Object(request.metadata.unwrap_or_default().0),
        enabled: request.enabled.unwrap_or(true),
    };
    check_run_body(&run_body(&cron))?;
    cron.schedule_after(now);
    {
        let _held = shared.crons.lock.lock().await;
        shared.crons.put(&tenant.0, &cron).await?;
    }
    shared.crons.wake.notify_one();
    Ok(Json(cron_json(&cron)))
}

pub(super) async fn cron_create(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Body0(body): Body0,
) -> ApiResult<Json<Value>> {
    create(&shared, &tenant, None, body).await
}

pub(super) async fn thread_cron_create(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(thread_id): Path<String>,
    Body0(body): Body0,
) -> ApiResult<Json<Value>> {
    create(&shared, &tenant, Some(thread_id), body).await
}

pub(super) async fn cron_patch(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(cron_id): Path<String>,
    Body0(body): Body0,
) -> ApiResult<Json<Value>> {
    let patch: CronPatch = parse(&body)?;
    let end = match body.get("end_time") {
        None => None,
        Some(Value::Null) => Some(None),
        Some(Value::String(text)) => Some(Some(end_time(text)?)),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "`end_time` must be an ISO 8601 date and time or null, not {other}"
            )));
        }
    };
    let cron = {
        let _held = shared.crons.lock.lock().await;
        let mut cron = shared
            .crons
            .get(&tenant.0, &cron_id)
            .await?
            .ok_or_else(|| ApiError::not_found(format!("cron `{cron_id}`")))?;
        let rescheduled = patch.schedule.is_some()
            || patch.timezone.is_some()
            || patch.enabled.is_some()
            || end.is_some();
        if let Some(schedule) = &patch.schedule {
            cron.schedule = schedule.trim().to_owned();
        }
        if let Some(timezone) = patch.timezone {
            cron.timezone = Some(timezone);
        }
        Schedule::parse(&cron.schedule, cron.timezone.as_deref()).map_err(ApiError::invalid)?;
        if let Some(end) = end {
            cron.end_time = end;
        }
        if let Some(enabled) = patch.enabled {
            cron.enabled = enabled;
        }
        if let Some(on_run_completed) = patch.on_run_completed
            && cron.thread_id.is_none()
        {
            cron.on_run_completed = Some(on_run_completed.as_str().to_owned());
        }
        if let Some(metadata) = patch.metadata {
            cron.metadata = Value::Object(metadata.0);
        }
        // What the runs are made from: the fields sent replace the payload's.
        if let (Value::Object(payload), Value::Object(changes)) = (&mut cron.payload, &body) {
            for (key, value) in changes {
                if !value.is_null() && key != "assistant_id" {
                    payload.insert(key.clone(), value.clone());
                }
            }
        }
        check_run_body(&run_body(&cron))?;
        let now = now_ms();
        if rescheduled {
            cron.schedule_after(now);
        }
        cron.updated_at = rfc3339(now);
        shared.crons.put(&tenant.0, &cron).await?;
        cron
    };
    shared.crons.wake.notify_one();
    Ok(Json(cron_json(&cron)))
}

pub(super) async fn cron_delete(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(cron_id): Path<String>,
) -> ApiResult<StatusCode> {
    let _held = shared.crons.lock.lock().await;
    if shared.crons.delete(&tenant.0, &cron_id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("cron `{cron_id}`")))
    }
}

/// The tenant's crons that `search` picks, sorted as it asks.
async fn filtered(
    shared: &Shared,
    tenant: &Tenant,
    search: &CronSearch,
) -> ApiResult<Vec<CronRecord>> {
    // An assistant named by graph id or name is its id; an unknown one has no crons.
    let assistant = search
        .assistant_id
        .as_deref()
        .map(|id| shared.assistant(id).map(|a| a.id()).unwrap_or_default());
    let mut crons: Vec<CronRecord> = shared
        .crons
        .of(&tenant.0)
        .await?
        .into_iter()
        .filter(|c| assistant.as_deref().is_none_or(|id| id == c.assistant_id))
        .filter(|c| {
            search
                .thread_id
                .as_deref()
                .is_none_or(|id| c.thread_id.as_deref() == Some(id))
        })
        .filter(|c| search.enabled.is_none_or(|enabled| enabled == c.enabled))
        .filter(|c| matches(&c.metadata, search.metadata.as_ref()))
        .collect();
    let key = |c: &CronRecord| -> String {
        match search.sort_by.unwrap_or_default() {
            CronSortBy::CreatedAt => c.created_at.clone(),
            CronSortBy::CronId => c.cron_id.clone(),
            CronSortBy::AssistantId => c.assistant_id.clone(),
            CronSortBy::ThreadId => c.thread_id.clone().unwrap_or_default(),
            CronSortBy::UpdatedAt => c.updated_at.clone(),
            CronSortBy::NextRunDate => c.next_run_date.clone().unwrap_or_default(),
            CronSortBy::EndTime => c.end_time.clone().unwrap_or_default(),
        }
    };
    crons.sort_by_key(|c| (key(c), c.cron_id.clone()));
    if search.sort_order.unwrap_or_default() != CronSortOrder::Asc {
        crons.reverse();
    }
    Ok(crons)
}

pub(super) async fn crons_search(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Typed(search): Typed<CronSearch>,
) -> ApiResult<Response> {
    let (limit, offset) = (count_or(search.limit, 10), count_or(search.offset, 0));
    let crons = filtered(&shared, &tenant, &search).await?;
    let total = crons.len();
    let page: Vec<Value> = crons
        .iter()
        .skip(offset)
        .take(limit)
        .map(|cron| {
            let mut value = cron_json(cron);
            if let (Some(select), Value::Object(map)) = (&search.select, &mut value) {
                map.retain(|key, _| select.iter().any(|field| field == key));
            }
            value
        })
        .collect();
    Ok(super::paginated(page, offset, limit, total))
}

pub(super) async fn crons_count(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Typed(search): Typed<CronSearch>,
) -> ApiResult<Json<usize>> {
    Ok(Json(filtered(&shared, &tenant, &search).await?.len()))
}

/// Starts the scheduler of `shared`'s crons, when there is a runtime to run it on; it ends
/// with the server (its routes dropped, or its runs stopping).
pub(super) fn start_scheduler(shared: &AppState) {
    if tokio::runtime::Handle::try_current().is_err() {
        return;
    }
    let weak = Arc::downgrade(shared);
    tokio::spawn(schedule(weak));
}

async fn schedule(weak: Weak<Shared>) {
    loop {
        let Some(shared) = weak.upgrade() else {
            return;
        };
        if shared.runs.is_stopping() {
            return;
        }
        let wait = match fire_due(&shared).await {
            Ok(wait) => wait,
            Err(error) => {
                tracing::warn!(%error, "cannot look for due crons");
                shared.crons.tick
            }
        };
        let crons = Arc::clone(&shared.crons);
        drop(shared);
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = crons.wake.notified() => {}
        }
    }
}

/// Fires every cron due now that this server claims; how long until the next is due (at
/// most a tick).
async fn fire_due(shared: &AppState) -> ApiResult<Duration> {
    let now = now_ms();
    let tick = u64::try_from(shared.crons.tick.as_millis()).unwrap_or(u64::MAX);
    let mut wake = now.saturating_add(tick);
    for (tenant, cron) in shared.crons.all().await? {
        if !cron.enabled {
            continue;
        }
        let Some(due) = cron.next_run_ms() else {
            continue;
        };
        if due > now {
            wake = wake.min(due);
            continue;
        }
        // Past its end (changed meanwhile): moved on to never, without firing.
        let fires = cron.end_ms().is_none_or(|end| due <= end);
        // Missed firings (no server ran) fire once; the next is the next one from now.
        let next = cron.due_after(now.max(due));
        if !shared.crons.claim(&tenant, &cron, due, next).await? {
            continue;
        }
        if let Some(next) = next {
            wake = wake.min(next);
        }
        if fires && !shared.runs.is_stopping() {
            fire(shared, &tenant, &cron).await;
        }
    }
    Ok(Duration::from_millis(wake.saturating_sub(now_ms())))
}

/// Creates the run of one firing of `cron`, as its route would; a refusal (its thread gone
/// or busy with `reject`) is logged: that firing is skipped.
async fn fire(shared: &AppState, tenant: &str, cron: &CronRecord) {
    let tenant = Tenant(tenant.to_owned());
    let (thread_id, stateless) = match &cron.thread_id {
        Some(thread_id) => (thread_id.clone(), false),
        None => (new_id(), true),
    };
    match create_run(shared, &tenant, &thread_id, run_body(cron), stateless).await {
        Ok(run) => tracing::info!(
            cron_id = %cron.cron_id,
            run_id = %run.run_id,
            thread_id = %run.thread_id,
            "cron fired"
        ),
        Err(error) => tracing::warn!(
            cron_id = %cron.cron_id,
            thread_id = %thread_id,
            status = %error.status,
            detail = %error.detail,
            "a cron's firing was refused; it fires again when next due"
        ),
    }
}
