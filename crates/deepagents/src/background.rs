//! Background tasks: async subagents that run while their parent thread goes on, and the
//! endings that wake the parent.
//!
//! Who knows what:
//! - the parent's state (`async_tasks`, checkpointed with the thread) records each task, its
//!   generation (one per run of it: `update_async_task` starts another) and the generation
//!   whose ending the conversation already holds (`delivered`). That record alone says what
//!   was delivered, so an ending joins the conversation once, whichever run finds it;
//! - [`Background`] (process memory) knows what runs now and what ended without the thread
//!   showing it delivered yet, and tells whoever waits on the thread;
//! - a local task's run is checkpointed in the child thread `<parent>/<task id>`, a remote
//!   one lives on its server: after a restart [`Background::recover`] finds there the ending
//!   of a task the state does not show delivered, or lets the task go on.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use deepagents_core::checkpoint::CHILD_THREAD_SEPARATOR;
use deepagents_core::{
    AgentState, Checkpointer, Checkpointing, ContentBlock, EventSink, Message, Run, StateKey,
    StateUpdate, ThreadLease,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;

use crate::agent::Agent;
use crate::error::RunFailure;
use crate::run::{RunOptions, RunOutput, RunStatus};

/// The custom state key holding the background tasks, by task id.
pub const ASYNC_TASKS_KEY: &str = "async_tasks";

/// A background task as the parent's state records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct AsyncTask {
    pub(crate) agent: String,
    /// The thread the task runs in: a child thread of the parent's, or the remote server's.
    pub(crate) thread_id: String,
    /// The remote run; empty for a local task.
    pub(crate) run_id: String,
    pub(crate) status: String,
    pub(crate) description: String,
    /// Whether a local async subagent runs it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) local: bool,
    /// Which run of the task is the latest, from 1; 0 for tasks recorded before endings were
    /// delivered (they are never delivered nor recovered).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) generation: u32,
    /// The generation whose ending the conversation holds (0: none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) delivered: u32,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// The background tasks of a state, typed.
const TASKS: StateKey<BTreeMap<String, AsyncTask>> = StateKey::new(ASYNC_TASKS_KEY);

/// The tasks `state` records (none when the key holds something else).
pub(crate) fn recorded(state: &AgentState) -> BTreeMap<String, AsyncTask> {
    TASKS.get(state).ok().flatten().unwrap_or_default()
}

/// An update recording `task` under `task_id`.
pub(crate) fn record(task_id: &str, task: &AsyncTask) -> StateUpdate {
    let value = serde_json::to_value(task).unwrap_or(Value::Null);
    StateUpdate::default().with_custom(ASYNC_TASKS_KEY, json!({ task_id: value }))
}

/// How a background task ended, as its parent is told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The id `start_async_task` returned.
    pub task_id: String,
    /// The subagent that did it.
    pub subagent: String,
    /// `success`, `error`, `paused`, or the status a remote server reported.
    pub status: String,
    /// Its answer, or what went wrong.
    pub answer: String,
    /// Which run of the task ended (1 for the first; `update_async_task` starts another).
    pub generation: u32,
}

/// A local async subagent.
pub(crate) struct LocalAgent {
    pub(crate) description: String,
    pub(crate) agent: Agent,
}

/// What a task's runner needs to run it again.
#[derive(Clone)]
struct Job {
    task_id: String,
    parent: String,
    subagent: String,
    checkpointer: Arc<dyn Checkpointer>,
}

impl Job {
    /// The child thread the task's run is checkpointed in.
    fn thread_id(&self) -> String {
        child_thread(&self.parent, &self.task_id)
    }
}

/// The child thread of `parent` a local task `task_id` runs in.
pub(crate) fn child_thread(parent: &str, task_id: &str) -> String {
    format!("{parent}{CHILD_THREAD_SEPARATOR}{task_id}")
}

/// A task this process knows.
struct Entry {
    parent: String,
    generation: u32,
    /// Its run (or watcher) while one goes on.
    running: Option<Running>,
    /// How its latest generation ended, until the thread shows it delivered.
    ended: Option<Completion>,
    /// What a local task needs to run again once ended.
    job: Option<Job>,
}

