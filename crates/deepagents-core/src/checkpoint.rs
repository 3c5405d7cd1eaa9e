//! Checkpoints: a run persisted step by step as deltas, so storage grows with what changed and
//! a thread can be resumed, listed, or forked.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::{Message, Usage};
use crate::run::{Control, PausedRun, Run};
use crate::spend::Spent;
use crate::state::{FileData, StateError, Todo};

/// The checkpoint format this build writes. Checkpoints without a version come from this
/// project's earlier format, which kept the harness's bookkeeping in custom state keys
/// (`deepagents.*`); they load and are upgraded ([`upgrade_legacy_control`]). A newer
/// version is refused ([`CheckpointError::Incompatible`]).
///
/// Format 3 writes a delta's step count, usage and spending only when they changed; format 2
/// wrote step count and usage in every delta and reads the same.
pub const CHECKPOINT_SCHEMA: u32 = 3;

/// The custom keys in which the earlier format kept what [`Control`] holds.
pub const LEGACY_CONTROL_KEYS: [&str; 4] = [
    "deepagents.pending_approval",
    "deepagents.decisions",
    "deepagents.paused_subagents",
    "deepagents.in_flight",
];

/// What one step changed: the messages it appended and the new values of whatever else it
/// touched. Applying a thread's deltas in order rebuilds its run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunDelta {
    /// The format version ([`CHECKPOINT_SCHEMA`] when written by this build; 0: the earlier,
    /// unversioned format).
    #[serde(default)]
    pub schema: u32,
    /// Messages appended (or, with [`replace_from`](Self::replace_from), the new tail).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<Message>,
    /// When set, the run's messages from this index on are dropped before `messages` are
    /// appended: a message that was already stored changed (an approval edited a call's
    /// arguments). Only the tail from the changed message is written, not the whole history.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_from: Option<usize>,
    /// The new plan, when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub todos: Option<Vec<Todo>>,
    /// Files written (`Some`) or deleted (`None`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, Option<FileData>>,
    /// New values of custom keys (merged already: they replace).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub custom: BTreeMap<String, Value>,
    /// The parts of the harness's bookkeeping that changed.
    #[serde(default, skip_serializing_if = "ControlDelta::is_empty")]
    pub control: ControlDelta,
    /// The run's step count after the step, when it changed (format 3; earlier formats
    /// always wrote it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
    /// The run's usage after the step, when it changed (as for `steps`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// What the run's tree spent since the latest user input, when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<Spent>,
    /// What the conversation spent in all, when it changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_spent: Option<Spent>,
}

impl RunDelta {
    /// A delta that rebuilds `run`: its messages replace any the thread held, its todos,
    /// files and custom keys are set. For a thread that holds a state already, use
    /// [`replacing`](Self::replacing), which also deletes the files `run` lacks.
    pub fn full(run: &Run) -> Self {
        Self {
            schema: CHECKPOINT_SCHEMA,
            messages: run.state.messages.to_vec(),
            replace_from: Some(0),
            todos: Some(run.state.todos.clone()),
            files: run
                .state
                .files
                .iter()
                .map(|(path, file)| (path.clone(), Some(file.clone())))
                .collect(),
            custom: run.state.custom.clone(),
            control: ControlDelta::full(&run.control),
            steps: Some(run.steps),
            usage: Some(run.usage),
            spent: Some(run.spent),
            total_spent: Some(run.total_spent),
        }
    }

    /// A delta that turns a thread holding `before` into `run` (a state update, a
    /// rollback): [`full`](Self::full), plus the deletion of the files of `before` that
    /// `run` lacks.
    pub fn replacing(before: &Run, run: &Run) -> Self {
        let mut delta = Self::full(run);
        for path in before.state.files.keys() {
            if !run.state.files.contains_key(path) {
                delta.files.insert(path.clone(), None);
            }
        }
        delta
    }

