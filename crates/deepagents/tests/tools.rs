//! Tool dispatch: concurrency, call order, argument checking, errors.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use deepagents::{
    Agent, DynamicTool, EventKind, RunOptions, Tool, ToolContext, ToolError, ToolOutput, ToolStatus,
};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{Barrier, Notify};

use crate::support::{assert_error_containing, scripted, text, tool_results};

/// Waits until all `parties` calls are running at once, then finishes in reverse call order.
struct Rendezvous {
    barrier: Arc<Barrier>,
    turns: Arc<Vec<Notify>>,
}

#[derive(Deserialize, JsonSchema)]
struct RendezvousArgs {
    index: usize,
}

impl Tool for Rendezvous {
    type Args = RendezvousArgs;
    fn name(&self) -> &str {
        "rendezvous"
    }
    fn description(&self) -> String {
        "test".into()
    }
    async fn call(&self, args: RendezvousArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        self.barrier.wait().await;
        let last = self.turns.len() - 1;
        if args.index != last {
            self.turns[args.index].notified().await;
        }
        if args.index > 0 {
            self.turns[args.index - 1].notify_one();
        }
        Ok(ToolOutput::text(format!("done {}", args.index)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_of_one_turn_run_concurrently_and_results_keep_call_order() {
    let model = scripted(json!([
        {"tool_calls": [
            {"id": "a", "name": "rendezvous", "args": {"index": 0}},
            {"id": "b", "name": "rendezvous", "args": {"index": 1}},
            {"id": "c", "name": "rendezvous", "args": {"index": 2}}
        ]},
        {"text": "all done"}
    ]));
    let tool = Rendezvous {
        barrier: Arc::new(Barrier::new(3)),
        turns: Arc::new((0..3).map(|_| Notify::new()).collect()),
    };
    let agent = Agent::builder(model).tool(tool).build().unwrap();
    let mut stream = agent.stream("go");
    let mut finished_order = Vec::new();
    let collect = async {
        use futures::StreamExt;
        while let Some(event) = stream.next().await {
            if let EventKind::ToolCallFinished { call_id, .. } = event.kind {
                finished_order.push(call_id);
            }
        }
        stream.outcome().await
    };
    // Sequential execution would deadlock at the barrier.
    let output = tokio::time::timeout(Duration::from_secs(10), collect)
        .await
        .expect("calls did not run concurrently")
        .unwrap();
    assert_eq!(finished_order, ["c", "b", "a"]);
    let results = tool_results(&output.run.state.messages);
    let ids: Vec<_> = results.iter().map(|r| r.tool_call_id.as_str()).collect();
    assert_eq!(ids, ["a", "b", "c"]);
    assert_eq!(text(results[0]), "done 0");
    assert_eq!(output.text, "all done");
}

/// Records the order in which mutating calls start and end.
struct Recorder {
    log: Arc<std::sync::Mutex<Vec<String>>>,
}

#[derive(Deserialize, JsonSchema)]
struct RecorderArgs {
    name: String,
    delay_ms: u64,
}

impl Tool for Recorder {
    type Args = RecorderArgs;
    fn name(&self) -> &str {
        "record"
    }
    fn description(&self) -> String {
        "test".into()
    }
    fn is_mutating(&self) -> bool {
        true
    }
    async fn call(&self, args: RecorderArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        self.log
            .lock()
            .unwrap()
            .push(format!("start {}", args.name));
        tokio::time::sleep(Duration::from_millis(args.delay_ms)).await;
        self.log.lock().unwrap().push(format!("end {}", args.name));
        Ok(ToolOutput::text("ok"))
    }
}

#[tokio::test]
async fn mutating_calls_run_one_after_another_in_call_order() {
    let model = scripted(json!([
        {"tool_calls": [
            {"name": "record", "args": {"name": "first", "delay_ms": 30}},
            {"name": "record", "args": {"name": "second", "delay_ms": 0}},
            {"name": "record", "args": {"name": "third", "delay_ms": 10}}
        ]},
        {"text": "ok"}
    ]));
    let log = Arc::new(std::sync::Mutex::new(Vec::new()));
    let agent = Agent::builder(model)
        .tool(Recorder { log: log.clone() })
        .build()
        .unwrap();
    agent.invoke("go").await.unwrap();
    assert_eq!(
        *log.lock().unwrap(),
        [
            "start first",
            "end first",
            "start second",
            "end second",
            "start third",
            "end third"
        ]
    );
}

#[tokio::test]
async fn unknown_tool_is_reported_to_the_model_and_the_run_goes_on() {
    let model = scripted(json!([
        {"tool_calls": [{"name": "teleport", "args": {}}]},
        {"text": "fine"}
    ]));
    let agent = Agent::builder(model).todos(true).build().unwrap();
    let output = agent.invoke("go").await.unwrap();
    let results = tool_results(&output.run.state.messages);
    assert_error_containing(results[0], "Unknown tool `teleport`");
    assert_error_containing(results[0], "write_todos");
    assert_eq!(output.text, "fine");
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct EchoArgs {
    text: String,
    #[serde(default)]
    times: u32,
}

struct Echo;

impl Tool for Echo {
    type Args = EchoArgs;
    fn name(&self) -> &str {
        "echo"
    }
    fn description(&self) -> String {
        "Echo text".into()
    }
    async fn call(&self, args: EchoArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        Ok(ToolOutput::text(
            args.text.repeat(args.times.max(1) as usize),
        ))
    }
}

fn dynamic_add() -> DynamicTool {
    DynamicTool::new(
        "add",
        "Add two integers",
        json!({
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": false
        }),
        |args, _ctx| async move {
            let sum = args["a"].as_i64().unwrap_or(0) + args["b"].as_i64().unwrap_or(0);
            Ok(ToolOutput::text(sum.to_string()))
        },
    )
    .unwrap()
}

#[tokio::test]
async fn malformed_and_invalid_arguments_become_error_results() {
    let model = scripted(json!([
        {"tool_calls": [
            {"id": "unparsable", "name": "echo", "args": "{\"text\": \"hi\""},
            {"id": "not_object", "name": "echo", "args": [1, 2]},
            {"id": "missing", "name": "echo", "args": {"times": 2}},
            {"id": "extra", "name": "echo", "args": {"text": "x", "colour": "red"}},
            {"id": "encoded", "name": "echo", "args": "{\"text\": \"ok\", \"times\": 2}"},
            {"id": "dyn_bad", "name": "add", "args": {"a": "one", "b": 2}},
            {"id": "dyn_missing", "name": "add", "args": {"a": 1}},
            {"id": "dyn_ok", "name": "add", "args": {"a": 40, "b": 2}}
        ]},
        {"text": "recovered"}
    ]));
    let agent = Agent::builder(model)
        .tool(Echo)
        .dyn_tool(Arc::new(dynamic_add()))
        .build()
        .unwrap();
    let output = agent.invoke("go").await.unwrap();
    let results = tool_results(&output.run.state.messages);
    assert_error_containing(results[0], "not valid JSON");
    assert_error_containing(results[1], "must be a JSON object, not an array");
    assert_error_containing(results[2], "\"text\" is a required property");
    assert_error_containing(results[3], "'colour' was unexpected");
    assert_eq!(results[4].status, ToolStatus::Ok);
    assert_eq!(text(results[4]), "okok");
    assert_error_containing(results[5], "at /a");
    assert_error_containing(results[6], "\"b\" is a required property");
    assert_eq!(text(results[7]), "42");
    assert_eq!(output.text, "recovered");
}

/// A wrong argument is named by its JSON path and the type it should have, for built-in and
/// typed tools alike, so the model can fix its call.
#[tokio::test]
async fn argument_errors_name_the_field_and_the_expected_type() {
    let model = scripted(json!([
        {"tool_calls": [
            {"id": "content", "name": "write_file", "args": {"file_path": "/a.txt", "content": {"text": "hi"}}},
            {"id": "status", "name": "write_todos", "args": {"todos": [
                {"content": "ok", "status": "pending"},
                {"content": "bad", "status": "finished"}
            ]}},
            {"id": "times", "name": "echo", "args": {"text": "x", "times": "two"}}
        ]},
        {"text": "recovered"}
    ]));
    let agent = Agent::builder(model)
        .tool(Echo)
        .todos(true)
        .build()
        .unwrap();
    let output = agent.invoke("go").await.unwrap();
    let results = tool_results(&output.run.state.messages);
    assert_error_containing(results[0], "at /content");
    assert_error_containing(results[0], "is not of type \"string\"");
    assert_error_containing(results[1], "at /todos/1/status");
    assert_error_containing(results[2], "at /times");
    assert_error_containing(results[2], "\"integer\"");
    assert_eq!(output.text, "recovered");
}

#[test]
fn dynamic_tool_with_an_invalid_schema_is_refused() {
    let result = DynamicTool::new("bad", "bad", json!({"type": 12}), |_, _| async {
        Ok(ToolOutput::text(""))
    });
    let error = result.err().expect("schema should be refused").to_string();
    assert!(error.contains("tool `bad`"), "{error}");
}

struct Failing;

#[derive(Deserialize, JsonSchema)]
struct FailingArgs {
    fatal: bool,
}

impl Tool for Failing {
    type Args = FailingArgs;
    fn name(&self) -> &str {
        "fail"
    }
    fn description(&self) -> String {
        "test".into()
    }
    async fn call(&self, args: FailingArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        if args.fatal {
            Err(ToolError::Fatal("the database is gone".into()))
        } else {
            Err(ToolError::RespondToModel(
                "No such record; list records first.".into(),
            ))
        }
    }
}

#[tokio::test]
async fn a_tool_error_goes_back_to_the_model() {
    let model = scripted(json!([
        {"tool_calls": [{"name": "fail", "args": {"fatal": false}}]},
        {"text": "handled"}
    ]));
    let agent = Agent::builder(model).tool(Failing).build().unwrap();
    let output = agent.invoke("go").await.unwrap();
    let results = tool_results(&output.run.state.messages);
    assert_error_containing(results[0], "list records first");
    assert_eq!(output.text, "handled");
}

#[tokio::test]
async fn a_fatal_tool_error_stops_the_run_and_keeps_sibling_results() {
    let model = scripted(json!([
        {"tool_calls": [
            {"name": "echo", "args": {"text": "kept"}},
            {"name": "fail", "args": {"fatal": true}}
        ]},
        {"text": "never reached"}
    ]));
    let agent = Agent::builder(model)
        .tool(Failing)
        .tool(Echo)
        .build()
        .unwrap();
    let failure = agent.invoke("go").await.unwrap_err();
    match &failure.error {
        deepagents::RunError::ToolFatal { tool, message } => {
            assert_eq!(tool, "fail");
            assert_eq!(message, "the database is gone");
        }
        other => panic!("unexpected error {other:?}"),
    }
    let results = tool_results(&failure.run.state.messages);
    assert_eq!(text(results[0]), "kept");
    assert_error_containing(results[1], "the database is gone");
    assert_eq!(failure.run.steps, 1);
}

struct Panicking;

#[derive(Deserialize, JsonSchema)]
struct NoArgs {}

impl Tool for Panicking {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "explode"
    }
    fn description(&self) -> String {
        "test".into()
    }
    async fn call(&self, _args: NoArgs, _ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        panic!("boom");
    }
}

#[tokio::test]
async fn a_panicking_tool_fails_only_its_own_call() {
    let model = scripted(json!([
        {"tool_calls": [
            {"name": "explode", "args": {}},
            {"name": "echo", "args": {"text": "sibling"}}
        ]},
        {"text": "survived"}
    ]));
    let agent = Agent::builder(model)
        .tool(Panicking)
        .tool(Echo)
        .build()
        .unwrap();
    let output = agent.invoke("go").await.unwrap();
    let results = tool_results(&output.run.state.messages);
    assert_error_containing(results[0], "crashed (panic: boom)");
    assert_eq!(text(results[1]), "sibling");
    assert_eq!(output.text, "survived");
}

struct ReadsRuntime {
    seen: Arc<AtomicUsize>,
}

impl Tool for ReadsRuntime {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "whoami"
    }
    fn description(&self) -> String {
        "test".into()
    }
    async fn call(&self, _args: NoArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let user = ctx
            .run
            .runtime
            .get::<String>()
            .ok_or_else(|| ToolError::Fatal("no user in the runtime context".into()))?;
        self.seen
            .fetch_add(ctx.state.messages.len(), Ordering::SeqCst);
        Ok(ToolOutput::text(format!("{user} via {}", ctx.call_id)))
    }
}

#[tokio::test]
async fn tools_see_runtime_context_state_and_call_id() {
    let model = scripted(json!([
        {"tool_calls": [{"id": "c1", "name": "whoami", "args": {}}]},
        {"text": "ok"}
    ]));
    let seen = Arc::new(AtomicUsize::new(0));
    let agent = Agent::builder(model)
        .tool(ReadsRuntime { seen: seen.clone() })
        .build()
        .unwrap();
    let run = deepagents::Run::from_task("go");
    let options = RunOptions {
        runtime: deepagents::RuntimeContext::new("alice".to_owned()),
        ..RunOptions::default()
    };
    let output = agent
        .run(run, options, deepagents::EventSink::discard())
        .await
        .unwrap();
    let results = tool_results(&output.run.state.messages);
    assert_eq!(text(results[0]), "alice via c1");
    // The user message and the assistant turn were visible to the tool.
    assert_eq!(seen.load(Ordering::SeqCst), 2);
}

#[test]
fn duplicate_and_invalid_tool_names_are_refused_at_build_time() {
    let model = scripted(json!([]));
    let error = Agent::builder(model.clone())
        .tool(Echo)
        .tool(Echo)
        .build()
        .err()
        .unwrap();
    assert!(
        error.to_string().contains("two tools are named `echo`"),
        "{error}"
    );
    let bad = DynamicTool::new("has space", "x", json!({"type": "object"}), |_, _| async {
        Ok(ToolOutput::text(""))
    })
    .unwrap();
    let error = Agent::builder(model.clone())
        .dyn_tool(Arc::new(bad))
        .build()
        .err()
        .unwrap();
    assert!(
        error.to_string().contains("`has space` is invalid"),
        "{error}"
    );
    let error = Agent::builder(model).max_turns(0).build().err().unwrap();
    assert!(error.to_string().contains("at least 1"), "{error}");
}

#[test]
fn typed_tool_schema_is_self_contained() {
    let model = scripted(json!([]));
    let agent = Agent::builder(model)
        .tool(Echo)
        .todos(true)
        .build()
        .unwrap();
    let names: Vec<_> = agent.tool_specs().iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "echo",
            "write_todos",
            "ls",
            "read_file",
            "write_file",
            "edit_file",
            "delete",
            "glob",
            "grep",
            "task"
        ],
        "user tools first, then planning, files (no execute without a shell), subagents"
    );
    let schema = &agent.tool_specs()[0].parameters;
    assert_eq!(schema["type"], "object");
    assert_eq!(schema["required"], json!(["text"]));
    assert!(schema.get("$schema").is_none());
    let todos = agent.tool_specs()[1].parameters.to_string();
    assert!(!todos.contains("$ref"), "{todos}");
    assert!(todos.contains("in_progress"), "{todos}");
}

#[tokio::test]
async fn a_tool_can_answer_for_the_run() {
    let direct = DynamicTool::new(
        "lookup",
        "Looks the answer up.",
        json!({"type": "object"}),
        |_, _| async { Ok(ToolOutput::text("found it").with_final_answer("42")) },
    )
    .unwrap();
    // The second turn would be a model call; the tool's answer ends the run first.
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"id": "a", "name": "lookup", "args": {}}]},
        {"text": "should not be asked"}
    ])))
    .dyn_tool(Arc::new(direct))
    .build()
    .unwrap();
    let output = agent.invoke("what is it?").await.unwrap();
    assert_eq!(output.text, "42");
    assert_eq!(output.run.steps, 1, "one model call");
}

