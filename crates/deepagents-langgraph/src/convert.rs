//! Our runs in the LangGraph Platform's terms: messages as LangChain message dicts, the state
//! as `values`, pending approvals as interrupts, and the decisions a resume carries.

use deepagents::core::{
    CheckpointError, Checkpointer, ContentBlock, Control, Message, Run, RunDelta, ToolResult,
    ToolStatus,
};
use deepagents::{Decision, DecisionKind, PendingAction, RunError};
use serde_json::{Map, Value, json};

/// The id of message `index` of a thread that was never forked: stable, since a thread's
/// messages are only ever appended (summaries change what the model sees, not the thread).
pub fn message_id(index: usize) -> String {
    MessageIds::default().id(index)
}

/// How a thread's messages are named: `msg-N` by position, and `msg-N-bF` for those made
/// after fork `F` of the thread (a run from an earlier checkpoint). A regenerated or edited
/// message sits where an earlier one did; without the fork in its id the two would share one,
/// and clients that track messages by id (the LangGraph SDK's branches) could not tell them
/// apart. Messages from before a fork keep their ids in every branch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MessageIds {
    /// The forks on the way to the state named, oldest first: the index of the first
    /// message made after each, and the fork's checkpoint.
    forks: Vec<(usize, u64)>,
}

impl MessageIds {
    /// The ids of a state reached through `forks`, oldest first: for each, the number of
    /// messages of the state it restored and the fork's checkpoint id.
    pub fn new(forks: Vec<(usize, u64)>) -> Self {
        Self { forks }
    }

    /// The id of message `index`.
    pub fn id(&self, index: usize) -> String {
        // The latest fork at or before the message made it; earlier entries may start later
        // when a later fork restored a shorter state.
        match self.forks.iter().rev().find(|(from, _)| *from <= index) {
            Some((_, fork)) => format!("msg-{index}-b{fork}"),
            None => format!("msg-{index}"),
        }
    }
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
    message_named(message_id(index), message)
}

/// A message as a LangChain message dict with the id `id`.
fn message_named(id: String, message: &Message) -> Value {
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
    messages_named(run, from, &MessageIds::default())
}

/// The messages of a run from `from` on, named by `ids`.
pub fn messages_named(run: &Run, from: usize, ids: &MessageIds) -> Vec<Value> {
    run.state
        .messages
        .iter()
        .enumerate()
        .skip(from)
        .map(|(index, m)| message_named(ids.id(index), m))
        .collect()
}

/// A run's state as the `values` of a thread: messages, todos, files, the structured
/// response when there is one, and `__interrupt__` while it waits for decisions.
pub fn values(run: &Run, interrupt_id: &str) -> Value {
    values_named(run, interrupt_id, &MessageIds::default())
}

