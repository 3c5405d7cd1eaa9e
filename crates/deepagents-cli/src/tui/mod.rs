//! The interactive agent: a conversation on a thread, in the terminal's alternate screen.
//!
//! The alternate screen (rather than an inline viewport) because the view is redrawn whole
//! on every change — streaming text, spinners, a resized window — and that stays exact
//! there; the conversation lives in the thread, not in the scrollback, and `deepagents
//! threads show` prints it. The loop waits on the terminal, the running turn's events and a
//! tick; every turn is a run of the thread, saved at every step.

mod app;
mod ask;
mod notes;
mod view;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use crossterm::event::{
    DisableBracketedPaste, EnableBracketedPaste, Event as TermEvent, EventStream,
};
use crossterm::execute;
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use deepagents::{Checkpointer, RunOptions, RunStatus, RunStream, Thread};
use futures::StreamExt as _;
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;

pub use ask::{Asker, Questions};

use app::{Action, Answer, App, Cell, Status};
use ask::Question;

use crate::args::{ChatArgs, RunArgs};
use crate::session::{Front, Session, prepare};

/// Opens the interactive agent: builds its session, then runs the TUI on the thread
/// `--resume`, `--thread` or a new one names.
pub async fn chat(args: ChatArgs) -> anyhow::Result<ExitCode> {
    let Ok(session) = crate::shutdown::or_signal(prepare(&args.run, Front::Tui, true)).await else {
        return Ok(ExitCode::from(crate::exit::INTERRUPTED));
    };
    let session = session?;
    let checkpointer =
        session.agent.checkpointer().cloned().context(
            "the interactive agent keeps threads; its data directory could not be opened",
        )?;
    let thread_id = match (args.resume.as_deref(), args.run.thread.clone()) {
        (Some(""), _) => Some(
            latest_thread(checkpointer.as_ref())
                .await?
                .context("there is no thread to resume yet; start one with `deepagents`")?,
        ),
        (Some(id), _) => Some(id.to_owned()),
        (None, thread) => thread,
    };
    let first = args.message.clone().or(args.run.task.clone());
    run(Start {
        session,
        args: args.run.clone(),
        thread_id,
        first,
        auto_approve: args.run.auto_approve,
    })
    .await
}

/// What the TUI starts with.
struct Start {
    /// The agent and what it keeps alive; rebuilt by `/model`.
    session: Session,
    /// The flags it was built from, for `/model`.
    args: RunArgs,
    /// The thread to open; a new one when `None`.
    thread_id: Option<String>,
    /// A message to send at once.
    first: Option<String>,
    /// Start in `/yolo`.
    auto_approve: bool,
}

/// The thread changed most recently.
async fn latest_thread(checkpointer: &dyn Checkpointer) -> anyhow::Result<Option<String>> {
    Ok(checkpointer
        .threads()
        .await?
        .into_iter()
        .max_by_key(|t| t.updated_at_ms)
        .map(|t| t.thread_id))
}

fn new_thread_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!("chat-{now}")
}

/// Puts the terminal back however the TUI ends (an error, a panic unwinding).
struct Screen;

impl Screen {
    fn enter() -> anyhow::Result<Self> {
        enable_raw_mode().context("cannot put the terminal in raw mode")?;
        // A second signal exits without unwinding: the terminal is put back first.
        crate::shutdown::on_exit_now(Some(Self::restore));
        execute!(
            std::io::stdout(),
            EnterAlternateScreen,
            EnableBracketedPaste
        )
        .context("cannot open the alternate screen")?;
        Ok(Self)
    }

    fn restore() {
        let _ = execute!(
            std::io::stdout(),
            DisableBracketedPaste,
            LeaveAlternateScreen
        );
        let _ = disable_raw_mode();
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        crate::shutdown::on_exit_now(None);
        Self::restore();
    }
}

/// The running turn.
struct Turn {
    stream: RunStream,
}

