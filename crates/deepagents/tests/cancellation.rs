//! Cancelling a run while a tool is in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deepagents::{Agent, RunError, RunOptions, Tool, ToolContext, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Notify;

use crate::support::{assert_error_containing, scripted, text, tool_results};

struct Waits {
    started: Arc<Notify>,
    saw_cancel: Arc<AtomicBool>,
}

#[derive(Deserialize, JsonSchema)]
struct NoArgs {}

impl Tool for Waits {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "wait"
    }
    fn description(&self) -> String {
        "test".into()
    }
    async fn call(&self, _: NoArgs, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        self.started.notify_one();
        ctx.run.cancel.cancelled().await;
        self.saw_cancel.store(true, Ordering::SeqCst);
        Ok(ToolOutput::text("stopped early"))
    }
}

struct Stubborn;

impl Tool for Stubborn {
    type Args = NoArgs;
    fn name(&self) -> &str {
        "stubborn"
    }
    fn description(&self) -> String {
        "test".into()
    }
    async fn call(&self, _: NoArgs, _: ToolContext) -> Result<ToolOutput, ToolError> {
        tokio::time::sleep(Duration::from_secs(3600)).await;
        Ok(ToolOutput::text("never"))
    }
}

#[tokio::test]
async fn cancelling_mid_tool_tells_the_tool_and_keeps_the_history_valid() {
    let started = Arc::new(Notify::new());
    let saw_cancel = Arc::new(AtomicBool::new(false));
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [
            {"id": "w", "name": "wait", "args": {}},
            {"id": "s", "name": "stubborn", "args": {}}
        ]},
        {"text": "never"}
    ])))
    .tool(Waits {
        started: started.clone(),
        saw_cancel: saw_cancel.clone(),
    })
    .tool(Stubborn)
    .build()
    .unwrap();
    let options = RunOptions {
        cancel_grace: Duration::from_millis(200),
        ..RunOptions::default()
    };
    let cancel = options.cancel.clone();
    let run = deepagents::Run::from_task("go");
    let stream = agent.stream_run(run, options);
    started.notified().await;
    cancel.cancel();
    let failure = tokio::time::timeout(Duration::from_secs(10), stream.outcome())
        .await
        .expect("cancellation hung")
        .unwrap_err();
    assert!(matches!(failure.error, RunError::Cancelled));
    assert!(saw_cancel.load(Ordering::SeqCst), "the tool was not told");
    let results = tool_results(&failure.run.state.messages);
    assert_eq!(text(results[0]), "stopped early");
    assert_error_containing(results[1], "Cancelled before it finished");
    // Nothing is pending: the history is valid to resume from.
    assert!(failure.run.pending_tool_calls().is_empty());
}

#[tokio::test]
async fn a_cancelled_run_does_not_call_the_model() {
    let agent = Agent::builder(scripted(json!([]))).build().unwrap();
    let options = RunOptions::default();
    options.cancel.cancel();
    let run = deepagents::Run::from_task("go");
    let failure = agent
        .run(run, options, deepagents::EventSink::discard())
        .await
        .unwrap_err();
    assert!(matches!(failure.error, RunError::Cancelled));
    assert_eq!(failure.run.steps, 0);
}
