//! A run's stream: the frames each stream mode gets, kept in order so any client can join
//! it later and resume after the last frame it saw (`Last-Event-ID`).

use std::sync::{Arc, Mutex, PoisonError};

use serde_json::Value;
use tokio::sync::watch;

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

impl deepagents_langgraph::FrameSink for FrameLog {
    fn push(&self, mode: &str, data: &Value) {
        FrameLog::push(self, mode, data);
    }
}
