//! The TUI's state and how events change it. No terminal here: keys and run events go in,
//! [`Action`]s for the loop come out, and the view renders the state.

use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use deepagents::core::{
    ContentBlock, Event, EventKind, Message, Spent, Todo, ToolStatus, interrupt::DecisionKind,
};
use deepagents::{Decision, PendingAction};

/// How many characters of a tool's output a cell keeps for its preview.
const OUTPUT_PREVIEW: usize = 2_000;

/// One entry of the conversation view.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    /// What the person sent.
    User(String),
    /// The agent's text (`depth`: subagents nest).
    Assistant { text: String, depth: usize },
    /// The model's reasoning, where the provider shows it.
    Reasoning { text: String, depth: usize },
    /// A tool call: its name, a short form of its arguments, how it went.
    Tool {
        call_id: String,
        name: String,
        arguments: String,
        depth: usize,
        state: ToolState,
        /// Output so far (shell output streams here), or the result.
        output: String,
        /// An edit's old and new text, shown as a diff.
        diff: Option<(String, String)>,
    },
    /// Something the harness or the TUI says (summaries, interruptions, command output).
    Notice(String),
    /// A failure.
    Error(String),
}

/// Where a tool call stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolState {
    Running,
    Done { ok: bool, duration_ms: u64 },
}

/// `12,345` for 12345.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// What fills the context window, in estimated tokens (see [`App::show_context`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ContextParts {
    /// Memory files (AGENTS.md) put in the system prompt.
    pub memory: u64,
    /// The skills listed in the system prompt.
    pub skills: u64,
    /// Tool definitions, and how many.
    pub tools: (u64, usize),
    /// The conversation, and how many messages.
    pub messages: (u64, usize),
}

/// Who approves what waits for approval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// What the sandbox contains runs (file changes in the root, confined commands); what
    /// leaves it asks, in the approval panel (`/auto`).
    #[default]
    Auto,
    /// Every file change and command asks too (`/manual`).
    Manual,
    /// Everything is approved (`/yolo`): shown as a badge.
    Yolo,
}

impl Mode {
    /// Its name in the status bar and in commands.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Manual => "manual",
            Self::Yolo => "yolo",
        }
    }
}

/// Pending actions being decided, one after another.
#[derive(Clone, Debug, PartialEq)]
pub struct Approval {
    pub actions: Vec<PendingAction>,
    pub decisions: Vec<Decision>,
    /// Typing a reason for a rejection.
    /// Typing something for the action shown: a rejection's reason, edited arguments, a
    /// response in the call's place.
    pub typing: Option<(Typing, String)>,
}

/// A question a running turn waits on (a hook's `ask`, a server's elicitation).
#[derive(Clone, Debug, PartialEq)]
pub enum Asked {
    /// May this call run?
    Approve { call: String, reason: String },
    /// A server wants values for a form, asked field by field.
    Form {
        server: String,
        message: String,
        fields: Vec<(String, serde_json::Value, bool)>,
        at: usize,
        values: serde_json::Map<String, serde_json::Value>,
        typed: String,
        problem: Option<String>,
    },
    /// A server wants something done at a URL.
    Url {
        server: String,
        message: String,
        url: String,
    },
}

/// The thread picker (`/threads`): threads newest first, one selected.
#[derive(Clone, Debug, PartialEq)]
pub struct Picker {
    /// `(thread id, the line shown)`.
    pub threads: Vec<(String, String)>,
    pub selected: usize,
}

/// The answer to an [`Asked`].
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    Approved(bool),
    Elicited(deepagents_mcp::ElicitationAnswer),
}

/// What is being typed in the approval panel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Typing {
    /// A rejection's reason (optional).
    Reason,
    /// The call's arguments, as JSON.
    Arguments,
    /// An answer given to the model in the call's place.
    Response,
}

/// What the loop must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Reply to the question shown.
    Answer(Answer),
    /// Start a turn with this message.
    Send(String),
    /// Cancel the running turn.
    Interrupt,
    /// Continue the paused run with these decisions.
    Decide(Vec<Decision>),
    /// Start a new thread.
    NewThread,
    /// List the threads.
    ListThreads,
    /// Switch to this thread.
    Resume(String),
    /// Delete this thread.
    DeleteThread(String),
    /// Put this text on the clipboard (OSC 52).
    Copy(String),
    /// List the MCP servers and their tools.
    ListMcp,
    /// List the subagents.
    ListAgents,
    /// Show how full the context window is and with what.
    ShowContext,
    /// Attach the image on the clipboard (Ctrl-V).
    PasteImage,
    /// Add this line to the project's `AGENTS.md`.
    Remember(String),
    /// Give the thread this title.
    Rename(String),
    /// Use this model from the next turn on.
    SwitchModel(String),
    /// The approval mode or plan mode changed: remember it for the thread.
    ModeChanged,
    /// Plan mode ended with a plan: remember that and send this message.
    ApprovePlan(String),
    /// List the turns to rewind to (`None`), or rewind to before this one: its files, its
    /// conversation, or both.
    Rewind(Option<u64>, RewindWhat),
    /// Leave.
    Quit,
}

/// What `/rewind N` rewinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RewindWhat {
    /// The files and the conversation.
    Both,
    /// The files only (`/rewind N files`).
    Files,
    /// The conversation only (`/rewind N conversation`).
    Conversation,
}

/// The status bar's facts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Status {
    pub model: String,
    pub thread: String,
    pub sandbox: String,
    /// What this session spent.
    pub session: Spent,
    /// What the thread spent in all.
    pub thread_spent: Spent,
    /// The model's context window, when known.
    pub window: Option<u64>,
    /// Prompt tokens of the latest model call: how full the context is.
    pub context: u64,
}

/// The whole TUI state.
pub struct App {
    /// The id of the pause the approval shown answers: decisions are recorded for it only,
    /// so an approval left open while another process answered the pause cannot apply to
    /// the next one.
    pub pause: Option<String>,
    pub cells: Vec<Cell>,
    pub input: String,
    /// Where the cursor is in `input`, in bytes.
    pub cursor: usize,
    history: Vec<String>,
    history_at: Option<usize>,
    /// Messages typed while a turn runs, sent when it ends.
    pub queued: Vec<String>,
    /// A turn is running.
    pub busy: bool,
    pub approval: Option<Approval>,
    /// The question shown, when a turn waits on one.
    pub asked: Option<Asked>,
    /// The thread picker, when open.
    pub picker: Option<Picker>,
    pub mode: Mode,
    /// Plan mode (Shift-Tab, `/plan`): the agent reads and plans, changes nothing.
    pub plan: bool,
    pub status: Status,
    pub todos: Vec<Todo>,
    /// Lines scrolled up from the bottom of the conversation.
    pub scroll: usize,
    /// When Ctrl-C was pressed with nothing to interrupt: a second press soon after quits.
    /// When Esc was pressed on an empty input with no turn running: a second press soon
    /// after lists the turns to rewind to.
    rewind_armed: Option<Instant>,
    quit_armed: Option<Instant>,
    /// Spinner frame, advanced by ticks.
    pub tick: usize,
    /// Tool outputs shown whole (Ctrl-O) rather than their last lines.
    pub expanded: bool,
    /// Reasoning shown whole (Ctrl-R) rather than its first line.
    pub show_reasoning: bool,
    /// The session's root, for `@` path completion.
    pub root: Option<std::path::PathBuf>,
    /// Tools whose actions are approved for the rest of the session (`s` in the panel).
    pub allowed_tools: std::collections::BTreeSet<String>,
    /// `/compact`: the next turn summarizes first.
    pub compact_next: bool,
    /// The skills the agent has (listed in the thread's state once its first run loaded them).
    pub skills: Vec<deepagents::middleware::SkillInfo>,
    /// A turn was asked to compact and has not yet.
    compacting: bool,
    /// Images pasted into the input, sent with the message that still names them.
    pasted: Vec<Pasted>,
}

/// An image pasted into the input, named in it by its label (`[image 1]`).
#[derive(Clone, Debug, PartialEq)]
struct Pasted {
    label: String,
    mime: &'static str,
    bytes: Vec<u8>,
}

