//! The events a run emits. Every front end (the CLI's `--json`, a terminal UI, a server)
//! consumes this one stream; its JSON form is a versioned protocol ([`PROTOCOL_VERSION`],
//! described in `docs/PROTOCOL.md`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::content::ContentBlock;
use crate::interrupt::PendingAction;
use crate::message::{ToolStatus, Usage};
use crate::model::StopReason;
use crate::spend::Spent;

/// What a `final` event written before stop reasons were recorded ended with.
fn end_turn() -> StopReason {
    StopReason::EndTurn
}
use crate::state::{FileContent, Todo};

/// The version of the event protocol: the JSON shape of [`Event`]. It changes when a kind or
/// field is renamed or removed or changes its meaning, so programs reading the stream can
/// tell; additions (new kinds, new fields), which readers skip, keep it (`docs/PROTOCOL.md`).
pub const PROTOCOL_VERSION: u32 = 1;

/// The JSON Schema (draft 2020-12) of one [`Event`] as streams carry it, generated from the
/// types: what `docs/events.schema.json` holds (a test keeps the two the same). Its `oneOf`
/// lists every event kind, each with its `type` as a constant.
pub fn json_schema() -> Value {
    schemars::schema_for!(Event).to_value()
}

/// One level of the agent tree: the tool call that started a subagent, and its name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PathSegment {
    /// The id of the `task` (or other) call that started the subagent.
    pub call_id: String,
    /// The subagent's name.
    pub name: String,
}

/// Where in the agent tree an event comes from: `[]` for the main agent, one segment per
/// level of subagents below it.
pub type AgentPath = Vec<PathSegment>;

/// Reads an agent path in its current form or in the flat form of older checkpoints
/// (`["call id", "name", …]`).
pub fn agent_path_compat<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<AgentPath, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Either {
        Structured(AgentPath),
        Flat(Vec<String>),
    }
    Ok(match Either::deserialize(deserializer)? {
        Either::Structured(path) => path,
        Either::Flat(flat) => flat
            .chunks(2)
            .map(|pair| PathSegment {
                call_id: pair.first().cloned().unwrap_or_default(),
                name: pair.get(1).cloned().unwrap_or_default(),
            })
            .collect(),
    })
}

/// One event: which run produced it, where in the run's agent tree, when, and what happened.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Event {
    /// The run: one drive of the top-level agent (a resume or an answered pause is a new run).
    /// Subagents' events carry their parent run's id.
    pub run_id: String,
    /// 0, 1, 2… within the run, without gaps, in the order the events were emitted.
    pub seq: u64,
    /// When it was emitted, RFC 3339 in UTC with milliseconds.
    pub time: String,
    /// The producing agent.
    pub path: AgentPath,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// What caused a summarization.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SummaryTrigger {
    /// The conversation filled the part of the context window set aside for it.
    Threshold,
    /// The model called `compact_conversation`.
    Requested,
    /// The provider refused a request as too long.
    ContextOverflow,
}

/// Why a run failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// The run made as many model calls as it may.
    TurnLimit,
    /// The model failed.
    Model,
    /// A tool failed in a way the model cannot fix.
    ToolFatal,
    /// A middleware failed.
    Middleware,
    /// A state update could not be merged.
    State,
    /// The checkpoint store failed.
    Checkpoint,
    /// Decisions did not fit the pause they answer.
    InvalidDecision,
    /// The run was cancelled.
    Cancelled,
    /// The run's task panicked.
    Crashed,
    /// The next model call would have gone past the run's spend cap; resumable with a
    /// higher one.
    SpendCap,
}

/// How a backend's shell commands are confined.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Confinement {
    /// The engine: `bubblewrap`, `landlock`, `none` (unconfined), or `unavailable` (commands
    /// are refused, `unenforced` says why).
    pub engine: String,
    /// The network commands reach: `off`, `on`, or `only DOMAINS`.
    pub network: String,
    /// What of the policy the engine does not enforce on this machine, one sentence each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unenforced: Vec<String>,
}

