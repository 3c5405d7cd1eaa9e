//! Summarization: when the conversation nears the context window, older messages are replaced
//! by a structured summary in what the model sees; the run keeps every message, and the
//! replaced transcript is appended to a history file the model can read.

use std::collections::hash_map::{DefaultHasher, RandomState};
use std::fmt::Write as _;
use std::hash::{BuildHasher as _, Hash as _, Hasher as _};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use deepagents_backends::{Backend, BackendContext, VPath};
use deepagents_core::event::SummaryTrigger;
use deepagents_core::{
    AgentState, ContentBlock, DynTool, EventKind, Message, Model, ModelError, ModelRequest,
    ModelResponse, Reducer, RunContext, StateKey, StateUpdate, Tool, ToolContext, ToolError,
    ToolOutput, TypedTool,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Middleware, MiddlewareError, ModelNext};
use crate::context::{RunningEstimate, estimate_fixed, estimate_messages, estimate_tokens};
use crate::tools::output::truncate_chars;

/// The custom state key holding the summary marker.
pub const SUMMARY_KEY: &str = "summary";
/// Where replaced transcripts are appended: `<thread id>.md` for a run on a thread, else a
/// name made at the first summarization and kept with the run.
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
    /// A trigger learned from a provider's overflow error: requests over it are summarized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    learned_trigger: Option<u64>,
}

/// The summary marker, typed.
const SUMMARY: StateKey<SummaryMarker> = StateKey::new(SUMMARY_KEY);
/// Whether the model asked to compact, typed.
const COMPACT: StateKey<bool> = StateKey::new(COMPACT_KEY);

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
    /// The opt-in `compact_conversation` tool.
    compact_tool: Option<Arc<dyn DynTool>>,
    /// The user's hooks, for `PreCompact`.
    hooks: Option<super::Hooks>,
}

/// `RunOptions::compact_first`: summarize before the run's first model call (cleared once
/// acted on).
pub(crate) struct CompactFirst(std::sync::atomic::AtomicBool);

impl Default for CompactFirst {
    fn default() -> Self {
        Self(std::sync::atomic::AtomicBool::new(true))
    }
}

/// What summarization remembers during one run, in the run's extensions: one agent serves
/// many runs at once, and each run's hooks are called one after another.
#[derive(Default)]
struct PerRun(Mutex<RunMemory>);

#[derive(Default)]
struct RunMemory {
    /// A summary `prepare_model_call` made, announced when its request goes out (the first
    /// hook that sees the request is `wrap_model_call`).
    announce: Option<EventKind>,
    /// The run as `before_model` saw it, for `wrap_model_call`'s overflow recovery.
    view: Option<CallView>,
    /// A summary made on overflow, for the next `prepare_model_call` to record.
    pending: Option<Pending>,
    /// A trigger learned from a provider's overflow error in this run (the estimate was too
    /// optimistic); recorded in the marker so later runs of the thread keep it.
    learned_trigger: Option<u64>,
    /// Running estimate of the visible messages, so deciding costs the same at any history
    /// length.
    counted: RunningEstimate,
    /// The latest estimate, and the correction learned from the provider's reported usage.
    calibration: Calibration,
}

