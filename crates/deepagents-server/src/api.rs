//! The routes, payloads and status codes of the LangGraph Platform API, over [`Runs`] and
//! [`Records`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use deepagents::backends::Store;
use deepagents::core::{Checkpointer, Run};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};
use crate::records::{Records, RunRecord, ThreadRecord};
use crate::runs::{Job, Live, Runs, storage_id};
use crate::stream::FrameLog;
use crate::time::{now_ms, rfc3339};
use crate::{Assistant, ServerOptions};
use deepagents_langgraph::MODES;
use deepagents_langgraph::convert;

mod events;

/// What every handler shares.
struct Shared {
    assistants: Vec<Arc<Assistant>>,
    store: Arc<dyn Store>,
    watch: Arc<crate::StepWatch>,
    runs: Arc<Runs>,
    api_keys: BTreeMap<String, String>,
    /// When the server was set up: its assistants' creation time (they are made with it).
    started_at: String,
}

type AppState = Arc<Shared>;

/// The tenant a request acts for.
#[derive(Clone)]
struct Tenant(String);

impl Shared {
    fn records(&self, tenant: &Tenant) -> Records {
        Records::new(Arc::clone(&self.store), &tenant.0)
    }

    /// The assistant an `assistant_id` names: its id, graph id or name.
    fn assistant(&self, id: &str) -> ApiResult<Arc<Assistant>> {
        self.assistants
            .iter()
            .find(|a| a.id() == id || a.graph_id == id || a.name == id)
            .cloned()
            .ok_or_else(|| ApiError::not_found(format!("assistant `{id}`")))
    }
}

/// The router and the runs it drives.
pub fn router(options: ServerOptions) -> (Router, Arc<Runs>) {
    let assistants: Vec<Arc<Assistant>> = options.assistants.into_iter().map(Arc::new).collect();
    #[cfg(feature = "cluster")]
    let runs = match options.cluster {
        Some(cluster) => Runs::clustered(
            Arc::clone(&options.watch),
            Arc::clone(&options.store),
            assistants.clone(),
            cluster,
        ),
        None => Runs::new(
            Arc::clone(&options.watch),
            Arc::clone(&options.store),
            assistants.clone(),
        ),
    };
    #[cfg(not(feature = "cluster"))]
    let runs = Runs::new(
        Arc::clone(&options.watch),
        Arc::clone(&options.store),
        assistants.clone(),
    );
    let max_body = options.max_body_bytes;
    let shared = Arc::new(Shared {
        assistants,
        store: options.store,
        watch: options.watch,
        runs: Arc::clone(&runs),
        api_keys: options.api_keys,
        started_at: rfc3339(now_ms()),
    });
    let api = Router::new()
        .route("/assistants/search", post(assistants_search))
        .route("/assistants/count", post(assistants_count))
        .route("/assistants/{assistant_id}", get(assistant_get))
        .route("/assistants/{assistant_id}/schemas", get(assistant_schemas))
        .route("/assistants/{assistant_id}/graph", get(assistant_graph))
        .route(
            "/assistants/{assistant_id}/subgraphs",
            get(assistant_subgraphs),
        )
        .route(
            "/assistants/{assistant_id}/subgraphs/{namespace}",
            get(assistant_subgraphs),
        )
        .route("/threads", post(thread_create))
        .route("/threads/search", post(threads_search))
        .route("/threads/count", post(threads_count))
        .route(
            "/threads/{thread_id}",
            get(thread_get).patch(thread_patch).delete(thread_delete),
        )
        .route(
            "/threads/{thread_id}/state",
            get(state_get).post(state_update),
        )
        .route("/threads/{thread_id}/state/checkpoint", post(state_at_body))
        .route("/threads/{thread_id}/state/{checkpoint_id}", get(state_at))
        .route(
            "/threads/{thread_id}/history",
            get(history_get).post(history),
        )
        .route("/threads/{thread_id}/runs", get(runs_list).post(run_create))
        .route("/threads/{thread_id}/runs/stream", post(run_stream))
        .route("/threads/{thread_id}/runs/wait", post(run_wait))
        .route("/threads/{thread_id}/commands", post(events::command))
        .route("/threads/{thread_id}/stream/events", post(events::events))
        .route(
            "/threads/{thread_id}/runs/{run_id}",
            get(run_get).delete(run_delete),
        )
        .route("/threads/{thread_id}/runs/{run_id}/join", get(run_join))
        .route(
            "/threads/{thread_id}/runs/{run_id}/stream",
            get(run_join_stream),
        )
        .route(
            "/threads/{thread_id}/runs/{run_id}/cancel",
            post(run_cancel),
        )
        .route("/runs", post(stateless_create))
        .route("/runs/stream", post(stateless_stream))
        .route("/runs/wait", post(stateless_wait))
        .route(
            "/store/items",
            get(store_get).put(store_put).delete(store_delete),
        )
        .route("/store/items/search", post(store_search))
        .route("/store/namespaces", post(store_namespaces))
        .route_layer(middleware::from_fn_with_state(
            Arc::clone(&shared),
            authenticate,
        ));
    let router = Router::new()
        .route("/", get(crate::chat::page))
        .route("/chat.js", get(crate::chat::script))
        .route("/chat.css", get(crate::chat::style))
        .route("/ok", get(|| async { Json(json!({"ok": true})) }))
        .route("/info", get(info))
        .route("/metrics", get(metrics))
        .merge(api)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn(crate::error::log_refusals))
        .with_state(shared);
    (router, runs)
}

/// The tenant of the request's API key (`x-api-key` or `Authorization: Bearer`); without
/// configured keys, tenant `default`.
async fn authenticate(
    State(shared): State<AppState>,
    mut request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let tenant = if shared.api_keys.is_empty() {
        "default".to_owned()
    } else {
        let headers = request.headers();
        let key = headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .or_else(|| {
                headers
                    .get(header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("Bearer "))
            })
            .map(str::trim);
        match key.and_then(|key| shared.api_keys.get(key)) {
            Some(tenant) => tenant.clone(),
            None => return Err(ApiError::unauthorized()),
        }
    };
    request.extensions_mut().insert(Tenant(tenant));
    Ok(next.run(request).await)
}

/// A JSON body that may be absent or empty (`{}` then).
struct Body0(Value);

impl<S: Send + Sync> axum::extract::FromRequest<S> for Body0 {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(request, state).await.map_err(|e| {
            // Too large is the client's size, not its syntax: 413, as HTTP says.
            let status = e.status();
            ApiError {
                status: if status == StatusCode::PAYLOAD_TOO_LARGE {
                    status
                } else {
                    StatusCode::UNPROCESSABLE_ENTITY
                },
                detail: if status == StatusCode::PAYLOAD_TOO_LARGE {
                    format!(
                        "the body is too large: {e}; send less, or raise the server's body limit"
                    )
                } else {
                    format!("cannot read the body: {e}")
                },
            }
        })?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self(json!({})));
        }
        match serde_json::from_slice(&bytes) {
            Ok(value @ Value::Object(_)) => Ok(Self(value)),
            Ok(_) => Err(ApiError::invalid("the body must be a JSON object")),
            Err(e) => Err(ApiError::invalid(format!(
                "the body is not valid JSON: {e}"
            ))),
        }
    }
}

