//! Runs driven for Python: one background task per run turns its events and saved steps into
//! the frames of the stream modes asked for, and a [`NativeStream`] hands them to Python one
//! at a time, waiting with the GIL released.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use deepagents::core::{Checkpointer, RunLimits, RuntimeContext};
use deepagents::{RunOptions, RunStatus, RunStream};
use deepagents_langgraph::{FrameSink, Framer, convert};
use futures::StreamExt as _;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{AgentConfig, Built, build};
use crate::tool::RunData;

/// How long a run waits for another run of its thread (in this process or another) to end.
const LEASE_WAIT: Duration = Duration::from_secs(30);

/// A built agent.
#[pyclass(frozen, module = "deepagents_rs._native")]
pub struct NativeAgent {
    built: Arc<Built>,
}

/// What one call of `invoke`/`stream` asks for.
struct Request {
    input: Value,
    thread_id: Option<String>,
    resume: Option<Value>,
    modes: BTreeSet<String>,
    subgraphs: bool,
    /// This run's turn limit (`config["recursion_limit"]`), else the agent's.
    max_turns: Option<u32>,
    data: Arc<RunData>,
    cancel: CancellationToken,
}

#[pymethods]
impl NativeAgent {
    /// Builds the agent from its JSON configuration and the objects it names by index.
    #[new]
    fn new(py: Python<'_>, config: &str, objects: Vec<Py<PyAny>>) -> PyResult<Self> {
        let config: AgentConfig = serde_json::from_str(config)
            .map_err(|e| PyValueError::new_err(format!("invalid agent configuration: {e}")))?;
        let objects: Vec<Arc<Py<PyAny>>> = objects.into_iter().map(Arc::new).collect();
        let runtime = crate::runtime()?;
        let built = py
            .detach(|| runtime.block_on(build(config, objects)))
            .map_err(PyValueError::new_err)?;
        Ok(Self {
            built: Arc::new(built),
        })
    }

    /// The agent's name.
    #[getter]
    fn name(&self) -> &str {
        self.built.agent.name()
    }

    /// The tools the model is offered, as JSON (name, description, parameters).
    fn tools_json(&self) -> String {
        serde_json::to_string(self.built.agent.tool_specs()).unwrap_or_default()
    }

