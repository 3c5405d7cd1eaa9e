//! A run on a background task, seen as a stream of events.

use std::pin::Pin;
use std::task::{Context, Poll};

use deepagents_core::{Event, Run};
use futures::Stream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::agent::Agent;
use crate::error::{RunError, RunFailure};
use crate::run::{RunOptions, RunOutput};
use deepagents_core::EventSink;

/// Events of a running agent. Poll it as a [`Stream`]; when it ends, call
/// [`outcome`](RunStream::outcome) for the result. Dropping it does not stop the run; use
/// [`cancel`](RunStream::cancel) for that.
pub struct RunStream {
    events: mpsc::UnboundedReceiver<Event>,
    task: JoinHandle<Result<RunOutput, RunFailure>>,
    cancel: CancellationToken,
}

impl RunStream {
    pub(crate) fn spawn(agent: Agent, run: Run, options: RunOptions) -> Self {
        let (sink, events) = EventSink::channel();
        let cancel = options.cancel.clone();
        let task = tokio::spawn(async move { agent.run(run, options, sink).await });
        Self {
            events,
            task,
            cancel,
        }
    }

    /// Asks the run to stop; it ends with [`RunError::Cancelled`].
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Waits for the run to end and returns its result. Events not yet read are dropped.
    pub async fn outcome(self) -> Result<RunOutput, RunFailure> {
        match self.task.await {
            Ok(result) => result,
            Err(join_error) => Err(RunFailure {
                error: RunError::Crashed(join_error.to_string()),
                run: Box::default(),
            }),
        }
    }
}

impl Stream for RunStream {
    type Item = Event;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.events.poll_recv(cx)
    }
}
