//! The client against real servers: one written with the official Python SDK (`mcp` from
//! PyPI, installed by `scripts/test`; `DEEPAGENTS_TEST_MCP_PYTHON` names its Python) and the
//! reference servers from npm (`reference`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod flaky;
mod reference;
mod stop;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use deepagents_core::{
    ContentBlock, DynTool, Event, EventKind, EventSink, ToolContext, ToolError, ToolOutput,
};
use deepagents_mcp::{
    ConnectOptions, ElicitationAnswer, ElicitationRequest, Elicitor, ServerConfig, Transport,
    config, connect,
};
use serde_json::json;

/// Answers servers' questions from a script, keeping what was asked.
#[derive(Default)]
pub struct ScriptedElicitor {
    pub answers: Mutex<Vec<ElicitationAnswer>>,
    pub asked: Mutex<Vec<ElicitationRequest>>,
}

impl ScriptedElicitor {
    pub fn new(answers: Vec<ElicitationAnswer>) -> Arc<Self> {
        Arc::new(Self {
            answers: Mutex::new(answers),
            asked: Mutex::default(),
        })
    }
}

#[async_trait::async_trait]
impl Elicitor for ScriptedElicitor {
    async fn elicit(&self, request: ElicitationRequest) -> ElicitationAnswer {
        self.asked.lock().unwrap().push(request);
        let mut answers = self.answers.lock().unwrap();
        if answers.is_empty() {
            ElicitationAnswer::Decline
        } else {
            answers.remove(0)
        }
    }
}

/// A detached tool context whose events are collected.
pub fn context_with_events() -> (ToolContext, tokio::sync::mpsc::UnboundedReceiver<Event>) {
    let (events, received) = EventSink::channel();
    let mut cx = ToolContext::detached("c1", Arc::new(deepagents_core::AgentState::default()));
    cx.run.events = events;
    (cx, received)
}

/// The progress events received so far, as `(call_id, progress, total, message)`.
pub fn progress_of(
    received: &mut tokio::sync::mpsc::UnboundedReceiver<Event>,
) -> Vec<(String, f64, Option<f64>, Option<String>)> {
    let mut progress = Vec::new();
    while let Ok(event) = received.try_recv() {
        if let EventKind::ToolProgress {
            call_id,
            progress: done,
            total,
            message,
        } = event.kind
        {
            progress.push((call_id, done, total, message));
        }
    }
    progress
}

pub fn text_of(output: &ToolOutput) -> String {
    output
        .content
        .iter()
        .filter_map(ContentBlock::as_text)
        .collect::<Vec<_>>()
        .join("\n")
}

fn python() -> Option<String> {
    deepagents_test_support::mcp_python()
}

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/server.py")
}

