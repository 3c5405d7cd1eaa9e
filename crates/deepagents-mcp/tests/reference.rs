//! The reference MCP servers from npm (`@modelcontextprotocol/server-everything` over stdio
//! and streamable HTTP, `@modelcontextprotocol/server-filesystem` over stdio), installed by
//! `scripts/test`; `DEEPAGENTS_TEST_MCP_NPM` names their `node_modules`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use deepagents_core::{ContentBlock, DynTool, DynamicTool, ToolError};
use deepagents_mcp::{
    ConnectOptions, Connections, Elicitation, ElicitationAnswer, ServerConfig, config, connect,
};
use serde_json::{Value, json};

use crate::{ScriptedElicitor, context_with_events, progress_of, text_of};

fn node_modules() -> Option<PathBuf> {
    deepagents_test_support::mcp_node_modules()
}

fn everything(modules: &Path) -> String {
    deepagents_test_support::everything_server(modules)
        .display()
        .to_string()
}

fn servers(text: &str) -> Vec<ServerConfig> {
    config::parse(text, Path::new("reference.mcp.json"), &|_| None).unwrap()
}

fn tool(connections: &Connections, name: &str) -> DynamicTool {
    let server = connections
        .servers
        .iter()
        .find(|s| name.starts_with(&format!("{}__", s.config.name)))
        .unwrap();
    server
        .agent_tools()
        .into_iter()
        .map(Result::unwrap)
        .find(|t| t.spec().name == name)
        .unwrap_or_else(|| panic!("no tool {name}: {:?}", server.tools))
}

/// Every kind of result, progress and a question, the same over either transport.
async fn exercise_everything(connections: &Connections, server: &str, elicitor: &ScriptedElicitor) {
    assert!(
        connections.failures.is_empty(),
        "{:?}",
        connections.failures
    );
    let name = |tool: &str| format!("{server}__{tool}");
    let (cx, mut received) = context_with_events();

    let echoed = tool(connections, &name("echo"))
        .call(json!({"message": "hi"}), cx.clone())
        .await
        .unwrap();
    assert_eq!(text_of(&echoed), "Echo: hi");

    let image = tool(connections, &name("get-tiny-image"))
        .call(json!({}), cx.clone())
        .await
        .unwrap();
    assert!(
        image.content.iter().any(
            |b| matches!(b, ContentBlock::Data { mime_type, data } if mime_type == "image/png" && data.starts_with(b"\x89PNG"))
        ),
        "{image:?}"
    );

    let weather = tool(connections, &name("get-structured-content"))
        .call(json!({"location": "New York"}), cx.clone())
        .await
        .unwrap();
    let artifact = weather.artifact.clone().unwrap();
    assert!(artifact.is_object(), "{weather:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&text_of(&weather)).unwrap(),
        artifact
    );

    let links = tool(connections, &name("get-resource-links"))
        .call(json!({"count": 2}), cx.clone())
        .await
        .unwrap();
    let links = text_of(&links);
    assert_eq!(links.matches("[resource link]").count(), 2, "{links}");

    let long = tool(connections, &name("trigger-long-running-operation"))
        .call(json!({"duration": 0.3, "steps": 3}), cx.clone())
        .await
        .unwrap();
    assert!(text_of(&long).contains("completed"), "{long:?}");
    // Reported while the call runs (the last report races the answer, and what comes after
    // the answer is dropped: the call has ended).
    let progress: Vec<(String, f64, Option<f64>)> = progress_of(&mut received)
        .into_iter()
        .map(|(call, done, total, _)| (call, done, total))
        .collect();
    assert!(
        progress.starts_with(&[("c1".into(), 1.0, Some(3.0)), ("c1".into(), 2.0, Some(3.0))]),
        "{progress:?}"
    );

    // The elicitor answers during the call; its answer reaches the server.
    let asked = tool(connections, &name("trigger-elicitation-request"))
        .call(json!({}), cx.clone())
        .await
        .unwrap();
    let asked = text_of(&asked);
    assert!(asked.contains("- Name: Grace"), "{asked}");
    let question = elicitor.asked.lock().unwrap().pop().unwrap();
    assert_eq!(question.server, server);
    let Elicitation::Form { schema } = question.kind else {
        panic!("{question:?}")
    };
    assert_eq!(schema["properties"]["name"]["type"], "string", "{schema}");

    // Arguments the server rejects come back as an error the model can read.
    match tool(connections, &name("get-sum"))
        .call(json!({"a": "x", "b": 1}), cx)
        .await
    {
        Err(ToolError::RespondToModel(message)) => assert!(!message.is_empty()),
        other => panic!("{other:?}"),
    }
}

