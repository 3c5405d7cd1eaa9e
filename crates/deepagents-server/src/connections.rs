//! Serving connections: how many at once, how long a client may take to send a request, and
//! how long a stop waits for those still open — what keeps the server answering under idle
//! or slow clients, and its stop bounded.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Limits on the connections a server holds.
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    /// Connections served at once; more wait in the listen backlog until one closes. Below
    /// the usual 1,024 open files, with room for the stores and model clients.
    pub max_connections: usize,
    /// How long a client may take to send a request's headers, on a new connection and
    /// between requests on a kept-alive one; then the connection is closed. Connections that
    /// send nothing cannot pile up.
    pub header_read_timeout: Duration,
    /// How long a stop waits for open connections (streams, waits) to finish after the runs
    /// were stopped; then they are closed.
    pub shutdown_grace: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 768,
            header_read_timeout: Duration::from_secs(30),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}

/// Serves `router` on `listener` within `limits` until `shutdown` completes, then lets the
/// open connections finish for at most the grace.
pub(crate) async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: &ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let capacity = limits.max_connections.clamp(1, Semaphore::MAX_PERMITS);
    let slots = Arc::new(Semaphore::new(capacity));
    // Told to every connection at the stop: each finishes its request and closes.
    let (stopping, stop) = tokio::sync::watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    tokio::pin!(shutdown);
    loop {
        // A slot first: at the limit, new clients wait in the backlog instead of taking a
        // descriptor the server needs.
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of descriptors and the like: pause instead of spinning.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let service = TowerToHyperService::new(router.clone());
        // With upgrades: a WebSocket takes the connection over (its protocol closes it at a
        // stop).
        let connection = http
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            tokio::pin!(connection);
            let stopped = async move {
                while !*stop.borrow_and_update() {
                    if stop.changed().await.is_err() {
                        return;
                    }
                }
            };
            // A client that goes away or times out ends its connection; nothing to report.
            tokio::select! {
                _ = connection.as_mut() => {}
                () = stopped => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    let _ = stopping.send(true);
    // Every slot back: every connection closed.
    let closed = slots.acquire_many(u32::try_from(capacity).unwrap_or(u32::MAX));
    if tokio::time::timeout(limits.shutdown_grace, closed)
        .await
        .is_err()
    {
        tracing::warn!(
            grace_s = limits.shutdown_grace.as_secs_f64(),
            "connections still open after the stop's grace are closed"
        );
    }
}
