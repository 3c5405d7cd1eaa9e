//! Summarization: when the conversation nears the context window, older messages are replaced
//! by a structured summary in what the model sees; the run keeps every message, and the
//! replaced transcript is appended to a history file the model can read.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use deepagents_backends::{Backend, BackendContext, VPath};
use deepagents_core::{
    AgentState, ContentBlock, DynTool, Message, Model, ModelError, ModelRequest, ModelResponse,
    Reducer, StateUpdate, Tool, ToolContext, ToolError, ToolOutput, TypedTool,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Middleware, MiddlewareError, ModelNext};
use crate::context::{RunningEstimate, estimate_fixed, estimate_messages, estimate_tokens};
use crate::tools::output::truncate_chars;

/// The custom state key holding the summary marker.
pub const SUMMARY_KEY: &str = "summary";
/// Where replaced transcripts are appended.
pub const HISTORY_DIR: &str = "/conversation_history";

/// A size in tokens, in messages, or as a fraction of the context window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Threshold {
    /// Tokens (estimated).
    Tokens(u64),
    /// Messages.
    Messages(usize),
    /// A fraction of the model's context window.
    Fraction(f64),
}

/// When to summarize and how much recent conversation to keep.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SummarizationConfig {
    /// Summarize once the request passes this.
    pub trigger: Threshold,
    /// Keep at least this much of the most recent conversation verbatim.
    pub keep: Threshold,
}

impl SummarizationConfig {
    /// The defaults: trigger at 85 % of a known window and keep 10 % of it; for an unknown
    /// window, trigger at 170,000 tokens and keep 6 messages.
    pub fn default_for(window: Option<u64>) -> Self {
        match window {
            Some(_) => Self {
                trigger: Threshold::Fraction(0.85),
                keep: Threshold::Fraction(0.10),
            },
            None => Self {
                trigger: Threshold::Tokens(170_000),
                keep: Threshold::Messages(6),
            },
        }
    }
}

/// What the run records of past summarizations.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct SummaryMarker {
    /// `messages[..upto]` are replaced by the summary in requests.
    upto: usize,
    /// The summary text.
    text: String,
    /// The file holding the replaced transcripts.
    history_file: String,
    /// How many summarizations led here.
    count: u32,
}

const SUMMARIZER_PROMPT: &str = "\
You compress an agent's conversation so it can continue with less context. Write a summary \
with exactly these sections:
## Goal
What the user wants, in their terms.
## Decisions
Choices made and why, including approaches rejected.
## Files and artifacts
Paths created, changed or read that matter, with one line each on their state.
## Open items
What is unfinished, failing or uncertain.
## Next step
The single next action.
Be specific and brief: keep names, paths, numbers and error messages exact. Do not invent \
anything.";

/// Summarizes older messages when a request nears the context window. Its name is
/// `summarization`.
pub struct SummarizationMiddleware {
    model: Arc<dyn Model>,
    backend: Arc<dyn Backend>,
    window: u64,
    config: SummarizationConfig,
    /// A summary made while retrying an overflowing call, to record in the state next step.
    pending: Mutex<Option<StateUpdate>>,
    /// A trigger learned from a provider's overflow error: the estimate was too optimistic.
    learned_trigger: Mutex<Option<u64>>,
    /// Running estimate of the visible messages, so deciding costs the same at any history
    /// length.
    counted: RunningEstimate,
    /// The opt-in `compact_conversation` tool.
    compact_tool: Option<Arc<dyn DynTool>>,
    /// The latest estimate, and the correction learned from the provider's reported usage
    /// (reported ÷ estimated input tokens, smoothed), so triggers follow the real tokenizer.
    calibration: Mutex<Calibration>,
}

#[derive(Clone, Copy, Debug)]
struct Calibration {
    last_estimate: u64,
    factor: f64,
}

/// The custom state key set when the model asked to compact.
pub const COMPACT_KEY: &str = "compact_requested";

/// `compact_conversation`: summarize now instead of at the trigger.
struct CompactConversation {
    trigger_tokens: u64,
}

/// Arguments of `compact_conversation` (none).
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CompactArgs {}

impl Tool for CompactConversation {
    type Args = CompactArgs;

    fn name(&self) -> &str {
        "compact_conversation"
    }

    fn description(&self) -> String {
        "Summarize the earlier conversation now to free context, for example before a large new          phase of work. The full transcript stays readable in /conversation_history/. Refused          when less than half of the context budget is in use."
            .to_owned()
    }

