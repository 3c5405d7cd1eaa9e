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

use crate::connection::{Live, ProgressTarget, Question, Service};

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
            let agent_name = name.clone();
            let made = DynamicTool::new(name, description, schema, move |args, ctx| {
                let (live, remote, name) = (Arc::clone(&live), remote.clone(), agent_name.clone());
                async move { call(&live, &name, &remote, args, ctx).await }
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
            runtime.spawn(async move {
                let _ = peer.send_notification(cancelled(id)).await;
            });
        }
    }
}

/// `notifications/cancelled` for the call `id`.
fn cancelled(id: RequestId) -> ClientNotification {
    ClientNotification::CancelledNotification(CancelledNotification::new(
        CancelledNotificationParam::new(
            Some(id),
            Some("the agent stopped waiting for this call".to_owned()),
        ),
    ))
}

/// A call registered to suspend on its server's questions, unregistered when it ends.
struct AskingGuard<'a> {
    live: &'a Live,
    key: u64,
}

impl Drop for AskingGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut asking) = self.live.handler.asking.lock() {
            asking.end(self.key);
        }
    }
}

/// What a person is told about a server's question a call suspended on.
fn suspension_description(question: &Question) -> String {
    format!(
        "The MCP server {} asks: {} (answering sends the call to the server again; what it did before asking happens again)",
        question.request.server, question.request.message
    )
}