impl App {
    /// A fresh view for `status`.
    pub fn new(status: Status) -> Self {
        Self {
            pause: None,
            cells: Vec::new(),
            input: String::new(),
            cursor: 0,
            history: Vec::new(),
            history_at: None,
            queued: Vec::new(),
            busy: false,
            approval: None,
            asked: None,
            picker: None,
            mode: Mode::Auto,
            plan: false,
            status,
            todos: Vec::new(),
            scroll: 0,
            quit_armed: None,
            rewind_armed: None,
            tick: 0,
            expanded: false,
            show_reasoning: false,
            root: None,
            allowed_tools: std::collections::BTreeSet::new(),
            compact_next: false,
            compacting: false,
            skills: Vec::new(),
            pasted: Vec::new(),
        }
    }

    /// Shows a thread's earlier conversation.
    pub fn show_history(&mut self, messages: &[Message]) {
        for message in messages {
            match message {
                Message::User { .. } => self.cells.push(Cell::User(message.text())),
                Message::Assistant(assistant) => {
                    let text = message.text();
                    if !text.trim().is_empty() {
                        self.cells.push(Cell::Assistant { text, depth: 0 });
                    }
                    for call in &assistant.tool_calls {
                        self.cells.push(Cell::Tool {
                            call_id: call.id.clone(),
                            name: call.name.clone(),
                            arguments: short_arguments(&call.arguments),
                            depth: 0,
                            state: ToolState::Done {
                                ok: true,
                                duration_ms: 0,
                            },
                            output: String::new(),
                            diff: edit_diff(&call.name, &call.arguments),
                        });
                    }
                }
                Message::Tool(result) => {
                    let ok = result.status == ToolStatus::Ok;
                    let text = Message::Tool(result.clone()).text();
                    self.finish_tool(&result.tool_call_id, ok, 0, &text);
                }
                Message::System { .. } => {}
            }
        }
    }

    /// Folds one run event into the view.
    pub fn on_run_event(&mut self, event: &Event) {
        let depth = event.path.len();
        match &event.kind {
            EventKind::TextDelta { text } => match self.cells.last_mut() {
                Some(Cell::Assistant {
                    text: shown,
                    depth: d,
                }) if *d == depth => {
                    shown.push_str(text);
                }
                _ => self.cells.push(Cell::Assistant {
                    text: text.clone(),
                    depth,
                }),
            },
            EventKind::ToolCallStarted {
                call_id,
                name,
                arguments,
            } => self.cells.push(Cell::Tool {
                call_id: call_id.clone(),
                name: name.clone(),
                arguments: short_arguments(arguments),
                depth,
                state: ToolState::Running,
                output: String::new(),
                diff: edit_diff(name, arguments),
            }),
            EventKind::ReasoningDelta { text } => match self.cells.last_mut() {
                Some(Cell::Reasoning {
                    text: shown,
                    depth: d,
                }) if *d == depth => {
                    shown.push_str(text);
                }
                _ => self.cells.push(Cell::Reasoning {
                    text: text.clone(),
                    depth,
                }),
            },
            EventKind::ToolOutputDelta { call_id, text, .. } => {
                if let Some(Cell::Tool { output, .. }) = self.tool_cell(call_id) {
                    push_capped(output, text);
                }
            }
            EventKind::ToolProgress {
                call_id,
                progress,
                total,
                message,
            } => {
                if let Some(Cell::Tool { output, .. }) = self.tool_cell(call_id) {
                    output.clear();
                    output.push_str(&match total {
                        Some(total) => format!("{progress}/{total}"),
                        None => progress.to_string(),
                    });
                    if let Some(message) = message {
                        output.push(' ');
                        output.push_str(message);
                    }
                }
            }
            EventKind::ToolCallFinished {
                call_id,
                status,
                content,
                duration_ms,
                ..
            } => {
                let text: String = content.iter().filter_map(ContentBlock::as_text).collect();
                self.finish_tool(call_id, *status == ToolStatus::Ok, *duration_ms, &text);
            }
            EventKind::StateUpdated { todos, custom, .. } if depth == 0 => {
                if let Some(todos) = todos {
                    self.todos.clone_from(todos);
                }
                self.learn_skills(custom.get(deepagents::middleware::SKILLS_KEY));
            }
            EventKind::ModelCallFinished { usage, .. } if depth == 0 => {
                self.status.context = usage.input_tokens;
            }
            EventKind::Summarized { replaced, .. } => {
                self.compacting = false;
                self.cells.push(Cell::Notice(format!(
                    "summarized {replaced} earlier messages to make room"
                )));
            }
            EventKind::Sandbox { confinement } if depth == 0 => {
                self.status.sandbox = confinement.engine.clone();
            }
            EventKind::BackgroundTaskFinished {
                task_id,
                subagent,
                status,
                ..
            } => {
                self.cells.push(Cell::Notice(format!(
                    "background task {task_id} ({subagent}) ended: {status}; its answer went to the agent"
                )));
            }
            _ => {}
        }
    }

    /// Takes the skills from the state's listing, when it holds one.
    pub fn learn_skills(&mut self, listing: Option<&serde_json::Value>) {
        if let Some(skills) = listing.and_then(|v| serde_json::from_value(v.clone()).ok()) {
            self.skills = skills;
        }
    }

    fn tool_cell(&mut self, id: &str) -> Option<&mut Cell> {
        self.cells
            .iter_mut()
            .rev()
            .find(|cell| matches!(cell, Cell::Tool { call_id, .. } if call_id == id))
    }

    fn finish_tool(&mut self, id: &str, ok: bool, duration_ms: u64, text: &str) {
        if let Some(Cell::Tool { state, output, .. }) = self.tool_cell(id) {
            *state = ToolState::Done { ok, duration_ms };
            output.clear();
            push_capped(output, text);
        }
    }

    /// Whether the turn about to start compacts first (`/compact`).
    pub fn take_compact(&mut self) -> bool {
        self.compacting = self.compact_next;
        std::mem::take(&mut self.compact_next)
    }

    /// `/context`: the window gauge and what fills it.
    pub fn show_context(&mut self, parts: &ContextParts) {
        let status = &self.status;
        let known = parts.memory + parts.skills + parts.tools.0 + parts.messages.0;
        // The latest request is measured; its parts are estimated, the system prompt's
        // own text being what the estimate leaves.
        let total = status.context.max(known);
        let mut lines = vec![match status.window {
            Some(window) => {
                let filled = (total * 20 / window.max(1)).min(20) as usize;
                format!(
                    "context: {} of {} tokens ({}%)  {}{}",
                    thousands(total),
                    thousands(window),
                    total * 100 / window.max(1),
                    "█".repeat(filled),
                    "░".repeat(20 - filled)
                )
            }
            None => format!(
                "context: {} tokens (the model's window is not known)",
                thousands(total)
            ),
        }];
        let system = if status.context > 0 {
            format!("~{}", thousands(status.context.saturating_sub(known)))
        } else {
            "known after the first model call".to_owned()
        };
        for (what, tokens) in [
            ("system prompt".to_owned(), system),
            (
                "memory (AGENTS.md)".to_owned(),
                format!("~{}", thousands(parts.memory)),
            ),
            ("skills".to_owned(), format!("~{}", thousands(parts.skills))),
            (
                format!("tools ({})", parts.tools.1),
                format!("~{}", thousands(parts.tools.0)),
            ),
            (
                format!("messages ({})", parts.messages.1),
                format!("~{}", thousands(parts.messages.0)),
            ),
        ] {
            lines.push(format!("  {what:<20} {tokens}"));
        }
        lines.push(
            "parts estimated at 4 characters a token; older messages are summarized as the window fills (/compact now)"
                .to_owned(),
        );
        self.cells.push(Cell::Notice(lines.join("\n")));
    }

    /// The turn ended with an answer; what it and the session spent.
    pub fn finished(&mut self, spent: Spent, thread: Spent) -> Option<Action> {
        self.busy = false;
        if self.plan {
            self.cells.push(Cell::Notice(
                "Plan mode: /approve (or Shift-Tab) approves this plan and the work starts; or say what to change".to_owned(),
            ));
        }
        if std::mem::take(&mut self.compacting) {
            self.cells.push(Cell::Notice(
                "nothing was summarized: the conversation is still small for the window".to_owned(),
            ));
        }
        self.status.session.add(&spent);
        self.status.thread_spent = thread;
        self.next_queued()
    }

