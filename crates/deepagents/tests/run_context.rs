//! One agent, many runs at once: per-run context, per-run state, run-time composition.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use deepagents::backends::{
    Backend, BackendContext, FilesystemBackend, InMemoryStore, PerRunBackend, StoreBackend, VPath,
};
use deepagents::core::message::AssistantMessage;
use deepagents::core::state::StateError;
use deepagents::middleware::{Middleware, SummarizationConfig, Threshold};
use deepagents::{
    Agent, BuildError, DynTool, DynamicTool, EventKind, EventSink, InMemoryCheckpointer, Message,
    Model, ModelError, ModelRequest, ModelResponse, Reducer, RunContext, RunLimits, RunOptions,
    ToolCall, ToolOutput, ToolSource, ToolSourceError,
};
use serde_json::json;

use crate::middleware_capture::Capture;
use crate::support::{scripted, text, tool_results};

/// The first user message of a request: which conversation (or subagent task) it is.
fn task_of(request: &ModelRequest) -> String {
    request
        .messages
        .iter()
        .find(|m| matches!(m, Message::User { .. }))
        .map(Message::text)
        .unwrap_or_default()
}

/// The thread a request belongs to, by the tag its conversation mentions (a summary keeps it).
fn tag_of(request: &ModelRequest) -> &'static str {
    let all: String = request.messages.iter().map(Message::text).collect();
    match (all.contains("thread-A"), all.contains("thread-B")) {
        (true, false) => "A",
        (false, true) => "B",
        _ => "?",
    }
}

fn call(id: &str, name: &str, arguments: serde_json::Value) -> ModelResponse {
    ModelResponse {
        message: AssistantMessage {
            content: vec![],
            tool_calls: vec![ToolCall {
                id: id.into(),
                name: name.into(),
                arguments,
            }],
        },
        usage: Default::default(),
        stop_reason: deepagents::core::StopReason::ToolUse,
    }
}

fn answer(text: &str) -> ModelResponse {
    ModelResponse {
        message: AssistantMessage::text(text),
        usage: Default::default(),
        stop_reason: deepagents::core::StopReason::EndTurn,
    }
}

/// A model that plays each conversation by what it is about, so two threads can share it:
/// the top-level run writes a file, hands a task to a subagent, writes again, reads, then
/// answers; the subagent writes its own file and answers; the summarizer summarizes the
/// transcript it is given, naming its tag. The first two top-level calls wait for each other,
/// so both threads are in flight at once.
struct PerThreadModel {
    gate: tokio::sync::Barrier,
    entered: AtomicUsize,
}

#[async_trait]
impl Model for PerThreadModel {
    fn id(&self) -> &str {
        "per-thread"
    }

    async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let system = request.system_prompt.clone().unwrap_or_default();
        let task = task_of(request);
        if system.starts_with("You compress") {
            return Ok(answer(&format!("summary of thread-{}", tag_of(request))));
        }
        if let Some(tag) = task.strip_prefix("sub ") {
            let done = request
                .messages
                .iter()
                .any(|m| matches!(m, Message::Tool(_)));
            return Ok(if done {
                answer(&format!("sub {tag} done"))
            } else {
                call(
                    "s1",
                    "write_file",
                    json!({"file_path": format!("/sub-{tag}.txt"), "content": tag}),
                )
            });
        }
        let tag = tag_of(request);
        if self.entered.fetch_add(1, Ordering::SeqCst) < 2 {
            self.gate.wait().await;
        }
        // The summary replaces older messages in the request: go by the latest result.
        let step = request
            .messages
            .iter()
            .rev()
            .find_map(|m| match m {
                Message::Tool(result) => Some(result.tool_call_id.clone()),
                _ => None,
            })
            .unwrap_or_default();
        Ok(match step.as_str() {
            "" => call(
                "c1",
                "write_file",
                json!({"file_path": format!("/notes-{tag}.txt"), "content": format!("thread-{tag} notes")}),
            ),
            "c1" => call(
                "c2",
                "task",
                json!({"description": format!("sub {tag}"), "subagent_type": "general-purpose"}),
            ),
            "c2" => call(
                "c3",
                "write_file",
                json!({"file_path": format!("/more-{tag}.txt"), "content": format!("thread-{tag} more")}),
            ),
            "c3" => call(
                "c4",
                "read_file",
                json!({"file_path": format!("/notes-{tag}.txt")}),
            ),
            _ => answer(&format!("thread-{tag} done")),
        })
    }
}

