//! Drawing the state: the conversation, the plan, the approval panel, the input and the
//! status bar. Lines are wrapped here (by display width, so wide characters take two
//! columns) so scrolling knows exactly how tall the conversation is.

use deepagents::core::interrupt::DecisionKind;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Position, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

use super::app::{App, Asked, Cell, Mode, Picker, ToolState, Typing, mark, matching_commands};

const SPINNER: [&str; 4] = ["⠋", "⠙", "⠸", "⠴"];

/// Lines of a tool's output shown under it.
const OUTPUT_LINES: usize = 4;

/// Draws the whole screen; `cache` keeps the conversation's wrapped lines between frames.
pub fn render(frame: &mut Frame, app: &App, cache: &mut LineCache) {
    let area = frame.area();
    let input_lines = app.input.split('\n').count().clamp(1, 6) as u16;
    let todo_lines = if app.todos.is_empty() {
        0
    } else {
        app.todos.len().min(6) as u16 + 1
    };
    let approval_lines = approval_lines(app, area.width);
    let palette = palette_lines(app);
    let [conversation, todos, approval, palette_area, input, status] = Layout::vertical([
        Constraint::Min(3),
        Constraint::Length(todo_lines),
        // The panel's top border takes a line of its own.
        Constraint::Length(approval_lines.len() as u16 + u16::from(!approval_lines.is_empty())),
        Constraint::Length(palette.len() as u16),
        Constraint::Length(input_lines + 2),
        Constraint::Length(1),
    ])
    .areas(area);
    if !palette.is_empty() {
        frame.render_widget(Paragraph::new(palette), palette_area);
    }
    render_conversation(frame, app, cache, conversation);
    if todo_lines > 0 {
        let lines: Vec<Line> = std::iter::once(Line::styled("Plan", Style::new().bold()))
            .chain(
                app.todos
                    .iter()
                    .take(6)
                    .map(|t| Line::raw(format!(" {} {}", mark(t), t.content))),
            )
            .collect();
        frame.render_widget(Paragraph::new(lines), todos);
    }
    if !approval_lines.is_empty() {
        frame.render_widget(
            Paragraph::new(approval_lines).block(
                Block::new()
                    .borders(Borders::TOP)
                    .border_style(Style::new().fg(Color::Yellow))
                    .title(if app.asked.is_some() {
                        " question "
                    } else if app.picker.is_some() {
                        " threads "
                    } else {
                        " approval needed "
                    }),
            ),
            approval,
        );
    }
    render_input(frame, app, input);
    frame.render_widget(Paragraph::new(status_line(app)), status);
}

/// While a `/command` is typed: the commands that match (Tab takes the first).
fn palette_lines(app: &App) -> Vec<Line<'static>> {
    let Some(typed) = app.input.strip_prefix('/') else {
        return Vec::new();
    };
    if typed.contains(' ') || app.approval.is_some() {
        return Vec::new();
    }
    matching_commands(typed)
        .into_iter()
        .take(8)
        .enumerate()
        .map(|(i, (name, about))| {
            let style = if i == 0 {
                Style::new().fg(Color::Cyan).bold()
            } else {
                Style::new().fg(Color::Cyan)
            };
            Line::from(vec![
                Span::styled(format!("  /{name:<10}"), style),
                Span::styled(about.to_owned(), Style::new().fg(Color::DarkGray)),
            ])
        })
        .collect()
}

/// A question the run waits on.
fn question_lines(asked: &Asked, width: u16) -> Vec<Line<'static>> {
    let width = width.saturating_sub(2) as usize;
    let mut lines = vec![Line::raw("")];
    let mut say = |text: String, style: Style| {
        for piece in wrap(&text, width) {
            lines.push(Line::styled(format!("  {piece}"), style));
        }
    };
    let hint = Style::new().fg(Color::Yellow);
    match asked {
        Asked::Approve { call, reason } => {
            say(
                format!("A hook asks you to approve: {call}"),
                Style::new().bold(),
            );
            say(reason.clone(), Style::new().fg(Color::DarkGray));
            say("y run it · n or Esc: do not".to_owned(), hint);
        }
        Asked::Url {
            server,
            message,
            url,
        } => {
            say(
                format!("The MCP server {server} asks: {message}"),
                Style::new().bold(),
            );
            say(format!("Open {url}"), Style::new().fg(Color::Cyan));
            say(
                "y or Enter when done · n decline · Esc cancel the call".to_owned(),
                hint,
            );
        }
        Asked::Form {
            server,
            message,
            fields,
            at,
            typed,
            problem,
            ..
        } => {
            say(
                format!("The MCP server {server} asks: {message}"),
                Style::new().bold(),
            );
            if let Some((name, field, required)) = fields.get(*at) {
                let about = field["description"]
                    .as_str()
                    .or_else(|| field["title"].as_str())
                    .map(|d| format!(" — {d}"))
                    .unwrap_or_default();
                let kind = field["type"].as_str().unwrap_or("string");
                let optional = if *required {
                    ""
                } else {
                    ", optional: Enter skips"
                };
                say(
                    format!(
                        "[{}/{}] {name} ({kind}{optional}){about}",
                        at + 1,
                        fields.len()
                    ),
                    Style::new(),
                );
                say(format!("> {typed}"), Style::new().fg(Color::Cyan));
            }
            if let Some(problem) = problem {
                say(problem.clone(), Style::new().fg(Color::Red));
            }
            say("Enter next field · Esc decline".to_owned(), hint);
        }
    }
    lines
}

