//! A server's tools as agent tools: their names for the model, their calls (bounded by the
//! server's timeout, reporting progress, cancelled with the run) and their results as content.

use std::sync::Arc;

use base64::Engine as _;
use deepagents_core::{ContentBlock, DynamicTool, ToolContext, ToolError, ToolOutput};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CancelledNotification, CancelledNotificationParam,
    ClientNotification, ClientRequest, ProgressToken, RequestId, ServerResult,
};
use rmcp::service::{Peer, PeerRequestOptions, RoleClient};
use serde_json::Value;

use crate::connection::{Live, ProgressTarget, Service};

/// The longest tool name every provider accepts.
pub const MAX_TOOL_NAME: usize = 64;

/// The name a server's tool has for the model: `SERVER__TOOL`, every character but ASCII
/// letters, digits, `_` and `-` replaced by `_`; past 64 characters, cut to 55 and ended
/// with `_` and 8 hex digits of a hash of the full name, so it stays unique and stable.
pub fn tool_name(server: &str, tool: &str) -> String {
    let full = format!("{server}__{tool}");
    let clean: String = full
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.len() <= MAX_TOOL_NAME {
        return clean;
    }
    // FNV-1a: stable across runs and builds, unlike the standard hasher.
    let hash = full.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("{}_{hash:08x}", &clean[..55])
}

/// `tools` (as a server describes them) as agent tools calling through `live`.
pub(crate) fn agent_tools(live: &Arc<Live>, tools: &[Value]) -> Vec<Result<DynamicTool, String>> {
    tools
        .iter()
        .map(|tool| {
            let remote = tool["name"].as_str().unwrap_or_default().to_owned();
            let name = tool_name(&live.config.name, &remote);
            let description = tool["description"].as_str().unwrap_or("").to_owned();
            let schema = match tool.get("inputSchema") {
                Some(schema @ Value::Object(_)) => schema.clone(),
                _ => serde_json::json!({"type": "object"}),
            };
            let read_only = tool["annotations"]["readOnlyHint"].as_bool() == Some(true);
            let live = Arc::clone(live);
            let made = DynamicTool::new(name, description, schema, move |args, ctx| {
                let (live, remote) = (Arc::clone(&live), remote.clone());
                async move { call(&live, &remote, args, ctx).await }
            })
            .map_err(|e| e.to_string())?;
            Ok(if read_only { made } else { made.mutating() })
        })
        .collect()
}

/// While a call runs: its progress goes to the run's events; if it is given up before the
/// server answered (timeout, the run cancelled, the call dropped), the server is told with
/// `notifications/cancelled` so it can stop working on it.
struct CallGuard<'a> {
    live: &'a Live,
    token: ProgressToken,
    pending: Option<(Peer<RoleClient>, RequestId)>,
}

impl Drop for CallGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut routes) = self.live.handler.progress.lock() {
            routes.end(&self.token);
        }
        if let Some((peer, id)) = self.pending.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let notification = ClientNotification::CancelledNotification(
                CancelledNotification::new(CancelledNotificationParam::new(
                    Some(id),
                    Some("the agent stopped waiting for this call".to_owned()),
                )),
            );
            runtime.spawn(async move {
                let _ = peer.send_notification(notification).await;
            });
        }
    }
}

