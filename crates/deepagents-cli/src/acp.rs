//! `deepagents acp`: the agent served to an editor over ACP, the Agent Client Protocol
//! (JSON-RPC 2.0, one message a line, on stdin and stdout), as Zed, JetBrains IDEs, Neovim and
//! VS Code clients drive goose, opencode or Claude Code.
//!
//! Each ACP session is a conversation thread: `session/new` starts one rooted at the
//! editor's directory (as `--root` would), `session/load` reopens one and replays its
//! conversation, `session/prompt` runs a turn and streams it as `session/update`s (text,
//! reasoning, tool calls with their diffs and output, the plan of `write_todos`), and
//! `session/cancel` stops it. Calls that wait for approval become `session/request_permission`
//! requests; the session modes switch between asking before every change (`manual`) and
//! only before what the rules hold (`auto`), as `/manual` and `/auto` do in the TUI.
//!
//! What the editor offers in `initialize` is used ([`editor`]): its buffers for reading and
//! writing text files, and its terminal for `execute` when commands run unconfined. Each
//! prompt takes a rewind snapshot first, as `run --thread` and the TUI do.

mod editor;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};

use agent_client_protocol::v1::schema as acp;
use agent_client_protocol::v1::{ConnectionTo, Responder};
use agent_client_protocol::{Client, ErrorCode, JsonRpcResponse, Stdio};
use anyhow::{anyhow, bail};
use base64::Engine as _;
use deepagents::core::event::{Event, EventKind};
use deepagents::{
    ASK_USER, ContentBlock, Decision, DecisionKind, Message, PendingAction, RunError, RunOptions,
    RunStatus,
};
use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;

use crate::args::RunArgs;
use crate::session::{Front, Session, prepare, prepare_with_layer};
use crate::{approvals, shutdown};

/// The connection to the editor, as handlers and turns see it.
type Cx = ConnectionTo<Client>;

/// The mode that asks before every change.
const MANUAL: &str = "manual";
/// The mode that asks only before what the rules hold.
const AUTO: &str = "auto";

/// The permission options every request offers.
const ALLOW_ONCE: &str = "allow_once";
const ALLOW_ALWAYS: &str = "allow_always";
const REJECT_ONCE: &str = "reject_once";

