//! Stopping servers: a stdio server's whole process group goes, and it is not restarted.
//! The server here is a few lines of Python speaking JSON-RPC, so no SDK is needed.

use std::path::Path;
use std::time::Duration;

use deepagents_core::{DynTool, ToolContext, ToolError};
use deepagents_mcp::{ConnectOptions, config, connect};
use serde_json::json;

/// A server that starts a child (`sleep 300.MARK`), then answers `initialize`, `tools/list`
/// (one tool, `ping`) and `tools/call`.
const SERVER: &str = r#"
import json, subprocess, sys
subprocess.Popen(['sleep', '300.MARK'])
for line in sys.stdin:
    message = json.loads(line)
    if 'id' not in message:
        continue
    method = message['method']
    if method == 'initialize':
        result = {'protocolVersion': message['params']['protocolVersion'],
                  'capabilities': {'tools': {}}, 'serverInfo': {'name': 'tiny', 'version': '1'}}
    elif method == 'tools/list':
        result = {'tools': [{'name': 'ping', 'description': 'Ping.',
                             'inputSchema': {'type': 'object'}}]}
    elif method == 'tools/call':
        result = {'content': [{'type': 'text', 'text': 'pong'}]}
    else:
        result = {}
    print(json.dumps({'jsonrpc': '2.0', 'id': message['id'], 'result': result}), flush=True)
"#;

/// The living processes whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|raw| String::from_utf8_lossy(&raw).replace('\0', " "))
        .filter(|line| line.contains(marker))
        .collect()
}

async fn gone_within(marker: &str, limit: Duration) -> bool {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if processes_with(marker).is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    processes_with(marker).is_empty()
}

fn tiny_server(dir: &Path, mark: &str) -> Vec<deepagents_mcp::ServerConfig> {
    let script = dir.join("tiny.py");
    std::fs::write(&script, SERVER.replace("MARK", mark)).unwrap();
    let text = json!({"mcpServers": {"tiny": {"command": "python3", "args": [script]}}});
    config::parse(&text.to_string(), Path::new("tiny.mcp.json"), &|_| None).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_server_is_killed_with_its_children_and_not_restarted() {
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(std::env::var_os("CI").is_none(), "python3 is missing");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let mark = format!("{}1", std::process::id());
    let connections = connect(
        &tiny_server(root.path(), &mark),
        &ConnectOptions::new(root.path()),
    )
    .await;
    assert!(
        connections.failures.is_empty(),
        "{:?}",
        connections.failures
    );
    let (tools, _) = connections.tools();
    let ping = tools[0].clone();
    let cx = || ToolContext::detached("c1", std::sync::Arc::new(Default::default()));
    assert!(ping.call(json!({}), cx()).await.is_ok());
    assert_eq!(processes_with(&format!("sleep 300.{mark}")).len(), 1);

    connections.stop();
    assert!(
        gone_within(&mark, Duration::from_secs(5)).await,
        "left: {:?}",
        processes_with(&mark)
    );
    // The tools outlive the stop, but the server does not come back for them.
    let refused = ping.call(json!({}), cx()).await;
    assert!(
        matches!(&refused, Err(ToolError::RespondToModel(why)) if why.contains("stopped")),
        "{refused:?}"
    );
    assert!(processes_with(&mark).is_empty(), "it was restarted");
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_the_connections_stops_servers_whose_tools_are_still_held() {
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(std::env::var_os("CI").is_none(), "python3 is missing");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let mark = format!("{}2", std::process::id());
    let connections = connect(
        &tiny_server(root.path(), &mark),
        &ConnectOptions::new(root.path()),
    )
    .await;
    assert!(
        connections.failures.is_empty(),
        "{:?}",
        connections.failures
    );
    let source = connections.tool_source();
    assert_eq!(processes_with(&format!("sleep 300.{mark}")).len(), 1);
    drop(connections);
    assert!(
        gone_within(&mark, Duration::from_secs(5)).await,
        "left: {:?}",
        processes_with(&mark)
    );
    drop(source);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_abandoned_start_kills_the_server_and_its_children() {
    if std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(std::env::var_os("CI").is_none(), "python3 is missing");
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let mark = format!("{}3", std::process::id());
    // This one starts its child, then never answers.
    let script = root.path().join("mute.py");
    std::fs::write(
        &script,
        format!(
            "import subprocess, sys, time\nsubprocess.Popen(['sleep', '300.{mark}'])\nsys.stdin.readline()\ntime.sleep(300)\n"
        ),
    )
    .unwrap();
    let text = json!({"mcpServers": {"mute": {"command": "python3", "args": [script]}}});
    let servers = config::parse(&text.to_string(), Path::new("mute.mcp.json"), &|_| None).unwrap();
    let options = ConnectOptions::new(root.path());
    let starting = connect(&servers, &options);
    // Abandoned once the child runs (as a signal during start-up abandons it).
    let abandoned = tokio::time::timeout(Duration::from_secs(20), async {
        tokio::pin!(starting);
        loop {
            tokio::select! {
                _ = &mut starting => panic!("the mute server connected"),
                () = tokio::time::sleep(Duration::from_millis(50)) => {
                    if !processes_with(&format!("sleep 300.{mark}")).is_empty() {
                        return;
                    }
                }
            }
        }
    })
    .await;
    assert!(abandoned.is_ok(), "the mute server's child never started");
    assert!(
        gone_within(&mark, Duration::from_secs(5)).await,
        "left: {:?}",
        processes_with(&mark)
    );
}
