//! Async subagents: background tasks whose endings wake their parent thread.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use deepagents::core::message::AssistantMessage;
use deepagents::core::{
    Checkpointer, EventKind, InMemoryCheckpointer, ModelError, ModelRequest, ModelResponse,
    StopReason, ToolCall, Usage,
};
use deepagents::subagents::SubAgent;
use deepagents::{Agent, EventSink, Message, Model};
use serde_json::json;
use tokio::sync::Semaphore;

type Turn = Box<dyn Fn(&[Message]) -> AssistantMessage + Send + Sync>;

/// A model answering with `turns` in order (the last repeated), recording its requests; with
/// a gate, each answer waits for a permit first.
struct Fake {
    turns: Vec<Turn>,
    gate: Option<Arc<Semaphore>>,
    requests: Mutex<Vec<ModelRequest>>,
}

impl Fake {
    fn new(turns: Vec<Turn>) -> Arc<Self> {
        Arc::new(Self {
            turns,
            gate: None,
            requests: Mutex::default(),
        })
    }

    fn gated(turns: Vec<Turn>, gate: Arc<Semaphore>) -> Arc<Self> {
        Arc::new(Self {
            turns,
            gate: Some(gate),
            requests: Mutex::default(),
        })
    }

    fn requests(&self) -> Vec<ModelRequest> {
        self.requests.lock().unwrap().clone()
    }

    /// The text of every message of the latest request.
    fn last_request_text(&self) -> String {
        let requests = self.requests();
        let last = requests.last().expect("a request");
        last.messages
            .iter()
            .map(Message::text)
            .collect::<Vec<_>>()
            .join("\n")
    }
}

#[async_trait::async_trait]
impl Model for Fake {
    fn id(&self) -> &str {
        "fake"
    }

    async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        let index = {
            let mut requests = self.requests.lock().unwrap();
            requests.push(request.clone());
            requests.len() - 1
        };
        let message = self.turns[index.min(self.turns.len() - 1)](&request.messages);
        let stop_reason = if message.tool_calls.is_empty() {
            StopReason::EndTurn
        } else {
            StopReason::ToolUse
        };
        Ok(ModelResponse {
            message,
            usage: Usage::default(),
            stop_reason,
        })
    }
}

fn say(text: &'static str) -> Turn {
    Box::new(move |_| AssistantMessage {
        content: vec![deepagents::ContentBlock::text(text)],
        tool_calls: vec![],
    })
}

fn call(name: &'static str, args: serde_json::Value) -> Turn {
    Box::new(move |_| AssistantMessage {
        content: vec![],
        tool_calls: vec![ToolCall {
            id: format!("call_{name}"),
            name: name.to_owned(),
            arguments: args.clone(),
        }],
    })
}

/// A call whose arguments name the task id the latest `start_async_task` returned.
fn on_task(name: &'static str) -> Turn {
    Box::new(move |messages| AssistantMessage {
        content: vec![],
        tool_calls: vec![ToolCall {
            id: format!("call_{name}"),
            name: name.to_owned(),
            arguments: json!({ "task_id": started_task(messages) }),
        }],
    })
}

/// The id in the latest "Started background task …" result.
fn started_task(messages: &[Message]) -> String {
    messages
        .iter()
        .rev()
        .find_map(|m| {
            let text = m.text();
            let rest = text.strip_prefix("Started background task ")?;
            Some(rest.split(' ').next()?.to_owned())
        })
        .expect("a started task")
}

fn start() -> Turn {
    call(
        "start_async_task",
        json!({"description": "compute the answer", "subagent_type": "helper"}),
    )
}

/// A parent agent over `parent` with the async subagent `helper` over `child`.
fn agent(parent: Arc<Fake>, child: Arc<Fake>, store: Arc<dyn Checkpointer>) -> Agent {
    Agent::builder(parent)
        .checkpointer(store)
        .general_purpose_subagent(false)
        .subagent(
            SubAgent::new("helper", "Computes answers.", "You compute answers.")
                .model(child)
                .asynchronous(true),
        )
        .build()
        .unwrap()
}

fn notices(messages: &[Message]) -> usize {
    messages
        .iter()
        .filter(|m| m.text().starts_with("[Background task "))
        .count()
}

async fn within<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), future)
        .await
        .expect("timed out")
}

