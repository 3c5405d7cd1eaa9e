//! The builder: threads through its checkpointer, long-term memory through its store, refused
//! combinations, spec strings and the runtime context tools read.

use std::sync::Arc;

use deepagents::backends::{
    Backend, CompositeBackend, InMemoryStore, Permissions, StateBackend, Store, StoreBackend,
};
use deepagents::core::FileContent;
use deepagents::models::SpecError;
use deepagents::{
    Agent, BuildError, Checkpointer, Decision, DynamicTool, InMemoryCheckpointer, InterruptConfig,
    Message, Run, RunError, RunOptions, RuntimeContext, SubAgent, ThreadError, ToolOutput,
};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::support::{scripted, text, tool_results};

fn checkpointer() -> Arc<dyn Checkpointer> {
    Arc::new(InMemoryCheckpointer::new())
}

fn file(run: &Run, path: &str) -> Option<String> {
    run.state.files.get(path).map(|f| match &f.content {
        FileContent::Text { text } => text.clone(),
        other => panic!("{other:?}"),
    })
}

fn user_texts(run: &Run) -> Vec<String> {
    run.state
        .messages
        .iter()
        .filter(|m| matches!(m, Message::User { .. }))
        .map(Message::text)
        .collect()
}

fn tool(
    name: &str,
    answer: impl Fn(&deepagents::ToolContext) -> String + Send + Sync + 'static,
) -> Arc<DynamicTool> {
    let answer = Arc::new(answer);
    Arc::new(
        DynamicTool::new(
            name,
            "A test tool",
            json!({"type": "object"}),
            move |_, cx| {
                let answer = answer.clone();
                async move { Ok(ToolOutput::text(answer(&cx))) }
            },
        )
        .unwrap(),
    )
}

// ---- threads -----------------------------------------------------------------------------

#[tokio::test]
async fn a_thread_continues_its_conversation_and_threads_stay_apart() {
    let store = checkpointer();
    let agent = Agent::builder(scripted(json!([{"text": "first"}, {"text": "second"}])))
        .checkpointer(store.clone())
        .build()
        .unwrap();

    let thread = agent.thread("t").unwrap();
    assert_eq!(thread.id(), "t");
    assert_eq!(thread.run("hello").await.unwrap().text, "first");
    // A fresh handle on the same id continues the stored conversation.
    let output = agent.thread("t").unwrap().run("and again").await.unwrap();
    assert_eq!(output.text, "second", "the model saw the earlier turn");
    assert_eq!(user_texts(&output.run), ["hello", "and again"]);
    assert_eq!(output.run.state.messages.len(), 4);

    let stored = thread.state().await.unwrap().unwrap();
    assert_eq!(stored.state.messages, output.run.state.messages);
    assert!(!thread.history().await.unwrap().is_empty());
    assert!(
        Arc::ptr_eq(agent.checkpointer().unwrap(), &store),
        "the agent reports its checkpointer"
    );

    // Another thread starts empty.
    let other = agent.thread("u").unwrap();
    assert!(other.state().await.unwrap().is_none());
    assert!(other.history().await.unwrap().is_empty());
    let output = other.run("hi").await.unwrap();
    assert_eq!(output.text, "first");
    assert_eq!(user_texts(&output.run), ["hi"]);
}

#[tokio::test]
async fn a_thread_streams_its_events_and_saves_the_run() {
    let agent = Agent::builder(scripted(json!([{"text": "one"}, {"text": "two"}])))
        .checkpointer(checkpointer())
        .build()
        .unwrap();
    let thread = agent.thread("s").unwrap();
    thread.run("a").await.unwrap();
    let mut stream = thread.stream("b").await.unwrap();
    let mut events = 0;
    while stream.next().await.is_some() {
        events += 1;
    }
    assert!(events > 0, "the stream carried events");
    let output = stream.outcome().await.unwrap();
    assert_eq!(output.text, "two");
    let stored = thread.state().await.unwrap().unwrap();
    assert_eq!(user_texts(&stored), ["a", "b"]);
}

#[tokio::test]
async fn thread_methods_without_a_checkpointer_are_refused() {
    let agent = Agent::builder(scripted(json!([{"text": "x"}])))
        .build()
        .unwrap();
    assert!(agent.checkpointer().is_none());
    let error = agent.thread("t").unwrap_err();
    assert!(matches!(error, ThreadError::NoCheckpointer));
    assert!(
        error.to_string().contains("AgentBuilder::checkpointer"),
        "{error}"
    );
}