    /// Starts a run: `input` (JSON, `{"messages": […]}` or null) or `resume` (JSON, the
    /// decisions of `Command(resume=…)`), on thread `thread_id` when the agent keeps
    /// threads. Frames come from the returned stream.
    #[pyo3(signature = (input, thread_id, resume, modes, subgraphs, context, event_loop, max_turns=None))]
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        input: &str,
        thread_id: Option<String>,
        resume: Option<&str>,
        modes: Vec<String>,
        subgraphs: bool,
        context: Py<PyAny>,
        event_loop: Py<PyAny>,
        max_turns: Option<u32>,
    ) -> PyResult<NativeStream> {
        let parse = |what: &str, text: &str| {
            serde_json::from_str::<Value>(text)
                .map_err(|e| PyValueError::new_err(format!("{what} is not JSON: {e}")))
        };
        let request = Request {
            input: parse("input", input)?,
            thread_id,
            resume: resume.map(|text| parse("resume", text)).transpose()?,
            modes: modes.into_iter().collect(),
            subgraphs,
            max_turns,
            data: Arc::new(RunData {
                context,
                event_loop,
            }),
            cancel: CancellationToken::new(),
        };
        let cancel = request.cancel.clone();
        let (frames, receiver) = mpsc::unbounded_channel();
        let built = Arc::clone(&self.built);
        crate::runtime()?.spawn(async move {
            let sink = Frames(frames);
            if let Err(message) = drive(&built, request, &sink).await {
                sink.push("__error__", &json!({"kind": "invalid", "message": message}));
            }
        });
        Ok(NativeStream {
            receiver: Mutex::new(receiver),
            cancel,
        })
    }

    /// The state of thread `thread_id` as JSON values (`null` when it has none), at
    /// checkpoint `at` or the latest.
    #[pyo3(signature = (thread_id, at=None))]
    fn state_json(&self, py: Python<'_>, thread_id: String, at: Option<u64>) -> PyResult<String> {
        let runtime = crate::runtime()?;
        let watch = Arc::clone(&self.built.watch);
        let run = py
            .detach(|| runtime.block_on(watch.load(&thread_id, at)))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(run.map_or_else(
            || "null".to_owned(),
            |run| self.built.values(&run).to_string(),
        ))
    }

    /// Applies `values` (JSON: messages added or replaced by id, `todos`, `files`) to thread
    /// `thread_id` as a checkpoint of its own; returns the checkpoint's id.
    fn update_state_json(&self, py: Python<'_>, thread_id: String, values: &str) -> PyResult<u64> {
        let values: Value = serde_json::from_str(values)
            .map_err(|e| PyValueError::new_err(format!("values are not JSON: {e}")))?;
        let runtime = crate::runtime()?;
        let watch = Arc::clone(&self.built.watch);
        py.detach(|| runtime.block_on(convert::update_state(watch.as_ref(), &thread_id, &values)))
            .map(|(checkpoint, _)| checkpoint)
            .map_err(|error| PyValueError::new_err(update_error(error)))
    }

    /// How many async subagent tasks of thread `thread_id` run now in this process.
    fn background_running(&self, thread_id: String) -> PyResult<usize> {
        Ok(self
            .built
            .agent
            .thread(&thread_id)
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .background_running())
    }

    /// Waits up to `timeout` seconds for endings of thread `thread_id`'s async subagent tasks
    /// that the thread can take, as JSON (a list of `task_id`, `subagent`, `status`,
    /// `answer`; empty when nothing is left to wait for); `None` when the time ran out first.
    /// Nothing is delivered: the thread's next run takes them. The wait is cut into the
    /// caller's slices so Python sees Ctrl-C and task cancellation between them.
    fn next_wake_json(
        &self,
        py: Python<'_>,
        thread_id: String,
        timeout: f64,
    ) -> PyResult<Option<String>> {
        let thread = self
            .built
            .agent
            .thread(&thread_id)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let runtime = crate::runtime()?;
        let limit = Duration::from_secs_f64(timeout.max(0.0));
        let waited = py.detach(|| {
            runtime.block_on(async { tokio::time::timeout(limit, thread.next_wake()).await })
        });
        let Ok(endings) = waited else {
            return Ok(None);
        };
        let endings = endings.map_err(|e| PyValueError::new_err(e.to_string()))?;
        let list: Vec<Value> = endings
            .unwrap_or_default()
            .into_iter()
            .map(|ending| {
                json!({
                    "task_id": ending.task_id,
                    "subagent": ending.subagent,
                    "status": ending.status,
                    "answer": ending.answer,
                })
            })
            .collect();
        Ok(Some(Value::Array(list).to_string()))
    }

    /// The checkpoints of thread `thread_id`, oldest first, as JSON.
    fn history_json(&self, py: Python<'_>, thread_id: String) -> PyResult<String> {
        let runtime = crate::runtime()?;
        let watch = Arc::clone(&self.built.watch);
        let checkpoints = py
            .detach(|| runtime.block_on(watch.checkpoints(&thread_id)))
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(serde_json::to_string(&checkpoints).unwrap_or_default())
    }
}

/// Frames into the channel a [`NativeStream`] reads.
struct Frames(mpsc::UnboundedSender<(String, String)>);

impl FrameSink for Frames {
    fn push(&self, mode: &str, data: &Value) {
        let _ = self.0.send((mode.to_owned(), data.to_string()));
    }
}

/// The frames of one run: `(mode, JSON)` pairs; the last is `__end__` (the final values and
/// status) or `__error__` (what failed, and the values so far).
#[pyclass(frozen, module = "deepagents_rs._native")]
pub struct NativeStream {
    receiver: Mutex<mpsc::UnboundedReceiver<(String, String)>>,
    cancel: CancellationToken,
}