#[tokio::test]
async fn an_ending_while_idle_starts_the_parents_next_turn() {
    let gate = Arc::new(Semaphore::new(0));
    let child = Fake::gated(vec![say("The answer is 42.")], gate.clone());
    let parent = Fake::new(vec![
        start(),
        say("Started; I will tell you."),
        say("The helper says 42."),
    ]);
    let agent = agent(parent.clone(), child, Arc::new(InMemoryCheckpointer::new()));
    let thread = agent.thread("idle").unwrap();
    let first = thread.run("find the answer").await.unwrap();
    assert_eq!(first.text, "Started; I will tell you.");
    assert_eq!(thread.background_running(), 1);

    gate.add_permits(1);
    let endings = within(thread.next_wake()).await.unwrap().expect("a wake");
    assert_eq!(endings.len(), 1);
    assert_eq!(endings[0].subagent, "helper");
    assert_eq!(endings[0].status, "success");
    assert_eq!(endings[0].answer, "The answer is 42.");

    let (sink, mut events) = EventSink::channel();
    let woken = thread
        .clone()
        .with_events(sink)
        .run(deepagents::Input::Wake)
        .await
        .unwrap();
    assert_eq!(woken.text, "The helper says 42.");
    let request = parent.last_request_text();
    assert!(request.contains("The answer is 42."), "{request}");
    assert!(request.contains("finished"), "{request}");
    let mut kinds = Vec::new();
    while let Ok(event) = events.try_recv() {
        kinds.push(event.kind);
    }
    assert!(matches!(kinds[0], EventKind::RunStarted { .. }));
    assert!(matches!(
        &kinds[1],
        EventKind::BackgroundTaskFinished { subagent, status, answer, .. }
            if subagent == "helper" && status == "success" && answer == "The answer is 42."
    ));
    // Delivered once: nothing wakes the thread again.
    assert!(within(thread.next_wake()).await.unwrap().is_none());
    assert!(crate::support::nothing_to_wake(
        thread.run(deepagents::Input::Wake).await
    ));
    let run = thread.state().await.unwrap().unwrap();
    assert_eq!(notices(&run.state.messages), 1);
    let task = &run.state.custom["async_tasks"][&endings[0].task_id];
    assert_eq!(task["status"], "success");
    assert_eq!(task["delivered"], 1);
}

/// A tool that lets the background task answer and waits until it has ended.
struct LetItFinish {
    gate: Arc<Semaphore>,
    endings: Arc<Mutex<Option<tokio::sync::broadcast::Receiver<String>>>>,
}

/// Arguments of `let_it_finish` (none).
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct NoArgs {}

impl deepagents::Tool for LetItFinish {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "let_it_finish"
    }
    fn description(&self) -> String {
        "Waits.".to_owned()
    }
    async fn call(
        &self,
        _args: NoArgs,
        _ctx: deepagents::ToolContext,
    ) -> Result<deepagents::ToolOutput, deepagents::ToolError> {
        let mut endings = self.endings.lock().unwrap().take().unwrap();
        self.gate.add_permits(1);
        endings.recv().await.unwrap();
        Ok(deepagents::ToolOutput::text("waited"))
    }
}

#[tokio::test]
async fn an_ending_while_busy_is_delivered_at_the_next_model_call_exactly_once() {
    let gate = Arc::new(Semaphore::new(0));
    let child = Fake::gated(vec![say("The answer is 42.")], gate.clone());
    let parent = Fake::new(vec![
        start(),
        call("let_it_finish", json!({})),
        say("The helper says 42."),
    ]);
    let endings = Arc::new(Mutex::new(None));
    let agent = Agent::builder(parent.clone())
        .checkpointer(Arc::new(InMemoryCheckpointer::new()))
        .general_purpose_subagent(false)
        .subagent(
            SubAgent::new("helper", "Computes answers.", "You compute answers.")
                .model(child)
                .asynchronous(true),
        )
        .tool(LetItFinish {
            gate,
            endings: endings.clone(),
        })
        .build()
        .unwrap();
    *endings.lock().unwrap() = agent.background_endings();
    let thread = agent.thread("busy").unwrap();
    let (sink, mut events) = EventSink::channel();
    let output = within(thread.clone().with_events(sink).run("find the answer"))
        .await
        .unwrap();
    assert_eq!(output.text, "The helper says 42.");
    // The third model call saw the answer, right after the tool's result.
    let requests = parent.requests();
    assert_eq!(requests.len(), 3);
    let last = requests[2].messages.last().unwrap().text();
    assert!(last.contains("The answer is 42."), "{last}");
    assert_eq!(notices(&output.run.state.messages), 1);
    let mut delivered = 0;
    while let Ok(event) = events.try_recv() {
        delivered += usize::from(matches!(
            event.kind,
            EventKind::BackgroundTaskFinished { .. }
        ));
    }
    assert_eq!(delivered, 1);
    // Nothing is left to wake the thread with.
    assert!(within(thread.next_wake()).await.unwrap().is_none());
    assert!(crate::support::nothing_to_wake(
        thread.run(deepagents::Input::Wake).await
    ));
    let run = thread.state().await.unwrap().unwrap();
    assert_eq!(notices(&run.state.messages), 1);
}

