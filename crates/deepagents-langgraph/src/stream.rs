//! The stream modes of a LangGraph run, built from our run's events and saved steps.

use std::collections::BTreeSet;

use deepagents::core::{Event, EventKind, Run};
use serde_json::{Value, json};

use crate::Step;
use crate::convert;

/// Where a [`Framer`] puts its frames: the server's log of a run, an in-process stream.
pub trait FrameSink {
    /// One frame: `mode` is the stream mode (with `|tools:CALL` per subagent level for a
    /// subagent's), `data` its payload.
    fn push(&self, mode: &str, data: &Value);
}

impl<T: FrameSink + ?Sized> FrameSink for &T {
    fn push(&self, mode: &str, data: &Value) {
        T::push(self, mode, data);
    }
}

impl<T: FrameSink + ?Sized> FrameSink for std::sync::Arc<T> {
    fn push(&self, mode: &str, data: &Value) {
        T::push(self, mode, data);
    }
}

/// Turns a run's events and saved steps into the frames of the stream modes asked for.
pub struct Framer<S> {
    sink: S,
    modes: BTreeSet<String>,
    subgraphs: bool,
    meta: Value,
    /// Messages of the run already reported (the next one's index names it).
    reported: usize,
    /// How the thread's messages are named (a forked thread's carry their fork).
    ids: convert::MessageIds,
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
pub const MODES: [&str; 9] = [
    "values",
    "updates",
    "messages",
    "messages-tuple",
    "events",
    "custom",
    "debug",
    "checkpoints",
    "deepagents",
];

impl<S: FrameSink> Framer<S> {
    /// Frames for `modes` into `sink`; `meta` is the metadata `messages` frames carry;
    /// `run` is the run as it stood before (its messages are not reported again).
    pub fn new(
        sink: S,
        modes: BTreeSet<String>,
        subgraphs: bool,
        meta: Value,
        run: Option<&Run>,
    ) -> Self {
        Self {
            sink,
            modes,
            subgraphs,
            meta,
            reported: run.map_or(0, |run| run.state.messages.len()),
            ids: convert::MessageIds::default(),
            checkpoint: None,
            partial: String::new(),
            partial_announced: false,
            step: 0,
        }
    }

