//! Hooks: the user's own commands run at points of a run, configured as Claude Code's
//! `hooks.json` (so existing hook scripts work unchanged).
//!
//! A hook is a shell command that gets the event as JSON on stdin. Exit 0 continues (JSON on
//! stdout may carry a decision, a replaced tool input or extra context); exit 2 blocks, with
//! its stderr as the reason; any other status is a failed hook: the run goes on and the
//! failure is logged. A hook that outlives its timeout is killed and counts as failed.
//!
//! | event | when | what blocking does |
//! |---|---|---|
//! | `SessionStart` | a run starts or resumes | — (its stdout becomes context for the model) |
//! | `UserPromptSubmit` | a run starts on a new user message | the run stops with the reason |
//! | `PreToolUse` | before a tool call | the call does not run; the model gets the reason (`ask`: the [`HookApprover`] decides) |
//! | `PostToolUse` | after a call that succeeded | the model gets the reason with the result |
//! | `PostToolUseFailure` | after a call that failed | the model gets the reason with the result |
//! | `SubagentStart` / `SubagentStop` | around a `task` call | `SubagentStart`: as `PreToolUse` |
//! | `PreCompact` | before older messages are summarized (matcher: `auto` or `manual`) | — |
//! | `Stop` | the model answered without calling tools | the run goes on: the reason is the model's next message (`stop_hook_active` is then `true`) |
//! | `Notification`, `SessionEnd` | when a front end calls [`Hooks::notify`] | — |
//!
//! Matchers (for the tool events) are regular expressions matched against the whole tool
//! name, ours or its Claude Code alias (`execute` ↔ `Bash`, `read_file` ↔ `Read`,
//! `write_file` ↔ `Write`, `edit_file` ↔ `Edit`, `glob` ↔ `Glob`, `grep` ↔ `Grep`, `ls` ↔
//! `LS`, `task` ↔ `Task`, `write_todos` ↔ `TodoWrite`, `web_fetch` ↔ `WebFetch`, and an MCP
//! server's `SERVER__TOOL` ↔ `mcp__SERVER__TOOL` for the servers named with
//! [`Hooks::mcp_tool_prefixes`]); empty or `*` matches every tool. The input's `tool_name` is the Claude Code name where there is one
//! (`agent_tool_name` is ours).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deepagents_core::message::AssistantMessage;
use deepagents_core::{
    AgentState, ContentBlock, Message, Messages, ModelRequest, ModelResponse, RunContext,
    StateUpdate, ToolCall, ToolContext, ToolError, ToolOutput,
};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use super::{Middleware, MiddlewareError, ToolNext};

/// A hook runs this long unless its entry sets `timeout` (seconds).
pub const DEFAULT_HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// Our tool names and their Claude Code aliases.
const ALIASES: [(&str, &str); 10] = [
    ("execute", "Bash"),
    ("web_fetch", "WebFetch"),
    ("read_file", "Read"),
    ("write_file", "Write"),
    ("edit_file", "Edit"),
    ("glob", "Glob"),
    ("grep", "Grep"),
    ("ls", "LS"),
    ("task", "Task"),
    ("write_todos", "TodoWrite"),
];

/// The events a hook can be attached to.
pub const EVENTS: [&str; 11] = [
    "SessionStart",
    "SessionEnd",
    "UserPromptSubmit",
    "PreToolUse",
    "PostToolUse",
    "PostToolUseFailure",
    "PreCompact",
    "SubagentStart",
    "SubagentStop",
    "Stop",
    "Notification",
];

/// One hook command.
#[derive(Clone, Debug)]
struct HookCommand {
    command: String,
    timeout: Duration,
}

/// Hooks for one event behind one matcher.
#[derive(Clone, Debug)]
struct Matcher {
    pattern: Option<regex::Regex>,
    commands: Vec<HookCommand>,
}

impl Matcher {
    /// Whether it matches a tool known by `names` (ours, then Claude Code's); every matcher
    /// matches an event without a tool.
    fn matches(&self, names: &[&str]) -> bool {
        match &self.pattern {
            Some(pattern) if !names.is_empty() => names.iter().any(|name| pattern.is_match(name)),
            _ => true,
        }
    }
}