#[pymethods]
impl NativeStream {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next frame, waiting for it with the GIL released; Ctrl-C cancels the run.
    fn __next__(&self, py: Python<'_>) -> PyResult<Option<(String, String)>> {
        let runtime = crate::runtime()?;
        loop {
            let next = py.detach(|| {
                let mut receiver = self.receiver.lock().unwrap_or_else(PoisonError::into_inner);
                runtime.block_on(async {
                    tokio::time::timeout(Duration::from_millis(100), receiver.recv()).await
                })
            });
            match next {
                Ok(frame) => return Ok(frame),
                Err(_elapsed) => {
                    if let Err(error) = py.check_signals() {
                        self.cancel.cancel();
                        return Err(error);
                    }
                }
            }
        }
    }

    /// Stops the run; its stream ends with a `cancelled` error.
    fn cancel(&self) {
        self.cancel.cancel();
    }
}

fn update_error(error: convert::UpdateError) -> String {
    match error {
        convert::UpdateError::Invalid(message) => message,
        convert::UpdateError::Checkpoint(error) => error.to_string(),
    }
}

/// Threads made for one call when the agent keeps none.
fn scratch_thread() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "py-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs the request to its end, framing everything into `sink`. An `Err` is a request that
/// could not start.
async fn drive(built: &Built, request: Request, sink: &Frames) -> Result<(), String> {
    let keep = built.persistent && request.thread_id.is_some();
    if request.resume.is_some() && !keep {
        return Err(if built.persistent {
            "Command(resume=…) needs the thread: pass config={\"configurable\": {\"thread_id\": …}}"
                .to_owned()
        } else {
            "Command(resume=…) needs a checkpointer: create_deep_agent(…, checkpointer=InMemorySaver()) and a thread_id".to_owned()
        });
    }
    let thread_id = match (&request.thread_id, keep) {
        (Some(id), true) => id.clone(),
        _ => scratch_thread(),
    };
    let watch = &built.watch;
    let thread = built
        .agent
        .thread(&thread_id)
        .map_err(|e| e.to_string())?
        .with_options(RunOptions {
            runtime: RuntimeContext::new(Arc::clone(&request.data)),
            cancel: request.cancel.clone(),
            limits: request.max_turns.map(|max_turns| RunLimits {
                max_turns,
                ..RunLimits::default()
            }),
            ..RunOptions::default()
        })
        .with_lease_wait(LEASE_WAIT);
    let mut before = watch
        .load(&thread_id, None)
        .await
        .map_err(|e| e.to_string())?;
    let stream = start(&request, &thread, &thread_id, built, &mut before).await;
    let outcome = match stream {
        Ok((stream, mut steps)) => {
            let meta = json!({"thread_id": request.thread_id, "assistant_id": built.agent.name()});
            let mut framer = Framer::new(
                sink,
                request.modes.clone(),
                request.subgraphs,
                meta,
                before.as_ref(),
            );
            frame(stream, &mut steps, &mut framer).await
        }
        Err(error) => Err(error),
    };
    match outcome {
        Ok(output) => {
            let run = &output.run;
            let status = match output.status {
                RunStatus::Finished => "finished",
                RunStatus::Interrupted => "interrupted",
            };
            sink.push(
                "__end__",
                &json!({
                    "status": status,
                    "values": built.values(run),
                    "text": output.text,
                    "structured_response": output.structured,
                }),
            );
        }
        Err((error, run)) => {
            sink.push(
                "__error__",
                &json!({
                    "kind": serde_json::to_value(error.kind()).unwrap_or(Value::Null),
                    "message": error.to_string(),
                    "values": run.as_ref().map(|run| built.values(run)),
                }),
            );
        }
    }
    if !keep {
        let _ = watch.delete_thread(&thread_id).await;
    }
    Ok(())
}

type Failure = (deepagents::RunError, Option<deepagents::core::Run>);