fn field<'a>(body: &'a Value, key: &str) -> Option<&'a Value> {
    body.get(key).filter(|v| !v.is_null())
}

fn count(body: &Value, key: &str, default: usize) -> ApiResult<usize> {
    match field(body, key) {
        None => Ok(default),
        Some(value) => value
            .as_u64()
            .map(|n| n as usize)
            .ok_or_else(|| ApiError::invalid(format!("`{key}` must be a non-negative integer"))),
    }
}

/// Whether `metadata` holds every key of `filter` with the same value.
fn matches(metadata: &Value, filter: Option<&Value>) -> bool {
    match filter.and_then(Value::as_object) {
        None => true,
        Some(filter) => filter.iter().all(|(k, v)| metadata.get(k) == Some(v)),
    }
}

async fn info() -> Json<Value> {
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "langgraph_py_version": null,
        "flags": {"assistants": true, "crons": false, "langsmith": false, "langsmith_tracing_replicas": false},
        "metadata": {"server": "deepagents-rs"},
    }))
}

async fn metrics(State(shared): State<AppState>) -> Response {
    let (active, queued) = shared.runs.counts().await;
    let text = shared.runs.metrics.render(active, queued);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

// ---- assistants ----

fn assistant_json(assistant: &Assistant, at: &str) -> Value {
    json!({
        "assistant_id": assistant.id(),
        "graph_id": assistant.graph_id,
        "name": assistant.name,
        "description": assistant.description,
        "config": {},
        "context": {},
        "metadata": {"created_by": "system"},
        "version": 1,
        "created_at": at,
        "updated_at": at,
    })
}

fn assistants_matching<'a>(shared: &'a Shared, body: &Value) -> Vec<&'a Arc<Assistant>> {
    shared
        .assistants
        .iter()
        .filter(|a| field(body, "graph_id").is_none_or(|g| g.as_str() == Some(&a.graph_id)))
        .filter(|a| field(body, "name").is_none_or(|n| n.as_str() == Some(&a.name)))
        .filter(|_| matches(&json!({"created_by": "system"}), field(body, "metadata")))
        .collect()
}

async fn assistants_search(
    State(shared): State<AppState>,
    Body0(body): Body0,
) -> ApiResult<Json<Vec<Value>>> {
    let (limit, offset) = (count(&body, "limit", 10)?, count(&body, "offset", 0)?);
    Ok(Json(
        assistants_matching(&shared, &body)
            .into_iter()
            .skip(offset)
            .take(limit)
            .map(|a| assistant_json(a, &shared.started_at))
            .collect(),
    ))
}

async fn assistants_count(State(shared): State<AppState>, Body0(body): Body0) -> Json<usize> {
    Json(assistants_matching(&shared, &body).len())
}

async fn assistant_get(
    State(shared): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(assistant_json(
        &*shared.assistant(&id)?,
        &shared.started_at,
    )))
}

async fn assistant_schemas(
    State(shared): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let assistant = shared.assistant(&id)?;
    let messages = json!({"type": "array", "items": {"type": "object"}});
    Ok(Json(json!({
        "graph_id": assistant.graph_id,
        "input_schema": {"type": "object", "properties": {"messages": messages}},
        "output_schema": {"type": "object", "properties": {"messages": messages, "todos": {"type": "array"}, "files": {"type": "object"}, "structured_response": {}}},
        "state_schema": {"type": "object", "properties": {"messages": messages, "todos": {"type": "array"}, "files": {"type": "object"}}},
        "config_schema": {"type": "object", "properties": {}},
        "context_schema": {"type": "object", "properties": {}},
    })))
}

/// The agent's loop as LangGraph draws a graph (what LangGraph Studio shows): the model
/// node, the tools node it hands calls to, and back.
async fn assistant_graph(
    State(shared): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    shared.assistant(&id)?;
    let node = |name: &str| json!({"id": name, "type": "runnable", "data": {"id": ["deepagents", name], "name": name}});
    Ok(Json(json!({
        "nodes": [
            {"id": "__start__", "type": "schema", "data": "__start__"},
            node("model"),
            node("tools"),
            {"id": "__end__", "type": "schema", "data": "__end__"},
        ],
        "edges": [
            {"source": "__start__", "target": "model"},
            {"source": "model", "target": "tools", "conditional": true},
            {"source": "model", "target": "__end__", "conditional": true},
            {"source": "tools", "target": "model"},
        ],
    })))
}

/// Subagents run as the `task` tool, not as subgraphs: there are none to list.
async fn assistant_subgraphs(
    State(shared): State<AppState>,
    Path(params): Path<Vec<(String, String)>>,
) -> ApiResult<Json<Value>> {
    let id = params
        .iter()
        .find(|(name, _)| name == "assistant_id")
        .map(|(_, value)| value.as_str())
        .unwrap_or_default();
    shared.assistant(id)?;
    Ok(Json(json!({})))
}

// ---- threads ----

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// A thread as the API shows it (see [`thread_json`]), read from its latest checkpoint.
async fn thread_view(shared: &Shared, tenant: &Tenant, record: &ThreadRecord) -> ApiResult<Value> {
    let run = load(shared, tenant, &record.thread_id, None).await?;
    let ids = message_ids(shared, tenant, record, None).await?;
    Ok(thread_json(record, run.as_ref(), &ids))
}

/// How the messages of a thread's state at checkpoint `at` (default: the latest) are named:
/// by position, with the forks on the way to that state (see [`convert::MessageIds`]).
async fn message_ids(
    shared: &Shared,
    tenant: &Tenant,
    thread: &ThreadRecord,
    at: Option<u64>,
) -> ApiResult<convert::MessageIds> {
    if thread.forks.is_empty() {
        return Ok(convert::MessageIds::default());
    }
    let checkpoints = shared
        .watch
        .checkpoints(&storage_id(&tenant.0, &thread.thread_id))
        .await?;
    let at = at.unwrap_or_else(|| checkpoints.last().map_or(0, |latest| latest.id));
    Ok(thread.message_ids(&checkpoints, at))
}