/// Which output of a command a chunk comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// What happened. Serialized with a `type` field in snake_case.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EventKind {
    /// The run began (or resumed). The first event of every run.
    RunStarted {
        /// The event protocol's version ([`PROTOCOL_VERSION`]).
        protocol: u32,
        /// Name of the agent.
        agent: String,
        /// The model spec.
        model: String,
        /// The thread the run is checkpointed in, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        thread_id: Option<String>,
    },
    /// A model call is about to be made.
    ModelCallStarted {
        /// 1-based number of the call since the latest user input.
        step: u32,
    },
    /// A piece of assistant text, as it streams.
    TextDelta {
        /// The new text.
        text: String,
    },
    /// A piece of the model's reasoning (thinking) text, as it streams.
    ReasoningDelta {
        /// The new text.
        text: String,
    },
    /// A piece of a tool call as the model streams it; `call_id` and `name` come with the
    /// call's first piece.
    ToolCallDelta {
        /// Position of the call within the model's turn.
        index: usize,
        /// The call id, on the first piece.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        call_id: Option<String>,
        /// The tool, on the first piece.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// The next piece of the JSON arguments.
        arguments_delta: String,
    },
    /// A model call finished.
    ModelCallFinished {
        /// Same as in [`EventKind::ModelCallStarted`].
        step: u32,
        /// Tokens used by this call.
        usage: Usage,
        /// Why the model stopped.
        stop_reason: StopReason,
        /// How many tool calls it asked for.
        tool_calls: usize,
    },
    /// A tool call is starting.
    ToolCallStarted {
        /// The call id.
        call_id: String,
        /// The tool.
        name: String,
        /// The arguments as the model sent them.
        arguments: Value,
    },
    /// Output of a running tool call (a shell command), as it is produced.
    ToolOutputDelta {
        /// The call id.
        call_id: String,
        /// Which output.
        stream: OutputStream,
        /// The new text (invalid UTF-8 shown as U+FFFD).
        text: String,
    },
    /// How far a running tool call has got, as the tool reports it (an MCP server's progress
    /// notifications): `progress` grows with each report; `total` when the tool knows it.
    ToolProgress {
        /// The call id.
        call_id: String,
        /// Work done so far, in the tool's own unit.
        progress: f64,
        /// All the work, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total: Option<f64>,
        /// What it is doing now.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// A tool call finished.
    ToolCallFinished {
        /// The call id.
        call_id: String,
        /// The tool.
        name: String,
        /// Success or failure.
        status: ToolStatus,
        /// What the model sees, notes of the harness included.
        content: Vec<ContentBlock>,
        /// Wall time of the call.
        duration_ms: u64,
    },
    /// The agent state changed.
    StateUpdated {
        /// The new plan, when it changed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        todos: Option<Vec<Todo>>,
        /// Paths of files written or deleted.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        files_changed: Vec<String>,
        /// Custom keys that changed, with their new values.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        custom: BTreeMap<String, Value>,
    },
    /// The run's state was saved: checkpoint `checkpoint` of its thread now holds everything
    /// announced before this event. Front ends that also watch the saved steps use it to put
    /// each step right after its events.
    Checkpointed {
        /// The checkpoint's id (increasing within the thread).
        checkpoint: u64,
    },
    /// The run paused: these tool calls wait for a human decision.
    Interrupted {
        /// The pending actions, in the order decisions must be given.
        actions: Vec<PendingAction>,
    },
    /// Older messages were replaced by a summary in what the model sees. The run still holds
    /// them all, and their transcript was appended to `history_file`.
    Summarized {
        /// How many messages this summarization replaced.
        replaced: usize,
        /// Index in the conversation of the first message still sent verbatim (everything
        /// before it is summarized), when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        kept_from: Option<usize>,
        /// The file holding the replaced transcripts.
        history_file: String,
        /// What caused it.
        trigger: SummaryTrigger,
    },
    /// The run ended with an answer.
    Final {
        /// The answer: the text of the last assistant message.
        text: String,
        /// Tokens used since the latest user input.
        usage: Usage,
        /// Model calls made since the latest user input.
        steps: u32,
        /// What the run and its subagents spent since the latest user input (`cost_usd` at
        /// the models' known prices).
        #[serde(default)]
        spent: Spent,
        /// What the conversation has spent in all its runs.
        #[serde(default)]
        total_spent: Spent,
        /// Why the model ended the answer: `max_tokens` means it was cut at the output limit
        /// and is not whole.
        #[serde(default = "end_turn")]
        stop_reason: StopReason,
        /// The files kept in the agent state (the state backend's), by path, with their
        /// contents: `{"encoding": "text", "text": …}` or `{"encoding": "binary", "mime_type":
        /// …, "data": base64}`. Files on disk or in a store are not repeated here.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        files: BTreeMap<String, FileContent>,
    },
    /// How the backend's commands are confined, once at the start of a run whose backend
    /// has a shell that can say.
    Sandbox {
        /// What confines them.
        confinement: Confinement,
    },
    /// A background task (an async subagent started with `start_async_task`) ended, and its
    /// outcome joined the conversation as a message the model reads next: emitted by the run
    /// that delivers it, once per ending, after `run_started` (a run woken by the task) or
    /// before a model call (a run already going).
    BackgroundTaskFinished {
        /// The id `start_async_task` returned.
        task_id: String,
        /// The subagent that did the task.
        subagent: String,
        /// `success`, `error`, `paused` (it asked for a decision, which a background task
        /// cannot get) or another status a remote server reported.
        status: String,
        /// Its answer, or what went wrong.
        answer: String,
    },
    /// The run stopped on an error.
    Error {
        /// What kind of failure.
        kind: ErrorKind,
        /// A one-line reason.
        message: String,
    },
}