/// The thread picker: the threads around the selected one.
fn picker_lines(picker: &Picker, width: u16) -> Vec<Line<'static>> {
    let mut lines = vec![Line::raw("")];
    let first = picker.selected.saturating_sub(7);
    for (i, (_, line)) in picker.threads.iter().enumerate().skip(first).take(8) {
        let text: String = line
            .chars()
            .take(width.saturating_sub(4) as usize)
            .collect();
        lines.push(if i == picker.selected {
            Line::styled(format!("› {text}"), Style::new().fg(Color::Cyan).bold())
        } else {
            Line::raw(format!("  {text}"))
        });
    }
    lines.push(Line::styled(
        "  ↑↓ choose · Enter open · d delete · Esc close",
        Style::new().fg(Color::Yellow),
    ));
    lines
}

fn approval_lines(app: &App, width: u16) -> Vec<Line<'static>> {
    if let Some(asked) = &app.asked {
        return question_lines(asked, width);
    }
    if let Some(picker) = &app.picker {
        return picker_lines(picker, width);
    }
    let Some(approval) = &app.approval else {
        return Vec::new();
    };
    let Some(action) = approval.actions.get(approval.decisions.len()) else {
        return Vec::new();
    };
    let mut lines = vec![Line::raw("")];
    let who = if action.agents().is_empty() {
        String::new()
    } else {
        format!(
            " (in {})",
            action
                .agents()
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(" › ")
        )
    };
    lines.push(Line::from(vec![
        Span::styled(
            format!(
                "[{}/{}] ",
                approval.decisions.len() + 1,
                approval.actions.len()
            ),
            Style::new().fg(Color::DarkGray),
        ),
        Span::styled(action.name.clone(), Style::new().bold()),
        Span::raw(who),
    ]));
    let shown = match action.arguments.get("command").and_then(|c| c.as_str()) {
        Some(command) => format!("$ {command}"),
        None => serde_json::to_string_pretty(&action.arguments).unwrap_or_default(),
    };
    for line in shown.lines().take(8) {
        for piece in wrap(line, width.saturating_sub(2) as usize) {
            lines.push(Line::styled(
                format!("  {piece}"),
                Style::new().fg(Color::Cyan),
            ));
        }
    }
    if let Some(description) = &action.description {
        lines.push(Line::styled(
            format!("  {description}"),
            Style::new().fg(Color::DarkGray),
        ));
    }
    lines.push(match &approval.typing {
        Some((what, text)) => {
            let label = match what {
                Typing::Reason => "reason (Enter rejects, Esc back)",
                Typing::Arguments => "arguments as JSON (Enter runs it so, Esc back)",
                Typing::Response => "answer for the model (Enter sends, Esc back)",
            };
            Line::raw(format!("  {label}: {text}"))
        }
        None => {
            // Only the keys that do something for this action: a question (`ask_user`) is
            // answered or refused, not approved.
            let allows = |kind| action.allowed.contains(&kind);
            let approvable = allows(DecisionKind::Approve);
            let mut keys = Vec::new();
            if approvable {
                keys.extend(["y approve", "s this tool for the session"]);
            }
            if allows(DecisionKind::Edit) {
                keys.push("e edit");
            }
            if allows(DecisionKind::Respond) {
                keys.push(if approvable {
                    "m answer instead"
                } else {
                    "m or Enter answer"
                });
            }
            if allows(DecisionKind::Reject) {
                keys.push("n reject");
            }
            if approvable {
                keys.push("A everything");
            }
            Line::styled(
                format!("  {}", keys.join(" · ")),
                Style::new().fg(Color::Yellow),
            )
        }
    });
    lines
}

fn render_input(frame: &mut Frame, app: &App, area: Rect) {
    let title = if app.busy {
        format!(
            " {} working · Esc interrupts{} ",
            SPINNER[app.tick % SPINNER.len()],
            if app.queued.is_empty() {
                String::new()
            } else {
                format!(" · {} queued", app.queued.len())
            }
        )
    } else if app.quit_armed() {
        " Ctrl-C again to quit ".to_owned()
    } else {
        " message · /help ".to_owned()
    };
    let block = Block::new()
        .borders(Borders::ALL)
        .border_style(Style::new().fg(Color::DarkGray))
        .title(title);
    let inner = block.inner(area);
    let lines: Vec<&str> = app.input.split('\n').collect();
    // Keep the cursor's line visible.
    let before = &app.input[..app.cursor.min(app.input.len())];
    let cursor_line = before.matches('\n').count();
    let first = cursor_line.saturating_sub(inner.height.saturating_sub(1) as usize);
    let text: Vec<Line> = lines
        .iter()
        .skip(first)
        .map(|l| Line::raw((*l).to_owned()))
        .collect();
    frame.render_widget(Paragraph::new(text).block(block), area);
    if app.approval.is_none() && app.asked.is_none() && app.picker.is_none() {
        let column = before.rsplit('\n').next().map_or(0, UnicodeWidthStr::width);
        frame.set_cursor_position(Position::new(
            inner.x + (column as u16).min(inner.width.saturating_sub(1)),
            inner.y + (cursor_line - first) as u16,
        ));
    }
}