    /// The turn paused: the actions wait for decisions (at once, in `/yolo`).
    pub fn paused(&mut self, actions: Vec<PendingAction>) -> Option<Action> {
        if self.mode == Mode::Yolo {
            return Some(Action::Decide(
                actions
                    .iter()
                    .map(|action| {
                        if action.allowed.contains(&DecisionKind::Approve) {
                            Decision::Approve
                        } else {
                            Decision::Reject {
                                message: Some("It may not be approved.".to_owned()),
                            }
                        }
                    })
                    .collect(),
            ));
        }
        self.approval = Some(Approval {
            actions,
            decisions: Vec::new(),
            typing: None,
        });
        self.approve_allowed()
    }

    /// Approves the actions next in line whose tool was allowed for the session; the
    /// decisions when that settles them all.
    fn approve_allowed(&mut self) -> Option<Action> {
        let approval = self.approval.as_mut()?;
        while let Some(action) = approval.actions.get(approval.decisions.len()) {
            if !(self.allowed_tools.contains(&action.name)
                && action.allowed.contains(&DecisionKind::Approve))
            {
                return None;
            }
            approval.decisions.push(Decision::Approve);
        }
        let decisions = std::mem::take(&mut approval.decisions);
        self.approval = None;
        Some(Action::Decide(decisions))
    }

    /// The turn failed (or was interrupted).
    pub fn failed(&mut self, message: String, spent: Spent) -> Option<Action> {
        self.busy = false;
        self.status.session.add(&spent);
        self.cells.push(Cell::Error(message));
        self.next_queued()
    }

    fn next_queued(&mut self) -> Option<Action> {
        if self.queued.is_empty() {
            return None;
        }
        let next = self.queued.remove(0);
        self.start_turn(&next);
        Some(Action::Send(next))
    }

    fn start_turn(&mut self, text: &str) {
        self.cells.push(Cell::User(text.to_owned()));
        self.busy = true;
        self.scroll = 0;
    }

    /// Pasted text goes into the input as it is (newlines included); the path of an image
    /// file (what dropping a file on a terminal pastes) attaches the image instead.
    pub fn on_paste(&mut self, text: &str) {
        if let Some((path, mime)) = pasted_image_path(text) {
            match std::fs::metadata(&path) {
                Ok(meta) if meta.len() > MAX_ATTACHMENT => self.cells.push(Cell::Error(format!(
                    "{}: larger than 5 MiB, not attached",
                    path.display()
                ))),
                _ => match std::fs::read(&path) {
                    Ok(bytes) => {
                        let name = path.file_name().map_or_else(
                            || path.display().to_string(),
                            |name| name.to_string_lossy().into_owned(),
                        );
                        self.attach(&name, mime, bytes);
                    }
                    Err(e) => self
                        .cells
                        .push(Cell::Error(format!("{}: {e}", path.display()))),
                },
            }
            return;
        }
        let text = text.replace("\r\n", "\n").replace('\r', "\n");
        self.input.insert_str(self.cursor, &text);
        self.cursor += text.len();
    }

    /// Attaches an image to the message being written, named in it as `[image N]`.
    pub fn attach(&mut self, name: &str, mime: &'static str, bytes: Vec<u8>) {
        if bytes.len() as u64 > MAX_ATTACHMENT {
            self.cells.push(Cell::Error(format!(
                "{name}: larger than 5 MiB, not attached"
            )));
            return;
        }
        let label = format!("[image {}]", self.pasted.len() + 1);
        self.cells.push(Cell::Notice(format!(
            "attached {name} ({} KB) as {label}",
            (bytes.len() as u64).div_ceil(1024)
        )));
        let mut typed = label.clone();
        if self.input[..self.cursor]
            .chars()
            .last()
            .is_some_and(|c| !c.is_whitespace())
        {
            typed.insert(0, ' ');
        }
        typed.push(' ');
        self.input.insert_str(self.cursor, &typed);
        self.cursor += typed.len();
        self.pasted.push(Pasted { label, mime, bytes });
    }

    /// The pasted images `text` still names, as content to send with it.
    pub fn take_pasted(&mut self, text: &str) -> Vec<ContentBlock> {
        let (named, rest) = std::mem::take(&mut self.pasted)
            .into_iter()
            .partition::<Vec<_>, _>(|image| text.contains(&image.label));
        // Images of a message still being written (or queued) stay for it.
        self.pasted = rest;
        named
            .into_iter()
            .map(|image| ContentBlock::data(image.mime, image.bytes))
            .collect()
    }

    /// A spinner step.
    /// Shift-Tab, `/plan`, `/approve`: plan mode on, or off — and leaving it after a plan was
    /// made approves the plan, so the agent starts on it.
    fn toggle_plan(&mut self) -> Option<Action> {
        if !self.plan {
            self.plan = true;
            self.cells.push(Cell::Notice(
                "plan mode: the agent reads and plans, changes nothing until you approve (Shift-Tab or /approve)".to_owned(),
            ));
            return Some(Action::ModeChanged);
        }
        self.plan = false;
        let planned = self
            .cells
            .iter()
            .rev()
            .take_while(
                |cell| !matches!(cell, Cell::Notice(text) if text.starts_with("plan mode:")),
            )
            .any(|cell| matches!(cell, Cell::Assistant { depth: 0, .. }));
        self.cells.push(Cell::Notice(format!(
            "plan mode off: {} mode again",
            self.mode.name()
        )));
        if planned && !self.busy {
            let text = "The plan is approved: carry it out.".to_owned();
            self.start_turn(&text);
            return Some(Action::ApprovePlan(text));
        }
        Some(Action::ModeChanged)
    }

    /// A tick of the clock; returns whether the screen changed (a spinner turns while a turn
    /// runs, the quit hint expires), so an idle session draws nothing.
    pub fn on_tick(&mut self) -> bool {
        self.tick = self.tick.wrapping_add(1);
        let mut changed = self.busy;
        if self
            .quit_armed
            .is_some_and(|at| at.elapsed() > Duration::from_secs(2))
        {
            self.quit_armed = None;
            changed = true;
        }
        changed
    }

    /// Whether a second Ctrl-C would quit now.
    pub fn quit_armed(&self) -> bool {
        self.quit_armed.is_some()
    }

    /// A key press.
    pub fn on_key(&mut self, key: KeyEvent) -> Option<Action> {
        if key.kind == KeyEventKind::Release {
            return None;
        }
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && key.code == KeyCode::Char('c') {
            if self.busy {
                self.cells.push(Cell::Notice(
                    "interrupting (Ctrl-C again to quit)".to_owned(),
                ));
                self.quit_armed = Some(Instant::now());
                return Some(Action::Interrupt);
            }
            if self.quit_armed.is_some() {
                return Some(Action::Quit);
            }
            self.quit_armed = Some(Instant::now());
            return None;
        }
        if ctrl && key.code == KeyCode::Char('d') && self.input.is_empty() {
            return Some(Action::Quit);
        }
        if self.asked.is_some() {
            return self.on_question_key(key);
        }
        if self.picker.is_some() {
            return self.on_picker_key(key);
        }
        if self.approval.is_some() {
            return self.on_approval_key(key);
        }
        match key.code {
            KeyCode::Esc if self.busy => {
                self.cells.push(Cell::Notice("interrupted".to_owned()));
                Some(Action::Interrupt)
            }
            // Esc Esc on an empty input: the turns to rewind to, as `/rewind` lists them.
            KeyCode::Esc if self.input.is_empty() => {
                if self
                    .rewind_armed
                    .take()
                    .is_some_and(|at| at.elapsed() < Duration::from_secs(1))
                {
                    return Some(Action::Rewind(None, RewindWhat::Both));
                }
                self.rewind_armed = Some(Instant::now());
                None
            }
            KeyCode::Enter
                if key
                    .modifiers
                    .intersects(KeyModifiers::SHIFT | KeyModifiers::ALT) =>
            {
                self.on_paste("\n");
                None
            }
            KeyCode::Char('j') if ctrl => {
                self.on_paste("\n");
                None
            }
            KeyCode::Char('o') if ctrl => {
                self.expanded = !self.expanded;
                None
            }
            KeyCode::Char('v') if ctrl => Some(Action::PasteImage),
            KeyCode::Char('r') if ctrl => {
                self.show_reasoning = !self.show_reasoning;
                None
            }
            KeyCode::Tab => {
                self.complete();
                None
            }
            KeyCode::BackTab => self.toggle_plan(),
            KeyCode::Enter => self.submit(),
            KeyCode::Char(c) => {
                self.input.insert(self.cursor, c);
                self.cursor += c.len_utf8();
                None
            }
            KeyCode::Backspace => {
                if let Some((at, _)) = self.input[..self.cursor].char_indices().next_back() {
                    self.input.remove(at);
                    self.cursor = at;
                }
                None
            }
            KeyCode::Left => {
                if let Some((at, _)) = self.input[..self.cursor].char_indices().next_back() {
                    self.cursor = at;
                }
                None
            }
            KeyCode::Right => {
                if let Some(c) = self.input[self.cursor..].chars().next() {
                    self.cursor += c.len_utf8();
                }
                None
            }
            KeyCode::Home => {
                self.cursor = 0;
                None
            }
            KeyCode::End => {
                self.cursor = self.input.len();
                None
            }
            KeyCode::Up if !self.input.contains('\n') => {
                self.recall(true);
                None
            }
            KeyCode::Down if !self.input.contains('\n') => {
                self.recall(false);
                None
            }
            KeyCode::PageUp => {
                self.scroll += 10;
                None
            }
            KeyCode::PageDown => {
                self.scroll = self.scroll.saturating_sub(10);
                None
            }
            _ => None,
        }
    }

