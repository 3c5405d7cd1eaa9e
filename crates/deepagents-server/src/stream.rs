//! A run's stream: the frames each stream mode gets, kept in order so any client can join
//! it later and resume after the last frame it saw (`Last-Event-ID`).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use deepagents::core::{Event, EventKind, Run};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::convert;

/// One server-sent event.
#[derive(Clone, Debug)]
pub struct Frame {
    /// `event:`: the stream mode (with `|namespace` for a subagent's).
    pub event: String,
    /// `data:`: JSON.
    pub data: String,
}

/// What a run's log sends where its frames are published besides (the cluster's Redis
/// stream).
#[cfg(feature = "cluster")]
pub enum Published {
    /// Frame `index`.
    Frame(usize, Frame),
    /// The run ended.
    End,
    /// This server stops publishing; the run goes on elsewhere.
    Stop,
}

/// Where a run's frames are published besides its log.
#[cfg(feature = "cluster")]
pub type Publisher = tokio::sync::mpsc::UnboundedSender<Published>;

/// The frames of one run, growing while it runs.
pub struct FrameLog {
    /// The frames, the first being frame `base` (an earlier attempt of the run, on another
    /// server, sent those before).
    frames: Mutex<Vec<Frame>>,
    base: usize,
    #[cfg(feature = "cluster")]
    publisher: Option<Publisher>,
    /// How many frames there are, and whether the run ended.
    progress: watch::Sender<(usize, bool)>,
}

impl FrameLog {
    /// An empty log.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            frames: Mutex::new(Vec::new()),
            base: 0,
            #[cfg(feature = "cluster")]
            publisher: None,
            progress: watch::channel((0, false)).0,
        })
    }

    /// A log whose first frame is frame `base`, each also sent to `publisher`.
    #[cfg(feature = "cluster")]
    pub fn continuing(base: usize, publisher: Option<Publisher>) -> Arc<Self> {
        Arc::new(Self {
            frames: Mutex::new(Vec::new()),
            base,
            publisher,
            progress: watch::channel((base, false)).0,
        })
    }

    /// Adds a frame.
    pub fn push(&self, event: impl Into<String>, data: &Value) {
        let frame = Frame {
            event: event.into(),
            data: data.to_string(),
        };
        let mut frames = self.frames.lock().unwrap_or_else(PoisonError::into_inner);
        let index = self.base + frames.len();
        #[cfg(feature = "cluster")]
        if let Some(publisher) = &self.publisher {
            let _ = publisher.send(Published::Frame(index, frame.clone()));
        }
        frames.push(frame);
        self.progress.send_modify(|progress| progress.0 = index + 1);
    }

    /// No more frames come.
    pub fn end(&self) {
        #[cfg(feature = "cluster")]
        if let Some(publisher) = &self.publisher {
            let _ = publisher.send(Published::End);
        }
        self.progress.send_modify(|progress| progress.1 = true);
    }

    /// No more frames come from this server, but the run goes on elsewhere: joiners here
    /// stop, those of the cluster's copy wait for the next server's frames.
    #[cfg(feature = "cluster")]
    pub fn end_here(&self) {
        self.progress.send_modify(|progress| progress.1 = true);
    }

    /// Publishes nothing after the frames sent so far.
    #[cfg(feature = "cluster")]
    pub fn stop_publishing(&self) {
        if let Some(publisher) = &self.publisher {
            let _ = publisher.send(Published::Stop);
        }
    }

    /// Whether the run ended.
    pub fn has_ended(&self) -> bool {
        self.progress.borrow().1
    }

    /// Frames from index `from` on, and whether the log has ended.
    pub fn since(&self, from: usize) -> (Vec<(usize, Frame)>, bool) {
        let ended = self.progress.borrow().1;
        let frames = self.frames.lock().unwrap_or_else(PoisonError::into_inner);
        let new = frames
            .iter()
            .enumerate()
            .map(|(i, frame)| (self.base + i, frame))
            .filter(|(i, _)| *i >= from)
            .map(|(i, frame)| (i, frame.clone()))
            .collect();
        (new, ended)
    }

    /// Waits until there are more than `seen` frames or the log ended.
    pub async fn changed(&self, seen: usize) {
        let mut progress = self.progress.subscribe();
        let _ = progress
            .wait_for(|(len, ended)| *len > seen || *ended)
            .await;
    }
}