fn status_line(app: &App) -> Line<'static> {
    let status = &app.status;
    let mut spans = vec![
        Span::styled(format!(" {} ", status.model), Style::new().bold()),
        Span::raw(format!("· {} ", status.thread)),
    ];
    if app.mode == Mode::Yolo {
        spans.push(Span::styled(
            " YOLO ",
            Style::new().fg(Color::Black).bg(Color::Red).bold(),
        ));
        spans.push(Span::raw(" "));
    } else {
        spans.push(Span::raw(format!("· {} ", app.mode.name())));
    }
    if app.plan {
        spans.push(Span::styled(
            " PLAN ",
            Style::new().fg(Color::Black).bg(Color::Cyan).bold(),
        ));
        spans.push(Span::raw(" "));
    }
    if !status.sandbox.is_empty() {
        spans.push(Span::raw(format!("· {} ", status.sandbox)));
    }
    if let Some(window) = status.window
        && status.context > 0
    {
        spans.push(Span::raw(format!(
            "· ctx {}% ",
            status.context * 100 / window.max(1)
        )));
    }
    let spent = &status.session;
    spans.push(Span::styled(
        format!(
            "· ${:.4} · {} in / {} out / {} cached",
            spent.cost_usd,
            spent.usage.input_tokens,
            spent.usage.output_tokens,
            spent.usage.cached_input_tokens
        ),
        Style::new().fg(Color::DarkGray),
    ));
    Line::from(spans)
}

/// The wrapped lines of each cell of the conversation, kept between frames: a frame re-wraps
/// only the cells that changed since the last (the one streaming, a tool finishing), so
/// drawing costs the same on a long thread as on a short one. Keyed per cell by what its lines
/// depend on; a resize or a toggle (reasoning, expanded output) re-wraps everything once.
#[derive(Default)]
pub struct LineCache {
    cells: Vec<CachedCell>,
    /// Cells wrapped since the cache was made, for tests.
    #[cfg(test)]
    wrapped: usize,
}

struct CachedCell {
    key: CellKey,
    lines: Vec<Line<'static>>,
}

/// What a cell's lines depend on. Cells only grow at their end (streamed text, output) or
/// change state, so lengths and state stand for their content without reading it.
#[derive(Clone, Copy, PartialEq, Eq)]
struct CellKey {
    width: usize,
    show_reasoning: bool,
    expanded: bool,
    kind: u8,
    depth: usize,
    lengths: [usize; 4],
    /// The tool's state, and the spinner's frame while it runs.
    state: Option<(ToolState, usize)>,
}

impl CellKey {
    fn of(cell: &Cell, app: &App, width: usize) -> Self {
        let mut key = Self {
            width,
            show_reasoning: app.show_reasoning,
            expanded: app.expanded,
            kind: 0,
            depth: 0,
            lengths: [0; 4],
            state: None,
        };
        match cell {
            Cell::User(text) => key.lengths[0] = text.len(),
            Cell::Assistant { text, depth } => {
                (key.kind, key.depth, key.lengths[0]) = (1, *depth, text.len());
            }
            Cell::Reasoning { text, depth } => {
                (key.kind, key.depth, key.lengths[0]) = (2, *depth, text.len());
            }
            Cell::Tool {
                name,
                arguments,
                depth,
                state,
                output,
                diff,
                ..
            } => {
                key.kind = 3;
                key.depth = *depth;
                key.lengths = [
                    name.len() + arguments.len(),
                    output.len(),
                    diff.as_ref().map_or(0, |(old, _)| old.len()),
                    diff.as_ref().map_or(0, |(_, new)| new.len()),
                ];
                let frame = match state {
                    ToolState::Running => app.tick % SPINNER.len(),
                    ToolState::Done { .. } => 0,
                };
                key.state = Some((*state, frame));
            }
            Cell::Notice(text) => (key.kind, key.lengths[0]) = (4, text.len()),
            Cell::Error(text) => (key.kind, key.lengths[0]) = (5, text.len()),
        }
        key
    }
}

impl LineCache {
    /// The lines of every cell at `width`, each followed by a blank line, re-wrapping only
    /// cells whose key changed; returns the total number of lines.
    fn update(&mut self, app: &App, width: usize) -> usize {
        self.cells.truncate(app.cells.len());
        let mut total = 0;
        for (index, cell) in app.cells.iter().enumerate() {
            let key = CellKey::of(cell, app, width);
            if self.cells.get(index).is_none_or(|cached| cached.key != key) {
                let mut lines = Vec::new();
                cell_lines(cell, app, width, &mut lines);
                lines.push(Line::raw(""));
                let cached = CachedCell { key, lines };
                #[cfg(test)]
                {
                    self.wrapped += 1;
                }
                match self.cells.get_mut(index) {
                    Some(slot) => *slot = cached,
                    None => self.cells.push(cached),
                }
            }
            total += self.cells[index].lines.len();
        }
        total
    }