    /// Applies the delta to `run`.
    pub fn apply(&self, run: &mut Run) {
        if let Some(from) = self.replace_from {
            run.state.messages.truncate(from);
        }
        run.state.messages.extend(self.messages.iter().cloned());
        if let Some(todos) = &self.todos {
            run.state.todos.clone_from(todos);
        }
        for (path, file) in &self.files {
            match file {
                Some(file) => run.state.files.insert(path.clone(), file.clone()),
                None => run.state.files.remove(path),
            };
        }
        for (key, value) in &self.custom {
            run.state.custom.insert(key.clone(), value.clone());
        }
        self.control.apply(&mut run.control);
        if let Some(steps) = self.steps {
            run.steps = steps;
        }
        if let Some(usage) = self.usage {
            run.usage = usage;
        }
        if let Some(spent) = self.spent {
            run.spent = spent;
        }
        if let Some(total) = self.total_spent {
            run.total_spent = total;
        }
    }

    /// Reads a stored delta, refusing one written by a newer version.
    pub fn decode(json: &str) -> Result<Self, CheckpointError> {
        let delta: Self = serde_json::from_str(json)
            .map_err(|e| CheckpointError::Storage(format!("unreadable checkpoint: {e}")))?;
        check_schema(delta.schema)?;
        Ok(delta)
    }
}

/// New values of the parts of a run's [`Control`] that a step changed. The parts change at
/// different moments (decisions are stored at once; the paused subagent runs holding them
/// only once the step that uses them is done), so each is written on its own.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ControlDelta {
    /// New [`Control::pending`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<Vec<crate::interrupt::PendingAction>>,
    /// New [`Control::decisions`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decisions: Option<BTreeMap<String, crate::interrupt::Decision>>,
    /// New [`Control::paused_subagents`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_subagents: Option<BTreeMap<String, PausedRun>>,
    /// New [`Control::in_flight`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<Vec<String>>,
    /// New [`Control::input_key`], stored with the input or decisions it names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_key: Option<String>,
}

impl ControlDelta {
    /// A delta that sets every part to `control`'s.
    pub fn full(control: &Control) -> Self {
        Self {
            pending: Some(control.pending.clone()),
            decisions: Some(control.decisions.clone()),
            paused_subagents: Some(control.paused_subagents.clone()),
            in_flight: Some(control.in_flight.clone()),
            input_key: control.input_key.clone(),
        }
    }

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// Applies it to `control`.
    pub fn apply(&self, control: &mut Control) {
        if let Some(pending) = &self.pending {
            control.pending.clone_from(pending);
        }
        if let Some(decisions) = &self.decisions {
            control.decisions.clone_from(decisions);
        }
        if let Some(paused) = &self.paused_subagents {
            control.paused_subagents.clone_from(paused);
        }
        if let Some(in_flight) = &self.in_flight {
            control.in_flight.clone_from(in_flight);
        }
        if let Some(key) = &self.input_key {
            control.input_key = Some(key.clone());
        }
    }
}

/// A run as a stored snapshot: its JSON with the format version.
pub fn encode_snapshot(run: &Run) -> Result<String, CheckpointError> {
    #[derive(Serialize)]
    struct Snapshot<'a> {
        schema: u32,
        #[serde(flatten)]
        run: &'a Run,
    }
    serde_json::to_string(&Snapshot {
        schema: CHECKPOINT_SCHEMA,
        run,
    })
    .map_err(|e| CheckpointError::Storage(format!("cannot encode the run: {e}")))
}

/// Reads a stored snapshot, refusing one written by a newer version.
pub fn decode_snapshot(json: &str) -> Result<Run, CheckpointError> {
    /// Only the version, read first so that a newer format is refused before its run is
    /// misread; the run itself ignores the field.
    #[derive(Deserialize)]
    struct Version {
        #[serde(default)]
        schema: u64,
    }
    let unreadable =
        |e: serde_json::Error| CheckpointError::Storage(format!("unreadable snapshot: {e}"));
    let version: Version = serde_json::from_str(json).map_err(unreadable)?;
    check_schema(u32::try_from(version.schema).unwrap_or(u32::MAX))?;
    serde_json::from_str(json).map_err(unreadable)
}