/// Every description the model reads of an agent with each built-in tool: the tools' own and
/// those of their parameters.
fn descriptions(agent: &Agent) -> Vec<(String, String)> {
    fn walk(tool: &str, value: &serde_json::Value, found: &mut Vec<(String, String)>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("description", serde_json::Value::String(text)) => {
                            found.push((format!("{tool} (a parameter)"), text.clone()));
                        }
                        _ => walk(tool, value, found),
                    }
                }
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    walk(tool, item, found);
                }
            }
            _ => {}
        }
    }
    let mut found = Vec::new();
    for spec in agent.tool_specs() {
        found.push((spec.name.clone(), spec.description.clone()));
        walk(&spec.name, &spec.parameters, &mut found);
    }
    found
}

#[test]
fn built_in_tool_descriptions_have_no_stray_whitespace() {
    let root = tempfile::tempdir().unwrap();
    let shell = deepagents::backends::LocalShellBackend::new(
        deepagents::backends::FilesystemBackend::new(root.path()).unwrap(),
    );
    let agent = Agent::builder(scripted(json!([])))
        .backend(Arc::new(shell))
        .todos(true)
        .ask_user(true)
        .context_window(100_000)
        .compact_tool(true)
        .web_fetch(true)
        .response_format(json!({"type": "object", "properties": {"a": {"type": "string"}}}))
        .remote_subagent(deepagents::middleware::RemoteSubAgent {
            name: "far".into(),
            description: "Far away.".into(),
            url: "http://127.0.0.1:9".into(),
            graph_id: "g".into(),
            headers: vec![],
        })
        .build()
        .unwrap();
    let names: Vec<&str> = agent.tool_specs().iter().map(|s| s.name.as_str()).collect();
    for expected in [
        "execute",
        "write_todos",
        "ask_user",
        "web_fetch",
        "compact_conversation",
        "final_answer",
        "task",
        "start_async_task",
    ] {
        assert!(
            names.contains(&expected),
            "{expected} missing from {names:?}"
        );
    }
    let mut bad = Vec::new();
    for (tool, text) in descriptions(&agent) {
        let stray = text.is_empty()
            || text.contains("  ")
            || text.contains('\t')
            || text.lines().any(|line| line != line.trim());
        if stray {
            bad.push(format!("{tool}: {text:?}"));
        }
    }
    assert!(
        bad.is_empty(),
        "descriptions with stray whitespace:\n{}",
        bad.join("\n")
    );
}

