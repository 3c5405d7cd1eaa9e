//! Threads: their records, state, history and forks.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::{Extension, Json};
use deepagents::core::{Checkpointer, Run};
use serde::Deserialize;
use serde_json::{Value, json};

use super::request::{CheckpointRef, Count, Object, Typed, TypedQuery, api_enum, count_or};
use super::{AppState, Shared, Tenant, matches, new_id};
use crate::error::{ApiError, ApiResult};
use crate::records::ThreadRecord;
use crate::runs::storage_id;
use crate::time::{now_ms, rfc3339};
use deepagents_langgraph::convert;

/// A thread as the API shows it (see [`thread_json`]), read from its latest checkpoint.
pub(super) async fn thread_view(
    shared: &Shared,
    tenant: &Tenant,
    record: &ThreadRecord,
) -> ApiResult<Value> {
    let run = load(shared, tenant, &record.thread_id, None).await?;
    let ids = message_ids(shared, tenant, record).await?;
    Ok(thread_json(record, run.as_ref(), &ids))
}

/// How the messages of `thread`'s latest state are named (see
/// [`ThreadRecord::head_message_ids`]).
pub(super) async fn message_ids(
    shared: &Shared,
    tenant: &Tenant,
    thread: &ThreadRecord,
) -> ApiResult<convert::MessageIds> {
    Ok(thread
        .head_message_ids(
            shared.watch.as_ref(),
            &storage_id(&tenant.0, &thread.thread_id),
        )
        .await?)
}

/// A thread as the API shows it, with its current values and interrupts.
pub(super) fn thread_json(
    record: &ThreadRecord,
    run: Option<&Run>,
    ids: &convert::MessageIds,
) -> Value {
    let (values, interrupts) = match run {
        Some(run) => {
            let id = convert::interrupt_id(run);
            let interrupts = if run.control.pending.is_empty() {
                json!({})
            } else {
                json!({ id.clone(): convert::interrupts(&run.control.pending, &id) })
            };
            (convert::values_named(run, &id, ids), interrupts)
        }
        None => (json!({}), json!({})),
    };
    json!({
        "thread_id": record.thread_id,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "metadata": record.metadata,
        "status": record.status,
        "values": values,
        "interrupts": interrupts,
        "config": {},
    })
}

pub(super) async fn load(
    shared: &Shared,
    tenant: &Tenant,
    thread_id: &str,
    at: Option<u64>,
) -> ApiResult<Option<Run>> {
    Ok(shared
        .watch
        .load(&storage_id(&tenant.0, thread_id), at)
        .await?)
}

api_enum! {
    /// What creating a thread that exists does.
    IfExists { Raise = "raise", DoNothing = "do_nothing" }
}

api_enum! {
    /// A thread's status, as threads are searched by.
    ThreadStatus { Idle = "idle", Busy = "busy", Interrupted = "interrupted", Error = "error" }
}

api_enum! {
    /// What threads are sorted by.
    ThreadSortBy {
        UpdatedAt = "updated_at",
        ThreadId = "thread_id",
        CreatedAt = "created_at",
        Status = "status",
    }
}

api_enum! {
    /// Which way a listing is sorted.
    SortOrder { Desc = "desc", Asc = "asc" }
}

/// The payload of `POST /threads`.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct ThreadCreate {
    pub(super) thread_id: Option<String>,
    pub(super) metadata: Option<Object>,
    pub(super) if_exists: Option<IfExists>,
}

/// The payload of `PATCH /threads/{id}`.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct ThreadPatch {
    metadata: Option<Object>,
}

/// The payload of `POST /threads/search` and `/threads/count`.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct ThreadSearch {
    ids: Option<Vec<String>>,
    status: Option<ThreadStatus>,
    metadata: Option<Object>,
    sort_by: Option<ThreadSortBy>,
    sort_order: Option<SortOrder>,
    limit: Option<Count>,
    offset: Option<Count>,
}

/// The payload of `POST /threads/{id}/state/checkpoint`.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct StateAt {
    checkpoint: Option<CheckpointRef>,
}

/// The payload of `POST /threads/{id}/state`.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct StateUpdate {
    values: Option<Value>,
}

/// The payload of `POST /threads/{id}/history` (and the query of its `GET`).
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct HistoryRequest {
    limit: Option<Count>,
    before: Option<CheckpointRef>,
    metadata: Option<Object>,
}

