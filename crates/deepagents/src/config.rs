//! A built agent's configuration: what the loop runs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use deepagents_core::{Checkpointer, Model, ModelSettings, RunLimits, StateSchema, ToolSource};

use crate::approval::InterruptConfig;
use crate::middleware::Middleware;
use crate::registry::ToolRegistry;

/// A built agent's configuration: what the loop runs, shared by every run of the agent
/// and never changed by one.
pub(crate) struct AgentConfig {
    pub(crate) name: String,
    pub(crate) model: Arc<dyn Model>,
    pub(crate) system_prompt: Option<String>,
    pub(crate) settings: ModelSettings,
    pub(crate) middleware: Arc<[Arc<dyn Middleware>]>,
    pub(crate) tools: Arc<ToolRegistry>,
    /// Tools that may change between model calls, offered after `tools`.
    pub(crate) tool_sources: Vec<Arc<dyn ToolSource>>,
    pub(crate) schema: StateSchema,
    /// The limits of a run that sets none ([`RunOptions::limits`]).
    pub(crate) limits: RunLimits,
    /// The spend caps of a run that sets none ([`RunOptions::spend_limits`]).
    pub(crate) spend_limits: deepagents_core::SpendLimits,
    /// The prices model calls are charged at.
    pub(crate) prices: Arc<deepagents_core::PriceBook>,
    /// Whether answers must come through `final_answer`.
    pub(crate) response_format: bool,
    /// Tools whose calls wait for approval.
    pub(crate) interrupts: BTreeMap<String, InterruptConfig>,
    /// Custom keys declared with [`AgentBuilder::state_value`] (not private): the values a
    /// subagent run receives from its parent.
    pub(crate) shared_keys: BTreeSet<String>,
    /// Where threads are saved ([`AgentBuilder::checkpointer`]).
    pub(crate) checkpointer: Option<Arc<dyn Checkpointer>>,
    /// The background tasks of the async subagents, when there are any.
    pub(crate) background: Option<Arc<crate::background::Background>>,
}
