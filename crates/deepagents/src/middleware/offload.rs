//! Large tool results go to the filesystem; the model gets the path and a preview.

use std::sync::Arc;

use async_trait::async_trait;
use deepagents_backends::{Backend, VPath};
use deepagents_core::{ContentBlock, ToolCall, ToolContext, ToolError, ToolOutput};

use super::{Middleware, ToolNext};
use crate::tools::filesystem::backend_context;
use crate::tools::output::truncate_chars;

/// Results over this many characters are offloaded (about 20,000 tokens).
pub const DEFAULT_OFFLOAD_THRESHOLD: usize = 80_000;

/// Where offloaded results are written.
pub const LARGE_RESULTS_DIR: &str = "/large_tool_results";

/// Tools whose output is already paged and capped.
const EXEMPT: &[&str] = &[
    "ls",
    "read_file",
    "write_file",
    "edit_file",
    "delete",
    "glob",
    "grep",
];

/// Lines of the head and of the tail shown in the preview, and their longest length.
const PREVIEW_LINES: usize = 5;
const PREVIEW_LINE_CHARS: usize = 1_000;

/// Writes any tool result longer than a threshold to `/large_tool_results/<call id>` and
/// replaces it with the path and a head-and-tail preview, so one result cannot flood the
/// context. The file tools are exempt. Its name is `large_results`.
pub struct LargeResultsMiddleware {
    backend: Arc<dyn Backend>,
    threshold: usize,
}

impl LargeResultsMiddleware {
    /// Offloads to `backend` above `threshold` characters.
    pub fn new(backend: Arc<dyn Backend>, threshold: usize) -> Self {
        Self { backend, threshold }
    }
}

fn preview(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let clip = |line: &&str| truncate_chars(line, PREVIEW_LINE_CHARS).to_owned();
    if lines.len() <= PREVIEW_LINES * 2 {
        return lines.iter().map(clip).collect::<Vec<_>>().join("\n");
    }
    let head: Vec<String> = lines[..PREVIEW_LINES].iter().map(clip).collect();
    let tail: Vec<String> = lines[lines.len() - PREVIEW_LINES..]
        .iter()
        .map(clip)
        .collect();
    format!(
        "{}\n[… {} lines omitted …]\n{}",
        head.join("\n"),
        lines.len() - PREVIEW_LINES * 2,
        tail.join("\n")
    )
}

#[async_trait]
impl Middleware for LargeResultsMiddleware {
    fn name(&self) -> &str {
        "large_results"
    }

    async fn wrap_tool_call(
        &self,
        call: ToolCall,
        ctx: ToolContext,
        next: ToolNext<'_>,
    ) -> Result<ToolOutput, ToolError> {
        let exempt = EXEMPT.contains(&call.name.as_str());
        let cx = backend_context(&ctx);
        let call_id = call.id.clone();
        let mut output = next.call(call, ctx).await?;
        let text: String = output
            .content
            .iter()
            .filter_map(ContentBlock::as_text)
            .collect();
        if exempt || text.len() <= self.threshold {
            return Ok(output);
        }
        // Call ids come from providers: keep only characters that are safe in a file name.
        let safe_id: String = call_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let Ok(path) = VPath::parse(&format!("{LARGE_RESULTS_DIR}/{safe_id}")) else {
            return Ok(output);
        };
        match self.backend.write(&cx, &path, &text).await {
            Ok(changed) => {
                let lines = text.lines().count();
                let notice = format!(
                    "The result was too large to show ({} characters, {lines} lines) and was saved to {path}. Read it in pages with read_file or search it with grep.\n\nPreview:\n{}",
                    text.len(),
                    preview(&text)
                );
                let mut content = vec![ContentBlock::text(notice)];
                content.extend(output.content.into_iter().filter(|b| b.as_text().is_none()));
                output.content = content;
                output.update.files.extend(changed.update.files);
                Ok(output)
            }
            Err(error) => {
                let notice = format!(
                    "{}\n\n[Result cut at {} of {} characters: saving it whole failed ({error}).]",
                    truncate_chars(&text, self.threshold),
                    self.threshold,
                    text.len()
                );
                let mut content = vec![ContentBlock::text(notice)];
                content.extend(output.content.into_iter().filter(|b| b.as_text().is_none()));
                output.content = content;
                Ok(output)
            }
        }
    }
}
