//! The agent loop's own overhead per step, against a hand-written baseline loop.
//!
//! Both loops use the same O(1) model (it answers from the message count) and the same no-op
//! tool, so the difference is what the harness adds: request building, the middleware chain,
//! task spawning, event emission, state merging. Run with `cargo bench -p deepagents`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

#[path = "common/noop.rs"]
mod noop;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deepagents::core::message::AssistantMessage;
use deepagents::core::{ModelResponse, StopReason};
use deepagents::{
    Agent, ContentBlock, Message, Model, ModelError, ModelRequest, Tool, ToolCall, ToolContext,
    ToolResult, ToolStatus, Usage,
};
use futures::StreamExt;
use noop::{Noop, NoopArgs};
use serde_json::json;

/// Calls `noop` until `steps` tool rounds are done, then answers.
struct BenchModel {
    steps: usize,
}

#[async_trait]
impl Model for BenchModel {
    fn id(&self) -> &str {
        "bench"
    }
    async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let round = request.messages.len() / 2;
        let message = if round < self.steps {
            AssistantMessage {
                content: vec![ContentBlock::text("working")],
                tool_calls: vec![ToolCall {
                    id: format!("call_{round}"),
                    name: "noop".into(),
                    arguments: json!({"n": round}),
                }],
            }
        } else {
            AssistantMessage::text("done")
        };
        Ok(ModelResponse {
            message,
            usage: Usage {
                input_tokens: 10,
                output_tokens: 2,
                ..Usage::default()
            },
            stop_reason: StopReason::EndTurn,
        })
    }
}

/// The least a loop can do: call the model, run the tool, append, repeat.
async fn baseline(model: &BenchModel, steps: usize) {
    let mut messages = vec![Message::user("go")];
    loop {
        let request = ModelRequest {
            messages: messages.clone().into(),
            ..ModelRequest::default()
        };
        let response = model.generate(&request).await.unwrap();
        let calls = response.message.tool_calls.clone();
        messages.push(Message::Assistant(response.message));
        if calls.is_empty() {
            break;
        }
        for call in calls {
            let args: NoopArgs = serde_json::from_value(call.arguments.clone()).unwrap();
            let output = Noop.call(args, dummy_context()).await.unwrap();
            messages.push(Message::Tool(ToolResult {
                tool_call_id: call.id,
                name: call.name,
                content: output.content,
                status: ToolStatus::Ok,
                artifact: None,
            }));
        }
    }
    assert_eq!(messages.len(), 2 + steps * 2);
}

fn dummy_context() -> ToolContext {
    ToolContext::detached("", Arc::default())
}

fn agent(steps: usize) -> Agent {
    Agent::builder(Arc::new(BenchModel { steps }))
        .tool(Noop)
        .max_turns(u32::MAX)
        .build()
        .unwrap()
}

/// Median wall time of `repeats` runs of `f`.
async fn median<F, Fut>(repeats: usize, mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut times = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let start = Instant::now();
        f().await;
        times.push(start.elapsed());
    }
    times.sort();
    times[repeats / 2]
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        println!(
            "steps  baseline/step  invoke/step  stream/step  invoke÷baseline  stream÷baseline"
        );
        for steps in [10usize, 100, 1000] {
            let repeats = if steps >= 1000 { 5 } else { 21 };
            let model = BenchModel { steps };
            let base = median(repeats, || baseline(&model, steps)).await;
            let invoked = agent(steps);
            let invoke = median(repeats, || async {
                invoked.invoke("go").await.unwrap();
            })
            .await;
            let streamed = agent(steps);
            let stream = median(repeats, || async {
                let mut events = streamed.stream("go");
                while events.next().await.is_some() {}
                events.outcome().await.unwrap();
            })
            .await;
            let per = |d: Duration| d.as_nanos() as f64 / steps as f64;
            println!(
                "{steps:>5}  {:>10.0} ns  {:>8.0} ns  {:>8.0} ns  {:>14.2}  {:>14.2}",
                per(base),
                per(invoke),
                per(stream),
                per(invoke) / per(base),
                per(stream) / per(base),
            );
        }
    });
}