#[tokio::test]
async fn a_cancelled_task_never_wakes_its_parent() {
    let gate = Arc::new(Semaphore::new(0));
    let child = Fake::gated(vec![say("The answer is 42.")], gate.clone());
    let parent = Fake::new(vec![
        start(),
        on_task("cancel_async_task"),
        call("list_async_tasks", json!({})),
        say("Cancelled."),
    ]);
    let agent = agent(parent.clone(), child, Arc::new(InMemoryCheckpointer::new()));
    let thread = agent.thread("cancel").unwrap();
    let output = thread.run("start and stop").await.unwrap();
    assert_eq!(output.text, "Cancelled.");
    let results = crate::support::tool_results(&output.run.state.messages);
    let cancelled = crate::support::text(results[1]);
    assert!(cancelled.ends_with("was cancelled."), "{cancelled}");
    let listed = crate::support::text(results[2]);
    assert!(
        listed.contains("(helper): cancelled: compute the answer"),
        "{listed}"
    );
    assert_eq!(thread.background_running(), 0);
    gate.add_permits(1);
    assert!(within(thread.next_wake()).await.unwrap().is_none());
    assert!(crate::support::nothing_to_wake(
        thread.run(deepagents::Input::Wake).await
    ));
}

#[tokio::test]
async fn check_and_update_work_on_local_tasks() {
    let gate = Arc::new(Semaphore::new(0));
    let child = Fake::gated(
        vec![Box::new(|messages: &[Message]| {
            let second = messages
                .iter()
                .any(|m| m.text().contains("only the second"));
            AssistantMessage {
                content: vec![deepagents::ContentBlock::text(if second {
                    "Second answer."
                } else {
                    "First answer."
                })],
                tool_calls: vec![],
            }
        })],
        gate.clone(),
    );
    let parent = Fake::new(vec![
        start(),
        on_task("check_async_task"),
        Box::new(|messages| AssistantMessage {
            content: vec![],
            tool_calls: vec![ToolCall {
                id: "call_update".into(),
                name: "update_async_task".into(),
                arguments: json!({"task_id": started_task(messages), "message": "only the second"}),
            }],
        }),
        say("Updated."),
        say("Got the second answer."),
    ]);
    let agent = agent(
        parent.clone(),
        child.clone(),
        Arc::new(InMemoryCheckpointer::new()),
    );
    let thread = agent.thread("update").unwrap();
    let output = thread.run("go").await.unwrap();
    assert_eq!(output.text, "Updated.");
    let results = crate::support::tool_results(&output.run.state.messages);
    assert!(crate::support::text(results[1]).ends_with("is still running."));
    assert!(crate::support::text(results[2]).ends_with("received the new instructions."));
    // The first run was replaced before it answered; only the second one's ending comes.
    gate.add_permits(2);
    let endings = within(thread.next_wake()).await.unwrap().expect("a wake");
    assert_eq!(endings.len(), 1);
    assert_eq!(endings[0].generation, 2);
    assert_eq!(endings[0].answer, "Second answer.");
    let woken = thread.run(deepagents::Input::Wake).await.unwrap();
    assert_eq!(woken.text, "Got the second answer.");
    let child_saw = child.last_request_text();
    assert!(child_saw.contains("only the second"), "{child_saw}");
}