/// A run in progress: how to stop it and, for a local one, how to reach its runner.
struct Running {
    cancel: CancellationToken,
    updates: Option<mpsc::UnboundedSender<String>>,
}

/// The background tasks of one agent's threads in this process.
pub(crate) struct Background {
    pub(crate) locals: BTreeMap<String, LocalAgent>,
    #[cfg(feature = "remote")]
    pub(crate) remotes: crate::middleware::remote::Remotes,
    tasks: Mutex<HashMap<String, Entry>>,
    /// The parent thread of every task that ends.
    ended: broadcast::Sender<String>,
}

impl Background {
    /// The registry of `locals` (and `remotes`).
    pub(crate) fn new(
        locals: BTreeMap<String, LocalAgent>,
        #[cfg(feature = "remote")] remotes: crate::middleware::remote::Remotes,
    ) -> Self {
        Self {
            locals,
            #[cfg(feature = "remote")]
            remotes,
            tasks: Mutex::default(),
            ended: broadcast::channel(64).0,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Parent thread ids, one each time a task of theirs ends.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<String> {
        self.ended.subscribe()
    }

    /// How many tasks of `parent` run now.
    pub(crate) fn running_for(&self, parent: &str) -> usize {
        self.lock()
            .values()
            .filter(|e| e.parent == parent && e.running.is_some())
            .count()
    }

    /// Whether the task runs now; `None` when this process does not know it.
    pub(crate) fn is_running(&self, task_id: &str) -> Option<bool> {
        self.lock().get(task_id).map(|e| e.running.is_some())
    }

    /// How the task's latest generation ended, when it did and is not known delivered.
    pub(crate) fn ending(&self, task_id: &str) -> Option<Completion> {
        self.lock().get(task_id).and_then(|e| e.ended.clone())
    }

    /// Starts local subagent `subagent` on `description` for thread `parent`; the task id.
    pub(crate) fn start_local(
        self: &Arc<Self>,
        parent: &str,
        checkpointer: Arc<dyn Checkpointer>,
        subagent: &str,
        description: String,
    ) -> String {
        let job = Job {
            task_id: new_task_id(),
            parent: parent.to_owned(),
            subagent: subagent.to_owned(),
            checkpointer,
        };
        let task_id = job.task_id.clone();
        self.spawn_local(job, Some(description), 1);
        task_id
    }

    /// Runs `job` (with `input` as a new user message, or on from its checkpoint) as
    /// generation `generation`, replacing what this process knew of it.
    fn spawn_local(self: &Arc<Self>, job: Job, input: Option<String>, generation: u32) {
        let cancel = CancellationToken::new();
        let (updates, receiver) = mpsc::unbounded_channel();
        self.lock().insert(
            job.task_id.clone(),
            Entry {
                parent: job.parent.clone(),
                generation,
                running: Some(Running {
                    cancel: cancel.clone(),
                    updates: Some(updates),
                }),
                ended: None,
                job: Some(job.clone()),
            },
        );
        let background = Arc::clone(self);
        tokio::spawn(background.run_local(job, input, generation, receiver, cancel));
    }

    /// Sends new instructions to a local task: its current run stops and a new one starts
    /// with them (an ended task starts again). The new generation; `None` for a task this
    /// process does not know.
    pub(crate) fn update_local(self: &Arc<Self>, task_id: &str, message: String) -> Option<u32> {
        let mut tasks = self.lock();
        let entry = tasks.get_mut(task_id)?;
        entry.generation += 1;
        entry.ended = None;
        let generation = entry.generation;
        if let Some(sender) = entry.running.as_ref().and_then(|r| r.updates.as_ref())
            && sender.send(message.clone()).is_ok()
        {
            return Some(generation);
        }
        let job = entry.job.clone()?;
        drop(tasks);
        self.spawn_local(job, Some(message), generation);
        Some(generation)
    }

    /// Starts generation `generation` of local task `task_id` of thread `parent` with
    /// `message`, for a task this process no longer knows (it ended before a restart).
    pub(crate) fn restart_local(
        self: &Arc<Self>,
        parent: &str,
        checkpointer: Arc<dyn Checkpointer>,
        task_id: &str,
        subagent: &str,
        message: String,
        generation: u32,
    ) {
        let job = Job {
            task_id: task_id.to_owned(),
            parent: parent.to_owned(),
            subagent: subagent.to_owned(),
            checkpointer,
        };
        self.spawn_local(job, Some(message), generation);
    }

    /// Stops a task and forgets it: its ending is never delivered.
    pub(crate) fn cancel(&self, task_id: &str) {
        if let Some(entry) = self.lock().remove(task_id)
            && let Some(running) = entry.running
        {
            running.cancel.cancel();
        }
    }

    /// Records how generation `generation` of a task ended and wakes its parent; `false` when
    /// a later generation superseded it (new instructions came in as it ended) or the task
    /// was cancelled.
    fn finish(&self, completion: Completion) -> bool {
        let mut tasks = self.lock();
        let Some(entry) = tasks.get_mut(&completion.task_id) else {
            return false;
        };
        if entry.generation != completion.generation {
            return false;
        }
        entry.running = None;
        let parent = entry.parent.clone();
        entry.ended = Some(completion);
        drop(tasks);
        // Nobody listening is fine: the ending waits in the registry for the next run.
        let _ = self.ended.send(parent);
        true
    }

    /// The runner of a local task: its runs one after another, as instructions come in, until
    /// one ends without new instructions waiting or the task is cancelled.
    async fn run_local(
        self: Arc<Self>,
        job: Job,
        mut input: Option<String>,
        mut generation: u32,
        mut updates: mpsc::UnboundedReceiver<String>,
        cancel: CancellationToken,
    ) {
        loop {
            let run_cancel = cancel.child_token();
            let drive = self.drive_local(&job, input.take(), run_cancel.clone());
            tokio::pin!(drive);
            let outcome = tokio::select! {
                outcome = &mut drive => outcome,
                Some(message) = updates.recv() => {
                    // Replaced, as the Agent Protocol's `interrupt` strategy does: the run
                    // stops (its work so far checkpointed) and the new message follows.
                    run_cancel.cancel();
                    let _ = drive.await;
                    input = Some(message);
                    generation += 1;
                    continue;
                }
            };
            if cancel.is_cancelled() {
                return;
            }
            let (status, answer) = ending_of(outcome);
            let finished = self.finish(Completion {
                task_id: job.task_id.clone(),
                subagent: job.subagent.clone(),
                status,
                answer,
                generation,
            });
            if finished {
                return;
            }
            match updates.try_recv() {
                Ok(message) => {
                    input = Some(message);
                    generation += 1;
                }
                Err(_) => return,
            }
        }
    }

    /// One run of a local task in its child thread.
    async fn drive_local(
        &self,
        job: &Job,
        input: Option<String>,
        cancel: CancellationToken,
    ) -> Result<RunOutput, String> {
        let Some(local) = self.locals.get(&job.subagent) else {
            return Err(format!("no async subagent `{}`", job.subagent));
        };
        // The task's runner is the child thread's only writer in this process; its parent's
        // lease guards the parent, not this thread.
        let lease = ThreadLease::new(job.thread_id(), ());
        let mut checkpoint = Checkpointing::new(Arc::clone(&job.checkpointer), lease, 0);
        let mut run = crate::journal::reload(&mut checkpoint)
            .await
            .map_err(|e| e.to_string())?;
        if let Some(input) = input {
            run.push_user_input(vec![ContentBlock::text(input)]);
        }
        let options = RunOptions {
            checkpoint: Some(checkpoint),
            cancel,
            ..RunOptions::default()
        };
        local
            .agent
            .run(run, options, EventSink::discard())
            .await
            .map_err(|failure: RunFailure| failure.error.to_string())
    }

    /// Makes sure every task `state` records as not delivered is known here: a local task
    /// whose child thread holds its ending waits for delivery, one that stopped short (the
    /// process ended) runs on, and a remote one is watched again. Tasks this process already
    /// knows are left alone; entries the state shows delivered are dropped.
    pub(crate) async fn recover(
        self: &Arc<Self>,
        checkpointer: &Arc<dyn Checkpointer>,
        parent: &str,
        state: &AgentState,
    ) {
        let records = recorded(state);
        self.lock().retain(|id, entry| {
            entry.parent != parent
                || entry.running.is_some()
                || entry.ended.as_ref().is_none_or(|ended| {
                    records
                        .get(id)
                        .is_none_or(|r| r.delivered < ended.generation)
                })
        });
        for (task_id, task) in records {
            let pending = task.generation > 0
                && task.delivered < task.generation
                && task.status != "cancelled";
            if !pending || self.lock().contains_key(&task_id) {
                continue;
            }
            if task.local {
                self.recover_local(checkpointer, parent, &task_id, &task)
                    .await;
            } else {
                #[cfg(feature = "remote")]
                self.watch_remote(parent, &task_id, &task);
            }
        }
    }

    /// A local task after a restart: its ending from the child thread, or its run resumed.
    async fn recover_local(
        self: &Arc<Self>,
        checkpointer: &Arc<dyn Checkpointer>,
        parent: &str,
        task_id: &str,
        task: &AsyncTask,
    ) {
        let job = Job {
            task_id: task_id.to_owned(),
            parent: parent.to_owned(),
            subagent: task.agent.clone(),
            checkpointer: Arc::clone(checkpointer),
        };
        let stored = match checkpointer.load(&job.thread_id(), None).await {
            Ok(stored) => stored,
            Err(error) => {
                tracing::warn!(target: "deepagents::background", "background task {task_id}: {error}");
                return;
            }
        };
        match stored.as_ref().and_then(ended_run) {
            Some((status, answer)) => {
                self.lock().insert(
                    task_id.to_owned(),
                    Entry {
                        parent: parent.to_owned(),
                        generation: task.generation,
                        running: None,
                        ended: Some(Completion {
                            task_id: task_id.to_owned(),
                            subagent: task.agent.clone(),
                            status,
                            answer,
                            generation: task.generation,
                        }),
                        job: Some(job),
                    },
                );
            }
            // Nothing stored yet: the first message was never saved, so it is sent again.
            None if stored.is_none() => {
                self.spawn_local(job, Some(task.description.clone()), task.generation);
            }
            None => self.spawn_local(job, None, task.generation),
        }
    }

    /// Watches remote task `task_id` until its run ends, then records its ending. Replaces a
    /// watcher of an earlier generation.
    #[cfg(feature = "remote")]
    pub(crate) fn watch_remote(self: &Arc<Self>, parent: &str, task_id: &str, task: &AsyncTask) {
        let Some(remote) = self.remotes.get(&task.agent).cloned() else {
            return;
        };
        let cancel = CancellationToken::new();
        let previous = self.lock().insert(
            task_id.to_owned(),
            Entry {
                parent: parent.to_owned(),
                generation: task.generation,
                running: Some(Running {
                    cancel: cancel.clone(),
                    updates: None,
                }),
                ended: None,
                job: None,
            },
        );
        if let Some(running) = previous.and_then(|p| p.running) {
            running.cancel.cancel();
        }
        let background = Arc::clone(self);
        let (task_id, task) = (task_id.to_owned(), task.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => {}
                (status, answer) = watch(&remote, &task) => {
                    background.finish(Completion {
                        task_id,
                        subagent: task.agent,
                        status,
                        answer,
                        generation: task.generation,
                    });
                }
            }
        });
    }

