//! Runs: one at a time per thread, the others waiting their turn (`multitask_strategy`),
//! each driven on its own task with its frames kept for joiners. Embedded, the queue is in
//! this process; in a cluster it is the shared one of [`crate::cluster`], and any server
//! may drive a run another one accepted.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deepagents::backends::Store;
use deepagents::core::{Checkpointer, ContentBlock, Run, RunDelta};
use deepagents::{RunError, RunOptions, RunStream};
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::Assistant;
use crate::error::{ApiError, ApiResult};
use crate::lock;
use crate::records::{Records, RunRecord};
use crate::stream::FrameLog;
use deepagents_langgraph::Framer;
use deepagents_langgraph::StepWatch;
use deepagents_langgraph::convert;

/// How long a finished run's frames stay for clients that join late.
const KEEP_FINISHED: Duration = Duration::from_secs(600);

/// The checkpointer's id of thread `thread_id` of `tenant`: tenants never share threads.
pub fn storage_id(tenant: &str, thread_id: &str) -> String {
    format!("{tenant}:{thread_id}")
}

/// A run this process drives (or drove): its record, its frames, how to stop it.
pub struct Live {
    /// The run's record, as last saved.
    pub record: Mutex<RunRecord>,
    /// Its frames.
    pub log: Arc<FrameLog>,
    /// Cancels it.
    pub cancel: CancellationToken,
    /// How it was cancelled: `interrupt` (keep what it did) or `rollback` (undo it).
    cancel_action: Mutex<Option<String>>,
    /// The run after its latest step, once it ended, with how the thread names messages:
    /// its values are what a `wait` (and the run's webhook) is answered with without
    /// reading the thread back, and what a stateless run's record keeps.
    last: Mutex<Option<(Run, convert::MessageIds)>>,
    /// Stopped to be handed to another server (this one is shutting down): not settled.
    handed_back: std::sync::atomic::AtomicBool,
}