fn alias(tool: &str) -> Option<&'static str> {
    ALIASES
        .iter()
        .find(|(ours, _)| *ours == tool)
        .map(|(_, theirs)| *theirs)
}

/// A `hooks.json` that cannot be used: the file, the place in it, and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{origin}: {place}: {message}")]
pub struct HooksError {
    /// The file (or other source) the hooks came from.
    pub origin: String,
    /// Where in it: the event, the entry, the key.
    pub place: String,
    /// What is wrong and what to do.
    pub message: String,
}

/// Who decides a tool call a `PreToolUse` hook wants the user to approve (`"ask"`): a
/// terminal prompt, a UI. Without one, such calls do not run.
#[async_trait]
pub trait HookApprover: Send + Sync {
    /// Whether `call` may run; `reason` is the hook's.
    async fn approve(&self, call: &ToolCall, reason: &str) -> bool;
}

/// The hooks of a run, by event, in the order their files were read.
#[derive(Clone, Default)]
pub struct Hooks {
    events: BTreeMap<String, Vec<Matcher>>,
    dir: Option<PathBuf>,
    approver: Option<Arc<dyn HookApprover>>,
    /// How MCP servers' tools are named for the model (`SERVER__`), so hooks see them as
    /// Claude Code does (`mcp__SERVER__TOOL`).
    mcp_prefixes: Vec<String>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("events", &self.events)
            .field("dir", &self.dir)
            .field("approver", &self.approver.is_some())
            .finish()
    }
}

