//! The thread-centric streaming protocol (LangGraph's "v2" event streaming, the types of
//! `@langchain/protocol`): what `@langchain/react` 1.1's `useStream` and the JS SDK's
//! `ThreadStream` read.
//!
//! Every thread has a [`Tape`]: the protocol events of its runs, one after the other, each
//! numbered by a `seq` that grows across the thread's runs. A [`RunTape`] writes one run's
//! events to it from what the run emits ([`deepagents::core::Event`]) and saves
//! ([`Step`]); event streams replay the tape from any `seq` and follow it live, so a client
//! that reconnects with `since` misses nothing, and one that connects without it sees the
//! thread's runs as they happened (what the reference server does, and what the SDK expects).
//!
//! Namespaces follow the v1 stream's subagent paths: a subagent started by tool call `c` is
//! `["tools:c"]` (one segment per level), and a tool call `c`'s own events sit one level below
//! the agent that made it (`[…, "tools:c"]`, as LangGraph runs tools in a task of their own).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use deepagents::core::{ContentBlock, Event, EventKind, Message, Run, ToolStatus};
use serde_json::{Map, Value, json};
use tokio::sync::watch;

use crate::{Step, lock};
use deepagents_langgraph::convert;

/// The channels a client may ask for (besides `custom:NAME`).
pub const CHANNELS: [&str; 9] = [
    "values",
    "updates",
    "messages",
    "tools",
    "lifecycle",
    "input",
    "checkpoints",
    "tasks",
    "custom",
];

/// How many events a thread's tape keeps; older ones are dropped first (a client asking to
/// replay from before them gets what is left).
const MAX_EVENTS: usize = 10_000;

/// How long a tape nobody holds is kept after its last event.
const KEEP_IDLE: Duration = Duration::from_secs(3600);

/// The tapes of a server's threads, by storage id (`tenant:thread`).
pub struct Tapes {
    threads: Mutex<HashMap<String, Arc<Tape>>>,
    /// Set when the server stops: event streams end so it can.
    closed: watch::Sender<bool>,
    /// The cluster whose Redis holds every thread's events, when there is one: runs add
    /// theirs there too, and event streams read them from there.
    #[cfg(feature = "cluster")]
    shared: std::sync::OnceLock<Arc<crate::cluster::Cluster>>,
}

impl Default for Tapes {
    fn default() -> Self {
        Self {
            threads: Mutex::new(HashMap::new()),
            closed: watch::channel(false).0,
            #[cfg(feature = "cluster")]
            shared: std::sync::OnceLock::new(),
        }
    }
}

impl Tapes {
    /// Shares every thread's events through `cluster` from now on.
    #[cfg(feature = "cluster")]
    pub fn share(&self, cluster: Arc<crate::cluster::Cluster>) {
        let _ = self.shared.set(cluster);
    }

    /// The cluster the events are shared through, when they are.
    #[cfg(feature = "cluster")]
    pub fn shared(&self) -> Option<&Arc<crate::cluster::Cluster>> {
        self.shared.get()
    }

    /// The tape of thread `storage`, made empty when it has none.
    pub fn tape(&self, storage: &str) -> Arc<Tape> {
        let mut threads = lock(&self.threads);
        if let Some(tape) = threads.get(storage) {
            return Arc::clone(tape);
        }
        // Tapes of idle threads nobody follows go, so a long-lived server does not keep every
        // thread's events; a stream or a run holding one keeps it.
        threads.retain(|_, tape| Arc::strong_count(tape) > 1 || !tape.idle_for(KEEP_IDLE));
        #[allow(unused_mut)]
        let mut tape = Tape::default();
        #[cfg(feature = "cluster")]
        if let Some(cluster) = self.shared.get() {
            tape.mirror = Mirror::start(Arc::clone(cluster), storage);
        }
        let tape = Arc::new(tape);
        threads.insert(storage.to_owned(), Arc::clone(&tape));
        tape
    }

    /// Where a client follows thread `storage`'s events from: this server's tape, or in a
    /// cluster the shared one.
    pub fn follower(&self, storage: &str) -> Follower {
        #[cfg(feature = "cluster")]
        if let Some(cluster) = self.shared.get() {
            return Follower::Shared {
                cluster: Arc::clone(cluster),
                storage: storage.to_owned(),
                after_entry: "0".to_owned(),
            };
        }
        Follower::Local(self.tape(storage))
    }

    /// The `seq` of thread `storage`'s latest event, wherever it was added (0 before any in
    /// a cluster: this server's own numbering says nothing of the others').
    pub async fn last_seq(&self, storage: &str) -> u64 {
        #[cfg(feature = "cluster")]
        if let Some(cluster) = self.shared.get() {
            return match cluster.last_event_seq(storage).await {
                Ok(shared) => shared.unwrap_or(0),
                Err(error) => {
                    tracing::warn!(%storage, %error, "cannot read the thread's shared events");
                    0
                }
            };
        }
        self.tape(storage).last_seq()
    }

    /// Thread `storage`'s agent tree, as its latest run left it, wherever it ran.
    pub async fn tree(&self, storage: &str) -> Value {
        #[cfg(feature = "cluster")]
        if let Some(cluster) = self.shared.get() {
            match cluster.tree(storage).await {
                Ok(Some(tree)) => return tree,
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(%storage, %error, "cannot read the thread's shared agent tree")
                }
            }
        }
        self.tape(storage).tree()
    }

    /// Forgets the events of thread `storage` (it was deleted); its numbering goes on, so
    /// a client that saw them is not confused by new events with old numbers.
    pub fn clear(&self, storage: &str) {
        if let Some(tape) = lock(&self.threads).get(storage) {
            let mut inner = lock(&tape.inner);
            inner.events.clear();
            inner.tree.clear();
            inner.client_ids.clear();
        }
    }

    /// The server is stopping: every event stream ends.
    pub fn close(&self) {
        self.closed.send_replace(true);
    }

    /// Whether the server is stopping, and a way to wait until it does.
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.closed.subscribe()
    }
}