/// Serves ACP on stdin and stdout until the editor closes the connection (or a signal).
pub async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    if args.task.is_some() || args.thread.is_some() {
        bail!(
            "`deepagents acp` takes no task and no --thread: the editor starts sessions (session/new) and reopens them (session/load)"
        );
    }
    let server = Arc::new(Server {
        args,
        client: Mutex::new(acp::ClientCapabilities::default()),
        sessions: Mutex::new(HashMap::new()),
        turns: Mutex::new(Vec::new()),
    });
    let connection = {
        let (init, new, load, prompt, mode, cancel) = (
            server.clone(),
            server.clone(),
            server.clone(),
            server.clone(),
            server.clone(),
            server.clone(),
        );
        agent_client_protocol::Agent
            .v1()
            .name("deepagents")
            .on_receive_request(
                async move |request: acp::InitializeRequest,
                            responder: Responder<acp::InitializeResponse>,
                            _cx: Cx| {
                    *lock(&init.client) = request.client_capabilities.clone();
                    responder.respond(initialize(&request))
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: acp::NewSessionRequest,
                            responder: Responder<acp::NewSessionResponse>,
                            cx: Cx| {
                    let server = new.clone();
                    server.clone().spawn(async move {
                        reply(responder, server.new_session(request, &cx).await);
                    });
                    Ok(())
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: acp::LoadSessionRequest,
                            responder: Responder<acp::LoadSessionResponse>,
                            cx: Cx| {
                    let server = load.clone();
                    server.clone().spawn(async move {
                        reply(responder, server.load_session(request, &cx).await);
                    });
                    Ok(())
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: acp::PromptRequest,
                            responder: Responder<acp::PromptResponse>,
                            cx: Cx| {
                    let server = prompt.clone();
                    server.clone().spawn(async move {
                        reply(responder, server.prompt(request, &cx).await);
                    });
                    Ok(())
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_request(
                async move |request: acp::SetSessionModeRequest,
                            responder: Responder<acp::SetSessionModeResponse>,
                            _cx: Cx| {
                    reply(responder, mode.set_mode(&request));
                    Ok(())
                },
                agent_client_protocol::on_receive_request!(),
            )
            .on_receive_notification(
                async move |notification: acp::CancelNotification, _cx: Cx| {
                    cancel.cancel(&notification.session_id);
                    Ok(())
                },
                agent_client_protocol::on_receive_notification!(),
            )
            .connect_to(Stdio::new())
    };
    let outcome = tokio::select! {
        outcome = connection => outcome.map_err(|error| anyhow!("the ACP connection failed: {error}")),
        () = shutdown::token().cancelled() => Ok(()),
    };
    server.close().await;
    outcome?;
    Ok(ExitCode::SUCCESS)
}

/// What the agent can do: reopen sessions, and take images and embedded files in prompts.
fn initialize(_request: &acp::InitializeRequest) -> acp::InitializeResponse {
    acp::InitializeResponse::new(agent_client_protocol::schema::ProtocolVersion::V1)
        .agent_capabilities(
            acp::AgentCapabilities::new()
                .load_session(true)
                .prompt_capabilities(
                    acp::PromptCapabilities::new()
                        .image(true)
                        .embedded_context(true),
                ),
        )
        .agent_info(
            acp::Implementation::new("deepagents", env!("CARGO_PKG_VERSION")).title("Deep Agents"),
        )
}

/// Answers a request with its result, or with the error's message.
fn reply<T: JsonRpcResponse>(responder: Responder<T>, result: anyhow::Result<T>) {
    // The editor may have gone; nothing is left to tell it then.
    let _ = match result {
        Ok(response) => responder.respond(response),
        Err(error) => responder.respond_with_error(agent_client_protocol::Error::new(
            ErrorCode::INTERNAL_ERROR,
            format!("{error:#}"),
        )),
    };
}

/// Sends one `session/update`.
fn notify(cx: &Cx, session: &str, update: acp::SessionUpdate) {
    // A closed connection ends the server; the run goes on to its checkpoint regardless.
    let _ = cx.send_notification(acp::SessionNotification::new(session.to_owned(), update));
}

/// The sessions the editor opened, and the turns running in them.
struct Server {
    /// The flags: every session's agent is built from them, rooted at its directory.
    args: RunArgs,
    /// What the editor said it offers (`initialize`).
    client: Mutex<acp::ClientCapabilities>,
    /// By session id (the thread id).
    sessions: Mutex<HashMap<String, Arc<AcpSession>>>,
    /// Requests being answered, awaited on the way out so that runs checkpoint.
    turns: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// One ACP session: a thread of the agent built for its directory.
struct AcpSession {
    /// The session id, which is the thread id.
    id: String,
    /// The agent and what it holds open.
    session: Session,
    /// Cancels the turn running now.
    turn: Mutex<Option<CancellationToken>>,
    /// Tools the person allowed for the rest of the session ("always allow").
    always: Mutex<HashSet<String>>,
    /// The calls of its turns, as the editor's terminals see them.
    calls: Arc<editor::Calls>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Server {
    /// Answers a request on a task of its own, so that the connection reads on (a cancel, a
    /// permission answer) while it runs.
    fn spawn(self: Arc<Self>, work: impl Future<Output = ()> + Send + 'static) {
        let handle = tokio::spawn(work);
        let mut turns = lock(&self.turns);
        turns.retain(|turn| !turn.is_finished());
        turns.push(handle);
    }

    /// The agent for session `id` rooted at `cwd`, using what the editor offers; the calls
    /// its terminals follow.
    async fn build(
        &self,
        cwd: &Path,
        id: &str,
        cx: &Cx,
    ) -> anyhow::Result<(Session, Arc<editor::Calls>)> {
        let mut args = self.args.clone();
        args.root = Some(cwd.to_owned());
        let client = lock(&self.client).clone();
        let link = Arc::new(editor::Link::new(cx.clone(), id, &client));
        let calls = link.calls.clone();
        let session = if link.offers_anything() {
            prepare_with_layer(&args, Front::Acp, &editor::Layer(link)).await?
        } else {
            prepare(&args, Front::Acp, false).await?
        };
        Ok((session, calls))
    }

    fn add(&self, id: &str, (session, calls): (Session, Arc<editor::Calls>)) -> Arc<AcpSession> {
        let session = Arc::new(AcpSession {
            id: id.to_owned(),
            session,
            turn: Mutex::new(None),
            always: Mutex::new(HashSet::new()),
            calls,
        });
        lock(&self.sessions).insert(id.to_owned(), session.clone());
        session
    }

    fn session(&self, id: &acp::SessionId) -> anyhow::Result<Arc<AcpSession>> {
        lock(&self.sessions)
            .get(id.0.as_ref())
            .cloned()
            .ok_or_else(|| anyhow!("no session `{}`: start one with session/new", id.0))
    }

    /// `session/new`: a new thread, rooted at the editor's directory.
    async fn new_session(
        &self,
        request: acp::NewSessionRequest,
        cx: &Cx,
    ) -> anyhow::Result<acp::NewSessionResponse> {
        let id = new_session_id();
        let session = self.build(&request.cwd, &id, cx).await?;
        let session = self.add(&id, session);
        Ok(acp::NewSessionResponse::new(id).modes(modes(&session.session)))
    }

    /// `session/load`: an existing thread, its conversation replayed as updates first.
    async fn load_session(
        &self,
        request: acp::LoadSessionRequest,
        cx: &Cx,
    ) -> anyhow::Result<acp::LoadSessionResponse> {
        let id = request.session_id.0.to_string();
        let (session, calls) = self.build(&request.cwd, &id, cx).await?;
        let thread = session.agent.thread(id.as_str())?;
        let Some(run) = thread.state().await? else {
            session.store.close().await;
            bail!("no session `{id}` to load (it has no thread yet)");
        };
        let root = session.root.clone();
        for update in replay(&run, root.as_deref()) {
            notify(cx, &id, update);
        }
        let session = self.add(&id, (session, calls));
        Ok(acp::LoadSessionResponse::new().modes(modes(&session.session)))
    }

    /// `session/set_mode`: `manual` asks before every change, `auto` does not.
    fn set_mode(
        &self,
        request: &acp::SetSessionModeRequest,
    ) -> anyhow::Result<acp::SetSessionModeResponse> {
        let session = self.session(&request.session_id)?;
        let Some(manual) = &session.session.manual else {
            bail!("this session has no modes: every call is approved (--auto-approve)");
        };
        match request.mode_id.0.as_ref() {
            MANUAL => manual.set(true),
            AUTO => manual.set(false),
            other => bail!("no mode `{other}`; the modes are `{AUTO}` and `{MANUAL}`"),
        }
        Ok(acp::SetSessionModeResponse::new())
    }

    /// `session/cancel`: cancels the session's running turn, which ends `cancelled`.
    fn cancel(&self, id: &acp::SessionId) {
        if let Ok(session) = self.session(id)
            && let Some(turn) = lock(&session.turn).as_ref()
        {
            turn.cancel();
        }
    }

    /// `session/prompt`: one turn, streamed as updates; its stop reason once it ends.
    async fn prompt(
        &self,
        request: acp::PromptRequest,
        cx: &Cx,
    ) -> anyhow::Result<acp::PromptResponse> {
        let session = self.session(&request.session_id)?;
        let cancel = shutdown::token().child_token();
        *lock(&session.turn) = Some(cancel.clone());
        let outcome = turn(&session, prompt_content(&request.prompt), cx, &cancel).await;
        *lock(&session.turn) = None;
        outcome.map(acp::PromptResponse::new)
    }

    /// Cancels what runs, waits for the runs to checkpoint, and closes every session.
    async fn close(&self) {
        let sessions: Vec<_> = lock(&self.sessions).drain().map(|(_, s)| s).collect();
        for session in &sessions {
            if let Some(turn) = lock(&session.turn).as_ref() {
                turn.cancel();
            }
        }
        let turns: Vec<_> = lock(&self.turns).drain(..).collect();
        let all = futures::future::join_all(turns);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(10), all).await;
        for session in sessions {
            if let Some(mcp) = &session.session.mcp {
                mcp.stop();
            }
            session.session.store.close().await;
        }
    }
}

/// A new session's id (and thread id): `acp-`, the time in milliseconds (made unique in the
/// process) and the process id (unique among editors' servers sharing the data directory).
fn new_session_id() -> String {
    static LAST: Mutex<u128> = Mutex::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let mut last = lock(&LAST);
    *last = (*last + 1).max(now);
    format!("acp-{}-{}", *last, std::process::id())
}

/// The session modes, when the session asks at all.
fn modes(session: &Session) -> Option<acp::SessionModeState> {
    session.manual.as_ref()?;
    Some(acp::SessionModeState::new(
        AUTO,
        vec![
            acp::SessionMode::new(AUTO, "Auto").description(
                "Changes files without asking; asks before commands outside the sandbox and the tools --interrupt-on names",
            ),
            acp::SessionMode::new(MANUAL, "Manual")
                .description("Asks before every file change, command and web fetch"),
        ],
    ))
}

/// Runs one turn to its end, answering pauses with permission requests.
async fn turn(
    session: &AcpSession,
    input: Vec<ContentBlock>,
    cx: &Cx,
    cancel: &CancellationToken,
) -> anyhow::Result<acp::StopReason> {
    let thread = session
        .session
        .agent
        .thread(session.id.as_str())?
        .with_options(RunOptions {
            cancel: cancel.clone(),
            ..RunOptions::default()
        });
    // What the agent may change is recorded first, so `threads rewind` undoes the turn.
    let root = session.session.root.clone();
    let said = result_text(&input);
    let snapshot = crate::rewind::before_turn(&thread, root.as_deref(), &said).await;
    let outcome = drive(session, &thread, input, cx, cancel).await;
    crate::rewind::after_turn(&thread, snapshot, root.as_deref()).await;
    outcome
}

/// Drives a turn's run to its end, answering pauses with permission requests.
async fn drive(
    session: &AcpSession,
    thread: &deepagents::Thread,
    input: Vec<ContentBlock>,
    cx: &Cx,
    cancel: &CancellationToken,
) -> anyhow::Result<acp::StopReason> {
    let mut view = View {
        session: session.id.clone(),
        root: session.session.root.clone(),
        calls: HashMap::new(),
        editor: Some(session.calls.clone()),
    };
    let mut stream = thread.stream(deepagents::Input::Content(input)).await?;
    loop {
        while let Some(event) = stream.next().await {
            view.event(&event, cx);
        }
        let output = match stream.outcome().await {
            Ok(output) => output,
            Err(failure) => {
                return match failure.error {
                    RunError::Cancelled => Ok(acp::StopReason::Cancelled),
                    RunError::TurnLimit(_) => Ok(acp::StopReason::MaxTurnRequests),
                    error => Err(anyhow!("{}", crate::exit::error_text(&error.to_string()))),
                };
            }
        };
        if output.status == RunStatus::Finished {
            return Ok(match output.stop_reason {
                deepagents::core::model::StopReason::MaxTokens => acp::StopReason::MaxTokens,
                deepagents::core::model::StopReason::ContentFilter => acp::StopReason::Refusal,
                _ => acp::StopReason::EndTurn,
            });
        }
        let pause = output.pause_id();
        let decisions = match decide(session, &output.pending, &mut view, cx, cancel).await? {
            Some(decisions) => decisions,
            None => {
                // Cancelled while asking: the calls are refused, so that the conversation
                // takes the next prompt; the run stops before the model is called again.
                cancel.cancel();
                let refused = output.pending.iter().map(|_| cancelled()).collect();
                let stream = thread
                    .stream(deepagents::Input::decide(pause.clone(), refused))
                    .await;
                if let Ok(mut stream) = stream {
                    while stream.next().await.is_some() {}
                    let _ = stream.outcome().await;
                }
                for action in &output.pending {
                    view.failed(action.tool_call_id(), cx);
                }
                return Ok(acp::StopReason::Cancelled);
            }
        };
        if let Some(policy) = &session.session.grants {
            approvals::grant_approved(policy, &output.pending, &decisions);
        }
        for (action, decision) in output.pending.iter().zip(&decisions) {
            if !matches!(decision, Decision::Approve | Decision::Edit { .. }) {
                view.failed(action.tool_call_id(), cx);
            }
        }
        let started = thread
            .stream(deepagents::Input::decide(pause.clone(), decisions))
            .await;
        stream = started.map_err(|failure| anyhow!("{}", failure.error))?;
    }
}

/// A refusal for a call the person cancelled the turn over.
fn cancelled() -> Decision {
    Decision::Reject {
        message: Some("The user cancelled the turn before deciding about this call.".to_owned()),
    }
}

/// One decision per paused call: the editor asks the person about each (but for tools
/// allowed for the session); `None` when the turn was cancelled meanwhile.
async fn decide(
    session: &AcpSession,
    pending: &[PendingAction],
    view: &mut View,
    cx: &Cx,
    cancel: &CancellationToken,
) -> anyhow::Result<Option<Vec<Decision>>> {
    let mut decisions = Vec::with_capacity(pending.len());
    for action in pending {
        // Questions (ask_user, a tool's own) have no ACP request to carry them, and a call
        // its rule does not let be approved is refused: as when nobody can answer.
        if action.name == ASK_USER
            || action.request.is_some()
            || !action.allowed.contains(&DecisionKind::Approve)
        {
            decisions.extend(approvals::approve_all(std::slice::from_ref(action)));
            continue;
        }
        if lock(&session.always).contains(&action.name) {
            decisions.push(Decision::Approve);
            continue;
        }
        view.announce(action, cx);
        let mut fields = view.fields(&action.name, &action.arguments);
        fields = fields.status(acp::ToolCallStatus::Pending);
        let request = acp::RequestPermissionRequest::new(
            session.id.clone(),
            acp::ToolCallUpdate::new(action.call_id.clone(), fields),
            vec![
                acp::PermissionOption::new(
                    ALLOW_ONCE,
                    "Allow",
                    acp::PermissionOptionKind::AllowOnce,
                ),
                acp::PermissionOption::new(
                    ALLOW_ALWAYS,
                    format!("Always allow {}", action.name),
                    acp::PermissionOptionKind::AllowAlways,
                ),
                acp::PermissionOption::new(
                    REJECT_ONCE,
                    "Reject",
                    acp::PermissionOptionKind::RejectOnce,
                ),
            ],
        );
        let answer = tokio::select! {
            answer = cx.send_request(request).block_task() => answer
                .map_err(|error| anyhow!("the editor did not answer the permission request: {error}"))?,
            () = cancel.cancelled() => return Ok(None),
        };
        let option = match answer.outcome {
            acp::RequestPermissionOutcome::Selected(selected) => selected.option_id,
            _ => return Ok(None),
        };
        decisions.push(match option.0.as_ref() {
            ALLOW_ONCE => Decision::Approve,
            ALLOW_ALWAYS => {
                lock(&session.always).insert(action.name.clone());
                Decision::Approve
            }
            _ => Decision::Reject {
                message: Some("The user rejected this call.".to_owned()),
            },
        });
    }
    Ok(Some(decisions))
}

/// What the editor sent, as the agent's input: text, images, files (embedded, or linked).
fn prompt_content(blocks: &[acp::ContentBlock]) -> Vec<ContentBlock> {
    let decode = |data: &str| base64::engine::general_purpose::STANDARD.decode(data.trim());
    let mut content = Vec::new();
    for block in blocks {
        match block {
            acp::ContentBlock::Text(text) => content.push(ContentBlock::text(text.text.clone())),
            acp::ContentBlock::Image(image) => match decode(&image.data) {
                Ok(data) => content.push(ContentBlock::data(image.mime_type.clone(), data)),
                Err(_) => content.push(ContentBlock::text("[an image that was not valid base64]")),
            },
            acp::ContentBlock::Audio(audio) => {
                if let Ok(data) = decode(&audio.data) {
                    content.push(ContentBlock::data(audio.mime_type.clone(), data));
                }
            }
            acp::ContentBlock::ResourceLink(link) => {
                content.push(ContentBlock::text(format!(
                    "[@{}]({})",
                    link.name, link.uri
                )));
            }
            acp::ContentBlock::Resource(resource) => match &resource.resource {
                acp::EmbeddedResourceResource::TextResourceContents(file) => {
                    content.push(ContentBlock::text(format!(
                        "<context uri=\"{}\">\n{}\n</context>",
                        file.uri, file.text
                    )));
                }
                acp::EmbeddedResourceResource::BlobResourceContents(blob) => {
                    content.push(ContentBlock::text(format!(
                        "<context uri=\"{}\">",
                        blob.uri
                    )));
                    if let Ok(data) = decode(&blob.blob) {
                        let mime = blob
                            .mime_type
                            .clone()
                            .unwrap_or_else(|| "application/octet-stream".to_owned());
                        content.push(ContentBlock::data(mime, data));
                    }
                    content.push(ContentBlock::text("</context>"));
                }
                _ => {}
            },
            _ => {}
        }
    }
    content
}

/// How a tool is shown: what kind of thing it does.
fn kind(tool: &str) -> acp::ToolKind {
    match tool {
        "read_file" | "ls" => acp::ToolKind::Read,
        "glob" | "grep" => acp::ToolKind::Search,
        "write_file" | "edit_file" => acp::ToolKind::Edit,
        "delete" => acp::ToolKind::Delete,
        "execute" => acp::ToolKind::Execute,
        deepagents::WEB_FETCH => acp::ToolKind::Fetch,
        "write_todos" | "think" => acp::ToolKind::Think,
        _ => acp::ToolKind::Other,
    }
}

/// The path a tool names, as a path on the host: the agent's `/notes.md` is under the root.
fn host_path(root: Option<&Path>, path: &str) -> PathBuf {
    match root {
        Some(root) if !Path::new(path).starts_with(root) => root.join(path.trim_start_matches('/')),
        _ => PathBuf::from(path),
    }
}

/// The file a call works on, when it names one.
fn file_argument(arguments: &serde_json::Value) -> Option<&str> {
    ["file_path", "path"]
        .iter()
        .find_map(|key| arguments[key].as_str())
}

/// A call's title: the tool and what it works on (`write_file /notes.md`, `` `ls -la` ``).
fn title(tool: &str, arguments: &serde_json::Value) -> String {
    if tool == "execute"
        && let Some(command) = arguments["command"].as_str()
    {
        return format!("`{command}`");
    }
    let subject = [
        "file_path",
        "path",
        "url",
        "pattern",
        "description",
        "query",
    ]
    .iter()
    .find_map(|key| arguments[key].as_str());
    match subject {
        Some(subject) => {
            let line = subject.lines().next().unwrap_or_default();
            let short: String = line.chars().take(80).collect();
            format!("{tool} {short}")
        }
        None => tool.to_owned(),
    }
}

/// What a change to a file looks like to the editor: the text before and after (for
/// `edit_file`, the part replaced).
fn diff(root: Option<&Path>, tool: &str, arguments: &serde_json::Value) -> Option<acp::Diff> {
    let path = host_path(root, file_argument(arguments)?);
    match tool {
        "write_file" => Some(acp::Diff::new(path, arguments["content"].as_str()?)),
        "edit_file" => Some(
            acp::Diff::new(path, arguments["new_string"].as_str()?)
                .old_text(arguments["old_string"].as_str()?.to_owned()),
        ),
        _ => None,
    }
}

/// Text content of a tool call.
fn text_content(text: impl Into<String>) -> acp::ToolCallContent {
    acp::ToolCallContent::Content(acp::Content::new(acp::ContentBlock::from(text.into())))
}

/// The text of a tool result.
fn result_text(content: &[ContentBlock]) -> String {
    content
        .iter()
        .filter_map(ContentBlock::as_text)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The plan of `write_todos`, as ACP plan entries.
fn plan(todos: &[deepagents::core::state::Todo]) -> acp::Plan {
    use deepagents::core::state::TodoStatus;
    acp::Plan::new(
        todos
            .iter()
            .map(|todo| {
                let status = match todo.status {
                    TodoStatus::Pending => acp::PlanEntryStatus::Pending,
                    TodoStatus::InProgress => acp::PlanEntryStatus::InProgress,
                    TodoStatus::Completed => acp::PlanEntryStatus::Completed,
                };
                acp::PlanEntry::new(todo.content.clone(), acp::PlanEntryPriority::Medium, status)
            })
            .collect(),
    )
}

/// A turn's events as session updates; it remembers the calls it announced.
struct View {
    session: String,
    root: Option<PathBuf>,
    /// By call id: the tool, its diff, and the output so far.
    calls: HashMap<String, CallView>,
    /// The session's calls as its terminals follow them (none when replaying).
    editor: Option<Arc<editor::Calls>>,
}

struct CallView {
    diff: Option<acp::Diff>,
    output: String,
}

impl View {
    /// What the editor shows of a call with these arguments.
    fn fields(&self, tool: &str, arguments: &serde_json::Value) -> acp::ToolCallUpdateFields {
        let mut fields = acp::ToolCallUpdateFields::new()
            .title(title(tool, arguments))
            .kind(kind(tool))
            .raw_input(arguments.clone());
        if let Some(path) = file_argument(arguments) {
            let location = acp::ToolCallLocation::new(host_path(self.root.as_deref(), path));
            fields = fields.locations(vec![location]);
        }
        if let Some(diff) = diff(self.root.as_deref(), tool, arguments) {
            fields = fields.content(vec![diff.into()]);
        }
        fields
    }

    /// Announces a paused call the editor has not heard of yet.
    fn announce(&mut self, action: &PendingAction, cx: &Cx) {
        if self.calls.contains_key(&action.call_id) {
            return;
        }
        self.start(&action.call_id, &action.name, cx);
    }

    /// Announces a new call, pending.
    fn start(&mut self, id: &str, name: &str, cx: &Cx) {
        self.calls.insert(
            id.to_owned(),
            CallView {
                diff: None,
                output: String::new(),
            },
        );
        let call = acp::ToolCall::new(id.to_owned(), name.to_owned())
            .kind(kind(name))
            .status(acp::ToolCallStatus::Pending);
        notify(cx, &self.session, acp::SessionUpdate::ToolCall(call));
    }

    /// Marks a call failed (refused, or cancelled before it ran).
    fn failed(&mut self, id: &str, cx: &Cx) {
        let fields = acp::ToolCallUpdateFields::new().status(acp::ToolCallStatus::Failed);
        let update = acp::ToolCallUpdate::new(id.to_owned(), fields);
        notify(
            cx,
            &self.session,
            acp::SessionUpdate::ToolCallUpdate(update),
        );
    }

    fn update(&self, id: &str, fields: acp::ToolCallUpdateFields, cx: &Cx) {
        let update = acp::ToolCallUpdate::new(id.to_owned(), fields);
        notify(
            cx,
            &self.session,
            acp::SessionUpdate::ToolCallUpdate(update),
        );
    }

    /// Sends what one event shows. Subagents' events stay inside their `task` call.
    fn event(&mut self, event: &Event, cx: &Cx) {
        // Every call, a subagent's too, is followed: a command waits to know whether the
        // editor was told of its call before showing its terminal there.
        let mut terminal = None;
        if let Some(editor) = self.editor.clone() {
            match &event.kind {
                EventKind::ToolCallStarted { call_id, .. } => {
                    // Announced below, before the command (which runs after this event) can
                    // ask: the notification goes out first.
                    if event.path.is_empty() {
                        self.event_at_top(event, cx, None);
                    }
                    editor.started(call_id, event.path.is_empty());
                    return;
                }
                EventKind::ToolCallFinished { call_id, .. } => {
                    terminal = editor.finished(call_id);
                }
                EventKind::ToolOutputDelta { call_id, .. }
                    if editor.terminal(call_id).is_some() =>
                {
                    // The editor shows the terminal's own output.
                    return;
                }
                _ => {}
            }
        }
        if event.path.is_empty() {
            self.event_at_top(event, cx, terminal);
        }
    }

    /// Sends what one event of the main agent shows; `terminal` is the editor's terminal a
    /// finished call's command ran in.
    fn event_at_top(&mut self, event: &Event, cx: &Cx, terminal: Option<acp::TerminalId>) {
        let chunk = |text: &str| acp::ContentChunk::new(acp::ContentBlock::from(text.to_owned()));
        match &event.kind {
            EventKind::TextDelta { text } => notify(
                cx,
                &self.session,
                acp::SessionUpdate::AgentMessageChunk(chunk(text)),
            ),
            EventKind::ReasoningDelta { text } => notify(
                cx,
                &self.session,
                acp::SessionUpdate::AgentThoughtChunk(chunk(text)),
            ),
            EventKind::ToolCallDelta {
                call_id: Some(id),
                name: Some(name),
                ..
            } if !self.calls.contains_key(id) => self.start(id, name, cx),
            EventKind::ToolCallStarted {
                call_id,
                name,
                arguments,
            } => {
                if !self.calls.contains_key(call_id) {
                    self.start(call_id, name, cx);
                }
                let fields = self
                    .fields(name, arguments)
                    .status(acp::ToolCallStatus::InProgress);
                if let Some(call) = self.calls.get_mut(call_id) {
                    call.diff = diff(self.root.as_deref(), name, arguments);
                }
                self.update(call_id, fields, cx);
            }
            EventKind::ToolOutputDelta { call_id, text, .. } => {
                let Some(call) = self.calls.get_mut(call_id) else {
                    return;
                };
                call.output.push_str(text);
                let fields =
                    acp::ToolCallUpdateFields::new().content(vec![text_content(&call.output)]);
                self.update(call_id, fields, cx);
            }
            EventKind::ToolCallFinished {
                call_id,
                status,
                content,
                ..
            } => {
                let text = result_text(content);
                let ok = *status == deepagents::core::message::ToolStatus::Ok;
                let diff = self.calls.get(call_id).and_then(|call| call.diff.clone());
                let shown = match (diff, terminal) {
                    (_, Some(terminal)) => {
                        vec![acp::ToolCallContent::Terminal(acp::Terminal::new(terminal))]
                    }
                    (Some(diff), None) if ok => vec![diff.into()],
                    _ => vec![text_content(text.clone())],
                };
                let fields = acp::ToolCallUpdateFields::new()
                    .status(if ok {
                        acp::ToolCallStatus::Completed
                    } else {
                        acp::ToolCallStatus::Failed
                    })
                    .content(shown)
                    .raw_output(serde_json::Value::String(text));
                self.update(call_id, fields, cx);
            }
            EventKind::StateUpdated {
                todos: Some(todos), ..
            } => notify(cx, &self.session, acp::SessionUpdate::Plan(plan(todos))),
            _ => {}
        }
    }
}

/// A thread's conversation as session updates: the person's messages, the agent's text and
/// reasoning, each tool call with its outcome, and the plan.
fn replay(run: &deepagents::Run, root: Option<&Path>) -> Vec<acp::SessionUpdate> {
    let results: HashMap<&str, &deepagents::core::message::ToolResult> = run
        .state
        .messages
        .iter()
        .filter_map(|message| match message {
            Message::Tool(result) => Some((result.tool_call_id.as_str(), result)),
            _ => None,
        })
        .collect();
    let view = View {
        session: String::new(),
        root: root.map(Path::to_owned),
        calls: HashMap::new(),
        editor: None,
    };
    let chunk = |block: acp::ContentBlock| acp::ContentChunk::new(block);
    let mut updates = Vec::new();
    for message in &run.state.messages {
        match message {
            Message::User { content } => {
                for block in content {
                    match block {
                        ContentBlock::Text { text } => updates.push(
                            acp::SessionUpdate::UserMessageChunk(chunk(text.clone().into())),
                        ),
                        ContentBlock::Data { mime_type, data }
                            if mime_type.starts_with("image/") =>
                        {
                            let image = acp::ImageContent::new(
                                base64::engine::general_purpose::STANDARD.encode(data),
                                mime_type.clone(),
                            );
                            updates.push(acp::SessionUpdate::UserMessageChunk(chunk(
                                acp::ContentBlock::Image(image),
                            )));
                        }
                        _ => {}
                    }
                }
            }
            Message::Assistant(assistant) => {
                for block in &assistant.content {
                    match block {
                        ContentBlock::Reasoning { text, .. } if !text.is_empty() => updates.push(
                            acp::SessionUpdate::AgentThoughtChunk(chunk(text.clone().into())),
                        ),
                        ContentBlock::Text { text } => updates.push(
                            acp::SessionUpdate::AgentMessageChunk(chunk(text.clone().into())),
                        ),
                        _ => {}
                    }
                }
                for call in &assistant.tool_calls {
                    let fields = view.fields(&call.name, &call.arguments);
                    let mut shown =
                        acp::ToolCall::new(call.id.clone(), title(&call.name, &call.arguments))
                            .kind(kind(&call.name))
                            .raw_input(call.arguments.clone())
                            .locations(fields.locations.clone().unwrap_or_default());
                    shown = match results.get(call.id.as_str()) {
                        Some(result) => {
                            let ok = result.status == deepagents::core::message::ToolStatus::Ok;
                            let text = result_text(&result.content);
                            let content = match diff(root, &call.name, &call.arguments) {
                                Some(diff) if ok => vec![diff.into()],
                                _ => vec![text_content(text.clone())],
                            };
                            shown
                                .status(if ok {
                                    acp::ToolCallStatus::Completed
                                } else {
                                    acp::ToolCallStatus::Failed
                                })
                                .content(content)
                                .raw_output(serde_json::Value::String(text))
                        }
                        None => shown.status(acp::ToolCallStatus::Pending),
                    };
                    updates.push(acp::SessionUpdate::ToolCall(shown));
                }
            }
            _ => {}
        }
    }
    if !run.state.todos.is_empty() {
        updates.push(acp::SessionUpdate::Plan(plan(&run.state.todos)));
    }
    updates
}