    /// Names the thread's messages by `ids` (those of a forked thread).
    pub fn with_ids(mut self, ids: convert::MessageIds) -> Self {
        self.ids = ids;
        self
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
        // Our own events have their own mode: `custom` is for what the user's code emits,
        // and a LangGraph client listening to it must not get the harness's traffic.
        if self.wants("deepagents")
            && let Ok(data) = serde_json::to_value(event)
        {
            self.sink.push(&Self::name("deepagents", event), &data);
        }
        let id = self.ids.id(self.reported);
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
                self.sink.push(&Self::name("events", event), &data);
            }
            EventKind::ToolCallFinished {
                call_id,
                name,
                content,
                ..
            } if self.wants("events") => {
                let data = json!({"event": "on_tool_end", "name": name, "run_id": call_id, "data": {"output": deepagents::core::content::joined_text(content)}, "metadata": self.message_meta("tools")});
                self.sink.push(&Self::name("events", event), &data);
            }
            _ => {}
        }
    }

    fn model_chunk(&mut self, event: &Event, chunk: Value, text: &str, id: &str) {
        if self.wants("messages-tuple") {
            let meta = self.message_meta("model");
            self.sink
                .push(&Self::name("messages", event), &json!([chunk, meta]));
        }
        if self.wants("events") {
            let data = json!({"event": "on_chat_model_stream", "name": "model", "data": {"chunk": chunk}, "metadata": self.message_meta("model")});
            self.sink.push(&Self::name("events", event), &data);
        }
        if self.wants("messages") && event.path.is_empty() {
            if !self.partial_announced {
                self.partial_announced = true;
                self.sink.push(
                    "messages/metadata",
                    &json!({ id: {"metadata": self.message_meta("model")} }),
                );
            }
            self.partial.push_str(text);
            self.sink.push(
                "messages/partial",
                &json!([{"type": "ai", "id": id, "content": self.partial, "tool_calls": []}]),
            );
        }
    }

    /// A step the run saved.
    pub fn step(&mut self, step: &Step) {
        self.step_with_values(step, None);
    }

    /// Like [`step`](Self::step), given the step's values as
    /// [`convert::values_named`] makes them with this framer's message ids, so a caller that
    /// needs them too makes them once.
    pub fn step_with_values(&mut self, step: &Step, values: Option<&Value>) {
        let (checkpoint, run) = (step.checkpoint, &step.run);
        let interrupt_id = &convert::interrupt_id(run);
        let made;
        let values = match values {
            Some(values) => values,
            None if self.wants("values") || self.wants("debug") || self.wants("checkpoints") => {
                made = convert::values_named(run, interrupt_id, &self.ids);
                &made
            }
            None => &Value::Null,
        };
        let messages = &run.state.messages;
        let new: Vec<Value> =
            convert::messages_named(run, self.reported.min(messages.len()), &self.ids);
        let last_is_ai = matches!(
            messages.last(),
            Some(deepagents::core::Message::Assistant(_))
        );
        let only_input = messages
            .iter()
            .skip(self.reported)
            .all(|m| matches!(m, deepagents::core::Message::User { .. }));
        let node = if last_is_ai { "model" } else { "tools" };
        // A step's message frames go before its `values`, as LangGraph sends a node's
        // messages while it runs: a client that lists messages from both then sees each once.
        if !only_input {
            for (value, message) in new.iter().zip(messages.iter().skip(self.reported)) {
                let tool = matches!(message, deepagents::core::Message::Tool(_));
                if self.wants("messages-tuple") && tool {
                    let meta = self.message_meta("tools");
                    self.sink.push("messages", &json!([value, meta]));
                }
                if self.wants("messages") {
                    let node = if tool { "tools" } else { "model" };
                    if (tool || !self.partial_announced)
                        && let Some(id) = value.get("id").and_then(Value::as_str)
                    {
                        self.sink.push(
                            "messages/metadata",
                            &json!({ id: {"metadata": self.message_meta(node)} }),
                        );
                    }
                    self.sink.push("messages/complete", &json!([value]));
                }
            }
        }
        if self.wants("values") {
            self.sink.push("values", values);
        }
        if self.wants("updates") {
            if !new.is_empty() && !only_input {
                let mut update = json!({"messages": new});
                if node == "tools" {
                    update["todos"] = serde_json::to_value(&run.state.todos).unwrap_or(Value::Null);
                }
                self.sink.push("updates", &json!({ node: update }));
            }
            if !run.control.pending.is_empty() {
                self.sink.push(
                    "updates",
                    &json!({"__interrupt__": convert::interrupts(&run.control.pending, interrupt_id)}),
                );
            }
        }
        if self.wants("debug") || self.wants("checkpoints") {
            let payload = json!({
                "config": {"configurable": {"checkpoint_id": checkpoint.to_string(), "checkpoint_ns": ""}},
                "parent_config": self.checkpoint.map(|id| json!({"configurable": {"checkpoint_id": id.to_string(), "checkpoint_ns": ""}})),
                "values": values,
                "metadata": {"step": run.steps},
                "next": if run.control.pending.is_empty() { json!([]) } else { json!(["tools"]) },
            });
            if self.wants("checkpoints") {
                self.sink.push("checkpoints", &payload);
            }
            if self.wants("debug") {
                self.sink.push(
                    "debug",
                    &json!({"type": "checkpoint", "timestamp": crate::convert::now_rfc3339(), "step": run.steps, "payload": payload}),
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
        self.sink
            .push("error", &json!({"error": kind, "message": message}));
    }
}
