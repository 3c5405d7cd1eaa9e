//! Delivery of events to whoever listens.

use deepagents_core::{AgentPath, Event, EventKind};
use tokio::sync::mpsc;

/// Where a run sends its events; cheap to clone.
///
/// Delivery never blocks the run: the channel is unbounded, and a listener that went away is
/// ignored.
#[derive(Clone, Debug, Default)]
pub struct EventSink {
    sender: Option<mpsc::UnboundedSender<Event>>,
    path: AgentPath,
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
        };
        (sink, receiver)
    }

    /// A sink for a nested agent: its events carry this path plus `segments`.
    pub fn nested(&self, segments: impl IntoIterator<Item = String>) -> Self {
        let mut path = self.path.clone();
        path.extend(segments);
        Self {
            sender: self.sender.clone(),
            path,
        }
    }

    /// The path stamped on this sink's events.
    pub fn path(&self) -> &AgentPath {
        &self.path
    }

    /// Sends one event.
    pub fn emit(&self, kind: EventKind) {
        if let Some(sender) = &self.sender {
            // A closed channel means nobody listens any more; the run goes on regardless.
            let _ = sender.send(Event {
                path: self.path.clone(),
                kind,
            });
        }
    }
}
