//! The assistants: this server's agents, as the API lists them.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use serde_json::{Value, json};

use super::request::{Count, Object, Typed, count_or};
use super::{AppState, Shared, matches};
use crate::Assistant;
use crate::error::ApiResult;
use serde::Deserialize;

pub(super) fn assistant_json(assistant: &Assistant, at: &str) -> Value {
    json!({
        "assistant_id": assistant.id(),
        "graph_id": assistant.graph_id,
        "name": assistant.name,
        "description": assistant.description,
        "config": {},
        "context": {},
        "metadata": {"created_by": "system"},
        "version": 1,
        "created_at": at,
        "updated_at": at,
    })
}

/// The payload of `POST /assistants/search` and `/assistants/count`.
#[derive(Default, Deserialize)]
#[serde(default)]
pub(super) struct AssistantSearch {
    graph_id: Option<String>,
    name: Option<String>,
    metadata: Option<Object>,
    limit: Option<Count>,
    offset: Option<Count>,
}

pub(super) fn assistants_matching<'a>(
    shared: &'a Shared,
    search: &AssistantSearch,
) -> Vec<&'a Arc<Assistant>> {
    shared
        .assistants
        .iter()
        .filter(|a| search.graph_id.as_ref().is_none_or(|g| *g == a.graph_id))
        .filter(|a| search.name.as_ref().is_none_or(|n| *n == a.name))
        .filter(|_| matches(&json!({"created_by": "system"}), search.metadata.as_ref()))
        .collect()
}

pub(super) async fn assistants_search(
    State(shared): State<AppState>,
    Typed(search): Typed<AssistantSearch>,
) -> ApiResult<Json<Vec<Value>>> {
    let (limit, offset) = (count_or(search.limit, 10), count_or(search.offset, 0));
    Ok(Json(
        assistants_matching(&shared, &search)
            .into_iter()
            .skip(offset)
            .take(limit)
            .map(|a| assistant_json(a, &shared.started_at))
            .collect(),
    ))
}

pub(super) async fn assistants_count(
    State(shared): State<AppState>,
    Typed(search): Typed<AssistantSearch>,
) -> Json<usize> {
    Json(assistants_matching(&shared, &search).len())
}

pub(super) async fn assistant_get(
    State(shared): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    Ok(Json(assistant_json(
        &*shared.assistant(&id)?,
        &shared.started_at,
    )))
}

pub(super) async fn assistant_schemas(
    State(shared): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let assistant = shared.assistant(&id)?;
    let messages = json!({"type": "array", "items": {"type": "object"}});
    Ok(Json(json!({
        "graph_id": assistant.graph_id,
        "input_schema": {"type": "object", "properties": {"messages": messages}},
        "output_schema": {"type": "object", "properties": {"messages": messages, "todos": {"type": "array"}, "files": {"type": "object"}, "structured_response": {}}},
        "state_schema": {"type": "object", "properties": {"messages": messages, "todos": {"type": "array"}, "files": {"type": "object"}}},
        "config_schema": {"type": "object", "properties": {}},
        "context_schema": {"type": "object", "properties": {}},
    })))
}

/// The agent's loop as LangGraph draws a graph (what LangGraph Studio shows): the model
/// node, the tools node it hands calls to, and back.
pub(super) async fn assistant_graph(
    State(shared): State<AppState>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    shared.assistant(&id)?;
    let node = |name: &str| json!({"id": name, "type": "runnable", "data": {"id": ["deepagents", name], "name": name}});
    Ok(Json(json!({
        "nodes": [
            {"id": "__start__", "type": "schema", "data": "__start__"},
            node("model"),
            node("tools"),
            {"id": "__end__", "type": "schema", "data": "__end__"},
        ],
        "edges": [
            {"source": "__start__", "target": "model"},
            {"source": "model", "target": "tools", "conditional": true},
            {"source": "model", "target": "__end__", "conditional": true},
            {"source": "tools", "target": "model"},
        ],
    })))
}

/// Subagents run as the `task` tool, not as subgraphs: there are none to list.
pub(super) async fn assistant_subgraphs(
    State(shared): State<AppState>,
    Path(params): Path<Vec<(String, String)>>,
) -> ApiResult<Json<Value>> {
    let id = params
        .iter()
        .find(|(name, _)| name == "assistant_id")
        .map(|(_, value)| value.as_str())
        .unwrap_or_default();
    shared.assistant(id)?;
    Ok(Json(json!({})))
}
