//! The client against a real server written with the official Python SDK (`mcp` from PyPI,
//! installed by `.ci/run`; `DEEPAGENTS_TEST_MCP_PYTHON` names its Python).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use deepagents_core::{DynTool, ToolContext, ToolError};
use deepagents_mcp::{ServerConfig, Transport, config, connect};
use serde_json::json;

fn python() -> Option<String> {
    match std::env::var("DEEPAGENTS_TEST_MCP_PYTHON") {
        Ok(python) => Some(python),
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!("DEEPAGENTS_TEST_MCP_PYTHON is not set")
        }
        Err(_) => {
            eprintln!("skipped: set DEEPAGENTS_TEST_MCP_PYTHON to a Python with `mcp` installed");
            None
        }
    }
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
    let connections = connect(&servers, root.path(), Some(logs.path())).await;
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
    let source = deepagents_mcp::lazy(servers, root.path(), None);
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