    /// Lines `start..end` of the conversation, copied out of the cache.
    fn window(&self, start: usize, end: usize) -> Vec<Line<'static>> {
        let mut shown = Vec::with_capacity(end - start);
        let mut first = 0;
        for cached in &self.cells {
            let last = first + cached.lines.len();
            if last > start && first < end {
                let from = start.saturating_sub(first);
                let to = (end - first).min(cached.lines.len());
                shown.extend_from_slice(&cached.lines[from..to]);
            }
            if last >= end {
                break;
            }
            first = last;
        }
        shown
    }
}

fn render_conversation(frame: &mut Frame, app: &App, cache: &mut LineCache, area: Rect) {
    let width = area.width.max(10) as usize;
    let total = cache.update(app, width);
    let height = area.height as usize;
    let end = total.saturating_sub(app.scroll);
    let start = end.saturating_sub(height);
    frame.render_widget(Paragraph::new(cache.window(start, end)), area);
}

fn cell_lines(cell: &Cell, app: &App, width: usize, lines: &mut Vec<Line<'static>>) {
    let tick = app.tick;
    match cell {
        Cell::User(text) => {
            for (i, line) in text.lines().enumerate() {
                let prefix = if i == 0 { "› " } else { "  " };
                for piece in wrap(line, width - 2) {
                    lines.push(Line::styled(
                        format!("{prefix}{piece}"),
                        Style::new().fg(Color::Green).add_modifier(Modifier::BOLD),
                    ));
                }
            }
        }
        Cell::Assistant { text, depth } => markdown(text, *depth, width, lines),
        Cell::Reasoning { text, depth } => {
            let indent = "  ".repeat(*depth);
            let style = Style::new()
                .fg(Color::DarkGray)
                .add_modifier(Modifier::ITALIC);
            let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            let shown = if app.show_reasoning { all.len() } else { 1 };
            for line in all.iter().take(shown) {
                for piece in wrap(line, width.saturating_sub(indent.len() + 2).max(8)) {
                    lines.push(Line::styled(format!("{indent}∴ {piece}"), style));
                }
            }
            if all.len() > shown {
                lines.push(Line::styled(
                    format!(
                        "{indent}  … {} of reasoning (Ctrl-R)",
                        lines_count(all.len() - shown)
                    ),
                    style,
                ));
            }
        }
        Cell::Tool {
            name,
            arguments,
            depth,
            state,
            output,
            diff,
            ..
        } => {
            let indent = "  ".repeat(*depth);
            let (mark, style, duration) = match state {
                ToolState::Running => (
                    SPINNER[tick % SPINNER.len()],
                    Style::new().fg(Color::Yellow),
                    String::new(),
                ),
                ToolState::Done {
                    ok: true,
                    duration_ms,
                } => (
                    "✓",
                    Style::new().fg(Color::Green),
                    format!(" {duration_ms} ms"),
                ),
                ToolState::Done {
                    ok: false,
                    duration_ms,
                } => (
                    "✗",
                    Style::new().fg(Color::Red),
                    format!(" {duration_ms} ms"),
                ),
            };
            let head = format!("{indent}{mark} {name} {arguments}");
            for (i, piece) in wrap(&head, width).into_iter().enumerate() {
                let mut spans = vec![Span::styled(piece, style)];
                if i == 0 && !duration.is_empty() {
                    spans.push(Span::styled(
                        duration.clone(),
                        Style::new().fg(Color::DarkGray),
                    ));
                }
                lines.push(Line::from(spans));
            }
            if let Some((old, new)) = diff {
                let gone = Style::new().fg(Color::Red);
                let added = Style::new().fg(Color::Green);
                for (mark, text, style) in [("-", old, gone), ("+", new, added)] {
                    for line in text.lines().take(if app.expanded { 40 } else { 6 }) {
                        for piece in wrap(line, width.saturating_sub(indent.len() + 4).max(8)) {
                            lines.push(Line::styled(format!("{indent}  {mark} {piece}"), style));
                        }
                    }
                }
            }
            let output_lines: Vec<&str> = output.lines().collect();
            let keep = if app.expanded { 200 } else { OUTPUT_LINES };
            let skipped = output_lines.len().saturating_sub(keep);
            if skipped > 0 {
                lines.push(Line::styled(
                    format!("{indent}  … {} (Ctrl-O)", lines_count(skipped)),
                    Style::new().fg(Color::DarkGray),
                ));
            }
            for line in &output_lines[skipped..] {
                // Tabs have no width of their own on the grid (line-numbered file reads).
                let line = line.replace('\t', "  ");
                for piece in wrap(&line, width.saturating_sub(indent.len() + 4).max(8)) {
                    lines.push(Line::styled(
                        format!("{indent}  │ {piece}"),
                        Style::new().fg(Color::DarkGray),
                    ));
                }
            }
        }
        Cell::Notice(text) => {
            for line in text.lines() {
                for piece in wrap(line, width - 2) {
                    lines.push(Line::styled(
                        format!("⋯ {piece}"),
                        Style::new().fg(Color::Blue),
                    ));
                }
            }
        }
        Cell::Error(text) => {
            for piece in wrap(text, width - 2) {
                lines.push(Line::styled(
                    format!("✗ {piece}"),
                    Style::new().fg(Color::Red),
                ));
            }
        }
    }
}