/// [`values`], with the messages named by `ids` (a forked thread's).
pub fn values_named(run: &Run, interrupt_id: &str, ids: &MessageIds) -> Value {
    let mut values = Map::new();
    values.insert(
        "messages".to_owned(),
        Value::Array(messages_named(run, 0, ids)),
    );
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

/// The interrupt id of a pause ([`deepagents::pause_id`]): the same while the same actions
/// wait, another for every later pause; empty when nothing waits.
pub fn interrupt_id(run: &Run) -> String {
    deepagents::pause_id(run).unwrap_or_default()
}

/// Pending approvals as the reference harness interrupts for them: one interrupt whose
/// value lists the actions and what may be decided for each.
pub fn interrupts(pending: &[PendingAction], id: &str) -> Value {
    // A tool that asked with `interrupt(value)`: its value, as LangGraph shows it.
    if let [action] = pending
        && let Some(request) = &action.request
    {
        return json!([{ "id": id, "value": request }]);
    }
    let kind = |kind: &DecisionKind| match kind {
        DecisionKind::Approve => "approve",
        DecisionKind::Edit => "edit",
        DecisionKind::Reject => "reject",
        DecisionKind::Respond => "respond",
    };
    let requests: Vec<Value> = pending
        .iter()
        .map(|action| {
            // UIs show the description on the approval card; one is always given.
            let description = action.description.clone().unwrap_or_else(|| {
                if action.request.is_some() {
                    format!("`{}` asks for an answer.", action.name)
                } else {
                    format!("Review this call of `{}` before it runs.", action.name)
                }
            });
            let mut request = json!({
                "name": action.name,
                "args": action.arguments,
                // A question a tool asked carries the id of the call that asked it.
                "id": action.tool_call_id(),
                "description": description,
            });
            if !action.agents().is_empty() {
                request["agent_path"] =
                    serde_json::to_value(action.agents()).unwrap_or(Value::Null);
            }
            request
        })
        .collect();
    let configs: Vec<Value> = pending
        .iter()
        .map(|action| {
            // The v1 HITL schema knows approve, edit and reject; `respond` is listed only for
            // a call that cannot be approved — a question such as `ask_user`, answered
            // instead of run — where it is the answer.
            let approvable = action.allowed.contains(&DecisionKind::Approve);
            let allowed: Vec<&str> = action
                .allowed
                .iter()
                .filter(|k| !(approvable && matches!(k, DecisionKind::Respond)))
                .map(kind)
                .collect();
            json!({"action_name": action.name, "allowed_decisions": allowed})
        })
        .collect();
    json!([{ "id": id, "value": {"action_requests": requests, "review_configs": configs} }])
}

/// A `command.resume` read against the pause it answers.
#[derive(Clone, Debug, PartialEq)]
pub struct Resume {
    /// The interrupt the resume names (`{interrupt_id: …}`), checked to be the pending one;
    /// `None` for the forms that name none.
    pub interrupt: Option<String>,
    /// The pause the decisions answer: the one named, else the one they were read against.
    /// Front ends record them for it ([`deepagents::Input::DecidePause`]), so the
    /// check is made again under the thread's lease, and a run that answered the pause in
    /// between makes this one fail rather than apply to the next pause.
    pub pause: String,
    /// One decision per pending action, in order.
    pub decisions: Vec<Decision>,
}

/// Reads a `command.resume` (`Command(resume=…)`) against `run`, the thread as it stands:
/// `{"decisions": […]}` or the list alone answer whatever pause waits; `{interrupt_id:
/// {"decisions": […]}}` (or `{interrupt_id: […]}`) answers only the interrupt it names, which
/// must be the pending one ([`deepagents::check_pause`]); a bare `"approve"`/`"reject"`
/// string or `true`/`false`, alone or under an interrupt id, decides every action alike.
/// Decisions are `{"type": "approve" | "edit" | "reject" | "respond", …}`, one per pending
/// action.
///
/// Fails with [`RunError::StalePause`] for an interrupt that is not pending now (answered
/// already, or never one of this thread's: a conflict with the thread's state), else with
/// [`RunError::InvalidDecision`] for decisions that cannot be read or do not fit.
pub fn resume(resume: &Value, run: Option<&Run>) -> Result<Resume, RunError> {
    if let Some(answered) = answers(resume, run) {
        return answered;
    }
    let (interrupt, body) = form(resume)?;
    // A named interrupt is checked first: decisions for a pause the caller did not see are
    // refused whatever they hold.
    if let Some(id) = &interrupt {
        match run {
            Some(run) => deepagents::check_pause(run, id)?,
            None => {
                return Err(RunError::StalePause {
                    given: id.clone(),
                    current: None,
                });
            }
        }
    }
    let (Some(run), Some(pause)) = (run, run.and_then(deepagents::pause_id)) else {
        return Err(RunError::InvalidDecision(
            "the thread waits for no decision; send input instead of a resume".to_owned(),
        ));
    };
    let pending = run.control.pending.as_slice();
    let list = match body {
        Value::Bool(yes) => Value::Array(vec![
            json!({"type": if *yes { "approve" } else { "reject" }});
            pending.len()
        ]),
        Value::String(kind) => Value::Array(vec![json!({"type": kind}); pending.len()]),
        Value::Object(map) => map.get("decisions").cloned().unwrap_or(Value::Null),
        other => other.clone(),
    };
    Ok(Resume {
        interrupt,
        pause,
        decisions: decisions(&list, pending)?,
    })
}

/// A resume of a pause in which only tools' questions wait (`interrupt(value)` in a tool):
/// any value but a decision list is the answer to each, as LangGraph takes it, under the
/// interrupt's id or not. `None` when the pause holds approvals or the value is decisions.
fn answers(resume: &Value, run: Option<&Run>) -> Option<Result<Resume, RunError>> {
    let run = run?;
    let pending = &run.control.pending;
    if pending.is_empty() || pending.iter().any(|action| action.request.is_none()) {
        return None;
    }
    let pause = deepagents::pause_id(run)?;
    let (interrupt, body) = match resume {
        Value::Object(map) if map.contains_key("decisions") => return None,
        Value::Object(map) if map.len() == 1 => match map.iter().next() {
            Some((key, inner)) if key.starts_with("interrupt-") => (Some(key.clone()), inner),
            _ => (None, resume),
        },
        _ => (None, resume),
    };
    if let Some(id) = &interrupt
        && let Err(error) = deepagents::check_pause(run, id)
    {
        return Some(Err(error));
    }
    if let Value::Object(map) = body
        && map.contains_key("decisions")
    {
        return None;
    }
    // One question takes the value whole; several take a list, one answer each, in order.
    let values: Vec<&Value> = match (pending.len(), body) {
        (1, value) => vec![value],
        (n, Value::Array(list)) if list.len() == n => list.iter().collect(),
        (n, _) => {
            return Some(Err(RunError::InvalidDecision(format!(
                "{n} questions wait: resume with a list of {n} answers, one per question in order"
            ))));
        }
    };
    Some(Ok(Resume {
        interrupt,
        pause,
        decisions: values
            .into_iter()
            .zip(pending)
            .map(|(value, action)| Decision::Respond {
                message: answer_text(value, action),
            })
            .collect(),
    }))
}

/// An answer as its decision's text. Answers are kept as JSON text, so a tool reads back
/// exactly the value sent; but `ask_user` takes the text itself as the call's result (what a
/// person types in the CLI or the chat page), so a string answer to it is given as it is —
/// JSON text would reach the model quoted.
fn answer_text(value: &Value, action: &PendingAction) -> String {
    match value {
        Value::String(text) if action.name == deepagents::ASK_USER => text.clone(),
        other => other.to_string(),
    }
}

/// The interrupt a `command.resume` names, if it names one (see [`resume`]); what it decides
/// is not read. A front end uses it to keep a resume for a named interrupt from waiting
/// behind another run, which may answer that interrupt first.
pub fn resume_interrupt(resume: &Value) -> Option<String> {
    form(resume).ok().and_then(|(interrupt, _)| interrupt)
}

/// A resume's form: the interrupt it names, if any, and what it decides.
fn form(resume: &Value) -> Result<(Option<String>, &Value), RunError> {
    let invalid = |message: String| RunError::InvalidDecision(message);
    Ok(match resume {
        Value::Object(map) if map.contains_key("decisions") => (None, resume),
        // One decision without its list: a shape error, not an interrupt named `type`.
        Value::Object(map) if map.contains_key("type") => {
            return Err(invalid(
                "a resume carries a list of decisions: send {\"decisions\": [{\"type\": …}]}, one per pending action".to_owned(),
            ));
        }
        // `{interrupt_id: …}`: one interrupt per pause here, so one key.
        Value::Object(map) if map.len() == 1 => match map.iter().next() {
            Some((id, inner)) => (Some(id.clone()), inner),
            None => (None, resume),
        },
        Value::Array(_) | Value::Bool(_) | Value::String(_) => (None, resume),
        other => {
            return Err(invalid(format!(
                "cannot read decisions from {other}; send {{\"decisions\": [{{\"type\": \"approve\"}}, …]}}, one per pending action"
            )));
        }
    })
}

/// The decisions of a list, one per pending action.
fn decisions(list: &Value, pending: &[PendingAction]) -> Result<Vec<Decision>, RunError> {
    let Value::Array(list) = list else {
        return Err(RunError::InvalidDecision(
            "`decisions` must be a list, one per pending action".to_owned(),
        ));
    };
    if list.len() != pending.len() {
        return Err(RunError::InvalidDecision(format!(
            "{} decisions for {} pending actions; send one per action, in order",
            list.len(),
            pending.len()
        )));
    }
    list.iter()
        .zip(pending)
        .map(|(item, action)| decision(item, action).map_err(RunError::InvalidDecision))
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
            // The call's arguments are an object; anything else would reach the tool as
            // arguments it cannot read, after the human thought it fixed them.
            if !arguments.is_object() {
                return Err(format!(
                    "the edit of `{}` has `edited_action.args` {arguments}, not an object of arguments",
                    action.name
                ));
            }
            // An edit changes what the call does, not which tool it calls: that would skip the
            // approval rules of the other tool.
            if let Some(name) = item.pointer("/edited_action/name").and_then(Value::as_str)
                && name != action.name
            {
                return Err(format!(
                    "the edit of `{}` names tool `{name}`; an edit may change the arguments, not the tool (reject the call instead)",
                    action.name
                ));
            }
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

/// The user content of a run's `input` (`{"messages": [...]}`); `None` when it has none.
/// Tool messages are refused: only a front end that settles waiting calls takes them (see
/// [`input_messages`]).
pub fn input_content(input: &Value) -> Result<Option<Vec<ContentBlock>>, String> {
    let (answers, content) = input_messages(input)?;
    if !answers.is_empty() {
        return Err(
            "only user messages can be sent as input (found role `tool`); the agent keeps the rest of the conversation"
                .to_owned(),
        );
    }
    Ok(content)
}

/// A tool message of a run's input: the result a client gives a call that waits (a UI that
/// answers a pending call itself when the user types instead of deciding).
#[derive(Clone, Debug, PartialEq)]
pub struct ToolAnswer {
    /// The call it answers.
    pub call_id: String,
    /// What the model sees.
    pub content: Vec<ContentBlock>,
    /// Whether it reports a failure (`status: "error"`).
    pub error: bool,
}

/// A run's `input` read as LangGraph appends it: tool messages answering waiting calls, and
/// the user content (`None` when there is none). Other roles are refused.
pub fn input_messages(
    input: &Value,
) -> Result<(Vec<ToolAnswer>, Option<Vec<ContentBlock>>), String> {
    let messages = match input {
        Value::Null => return Ok((Vec::new(), None)),
        Value::Object(map) => match map.get("messages") {
            Some(Value::Array(messages)) => messages.clone(),
            Some(Value::Null) | None => return Ok((Vec::new(), None)),
            Some(single) => vec![single.clone()],
        },
        other => {
            return Err(format!(
                "`input` must be an object like {{\"messages\": […]}}, not {other}"
            ));
        }
    };
    let mut answers = Vec::new();
    let mut blocks = Vec::new();
    for message in &messages {
        let role = message
            .get("role")
            .or_else(|| message.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("user");
        match role {
            "user" | "human" => blocks.extend(parse_content(
                message.get("content").unwrap_or(&Value::Null),
            )?),
            "tool" => {
                let call_id = message.get("tool_call_id").and_then(Value::as_str).ok_or(
                    "a tool message in `input` needs the `tool_call_id` of the call it answers",
                )?;
                answers.push(ToolAnswer {
                    call_id: call_id.to_owned(),
                    content: parse_content(message.get("content").unwrap_or(&Value::Null))?,
                    error: message.get("status").and_then(Value::as_str) == Some("error"),
                });
            }
            other => {
                return Err(format!(
                    "only user messages, and tool messages answering waiting calls, can be sent as input (found role `{other}`); the agent keeps the rest of the conversation"
                ));
            }
        }
    }
    Ok((answers, (!blocks.is_empty()).then_some(blocks)))
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
                        // LangChain writes `mime_type`; the JS SDK's content blocks `mimeType`.
                        let mime = part
                            .get("mime_type")
                            .or_else(|| part.get("mimeType"))
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
pub fn message_from(value: &Value) -> Result<Message, String> {
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

/// Makes the thread's state that of checkpoint `at` again, as a new checkpoint on top (a run
/// started from a `checkpoint`: LangGraph's fork, which edit and regenerate use); checkpoint
/// 0 is the empty thread before its first input. Returns the new checkpoint's id, or `None`
/// when `at` is the latest already. A checkpoint the thread does not have is `NotFound`.
pub async fn restore_checkpoint(
    checkpointer: &dyn Checkpointer,
    thread_id: &str,
    at: u64,
) -> Result<Option<u64>, UpdateError> {
    let _lease = checkpointer
        .try_lease(thread_id)
        .await
        .map_err(UpdateError::Checkpoint)?;
    let checkpoints = checkpointer
        .checkpoints(thread_id)
        .await
        .map_err(UpdateError::Checkpoint)?;
    if checkpoints.last().map_or(0, |latest| latest.id) == at {
        return Ok(None);
    }
    let restored = if at == 0 {
        Run::default()
    } else if checkpoints.iter().any(|checkpoint| checkpoint.id == at) {
        checkpointer
            .load(thread_id, Some(at))
            .await
            .map_err(UpdateError::Checkpoint)?
            .unwrap_or_default()
    } else {
        return Err(UpdateError::Invalid(format!(
            "thread `{thread_id}` has no checkpoint `{at}`; take one from its history"
        )));
    };
    let head = checkpointer
        .load(thread_id, None)
        .await
        .map_err(UpdateError::Checkpoint)?
        .unwrap_or_default();
    let checkpoint = checkpointer
        .append(thread_id, &RunDelta::replacing(&head, &restored), &restored)
        .await
        .map_err(UpdateError::Checkpoint)?;
    Ok(Some(checkpoint))
}

/// Ends a paused turn without running what it waits on (`command.goto: "__end__"`, a UI's
/// "mark as resolved", or a UI answering the waiting calls itself): each call of the thread's
/// last model turn that has no result gets the one `answers` gives it, else one saying it was
/// not run; nothing waits any more, so the thread is at rest and the next input starts a new
/// turn. An answer for a call that does not wait is refused. `Ok(None)`: nothing was waiting
/// and nothing was answered, nothing changed.
pub async fn end_turn(
    checkpointer: &dyn Checkpointer,
    thread_id: &str,
    answers: &[ToolAnswer],
) -> Result<Option<(u64, Run)>, UpdateError> {
    let _lease = checkpointer
        .try_lease(thread_id)
        .await
        .map_err(UpdateError::Checkpoint)?;
    let before = checkpointer
        .load(thread_id, None)
        .await
        .map_err(UpdateError::Checkpoint)?
        .unwrap_or_default();
    if before.control.pending.is_empty() && answers.is_empty() {
        return Ok(None);
    }
    let waiting = before.pending_tool_calls();
    if let Some(stray) = answers
        .iter()
        .find(|answer| !waiting.iter().any(|call| call.id == answer.call_id))
    {
        return Err(UpdateError::Invalid(format!(
            "the tool message for call `{}` answers no call that waits; send tool messages only for the calls of the pending interrupt",
            stray.call_id
        )));
    }
    let mut run = before.clone();
    for call in &waiting {
        let result = match answers.iter().find(|answer| answer.call_id == call.id) {
            Some(answer) => ToolResult {
                tool_call_id: call.id.clone(),
                name: call.name.clone(),
                content: answer.content.clone(),
                status: if answer.error {
                    ToolStatus::Error
                } else {
                    ToolStatus::Ok
                },
                artifact: None,
            },
            None => ToolResult::error(
                call,
                "Not run: the user ended the turn without approving this call.",
            ),
        };
        run.state.messages.push(Message::Tool(result));
    }
    run.control = Control::default();
    let checkpoint = checkpointer
        .append(thread_id, &RunDelta::replacing(&before, &run), &run)
        .await
        .map_err(UpdateError::Checkpoint)?;
    Ok(Some((checkpoint, run)))
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

    #[test]
    fn a_malformed_edit_is_refused_naming_what_is_wrong() {
        let run = paused(1, &[action("c1", "execute")]);
        for (edit, expected) in [
            (
                json!({"type": "edit", "edited_action": {"name": "execute", "args": "rm -rf /"}}),
                "not an object",
            ),
            (
                json!({"type": "edit", "edited_action": {"name": "write_file", "args": {}}}),
                "not the tool",
            ),
            (
                json!({"type": "edit", "edited_action": {"name": "execute"}}),
                "no `edited_action.args`",
            ),
        ] {
            let error = resume(&json!({"decisions": [edit]}), Some(&run)).unwrap_err();
            assert!(
                matches!(&error, RunError::InvalidDecision(m) if m.contains(expected)),
                "{error}"
            );
        }
        let ok = resume(
            &json!({"decisions": [{"type": "edit", "edited_action": {"name": "execute", "args": {"command": "ls -a"}}}]}),
            Some(&run),
        )
        .unwrap();
        assert_eq!(
            ok.decisions,
            vec![Decision::Edit {
                arguments: json!({"command": "ls -a"})
            }]
        );
    }

    #[test]
    fn messages_made_after_a_fork_are_named_apart_and_earlier_ones_keep_their_ids() {
        let plain = MessageIds::default();
        assert_eq!(plain.id(3), "msg-3");
        // Fork 7 kept 2 messages; fork 9 then restored a state of 1 message.
        let ids = MessageIds::new(vec![(2, 7), (1, 9)]);
        assert_eq!(ids.id(0), "msg-0");
        assert_eq!(ids.id(1), "msg-1-b9");
        assert_eq!(ids.id(4), "msg-4-b9");
        let ids = MessageIds::new(vec![(2, 7)]);
        assert_eq!(ids.id(1), "msg-1");
        assert_eq!(ids.id(2), "msg-2-b7");
    }

    #[test]
    fn interrupts_have_a_description_and_only_v1_decisions_unless_answering_is_all() {
        let mut question = action("q", "ask_user");
        question.allowed = vec![DecisionKind::Respond, DecisionKind::Reject];
        let mut mixed = action("m", "execute");
        mixed.allowed.push(DecisionKind::Respond);
        mixed.description = Some("Runs a shell command".into());
        let value = interrupts(&[action("a", "write_file"), mixed, question], "i");
        let requests = &value[0]["value"]["action_requests"];
        assert!(
            requests[0]["description"]
                .as_str()
                .unwrap()
                .contains("write_file")
        );
        assert_eq!(requests[1]["description"], "Runs a shell command");
        let configs = &value[0]["value"]["review_configs"];
        assert_eq!(
            configs[1]["allowed_decisions"],
            json!(["approve", "edit", "reject"])
        );
        assert_eq!(
            configs[2]["allowed_decisions"],
            json!(["respond", "reject"])
        );
    }

    #[test]
    fn image_blocks_take_the_js_sdks_mime_type_spelling() {
        let blocks = parse_content(&json!([
            {"type": "image", "mimeType": "image/png", "data": "iVBORw0KGgo=", "metadata": {"name": "a.png"}}
        ]))
        .unwrap();
        assert!(
            matches!(&blocks[0], ContentBlock::Data { mime_type, .. } if mime_type == "image/png"),
            "{blocks:?}"
        );
    }

    fn action(id: &str, name: &str) -> PendingAction {
        PendingAction {
            call_id: id.into(),
            name: name.into(),
            arguments: json!({"command": "ls"}),
            description: None,
            allowed: vec![
                DecisionKind::Approve,
                DecisionKind::Edit,
                DecisionKind::Reject,
            ],
            request: None,
            path: Vec::new(),
        }
    }

    /// A thread that asked for `actions` after `before` user messages, and waits on them.
    fn paused(before: usize, actions: &[PendingAction]) -> Run {
        let mut run = Run::default();
        for _ in 0..before {
            run.state.messages.push(Message::User {
                content: vec![ContentBlock::text("go")],
            });
        }
        let mut asking = deepagents::core::AssistantMessage::text("");
        asking.tool_calls = actions
            .iter()
            .map(|action| deepagents::core::ToolCall {
                id: action.call_id.clone(),
                name: action.name.clone(),
                arguments: action.arguments.clone(),
            })
            .collect();
        run.state.messages.push(Message::Assistant(asking));
        run.control.pending = actions.to_vec();
        run
    }

    fn two() -> Run {
        paused(1, &[action("c1", "execute"), action("c2", "write_file")])
    }

    fn refused(value: Value, run: Option<&Run>) -> RunError {
        resume(&value, run).unwrap_err()
    }

    #[test]
    fn decisions_are_read_in_the_reference_shapes() {
        let run = two();
        let both = resume(
            &json!({"decisions": [{"type": "approve"}, {"type": "edit", "edited_action": {"name": "write_file", "args": {"a": 1}}}]}),
            Some(&run),
        )
        .unwrap();
        assert_eq!(both.interrupt, None);
        assert_eq!(
            both.decisions,
            [
                Decision::Approve,
                Decision::Edit {
                    arguments: json!({"a": 1})
                }
            ]
        );
        // Read against `run`, an unkeyed resume answers `run`'s pause.
        assert_eq!(Some(both.pause), deepagents::pause_id(&run));
        let id = interrupt_id(&run);
        let keyed = resume(
            &json!({ id.clone(): {"decisions": [{"type": "reject", "message": "no"}, "approve"]} }),
            Some(&run),
        )
        .unwrap();
        assert_eq!(keyed.interrupt.as_deref(), Some(id.as_str()));
        assert_eq!(keyed.pause, id);
        assert_eq!(
            keyed.decisions[0],
            Decision::Reject {
                message: Some("no".into())
            }
        );
        let listed = resume(&json!({ id.clone(): ["approve", "approve"] }), Some(&run)).unwrap();
        assert_eq!(listed.decisions, [Decision::Approve, Decision::Approve]);
        assert_eq!(resume(&json!(true), Some(&run)).unwrap().decisions.len(), 2);
        assert_eq!(
            resume(&json!({ id: "reject" }), Some(&run))
                .unwrap()
                .decisions[1],
            Decision::Reject { message: None }
        );
    }

    #[test]
    fn malformed_decisions_are_invalid_not_conflicts() {
        let run = two();
        let id = interrupt_id(&run);
        for (value, says) in [
            (
                json!({"decisions": [{"type": "approve"}]}),
                "1 decisions for 2",
            ),
            (
                json!({ id.clone(): {"decisions": [{"type": "approve"}]} }),
                "1 decisions for 2",
            ),
            (
                json!({"decisions": [{"type": "respond", "message": "x"}, "approve"]}),
                "may not be decided",
            ),
            (json!({"decisions": "approve"}), "must be a list"),
            (json!({"type": "approve"}), "list of decisions"),
            (json!(7), "cannot read decisions"),
            (json!({"a": [], "b": []}), "cannot read decisions"),
        ] {
            let error = refused(value.clone(), Some(&run));
            assert!(
                matches!(&error, RunError::InvalidDecision(message) if message.contains(says)),
                "{value}: {error:?}"
            );
        }
        assert!(matches!(
            refused(json!({"decisions": [{"type": "approve"}]}), None),
            RunError::InvalidDecision(message) if message.contains("waits for no decision")
        ));
    }

    #[test]
    fn a_resume_keyed_to_another_interrupt_is_refused_as_stale() {
        let first = paused(1, &[action("call_0_0", "write_file")]);
        let old = interrupt_id(&first);
        // The next pause; its model reused the call id.
        let mut second = first.clone();
        second.state.messages.push(Message::User {
            content: vec![ContentBlock::text("then")],
        });
        second.control.pending.clear();
        let next = paused(0, &[action("call_0_0", "write_file")]);
        second
            .state
            .messages
            .extend(next.state.messages.iter().cloned());
        second.control.pending = next.control.pending.clone();
        let current = interrupt_id(&second);
        assert_ne!(old, current);
        let approve = json!({"decisions": [{"type": "approve"}]});
        // The old id, an unknown one, a tool call's id: stale, whatever the decisions hold.
        for key in [old.as_str(), "interrupt-nope", "call_0_0"] {
            for body in [approve.clone(), json!({"decisions": []})] {
                let error = refused(json!({ key: body }), Some(&second));
                match &error {
                    RunError::StalePause {
                        given,
                        current: now,
                    } => {
                        assert_eq!(given, key);
                        assert_eq!(now.as_deref(), Some(current.as_str()));
                    }
                    other => panic!("{key}: {other:?}"),
                }
                assert!(error.to_string().contains(&current), "{error}");
            }
        }
        // Nothing pending: a named interrupt is stale, not merely invalid.
        assert!(matches!(
            refused(json!({ old.clone(): approve.clone() }), None),
            RunError::StalePause { current: None, .. }
        ));
        let mut done = second.clone();
        done.control.pending.clear();
        assert!(matches!(
            refused(json!({ current.clone(): approve.clone() }), Some(&done)),
            RunError::StalePause { current: None, .. }
        ));
        // A different set of actions behind the same first call is another interrupt.
        let wider = paused(
            1,
            &[
                action("call_0_0", "write_file"),
                action("call_0_1", "write_file"),
            ],
        );
        assert!(matches!(
            refused(json!({ old.clone(): ["approve", "approve"] }), Some(&wider)),
            RunError::StalePause { .. }
        ));
        let fresh = resume(&json!({ current.clone(): approve }), Some(&second)).unwrap();
        assert_eq!(fresh.pause, current);
    }

    #[test]
    fn a_string_answers_ask_user_as_its_text_and_a_tool_s_question_as_json() {
        let question = |name: &str| PendingAction {
            allowed: vec![DecisionKind::Respond, DecisionKind::Reject],
            request: Some(json!({"question": "Which colour?"})),
            ..action("q", name)
        };
        let answered = |name: &str, value: Value| {
            resume(&value, Some(&paused(1, &[question(name)])))
                .unwrap()
                .decisions
        };
        let respond = |message: &str| {
            vec![Decision::Respond {
                message: message.to_owned(),
            }]
        };
        assert_eq!(answered("ask_user", json!("blue")), respond("blue"));
        assert_eq!(answered("ask_user", json!(["a"])), respond(r#"["a"]"#));
        assert_eq!(answered("pick", json!("blue")), respond(r#""blue""#));
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