    /// Tab: a `/command` is completed to the best match; an `@path` to the longest name
    /// the root's entries share (several are listed).
    fn complete(&mut self) {
        if let Some(typed) = self.input.strip_prefix('/')
            && !typed.contains(' ')
        {
            if let Some((name, _)) = matching_commands(typed).first() {
                self.input = format!("/{name} ");
                self.cursor = self.input.len();
            }
            return;
        }
        let before = &self.input[..self.cursor];
        let start = before.rfind(char::is_whitespace).map_or(0, |i| i + 1);
        let Some(partial) = before[start..].strip_prefix('@') else {
            return;
        };
        let Some(root) = &self.root else {
            return;
        };
        let (dir, prefix) = match partial.rfind('/') {
            Some(at) => (&partial[..=at], &partial[at + 1..]),
            None => ("", partial),
        };
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            return;
        };
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let name = entry.file_name().into_string().ok()?;
                let slash = if entry.path().is_dir() { "/" } else { "" };
                (name.starts_with(prefix) && !name.starts_with('.'))
                    .then(|| format!("{name}{slash}"))
            })
            .collect();
        names.sort();
        let Some(first) = names.first() else {
            return;
        };
        // The longest start every candidate shares.
        let mut common = first.clone();
        for name in &names[1..] {
            while !name.starts_with(&common) {
                common.pop();
            }
        }
        if names.len() > 1 {
            self.cells.push(Cell::Notice(names.join("  ")));
        }
        let replacement = format!("@{dir}{common}");
        self.input.replace_range(start..self.cursor, &replacement);
        self.cursor = start + replacement.len();
    }

    fn recall(&mut self, older: bool) {
        if self.history.is_empty() {
            return;
        }
        let at = match (self.history_at, older) {
            (None, true) => self.history.len() - 1,
            (None, false) => return,
            (Some(at), true) => at.saturating_sub(1),
            (Some(at), false) if at + 1 >= self.history.len() => {
                self.history_at = None;
                self.input.clear();
                self.cursor = 0;
                return;
            }
            (Some(at), false) => at + 1,
        };
        self.history_at = Some(at);
        self.input.clone_from(&self.history[at]);
        self.cursor = self.input.len();
    }

    fn submit(&mut self) -> Option<Action> {
        let text = self.input.trim().to_owned();
        self.input.clear();
        self.cursor = 0;
        self.history_at = None;
        if text.is_empty() {
            return None;
        }
        self.history.push(text.clone());
        if let Some(command) = text.strip_prefix('/') {
            return self.command(command);
        }
        if self.busy {
            self.queued.push(text);
            return None;
        }
        self.start_turn(&text);
        Some(Action::Send(text))
    }

    /// A slash command.
    fn command(&mut self, line: &str) -> Option<Action> {
        let (name, rest) = line.split_once(' ').unwrap_or((line, ""));
        let rest = rest.trim();
        let say = |app: &mut Self, text: String| {
            app.cells.push(Cell::Notice(text));
            None
        };
        match name {
            "help" | "?" => say(self, HELP.to_owned()),
            "quit" | "exit" | "q" => Some(Action::Quit),
            "clear" => {
                self.cells.clear();
                self.scroll = 0;
                None
            }
            "new" if self.busy => say(self, "wait for the turn to end (or Esc)".to_owned()),
            "new" => Some(Action::NewThread),
            "threads" => Some(Action::ListThreads),
            "rewind" if self.busy => say(self, "wait for the turn to end (or Esc)".to_owned()),
            "rewind" => {
                let mut words = rest.split_whitespace();
                let turn = words.next().map(str::parse::<u64>);
                let what = match words.next() {
                    None => Some(RewindWhat::Both),
                    Some("files") => Some(RewindWhat::Files),
                    Some("conversation") => Some(RewindWhat::Conversation),
                    Some(_) => None,
                };
                match (turn, what) {
                    (None, _) => Some(Action::Rewind(None, RewindWhat::Both)),
                    (Some(Ok(turn)), Some(what)) => Some(Action::Rewind(Some(turn), what)),
                    _ => say(
                        self,
                        "usage: /rewind [TURN [files|conversation]]".to_owned(),
                    ),
                }
            }
            "resume" if rest.is_empty() => say(self, "usage: /resume THREAD_ID".to_owned()),
            "resume" if self.busy => say(self, "wait for the turn to end (or Esc)".to_owned()),
            "resume" => Some(Action::Resume(rest.to_owned())),
            "cost" | "tokens" => {
                let line = spending(&self.status.session, &self.status.thread_spent);
                say(self, line)
            }
            "compact" => {
                self.compact_next = true;
                say(
                    self,
                    "older messages will be summarized before your next message is answered"
                        .to_owned(),
                )
            }
            "context" => Some(Action::ShowContext),
            "todos" if self.todos.is_empty() => say(self, "no plan yet".to_owned()),
            "todos" => {
                let list = self
                    .todos
                    .iter()
                    .map(|t| format!("{} {}", mark(t), t.content))
                    .collect::<Vec<_>>()
                    .join("\n");
                say(self, list)
            }
            "copy" => match self.cells.iter().rev().find_map(|cell| match cell {
                Cell::Assistant { text, depth: 0 } => Some(text.clone()),
                _ => None,
            }) {
                Some(text) => {
                    self.cells.push(Cell::Notice(
                        "copied the last answer to the clipboard".to_owned(),
                    ));
                    Some(Action::Copy(text))
                }
                None => say(self, "no answer to copy yet".to_owned()),
            },
            "mcp" => Some(Action::ListMcp),
            "agents" => Some(Action::ListAgents),
            "remember" if rest.is_empty() => say(self, "usage: /remember TEXT".to_owned()),
            "remember" => Some(Action::Remember(rest.to_owned())),
            "plan" if rest == "off" => {
                if self.plan {
                    self.toggle_plan()
                } else {
                    say(self, "plan mode is off".to_owned())
                }
            }
            "plan" if self.plan => say(
                self,
                "plan mode is on: /approve approves the plan, /plan off leaves without approving"
                    .to_owned(),
            ),
            "plan" => self.toggle_plan(),
            "approve" if !self.plan => say(self, "no plan to approve: /plan first".to_owned()),
            "approve" if self.busy => say(self, "wait for the plan (or Esc)".to_owned()),
            "approve" => self.toggle_plan(),
            "yolo" => {
                self.mode = Mode::Yolo;
                self.cells.push(Cell::Notice(
                    "YOLO: every action is approved without asking (kept for this thread)"
                        .to_owned(),
                ));
                Some(Action::ModeChanged)
            }
            "manual" => {
                self.mode = Mode::Manual;
                self.cells.push(Cell::Notice(
                    "every file change and command asks first (kept for this thread)".to_owned(),
                ));
                Some(Action::ModeChanged)
            }
            "auto" => {
                self.mode = Mode::Auto;
                self.cells.push(Cell::Notice(
                    "what the sandbox contains runs; what leaves it asks (kept for this thread)"
                        .to_owned(),
                ));
                Some(Action::ModeChanged)
            }
            "model" if rest.is_empty() => {
                let text = format!(
                    "the model is {}; /model SPEC switches (e.g. anthropic:claude-sonnet-4-5)",
                    self.status.model
                );
                say(self, text)
            }
            "model" if self.busy => say(self, "wait for the turn to end (or Esc)".to_owned()),
            "model" => Some(Action::SwitchModel(rest.to_owned())),
            "rename" if rest.is_empty() => say(self, "usage: /rename TITLE".to_owned()),
            "rename" => Some(Action::Rename(rest.to_owned())),
            "skills" if self.skills.is_empty() => say(
                self,
                "no skills listed yet (they are loaded with the thread's first message)".to_owned(),
            ),
            "skills" => {
                let list = self
                    .skills
                    .iter()
                    .map(|skill| format!("/{}: {}", skill.name, skill.description))
                    .collect::<Vec<_>>()
                    .join("\n");
                say(self, list)
            }
            other => match self.skills.iter().find(|skill| skill.name == other) {
                // A skill as a command: the message asks for it by name.
                Some(skill) if !self.busy => {
                    let text = format!(
                        "Use the `{}` skill (read {} first).{}",
                        skill.name,
                        skill.path,
                        if rest.is_empty() {
                            String::new()
                        } else {
                            format!(" {rest}")
                        }
                    );
                    self.start_turn(&text);
                    Some(Action::Send(text))
                }
                Some(_) => say(self, "wait for the turn to end (or Esc)".to_owned()),
                None => say(
                    self,
                    format!("unknown command /{other}; /help lists the commands"),
                ),
            },
        }
    }

    /// Opens the thread picker on `threads` (id, line), newest first.
    pub fn pick_thread(&mut self, threads: Vec<(String, String)>) {
        if threads.is_empty() {
            self.cells.push(Cell::Notice("no threads yet".to_owned()));
            return;
        }
        self.picker = Some(Picker {
            threads,
            selected: 0,
        });
    }

    fn on_picker_key(&mut self, key: KeyEvent) -> Option<Action> {
        let picker = self.picker.as_mut()?;
        match key.code {
            KeyCode::Up => picker.selected = picker.selected.saturating_sub(1),
            KeyCode::Down => {
                picker.selected = (picker.selected + 1).min(picker.threads.len() - 1);
            }
            KeyCode::Enter if !self.busy => {
                let (id, _) = picker.threads[picker.selected].clone();
                self.picker = None;
                return Some(Action::Resume(id));
            }
            KeyCode::Char('d') | KeyCode::Delete => {
                let (id, _) = picker.threads.remove(picker.selected);
                picker.selected = picker.selected.min(picker.threads.len().saturating_sub(1));
                if picker.threads.is_empty() {
                    self.picker = None;
                }
                return Some(Action::DeleteThread(id));
            }
            KeyCode::Esc | KeyCode::Char('q') => self.picker = None,
            _ => {}
        }
        None
    }

    /// Shows a question from the run.
    pub fn ask(&mut self, question: &super::ask::Question) {
        self.asked = Some(match question {
            super::ask::Question::Approve { call, reason, .. } => Asked::Approve {
                call: format!("{} {}", call.name, short_arguments(&call.arguments)),
                reason: reason.clone(),
            },
            super::ask::Question::Elicit { request, .. } => match &request.kind {
                deepagents_mcp::Elicitation::Form { schema } => Asked::Form {
                    server: request.server.clone(),
                    message: request.message.clone(),
                    fields: deepagents_mcp::elicitation::form_fields(schema),
                    at: 0,
                    values: serde_json::Map::new(),
                    typed: String::new(),
                    problem: None,
                },
                deepagents_mcp::Elicitation::Url { url } => Asked::Url {
                    server: request.server.clone(),
                    message: request.message.clone(),
                    url: url.clone(),
                },
            },
        });
    }

    fn answered(&mut self, answer: Answer) -> Option<Action> {
        self.asked = None;
        Some(Action::Answer(answer))
    }

    fn on_question_key(&mut self, key: KeyEvent) -> Option<Action> {
        use deepagents_mcp::ElicitationAnswer;
        let asked = self.asked.as_mut()?;
        match asked {
            Asked::Approve { .. } => match key.code {
                KeyCode::Char('y') => self.answered(Answer::Approved(true)),
                KeyCode::Char('n') | KeyCode::Esc | KeyCode::Enter => {
                    self.answered(Answer::Approved(false))
                }
                _ => None,
            },
            Asked::Url { .. } => match key.code {
                KeyCode::Char('y') | KeyCode::Enter => {
                    self.answered(Answer::Elicited(ElicitationAnswer::Accept(None)))
                }
                KeyCode::Char('n') => self.answered(Answer::Elicited(ElicitationAnswer::Decline)),
                KeyCode::Esc => self.answered(Answer::Elicited(ElicitationAnswer::Cancel)),
                _ => None,
            },
            Asked::Form {
                fields,
                at,
                values,
                typed,
                problem,
                ..
            } => match key.code {
                KeyCode::Esc => self.answered(Answer::Elicited(ElicitationAnswer::Decline)),
                KeyCode::Backspace => {
                    typed.pop();
                    None
                }
                KeyCode::Char(c) => {
                    typed.push(c);
                    None
                }
                KeyCode::Enter => {
                    let (name, field, required) = fields.get(*at)?;
                    if typed.trim().is_empty() && !required {
                        *at += 1;
                    } else {
                        match deepagents_mcp::elicitation::parse_field(field, typed) {
                            Ok(value) => {
                                values.insert(name.clone(), value);
                                *at += 1;
                                *problem = None;
                            }
                            Err(why) => *problem = Some(why),
                        }
                    }
                    typed.clear();
                    if *at >= fields.len() {
                        let values = std::mem::take(values);
                        return self.answered(Answer::Elicited(ElicitationAnswer::Accept(Some(
                            serde_json::Value::Object(values),
                        ))));
                    }
                    None
                }
                _ => None,
            },
        }
    }

    fn on_approval_key(&mut self, key: KeyEvent) -> Option<Action> {
        let approval = self.approval.as_mut()?;
        if let Some((what, text)) = approval.typing.as_mut() {
            match key.code {
                KeyCode::Enter => {
                    let (what, text) = (*what, std::mem::take(text));
                    let decision = match what {
                        Typing::Reason => Decision::Reject {
                            message: (!text.trim().is_empty()).then_some(text),
                        },
                        Typing::Response => Decision::Respond { message: text },
                        Typing::Arguments => match serde_json::from_str::<serde_json::Value>(&text)
                        {
                            Ok(arguments @ serde_json::Value::Object(_)) => {
                                Decision::Edit { arguments }
                            }
                            _ => {
                                // Keep what was typed to fix it.
                                approval.typing = Some((what, text));
                                self.cells.push(Cell::Error(
                                    "the arguments must be one JSON object".to_owned(),
                                ));
                                return None;
                            }
                        },
                    };
                    approval.typing = None;
                    return self.decide(decision);
                }
                KeyCode::Esc => approval.typing = None,
                KeyCode::Backspace => {
                    text.pop();
                }
                KeyCode::Char(c) => text.push(c),
                _ => {}
            }
            return None;
        }
        let action = approval.actions.get(approval.decisions.len())?;
        let allows = |kind| action.allowed.contains(&kind);
        match key.code {
            KeyCode::Char('y' | 'a') | KeyCode::Enter if allows(DecisionKind::Approve) => {
                self.decide(Decision::Approve)
            }
            KeyCode::Char('A') if allows(DecisionKind::Approve) => {
                // Approve this and the rest of the session's actions.
                self.mode = Mode::Yolo;
                self.cells.push(Cell::Notice(
                    "approving everything for the rest of the session (/auto to undo)".to_owned(),
                ));
                let remaining = approval.actions.len() - approval.decisions.len();
                let mut last = None;
                for _ in 0..remaining {
                    last = self.decide(Decision::Approve);
                }
                last
            }
            KeyCode::Char('s') if allows(DecisionKind::Approve) => {
                let tool = action.name.clone();
                self.cells.push(Cell::Notice(format!(
                    "{tool} is approved for the rest of the session"
                )));
                self.allowed_tools.insert(tool);
                self.decide(Decision::Approve)
            }
            KeyCode::Char('n' | 'r') if allows(DecisionKind::Reject) => {
                approval.typing = Some((Typing::Reason, String::new()));
                None
            }
            KeyCode::Char('e') if allows(DecisionKind::Edit) => {
                let arguments = action.arguments.to_string();
                approval.typing = Some((Typing::Arguments, arguments));
                None
            }
            // Enter answers a question, which cannot be approved.
            KeyCode::Char('m') if allows(DecisionKind::Respond) => {
                approval.typing = Some((Typing::Response, String::new()));
                None
            }
            KeyCode::Enter if allows(DecisionKind::Respond) => {
                approval.typing = Some((Typing::Response, String::new()));
                None
            }
            KeyCode::Esc if allows(DecisionKind::Reject) => {
                self.decide(Decision::Reject { message: None })
            }
            _ => None,
        }
    }

    fn decide(&mut self, decision: Decision) -> Option<Action> {
        let approval = self.approval.as_mut()?;
        let action = approval.actions.get(approval.decisions.len()).cloned();
        approval.decisions.push(decision.clone());
        // A call that will not run shows how it was settled now: the run that follows
        // reports only the calls it runs.
        if let Some(action) = action {
            let settled = match &decision {
                Decision::Reject { message } => Some((
                    false,
                    match message {
                        Some(reason) => format!("rejected: {reason}"),
                        None => "rejected".to_owned(),
                    },
                )),
                Decision::Respond { message } => Some((true, format!("answered: {message}"))),
                _ => None,
            };
            if let Some((ok, text)) = settled {
                // A question a tool asked belongs to the call that asked it.
                let call_id = action.tool_call_id().to_owned();
                if self.tool_cell(&call_id).is_none() {
                    self.cells.push(Cell::Tool {
                        call_id: call_id.clone(),
                        name: action.name.clone(),
                        arguments: short_arguments(&action.arguments),
                        depth: action.agents().len(),
                        state: ToolState::Running,
                        output: String::new(),
                        diff: None,
                    });
                }
                self.finish_tool(&call_id, ok, 0, &text);
            }
        }
        self.approve_allowed()
    }
}