/// Turns a run's events and saved steps into the frames of the stream modes asked for.
pub struct Framer {
    log: Arc<FrameLog>,
    modes: BTreeSet<String>,
    subgraphs: bool,
    meta: Value,
    /// Messages of the run already reported (the next one's index is its id).
    reported: usize,
    /// The checkpoint before the latest step, for `parent_checkpoint`.
    checkpoint: Option<u64>,
    /// The text of the AI message streaming now, for `messages/partial`.
    partial: String,
    /// Whether `messages/metadata` was sent for the message streaming now.
    partial_announced: bool,
    /// The step of the model call streaming now.
    step: u32,
}

/// The stream modes the API knows.
pub const MODES: [&str; 8] = [
    "values",
    "updates",
    "messages",
    "messages-tuple",
    "events",
    "custom",
    "debug",
    "checkpoints",
];

impl Framer {
    /// Frames for `modes` into `log`; `meta` is the metadata `messages` frames carry.
    pub fn new(
        log: Arc<FrameLog>,
        modes: BTreeSet<String>,
        subgraphs: bool,
        meta: Value,
        run: Option<&Run>,
    ) -> Self {
        Self {
            log,
            modes,
            subgraphs,
            meta,
            reported: run.map_or(0, |run| run.state.messages.len()),
            checkpoint: None,
            partial: String::new(),
            partial_announced: false,
            step: 0,
        }
    }

    fn wants(&self, mode: &str) -> bool {
        self.modes.contains(mode)
    }

    /// The name of a frame of `mode` for an event at `path`: `mode|tools:call` per level.
    fn name(mode: &str, event: &Event) -> String {
        let mut name = mode.to_owned();
        for segment in &event.path {
            name.push_str(&format!("|tools:{}", segment.call_id));
        }
        name
    }

    fn message_meta(&self, node: &str) -> Value {
        let mut meta = self.meta.clone();
        meta["langgraph_node"] = Value::String(node.to_owned());
        meta["langgraph_step"] = json!(self.step);
        meta
    }

    /// An event of the run.
    pub fn event(&mut self, event: &Event) {
        let nested = !event.path.is_empty();
        if nested && !self.subgraphs {
            return;
        }
        if self.wants("custom")
            && let Ok(data) = serde_json::to_value(event)
        {
            self.log.push(Self::name("custom", event), &data);
        }
        let id = convert::message_id(self.reported);
        match &event.kind {
            EventKind::ModelCallStarted { step } if !nested => {
                self.step = *step;
                self.partial.clear();
                self.partial_announced = false;
            }
            EventKind::TextDelta { text } => {
                let chunk = json!({"type": "AIMessageChunk", "id": id, "content": text, "tool_call_chunks": []});
                self.model_chunk(event, chunk, text, &id);
            }
            EventKind::ToolCallDelta {
                index,
                call_id,
                name,
                arguments_delta,
            } => {
                let chunk = json!({
                    "type": "AIMessageChunk",
                    "id": id,
                    "content": "",
                    "tool_call_chunks": [{
                        "type": "tool_call_chunk",
                        "index": index,
                        "id": call_id,
                        "name": name,
                        "args": arguments_delta,
                    }],
                });
                self.model_chunk(event, chunk, "", &id);
            }
            EventKind::ToolCallStarted {
                call_id,
                name,
                arguments,
            } if self.wants("events") => {
                let data = json!({"event": "on_tool_start", "name": name, "run_id": call_id, "data": {"input": arguments}, "metadata": self.message_meta("tools")});
                self.log.push(Self::name("events", event), &data);
            }
            EventKind::ToolCallFinished {
                call_id,
                name,
                content,
                ..
            } if self.wants("events") => {
                let data = json!({"event": "on_tool_end", "name": name, "run_id": call_id, "data": {"output": deepagents::core::content::joined_text(content)}, "metadata": self.message_meta("tools")});
                self.log.push(Self::name("events", event), &data);
            }
            _ => {}
        }
    }