/// Runs the TUI until the person quits.
async fn run(start: Start) -> anyhow::Result<ExitCode> {
    let mut session = start.session;
    let mut args = start.args;
    let mut thread_id = start.thread_id.unwrap_or_else(new_thread_id);
    let mut app = App::new(Status {
        model: session.model.clone(),
        thread: thread_id.clone(),
        sandbox: session.sandbox.clone(),
        window: session.window,
        ..Status::default()
    });
    if start.auto_approve {
        app.mode = app::Mode::Yolo;
    }
    app.plan = args.plan;
    app.root.clone_from(&session.root);
    let mut notes = notes::Notes::load();
    open(&session, &thread_id, &mut app, &notes).await?;
    let _screen = Screen::enter()?;
    let mut terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))
        .context("cannot draw on the terminal")?;
    let mut questions = session.questions.take();
    // The question shown first; the others wait their turn.
    let mut asking: std::collections::VecDeque<Question> = std::collections::VecDeque::new();
    let mut keys = EventStream::new();
    let mut tick = tokio::time::interval(Duration::from_millis(120));
    let mut turn: Option<Turn> = None;
    // Async subagents' endings: one that belongs to the open thread starts its next turn
    // once the TUI is idle. Checked at start too: a task may have ended while it was closed.
    let mut endings = session.agent.background_endings();
    let mut wake_due = true;
    // The turn whose snapshot was taken last (`/rewind`), and a rewind waiting for its
    // second confirmation because it would overwrite files changed by hand.
    let mut snapshot_turn: Option<u64> = None;
    let mut confirm_rewind: Option<(u64, app::RewindWhat)> = None;
    let mut pending = start.first.map(|first| {
        app.cells.push(Cell::User(first.clone()));
        app.busy = true;
        Action::Send(first)
    });
    // Why the loop ended other than by quitting: the terminal failed.
    let mut failed: Option<anyhow::Error> = None;
    // Frames are drawn when something changed, at most one per FRAME: a stream of deltas is
    // coalesced, and an idle session draws nothing.
    let mut lines = view::LineCache::default();
    let mut dirty = true;
    let mut drawn_at: Option<tokio::time::Instant> = None;
    loop {
        // The interrupt rules read the mode at every call: a switch applies at once.
        if let Some(manual) = &session.manual {
            manual.set(app.mode == app::Mode::Manual);
        }
        if let Some(plan) = &session.plan {
            plan.set(app.plan);
        }
        if let Some(action) = pending.take() {
            dirty = true;
            match action {
                Action::Quit => break,
                Action::Answer(answer) => {
                    match (asking.pop_front(), answer) {
                        (Some(Question::Approve { reply, .. }), Answer::Approved(yes)) => {
                            let _ = reply.send(yes);
                        }
                        (Some(Question::Elicit { reply, .. }), Answer::Elicited(answer)) => {
                            let _ = reply.send(answer);
                        }
                        // A mismatch cannot happen; dropping the reply declines.
                        _ => {}
                    }
                    if let Some(next) = asking.front() {
                        app.ask(next);
                    }
                }
                Action::Send(text) => {
                    let (mut content, notes) = app::message_content(&text, session.root.as_deref());
                    content.extend(app.take_pasted(&text));
                    for note in notes {
                        app.cells.push(Cell::Notice(note));
                    }
                    let thread = handle(&session, &thread_id, app.take_compact())?;
                    confirm_rewind = None;
                    snapshot_turn =
                        crate::rewind::before_turn(&thread, session.root.as_deref(), &text).await;
                    let started = thread.stream(deepagents::Input::Content(content)).await;
                    match started {
                        Ok(stream) => turn = Some(Turn { stream }),
                        Err(e) => pending = app.failed(e.to_string(), Default::default()),
                    }
                }
                Action::Decide(decisions) => {
                    let thread = handle(&session, &thread_id, false)?;
                    if let Some(policy) = &session.grants
                        && let Ok(actions) = thread.pending().await
                    {
                        crate::approvals::grant_approved(policy, &actions, &decisions);
                    }
                    app.busy = true;
                    let started = thread
                        .stream(deepagents::Input::decide(app.pause.take(), decisions))
                        .await;
                    match started {
                        Ok(stream) => turn = Some(Turn { stream }),
                        Err(failure) => {
                            pending = app.failed(failure_text(&failure), failure.run.spent)
                        }
                    }
                }
                Action::Interrupt => {
                    if let Some(turn) = &turn {
                        turn.stream.cancel();
                    }
                }
                Action::NewThread => {
                    thread_id = new_thread_id();
                    app.cells.clear();
                    app.todos.clear();
                    open(&session, &thread_id, &mut app, &notes).await?;
                    app.cells
                        .push(Cell::Notice(format!("new thread {thread_id}")));
                    wake_due = true;
                }
                Action::Resume(id) => {
                    if let Err(e) = deepagents::validate_thread_id(&id) {
                        app.cells.push(Cell::Error(e.to_string()));
                    } else {
                        thread_id = id;
                        app.cells.clear();
                        app.todos.clear();
                        open(&session, &thread_id, &mut app, &notes).await?;
                        app.cells
                            .push(Cell::Notice(format!("opened thread {thread_id}")));
                        wake_due = true;
                    }
                }
                Action::Rewind(None, _) => {
                    let checkpointer = session.agent.checkpointer().cloned();
                    app.cells.push(match checkpointer {
                        Some(c) => match crate::rewind::listing(c.as_ref(), &thread_id).await {
                            Ok(list) => Cell::Notice(format!(
                                "{list}\n/rewind N goes back to before turn N (files and conversation; /rewind N files, /rewind N conversation)"
                            )),
                            Err(e) => Cell::Error(format!("{e:#}")),
                        },
                        None => Cell::Error("this session keeps no thread".to_owned()),
                    });
                }
                Action::Rewind(Some(n), what) => {
                    let force = confirm_rewind.take() == Some((n, what));
                    let options = deepagents::rewind::RewindOptions {
                        files: what != app::RewindWhat::Conversation,
                        conversation: what != app::RewindWhat::Files,
                        force,
                    };
                    let Some(checkpointer) = session.agent.checkpointer().cloned() else {
                        app.cells
                            .push(Cell::Error("this session keeps no thread".to_owned()));
                        continue;
                    };
                    match crate::rewind::rewind(checkpointer.as_ref(), &thread_id, n, options).await
                    {
                        Ok(lines) => {
                            if options.conversation {
                                app.cells.clear();
                                app.todos.clear();
                                open(&session, &thread_id, &mut app, &notes).await?;
                            }
                            app.cells.push(Cell::Notice(format!(
                                "rewound to before turn {n}\n{}",
                                lines.join("\n")
                            )));
                        }
                        Err(deepagents::rewind::RewindError::Conflicts(paths)) => {
                            confirm_rewind = Some((n, what));
                            app.cells.push(Cell::Error(format!(
                                "changed by hand since the snapshot: {}\nnothing was changed; /rewind {n} again overwrites them",
                                paths.join(", ")
                            )));
                        }
                        Err(e) => app.cells.push(Cell::Error(e.to_string())),
                    }
                }
                Action::Copy(text) => {
                    use base64::Engine as _;
                    // OSC 52: the terminal (or tmux, or an SSH client) sets its clipboard.
                    let encoded = base64::engine::general_purpose::STANDARD.encode(text);
                    let _ = std::io::Write::write_all(
                        &mut std::io::stdout(),
                        format!("\x1b]52;c;{encoded}\x07").as_bytes(),
                    );
                }
                Action::ListMcp => app.cells.push(Cell::Notice(mcp_summary(&session))),
                Action::PasteImage => match clipboard_image().await {
                    Ok(bytes) => app.attach("the clipboard's image", "image/png", bytes),
                    Err(why) => app.cells.push(Cell::Error(why)),
                },
                Action::ShowContext => {
                    let parts = context_parts(&session, &thread_id).await;
                    app.show_context(&parts);
                }
                Action::ListAgents => app.cells.push(Cell::Notice(
                    session
                        .subagents
                        .iter()
                        .map(|(name, about)| format!("{name}: {about}"))
                        .collect::<Vec<_>>()
                        .join("\n"),
                )),
                Action::Remember(line) => app.cells.push(match remember(&session, &line) {
                    Ok(path) => Cell::Notice(format!("added to {}", path.display())),
                    Err(e) => Cell::Error(format!("{e:#}")),
                }),
                Action::SwitchModel(spec) => {
                    let mut next = args.clone();
                    next.model = Some(spec.clone());
                    next.trust_project = session.trusted;
                    // A signal abandons the new session (its MCP servers are stopped).
                    let Ok(prepared) =
                        crate::shutdown::or_signal(prepare(&next, Front::Tui, false)).await
                    else {
                        break;
                    };
                    match prepared {
                        Ok(rebuilt) => {
                            let old = std::mem::replace(&mut session, rebuilt);
                            old.store.close().await;
                            drop(old);
                            questions = session.questions.take();
                            endings = session.agent.background_endings();
                            args = next;
                            app.status.model.clone_from(&spec);
                            app.status.window = session.window;
                            app.cells
                                .push(Cell::Notice(format!("the next turns use {spec}")));
                        }
                        Err(e) => app.cells.push(Cell::Error(format!("{e:#}"))),
                    }
                    // Building may have written to the terminal: draw everything again.
                    let _ = terminal.clear();
                }
                Action::Rename(title) => {
                    notes.update(&thread_id, |note| note.title = Some(title.clone()));
                    app.status.thread = title;
                }
                Action::ModeChanged => {
                    let (mode, plan) = (app.mode, app.plan);
                    notes.update(&thread_id, |note| {
                        note.mode = mode;
                        note.plan = plan;
                    });
                }
                Action::ApprovePlan(text) => {
                    notes.update(&thread_id, |note| note.plan = false);
                    // The approval is the next message, as if typed.
                    pending = Some(Action::Send(text));
                }
                Action::ListThreads => {
                    let threads = match session.agent.checkpointer() {
                        Some(checkpointer) => thread_list(checkpointer.as_ref(), &notes).await,
                        None => Vec::new(),
                    };
                    app.pick_thread(threads);
                }
                Action::DeleteThread(id) if id == thread_id => app.cells.push(Cell::Error(
                    "this is the thread open now; /new or /resume another one first".to_owned(),
                )),
                Action::DeleteThread(id) => {
                    let deleted = match session.agent.checkpointer() {
                        Some(checkpointer) => delete_thread(checkpointer.as_ref(), &id).await,
                        None => Err(anyhow::anyhow!("no thread store")),
                    };
                    app.cells.push(match deleted {
                        Ok(()) => Cell::Notice(format!("deleted thread {id}")),
                        Err(e) => Cell::Error(format!("cannot delete {id}: {e:#}")),
                    });
                }
            }
            continue;
        }
        if wake_due && turn.is_none() && app.pause.is_none() {
            wake_due = false;
            if let Some(stream) = woken(&session, &thread_id, &mut app).await? {
                turn = Some(Turn { stream });
                dirty = true;
            }
        }
        let due = drawn_at.map(|at| at + FRAME);
        if dirty && due.is_none_or(|due| tokio::time::Instant::now() >= due) {
            if let Err(e) = terminal.draw(|frame| view::render(frame, &app, &mut lines)) {
                failed = Some(anyhow::Error::new(e).context("cannot draw on the terminal"));
                break;
            }
            dirty = false;
            drawn_at = Some(tokio::time::Instant::now());
        }
        // A change that came too soon after the last frame is drawn when the next is due.
        let next_frame = async {
            match (dirty, due) {
                (true, Some(due)) => tokio::time::sleep_until(due).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            () = next_frame => continue,
            // SIGTERM, SIGHUP (the terminal went away), SIGINT from elsewhere (a key's Ctrl-C
            // is a key here): the turn is cancelled and saved below, as on quitting.
            _ = crate::shutdown::signalled() => break,
            key = keys.next() => match key {
                Some(Ok(TermEvent::Key(key))) => {
                    pending = app.on_key(key);
                    dirty = true;
                }
                Some(Ok(TermEvent::Paste(text))) => {
                    app.on_paste(&text);
                    dirty = true;
                }
                // A resize, focus change: draw again.
                Some(Ok(_)) => dirty = true,
                Some(Err(e)) => {
                    failed = Some(anyhow::Error::new(e).context("cannot read the terminal"));
                    break;
                }
                None => break,
            },
            event = async {
                match turn.as_mut() {
                    Some(turn) => turn.stream.next().await,
                    None => std::future::pending().await,
                }
            } => match event {
                Some(event) => {
                    app.on_run_event(&event);
                    dirty = true;
                }
                None => {
                    dirty = true;
                    // An ending that came after the turn's last model call waits for it.
                    wake_due = true;
                    if let Some(ended) = turn.take() {
                        let outcome = ended.stream.outcome().await;
                        let thread = handle(&session, &thread_id, false)?;
                        crate::rewind::after_turn(&thread, snapshot_turn, session.root.as_deref())
                            .await;
                        pending = match outcome {
                            Ok(output) if output.status == RunStatus::Finished => {
                                if output.cut() {
                                    app.cells.push(Cell::Notice(
                                        "The answer was cut at the model's output limit and is not complete: ask for the rest, or raise max_output_tokens in config.toml.".to_owned(),
                                    ));
                                }
                                app.finished(output.run.spent, output.run.total_spent)
                            }
                            Ok(output) => {
                                app.pause = output.pause_id();
                                app.paused(output.pending)
                            }
                            Err(failure) => app.failed(failure_text(&failure), failure.run.spent),
                        };
                    }
                }
            },
            question = async {
                match questions.as_mut() {
                    Some(questions) => questions.recv().await,
                    None => std::future::pending().await,
                }
            } => match question {
                Some(question) => {
                    dirty = true;
                    if asking.is_empty() {
                        app.ask(&question);
                    }
                    asking.push_back(question);
                }
                None => questions = None,
            },
            ended = async {
                match endings.as_mut() {
                    Some(endings) => endings.recv().await,
                    None => std::future::pending().await,
                }
            } => match ended {
                Ok(id) => wake_due |= id == thread_id,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => wake_due = true,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => endings = None,
            },
            _ = tick.tick() => dirty |= app.on_tick(),
        }
    }
    // However the loop ended, the running turn stops the way Esc stops it: its commands are
    // killed and what it did is saved before the outcome comes back.
    if let Some(turn) = turn {
        turn.stream.cancel();
        let _ = turn.stream.outcome().await;
    }
    // Questions still waiting are declined by dropping their replies.
    drop(asking);
    drop(_screen);
    if let Some(hooks) = &session.hooks {
        hooks
            .notify(
                &thread_id,
                "SessionEnd",
                serde_json::json!({"reason": "exit"}),
            )
            .await;
    }
    if let Some(mcp) = &session.mcp {
        mcp.stop();
    }
    session.store.close().await;
    match failed {
        Some(e) => Err(e),
        None => Ok(ExitCode::SUCCESS),
    }
}

