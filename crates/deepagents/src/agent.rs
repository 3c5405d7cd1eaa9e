//! The built agent: a cheap handle for starting runs and opening threads.

use std::sync::Arc;

use deepagents_core::{Checkpointer, EventSink, Model, Run};

use crate::builder::AgentBuilder;
use crate::config::AgentConfig;
use crate::error::RunFailure;
use crate::run::{RunOptions, RunOutput};
use crate::stream::RunStream;
use crate::thread::{Thread, ThreadError};

/// A built agent: immutable, cheap to clone, safe to share between tasks and runs.
#[derive(Clone)]
pub struct Agent {
    pub(crate) inner: Arc<AgentConfig>,
}

impl Agent {
    /// Starts configuring an agent around `model`.
    pub fn builder(model: Arc<dyn Model>) -> AgentBuilder {
        AgentBuilder::new(model)
    }

    /// Starts configuring an agent around the model named by `spec` (`provider:model`).
    pub fn builder_from_spec(spec: &str) -> Result<AgentBuilder, deepagents_models::SpecError> {
        Ok(Self::builder(deepagents_models::from_spec(spec)?))
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The names of the middleware stack, in order.
    pub fn middleware_names(&self) -> Vec<String> {
        self.inner
            .middleware
            .iter()
            .map(|m| m.name().to_owned())
            .collect()
    }

    /// The tools offered to the model, in order.
    pub fn tool_specs(&self) -> &[deepagents_core::ToolSpec] {
        self.inner.tools.specs()
    }

    /// Runs `task` as a fresh conversation and returns the final answer.
    pub async fn invoke(&self, task: impl Into<String>) -> Result<RunOutput, RunFailure> {
        self.run(
            Run::from_task(task),
            RunOptions::default(),
            EventSink::discard(),
        )
        .await
    }

    /// Runs `task` as a fresh conversation, streaming events.
    pub fn stream(&self, task: impl Into<String>) -> RunStream {
        self.stream_run(Run::from_task(task), RunOptions::default())
    }

    /// Continues `run` (for example one loaded from a checkpoint, with new user input pushed)
    /// on a background task, streaming events.
    pub fn stream_run(&self, run: Run, options: RunOptions) -> RunStream {
        RunStream::spawn(self.clone(), run, options)
    }

    /// Continues `run` until it has a final answer or fails, sending events to `events`.
    pub async fn run(
        &self,
        run: Run,
        options: RunOptions,
        events: EventSink,
    ) -> Result<RunOutput, RunFailure> {
        crate::driver::drive(&self.inner, run, &options, &events).await
    }

    /// Like [`thread`](Self::thread), saved in `checkpointer` instead of the agent's own
    /// (which it need not have): a conversation kept elsewhere, such as in memory for a run
    /// that should leave nothing behind but still needs a thread (async subagents report to
    /// one).
    pub fn thread_in(
        &self,
        checkpointer: Arc<dyn Checkpointer>,
        thread_id: impl Into<String>,
    ) -> Result<Thread, ThreadError> {
        let id = thread_id.into();
        deepagents_core::validate_thread_id(&id).map_err(ThreadError::InvalidId)?;
        Ok(Thread::new(self.clone(), checkpointer, id))
    }

    /// The ids of threads whose background tasks end, one per ending, from now on; `None`
    /// when the agent has no async subagents. A front end that serves many threads (a server)
    /// listens here and wakes the thread: [`Input::Wake`](crate::Input::Wake). A receiver that falls behind
    /// loses the oldest ids (and is told so), so check the threads it may have missed.
    pub fn background_endings(&self) -> Option<tokio::sync::broadcast::Receiver<String>> {
        self.inner.background.as_ref().map(|b| b.subscribe())
    }

    /// The checkpointer threads are saved in ([`AgentBuilder::checkpointer`]).
    pub fn checkpointer(&self) -> Option<&Arc<dyn Checkpointer>> {
        self.inner.checkpointer.as_ref()
    }

    /// A handle on thread `thread_id` of the agent's checkpointer: a conversation that goes on
    /// across calls (and restarts), checkpointed after every step. Nothing is read until a
    /// method of the handle is called; an unknown thread starts empty. Fails with
    /// [`ThreadError::NoCheckpointer`] when the agent was built without
    /// [`AgentBuilder::checkpointer`].
    ///
    /// Thread ids are 1 to 128 letters, digits and `- _ . @ + : ~`
    /// ([`validate_thread_id`](crate::validate_thread_id)); others fail with
    /// [`ThreadError::InvalidId`].
    pub fn thread(&self, thread_id: impl Into<String>) -> Result<Thread, ThreadError> {
        let checkpointer = self
            .inner
            .checkpointer
            .clone()
            .ok_or(ThreadError::NoCheckpointer)?;
        let id = thread_id.into();
        deepagents_core::validate_thread_id(&id).map_err(ThreadError::InvalidId)?;
        Ok(Thread::new(self.clone(), checkpointer, id))
    }
}