    async fn call(&self, _args: CompactArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let marker = marker_of(&ctx.state);
        let used = estimate_messages(&visible(&marker, &ctx.state.messages));
        if used < self.trigger_tokens / 2 {
            return Err(ToolError::RespondToModel(format!(
                "The conversation uses about {used} tokens, under half of the {} at which it is compacted; compacting now would save little. Carry on.",
                self.trigger_tokens
            )));
        }
        Ok(
            ToolOutput::text("The conversation will be compacted before your next step.")
                .with_update(StateUpdate::default().with_custom(COMPACT_KEY, Value::Bool(true))),
        )
    }
}

impl SummarizationMiddleware {
    /// Summarization for a model whose window holds `window` tokens (`None`: unknown).
    pub fn new(
        model: Arc<dyn Model>,
        backend: Arc<dyn Backend>,
        window: Option<u64>,
        config: Option<SummarizationConfig>,
    ) -> Self {
        Self {
            model,
            backend,
            window: window.unwrap_or(crate::context::FALLBACK_CONTEXT_TOKENS),
            config: config.unwrap_or_else(|| SummarizationConfig::default_for(window)),
            pending: Mutex::new(None),
            learned_trigger: Mutex::new(None),
            counted: RunningEstimate::default(),
            compact_tool: None,
            calibration: Mutex::new(Calibration {
                last_estimate: 0,
                factor: 1.0,
            }),
        }
    }

    /// Also offers the `compact_conversation` tool.
    pub fn with_compact_tool(mut self) -> Self {
        let trigger_tokens = self
            .tokens_of(self.config.trigger)
            .unwrap_or((self.window as f64 * 0.85) as u64);
        self.compact_tool = Some(Arc::new(TypedTool::new(CompactConversation {
            trigger_tokens,
        })));
        self
    }

    fn tokens_of(&self, threshold: Threshold) -> Option<u64> {
        match threshold {
            Threshold::Tokens(tokens) => Some(tokens),
            Threshold::Fraction(fraction) => Some((self.window as f64 * fraction) as u64),
            Threshold::Messages(_) => None,
        }
    }

    /// Tokens of the messages a request shows under `marker`, counting only messages added
    /// since the last call (messages are only ever appended).
    fn visible_tokens(&self, marker: &SummaryMarker, messages: &[Message]) -> u64 {
        let start = marker.upto.min(messages.len());
        let tokens = self.counted.messages_from(messages, start);
        let summary = if start > 0 {
            estimate_messages(&visible(marker, &messages[..start.min(messages.len())]))
        } else {
            0
        };
        tokens + summary
    }

    /// Whether a request of `tokens` over `messages` messages should be summarized.
    fn triggered(&self, tokens: u64, messages: usize) -> bool {
        let learned = *self
            .learned_trigger
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if learned.is_some_and(|limit| tokens > limit) {
            return true;
        }
        match self.config.trigger {
            Threshold::Messages(limit) => messages > limit,
            other => self.tokens_of(other).is_some_and(|limit| tokens > limit),
        }
    }

    /// The first kept message: enough recent messages to satisfy `keep`, never separating a
    /// tool result from the call that asked for it.
    fn cut(&self, messages: &[Message], from: usize) -> usize {
        let mut cut = messages.len();
        match self.config.keep {
            Threshold::Messages(keep) => cut = messages.len().saturating_sub(keep),
            other => {
                // A tail as large as the trigger would leave nothing to gain: keep at most half.
                let learned = *self
                    .learned_trigger
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                let trigger = [self.tokens_of(self.config.trigger), learned]
                    .into_iter()
                    .flatten()
                    .min();
                let mut budget = self.tokens_of(other).unwrap_or(0);
                if let Some(trigger) = trigger {
                    budget = budget.min(trigger / 2);
                }
                let mut kept = 0;
                while cut > from {
                    let cost = estimate_tokens(&ModelRequest {
                        messages: vec![messages[cut - 1].clone()],
                        ..ModelRequest::default()
                    });
                    if kept + cost > budget {
                        break;
                    }
                    kept += cost;
                    cut -= 1;
                }
            }
        }
        while cut > from && matches!(messages.get(cut), Some(Message::Tool(_))) {
            cut -= 1;
        }
        cut.max(from)
    }

