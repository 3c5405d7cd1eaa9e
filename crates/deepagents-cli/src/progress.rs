//! Human-readable progress on stderr.

use std::collections::HashMap;
use std::fmt::Arguments;
use std::io::Write;

use deepagents::core::{AgentPath, Event, EventKind};
use deepagents::{ContentBlock, TodoStatus, ToolStatus};
use serde_json::Value;

/// `eprintln!` with one system call per line (see [`write_line`]).
macro_rules! say {
    ($($arg:tt)*) => {
        write_line(format_args!($($arg)*))
    };
}

/// Longest argument or result preview, in characters.
const PREVIEW: usize = 120;

/// Writes a line per notable event to stderr. The model's narration between tool calls is
/// shown too; its final answer is left for stdout.
#[derive(Default)]
pub struct Progress {
    /// Text streamed so far by each agent (subagents run in parallel), by agent path.
    narration: HashMap<AgentPath, String>,
}

impl Progress {
    pub fn show(&mut self, event: &Event) {
        let indent = "  ".repeat(event.path.len());
        match &event.kind {
            EventKind::TextDelta { text } => self
                .narration
                .entry(event.path.clone())
                .or_default()
                .push_str(text),
            EventKind::ModelCallFinished { tool_calls, .. } => {
                let narration = self.narration.remove(&event.path).unwrap_or_default();
                if *tool_calls > 0 && !narration.trim().is_empty() {
                    say!("{indent}› {}", narration.trim());
                }
            }
            EventKind::ToolCallStarted {
                name, arguments, ..
            } => say!("{indent}▸ {name} {}", preview(&arguments.to_string())),
            EventKind::ToolCallFinished {
                name,
                status,
                content,
                duration_ms,
                ..
            } => match status {
                ToolStatus::Ok => say!("{indent}  ✓ {name} ({duration_ms} ms)"),
                ToolStatus::Error => {
                    let text: String = content.iter().filter_map(ContentBlock::as_text).collect();
                    say!("{indent}  ✗ {name}: {}", preview(&text));
                }
            },
            EventKind::ToolProgress {
                progress,
                total,
                message,
                ..
            } => {
                let done = match total {
                    Some(total) => format!("{progress}/{total}"),
                    None => progress.to_string(),
                };
                let message = message
                    .as_deref()
                    .map(|m| format!(" {m}"))
                    .unwrap_or_default();
                say!("{indent}  … {done}{message}");
            }
            EventKind::StateUpdated { todos, custom, .. } => {
                for todo in todos.iter().flatten() {
                    say!("{indent}  {} {}", todo_mark(todo.status), todo.content);
                }
                // Set once per thread, when the skills are loaded.
                if let Some(warnings) = custom.get("skill_warnings").and_then(Value::as_array) {
                    for warning in warnings {
                        say!("{indent}{}", skill_warning(warning));
                    }
                }
            }
            EventKind::Summarized {
                replaced,
                history_file,
                ..
            } => say!(
                "{indent}⋯ summarized {replaced} earlier message{} (transcript in {history_file})",
                if *replaced == 1 { "" } else { "s" }
            ),
            _ => {}
        }
    }
}

/// Writes one progress line to stderr with a single write: stderr is unbuffered, and a
/// formatted `eprintln!` costs a system call per piece of the format (about ten a step).
fn write_line(args: Arguments<'_>) {
    let mut line = std::fmt::format(args);
    line.push('\n');
    // Progress is best-effort: a closed stderr must not stop the run.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// `$0.0123 · 1234 tokens (1100 in, 800 cached, 134 out)`: what some runs spent, the one
/// form every front end prints it in.
pub fn spent_summary(spent: &deepagents::core::Spent) -> String {
    format!(
        "${:.4} · {} tokens ({} in, {} cached, {} out)",
        spent.cost_usd,
        spent.tokens(),
        spent.usage.input_tokens,
        spent.usage.cached_input_tokens,
        spent.usage.output_tokens
    )
}

/// The mark of a plan item: ☐ to do, ◐ in progress, ☑ done (here and in the TUI).
pub fn todo_mark(status: TodoStatus) -> &'static str {
    match status {
        TodoStatus::Pending => "☐",
        TodoStatus::InProgress => "◐",
        TodoStatus::Completed => "☑",
    }
}

/// `⚠ skill `name`: what is wrong [rule] (path)`.
fn skill_warning(warning: &Value) -> String {
    let field = |key: &str| warning[key].as_str().unwrap_or_default();
    format!(
        "⚠ skill `{}`: {} [{}] ({})",
        field("skill"),
        field("message"),
        field("rule"),
        field("path")
    )
}

fn preview(text: &str) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= PREVIEW {
        flat
    } else {
        let cut: String = flat.chars().take(PREVIEW).collect();
        format!("{cut}…")
    }
}