impl PerRun {
    fn of(ctx: &RunContext) -> Arc<Self> {
        ctx.extensions.get_or_insert_with(Self::default)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RunMemory> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The latest estimate, and the correction learned from the provider's reported usage
/// (reported ÷ estimated input tokens, smoothed), so triggers follow the real tokenizer.
#[derive(Clone, Copy, Debug)]
struct Calibration {
    last_estimate: u64,
    factor: f64,
}

impl Default for Calibration {
    fn default() -> Self {
        Self {
            last_estimate: 0,
            factor: 1.0,
        }
    }
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
        "Summarize the earlier conversation now to free context, for example before a large new \
         phase of work. The full transcript stays readable in /conversation_history/. Refused \
         when less than half of the context budget is in use."
            .to_owned()
    }

    async fn call(&self, _args: CompactArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let marker = SUMMARY
            .get(&ctx.state)
            .map_err(|e| ToolError::Fatal(e.to_string()))?
            .unwrap_or_default();
        let used = estimate_messages(&visible(&marker, &ctx.state.messages));
        if used < self.trigger_tokens / 2 {
            return Err(ToolError::RespondToModel(format!(
                "The conversation uses about {used} tokens, under half of the {} at which it is compacted; compacting now would save little. Carry on.",
                self.trigger_tokens
            )));
        }
        Ok(
            ToolOutput::text("The conversation will be compacted before your next step.")
                .with_update(
                    COMPACT
                        .update(&true)
                        .map_err(|e| ToolError::Fatal(e.to_string()))?,
                ),
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
            compact_tool: None,
            hooks: None,
        }
    }

    /// Runs the `PreCompact` hooks of `hooks` before each summary.
    pub fn with_hooks(mut self, hooks: super::Hooks) -> Self {
        self.hooks = Some(hooks);
        self
    }

    async fn announce_compaction(&self, ctx: &RunContext, manual: bool) {
        if let Some(hooks) = &self.hooks {
            hooks
                .pre_compact(ctx, if manual { "manual" } else { "auto" })
                .await;
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
    fn visible_tokens(
        counted: &RunningEstimate,
        marker: &SummaryMarker,
        messages: &[Message],
    ) -> u64 {
        let start = marker.upto.min(messages.len());
        let tokens = counted.messages_from(messages, start);
        let summary = if start > 0 {
            estimate_messages(&visible(marker, &messages[..start.min(messages.len())]))
        } else {
            0
        };
        tokens + summary
    }

    /// Whether a request of `tokens` over `messages` messages should be summarized, given a
    /// trigger `learned` from an overflow.
    fn triggered(&self, tokens: u64, messages: usize, learned: Option<u64>) -> bool {
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
    fn cut(&self, messages: &[Message], from: usize, learned: Option<u64>) -> usize {
        let mut cut = messages.len();
        match self.config.keep {
            Threshold::Messages(keep) => cut = messages.len().saturating_sub(keep),
            other => {
                // A tail as large as the trigger would leave nothing to gain: keep at most half.
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
                        messages: vec![messages[cut - 1].clone()].into(),
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
        // The latest exchange (the newest assistant turn, its tool results and anything after)
        // always stays verbatim: a model that sees only a summary of the result it just asked
        // for would ask again.
        if let Some(latest) = messages[from.min(messages.len())..]
            .iter()
            .rposition(|m| matches!(m, Message::Assistant(_)))
        {
            cut = cut.min(from + latest);
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
        ctx: &RunContext,
        state: &AgentState,
        marker: &SummaryMarker,
        cut: usize,
        history_file: String,
    ) -> Result<(SummaryMarker, StateUpdate), String> {
        let transcript = render(&state.messages[marker.upto..cut], marker.upto);
        let factor = PerRun::of(ctx).lock().calibration.factor;
        let text = self
            .summary_of(ctx, factor, &marker.text, &transcript)
            .await?;
        let update = self
            .append_history(ctx, state, &history_file, &transcript)
            .await?;
        let next = SummaryMarker {
            upto: cut,
            text,
            history_file,
            count: marker.count + 1,
            learned_trigger: marker.learned_trigger,
        };
        Ok((next, update))
    }

    /// Asks the model for a summary of `transcript`, continuing `previous`; `factor` is the
    /// run's calibration (reported ÷ estimated tokens).
    async fn summary_of(
        &self,
        ctx: &RunContext,
        factor: f64,
        previous: &str,
        transcript: &str,
    ) -> Result<String, String> {
        // The summarizer's own input must fit the window however long the conversation got:
        // the previous summary gets an eighth of it and the transcript half (head and tail
        // kept), which leaves room for the instructions and the answer. A provider that counts
        // more tokens than the estimate (see the calibration) gets proportionally less.
        let factor = factor.max(1.0);
        let chars_for = |tokens: u64| (tokens as f64 * 4.0 / factor) as usize;
        let mut input = String::new();
        if !previous.is_empty() {
            let _ = write!(
                input,
                "Summary of the conversation before this part:\n{}\n\n",
                clip_middle(previous, chars_for(self.window / 8))
            );
        }
        let _ = write!(
            input,
            "Conversation to summarize:\n{}",
            clip_middle(transcript, chars_for(self.window / 2))
        );
        let request = ModelRequest {
            system_prompt: Some(SUMMARIZER_PROMPT.to_owned()),
            messages: vec![Message::user(input)].into(),
            ..ModelRequest::default()
        };
        let response = self
            .model
            .generate(&request)
            .await
            .map_err(|e| format!("the summarizer failed: {e}"))?;
        // Summaries are model calls too: they count against the run's spend caps.
        ctx.budget.charge(self.model.id(), response.usage);
        let text = Message::Assistant(response.message)
            .text()
            .trim()
            .to_owned();
        if text.is_empty() {
            return Err("the summarizer returned nothing".to_owned());
        }
        Ok(text)
    }

    async fn append_history(
        &self,
        ctx: &RunContext,
        state: &AgentState,
        path: &str,
        transcript: &str,
    ) -> Result<StateUpdate, String> {
        let path = VPath::parse(path).map_err(|e| e.to_string())?;
        let cx = BackendContext::for_run(ctx, Arc::new(state.clone()));
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
            .overwrite(&cx, &path, &text)
            .await
            .map_err(|e| format!("cannot write the history file: {e}"))?;
        Ok(changed.update)
    }

    /// Summarizes the request that overflowed and retries it once. The summary is written
    /// down at the run's next step (`prepare_model_call`), where the state is at hand.
    async fn recover(
        &self,
        request: ModelRequest,
        message: String,
        view: Option<CallView>,
        next: ModelNext,
    ) -> Result<ModelResponse, ModelError> {
        let ctx = next.context().clone();
        let per_run = PerRun::of(&ctx);
        // The estimate undercounted: summarize earlier from now on.
        let learned = estimate_tokens(&request) * 4 / 5;
        let factor = {
            let mut memory = per_run.lock();
            memory.learned_trigger = Some(learned);
            memory.calibration.factor
        };
        let (marker, run_len) = match &view {
            Some(view) => (view.marker.clone(), Some(view.run_len)),
            None => (SummaryMarker::default(), None),
        };
        let messages = &request.messages;
        // The run's own messages follow our summary when one leads the request.
        let summarized = marker.upto > 0 && !marker.text.is_empty();
        let start = usize::from(summarized).min(messages.len());
        let base = if summarized { marker.upto } else { 0 };
        // Keep at most the latest exchange: the provider has already said no once.
        let mut cut = self
            .cut(messages, start, Some(learned))
            .max(messages.len().saturating_sub(2));
        while cut > start && matches!(messages.get(cut), Some(Message::Tool(_))) {
            cut -= 1;
        }
        if cut <= start {
            return Err(ModelError::ContextWindowExceeded {
                message: format!(
                    "{message} (nothing older is left to summarize; raise the window or shorten the task)"
                ),
            });
        }
        self.announce_compaction(&ctx, false).await;
        // Request positions are the run's only when no other middleware added messages.
        let maps = run_len.is_some_and(|len| len == base + messages.len() - start);
        let transcript = if maps {
            render(&messages[start..cut], base)
        } else {
            format!(
                "(Replaced after a context overflow; numbered within the request that overflowed.)\n\n{}",
                render(&messages[start..cut], start)
            )
        };
        let history_file = self.history_file_for(&ctx, &marker);
        let text = self
            .summary_of(&ctx, factor, &marker.text, &transcript)
            .await
            .map_err(|reason| ModelError::ContextWindowExceeded {
                message: format!("{message}; summarizing to make room failed: {reason}"),
            })?;
        let next_marker = SummaryMarker {
            upto: base + cut - start,
            text,
            history_file: history_file.clone(),
            count: marker.count + 1,
            learned_trigger: Some(learned),
        };
        let mut retried_messages = Vec::with_capacity(messages.len() - cut + 1);
        retried_messages.push(summary_message(&next_marker));
        retried_messages.extend(messages[cut..].iter().cloned());
        ctx.events.emit(EventKind::Summarized {
            replaced: cut - start,
            kept_from: maps.then_some(next_marker.upto),
            history_file: history_file.clone(),
            trigger: SummaryTrigger::ContextOverflow,
        });
        per_run.lock().pending = Some(Pending {
            base_upto: marker.upto,
            history_file,
            transcript,
            marker: maps.then_some(next_marker),
        });
        let retried = ModelRequest {
            messages: retried_messages.into(),
            ..request
        };
        next.call(retried).await.map_err(|error| match error {
            ModelError::ContextWindowExceeded { message } => ModelError::ContextWindowExceeded {
                message: format!("{message} (even after summarizing the conversation; raise the window or shorten the task)"),
            },
            other => other,
        })
    }

    /// The file for `marker`'s run: the one it has, else one named after the thread (and the
    /// subagent path inside it), else a new one.
    fn history_file_for(&self, ctx: &RunContext, marker: &SummaryMarker) -> String {
        if !marker.history_file.is_empty() {
            return marker.history_file.clone();
        }
        let stem = match &ctx.thread_id {
            Some(thread) => {
                let mut name = thread.clone();
                for segment in ctx.agent_path() {
                    name.push_str("--");
                    name.push_str(&segment.call_id);
                }
                file_stem(&name)
            }
            None => fresh_id(),
        };
        format!("{HISTORY_DIR}/{stem}.md")
    }
}

/// The run as `before_model` saw it.
#[derive(Clone, Debug)]
struct CallView {
    /// Messages in the run.
    run_len: usize,
    marker: SummaryMarker,
}

/// A summary made on overflow, not yet in the run's state.
struct Pending {
    /// The run's `marker.upto` when it overflowed.
    base_upto: usize,
    history_file: String,
    transcript: String,
    /// The marker to record, when the request's messages mapped onto the run's.
    marker: Option<SummaryMarker>,
}

/// A name no other run uses: the time, for sorting, and a random part.
fn fresh_id() -> String {
    let now = deepagents_backends::memory::now_ms();
    let random = RandomState::new().hash_one(now);
    format!("run-{now}-{:08x}", random & 0xffff_ffff)
}

/// `thread` as a file name; ids that are not already safe ones get a hash so that two ids
/// never share a file.
fn file_stem(thread: &str) -> String {
    const MAX: usize = 100;
    let safe: String = thread
        .chars()
        .take(MAX)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if !safe.is_empty() && safe == thread && !safe.starts_with('.') {
        return safe;
    }
    let mut hasher = DefaultHasher::new();
    thread.hash(&mut hasher);
    format!(
        "{}-{:08x}",
        safe.trim_start_matches('.'),
        hasher.finish() & 0xffff_ffff
    )
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

/// The message standing for everything `marker` replaced.
fn summary_message(marker: &SummaryMarker) -> Message {
    Message::user(format!(
        "[Earlier conversation, summarized. The full transcript is in {}; read it with read_file if you need details.]\n\n{}",
        marker.history_file, marker.text
    ))
}

/// `messages` (the start of `state`'s conversation) as requests show them under the summary
/// recorded in `state`: the summary, then what follows it.
pub(crate) fn summarized_view(state: &AgentState, messages: Vec<Message>) -> Vec<Message> {
    match SUMMARY.get(state) {
        Ok(Some(marker)) if marker.upto > 0 && messages.len() >= marker.upto => {
            visible(&marker, &messages)
        }
        _ => messages,
    }
}

/// The messages a request carries under `marker`: the summary, then what follows it.
fn visible(marker: &SummaryMarker, messages: &[Message]) -> Vec<Message> {
    if marker.upto == 0 || marker.text.is_empty() {
        return messages.to_vec();
    }
    let mut out = Vec::with_capacity(messages.len().saturating_sub(marker.upto) + 1);
    out.push(summary_message(marker));
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
        ctx: &RunContext,
        request: &ModelRequest,
        state: &AgentState,
    ) -> Result<StateUpdate, MiddlewareError> {
        let per_run = PerRun::of(ctx);
        let mut update = StateUpdate::default();
        let stored = SUMMARY.get(state)?.unwrap_or_default();
        let mut marker = stored.clone();
        // A summary made while recovering from an overflow is written down first.
        let pending = per_run.lock().pending.take();
        if let Some(pending) = pending.filter(|p| p.base_upto == marker.upto) {
            match self
                .append_history(ctx, state, &pending.history_file, &pending.transcript)
                .await
            {
                Ok(files) => {
                    update.files.extend(files.files);
                    match pending.marker {
                        Some(next) if next.upto <= state.messages.len() => marker = next,
                        _ if marker.history_file.is_empty() => {
                            marker.history_file = pending.history_file;
                        }
                        _ => {}
                    }
                }
                Err(reason) => tracing::warn!(target: "deepagents::summarization", "{reason}"),
            }
        }
        let learned = {
            let memory = per_run.lock();
            [memory.learned_trigger, marker.learned_trigger]
                .into_iter()
                .flatten()
                .min()
        };
        marker.learned_trigger = learned;
        let tokens = {
            let mut memory = per_run.lock();
            let estimate = estimate_fixed(request)
                + Self::visible_tokens(&memory.counted, &marker, &state.messages);
            memory.calibration.last_estimate = estimate;
            (estimate as f64 * memory.calibration.factor) as u64
        };
        let shown_messages = state.messages.len() - marker.upto.min(state.messages.len())
            + usize::from(marker.upto > 0);
        // Asked for by the compact tool (in the state) or by the run's options (once).
        let asked_by_run = ctx
            .extensions
            .get::<CompactFirst>()
            .is_some_and(|first| first.0.swap(false, std::sync::atomic::Ordering::AcqRel));
        let requested = COMPACT.get(state)? == Some(true) || asked_by_run;
        if requested {
            COMPACT.set(&mut update, &false)?;
        }
        let cut = if requested || self.triggered(tokens, shown_messages, learned) {
            self.cut(&state.messages, marker.upto, learned)
        } else {
            marker.upto
        };
        if cut <= marker.upto {
            if marker != stored {
                SUMMARY.set(&mut update, &marker)?;
            }
            return Ok(update);
        }
        self.announce_compaction(ctx, requested).await;
        let history_file = self.history_file_for(ctx, &marker);
        match self.summarize(ctx, state, &marker, cut, history_file).await {
            Ok((next, summarized)) => {
                update.files.extend(summarized.files);
                SUMMARY.set(&mut update, &next)?;
                per_run.lock().announce = Some(EventKind::Summarized {
                    replaced: cut - marker.upto,
                    kept_from: Some(cut),
                    history_file: next.history_file,
                    trigger: if requested {
                        SummaryTrigger::Requested
                    } else {
                        SummaryTrigger::Threshold
                    },
                });
            }
            // The call may still fit; if it does not, the overflow path retries.
            Err(reason) => {
                tracing::warn!(target: "deepagents::summarization", "{reason}");
                if marker != stored {
                    SUMMARY.set(&mut update, &marker)?;
                }
            }
        }
        Ok(update)
    }

    async fn before_model(
        &self,
        ctx: &RunContext,
        request: &mut ModelRequest,
        state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        let marker = SUMMARY.get(state)?.unwrap_or_default();
        if marker.upto > 0 && request.messages.len() >= marker.upto {
            request.messages = visible(&marker, &request.messages).into();
        }
        // `wrap_model_call` sees only the request: tell it where the run stands.
        PerRun::of(ctx).lock().view = Some(CallView {
            run_len: state.messages.len(),
            marker,
        });
        Ok(())
    }

    async fn after_model(
        &self,
        ctx: &RunContext,
        response: &mut ModelResponse,
        _state: &AgentState,
    ) -> Result<(), MiddlewareError> {
        let reported = response.usage.input_tokens;
        let per_run = PerRun::of(ctx);
        let mut memory = per_run.lock();
        let calibration = &mut memory.calibration;
        if reported > 0 && calibration.last_estimate > 0 {
            let ratio = (reported as f64 / calibration.last_estimate as f64).clamp(0.25, 4.0);
            calibration.factor = 0.7 * calibration.factor + 0.3 * ratio;
        }
        Ok(())
    }

    async fn wrap_model_call(
        &self,
        request: ModelRequest,
        next: ModelNext,
    ) -> Result<ModelResponse, ModelError> {
        let (view, announce) = {
            let per_run = PerRun::of(next.context());
            let mut memory = per_run.lock();
            (memory.view.take(), memory.announce.take())
        };
        // Announced here because the summary was made just before, for this very request.
        if let Some(event) = announce {
            next.context().events.emit(event);
        }
        match next.call(request.clone()).await {
            Err(ModelError::ContextWindowExceeded { message }) => {
                self.recover(request, message, view, next).await
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use deepagents_backends::StateBackend;
    use deepagents_core::message::AssistantMessage;
    use deepagents_models::ScriptedModel;

    use super::*;

    fn middleware() -> SummarizationMiddleware {
        let script = r#"{"turns": [{"text": "Goal: keep going."}]}"#;
        let model = ScriptedModel::from_json(script).unwrap();
        SummarizationMiddleware::new(
            Arc::new(model),
            Arc::new(StateBackend::default()),
            None,
            Some(SummarizationConfig {
                trigger: Threshold::Messages(2),
                keep: Threshold::Messages(1),
            }),
        )
    }

    fn state() -> AgentState {
        AgentState {
            messages: vec![
                Message::user("task"),
                Message::Assistant(AssistantMessage::text("working")),
                Message::user("more"),
            ]
            .into(),
            ..AgentState::default()
        }
    }

    async fn history_file(thread: Option<&str>) -> String {
        let mw = middleware();
        let (request, state) = (ModelRequest::default(), state());
        let mut ctx = RunContext::detached("agent");
        ctx.thread_id = thread.map(str::to_owned);
        let update = mw.prepare_model_call(&ctx, &request, &state).await.unwrap();
        let file = update.custom[SUMMARY_KEY]["history_file"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(update.files.contains_key(&file), "{file} was written");
        file
    }

    #[tokio::test]
    async fn a_run_on_a_thread_keeps_its_history_in_a_file_named_after_the_thread() {
        assert_eq!(
            history_file(Some("alpha")).await,
            "/conversation_history/alpha.md"
        );
        // Without a thread, each run gets a file of its own.
        let first = history_file(None).await;
        let second = history_file(None).await;
        assert!(first.starts_with("/conversation_history/run-"), "{first}");
        assert_ne!(first, second);
    }

    #[test]
    fn thread_ids_become_distinct_valid_file_names() {
        assert_eq!(file_stem("alpha-1.2_b"), "alpha-1.2_b");
        let odd = ["a/b", "a_b", "../x", ".hidden", "", "spaced out", "ü"];
        let stems: Vec<String> = odd.iter().map(|t| file_stem(t)).collect();
        for (thread, stem) in odd.iter().zip(&stems) {
            let path = format!("{HISTORY_DIR}/{stem}.md");
            assert!(VPath::parse(&path).is_ok(), "{thread:?} gave {path}");
            assert!(!stem.starts_with('.'), "{thread:?} gave a hidden file");
        }
        let unique: std::collections::HashSet<&String> = stems.iter().collect();
        assert_eq!(unique.len(), stems.len(), "{stems:?}");
        assert!(file_stem(&"t".repeat(500)).len() < 120);
    }
}