impl Hooks {
    /// Parses a Claude-Code-style `hooks.json`: `{"hooks": {EVENT: [{"matcher": "Bash",
    /// "hooks": [{"type": "command", "command": "…", "timeout": 30}]}]}}` (the outer
    /// `"hooks"` object may be left out). `origin` names the file in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, HooksError> {
        let error = |place: String, message: String| HooksError {
            origin: origin.to_owned(),
            place,
            message,
        };
        let value: Value = serde_json::from_str(text)
            .map_err(|e| error(format!("line {}", e.line()), format!("not valid JSON: {e}")))?;
        let events = match value.get("hooks") {
            Some(hooks) => hooks,
            None => &value,
        };
        let Some(events) = events.as_object() else {
            return Err(error(
                "hooks".to_owned(),
                "expected an object mapping event names to lists of matchers".to_owned(),
            ));
        };
        let mut hooks = Self::default();
        for (event, entries) in events {
            if !EVENTS.contains(&event.as_str()) {
                return Err(error(
                    format!("hooks.{event}"),
                    format!("unknown event; the events are {}", EVENTS.join(", ")),
                ));
            }
            let entries = entries.as_array().ok_or_else(|| {
                error(
                    format!("hooks.{event}"),
                    "expected a list of matchers".to_owned(),
                )
            })?;
            for (n, entry) in entries.iter().enumerate() {
                let place = format!("hooks.{event}[{n}]");
                let pattern = match entry.get("matcher") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(p)) if p.is_empty() || p == "*" => None,
                    Some(Value::String(p)) => {
                        Some(regex::Regex::new(&format!("^(?:{p})$")).map_err(|e| {
                            error(
                                format!("{place}.matcher"),
                                format!("not a valid pattern: {e}"),
                            )
                        })?)
                    }
                    Some(_) => {
                        return Err(error(
                            format!("{place}.matcher"),
                            "expected a string".to_owned(),
                        ));
                    }
                };
                let list = entry
                    .get("hooks")
                    .and_then(Value::as_array)
                    .ok_or_else(|| {
                        error(
                            format!("{place}.hooks"),
                            "expected a list of {\"type\": \"command\", \"command\": …}".to_owned(),
                        )
                    })?;
                let mut commands = Vec::new();
                for (m, hook) in list.iter().enumerate() {
                    let place = format!("{place}.hooks[{m}]");
                    match hook.get("type").and_then(Value::as_str) {
                        Some("command") | None => {}
                        Some(other) => {
                            return Err(error(
                                format!("{place}.type"),
                                format!("only \"command\" hooks are supported, not {other:?}"),
                            ));
                        }
                    }
                    let command = hook
                        .get("command")
                        .and_then(Value::as_str)
                        .filter(|c| !c.trim().is_empty())
                        .ok_or_else(|| {
                            error(format!("{place}.command"), "expected a command".to_owned())
                        })?;
                    let timeout = match hook.get("timeout") {
                        None => DEFAULT_HOOK_TIMEOUT,
                        Some(t) => t
                            .as_f64()
                            .filter(|s| *s > 0.0 && s.is_finite())
                            .map(Duration::from_secs_f64)
                            .ok_or_else(|| {
                                error(
                                    format!("{place}.timeout"),
                                    "expected a positive number of seconds".to_owned(),
                                )
                            })?,
                    };
                    commands.push(HookCommand {
                        command: command.to_owned(),
                        timeout,
                    });
                }
                hooks
                    .events
                    .entry(event.clone())
                    .or_default()
                    .push(Matcher { pattern, commands });
            }
        }
        Ok(hooks)
    }

    /// Reads and parses a `hooks.json` file.
    pub fn load(path: &Path) -> Result<Self, HooksError> {
        let text = std::fs::read_to_string(path).map_err(|e| HooksError {
            origin: path.display().to_string(),
            place: "file".to_owned(),
            message: format!("cannot read it: {e}"),
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// These hooks followed by `other`'s (both run, these first).
    pub fn merge(mut self, other: Self) -> Self {
        for (event, matchers) in other.events {
            self.events.entry(event).or_default().extend(matchers);
        }
        self.dir = other.dir.or(self.dir);
        self.approver = other.approver.or(self.approver);
        self.mcp_prefixes.extend(other.mcp_prefixes);
        self
    }

    /// Runs hooks in `dir` (the project's root: their working directory and
    /// `CLAUDE_PROJECT_DIR`, made absolute as Claude Code gives them); default: this
    /// process's working directory.
    pub fn in_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        let dir = dir.into();
        self.dir = Some(std::path::absolute(&dir).unwrap_or(dir));
        self
    }

    /// The prefixes (`SERVER__`) of the MCP tools the agent has: hooks see those tools by
    /// Claude Code's name, `mcp__SERVER__TOOL`, beside ours.
    pub fn mcp_tool_prefixes(mut self, prefixes: impl IntoIterator<Item = String>) -> Self {
        self.mcp_prefixes.extend(prefixes);
        self
    }

    /// Claude Code's name of tool `tool`, where it has another.
    fn claude_name(&self, tool: &str) -> Option<String> {
        if let Some(alias) = alias(tool) {
            return Some(alias.to_owned());
        }
        self.mcp_prefixes
            .iter()
            .any(|prefix| tool.starts_with(prefix.as_str()))
            .then(|| format!("mcp__{tool}"))
    }

    /// Calls a `PreToolUse` hook asks about go to `approver`.
    pub fn approver(mut self, approver: Arc<dyn HookApprover>) -> Self {
        self.approver = Some(approver);
        self
    }

    /// Whether no hook is configured.
    pub fn is_empty(&self) -> bool {
        self.events
            .values()
            .all(|m| m.iter().all(|m| m.commands.is_empty()))
    }

    /// Runs the hooks of `event` that match `tool` with `input` (the common fields are
    /// added), in order, and folds what they say.
    async fn fire(
        &self,
        ctx: &RunContext,
        event: &str,
        tool: Option<&str>,
        input: Value,
    ) -> Verdict {
        let session = ctx
            .thread_id
            .clone()
            .unwrap_or_else(|| ctx.run_id().to_owned());
        let transcript = ctx.extensions.get::<Transcript>();
        self.fire_in(&session, event, tool, input, transcript.as_deref())
            .await
    }

    /// Runs the `PreCompact` hooks before older messages are summarized; `trigger` is `auto`
    /// (the context filled) or `manual` (asked for), matched by their matchers. What they say
    /// does not stop the summary.
    pub(crate) async fn pre_compact(&self, ctx: &RunContext, trigger: &str) {
        let _ = self
            .fire(
                ctx,
                "PreCompact",
                Some(trigger),
                json!({"trigger": trigger, "custom_instructions": ""}),
            )
            .await;
    }

    /// Runs the hooks of an event the harness does not fire itself — `Notification` (the
    /// front end asks the user something) and `SessionEnd` (the front end exits) — with
    /// `input` plus the common fields. Blocking means nothing for these; failures are
    /// reported on stderr.
    pub async fn notify(&self, session_id: &str, event: &str, input: Value) {
        if matches!(event, "Notification" | "SessionEnd") {
            let _ = self.fire_in(session_id, event, None, input, None).await;
        }
    }

    async fn fire_in(
        &self,
        session: &str,
        event: &str,
        tool: Option<&str>,
        mut input: Value,
        transcript: Option<&Transcript>,
    ) -> Verdict {
        let mut verdict = Verdict::default();
        let claude = tool.and_then(|tool| self.claude_name(tool));
        let names: Vec<&str> = tool.into_iter().chain(claude.as_deref()).collect();
        let commands: Vec<&HookCommand> = self
            .events
            .get(event)
            .into_iter()
            .flatten()
            .filter(|m| m.matches(&names))
            .flat_map(|m| &m.commands)
            .collect();
        if commands.is_empty() {
            return verdict;
        }
        let dir = self
            .dir
            .clone()
            .or_else(|| std::env::current_dir().ok())
            .unwrap_or_else(|| PathBuf::from("/"));
        if let Some(fields) = input.as_object_mut() {
            fields.insert("hook_event_name".into(), json!(event));
            fields.insert("session_id".into(), json!(session));
            let path = transcript.and_then(|transcript| transcript.write(session));
            let path = path.map_or_else(String::new, |path| path.display().to_string());
            fields.insert("transcript_path".into(), json!(path));
            fields.insert("cwd".into(), json!(dir.display().to_string()));
        }
        let stdin = input.to_string();
        for hook in commands {
            let outcome = run_hook(hook, &dir, &stdin).await;
            verdict.absorb(event, &hook.command, outcome);
            if verdict.blocked.is_some() {
                break;
            }
        }
        verdict
    }
}

/// The conversation as the model last saw it, with its answer: what hooks read at
/// `transcript_path`, written in Claude Code's transcript format when a hook fires.
struct Transcript {
    messages: Messages,
    answer: Option<AssistantMessage>,
}

impl Transcript {
    /// Writes it as JSON lines to a file of `session`'s, readable by this user only; `None`
    /// when it cannot be written (the hook then gets an empty path).
    fn write(&self, session: &str) -> Option<PathBuf> {
        use std::io::Write as _;
        use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
        let uid = rustix::process::getuid().as_raw();
        let dir = std::env::temp_dir().join(format!("deepagents-transcripts-{uid}"));
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
        // Another user's directory (or a link) under a shared temp dir is not written into.
        let owned = std::fs::symlink_metadata(&dir)
            .is_ok_and(|meta| meta.is_dir() && meta.uid() == uid && meta.mode() & 0o077 == 0);
        if !owned {
            return None;
        }
        let name: String = session
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = dir.join(format!("{name}.jsonl"));
        let answer = self.answer.clone().map(Message::Assistant);
        let mut lines = String::new();
        for message in self.messages.iter().chain(answer.as_ref()) {
            if let Some(line) = transcript_line(message, session) {
                lines.push_str(&line.to_string());
                lines.push('\n');
            }
        }
        // In a directory only this user can write to: nothing else can be planted there.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .ok()?;
        file.write_all(lines.as_bytes()).ok()?;
        Some(path)
    }
}

/// One message as a line of a Claude Code transcript (system messages have none).
fn transcript_line(message: &Message, session: &str) -> Option<Value> {
    let text = |text: String| json!({"type": "text", "text": text});
    let (kind, content) = match message {
        Message::User { .. } => ("user", vec![text(message.text())]),
        Message::Assistant(answer) => {
            let mut content: Vec<Value> = answer
                .content
                .iter()
                .filter_map(ContentBlock::as_text)
                .map(|part| text(part.to_owned()))
                .collect();
            content.extend(answer.tool_calls.iter().map(|call| {
                json!({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
            }));
            ("assistant", content)
        }
        Message::Tool(result) => (
            "user",
            vec![json!({
                "type": "tool_result",
                "tool_use_id": result.tool_call_id,
                "content": message.text(),
                "is_error": result.status == deepagents_core::ToolStatus::Error,
            })],
        ),
        Message::System { .. } => return None,
    };
    Some(json!({
        "type": kind,
        "sessionId": session,
        "message": {"role": if kind == "assistant" { "assistant" } else { "user" }, "content": content},
    }))
}

/// What one hook did.
enum Outcome {
    Exited {
        code: Option<i32>,
        stdout: String,
        stderr: String,
    },
    Failed(String),
}

async fn run_hook(hook: &HookCommand, dir: &Path, stdin: &str) -> Outcome {
    let mut command = tokio::process::Command::new("/bin/sh");
    command
        .arg("-c")
        .arg(&hook.command)
        .current_dir(dir)
        .env("CLAUDE_PROJECT_DIR", dir)
        .env("DEEPAGENTS_PROJECT_DIR", dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => return Outcome::Failed(format!("cannot start it: {e}")),
    };
    if let Some(mut pipe) = child.stdin.take() {
        // A hook that does not read its input is fine: a broken pipe is not an error.
        let _ = pipe.write_all(stdin.as_bytes()).await;
    }
    let mut running = HookGroup(
        child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .and_then(rustix::process::Pid::from_raw),
    );
    let waited = tokio::time::timeout(hook.timeout, child.wait_with_output()).await;
    if matches!(waited, Ok(Ok(_))) {
        // It exited and its output is closed: what it left running on purpose stays.
        running.0 = None;
    }
    match waited {
        Err(_) => Outcome::Failed(format!(
            "timed out after {} s and was killed",
            hook.timeout.as_secs_f64()
        )),
        Ok(Err(e)) => Outcome::Failed(format!("waiting for it failed: {e}")),
        Ok(Ok(output)) => Outcome::Exited {
            code: output.status.code(),
            stdout: String::from_utf8_lossy(&output.stdout).trim().to_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        },
    }
}

/// The process group of a hook still running: killed, shell and everything it started, when
/// the hook times out or its run is cancelled (the future waiting on it dropped); a leftover
/// would hold its pipes and go on acting for a run that ended.
struct HookGroup(Option<rustix::process::Pid>);

impl Drop for HookGroup {
    fn drop(&mut self) {
        if let Some(group) = self.0.take() {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }
}

/// What the hooks of one event said, together.
#[derive(Default)]
struct Verdict {
    /// Blocked, with the reason.
    blocked: Option<String>,
    /// The user is to decide, for this reason.
    ask: Option<String>,
    /// `"continue": false`: everything is to stop (`blocked` holds the reason).
    halted: bool,
    /// A replaced tool input.
    input: Option<Value>,
    /// Text to add for the model.
    context: Vec<String>,
}

impl Verdict {
    fn absorb(&mut self, event: &str, command: &str, outcome: Outcome) {
        let (code, stdout, stderr) = match outcome {
            Outcome::Failed(why) => {
                tracing::warn!(event, command, "hook failed: {why}");
                eprintln!("warning: the {event} hook `{command}` {why}; the run goes on");
                return;
            }
            Outcome::Exited {
                code,
                stdout,
                stderr,
            } => (code, stdout, stderr),
        };
        match code {
            Some(0) => {}
            Some(2) => {
                self.blocked = Some(if stderr.is_empty() {
                    format!("blocked by the {event} hook `{command}`")
                } else {
                    stderr
                });
                return;
            }
            _ => {
                eprintln!(
                    "warning: the {event} hook `{command}` failed (exit {}): {stderr}",
                    code.map_or("by a signal".to_owned(), |c| c.to_string())
                );
                return;
            }
        }
        let Ok(Value::Object(output)) = serde_json::from_str::<Value>(&stdout) else {
            // Plain text on stdout is context where Claude Code treats it so.
            if !stdout.is_empty() && matches!(event, "SessionStart" | "UserPromptSubmit") {
                self.context.push(stdout);
            }
            return;
        };
        let specific = output.get("hookSpecificOutput").and_then(Value::as_object);
        let reason = |keys: &[&str]| {
            keys.iter()
                .find_map(|k| {
                    specific
                        .and_then(|s| s.get(*k))
                        .or_else(|| output.get(*k))
                        .and_then(Value::as_str)
                })
                .map(str::to_owned)
        };
        if output.get("continue") == Some(&Value::Bool(false)) {
            self.halted = true;
            self.blocked = Some(
                reason(&["stopReason", "reason"])
                    .unwrap_or_else(|| format!("stopped by the {event} hook `{command}`")),
            );
            return;
        }
        let decision = specific
            .and_then(|s| s.get("permissionDecision"))
            .or_else(|| output.get("decision"))
            .and_then(Value::as_str);
        match decision {
            Some("deny" | "block") => {
                self.blocked = Some(
                    reason(&["permissionDecisionReason", "reason"])
                        .unwrap_or_else(|| format!("blocked by the {event} hook `{command}`")),
                );
                return;
            }
            Some("ask") => {
                self.ask = Some(
                    reason(&["permissionDecisionReason", "reason"])
                        .unwrap_or_else(|| format!("the {event} hook `{command}` asks")),
                );
            }
            _ => {}
        }
        if let Some(input) = specific.and_then(|s| s.get("updatedInput")) {
            self.input = Some(input.clone());
        }
        if let Some(context) = reason(&["additionalContext"]) {
            self.context.push(context);
        }
    }
}

/// What `SessionStart` and `UserPromptSubmit` hooks added for the model, for this run.
struct HookContext(String);

/// Runs [`Hooks`] at the points of a run they name.
pub struct HooksMiddleware {
    hooks: Hooks,
}

impl HooksMiddleware {
    /// The middleware for `hooks`.
    pub fn new(hooks: Hooks) -> Self {
        Self { hooks }
    }
}

fn tool_input(hooks: &Hooks, call: &ToolCall, event: &str) -> Value {
    json!({
        "tool_name": hooks.claude_name(&call.name).unwrap_or_else(|| call.name.clone()),
        "agent_tool_name": call.name,
        "tool_input": call.arguments,
        "tool_use_id": call.id,
        "hook_event_name": event,
    })
}

fn result_text(output: &ToolOutput) -> String {
    output
        .content
        .iter()
        .filter_map(|block| match block {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[async_trait]
impl Middleware for HooksMiddleware {
    fn name(&self) -> &str {
        "hooks"
    }

    async fn before_run(
        &self,
        ctx: &RunContext,
        state: &AgentState,
    ) -> Result<StateUpdate, MiddlewareError> {
        ctx.extensions.insert(Transcript {
            messages: state.messages.clone(),
            answer: None,
        });
        // A subagent's run is part of the session, not a session of its own.
        if !ctx.events.path().is_empty() {
            return Ok(StateUpdate::default());
        }
        let start = self
            .hooks
            .fire(ctx, "SessionStart", None, json!({"source": "startup"}))
            .await;
        let mut context = start.context;
        // A run that starts on a new user message (not one resumed after a pause).
        if let Some(prompt @ Message::User { .. }) = state.messages.last() {
            let verdict = self
                .hooks
                .fire(
                    ctx,
                    "UserPromptSubmit",
                    None,
                    json!({"prompt": prompt.text()}),
                )
                .await;
            if let Some(reason) = verdict.blocked {
                return Err(MiddlewareError::from(format!(
                    "the prompt was blocked by a UserPromptSubmit hook: {reason}"
                )));
            }
            context.extend(verdict.context);
        }
        if !context.is_empty() {
            ctx.extensions.insert(HookContext(context.join("\n")));
        }
        Ok(StateUpdate::default())
    }

    async fn before_model(
        &self,
        ctx: &RunContext,
        request: &mut ModelRequest,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        if let Some(context) = ctx.extensions.get::<HookContext>() {
            request.push_system_section(&format!("## From the user's hooks\n\n{}", context.0));
        }
        Ok(())
    }

    async fn after_model(
        &self,
        ctx: &RunContext,
        response: &mut ModelResponse,
        state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        // Cheap: the conversation is one shared list; written out only when a hook fires.
        ctx.extensions.insert(Transcript {
            messages: state.messages.clone(),
            answer: Some(response.message.clone()),
        });
        Ok(())
    }

    async fn wrap_tool_call(
        &self,
        mut call: ToolCall,
        ctx: ToolContext,
        next: ToolNext,
    ) -> Result<ToolOutput, ToolError> {
        let run = ctx.run.clone();
        let mut before = self
            .hooks
            .fire(
                &run,
                "PreToolUse",
                Some(&call.name),
                tool_input(&self.hooks, &call, "PreToolUse"),
            )
            .await;
        if before.blocked.is_none() && call.name == "task" {
            let subagent = call.arguments["subagent_type"].clone();
            let started = self
                .hooks
                .fire(
                    &run,
                    "SubagentStart",
                    Some(&call.name),
                    json!({"agent_type": subagent, "tool_input": call.arguments}),
                )
                .await;
            before.blocked = started.blocked;
        }
        if let Some(reason) = before.blocked {
            return Err(ToolError::RespondToModel(format!(
                "A hook blocked this call: {reason}"
            )));
        }
        if let Some(reason) = before.ask {
            let approved = match &self.hooks.approver {
                Some(approver) => approver.approve(&call, &reason).await,
                None => {
                    return Err(ToolError::RespondToModel(format!(
                        "A hook wants the user to approve this call and nobody can approve it here, so it did not run: {reason}"
                    )));
                }
            };
            if !approved {
                return Err(ToolError::RespondToModel(format!(
                    "The user did not approve this call (a hook asked: {reason}). Do not retry it unchanged."
                )));
            }
        }
        if let Some(input) = before.input {
            call.arguments = input;
        }
        let outcome = next.call(call.clone(), ctx).await;
        let (event, mut input) = match &outcome {
            Ok(output) if !output.is_error => {
                let mut input = tool_input(&self.hooks, &call, "PostToolUse");
                input["tool_response"] =
                    json!({"output": result_text(output), "artifact": output.artifact});
                ("PostToolUse", input)
            }
            Ok(output) => {
                let mut input = tool_input(&self.hooks, &call, "PostToolUseFailure");
                input["error"] = json!(result_text(output));
                ("PostToolUseFailure", input)
            }
            Err(e) => {
                let mut input = tool_input(&self.hooks, &call, "PostToolUseFailure");
                input["error"] = json!(e.to_string());
                ("PostToolUseFailure", input)
            }
        };
        if call.name == "task" {
            input["agent_type"] = call.arguments["subagent_type"].clone();
            let _ = self
                .hooks
                .fire(&run, "SubagentStop", Some(&call.name), input.clone())
                .await;
        }
        let after = self.hooks.fire(&run, event, Some(&call.name), input).await;
        let notes: Vec<String> = after
            .blocked
            .map(|reason| format!("[hook] {reason}"))
            .into_iter()
            .chain(after.context.into_iter().map(|c| format!("[hook] {c}")))
            .collect();
        if notes.is_empty() {
            return outcome;
        }
        match outcome {
            Ok(mut output) => {
                output.content.push(ContentBlock::text(notes.join("\n")));
                Ok(output)
            }
            Err(ToolError::RespondToModel(message)) => Err(ToolError::RespondToModel(format!(
                "{message}\n{}",
                notes.join("\n")
            ))),
            Err(fatal) => Err(fatal),
        }
    }

    async fn before_finish(
        &self,
        ctx: &RunContext,
        _state: &AgentState,
    ) -> Result<Option<String>, MiddlewareError> {
        if !ctx.events.path().is_empty() {
            return Ok(None);
        }
        let kept_going = ctx.extensions.get::<KeptGoing>().is_some();
        let verdict = self
            .hooks
            .fire(ctx, "Stop", None, json!({"stop_hook_active": kept_going}))
            .await;
        // `"continue": false` means stop, whatever else it says.
        if verdict.halted {
            return Ok(None);
        }
        Ok(verdict.blocked.map(|reason| {
            ctx.extensions.insert(KeptGoing);
            format!("[Stop hook] Do not stop yet: {reason}")
        }))
    }
}

/// A Stop hook made this run go on once already.
struct KeptGoing;

#[cfg(test)]
mod tests {
    use super::*;

    /// A hook abandoned mid-way (its run cancelled) leaves no process behind, not even one its
    /// shell started in the background.
    #[tokio::test]
    async fn an_abandoned_hook_leaves_no_process() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let pid_file = dir.path().join("pid");
        let hook = HookCommand {
            command: format!("sleep 30 & echo $! > {}; wait", pid_file.display()),
            timeout: Duration::from_secs(60),
        };
        let abandoned = tokio::time::timeout(
            Duration::from_millis(500),
            run_hook(&hook, dir.path(), "{}"),
        );
        assert!(abandoned.await.is_err(), "the hook should still run");
        let pid = std::fs::read_to_string(&pid_file).unwrap_or_else(|e| panic!("{e}"));
        let stat = format!("/proc/{}/stat", pid.trim());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        // Gone, or a zombie waiting for a parent to reap it.
        while std::fs::read_to_string(&stat).is_ok_and(|stat| {
            !stat
                .rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        }) {
            assert!(
                std::time::Instant::now() < deadline,
                "the hook's sleep is still running"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn claude_code_files_parse_and_bad_ones_say_where() {
        let hooks = Hooks::parse(
            r#"{"hooks": {"PreToolUse": [{"matcher": "Bash|Write", "hooks": [{"type": "command", "command": "true", "timeout": 5}]}], "Stop": [{"hooks": [{"command": "true"}]}]}}"#,
            "hooks.json",
        )
        .unwrap_or_default();
        let matcher = &hooks.events["PreToolUse"][0];
        let names = |tool: &str| {
            let claude = hooks.claude_name(tool);
            let mut names = vec![tool.to_owned()];
            names.extend(claude);
            names
        };
        let matches = |tool: &str| {
            let names = names(tool);
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            matcher.matches(&names)
        };
        assert!(matches("execute") && matches("write_file"));
        assert!(!matches("read_file") && !matches("Bashful"));
        assert_eq!(matcher.commands[0].timeout, Duration::from_secs(5));
        // An MCP tool by Claude Code's name, for the servers the agent has.
        let mcp = Hooks::parse(
            r#"{"hooks": {"PreToolUse": [{"matcher": "mcp__fs__write_file", "hooks": [{"command": "true"}]}]}}"#,
            "test",
        )
        .unwrap_or_default()
        .mcp_tool_prefixes(["fs__".to_owned()]);
        assert_eq!(
            mcp.claude_name("fs__write_file").as_deref(),
            Some("mcp__fs__write_file")
        );
        assert_eq!(mcp.claude_name("my__tool"), None);
        assert!(mcp.events["PreToolUse"][0].matches(&["fs__write_file", "mcp__fs__write_file"]));
        assert!(!mcp.events["PreToolUse"][0].matches(&["fs__read_file", "mcp__fs__read_file"]));
        for (text, place) in [
            (r#"{"hooks": {"PreToolUsed": []}}"#, "hooks.PreToolUsed"),
            (
                r#"{"PreToolUse": [{"matcher": "(", "hooks": []}]}"#,
                "hooks.PreToolUse[0].matcher",
            ),
            (
                r#"{"PreToolUse": [{"hooks": [{"type": "prompt", "command": "x"}]}]}"#,
                "hooks.PreToolUse[0].hooks[0].type",
            ),
            (
                r#"{"PreToolUse": [{"hooks": [{"command": "x", "timeout": -1}]}]}"#,
                "hooks.PreToolUse[0].hooks[0].timeout",
            ),
        ] {
            let error = Hooks::parse(text, "f.json")
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(error.starts_with(&format!("f.json: {place}:")), "{error}");
        }
    }
}