/// One protocol event as kept on a tape: what filters read, and its JSON.
pub struct Recorded {
    /// Its number on the tape.
    pub seq: u64,
    /// The protocol method (`lifecycle`, `messages`, `input.requested`…).
    pub method: &'static str,
    /// The agent it concerns.
    pub namespace: Vec<String>,
    /// The whole event as sent (`{"type": "event", "seq", "event_id", "method", "params"}`).
    pub json: String,
}

impl Recorded {
    /// An event read back from the cluster's copy of a tape; `None` for a method this server
    /// does not send.
    #[cfg(feature = "cluster")]
    pub fn restored(seq: u64, method: &str, namespace: Vec<String>, json: String) -> Option<Self> {
        const METHODS: [&str; 8] = [
            "lifecycle",
            "messages",
            "tools",
            "values",
            "updates",
            "checkpoints",
            "input.requested",
            "input.answered",
        ];
        let method = METHODS.into_iter().find(|known| *known == method)?;
        Some(Self {
            seq,
            method,
            namespace,
            json,
        })
    }

    /// The channel a filter names it by.
    pub fn channel(&self) -> &'static str {
        match self.method {
            "input.requested" | "input.answered" => "input",
            other => other,
        }
    }
}

/// The status of an agent of the tree, as `agent.getTree` shows it.
#[derive(Clone)]
struct Node {
    status: &'static str,
    graph_name: String,
}

#[derive(Default)]
struct TapeState {
    events: VecDeque<Arc<Recorded>>,
    last_seq: u64,
    touched: Option<Instant>,
    /// The agents of the latest run: the root (`[]`) and each subagent namespace.
    tree: BTreeMap<Vec<String>, Node>,
    /// Ids clients gave their input messages, by position in the thread: the SDK shows a
    /// message as soon as it is sent and matches it with the state's by id, so the state this
    /// tape sends names it so.
    client_ids: BTreeMap<usize, String>,
}

/// The protocol events of one thread, growing while its runs run.
pub struct Tape {
    inner: Mutex<TapeState>,
    /// The latest `seq`, for followers to wait on.
    progress: watch::Sender<u64>,
    /// Where the events also go in a cluster.
    #[cfg(feature = "cluster")]
    mirror: Option<Mirror>,
}

impl Default for Tape {
    fn default() -> Self {
        // Numbering starts from the clock (a thousand numbers a millisecond, within the
        // integers JavaScript holds exactly), so it grows across tapes of one thread: after a
        // restart or an idle tape's eviction, a client's `since` is behind the new tape's
        // events (it gets them all) and no event id it has seen comes again.
        let base = crate::time::now_ms().saturating_mul(1000);
        Self {
            inner: Mutex::new(TapeState {
                last_seq: base,
                ..TapeState::default()
            }),
            progress: watch::channel(base).0,
            #[cfg(feature = "cluster")]
            mirror: None,
        }
    }
}

impl Tape {
    fn idle_for(&self, quiet: Duration) -> bool {
        lock(&self.inner)
            .touched
            .is_none_or(|touched| touched.elapsed() > quiet)
    }

    /// The `seq` of the latest event (below the first one's before there is any).
    pub fn last_seq(&self) -> u64 {
        lock(&self.inner).last_seq
    }

    /// Numbers the next events after `seq` at least: a run continues the numbering of the
    /// thread's shared tape, whichever server added its latest events. Local events left from
    /// before a jump are dropped, so local numbers stay consecutive.
    #[cfg(feature = "cluster")]
    pub fn continue_after(&self, seq: u64) {
        let mut inner = lock(&self.inner);
        if seq > inner.last_seq {
            inner.events.clear();
            inner.last_seq = seq;
        }
    }

    /// Waits (at most `limit`) until every event added so far is in the shared tape, so the
    /// next run, on any server, numbers its events after them.
    #[cfg(feature = "cluster")]
    pub async fn flushed(&self, limit: Duration) {
        if let Some(mirror) = &self.mirror {
            let last = self.last_seq();
            let mut published = mirror.published.subscribe();
            let _ = tokio::time::timeout(limit, published.wait_for(|seq| *seq >= last)).await;
        }
    }

    /// The events numbered after `after`, in order, and the number of the latest event on
    /// the tape when they were read (to wait for what comes next, nothing missed between).
    pub fn since(&self, after: u64) -> (Vec<Arc<Recorded>>, u64) {
        let inner = lock(&self.inner);
        // Numbers grow one by one: the first wanted is found by arithmetic, not a scan.
        let first = inner.events.front().map_or(0, |event| event.seq);
        let skip = usize::try_from((after + 1).saturating_sub(first)).unwrap_or(usize::MAX);
        let events = inner.events.iter().skip(skip).cloned().collect();
        (events, inner.last_seq)
    }

    /// Waits until an event numbered after `seen` is on the tape.
    pub async fn changed(&self, seen: u64) {
        let mut progress = self.progress.subscribe();
        let _ = progress.wait_for(|last| *last > seen).await;
    }