fn grace() -> std::sync::Arc<ScriptedElicitor> {
    ScriptedElicitor::new(vec![ElicitationAnswer::Accept(Some(
        json!({"name": "Grace", "check": true, "email": "grace@example.com"}),
    ))])
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reference_everything_server_works_over_stdio() {
    let Some(modules) = node_modules() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    let servers = servers(
        &json!({"mcpServers": {"everything": {"command": "node", "args": [everything(&modules), "stdio"]}}})
            .to_string(),
    );
    let elicitor = grace();
    let connections = connect(
        &servers,
        &ConnectOptions::new(root.path()).elicitor(elicitor.clone()),
    )
    .await;
    exercise_everything(&connections, "everything", &elicitor).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reference_everything_server_works_over_streamable_http() {
    let Some(modules) = node_modules() else {
        return;
    };
    let http = deepagents_test_support::EverythingHttp::start(&modules);
    let root = tempfile::tempdir().unwrap();
    let servers = servers(
        &json!({"mcpServers": {"web": {"type": "http", "url": http.url, "headers": {"X-Test": "1"}}}})
            .to_string(),
    );
    let elicitor = grace();
    let connections = connect(
        &servers,
        &ConnectOptions::new(root.path()).elicitor(elicitor.clone()),
    )
    .await;
    exercise_everything(&connections, "web", &elicitor).await;
    // Without someone to answer live, elicitation is still offered (a question suspends the
    // call), so the server offers its tool that asks.
    let connections = connect(&servers, &ConnectOptions::new(root.path())).await;
    assert!(
        connections.failures.is_empty(),
        "{:?}",
        connections.failures
    );
    let names: Vec<&str> = connections.servers[0]
        .tools
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&"echo"), "{names:?}");
    assert!(names.contains(&"trigger-elicitation-request"), "{names:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reference_everything_server_works_over_legacy_sse() {
    let Some(modules) = node_modules() else {
        return;
    };
    let sse = deepagents_test_support::EverythingHttp::start_legacy_sse(&modules);
    let root = tempfile::tempdir().unwrap();
    let servers =
        servers(&json!({"mcpServers": {"old": {"type": "sse", "url": sse.url}}}).to_string());
    let elicitor = grace();
    let connections = connect(
        &servers,
        &ConnectOptions::new(root.path()).elicitor(elicitor.clone()),
    )
    .await;
    exercise_everything(&connections, "old", &elicitor).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_http_server_that_is_not_there_is_reported_and_skipped() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let servers = servers(
        &json!({"mcpServers": {"gone": {"type": "http", "url": format!("http://127.0.0.1:{port}/mcp"), "startup_timeout": 5}}})
            .to_string(),
    );
    let root = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let connections = connect(&servers, &ConnectOptions::new(root.path())).await;
    assert!(started.elapsed() < Duration::from_secs(6));
    assert_eq!(connections.failures.len(), 1);
    assert_eq!(connections.failures[0].0, "gone");
    assert!(!connections.failures[0].1.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reference_filesystem_server_reads_and_writes_in_the_allowed_directory() {
    let Some(modules) = node_modules() else {
        return;
    };
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("notes.txt"), "remember the milk").unwrap();
    let server = modules
        .join("@modelcontextprotocol/server-filesystem/dist/index.js")
        .display()
        .to_string();
    let servers = servers(
        &json!({"mcpServers": {"fs": {"command": "node", "args": [server, "."]}}}).to_string(),
    );
    // "." is the session's root: stdio servers start there.
    let connections = connect(&servers, &ConnectOptions::new(root.path())).await;
    assert!(
        connections.failures.is_empty(),
        "{:?}",
        connections.failures
    );
    let (cx, _) = context_with_events();
    let read = tool(&connections, "fs__read_text_file")
        .call(json!({"path": root.path().join("notes.txt")}), cx.clone())
        .await
        .unwrap();
    assert_eq!(text_of(&read), "remember the milk");
    let target = root.path().join("out.txt");
    tool(&connections, "fs__write_file")
        .call(json!({"path": target, "content": "written"}), cx.clone())
        .await
        .unwrap();
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "written");
    // Outside the allowed directory: an error result, nothing read.
    match tool(&connections, "fs__read_text_file")
        .call(json!({"path": "/etc/hostname"}), cx)
        .await
    {
        Err(ToolError::RespondToModel(message)) => {
            assert!(
                message.contains("denied") || message.contains("outside"),
                "{message}"
            )
        }
        other => panic!("{other:?}"),
    }
    // Its annotations are used: reading is not mutating, writing is.
    assert!(!tool(&connections, "fs__read_text_file").is_mutating());
    assert!(tool(&connections, "fs__write_file").is_mutating());
}
