//! Large tool results go to the filesystem; the model gets the path and a preview.

use std::sync::Arc;

use async_trait::async_trait;
use std::collections::BTreeMap;

use deepagents_backends::{Backend, BackendContext, VPath};
use deepagents_core::{
    AgentState, ContentBlock, Message, ModelRequest, Reducer, RunContext, StateKey, StateUpdate,
    ToolCall, ToolContext, ToolError, ToolOutput,
};
use serde::{Deserialize, Serialize};

use super::{Middleware, MiddlewareError, ToolNext};
use crate::tools::filesystem::backend_context;
use crate::tools::output::truncate_chars;

/// Results over this many characters are offloaded (about 20,000 tokens).
pub const DEFAULT_OFFLOAD_THRESHOLD: usize = 80_000;

/// Where offloaded results are written.
pub const LARGE_RESULTS_DIR: &str = "/large_tool_results";

/// User messages over this many characters (about 50,000 tokens) are offloaded too.
pub const LARGE_INPUT_THRESHOLD: usize = 200_000;

/// The custom state key recording offloaded user messages.
pub const LARGE_INPUTS_KEY: &str = "large_inputs";

/// Offloaded user messages: the file of each by its index in the conversation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct LargeInputs {
    files: BTreeMap<usize, String>,
}

/// The offloaded user messages, typed.
const LARGE_INPUTS: StateKey<LargeInputs> = StateKey::new(LARGE_INPUTS_KEY);

/// What the model is shown of a long user message saved to `path`.
fn saved_input(path: &str, text: &str) -> Message {
    Message::user(format!(
        "[A long message ({} characters) was saved to {path}; read it in pages with read_file or search it with grep.]\n\nPreview:\n{}",
        text.len(),
        preview(text)
    ))
}

/// `messages` (the start of `state`'s conversation) with the long user messages recorded in
/// `state` as saved, the way requests show them.
pub(crate) fn with_saved_inputs(state: &AgentState, mut messages: Vec<Message>) -> Vec<Message> {
    let inputs = LARGE_INPUTS.get(state).ok().flatten().unwrap_or_default();
    for (index, path) in inputs.files {
        if let Some(message @ Message::User { .. }) = messages.get_mut(index) {
            *message = saved_input(&path, &message.text());
        }
    }
    messages
}

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
/// context. The file tools are exempt. User messages over [`LARGE_INPUT_THRESHOLD`] characters
/// are written to `/conversation_history/input-<n>.md` and shown to the model as a preview
/// (the run keeps them whole). Its name is `large_results`.
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

    fn state_values(&self) -> Vec<(String, Reducer)> {
        vec![(LARGE_INPUTS_KEY.to_owned(), Reducer::Replace)]
    }

    async fn prepare_model_call(
        &self,
        ctx: &RunContext,
        _request: &ModelRequest,
        state: &AgentState,
    ) -> Result<StateUpdate, MiddlewareError> {
        let mut inputs = LARGE_INPUTS.get(state)?.unwrap_or_default();
        let mut update = StateUpdate::default();
        let mut cx = None;
        // User input arrives after the latest assistant turn, so only that stretch is new.
        let latest = state
            .messages
            .iter()
            .enumerate()
            .rev()
            .take_while(|(_, m)| !matches!(m, Message::Assistant(_)));
        for (index, message) in latest {
            if !matches!(message, Message::User { .. }) || inputs.files.contains_key(&index) {
                continue;
            }
            let text = message.text();
            if text.len() <= LARGE_INPUT_THRESHOLD {
                continue;
            }
            let Ok(path) = VPath::parse(&format!("/conversation_history/input-{index}.md")) else {
                continue;
            };
            let cx =
                cx.get_or_insert_with(|| BackendContext::for_run(ctx, Arc::new(state.clone())));
            // If saving fails the message goes whole, as the user sent it.
            if let Ok(changed) = self.backend.overwrite(cx, &path, &text).await {
                update.files.extend(changed.update.files);
                inputs.files.insert(index, path.to_string());
            }
        }
        if update.files.is_empty() {
            return Ok(update);
        }
        LARGE_INPUTS.set(&mut update, &inputs)?;
        Ok(update)
    }

    async fn before_model(
        &self,
        _ctx: &RunContext,
        request: &mut ModelRequest,
        state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        let inputs = LARGE_INPUTS.get(state)?.unwrap_or_default();
        for (index, path) in inputs.files {
            if let Some(message @ Message::User { .. }) = request.messages.get_mut(index) {
                *message = saved_input(&path, &message.text());
            }
        }
        Ok(())
    }

    async fn wrap_tool_call(
        &self,
        call: ToolCall,
        ctx: ToolContext,
        next: ToolNext,
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
        match self.backend.overwrite(&cx, &path, &text).await {
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