fn server(name: &str, python: &str, text: &str) -> Vec<ServerConfig> {
    let file = Path::new("test.mcp.json");
    config::parse(
        &text
            .replace("PYTHON", python)
            .replace("SERVER", &fixture().display().to_string())
            .replace("NAME", name),
        file,
        &|var| (var == "GREETING").then(|| "hello".to_owned()),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_python_sdk_server_s_tools_work_as_agent_tools() {
    let Some(python) = python() else { return };
    let root = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    let mut servers = server(
        "fixture",
        &python,
        r#"{"mcpServers": {"NAME": {"command": "PYTHON", "args": ["SERVER"], "env": {"FIXTURE_GREETING": "${GREETING}"}, "timeout": 2, "disabled_tools": ["link"]}}}"#,
    );
    // A server that cannot start and one that never answers do not stop the others.
    servers.push(ServerConfig {
        name: "missing".into(),
        transport: Transport::Stdio {
            command: "/nonexistent/server".into(),
            args: vec![],
            env: Default::default(),
            cwd: None,
        },
        ..servers[0].clone()
    });
    servers.push(ServerConfig {
        name: "mute".into(),
        transport: Transport::Stdio {
            command: "sleep".into(),
            args: vec!["30".into()],
            env: Default::default(),
            cwd: None,
        },
        startup_timeout: Duration::from_millis(500),
        ..servers[0].clone()
    });
    let started = std::time::Instant::now();
    let connections = connect(
        &servers,
        &ConnectOptions::new(root.path()).log_dir(logs.path()),
    )
    .await;
    assert!(started.elapsed() < Duration::from_secs(20));
    let failures: Vec<&str> = connections
        .failures
        .iter()
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(failures, ["missing", "mute"], "{:?}", connections.failures);
    assert!(connections.failures[1].1.contains("startup_timeout"));
    let (tools, broken) = connections.tools();
    assert!(broken.is_empty(), "{broken:?}");
    let names: Vec<String> = tools.iter().map(|t| t.spec().name).collect();
    for expected in [
        "fixture__echo",
        "fixture__add",
        "fixture__fail",
        "fixture__slow",
        "fixture__pixel",
        "fixture__where",
    ] {
        assert!(names.contains(&expected.to_owned()), "{names:?}");
    }
    assert!(
        !names.contains(&"fixture__link".to_owned()),
        "disabled_tools ignored: {names:?}"
    );
    let tool = |name: &str| {
        tools
            .iter()
            .find(|t| t.spec().name == name)
            .unwrap()
            .clone()
    };
    let cx = || {
        ToolContext::detached(
            "c1",
            std::sync::Arc::new(deepagents_core::AgentState::default()),
        )
    };
    let text = |output: &deepagents_core::ToolOutput| {
        output
            .content
            .iter()
            .filter_map(|b| b.as_text())
            .collect::<Vec<_>>()
            .join("")
    };

    let echoed = tool("fixture__echo")
        .call(json!({"text": "hi"}), cx())
        .await
        .unwrap();
    assert_eq!(text(&echoed), "echo: hi");
    let added = tool("fixture__add")
        .call(json!({"a": 2, "b": 3}), cx())
        .await
        .unwrap();
    assert_eq!(added.artifact, Some(json!({"sum": 5})), "{added:?}");
    match tool("fixture__fail")
        .call(json!({"reason": "testing"}), cx())
        .await
    {
        Err(ToolError::RespondToModel(message)) => {
            assert!(message.contains("failed because testing"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    let pixel = tool("fixture__pixel").call(json!({}), cx()).await.unwrap();
    assert!(
        matches!(&pixel.content[0], deepagents_core::ContentBlock::Data { mime_type, .. } if mime_type == "image/png"),
        "{pixel:?}"
    );
    let slow = tokio::time::timeout(
        Duration::from_secs(10),
        tool("fixture__slow").call(json!({"seconds": 5}), cx()),
    )
    .await
    .expect("the call timeout holds");
    match slow {
        Err(ToolError::RespondToModel(message)) => {
            assert!(message.contains("did not answer"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    // Started in the session's root, with its configured environment.
    let place = tool("fixture__where").call(json!({}), cx()).await.unwrap();
    let root_path = root.path().canonicalize().unwrap();
    assert_eq!(text(&place), format!("{} hello", root_path.display()));
    // A new tool announced with tools/list_changed shows up through the tool source.
    let source = connections.tool_source();
    let before = deepagents_core::ToolSource::version(&*source);
    tool("fixture__grow").call(json!({}), cx()).await.unwrap();
    for _ in 0..50 {
        if deepagents_core::ToolSource::version(&*source) != before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_ne!(deepagents_core::ToolSource::version(&*source), before);
    let run = deepagents_core::RunContext::detached("test");
    let now: Vec<String> = deepagents_core::ToolSource::tools(&*source, &run)
        .await
        .unwrap()
        .iter()
        .map(|t| t.spec().name)
        .collect();
    assert!(now.contains(&"fixture__extra".to_owned()), "{now:?}");
    // A crash mid-call: that call fails, the server is restarted once and works again; a
    // second crash leaves its tools answering that they are unavailable.
    let crashed = |outcome: Result<deepagents_core::ToolOutput, ToolError>| match outcome {
        Err(ToolError::RespondToModel(message)) => message,
        other => panic!("{other:?}"),
    };
    let first = crashed(tool("fixture__crash").call(json!({}), cx()).await);
    assert!(first.contains("was restarted"), "{first}");
    let again = tool("fixture__echo")
        .call(json!({"text": "back"}), cx())
        .await
        .unwrap();
    assert_eq!(text(&again), "echo: back");
    let second = crashed(tool("fixture__crash").call(json!({}), cx()).await);
    assert!(second.contains("stopped again"), "{second}");
    let gone = crashed(tool("fixture__echo").call(json!({"text": "x"}), cx()).await);
    assert!(gone.contains("unavailable"), "{gone}");
    // Its stderr went to its log.
    assert!(logs.path().join("fixture.log").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn servers_given_to_an_agent_connect_on_first_use() {
    let Some(python) = python() else { return };
    let root = tempfile::tempdir().unwrap();
    let servers = server(
        "late",
        &python,
        r#"{"mcpServers": {"NAME": {"command": "PYTHON", "args": ["SERVER"]}}}"#,
    );
    let source = deepagents_mcp::lazy(servers, ConnectOptions::new(root.path()));
    assert!(source.connections().is_none());
    assert_eq!(deepagents_core::ToolSource::version(&source), 0);
    let run = deepagents_core::RunContext::detached("test");
    let tools = deepagents_core::ToolSource::tools(&source, &run)
        .await
        .unwrap();
    assert!(tools.iter().any(|t| t.spec().name == "late__echo"));
    assert_eq!(source.connections().map(|c| c.servers.len()), Some(1));
    assert_eq!(deepagents_core::ToolSource::version(&source), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn progress_questions_and_cancellation_reach_across() {
    let Some(python) = python() else { return };
    let root = tempfile::tempdir().unwrap();
    let servers = server(
        "fixture",
        &python,
        r#"{"mcpServers": {"NAME": {"command": "PYTHON", "args": ["SERVER"], "timeout": 20}}}"#,
    );
    let elicitor = ScriptedElicitor::new(vec![ElicitationAnswer::Accept(Some(
        json!({"name": "Ada", "age": 36}),
    ))]);
    let connections = connect(
        &servers,
        &ConnectOptions::new(root.path()).elicitor(elicitor.clone()),
    )
    .await;
    assert!(
        connections.failures.is_empty(),
        "{:?}",
        connections.failures
    );
    let (tools, _) = connections.tools();
    let tool = |name: &str| {
        tools
            .iter()
            .find(|t| t.spec().name == name)
            .unwrap()
            .clone()
    };

    // Progress notifications become the call's events, in order.
    let (cx, mut received) = context_with_events();
    let done = tool("fixture__steps")
        .call(json!({"count": 3}), cx)
        .await
        .unwrap();
    assert_eq!(text_of(&done), "3 steps");
    // rmcp may hand notifications over out of order; what reaches the run only ever grows.
    let progress = progress_of(&mut received);
    assert!(!progress.is_empty());
    assert!(
        progress.windows(2).all(|pair| pair[0].1 < pair[1].1),
        "{progress:?}"
    );
    for (call_id, step, total, message) in &progress {
        assert!([1.0, 2.0, 3.0].contains(step), "{progress:?}");
        assert_eq!((call_id.as_str(), *total), ("c1", Some(3.0)));
        assert_eq!(message.as_deref(), Some(format!("step {step}").as_str()));
    }

    // A question goes to the elicitor while the call waits; its answer reaches the server.
    let (cx, _) = context_with_events();
    let answered = tool("fixture__ask")
        .call(json!({}), cx.clone())
        .await
        .unwrap();
    assert_eq!(text_of(&answered), "hello Ada, 36");
    let declined = tool("fixture__ask").call(json!({}), cx).await.unwrap();
    assert_eq!(text_of(&declined), "no answer (decline)");
    let asked = elicitor.asked.lock().unwrap().clone();
    assert_eq!(asked.len(), 2);
    assert_eq!(asked[0].server, "fixture");
    assert_eq!(asked[0].message, "Who are you?");
    let deepagents_mcp::Elicitation::Form { schema } = &asked[0].kind else {
        panic!("{asked:?}")
    };
    assert_eq!(schema["properties"]["age"]["type"], "integer", "{schema}");

    // Cancelling the run ends the call at once and tells the server, which stops.
    let (cx, _) = context_with_events();
    let cancel = cx.run.cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        cancel.cancel();
    });
    let started = std::time::Instant::now();
    match tool("fixture__hang").call(json!({}), cx).await {
        Err(ToolError::RespondToModel(message)) => {
            assert!(message.contains("cancelled"), "{message}")
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5));
    let marker = root.path().join("cancelled");
    for _ in 0..100 {
        if marker.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        marker.exists(),
        "the server never heard of the cancellation"
    );
    // The connection still serves calls.
    let (cx, _) = context_with_events();
    let echoed = tool("fixture__echo")
        .call(json!({"text": "still here"}), cx)
        .await
        .unwrap();
    assert_eq!(text_of(&echoed), "echo: still here");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_built_with_a_mcp_json_calls_its_servers_tools() {
    let Some(python) = python() else { return };
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join(".mcp.json");
    std::fs::write(
        &file,
        json!({"mcpServers": {"fixture": {"command": python, "args": [fixture().display().to_string()]}}})
            .to_string(),
    )
    .unwrap();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "e", "name": "fixture__echo", "args": {"text": "from the builder"}}]},
        {"text": "done"}
    ]});
    let model = std::sync::Arc::new(
        deepagents::models::ScriptedModel::from_json(&script.to_string()).unwrap(),
    );
    let agent = deepagents::Agent::builder(model)
        .mcp_config_file(&file, ConnectOptions::new(root.path()))
        .unwrap()
        .build()
        .unwrap();
    let output = agent.invoke("go").await.unwrap();
    assert_eq!(output.text, "done");
    let echoed = output
        .run
        .state
        .messages
        .iter()
        .find_map(|m| match m {
            deepagents::Message::Tool(result) if result.tool_call_id == "e" => {
                Some(deepagents::Message::Tool(result.clone()).text())
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(echoed, "echo: from the builder");
    // A broken file names itself, the server and the key.
    std::fs::write(&file, r#"{"mcpServers": {"bad": {"command": 7}}}"#).unwrap();
    let model = std::sync::Arc::new(
        deepagents::models::ScriptedModel::from_json(&script.to_string()).unwrap(),
    );
    let error = deepagents::Agent::builder(model)
        .mcp_config_file(&file, ConnectOptions::new(root.path()))
        .err()
        .unwrap()
        .to_string();
    assert!(error.contains("mcpServers.bad.command"), "{error}");
}

/// Whether process `pid` is gone (or a zombie nobody has reaped yet).
fn gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_server_takes_what_it_started_with_it() {
    let Some(python) = python() else { return };
    let root = tempfile::tempdir().unwrap();
    let servers = server(
        "spawner",
        &python,
        r#"{"mcpServers": {"NAME": {"command": "PYTHON", "args": ["SERVER"], "env": {"FIXTURE_SPAWN": "1"}}}}"#,
    );
    let connections = connect(&servers, &ConnectOptions::new(root.path())).await;
    assert!(
        connections.failures.is_empty(),
        "{:?}",
        connections.failures
    );
    let pid = std::fs::read_to_string(root.path().join("helper.pid")).unwrap();
    assert!(!gone(&pid), "the helper should run while the server does");
    drop(connections);
    for _ in 0..100 {
        if gone(&pid) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone(&pid), "the server's helper {pid} outlived it");
}

/// Without a live asker a server's question suspends the call: the run pauses with the
/// question (message and schema) as its pending request; each answer sends the SAME call to
/// the server again (the tool runs again: `run 3`), whose questions are answered from the
/// answers so far, in order, until it finishes. Declining and cancelling reach the server.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_live_asker_a_server_s_question_pauses_the_run_until_answered() {
    use deepagents::{Decision, Input, RunStatus};
    let Some(python) = python() else { return };
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join(".mcp.json");
    std::fs::write(
        &file,
        json!({"mcpServers": {"fixture": {"command": python, "args": [fixture().display().to_string()]}}})
            .to_string(),
    )
    .unwrap();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "s", "name": "fixture__survey", "args": {}}]},
        {"text": "done"}
    ]});
    let model =
        Arc::new(deepagents::models::ScriptedModel::from_json(&script.to_string()).unwrap());
    let agent = deepagents::Agent::builder(model)
        .mcp_config_file(&file, ConnectOptions::new(root.path()))
        .unwrap()
        .checkpointer(Arc::new(deepagents::InMemoryCheckpointer::new()))
        .build()
        .unwrap();
    let pending = |output: &deepagents::RunOutput| output.run.control.pending.clone();
    let result = |output: &deepagents::RunOutput| {
        output
            .run
            .state
            .messages
            .iter()
            .find_map(|m| match m {
                deepagents::Message::Tool(result) if result.tool_call_id == "s" => {
                    Some(deepagents::Message::Tool(result.clone()).text())
                }
                _ => None,
            })
            .unwrap()
    };
    let answer = |text: &str| {
        Input::Decide(vec![Decision::Respond {
            message: text.to_owned(),
        }])
    };

    let first = agent.thread("t").unwrap().run("go").await.unwrap();
    let asked = pending(&first);
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0].tool_call_id(), "s");
    let request = asked[0].request.clone().unwrap();
    assert_eq!(request["kind"], "mcp_elicitation");
    assert_eq!(request["server"], "fixture");
    assert_eq!(request["message"], "Who are you?");
    assert_eq!(request["mode"], "form");
    assert_eq!(
        request["requestedSchema"]["properties"]["age"]["type"],
        "integer"
    );
    assert!(
        asked[0]
            .description
            .as_deref()
            .unwrap()
            .contains("sends the call to the server again"),
        "{asked:?}"
    );
    let second = agent
        .thread("t")
        .unwrap()
        .run(answer(r#"{"name": "Ada", "age": 36}"#))
        .await
        .unwrap();
    let asked = pending(&second);
    assert_eq!(
        asked[0].request.as_ref().unwrap()["message"],
        "Your colour, Ada?"
    );
    let done = agent
        .thread("t")
        .unwrap()
        .run(answer(
            r#"{"action": "accept", "content": {"colour": "blue"}}"#,
        ))
        .await
        .unwrap();
    assert_eq!(done.status, RunStatus::Finished);
    assert_eq!(result(&done), "Ada, 36, likes blue, run 3");

    // A rejection declines; "cancel" cancels: the server's tool decides what that means.
    agent.thread("d").unwrap().run("go").await.unwrap();
    let declined = agent
        .thread("d")
        .unwrap()
        .run(Input::Decide(vec![Decision::Reject { message: None }]))
        .await
        .unwrap();
    assert_eq!(result(&declined), "no answer (decline), run 5");
    agent.thread("c").unwrap().run("go").await.unwrap();
    agent
        .thread("c")
        .unwrap()
        .run(answer(r#"{"name": "Bo", "age": 7}"#))
        .await
        .unwrap();
    let cancelled = agent
        .thread("c")
        .unwrap()
        .run(answer("cancel"))
        .await
        .unwrap();
    assert_eq!(result(&cancelled), "Bo: no colour (cancel), run 8");
}
