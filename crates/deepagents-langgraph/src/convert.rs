//! Our runs in the LangGraph Platform's terms: messages as LangChain message dicts, the state
//! as `values`, pending approvals as interrupts, and the decisions a resume carries.

use deepagents::core::{
    CheckpointError, Checkpointer, ContentBlock, Message, Run, RunDelta, ToolStatus,
};
use deepagents::{Decision, DecisionKind, PendingAction};
use serde_json::{Map, Value, json};

/// The id of message `index` of a thread: stable, since a thread's messages are only ever
/// appended (summaries change what the model sees, not the thread).
pub fn message_id(index: usize) -> String {
    format!("msg-{index}")
}

/// `content` as LangChain writes it: a string when it is only text, else a list of blocks.
fn content(blocks: &[ContentBlock]) -> Value {
    if blocks.iter().all(|block| block.as_text().is_some()) {
        return Value::String(deepagents::core::content::joined_text(blocks));
    }
    Value::Array(
        blocks
            .iter()
            .filter_map(|block| match block {
                ContentBlock::Text { text } => Some(json!({"type": "text", "text": text})),
                ContentBlock::Data { mime_type, data } => Some(json!({
                    "type": if mime_type.starts_with("image/") { "image" } else { "file" },
                    "source_type": "base64",
                    "mime_type": mime_type,
                    "data": base64(data),
                })),
                ContentBlock::Reasoning { text, .. } => {
                    Some(json!({"type": "reasoning", "reasoning": text}))
                }
                _ => None,
            })
            .collect(),
    )
}

fn base64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Message `index` of a thread as a LangChain message dict.
pub fn message(index: usize, message: &Message) -> Value {
    let id = message_id(index);
    match message {
        Message::System { content: blocks } => {
            json!({"type": "system", "id": id, "content": content(blocks)})
        }
        Message::User { content: blocks } => {
            json!({"type": "human", "id": id, "content": content(blocks)})
        }
        Message::Assistant(assistant) => json!({
            "type": "ai",
            "id": id,
            "content": content(&assistant.content),
            "tool_calls": assistant.tool_calls.iter().map(|call| json!({
                "type": "tool_call",
                "id": call.id,
                "name": call.name,
                "args": call.arguments,
            })).collect::<Vec<_>>(),
            "invalid_tool_calls": [],
        }),
        Message::Tool(result) => json!({
            "type": "tool",
            "id": id,
            "content": content(&result.content),
            "tool_call_id": result.tool_call_id,
            "name": result.name,
            "status": if result.status == ToolStatus::Ok { "success" } else { "error" },
        }),
    }
}

/// The messages of a run from `from` on.
pub fn messages_from(run: &Run, from: usize) -> Vec<Value> {
    run.state
        .messages
        .iter()
        .enumerate()
        .skip(from)
        .map(|(index, m)| message(index, m))
        .collect()
}

/// A run's state as the `values` of a thread: messages, todos, files, the structured
/// response when there is one, and `__interrupt__` while it waits for decisions.
pub fn values(run: &Run, interrupt_id: &str) -> Value {
    let mut values = Map::new();
    values.insert("messages".to_owned(), Value::Array(messages_from(run, 0)));
    values.insert(
        "todos".to_owned(),
        serde_json::to_value(&run.state.todos).unwrap_or(Value::Null),
    );
    values.insert("files".to_owned(), files(run));
    if let Some(structured) = run
        .state
        .custom
        .get(deepagents::middleware::STRUCTURED_RESPONSE_KEY)
    {
        values.insert("structured_response".to_owned(), structured.clone());
    }
    if !run.control.pending.is_empty() {
        values.insert(
            "__interrupt__".to_owned(),
            interrupts(&run.control.pending, interrupt_id),
        );
    }
    Value::Object(values)
}

