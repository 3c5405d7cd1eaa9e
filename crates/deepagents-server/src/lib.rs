//! An HTTP server for deep agents that speaks the LangGraph Platform API: the official
//! `langgraph-sdk` clients, and the UIs built on them, talk to it unchanged.
//!
//! It serves [`Assistant`]s — built agents with a graph id — over threads kept in the agents'
//! checkpointer and runs driven in this process, one at a time per thread. Threads' metadata
//! and runs' records live in a [`Store`], beside the API's own store items; every one of them
//! belongs to a tenant, named by the API key a request carries or by the user of its bearer
//! JWT ([`JwtOptions`]).
//!
//! ```no_run
//! # async fn serve(agent: deepagents::Agent, store: std::sync::Arc<dyn deepagents::backends::Store>, watch: std::sync::Arc<deepagents_server::StepWatch>) -> std::io::Result<()> {
//! // `agent` was built with `watch` as its checkpointer.
//! let options = deepagents_server::ServerOptions::new(
//!     vec![deepagents_server::Assistant::new("agent", agent)],
//!     store,
//!     watch,
//! );
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:2024").await?;
//! deepagents_server::serve(listener, options, std::future::pending()).await
//! # }
//! ```

mod api;
mod auth;
mod chat;
#[cfg(feature = "cluster")]
pub mod cluster;
mod connections;
mod cors;
mod crons;
mod error;
mod metrics;
#[cfg(feature = "otel")]
pub mod otel;
mod protocol;
mod records;
mod runs;
mod stream;
mod time;
mod webhooks;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use deepagents::Agent;
use deepagents::backends::Store;

pub use auth::JwtOptions;
pub use connections::ConnectionLimits;
pub use cors::CorsOrigins;
pub use deepagents_langgraph::{Step, StepWatch, Subscription};
pub use error::ApiError;
pub use webhooks::{SIGNATURE_HEADER, TIMESTAMP_HEADER, WebhookOptions};

/// One agent the server offers, under a graph id (`agent` by default, as the reference
/// platform's templates name it).
pub struct Assistant {
    /// The graph id clients name it by (`assistant_id` may be it or [`id`](Self::id)).
    pub graph_id: String,
    /// Its display name.
    pub name: String,
    /// What it is for.
    pub description: Option<String>,
    /// The agent; its checkpointer must be the server's [`StepWatch`].
    pub agent: Agent,
}

impl Assistant {
    /// `agent` as graph `graph_id`, named so.
    pub fn new(graph_id: impl Into<String>, agent: Agent) -> Self {
        let graph_id = graph_id.into();
        Self {
            name: graph_id.clone(),
            graph_id,
            description: None,
            agent,
        }
    }

    /// Its assistant id: derived from the graph id as the reference platform derives the
    /// ids of the assistants it makes for each graph (a UUID v5 in the URL namespace).
    pub fn id(&self) -> String {
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_URL, self.graph_id.as_bytes()).to_string()
    }
}

/// What the server serves and how.
pub struct ServerOptions {
    /// The assistants, the first being the default.
    pub assistants: Vec<Assistant>,
    /// Where threads' metadata, runs' records and the API's store items live.
    pub store: Arc<dyn Store>,
    /// The agents' checkpointer, watched.
    pub watch: Arc<StepWatch>,
    /// API keys and the tenant each belongs to. Empty: no key is asked for and everything
    /// belongs to tenant `default` (for a server on 127.0.0.1).
    pub api_keys: BTreeMap<String, String>,
    /// Bearer JWTs, beside the API keys: each verified token's user (its `sub`) is the
    /// request's tenant. `None` (the default): no JWT is taken.
    pub jwt: Option<JwtOptions>,
    /// The largest request body accepted (default 16 MiB).
    pub max_body_bytes: usize,
    /// Which web pages of other origins may call the server (default: none).
    pub cors: CorsOrigins,
    /// How many connections at once, how long a request may take to arrive, how long a stop
    /// waits for open connections.
    pub connections: ConnectionLimits,
    /// Which `webhook` URLs runs may name, how deliveries are signed and retried (default:
    /// none allowed).
    pub webhooks: WebhookOptions,
    /// How often the cron scheduler looks for due crons at least (default 5 s; it also
    /// wakes when the next cron is due).
    pub cron_tick: std::time::Duration,
    /// The queue and event fan-out shared with other servers; `None`: this server runs
    /// every run it accepts.
    #[cfg(feature = "cluster")]
    pub cluster: Option<Arc<cluster::Cluster>>,
    /// Where runs' traces are exported (OTLP over HTTP); `None` (the default): nowhere.
    /// [`otel::TraceOptions::from_env`] reads the standard `OTEL_*` variables.
    #[cfg(feature = "otel")]
    pub traces: Option<otel::TraceOptions>,
}