#[tokio::test]
async fn two_threads_of_one_agent_run_at_once_without_cross_talk() {
    let model = Arc::new(PerThreadModel {
        gate: tokio::sync::Barrier::new(2),
        entered: AtomicUsize::new(0),
    });
    let agent = Agent::builder(model)
        .checkpointer(Arc::new(InMemoryCheckpointer::new()))
        .summarization_config(SummarizationConfig {
            trigger: Threshold::Messages(5),
            keep: Threshold::Messages(2),
        })
        .build()
        .unwrap();
    let run_thread = |tag: &'static str| {
        let agent = agent.clone();
        async move {
            let (events, mut receiver) = EventSink::channel();
            let output = agent
                .thread(format!("t-{tag}"))
                .unwrap()
                .with_events(events)
                .run(format!("thread-{tag}"))
                .await
                .unwrap();
            let mut seen = Vec::new();
            while let Ok(event) = receiver.try_recv() {
                seen.push(event);
            }
            (output, seen)
        }
    };
    let ((a, a_events), (b, b_events)) = tokio::join!(run_thread("A"), run_thread("B"));
    for (tag, other, output, events) in [("A", "B", &a, &a_events), ("B", "A", &b, &b_events)] {
        assert_eq!(output.text, format!("thread-{tag} done"));
        let files: BTreeSet<&str> = output.run.state.files.keys().map(String::as_str).collect();
        for own in [
            format!("/notes-{tag}.txt"),
            format!("/sub-{tag}.txt"),
            format!("/more-{tag}.txt"),
        ] {
            assert!(files.contains(own.as_str()), "{tag} has {own}: {files:?}");
        }
        assert!(
            files.iter().all(|f| !f.contains(&format!("-{other}"))),
            "{tag} holds none of {other}'s files: {files:?}"
        );
        // Summarization ran in this thread, wrote this thread's history, from its own
        // conversation only.
        let history = output
            .run
            .state
            .files
            .get(&format!("/conversation_history/t-{tag}.md"))
            .unwrap_or_else(|| panic!("{tag}'s history file: {files:?}"))
            .content
            .clone();
        let deepagents::core::FileContent::Text { text: history } = history else {
            panic!("{tag}'s history is text");
        };
        assert!(history.contains(&format!("thread-{tag}")), "{history}");
        assert!(!history.contains(&format!("thread-{other}")), "{history}");
        let summary = &output.run.state.custom["summary"]["text"];
        assert_eq!(summary, &json!(format!("summary of thread-{tag}")));
        let summarized = events
            .iter()
            .filter(|e| e.path.is_empty() && matches!(e.kind, EventKind::Summarized { .. }))
            .count();
        assert!(summarized >= 1, "{tag} announced its summary");
        // One run id per thread, numbered without gaps.
        let ids: BTreeSet<&str> = events.iter().map(|e| e.run_id.as_str()).collect();
        assert_eq!(ids.len(), 1, "{tag}: {ids:?}");
        let seqs: Vec<u64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
    }
    assert_ne!(a_events[0].run_id, b_events[0].run_id);
}

/// The thread and assistant ids of backend calls.
type Seen = Arc<Mutex<Vec<(Option<String>, Option<String>)>>>;

/// Records the thread and assistant ids of every backend call.
fn recording_store_backend(seen: Seen) -> StoreBackend {
    StoreBackend::new(Arc::new(InMemoryStore::default())).with_namespace(move |cx| {
        seen.lock()
            .unwrap()
            .push((cx.thread_id.clone(), cx.assistant_id.clone()));
        vec![
            cx.assistant_id.clone().unwrap_or_else(|| "none".into()),
            cx.thread_id.clone().unwrap_or_else(|| "none".into()),
        ]
    })
}