/// The files of the state: text as `content` (a string), binary as base64 with its type.
fn files(run: &Run) -> Value {
    let mut files = Map::new();
    for (path, file) in &run.state.files {
        let mut entry = match &file.content {
            deepagents::core::FileContent::Text { text } => json!({"content": text}),
            deepagents::core::FileContent::Binary { mime_type, data } => {
                json!({"content": base64(data), "encoding": "base64", "mime_type": mime_type})
            }
        };
        entry["modified_at"] =
            Value::String(deepagents::core::event::rfc3339_ms(file.modified_at_ms));
        if file.created_at_ms > 0 {
            entry["created_at"] =
                Value::String(deepagents::core::event::rfc3339_ms(file.created_at_ms));
        }
        files.insert(path.clone(), entry);
    }
    Value::Object(files)
}

/// The interrupt id of a pause: stable while the same actions wait.
pub fn interrupt_id(run: &Run) -> String {
    run.control
        .pending
        .first()
        .map_or_else(String::new, |action| {
            format!("interrupt-{}", action.call_id)
        })
}

/// Pending approvals as the reference harness interrupts for them: one interrupt whose
/// value lists the actions and what may be decided for each.
pub fn interrupts(pending: &[PendingAction], id: &str) -> Value {
    let kind = |kind: &DecisionKind| match kind {
        DecisionKind::Approve => "approve",
        DecisionKind::Edit => "edit",
        DecisionKind::Reject => "reject",
        DecisionKind::Respond => "respond",
    };
    let requests: Vec<Value> = pending
        .iter()
        .map(|action| {
            let mut request =
                json!({"name": action.name, "args": action.arguments, "id": action.call_id});
            if let Some(description) = &action.description {
                request["description"] = Value::String(description.clone());
            }
            if !action.path.is_empty() {
                request["agent_path"] = serde_json::to_value(&action.path).unwrap_or(Value::Null);
            }
            request
        })
        .collect();
    let configs: Vec<Value> = pending
        .iter()
        .map(|action| {
            json!({
                "action_name": action.name,
                "allowed_decisions": action.allowed.iter().map(kind).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!([{ "id": id, "value": {"action_requests": requests, "review_configs": configs} }])
}

/// The decisions a `command.resume` carries, one per pending action: `{"decisions": […]}`
/// (or keyed by interrupt id, or the list alone), each `{"type": "approve" | "edit" |
/// "reject" | "respond", …}`; a bare `"approve"`/`"reject"` string or `true`/`false` decides
/// every action alike.
pub fn decisions(resume: &Value, pending: &[PendingAction]) -> Result<Vec<Decision>, String> {
    let list = match resume {
        Value::Object(map) if map.contains_key("decisions") => map["decisions"].clone(),
        // `{interrupt_id: {"decisions": […]}}`: one interrupt per pause here.
        Value::Object(map) if map.len() == 1 => {
            let inner = map.values().next().cloned().unwrap_or(Value::Null);
            inner.get("decisions").cloned().unwrap_or(inner)
        }
        Value::Array(_) => resume.clone(),
        Value::Bool(yes) => Value::Array(vec![
            json!({"type": if *yes { "approve" } else { "reject" }});
            pending.len()
        ]),
        Value::String(kind) => Value::Array(vec![json!({"type": kind}); pending.len()]),
        other => {
            return Err(format!(
                "cannot read decisions from {other}; send {{\"decisions\": [{{\"type\": \"approve\"}}, …]}}, one per pending action"
            ));
        }
    };
    let Value::Array(list) = list else {
        return Err("`decisions` must be a list, one per pending action".to_owned());
    };
    if list.len() != pending.len() {
        return Err(format!(
            "{} decisions for {} pending actions; send one per action, in order",
            list.len(),
            pending.len()
        ));
    }
    list.iter()
        .zip(pending)
        .map(|(item, action)| decision(item, action))
        .collect()
}

fn decision(item: &Value, action: &PendingAction) -> Result<Decision, String> {
    let text = |key: &str| item.get(key).and_then(Value::as_str).map(str::to_owned);
    let decision = match item
        .get("type")
        .and_then(Value::as_str)
        .or_else(|| item.as_str())
    {
        Some("approve" | "accept") => Decision::Approve,
        Some("edit") => {
            let arguments = item
                .pointer("/edited_action/args")
                .or_else(|| item.get("args"))
                .or_else(|| item.get("arguments"))
                .cloned()
                .ok_or_else(|| {
                    format!("the edit of `{}` has no `edited_action.args`", action.name)
                })?;
            Decision::Edit { arguments }
        }
        Some("reject") => Decision::Reject {
            message: text("message"),
        },
        Some("respond" | "response") => Decision::Respond {
            message: text("message").or_else(|| text("args")).unwrap_or_default(),
        },
        other => {
            return Err(format!(
                "unknown decision {other:?} for `{}`; use approve, edit, reject or respond",
                action.name
            ));
        }
    };
    if !action.allowed.contains(&decision.kind()) {
        return Err(format!(
            "`{}` may not be decided so here; allowed: {:?}",
            action.name, action.allowed
        ));
    }
    Ok(decision)
}

/// The user input in `input.messages`: the content of its human messages, in order (other
/// roles are refused: the thread's history is the agent's own).
pub fn input_content(input: &Value) -> Result<Option<Vec<ContentBlock>>, String> {
    let messages = match input {
        Value::Null => return Ok(None),
        Value::Object(map) => match map.get("messages") {
            Some(Value::Array(messages)) => messages.clone(),
            Some(Value::Null) | None => return Ok(None),
            Some(single) => vec![single.clone()],
        },
        other => {
            return Err(format!(
                "`input` must be an object like {{\"messages\": […]}}, not {other}"
            ));
        }
    };
    let mut blocks = Vec::new();
    for message in &messages {
        let role = message
            .get("role")
            .or_else(|| message.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("user");
        if !matches!(role, "user" | "human") {
            return Err(format!(
                "only user messages can be sent as input (found role `{role}`); the agent keeps the rest of the conversation"
            ));
        }
        blocks.extend(parse_content(
            message.get("content").unwrap_or(&Value::Null),
        )?);
    }
    Ok((!blocks.is_empty()).then_some(blocks))
}

/// Message content as LangChain writes it: a string, or a list of text and image parts.
fn parse_content(content: &Value) -> Result<Vec<ContentBlock>, String> {
    let mut blocks = Vec::new();
    match content {
        Value::String(text) => blocks.push(ContentBlock::text(text)),
        Value::Array(parts) => {
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => blocks.push(ContentBlock::text(
                        part.get("text").and_then(Value::as_str).unwrap_or_default(),
                    )),
                    Some("image" | "file") => {
                        let mime = part
                            .get("mime_type")
                            .and_then(Value::as_str)
                            .unwrap_or("application/octet-stream");
                        let data = part
                            .get("data")
                            .or_else(|| part.get("base64"))
                            .and_then(Value::as_str)
                            .unwrap_or_default();
                        blocks.push(decode_data(mime, data)?);
                    }
                    Some("image_url") => {
                        let url = part
                            .pointer("/image_url/url")
                            .or_else(|| part.get("image_url"))
                            .and_then(Value::as_str)
                            .unwrap_or_default();
                        let Some((mime, data)) = url
                            .strip_prefix("data:")
                            .and_then(|rest| rest.split_once(";base64,"))
                        else {
                            return Err(
                                "image URLs must be data: URLs (the server does not fetch)"
                                    .to_owned(),
                            );
                        };
                        blocks.push(decode_data(mime, data)?);
                    }
                    // What a model produced is kept as the text it is not.
                    Some("reasoning" | "thinking") => {}
                    other => {
                        return Err(format!(
                            "unsupported content part {other:?}; use text, image or image_url"
                        ));
                    }
                }
            }
        }
        Value::Null => {}
        other => {
            return Err(format!(
                "message content must be a string or a list of parts, not {other}"
            ));
        }
    }
    Ok(blocks)
}

/// A LangChain message dict as a message of the thread.
fn message_from(value: &Value) -> Result<Message, String> {
    let role = value
        .get("type")
        .or_else(|| value.get("role"))
        .and_then(Value::as_str)
        .unwrap_or("human");
    let content = parse_content(value.get("content").unwrap_or(&Value::Null))?;
    let text = |key: &str| {
        value
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    Ok(match role {
        "human" | "user" => Message::User { content },
        "system" | "developer" => Message::System { content },
        "ai" | "assistant" | "AIMessageChunk" => {
            let mut assistant = deepagents::core::AssistantMessage::text("");
            assistant.content = content;
            for call in value
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                assistant.tool_calls.push(deepagents::core::ToolCall {
                    id: call
                        .get("id")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    name: call
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    arguments: call.get("args").cloned().unwrap_or_else(|| json!({})),
                });
            }
            Message::Assistant(assistant)
        }
        "tool" => {
            let call = deepagents::core::ToolCall {
                id: text("tool_call_id"),
                name: text("name"),
                arguments: json!({}),
            };
            let mut result = deepagents::core::ToolResult::error(&call, "");
            result.content = content;
            if value.get("status").and_then(Value::as_str) != Some("error") {
                result.status = ToolStatus::Ok;
            }
            Message::Tool(result)
        }
        other => {
            return Err(format!(
                "unknown message type `{other}`; use human, ai, tool or system"
            ));
        }
    })
}

/// Applies a state update (`threads.update_state`, `command.update`) to `run`: messages
/// are added (one whose id is that of a message of the thread replaces it), `todos`
/// replaced, `files` written (`null` deletes one).
pub fn apply_values(run: &mut Run, values: &Value) -> Result<(), String> {
    let Value::Object(values) = values else {
        return Err("`values` must be an object of state keys (messages, todos, files)".to_owned());
    };
    for (key, value) in values {
        match key.as_str() {
            "messages" => {
                let list = match value {
                    Value::Array(list) => list.clone(),
                    single => vec![single.clone()],
                };
                let mut messages = run.state.messages.to_vec();
                for item in &list {
                    let message = message_from(item)?;
                    let replaces = item
                        .get("id")
                        .and_then(Value::as_str)
                        .and_then(|id| id.strip_prefix("msg-"))
                        .and_then(|index| index.parse::<usize>().ok())
                        .filter(|index| *index < messages.len());
                    match replaces {
                        Some(index) => messages[index] = message,
                        None => messages.push(message),
                    }
                }
                run.state.messages = messages.into();
            }
            "todos" => {
                run.state.todos = serde_json::from_value(value.clone())
                    .map_err(|e| format!("`todos` must be a list of {{content, status}}: {e}"))?;
            }
            "files" => {
                let Value::Object(files) = value else {
                    return Err("`files` must be an object of paths".to_owned());
                };
                for (path, file) in files {
                    if file.is_null() {
                        run.state.files.remove(path);
                        continue;
                    }
                    let text = file
                        .get("content")
                        .and_then(|content| match content {
                            Value::String(text) => Some(text.clone()),
                            Value::Array(lines) => Some(
                                lines
                                    .iter()
                                    .filter_map(Value::as_str)
                                    .collect::<Vec<_>>()
                                    .join("\n"),
                            ),
                            _ => None,
                        })
                        .or_else(|| file.as_str().map(str::to_owned))
                        .ok_or_else(|| format!("file `{path}` needs a text `content`"))?;
                    let now = now_ms();
                    let created = run
                        .state
                        .files
                        .get(path)
                        .map_or(now, |old| old.created_at_ms);
                    run.state.files.insert(
                        path.clone(),
                        deepagents::core::FileData {
                            content: deepagents::core::FileContent::Text { text },
                            modified_at_ms: now,
                            created_at_ms: created,
                        },
                    );
                }
            }
            other => {
                return Err(format!(
                    "cannot update `{other}`; the state has messages, todos and files"
                ));
            }
        }
    }
    Ok(())
}

/// Why a state update was not made.
#[derive(Debug)]
pub enum UpdateError {
    /// The values do not fit the state; the message says what to send.
    Invalid(String),
    /// The thread could not be read, leased or written.
    Checkpoint(CheckpointError),
}

/// Applies `values` (see [`apply_values`]) to thread `thread_id` as a checkpoint of its own,
/// under the thread's lease; returns the checkpoint's id and the thread's new state.
pub async fn update_state(
    checkpointer: &dyn Checkpointer,
    thread_id: &str,
    values: &Value,
) -> Result<(u64, Run), UpdateError> {
    let _lease = checkpointer
        .try_lease(thread_id)
        .await
        .map_err(UpdateError::Checkpoint)?;
    let before = checkpointer
        .load(thread_id, None)
        .await
        .map_err(UpdateError::Checkpoint)?
        .unwrap_or_default();
    let mut run = before.clone();
    apply_values(&mut run, values).map_err(UpdateError::Invalid)?;
    let checkpoint = checkpointer
        .append(thread_id, &RunDelta::replacing(&before, &run), &run)
        .await
        .map_err(UpdateError::Checkpoint)?;
    Ok((checkpoint, run))
}

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// Now, as LangGraph writes timestamps: RFC 3339 in UTC with milliseconds.
pub fn now_rfc3339() -> String {
    deepagents::core::event::rfc3339_ms(now_ms())
}

fn decode_data(mime: &str, data: &str) -> Result<ContentBlock, String> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(data)
        .map(|bytes| ContentBlock::data(mime, bytes))
        .map_err(|e| format!("content that is not valid base64: {e}"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn action(name: &str) -> PendingAction {
        PendingAction {
            call_id: "c1".into(),
            name: name.into(),
            arguments: json!({"command": "ls"}),
            description: None,
            allowed: vec![
                DecisionKind::Approve,
                DecisionKind::Edit,
                DecisionKind::Reject,
            ],
            path: Vec::new(),
        }
    }

    #[test]
    fn decisions_are_read_in_the_reference_shapes() {
        let pending = [action("execute"), action("write_file")];
        let both = decisions(
            &json!({"decisions": [{"type": "approve"}, {"type": "edit", "edited_action": {"name": "write_file", "args": {"a": 1}}}]}),
            &pending,
        )
        .unwrap();
        assert_eq!(
            both,
            [
                Decision::Approve,
                Decision::Edit {
                    arguments: json!({"a": 1})
                }
            ]
        );
        let keyed = decisions(
            &json!({"int-1": {"decisions": [{"type": "reject", "message": "no"}, "approve"]}}),
            &pending,
        )
        .unwrap();
        assert_eq!(
            keyed[0],
            Decision::Reject {
                message: Some("no".into())
            }
        );
        assert!(
            decisions(&json!({"decisions": [{"type": "approve"}]}), &pending)
                .unwrap_err()
                .contains("1 decisions for 2")
        );
        assert!(
            decisions(
                &json!({"decisions": [{"type": "respond", "message": "x"}, "approve"]}),
                &pending
            )
            .unwrap_err()
            .contains("may not be decided")
        );
        assert_eq!(decisions(&json!(true), &pending).unwrap().len(), 2);
    }

    #[test]
    fn input_takes_user_messages_in_either_spelling() {
        let content = input_content(&json!({"messages": [{"role": "user", "content": "hi"}, {"type": "human", "content": [{"type": "text", "text": "there"}]}]})).unwrap().unwrap();
        assert_eq!(
            content,
            [ContentBlock::text("hi"), ContentBlock::text("there")]
        );
        assert!(
            input_content(&json!({"messages": [{"role": "assistant", "content": "x"}]}))
                .unwrap_err()
                .contains("only user messages")
        );
        assert_eq!(input_content(&Value::Null).unwrap(), None);
    }
}