/// `1 more line`, `3 more lines`.
fn lines_count(n: usize) -> String {
    format!("{n} more line{}", if n == 1 { "" } else { "s" })
}

/// Light markdown: headings bold, fenced code dimmed and kept as is, list bullets as `•`,
/// `**bold**` and `` `code` `` spans styled.
fn markdown(text: &str, depth: usize, width: usize, lines: &mut Vec<Line<'static>>) {
    let indent = "  ".repeat(depth);
    let width = width.saturating_sub(indent.len()).max(8);
    let mut code = false;
    let mut language = String::new();
    let all: Vec<&str> = text.lines().collect();
    let mut next = 0;
    while next < all.len() {
        let raw = all[next];
        next += 1;
        if let Some(fence) = raw.trim_start().strip_prefix("```") {
            code = !code;
            language = fence.trim().to_ascii_lowercase();
            continue;
        }
        if !code && raw.trim_start().starts_with('|') {
            let start = next - 1;
            while next < all.len() && all[next].trim_start().starts_with('|') {
                next += 1;
            }
            table(&all[start..next], &indent, width, lines);
            continue;
        }
        if code {
            for piece in wrap(raw, width - 2) {
                let mut spans = vec![Span::raw(format!("{indent}  "))];
                spans.extend(highlight(&piece, &language));
                lines.push(Line::from(spans));
            }
            continue;
        }
        let trimmed = raw.trim_start();
        if let Some(heading) = trimmed.strip_prefix('#') {
            let heading = heading.trim_start_matches('#').trim();
            lines.push(Line::styled(
                format!("{indent}{heading}"),
                Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED),
            ));
            continue;
        }
        let (lead, body) = match trimmed.strip_prefix("- ").or(trimmed.strip_prefix("* ")) {
            Some(item) => (format!("{}• ", &raw[..raw.len() - trimmed.len()]), item),
            None => (String::new(), raw),
        };
        for (i, piece) in wrap(body, width.saturating_sub(lead.len()).max(8))
            .into_iter()
            .enumerate()
        {
            let prefix = if i == 0 {
                lead.clone()
            } else {
                " ".repeat(lead.chars().count())
            };
            let mut spans = vec![Span::raw(format!("{indent}{prefix}"))];
            spans.extend(inline_spans(&piece));
            lines.push(Line::from(spans));
        }
    }
}

/// Keywords, strings, numbers and comments of a line of code in `language` (a fence's info
/// string), colored; other languages get the plain code color. A lexer this small misreads
/// some lines (strings across lines); it only colors, never changes the text.
fn highlight(line: &str, language: &str) -> Vec<Span<'static>> {
    const RUST: &[&str] = &[
        "as", "async", "await", "break", "const", "continue", "crate", "else", "enum", "false",
        "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub",
        "ref", "return", "self", "Self", "static", "struct", "super", "trait", "true", "type",
        "use", "where", "while",
    ];
    const PYTHON: &[&str] = &[
        "and", "as", "async", "await", "class", "def", "elif", "else", "except", "False",
        "finally", "for", "from", "if", "import", "in", "is", "lambda", "None", "not", "or",
        "pass", "raise", "return", "True", "try", "while", "with", "yield",
    ];
    const SCRIPT: &[&str] = &[
        "async",
        "await",
        "break",
        "case",
        "class",
        "const",
        "continue",
        "default",
        "do",
        "done",
        "elif",
        "else",
        "esac",
        "export",
        "false",
        "fi",
        "for",
        "function",
        "if",
        "import",
        "in",
        "interface",
        "let",
        "new",
        "null",
        "return",
        "then",
        "this",
        "true",
        "type",
        "var",
        "while",
    ];
    let (keywords, comment): (&[&str], &str) = match language {
        "rust" | "rs" => (RUST, "//"),
        "python" | "py" => (PYTHON, "#"),
        "sh" | "bash" | "shell" | "zsh" | "console" => (SCRIPT, "#"),
        "js" | "javascript" | "ts" | "typescript" | "go" | "c" | "cpp" | "java" => (SCRIPT, "//"),
        "toml" | "yaml" | "yml" => (&[], "#"),
        _ => return vec![Span::styled(line.to_owned(), Style::new().fg(Color::Cyan))],
    };
    let keyword = Style::new().fg(Color::Magenta).add_modifier(Modifier::BOLD);
    let string = Style::new().fg(Color::Green);
    let number = Style::new().fg(Color::Yellow);
    let plain = Style::new().fg(Color::Cyan);
    let mut spans = Vec::new();
    let mut rest = line;
    while let Some(c) = rest.chars().next() {
        if rest.starts_with(comment) {
            spans.push(Span::styled(
                rest.to_owned(),
                Style::new().fg(Color::DarkGray),
            ));
            break;
        }
        let take = if c == '"' || (c == '\'' && language != "rust" && language != "rs") {
            // To the closing quote (a backslash escapes), or the end of the line.
            let mut end = rest.len();
            let mut escaped = false;
            for (i, d) in rest.char_indices().skip(1) {
                if escaped {
                    escaped = false;
                } else if d == '\\' {
                    escaped = true;
                } else if d == c {
                    end = i + d.len_utf8();
                    break;
                }
            }
            (end, string)
        } else if c.is_ascii_digit() {
            let end = rest
                .find(|d: char| !(d.is_ascii_alphanumeric() || d == '.' || d == '_'))
                .unwrap_or(rest.len());
            (end, number)
        } else if c.is_alphabetic() || c == '_' {
            let end = rest
                .find(|d: char| !(d.is_alphanumeric() || d == '_'))
                .unwrap_or(rest.len());
            let word = &rest[..end];
            (
                end,
                if keywords.contains(&word) {
                    keyword
                } else {
                    plain
                },
            )
        } else {
            (c.len_utf8(), plain)
        };
        let (end, style) = take;
        spans.push(Span::styled(rest[..end].to_owned(), style));
        rest = &rest[end..];
    }
    spans
}