fn check_schema(found: u32) -> Result<(), CheckpointError> {
    if found > CHECKPOINT_SCHEMA {
        return Err(CheckpointError::Incompatible {
            found,
            supported: CHECKPOINT_SCHEMA,
        });
    }
    Ok(())
}

/// Moves the bookkeeping a checkpoint of the earlier format kept in custom keys
/// ([`LEGACY_CONTROL_KEYS`]) into [`Run::control`], in `run` and in the subagent runs paused
/// inside it. Returns the keys it removed (none for a run of this format): a store that
/// upgrades a thread writes them as `null` with the new control. A value that does not decode
/// is an error naming its key; nothing is dropped silently.
pub fn upgrade_legacy_control(run: &mut Run) -> Result<Vec<&'static str>, StateError> {
    let mut removed = Vec::new();
    let mut take = |run: &mut Run, key: &'static str| -> Option<Value> {
        let value = run.state.custom.remove(key)?;
        removed.push(key);
        Some(value).filter(|v| !v.is_null())
    };
    let [pending, decisions, paused, in_flight] = LEGACY_CONTROL_KEYS;
    if let Some(value) = take(run, pending) {
        run.control.pending = decode(pending, value)?;
    }
    if let Some(value) = take(run, decisions) {
        run.control.decisions = decode(decisions, value)?;
    }
    if let Some(value) = take(run, paused) {
        let mut runs: BTreeMap<String, PausedRun> = decode(paused, value)?;
        for child in runs.values_mut() {
            upgrade_legacy_control(&mut child.run)?;
        }
        run.control.paused_subagents = runs;
    }
    if let Some(value) = take(run, in_flight) {
        run.control.in_flight = decode(in_flight, value)?;
    }
    Ok(removed)
}

fn decode<T: serde::de::DeserializeOwned>(key: &str, value: Value) -> Result<T, StateError> {
    serde_json::from_value(value).map_err(|e| StateError::Decode {
        key: key.to_owned(),
        message: e.to_string(),
    })
}

/// One stored checkpoint of a thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointInfo {
    /// Its id: 1, 2, 3… within the thread.
    pub id: u64,
    /// When it was written, in milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Messages in the run at this checkpoint.
    pub messages: usize,
}

/// One stored thread.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadInfo {
    /// The thread id.
    pub thread_id: String,
    /// Its checkpoints.
    pub checkpoints: u64,
    /// When it last changed, in milliseconds since the Unix epoch.
    pub updated_at_ms: u64,
}

/// A checkpoint store failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// The thread or checkpoint does not exist.
    #[error("no checkpoint {what}; list the threads and their checkpoints to see what exists")]
    NotFound {
        /// What was asked for.
        what: String,
    },
    /// A fork's target thread already exists: forking never writes into a thread that has
    /// checkpoints.
    #[error(
        "thread `{thread_id}` already exists; fork into a new thread id, or delete `{thread_id}` first"
    )]
    AlreadyExists {
        /// The existing thread.
        thread_id: String,
    },
    /// Another run holds the thread's lease ([`Checkpointer::try_lease`]): two runs writing
    /// one thread would interleave their turns.
    #[error(
        "thread `{thread_id}` is in use by another run{}; wait until it finishes (or wait for its lease), or continue in another thread",
        holder.as_deref().map(|h| format!(" ({h})")).unwrap_or_default()
    )]
    Busy {
        /// The thread.
        thread_id: String,
        /// Who holds it, when the store knows (e.g. `pid 4242`).
        holder: Option<String>,
    },
    /// A thread id that cannot be stored ([`validate_thread_id`]).
    #[error("invalid thread id {thread_id:?}: {reason}")]
    InvalidThreadId {
        /// The id as given.
        thread_id: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The storage failed or holds data this build cannot read.
    #[error("checkpoint storage error: {0}")]
    Storage(String),
    /// The checkpoint was written by a newer version of deepagents.
    #[error(
        "the checkpoint was written in format {found} by a newer deepagents; this build reads formats up to {supported}: upgrade deepagents to open this thread"
    )]
    Incompatible {
        /// The checkpoint's format.
        found: u32,
        /// The newest format this build reads.
        supported: u32,
    },
    /// A stored value could not be read back as what it should be.
    #[error("the checkpoint holds a value this version cannot read: {0}")]
    State(#[from] StateError),
}