    /// The agent tree of the latest run, as `agent.getTree` answers it.
    pub fn tree(&self) -> Value {
        let inner = lock(&self.inner);
        let root = inner.tree.get(&Vec::new()).cloned().unwrap_or(Node {
            status: "completed",
            graph_name: "root".to_owned(),
        });
        tree_node(&inner.tree, &[], &root)
    }

    /// Adds an event: `data` on `method` for `namespace`; `event_id` when the event needs a
    /// stable one the client reads (root lifecycle names its run by it), else its number.
    fn push(
        &self,
        method: &'static str,
        namespace: &[String],
        data: Value,
        node: Option<&str>,
        event_id: Option<String>,
    ) {
        let mut inner = lock(&self.inner);
        let seq = inner.last_seq + 1;
        // Serialized from references: `json!` would copy `data` (a thread's whole values, at
        // every step) before writing it.
        let event = Envelope {
            kind: "event",
            event_id: event_id.unwrap_or_else(|| seq.to_string()),
            seq,
            method,
            params: Params {
                namespace,
                timestamp: crate::time::now_ms(),
                data: &data,
                node,
            },
        };
        inner.events.push_back(Arc::new(Recorded {
            seq,
            method,
            namespace: namespace.to_vec(),
            json: serde_json::to_string(&event).unwrap_or_default(),
        }));
        if inner.events.len() > MAX_EVENTS {
            inner.events.pop_front();
        }
        inner.last_seq = seq;
        inner.touched = Some(Instant::now());
        #[cfg(feature = "cluster")]
        if let (Some(mirror), Some(event)) = (&self.mirror, inner.events.back()) {
            mirror.send(Mirrored::Event(Arc::clone(event)));
        }
        drop(inner);
        self.progress.send_replace(seq);
    }

    fn set_node(&self, namespace: &[String], status: &'static str, graph_name: &str) {
        lock(&self.inner).tree.insert(
            namespace.to_vec(),
            Node {
                status,
                graph_name: graph_name.to_owned(),
            },
        );
        #[cfg(feature = "cluster")]
        if let Some(mirror) = &self.mirror {
            mirror.send(Mirrored::Tree(self.tree()));
        }
    }
}

/// A protocol event as it is written: `{type, event_id, seq, method, params}`.
#[derive(serde::Serialize)]
struct Envelope<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    event_id: String,
    seq: u64,
    method: &'static str,
    params: Params<'a>,
}

/// An event's `params`.
#[derive(serde::Serialize)]
struct Params<'a> {
    namespace: &'a [String],
    timestamp: u64,
    data: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<&'a str>,
}

/// The most items a tape's mirror writes in one round trip.
#[cfg(feature = "cluster")]
const MIRROR_BATCH: usize = 256;

/// What a tape sends to the cluster, in order.
#[cfg(feature = "cluster")]
enum Mirrored {
    Event(Arc<Recorded>),
    Tree(Value),
}

/// A tape's copy in the cluster's Redis, written in order by a task of its own.
#[cfg(feature = "cluster")]
struct Mirror {
    sender: tokio::sync::mpsc::UnboundedSender<Mirrored>,
    /// The `seq` of the latest event written.
    published: Arc<watch::Sender<u64>>,
}

#[cfg(feature = "cluster")]
impl Mirror {
    /// The copy of thread `storage`'s tape; `None` outside a runtime.
    fn start(cluster: Arc<crate::cluster::Cluster>, storage: &str) -> Option<Self> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (sender, mut received) = tokio::sync::mpsc::unbounded_channel();
        let published = Arc::new(watch::channel(0).0);
        let storage = storage.to_owned();
        let written = Arc::clone(&published);
        // Ends when the tape, and with it the sender, is gone.
        runtime.spawn(async move {
            // What waits at once goes in one round trip: the events in order, the latest tree.
            let mut batch = Vec::new();
            while received.recv_many(&mut batch, MIRROR_BATCH).await > 0 {
                let mut events = Vec::with_capacity(batch.len());
                let mut tree = None;
                for item in batch.drain(..) {
                    match item {
                        Mirrored::Event(event) => events.push(event),
                        Mirrored::Tree(latest) => tree = Some(latest),
                    }
                }
                let result = cluster
                    .publish_events(&storage, &events, tree.as_ref(), MAX_EVENTS)
                    .await;
                if let Some(last) = events.last() {
                    written.send_replace(last.seq);
                }
                if let Err(error) = result {
                    tracing::warn!(%storage, %error, "protocol events were not shared with the cluster");
                }
            }
        });
        Some(Self { sender, published })
    }

    fn send(&self, item: Mirrored) {
        let _ = self.sender.send(item);
    }
}

/// Where a client follows a thread's events from ([`Tapes::follower`]).
pub enum Follower {
    /// This server's tape.
    Local(Arc<Tape>),
    /// The cluster's shared tape in Redis, read from after entry `after_entry`.
    #[cfg(feature = "cluster")]
    Shared {
        /// The cluster.
        cluster: Arc<crate::cluster::Cluster>,
        /// The thread.
        storage: String,
        /// The Redis entry read last.
        after_entry: String,
    },
}