/// A thread as the API shows it, with its current values and interrupts.
fn thread_json(record: &ThreadRecord, run: Option<&Run>, ids: &convert::MessageIds) -> Value {
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

async fn load(
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

async fn create_thread(shared: &Shared, tenant: &Tenant, body: &Value) -> ApiResult<ThreadRecord> {
    let records = shared.records(tenant);
    let thread_id = match field(body, "thread_id") {
        Some(Value::String(id)) => id.clone(),
        Some(_) => return Err(ApiError::invalid("`thread_id` must be a string")),
        None => new_id(),
    };
    deepagents::core::validate_thread_id(&storage_id(&tenant.0, &thread_id))?;
    if let Some(existing) = records.thread(&thread_id).await? {
        return match field(body, "if_exists").and_then(Value::as_str) {
            Some("do_nothing") => Ok(existing),
            _ => Err(ApiError::conflict(format!(
                "thread `{thread_id}` exists; send if_exists: do_nothing to get it instead"
            ))),
        };
    }
    let metadata = match field(body, "metadata") {
        Some(Value::Object(map)) => Value::Object(map.clone()),
        Some(_) => return Err(ApiError::invalid("`metadata` must be an object")),
        None => json!({}),
    };
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

async fn thread_create(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Body0(body): Body0,
) -> ApiResult<Json<Value>> {
    let record = create_thread(&shared, &tenant, &body).await?;
    Ok(Json(thread_view(&shared, &tenant, &record).await?))
}

async fn thread_get(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let record = shared.records(&tenant).existing_thread(&id).await?;
    Ok(Json(thread_view(&shared, &tenant, &record).await?))
}

async fn thread_patch(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
    Body0(body): Body0,
) -> ApiResult<Json<Value>> {
    let records = shared.records(&tenant);
    let mut record = records.existing_thread(&id).await?;
    if let (Some(Value::Object(update)), Value::Object(metadata)) =
        (field(&body, "metadata"), &mut record.metadata)
    {
        metadata.extend(update.clone());
    }
    record.updated_at = rfc3339(now_ms());
    records.put_thread(&record).await?;
    Ok(Json(thread_view(&shared, &tenant, &record).await?))
}

async fn thread_delete(
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

async fn filtered_threads(
    shared: &Shared,
    tenant: &Tenant,
    body: &Value,
) -> ApiResult<Vec<ThreadRecord>> {
    let ids: Option<BTreeSet<&str>> = field(body, "ids")
        .and_then(Value::as_array)
        .map(|ids| ids.iter().filter_map(Value::as_str).collect());
    let status = field(body, "status").and_then(Value::as_str);
    let mut threads: Vec<ThreadRecord> = shared
        .records(tenant)
        .threads()
        .await?
        .into_iter()
        .filter(|t| matches(&t.metadata, field(body, "metadata")))
        .filter(|t| status.is_none_or(|s| s == t.status))
        .filter(|t| {
            ids.as_ref()
                .is_none_or(|ids| ids.contains(t.thread_id.as_str()))
        })
        .collect();
    let sort_by = field(body, "sort_by")
        .and_then(Value::as_str)
        .unwrap_or("updated_at");
    let key = |t: &ThreadRecord| match sort_by {
        "thread_id" => t.thread_id.clone(),
        "created_at" => t.created_at.clone(),
        "status" => t.status.clone(),
        _ => t.updated_at.clone(),
    };
    threads.sort_by_key(|t| (key(t), t.thread_id.clone()));
    if field(body, "sort_order").and_then(Value::as_str) != Some("asc") {
        threads.reverse();
    }
    Ok(threads)
}

async fn threads_search(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Body0(body): Body0,
) -> ApiResult<Response> {
    let (limit, offset) = (count(&body, "limit", 10)?, count(&body, "offset", 0)?);
    let threads = filtered_threads(&shared, &tenant, &body).await?;
    let total = threads.len();
    let mut page = Vec::new();
    for record in threads.iter().skip(offset).take(limit) {
        page.push(thread_view(&shared, &tenant, record).await?);
    }
    let mut response = Json(page).into_response();
    if offset + limit < total
        && let Ok(next) = HeaderValue::from_str(&(offset + limit).to_string())
    {
        response.headers_mut().insert("X-Pagination-Next", next);
    }
    if let Ok(total) = HeaderValue::from_str(&total.to_string()) {
        response.headers_mut().insert("X-Pagination-Total", total);
    }
    Ok(response)
}

async fn threads_count(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Body0(body): Body0,
) -> ApiResult<Json<usize>> {
    Ok(Json(filtered_threads(&shared, &tenant, &body).await?.len()))
}

// ---- state ----

fn checkpoint_json(thread_id: &str, id: Option<u64>) -> Value {
    match id {
        Some(id) => {
            json!({"thread_id": thread_id, "checkpoint_ns": "", "checkpoint_id": id.to_string(), "checkpoint_map": null})
        }
        None => Value::Null,
    }
}

/// A thread's state at one checkpoint, as `get_state` and `get_history` return it.
fn state_json(
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
fn start_state_json(thread_id: &str, created_at: &str) -> Value {
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
fn parent_of(
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
fn hidden_fork(
    checkpoints: &[deepagents::core::CheckpointInfo],
    position: usize,
    thread: &ThreadRecord,
) -> bool {
    position + 1 < checkpoints.len() && thread.forks.contains_key(&checkpoints[position].id)
}

/// The state at checkpoint `at` (default: the latest) of a thread that exists.
async fn state_of(
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

fn checkpoint_id(value: &Value) -> ApiResult<u64> {
    let id = value
        .get("checkpoint_id")
        .or_else(|| value.pointer("/configurable/checkpoint_id"))
        .unwrap_or(value);
    match id {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
    .ok_or_else(|| ApiError::invalid(format!("not a checkpoint id: {id}")))
}

async fn state_get(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(state_of(&shared, &tenant, &id, None).await?))
}

async fn state_at(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path((id, checkpoint)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let at = checkpoint_id(&Value::String(checkpoint))?;
    Ok(Json(state_of(&shared, &tenant, &id, Some(at)).await?))
}

async fn state_at_body(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
    Body0(body): Body0,
) -> ApiResult<Json<Value>> {
    let checkpoint =
        field(&body, "checkpoint").ok_or_else(|| ApiError::invalid("`checkpoint` is missing"))?;
    let at = checkpoint_id(checkpoint)?;
    Ok(Json(state_of(&shared, &tenant, &id, Some(at)).await?))
}

async fn state_update(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
    Body0(body): Body0,
) -> ApiResult<Json<Value>> {
    shared.records(&tenant).existing_thread(&id).await?;
    let storage = storage_id(&tenant.0, &id);
    if shared.runs.busy(&tenant.0, &id).await? {
        return Err(ApiError::conflict(format!(
            "thread `{id}` has a run going; update its state when it ends"
        )));
    }
    let values = field(&body, "values").cloned().unwrap_or(Value::Null);
    let checkpoint = update_state(&shared, &storage, &values).await?;
    Ok(Json(
        json!({"checkpoint": checkpoint_json(&id, Some(checkpoint))}),
    ))
}

/// A state update of a thread (`threads.update_state`, `command.update`).
async fn update_state(shared: &Shared, storage: &str, values: &Value) -> ApiResult<u64> {
    convert::update_state(shared.watch.as_ref(), storage, values)
        .await
        .map(|(checkpoint, _)| checkpoint)
        .map_err(|error| match error {
            convert::UpdateError::Invalid(message) => ApiError::invalid(message),
            convert::UpdateError::Checkpoint(error) => error.into(),
        })
}

async fn history_of(
    shared: &Shared,
    tenant: &Tenant,
    id: &str,
    body: &Value,
) -> ApiResult<Vec<Value>> {
    let thread = shared.records(tenant).existing_thread(id).await?;
    let limit = count(body, "limit", 10)?;
    let before = field(body, "before").map(checkpoint_id).transpose()?;
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
        if matches(&state["metadata"], field(body, "metadata")) {
            states.push(state);
        }
    }
    // The input checkpoint closes a history that has any, as LangGraph's does.
    if !checkpoints.is_empty() && states.len() < limit && before.is_none_or(|before| before > 0) {
        let start = start_state_json(id, &thread.created_at);
        if matches(&start["metadata"], field(body, "metadata")) {
            states.push(start);
        }
    }
    Ok(states)
}

async fn history(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
    Body0(body): Body0,
) -> ApiResult<Json<Vec<Value>>> {
    Ok(Json(history_of(&shared, &tenant, &id, &body).await?))
}

#[derive(Deserialize)]
struct HistoryQuery {
    limit: Option<usize>,
    before: Option<String>,
}

async fn history_get(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(id): Path<String>,
    Query(query): Query<HistoryQuery>,
) -> ApiResult<Json<Vec<Value>>> {
    let body = json!({"limit": query.limit, "before": query.before});
    Ok(Json(history_of(&shared, &tenant, &id, &body).await?))
}

// ---- runs ----

fn run_json(record: &RunRecord) -> Value {
    let mut value = serde_json::to_value(record).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut value {
        map.remove("kwargs");
        map.insert("kwargs".to_owned(), record.kwargs.clone());
    }
    value
}

/// The stream modes of a payload (default `values`), checked.
fn stream_modes(body: &Value) -> ApiResult<BTreeSet<String>> {
    let modes: Vec<String> = match field(body, "stream_mode") {
        None => vec!["values".to_owned()],
        Some(Value::String(mode)) => vec![mode.clone()],
        Some(Value::Array(modes)) => modes
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        Some(_) => {
            return Err(ApiError::invalid(
                "`stream_mode` must be a string or a list of strings",
            ));
        }
    };
    for mode in &modes {
        if !MODES.contains(&mode.as_str()) {
            return Err(ApiError::invalid(format!(
                "unknown stream mode `{mode}`; use one of {}",
                MODES.join(", ")
            )));
        }
    }
    Ok(modes.into_iter().collect())
}

/// Run fields this server does not act on. Each is refused by name when it asks for
/// something (a non-empty value), never silently ignored: a client relying on it would
/// otherwise get a run that behaves differently from what it asked for.
const UNHONOURED: [(&str, &str); 4] = [
    (
        "interrupt_before",
        "pauses come from the assistant's approval rules",
    ),
    (
        "interrupt_after",
        "pauses come from the assistant's approval rules",
    ),
    ("webhook", "poll the run or join its stream"),
    ("after_seconds", "start the run when it is due"),
];

fn refuse_unhonoured(body: &Value) -> ApiResult<()> {
    for (name, instead) in UNHONOURED {
        let asks = match field(body, name) {
            None | Some(Value::Null) => false,
            Some(Value::Array(items)) => !items.is_empty(),
            Some(Value::String(text)) => !text.is_empty(),
            Some(Value::Number(n)) => n.as_f64() != Some(0.0),
            Some(_) => true,
        };
        if asks {
            return Err(ApiError::invalid(format!(
                "`{name}` is not supported by this server; {instead}"
            )));
        }
    }
    Ok(())
}

/// Records on the thread which assistant last ran on it (`graph_id`, `assistant_id` in its
/// metadata), as LangGraph does: UIs list a graph's threads by searching that metadata.
async fn record_assistant(
    records: &Records,
    thread_id: &str,
    assistant: &Assistant,
) -> ApiResult<()> {
    let Some(mut thread) = records.thread(thread_id).await? else {
        return Ok(());
    };
    let Value::Object(metadata) = &mut thread.metadata else {
        return Ok(());
    };
    let (graph_id, assistant_id) = (json!(assistant.graph_id), json!(assistant.id()));
    // Written only when it changes, so a busy thread's status is not raced needlessly.
    if metadata.get("graph_id") == Some(&graph_id)
        && metadata.get("assistant_id") == Some(&assistant_id)
    {
        return Ok(());
    }
    metadata.insert("graph_id".to_owned(), graph_id);
    metadata.insert("assistant_id".to_owned(), assistant_id);
    records.put_thread(&thread).await
}

/// Creates a run from a payload and starts or queues it.
async fn create_run(
    shared: &AppState,
    tenant: &Tenant,
    thread_id: &str,
    body: Value,
    stateless: bool,
) -> ApiResult<RunRecord> {
    let records = shared.records(tenant);
    let assistant_id = field(&body, "assistant_id")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("`assistant_id` is missing"))?;
    let assistant = shared.assistant(assistant_id)?;
    if records.thread(thread_id).await?.is_none() {
        if stateless || field(&body, "if_not_exists").and_then(Value::as_str) == Some("create") {
            create_thread(shared, tenant, &json!({"thread_id": thread_id})).await?;
        } else {
            return Err(ApiError::not_found(format!(
                "thread `{thread_id}` (send if_not_exists: create to make it)"
            )));
        }
    }
    refuse_unhonoured(&body)?;
    let context = match field(&body, "context") {
        None | Some(Value::Null) => None,
        Some(Value::Object(map)) if map.is_empty() => None,
        Some(context @ Value::Object(_)) => Some(context.clone()),
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "`context` must be an object of the values the run's tools read, not {other}"
            )));
        }
    };
    if !stateless {
        record_assistant(&records, thread_id, &assistant).await?;
    }
    let (answers, input) = convert::input_messages(field(&body, "input").unwrap_or(&Value::Null))
        .map_err(ApiError::invalid)?;
    let resume = field(&body, "command")
        .and_then(|command| field(command, "resume"))
        .cloned();
    let end_turn = match field(&body, "command").and_then(|command| field(command, "goto")) {
        None | Some(Value::Null) => false,
        Some(Value::String(node)) if node == "__end__" => true,
        Some(_) => {
            return Err(ApiError::invalid(
                "command.goto may only be \"__end__\" (end the turn without running what waits): the agent has one loop; send resume or input to go on",
            ));
        }
    };
    let modes = stream_modes(&body)?;
    // A resume is checked before anything changes (`command.update` included), so a refused
    // one changes nothing: an interrupt that is not pending now is a 409, as is one named
    // while another run of the thread is going (it may answer it first); decisions that
    // cannot be used are a 422 (behind a running run, those that name no interrupt are
    // checked when their turn comes: what will wait then is not known yet). `submit`
    // checks again once no other run can start.
    if let Some(resume) = &resume {
        let busy = shared.runs.busy(&tenant.0, thread_id).await?;
        match shared
            .runs
            .check_resume(&storage_id(&tenant.0, thread_id), resume)
            .await
        {
            Err(error) if busy && error.status == StatusCode::UNPROCESSABLE_ENTITY => {}
            other => other?,
        }
        if busy && let Some(interrupt) = convert::resume_interrupt(resume) {
            return Err(crate::runs::busy_before_resume(thread_id, &interrupt));
        }
    }
    // A run from an earlier checkpoint starts from there (edit, regenerate): the fork comes
    // first, so an update and the input apply to the restored state.
    if let Some(at) = fork_point(&body)? {
        fork(shared, tenant, thread_id, at).await?;
    }
    if let Some(update) = field(&body, "command").and_then(|command| field(command, "update")) {
        update_state(shared, &storage_id(&tenant.0, thread_id), update).await?;
    }
    let strategy = field(&body, "multitask_strategy")
        .and_then(Value::as_str)
        .unwrap_or("reject")
        .to_owned();
    if !matches!(
        strategy.as_str(),
        "reject" | "enqueue" | "interrupt" | "rollback"
    ) {
        return Err(ApiError::invalid(format!(
            "unknown multitask_strategy `{strategy}`; use reject, enqueue, interrupt or rollback"
        )));
    }
    if end_turn {
        return end_thread_turn(shared, tenant, thread_id, &assistant, body, strategy).await;
    }
    // Tool messages in the input answer the calls that wait (a UI settling them when the
    // user types instead of deciding), as LangGraph appends them: the turn ends with those
    // results, then the run goes on from them and the user's message.
    if !answers.is_empty() {
        if resume.is_some() {
            return Err(ApiError::invalid(
                "send either tool messages answering the waiting calls or command.resume, not both",
            ));
        }
        settle_calls(shared, tenant, thread_id, &answers).await?;
    }
    let at = rfc3339(now_ms());
    let record = RunRecord {
        run_id: new_id(),
        thread_id: thread_id.to_owned(),
        assistant_id: assistant.id(),
        created_at: at.clone(),
        updated_at: at,
        status: "pending".to_owned(),
        metadata: field(&body, "metadata")
            .cloned()
            .unwrap_or_else(|| json!({})),
        multitask_strategy: strategy.clone(),
        kwargs: body.clone(),
        error: None,
        values: None,
        worker: None,
        stop_reason: None,
    };
    records.put_run(&record).await?;
    let keep = field(&body, "on_completion").and_then(Value::as_str) == Some("keep");
    let job = Job {
        tenant: tenant.0.clone(),
        graph_id: assistant.graph_id.clone(),
        record: record.clone(),
        input,
        resume,
        modes,
        subgraphs: field(&body, "stream_subgraphs")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        delete_thread_after: stateless && !keep,
        context,
    };
    if let Err(error) = shared.runs.submit(job, &strategy).await {
        let _ = records.delete_run(thread_id, &record.run_id).await;
        return Err(error);
    }
    Ok(record)
}

/// The checkpoint a run starts from (`checkpoint: {checkpoint_id}` or `checkpoint_id`), when
/// the payload names one.
fn fork_point(body: &Value) -> ApiResult<Option<u64>> {
    let named = field(body, "checkpoint")
        .filter(|checkpoint| !checkpoint.is_null())
        .or_else(|| field(body, "checkpoint_id").filter(|id| !id.is_null()));
    match named {
        // `{}` or a checkpoint without an id names none (the SDK sends what it has).
        Some(Value::Object(map)) if map.get("checkpoint_id").is_none_or(Value::is_null) => Ok(None),
        Some(value) => checkpoint_id(value).map(Some),
        None => Ok(None),
    }
}

/// Starts the thread again from checkpoint `at` (edit, regenerate): its state becomes that
/// checkpoint's, recorded as a branch from it, before the run adds its input. Naming the
/// latest checkpoint (as UIs do on every submit) changes nothing.
async fn fork(shared: &Shared, tenant: &Tenant, thread_id: &str, at: u64) -> ApiResult<()> {
    if shared.runs.busy(&tenant.0, thread_id).await? {
        // Behind a running run the latest checkpoint is still to come: only a fork needs the
        // thread at rest, and it cannot be told from here; the run's strategy decides.
        let latest = shared
            .watch
            .checkpoints(&storage_id(&tenant.0, thread_id))
            .await?
            .last()
            .map_or(0, |checkpoint| checkpoint.id);
        if latest == at {
            return Ok(());
        }
        return Err(ApiError::conflict(format!(
            "thread `{thread_id}` has a run going; start from checkpoint `{at}` once it ends"
        )));
    }
    let restored =
        convert::restore_checkpoint(shared.watch.as_ref(), &storage_id(&tenant.0, thread_id), at)
            .await
            .map_err(|error| match error {
                convert::UpdateError::Invalid(detail) => ApiError {
                    status: StatusCode::NOT_FOUND,
                    detail,
                },
                convert::UpdateError::Checkpoint(error) => error.into(),
            })?;
    if let Some(new) = restored {
        let records = shared.records(tenant);
        if let Some(mut thread) = records.thread(thread_id).await? {
            thread.forks.insert(new, at);
            records.put_thread(&thread).await?;
        }
    }
    Ok(())
}

/// Ends the thread's paused turn with `answers` for its waiting calls (the rest marked not
/// run), when no run of the thread is going.
async fn settle_calls(
    shared: &Shared,
    tenant: &Tenant,
    thread_id: &str,
    answers: &[convert::ToolAnswer],
) -> ApiResult<Option<(u64, deepagents::core::Run)>> {
    if shared.runs.busy(&tenant.0, thread_id).await? {
        return Err(ApiError::conflict(format!(
            "thread `{thread_id}` has a run going; settle its waiting calls once it has paused"
        )));
    }
    convert::end_turn(
        shared.watch.as_ref(),
        &storage_id(&tenant.0, thread_id),
        answers,
    )
    .await
    .map_err(|error| match error {
        convert::UpdateError::Invalid(message) => ApiError::invalid(message),
        convert::UpdateError::Checkpoint(error) => error.into(),
    })
}

/// A run of `command.goto: "__end__"` ("mark as resolved"): the paused turn ends without
/// running what waits, at once, and the run is recorded as done; nothing is queued.
async fn end_thread_turn(
    shared: &AppState,
    tenant: &Tenant,
    thread_id: &str,
    assistant: &Assistant,
    body: Value,
    strategy: String,
) -> ApiResult<RunRecord> {
    let ended = settle_calls(shared, tenant, thread_id, &[]).await?;
    let run = match ended {
        Some((_, run)) => Some(run),
        None => load(shared, tenant, thread_id, None).await?,
    };
    let records = shared.records(tenant);
    let ids = match records.thread(thread_id).await? {
        Some(thread) => message_ids(shared, tenant, &thread, None).await?,
        None => convert::MessageIds::default(),
    };
    let values = run
        .as_ref()
        .map(|run| convert::values_named(run, &convert::interrupt_id(run), &ids));
    let at = rfc3339(now_ms());
    let record = RunRecord {
        run_id: new_id(),
        thread_id: thread_id.to_owned(),
        assistant_id: assistant.id(),
        created_at: at.clone(),
        updated_at: at,
        status: "success".to_owned(),
        metadata: field(&body, "metadata")
            .cloned()
            .unwrap_or_else(|| json!({})),
        multitask_strategy: strategy,
        kwargs: body,
        error: None,
        values,
        worker: None,
        stop_reason: None,
    };
    records.put_run(&record).await?;
    records.set_thread_status(thread_id, "idle").await?;
    Ok(record)
}

async fn run_create(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(thread_id): Path<String>,
    Body0(body): Body0,
) -> ApiResult<Response> {
    let record = create_run(&shared, &tenant, &thread_id, body, false).await?;
    let mut response = Json(run_json(&record)).into_response();
    set_location(&mut response, &record, false);
    Ok(response)
}

async fn stateless_create(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Body0(body): Body0,
) -> ApiResult<Json<Value>> {
    let record = create_run(&shared, &tenant, &new_id(), body, true).await?;
    Ok(Json(run_json(&record)))
}

fn set_location(response: &mut Response, record: &RunRecord, stream: bool) {
    let path = format!("/threads/{}/runs/{}", record.thread_id, record.run_id);
    if let Ok(value) = HeaderValue::from_str(&path) {
        response
            .headers_mut()
            .insert(header::CONTENT_LOCATION, value);
    }
    if stream && let Ok(value) = HeaderValue::from_str(&format!("{path}/stream")) {
        response.headers_mut().insert(header::LOCATION, value);
    }
}

/// Cancels a run when the client of its stream goes away (`on_disconnect: cancel`).
struct CancelOnDrop(Option<(Arc<Runs>, RunRecord)>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some((runs, record)) = self.0.take() {
            tokio::spawn(async move {
                let _ = runs.cancel(&record, "interrupt").await;
            });
        }
    }
}

/// Where a stream's frames come from: the run's log in this process, or the cluster's
/// copy of it when another server runs it (or may).
enum Source {
    Local(Arc<Live>),
    #[cfg(feature = "cluster")]
    Remote(Box<Remote>),
}

/// A run's frames in the cluster's Redis stream.
#[cfg(feature = "cluster")]
struct Remote {
    runs: Arc<Runs>,
    cluster: Arc<crate::cluster::Cluster>,
    records: Records,
    record: RunRecord,
    /// The Redis entry read last.
    after: String,
    /// The end marker was read.
    finished: bool,
}

impl Source {
    /// The source of `record`'s frames.
    fn of(shared: &Shared, tenant: &Tenant, record: &RunRecord) -> Self {
        #[cfg(feature = "cluster")]
        if let Some(cluster) = shared.runs.cluster() {
            return Self::Remote(Box::new(Remote {
                runs: Arc::clone(&shared.runs),
                cluster: Arc::clone(cluster),
                records: shared.records(tenant),
                record: record.clone(),
                after: "0".to_owned(),
                finished: false,
            }));
        }
        let _ = tenant;
        match shared.runs.get(&record.run_id) {
            Some(live) => Self::Local(live),
            // A run this process does not run (it ended long ago): nothing more to stream.
            None => {
                let log = FrameLog::new();
                log.end();
                Self::Local(Live::ended_with(record.clone(), log))
            }
        }
    }

    /// The next frames from index `next` on; `None` once the run ended and all were sent.
    /// An empty list when nothing came for a while (time for a heartbeat).
    async fn next(&mut self, next: usize) -> Option<Vec<(usize, crate::stream::Frame)>> {
        match self {
            Self::Local(live) => loop {
                let (frames, ended) = live.log.since(next);
                if !frames.is_empty() {
                    return Some(frames);
                }
                if ended {
                    return None;
                }
                let waited = tokio::time::timeout(Duration::from_secs(15), live.log.changed(next));
                if waited.await.is_err() {
                    return Some(Vec::new());
                }
            },
            #[cfg(feature = "cluster")]
            Self::Remote(remote) => {
                let Remote {
                    runs,
                    cluster,
                    records,
                    record,
                    after,
                    finished,
                } = &mut **remote;
                // A server shutting down ends its streams; the client reconnects elsewhere.
                if *finished || runs.is_stopping() {
                    return None;
                }
                // Polled: a blocking read would hold the shared connection.
                let mut polls = 0u32;
                let entries = loop {
                    match cluster.read(&record.run_id, after).await {
                        Ok(entries) if !entries.is_empty() => break entries,
                        Ok(_) => {}
                        Err(error) => {
                            tracing::warn!(run_id = %record.run_id, %error, "cannot read the run's frames");
                        }
                    }
                    polls += 1;
                    if runs.is_stopping() {
                        return None;
                    }
                    // Now and then: did the run end without frames (long ago, or before
                    // they were kept)? And a heartbeat every 15 s.
                    if polls.is_multiple_of(20) {
                        let ended = records
                            .run(&record.thread_id, &record.run_id)
                            .await
                            .ok()
                            .flatten()
                            .is_none_or(|now| now.ended());
                        if ended
                            && cluster
                                .read(&record.run_id, after)
                                .await
                                .is_ok_and(|e| e.is_empty())
                        {
                            return None;
                        }
                    }
                    if polls == 300 {
                        return Some(Vec::new());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
                let mut frames = Vec::new();
                for (id, index, frame) in entries {
                    *after = id;
                    match frame {
                        Some(frame) if index >= next => frames.push((index, frame)),
                        Some(_) => {}
                        None if frames.is_empty() => return None,
                        // The frames before the end go out first; the end comes next time.
                        None => {
                            *finished = true;
                            break;
                        }
                    }
                }
                Some(frames)
            }
        }
    }
}

/// A run's frames from `from` on as server-sent events, following it until it ends; only
/// the frames of `modes` when given.
fn sse(
    source: Source,
    from: usize,
    modes: Option<BTreeSet<String>>,
    guard: CancelOnDrop,
) -> Response {
    let stream = futures::stream::unfold(
        (source, from, guard),
        move |(mut source, next, mut guard)| {
            let modes = modes.clone();
            async move {
                let Some(frames) = source.next(next).await else {
                    // The run ended on its own: nothing to cancel.
                    drop(guard.0.take());
                    return None;
                };
                let Some((last, _)) = frames.last() else {
                    // A comment now and then keeps proxies from closing a quiet stream.
                    return Some((
                        Ok::<_, std::convert::Infallible>(Bytes::from_static(b": heartbeat\n\n")),
                        (source, next, guard),
                    ));
                };
                let after = last + 1;
                let mut text = String::new();
                for (id, frame) in &frames {
                    let mode = frame.event.split(['|', '/']).next().unwrap_or_default();
                    let wanted = modes.as_ref().is_none_or(|modes| {
                        matches!(mode, "metadata" | "error")
                            || modes.contains(mode)
                            || (mode == "messages" && modes.contains("messages-tuple"))
                    });
                    if wanted {
                        text.push_str(&format!(
                            "event: {}\ndata: {}\nid: {id}\n\n",
                            frame.event, frame.data
                        ));
                    }
                }
                Some((Ok(Bytes::from(text)), (source, after, guard)))
            }
        },
    );
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

async fn stream_run(
    shared: AppState,
    tenant: Tenant,
    thread_id: String,
    body: Value,
    stateless: bool,
) -> ApiResult<Response> {
    let cancel = field(&body, "on_disconnect").and_then(Value::as_str) == Some("cancel");
    let record = create_run(&shared, &tenant, &thread_id, body, stateless).await?;
    let guard = CancelOnDrop(cancel.then(|| (Arc::clone(&shared.runs), record.clone())));
    let mut response = sse(Source::of(&shared, &tenant, &record), 0, None, guard);
    set_location(&mut response, &record, !stateless);
    Ok(response)
}

async fn run_stream(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(thread_id): Path<String>,
    Body0(body): Body0,
) -> ApiResult<Response> {
    stream_run(shared, tenant, thread_id, body, false).await
}

async fn stateless_stream(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Body0(body): Body0,
) -> ApiResult<Response> {
    stream_run(shared, tenant, new_id(), body, true).await
}

/// Waits until `record`'s run ended and gives its record then.
async fn ended(shared: &Shared, tenant: &Tenant, record: &RunRecord) -> ApiResult<RunRecord> {
    if let Some(live) = shared.runs.get(&record.run_id) {
        live.ended().await;
    }
    // Run elsewhere (another server of the cluster), or settled just now: its record says.
    let records = shared.records(tenant);
    loop {
        match records.run(&record.thread_id, &record.run_id).await? {
            Some(now) if now.ended() => return Ok(now),
            Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            // Rolled back: it left nothing.
            None => {
                return Ok(RunRecord {
                    status: "interrupted".to_owned(),
                    ..record.clone()
                });
            }
        }
    }
}

/// What `wait` and `join` answer: the thread's values once the run ended, or its error.
async fn outcome(shared: &Shared, tenant: &Tenant, record: &RunRecord) -> ApiResult<Value> {
    let record = ended(shared, tenant, record).await?;
    if let Some(error) = record.error {
        return Ok(json!({"__error__": error}));
    }
    if let Some(values) = record.values {
        return Ok(values);
    }
    let thread = shared.records(tenant).thread(&record.thread_id).await?;
    let ids = match &thread {
        Some(thread) => message_ids(shared, tenant, thread, None).await?,
        None => convert::MessageIds::default(),
    };
    Ok(match load(shared, tenant, &record.thread_id, None).await? {
        Some(run) => convert::values_named(&run, &convert::interrupt_id(&run), &ids),
        None => json!({}),
    })
}

async fn wait_run(
    shared: AppState,
    tenant: Tenant,
    thread_id: String,
    body: Value,
    stateless: bool,
) -> ApiResult<Response> {
    let record = create_run(&shared, &tenant, &thread_id, body, stateless).await?;
    let values = outcome(&shared, &tenant, &record).await?;
    let mut response = Json(values).into_response();
    set_location(&mut response, &record, false);
    Ok(response)
}

async fn run_wait(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(thread_id): Path<String>,
    Body0(body): Body0,
) -> ApiResult<Response> {
    wait_run(shared, tenant, thread_id, body, false).await
}

async fn stateless_wait(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Body0(body): Body0,
) -> ApiResult<Response> {
    wait_run(shared, tenant, new_id(), body, true).await
}

#[derive(Deserialize)]
struct ListQuery {
    limit: Option<usize>,
    offset: Option<usize>,
    status: Option<String>,
}

async fn runs_list(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(thread_id): Path<String>,
    Query(query): Query<ListQuery>,
) -> ApiResult<Json<Vec<Value>>> {
    let records = shared.records(&tenant);
    records.existing_thread(&thread_id).await?;
    let runs = records.runs(&thread_id).await?;
    Ok(Json(
        runs.iter()
            .map(|record| {
                shared
                    .runs
                    .get(&record.run_id)
                    .map_or_else(|| record.clone(), |live| live.snapshot())
            })
            .filter(|record| query.status.as_deref().is_none_or(|s| s == record.status))
            .skip(query.offset.unwrap_or(0))
            .take(query.limit.unwrap_or(10))
            .map(|record| run_json(&record))
            .collect(),
    ))
}

/// The run, as this process knows it or as recorded; the record decides the tenant (a run
/// of another tenant's thread is not found).
async fn find_run(
    shared: &Shared,
    tenant: &Tenant,
    thread_id: &str,
    run_id: &str,
) -> ApiResult<RunRecord> {
    let record = shared
        .records(tenant)
        .run(thread_id, run_id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("run `{run_id}` of thread `{thread_id}`")))?;
    Ok(match shared.runs.get(run_id) {
        Some(live) if live.snapshot().thread_id == thread_id => live.snapshot(),
        _ => record,
    })
}

async fn run_get(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path((thread_id, run_id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let record = find_run(&shared, &tenant, &thread_id, &run_id).await?;
    Ok(Json(run_json(&record)))
}

async fn run_delete(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path((thread_id, run_id)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    let record = find_run(&shared, &tenant, &thread_id, &run_id).await?;
    if matches!(record.status.as_str(), "pending" | "running") {
        return Err(ApiError::conflict(
            "the run is still going; cancel it first",
        ));
    }
    shared
        .records(&tenant)
        .delete_run(&thread_id, &run_id)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn run_join(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path((thread_id, run_id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let record = find_run(&shared, &tenant, &thread_id, &run_id).await?;
    Ok(Json(outcome(&shared, &tenant, &record).await?))
}

async fn run_join_stream(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path((thread_id, run_id)): Path<(String, String)>,
    Query(query): Query<Vec<(String, String)>>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let record = find_run(&shared, &tenant, &thread_id, &run_id).await?;
    let from = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(0, |last| last + 1);
    // `stream_mode` may repeat (one per mode) or list modes with commas.
    let modes: BTreeSet<String> = query
        .iter()
        .filter(|(key, _)| key == "stream_mode")
        .flat_map(|(_, value)| value.split(','))
        .filter(|mode| !mode.is_empty())
        .map(str::to_owned)
        .collect();
    let modes = (!modes.is_empty()).then_some(modes);
    let cancel = query
        .iter()
        .any(|(key, value)| key == "cancel_on_disconnect" && value.eq_ignore_ascii_case("true"));
    let guard = CancelOnDrop(cancel.then(|| (Arc::clone(&shared.runs), record.clone())));
    let mut response = sse(Source::of(&shared, &tenant, &record), from, modes, guard);
    set_location(&mut response, &record, true);
    Ok(response)
}

#[derive(Deserialize)]
struct CancelQuery {
    wait: Option<String>,
    action: Option<String>,
}

async fn run_cancel(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path((thread_id, run_id)): Path<(String, String)>,
    Query(query): Query<CancelQuery>,
) -> ApiResult<StatusCode> {
    let record = find_run(&shared, &tenant, &thread_id, &run_id).await?;
    let action = query.action.as_deref().unwrap_or("interrupt");
    if !matches!(action, "interrupt" | "rollback") {
        return Err(ApiError::invalid(format!(
            "unknown cancel action `{action}`; use interrupt or rollback"
        )));
    }
    let wait = matches!(query.wait.as_deref(), Some("1" | "true" | "True"));
    let reached = shared.runs.cancel(&record, action).await?;
    if !reached && !record.ended() {
        // Recorded as going but run by no one (a server that stopped): settle it.
        let mut record = record;
        record.status = "interrupted".to_owned();
        record.updated_at = rfc3339(now_ms());
        shared.records(&tenant).put_run(&record).await?;
    } else if wait {
        ended(&shared, &tenant, &record).await?;
    }
    Ok(if wait {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::ACCEPTED
    })
}

// ---- store ----

fn store_ns(tenant: &Tenant, namespace: &[String]) -> Vec<String> {
    let mut full = vec!["store".to_owned(), tenant.0.clone()];
    full.extend(namespace.iter().cloned());
    full
}

fn namespace_of(body: &Value, key: &str) -> ApiResult<Vec<String>> {
    match field(body, key) {
        Some(Value::Array(labels)) => labels
            .iter()
            .map(|label| {
                label
                    .as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| ApiError::invalid(format!("`{key}` must be a list of strings")))
            })
            .collect(),
        None => Ok(Vec::new()),
        Some(_) => Err(ApiError::invalid(format!(
            "`{key}` must be a list of strings"
        ))),
    }
}

fn item_json(item: &deepagents::backends::store::StoreItem) -> Value {
    json!({
        "namespace": item.namespace.iter().skip(2).collect::<Vec<_>>(),
        "key": item.key,
        "value": item.value,
        "created_at": rfc3339(item.created_at_ms),
        "updated_at": rfc3339(item.updated_at_ms),
    })
}

async fn store_put(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Body0(body): Body0,
) -> ApiResult<StatusCode> {
    let namespace = namespace_of(&body, "namespace")?;
    if namespace.is_empty() {
        return Err(ApiError::invalid("`namespace` needs at least one label"));
    }
    // Reads name a namespace as its labels joined by dots (`GET /store/items?namespace=a.b`),
    // so an item under a label with a dot could be written but never read back.
    if let Some(label) = namespace
        .iter()
        .find(|label| label.is_empty() || label.contains('.'))
    {
        return Err(ApiError::invalid(format!(
            "namespace label `{label}` cannot be empty or hold a dot (reads join labels with dots); use another separator"
        )));
    }
    let key = field(&body, "key")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("`key` is missing"))?;
    let value = field(&body, "value")
        .cloned()
        .ok_or_else(|| ApiError::invalid("`value` is missing"))?;
    shared
        .store
        .put(&store_ns(&tenant, &namespace), key, value)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize)]
struct ItemQuery {
    namespace: Option<String>,
    key: String,
}

async fn store_get(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Query(query): Query<ItemQuery>,
) -> ApiResult<Json<Value>> {
    let namespace: Vec<String> = query
        .namespace
        .as_deref()
        .unwrap_or_default()
        .split('.')
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    let item = shared
        .store
        .get(&store_ns(&tenant, &namespace), &query.key)
        .await?;
    item.map(|item| Json(item_json(&item))).ok_or_else(|| {
        ApiError::not_found(format!("item `{}` in namespace {namespace:?}", query.key))
    })
}

async fn store_delete(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Body0(body): Body0,
) -> ApiResult<StatusCode> {
    let namespace = namespace_of(&body, "namespace")?;
    let key = field(&body, "key")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid("`key` is missing"))?;
    shared
        .store
        .delete(&store_ns(&tenant, &namespace), key)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Every item under `prefix` of the tenant's store.
async fn items_under(
    shared: &Shared,
    tenant: &Tenant,
    prefix: &[String],
) -> ApiResult<Vec<deepagents::backends::store::StoreItem>> {
    crate::records::all_under(&*shared.store, &store_ns(tenant, prefix)).await
}

async fn store_search(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Body0(body): Body0,
) -> ApiResult<Json<Value>> {
    let prefix = namespace_of(&body, "namespace_prefix")?;
    let (limit, offset) = (count(&body, "limit", 10)?, count(&body, "offset", 0)?);
    // No embeddings: a query matches items whose value contains it as text.
    let query = field(&body, "query")
        .and_then(Value::as_str)
        .map(str::to_lowercase);
    let items: Vec<Value> = items_under(&shared, &tenant, &prefix)
        .await?
        .iter()
        .filter(|item| matches(&item.value, field(&body, "filter")))
        .filter(|item| {
            query
                .as_ref()
                .is_none_or(|q| item.value.to_string().to_lowercase().contains(q))
        })
        .skip(offset)
        .take(limit)
        .map(item_json)
        .collect();
    Ok(Json(json!({"items": items})))
}

async fn store_namespaces(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Body0(body): Body0,
) -> ApiResult<Json<Value>> {
    let prefix = namespace_of(&body, "prefix")?;
    let suffix = namespace_of(&body, "suffix")?;
    let max_depth = field(&body, "max_depth")
        .and_then(Value::as_u64)
        .map(|d| d as usize);
    let (limit, offset) = (count(&body, "limit", 100)?, count(&body, "offset", 0)?);
    let namespaces: BTreeSet<Vec<String>> = items_under(&shared, &tenant, &prefix)
        .await?
        .into_iter()
        .map(|item| item.namespace.into_iter().skip(2).collect::<Vec<_>>())
        .filter(|ns| ns.ends_with(&suffix))
        .map(|mut ns| {
            if let Some(depth) = max_depth {
                ns.truncate(depth);
            }
            ns
        })
        .collect();
    let page: Vec<Vec<String>> = namespaces.into_iter().skip(offset).take(limit).collect();
    Ok(Json(json!({"namespaces": page})))
}