/// The longest thread id accepted, in bytes.
pub const MAX_THREAD_ID_LEN: usize = 128;

/// Separates a thread id from the ids of the child threads that checkpoint its subagent runs
/// (`parent/call_1`); thread ids of users never contain it.
pub const CHILD_THREAD_SEPARATOR: char = '/';

/// Checks a thread id: 1 to [`MAX_THREAD_ID_LEN`] bytes of letters, digits and `- _ . @ + : ~`
/// (the characters of store namespaces), not `.` or `..`. Ids are used as names in storage
/// (lock files, keys), so separators and path syntax are refused.
pub fn validate_thread_id(thread_id: &str) -> Result<(), CheckpointError> {
    let refuse = |reason: String| CheckpointError::InvalidThreadId {
        thread_id: thread_id.to_owned(),
        reason,
    };
    if thread_id.is_empty() {
        return Err(refuse("it is empty".to_owned()));
    }
    if thread_id.len() > MAX_THREAD_ID_LEN {
        return Err(refuse(format!(
            "it is {} bytes long; use at most {MAX_THREAD_ID_LEN}",
            thread_id.len()
        )));
    }
    if thread_id == "." || thread_id == ".." {
        return Err(refuse("`.` and `..` are reserved".to_owned()));
    }
    if let Some(bad) = thread_id
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-_.@+:~".contains(*c)))
    {
        return Err(refuse(format!(
            "`{}` is not allowed; use letters, digits and - _ . @ + : ~",
            bad.escape_debug()
        )));
    }
    Ok(())
}

/// Whether `thread_id` is `parent` itself or one of its child threads, at any depth.
pub fn is_in_thread(thread_id: &str, parent: &str) -> bool {
    thread_id
        .strip_prefix(parent)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(CHILD_THREAD_SEPARATOR))
}

/// The right to write a thread: while a lease is alive, no other run (in this process or
/// another) gets one for the same thread. Dropping it releases the thread. A lease held by a
/// process that dies is released with it (the stores use locks of the operating system or of
/// the database session), so a crashed run's thread can be resumed at once.
pub struct ThreadLease {
    thread_id: String,
    _held: Box<dyn Send + Sync>,
}

impl ThreadLease {
    /// A lease on `thread_id` kept for as long as `held` (a lock guard) lives.
    pub fn new(thread_id: impl Into<String>, held: impl Send + Sync + 'static) -> Self {
        Self {
            thread_id: thread_id.into(),
            _held: Box::new(held),
        }
    }

    /// The leased thread.
    pub fn thread_id(&self) -> &str {
        &self.thread_id
    }
}

impl std::fmt::Debug for ThreadLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadLease")
            .field("thread_id", &self.thread_id)
            .finish_non_exhaustive()
    }
}

/// Leases of threads held in this process, for stores that live in one process.
#[derive(Clone, Debug, Default)]
pub struct LocalLeases {
    held: Arc<Mutex<HashSet<String>>>,
}

impl LocalLeases {
    /// No thread leased.
    pub fn new() -> Self {
        Self::default()
    }

    /// Leases `thread_id`, or fails with [`CheckpointError::Busy`] when it is leased already.
    pub fn try_lease(&self, thread_id: &str) -> Result<ThreadLease, CheckpointError> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if !held.insert(thread_id.to_owned()) {
            return Err(CheckpointError::Busy {
                thread_id: thread_id.to_owned(),
                holder: Some("in this process".to_owned()),
            });
        }
        let release = LocalRelease {
            held: Arc::clone(&self.held),
            thread_id: thread_id.to_owned(),
        };
        Ok(ThreadLease::new(thread_id, release))
    }
}

