//! The routes, payloads and status codes of the LangGraph Platform API, over [`Runs`] and
//! [`Records`].

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use deepagents::backends::Store;
use serde_json::{Value, json};

use crate::error::{ApiError, ApiResult};
use crate::records::Records;
use crate::runs::Runs;
use crate::time::{now_ms, rfc3339};
use crate::{Assistant, ServerOptions};

mod assistants;
mod crons;
mod events;
mod request;
mod runs;
mod sse;
mod store;
mod threads;
mod wakes;

/// What every handler shares.
struct Shared {
    assistants: Vec<Arc<Assistant>>,
    store: Arc<dyn Store>,
    watch: Arc<crate::StepWatch>,
    runs: Arc<Runs>,
    api_keys: BTreeMap<String, String>,
    /// Verifies bearer JWTs, when they are taken.
    jwt: Option<crate::auth::Verifier>,
    /// When the server was set up: its assistants' creation time (they are made with it).
    started_at: String,
    /// The crons, which its scheduler fires.
    crons: Arc<crate::crons::Crons>,
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
pub fn router(options: ServerOptions, jwt: Option<crate::auth::Verifier>) -> (Router, Arc<Runs>) {
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
    let crons = crate::crons::Crons::new(Arc::clone(&options.store), options.cron_tick);
    #[cfg(feature = "cluster")]
    let crons = match runs.cluster() {
        Some(cluster) => crons.clustered(Arc::clone(cluster)),
        None => crons,
    };
    let shared = Arc::new(Shared {
        assistants,
        store: options.store,
        watch: options.watch,
        runs: Arc::clone(&runs),
        api_keys: options.api_keys,
        jwt,
        started_at: rfc3339(now_ms()),
        crons: Arc::new(crons),
    });
    crons::start_scheduler(&shared);
    wakes::start_listeners(&shared);
    let api = Router::new()
        .route("/assistants/search", post(assistants::assistants_search))
        .route("/assistants/count", post(assistants::assistants_count))
        .route("/assistants/{assistant_id}", get(assistants::assistant_get))
        .route(
            "/assistants/{assistant_id}/schemas",
            get(assistants::assistant_schemas),
        )
        .route(
            "/assistants/{assistant_id}/graph",
            get(assistants::assistant_graph),
        )
        .route(
            "/assistants/{assistant_id}/subgraphs",
            get(assistants::assistant_subgraphs),
        )
        .route(
            "/assistants/{assistant_id}/subgraphs/{namespace}",
            get(assistants::assistant_subgraphs),
        )
        .route("/threads", post(threads::thread_create))
        .route("/threads/search", post(threads::threads_search))
        .route("/threads/count", post(threads::threads_count))
        .route(
            "/threads/{thread_id}",
            get(threads::thread_get)
                .patch(threads::thread_patch)
                .delete(threads::thread_delete),
        )
        .route(
            "/threads/{thread_id}/state",
            get(threads::state_get).post(threads::state_update),
        )
        .route(
            "/threads/{thread_id}/state/checkpoint",
            post(threads::state_at_body),
        )
        .route(
            "/threads/{thread_id}/state/{checkpoint_id}",
            get(threads::state_at),
        )
        .route(
            "/threads/{thread_id}/history",
            get(threads::history_get).post(threads::history),
        )
        .route(
            "/threads/{thread_id}/runs",
            get(runs::runs_list).post(runs::run_create),
        )
        .route("/threads/{thread_id}/runs/stream", post(runs::run_stream))
        .route("/threads/{thread_id}/runs/wait", post(runs::run_wait))
        .route("/threads/{thread_id}/commands", post(events::command))
        .route(
            "/threads/{thread_id}/stream/events",
            post(events::events).get(events::socket),
        )
        .route(
            "/threads/{thread_id}/runs/{run_id}",
            get(runs::run_get).delete(runs::run_delete),
        )
        .route(
            "/threads/{thread_id}/runs/{run_id}/join",
            get(runs::run_join),
        )
        .route(
            "/threads/{thread_id}/runs/{run_id}/stream",
            get(runs::run_join_stream),
        )
        .route(
            "/threads/{thread_id}/runs/{run_id}/cancel",
            post(runs::run_cancel),
        )
        .route("/runs", post(runs::stateless_create))
        .route("/runs/crons", post(crons::cron_create))
        .route("/runs/crons/search", post(crons::crons_search))
        .route("/runs/crons/count", post(crons::crons_count))
        .route(
            "/runs/crons/{cron_id}",
            axum::routing::patch(crons::cron_patch).delete(crons::cron_delete),
        )
        .route(
            "/threads/{thread_id}/runs/crons",
            post(crons::thread_cron_create),
        )
        .route("/runs/stream", post(runs::stateless_stream))
        .route("/runs/wait", post(runs::stateless_wait))
        .route(
            "/store/items",
            get(store::store_get)
                .put(store::store_put)
                .delete(store::store_delete),
        )
        .route("/store/items/search", post(store::store_search))
        .route("/store/namespaces", post(store::store_namespaces))
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

/// The tenant of the request's API key (`x-api-key` or `Authorization: Bearer`) or of the
/// user of its bearer JWT; with neither keys nor JWTs configured, tenant `default`.
async fn authenticate(
    State(shared): State<AppState>,
    mut request: Request,
    next: Next,
) -> Result<Response, Response> {
    let tenant = if shared.api_keys.is_empty() && shared.jwt.is_none() {
        "default".to_owned()
    } else {
        let headers = request.headers();
        let api_key = headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim);
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.split_once(' ')
                    .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            })
            .map(|(_, credential)| credential.trim());
        let keyed = [api_key, bearer]
            .into_iter()
            .flatten()
            .find_map(|key| shared.api_keys.get(key));
        match (keyed, &shared.jwt, bearer) {
            (Some(tenant), _, _) => tenant.clone(),
            // A bearer credential that is no API key and has a JWT's three parts.
            (None, Some(jwt), Some(token)) if token.split('.').count() == 3 => {
                match jwt.verify(token).await {
                    Ok(user) => crate::auth::tenant_of(&user),
                    Err(refusal) => return Err(token_refused(refusal)),
                }
            }
            (None, None, _) => return Err(ApiError::unauthorized().into_response()),
            (None, Some(_), _) => {
                return Err(ApiError {
                    status: StatusCode::UNAUTHORIZED,
                    detail: "missing or unknown credentials; send a JWT as `Authorization: Bearer <token>` or an API key as `x-api-key`".to_owned(),
                }
                .into_response());
            }
        }
    };
    request.extensions_mut().insert(Tenant(tenant));
    Ok(next.run(request).await)
}

