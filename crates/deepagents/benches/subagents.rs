//! 100 subagents of 5 steps each, run in parallel (one turn of 100 `task` calls) against the
//! same work done sequentially (100 turns of one call). Reports wall time and peak memory; each
//! variant runs in its own process so peak RSS is its own. Run with
//! `cargo bench -p deepagents --bench subagents`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deepagents::core::message::AssistantMessage;
use deepagents::core::{ModelResponse, StopReason};
use deepagents::{Agent, ContentBlock, Message, Model, ModelError, ModelRequest, ToolCall, Usage};
use serde_json::json;

const SUBAGENTS: usize = 100;
const STEPS: usize = 5;
/// Simulated model latency per call, so parallelism has something to overlap.
const LATENCY: Duration = Duration::from_millis(20);

/// The parent asks for subagents (all at once or one per turn); each subagent lists files
/// `STEPS - 1` times, then answers.
struct BenchModel {
    parallel: bool,
}

fn call(id: String, name: &str, arguments: serde_json::Value) -> ToolCall {
    ToolCall {
        id,
        name: name.into(),
        arguments,
    }
}

#[async_trait]
impl Model for BenchModel {
    fn id(&self) -> &str {
        "bench"
    }
    async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        tokio::time::sleep(LATENCY).await;
        let task = request
            .messages
            .first()
            .map(Message::text)
            .unwrap_or_default();
        let turns = request
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant(_)))
            .count();
        let task_call = |i: usize| {
            call(
                format!("task_{i}"),
                "task",
                json!({"subagent_type": "general-purpose", "description": format!("sub {i}")}),
            )
        };
        let tool_calls = if task.starts_with("sub ") {
            if turns + 1 < STEPS {
                vec![call(format!("ls_{turns}"), "ls", json!({}))]
            } else {
                vec![]
            }
        } else if self.parallel {
            if turns == 0 {
                (0..SUBAGENTS).map(task_call).collect()
            } else {
                vec![]
            }
        } else if turns < SUBAGENTS {
            vec![task_call(turns)]
        } else {
            vec![]
        };
        Ok(ModelResponse {
            message: AssistantMessage {
                content: vec![ContentBlock::text("working")],
                tool_calls,
            },
            usage: Usage::default(),
            stop_reason: StopReason::EndTurn,
        })
    }
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn run_variant(parallel: bool) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let elapsed = runtime.block_on(async {
        let agent = Agent::builder(Arc::new(BenchModel { parallel }))
            .max_turns(1_000)
            .subagent_limits(3, SUBAGENTS)
            .build()
            .unwrap();
        let start = Instant::now();
        let output = agent.invoke("parent").await.unwrap();
        assert_eq!(
            output
                .run
                .state
                .messages
                .iter()
                .filter(|m| matches!(m, Message::Tool(_)))
                .count(),
            SUBAGENTS
        );
        start.elapsed()
    });
    println!(
        "{} {} {}",
        if parallel { "parallel" } else { "sequential" },
        elapsed.as_millis(),
        peak_rss_kib()
    );
}

fn main() {
    if let Ok(mode) = std::env::var("SUBAGENT_BENCH_MODE") {
        run_variant(mode == "parallel");
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut rows = Vec::new();
    for mode in ["parallel", "sequential"] {
        let out = std::process::Command::new(&exe)
            .env("SUBAGENT_BENCH_MODE", mode)
            .output()
            .unwrap();
        let line = String::from_utf8(out.stdout).unwrap();
        let fields: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        rows.push(fields);
    }
    println!(
        "{SUBAGENTS} subagents x {STEPS} steps, {} ms simulated model latency",
        LATENCY.as_millis()
    );
    println!("variant      wall ms   peak RSS KiB");
    for row in &rows {
        println!("{:<12} {:>7}   {:>12}", row[0], row[1], row[2]);
    }
    let ms = |row: &Vec<String>| row[1].parse::<f64>().unwrap_or(f64::NAN);
    println!(
        "sequential ÷ parallel wall time: {:.1}×",
        ms(&rows[1]) / ms(&rows[0])
    );
}
