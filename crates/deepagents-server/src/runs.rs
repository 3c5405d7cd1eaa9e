//! Runs in this process: one at a time per thread, the others waiting their turn
//! (`multitask_strategy`), each driven on its own task with its frames kept for joiners.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deepagents::core::{Checkpointer, ContentBlock, Run, RunDelta};
use deepagents::{RunError, RunOptions, RunStream};
use futures::{FutureExt as _, StreamExt as _};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::error::{ApiError, ApiResult};
use crate::records::{Records, RunRecord};
use crate::stream::{FrameLog, Framer};
use crate::watch::StepWatch;
use crate::{Assistant, convert};

/// How long a finished run's frames stay for clients that join late.
const KEEP_FINISHED: Duration = Duration::from_secs(600);

/// The checkpointer's id of thread `thread_id` of `tenant`: tenants never share threads.
pub fn storage_id(tenant: &str, thread_id: &str) -> String {
    format!("{tenant}:{thread_id}")
}

/// The interrupt id of a pause: stable while the same actions wait.
pub fn interrupt_id(run: &Run) -> String {
    run.control
        .pending
        .first()
        .map_or_else(String::new, |action| {
            format!("interrupt-{}", action.call_id)
        })
}

/// Whether `event` begins what follows a saved step: the run's start or its next model call.
fn starts_turn(event: &deepagents::core::Event) -> bool {
    event.path.is_empty()
        && matches!(
            event.kind,
            deepagents::core::EventKind::RunStarted { .. }
                | deepagents::core::EventKind::ModelCallStarted { .. }
        )
}

/// A run this process knows: its record, its frames, how to stop it.
pub struct Live {
    /// The run's record, as last saved.
    pub record: Mutex<RunRecord>,
    /// Its frames.
    pub log: Arc<FrameLog>,
    /// Cancels it.
    pub cancel: CancellationToken,
    /// How it was cancelled: `interrupt` (keep what it did) or `rollback` (undo it).
    cancel_action: Mutex<Option<String>>,
    /// Why it failed, for `wait`.
    pub error: Mutex<Option<Value>>,
    /// The thread's values after the run's latest step, for `wait` (a stateless run's
    /// thread is gone once it ends).
    pub values: Mutex<Option<Value>>,
}

impl Live {
    /// A pending run.
    pub fn new(record: RunRecord) -> Arc<Self> {
        Arc::new(Self {
            record: Mutex::new(record),
            log: FrameLog::new(),
            cancel: CancellationToken::new(),
            cancel_action: Mutex::new(None),
            error: Mutex::new(None),
            values: Mutex::new(None),
        })
    }

    /// The record now.
    pub fn snapshot(&self) -> RunRecord {
        self.record
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops the run: `interrupt` keeps what it did, `rollback` undoes it.
    pub fn stop(&self, action: &str) {
        *self
            .cancel_action
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(action.to_owned());
        self.cancel.cancel();
    }

    fn keep_values(&self, run: &Run) {
        *self.values.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(convert::values(run, &interrupt_id(run)));
    }

    /// Waits until the run ended.
    pub async fn ended(&self) {
        loop {
            let (frames, ended) = self.log.since(usize::MAX);
            drop(frames);
            if ended {
                return;
            }
            self.log.changed(usize::MAX).await;
        }
    }
}

/// What a run does, besides its record.
pub struct Job {
    /// The tenant's records.
    pub records: Records,
    /// The assistant it runs.
    pub assistant: Arc<Assistant>,
    /// The user input to add.
    pub input: Option<Vec<ContentBlock>>,
    /// `command.resume`: the decisions for the pending actions.
    pub resume: Option<Value>,
    /// Stream modes to frame.
    pub modes: BTreeSet<String>,
    /// Whether subagents' events are framed (namespaced).
    pub subgraphs: bool,
    /// A stateless run's thread, deleted when the run ends.
    pub delete_thread_after: bool,
}

/// A thread's runs: the one running and those waiting.
#[derive(Default)]
struct Line {
    active: Option<Arc<Live>>,
    queue: VecDeque<(Arc<Live>, Job)>,
}

/// The runs of this process.
pub struct Runs {
    live: Mutex<HashMap<String, Arc<Live>>>,
    lines: Mutex<HashMap<String, Line>>,
    watch: Arc<StepWatch>,
}

impl Runs {
    /// No runs yet; steps come from `watch`.
    pub fn new(watch: Arc<StepWatch>) -> Arc<Self> {
        Arc::new(Self {
            live: Mutex::new(HashMap::new()),
            lines: Mutex::new(HashMap::new()),
            watch,
        })
    }

    /// Run `run_id`, while this process knows it.
    pub fn get(&self, run_id: &str) -> Option<Arc<Live>> {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(run_id)
            .cloned()
    }

    /// Runs running and runs waiting, in this process.
    pub fn counts(&self) -> (usize, usize) {
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let active = lines.values().filter(|line| line.active.is_some()).count();
        let queued = lines.values().map(|line| line.queue.len()).sum();
        (active, queued)
    }