/// Where a run sends its events; cheap to clone.
///
/// Delivery never blocks the run: the channel is unbounded, and a listener that went away is
/// ignored. Sinks made from one another ([`nested`](Self::nested)) share the run id and the
/// sequence counter, so a run's events are numbered without gaps across its whole agent tree.
#[derive(Clone, Debug, Default)]
pub struct EventSink {
    sender: Option<mpsc::UnboundedSender<Event>>,
    path: AgentPath,
    run: Arc<RunStamp>,
}

/// The run id and the next sequence number; the lock also keeps numbering and sending in one
/// order when several tasks emit at once.
#[derive(Debug, Default)]
struct RunStamp {
    run_id: String,
    next: Mutex<u64>,
}

impl RunStamp {
    fn fresh() -> Arc<Self> {
        Arc::new(Self {
            run_id: new_run_id(),
            next: Mutex::new(0),
        })
    }
}

impl EventSink {
    /// A sink that drops every event.
    pub fn discard() -> Self {
        Self::default()
    }

    /// A sink for the main agent and the receiver of its events.
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<Event>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let sink = Self {
            sender: Some(sender),
            path: AgentPath::new(),
            run: RunStamp::fresh(),
        };
        (sink, receiver)
    }

    /// A sink for a nested agent: its events carry this path plus `segment`.
    pub fn nested(&self, segment: PathSegment) -> Self {
        let mut path = self.path.clone();
        path.push(segment);
        Self {
            sender: self.sender.clone(),
            path,
            run: Arc::clone(&self.run),
        }
    }

    /// The same destination for a new run: a fresh run id, numbered from 0.
    pub fn for_new_run(&self) -> Self {
        Self {
            sender: self.sender.clone(),
            path: self.path.clone(),
            run: RunStamp::fresh(),
        }
    }

    /// The path stamped on this sink's events.
    pub fn path(&self) -> &AgentPath {
        &self.path
    }

    /// The id stamped on this sink's events.
    pub fn run_id(&self) -> &str {
        &self.run.run_id
    }

    /// Sends one event.
    pub fn emit(&self, kind: EventKind) {
        let Some(sender) = &self.sender else {
            return;
        };
        let mut next = self.run.next.lock().unwrap_or_else(PoisonError::into_inner);
        let event = Event {
            run_id: self.run.run_id.clone(),
            seq: *next,
            time: rfc3339_now(),
            path: self.path.clone(),
            kind,
        };
        // A closed channel means nobody listens any more; the run goes on regardless.
        if sender.send(event).is_ok() {
            *next += 1;
        }
    }
}

/// A new run id: 128 random bits in the UUID v4 layout.
fn new_run_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    // `RandomState` is seeded from the OS per process and varies per instance; two hashes of
    // the time and a counter give 128 unpredictable bits without a dependency.
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let half = |salt: u64| {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(now);
        hasher.write_u64(count);
        hasher.write_u64(salt);
        hasher.finish()
    };
    let (high, low) = (half(1), half(2));
    let bits = (u128::from(high) << 64) | u128::from(low);
    // Version 4, variant 10xx.
    let bits = (bits & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The current time as RFC 3339 in UTC with milliseconds, e.g. `2026-12-01T20:03:30.123Z`.
pub fn rfc3339_now() -> String {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339_ms(since.as_millis() as u64)
}

/// `ms` milliseconds since the Unix epoch as RFC 3339 in UTC with milliseconds.
pub fn rfc3339_ms(ms: u64) -> String {
    let (seconds, millis) = (ms / 1000, ms % 1000);
    let days = seconds / 86_400;
    let rest = seconds % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339_ms(951_782_400_007), "2000-02-29T00:00:00.007Z");
        assert_eq!(rfc3339_ms(1_796_155_410_123), "2026-12-01T20:03:30.123Z");
    }

    #[test]
    fn run_ids_are_distinct_uuids() {
        let a = new_run_id();
        let b = new_run_id();
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
    }
}