    /// The endings of `parent`'s tasks that `state` does not show delivered, as a message and
    /// the records marking them delivered; `None` when there are none.
    pub(crate) fn deliveries(
        &self,
        parent: &str,
        state: &AgentState,
    ) -> Option<(StateUpdate, Vec<Completion>)> {
        let records = recorded(state);
        let mut endings: Vec<Completion> = self
            .lock()
            .values()
            .filter(|e| e.parent == parent)
            .filter_map(|e| e.ended.clone())
            .filter(|c| {
                records
                    .get(&c.task_id)
                    .is_none_or(|r| r.delivered < c.generation)
            })
            .collect();
        if endings.is_empty() {
            return None;
        }
        endings.sort_by(|a, b| a.task_id.cmp(&b.task_id));
        let mut update = StateUpdate::default();
        let mut marks = serde_json::Map::new();
        for ending in &endings {
            let mut task = records.get(&ending.task_id).cloned().unwrap_or(AsyncTask {
                agent: ending.subagent.clone(),
                thread_id: String::new(),
                run_id: String::new(),
                status: String::new(),
                description: String::new(),
                local: false,
                generation: ending.generation,
                delivered: 0,
            });
            task.status.clone_from(&ending.status);
            task.delivered = ending.generation;
            marks.insert(
                ending.task_id.clone(),
                serde_json::to_value(&task).unwrap_or(Value::Null),
            );
        }
        update
            .custom
            .insert(ASYNC_TASKS_KEY.to_owned(), Value::Object(marks));
        update.messages.push(Message::user(notice(&endings)));
        Some((update, endings))
    }
}