#[tokio::test]
async fn a_thread_pauses_then_decide_continues_it() {
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [
            {"id": "w", "name": "write_file", "args": {"file_path": "/plan.md", "content": "v1\n"}}
        ]},
        {"text": "done"}
    ])))
    .checkpointer(checkpointer())
    .interrupt_on("write_file", InterruptConfig::default())
    .build()
    .unwrap();
    let thread = agent.thread("t").unwrap();

    let failure = thread.run("plan").await.unwrap();
    let actions = crate::support::paused(&failure);
    assert_eq!(actions[0].call_id, "w");
    let pending = thread.pending().await.unwrap();
    assert_eq!(pending.len(), 1, "the pause is stored");
    assert_eq!(pending[0].name, "write_file");

    // Resuming without decisions stays paused and runs nothing.
    let failure = thread.run(deepagents::Input::Resume).await.unwrap();
    crate::support::paused(&failure);
    assert_eq!(file(&failure.run, "/plan.md"), None);

    // Wrong decisions change nothing.
    let failure = thread
        .run(deepagents::Input::Decide(vec![
            Decision::Approve,
            Decision::Approve,
        ]))
        .await
        .unwrap_err();
    assert!(
        matches!(failure.error, RunError::InvalidDecision(_)),
        "{failure}"
    );
    assert_eq!(thread.pending().await.unwrap(), pending);

    let output = thread
        .run(deepagents::Input::Decide(vec![Decision::Approve]))
        .await
        .unwrap();
    assert_eq!(output.text, "done");
    assert_eq!(file(&output.run, "/plan.md").as_deref(), Some("v1\n"));
    assert!(thread.pending().await.unwrap().is_empty());
    let stored = thread.state().await.unwrap().unwrap();
    assert_eq!(file(&stored, "/plan.md").as_deref(), Some("v1\n"));
    assert_eq!(stored.state.messages, output.run.state.messages);
}

// ---- the store ---------------------------------------------------------------------------

fn write_then(path: &str, content: &str) -> Value {
    json!([
        {"tool_calls": [
            {"id": "w", "name": "write_file", "args": {"file_path": path, "content": content}},
            {"id": "s", "name": "write_file", "args": {"file_path": "/scratch.md", "content": "tmp\n"}}
        ]},
        {"text": "saved"}
    ])
}

fn read_then(path: &str) -> Value {
    json!([
        {"tool_calls": [
            {"id": "r", "name": "read_file", "args": {"file_path": path}},
            {"id": "s", "name": "read_file", "args": {"file_path": "/scratch.md"}}
        ]},
        {"text": "read"}
    ])
}

#[tokio::test]
async fn the_builder_store_keeps_memories_across_threads() {
    let store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let threads = checkpointer();
    let build = |script: Value| {
        Agent::builder(scripted(script))
            .checkpointer(threads.clone())
            .store(store.clone())
            .build()
            .unwrap()
    };

    let output = build(write_then("/memories/fact.md", "the sky is green\n"))
        .thread("a")
        .unwrap()
        .run("remember")
        .await
        .unwrap();
    assert_eq!(output.text, "saved");
    assert!(
        !output.run.state.files.contains_key("/memories/fact.md"),
        "memories are not thread state"
    );
    assert!(output.run.state.files.contains_key("/scratch.md"));
    let item = store
        .get(&[deepagents::MEMORIES_NAMESPACE.to_owned()], "/fact.md")
        .await
        .unwrap();
    assert!(item.is_some(), "the memory is in the builder's store");

    let output = build(read_then("/memories/fact.md"))
        .thread("b")
        .unwrap()
        .run("recall")
        .await
        .unwrap();
    let results = tool_results(&output.run.state.messages);
    assert!(
        text(results[0]).contains("the sky is green"),
        "{}",
        text(results[0])
    );
    // Thread state stays per thread.
    crate::support::assert_error_containing(results[1], "scratch.md");
}

#[tokio::test]
async fn a_backend_that_routes_memories_itself_keeps_its_route() {
    let builder_store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let own_store: Arc<dyn Store> = Arc::new(InMemoryStore::new());
    let own = StoreBackend::new(own_store.clone()).with_namespace(|_| vec!["mine".to_owned()]);
    let backend: Arc<dyn Backend> = Arc::new(
        CompositeBackend::new(Arc::new(StateBackend::default()))
            .route("/memories/", Arc::new(own))
            .unwrap(),
    );
    let agent = Agent::builder(scripted(write_then("/memories/fact.md", "x\n")))
        .backend(backend)
        .store(builder_store.clone())
        .build()
        .unwrap();
    agent.invoke("remember").await.unwrap();
    assert!(
        own_store
            .get(&["mine".to_owned()], "/fact.md")
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        builder_store
            .get(&[deepagents::MEMORIES_NAMESPACE.to_owned()], "/fact.md")
            .await
            .unwrap()
            .is_none(),
        "the builder's store was not mounted over the backend's route"
    );
}

// ---- refused combinations and spec strings -----------------------------------------------