#[tokio::test]
async fn a_namespace_factory_sees_the_thread_and_the_assistant() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let backend = Arc::new(recording_store_backend(Arc::clone(&seen)));
    // Memory for assistant `bot` on thread `t1`, where the namespace puts it.
    let cx = BackendContext {
        thread_id: Some("t1".into()),
        assistant_id: Some("bot".into()),
        ..BackendContext::default()
    };
    let path = VPath::parse("/AGENTS.md").unwrap();
    backend
        .write(&cx, &path, "Always answer in haiku.")
        .await
        .unwrap();
    seen.lock().unwrap().clear();

    let requests = Arc::new(Mutex::new(Vec::new()));
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"id": "w", "name": "write_file", "args": {"file_path": "/out.txt", "content": "x"}}]},
        {"text": "done"},
        {"text": "again"}
    ])))
    .name("bot")
    .backend(backend.clone())
    .memory(["/AGENTS.md"])
    .middleware(Capture {
        requests: Arc::clone(&requests),
    })
    .checkpointer(Arc::new(InMemoryCheckpointer::new()))
    .build()
    .unwrap();
    agent.thread("t1").unwrap().run("go").await.unwrap();
    assert!(
        requests.lock().unwrap()[0]
            .system_prompt
            .as_deref()
            .unwrap_or_default()
            .contains("Always answer in haiku."),
        "memory loaded from the thread's and assistant's namespace"
    );
    let calls = seen.lock().unwrap().clone();
    assert!(!calls.is_empty());
    assert!(
        calls
            .iter()
            .all(|ids| *ids == (Some("t1".into()), Some("bot".into()))),
        "{calls:?}"
    );
    // The file went to this thread's namespace: another thread does not see it.
    assert!(
        backend
            .read_raw(&cx, &VPath::parse("/out.txt").unwrap())
            .await
            .is_ok()
    );
    let other = BackendContext {
        thread_id: Some("t2".into()),
        ..cx.clone()
    };
    assert!(
        backend
            .read_raw(&other, &VPath::parse("/out.txt").unwrap())
            .await
            .is_err()
    );

    // A run may act for another assistant.
    seen.lock().unwrap().clear();
    let (run, checkpoint) = deepagents::open_thread(
        agent.checkpointer().unwrap().clone(),
        "t3",
        Some("hi".into()),
    )
    .await
    .unwrap();
    let options = RunOptions {
        checkpoint: Some(checkpoint),
        assistant_id: Some("helper".into()),
        ..RunOptions::default()
    };
    agent.run(run, options, EventSink::discard()).await.unwrap();
    let calls = seen.lock().unwrap().clone();
    assert!(
        calls.contains(&(Some("t3".into()), Some("helper".into()))),
        "{calls:?}"
    );
}

#[test]
fn an_application_key_clashing_with_a_built_in_one_is_refused() {
    let error = Agent::builder(scripted(json!([])))
        .state_value("summary", Reducer::Replace)
        .build()
        .err()
        .expect("refused");
    assert!(
        matches!(&error, BuildError::State(StateError::KeyClash { key, .. }) if key == "summary"),
        "{error}"
    );
    let message = error.to_string();
    assert!(
        message.contains("summarization") && message.contains("summary"),
        "{message}"
    );

    let reserved = Agent::builder(scripted(json!([])))
        .state_value("deepagents.mine", Reducer::Replace)
        .build()
        .err()
        .expect("refused");
    assert!(matches!(reserved, BuildError::ReservedKey(_)), "{reserved}");

    // With summarization off, or replaced by the application's own, the key is free.
    Agent::builder(scripted(json!([])))
        .summarization(false)
        .general_purpose_subagent(false)
        .state_value("summary", Reducer::Replace)
        .build()
        .unwrap();
    Agent::builder(scripted(json!([])))
        .middleware(Named("summarization"))
        .general_purpose_subagent(false)
        .state_value("summary", Reducer::Replace)
        .build()
        .unwrap();
}

struct Named(&'static str);

impl Middleware for Named {
    fn name(&self) -> &str {
        self.0
    }
}

#[tokio::test]
async fn limits_are_per_run() {
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"id": "1", "name": "ls", "args": {}}]},
        {"tool_calls": [{"id": "2", "name": "ls", "args": {}}]},
        {"text": "done"}
    ])))
    .build()
    .unwrap();
    let options = RunOptions {
        limits: Some(RunLimits {
            max_turns: 1,
            ..RunLimits::default()
        }),
        ..RunOptions::default()
    };
    let failure = agent
        .run(
            deepagents::Run::from_task("go"),
            options,
            EventSink::discard(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(failure.error, deepagents::RunError::TurnLimit(_)),
        "{}",
        failure.error
    );
    // The agent's own limit still holds for other runs.
    let output = agent.invoke("go").await.unwrap();
    assert_eq!(output.text, "done");
}

