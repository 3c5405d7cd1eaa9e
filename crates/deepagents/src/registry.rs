//! The agent's tools, by name.

use std::collections::HashMap;
use std::sync::Arc;

use deepagents_core::{
    DynTool, RunContext, ToolCall, ToolContext, ToolError, ToolOutput, ToolSpec,
};

use crate::config::AgentConfig;
use serde_json::Value;

/// A tool source's tools as last listed, with the version they belong to.
type Listed = (u64, Vec<Arc<dyn DynTool>>);

/// The tools one run is offered: the agent's fixed ones and its tool sources', listed again
/// whenever a source's version changes.
pub(crate) struct OfferedTools {
    /// The tools as of now.
    pub(crate) registry: Arc<ToolRegistry>,
    /// Per tool source: the version last listed and its tools then (`None`: not listed yet).
    sources: Vec<Option<Listed>>,
}

impl OfferedTools {
    /// The agent's fixed tools; its sources are listed by the first [`refresh`](Self::refresh).
    pub(crate) fn new(agent: &AgentConfig) -> Self {
        Self {
            registry: Arc::clone(&agent.tools),
            sources: agent.tool_sources.iter().map(|_| None).collect(),
        }
    }

    /// Lists the tools of the sources whose version changed and rebuilds the offered set.
    pub(crate) async fn refresh(&mut self, agent: &AgentConfig, ctx: &RunContext) {
        let mut changed = false;
        for (source, seen) in agent.tool_sources.iter().zip(&mut self.sources) {
            let version = source.version();
            if seen.as_ref().is_some_and(|(v, _)| *v == version) {
                continue;
            }
            match source.tools(ctx).await {
                Ok(tools) => {
                    *seen = Some((version, tools));
                    changed = true;
                }
                Err(error) => tracing::warn!(
                    target: "deepagents::tools",
                    "{error}; the run keeps the tools it had"
                ),
            }
        }
        if !changed {
            return;
        }
        let listed: Vec<Arc<dyn DynTool>> = self
            .sources
            .iter()
            .flatten()
            .flat_map(|(_, tools)| tools.iter().cloned())
            .collect();
        let (tools, refused) = agent.tools.extended(listed);
        for name in refused {
            tracing::warn!(
                target: "deepagents::tools",
                "a tool source offered `{name}`, whose name is invalid or already taken; it is left out"
            );
        }
        self.registry = Arc::new(tools);
    }
}

/// Tools offered to the model, in offer order, with lookup by name.
pub(crate) struct ToolRegistry {
    specs: Vec<ToolSpec>,
    tools: HashMap<String, Arc<dyn DynTool>>,
}

/// Why a set of tools cannot be registered.
#[derive(Debug)]
pub(crate) enum RegistryError {
    Duplicate(String),
    InvalidName(String),
}

/// Provider limits: OpenAI and Anthropic accept `^[a-zA-Z0-9_-]{1,64}$`.
fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl ToolRegistry {
    pub(crate) fn new(tools: Vec<Arc<dyn DynTool>>) -> Result<Self, RegistryError> {
        let mut specs = Vec::with_capacity(tools.len());
        let mut by_name = HashMap::with_capacity(tools.len());
        for tool in tools {
            let spec = tool.spec();
            if !is_valid_name(&spec.name) {
                return Err(RegistryError::InvalidName(spec.name));
            }
            if by_name.insert(spec.name.clone(), tool).is_some() {
                return Err(RegistryError::Duplicate(spec.name));
            }
            specs.push(spec);
        }
        Ok(Self {
            specs,
            tools: by_name,
        })
    }

    /// These tools plus `extra`, in that order; extra tools whose names are invalid or taken
    /// are left out and named in the second value.
    pub(crate) fn extended(&self, extra: Vec<Arc<dyn DynTool>>) -> (Self, Vec<String>) {
        let mut specs = self.specs.clone();
        let mut tools = self.tools.clone();
        let mut refused = Vec::new();
        for tool in extra {
            let spec = tool.spec();
            if !is_valid_name(&spec.name) || tools.contains_key(&spec.name) {
                refused.push(spec.name);
                continue;
            }
            tools.insert(spec.name.clone(), tool);
            specs.push(spec);
        }
        (Self { specs, tools }, refused)
    }

    pub(crate) fn specs(&self) -> &[ToolSpec] {
        &self.specs
    }

    pub(crate) fn is_mutating(&self, name: &str) -> bool {
        self.tools.get(name).is_some_and(|tool| tool.is_mutating())
    }

    /// Looks the tool up, checks that the arguments are a JSON object, and runs it. Problems
    /// the model caused come back as [`ToolError::RespondToModel`].
    pub(crate) async fn call(
        &self,
        call: ToolCall,
        ctx: ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let Some(tool) = self.tools.get(&call.name) else {
            let names: Vec<&str> = self.specs.iter().map(|s| s.name.as_str()).collect();
            let available = if names.is_empty() {
                "none".to_owned()
            } else {
                names.join(", ")
            };
            return Err(ToolError::RespondToModel(format!(
                "Unknown tool `{}`. Available tools: {available}.",
                call.name
            )));
        };
        let args = arguments_object(&call)?;
        tool.call(args, ctx).await
    }
}

/// The call's arguments as a JSON object. Models sometimes send arguments as a JSON-encoded
/// string; those are decoded, and text that is not JSON is reported with the parser's reason.
fn arguments_object(call: &ToolCall) -> Result<Value, ToolError> {
    let decoded;
    let args = match &call.arguments {
        Value::String(text) => {
            decoded = serde_json::from_str::<Value>(text).map_err(|e| {
                ToolError::RespondToModel(format!(
                    "The arguments of `{}` are not valid JSON ({e}). Send one JSON object that matches the tool's parameters schema.",
                    call.name
                ))
            })?;
            &decoded
        }
        Value::Null => return Ok(Value::Object(serde_json::Map::new())),
        other => other,
    };
    match args {
        Value::Object(_) => Ok(args.clone()),
        other => Err(ToolError::RespondToModel(format!(
            "The arguments of `{}` must be a JSON object, not {}. Send one JSON object that matches the tool's parameters schema.",
            call.name,
            json_kind(other)
        ))),
    }
}

fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