struct LocalRelease {
    held: Arc<Mutex<HashSet<String>>>,
    thread_id: String,
}

impl Drop for LocalRelease {
    fn drop(&mut self) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.thread_id);
    }
}

/// Where a run is checkpointed: the store, the thread, and the lease that makes this run its
/// only writer. Clones share the lease; the thread is released when the last clone is dropped.
#[derive(Clone)]
pub struct Checkpointing {
    /// The store.
    pub checkpointer: Arc<dyn Checkpointer>,
    /// The thread the run belongs to.
    pub thread_id: String,
    /// How many of the run's messages the store already holds.
    pub persisted_messages: usize,
    /// The [`Control::input_key`] the store already holds.
    pub persisted_input_key: Option<String>,
    lease: Arc<ThreadLease>,
    /// Child threads whose runs are over; removed once this thread's next checkpoint holds
    /// their results.
    finished_children: Arc<Mutex<Vec<String>>>,
    /// The parent's list, for a child thread.
    parent_finished: Option<Arc<Mutex<Vec<String>>>>,
}

impl std::fmt::Debug for Checkpointing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpointing")
            .field("thread_id", &self.thread_id)
            .field("persisted_messages", &self.persisted_messages)
            .finish_non_exhaustive()
    }
}

impl Checkpointing {
    /// Checkpointing of `lease`'s thread in `checkpointer`, which holds `persisted_messages`
    /// of the run already.
    pub fn new(
        checkpointer: Arc<dyn Checkpointer>,
        lease: ThreadLease,
        persisted_messages: usize,
    ) -> Self {
        Self {
            checkpointer,
            thread_id: lease.thread_id().to_owned(),
            persisted_messages,
            persisted_input_key: None,
            lease: Arc::new(lease),
            finished_children: Arc::default(),
            parent_finished: None,
        }
    }

    /// The lease this run writes under.
    pub fn lease(&self) -> &ThreadLease {
        &self.lease
    }

    /// The child thread that checkpoints the run a tool call starts (a subagent), under the
    /// same lease: `<thread>/<call id>`. Its store holds nothing yet as far as this value
    /// knows; set [`persisted_messages`](Self::persisted_messages) after loading it.
    pub fn child(&self, call_id: &str) -> Self {
        Self {
            checkpointer: Arc::clone(&self.checkpointer),
            thread_id: format!("{}{CHILD_THREAD_SEPARATOR}{call_id}", self.thread_id),
            persisted_messages: 0,
            persisted_input_key: None,
            lease: Arc::clone(&self.lease),
            finished_children: Arc::default(),
            parent_finished: Some(Arc::clone(&self.finished_children)),
        }
    }

    /// Marks this child thread's run as over: the parent removes the thread after its next
    /// checkpoint, which records the call's result. Until then a crash resumes the run from
    /// the child thread (a finished run answers at once), so finished work never repeats.
    pub fn finish_child(&self) {
        if let Some(parent) = &self.parent_finished {
            parent
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(self.thread_id.clone());
        }
    }

    /// Takes the child threads that finished since the last call.
    pub fn take_finished_children(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .finished_children
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }
}

/// Stores runs per thread as a sequence of deltas.
#[async_trait]
pub trait Checkpointer: Send + Sync {
    /// Appends a delta to `thread_id` and returns the new checkpoint's id. `run` is the run
    /// after the delta, for stores that keep periodic snapshots.
    async fn append(
        &self,
        thread_id: &str,
        delta: &RunDelta,
        run: &Run,
    ) -> Result<u64, CheckpointError>;

    /// The run at checkpoint `at` (default: the latest); `None` for an unknown thread.
    async fn load(&self, thread_id: &str, at: Option<u64>) -> Result<Option<Run>, CheckpointError>;

    /// The checkpoints of a thread, oldest first.
    async fn checkpoints(&self, thread_id: &str) -> Result<Vec<CheckpointInfo>, CheckpointError>;