/// The message that brings endings into the conversation.
fn notice(endings: &[Completion]) -> String {
    endings
        .iter()
        .map(|c| {
            let what = match c.status.as_str() {
                "success" => "finished".to_owned(),
                "error" => "failed".to_owned(),
                "paused" => "stopped".to_owned(),
                other => format!("ended with status `{other}`"),
            };
            format!(
                "[Background task {} ({}) {what}. This message is from the harness, not the user.]\n{}",
                c.task_id, c.subagent, c.answer
            )
        })
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// Status and answer of a local task's run.
fn ending_of(outcome: Result<RunOutput, String>) -> (String, String) {
    match outcome {
        Ok(output) if output.status == RunStatus::Interrupted => {
            ("paused".to_owned(), paused_answer(&output.run))
        }
        Ok(output) => {
            let answer = match &output.structured {
                Some(json) => json.to_string(),
                None => output.text,
            };
            ("success".to_owned(), non_empty(answer))
        }
        Err(error) => ("error".to_owned(), format!("It failed: {error}.")),
    }
}

fn non_empty(answer: String) -> String {
    if answer.trim().is_empty() {
        "(the subagent finished without an answer)".to_owned()
    } else {
        answer
    }
}

fn paused_answer(run: &Run) -> String {
    let tools: Vec<&str> = run
        .control
        .pending
        .iter()
        .map(|a| a.name.as_str())
        .collect();
    format!(
        "It stopped to ask for a human decision on {}, which a background task cannot get. \
         Do that part yourself, or start it again with other instructions.",
        tools.join(", ")
    )
}

/// How a stored run ended, when it did: paused, or answered.
fn ended_run(run: &Run) -> Option<(String, String)> {
    if !run.control.pending.is_empty() {
        return Some(("paused".to_owned(), paused_answer(run)));
    }
    match run.state.messages.last() {
        Some(Message::Assistant(turn)) if turn.tool_calls.is_empty() => {
            let answer = crate::middleware::final_structured_answer(run).map_or_else(
                || Message::Assistant(turn.clone()).text(),
                |json| json.to_string(),
            );
            Some(("success".to_owned(), non_empty(answer)))
        }
        _ => None,
    }
}

/// Waits for a remote task's run to end: `join` on the server, then its status; statuses
/// that are not final are checked again after a pause, unreachable servers with back-off.
#[cfg(feature = "remote")]
async fn watch(remote: &crate::middleware::remote::Remote, task: &AsyncTask) -> (String, String) {
    use std::time::Duration;
    let mut pause = Duration::from_millis(500);
    loop {
        remote.join(&task.thread_id, &task.run_id).await;
        match remote.status(&task.thread_id, &task.run_id).await {
            Ok(status) if status == "pending" || status == "running" => {
                pause = Duration::from_millis(500);
            }
            Ok(status) if status == "success" => {
                return match remote.answer(&task.thread_id).await {
                    Ok(answer) => (status, non_empty(answer)),
                    Err(error) => ("error".to_owned(), error.to_string()),
                };
            }
            Ok(status) => {
                return (
                    status.clone(),
                    format!("The remote run ended with status `{status}`."),
                );
            }
            Err(_) => pause = (pause * 2).min(Duration::from_secs(30)),
        }
        tokio::time::sleep(pause).await;
    }
}

/// A task id: `bg-` and 16 hex digits, unpredictable enough not to collide in a thread.
fn new_task_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    format!("bg-{:016x}", hasher.finish())
}