    /// Whether thread `storage` has a run running or waiting.
    pub fn busy(&self, storage: &str) -> bool {
        self.lines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(storage)
            .is_some_and(|line| line.active.is_some() || !line.queue.is_empty())
    }

    /// Stops every run (the server is shutting down): running ones keep what they did,
    /// waiting ones never start; their threads can be continued by the next server.
    pub fn stop_all(&self) {
        let lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        for line in lines.values() {
            if let Some(active) = &line.active {
                active.stop("interrupt");
            }
            for (live, _) in &line.queue {
                live.cancel.cancel();
            }
        }
    }

    /// Waits until no run is going.
    pub async fn settled(&self) {
        loop {
            let active: Vec<Arc<Live>> = self
                .lines
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .filter_map(|line| line.active.clone())
                .collect();
            let Some(live) = active.into_iter().next() else {
                return;
            };
            live.ended().await;
            // The next one of its thread starts (cancelled) and ends at once.
            tokio::task::yield_now().await;
        }
    }

    /// Stops every run of thread `storage`, running or waiting (the thread is going away).
    pub fn stop_thread(&self, storage: &str) {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(line) = lines.get_mut(storage) {
            if let Some(active) = &line.active {
                active.stop("interrupt");
            }
            for (live, _) in line.queue.drain(..) {
                live.log.end();
            }
        }
    }

    /// Starts `live`, or queues it behind the thread's run as `strategy` says: `reject` (a
    /// 409), `enqueue`, `interrupt` or `rollback` (the running one is stopped first).
    pub fn submit(self: &Arc<Self>, live: Arc<Live>, job: Job, strategy: &str) -> ApiResult<()> {
        let record = live.snapshot();
        let storage = storage_id(job.records.tenant(), &record.thread_id);
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let line = lines.entry(storage.clone()).or_default();
        if line.active.is_some() || !line.queue.is_empty() {
            match strategy {
                "enqueue" => line.queue.push_back((live.clone(), job)),
                "interrupt" | "rollback" => {
                    if let Some(active) = &line.active {
                        active.stop(strategy);
                    }
                    line.queue.push_front((live.clone(), job));
                }
                _ => {
                    return Err(ApiError::conflict(format!(
                        "thread `{}` is busy with a run; wait for it, cancel it, or send multitask_strategy enqueue, interrupt or rollback",
                        record.thread_id
                    )));
                }
            }
        } else {
            line.active = Some(live.clone());
            tokio::spawn(Arc::clone(self).drive(storage, live.clone(), job));
        }
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(record.run_id, live);
        Ok(())
    }

    /// The thread's run ended: the next waiting one starts.
    fn next(self: &Arc<Self>, storage: &str) {
        let mut lines = self.lines.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(line) = lines.get_mut(storage) else {
            return;
        };
        line.active = None;
        match line.queue.pop_front() {
            Some((live, job)) => {
                line.active = Some(live.clone());
                tokio::spawn(Arc::clone(self).drive(storage.to_owned(), live, job));
            }
            None => {
                lines.remove(storage);
            }
        }
    }

    async fn drive(self: Arc<Self>, storage: String, live: Arc<Live>, job: Job) {
        if !live.cancel.is_cancelled() {
            self.execute(&storage, &live, &job).await;
        } else {
            self.settle(&live, &job, "interrupted", None).await;
        }
        // A stateless run's thread is gone before anyone waiting learns the run ended.
        if job.delete_thread_after {
            let thread_id = live.snapshot().thread_id;
            let _ = self.watch.delete_thread(&storage).await;
            let _ = job.records.delete_thread(&thread_id).await;
        }
        live.log.end();
        self.next(&storage);
        // Finished runs stay joinable for a while, then only their record remains.
        let runs = Arc::clone(&self);
        let run_id = live.snapshot().run_id;
        tokio::spawn(async move {
            tokio::time::sleep(KEEP_FINISHED).await;
            runs.live
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(&run_id);
        });
    }

    /// Saves the run's final status and its thread's.
    async fn settle(&self, live: &Live, job: &Job, status: &str, thread_status: Option<&str>) {
        let record = {
            let mut record = live.record.lock().unwrap_or_else(PoisonError::into_inner);
            record.status = status.to_owned();
            record.updated_at = crate::time::rfc3339(crate::time::now_ms());
            record.clone()
        };
        if let Err(error) = job.records.put_run(&record).await {
            tracing::warn!(run_id = %record.run_id, %error, "the run's status was not saved");
        }
        if let Some(thread_status) = thread_status {
            let _ = job
                .records
                .set_thread_status(&record.thread_id, thread_status)
                .await;
        }
    }