async fn call(
    live: &Live,
    tool: &str,
    args: Value,
    ctx: ToolContext,
) -> Result<ToolOutput, ToolError> {
    let server = live.config.name.as_str();
    let timeout = live.config.call_timeout;
    let Some(service) = live.current().await else {
        return Err(ToolError::RespondToModel(format!(
            "the MCP server {server} has stopped; its tools are unavailable for the rest of the session"
        )));
    };
    let arguments = match args {
        Value::Object(map) => map,
        Value::Null => serde_json::Map::new(),
        other => {
            return Err(ToolError::RespondToModel(format!(
                "the arguments must be an object, not {other}"
            )));
        }
    };
    let request = ClientRequest::CallToolRequest(CallToolRequest::new(
        CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments),
    ));
    let handle = match service
        .peer()
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
    {
        Ok(handle) => handle,
        Err(e) => return Err(failure(live, &service, tool, e).await),
    };
    let mut guard = CallGuard {
        live,
        token: handle.progress_token.clone(),
        pending: Some((handle.peer.clone(), handle.id.clone())),
    };
    if let Ok(mut routes) = live.handler.progress.lock() {
        routes.route(
            guard.token.clone(),
            ProgressTarget {
                events: ctx.run.events.clone(),
                call_id: ctx.call_id.clone(),
            },
        );
    }
    let answer = tokio::select! {
        answer = tokio::time::timeout(timeout, handle.await_response()) => answer,
        () = ctx.run.cancel.cancelled() => {
            return Err(ToolError::RespondToModel(format!(
                "the run was cancelled while {tool} ran on the MCP server {server}; the server was told to stop"
            )));
        }
    };
    let result = match answer {
        Err(_) => {
            return Err(ToolError::RespondToModel(format!(
                "the MCP server {server} did not answer {tool} within {} s; try again later or do without it",
                timeout.as_secs_f64()
            )));
        }
        Ok(answer) => {
            // Answered (or failed): nothing left to cancel.
            guard.pending = None;
            match answer {
                Ok(ServerResult::CallToolResult(result)) => result,
                Ok(_) => {
                    return Err(ToolError::RespondToModel(format!(
                        "the MCP server {server} answered {tool} with something other than a tool result"
                    )));
                }
                Err(e) => return Err(failure(live, &service, tool, e).await),
            }
        }
    };
    drop(guard);
    let result = serde_json::to_value(&result).unwrap_or_default();
    let mut blocks: Vec<ContentBlock> = result["content"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(block)
        .collect();
    let structured = result
        .get("structuredContent")
        .cloned()
        .filter(|v| !v.is_null());
    if blocks.is_empty()
        && let Some(structured) = &structured
    {
        blocks.push(ContentBlock::text(structured.to_string()));
    }
    if result["isError"].as_bool() == Some(true) {
        let text = blocks
            .iter()
            .filter_map(ContentBlock::as_text)
            .collect::<Vec<_>>()
            .join("\n");
        return Err(ToolError::RespondToModel(if text.is_empty() {
            format!("{tool} failed on the MCP server {server}")
        } else {
            text
        }));
    }
    let output = ToolOutput::blocks(blocks);
    Ok(match structured {
        Some(structured) => output.with_artifact(structured),
        None => output,
    })
}

/// The error for a call that got no answer: when the connection broke, the server is
/// restarted (once) and the model told.
async fn failure(
    live: &Live,
    service: &Arc<Service>,
    tool: &str,
    error: rmcp::ServiceError,
) -> ToolError {
    if service.is_closed()
        || matches!(
            error,
            rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_)
        )
    {
        return ToolError::RespondToModel(live.recover(service).await);
    }
    ToolError::RespondToModel(format!(
        "the MCP server {} failed on {tool}: {error}",
        live.config.name
    ))
}

/// One MCP content item as a block the model can use.
fn block(item: &Value) -> Option<ContentBlock> {
    let binary = |data: &Value, mime: &Value| {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.as_str()?)
            .ok()?;
        Some(ContentBlock::data(
            mime.as_str().unwrap_or("application/octet-stream"),
            bytes,
        ))
    };
    match item["type"].as_str()? {
        "text" => Some(ContentBlock::text(item["text"].as_str()?)),
        "image" | "audio" => binary(&item["data"], &item["mimeType"]),
        "resource" => {
            let resource = &item["resource"];
            match resource["text"].as_str() {
                Some(text) => Some(ContentBlock::text(format!(
                    "[resource {}]\n{text}",
                    resource["uri"].as_str().unwrap_or("")
                ))),
                None => binary(&resource["blob"], &resource["mimeType"]),
            }
        }
        "resource_link" => Some(ContentBlock::text(format!(
            "[resource link] {} {}{}",
            item["uri"].as_str().unwrap_or(""),
            item["name"].as_str().unwrap_or(""),
            item["description"]
                .as_str()
                .map(|d| format!(": {d}"))
                .unwrap_or_default()
        ))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::tool_name;

    #[test]
    fn tool_names_are_valid_everywhere_and_stable() {
        assert_eq!(tool_name("files", "read_file"), "files__read_file");
        assert_eq!(tool_name("my server", "get.thing"), "my_server__get_thing");
        let long = tool_name("server", &"x".repeat(100));
        assert_eq!(long.len(), 64);
        assert_eq!(long, tool_name("server", &"x".repeat(100)));
        assert_ne!(long, tool_name("server", &format!("{}y", "x".repeat(99))));
    }
}