impl Live {
    fn new(record: RunRecord, log: Arc<FrameLog>) -> Arc<Self> {
        Arc::new(Self {
            record: Mutex::new(record),
            log,
            cancel: CancellationToken::new(),
            cancel_action: Mutex::new(None),
            last: Mutex::new(None),
            handed_back: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Stops the run so another server continues it.
    #[cfg(feature = "cluster")]
    fn hand_back(&self) {
        self.handed_back
            .store(true, std::sync::atomic::Ordering::Release);
        self.cancel.cancel();
    }

    fn is_handed_back(&self) -> bool {
        self.handed_back.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A run that ended, with its frames.
    pub fn ended_with(record: RunRecord, log: Arc<FrameLog>) -> Arc<Self> {
        Self::new(record, log)
    }

    /// The record now.
    pub fn snapshot(&self) -> RunRecord {
        lock(&self.record).clone()
    }

    /// Stops the run: `interrupt` keeps what it did, `rollback` undoes it.
    pub fn stop(&self, action: &str) {
        *lock(&self.cancel_action) = Some(action.to_owned());
        self.cancel.cancel();
    }

    /// Waits until the run ended.
    pub async fn ended(&self) {
        while !self.log.has_ended() {
            self.log.changed(usize::MAX).await;
        }
    }

    /// What `wait` answers for the run, known here without reading the database: the
    /// error of a run that failed, else the values after its latest step. `None` while it
    /// runs, when it was handed back or rolled back (its record says), or made no step.
    pub fn outcome(&self) -> Option<Value> {
        let record = self.snapshot();
        if !record.ended() || self.is_handed_back() {
            return None;
        }
        match record.error {
            Some(error) => Some(json!({"__error__": error})),
            None => self.final_values(),
        }
    }

    /// The thread's values after the run's latest step, if it made one.
    fn final_values(&self) -> Option<Value> {
        lock(&self.last)
            .as_ref()
            .map(|(run, ids)| convert::values_named(run, &convert::interrupt_id(run), ids))
    }
}

/// How to run a run: what its payload asked, as it waits in a queue.
#[derive(Clone, Serialize, Deserialize)]
pub struct Job {
    /// The tenant the run belongs to.
    pub tenant: String,
    /// The assistant's graph id.
    pub graph_id: String,
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
    /// The run's `context`: application data its tools and middleware read as the run's
    /// [`RuntimeContext`](deepagents::RuntimeContext), a JSON [`Value`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<Value>,
    /// The run's record when it was created.
    pub record: RunRecord,
}

/// A thread's runs in this process: the one running and those waiting.
#[derive(Default)]
struct Line {
    active: Option<Arc<Live>>,
    queue: VecDeque<(Arc<Live>, Job)>,
}

/// The runs of this server.
pub struct Runs {
    live: Mutex<HashMap<String, Arc<Live>>>,
    lines: Mutex<HashMap<String, Line>>,
    watch: Arc<StepWatch>,
    store: Arc<dyn Store>,
    assistants: Vec<Arc<Assistant>>,
    /// What `/metrics` reports.
    pub metrics: crate::metrics::Metrics,
    #[cfg(feature = "cluster")]
    cluster: Option<Arc<crate::cluster::Cluster>>,
    /// Wakes the cluster dispatcher when this server queued a run.
    #[cfg(feature = "cluster")]
    queued: tokio::sync::Notify,
    /// The runs this server may drive at once, when the cluster limits them (`--jobs`).
    #[cfg(feature = "cluster")]
    slots: Option<Arc<tokio::sync::Semaphore>>,
    /// The server is shutting down: it claims no more runs.
    stopping: std::sync::atomic::AtomicBool,
    /// Each thread's runs as events of the thread-centric protocol.
    pub protocol: crate::protocol::Tapes,
    /// Where runs that named a `webhook` are reported when they end.
    webhooks: std::sync::OnceLock<Arc<crate::webhooks::Webhooks>>,
    /// Where runs' traces are exported, when anywhere.
    #[cfg(feature = "otel")]
    tracer: std::sync::OnceLock<Arc<crate::otel::Tracer>>,
}

impl Runs {
    /// No runs yet; steps come from `watch`.
    pub fn new(
        watch: Arc<StepWatch>,
        store: Arc<dyn Store>,
        assistants: Vec<Arc<Assistant>>,
    ) -> Arc<Self> {
        Self::with(
            watch,
            store,
            assistants,
            #[cfg(feature = "cluster")]
            None,
        )
    }

    fn with(
        watch: Arc<StepWatch>,
        store: Arc<dyn Store>,
        assistants: Vec<Arc<Assistant>>,
        #[cfg(feature = "cluster")] cluster: Option<Arc<crate::cluster::Cluster>>,
    ) -> Arc<Self> {
        #[cfg(feature = "cluster")]
        let slots = cluster
            .as_ref()
            .and_then(|cluster| cluster.jobs())
            .map(|jobs| Arc::new(tokio::sync::Semaphore::new(jobs)));
        Arc::new(Self {
            live: Mutex::new(HashMap::new()),
            lines: Mutex::new(HashMap::new()),
            watch,
            store,
            assistants,
            metrics: crate::metrics::Metrics::default(),
            #[cfg(feature = "cluster")]
            cluster,
            #[cfg(feature = "cluster")]
            queued: tokio::sync::Notify::new(),
            #[cfg(feature = "cluster")]
            slots,
            stopping: std::sync::atomic::AtomicBool::new(false),
            protocol: crate::protocol::Tapes::default(),
            webhooks: std::sync::OnceLock::new(),
            #[cfg(feature = "otel")]
            tracer: std::sync::OnceLock::new(),
        })
    }

    /// Sets the server's webhooks (once, as the server is set up).
    pub(crate) fn set_webhooks(&self, webhooks: Arc<crate::webhooks::Webhooks>) {
        let _ = self.webhooks.set(webhooks);
    }

    /// Sets where runs' traces go (once, as the server is set up).
    #[cfg(feature = "otel")]
    pub(crate) fn set_tracer(&self, tracer: Arc<crate::otel::Tracer>) {
        let _ = self.tracer.set(tracer);
    }

    /// Where runs' traces go, when anywhere.
    #[cfg(feature = "otel")]
    pub(crate) fn tracer(&self) -> Option<&Arc<crate::otel::Tracer>> {
        self.tracer.get()
    }

    /// The server's webhooks.
    pub(crate) fn webhooks(&self) -> Option<&Arc<crate::webhooks::Webhooks>> {
        self.webhooks.get()
    }

    /// Sends a run that ended to the webhook it named, with the thread's final values
    /// (a stateless run's are in its record). A run rolled back left no record: nothing.
    async fn report(&self, storage: &str, live: &Live, records: &Records) {
        let record = live.snapshot();
        let Some(webhooks) = self.webhooks.get() else {
            return;
        };
        if !record.ended() || crate::webhooks::url_of(&record).is_none() {
            return;
        }
        let known = record
            .values
            .is_none()
            .then(|| live.final_values())
            .flatten();
        let values = match &record.values {
            Some(_) => None,
            None if known.is_some() => known,
            None => match self.watch.load(storage, None).await {
                Ok(Some(run)) => {
                    let thread = records.thread(&record.thread_id).await;
                    let ids = self.message_ids(thread, storage).await;
                    Some(convert::values_named(
                        &run,
                        &convert::interrupt_id(&run),
                        &ids,
                    ))
                }
                Ok(None) => None,
                Err(error) => {
                    tracing::warn!(%error, "the webhook goes without the thread's values");
                    None
                }
            },
        };
        webhooks.deliver(&record, values);
    }

    /// Runs whose queue is `cluster`'s, driven by whichever server claims them.
    #[cfg(feature = "cluster")]
    pub fn clustered(
        watch: Arc<StepWatch>,
        store: Arc<dyn Store>,
        assistants: Vec<Arc<Assistant>>,
        cluster: Arc<crate::cluster::Cluster>,
    ) -> Arc<Self> {
        tokio::spawn({
            let cluster = Arc::clone(&cluster);
            async move { cluster.keep_alive().await }
        });
        let runs = Self::with(watch, store, assistants, Some(Arc::clone(&cluster)));
        runs.protocol.share(cluster);
        tokio::spawn(Arc::clone(&runs).dispatch());
        runs
    }

    /// The cluster, when there is one.
    #[cfg(feature = "cluster")]
    pub fn cluster(&self) -> Option<&Arc<crate::cluster::Cluster>> {
        self.cluster.as_ref()
    }

    /// Whether the server is shutting down.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether this server is stopping and handing its runs to the rest of its cluster:
    /// its streams and waits end so their clients reconnect elsewhere.
    pub fn hands_runs_back(&self) -> bool {
        #[cfg(feature = "cluster")]
        if self.cluster.is_some() {
            return self.is_stopping();
        }
        false
    }

    /// Run `run_id`, while this process knows it.
    pub fn get(&self, run_id: &str) -> Option<Arc<Live>> {
        lock(&self.live).get(run_id).cloned()
    }

    /// Runs running and runs waiting: in the cluster, or in this process.
    pub async fn counts(&self) -> (usize, usize) {
        #[cfg(feature = "cluster")]
        if let Some(cluster) = &self.cluster
            && let Ok((pending, running)) = cluster.depth().await
        {
            return (running as usize, pending as usize);
        }
        let lines = lock(&self.lines);
        let active = lines.values().filter(|line| line.active.is_some()).count();
        let queued = lines.values().map(|line| line.queue.len()).sum();
        (active, queued)
    }

    /// Whether thread `thread_id` of `tenant` has a run running or waiting.
    pub async fn busy(&self, tenant: &str, thread_id: &str) -> ApiResult<bool> {
        #[cfg(feature = "cluster")]
        if let Some(cluster) = &self.cluster {
            return cluster
                .thread_busy(tenant, thread_id)
                .await
                .map_err(ApiError::internal);
        }
        Ok(lock(&self.lines)
            .get(&storage_id(tenant, thread_id))
            .is_some_and(|line| line.active.is_some() || !line.queue.is_empty()))
    }

    /// Stops every run of a thread, running or waiting (the thread is going away).
    pub async fn stop_thread(&self, tenant: &str, thread_id: &str) -> ApiResult<()> {
        self.protocol.clear(&storage_id(tenant, thread_id));
        #[cfg(feature = "cluster")]
        if let Some(cluster) = &self.cluster {
            return cluster
                .cancel_thread(tenant, thread_id, "interrupt")
                .await
                .map_err(ApiError::internal);
        }
        let mut lines = lock(&self.lines);
        if let Some(line) = lines.get_mut(&storage_id(tenant, thread_id)) {
            if let Some(active) = &line.active {
                active.stop("interrupt");
            }
            for (live, _) in line.queue.drain(..) {
                live.log.end();
            }
        }
        Ok(())
    }

    /// Asks run `record` to stop, wherever it runs; whether anything was running it.
    pub async fn cancel(&self, record: &RunRecord, action: &str) -> ApiResult<bool> {
        if let Some(live) = self.get(&record.run_id) {
            live.stop(action);
        }
        #[cfg(feature = "cluster")]
        if let Some(cluster) = &self.cluster {
            return cluster
                .cancel(&record.run_id, action)
                .await
                .map_err(ApiError::internal);
        }
        Ok(self.get(&record.run_id).is_some())
    }

    /// Stops every run (the server is shutting down): embedded, running ones keep what they
    /// did and waiting ones never start (their threads can be continued later); in a
    /// cluster, each is handed back to the queue for another server to continue.
    pub fn stop_all(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Release);
        self.protocol.close();
        #[cfg(feature = "cluster")]
        if self.cluster.is_some() {
            for live in lock(&self.live).values() {
                if !live.log.has_ended() {
                    live.hand_back();
                }
            }
            return;
        }
        let lines = lock(&self.lines);
        for line in lines.values() {
            if let Some(active) = &line.active {
                active.stop("interrupt");
            }
            for (live, _) in &line.queue {
                live.cancel.cancel();
            }
        }
    }

    /// Waits until no run is going in this process.
    pub async fn settled(&self) {
        loop {
            let going = lock(&self.live)
                .values()
                .find(|live| !live.log.has_ended())
                .cloned();
            let Some(live) = going else {
                return;
            };
            live.ended().await;
            tokio::task::yield_now().await;
        }
    }

    /// Checks `command.resume` against thread `storage` as it stands now
    /// ([`convert::resume`]): a 409 when it names an interrupt that is not pending (the
    /// client's view is stale: the detail says what is pending now), a 422 when its
    /// decisions cannot be used.
    pub async fn check_resume(&self, storage: &str, resume: &Value) -> ApiResult<()> {
        let current = self.watch.load(storage, None).await?;
        convert::resume(resume, current.as_ref())
            .map(drop)
            .map_err(resume_error)
    }

    /// Starts a new run, or queues it behind its thread's as `strategy` says: `reject` (a
    /// 409), `enqueue`, `interrupt` or `rollback` (the running one is stopped first). A
    /// resume that names an interrupt never waits behind another run, whatever the
    /// strategy (that run may answer the interrupt first): it starts on a thread at rest,
    /// checked against it once no other run can start, or is refused with a 409.
    ///
    /// The run's record is saved here: a refused run leaves none, and in a cluster the run is
    /// taken in before its record is saved and admitted after, so a server stopping between
    /// the two loses nothing (see [`Cluster::enqueue`](crate::cluster::Cluster::enqueue)).
    pub async fn submit(self: &Arc<Self>, job: Job, strategy: &str) -> ApiResult<()> {
        let record = job.record.clone();
        let tenant = job.tenant.clone();
        let records = self.records(&tenant);
        let busy_error = || {
            ApiError::conflict(format!(
                "thread `{}` is busy with a run; wait for it, cancel it, or send multitask_strategy enqueue, interrupt or rollback",
                record.thread_id
            ))
        };
        let named = job.resume.as_ref().and_then(convert::resume_interrupt);
        let named_busy = |interrupt: &str| busy_before_resume(&record.thread_id, interrupt);
        let storage = storage_id(&tenant, &record.thread_id);
        #[cfg(feature = "cluster")]
        if let Some(cluster) = &self.cluster {
            if let (Some(interrupt), Some(resume)) = (&named, &job.resume) {
                // Checked and queued under the thread's lock in the queue: of two such
                // resumes, on any servers, the second finds the first queued.
                let queued = serde_json::to_value(&job).map_err(ApiError::internal)?;
                let outcome = cluster
                    .enqueue_alone(
                        &record.run_id,
                        &tenant,
                        &record.thread_id,
                        &queued,
                        self.check_resume(&storage, resume),
                    )
                    .await
                    .map_err(ApiError::internal)?;
                return match outcome {
                    crate::cluster::Alone::Queued => self.admit(cluster, &records, &record).await,
                    crate::cluster::Alone::Busy => Err(named_busy(interrupt)),
                    crate::cluster::Alone::Refused(error) => Err(error),
                };
            }
            // Checked in the statement that queues it: a busy thread refuses the run there.
            let only_if_idle = match strategy {
                "enqueue" => false,
                "interrupt" | "rollback" => {
                    cluster
                        .cancel_thread(&tenant, &record.thread_id, strategy)
                        .await
                        .map_err(ApiError::internal)?;
                    false
                }
                _ => true,
            };
            let job = serde_json::to_value(&job).map_err(ApiError::internal)?;
            let queued = cluster
                .enqueue(
                    &record.run_id,
                    &tenant,
                    &record.thread_id,
                    &job,
                    only_if_idle,
                )
                .await
                .map_err(ApiError::internal)?;
            if !queued {
                return Err(busy_error());
            }
            return self.admit(cluster, &records, &record).await;
        }
        // Saved before the run can start, which saves it again as it goes; removed when the
        // run is refused.
        records.put_run(&record).await?;
        let live = Live::new(record.clone(), FrameLog::new());
        let placed = {
            let mut lines = lock(&self.lines);
            let line = lines.entry(storage.clone()).or_default();
            if line.active.is_some() || !line.queue.is_empty() {
                match (&named, strategy) {
                    (Some(interrupt), _) => Err(named_busy(interrupt)),
                    (None, "enqueue") => {
                        line.queue.push_back((live.clone(), job));
                        Ok(None)
                    }
                    (None, "interrupt" | "rollback") => {
                        if let Some(active) = &line.active {
                            active.stop(strategy);
                        }
                        line.queue.push_front((live.clone(), job));
                        Ok(None)
                    }
                    (None, _) => Err(busy_error()),
                }
            } else {
                // The thread is this run's now: no other run of it starts here until it ends.
                line.active = Some(live.clone());
                Ok(Some(job))
            }
        };
        let to_start = match placed {
            Ok(to_start) => to_start,
            Err(error) => return Err(self.refused(&records, &record, error).await),
        };
        if let Some(job) = to_start {
            // So the resume is checked against the thread it will start from: of two
            // resumes of one interrupt, the second sees the first's run, or what it left.
            if let Some(resume) = &job.resume
                && let Err(error) = self.check_resume(&storage, resume).await
            {
                self.next(&storage);
                return Err(self.refused(&records, &record, error).await);
            }
            tokio::spawn(
                Arc::clone(self)
                    .drive(storage, live.clone(), job, 1)
                    .in_current_span(),
            );
        }
        lock(&self.live).insert(record.run_id, live);
        Ok(())
    }

    /// Removes the record of a run refused after it was saved; `error` says why.
    async fn refused(&self, records: &Records, record: &RunRecord, error: ApiError) -> ApiError {
        if let Err(cleanup) = records.delete_run(&record.thread_id, &record.run_id).await {
            tracing::warn!(run_id = %record.run_id, %cleanup, "cannot delete the record of a run that was refused");
        }
        error
    }

    /// Saves the record of a run taken in by the cluster's queue, then admits it: with room
    /// here, as this server's run at once (no other server is woken for it, and a `wait`
    /// sent here is answered from the run itself), else to the queue for any server to claim.
    /// A record that cannot be saved takes the run out of the queue again.
    #[cfg(feature = "cluster")]
    async fn admit(
        self: &Arc<Self>,
        cluster: &Arc<crate::cluster::Cluster>,
        records: &Records,
        record: &RunRecord,
    ) -> ApiResult<()> {
        if let Err(error) = records.put_run(record).await {
            if let Err(cleanup) = cluster.finish(&record.run_id).await {
                tracing::warn!(run_id = %record.run_id, %cleanup, "a run without a record stays queued until its intake lease runs out");
            }
            return Err(error);
        }
        if let Some(slot) = self.room_here(cluster) {
            match cluster.admit_here(&record.run_id).await {
                Ok(Some(claimed)) => {
                    if let Some(registered) = self.register_claimed(cluster, claimed).await {
                        let (runs, cluster) = (Arc::clone(self), Arc::clone(cluster));
                        tokio::spawn(async move {
                            runs.drive_registered(cluster, registered).await;
                            drop(slot);
                        });
                    }
                    return Ok(());
                }
                // An older run of its thread goes first: the queue orders them.
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(run_id = %record.run_id, %error, "cannot run it here; queueing it")
                }
            }
        }
        match cluster.admit(&record.run_id).await {
            Ok(true) => {
                self.queued.notify_one();
                Ok(())
            }
            Ok(false) => Err(self
                .refused(
                    records,
                    record,
                    ApiError::unavailable(
                        "the run was dropped from the queue before it was recorded (this server was too slow to take it in); send it again",
                    ),
                )
                .await),
            // Recorded and queued: once the intake's lease runs out, a server claims it.
            Err(error) => {
                tracing::warn!(run_id = %record.run_id, %error, "a run taken in starts once its intake lease runs out");
                Ok(())
            }
        }
    }

    fn records(&self, tenant: &str) -> Records {
        Records::new(Arc::clone(&self.store), tenant)
    }

    fn assistant(&self, graph_id: &str) -> Option<Arc<Assistant>> {
        self.assistants
            .iter()
            .find(|a| a.graph_id == graph_id)
            .cloned()
    }

    /// The thread's run ended: the next waiting one starts.
    fn next(self: &Arc<Self>, storage: &str) {
        let mut lines = lock(&self.lines);
        let Some(line) = lines.get_mut(storage) else {
            return;
        };
        line.active = None;
        match line.queue.pop_front() {
            Some((live, job)) => {
                line.active = Some(live.clone());
                tokio::spawn(Arc::clone(self).drive(storage.to_owned(), live, job, 1));
            }
            None => {
                lines.remove(storage);
            }
        }
    }

    async fn drive(self: Arc<Self>, storage: String, live: Arc<Live>, job: Job, attempt: i32) {
        let span = tracing::info_span!("run", run_id = %job.record.run_id, thread_id = %job.record.thread_id, tenant = %job.tenant, attempt);
        self.drive_in(storage, live, job, attempt)
            .instrument(span)
            .await;
    }

    async fn drive_in(self: Arc<Self>, storage: String, live: Arc<Live>, job: Job, attempt: i32) {
        let records = self.records(&job.tenant);
        let stateless = job.delete_thread_after;
        match self.assistant(&job.graph_id) {
            Some(assistant) if !live.cancel.is_cancelled() => {
                self.execute(&storage, &live, &job, &records, &assistant, attempt)
                    .await;
            }
            Some(_) => {
                self.settle(&live, &records, "interrupted", Some("idle"), stateless)
                    .await
            }
            None => {
                let error = json!({"error": "assistant", "message": format!("this server has no assistant `{}`", job.graph_id)});
                lock(&live.record).error = Some(error);
                self.settle(&live, &records, "error", Some("error"), stateless)
                    .await;
            }
        }
        // Handed back: whoever hands it back ends it here once the queue has it again.
        if live.is_handed_back() {
            return;
        }
        self.report(&storage, &live, &records).await;
        // A stateless run's thread is gone before anyone waiting learns the run ended; its
        // record keeps the final values.
        if job.delete_thread_after {
            let thread_id = live.snapshot().thread_id;
            let _ = self.watch.delete_thread(&storage).await;
            let _ = records.delete_thread(&thread_id, true).await;
        }
        // The thread is free (or its next run started) before anyone waiting learns the run
        // ended: a client that follows a `wait` with the next request finds it at rest.
        self.next(&storage);
        live.log.end();
        // Finished runs stay joinable for a while, then only their record remains.
        let runs = Arc::clone(&self);
        let run_id = live.snapshot().run_id;
        tokio::spawn(async move {
            tokio::time::sleep(KEEP_FINISHED).await;
            lock(&runs.live).remove(&run_id);
        });
    }

    /// Saves the run's final status, and its thread's.
    async fn settle(
        &self,
        live: &Live,
        records: &Records,
        status: &str,
        thread_status: Option<&str>,
        stateless: bool,
    ) {
        let record = {
            let mut record = lock(&live.record);
            record.status = status.to_owned();
            record.updated_at = crate::time::rfc3339(crate::time::now_ms());
            if stateless {
                record.values = live.final_values();
            }
            record.clone()
        };
        self.metrics.finished(status);
        tracing::info!(%status, "run ended");
        if let Err(error) = records.put_run(&record).await {
            tracing::warn!(run_id = %record.run_id, %error, "the run's status was not saved");
        }
        if let Some(thread_status) = thread_status {
            let _ = records
                .set_thread_status(&record.thread_id, thread_status)
                .await;
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn execute(
        &self,
        storage: &str,
        live: &Live,
        job: &Job,
        records: &Records,
        assistant: &Assistant,
        attempt: i32,
    ) {
        let record = live.snapshot();
        let mut steps = self.watch.subscribe(storage);
        // The thread as the run starts from it, loaded under its lease: what a rollback
        // restores. A thread that cannot be read fails the run; taken as empty, a rollback
        // would delete it.
        let opened = self.open(storage, live, job, assistant).await;
        let before = match &opened {
            Ok(open) => open.state().cloned(),
            Err(failure) => {
                tracing::warn!(%storage, error = %failure.error, "cannot open the thread for its run; the run fails");
                None
            }
        };
        {
            let mut record = lock(&live.record);
            record.status = "running".to_owned();
        }
        let _ = records.put_run(&live.snapshot()).await;
        let thread = records.set_thread_status(&record.thread_id, "busy").await;
        let meta = json!({
            "run_id": record.run_id,
            "thread_id": record.thread_id,
            "assistant_id": record.assistant_id,
            "graph_id": assistant.graph_id,
        });
        live.log.push(
            "metadata",
            &json!({"run_id": record.run_id, "attempt": attempt}),
        );
        let ids = self.message_ids(thread, storage).await;
        let mut framer = Framer::new(
            live.log.clone(),
            job.modes.clone(),
            job.subgraphs,
            meta,
            before.as_ref(),
        )
        .with_ids(ids.clone());
        // The run after its latest step: its values are what `wait` answers.
        let mut last = None;
        let tape = self.protocol.tape(storage);
        // In a cluster the thread's events are numbered across servers: this run's follow
        // the latest, wherever the run before it ran.
        #[cfg(feature = "cluster")]
        if let Some(cluster) = self.protocol.shared() {
            match cluster.last_event_seq(storage).await {
                Ok(Some(seq)) => tape.continue_after(seq),
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(%error, "cannot read the thread's shared events; numbering on")
                }
            }
        }
        let mut protocol = crate::protocol::RunTape::start(
            Arc::clone(&tape),
            &record.run_id,
            &assistant.graph_id,
            before.as_ref(),
            job.resume.as_ref(),
        )
        .with_ids(ids.clone())
        .with_input(record.kwargs.get("input"));
        let mut clock = crate::metrics::CallClock::default();
        // The run's spans, made from its events.
        #[cfg(feature = "otel")]
        let mut trace = self.tracer.get().map(|tracer| {
            tracer.run(vec![
                ("deepagents.run_id".to_owned(), record.run_id.clone().into()),
                (
                    "deepagents.thread_id".to_owned(),
                    record.thread_id.clone().into(),
                ),
                (
                    "gen_ai.conversation.id".to_owned(),
                    record.thread_id.clone().into(),
                ),
                (
                    "deepagents.assistant_id".to_owned(),
                    record.assistant_id.clone().into(),
                ),
                (
                    "deepagents.graph_id".to_owned(),
                    assistant.graph_id.clone().into(),
                ),
                (
                    "gen_ai.agent.name".to_owned(),
                    assistant.graph_id.clone().into(),
                ),
                ("gen_ai.operation.name".to_owned(), "invoke_agent".into()),
                ("deepagents.tenant".to_owned(), job.tenant.clone().into()),
                ("deepagents.attempt".to_owned(), i64::from(attempt).into()),
            ])
        });
        // A resume refused before anything ran leaves the thread as it was.
        let mut refused = false;
        let started = match opened {
            Ok(open) => Self::start(open, job, before.as_ref()),
            Err(failure) => Err(failure.error),
        };
        let outcome = match started {
            Ok(mut stream) => {
                while let Some(event) = stream.next().await {
                    self.metrics.observe(&event, &mut clock);
                    for step in steps.steps_before(&event) {
                        Self::frame(&mut framer, &mut protocol, &ids, &step);
                        last = Some(step.run);
                    }
                    #[cfg(feature = "otel")]
                    if let Some(trace) = &mut trace {
                        trace.event(&event);
                    }
                    framer.event(&event);
                    protocol.event(&event);
                }
                for step in steps.remaining() {
                    Self::frame(&mut framer, &mut protocol, &ids, &step);
                    last = Some(step.run);
                }
                stream.outcome().await.map_err(|failure| failure.error)
            }
            Err(error) => {
                refused = matches!(
                    error,
                    RunError::InvalidDecision(_) | RunError::StalePause { .. }
                );
                Err(error)
            }
        };
        drop(steps);
        *lock(&live.last) = last.map(|run| (run, ids));
        if live.is_handed_back() {
            tracing::info!("run handed back to the queue");
            #[cfg(feature = "otel")]
            if let Some(trace) = &mut trace {
                trace.finish("handed_back", None);
            }
            #[cfg(feature = "cluster")]
            tape.flushed(Duration::from_secs(5)).await;
            return;
        }
        let action = lock(&live.cancel_action).clone();
        let ending = match &outcome {
            Ok(output) if output.pending.is_empty() => crate::protocol::Outcome::Completed,
            Ok(_) | Err(RunError::Cancelled) => crate::protocol::Outcome::Interrupted,
            Err(error) => crate::protocol::Outcome::Failed(error.to_string()),
        };
        #[cfg(feature = "otel")]
        if let Some(trace) = &mut trace {
            match &outcome {
                Ok(_) => trace.finish("success", None),
                Err(RunError::Cancelled) if action.as_deref() == Some("rollback") => {
                    trace.finish("rolled_back", None)
                }
                Err(RunError::Cancelled) => trace.finish("interrupted", None),
                Err(error) => trace.finish("error", Some(&error.to_string())),
            }
        }
        match outcome {
            Ok(output) => {
                let thread_status = if output.pending.is_empty() {
                    "idle"
                } else {
                    "interrupted"
                };
                if output.pending.is_empty() {
                    lock(&live.record).stop_reason = serde_json::to_value(&output.stop_reason)
                        .ok()
                        .map(|reason| match reason {
                            Value::String(reason) => reason,
                            _ => "other".to_owned(),
                        });
                }
                self.settle(
                    live,
                    records,
                    "success",
                    Some(thread_status),
                    job.delete_thread_after,
                )
                .await;
            }
            Err(RunError::Cancelled) if action.as_deref() == Some("rollback") => {
                // Undone: the thread as it was before, and no record of the run.
                let restored = match &before {
                    Some(run) => match self.watch.load(storage, None).await {
                        Ok(now) => self
                            .watch
                            .append(
                                storage,
                                &RunDelta::replacing(&now.unwrap_or_default(), run),
                                run,
                            )
                            .await
                            .map(drop),
                        Err(error) => Err(error),
                    },
                    None => self.watch.delete_thread(storage).await.map(drop),
                };
                if let Err(error) = restored {
                    tracing::warn!(%storage, %error, "a rolled-back run's changes stay");
                }
                let _ = records.delete_run(&record.thread_id, &record.run_id).await;
                let status = if before
                    .as_ref()
                    .is_some_and(|run| !run.control.pending.is_empty())
                {
                    "interrupted"
                } else {
                    "idle"
                };
                let _ = records.set_thread_status(&record.thread_id, status).await;
            }
            Err(RunError::Cancelled) => {
                self.settle(
                    live,
                    records,
                    "interrupted",
                    Some("idle"),
                    job.delete_thread_after,
                )
                .await;
            }
            Err(error) => {
                let kind = serde_json::to_value(error.kind())
                    .ok()
                    .and_then(|kind| kind.as_str().map(str::to_owned))
                    .unwrap_or_else(|| "error".to_owned());
                let message = error.to_string();
                framer.error(&kind, &message);
                lock(&live.record).error = Some(json!({"error": kind, "message": message}));
                // A refused resume changed nothing: the thread still waits (or rests) as it
                // did, and says so.
                let thread_status = if !refused {
                    "error"
                } else if self
                    .watch
                    .load(storage, None)
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|run| !run.control.pending.is_empty())
                {
                    "interrupted"
                } else {
                    "idle"
                };
                self.settle(
                    live,
                    records,
                    "error",
                    Some(thread_status),
                    job.delete_thread_after,
                )
                .await;
            }
        }
        // After the run's status is saved: a client that reads the thread once it sees the
        // end finds it settled.
        protocol.finish(ending);
        // The thread's next run, on whichever server, numbers its events after these.
        #[cfg(feature = "cluster")]
        tape.flushed(Duration::from_secs(5)).await;
    }

    /// A saved step into the run's frames and the thread's protocol events, its values made
    /// once for both.
    fn frame(
        framer: &mut Framer<Arc<FrameLog>>,
        protocol: &mut crate::protocol::RunTape,
        ids: &convert::MessageIds,
        step: &crate::Step,
    ) {
        let values = convert::values_named(&step.run, &convert::interrupt_id(&step.run), ids);
        framer.step_with_values(step, Some(&values));
        protocol.step(step, values);
    }

    /// How the messages the run adds are named: by position, with the thread's forks (a
    /// run after an edit or a regenerate names its messages apart from the ones it replaces).
    async fn message_ids(
        &self,
        thread: crate::error::ApiResult<Option<crate::records::ThreadRecord>>,
        storage: &str,
    ) -> convert::MessageIds {
        let named = match thread {
            Ok(Some(thread)) => thread
                .head_message_ids(self.watch.as_ref(), storage)
                .await
                .map_err(|error| error.to_string()),
            Ok(None) => Ok(convert::MessageIds::default()),
            Err(error) => Err(error.to_string()),
        };
        named.unwrap_or_else(|error| {
            tracing::warn!(%error, "cannot read the thread's forks; messages named by position");
            convert::MessageIds::default()
        })
    }

    /// Opens the run's thread: its lease taken, its latest state loaded. Input and decisions
    /// are keyed by the run's id: a run taken over after its server stopped continues what it
    /// added.
    async fn open(
        &self,
        storage: &str,
        live: &Live,
        job: &Job,
        assistant: &Assistant,
    ) -> Result<deepagents::OpenThread, deepagents::RunFailure> {
        assistant
            .agent
            .thread(storage)
            .map_err(|e| deepagents::RunFailure {
                error: RunError::Crashed(e.to_string()),
                run: Box::default(),
            })?
            .with_options(RunOptions {
                cancel: live.cancel.clone(),
                assistant_id: Some(assistant.graph_id.clone()),
                runtime: job
                    .context
                    .clone()
                    .map(deepagents::RuntimeContext::new)
                    .unwrap_or_default(),
                ..RunOptions::default()
            })
            // A run of this thread elsewhere (the CLI on the same database, a server whose
            // lease ran out but whose connection lingers) ends before this one starts.
            .with_lease_wait(Duration::from_secs(30))
            .with_input_key(job.record.run_id.clone())
            .open()
            .await
    }

    /// Starts the run on its opened thread: the decisions of a resume, else the input, else
    /// a continuation of what the thread left unfinished.
    fn start(
        open: deepagents::OpenThread,
        job: &Job,
        before: Option<&Run>,
    ) -> Result<RunStream, RunError> {
        let taken =
            before.is_some_and(|run| run.control.input_key.as_deref() == Some(&job.record.run_id));
        let input = match (&job.resume, &job.input) {
            (Some(_), _) if taken => deepagents::Input::Resume,
            (Some(resume), _) => {
                // Recorded for the pause they were read for, checked again under the
                // thread's lease: a run that answered it meanwhile makes this one fail.
                let resume = convert::resume(resume, before)?;
                deepagents::Input::DecidePause {
                    pause: resume.pause,
                    decisions: resume.decisions,
                }
            }
            (None, Some(content)) => deepagents::Input::Content(content.clone()),
            // A run without input: a turn that background tasks' endings start (their
            // answers are its input), else the continuation of what the thread left.
            (None, None) => deepagents::Input::Resume,
        };
        open.stream(input).map_err(|failure| failure.error)
    }
}

/// The 409 for a resume naming `interrupt` while thread `thread_id` has a run going or
/// waiting: that run may answer the interrupt first, so the resume is not queued behind it.
pub fn busy_before_resume(thread_id: &str, interrupt: &str) -> ApiError {
    ApiError::conflict(format!(
        "thread `{thread_id}` is busy with a run, which may answer interrupt `{interrupt}` first; wait for it to end, then re-read the thread state and resume what is pending then"
    ))
}

/// A refused resume as the API answers it: a 409 for an interrupt that is not pending
/// (the client should look again), a 422 for decisions that cannot be used.
fn resume_error(error: RunError) -> ApiError {
    match error {
        RunError::StalePause { .. } => ApiError::conflict(error.to_string()),
        RunError::InvalidDecision(message) => ApiError::invalid(message),
        other => ApiError::invalid(other.to_string()),
    }
}

#[cfg(feature = "cluster")]
impl Runs {
    /// Claims runs from the cluster's queue and drives them, as long as the server runs.
    async fn dispatch(self: Arc<Self>) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        if cluster.jobs() == Some(0) {
            tracing::info!("serving the API only: other servers of the cluster run the runs");
            return;
        }
        let jobs = self.slots.clone();
        // Subscribed before the first claim: what is admitted after a claim found nothing
        // wakes the wait that follows.
        let mut events = cluster.events();
        while !self.stopping.load(std::sync::atomic::Ordering::Acquire) {
            // A free slot before a claim: a run claimed here is not left waiting for one.
            let slot = match &jobs {
                Some(jobs) => match Arc::clone(jobs).acquire_owned().await {
                    Ok(slot) => Some(slot),
                    Err(_) => return,
                },
                None => None,
            };
            match cluster.claim().await {
                Ok(Some(claimed)) => {
                    let runs = Arc::clone(&self);
                    let cluster = Arc::clone(&cluster);
                    tokio::spawn(async move {
                        runs.drive_claimed(cluster, claimed).await;
                        drop(slot);
                    });
                    continue;
                }
                Ok(None) => {}
                Err(error) => tracing::warn!(%error, "cannot claim runs; trying again"),
            }
            // Runs queued here wake it at once, others' by their notification, and the
            // rest (a dead server's runs, lapsed leases, lost notifications) the safety poll.
            tokio::select! {
                () = self.queued.notified() => {}
                () = cluster.woken(&mut events, |event| *event == crate::cluster::Event::Claimable) => {}
            }
        }
    }

    /// A slot for a run here, when this server runs runs and has room for one now (`None`
    /// inside when the cluster sets no limit).
    fn room_here(
        &self,
        cluster: &crate::cluster::Cluster,
    ) -> Option<Option<tokio::sync::OwnedSemaphorePermit>> {
        if self.is_stopping() || cluster.jobs() == Some(0) {
            return None;
        }
        match &self.slots {
            Some(slots) => Arc::clone(slots).try_acquire_owned().ok().map(Some),
            None => Some(None),
        }
    }

    async fn drive_claimed(
        self: Arc<Self>,
        cluster: Arc<crate::cluster::Cluster>,
        claimed: crate::cluster::Claimed,
    ) {
        if let Some(registered) = self.register_claimed(&cluster, claimed).await {
            self.drive_registered(cluster, registered).await;
        }
    }

    /// Makes a claimed run this server's: its frames published as they come, its live state
    /// where joiners and waiters here find it. `None` when it is dropped instead.
    async fn register_claimed(
        &self,
        cluster: &Arc<crate::cluster::Cluster>,
        claimed: crate::cluster::Claimed,
    ) -> Option<Registered> {
        let run_id = claimed.run_id.clone();
        let Ok(job) = serde_json::from_value::<Job>(claimed.job) else {
            tracing::warn!(%run_id, "a queued run that cannot be read is dropped");
            let _ = cluster.finish(&run_id).await;
            return None;
        };
        // Its server stopped while taking it in: it runs if its record was saved, else the
        // client was refused and it is dropped.
        if !claimed.admitted {
            match self
                .records(&claimed.tenant)
                .run(&job.record.thread_id, &run_id)
                .await
            {
                Ok(Some(_)) => {}
                Ok(None) => {
                    tracing::info!(%run_id, "a run whose server stopped before recording it is dropped");
                    let _ = cluster.finish(&run_id).await;
                    return None;
                }
                // Run rather than lose it: the run saves its record as it starts.
                Err(error) => {
                    tracing::warn!(%run_id, %error, "cannot read the record of a run taken over; running it")
                }
            }
        }
        // A first attempt published nothing yet.
        let base = if claimed.attempt > 1 {
            cluster.frame_count(&run_id).await.unwrap_or(0)
        } else {
            0
        };
        let (publisher, mut published) = tokio::sync::mpsc::unbounded_channel();
        // Frames go out in order, until the run ends or this server hands it back.
        let publishing = {
            let cluster = Arc::clone(cluster);
            let run_id = run_id.clone();
            tokio::spawn(async move {
                // What waits at once goes out in one round trip.
                let mut batch = Vec::new();
                while published.recv_many(&mut batch, 256).await > 0 {
                    let mut frames = Vec::with_capacity(batch.len());
                    let mut last = None;
                    for item in batch.drain(..) {
                        match item {
                            crate::stream::Published::Frame(index, frame) => {
                                frames.push((index, frame))
                            }
                            ending => {
                                last = Some(ending);
                                break;
                            }
                        }
                    }
                    let end = matches!(last, Some(crate::stream::Published::End));
                    if (!frames.is_empty() || end)
                        && let Err(error) = cluster.publish_frames(&run_id, &frames, end).await
                    {
                        tracing::warn!(%run_id, %error, "frames were not published");
                    }
                    if last.is_some() {
                        return;
                    }
                }
            })
        };
        let mut record = job.record.clone();
        record.worker = Some(cluster.worker.clone());
        let live = Live::new(record, FrameLog::continuing(base, Some(publisher)));
        if let Some(action) = &claimed.cancel {
            live.stop(action);
        }
        lock(&self.live).insert(run_id.clone(), Arc::clone(&live));
        Some(Registered {
            run_id,
            storage: storage_id(&claimed.tenant, &job.record.thread_id),
            attempt: claimed.attempt,
            job,
            live,
            publishing,
        })
    }

    /// Drives a registered run to its end (or until it is handed back), renewing its lease.
    async fn drive_registered(
        self: Arc<Self>,
        cluster: Arc<crate::cluster::Cluster>,
        registered: Registered,
    ) {
        let Registered {
            run_id,
            storage,
            attempt,
            job,
            live,
            publishing,
        } = registered;
        let heartbeat = {
            let cluster = Arc::clone(&cluster);
            let live = Arc::clone(&live);
            let run_id = run_id.clone();
            let mut events = cluster.events();
            let every = cluster.timings().heartbeat;
            tokio::spawn(async move {
                loop {
                    // A cancellation (or a take-over) is looked at once it is notified; the
                    // lease is renewed every `heartbeat` in any case.
                    let renew = tokio::time::sleep(every);
                    tokio::pin!(renew);
                    loop {
                        use tokio::sync::broadcast::error::RecvError;
                        tokio::select! {
                            () = &mut renew => break,
                            event = events.recv() => match event {
                                Ok(crate::cluster::Event::Cancel(id)) if id == run_id => break,
                                Ok(crate::cluster::Event::Resync) | Err(RecvError::Lagged(_)) => break,
                                Ok(_) => {}
                                Err(RecvError::Closed) => {
                                    renew.as_mut().await;
                                    break;
                                }
                            },
                        }
                    }
                    match cluster.heartbeat(&run_id).await {
                        Ok(crate::cluster::Heartbeat::Held(Some(action))) => live.stop(&action),
                        Ok(crate::cluster::Heartbeat::Held(None)) => {}
                        // Another server has it: this one stops without settling it.
                        Ok(crate::cluster::Heartbeat::Lost) => {
                            live.cancel.cancel();
                            return;
                        }
                        Err(error) => {
                            tracing::warn!(%run_id, %error, "the run's lease was not renewed")
                        }
                    }
                }
            })
        };
        Arc::clone(&self)
            .drive(storage, Arc::clone(&live), job, attempt)
            .await;
        heartbeat.abort();
        if live.is_handed_back() {
            // Its frames out first, then the queue has it again, then this server may stop.
            live.log.stop_publishing();
            let _ = publishing.await;
            if let Err(error) = cluster.release(&run_id).await {
                tracing::warn!(%run_id, %error, "the run waits for its lease to run out");
            }
            live.log.end_here();
        } else {
            let _ = cluster.finish(&run_id).await;
            let _ = publishing.await;
        }
    }
}

/// A run this server claimed and made its own, before it is driven.
#[cfg(feature = "cluster")]
struct Registered {
    run_id: String,
    storage: String,
    attempt: i32,
    job: Job,
    live: Arc<Live>,
    /// The task publishing its frames.
    publishing: tokio::task::JoinHandle<()>,
}