#[tokio::test]
async fn a_restart_between_the_ending_and_its_delivery_loses_nothing() {
    let store: Arc<dyn Checkpointer> = Arc::new(InMemoryCheckpointer::new());
    let gate = Arc::new(Semaphore::new(0));
    let child = Fake::gated(vec![say("The answer is 42.")], gate.clone());
    let before = Fake::new(vec![start(), say("Started.")]);
    let first = agent(before, child, store.clone());
    let mut ended = first.background_endings().unwrap();
    first.thread("restart").unwrap().run("go").await.unwrap();
    gate.add_permits(1);
    within(ended.recv()).await.unwrap();
    // The process "restarts": a new agent over the same store knows nothing in memory.
    drop(first);
    let after = Fake::new(vec![
        say("The helper says 42."),
        Box::new(|messages| AssistantMessage {
            content: vec![],
            tool_calls: vec![ToolCall {
                id: "call_update".into(),
                name: "update_async_task".into(),
                arguments: json!({"task_id": started_task(messages), "message": "and again"}),
            }],
        }),
        say("Asked again."),
        say("The helper now says 43."),
    ]);
    let second = agent(
        after.clone(),
        Fake::new(vec![say("The answer is 43.")]),
        store.clone(),
    );
    let thread = second.thread("restart").unwrap();
    let endings = within(thread.next_wake()).await.unwrap().expect("a wake");
    assert_eq!(endings[0].answer, "The answer is 42.");
    let woken = thread.run(deepagents::Input::Wake).await.unwrap();
    assert_eq!(woken.text, "The helper says 42.");
    assert!(after.last_request_text().contains("The answer is 42."));
    assert!(crate::support::nothing_to_wake(
        thread.run(deepagents::Input::Wake).await
    ));
    // A task that ended before the restart takes new instructions in its child thread.
    assert_eq!(thread.run("ask again").await.unwrap().text, "Asked again.");
    let endings = within(thread.next_wake()).await.unwrap().expect("a wake");
    assert_eq!(endings[0].answer, "The answer is 43.");
    assert_eq!(endings[0].generation, 2);
    let woken = thread.run(deepagents::Input::Wake).await.unwrap();
    assert_eq!(woken.text, "The helper now says 43.");
}

#[tokio::test]
async fn a_task_cut_short_by_a_restart_runs_on_and_then_wakes_its_parent() {
    let store: Arc<dyn Checkpointer> = Arc::new(InMemoryCheckpointer::new());
    // The first process's subagent never answers: it "dies" with the process.
    let stuck = Fake::gated(vec![say("never")], Arc::new(Semaphore::new(0)));
    let first = agent(
        Fake::new(vec![start(), say("Started.")]),
        stuck,
        store.clone(),
    );
    first.thread("cut").unwrap().run("go").await.unwrap();
    drop(first);
    let after = Fake::new(vec![say("The helper says 7.")]);
    let second = agent(
        after.clone(),
        Fake::new(vec![say("The answer is 7.")]),
        store,
    );
    let thread = second.thread("cut").unwrap();
    let endings = within(thread.next_wake()).await.unwrap().expect("a wake");
    assert_eq!(endings[0].answer, "The answer is 7.");
    let woken = thread.run(deepagents::Input::Wake).await.unwrap();
    assert_eq!(woken.text, "The helper says 7.");
}

#[tokio::test]
async fn a_local_async_subagent_needs_a_thread_and_is_not_a_task_type() {
    let child = Fake::new(vec![say("unused")]);
    let parent = Fake::new(vec![start(), say("done")]);
    let agent = Agent::builder(parent.clone())
        .subagent(
            SubAgent::new("helper", "Computes answers.", "You compute answers.")
                .model(child)
                .asynchronous(true),
        )
        .build()
        .unwrap();
    let output = agent.invoke("go").await.unwrap();
    crate::support::assert_error_containing(
        crate::support::tool_results(&output.run.state.messages)[0],
        "needs a saved conversation",
    );
    let request = &parent.requests()[0];
    let task = request.tools.iter().find(|t| t.name == "task").unwrap();
    assert!(!task.description.contains("helper"));
    assert!(request.tools.iter().any(|t| t.name == "start_async_task"));
    let prompt = request.system_prompt.clone().unwrap_or_default();
    assert!(prompt.contains("- helper: Computes answers."), "{prompt}");
}

#[test]
fn markdown_declares_an_async_subagent_with_async_true() {
    let subagent = SubAgent::from_markdown(
        "helper.md",
        "---\nname: helper\ndescription: Computes answers.\nasync: true\n---\nYou compute.",
    )
    .unwrap();
    assert!(subagent.is_async());
    let plain = SubAgent::from_markdown(
        "plain.md",
        "---\nname: plain\ndescription: Plain.\n---\nYou work.",
    )
    .unwrap();
    assert!(!plain.is_async());
}
