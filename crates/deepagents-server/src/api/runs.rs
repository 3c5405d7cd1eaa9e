//! Runs: created (and started or queued), streamed, waited for, joined, cancelled, listed.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use deepagents::core::Checkpointer;
use serde::Deserialize;
use serde_json::{Value, json};

use super::request::{CheckpointRef, Count, TypedQuery, api_enum, checked, count_or, parse};
use super::sse::{CancelOnDrop, Source, sse};
use super::threads::{ThreadCreate, create_thread, load, message_ids, update_state};
use super::{AppState, Body0, Shared, Tenant, new_id};
use crate::Assistant;
use crate::error::{ApiError, ApiResult};
use crate::records::{Records, RunRecord, ThreadRecord};
use crate::runs::{Job, storage_id};
use crate::time::{now_ms, rfc3339};
use deepagents_langgraph::MODES;
use deepagents_langgraph::convert;

pub(super) fn run_json(record: &RunRecord) -> Value {
    let mut value = serde_json::to_value(record).unwrap_or_else(|error| {
        tracing::warn!(run_id = %record.run_id, %error, "cannot show a run's record");
        Value::Null
    });
    if let Value::Object(map) = &mut value {
        map.remove("kwargs");
        map.insert("kwargs".to_owned(), record.kwargs.clone());
    }
    value
}

/// `stream_mode`: one mode or a list of them.
#[derive(Clone)]
pub(super) struct StreamModes(pub(super) Vec<String>);

impl<'de> Deserialize<'de> for StreamModes {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        checked(deserializer, |value| match value {
            Value::String(mode) => Ok(Self(vec![mode])),
            Value::Array(modes) if modes.iter().all(Value::is_string) => Ok(Self(
                modes
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect(),
            )),
            other => Err(format!(
                "must be a string or a list of strings, not {other}"
            )),
        })
    }
}

/// The stream modes of a payload (default `values`), checked.
pub(super) fn stream_modes(modes: Option<&StreamModes>) -> ApiResult<BTreeSet<String>> {
    let modes = modes.map_or_else(|| vec!["values".to_owned()], |modes| modes.0.clone());
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

api_enum! {
    /// What a run does when another run of its thread is going.
    MultitaskStrategy { Reject = "reject", Enqueue = "enqueue", Interrupt = "interrupt", Rollback = "rollback" }
}

api_enum! {
    /// What a run does when its thread does not exist.
    IfNotExists { Reject = "reject", Create = "create" }
}

api_enum! {
    /// What becomes of a stateless run's thread when it ends.
    OnCompletion { Delete = "delete", Keep = "keep" }
}

api_enum! {
    /// What becomes of a streamed run when its client goes away.
    OnDisconnect { Continue = "continue", Cancel = "cancel" }
}

api_enum! {
    /// How a cancelled run ends: stopped where it is, or undone.
    CancelAction { Interrupt = "interrupt", Rollback = "rollback" }
}

api_enum! {
    /// A run's status, as runs are listed by.
    RunStatus {
        Pending = "pending",
        Running = "running",
        Error = "error",
        Success = "success",
        Timeout = "timeout",
        Interrupted = "interrupted",
    }
}

/// `command.goto`: only `"__end__"` (end the turn without running what waits).
#[derive(Clone, Copy)]
pub(super) struct GotoEnd;

impl<'de> Deserialize<'de> for GotoEnd {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        checked(deserializer, |value| {
            match value {
            Value::String(node) if node == "__end__" => Ok(Self),
            _ => Err("command.goto may only be \"__end__\" (end the turn without running what waits): the agent has one loop; send resume or input to go on".to_owned()),
        }
        })
    }
}

/// A run's `command`: a resume, a state update, or the end of the turn.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct RunCommand {
    resume: Option<Value>,
    update: Option<Value>,
    goto: Option<GotoEnd>,
}

/// A run's `context`: the values its tools read, an object.
#[derive(Clone)]
pub(super) struct Context(Value);

impl<'de> Deserialize<'de> for Context {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        checked(deserializer, |value| match value {
            context @ Value::Object(_) => Ok(Self(context)),
            other => Err(format!(
                "must be an object of the values the run's tools read, not {other}"
            )),
        })
    }
}