    /// Summarizes `messages[marker.upto..cut]` (after the previous summary) and appends them to
    /// the history file. Returns the new marker and the file changes.
    async fn summarize(
        &self,
        state: &AgentState,
        marker: &SummaryMarker,
        cut: usize,
        history_file: String,
    ) -> Result<(SummaryMarker, StateUpdate), String> {
        let replaced = &state.messages[marker.upto..cut];
        let transcript = render(replaced, marker.upto);
        let mut input = String::new();
        if !marker.text.is_empty() {
            let _ = write!(
                input,
                "Summary of the conversation before this part:\n{}\n\n",
                marker.text
            );
        }
        // The summarizer's own input must fit: half the window at most, head and tail kept.
        let budget_chars = usize::try_from(self.window / 2 * 4).unwrap_or(usize::MAX);
        let _ = write!(
            input,
            "Conversation to summarize:\n{}",
            clip_middle(&transcript, budget_chars)
        );
        let request = ModelRequest {
            system_prompt: Some(SUMMARIZER_PROMPT.to_owned()),
            messages: vec![Message::user(input)],
            ..ModelRequest::default()
        };
        let response = self
            .model
            .generate(&request)
            .await
            .map_err(|e| format!("the summarizer failed: {e}"))?;
        let text = Message::Assistant(response.message)
            .text()
            .trim()
            .to_owned();
        if text.is_empty() {
            return Err("the summarizer returned nothing".to_owned());
        }
        let update = self
            .append_history(state, &history_file, &transcript)
            .await?;
        let next = SummaryMarker {
            upto: cut,
            text,
            history_file,
            count: marker.count + 1,
        };
        Ok((next, update))
    }

    async fn append_history(
        &self,
        state: &AgentState,
        path: &str,
        transcript: &str,
    ) -> Result<StateUpdate, String> {
        let path = VPath::parse(path).map_err(|e| e.to_string())?;
        let cx = BackendContext::with_state(Arc::new(state.clone()));
        let mut text = match self.backend.read_raw(&cx, &path).await {
            Ok(raw) => String::from_utf8_lossy(&raw.data).into_owned(),
            Err(_) => {
                "# Conversation history\nMessages replaced by summaries, oldest first.\n".to_owned()
            }
        };
        text.push('\n');
        text.push_str(transcript);
        let changed = self
            .backend
            .write(&cx, &path, &text)
            .await
            .map_err(|e| format!("cannot write the history file: {e}"))?;
        Ok(changed.update)
    }
}

/// Messages as markdown, numbered by their index in the run.
fn render(messages: &[Message], first_index: usize) -> String {
    let mut out = String::new();
    for (offset, message) in messages.iter().enumerate() {
        let index = first_index + offset;
        let _ = match message {
            Message::System { .. } => writeln!(out, "### [{index}] system\n{}\n", message.text()),
            Message::User { .. } => writeln!(out, "### [{index}] user\n{}\n", message.text()),
            Message::Assistant(assistant) => {
                let _ = writeln!(out, "### [{index}] assistant\n{}", message.text());
                for call in &assistant.tool_calls {
                    let _ = writeln!(
                        out,
                        "- call `{}` ({}): {}",
                        call.name, call.id, call.arguments
                    );
                }
                writeln!(out)
            }
            Message::Tool(result) => writeln!(
                out,
                "### [{index}] tool `{}` ({:?}, {})\n{}\n",
                result.name,
                result.status,
                result.tool_call_id,
                message.text()
            ),
        };
        for block in message_blocks(message) {
            if block.as_text().is_none() {
                let _ = writeln!(out, "(binary content omitted)\n");
            }
        }
    }
    out
}

fn message_blocks(message: &Message) -> &[ContentBlock] {
    match message {
        Message::System { content } | Message::User { content } => content,
        Message::Assistant(assistant) => &assistant.content,
        Message::Tool(result) => &result.content,
    }
}

/// At most `max` characters of `text`: its start and its end, with a note between.
fn clip_middle(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let head = truncate_chars(text, max / 5);
    let tail_start = text
        .char_indices()
        .map(|(i, _)| i)
        .find(|&i| text.len() - i <= max - head.len())
        .unwrap_or(text.len());
    format!(
        "{head}\n[… middle of the conversation omitted to fit …]\n{}",
        &text[tail_start..]
    )
}

fn marker_of(state: &AgentState) -> SummaryMarker {
    state
        .custom
        .get(SUMMARY_KEY)
        .and_then(|v| serde_json::from_value(v.clone()).ok())
        .unwrap_or_default()
}

/// The messages a request carries under `marker`: the summary, then what follows it.
fn visible(marker: &SummaryMarker, messages: &[Message]) -> Vec<Message> {
    if marker.upto == 0 || marker.text.is_empty() {
        return messages.to_vec();
    }
    let mut out = Vec::with_capacity(messages.len().saturating_sub(marker.upto) + 1);
    out.push(Message::user(format!(
        "[Earlier conversation, summarized. The full transcript is in {}; read it with read_file if you need details.]\n\n{}",
        marker.history_file, marker.text
    )));
    out.extend(messages.iter().skip(marker.upto).cloned());
    out
}

#[async_trait]
impl Middleware for SummarizationMiddleware {
    fn name(&self) -> &str {
        "summarization"
    }

    fn state_values(&self) -> Vec<(String, Reducer)> {
        vec![
            (SUMMARY_KEY.to_owned(), Reducer::Replace),
            (COMPACT_KEY.to_owned(), Reducer::Replace),
        ]
    }