const HELP: &str = "Enter sends · Shift/Alt-Enter or Ctrl-J: new line · Up/Down: earlier messages · PgUp/PgDn: scroll
Tab completes a /command or an @path · Ctrl-V: the clipboard's image · Ctrl-O: whole tool outputs · Ctrl-R: whole reasoning
Esc interrupts the turn (Esc Esc on an empty line: the turns to /rewind to) · Ctrl-C interrupts, twice quits · Ctrl-D on an empty line quits
Approvals: y approve · s this tool for the session · n reject (a reason, Enter) · e edit the arguments · m answer instead · A everything
Modes: /auto runs what the sandbox contains · /manual asks before every change · /yolo approves everything
Shift-Tab or /plan: plan mode (reads, changes nothing) · /approve: approve the plan and start";

/// The slash commands, with what they do (the palette shows them).
pub const COMMANDS: &[(&str, &str)] = &[
    ("help", "keys and commands"),
    ("new", "start a new thread"),
    ("threads", "pick a thread: Enter opens, d deletes"),
    ("resume", "ID: open a thread"),
    ("clear", "clear the view"),
    ("cost", "what the session and the thread spent"),
    ("tokens", "the same, in tokens"),
    ("context", "how full the context window is, and with what"),
    ("compact", "summarize older messages before the next turn"),
    ("rewind", "[N]: list the turns, or go back to before turn N"),
    ("model", "SPEC: use another model from the next turn"),
    ("todos", "the plan"),
    ("rename", "TITLE: name this thread"),
    ("mcp", "MCP servers and their tools"),
    ("agents", "the subagents the agent can hand work to"),
    ("skills", "the skills; /NAME uses one"),
    ("remember", "TEXT: add a line to the project's AGENTS.md"),
    ("copy", "the last answer to the clipboard"),
    ("auto", "run what the sandbox contains, ask for the rest"),
    ("manual", "ask before every file change and command"),
    ("yolo", "approve every action"),
    (
        "plan",
        "plan mode: read and plan, change nothing (off: leave)",
    ),
    ("approve", "approve the plan and start on it"),
    ("quit", "leave"),
];