#[test]
fn an_interrupt_for_a_tool_that_is_not_offered_is_refused() {
    // The state backend has no shell, so `execute` is not offered.
    let error = Agent::builder(scripted(json!([])))
        .interrupt_on("execute", InterruptConfig::default())
        .build()
        .err()
        .expect("refused");
    let BuildError::UnknownInterruptTool {
        tool: named,
        offered,
    } = &error
    else {
        panic!("{error}");
    };
    assert_eq!(named, "execute");
    assert!(offered.iter().any(|t| t == "write_file"), "{offered:?}");
    let message = error.to_string();
    assert!(message.contains("`execute`"), "{message}");
    assert!(message.contains("write_file"), "{message}");

    let error = Agent::builder(scripted(json!([])))
        .file_tools(false)
        .interrupt_on("write_file", InterruptConfig::default())
        .build()
        .err()
        .expect("refused");
    assert!(
        matches!(&error, BuildError::UnknownInterruptTool { tool, .. } if tool == "write_file"),
        "{error}"
    );

    // Offered tools, built-in or the user's, are accepted.
    Agent::builder(scripted(json!([])))
        .dyn_tool(tool("guarded", |_| "ok".into()))
        .interrupt_on("guarded", InterruptConfig::default())
        .interrupt_on("write_file", InterruptConfig::default())
        .build()
        .unwrap();
}

#[test]
fn a_subagent_without_the_parents_interrupted_tool_still_builds() {
    // The subagent has its own tools, so it lacks `guarded`; the inherited interrupt is dropped.
    let subagent =
        SubAgent::new("helper", "Helps", "You help.").dyn_tool(tool("other", |_| "ok".into()));
    Agent::builder(scripted(json!([])))
        .dyn_tool(tool("guarded", |_| "ok".into()))
        .interrupt_on("guarded", InterruptConfig::default())
        .subagent(subagent)
        .build()
        .unwrap();
    // Its own interrupt for a tool it lacks is refused, naming it.
    let subagent = SubAgent::new("helper", "Helps", "You help.")
        .dyn_tool(tool("other", |_| "ok".into()))
        .interrupt_on("missing", InterruptConfig::default());
    let error = Agent::builder(scripted(json!([])))
        .subagent(subagent)
        .build()
        .err()
        .expect("refused");
    let message = error.to_string();
    assert!(matches!(error, BuildError::Subagent { .. }), "{message}");
    assert!(
        message.contains("helper") && message.contains("`missing`"),
        "{message}"
    );
}

#[test]
fn builder_refuses_permissions_without_file_tools() {
    let error = Agent::builder(scripted(json!([])))
        .file_tools(false)
        .permissions(Permissions::default())
        .build()
        .err()
        .expect("refused");
    assert!(
        matches!(error, BuildError::PermissionsWithoutFiles),
        "{error}"
    );
    assert!(error.to_string().contains("enable file_tools"), "{error}");
}

#[test]
fn builder_from_spec_names_an_unknown_provider() {
    let error = Agent::builder_from_spec("nosuch:model-1")
        .err()
        .expect("refused");
    assert!(
        matches!(&error, SpecError::UnknownProvider { provider, .. } if provider == "nosuch"),
        "{error}"
    );
    let message = error.to_string();
    assert!(message.contains("`nosuch`"), "{message}");
    assert!(
        message.contains("anthropic"),
        "lists the known ones: {message}"
    );

    let error = Agent::builder_from_spec("model-without-provider")
        .err()
        .expect("refused");
    assert!(
        matches!(error, SpecError::MissingProvider { .. }),
        "{error}"
    );
}

// ---- runtime context ---------------------------------------------------------------------

/// Application data of the caller's own type.
struct Tenant {
    name: String,
}

fn tenant_agent(turns: Value) -> Agent {
    let whoami = tool("whoami", |cx| match cx.run.runtime.get::<Tenant>() {
        Some(tenant) => format!("tenant {}", tenant.name),
        None => "no tenant".to_owned(),
    });
    Agent::builder(scripted(turns))
        .dyn_tool(whoami)
        .checkpointer(checkpointer())
        .build()
        .unwrap()
}

fn whoami_turns() -> Value {
    json!([{"tool_calls": [{"id": "c", "name": "whoami", "args": {}}]}, {"text": "ok"}])
}

#[tokio::test]
async fn builder_agent_tools_read_a_typed_runtime_context() {
    let agent = tenant_agent(whoami_turns());
    let options = RunOptions {
        runtime: RuntimeContext::new(Tenant {
            name: "acme".into(),
        }),
        ..RunOptions::default()
    };
    let output = agent
        .run(
            Run::from_task("who?"),
            options,
            deepagents::EventSink::discard(),
        )
        .await
        .unwrap();
    assert_eq!(
        text(tool_results(&output.run.state.messages)[0]),
        "tenant acme"
    );

    // Without it the tool sees none.
    let output = agent.invoke("who?").await.unwrap();
    assert_eq!(
        text(tool_results(&output.run.state.messages)[0]),
        "no tenant"
    );

    // A thread handle passes its options' runtime context on.
    let thread = tenant_agent(whoami_turns())
        .thread("t")
        .unwrap()
        .with_options(RunOptions {
            runtime: RuntimeContext::new(Tenant {
                name: "globex".into(),
            }),
            ..RunOptions::default()
        });
    let output = thread.run("who?").await.unwrap();
    assert_eq!(
        text(tool_results(&output.run.state.messages)[0]),
        "tenant globex"
    );
}
