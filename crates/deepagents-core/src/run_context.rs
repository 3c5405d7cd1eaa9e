//! What one run is: its identity, its channels and its per-run scratch space, handed to every
//! middleware hook and (inside [`ToolContext`](crate::ToolContext)) to every tool call.
//!
//! One agent value serves many runs at once; anything a middleware or tool must remember for
//! the length of a run goes in the run's [`Extensions`], never in the middleware itself.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

use crate::checkpoint::Checkpointing;
use crate::event::{AgentPath, EventSink};
use crate::spend::Budget;
use crate::tool::RuntimeContext;

/// The limits one run works under. The agent's builder sets the defaults; a run may set its
/// own (`RunOptions::limits` in the harness).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunLimits {
    /// Model calls the run may make before it stops with a turn-limit error.
    pub max_turns: u32,
    /// How deep subagents may nest below this run's agent (1: its subagents start none).
    pub subagent_depth: usize,
    /// How many subagents of this run's whole tree may work at once.
    pub subagent_concurrency: usize,
}

impl Default for RunLimits {
    fn default() -> Self {
        Self {
            max_turns: 100,
            subagent_depth: 3,
            subagent_concurrency: 8,
        }
    }
}

/// One run, as middleware and tools see it.
#[derive(Clone, Debug)]
pub struct RunContext {
    /// The conversation thread the run belongs to, if any. A subagent's run reports its
    /// top-level thread, so per-thread storage is shared by the whole tree.
    pub thread_id: Option<String>,
    /// Who the run acts for: the id the application gave (`RunOptions::assistant_id`), else
    /// the name of the top-level agent. Store namespaces are often keyed by it.
    pub assistant_id: String,
    /// The name of the agent this run drives (a subagent's own name inside a subagent).
    pub agent: String,
    /// Where the run's events go; its path names the agent (`[]` for the top-level one).
    pub events: EventSink,
    /// Cancelled when the run is cancelled.
    pub cancel: CancellationToken,
    /// Application data for the run.
    pub runtime: RuntimeContext,
    /// Where the run is checkpointed, if it is.
    pub checkpoint: Option<Checkpointing>,
    /// The limits this run works under.
    pub limits: RunLimits,
    /// What the run tree may spend and has spent; subagent runs share their parent's.
    pub budget: Budget,
    /// Typed per-run values: state a middleware or tool keeps for this run only.
    pub extensions: Extensions,
}

impl RunContext {
    /// A context for a run outside any thread, with default limits: for tests and for
    /// calling middleware or tools directly.
    pub fn detached(agent: impl Into<String>) -> Self {
        let agent = agent.into();
        Self {
            thread_id: None,
            assistant_id: agent.clone(),
            agent,
            events: EventSink::discard(),
            cancel: CancellationToken::new(),
            runtime: RuntimeContext::default(),
            checkpoint: None,
            limits: RunLimits::default(),
            budget: Budget::default(),
            extensions: Extensions::default(),
        }
    }

    /// The run's id, as stamped on its events.
    pub fn run_id(&self) -> &str {
        self.events.run_id()
    }

    /// The agent this run drives, as a path from the top-level agent (`[]` for it).
    pub fn agent_path(&self) -> &AgentPath {
        self.events.path()
    }
}

type Entry = Arc<dyn Any + Send + Sync>;

/// A map from type to value, one value per type, shared by every clone: the per-run scratch
/// space of [`RunContext`]. Use a type private to your middleware as the key so no one else
/// can reach its value.
#[derive(Clone, Default)]
pub struct Extensions(Arc<Mutex<HashMap<TypeId, Entry>>>);

impl Extensions {
    /// The `T` of this run, made by `make` the first time it is asked for.
    pub fn get_or_insert_with<T: Any + Send + Sync>(&self, make: impl FnOnce() -> T) -> Arc<T> {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(value) = map
            .get(&TypeId::of::<T>())
            .and_then(|entry| Arc::clone(entry).downcast::<T>().ok())
        {
            return value;
        }
        let value = Arc::new(make());
        map.insert(TypeId::of::<T>(), Arc::clone(&value) as Entry);
        value
    }

    /// The `T` of this run, if one was inserted.
    pub fn get<T: Any + Send + Sync>(&self) -> Option<Arc<T>> {
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(&TypeId::of::<T>())
            .and_then(|entry| Arc::clone(entry).downcast::<T>().ok())
    }

    /// Sets the `T` of this run, returning the one it replaces.
    pub fn insert<T: Any + Send + Sync>(&self, value: T) -> Option<Arc<T>> {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.insert(TypeId::of::<T>(), Arc::new(value))
            .and_then(|old| old.downcast::<T>().ok())
    }
}

impl fmt::Debug for Extensions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.0.lock().map_or(0, |map| map.len());
        write!(f, "Extensions({count} values)")
    }
}
