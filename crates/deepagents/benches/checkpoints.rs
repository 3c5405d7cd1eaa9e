//! Checkpoint cost as a thread grows: bytes and time per step at steps 10, 100 and 1,000
//! (they must stay flat), and the time to load a 1,000-step thread. Runs the real driver with a
//! SQLite checkpointer. Run with `cargo bench -p deepagents --features sqlite --bench checkpoints`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deepagents::backends::SqliteStore;
use deepagents::core::message::{AssistantMessage, ToolCall};
use deepagents::core::{
    CheckpointError, CheckpointInfo, ModelResponse, RunDelta, StopReason, ThreadInfo,
};
use deepagents::{
    Agent, Checkpointer, ContentBlock, Model, ModelError, ModelRequest, Run, RunOptions, Usage,
    open_thread,
};
use serde_json::json;

const STEPS: usize = 1_000;

/// Writes a small file every step, then answers.
struct BenchModel;

#[async_trait]
impl Model for BenchModel {
    fn id(&self) -> &str {
        "bench"
    }
    async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let step = request.messages.len() / 2;
        let tool_calls = if step < STEPS {
            vec![ToolCall {
                id: format!("c{step}"),
                name: "write_file".into(),
                arguments: json!({"file_path": format!("/notes/{}.md", step % 20), "content": format!("note {step}\n")}),
            }]
        } else {
            vec![]
        };
        Ok(ModelResponse {
            message: AssistantMessage {
                content: vec![ContentBlock::text(format!("step {step}"))],
                tool_calls,
            },
            usage: Usage {
                input_tokens: 100,
                output_tokens: 10,
                cached_input_tokens: 0,
            },
            stop_reason: StopReason::EndTurn,
        })
    }
}

/// Measures what goes to the store.
struct Measured {
    inner: Arc<dyn Checkpointer>,
    writes: Mutex<Vec<(usize, usize, Duration)>>,
}

#[async_trait]
impl Checkpointer for Measured {
    async fn append(
        &self,
        thread: &str,
        delta: &RunDelta,
        run: &Run,
    ) -> Result<u64, CheckpointError> {
        let bytes = serde_json::to_string(delta).unwrap().len();
        let start = Instant::now();
        let id = self.inner.append(thread, delta, run).await?;
        self.writes
            .lock()
            .unwrap()
            .push((run.steps as usize, bytes, start.elapsed()));
        Ok(id)
    }
    async fn load(&self, thread: &str, at: Option<u64>) -> Result<Option<Run>, CheckpointError> {
        self.inner.load(thread, at).await
    }
    async fn checkpoints(&self, thread: &str) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        self.inner.checkpoints(thread).await
    }
    async fn threads(&self) -> Result<Vec<ThreadInfo>, CheckpointError> {
        self.inner.threads().await
    }
    async fn delete_thread(&self, thread: &str) -> Result<bool, CheckpointError> {
        self.inner.delete_thread(thread).await
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("bench.db"))
            .await
            .unwrap();
        let measured = Arc::new(Measured {
            inner: Arc::new(store.checkpointer()),
            writes: Mutex::new(Vec::new()),
        });
        let agent = Agent::builder(Arc::new(BenchModel))
            .max_turns(u32::MAX)
            .summarization(false)
            .general_purpose_subagent(false)
            .build()
            .unwrap();
        let (run, checkpoint) = open_thread(measured.clone(), "bench", Some("go".into()))
            .await
            .unwrap();
        let options = RunOptions {
            checkpoint: Some(checkpoint),
            ..RunOptions::default()
        };
        let started = Instant::now();
        agent
            .run(run, options, deepagents::EventSink::discard())
            .await
            .unwrap();
        let total = started.elapsed();
        let writes = measured.writes.lock().unwrap().clone();
        println!(
            "{STEPS}-step run with SQLite checkpoints: {} checkpoints in {:.2} s",
            writes.len(),
            total.as_secs_f64()
        );
        println!("steps      delta bytes/checkpoint   append µs/checkpoint");
        for (from, to) in [(1, 10), (91, 100), (991, 1_000)] {
            let window: Vec<_> = writes
                .iter()
                .filter(|(s, _, _)| (from..=to).contains(s))
                .collect();
            let bytes =
                window.iter().map(|(_, b, _)| *b).sum::<usize>() as f64 / window.len() as f64;
            let micros = window.iter().map(|(_, _, d)| d.as_micros()).sum::<u128>() as f64
                / window.len() as f64;
            println!("{from:>4}-{to:<5}  {bytes:>21.0}   {micros:>20.0}");
        }
        let start = Instant::now();
        let loaded = store
            .checkpointer()
            .load("bench", None)
            .await
            .unwrap()
            .unwrap();
        println!(
            "load of the {}-message thread: {:.1} ms",
            loaded.state.messages.len(),
            start.elapsed().as_secs_f64() * 1e3
        );
    });
}