pub(super) async fn create_thread(
    shared: &Shared,
    tenant: &Tenant,
    request: &ThreadCreate,
) -> ApiResult<ThreadRecord> {
    let records = shared.records(tenant);
    let thread_id = request.thread_id.clone().unwrap_or_else(new_id);
    deepagents::core::validate_thread_id(&storage_id(&tenant.0, &thread_id))?;
    // An id made here is new; only a client's may name a thread that exists.
    if request.thread_id.is_some()
        && let Some(existing) = records.thread(&thread_id).await?
    {
        return match request.if_exists.unwrap_or_default() {
            IfExists::DoNothing => Ok(existing),
            IfExists::Raise => Err(ApiError::conflict(format!(
                "thread `{thread_id}` exists; send if_exists: do_nothing to get it instead"
            ))),
        };
    }
    let metadata = Value::Object(
        request
            .metadata
            .clone()
            .map(|metadata| metadata.0)
            .unwrap_or_default(),
    );
    let at = rfc3339(now_ms());
    let record = ThreadRecord {
        thread_id,
        created_at: at.clone(),
        updated_at: at,
        metadata,
        status: "idle".to_owned(),
        forks: BTreeMap::new(),
    };
    records.put_thread(&record).await?;
    Ok(record)
}

pub(super) async fn thread_create(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Typed(request): Typed<ThreadCreate>,
) -> ApiResult<Json<Value>> {
    let record = create_thread(&shared, &tenant, &request).await?;
    if request.thread_id.is_none() {
        // Nothing was ever saved under an id made here: no state to read.
        return Ok(Json(thread_json(
            &record,
            None,
            &convert::MessageIds::default(),
        )));
    }
    Ok(Json(thread_view(&shared, &tenant, &record).await?))
}

pub(super) async fn thread_get(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let record = shared.records(&tenant).existing_thread(&id).await?;
    Ok(Json(thread_view(&shared, &tenant, &record).await?))
}

pub(super) async fn thread_patch(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
    Typed(patch): Typed<ThreadPatch>,
) -> ApiResult<Json<Value>> {
    let records = shared.records(&tenant);
    let mut record = records.existing_thread(&id).await?;
    if let (Some(update), Value::Object(metadata)) = (patch.metadata, &mut record.metadata) {
        metadata.extend(update.0);
    }
    record.updated_at = rfc3339(now_ms());
    records.put_thread(&record).await?;
    Ok(Json(thread_view(&shared, &tenant, &record).await?))
}

pub(super) async fn thread_delete(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let records = shared.records(&tenant);
    records.existing_thread(&id).await?;
    let storage = storage_id(&tenant.0, &id);
    shared.runs.stop_thread(&tenant.0, &id).await?;
    records.delete_thread(&id, false).await?;
    // A run stopping now may still hold the thread for its last step.
    for _ in 0..50 {
        match shared.watch.delete_thread(&storage).await {
            Err(deepagents::core::CheckpointError::Busy { .. }) => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            other => {
                other?;
                break;
            }
        }
    }
    Ok(StatusCode::NO_CONTENT)
}

pub(super) async fn filtered_threads(
    shared: &Shared,
    tenant: &Tenant,
    search: &ThreadSearch,
) -> ApiResult<Vec<ThreadRecord>> {
    let ids: Option<BTreeSet<&str>> = search
        .ids
        .as_ref()
        .map(|ids| ids.iter().map(String::as_str).collect());
    let status = search.status.map(ThreadStatus::as_str);
    let mut threads: Vec<ThreadRecord> = shared
        .records(tenant)
        .threads()
        .await?
        .into_iter()
        .filter(|t| matches(&t.metadata, search.metadata.as_ref()))
        .filter(|t| status.is_none_or(|s| s == t.status))
        .filter(|t| {
            ids.as_ref()
                .is_none_or(|ids| ids.contains(t.thread_id.as_str()))
        })
        .collect();
    let key = |t: &ThreadRecord| match search.sort_by.unwrap_or_default() {
        ThreadSortBy::ThreadId => t.thread_id.clone(),
        ThreadSortBy::CreatedAt => t.created_at.clone(),
        ThreadSortBy::Status => t.status.clone(),
        ThreadSortBy::UpdatedAt => t.updated_at.clone(),
    };
    threads.sort_by_key(|t| (key(t), t.thread_id.clone()));
    if search.sort_order.unwrap_or_default() != SortOrder::Asc {
        threads.reverse();
    }
    Ok(threads)
}

pub(super) async fn threads_search(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Typed(search): Typed<ThreadSearch>,
) -> ApiResult<Response> {
    let (limit, offset) = (count_or(search.limit, 10), count_or(search.offset, 0));
    let threads = filtered_threads(&shared, &tenant, &search).await?;
    let total = threads.len();
    let mut page = Vec::new();
    for record in threads.iter().skip(offset).take(limit) {
        page.push(thread_view(&shared, &tenant, record).await?);
    }
    Ok(super::paginated(page, offset, limit, total))
}