/// The turn that background tasks' endings start on thread `id`, when it has any to take:
/// the TUI shows it as it would a turn of the person's.
async fn woken(session: &Session, id: &str, app: &mut App) -> anyhow::Result<Option<RunStream>> {
    if session.agent.background_endings().is_none() {
        return Ok(None);
    }
    let thread = handle(session, id, false)?;
    match thread.stream(deepagents::Input::Wake).await {
        Ok(stream) => {
            // Its `background_task_finished` event says which task; the answer follows.
            app.busy = true;
            Ok(Some(stream))
        }
        // Nothing left to deliver, or another process holds the thread: its run takes them.
        Err(failure)
            if matches!(
                failure.error,
                deepagents::RunError::NothingToWake
                    | deepagents::RunError::Checkpoint(deepagents::CheckpointError::Busy { .. })
            ) =>
        {
            Ok(None)
        }
        Err(failure) => {
            app.cells.push(Cell::Error(failure.error.to_string()));
            Ok(None)
        }
    }
}

/// The shortest time between two frames while the screen changes (30 frames a second).
const FRAME: Duration = Duration::from_millis(33);

/// The thread `id` for one turn: each turn gets its own cancellation; `compact` summarizes
/// older messages first.
fn handle(session: &Session, id: &str, compact: bool) -> anyhow::Result<Thread> {
    Ok(session.agent.thread(id)?.with_options(RunOptions {
        compact_first: compact,
        // A signal cancels the turn even while the loop is busy elsewhere.
        cancel: crate::shutdown::token().child_token(),
        ..RunOptions::default()
    }))
}

