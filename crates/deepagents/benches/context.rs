//! Context accounting: the token estimator's throughput, and the per-step cost of deciding
//! whether to summarize as history grows (it must stay flat when nothing changes).
//! Run with `cargo bench -p deepagents --bench context`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use deepagents::backends::StateBackend;
use deepagents::context::estimate_tokens;
use deepagents::core::message::{AssistantMessage, ToolCall, ToolResult};
use deepagents::core::{ModelResponse, ToolStatus};
use deepagents::middleware::{Middleware, SummarizationMiddleware};
use deepagents::{AgentState, ContentBlock, Message, Model, ModelError, ModelRequest};
use serde_json::json;

struct Unused;

#[async_trait]
impl Model for Unused {
    fn id(&self) -> &str {
        "unused"
    }
    async fn generate(&self, _: &ModelRequest) -> Result<ModelResponse, ModelError> {
        Err(ModelError::Other {
            message: "the bench never summarizes".into(),
        })
    }
}

fn history(messages: usize) -> Vec<Message> {
    let mut out = vec![Message::user("start the work")];
    for i in 0..messages / 2 {
        out.push(Message::Assistant(AssistantMessage {
            content: vec![ContentBlock::text(format!(
                "step {i}: reading the next file"
            ))],
            tool_calls: vec![ToolCall {
                id: format!("c{i}"),
                name: "read_file".into(),
                arguments: json!({"file_path": format!("/src/file_{i}.rs")}),
            }],
        }));
        out.push(Message::Tool(ToolResult {
            tool_call_id: format!("c{i}"),
            name: "read_file".into(),
            content: vec![ContentBlock::text("     1\tfn main() {}\n".repeat(20))],
            status: ToolStatus::Ok,
            artifact: None,
        }));
    }
    out
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // Estimator throughput.
    let request = ModelRequest {
        messages: history(1_000).into(),
        ..ModelRequest::default()
    };
    let bytes = serde_json::to_string(&request.messages).unwrap().len();
    let start = Instant::now();
    let rounds = 200;
    let mut total = 0;
    for _ in 0..rounds {
        total += estimate_tokens(&request);
    }
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "estimator: {:.0} MB/s of serialized history ({} tokens per 1,000-message request)",
        bytes as f64 * rounds as f64 / seconds / 1e6,
        total / rounds
    );

    // Deciding whether to summarize, one step at a time, as the history grows.
    println!("history  decision per step (window never reached)");
    let middleware = SummarizationMiddleware::new(
        Arc::new(Unused),
        Arc::new(StateBackend::default()),
        Some(100_000_000),
        None,
    );
    for size in [10usize, 100, 1_000, 10_000] {
        let mut state = AgentState {
            messages: history(size).into(),
            ..AgentState::default()
        };
        let request = ModelRequest::default();
        // One run: the running count lives in the run's extensions.
        let ctx = deepagents::RunContext::detached("bench");
        runtime.block_on(async {
            // Warm the running count, then time steps that each add one message.
            middleware
                .prepare_model_call(&ctx, &request, &state)
                .await
                .unwrap();
            let steps = 200;
            let start = Instant::now();
            for i in 0..steps {
                state.messages.push(Message::user(format!("more {i}")));
                middleware
                    .prepare_model_call(&ctx, &request, &state)
                    .await
                    .unwrap();
            }
            println!(
                "{size:>7}  {:>8.0} ns",
                start.elapsed().as_nanos() as f64 / steps as f64
            );
        });
    }
}
