//! Checkpoint cost as a thread grows: bytes and time per step at steps 10, 100 and 1,000
//! (they must stay flat), and the time to load a 1,000-step thread. Runs the real driver with a
//! SQLite checkpointer and, when `DEEPAGENTS_BENCH_POSTGRES_URL` (or
//! `DEEPAGENTS_TEST_POSTGRES_URL`) names a server, a PostgreSQL one (in the schema
//! `deepagents_bench`), and prints them side by side. Run with
//! `cargo bench -p deepagents --features sqlite --bench checkpoints`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use deepagents::backends::{PostgresStore, SqliteStore};
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
                ..Default::default()
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

    async fn try_lease(
        &self,
        thread: &str,
    ) -> Result<deepagents::core::ThreadLease, CheckpointError> {
        self.inner.try_lease(thread).await
    }
}

/// What one checkpointer measured.
struct Measurement {
    name: &'static str,
    checkpoints: usize,
    total: Duration,
    /// Per window of steps: delta bytes and append µs per checkpoint.
    windows: Vec<(f64, f64)>,
    messages: usize,
    /// Median of five loads of the whole thread.
    load: Duration,
}

const WINDOWS: [(usize, usize); 3] = [(1, 10), (91, 100), (991, 1_000)];

async fn measure(name: &'static str, store: Arc<dyn Checkpointer>) -> Measurement {
    store.delete_thread("bench").await.unwrap();
    let measured = Arc::new(Measured {
        inner: store.clone(),
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
    let windows = WINDOWS
        .iter()
        .map(|&(from, to)| {
            let window: Vec<_> = writes
                .iter()
                .filter(|(s, _, _)| (from..=to).contains(s))
                .collect();
            let bytes =
                window.iter().map(|(_, b, _)| *b).sum::<usize>() as f64 / window.len() as f64;
            let micros = window.iter().map(|(_, _, d)| d.as_micros()).sum::<u128>() as f64
                / window.len() as f64;
            (bytes, micros)
        })
        .collect();
    let mut loads = Vec::new();
    let mut messages = 0;
    for _ in 0..5 {
        let start = Instant::now();
        let loaded = store.load("bench", None).await.unwrap().unwrap();
        loads.push(start.elapsed());
        messages = loaded.state.messages.len();
    }
    loads.sort();
    store.delete_thread("bench").await.unwrap();
    Measurement {
        name,
        checkpoints: writes.len(),
        total,
        windows,
        messages,
        load: loads[2],
    }
}

fn postgres_url() -> Option<String> {
    [
        "DEEPAGENTS_BENCH_POSTGRES_URL",
        "DEEPAGENTS_TEST_POSTGRES_URL",
    ]
    .iter()
    .find_map(|var| std::env::var(var).ok().filter(|url| !url.trim().is_empty()))
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = SqliteStore::open(dir.path().join("bench.db"))
            .await
            .unwrap();
        let mut results = vec![measure("SQLite", Arc::new(sqlite.checkpointer())).await];
        match postgres_url() {
            Some(url) => {
                let postgres = PostgresStore::connect_in_schema(&url, "deepagents_bench")
                    .await
                    .unwrap();
                results.push(measure("PostgreSQL", Arc::new(postgres.checkpointer())).await);
            }
            None => println!(
                "PostgreSQL: skipped (set DEEPAGENTS_BENCH_POSTGRES_URL to postgres://user@host:port/db)"
            ),
        }
        for m in &results {
            println!(
                "{STEPS}-step run with {} checkpoints: {} checkpoints in {:.2} s",
                m.name,
                m.checkpoints,
                m.total.as_secs_f64()
            );
        }
        let mut header = format!("{:<11}  {:>22}", "steps", "delta bytes/checkpoint");
        for m in &results {
            let label = format!("{} append µs/checkpoint", m.name);
            header.push_str(&format!("  {label:>31}"));
        }
        println!("{header}");
        for (i, (from, to)) in WINDOWS.iter().enumerate() {
            let steps = format!("{from}-{to}");
            let bytes = results[0].windows[i].0;
            let mut line = format!("{steps:<11}  {bytes:>22.0}");
            for m in &results {
                line.push_str(&format!("  {:>31.0}", m.windows[i].1));
            }
            println!("{line}");
        }
        for m in &results {
            println!(
                "{}: load of the {}-message thread: {:.1} ms (median of 5)",
                m.name,
                m.messages,
                m.load.as_secs_f64() * 1e3
            );
        }
    });
}