/// Deletes thread `id`, unless a run holds it.
async fn delete_thread(checkpointer: &dyn Checkpointer, id: &str) -> anyhow::Result<()> {
    deepagents::validate_thread_id(id)?;
    drop(checkpointer.try_lease(id).await?);
    checkpointer.delete_thread(id).await?;
    Ok(())
}

/// The 50 threads changed last, newest first: id, and a line with when, how many messages,
/// the title.
async fn thread_list(
    checkpointer: &dyn Checkpointer,
    notes: &notes::Notes,
) -> Vec<(String, String)> {
    let mut threads = checkpointer.threads().await.unwrap_or_default();
    threads.sort_by_key(|t| std::cmp::Reverse(t.updated_at_ms));
    let mut lines = Vec::new();
    for thread in threads.into_iter().take(50) {
        let run = checkpointer
            .load(&thread.thread_id, None)
            .await
            .ok()
            .flatten();
        let messages = run.as_ref().map_or(0, |run| run.state.messages.len());
        let title = notes.get(&thread.thread_id).title.or_else(|| {
            run.as_ref().and_then(|run| {
                run.state
                    .messages
                    .iter()
                    .find(|m| matches!(m, deepagents::Message::User { .. }))
                    .map(|m| app::short_arguments(&serde_json::Value::String(m.text())))
            })
        });
        let line = format!(
            "{}  {}  {} messages  {}",
            thread.thread_id,
            notes::date(thread.updated_at_ms),
            messages,
            title.unwrap_or_default()
        );
        lines.push((thread.thread_id, line));
    }
    lines
}