impl Follower {
    /// The events numbered after `after`, in order, once there is one; none when `quiet`
    /// passed without any (time for a heartbeat).
    pub async fn next(&mut self, after: u64, quiet: Duration) -> Vec<Arc<Recorded>> {
        match self {
            Self::Local(tape) => {
                let (events, last_seq) = tape.since(after);
                if !events.is_empty() {
                    return events;
                }
                // Waiting is for events after all those on the tape now (a `since` from
                // before this tape's first number waits for its next event too).
                let _ = tokio::time::timeout(quiet, tape.changed(after.max(last_seq))).await;
                tape.since(after).0
            }
            #[cfg(feature = "cluster")]
            Self::Shared {
                cluster,
                storage,
                after_entry,
            } => {
                let started = Instant::now();
                loop {
                    // Polled: a blocking read would hold the shared connection.
                    match cluster.read_events(storage, after_entry).await {
                        Ok(entries) => {
                            let mut events = Vec::new();
                            for (entry, event) in entries {
                                *after_entry = entry;
                                if event.seq > after {
                                    events.push(Arc::new(event));
                                }
                            }
                            if !events.is_empty() {
                                return events;
                            }
                        }
                        Err(error) => {
                            tracing::warn!(%storage, %error, "cannot read the thread's shared events")
                        }
                    }
                    if started.elapsed() >= quiet {
                        return Vec::new();
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

fn tree_node(tree: &BTreeMap<Vec<String>, Node>, namespace: &[String], node: &Node) -> Value {
    let children: Vec<Value> = tree
        .iter()
        .filter(|(ns, _)| ns.len() == namespace.len() + 1 && ns.starts_with(namespace))
        .map(|(ns, child)| tree_node(tree, ns, child))
        .collect();
    let mut value = json!({
        "namespace": namespace,
        "status": node.status,
        "graph_name": node.graph_name,
    });
    if !children.is_empty() {
        value["children"] = Value::Array(children);
    }
    value
}

/// Which events a client asked for: an event stream's body (`EventStreamRequest`).
#[derive(Clone, Debug)]
pub struct Filter {
    /// Channel names; `custom:NAME` is taken as `custom` (no named custom events are sent).
    pub channels: Vec<String>,
    /// Namespace prefixes; `None`: every namespace.
    pub namespaces: Option<Vec<Vec<String>>>,
    /// How far below a prefix events may be.
    pub depth: Option<usize>,
}

impl Filter {
    /// Whether `event` is wanted.
    pub fn wants(&self, event: &Recorded) -> bool {
        let channel = event.channel();
        let named = self.channels.iter().any(|wanted| {
            wanted == channel || (channel == "custom" && wanted.starts_with("custom:"))
        });
        if !named {
            return false;
        }
        match &self.namespaces {
            None => self
                .depth
                .is_none_or(|depth| event.namespace.len() <= depth),
            Some(prefixes) if prefixes.is_empty() => true,
            Some(prefixes) => prefixes.iter().any(|prefix| {
                prefix_matches(&event.namespace, prefix)
                    && self
                        .depth
                        .is_none_or(|depth| event.namespace.len() - prefix.len() <= depth)
            }),
        }
    }
}

/// Whether `namespace` starts with `prefix`; a prefix segment without `:` (`tools`) also
/// matches a segment that adds an id to it (`tools:c1`), as the reference server matches.
fn prefix_matches(namespace: &[String], prefix: &[String]) -> bool {
    prefix.len() <= namespace.len()
        && prefix.iter().zip(namespace).all(|(want, have)| {
            want == have || (!want.contains(':') && have.split(':').next() == Some(want.as_str()))
        })
}

/// How a run ended, for its last lifecycle event.
pub enum Outcome {
    /// It answered.
    Completed,
    /// It paused for decisions, or was cancelled.
    Interrupted,
    /// It failed, for this reason.
    Failed(String),
}

/// A content block being streamed.
enum Block {
    Text(String),
    Reasoning(String),
    Call {
        id: Option<String>,
        name: Option<String>,
        args: String,
    },
}

impl Block {
    fn start(&self) -> Value {
        match self {
            Self::Text(_) => json!({"type": "text", "text": ""}),
            Self::Reasoning(_) => json!({"type": "reasoning", "reasoning": ""}),
            Self::Call { id, name, .. } => {
                json!({"type": "tool_call_chunk", "id": id, "name": name, "args": ""})
            }
        }
    }

    fn finished(&self) -> Value {
        match self {
            Self::Text(text) => json!({"type": "text", "text": text}),
            Self::Reasoning(text) => json!({"type": "reasoning", "reasoning": text}),
            Self::Call { id, name, args } => {
                // The finished block carries parsed arguments; a model that sent malformed
                // JSON shows as an invalid call, as LangChain reports it.
                match serde_json::from_str::<Value>(if args.trim().is_empty() {
                    "{}"
                } else {
                    args
                }) {
                    Ok(parsed) => {
                        json!({"type": "tool_call", "id": id, "name": name, "args": parsed})
                    }
                    Err(error) => {
                        json!({"type": "invalid_tool_call", "id": id, "name": name, "args": args, "error": error.to_string()})
                    }
                }
            }
        }
    }
}

/// An assistant message streaming in one namespace.
struct Streaming {
    id: String,
    blocks: Vec<Block>,
    /// The block receiving deltas now; blocks never interleave, so the previous one is
    /// finished when another starts.
    open: Option<usize>,
    /// Blocks that got deltas after they were finished (a model going back to an earlier
    /// tool call): finished again when the message ends.
    reopened: Vec<usize>,
    /// Tool-call position in the model's turn → its block.
    calls: HashMap<usize, usize>,
}

/// Writes one run's protocol events to its thread's tape.
pub struct RunTape {
    tape: Arc<Tape>,
    run_id: String,
    graph: String,
    /// Messages of the thread already in a `values` event; the next one's index names it.
    reported: usize,
    /// How the thread's messages are named (a forked thread's carry their fork).
    ids: convert::MessageIds,
    /// The checkpoint of the latest step, the parent of the next.
    checkpoint: Option<u64>,
    /// Messages streaming now, by namespace.
    streams: HashMap<Vec<String>, Streaming>,
    /// How many messages each subagent namespace streamed, for their ids.
    counts: HashMap<Vec<String>, usize>,
    /// Subagent namespaces and whether each is still going.
    agents: BTreeMap<Vec<String>, bool>,
    /// The model of each agent, for message metadata.
    models: HashMap<Vec<String>, String>,
    /// The interrupt announced (the root's terminal event then was sent).
    interrupted: Option<String>,
}

/// The namespace of an agent at `path`.
fn namespace_of(path: &[deepagents::core::event::PathSegment]) -> Vec<String> {
    path.iter()
        .map(|segment| format!("tools:{}", segment.call_id))
        .collect()
}

fn with_call(namespace: &[String], call_id: &str) -> Vec<String> {
    let mut namespace = namespace.to_vec();
    namespace.push(format!("tools:{call_id}"));
    namespace
}

impl RunTape {
    /// Starts run `run_id` of graph `graph` on `tape`: the root's `running` event, and for a
    /// resume (`resume` of the run's payload) the interrupt it answers (`input.answered`).
    /// `before` is the thread as the run found it.
    pub fn start(
        tape: Arc<Tape>,
        run_id: &str,
        graph: &str,
        before: Option<&Run>,
        resume: Option<&Value>,
    ) -> Self {
        {
            let mut inner = lock(&tape.inner);
            inner.tree.clear();
            // Messages past what the run starts from are gone (a fork restored an earlier
            // state): so are the ids given for them.
            let kept = before.map_or(0, |run| run.state.messages.len());
            inner.client_ids.retain(|index, _| *index < kept);
        }
        let run = Self {
            tape,
            run_id: run_id.to_owned(),
            graph: graph.to_owned(),
            reported: before.map_or(0, |run| run.state.messages.len()),
            ids: convert::MessageIds::default(),
            checkpoint: None,
            streams: HashMap::new(),
            counts: HashMap::new(),
            agents: BTreeMap::new(),
            models: HashMap::new(),
            interrupted: None,
        };
        run.lifecycle(&[], "running", None, None);
        let answered = resume.and_then(convert::resume_interrupt).or_else(|| {
            before
                .filter(|run| resume.is_some() && !run.control.pending.is_empty())
                .map(convert::interrupt_id)
        });
        if let Some(id) = answered {
            run.tape.push(
                "input.answered",
                &[],
                json!({"interrupt_ids": [id]}),
                None,
                Some(format!("synth:{}:answered|{id}", run.run_id)),
            );
        }
        run
    }

    /// Names the thread's messages by `ids` (those of a forked thread), as its state does.
    pub fn with_ids(mut self, ids: convert::MessageIds) -> Self {
        self.ids = ids;
        self
    }

    /// The run's `input` (`{"messages": [...]}`): the id a client gave the user message it
    /// adds names that message in the `values` and `updates` sent from now on.
    pub fn with_input(self, input: Option<&Value>) -> Self {
        let id = input
            .and_then(|input| input.get("messages"))
            .and_then(Value::as_array)
            .and_then(|messages| {
                messages.iter().rev().find(|message| {
                    matches!(
                        message
                            .get("type")
                            .or_else(|| message.get("role"))
                            .and_then(Value::as_str),
                        Some("human" | "user")
                    )
                })
            })
            .and_then(|message| message.get("id"))
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty());
        if let Some(id) = id {
            lock(&self.tape.inner)
                .client_ids
                .insert(self.reported, id.to_owned());
        }
        self
    }

    /// `messages` (from position `from` of the thread) with the ids clients gave them.
    fn named_by_clients(&self, messages: &mut [Value], from: usize) {
        let inner = lock(&self.tape.inner);
        for (index, id) in inner.client_ids.range(from..) {
            if let Some(message) = messages.get_mut(index - from) {
                message["id"] = Value::String(id.clone());
            }
        }
    }

    /// A lifecycle event: `status` of the agent at `namespace`. Its id names the run
    /// (`synth:RUN:…`), which is how the SDK tells one run's events from another's.
    fn lifecycle(
        &self,
        namespace: &[String],
        status: &'static str,
        extra: Option<Value>,
        name: Option<&str>,
    ) {
        let graph_name = name.map_or_else(
            || {
                namespace
                    .last()
                    .map_or_else(|| self.graph.clone(), |last| last.clone())
            },
            str::to_owned,
        );
        let mut data = json!({"event": status, "graph_name": graph_name});
        if let (Some(Value::Object(extra)), Value::Object(map)) = (extra, &mut data) {
            map.extend(extra);
        }
        self.tape.set_node(namespace, status, &graph_name);
        self.tape.push(
            "lifecycle",
            namespace,
            data,
            None,
            Some(format!(
                "synth:{}:lc|{}|{status}",
                self.run_id,
                namespace.join("/")
            )),
        );
    }

    fn message(&self, namespace: &[String], data: Value) {
        self.tape
            .push("messages", namespace, data, Some("model"), None);
    }

    /// An event of the run.
    pub fn event(&mut self, event: &Event) {
        let namespace = namespace_of(&event.path);
        match &event.kind {
            EventKind::RunStarted { agent, model, .. } => {
                self.models.insert(namespace.clone(), model.clone());
                if let Some(segment) = event.path.last() {
                    self.agents.insert(namespace.clone(), true);
                    self.lifecycle(
                        &namespace,
                        "started",
                        Some(
                            json!({"cause": {"type": "toolCall", "tool_call_id": segment.call_id}}),
                        ),
                        Some(agent),
                    );
                }
            }
            EventKind::ModelCallStarted { .. } => self.end_message(&namespace, None),
            EventKind::TextDelta { text } => {
                let index = self.block(&namespace, None, || Block::Text(String::new()));
                self.append(&namespace, index, text);
                self.message(
                    &namespace,
                    json!({"event": "content-block-delta", "index": index, "delta": {"type": "text-delta", "text": text}}),
                );
            }
            EventKind::ReasoningDelta { text } => {
                let index = self.block(&namespace, None, || Block::Reasoning(String::new()));
                self.append(&namespace, index, text);
                self.message(
                    &namespace,
                    json!({"event": "content-block-delta", "index": index, "delta": {"type": "reasoning-delta", "reasoning": text}}),
                );
            }
            EventKind::ToolCallDelta {
                index: call,
                call_id,
                name,
                arguments_delta,
            } => {
                let index = self.block(&namespace, Some(*call), || Block::Call {
                    id: call_id.clone(),
                    name: name.clone(),
                    args: String::new(),
                });
                self.append(&namespace, index, arguments_delta);
                if !arguments_delta.is_empty() {
                    self.message(
                        &namespace,
                        json!({"event": "content-block-delta", "index": index, "delta": {"type": "tool-call-delta", "args": arguments_delta}}),
                    );
                }
            }
            EventKind::ModelCallFinished {
                usage, stop_reason, ..
            } => {
                let reason = match stop_reason {
                    deepagents::core::StopReason::EndTurn
                    | deepagents::core::StopReason::StopSequence => "stop".to_owned(),
                    deepagents::core::StopReason::ToolUse => "tool_calls".to_owned(),
                    deepagents::core::StopReason::MaxTokens => "length".to_owned(),
                    deepagents::core::StopReason::ContentFilter => "content_filter".to_owned(),
                    deepagents::core::StopReason::Other(other) => other.clone(),
                };
                let usage = json!({
                    "input_tokens": usage.input_tokens,
                    "output_tokens": usage.output_tokens,
                    "total_tokens": usage.input_tokens + usage.output_tokens,
                    "input_token_details": {"cache_read": usage.cached_input_tokens},
                });
                self.end_message(&namespace, Some((reason, usage)));
            }
            EventKind::ToolCallStarted {
                call_id,
                name,
                arguments,
            } => {
                self.tape.push(
                    "tools",
                    &with_call(&namespace, call_id),
                    json!({"event": "tool-started", "tool_call_id": call_id, "tool_name": name, "input": arguments}),
                    Some("tools"),
                    None,
                );
            }
            EventKind::ToolOutputDelta { call_id, text, .. } => {
                self.tape.push(
                    "tools",
                    &with_call(&namespace, call_id),
                    json!({"event": "tool-output-delta", "tool_call_id": call_id, "delta": text}),
                    Some("tools"),
                    None,
                );
            }
            EventKind::ToolCallFinished {
                call_id,
                name,
                status,
                content,
                ..
            } => self.tool_finished(&namespace, call_id, name, *status, content),
            EventKind::Final { .. } if !event.path.is_empty() => {
                self.agent_ended(&namespace, None);
            }
            EventKind::Error { message, .. } if !event.path.is_empty() => {
                self.agent_ended(&namespace, Some(message));
            }
            _ => {}
        }
    }

    fn tool_finished(
        &mut self,
        namespace: &[String],
        call_id: &str,
        name: &str,
        status: ToolStatus,
        content: &[ContentBlock],
    ) {
        let call_namespace = with_call(namespace, call_id);
        let text = deepagents::core::content::joined_text(content);
        let data = match status {
            ToolStatus::Ok => {
                json!({"event": "tool-finished", "tool_call_id": call_id, "output": text})
            }
            ToolStatus::Error => {
                json!({"event": "tool-error", "tool_call_id": call_id, "message": text})
            }
        };
        self.tape
            .push("tools", &call_namespace, data, Some("tools"), None);
        // The result as a tool message in the call's namespace, as the reference server
        // mirrors it, for views of a subagent's transcript; the root's come with `values`.
        let id = format!("tool-{call_id}");
        for data in [
            json!({"event": "message-start", "role": "tool", "id": id, "tool_call_id": call_id, "name": name}),
            json!({"event": "content-block-start", "index": 0, "content": {"type": "text", "text": ""}}),
            json!({"event": "content-block-delta", "index": 0, "delta": {"type": "text-delta", "text": text}}),
            json!({"event": "content-block-finish", "index": 0, "content": {"type": "text", "text": text}}),
            json!({"event": "message-finish"}),
        ] {
            self.tape
                .push("messages", &call_namespace, data, Some("tools"), None);
        }
        // A subagent's call ended with it, whatever the subagent said last.
        if self.agents.get(&call_namespace) == Some(&true) {
            let error = (status == ToolStatus::Error).then_some(text);
            self.agent_ended(&call_namespace, error.as_deref());
        }
    }

    fn agent_ended(&mut self, namespace: &[String], error: Option<&str>) {
        if self.agents.get(namespace) != Some(&true) {
            return;
        }
        self.end_message(namespace, None);
        self.agents.insert(namespace.to_vec(), false);
        match error {
            None => self.lifecycle(namespace, "completed", None, None),
            Some(error) => self.lifecycle(namespace, "failed", Some(json!({"error": error})), None),
        }
    }

    /// The block a delta goes to, started (with the message, when it is the first) if
    /// needed; `call` is the tool call's position for a tool-call delta.
    fn block(
        &mut self,
        namespace: &[String],
        call: Option<usize>,
        new: impl FnOnce() -> Block,
    ) -> usize {
        if !self.streams.contains_key(namespace) {
            let id = if namespace.is_empty() {
                self.ids.id(self.reported)
            } else {
                let count = self.counts.entry(namespace.to_vec()).or_insert(0);
                *count += 1;
                format!(
                    "{}-ai-{count}",
                    namespace.last().map_or("agent", String::as_str)
                )
            };
            let mut metadata = json!({"run_id": self.run_id});
            if let Some(model) = self.models.get(namespace) {
                metadata["model"] = Value::String(model.clone());
            }
            self.message(
                namespace,
                json!({"event": "message-start", "role": "ai", "id": id, "metadata": metadata}),
            );
            self.streams.insert(
                namespace.to_vec(),
                Streaming {
                    id,
                    blocks: Vec::new(),
                    open: None,
                    reopened: Vec::new(),
                    calls: HashMap::new(),
                },
            );
        }
        let Some(stream) = self.streams.get_mut(namespace) else {
            return 0;
        };
        let block = new();
        // The open block takes the delta when it is of the same kind (and the same call).
        let existing = match call {
            Some(call) => stream.calls.get(&call).copied(),
            None => stream.open.filter(|open| {
                matches!(
                    (&stream.blocks[*open], &block),
                    (Block::Text(_), Block::Text(_)) | (Block::Reasoning(_), Block::Reasoning(_))
                )
            }),
        };
        let mut events = Vec::new();
        let index = match existing {
            Some(index) => {
                if stream.open != Some(index) && !stream.reopened.contains(&index) {
                    stream.reopened.push(index);
                }
                index
            }
            None => {
                if let Some(open) = stream.open.take() {
                    events.push(json!({"event": "content-block-finish", "index": open, "content": stream.blocks[open].finished()}));
                }
                let index = stream.blocks.len();
                events.push(
                    json!({"event": "content-block-start", "index": index, "content": block.start()}),
                );
                stream.blocks.push(block);
                if let Some(call) = call {
                    stream.calls.insert(call, index);
                }
                stream.open = Some(index);
                index
            }
        };
        for data in events {
            self.message(namespace, data);
        }
        index
    }

    fn append(&mut self, namespace: &[String], index: usize, text: &str) {
        if let Some(block) = self
            .streams
            .get_mut(namespace)
            .and_then(|stream| stream.blocks.get_mut(index))
        {
            match block {
                Block::Text(all) | Block::Reasoning(all) => all.push_str(text),
                Block::Call { args, .. } => args.push_str(text),
            }
        }
    }

    /// Ends the message streaming in `namespace`, if one is: its open blocks finish, then
    /// the message (with why the model stopped and its usage, when known).
    fn end_message(&mut self, namespace: &[String], finish: Option<(String, Value)>) {
        let Some(stream) = self.streams.remove(namespace) else {
            return;
        };
        let mut finishing: Vec<usize> = stream.open.into_iter().collect();
        finishing.extend(
            stream
                .reopened
                .iter()
                .filter(|index| Some(**index) != stream.open),
        );
        for index in finishing {
            self.message(
                namespace,
                json!({"event": "content-block-finish", "index": index, "content": stream.blocks[index].finished()}),
            );
        }
        let mut data = json!({"event": "message-finish", "id": stream.id});
        if let Some((reason, usage)) = finish {
            data["reason"] = Value::String(reason);
            data["usage"] = usage;
        }
        self.message(namespace, data);
    }

    /// A step the run saved: what changed (`updates`), its checkpoint (`checkpoints`), the
    /// thread's state (`values`: `values`, the step's values as [`convert::values_named`]
    /// makes them with this tape's message ids, sent without `__interrupt__`), and the
    /// interrupt it waits on (`input.requested`, then the root's `interrupted`).
    pub fn step(&mut self, step: &Step, mut values: Value) {
        let run = &step.run;
        let messages = &run.state.messages;
        let from = self.reported.min(messages.len());
        let mut new = convert::messages_named(run, from, &self.ids);
        self.named_by_clients(&mut new, from);
        let new_is_empty = new.is_empty();
        // A step that only adds the user's input is LangGraph's input checkpoint.
        let input = messages[from..]
            .iter()
            .all(|message| matches!(message, Message::User { .. }));
        if !new.is_empty() {
            let node = match messages.last() {
                Some(Message::Assistant(_)) => "model",
                Some(Message::Tool(_)) => "tools",
                _ => "__input__",
            };
            let mut update = Map::new();
            update.insert("messages".to_owned(), Value::Array(new));
            if node == "tools" {
                update.insert(
                    "todos".to_owned(),
                    serde_json::to_value(&run.state.todos).unwrap_or(Value::Null),
                );
            }
            let mut data = Map::new();
            data.insert("node".to_owned(), Value::String(node.to_owned()));
            data.insert("values".to_owned(), Value::Object(update));
            self.tape
                .push("updates", &[], Value::Object(data), Some(node), None);
        }
        // `step` is the checkpoint id: it grows across the thread's turns (the run's own
        // step count starts again at each input), which is what the SDK orders snapshots by.
        let mut checkpoint = json!({
            "id": step.checkpoint.to_string(),
            "step": step.checkpoint,
            "source": if input && !new_is_empty { "input" } else { "loop" },
        });
        if let Some(parent) = self.checkpoint {
            checkpoint["parent_id"] = Value::String(parent.to_string());
        }
        self.tape.push("checkpoints", &[], checkpoint, None, None);
        if let Value::Object(map) = &mut values {
            map.remove("__interrupt__");
        }
        if let Some(Value::Array(messages)) = values.get_mut("messages") {
            self.named_by_clients(messages, 0);
        }
        self.tape.push("values", &[], values, None, None);
        self.checkpoint = Some(step.checkpoint);
        self.reported = messages.len();
        if !run.control.pending.is_empty() {
            let id = convert::interrupt_id(run);
            if self.interrupted.as_deref() != Some(id.as_str()) {
                let payload = convert::interrupts(&run.control.pending, &id)
                    .get(0)
                    .and_then(|interrupt| interrupt.get("value"))
                    .cloned()
                    .unwrap_or(Value::Null);
                self.tape.push(
                    "input.requested",
                    &[],
                    json!({"interrupt_id": id, "payload": payload}),
                    None,
                    Some(format!("synth:{}:input||{id}", self.run_id)),
                );
                // The run stops here: clients may offer the decision now.
                self.close_all();
                self.lifecycle(&[], "interrupted", None, None);
                self.interrupted = Some(id);
            }
        }
    }

    /// Ends every message still streaming and every subagent still going.
    fn close_all(&mut self) {
        let streaming: Vec<Vec<String>> = self.streams.keys().cloned().collect();
        for namespace in streaming {
            self.end_message(&namespace, None);
        }
        // Deepest first, as nested agents end before the ones that started them.
        let going: Vec<Vec<String>> = self
            .agents
            .iter()
            .rev()
            .filter(|(_, going)| **going)
            .map(|(namespace, _)| namespace.clone())
            .collect();
        for namespace in going {
            self.agent_ended(&namespace, None);
        }
    }

    /// The run ended: the root's last lifecycle event.
    pub fn finish(mut self, outcome: Outcome) {
        self.close_all();
        match outcome {
            // Announced with its interrupt already.
            Outcome::Interrupted if self.interrupted.is_some() => {}
            Outcome::Interrupted => self.lifecycle(&[], "interrupted", None, None),
            Outcome::Completed => self.lifecycle(&[], "completed", None, None),
            Outcome::Failed(error) => {
                self.lifecycle(&[], "failed", Some(json!({"error": error})), None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(method: &'static str, namespace: &[&str]) -> Recorded {
        Recorded {
            seq: 1,
            method,
            namespace: namespace.iter().map(|s| (*s).to_owned()).collect(),
            json: String::new(),
        }
    }

    #[test]
    fn filters_match_channels_namespace_prefixes_and_depth() {
        let root_pump = Filter {
            channels: vec!["messages".into(), "input".into(), "tools".into()],
            namespaces: Some(vec![vec![]]),
            depth: Some(1),
        };
        assert!(root_pump.wants(&recorded("messages", &[])));
        assert!(root_pump.wants(&recorded("input.requested", &[])));
        assert!(root_pump.wants(&recorded("tools", &["tools:c1"])));
        assert!(!root_pump.wants(&recorded("tools", &["tools:t1", "tools:c2"])));
        assert!(!root_pump.wants(&recorded("values", &[])));
        let subagent = Filter {
            channels: vec!["messages".into()],
            namespaces: Some(vec![vec!["tools".into()]]),
            depth: None,
        };
        assert!(subagent.wants(&recorded("messages", &["tools:t1", "tools:c2"])));
        assert!(!subagent.wants(&recorded("messages", &[])));
        let exact = Filter {
            channels: vec!["lifecycle".into()],
            namespaces: Some(vec![vec!["tools:t1".into()]]),
            depth: Some(0),
        };
        assert!(exact.wants(&recorded("lifecycle", &["tools:t1"])));
        assert!(!exact.wants(&recorded("lifecycle", &["tools:t2"])));
        assert!(!exact.wants(&recorded("lifecycle", &["tools:t1", "tools:x"])));
    }

    #[test]
    fn a_tape_numbers_events_across_runs_and_replays_after_any_number() {
        let tapes = Tapes::default();
        let tape = tapes.tape("t:a");
        let first = RunTape::start(Arc::clone(&tape), "r1", "agent", None, None);
        first.finish(Outcome::Completed);
        let second = RunTape::start(Arc::clone(&tape), "r2", "agent", None, None);
        second.finish(Outcome::Failed("broke".into()));
        let (all, _) = tape.since(0);
        let base = all[0].seq - 1;
        let seqs: Vec<u64> = all.iter().map(|event| event.seq - base).collect();
        assert_eq!(seqs, [1, 2, 3, 4]);
        let (later, _) = tape.since(base + 2);
        assert_eq!(later.len(), 2);
        let last: Value = serde_json::from_str(&later[1].json).unwrap_or_default();
        assert_eq!(last["params"]["data"]["event"], "failed");
        assert_eq!(last["event_id"], "synth:r2:lc||failed");
        // The same tape is found again; a cleared one keeps counting.
        assert!(Arc::ptr_eq(&tape, &tapes.tape("t:a")));
        tapes.clear("t:a");
        assert!(tape.since(0).0.is_empty());
        assert_eq!(tape.last_seq(), base + 4);
        // Another tape of the thread (after a restart, a millisecond or more later) numbers on
        // from where this one was.
        std::thread::sleep(Duration::from_millis(2));
        assert!(Tape::default().last_seq() >= base + 4);
    }
}