pub(super) async fn threads_count(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Typed(search): Typed<ThreadSearch>,
) -> ApiResult<Json<usize>> {
    Ok(Json(
        filtered_threads(&shared, &tenant, &search).await?.len(),
    ))
}

// ---- state ----

pub(super) fn checkpoint_json(thread_id: &str, id: Option<u64>) -> Value {
    match id {
        Some(id) => {
            json!({"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": id.to_string(), "checkpoint_map": null})
        }
        None => Value::Null,
    }
}

/// A thread's state at one checkpoint, as `get_state` and `get_history` return it.
pub(super) fn state_json(
    thread_id: &str,
    ids: &convert::MessageIds,
    run: Option<&Run>,
    checkpoint: Option<u64>,
    parent: Option<u64>,
    created_at_ms: u64,
) -> Value {
    let Some(run) = run else {
        return json!({"values": {}, "next": [], "tasks": [], "checkpoint": null, "metadata": {}, "created_at": null, "parent_checkpoint": null, "interrupts": []});
    };
    let id = convert::interrupt_id(run);
    let waiting = !run.control.pending.is_empty();
    let interrupts = if waiting {
        convert::interrupts(&run.control.pending, &id)
    } else {
        json!([])
    };
    let tasks = if waiting {
        json!([{"id": id, "name": "tools", "path": ["__pregel_pull", "tools"], "error": null, "interrupts": interrupts, "checkpoint": null, "state": null, "result": null}])
    } else {
        json!([])
    };
    json!({
        "values": convert::values_named(run, &id, ids),
        "next": if waiting { json!(["tools"]) } else { json!([]) },
        "tasks": tasks,
        "checkpoint": checkpoint_json(thread_id, checkpoint),
        "metadata": {"step": run.steps, "source": "loop", "thread_id": thread_id},
        "created_at": rfc3339(created_at_ms),
        "parent_checkpoint": checkpoint_json(thread_id, parent),
        "interrupts": interrupts,
    })
}

/// Checkpoint 0: the thread before its first input, as LangGraph's input checkpoint — the
/// parent of the first message, so a client can edit that one too.
pub(super) fn start_state_json(thread_id: &str, created_at: &str) -> Value {
    json!({
        "values": {"messages": []},
        "next": [],
        "tasks": [],
        "checkpoint": checkpoint_json(thread_id, Some(0)),
        "metadata": {"step": -1, "source": "input", "thread_id": thread_id},
        "created_at": created_at,
        "parent_checkpoint": null,
        "interrupts": [],
    })
}

/// The parent of the checkpoint at `position`: the one before it (checkpoint 0 before the
/// first), where a fork stands for the checkpoint it restored — so a run from a checkpoint
/// continues it, as a sibling of what followed it before, as LangGraph's fork does.
pub(super) fn parent_of(
    checkpoints: &[deepagents::core::CheckpointInfo],
    position: usize,
    thread: &ThreadRecord,
) -> u64 {
    if let Some(restored) = thread.forks.get(&checkpoints[position].id) {
        return *restored;
    }
    match position.checked_sub(1) {
        Some(before) => {
            let id = checkpoints[before].id;
            thread.forks.get(&id).copied().unwrap_or(id)
        }
        None => 0,
    }
}

/// A fork that a later checkpoint follows is left out of the history: its state is the one
/// it restored, already there.
pub(super) fn hidden_fork(
    checkpoints: &[deepagents::core::CheckpointInfo],
    position: usize,
    thread: &ThreadRecord,
) -> bool {
    position + 1 < checkpoints.len() && thread.forks.contains_key(&checkpoints[position].id)
}

/// The state at checkpoint `at` (default: the latest) of a thread that exists.
pub(super) async fn state_of(
    shared: &Shared,
    tenant: &Tenant,
    thread_id: &str,
    at: Option<u64>,
) -> ApiResult<Value> {
    let thread = shared.records(tenant).existing_thread(thread_id).await?;
    if at == Some(0) {
        return Ok(start_state_json(thread_id, &thread.created_at));
    }
    let checkpoints = shared
        .watch
        .checkpoints(&storage_id(&tenant.0, thread_id))
        .await?;
    let position = match at {
        Some(at) => Some(checkpoints.iter().position(|c| c.id == at).ok_or_else(|| {
            ApiError::not_found(format!("checkpoint `{at}` of thread `{thread_id}`"))
        })?),
        None => checkpoints.len().checked_sub(1),
    };
    let Some(position) = position else {
        return Ok(state_json(
            thread_id,
            &convert::MessageIds::default(),
            None,
            None,
            None,
            0,
        ));
    };
    let info = &checkpoints[position];
    let run = load(shared, tenant, thread_id, Some(info.id)).await?;
    let parent = Some(parent_of(&checkpoints, position, &thread));
    Ok(state_json(
        thread_id,
        &thread.message_ids(&checkpoints, info.id),
        run.as_ref(),
        Some(info.id),
        parent,
        info.created_at_ms,
    ))
}