    fn model_chunk(&mut self, event: &Event, chunk: Value, text: &str, id: &str) {
        if self.wants("messages-tuple") {
            let meta = self.message_meta("model");
            self.log
                .push(Self::name("messages", event), &json!([chunk, meta]));
        }
        if self.wants("events") {
            let data = json!({"event": "on_chat_model_stream", "name": "model", "data": {"chunk": chunk}, "metadata": self.message_meta("model")});
            self.log.push(Self::name("events", event), &data);
        }
        if self.wants("messages") && event.path.is_empty() {
            if !self.partial_announced {
                self.partial_announced = true;
                self.log.push(
                    "messages/metadata",
                    &json!({ id: {"metadata": self.message_meta("model")} }),
                );
            }
            self.partial.push_str(text);
            self.log.push(
                "messages/partial",
                &json!([{"type": "ai", "id": id, "content": self.partial, "tool_calls": []}]),
            );
        }
    }

    /// A step the run saved: checkpoint `checkpoint`, the run after it.
    pub fn step(&mut self, checkpoint: u64, run: &Run, interrupt_id: &str) {
        let messages = &run.state.messages;
        let new: Vec<Value> = convert::messages_from(run, self.reported.min(messages.len()));
        let last_is_ai = matches!(
            messages.last(),
            Some(deepagents::core::Message::Assistant(_))
        );
        let only_input = messages
            .iter()
            .skip(self.reported)
            .all(|m| matches!(m, deepagents::core::Message::User { .. }));
        let node = if last_is_ai { "model" } else { "tools" };
        if self.wants("values") {
            self.log.push("values", &convert::values(run, interrupt_id));
        }
        if self.wants("updates") {
            if !new.is_empty() && !only_input {
                let mut update = json!({"messages": new});
                if node == "tools" {
                    update["todos"] = serde_json::to_value(&run.state.todos).unwrap_or(Value::Null);
                }
                self.log.push("updates", &json!({ node: update }));
            }
            if !run.control.pending.is_empty() {
                self.log.push(
                    "updates",
                    &json!({"__interrupt__": convert::interrupts(&run.control.pending, interrupt_id)}),
                );
            }
        }
        if !only_input {
            for (value, message) in new.iter().zip(messages.iter().skip(self.reported)) {
                let tool = matches!(message, deepagents::core::Message::Tool(_));
                if self.wants("messages-tuple") && tool {
                    let meta = self.message_meta("tools");
                    self.log.push("messages", &json!([value, meta]));
                }
                if self.wants("messages") {
                    let node = if tool { "tools" } else { "model" };
                    if (tool || !self.partial_announced)
                        && let Some(id) = value.get("id").and_then(Value::as_str)
                    {
                        self.log.push(
                            "messages/metadata",
                            &json!({ id: {"metadata": self.message_meta(node)} }),
                        );
                    }
                    self.log.push("messages/complete", &json!([value]));
                }
            }
        }
        if self.wants("debug") || self.wants("checkpoints") {
            let payload = json!({
                "config": {"configurable": {"checkpoint_id": checkpoint.to_string(), "checkpoint_ns": ""}},
                "parent_config": self.checkpoint.map(|id| json!({"configurable": {"checkpoint_id": id.to_string(), "checkpoint_ns": ""}})),
                "values": convert::values(run, interrupt_id),
                "metadata": {"step": run.steps},
                "next": if run.control.pending.is_empty() { json!([]) } else { json!(["tools"]) },
            });
            if self.wants("checkpoints") {
                self.log.push("checkpoints", &payload);
            }
            if self.wants("debug") {
                self.log.push(
                    "debug",
                    &json!({"type": "checkpoint", "timestamp": crate::time::rfc3339(crate::time::now_ms()), "step": run.steps, "payload": payload}),
                );
            }
        }
        self.checkpoint = Some(checkpoint);
        self.reported = messages.len();
        self.partial.clear();
        self.partial_announced = false;
    }

    /// The run failed.
    pub fn error(&self, kind: &str, message: &str) {
        self.log
            .push("error", &json!({"error": kind, "message": message}));
    }
}
