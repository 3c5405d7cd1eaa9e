//! The cost of one step as the conversation grows: a run that already holds H messages of
//! history takes one tool step and answers. The model encodes every request it gets with the
//! real Chat Completions wire format (to bytes, as the HTTP client sends it) and answers from
//! the message count, so the time is the harness's own work plus the encoding a provider call
//! needs. Flat per-step cost means the time barely moves from H = 10 to H = 10,000.
//!
//! Run with `cargo bench -p deepagents --bench step`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[path = "common/noop.rs"]
mod noop;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deepagents::core::message::AssistantMessage;
use deepagents::core::{ModelResponse, StopReason};
use deepagents::models::encoded::EncodeCache;
use deepagents::models::openai_chat::ChatWire;
use deepagents::models::provider::Wire;
use deepagents::{
    Agent, ContentBlock, EventSink, Message, Model, ModelError, ModelRequest, Run, RunOptions,
    ToolCall, ToolResult, ToolStatus, Usage,
};
use noop::Noop;
use serde_json::json;

/// Encodes each request as a provider would, then calls `noop` once and answers.
struct EncodingModel {
    wire: ChatWire,
    /// What the HTTP model keeps between requests: the encoded messages.
    encoded: std::sync::Mutex<EncodeCache>,
    /// Off (`STEP_ENCODE=0`) to time the harness alone.
    encode: bool,
    /// Tool rounds before the answer.
    rounds: usize,
}

#[async_trait]
impl Model for EncodingModel {
    fn id(&self) -> &str {
        "bench"
    }
    async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        if self.encode {
            // What the HTTP model sends: the wire's encoded body.
            let mut encoded = self.encoded.lock().unwrap();
            black_box(self.wire.encode(request, false, &mut encoded)?);
        }
        let since_user = request
            .messages
            .iter()
            .rev()
            .take_while(|m| !matches!(m, Message::User { .. }))
            .count();
        let message = if since_user >= 2 * self.rounds {
            AssistantMessage::text("done")
        } else {
            AssistantMessage {
                content: vec![ContentBlock::text("working")],
                tool_calls: vec![ToolCall {
                    id: format!("call_{}", request.messages.len()),
                    name: "noop".into(),
                    arguments: json!({"n": 1}),
                }],
            }
        };
        Ok(ModelResponse {
            message,
            usage: Usage {
                input_tokens: 10,
                output_tokens: 2,
                ..Default::default()
            },
            stop_reason: StopReason::EndTurn,
        })
    }
}

/// A run holding `messages` messages of earlier tool rounds (about 150 bytes each) and a new
/// user message.
fn history(messages: usize) -> Run {
    let mut run = Run::from_task("start");
    let mut round = 0;
    while run.state.messages.len() + 2 <= messages {
        let id = format!("old_{round}");
        run.state
            .messages
            .push(Message::Assistant(AssistantMessage {
                content: vec![ContentBlock::text(format!(
                    "Step {round}: reading the next file to check the release notes."
                ))],
                tool_calls: vec![ToolCall {
                    id: id.clone(),
                    name: "noop".into(),
                    arguments: json!({"n": round}),
                }],
            }));
        run.state.messages.push(Message::Tool(ToolResult {
            tool_call_id: id,
            name: "noop".into(),
            content: vec![ContentBlock::text("ok: 12 lines, nothing to change")],
            status: ToolStatus::Ok,
            artifact: None,
        }));
        round += 1;
    }
    run.state.messages.push(Message::user("one more step"));
    run
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let agent = |rounds: usize| {
        Agent::builder(Arc::new(EncodingModel {
            wire: ChatWire {
                provider: "openai_chat".into(),
                base_url: "http://127.0.0.1:1/v1".into(),
                model: "gpt-4o".into(),
                stream_usage: true,
                extra_headers: Vec::new(),
                reasoning: None,
                modalities: deepagents::core::model::InputModalities::ALL,
                max_output_tokens: None,
                legacy_max_tokens: false,
            },
            encoded: Default::default(),
            encode: std::env::var("STEP_ENCODE").map_or(true, |v| v != "0"),
            rounds,
        }))
        .tool(Noop)
        .max_turns(u32::MAX)
        // Room for the largest history: this times steps, not summarization.
        .context_window(100_000_000)
        .build()
        .unwrap()
    };
    // A run of one round and a run of 1 + EXTRA rounds over the same history: their
    // difference is what a step costs inside a run, without the once-per-run work (the first
    // token estimate of the history, loading it).
    const EXTRA: usize = 20;
    let (short, long) = (agent(1), agent(1 + EXTRA));
    println!("history  first step of a run  each further step  vs H=10");
    let mut base_step: Option<Duration> = None;
    // `STEP_SIZES=10000` times one size alone (for a profiler).
    let sizes: Vec<usize> = std::env::var("STEP_SIZES").map_or_else(
        |_| vec![10, 100, 1_000, 10_000],
        |list| {
            list.split(',')
                .filter_map(|s| s.trim().parse().ok())
                .collect()
        },
    );
    for size in sizes {
        let run = history(size);
        let repeats = if size >= 10_000 { 11 } else { 31 };
        let time = |agent: &Agent| -> Duration {
            let mut times: Vec<Duration> = (0..repeats)
                .map(|_| {
                    // A history of its own, as a run has: not shared with the template.
                    let mut run = run.clone();
                    run.state.messages = run.state.messages.to_vec().into();
                    let start = Instant::now();
                    let output = runtime.block_on(async {
                        agent
                            .run(run, RunOptions::default(), EventSink::discard())
                            .await
                            .unwrap()
                    });
                    let elapsed = start.elapsed();
                    // Freeing the finished run is the caller's business, not the step's.
                    drop(black_box(output));
                    elapsed
                })
                .collect();
            times.sort();
            times[repeats / 2]
        };
        let first = time(&short);
        let step = time(&long).saturating_sub(first) / EXTRA as u32;
        let base = *base_step.get_or_insert(step);
        println!(
            "{size:>7}  {:>14.1} µs  {:>14.1} µs  {:>6.2}×",
            first.as_secs_f64() * 1e6,
            step.as_secs_f64() * 1e6,
            step.as_secs_f64() / base.as_secs_f64()
        );
    }
}