/// The payload of a run (`POST /threads/{id}/runs`, `/runs/stream`, `/runs/wait`, the
/// stateless ones).
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct RunCreate {
    assistant_id: Option<String>,
    input: Option<Value>,
    command: Option<RunCommand>,
    metadata: Option<Value>,
    context: Option<Context>,
    stream_mode: Option<StreamModes>,
    stream_subgraphs: bool,
    multitask_strategy: Option<MultitaskStrategy>,
    if_not_exists: Option<IfNotExists>,
    on_completion: Option<OnCompletion>,
    pub(super) on_disconnect: Option<OnDisconnect>,
    checkpoint: Option<CheckpointRef>,
    checkpoint_id: Option<CheckpointRef>,
    interrupt_before: Option<Value>,
    interrupt_after: Option<Value>,
    webhook: Option<Value>,
    after_seconds: Option<Value>,
}

/// Run fields this server does not act on. Each is refused by name when it asks for
/// something (a non-empty value), never silently ignored: a client relying on it would
/// otherwise get a run that behaves differently from what it asked for.
pub(super) const UNHONOURED: [(&str, &str); 3] = [
    (
        "interrupt_before",
        "pauses come from the assistant's approval rules",
    ),
    (
        "interrupt_after",
        "pauses come from the assistant's approval rules",
    ),
    ("after_seconds", "start the run when it is due"),
];