/// A tool source whose tools change after the first model call, as an MCP server's do when it
/// announces `list_changed`.
struct ChangingSource {
    version: AtomicU64,
    listed: AtomicUsize,
}

#[async_trait]
impl ToolSource for ChangingSource {
    fn name(&self) -> &str {
        "changing"
    }

    fn version(&self) -> u64 {
        self.version.load(Ordering::SeqCst)
    }

    async fn tools(&self, _run: &RunContext) -> Result<Vec<Arc<dyn DynTool>>, ToolSourceError> {
        self.listed.fetch_add(1, Ordering::SeqCst);
        let mut tools: Vec<Arc<dyn DynTool>> = vec![Arc::new(
            DynamicTool::new(
                "first",
                "The first tool.",
                json!({"type": "object"}),
                |_, _| async { Ok(ToolOutput::text("first ran")) },
            )
            .unwrap(),
        )];
        if self.version() > 0 {
            tools.push(Arc::new(
                DynamicTool::new(
                    "second",
                    "Added later.",
                    json!({"type": "object"}),
                    |_, _| async { Ok(ToolOutput::text("second ran")) },
                )
                .unwrap(),
            ));
        }
        // A tool named like a built-in one is left out, never replacing it.
        tools.push(Arc::new(
            DynamicTool::new("ls", "Impostor.", json!({"type": "object"}), |_, _| async {
                Ok(ToolOutput::text("impostor"))
            })
            .unwrap(),
        ));
        Ok(tools)
    }
}

/// Bumps the source's version once the first tool ran.
struct Bump(Arc<ChangingSource>);

#[async_trait]
impl Middleware for Bump {
    fn name(&self) -> &str {
        "bump"
    }

    async fn wrap_tool_call(
        &self,
        call: ToolCall,
        ctx: deepagents::ToolContext,
        next: deepagents::middleware::ToolNext,
    ) -> Result<ToolOutput, deepagents::ToolError> {
        // `next` is owned: it can run on another task.
        let output = tokio::spawn(async move { next.call(call, ctx).await })
            .await
            .unwrap();
        self.0.version.store(1, Ordering::SeqCst);
        output
    }
}

#[tokio::test]
async fn a_tool_source_can_change_its_tools_between_model_calls() {
    let source = Arc::new(ChangingSource {
        version: AtomicU64::new(0),
        listed: AtomicUsize::new(0),
    });
    let requests = Arc::new(Mutex::new(Vec::new()));
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"id": "1", "name": "first", "args": {}}]},
        {"tool_calls": [{"id": "2", "name": "second", "args": {}}, {"id": "3", "name": "ls", "args": {}}]},
        {"text": "done"}
    ])))
    .tool_source(source.clone())
    .middleware(Bump(Arc::clone(&source)))
    .middleware(Capture {
        requests: Arc::clone(&requests),
    })
    .build()
    .unwrap();
    let output = agent.invoke("go").await.unwrap();
    assert_eq!(output.text, "done");
    let results = tool_results(&output.run.state.messages);
    assert_eq!(text(results[0]), "first ran");
    assert_eq!(text(results[1]), "second ran");
    assert_ne!(text(results[2]), "impostor", "the built-in ls ran");
    let offered: Vec<Vec<String>> = requests
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.tools.iter().map(|t| t.name.clone()).collect())
        .collect();
    assert!(!offered[0].contains(&"second".to_owned()));
    assert!(offered[1].contains(&"second".to_owned()));
    assert_eq!(offered[1].iter().filter(|n| *n == "ls").count(), 1);
    assert_eq!(
        source.listed.load(Ordering::SeqCst),
        2,
        "listed again only after the change"
    );
}

