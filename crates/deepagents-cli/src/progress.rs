//! Human-readable progress on stderr.

use std::collections::HashMap;

use deepagents::core::{AgentPath, Event, EventKind};
use deepagents::{ContentBlock, TodoStatus, ToolStatus};
use serde_json::Value;

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
                    eprintln!("{indent}› {}", narration.trim());
                }
            }
            EventKind::ToolCallStarted {
                name, arguments, ..
            } => eprintln!("{indent}▸ {name} {}", preview(&arguments.to_string())),
            EventKind::ToolCallFinished {
                name,
                status,
                content,
                duration_ms,
                ..
            } => match status {
                ToolStatus::Ok => eprintln!("{indent}  ✓ {name} ({duration_ms} ms)"),
                ToolStatus::Error => {
                    let text: String = content.iter().filter_map(ContentBlock::as_text).collect();
                    eprintln!("{indent}  ✗ {name}: {}", preview(&text));
                }
            },
            EventKind::StateUpdated { todos, custom, .. } => {
                for todo in todos.iter().flatten() {
                    let mark = match todo.status {
                        TodoStatus::Pending => "☐",
                        TodoStatus::InProgress => "◐",
                        TodoStatus::Completed => "☑",
                    };
                    eprintln!("{indent}  {mark} {}", todo.content);
                }
                // Set once per thread, when the skills are loaded.
                if let Some(warnings) = custom.get("skill_warnings").and_then(Value::as_array) {
                    for warning in warnings {
                        eprintln!("{indent}{}", skill_warning(warning));
                    }
                }
            }
            EventKind::Summarized {
                replaced,
                history_file,
                ..
            } => eprintln!(
                "{indent}⋯ summarized {replaced} earlier message{} (transcript in {history_file})",
                if *replaced == 1 { "" } else { "s" }
            ),
            _ => {}
        }
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