impl ServerOptions {
    /// `assistants` over `store` and `watch`, without API keys.
    pub fn new(assistants: Vec<Assistant>, store: Arc<dyn Store>, watch: Arc<StepWatch>) -> Self {
        Self {
            assistants,
            store,
            watch,
            api_keys: BTreeMap::new(),
            jwt: None,
            max_body_bytes: 16 * 1024 * 1024,
            cors: CorsOrigins::None,
            connections: ConnectionLimits::default(),
            cron_tick: crons::DEFAULT_TICK,
            webhooks: WebhookOptions::default(),
            #[cfg(feature = "cluster")]
            cluster: None,
            #[cfg(feature = "otel")]
            traces: None,
        }
    }
}

/// Why a server could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// There is nothing to serve.
    #[error("no assistants to serve")]
    NoAssistants,
    /// Two assistants share a graph id.
    #[error("two assistants have the graph id `{0}`; give each its own")]
    DuplicateGraph(String),
    /// An assistant's agent does not checkpoint through the server's watch.
    #[error(
        "the agent of assistant `{0}` does not checkpoint through the server's StepWatch; build it with .checkpointer(watch.clone())"
    )]
    Unwatched(String),
    /// A tenant name cannot be used in storage.
    #[error("tenant `{0}` may only have letters, digits, `-` and `_`")]
    InvalidTenant(String),
    /// A CORS origin is not what browsers send as `Origin`.
    #[error(
        "CORS origin `{0}` is not an origin; write it as scheme://host[:port] (for example http://localhost:3000), without a path, or `*` for any"
    )]
    InvalidCorsOrigin(String),
    /// A webhook setting cannot be used.
    #[error("{0}")]
    Webhooks(String),
    /// A JWT setting cannot be used (a key that is not one, a short secret, a bad JWKS URL).
    #[error("{0}")]
    Jwt(String),
    /// The trace exporter cannot be set up (a header that is not one).
    #[cfg(feature = "otel")]
    #[error("{0}")]
    Traces(String),
}

/// The server's routes, ready to be served (or nested in a larger application).
pub fn router(options: ServerOptions) -> Result<axum::Router, ServerError> {
    build(options).map(|(router, _)| router)
}

fn build(
    #[cfg_attr(not(feature = "otel"), allow(unused_mut))] mut options: ServerOptions,
) -> Result<(axum::Router, Arc<runs::Runs>), ServerError> {
    if options.assistants.is_empty() {
        return Err(ServerError::NoAssistants);
    }
    let mut seen = std::collections::BTreeSet::new();
    for assistant in &options.assistants {
        if !seen.insert(assistant.graph_id.clone()) {
            return Err(ServerError::DuplicateGraph(assistant.graph_id.clone()));
        }
        let watched = assistant.agent.checkpointer().is_some_and(|checkpointer| {
            std::ptr::addr_eq(Arc::as_ptr(checkpointer), Arc::as_ptr(&options.watch))
        });
        if !watched {
            return Err(ServerError::Unwatched(assistant.graph_id.clone()));
        }
    }
    if let Some(bad) = options.api_keys.values().find(|tenant| {
        tenant.is_empty()
            || !tenant
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    }) {
        return Err(ServerError::InvalidTenant(bad.clone()));
    }
    let cors = options.cors.layer()?;
    let webhooks = webhooks::Webhooks::new(&options.webhooks).map_err(ServerError::Webhooks)?;
    let jwt = options
        .jwt
        .as_ref()
        .map(auth::Verifier::new)
        .transpose()
        .map_err(ServerError::Jwt)?;
    #[cfg(feature = "otel")]
    let tracer = options
        .traces
        .take()
        .map(otel::Tracer::start)
        .transpose()
        .map_err(ServerError::Traces)?;
    let (router, runs) = api::router(options, jwt);
    runs.set_webhooks(Arc::new(webhooks));
    #[cfg(feature = "otel")]
    if let Some(tracer) = tracer {
        runs.set_tracer(tracer);
    }
    Ok((
        match cors {
            Some(cors) => router.layer(cors),
            None => router,
        },
        runs,
    ))
}

/// Serves `options` on `listener` until `shutdown` completes; then it stops taking requests
/// and runs, cancels the runs still going (their threads keep every finished step), closes
/// the connections still open after [`ConnectionLimits::shutdown_grace`] and returns once the
/// runs have settled.
pub async fn serve(
    listener: tokio::net::TcpListener,
    options: ServerOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = options.connections.clone();
    let (router, runs) =
        build(options).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let stopping = Arc::clone(&runs);
    // Streams of running runs hold their connections open: the runs stop first, so the
    // streams end and the server can.
    let shutdown = async move {
        shutdown.await;
        stopping.stop_all();
    };
    connections::serve(listener, router, &limits, shutdown).await;
    runs.settled().await;
    // The runs' last spans go out before the server is gone.
    #[cfg(feature = "otel")]
    if let Some(tracer) = runs.tracer() {
        tracer.shutdown(std::time::Duration::from_secs(5)).await;
    }
    Ok(())
}

/// Locks `mutex`; a panic in another holder leaves plain data, still usable.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