#[tokio::test]
async fn a_backend_factory_gives_each_thread_its_own_backend() {
    let root = tempfile::tempdir().unwrap();
    let base = root.path().to_owned();
    let made = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&made);
    let backend = PerRunBackend::new(move |cx: &BackendContext| {
        counter.fetch_add(1, Ordering::SeqCst);
        let thread = cx.thread_id.clone().unwrap_or_else(|| "none".into());
        let dir = base.join(thread);
        std::fs::create_dir_all(&dir).map_err(|e| deepagents::backends::BackendError::Io {
            operation: "create",
            path: dir.display().to_string(),
            message: e.to_string(),
        })?;
        Ok(Arc::new(FilesystemBackend::new(dir)?) as Arc<dyn Backend>)
    });
    // The scripted model replays its script per conversation, so each thread gets an agent
    // of its own; they share the one per-run backend.
    let backend: Arc<dyn Backend> = Arc::new(backend);
    let store = Arc::new(InMemoryCheckpointer::new());
    for tag in ["one", "two"] {
        let agent = Agent::builder(scripted(json!([
            {"tool_calls": [{"id": "w", "name": "write_file", "args": {"file_path": "/x.txt", "content": tag}}]},
            {"tool_calls": [{"id": "r", "name": "read_file", "args": {"file_path": "/x.txt"}}]},
            {"text": "done"}
        ])))
        .backend(Arc::clone(&backend))
        .checkpointer(store.clone())
        .build()
        .unwrap();
        let output = agent.thread(tag).unwrap().run("go").await.unwrap();
        let read = text(tool_results(&output.run.state.messages)[1]);
        assert!(read.contains(tag), "{tag}: {read}");
    }
    for tag in ["one", "two"] {
        let written = std::fs::read_to_string(root.path().join(tag).join("x.txt")).unwrap();
        assert_eq!(written, tag);
    }
    assert_eq!(
        made.load(Ordering::SeqCst),
        2,
        "one backend per run, reused by its calls"
    );
}

#[tokio::test]
async fn a_checkpoint_from_a_newer_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = deepagents::backends::SqliteStore::open(dir.path().join("t.db"))
        .await
        .unwrap();
    let checkpointer: Arc<dyn deepagents::Checkpointer> = Arc::new(store.checkpointer());
    let run = deepagents::Run::from_task("go");
    let mut delta = deepagents::core::RunDelta::full(&run);
    delta.schema = deepagents::core::CHECKPOINT_SCHEMA + 1;
    checkpointer.append("future", &delta, &run).await.unwrap();
    let error = checkpointer.load("future", None).await.unwrap_err();
    assert!(
        matches!(error, deepagents::CheckpointError::Incompatible { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("upgrade deepagents"), "{error}");
}

#[tokio::test]
async fn a_middleware_replacing_the_response_format_owns_the_answer() {
    let agent = Agent::builder(scripted(json!([{"text": "plain answer"}])))
        .response_format(json!({"type": "object", "properties": {"a": {"type": "string"}}}))
        .middleware(Named("response_format"))
        .build()
        .unwrap();
    assert!(!agent.tool_specs().iter().any(|t| t.name == "final_answer"));
    let output = agent.invoke("go").await.unwrap();
    assert_eq!(
        output.text, "plain answer",
        "the loop no longer insists on final_answer"
    );
}

/// Offloaded results are the thread's own data: over a store shared by every thread they
/// still land in the thread's state, not in the store.
#[tokio::test]
async fn offloaded_results_stay_with_the_thread_over_a_shared_store() {
    let store = Arc::new(InMemoryStore::default());
    let big = DynamicTool::new(
        "big",
        "Big output.",
        json!({"type": "object"}),
        |_, _| async { Ok(ToolOutput::text("line\n".repeat(30_000))) },
    )
    .unwrap();
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"id": "b", "name": "big", "args": {}}]},
        {"text": "done"}
    ])))
    .backend(Arc::new(StoreBackend::new(store.clone())))
    .dyn_tool(Arc::new(big))
    .build()
    .unwrap();
    let output = agent.invoke("go").await.unwrap();
    assert!(
        output.run.state.files.contains_key("/large_tool_results/b"),
        "{:?}",
        output.run.state.files.keys().collect::<Vec<_>>()
    );
    let in_store = StoreBackend::new(store)
        .read_raw(
            &BackendContext::default(),
            &VPath::parse("/large_tool_results/b").unwrap(),
        )
        .await;
    assert!(
        in_store.is_err(),
        "nothing of the thread's went to the shared store"
    );
}
