//! Seeing each step of a run as it is saved: a checkpointer that tells the server.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use deepagents::core::{
    CheckpointError, CheckpointInfo, Checkpointer, Event, EventKind, Run, RunDelta, ThreadInfo,
    ThreadLease,
};
use tokio::sync::mpsc;

/// A saved step: the checkpoint's id and the run as it stands after it.
#[derive(Debug)]
pub struct Step {
    /// The checkpoint's id within the thread.
    pub checkpoint: u64,
    /// The run after the step.
    pub run: Run,
}

/// Wraps the agents' checkpointer so the server learns of every step a run saves (its
/// `values` and `updates` stream modes), without reading the database back. Give it to
/// every agent the server runs ([`AgentBuilder::checkpointer`](deepagents::AgentBuilder::checkpointer)).
pub struct StepWatch {
    inner: Arc<dyn Checkpointer>,
    listeners: Mutex<HashMap<String, mpsc::UnboundedSender<Step>>>,
}

/// Steps of one thread, until dropped.
pub struct Subscription {
    watch: Arc<StepWatch>,
    thread_id: String,
    /// The steps, in order.
    pub steps: mpsc::UnboundedReceiver<Step>,
}

impl Subscription {
    /// The saved steps to frame before `event`, an event of the run saving them: when it is
    /// the run's `Checkpointed`, the steps up to that checkpoint. The events and the steps
    /// come through two channels; the announcement, sent after its step, is what puts each
    /// step right after its events however far behind the reader is. (A run's own saves
    /// start with its input, so steps saved before the run are older still and come first.)
    pub fn steps_before(&mut self, event: &Event) -> Vec<Step> {
        let EventKind::Checkpointed { checkpoint } = event.kind else {
            return Vec::new();
        };
        if !event.path.is_empty() {
            return Vec::new();
        }
        let mut steps = Vec::new();
        while let Ok(step) = self.steps.try_recv() {
            let last = step.checkpoint == checkpoint;
            steps.push(step);
            if last {
                break;
            }
        }
        steps
    }

    /// The steps saved and not taken yet: what is left once the run's events have ended.
    pub fn remaining(&mut self) -> Vec<Step> {
        std::iter::from_fn(|| self.steps.try_recv().ok()).collect()
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.watch
            .listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.thread_id);
    }
}

impl StepWatch {
    /// `inner`, watched.
    pub fn new(inner: Arc<dyn Checkpointer>) -> Arc<Self> {
        Arc::new(Self {
            inner,
            listeners: Mutex::new(HashMap::new()),
        })
    }

    /// The steps thread `thread_id` saves from now on (one listener per thread: a run holds
    /// the thread's lease, so there is one writer).
    pub fn subscribe(self: &Arc<Self>, thread_id: &str) -> Subscription {
        let (tx, steps) = mpsc::unbounded_channel();
        self.listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(thread_id.to_owned(), tx);
        Subscription {
            watch: Arc::clone(self),
            thread_id: thread_id.to_owned(),
            steps,
        }
    }

    fn tell(&self, thread_id: &str, checkpoint: u64, run: &Run) {
        let listeners = self
            .listeners
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(listener) = listeners.get(thread_id) {
            let _ = listener.send(Step {
                checkpoint,
                run: run.clone(),
            });
        }
    }
}

#[async_trait]
impl Checkpointer for StepWatch {
    async fn append(
        &self,
        thread_id: &str,
        delta: &RunDelta,
        run: &Run,
    ) -> Result<u64, CheckpointError> {
        let id = self.inner.append(thread_id, delta, run).await?;
        self.tell(thread_id, id, run);
        Ok(id)
    }

    async fn load(&self, thread_id: &str, at: Option<u64>) -> Result<Option<Run>, CheckpointError> {
        self.inner.load(thread_id, at).await
    }

    async fn checkpoints(&self, thread_id: &str) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        self.inner.checkpoints(thread_id).await
    }

    async fn threads(&self) -> Result<Vec<ThreadInfo>, CheckpointError> {
        self.inner.threads().await
    }

    async fn try_lease(&self, thread_id: &str) -> Result<ThreadLease, CheckpointError> {
        self.inner.try_lease(thread_id).await
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        self.inner.delete_thread(thread_id).await
    }

    async fn create(&self, thread_id: &str, run: &Run) -> Result<u64, CheckpointError> {
        let id = self.inner.create(thread_id, run).await?;
        self.tell(thread_id, id, run);
        Ok(id)
    }
}