/// The 401 (503 when the keys cannot be fetched) of a refused bearer token, with the
/// `WWW-Authenticate` challenge of RFC 6750.
fn token_refused(refusal: crate::auth::Refusal) -> Response {
    let detail = refusal.detail();
    if refusal.unavailable() {
        return ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            detail: detail.to_owned(),
        }
        .into_response();
    }
    let mut response = ApiError {
        status: StatusCode::UNAUTHORIZED,
        detail: detail.to_owned(),
    }
    .into_response();
    let challenge = format!(
        "Bearer error=\"invalid_token\", error_description=\"{}\"",
        detail.replace('`', "")
    );
    if let Ok(value) = header::HeaderValue::from_str(&challenge) {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, value);
    }
    response
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

/// Whether `metadata` holds every key of `filter` with the same value.
fn matches(metadata: &Value, filter: Option<&request::Object>) -> bool {
    filter.is_none_or(|filter| filter.0.iter().all(|(k, v)| metadata.get(k) == Some(v)))
}

async fn info() -> Json<Value> {
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "langgraph_py_version": null,
        "flags": {"assistants": true, "crons": true, "langsmith": false, "langsmith_tracing_replicas": false},
        "metadata": {"server": "deepagents-rs"},
    }))
}

async fn metrics(State(shared): State<AppState>) -> Response {
    let (active, queued) = shared.runs.counts().await;
    #[cfg_attr(not(feature = "otel"), allow(unused_mut))]
    let mut text = shared.runs.metrics.render(active, queued);
    #[cfg(feature = "otel")]
    if let Some(tracer) = shared.runs.tracer() {
        text.push_str(&tracer.render_metrics());
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

fn new_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// One page of a search as the SDKs read it: the items, `X-Pagination-Total` and, when more
/// follow, `X-Pagination-Next` (the offset of the next page).
fn paginated(page: Vec<Value>, offset: usize, limit: usize, total: usize) -> Response {
    let mut response = Json(page).into_response();
    // Saturating: a client may send any offset and limit, up to the largest integer.
    let next = offset.saturating_add(limit);
    if next < total
        && let Ok(next) = header::HeaderValue::from_str(&next.to_string())
    {
        response.headers_mut().insert("X-Pagination-Next", next);
    }
    if let Ok(total) = header::HeaderValue::from_str(&total.to_string()) {
        response.headers_mut().insert("X-Pagination-Total", total);
    }
    response
}