/// Shows thread `id`'s conversation so far (none for a new thread), with its title and mode.
async fn open(
    session: &Session,
    id: &str,
    app: &mut App,
    notes: &notes::Notes,
) -> anyhow::Result<()> {
    let note = notes.get(id);
    // With --auto-approve everything stays approved, whatever the thread had.
    if session.manual.is_some() {
        app.mode = note.mode;
    }
    // `--plan` starts in plan mode; otherwise the thread's.
    app.plan = app.plan || note.plan;
    if let Some(run) = handle(session, id, false)?.state().await? {
        app.show_history(&run.state.messages);
        app.todos.clone_from(&run.state.todos);
        app.learn_skills(run.state.custom.get(deepagents::middleware::SKILLS_KEY));
        app.status.thread_spent = run.total_spent;
        if !run.control.pending.is_empty() {
            // Shown for a decision even in YOLO mode: it was left waiting.
            if app.mode == app::Mode::Yolo {
                app.mode = app::Mode::Auto;
            }
            app.pause = deepagents::pause_id(&run);
            app.paused(run.control.pending.clone());
        }
    }
    app.status.thread = note.title.unwrap_or_else(|| id.to_owned());
    Ok(())
}

/// The image on the system clipboard, as PNG, read with `wl-paste` (Wayland) or `xclip`
/// (X11): a terminal pastes only text, so the image is fetched beside it.
async fn clipboard_image() -> Result<Vec<u8>, String> {
    let readers: [(&str, &[&str]); 2] = [
        ("wl-paste", &["--no-newline", "--type", "image/png"]),
        (
            "xclip",
            &["-selection", "clipboard", "-target", "image/png", "-out"],
        ),
    ];
    let mut tried = Vec::new();
    for (program, args) in readers {
        match tokio::process::Command::new(program)
            .args(args)
            .stdin(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .output()
            .await
        {
            Ok(out) if out.status.success() && out.stdout.starts_with(b"\x89PNG") => {
                return Ok(out.stdout);
            }
            Ok(_) => tried.push(format!("{program} found no image")),
            Err(_) => tried.push(format!("{program} is not installed")),
        }
    }
    Err(format!(
        "no image on the clipboard ({}); paste or drop an image file's path instead, or name it as @path",
        tried.join(", ")
    ))
}

/// Estimated tokens of what the next request carries besides the system prompt's own text.
async fn context_parts(session: &Session, id: &str) -> app::ContextParts {
    let tokens = |value: &serde_json::Value| {
        serde_json::to_string(value).map_or(0, |text| text.len() as u64 / 4)
    };
    let mut parts = app::ContextParts::default();
    let mut tools: Vec<serde_json::Value> = session
        .agent
        .tool_specs()
        .iter()
        .filter_map(|spec| serde_json::to_value(spec).ok())
        .collect();
    if let Some(connections) = &session.mcp {
        for server in &connections.servers {
            tools.extend(server.tools.iter().cloned());
        }
    }
    parts.tools = (tools.iter().map(tokens).sum(), tools.len());
    let state = match handle(session, id, false) {
        Ok(thread) => thread.state().await.ok().flatten(),
        Err(_) => None,
    };
    if let Some(run) = state {
        let state = &run.state;
        parts.messages = (
            state
                .messages
                .iter()
                .filter_map(|message| serde_json::to_value(message).ok())
                .map(|message| tokens(&message))
                .sum(),
            state.messages.len(),
        );
        let custom = |key: &str| state.custom.get(key).map_or(0, tokens);
        parts.memory = custom(deepagents::middleware::MEMORY_KEY);
        parts.skills = custom(deepagents::middleware::SKILLS_KEY);
    }
    parts
}

/// The MCP servers of the session and their tools, as the model sees them.
fn mcp_summary(session: &Session) -> String {
    let Some(connections) = &session.mcp else {
        return "no MCP servers (see .mcp.json, --mcp-config)".to_owned();
    };
    let mut lines = Vec::new();
    for server in &connections.servers {
        let names: Vec<String> = server
            .tools
            .iter()
            .filter_map(|tool| tool["name"].as_str())
            .map(|tool| deepagents_mcp::tool_name(&server.config.name, tool))
            .collect();
        lines.push(format!(
            "{} ({} tools): {}",
            server.config.name,
            names.len(),
            names.join(", ")
        ));
    }
    for (name, why) in &connections.failures {
        lines.push(format!("{name}: not available: {why}"));
    }
    lines.join("\n")
}

/// Appends `line` as a list item to `AGENTS.md` in the root: the project's memory, read at
/// the start of every run.
fn remember(session: &Session, line: &str) -> anyhow::Result<std::path::PathBuf> {
    let root = session
        .root
        .as_ref()
        .context("/remember needs a project on disk (--backend filesystem or shell)")?;
    let path = root.join("AGENTS.md");
    let mut text = std::fs::read_to_string(&path).unwrap_or_default();
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&format!("- {}\n", line.trim()));
    std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// What a failed run shows: its error, with the flag that lets it go on.
fn failure_text(failure: &deepagents::RunFailure) -> String {
    format!("{failure}{}", crate::exit::flag_hint(&failure.error))
}