/// The commands matching `typed` (the text after `/`): those it is a prefix of first, then
/// those containing its letters in order.
pub fn matching_commands(typed: &str) -> Vec<(&'static str, &'static str)> {
    let typed = typed
        .split(' ')
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let subsequence = |name: &str| {
        let mut letters = name.chars();
        typed.chars().all(|c| letters.any(|n| n == c))
    };
    let mut found: Vec<(&str, &str)> = COMMANDS
        .iter()
        .filter(|(name, _)| name.starts_with(&typed))
        .copied()
        .collect();
    found.extend(
        COMMANDS
            .iter()
            .filter(|(name, _)| !name.starts_with(&typed) && subsequence(name))
            .copied(),
    );
    found
}

/// The mark of a plan item.
pub fn mark(todo: &Todo) -> &'static str {
    crate::progress::todo_mark(todo.status)
}

/// `$0.0123 · 1234 tokens (1100 in, 800 cached, 134 out)` for the session and the thread.
pub fn spending(session: &Spent, thread: &Spent) -> String {
    let one = crate::progress::spent_summary;
    format!("session: {}\nthread:  {}", one(session), one(thread))
}

/// A call's arguments in one short line: its key argument when it has one (a command, a
/// path, a pattern, a subagent's task), else the values of its object, strings bare.
pub fn short_arguments(arguments: &serde_json::Value) -> String {
    let key = [
        "command",
        "file_path",
        "path",
        "pattern",
        "description",
        "query",
    ]
    .iter()
    .find_map(|key| arguments.get(key).and_then(serde_json::Value::as_str));
    let text = match (key, arguments) {
        (Some(key), _) => key.to_owned(),
        (None, serde_json::Value::Object(map)) => map
            .values()
            .map(|v| match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" "),
        (None, other) => other.to_string(),
    };
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line,
    }
}

/// The image file a paste names, alone: a path as terminals paste a dropped file (quoted,
/// with `\ ` escapes, or a `file://` URL), with the image's type.
fn pasted_image_path(text: &str) -> Option<(std::path::PathBuf, &'static str)> {
    let text = text.trim();
    let text = text
        .strip_prefix('\'')
        .and_then(|t| t.strip_suffix('\''))
        .or_else(|| text.strip_prefix('"').and_then(|t| t.strip_suffix('"')))
        .unwrap_or(text);
    let text = text.strip_prefix("file://").unwrap_or(text);
    if text.contains('\n') {
        return None;
    }
    let path = std::path::PathBuf::from(text.replace("\\ ", " "));
    let mime = image_type(&path.to_string_lossy())?;
    path.is_file().then_some((path, mime))
}

/// The type of an image file named `path`, by its extension.
fn image_type(path: &str) -> Option<&'static str> {
    match path.to_ascii_lowercase().rsplit('.').next()? {
        "png" => Some("image/png"),
        "jpg" | "jpeg" => Some("image/jpeg"),
        "gif" => Some("image/gif"),
        "webp" => Some("image/webp"),
        _ => None,
    }
}

/// The largest image a message attaches.
const MAX_ATTACHMENT: u64 = 5 * 1024 * 1024;

/// A message as content: its text, then each image it names as `@path` in the root
/// (png, jpeg, gif, webp, up to 5 MiB), attached so the model sees it; what was attached or
/// refused, for the view.
pub fn message_content(
    text: &str,
    root: Option<&std::path::Path>,
) -> (Vec<ContentBlock>, Vec<String>) {
    let mut content = vec![ContentBlock::text(text)];
    let mut notes = Vec::new();
    let Some(root) = root.and_then(|r| r.canonicalize().ok()) else {
        return (content, notes);
    };
    for word in text.split_whitespace() {
        let Some(path) = word.strip_prefix('@') else {
            continue;
        };
        let path = path.trim_end_matches([',', '.', ';', ':', ')', '?', '!']);
        let Some(mime) = image_type(path) else {
            continue;
        };
        let Ok(full) = root.join(path.trim_start_matches('/')).canonicalize() else {
            notes.push(format!("{path}: no such file"));
            continue;
        };
        if !full.starts_with(&root) {
            notes.push(format!("{path}: outside the project, not attached"));
            continue;
        }
        match std::fs::metadata(&full) {
            Ok(meta) if meta.len() > MAX_ATTACHMENT => {
                notes.push(format!("{path}: larger than 5 MiB, not attached"));
            }
            Ok(meta) => match std::fs::read(&full) {
                Ok(bytes) => {
                    notes.push(format!(
                        "attached {path} ({} KB)",
                        meta.len().div_ceil(1024)
                    ));
                    content.push(ContentBlock::data(mime, bytes));
                }
                Err(e) => notes.push(format!("{path}: {e}")),
            },
            Err(e) => notes.push(format!("{path}: {e}")),
        }
    }
    (content, notes)
}