/// A markdown table with its columns aligned by display width (the header bold, the
/// `---` row drawn as a rule); one too wide for the view is shown as written.
fn table(rows: &[&str], indent: &str, width: usize, lines: &mut Vec<Line<'static>>) {
    let cells = |row: &str| -> Vec<String> {
        let row = row.trim();
        let row = row.strip_prefix('|').unwrap_or(row);
        let row = row.strip_suffix('|').unwrap_or(row);
        row.split('|').map(|cell| cell.trim().to_owned()).collect()
    };
    let is_rule = |row: &str| {
        row.chars()
            .all(|c| matches!(c, '|' | '-' | ':' | ' ' | '\t'))
    };
    let body: Vec<Vec<String>> = rows
        .iter()
        .filter(|r| !is_rule(r))
        .map(|r| cells(r))
        .collect();
    let columns = body.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0; columns];
    for row in &body {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.width());
        }
    }
    let total = widths.iter().sum::<usize>() + 3 * columns.saturating_sub(1);
    if total > width {
        for row in rows {
            lines.push(Line::raw(format!("{indent}{row}")));
        }
        return;
    }
    let has_rule = rows.iter().any(|r| is_rule(r));
    for (n, row) in body.iter().enumerate() {
        let text = (0..columns)
            .map(|i| {
                let cell = row.get(i).map_or("", String::as_str);
                format!("{cell}{}", " ".repeat(widths[i] - cell.width()))
            })
            .collect::<Vec<_>>()
            .join(" │ ");
        let style = if n == 0 && has_rule {
            Style::new().add_modifier(Modifier::BOLD)
        } else {
            Style::new()
        };
        lines.push(Line::styled(format!("{indent}{}", text.trim_end()), style));
        if n == 0 && has_rule {
            let rule = widths
                .iter()
                .map(|w| "─".repeat(*w))
                .collect::<Vec<_>>()
                .join("─┼─");
            lines.push(Line::styled(
                format!("{indent}{rule}"),
                Style::new().fg(Color::DarkGray),
            ));
        }
    }
}

/// `**bold**` and `` `code` `` within a line.
fn inline_spans(text: &str) -> Vec<Span<'static>> {
    let mut spans = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let bold = rest.find("**");
        let code = rest.find('`');
        let (at, marker, style) = match (bold, code) {
            (Some(b), Some(c)) if c < b => (c, "`", Style::new().fg(Color::Cyan)),
            (Some(b), _) => (b, "**", Style::new().add_modifier(Modifier::BOLD)),
            (None, Some(c)) => (c, "`", Style::new().fg(Color::Cyan)),
            (None, None) => break,
        };
        let after = &rest[at + marker.len()..];
        let Some(end) = after.find(marker) else {
            break;
        };
        if at > 0 {
            spans.push(Span::raw(rest[..at].to_owned()));
        }
        spans.push(Span::styled(after[..end].to_owned(), style));
        rest = &after[end + marker.len()..];
    }
    if !rest.is_empty() {
        spans.push(Span::raw(rest.to_owned()));
    }
    spans
}