pub(super) fn refuse_unhonoured(request: &RunCreate) -> ApiResult<()> {
    let given = [
        &request.interrupt_before,
        &request.interrupt_after,
        &request.after_seconds,
    ];
    for ((name, instead), value) in UNHONOURED.into_iter().zip(given) {
        let asks = match value {
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
    mut thread: ThreadRecord,
    assistant: &Assistant,
) -> ApiResult<()> {
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
pub(super) async fn create_run(
    shared: &AppState,
    tenant: &Tenant,
    thread_id: &str,
    body: Value,
    stateless: bool,
) -> ApiResult<RunRecord> {
    let records = shared.records(tenant);
    let request: RunCreate = parse(&body)?;
    let assistant_id = request
        .assistant_id
        .as_deref()
        .ok_or_else(|| ApiError::invalid("`assistant_id` is missing"))?;
    let assistant = shared.assistant(assistant_id)?;
    // Refused before anything is made: a refused run leaves no thread behind.
    refuse_unhonoured(&request)?;
    // A webhook the server may not call is refused before the run exists.
    match shared.runs.webhooks() {
        Some(webhooks) => webhooks
            .check_field(request.webhook.as_ref())
            .map_err(ApiError::invalid)?,
        None if request.webhook.as_ref().is_some_and(|url| !url.is_null()) => {
            return Err(ApiError::invalid(
                "`webhook` is not supported by this server",
            ));
        }
        None => {}
    }
    let thread = match records.thread(thread_id).await? {
        Some(thread) => thread,
        None if stateless || request.if_not_exists == Some(IfNotExists::Create) => {
            let thread = ThreadCreate {
                thread_id: Some(thread_id.to_owned()),
                ..ThreadCreate::default()
            };
            create_thread(shared, tenant, &thread).await?
        }
        None => {
            return Err(ApiError::not_found(format!(
                "thread `{thread_id}` (send if_not_exists: create to make it)"
            )));
        }
    };
    let context = match &request.context {
        Some(Context(Value::Object(map))) if map.is_empty() => None,
        other => other.as_ref().map(|context| context.0.clone()),
    };
    if !stateless {
        record_assistant(&records, thread, &assistant).await?;
    }
    let (answers, input) = convert::input_messages(request.input.as_ref().unwrap_or(&Value::Null))
        .map_err(ApiError::invalid)?;
    let command = request.command.unwrap_or_default();
    let resume = command.resume;
    let end_turn = command.goto.is_some();
    let modes = stream_modes(request.stream_mode.as_ref())?;
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
    let fork_point = request
        .checkpoint
        .and_then(|checkpoint| checkpoint.0)
        .or_else(|| request.checkpoint_id.and_then(|checkpoint| checkpoint.0));
    if let Some(at) = fork_point {
        fork(shared, tenant, thread_id, at).await?;
    }
    if let Some(update) = &command.update {
        update_state(shared, &storage_id(&tenant.0, thread_id), update).await?;
    }
    let strategy = request.multitask_strategy.unwrap_or_default();
    let metadata = request.metadata.unwrap_or_else(|| json!({}));
    if end_turn {
        return end_thread_turn(
            shared, tenant, thread_id, &assistant, body, metadata, strategy,
        )
        .await;
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
        metadata,
        multitask_strategy: strategy.as_str().to_owned(),
        kwargs: body.clone(),
        error: None,
        values: None,
        worker: None,
        stop_reason: None,
    };
    let keep = request.on_completion == Some(OnCompletion::Keep);
    let job = Job {
        tenant: tenant.0.clone(),
        graph_id: assistant.graph_id.clone(),
        record: record.clone(),
        input,
        resume,
        modes,
        subgraphs: request.stream_subgraphs,
        delete_thread_after: stateless && !keep,
        context,
    };
    shared.runs.submit(job, strategy.as_str()).await?;
    Ok(record)
}

/// Starts the thread again from checkpoint `at` (edit, regenerate): its state becomes that
/// checkpoint's, recorded as a branch from it, before the run adds its input. Naming the
/// latest checkpoint (as UIs do on every submit) changes nothing.
pub(super) async fn fork(
    shared: &Shared,
    tenant: &Tenant,
    thread_id: &str,
    at: u64,
) -> ApiResult<()> {
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
pub(super) async fn settle_calls(
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
pub(super) async fn end_thread_turn(
    shared: &AppState,
    tenant: &Tenant,
    thread_id: &str,
    assistant: &Assistant,
    body: Value,
    metadata: Value,
    strategy: MultitaskStrategy,
) -> ApiResult<RunRecord> {
    let ended = settle_calls(shared, tenant, thread_id, &[]).await?;
    let run = match ended {
        Some((_, run)) => Some(run),
        None => load(shared, tenant, thread_id, None).await?,
    };
    let records = shared.records(tenant);
    let ids = match records.thread(thread_id).await? {
        Some(thread) => message_ids(shared, tenant, &thread).await?,
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
        metadata,
        multitask_strategy: strategy.as_str().to_owned(),
        kwargs: body,
        error: None,
        values,
        worker: None,
        stop_reason: None,
    };
    records.put_run(&record).await?;
    records.set_thread_status(thread_id, "idle").await?;
    if let Some(webhooks) = shared.runs.webhooks() {
        webhooks.deliver(&record, None);
    }
    Ok(record)
}

pub(super) async fn run_create(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(thread_id): Path<String>,
    Body0(body): Body0,
) -> ApiResult<Response> {
    let record = create_run(&shared, &tenant, &thread_id, body, false).await?;
    let mut response = Json(run_json(&record)).into_response();
    set_location(&mut response, &record, Rejoin::No);
    Ok(response)
}

pub(super) async fn stateless_create(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Body0(body): Body0,
) -> ApiResult<Json<Value>> {
    let record = create_run(&shared, &tenant, &new_id(), body, true).await?;
    Ok(Json(run_json(&record)))
}

pub(super) fn set_location(response: &mut Response, record: &RunRecord, rejoin: Rejoin) {
    let path = format!("/threads/{}/runs/{}", record.thread_id, record.run_id);
    if let Ok(value) = HeaderValue::from_str(&path) {
        response
            .headers_mut()
            .insert(header::CONTENT_LOCATION, value);
    }
    let again = match rejoin {
        Rejoin::No => return,
        Rejoin::Stream => format!("{path}/stream"),
        Rejoin::Join => format!("{path}/join"),
    };
    if let Ok(value) = HeaderValue::from_str(&again) {
        response.headers_mut().insert(header::LOCATION, value);
    }
}

/// Where a client reconnects to a response cut short (`Location`): the run's stream, its
/// join, or nowhere (a stateless run's thread is gone once it ends).
#[derive(Clone, Copy)]
pub(super) enum Rejoin {
    No,
    Stream,
    Join,
}

pub(super) async fn stream_run(
    shared: AppState,
    tenant: Tenant,
    thread_id: String,
    body: Value,
    stateless: bool,
) -> ApiResult<Response> {
    let request: RunCreate = parse(&body)?;
    let cancel = request.on_disconnect == Some(OnDisconnect::Cancel);
    let record = create_run(&shared, &tenant, &thread_id, body, stateless).await?;
    let guard = CancelOnDrop(cancel.then(|| (Arc::clone(&shared.runs), record.clone())));
    let mut response = sse(Source::of(&shared, &tenant, &record), 0, None, guard);
    let rejoin = if stateless {
        Rejoin::No
    } else {
        Rejoin::Stream
    };
    set_location(&mut response, &record, rejoin);
    Ok(response)
}

pub(super) async fn run_stream(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(thread_id): Path<String>,
    Body0(body): Body0,
) -> ApiResult<Response> {
    stream_run(shared, tenant, thread_id, body, false).await
}

pub(super) async fn stateless_stream(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Body0(body): Body0,
) -> ApiResult<Response> {
    stream_run(shared, tenant, new_id(), body, true).await
}

/// Waits until `record`'s run ended and gives its record then.
pub(super) async fn ended(
    shared: &Shared,
    tenant: &Tenant,
    record: &RunRecord,
) -> ApiResult<RunRecord> {
    if let Some(live) = shared.runs.get(&record.run_id) {
        live.ended().await;
    }
    // Run elsewhere (another server of the cluster), or settled just now: its record says,
    // read again when the run's end is notified (or at the cluster's safety poll).
    #[cfg(feature = "cluster")]
    let mut events = shared
        .runs
        .cluster()
        .map(|cluster| (Arc::clone(cluster), cluster.events()));
    let records = shared.records(tenant);
    loop {
        match records.run(&record.thread_id, &record.run_id).await? {
            Some(now) if now.ended() => return Ok(now),
            Some(_) => {
                #[cfg(feature = "cluster")]
                if let Some((cluster, events)) = &mut events {
                    let ended = crate::cluster::Event::Ended(record.run_id.clone());
                    cluster.woken(events, |event| *event == ended).await;
                    continue;
                }
                tokio::time::sleep(Duration::from_millis(100)).await
            }
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
/// A `wait` (`own`: the request made the run) is answered with the values the run ended
/// with, when this server ran it, without reading the thread back; a `join`, maybe long
/// after, reads the thread as it is now.
pub(super) async fn outcome(
    shared: &Shared,
    tenant: &Tenant,
    record: &RunRecord,
    own: bool,
) -> ApiResult<Value> {
    if own && let Some(live) = shared.runs.get(&record.run_id) {
        live.ended().await;
        if let Some(outcome) = live.outcome() {
            return Ok(outcome);
        }
    }
    let record = ended(shared, tenant, record).await?;
    if let Some(error) = record.error {
        return Ok(json!({"__error__": error}));
    }
    if let Some(values) = record.values {
        return Ok(values);
    }
    let thread = shared.records(tenant).thread(&record.thread_id).await?;
    let ids = match &thread {
        Some(thread) => message_ids(shared, tenant, thread).await?,
        None => convert::MessageIds::default(),
    };
    Ok(match load(shared, tenant, &record.thread_id, None).await? {
        Some(run) => convert::values_named(&run, &convert::interrupt_id(&run), &ids),
        None => json!({}),
    })
}

pub(super) async fn wait_run(
    shared: AppState,
    tenant: Tenant,
    thread_id: String,
    body: Value,
    stateless: bool,
) -> ApiResult<Response> {
    let record = create_run(&shared, &tenant, &thread_id, body, stateless).await?;
    let rejoin = if stateless { Rejoin::No } else { Rejoin::Join };
    Ok(waiting(shared, tenant, record, rejoin, true))
}

/// A response that answers with the run's [`outcome`] once it ends (`own`: to the request
/// that made the run). Its headers go out at
/// once, with where to rejoin the run in `Location` (`rejoin`); until the outcome, a
/// newline now and then (JSON allows leading whitespace) keeps proxies from closing it. A
/// server of a cluster stopping meanwhile cuts the body, so the SDK reconnects to
/// `Location` (another server) instead of failing; errors met after the headers are given
/// as the body `{"__error__": …}`, as a failed run's are.
fn waiting(
    shared: AppState,
    tenant: Tenant,
    record: RunRecord,
    rejoin: Rejoin,
    own: bool,
) -> Response {
    /// How often a waiting response sends a newline.
    const KEEPALIVE: Duration = Duration::from_secs(10);
    /// How often it looks whether the server is stopping.
    const POLL: Duration = Duration::from_millis(200);
    let runs = Arc::clone(&shared.runs);
    let pending = {
        let record = record.clone();
        Box::pin(async move { outcome(&shared, &tenant, &record, own).await })
    };
    let body = futures::stream::unfold(Some(pending), move |state| {
        let runs = Arc::clone(&runs);
        async move {
            let mut pending = state?;
            let mut quiet = Duration::ZERO;
            loop {
                tokio::select! {
                    result = &mut pending => {
                        let value = result.unwrap_or_else(|error| {
                            tracing::warn!(status = %error.status, detail = %error.detail, "a waited run's outcome cannot be read");
                            json!({"__error__": {"error": "outcome", "message": error.detail}})
                        });
                        return Some((Ok(axum::body::Bytes::from(value.to_string())), None));
                    }
                    () = tokio::time::sleep(POLL) => {
                        if runs.hands_runs_back() {
                            return Some((Err(super::sse::Reconnect), None));
                        }
                        quiet += POLL;
                        if quiet >= KEEPALIVE {
                            return Some((Ok(axum::body::Bytes::from_static(b"\n")), Some(pending)));
                        }
                    }
                }
            }
        }
    });
    let mut response = Response::new(axum::body::Body::from_stream(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    set_location(&mut response, &record, rejoin);
    response
}

pub(super) async fn run_wait(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(thread_id): Path<String>,
    Body0(body): Body0,
) -> ApiResult<Response> {
    wait_run(shared, tenant, thread_id, body, false).await
}

pub(super) async fn stateless_wait(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Body0(body): Body0,
) -> ApiResult<Response> {
    wait_run(shared, tenant, new_id(), body, true).await
}

/// The query of `GET /threads/{id}/runs`.
#[derive(Deserialize)]
pub(super) struct ListQuery {
    limit: Option<Count>,
    offset: Option<Count>,
    status: Option<RunStatus>,
}

pub(super) async fn runs_list(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(thread_id): Path<String>,
    TypedQuery(query): TypedQuery<ListQuery>,
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
            .filter(|record| {
                query
                    .status
                    .is_none_or(|status| status.as_str() == record.status)
            })
            .skip(count_or(query.offset, 0))
            .take(count_or(query.limit, 10))
            .map(|record| run_json(&record))
            .collect(),
    ))
}

/// The run, as this process knows it or as recorded; the record decides the tenant (a run
/// of another tenant's thread is not found).
pub(super) async fn find_run(
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

pub(super) async fn run_get(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path((thread_id, run_id)): Path<(String, String)>,
) -> ApiResult<Json<Value>> {
    let record = find_run(&shared, &tenant, &thread_id, &run_id).await?;
    Ok(Json(run_json(&record)))
}

pub(super) async fn run_delete(
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

pub(super) async fn run_join(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path((thread_id, run_id)): Path<(String, String)>,
) -> ApiResult<Response> {
    let record = find_run(&shared, &tenant, &thread_id, &run_id).await?;
    Ok(waiting(shared, tenant, record, Rejoin::Join, false))
}

pub(super) async fn run_join_stream(
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
        .map_or(0, |last| last.saturating_add(1));
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
    set_location(&mut response, &record, Rejoin::Stream);
    Ok(response)
}

/// The query of `POST /threads/{id}/runs/{run_id}/cancel`.
#[derive(Deserialize)]
pub(super) struct CancelQuery {
    wait: Option<String>,
    action: Option<CancelAction>,
}

pub(super) async fn run_cancel(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path((thread_id, run_id)): Path<(String, String)>,
    TypedQuery(query): TypedQuery<CancelQuery>,
) -> ApiResult<StatusCode> {
    let record = find_run(&shared, &tenant, &thread_id, &run_id).await?;
    let action = query.action.unwrap_or_default();
    let wait = matches!(query.wait.as_deref(), Some("1" | "true" | "True"));
    let reached = shared.runs.cancel(&record, action.as_str()).await?;
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