    async fn execute(&self, storage: &str, live: &Live, job: &Job) {
        let record = live.snapshot();
        let mut steps = self.watch.subscribe(storage);
        let before = self.watch.load(storage, None).await.ok().flatten();
        {
            let mut record = live.record.lock().unwrap_or_else(PoisonError::into_inner);
            record.status = "running".to_owned();
        }
        let _ = job.records.put_run(&live.snapshot()).await;
        let _ = job
            .records
            .set_thread_status(&record.thread_id, "busy")
            .await;
        let meta = json!({
            "run_id": record.run_id,
            "thread_id": record.thread_id,
            "assistant_id": record.assistant_id,
            "graph_id": job.assistant.graph_id,
        });
        live.log
            .push("metadata", &json!({"run_id": record.run_id, "attempt": 1}));
        let mut framer = Framer::new(
            live.log.clone(),
            job.modes.clone(),
            job.subgraphs,
            meta,
            before.as_ref(),
        );
        let outcome = match self.start(storage, live, job, before.as_ref()).await {
            Ok(mut stream) => {
                loop {
                    tokio::select! {
                        biased;
                        Some(step) = steps.steps.recv() => {
                            // The events of the step come before it: those already here up
                            // to the start of the next model call, which comes after it.
                            let mut next_turn = None;
                            while let Some(Some(event)) = stream.next().now_or_never() {
                                if starts_turn(&event) {
                                    next_turn = Some(event);
                                    break;
                                }
                                framer.event(&event);
                            }
                            framer.step(step.checkpoint, &step.run, &interrupt_id(&step.run));
                            live.keep_values(&step.run);
                            if let Some(event) = next_turn {
                                framer.event(&event);
                            }
                        }
                        event = stream.next() => match event {
                            Some(event) => framer.event(&event),
                            None => break,
                        },
                    }
                }
                while let Ok(step) = steps.steps.try_recv() {
                    framer.step(step.checkpoint, &step.run, &interrupt_id(&step.run));
                    live.keep_values(&step.run);
                }
                stream.outcome().await.map_err(|failure| failure.error)
            }
            Err(error) => Err(error),
        };
        drop(steps);
        let action = live
            .cancel_action
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        match outcome {
            Ok(output) => {
                let thread_status = if output.pending.is_empty() {
                    "idle"
                } else {
                    "interrupted"
                };
                self.settle(live, job, "success", Some(thread_status)).await;
            }
            Err(RunError::Cancelled) if action.as_deref() == Some("rollback") => {
                // Undone: the thread as it was before, and no record of the run.
                let restored = match &before {
                    Some(run) => self
                        .watch
                        .append(storage, &RunDelta::full(run), run)
                        .await
                        .map(drop),
                    None => self.watch.delete_thread(storage).await.map(drop),
                };
                if let Err(error) = restored {
                    tracing::warn!(%storage, %error, "a rolled-back run's changes stay");
                }
                let _ = job
                    .records
                    .delete_run(&record.thread_id, &record.run_id)
                    .await;
                let status = if before
                    .as_ref()
                    .is_some_and(|run| !run.control.pending.is_empty())
                {
                    "interrupted"
                } else {
                    "idle"
                };
                let _ = job
                    .records
                    .set_thread_status(&record.thread_id, status)
                    .await;
            }
            Err(RunError::Cancelled) => {
                self.settle(live, job, "interrupted", Some("idle")).await;
            }
            Err(error) => {
                let kind = serde_json::to_value(error.kind())
                    .ok()
                    .and_then(|kind| kind.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "error".to_owned());
                let message = error.to_string();
                framer.error(&kind, &message);
                *live.error.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some(json!({"error": kind, "message": message}));
                self.settle(live, job, "error", Some("error")).await;
            }
        }
    }

    /// Starts the run on its thread: the decisions of a resume, else the input, else a
    /// continuation of what the thread left unfinished.
    async fn start(
        &self,
        storage: &str,
        live: &Live,
        job: &Job,
        before: Option<&Run>,
    ) -> Result<RunStream, RunError> {
        let thread = job
            .assistant
            .agent
            .thread(storage)
            .map_err(|e| RunError::Crashed(e.to_string()))?
            .with_options(RunOptions {
                cancel: live.cancel.clone(),
                assistant_id: Some(job.assistant.graph_id.clone()),
                ..RunOptions::default()
            })
            // A run of this thread in another process (the CLI on the same database) ends
            // before this one starts, rather than failing it at once.
            .with_lease_wait(Duration::from_secs(30));
        match (&job.resume, &job.input) {
            (Some(resume), _) => {
                let pending = before
                    .map(|run| run.control.pending.clone())
                    .unwrap_or_default();
                if pending.is_empty() {
                    return Err(RunError::InvalidDecision(
                        "the thread waits for no decision; send input instead of command.resume"
                            .to_owned(),
                    ));
                }
                let decisions =
                    convert::decisions(resume, &pending).map_err(RunError::InvalidDecision)?;
                thread
                    .stream_decide(decisions)
                    .await
                    .map_err(|failure| failure.error)
            }
            (None, Some(content)) => thread
                .stream_content(content.clone())
                .await
                .map_err(RunError::Checkpoint),
            (None, None) => thread.stream_resume().await.map_err(RunError::Checkpoint),
        }
    }
}