/// Calls `tool` of the server as the agent's tool `name` (the name its suspensions and
/// answers go by).
async fn call(
    live: &Live,
    name: &str,
    tool: &str,
    args: Value,
    ctx: ToolContext,
) -> Result<ToolOutput, ToolError> {
    let server = live.config.name.as_str();
    let timeout = live.config.call_timeout;
    let mut service = live.current().await.map_err(ToolError::RespondToModel)?;
    // A connection that closed while idle is replaced before the call, not refused.
    if service.is_closed() {
        service = unless_cancelled(&ctx, server, tool, async {
            live.recover(&service, "the connection was closed")
                .await
                .map_err(ToolError::RespondToModel)
        })
        .await??;
    }
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
    // Nobody answers questions during the call: registered before the request goes out (a
    // server may ask at once), with the answers a resumed run gave to earlier questions.
    let mut asked = None;
    let mut asking = None;
    if live.handler.suspends()
        && let Ok(mut registry) = live.handler.asking.lock()
    {
        let (key, receiver) = registry.start(ctx.answers(name));
        asked = Some(receiver);
        asking = Some(AskingGuard { live, key });
    }
    let handle = match service
        .peer()
        .send_cancellable_request(request, PeerRequestOptions::no_options())
        .await
    {
        Ok(handle) => handle,
        Err(e) => {
            return Err(
                unless_cancelled(&ctx, server, tool, failure(live, &service, tool, e))
                    .await
                    .unwrap_or_else(|cancelled| cancelled),
            );
        }
    };
    if let Some(asking) = &asking
        && let Ok(mut registry) = live.handler.asking.lock()
    {
        registry.sent(asking.key, handle.id.clone());
    }
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
        Ok(question) = async {
            match asked.as_mut() {
                Some(asked) => asked.await,
                None => std::future::pending().await,
            }
        } => {
            // The call is given up on the server before its question is answered `cancel`,
            // so the tool stops rather than going on without the answer; the run pauses and,
            // once answered, sends the same call again.
            if let Some((peer, id)) = guard.pending.take() {
                let _ = peer.send_notification(cancelled(id)).await;
            }
            let description = suspension_description(&question);
            let request = question.request.to_json();
            let _ = question.given_up.send(());
            drop(asking);
            return Ok(ToolOutput::suspend(&ctx, name, request, Some(description)));
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
                Err(e) => {
                    return Err(unless_cancelled(
                        &ctx,
                        server,
                        tool,
                        failure(live, &service, tool, e),
                    )
                    .await
                    .unwrap_or_else(|cancelled| cancelled));
                }
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

/// `work` (reconnecting, restarting a server), or the error for a run cancelled meanwhile:
/// dropping the work leaves the old connection in place for the next call to replace.
async fn unless_cancelled<T>(
    ctx: &ToolContext,
    server: &str,
    tool: &str,
    work: impl Future<Output = T>,
) -> Result<T, ToolError> {
    tokio::select! {
        done = work => Ok(done),
        () = ctx.run.cancel.cancelled() => Err(ToolError::RespondToModel(format!(
            "the run was cancelled while {tool} waited for the MCP server {server} to come back"
        ))),
    }
}

/// The error for a call that got no answer. An HTTP error status is a failed call (the
/// connection stays); a broken connection is replaced — an HTTP server's re-established, a
/// stdio server restarted once — and the model told whether the server is back.
async fn failure(
    live: &Live,
    service: &Arc<Service>,
    tool: &str,
    error: rmcp::ServiceError,
) -> ToolError {
    let server = live.config.name.as_str();
    if !service.is_closed()
        && let Some(failed) = http_failure(&error)
    {
        return ToolError::RespondToModel(failed.message(server, tool));
    }
    if service.is_closed()
        || matches!(
            error,
            rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_)
        )
    {
        let why = match &error {
            rmcp::ServiceError::TransportClosed => {
                "the connection closed before the answer".to_owned()
            }
            other => crate::connection::plain_error(other),
        };
        return ToolError::RespondToModel(match live.recover(service, &why).await {
            Ok(_) if live.is_http() => format!(
                "the connection to the MCP server {server} broke during {tool} ({why}) and was re-established; {tool} may or may not have run: call it again if repeating it is safe"
            ),
            Ok(_) => format!(
                "the MCP server {server} stopped during this call and was restarted; call again if repeating it is safe"
            ),
            Err(message) => message,
        });
    }
    ToolError::RespondToModel(format!("the MCP server {server} failed on {tool}: {error}"))
}

/// An HTTP error status a server answered a call with.
#[derive(Debug, PartialEq)]
struct HttpFailure {
    status: u16,
    /// The `Retry-After` header, as sent.
    retry_after: Option<String>,
    /// What the server said, when known.
    detail: Option<String>,
}

impl HttpFailure {
    fn message(&self, server: &str, tool: &str) -> String {
        let status = self.status;
        let detail = self
            .detail
            .as_deref()
            .map(|detail| format!(" ({detail})"))
            .unwrap_or_default();
        match status {
            401 | 403 => format!(
                "the MCP server {server} refused {tool} with HTTP {status}{detail}: the client is not authorized; calling again will not help — its token (`headers` or `bearer_token_env_var` in .mcp.json) needs checking"
            ),
            429 => format!(
                "the MCP server {server} answered {tool} with HTTP 429 (too many requests){}; wait before calling it again",
                self.retry_after
                    .as_deref()
                    .map(|after| format!(", retry after {after}"))
                    .unwrap_or_default()
            ),
            500.. => format!(
                "the MCP server {server} failed on {tool} with HTTP {status}{detail}, an error on the server's side; {tool} may or may not have run: try again shortly if repeating it is safe, or do without it"
            ),
            _ => format!(
                "the MCP server {server} rejected {tool} with HTTP {status}{detail}; check the arguments, or do without it"
            ),
        }
    }
}

/// The HTTP error status behind a failed send, from the streamable HTTP client (429 and 5xx
/// as metadata, other statuses in the text of an unexpected response) or our legacy SSE
/// transport.
fn http_failure(error: &rmcp::ServiceError) -> Option<HttpFailure> {
    use rmcp::transport::streamable_http_client::{HttpStatusError, StreamableHttpError};
    let rmcp::ServiceError::TransportSend(sent) = error else {
        return None;
    };
    let inner: &(dyn std::error::Error + 'static) = sent.error.as_ref();
    let from_status = |status: &HttpStatusError| HttpFailure {
        status: status.status,
        retry_after: status.retry_after.clone(),
        detail: None,
    };
    if let Some(http) = inner.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
        return match http {
            StreamableHttpError::HttpStatus(status) => Some(from_status(status)),
            StreamableHttpError::AuthRequired(_) => Some(HttpFailure {
                status: 401,
                retry_after: None,
                detail: None,
            }),
            StreamableHttpError::InsufficientScope(_) => Some(HttpFailure {
                status: 403,
                retry_after: None,
                detail: Some("insufficient scope".to_owned()),
            }),
            // `HTTP 400 Bad Request: the body`.
            StreamableHttpError::UnexpectedServerResponse(text) => {
                let rest = text.strip_prefix("HTTP ")?;
                let status: u16 = rest.get(..3)?.parse().ok()?;
                (400..600).contains(&status).then(|| HttpFailure {
                    status,
                    retry_after: None,
                    detail: rest
                        .split_once(": ")
                        .map(|(_, body)| body.trim().chars().take(300).collect::<String>())
                        .filter(|body| !body.is_empty()),
                })
            }
            _ => None,
        };
    }
    inner
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::get_ref)
        .and_then(|error| error.downcast_ref::<HttpStatusError>())
        .map(from_status)
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
