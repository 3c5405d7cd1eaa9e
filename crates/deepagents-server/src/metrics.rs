//! What `/metrics` reports: counters this server keeps as it drives runs, in Prometheus'
//! text format.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use deepagents::core::{Event, EventKind};

/// Counters of the runs this server drove.
#[derive(Default)]
pub struct Metrics {
    finished: Mutex<BTreeMap<String, u64>>,
    model_calls: AtomicU64,
    model_micros: AtomicU64,
    input_tokens: AtomicU64,
    output_tokens: AtomicU64,
    cached_tokens: AtomicU64,
    /// Millionths of a dollar.
    cost_micro_usd: AtomicU64,
}

/// When the model call of a run streaming now began.
#[derive(Default)]
pub struct CallClock(Option<Instant>);

impl Metrics {
    /// Counts what `event` of a run says: a model call's duration and tokens, a run's cost.
    pub fn observe(&self, event: &Event, clock: &mut CallClock) {
        match &event.kind {
            EventKind::ModelCallStarted { .. } => clock.0 = Some(Instant::now()),
            EventKind::ModelCallFinished { usage, .. } => {
                self.model_calls.fetch_add(1, Ordering::Relaxed);
                if let Some(started) = clock.0.take() {
                    self.model_micros
                        .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                }
                self.input_tokens
                    .fetch_add(usage.input_tokens, Ordering::Relaxed);
                self.output_tokens
                    .fetch_add(usage.output_tokens, Ordering::Relaxed);
                self.cached_tokens
                    .fetch_add(usage.cached_input_tokens, Ordering::Relaxed);
            }
            // Subagents' spending is in their parent's.
            EventKind::Final { spent, .. } if event.path.is_empty() => {
                self.cost_micro_usd
                    .fetch_add((spent.cost_usd * 1e6).round() as u64, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    /// A run ended with `status`.
    pub fn finished(&self, status: &str) {
        let mut finished = self
            .finished
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *finished.entry(status.to_owned()).or_default() += 1;
    }

    /// The Prometheus text, with the gauges of runs going and waiting.
    pub fn render(&self, active: usize, queued: usize) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, String)]| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for (labels, value) in samples {
                out.push_str(&format!("{name}{labels} {value}\n"));
            }
        };
        let plain = |value: String| vec![(String::new(), value)];
        metric(
            "deepagents_runs_active",
            "gauge",
            "Runs running.",
            &plain(active.to_string()),
        );
        metric(
            "deepagents_runs_queued",
            "gauge",
            "Runs waiting for their thread or a server.",
            &plain(queued.to_string()),
        );
        let finished: Vec<(String, String)> = self
            .finished
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(status, n)| (format!("{{status=\"{status}\"}}"), n.to_string()))
            .collect();
        metric(
            "deepagents_runs_finished_total",
            "counter",
            "Runs this server drove to an end, by status.",
            &finished,
        );
        let calls = self.model_calls.load(Ordering::Relaxed);
        // A summary's samples are its name with `_sum` and `_count`.
        metric(
            "deepagents_model_call_seconds",
            "summary",
            "Model calls: time to the whole answer.",
            &[
                (
                    "_sum".to_owned(),
                    format!(
                        "{:.6}",
                        self.model_micros.load(Ordering::Relaxed) as f64 / 1e6
                    ),
                ),
                ("_count".to_owned(), calls.to_string()),
            ],
        );
        let tokens = [
            ("input", &self.input_tokens),
            ("output", &self.output_tokens),
            ("cached_input", &self.cached_tokens),
        ]
        .iter()
        .map(|(kind, n)| {
            (
                format!("{{kind=\"{kind}\"}}"),
                n.load(Ordering::Relaxed).to_string(),
            )
        })
        .collect::<Vec<_>>();
        metric(
            "deepagents_tokens_total",
            "counter",
            "Tokens of model calls, by kind.",
            &tokens,
        );
        metric(
            "deepagents_cost_usd_total",
            "counter",
            "Spending of runs at the models' prices.",
            &plain(format!(
                "{:.6}",
                self.cost_micro_usd.load(Ordering::Relaxed) as f64 / 1e6
            )),
        );
        out
    }
}