/// `line` cut into pieces at most `width` columns wide, at spaces where it can be.
pub fn wrap(line: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    if line.width() <= width {
        return vec![line.to_owned()];
    }
    let mut pieces = Vec::new();
    let mut current = String::new();
    let mut used = 0;
    for word in line.split_inclusive(' ') {
        let word_width = word.width();
        if used + word_width > width && !current.is_empty() {
            pieces.push(current.trim_end().to_owned());
            current = String::new();
            used = 0;
        }
        if word_width > width {
            // A word wider than the line is cut by characters.
            for c in word.chars() {
                let w = c.width().unwrap_or(0);
                if used + w > width {
                    pieces.push(std::mem::take(&mut current));
                    used = 0;
                }
                current.push(c);
                used += w;
            }
        } else {
            current.push_str(word);
            used += word_width;
        }
    }
    if !current.is_empty() {
        pieces.push(current.trim_end().to_owned());
    }
    pieces
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::tui::app::{Approval, Status};
    use deepagents::core::interrupt::DecisionKind;
    use deepagents::core::{Todo, TodoStatus};
    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    fn screen(app: &App, width: u16, height: u16) -> String {
        let mut terminal =
            Terminal::new(TestBackend::new(width, height)).unwrap_or_else(|e| panic!("{e}"));
        terminal
            .draw(|frame| render(frame, app, &mut LineCache::default()))
            .unwrap_or_else(|e| panic!("{e}"));
        let buffer = terminal.backend().buffer().clone();
        (0..buffer.area.height)
            .map(|y| {
                let mut row = String::new();
                let mut skip = 0;
                for x in 0..buffer.area.width {
                    if skip > 0 {
                        skip -= 1;
                        continue;
                    }
                    let symbol = buffer[(x, y)].symbol();
                    skip = symbol.width().saturating_sub(1);
                    row.push_str(symbol);
                }
                row.trim_end().to_owned()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn app() -> App {
        App::new(Status {
            model: "scripted:demo".into(),
            thread: "chat-1".into(),
            sandbox: "bubblewrap".into(),
            ..Status::default()
        })
    }

    /// Draws `app` through `cache`, as the loop does, and returns the screen.
    fn screen_with(app: &App, cache: &mut LineCache, width: u16, height: u16) -> String {
        let mut terminal =
            Terminal::new(TestBackend::new(width, height)).unwrap_or_else(|e| panic!("{e}"));
        terminal
            .draw(|frame| render(frame, app, cache))
            .unwrap_or_else(|e| panic!("{e}"));
        let buffer = terminal.backend().buffer().clone();
        (0..buffer.area.height)
            .map(|y| {
                (0..buffer.area.width)
                    .map(|x| buffer[(x, y)].symbol().to_owned())
                    .collect::<String>()
                    .trim_end()
                    .to_owned()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn a_frame_rewraps_only_the_cells_that_changed_and_draws_what_a_fresh_frame_draws() {
        let mut app = app();
        for i in 0..300 {
            app.cells
                .push(Cell::User(format!("question {i} with some words to wrap")));
            app.cells.push(Cell::Assistant {
                text: format!("answer {i}: **bold** and `code`, then a long line that wraps"),
                depth: 0,
            });
        }
        app.cells.push(Cell::Assistant {
            text: "streaming".into(),
            depth: 0,
        });
        let mut cache = LineCache::default();
        let first = screen_with(&app, &mut cache, 40, 20);
        assert_eq!(cache.wrapped, 601);
        // A streamed delta: only the last cell is wrapped again.
        if let Some(Cell::Assistant { text, .. }) = app.cells.last_mut() {
            text.push_str(" more text");
        }
        let streamed = screen_with(&app, &mut cache, 40, 20);
        assert_eq!(cache.wrapped, 602);
        assert_ne!(first, streamed);
        assert_eq!(
            streamed,
            screen_with(&app, &mut LineCache::default(), 40, 20)
        );
        // Scrolled up into the middle of a cell, the window is the same as a fresh frame's.
        app.scroll = 37;
        let scrolled = screen_with(&app, &mut cache, 40, 20);
        assert_eq!(cache.wrapped, 602);
        assert_eq!(
            scrolled,
            screen_with(&app, &mut LineCache::default(), 40, 20)
        );
        // A resize wraps everything once at the new width; a tool finishing, only itself.
        app.scroll = 0;
        let narrow = screen_with(&app, &mut cache, 30, 20);
        assert_eq!(cache.wrapped, 602 + 601);
        assert_eq!(narrow, screen_with(&app, &mut LineCache::default(), 30, 20));
        app.cells.push(Cell::Tool {
            call_id: "t".into(),
            name: "execute".into(),
            arguments: "make".into(),
            depth: 0,
            state: ToolState::Running,
            output: String::new(),
            diff: None,
        });
        screen_with(&app, &mut cache, 30, 20);
        if let Some(Cell::Tool { state, output, .. }) = app.cells.last_mut() {
            *state = ToolState::Done {
                ok: true,
                duration_ms: 5,
            };
            output.push_str("built");
        }
        let done = screen_with(&app, &mut cache, 30, 20);
        assert_eq!(cache.wrapped, 602 + 601 + 2);
        assert!(done.contains("built"), "{done}");
        // Cells removed (a thread switched) are dropped from the cache.
        app.cells.truncate(2);
        let short = screen_with(&app, &mut cache, 30, 20);
        assert_eq!(short, screen_with(&app, &mut LineCache::default(), 30, 20));
    }

    #[test]
    fn an_idle_tick_asks_for_no_frame_and_a_busy_one_does() {
        let mut app = app();
        assert!(!app.on_tick());
        app.busy = true;
        assert!(app.on_tick());
    }

    #[test]
    fn a_conversation_with_every_kind_of_cell() {
        let mut app = app();
        app.cells = vec![
            Cell::User("Summarize the repo".into()),
            Cell::Assistant {
                text: "# Plan\n- read the **README**\n- run `ls`\n```\ncargo test\n```\n| crate | lines |\n|---|---:|\n| core | 1200 |\n| tui | 900 |".into(),
                depth: 0,
            },
            Cell::Tool {
                call_id: "c".into(),
                name: "execute".into(),
                arguments: "ls -la".into(),
                depth: 0,
                state: ToolState::Done {
                    ok: true,
                    duration_ms: 12,
                },
                output: "a\nb\nc\nd\ne\nf".into(),
                diff: None,
            },
            Cell::Reasoning {
                text: "The README says what the project is.\nThen the layout.".into(),
                depth: 0,
            },
            Cell::Tool {
                call_id: "e".into(),
                name: "edit_file".into(),
                arguments: "/README.md".into(),
                depth: 0,
                state: ToolState::Done {
                    ok: true,
                    duration_ms: 2,
                },
                output: "Edited /README.md.".into(),
                diff: Some(("Status: draft".into(), "Status: ready".into())),
            },
            Cell::Tool {
                call_id: "d".into(),
                name: "read_file".into(),
                arguments: "/missing.txt".into(),
                depth: 1,
                state: ToolState::Done {
                    ok: false,
                    duration_ms: 1,
                },
                output: "no such file".into(),
                diff: None,
            },
            Cell::Notice("summarized 12 earlier messages to make room".into()),
            Cell::Error("the model failed: 500".into()),
        ];
        app.todos = vec![
            Todo {
                content: "Read the README".into(),
                status: TodoStatus::Completed,
            },
            Todo {
                content: "Write the summary".into(),
                status: TodoStatus::InProgress,
            },
        ];
        insta::assert_snapshot!(screen(&app, 60, 40));
    }

    #[test]
    fn an_approval_panel_and_the_yolo_badge() {
        let mut app = app();
        app.busy = true;
        app.approval = Some(Approval {
            actions: vec![deepagents::PendingAction {
                call_id: "x".into(),
                name: "execute".into(),
                arguments: serde_json::json!({"command": "rm -rf build"}),
                description: Some("Runs without the sandbox.".into()),
                allowed: vec![DecisionKind::Approve, DecisionKind::Reject],
                request: None,
                path: vec![deepagents::core::event::PathSegment {
                    call_id: "t".into(),
                    name: "cleaner".into(),
                }],
            }],
            decisions: Vec::new(),
            typing: None,
        });
        insta::assert_snapshot!("approval", screen(&app, 60, 16));
        app.approval = None;
        app.mode = Mode::Yolo;
        insta::assert_snapshot!("yolo", screen(&app, 60, 6));
    }

    /// A question offers the keys that answer or refuse it, none that approve.
    #[test]
    fn a_question_shows_only_the_keys_that_answer_it() {
        let mut app = app();
        app.busy = true;
        app.approval = Some(Approval {
            actions: vec![deepagents::PendingAction {
                call_id: "q".into(),
                name: deepagents::ASK_USER.into(),
                arguments: serde_json::json!({"question": "Which colour?"}),
                description: None,
                allowed: vec![DecisionKind::Respond, DecisionKind::Reject],
                request: None,
                path: Vec::new(),
            }],
            decisions: Vec::new(),
            typing: None,
        });
        let shown = screen(&app, 80, 24);
        assert!(shown.contains("m or Enter answer · n reject"), "{shown}");
        for approving in ["y approve", "this tool for the session", "A everything"] {
            assert!(!shown.contains(approving), "{shown}");
        }
    }

    #[test]
    fn code_is_colored_by_its_language() {
        let spans = highlight("let n = 42; // the answer", "rust");
        let style_of = |text: &str| {
            spans
                .iter()
                .find(|s| s.content == text)
                .map(|s| s.style.fg)
                .unwrap_or_else(|| panic!("no span {text:?}: {spans:?}"))
        };
        assert_eq!(style_of("let"), Some(Color::Magenta));
        assert_eq!(style_of("42"), Some(Color::Yellow));
        assert_eq!(style_of("// the answer"), Some(Color::DarkGray));
        assert_eq!(style_of("n"), Some(Color::Cyan));
        let python = highlight("print('a # b')  # note", "python");
        assert!(
            python
                .iter()
                .any(|s| s.content == "'a # b'" && s.style.fg == Some(Color::Green))
        );
        assert!(python.iter().any(|s| s.content == "# note"));
        // The text is never changed, only colored.
        let joined: String = highlight("x = \"unterminated", "py")
            .iter()
            .map(|s| s.content.to_string())
            .collect();
        assert_eq!(joined, "x = \"unterminated");
        assert_eq!(highlight("anything", "brainfuck").len(), 1);
    }

    #[test]
    fn typing_a_command_opens_the_palette() {
        let mut app = app();
        app.input = "/re".into();
        app.cursor = 3;
        let shown = screen(&app, 60, 12);
        assert!(shown.contains("/resume"), "{shown}");
        assert!(shown.contains("/remember"), "{shown}");
        assert!(!shown.contains("/quit"), "{shown}");
        insta::assert_snapshot!("palette", shown);
    }

    #[test]
    fn wide_characters_wrap_by_width_and_resizing_rewraps() {
        let mut app = app();
        app.cells = vec![Cell::Assistant {
            text: "日本語のテキストは二列ずつ使います。Mixed with ASCII words here.".into(),
            depth: 0,
        }];
        insta::assert_snapshot!("wide_narrow", screen(&app, 24, 10));
        insta::assert_snapshot!("wide_wide", screen(&app, 70, 8));
        for piece in wrap("日本語のテキストは二列ずつ使います", 10) {
            assert!(piece.width() <= 10, "{piece}");
        }
    }
}