/// `web_fetch` reads a page as Markdown, says when it cut it, and refuses what it cannot read:
/// an error status, binary content, a scheme other than http(s), a redirect loop.
#[tokio::test]
async fn web_fetch_reads_pages_as_markdown_and_refuses_what_it_cannot_read() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    let html = |body: &str| {
        ResponseTemplate::new(200).set_body_raw(body.to_owned(), "text/html; charset=utf-8")
    };
    Mock::given(method("GET"))
        .and(path("/notes"))
        .respond_with(html(
            "<html><head><title>x</title><script>var secret = 1;</script></head><body><h1>Notes</h1><p>Ship it &amp; tell <a href=\"/team\">them</a>.</p><ul><li>one</li><li>two</li></ul></body></html>",
        ))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/long"))
        .respond_with(ResponseTemplate::new(200).set_body_raw("a".repeat(5000), "text/plain"))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/huge"))
        .respond_with(
            ResponseTemplate::new(200).set_body_raw("b".repeat(6 * 1024 * 1024), "text/plain"),
        )
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/logo.png"))
        .respond_with(
            ResponseTemplate::new(200).set_body_raw(vec![0x89, b'P', b'N', b'G'], "image/png"),
        )
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/gone"))
        .respond_with(ResponseTemplate::new(404).set_body_string("no such page"))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/loop"))
        .respond_with(ResponseTemplate::new(302).insert_header("location", "/loop"))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/moved"))
        .respond_with(ResponseTemplate::new(301).insert_header("location", "/notes"))
        .mount(&server)
        .await;
    let url = |p: &str| format!("{}{p}", server.uri());
    let call = |id: &str, args: serde_json::Value| json!({"id": id, "name": deepagents::WEB_FETCH, "args": args});
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [
            call("page", json!({"url": url("/notes")})),
            call("long", json!({"url": url("/long"), "max_chars": 100})),
            call("huge", json!({"url": url("/huge"), "max_chars": 10})),
            call("png", json!({"url": url("/logo.png")})),
            call("gone", json!({"url": url("/gone")})),
            call("ftp", json!({"url": "ftp://example.com/file"})),
            call("loop", json!({"url": url("/loop")})),
            call("moved", json!({"url": url("/moved")}))
        ]},
        {"text": "read"}
    ])))
    // The mock listens on loopback, which is reached only when listed.
    .web_fetch_allowed_hosts(["127.0.0.1".to_owned()])
    .build()
    .unwrap();
    let output = agent.invoke("read them").await.unwrap();
    let results = tool_results(&output.run.state.messages);
    let by_id = |id: &str| {
        results
            .iter()
            .find(|r| r.tool_call_id == id)
            .copied()
            .unwrap_or_else(|| panic!("no result for {id}"))
    };
    let page = text(by_id("page"));
    assert!(
        page.contains(&format!(
            "# Notes\n\nShip it & tell [them]({}/team).\n\n- one\n- two",
            server.uri()
        )),
        "{page}"
    );
    assert!(!page.contains("secret") && !page.contains('<'), "{page}");
    let long = text(by_id("long"));
    assert!(
        long.contains(&"a".repeat(100)) && !long.contains(&"a".repeat(101)),
        "{long}"
    );
    assert!(
        long.contains("[Cut: 100 of 5000 characters shown"),
        "{long}"
    );
    let huge = text(by_id("huge"));
    assert!(huge.contains("the page was cut at 5242880 bytes"), "{huge}");
    assert_error_containing(by_id("png"), "image/png, not text");
    assert_error_containing(by_id("gone"), "404");
    assert_error_containing(by_id("ftp"), "only http and https");
    assert_error_containing(by_id("loop"), "redirects");
    let moved = text(by_id("moved"));
    assert!(
        moved.contains("redirected to") && moved.contains("# Notes"),
        "{moved}"
    );
}