    fn tools(&self) -> Vec<Arc<dyn DynTool>> {
        self.compact_tool.iter().cloned().collect()
    }

    async fn prepare_model_call(
        &self,
        request: &ModelRequest,
        state: &AgentState,
    ) -> Result<StateUpdate, MiddlewareError> {
        // A summary made while retrying an overflow is recorded first.
        let mut update = self
            .pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .unwrap_or_default();
        let marker = marker_of(state);
        let estimate = estimate_fixed(request) + self.visible_tokens(&marker, &state.messages);
        let tokens = {
            let mut calibration = self
                .calibration
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            calibration.last_estimate = estimate;
            (estimate as f64 * calibration.factor) as u64
        };
        let shown_messages = state.messages.len() - marker.upto.min(state.messages.len())
            + usize::from(marker.upto > 0);
        let requested = state.custom.get(COMPACT_KEY) == Some(&Value::Bool(true));
        if requested {
            update
                .custom
                .insert(COMPACT_KEY.to_owned(), Value::Bool(false));
        }
        if !requested && !self.triggered(tokens, shown_messages) {
            return Ok(update);
        }
        let cut = self.cut(&state.messages, marker.upto);
        if cut <= marker.upto {
            return Ok(update);
        }
        let history_file = if marker.history_file.is_empty() {
            format!("{HISTORY_DIR}/session.md")
        } else {
            marker.history_file.clone()
        };
        match self.summarize(state, &marker, cut, history_file).await {
            Ok((next, summarized)) => {
                let value =
                    serde_json::to_value(&next).map_err(|e| MiddlewareError(e.to_string()))?;
                update.files.extend(summarized.files);
                update.custom.insert(SUMMARY_KEY.to_owned(), value);
                Ok(update)
            }
            // The call may still fit; if it does not, the overflow path retries.
            Err(reason) => {
                tracing::warn!(target: "deepagents::summarization", "{reason}");
                Ok(update)
            }
        }
    }

    async fn before_model(
        &self,
        request: &mut ModelRequest,
        state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        let marker = marker_of(state);
        if marker.upto > 0 && request.messages.len() >= marker.upto {
            request.messages = visible(&marker, &request.messages);
        }
        Ok(())
    }

    async fn after_model(
        &self,
        response: &mut ModelResponse,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        let reported = response.usage.input_tokens;
        let mut calibration = self
            .calibration
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if reported > 0 && calibration.last_estimate > 0 {
            let ratio = (reported as f64 / calibration.last_estimate as f64).clamp(0.25, 4.0);
            calibration.factor = 0.7 * calibration.factor + 0.3 * ratio;
        }
        Ok(())
    }

    async fn wrap_model_call(
        &self,
        request: ModelRequest,
        next: ModelNext<'_>,
    ) -> Result<ModelResponse, ModelError> {
        match next.call(request.clone()).await {
            Err(ModelError::ContextWindowExceeded { message }) => {
                // The estimate undercounted: summarize earlier from now on.
                let estimate = estimate_tokens(&request);
                *self
                    .learned_trigger
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(estimate * 4 / 5);
                // Summarize everything but the recent tail of what was sent, and retry once.
                // The run's history file is not at hand here, so this transcript gets its own.
                let state = AgentState {
                    messages: request.messages.clone(),
                    ..AgentState::default()
                };
                // Keep at most the latest exchange: the provider has already said no once.
                let mut cut = self
                    .cut(&request.messages, 0)
                    .max(request.messages.len().saturating_sub(2));
                while cut > 0 && matches!(request.messages.get(cut), Some(Message::Tool(_))) {
                    cut -= 1;
                }
                let history_file = format!(
                    "{HISTORY_DIR}/overflow-{}.md",
                    deepagents_backends::memory::now_ms()
                );
                let (marker, update) = self
                    .summarize(&state, &SummaryMarker::default(), cut, history_file)
                    .await
                    .map_err(|reason| ModelError::ContextWindowExceeded {
                        message: format!("{message}; summarizing to make room failed: {reason}"),
                    })?;
                let retried = ModelRequest {
                    messages: visible(&marker, &request.messages),
                    ..request
                };
                let response = next.call(retried).await.map_err(|error| match error {
                    ModelError::ContextWindowExceeded { message } => ModelError::ContextWindowExceeded {
                        message: format!("{message} (even after summarizing the conversation; raise the window or shorten the task)"),
                    },
                    other => other,
                })?;
                // The history file was written; the state learns of it at the next step.
                *self.pending.lock().unwrap_or_else(PoisonError::into_inner) = Some(update);
                Ok(response)
            }
            other => other,
        }
    }
}