    /// Every thread, most recently changed first; child threads (subagent runs, with
    /// [`CHILD_THREAD_SEPARATOR`] in their ids) are not listed.
    async fn threads(&self) -> Result<Vec<ThreadInfo>, CheckpointError>;

    /// Takes the lease of `thread_id` without waiting, or fails with
    /// [`CheckpointError::Busy`] while another run holds it. Stores shared between processes
    /// lease across them; a lease dies with the process holding it.
    async fn try_lease(&self, thread_id: &str) -> Result<ThreadLease, CheckpointError>;

    /// Removes a thread and its child threads; returns whether it existed.
    async fn delete_thread(&self, thread_id: &str) -> Result<bool, CheckpointError>;

    /// Starts thread `thread_id` with `run` as its first checkpoint. Refuses
    /// ([`CheckpointError::AlreadyExists`]) when the thread already has checkpoints.
    ///
    /// The default checks and then appends, which leaves a window in which a concurrent writer
    /// could create the thread; stores shared between processes override it to check and write
    /// in one transaction.
    async fn create(&self, thread_id: &str, run: &Run) -> Result<u64, CheckpointError> {
        if !self.checkpoints(thread_id).await?.is_empty() {
            return Err(CheckpointError::AlreadyExists {
                thread_id: thread_id.to_owned(),
            });
        }
        self.append(thread_id, &RunDelta::full(run), run).await
    }

    /// Starts `new_thread` from checkpoint `at` of `thread_id` (through [`Self::create`], so a
    /// fork never appends onto another conversation).
    async fn fork(
        &self,
        thread_id: &str,
        at: u64,
        new_thread: &str,
    ) -> Result<(), CheckpointError> {
        let run = load_at(self, thread_id, at).await?;
        self.create(new_thread, &run).await?;
        Ok(())
    }
}

/// The run at checkpoint `at` of `thread_id`, or [`CheckpointError::NotFound`].
async fn load_at<C: Checkpointer + ?Sized>(
    checkpointer: &C,
    thread_id: &str,
    at: u64,
) -> Result<Run, CheckpointError> {
    checkpointer
        .load(thread_id, Some(at))
        .await?
        .ok_or_else(|| CheckpointError::NotFound {
            what: format!("{at} in thread `{thread_id}`"),
        })
}

/// Checkpoints in process memory, for tests and short-lived programs.
#[derive(Debug, Default)]
pub struct InMemoryCheckpointer {
    threads: Mutex<HashMap<String, Vec<(CheckpointInfo, RunDelta)>>>,
    leases: LocalLeases,
}

impl InMemoryCheckpointer {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[async_trait]
impl Checkpointer for InMemoryCheckpointer {
    async fn append(
        &self,
        thread_id: &str,
        delta: &RunDelta,
        run: &Run,
    ) -> Result<u64, CheckpointError> {
        let mut threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
        let entries = threads.entry(thread_id.to_owned()).or_default();
        let id = entries.len() as u64 + 1;
        let info = CheckpointInfo {
            id,
            created_at_ms: now_ms(),
            messages: run.state.messages.len(),
        };
        entries.push((info, delta.clone()));
        Ok(id)
    }

    async fn load(&self, thread_id: &str, at: Option<u64>) -> Result<Option<Run>, CheckpointError> {
        let threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(entries) = threads.get(thread_id) else {
            return Ok(None);
        };
        let last = at.unwrap_or(entries.len() as u64);
        if last == 0 || last > entries.len() as u64 {
            return Err(CheckpointError::NotFound {
                what: format!("{last} in thread `{thread_id}`"),
            });
        }
        let mut run = Run::default();
        for (_, delta) in entries
            .iter()
            .take(usize::try_from(last).unwrap_or(usize::MAX))
        {
            delta.apply(&mut run);
        }
        Ok(Some(run))
    }

