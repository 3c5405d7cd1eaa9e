//! A run's frames as server-sent events: where they come from (the run's log in this
//! process, or the cluster's Redis copy), with ids, heartbeats and a cancel when the client
//! goes away.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;

use super::runs::CancelAction;
use super::{Shared, Tenant};
#[cfg(feature = "cluster")]
use crate::records::Records;
use crate::records::RunRecord;
use crate::runs::{Live, Runs};
use crate::stream::FrameLog;

/// Cancels a run when the client of its stream goes away (`on_disconnect: cancel`).
pub(super) struct CancelOnDrop(pub(super) Option<(Arc<Runs>, RunRecord)>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some((runs, record)) = self.0.take() {
            tokio::spawn(async move {
                if let Err(error) = runs.cancel(&record, CancelAction::Interrupt.as_str()).await {
                    tracing::warn!(run_id = %record.run_id, %error, "cannot cancel the run whose client went away");
                }
            });
        }
    }
}

/// Where a stream's frames come from: the run's log in this process, or the cluster's
/// copy of it when another server runs it (or may).
pub(super) enum Source {
    Local(Arc<Live>),
    #[cfg(feature = "cluster")]
    Remote(Box<Remote>),
}

/// A run's frames in the cluster's Redis stream.
#[cfg(feature = "cluster")]
pub(super) struct Remote {
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
    pub(super) fn of(shared: &Shared, tenant: &Tenant, record: &RunRecord) -> Self {
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

    /// The next frames from index `next` on. An empty list when nothing came for a while
    /// (time for a heartbeat).
    async fn next(&mut self, next: usize) -> Next {
        match self {
            Self::Local(live) => loop {
                let (frames, ended) = live.log.since(next);
                if !frames.is_empty() {
                    return Next::Frames(frames);
                }
                if ended {
                    return Next::Ended;
                }
                let waited = tokio::time::timeout(Duration::from_secs(15), live.log.changed(next));
                if waited.await.is_err() {
                    return Next::Frames(Vec::new());
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
                if *finished {
                    return Next::Ended;
                }
                if runs.is_stopping() {
                    return Next::Stopping;
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
                        return Next::Stopping;
                    }
                    // Now and then: did the run end without frames (long ago, or before
                    // they were kept)? And a heartbeat every 15 s.
                    if polls.is_multiple_of(20) {
                        // A record that cannot be read says nothing: keep polling.
                        let ended = match records.run(&record.thread_id, &record.run_id).await {
                            Ok(now) => now.is_none_or(|now| now.ended()),
                            Err(error) => {
                                tracing::warn!(run_id = %record.run_id, %error, "cannot read the record of a streamed run");
                                false
                            }
                        };
                        if ended
                            && cluster
                                .read(&record.run_id, after)
                                .await
                                .is_ok_and(|e| e.is_empty())
                        {
                            return Next::Ended;
                        }
                    }
                    if polls == 300 {
                        return Next::Frames(Vec::new());
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                };
                let mut frames = Vec::new();
                for (id, index, frame) in entries {
                    *after = id;
                    match frame {
                        Some(frame) if index >= next => frames.push((index, frame)),
                        Some(_) => {}
                        None if frames.is_empty() => return Next::Ended,
                        // The frames before the end go out first; the end comes next time.
                        None => {
                            *finished = true;
                            break;
                        }
                    }
                }
                Next::Frames(frames)
            }
        }
    }
}

/// What a stream's source has next.
enum Next {
    /// Frames (none: nothing came for a while).
    Frames(Vec<(usize, crate::stream::Frame)>),
    /// The run ended and every frame was sent.
    Ended,
    /// This server is stopping while the run goes on elsewhere.
    #[cfg(feature = "cluster")]
    Stopping,
}

/// Cuts a stream short, so the client's SDK reconnects (to the `Location` the stream was
/// sent with, resuming after the last event id) instead of taking the stream's end for the
/// run's: a stream that ends cleanly tells it the run is over.
#[derive(Debug, thiserror::Error)]
#[error("this server is stopping while the run goes on; reconnect to continue the stream")]
pub(super) struct Reconnect;

/// A run's frames from `from` on as server-sent events, following it until it ends; only
/// the frames of `modes` when given.
pub(super) fn sse(
    source: Source,
    from: usize,
    modes: Option<BTreeSet<String>>,
    guard: CancelOnDrop,
) -> Response {
    let stream = futures::stream::unfold(
        (source, from, guard, false),
        move |(mut source, next, mut guard, told)| {
            let modes = modes.clone();
            async move {
                let frames = match source.next(next).await {
                    Next::Frames(frames) => frames,
                    Next::Ended => {
                        // The run ended on its own: nothing to cancel.
                        drop(guard.0.take());
                        return None;
                    }
                    #[cfg(feature = "cluster")]
                    Next::Stopping => {
                        // The run goes on elsewhere: the client reconnects, nothing to cancel.
                        drop(guard.0.take());
                        if told {
                            // A moment for the hint to be flushed: the connection is dropped
                            // with whatever is still buffered when the body fails.
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            return Some((Err(Reconnect), (source, next, guard, told)));
                        }
                        // Said first, for clients that read it (EventSource waits `retry` ms).
                        return Some((
                            Ok(Bytes::from_static(
                                b"retry: 1000\n: this server is stopping; reconnect to continue\n\n",
                            )),
                            (source, next, guard, true),
                        ));
                    }
                };
                let Some((last, _)) = frames.last() else {
                    // A comment now and then keeps proxies from closing a quiet stream.
                    return Some((
                        Ok::<_, Reconnect>(Bytes::from_static(b": heartbeat\n\n")),
                        (source, next, guard, told),
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
                Some((Ok(Bytes::from(text)), (source, after, guard, told)))
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