/// Private and loopback addresses are not reached unless listed: by address, by a name that
/// resolves there, or through a redirect.
#[tokio::test]
async fn web_fetch_reaches_no_internal_address_it_was_not_allowed() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/secret"))
        .respond_with(ResponseTemplate::new(200).set_body_string("the secret"))
        .mount(&server)
        .await;
    let port = server.address().port();
    let call = |id: &str, url: String| json!({"id": id, "name": deepagents::WEB_FETCH, "args": {"url": url}});
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [
            call("ip", format!("http://127.0.0.1:{port}/secret")),
            call("name", format!("http://localhost:{port}/secret")),
            call("mapped", format!("http://[::ffff:127.0.0.1]:{port}/secret")),
            call("metadata", "http://169.254.169.254/latest/meta-data".to_owned()),
            call("private", "http://10.0.0.1/".to_owned())
        ]},
        {"text": "done"}
    ])))
    .web_fetch(true)
    .build()
    .unwrap();
    let output = agent.invoke("fetch").await.unwrap();
    let results = tool_results(&output.run.state.messages);
    assert_eq!(results.len(), 5);
    for result in &results {
        let body = text(result);
        assert!(
            !body.contains("the secret"),
            "{}: {body}",
            result.tool_call_id
        );
        assert_error_containing(result, "not");
    }
    // A public name redirecting inside is refused at the redirect: the mock plays the public
    // host by being listed, and sends the fetch to an unlisted internal port.
    let inner = MockServer::start().await;
    Mock::given(method("GET"))
        .respond_with(ResponseTemplate::new(200).set_body_string("inside"))
        .mount(&inner)
        .await;
    Mock::given(method("GET"))
        .and(path("/jump"))
        .respond_with(ResponseTemplate::new(302).insert_header(
            "location",
            format!("http://127.0.0.1:{}/", inner.address().port()),
        ))
        .mount(&server)
        .await;
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [call("jump", format!("http://127.0.0.1:{port}/jump"))]},
        {"text": "done"}
    ])))
    .web_fetch_allowed_hosts([format!("127.0.0.1:{port}")])
    .build()
    .unwrap();
    let output = agent.invoke("fetch").await.unwrap();
    let results = tool_results(&output.run.state.messages);
    assert!(!text(results[0]).contains("inside"), "{}", text(results[0]));
    assert_error_containing(results[0], "redirect");
}