/// Starts the run the request asks for; `before` becomes the run as it stands before it (its
/// messages are not streamed again).
async fn start(
    request: &Request,
    thread: &deepagents::Thread,
    thread_id: &str,
    built: &Built,
    before: &mut Option<deepagents::core::Run>,
) -> Result<(RunStream, deepagents_langgraph::Subscription), Failure> {
    let checkpoint =
        |e: deepagents::core::CheckpointError| (deepagents::RunError::Checkpoint(e), None);
    let invalid = |message: String| (deepagents::RunError::InvalidDecision(message), None);
    if let Some(resume) = &request.resume {
        // `{interrupt_id: …}` for an interrupt that is not pending is refused here, like
        // decisions that do not fit, with the thread unchanged.
        let resume =
            convert::resume(resume, before.as_ref()).map_err(|error| (error, before.clone()))?;
        let steps = built.watch.subscribe(thread_id);
        // Recorded for the pause they were read for, checked again under the thread's
        // lease: a run that answered it meanwhile makes this one fail instead.
        let stream = thread
            .stream(deepagents::Input::DecidePause {
                pause: resume.pause,
                decisions: resume.decisions,
            })
            .await
            .map_err(|failure| (failure.error, Some(*failure.run)))?;
        return Ok((stream, steps));
    }
    let messages = request
        .input
        .get("messages")
        .cloned()
        .unwrap_or(Value::Null);
    let only_user = match &messages {
        Value::Array(list) => list.iter().all(|m| {
            matches!(
                m.get("role")
                    .or_else(|| m.get("type"))
                    .and_then(Value::as_str),
                None | Some("user" | "human")
            )
        }),
        _ => true,
    };
    // A history (assistant or tool messages among the input) is added to the thread as it
    // is, with any `files` and `todos` of the input; the run then continues from the last
    // message.
    let mut seed = serde_json::Map::new();
    for key in ["files", "todos"] {
        if let Some(value) = request.input.get(key).filter(|value| !value.is_null()) {
            seed.insert(key.to_owned(), value.clone());
        }
    }
    if !only_user {
        let ends_well = messages
            .as_array()
            .and_then(|list| list.last())
            .is_some_and(|last| {
                matches!(
                    last.get("role")
                        .or_else(|| last.get("type"))
                        .and_then(Value::as_str),
                    Some("user" | "human" | "tool")
                )
            });
        if !ends_well {
            return Err(invalid(
                "the input must end with a user message (or tool results) for the agent to answer"
                    .to_owned(),
            ));
        }
        seed.insert("messages".to_owned(), messages);
    }
    let content = if only_user {
        convert::input_content(&request.input).map_err(invalid)?
    } else {
        None
    };
    let seeded = !seed.is_empty();
    if seeded {
        let (_, run) = convert::update_state(built.watch.as_ref(), thread_id, &Value::Object(seed))
            .await
            .map_err(|error| match error {
                convert::UpdateError::Invalid(message) => invalid(message),
                convert::UpdateError::Checkpoint(error) => checkpoint(error),
            })?;
        *before = Some(run);
    }
    let steps = built.watch.subscribe(thread_id);
    // `invoke(None, config)` on a thread whose async subagents have ended: the turn their
    // endings start (their answers are its input), as the server runs it; else the
    // continuation of what the thread left.
    let input = content.map_or(deepagents::Input::Resume, deepagents::Input::Content);
    let stream = thread
        .stream(input)
        .await
        .map_err(|failure| (failure.error, None))?;
    Ok((stream, steps))
}

/// Frames a run's events and steps in order: each step right after its events.
async fn frame(
    mut stream: RunStream,
    steps: &mut deepagents_langgraph::Subscription,
    framer: &mut Framer<&Frames>,
) -> Result<deepagents::RunOutput, Failure> {
    while let Some(event) = stream.next().await {
        for step in steps.steps_before(&event) {
            framer.step(&step);
        }
        framer.event(&event);
    }
    for step in steps.remaining() {
        framer.step(&step);
    }
    stream
        .outcome()
        .await
        .map_err(|failure| (failure.error, Some(*failure.run)))
}