    async fn checkpoints(&self, thread_id: &str) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        let threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(threads
            .get(thread_id)
            .map(|entries| entries.iter().map(|(info, _)| info.clone()).collect())
            .unwrap_or_default())
    }

    async fn threads(&self) -> Result<Vec<ThreadInfo>, CheckpointError> {
        let threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<ThreadInfo> = threads
            .iter()
            .filter(|(id, _)| !id.contains(CHILD_THREAD_SEPARATOR))
            .map(|(id, entries)| ThreadInfo {
                thread_id: id.clone(),
                checkpoints: entries.len() as u64,
                updated_at_ms: entries.last().map_or(0, |(info, _)| info.created_at_ms),
            })
            .collect();
        out.sort_by(|a, b| {
            b.updated_at_ms
                .cmp(&a.updated_at_ms)
                .then(a.thread_id.cmp(&b.thread_id))
        });
        Ok(out)
    }

    async fn try_lease(&self, thread_id: &str) -> Result<ThreadLease, CheckpointError> {
        self.leases.try_lease(thread_id)
    }

    async fn delete_thread(&self, thread_id: &str) -> Result<bool, CheckpointError> {
        let mut threads = self.threads.lock().unwrap_or_else(PoisonError::into_inner);
        let existed = threads.contains_key(thread_id);
        threads.retain(|id, _| !is_in_thread(id, thread_id));
        Ok(existed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::FileContent;

    fn run_with(messages: &[&str]) -> Run {
        let mut run = Run::default();
        for text in messages {
            run.state.messages.push(Message::user(*text));
        }
        run
    }

    #[tokio::test]
    async fn a_replacing_delta_makes_the_thread_its_run_without_duplicates_or_stale_files() {
        let store = InMemoryCheckpointer::new();
        let mut before = run_with(&["a", "b"]);
        before.state.files.insert(
            "/old.md".into(),
            FileData {
                content: FileContent::Text { text: "x".into() },
                modified_at_ms: 1,
                created_at_ms: 1,
            },
        );
        store
            .append("t", &RunDelta::full(&before), &before)
            .await
            .unwrap();
        let after = run_with(&["a", "B"]);
        store
            .append("t", &RunDelta::replacing(&before, &after), &after)
            .await
            .unwrap();
        let loaded = store.load("t", None).await.unwrap().unwrap();
        let texts: Vec<String> = loaded.state.messages.iter().map(Message::text).collect();
        assert_eq!(texts, ["a", "B"]);
        assert!(loaded.state.files.is_empty());
    }

    #[tokio::test]
    async fn fork_refuses_a_target_thread_that_exists_and_leaves_it_unchanged() {
        let store = InMemoryCheckpointer::new();
        let source = run_with(&["a", "b"]);
        store
            .append("source", &RunDelta::full(&source), &source)
            .await
            .unwrap();
        let other = run_with(&["other"]);
        store
            .append("taken", &RunDelta::full(&other), &other)
            .await
            .unwrap();

        let error = store.fork("source", 1, "taken").await.unwrap_err();
        assert_eq!(
            error,
            CheckpointError::AlreadyExists {
                thread_id: "taken".into()
            }
        );
        assert!(error.to_string().contains("new thread id"), "{error}");
        assert_eq!(store.checkpoints("taken").await.unwrap().len(), 1);
        assert_eq!(store.load("taken", None).await.unwrap().unwrap(), other);
        // Forking a thread onto itself is the same mistake.
        assert!(matches!(
            store.fork("source", 1, "source").await,
            Err(CheckpointError::AlreadyExists { .. })
        ));
        assert_eq!(store.checkpoints("source").await.unwrap().len(), 1);

        store.fork("source", 1, "fresh").await.unwrap();
        assert_eq!(store.load("fresh", None).await.unwrap().unwrap(), source);
        // A deleted thread's id is free again.
        assert!(store.delete_thread("taken").await.unwrap());
        store.fork("source", 1, "taken").await.unwrap();
        assert_eq!(store.load("taken", None).await.unwrap().unwrap(), source);
    }
}
