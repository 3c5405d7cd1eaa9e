//! The routes of the thread-centric streaming protocol (LangGraph's "v2" event streaming),
//! which `@langchain/react` 1.1's `useStream` and the JS SDK's `client.threads.stream(…)`
//! speak: `POST /threads/{id}/commands` takes one command and answers it, `POST
//! /threads/{id}/stream/events` streams the thread's protocol events ([`crate::protocol`]),
//! filtered as its body asks. Runs started here are the same runs as the v1 routes' (one
//! queue per thread, the same records and checkpoints).

use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::request::{Count, Namespace, checked, parse};
use super::runs::MultitaskStrategy;
use super::{AppState, Tenant};
use crate::error::{ApiError, ApiResult};
use crate::lock;
use crate::protocol::{CHANNELS, Filter};
use crate::runs::storage_id;
use serde::Deserialize;

/// How long `input.respond` waits for the run that paused to let go of its thread (it
/// announces the interrupt a moment before it has saved its status and ended).
const SETTLE: Duration = Duration::from_secs(10);

/// A command refused: the protocol's error code and what to do about it.
struct Refused(&'static str, String);

impl Refused {
    fn invalid(message: impl Into<String>) -> Self {
        Self("invalid_argument", message.into())
    }

    /// An API error as the protocol names it; `conflict` is the code of a 409 for this
    /// command (a stale interrupt for a resume, a busy thread otherwise).
    fn from_api(error: ApiError, conflict: &'static str) -> Self {
        let code = match error.status {
            StatusCode::NOT_FOUND if error.detail.contains("checkpoint") => "no_such_checkpoint",
            StatusCode::CONFLICT => conflict,
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => "permission_denied",
            status if status.is_server_error() => "unknown_error",
            _ => "invalid_argument",
        };
        Self(code, error.detail)
    }
}

/// The protocol's error response.
fn error_response(id: Option<&Value>, code: &str, message: &str) -> Value {
    json!({"type": "error", "id": id.filter(|id| id.is_u64()), "error": code, "message": message})
}

/// `POST /threads/{thread_id}/commands`: one command (`{id, method, params}`), answered with
/// the protocol's success or error response. Only a body that is not a command is an HTTP
/// error (400); a command that fails is a 200 carrying the error, as the reference server
/// answers, so clients read its code.
pub(super) async fn command(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(thread_id): Path<String>,
    body: Bytes,
) -> Response {
    let command: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    match answer(&shared, &tenant, &thread_id, &command, Transport::Http).await {
        Ok(answer) => Json(answer).into_response(),
        Err(answer) => (StatusCode::BAD_REQUEST, Json(answer)).into_response(),
    }
}

/// How a command came, for the subscription commands only a socket can take.
#[derive(Clone, Copy, PartialEq)]
enum Transport {
    Http,
    Socket,
}

/// The answer to one protocol command (`{id, method, params}`); `Err` when it is not a
/// command at all. Subscriptions are answered by the socket that holds them.
async fn answer(
    shared: &AppState,
    tenant: &Tenant,
    thread_id: &str,
    command: &Value,
    transport: Transport,
) -> Result<Value, Value> {
    let (Some(id), Some(method)) = (
        command.get("id").and_then(Value::as_u64),
        command.get("method").and_then(Value::as_str),
    ) else {
        return Err(error_response(
            command.get("id"),
            "invalid_argument",
            "a protocol command is a JSON object with an integer `id`, a string `method` and `params`",
        ));
    };
    let params = match command.get("params") {
        None | Some(Value::Null) => json!({}),
        Some(params @ Value::Object(_)) => params.clone(),
        Some(_) => {
            return Ok(error_response(
                Some(&json!(id)),
                "invalid_argument",
                "`params` must be an object",
            ));
        }
    };
    let storage = storage_id(&tenant.0, thread_id);
    // What the client has seen when its command applies: events numbered after this come
    // from what the command started.
    let applied = shared.runs.protocol.last_seq(&storage).await;
    let outcome = match method {
        "run.start" => run_start(shared, tenant, thread_id, &params).await,
        "input.respond" => input_respond(shared, tenant, thread_id, &params).await,
        "agent.getTree" => Ok(json!({"tree": shared.runs.protocol.tree(&storage).await})),
        "state.get" => state_get(shared, tenant, thread_id, &params).await,
        "state.listCheckpoints" => list_checkpoints(shared, tenant, thread_id, &params).await,
        "state.fork" => state_fork(shared, tenant, thread_id, &params).await,
        "subscription.subscribe" | "subscription.unsubscribe" | "subscription.reconnect"
            if transport == Transport::Http =>
        {
            Err(Refused(
                "not_supported",
                format!(
                    "over HTTP a subscription is a connection: open POST /threads/{thread_id}/stream/events with the channels, namespaces and depth (and `since` to resume); closing it unsubscribes"
                ),
            ))
        }
        "subscription.reconnect" => Err(Refused(
            "not_supported",
            "send subscription.subscribe again on the new socket: its buffered events are replayed".to_owned(),
        )),
        "input.inject" => Err(Refused(
            "not_supported",
            "messages cannot be injected into a running run here; send run.start with the message, which waits for the running one (multitask_strategy enqueue)".to_owned(),
        )),
        other => Err(Refused(
            "unknown_command",
            format!(
                "unknown protocol command `{other}`; this server knows run.start, input.respond, agent.getTree, state.get, state.listCheckpoints, state.fork, and over a WebSocket subscription.subscribe and subscription.unsubscribe"
            ),
        )),
    };
    Ok(match outcome {
        Ok(result) => success(id, result, applied),
        Err(Refused(code, message)) => error_response(Some(&json!(id)), code, &message),
    })
}

/// The protocol's success response.
fn success(id: u64, result: Value, applied: u64) -> Value {
    json!({
        "type": "success",
        "id": id,
        "result": result,
        "meta": {"applied_through_seq": applied},
    })
}

/// `GET /threads/{thread_id}/stream/events` upgraded to a WebSocket: the protocol over one
/// socket, as the JS SDK's `websocket` transport speaks it. Commands come in as text
/// messages and are answered on it; `subscription.subscribe` (a filter, as the body of
/// the SSE stream) sends the thread's buffered events that match it, then the live ones, until
/// `subscription.unsubscribe`. A client given the same event by two subscriptions keeps one
/// (by `event_id`). The server stopping closes the socket with 1012 (restart), so clients
/// reconnect and subscribe again.
pub(super) async fn socket(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(thread_id): Path<String>,
    upgrade: axum::extract::ws::WebSocketUpgrade,
) -> Response {
    upgrade.on_upgrade(move |socket| serve_socket(shared, tenant, thread_id, socket))
}

async fn serve_socket(
    shared: AppState,
    tenant: Tenant,
    thread_id: String,
    socket: axum::extract::ws::WebSocket,
) {
    use axum::extract::ws::{CloseFrame, Message};
    use futures::{SinkExt as _, StreamExt as _};
    let (mut sink, mut incoming) = socket.split();
    let (outgoing, mut to_send) = tokio::sync::mpsc::channel::<Message>(256);
    let writer = tokio::spawn(async move {
        while let Some(message) = to_send.recv().await {
            if sink.send(message).await.is_err() {
                return;
            }
        }
    });
    let storage = storage_id(&tenant.0, &thread_id);
    let mut closing = shared.runs.protocol.closing();
    // One forwarder sends the socket's events in the order of the tape, each once if any
    // subscription wants it: forwarders of their own would interleave the subscriptions'
    // events out of order, and the SDK takes an end seen before the values it follows as
    // the end of what it follows.
    let subscriptions: Subscriptions = Arc::default();
    let sent_through = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut forwarder: Option<tokio::task::JoinHandle<()>> = None;
    let mut next_subscription = 0u64;
    loop {
        let message = tokio::select! {
            message = incoming.next() => message,
            _ = closing.changed() => {
                let _ = outgoing
                    .send(Message::Close(Some(CloseFrame {
                        code: 1012,
                        reason: "the server is stopping; reconnect".into(),
                    })))
                    .await;
                break;
            }
        };
        let text = match message {
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
            Some(Ok(_)) => continue,
        };
        let command: Value = serde_json::from_str(text.as_str()).unwrap_or(Value::Null);
        let id = command.get("id").and_then(Value::as_u64);
        let method = command.get("method").and_then(Value::as_str);
        let params = command.get("params").cloned().unwrap_or_else(|| json!({}));
        let reply = match (id, method) {
            (Some(id), Some("subscription.subscribe")) => match read_filter(&params) {
                Ok((filter, since)) => {
                    next_subscription += 1;
                    let name = format!("sub-{next_subscription}");
                    let applied = shared.runs.protocol.last_seq(&storage).await;
                    lock(&subscriptions).insert(name.clone(), (filter, since));
                    // Started again from where the new subscription's replay begins; what
                    // was sent already comes again, and the client keeps one of each.
                    if let Some(task) = forwarder.take() {
                        task.abort();
                    }
                    let from = since.min(sent_through.load(std::sync::atomic::Ordering::Acquire));
                    forwarder = Some(tokio::spawn(forward(
                        shared.runs.protocol.follower(&storage),
                        Arc::clone(&subscriptions),
                        from,
                        outgoing.clone(),
                        Arc::clone(&sent_through),
                    )));
                    success(id, json!({"subscription_id": name}), applied)
                }
                Err(error) => error_response(Some(&json!(id)), "invalid_argument", &error.detail),
            },
            (Some(id), Some("subscription.unsubscribe")) => {
                let name = params
                    .get("subscription_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let removed = lock(&subscriptions).remove(name);
                match removed {
                    Some(_) => {
                        success(id, json!({}), shared.runs.protocol.last_seq(&storage).await)
                    }
                    None => error_response(
                        Some(&json!(id)),
                        "no_such_subscription",
                        &format!("no subscription `{name}` on this socket"),
                    ),
                }
            }
            _ => answer(&shared, &tenant, &thread_id, &command, Transport::Socket)
                .await
                .unwrap_or_else(|refused| refused),
        };
        if outgoing
            .send(Message::Text(reply.to_string().into()))
            .await
            .is_err()
        {
            break;
        }
    }
    if let Some(task) = forwarder {
        task.abort();
    }
    drop(outgoing);
    let _ = writer.await;
}

/// A socket's subscriptions: each one's filter and the `seq` its replay starts after.
type Subscriptions = Arc<std::sync::Mutex<std::collections::BTreeMap<String, (Filter, u64)>>>;

/// Sends the thread's events numbered after `after` that a subscription wants, in order,
/// then the live ones, to a socket, until it is gone; `sent_through` is the latest `seq` it
/// passed.
async fn forward(
    mut follower: crate::protocol::Follower,
    subscriptions: Subscriptions,
    mut after: u64,
    outgoing: tokio::sync::mpsc::Sender<axum::extract::ws::Message>,
    sent_through: Arc<std::sync::atomic::AtomicU64>,
) {
    loop {
        let events = follower.next(after, Duration::from_secs(15)).await;
        if outgoing.is_closed() {
            return;
        }
        for event in &events {
            after = event.seq;
            let wanted = lock(&subscriptions)
                .values()
                .any(|(filter, since)| event.seq > *since && filter.wants(event));
            if wanted {
                let message = axum::extract::ws::Message::Text(event.json.clone().into());
                if outgoing.send(message).await.is_err() {
                    return;
                }
            }
            sent_through.fetch_max(event.seq, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

/// A command's params as a `T`; a field of the wrong shape is `invalid_argument`, named.
fn params<T: serde::de::DeserializeOwned>(params: &Value) -> Result<T, Refused> {
    parse(params).map_err(|error| Refused::invalid(error.detail))
}

/// The run fields a command may carry, copied into the v1 run payload it becomes.
#[derive(Default, Deserialize)]
#[serde(default)]
struct RunFields {
    metadata: Option<Value>,
    context: Option<Value>,
    /// `config.configurable.checkpoint_id`: the checkpoint a run forks from (the SDK's
    /// `forkFrom`).
    config: Option<Value>,
}

impl RunFields {
    /// The checkpoint the run forks from, when named.
    fn fork_target(&self) -> Option<Value> {
        self.config
            .as_ref()?
            .pointer("/configurable/checkpoint_id")
            .filter(|id| !id.is_null())
            .cloned()
    }

    /// Copies `metadata` and `context` into a v1 run payload.
    fn copy_into(&self, body: &mut Value) {
        for (key, value) in [("metadata", &self.metadata), ("context", &self.context)] {
            if let Some(value) = value {
                body[key] = value.clone();
            }
        }
    }
}

/// The params of `run.start`.
#[derive(Default, Deserialize)]
#[serde(default)]
struct RunStart {
    assistant_id: Option<String>,
    multitask_strategy: Option<MultitaskStrategy>,
    /// The SDK spells it both ways.
    #[serde(rename = "multitaskStrategy")]
    multitask_strategy_camel: Option<MultitaskStrategy>,
    input: Option<Value>,
}

/// The params of `input.respond`: one response, or several under `responses`; with the
/// command's `update` and `goto`.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Respond {
    responses: Option<Value>,
    update: Option<Value>,
    goto: Option<Value>,
}

/// One response of `input.respond`: the interrupt it answers and the answer.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Response1 {
    interrupt_id: Option<String>,
    response: Option<Value>,
    /// Checked only: this server's interrupts are all the root's.
    #[allow(dead_code)]
    namespace: Option<Namespace>,
}

/// The params of `state.get` and `state.listCheckpoints`.
#[derive(Default, Deserialize)]
#[serde(default)]
struct StateParams {
    namespace: Option<Value>,
    keys: Option<Vec<String>>,
}

/// The params of `state.fork`.
#[derive(Default, Deserialize)]
#[serde(default)]
struct StateFork {
    checkpoint_id: Option<Value>,
    input: Option<Value>,
}

/// `run.start`: a run with `input` on the thread, made when it does not exist yet. A run
/// going on the thread is waited for unless `multitask_strategy` says otherwise.
async fn run_start(
    shared: &AppState,
    tenant: &Tenant,
    thread_id: &str,
    params: &Value,
) -> Result<Value, Refused> {
    let (start, fields): (RunStart, RunFields) = (self::params(params)?, self::params(params)?);
    let assistant_id = start
        .assistant_id
        .filter(|id| !id.is_empty())
        .ok_or_else(|| {
            Refused::invalid("run.start needs `assistant_id`: the graph id or assistant id to run")
        })?;
    let strategy = start
        .multitask_strategy
        .or(start.multitask_strategy_camel)
        .unwrap_or(MultitaskStrategy::Enqueue);
    let mut body = json!({
        "assistant_id": assistant_id,
        "if_not_exists": "create",
        "multitask_strategy": strategy.as_str(),
    });
    // Input that is an answer (`{"decisions": [...]}`, as `input.respond` carries) resumes
    // the thread's pause, as the reference server takes `run.start` on a paused thread; input
    // with messages is new input (calls left waiting are then marked not run).
    match start.input {
        Some(answer @ Value::Object(_))
            if answer.get("decisions").is_some() && answer.get("messages").is_none() =>
        {
            body["command"] = json!({"resume": answer});
        }
        input => body["input"] = input.unwrap_or(Value::Null),
    }
    fields.copy_into(&mut body);
    if let Some(checkpoint) = fields.fork_target() {
        body["checkpoint_id"] = checkpoint;
    }
    let record = super::runs::create_run(shared, tenant, thread_id, body, false)
        .await
        .map_err(|error| Refused::from_api(error, "invalid_argument"))?;
    Ok(json!({"run_id": record.run_id}))
}

/// The assistant that last ran on the thread (as its metadata records), else the default.
async fn thread_assistant(
    shared: &AppState,
    tenant: &Tenant,
    thread_id: &str,
) -> Result<String, Refused> {
    let thread = shared
        .records(tenant)
        .thread(thread_id)
        .await
        .map_err(|error| Refused::from_api(error, "invalid_argument"))?
        .ok_or_else(|| {
            Refused(
                "no_such_run",
                format!("thread `{thread_id}` has no run; start one with run.start"),
            )
        })?;
    let recorded = thread
        .metadata
        .get("assistant_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    match recorded {
        Some(id) => Ok(id),
        None => shared
            .assistants
            .first()
            .map(|assistant| assistant.graph_id.clone())
            .ok_or_else(|| Refused("unknown_error", "no assistants are served".to_owned())),
    }
}

/// `input.respond`: a run that resumes the interrupt the thread waits on with `response`
/// (for an approval, `{"decisions": [...]}`, one per action, as in the v1 API).
async fn input_respond(
    shared: &AppState,
    tenant: &Tenant,
    thread_id: &str,
    params: &Value,
) -> Result<Value, Refused> {
    let respond: Respond = self::params(params)?;
    let entries: Vec<Response1> = match respond.responses {
        Some(Value::Array(entries)) if !entries.is_empty() => {
            entries.iter().map(self::params).collect::<Result<_, _>>()?
        }
        Some(_) => {
            return Err(Refused::invalid(
                "`responses` must be a non-empty list of {interrupt_id, response, namespace}",
            ));
        }
        None => vec![self::params(params)?],
    };
    let mut answers = serde_json::Map::new();
    for entry in entries {
        let id = entry.interrupt_id.ok_or_else(|| {
            Refused::invalid(
                "input.respond needs `interrupt_id`: the id of the input.requested event answered",
            )
        })?;
        answers.insert(id, entry.response.unwrap_or(Value::Null));
    }
    if answers.len() > 1 {
        return Err(Refused::invalid(
            "this server pauses on one interrupt at a time (its approvals are one interrupt with every action); answer that one with a response holding one decision per action",
        ));
    }
    // The run that paused announced the interrupt just before it ended: let it end, so the
    // resume is not refused as behind a running run.
    let started = tokio::time::Instant::now();
    while shared
        .runs
        .busy(&tenant.0, thread_id)
        .await
        .map_err(|error| Refused::from_api(error, "invalid_argument"))?
        && started.elapsed() < SETTLE
    {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let assistant_id = thread_assistant(shared, tenant, thread_id).await?;
    let mut command = json!({"resume": Value::Object(answers)});
    for (key, value) in [("update", respond.update), ("goto", respond.goto)] {
        if let Some(value) = value {
            command[key] = value;
        }
    }
    let mut body = json!({"assistant_id": assistant_id, "command": command});
    self::params::<RunFields>(params)?.copy_into(&mut body);
    let record = super::runs::create_run(shared, tenant, thread_id, body, false)
        .await
        .map_err(|error| {
            // A 409 is an interrupt that is not pending, or (after the wait) a run of the
            // thread still going, which may answer it first.
            let stale = !error.detail.contains("is busy");
            Refused::from_api(
                error,
                if stale {
                    "no_such_interrupt"
                } else {
                    "invalid_argument"
                },
            )
        })?;
    Ok(json!({"run_id": record.run_id}))
}

/// Subagents keep no checkpoints of their own: only the root namespace has state.
fn root_only(params: &StateParams) -> Result<(), Refused> {
    match &params.namespace {
        None => Ok(()),
        Some(Value::Array(segments)) if segments.is_empty() => Ok(()),
        Some(_) => Err(Refused(
            "no_such_namespace",
            "only the root namespace ([]) has state here; a subagent's work is in its task's tool message".to_owned(),
        )),
    }
}

/// `state.get`: the thread's values and checkpoint, all keys or those of `keys`.
async fn state_get(
    shared: &AppState,
    tenant: &Tenant,
    thread_id: &str,
    params: &Value,
) -> Result<Value, Refused> {
    let params: StateParams = self::params(params)?;
    root_only(&params)?;
    let state = super::threads::state_of(shared, tenant, thread_id, None)
        .await
        .map_err(|error| Refused::from_api(error, "invalid_argument"))?;
    let mut values = state.get("values").cloned().unwrap_or_else(|| json!({}));
    if let (Some(keys), Value::Object(map)) = (&params.keys, &mut values) {
        map.retain(|key, _| keys.contains(key));
    }
    let mut result = json!({"values": values});
    if let Some(id) = state.pointer("/checkpoint/checkpoint_id") {
        result["checkpoint"] = json!({"id": id, "ns": ""});
    }
    Ok(result)
}

/// `state.listCheckpoints`: the thread's checkpoints, newest first.
async fn list_checkpoints(
    shared: &AppState,
    tenant: &Tenant,
    thread_id: &str,
    params: &Value,
) -> Result<Value, Refused> {
    root_only(&self::params(params)?)?;
    // `limit` (default 10) and `before`, as the v1 history takes them.
    let query = self::params(params)?;
    let states = super::threads::history_of(shared, tenant, thread_id, &query)
        .await
        .map_err(|error| Refused::from_api(error, "invalid_argument"))?;
    let checkpoints: Vec<Value> = states
        .iter()
        .map(|state| {
            json!({
                "id": state.pointer("/checkpoint/checkpoint_id").cloned().unwrap_or(Value::Null),
                "timestamp": state.get("created_at").cloned().unwrap_or(Value::Null),
                "step": state.pointer("/metadata/step").cloned().unwrap_or(json!(0)),
                "metadata": state.get("metadata").cloned().unwrap_or_else(|| json!({})),
            })
        })
        .collect();
    Ok(json!({"checkpoints": checkpoints}))
}

/// `state.fork`: a run from checkpoint `checkpoint_id` (with `input`, when given), as a new
/// branch of the thread.
async fn state_fork(
    shared: &AppState,
    tenant: &Tenant,
    thread_id: &str,
    params: &Value,
) -> Result<Value, Refused> {
    let (fork, fields): (StateFork, RunFields) = (self::params(params)?, self::params(params)?);
    let checkpoint = fork
        .checkpoint_id
        .ok_or_else(|| Refused::invalid("state.fork needs `checkpoint_id`"))?;
    let assistant_id = thread_assistant(shared, tenant, thread_id).await?;
    let mut body = json!({
        "assistant_id": assistant_id,
        "input": fork.input.unwrap_or(Value::Null),
        "checkpoint_id": checkpoint,
        "multitask_strategy": MultitaskStrategy::Enqueue.as_str(),
    });
    fields.copy_into(&mut body);
    let record = super::runs::create_run(shared, tenant, thread_id, body, false)
        .await
        .map_err(|error| Refused::from_api(error, "invalid_argument"))?;
    Ok(json!({"run_id": record.run_id, "thread_id": thread_id}))
}

/// The channels an event stream asks for: a non-empty list of channel names.
struct Channels(Vec<String>);

/// The channels this server streams, as an error message lists them.
fn allowed_channels() -> String {
    format!("{} or custom:NAME", CHANNELS.join(", "))
}

impl<'de> Deserialize<'de> for Channels {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        checked(deserializer, |value| {
            let list = match value {
                Value::Array(list) if !list.is_empty() => list,
                _ => {
                    return Err(format!(
                        "must be a non-empty list of channel names ({})",
                        allowed_channels()
                    ));
                }
            };
            list.iter()
                .map(|channel| match channel.as_str() {
                    Some(name)
                        if CHANNELS.contains(&name)
                            || name.strip_prefix("custom:").is_some_and(|n| !n.is_empty()) =>
                    {
                        Ok(name.to_owned())
                    }
                    _ => Err(format!(
                        "unknown channel {channel}; use {}",
                        allowed_channels()
                    )),
                })
                .collect::<Result<_, _>>()
                .map(Self)
        })
    }
}

/// Namespace prefixes: a list of namespaces, each a list of strings.
struct Namespaces(Vec<Vec<String>>);

impl<'de> Deserialize<'de> for Namespaces {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        checked(deserializer, |value| {
            value
                .as_array()
                .and_then(|list| {
                    list.iter()
                        .map(|namespace| {
                            namespace.as_array().and_then(|segments| {
                                segments
                                    .iter()
                                    .map(|s| s.as_str().map(str::to_owned))
                                    .collect::<Option<Vec<_>>>()
                            })
                        })
                        .collect::<Option<Vec<_>>>()
                })
                .map(Self)
                .ok_or_else(|| {
                    "must be a list of namespaces, each a list of strings ([] for the root)"
                        .to_owned()
                })
        })
    }
}

/// The body of an event stream (`EventStreamRequest`).
#[derive(Default, Deserialize)]
#[serde(default)]
struct EventStreamRequest {
    channels: Option<Channels>,
    namespaces: Option<Namespaces>,
    depth: Option<Count>,
    since: Option<Count>,
}

/// The filter of an event stream's body, checked; with `since`.
fn read_filter(body: &Value) -> ApiResult<(Filter, u64)> {
    let request: EventStreamRequest = parse(body)?;
    let channels = request.channels.ok_or_else(|| {
        ApiError::invalid(format!(
            "`channels` must be a non-empty list of channel names ({})",
            allowed_channels()
        ))
    })?;
    Ok((
        Filter {
            channels: channels.0,
            namespaces: request.namespaces.map(|namespaces| namespaces.0),
            depth: request.depth.map(|depth| depth.0),
        },
        request
            .since
            .map_or(0, |since| u64::try_from(since.0).unwrap_or(u64::MAX)),
    ))
}

/// `POST /threads/{thread_id}/stream/events`: the thread's protocol events as server-sent
/// events (`event:` the method, `data:` the event, `id:` its `seq`), those numbered after
/// `since` first, then live, across its runs, until the client goes away. The body filters
/// them: `channels`, `namespaces` (prefixes) and `depth` (how far below a prefix).
pub(super) async fn events(
    State(shared): State<AppState>,
    Extension(tenant): Extension<Tenant>,
    Path(thread_id): Path<String>,
    body: Bytes,
) -> ApiResult<Response> {
    let body: Value = if body.iter().all(u8::is_ascii_whitespace) {
        json!({})
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid(format!("the body is not valid JSON: {e}")))?
    };
    let (filter, since) = read_filter(&body)?;
    shared.records(&tenant).existing_thread(&thread_id).await?;
    let follower = shared
        .runs
        .protocol
        .follower(&storage_id(&tenant.0, &thread_id));
    let closing = shared.runs.protocol.closing();
    // A comment first, so the client has the response (and knows the stream is open)
    // before any event comes.
    let opening = futures::stream::once(async {
        Ok::<_, std::convert::Infallible>(Bytes::from_static(b": connected\n\n"))
    });
    let following = futures::stream::unfold(
        (follower, since, closing),
        move |(mut follower, mut after, mut closing)| {
            let filter = filter.clone();
            async move {
                loop {
                    if *closing.borrow() {
                        return None;
                    }
                    let events = tokio::select! {
                        events = follower.next(after, Duration::from_secs(15)) => events,
                        _ = closing.changed() => return None,
                    };
                    // A comment now and then keeps proxies from closing a quiet stream and
                    // tells the client the connection is alive.
                    if events.is_empty() {
                        return Some((
                            Ok(Bytes::from_static(b": heartbeat\n\n")),
                            (follower, after, closing),
                        ));
                    }
                    let mut text = String::new();
                    for event in &events {
                        after = event.seq;
                        if filter.wants(event) {
                            text.push_str(&format!(
                                "event: {}\ndata: {}\nid: {}\n\n",
                                event.method, event.json, event.seq
                            ));
                        }
                    }
                    if !text.is_empty() {
                        return Some((Ok(Bytes::from(text)), (follower, after, closing)));
                    }
                }
            }
        },
    );
    let mut response = Response::new(Body::from_stream(futures::StreamExt::chain(
        opening, following,
    )));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}