/// The old and new text of an `edit_file` call, for a diff.
fn edit_diff(tool: &str, arguments: &serde_json::Value) -> Option<(String, String)> {
    if tool != "edit_file" {
        return None;
    }
    let text = |key: &str| arguments.get(key).and_then(serde_json::Value::as_str);
    Some((
        text("old_string")?.to_owned(),
        text("new_string")?.to_owned(),
    ))
}

fn push_capped(output: &mut String, text: &str) {
    if output.len() >= OUTPUT_PREVIEW {
        return;
    }
    let room = OUTPUT_PREVIEW - output.len();
    match text.char_indices().nth(room) {
        Some((at, _)) => {
            output.push_str(&text[..at]);
            output.push('…');
        }
        None => output.push_str(text),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use deepagents::core::event::PathSegment;

    fn event(path: usize, kind: EventKind) -> Event {
        Event {
            run_id: "r".into(),
            seq: 0,
            time: String::new(),
            path: (0..path)
                .map(|i| PathSegment {
                    call_id: format!("t{i}"),
                    name: "sub".into(),
                })
                .collect(),
            kind,
        }
    }

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    fn type_text(app: &mut App, text: &str) {
        for c in text.chars() {
            app.on_key(key(KeyCode::Char(c)));
        }
    }

    #[test]
    fn esc_twice_on_an_empty_input_lists_the_turns_to_rewind_to() {
        let mut app = App::new(Status::default());
        assert_eq!(app.on_key(key(KeyCode::Esc)), None);
        assert_eq!(
            app.on_key(key(KeyCode::Esc)),
            Some(Action::Rewind(None, RewindWhat::Both))
        );
        // Not while typing, and a single press does nothing.
        type_text(&mut app, "draft");
        assert_eq!(app.on_key(key(KeyCode::Esc)), None);
        assert_eq!(app.on_key(key(KeyCode::Esc)), None);
    }

    #[test]
    fn typing_sends_and_a_busy_turn_queues() {
        let mut app = App::new(Status::default());
        type_text(&mut app, "hello");
        assert_eq!(
            app.on_key(key(KeyCode::Enter)),
            Some(Action::Send("hello".into()))
        );
        assert!(app.busy);
        type_text(&mut app, "next");
        assert_eq!(app.on_key(key(KeyCode::Enter)), None);
        assert_eq!(app.queued, ["next"]);
        // The queued message goes when the turn ends.
        assert_eq!(
            app.finished(Spent::default(), Spent::default()),
            Some(Action::Send("next".into()))
        );
        assert!(app.queued.is_empty());
        // Esc interrupts; history recalls.
        assert_eq!(app.on_key(key(KeyCode::Esc)), Some(Action::Interrupt));
        app.failed("the run was cancelled".into(), Spent::default());
        app.on_key(key(KeyCode::Up));
        assert_eq!(app.input, "next");
        app.on_key(key(KeyCode::Up));
        assert_eq!(app.input, "hello");
    }

    #[test]
    fn run_events_become_cells() {
        let mut app = App::new(Status::default());
        app.on_run_event(&event(
            0,
            EventKind::TextDelta {
                text: "Let me ".into(),
            },
        ));
        app.on_run_event(&event(
            0,
            EventKind::TextDelta {
                text: "look.".into(),
            },
        ));
        app.on_run_event(&event(
            0,
            EventKind::ToolCallStarted {
                call_id: "c".into(),
                name: "execute".into(),
                arguments: serde_json::json!({"command": "ls -la"}),
            },
        ));
        app.on_run_event(&event(
            0,
            EventKind::ToolOutputDelta {
                call_id: "c".into(),
                stream: deepagents::core::event::OutputStream::Stdout,
                text: "a.txt\n".into(),
            },
        ));
        assert_eq!(
            app.cells[0],
            Cell::Assistant {
                text: "Let me look.".into(),
                depth: 0
            }
        );
        assert!(
            matches!(&app.cells[1], Cell::Tool { state: ToolState::Running, output, arguments, .. } if output == "a.txt\n" && arguments == "ls -la")
        );
        app.on_run_event(&event(
            0,
            EventKind::ToolCallFinished {
                call_id: "c".into(),
                name: "execute".into(),
                status: ToolStatus::Ok,
                content: vec![ContentBlock::text("a.txt\nb.txt")],
                duration_ms: 12,
            },
        ));
        assert!(
            matches!(&app.cells[1], Cell::Tool { state: ToolState::Done { ok: true, duration_ms: 12 }, output, .. } if output == "a.txt\nb.txt")
        );
    }

    #[test]
    fn approvals_are_decided_with_keys_in_order() {
        let mut app = App::new(Status::default());
        let action = |id: &str| PendingAction {
            call_id: id.into(),
            name: "execute".into(),
            arguments: serde_json::json!({"command": "rm -r build"}),
            description: None,
            allowed: vec![DecisionKind::Approve, DecisionKind::Reject],
            request: None,
            path: Vec::new(),
        };
        assert_eq!(app.paused(vec![action("a"), action("b")]), None);
        assert_eq!(app.on_key(key(KeyCode::Char('y'))), None);
        app.on_key(key(KeyCode::Char('n')));
        type_text(&mut app, "not now");
        assert_eq!(
            app.on_key(key(KeyCode::Enter)),
            Some(Action::Decide(vec![
                Decision::Approve,
                Decision::Reject {
                    message: Some("not now".into())
                }
            ]))
        );
        assert!(app.approval.is_none());
        // `e` edits the arguments (as JSON), `m` answers in the call's place.
        let editable = |id: &str| PendingAction {
            allowed: vec![
                DecisionKind::Approve,
                DecisionKind::Edit,
                DecisionKind::Reject,
                DecisionKind::Respond,
            ],
            ..action(id)
        };
        app.paused(vec![editable("e1"), editable("e2")]);
        app.on_key(key(KeyCode::Char('e')));
        for _ in 0..40 {
            app.on_key(key(KeyCode::Backspace));
        }
        type_text(&mut app, "{\"command\": \"ls\"}");
        assert_eq!(app.on_key(key(KeyCode::Enter)), None);
        app.on_key(key(KeyCode::Char('m')));
        type_text(&mut app, "skipped it");
        assert_eq!(
            app.on_key(key(KeyCode::Enter)),
            Some(Action::Decide(vec![
                Decision::Edit {
                    arguments: serde_json::json!({"command": "ls"})
                },
                Decision::Respond {
                    message: "skipped it".into()
                }
            ]))
        );
        // Calls that will not run show how they were settled at once: the rejected one and
        // the one answered in its place.
        let settled = |id: &str| {
            app.cells.iter().rev().find_map(|cell| match cell {
                Cell::Tool {
                    call_id,
                    state: ToolState::Done { ok, .. },
                    output,
                    ..
                } if call_id == id => Some((*ok, output.clone())),
                _ => None,
            })
        };
        assert_eq!(settled("b"), Some((false, "rejected: not now".to_owned())));
        assert_eq!(
            settled("a"),
            None,
            "an approved call runs: the run reports it"
        );
        assert_eq!(
            settled("e2"),
            Some((true, "answered: skipped it".to_owned()))
        );
        assert_eq!(
            settled("e1"),
            None,
            "an edited call runs: the run reports it"
        );
        // `s` approves the tool for the session: its later actions do not wait.
        app.paused(vec![action("s1")]);
        assert_eq!(
            app.on_key(key(KeyCode::Char('s'))),
            Some(Action::Decide(vec![Decision::Approve]))
        );
        assert_eq!(
            app.paused(vec![action("s2"), action("s3")]),
            Some(Action::Decide(vec![Decision::Approve, Decision::Approve]))
        );
        app.allowed_tools.clear();
        // In YOLO mode nothing waits.
        app.mode = Mode::Yolo;
        assert_eq!(
            app.paused(vec![action("c")]),
            Some(Action::Decide(vec![Decision::Approve]))
        );
    }

    #[test]
    fn tab_completes_commands_and_paths() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("src")).unwrap();
        std::fs::write(root.path().join("src/main.rs"), "").unwrap();
        std::fs::write(root.path().join("src/mod.rs"), "").unwrap();
        let mut app = App::new(Status::default());
        app.root = Some(root.path().to_owned());
        type_text(&mut app, "/thr");
        app.on_key(key(KeyCode::Tab));
        assert_eq!(app.input, "/threads ");
        app.input.clear();
        app.cursor = 0;
        type_text(&mut app, "look at @sr");
        app.on_key(key(KeyCode::Tab));
        assert_eq!(app.input, "look at @src/");
        type_text(&mut app, "ma");
        app.on_key(key(KeyCode::Tab));
        assert_eq!(app.input, "look at @src/main.rs");
        assert_eq!(matching_commands("rsm")[0].0, "resume");
    }

    #[test]
    fn questions_are_answered_in_the_tui() {
        use deepagents_mcp::{Elicitation, ElicitationAnswer, ElicitationRequest};
        let mut app = App::new(Status::default());
        let (reply, _) = tokio::sync::oneshot::channel();
        app.ask(&crate::tui::ask::Question::Elicit {
            request: ElicitationRequest {
                server: "shop".into(),
                message: "Your details".into(),
                kind: Elicitation::Form {
                    schema: serde_json::json!({"type": "object", "properties": {
                        "age": {"type": "integer"}, "name": {"type": "string"}},
                        "required": ["age"]}),
                },
            },
            reply,
        });
        type_text(&mut app, "old");
        app.on_key(key(KeyCode::Enter));
        assert!(
            matches!(&app.asked, Some(Asked::Form { problem: Some(p), at: 0, .. }) if p.contains("whole number"))
        );
        type_text(&mut app, "41");
        app.on_key(key(KeyCode::Enter));
        type_text(&mut app, "Ada");
        assert_eq!(
            app.on_key(key(KeyCode::Enter)),
            Some(Action::Answer(Answer::Elicited(ElicitationAnswer::Accept(
                Some(serde_json::json!({"age": 41, "name": "Ada"}))
            ))))
        );
        assert!(app.asked.is_none());
        let (reply, _) = tokio::sync::oneshot::channel();
        app.ask(&crate::tui::ask::Question::Approve {
            call: deepagents::core::ToolCall {
                id: "c".into(),
                name: "execute".into(),
                arguments: serde_json::json!({"command": "make deploy"}),
            },
            reason: "deploys need a person".into(),
            reply,
        });
        assert_eq!(
            app.on_key(key(KeyCode::Char('y'))),
            Some(Action::Answer(Answer::Approved(true)))
        );
    }

    #[test]
    fn the_picker_opens_and_deletes_threads() {
        let mut app = App::new(Status::default());
        app.pick_thread(vec![
            ("b".into(), "b · newest".into()),
            ("a".into(), "a · older".into()),
        ]);
        app.on_key(key(KeyCode::Down));
        assert_eq!(
            app.on_key(key(KeyCode::Char('d'))),
            Some(Action::DeleteThread("a".into()))
        );
        assert_eq!(
            app.on_key(key(KeyCode::Enter)),
            Some(Action::Resume("b".into()))
        );
        assert!(app.picker.is_none());
    }

    #[test]
    fn a_pasted_image_path_attaches_the_image_until_its_label_is_sent() {
        let dir = tempfile::tempdir().unwrap();
        let shot = dir.path().join("my shot.png");
        std::fs::write(&shot, b"\x89PNG....").unwrap();
        let mut app = App::new(Status::default());
        app.on_paste("look at ");
        // As a terminal pastes a dropped file: quoted, or with escaped spaces.
        app.on_paste(&format!("'{}'", shot.display()));
        app.on_paste(&shot.display().to_string().replace(' ', "\\ "));
        assert_eq!(app.input, "look at [image 1] [image 2] ");
        assert!(
            matches!(&app.cells[0], Cell::Notice(n) if n == "attached my shot.png (1 KB) as [image 1]")
        );
        // A path to something else is text.
        app.on_paste("/etc/hostname");
        assert!(app.input.ends_with("/etc/hostname"));
        let sent = app.take_pasted("look at [image 2]");
        assert!(
            matches!(&sent[..], [ContentBlock::Data { mime_type, data }] if mime_type == "image/png" && data.starts_with(b"\x89PNG"))
        );
        // The one not sent stays for a later message; sent ones do not come twice.
        assert_eq!(app.take_pasted("look at [image 2]").len(), 0);
        assert_eq!(app.take_pasted("[image 1]").len(), 1);
        app.attach("big", "image/png", vec![0; 6 * 1024 * 1024]);
        assert!(
            matches!(app.cells.last(), Some(Cell::Error(e)) if e.contains("larger than 5 MiB"))
        );
    }

    #[test]
    fn context_shows_a_gauge_and_what_fills_it() {
        let mut app = App::new(Status {
            window: Some(200_000),
            context: 50_000,
            ..Status::default()
        });
        app.show_context(&ContextParts {
            memory: 1_000,
            skills: 500,
            tools: (3_500, 12),
            messages: (20_000, 31),
        });
        let Some(Cell::Notice(text)) = app.cells.last() else {
            panic!("{:?}", app.cells)
        };
        assert!(
            text.starts_with("context: 50,000 of 200,000 tokens (25%)  █████░░░"),
            "{text}"
        );
        assert!(text.contains("system prompt        ~25,000"), "{text}");
        assert!(text.contains("tools (12)           ~3,500"), "{text}");
        assert!(text.contains("messages (31)        ~20,000"), "{text}");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(999), "999");
    }

    #[test]
    fn modes_switch_with_commands() {
        let mut app = App::new(Status::default());
        assert_eq!(app.mode, Mode::Auto);
        for (command, mode) in [
            ("/manual", Mode::Manual),
            ("/yolo", Mode::Yolo),
            ("/auto", Mode::Auto),
        ] {
            app.input = command.to_owned();
            app.cursor = command.len();
            assert_eq!(
                app.on_key(KeyEvent::from(KeyCode::Enter)),
                Some(Action::ModeChanged)
            );
            assert_eq!(app.mode, mode);
        }
    }

    #[test]
    fn images_named_with_at_are_attached() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("shot.png"), b"\x89PNG....").unwrap();
        let (content, notes) =
            message_content("what is in @shot.png? and @gone.jpg", Some(root.path()));
        assert_eq!(content.len(), 2);
        assert!(
            matches!(&content[1], ContentBlock::Data { mime_type, data } if mime_type == "image/png" && data.starts_with(b"\x89PNG"))
        );
        assert_eq!(
            notes,
            ["attached shot.png (1 KB)", "gone.jpg: no such file"]
        );
        let (content, notes) = message_content("see @../etc/x.png", Some(root.path()));
        assert_eq!(content.len(), 1);
        assert_eq!(notes.len(), 1);
    }

    #[test]
    fn slash_commands_answer_in_notices() {
        let mut app = App::new(Status::default());
        type_text(&mut app, "/nope");
        app.on_key(key(KeyCode::Enter));
        assert!(
            matches!(app.cells.last(), Some(Cell::Notice(text)) if text.contains("unknown command /nope"))
        );
        type_text(&mut app, "/cost");
        app.on_key(key(KeyCode::Enter));
        assert!(
            matches!(app.cells.last(), Some(Cell::Notice(text)) if text.starts_with("session: $0.0000"))
        );
        type_text(&mut app, "/compact");
        assert_eq!(app.on_key(key(KeyCode::Enter)), None);
        assert!(app.take_compact());
        assert!(!app.take_compact(), "only the next turn compacts");
        app.learn_skills(Some(&serde_json::json!([
            {"name": "release", "description": "Cut a release", "path": "/skills/release/SKILL.md"}
        ])));
        type_text(&mut app, "/skills");
        app.on_key(key(KeyCode::Enter));
        assert!(
            matches!(app.cells.last(), Some(Cell::Notice(text)) if text == "/release: Cut a release")
        );
        type_text(&mut app, "/release 1.2");
        assert_eq!(
            app.on_key(key(KeyCode::Enter)),
            Some(Action::Send(
                "Use the `release` skill (read /skills/release/SKILL.md first). 1.2".into()
            ))
        );
        app.failed(String::new(), Spent::default());
        type_text(&mut app, "/agents");
        assert_eq!(app.on_key(key(KeyCode::Enter)), Some(Action::ListAgents));
        type_text(&mut app, "/quit");
        assert_eq!(app.on_key(key(KeyCode::Enter)), Some(Action::Quit));
    }
}