pub(super) async fn state_get(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(state_of(&shared, &tenant, &id, None).await?))
}

pub(super) async fn state_at(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path((id, checkpoint)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let at = CheckpointRef::of(&Value::String(checkpoint))
        .map_err(|error| ApiError::invalid(format!("the checkpoint id {error}")))?;
    Ok(Json(state_of(&shared, &tenant, &id, at.0).await?))
}

pub(super) async fn state_at_body(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
    Typed(request): Typed<StateAt>,
) -> ApiResult<Json<Value>> {
    let at = request
        .checkpoint
        .ok_or_else(|| ApiError::invalid("`checkpoint` is missing"))?
        .0
        .ok_or_else(|| ApiError::invalid("`checkpoint` names no `checkpoint_id`"))?;
    Ok(Json(state_of(&shared, &tenant, &id, Some(at)).await?))
}

pub(super) async fn state_update(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
    Typed(update): Typed<StateUpdate>,
) -> ApiResult<Json<Value>> {
    shared.records(&tenant).existing_thread(&id).await?;
    let storage = storage_id(&tenant.0, &id);
    if shared.runs.busy(&tenant.0, &id).await? {
        return Err(ApiError::conflict(format!(
            "thread `{id}` has a run going; update its state when it ends"
        )));
    }
    let values = update.values.unwrap_or(Value::Null);
    let checkpoint = update_state(&shared, &storage, &values).await?;
    Ok(Json(
        json!({"checkpoint": checkpoint_json(&id, Some(checkpoint))}),
    ))
}

/// A state update of a thread (`threads.update_state`, `command.update`).
pub(super) async fn update_state(shared: &Shared, storage: &str, values: &Value) -> ApiResult<u64> {
    convert::update_state(shared.watch.as_ref(), storage, values)
        .await
        .map(|(checkpoint, _)| checkpoint)
        .map_err(|error| match error {
            convert::UpdateError::Invalid(message) => ApiError::invalid(message),
            convert::UpdateError::Checkpoint(error) => error.into(),
        })
}

pub(super) async fn history_of(
    shared: &Shared,
    tenant: &Tenant,
    id: &str,
    request: &HistoryRequest,
) -> ApiResult<Vec<Value>> {
    let thread = shared.records(tenant).existing_thread(id).await?;
    let limit = count_or(request.limit, 10);
    let before = request.before.and_then(|before| before.0);
    let filter = request.metadata.as_ref();
    let checkpoints = shared.watch.checkpoints(&storage_id(&tenant.0, id)).await?;
    let mut states = Vec::new();
    for (position, info) in checkpoints.iter().enumerate().rev() {
        if before.is_some_and(|before| info.id >= before) {
            continue;
        }
        if states.len() == limit {
            break;
        }
        if hidden_fork(&checkpoints, position, &thread) {
            continue;
        }
        let run = load(shared, tenant, id, Some(info.id)).await?;
        let parent = Some(parent_of(&checkpoints, position, &thread));
        let ids = thread.message_ids(&checkpoints, info.id);
        let state = state_json(
            id,
            &ids,
            run.as_ref(),
            Some(info.id),
            parent,
            info.created_at_ms,
        );
        if matches(&state["metadata"], filter) {
            states.push(state);
        }
    }
    // The input checkpoint closes a history that has any, as LangGraph's does.
    if !checkpoints.is_empty() && states.len() < limit && before.is_none_or(|before| before > 0) {
        let start = start_state_json(id, &thread.created_at);
        if matches(&start["metadata"], filter) {
            states.push(start);
        }
    }
    Ok(states)
}

pub(super) async fn history(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
    Typed(request): Typed<HistoryRequest>,
) -> ApiResult<Json<Vec<Value>>> {
    Ok(Json(history_of(&shared, &tenant, &id, &request).await?))
}

pub(super) async fn history_get(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
    TypedQuery(request): TypedQuery<HistoryRequest>,
) -> ApiResult<Json<Vec<Value>>> {
    Ok(Json(history_of(&shared, &tenant, &id, &request).await?))
}
