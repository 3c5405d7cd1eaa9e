//! Custom state under concurrent updates: merged by declared rules, in call order.

use std::sync::Arc;
use std::time::Duration;

use deepagents::{Agent, DynamicTool, Reducer, StateUpdate, ToolOutput};
use serde_json::{Value, json};

use crate::support::scripted;

/// A tool that sleeps `delay_ms`, then proposes one update to every custom key.
fn updater() -> DynamicTool {
    DynamicTool::new(
        "update",
        "test",
        json!({"type": "object", "properties": {"tag": {"type": "string"}, "delay_ms": {"type": "integer"}}}),
        |args, _ctx| async move {
            let delay = args["delay_ms"].as_u64().unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(delay)).await;
            let tag = args["tag"].as_str().unwrap_or_default().to_owned();
            let update = StateUpdate::default()
                .with_custom("log", json!(tag))
                .with_custom("last", json!(tag))
                .with_custom("seen", json!({ tag.clone(): true }))
                .with_custom("total", json!(tag.len()));
            Ok(ToolOutput::text("ok").with_update(update))
        },
    )
    .unwrap()
}

#[tokio::test]
async fn concurrent_updates_merge_by_rule_in_call_order() {
    // The calls finish in reverse order; the merge must not care.
    let model = scripted(json!([
        {"tool_calls": [
            {"name": "update", "args": {"tag": "a", "delay_ms": 60}},
            {"name": "update", "args": {"tag": "bb", "delay_ms": 30}},
            {"name": "update", "args": {"tag": "ccc", "delay_ms": 0}}
        ]},
        {"tool_calls": [{"name": "update", "args": {"tag": "dddd", "delay_ms": 0}}]},
        {"text": "done"}
    ]));
    let sum = Reducer::custom(|current, update| {
        let current = current.and_then(Value::as_u64).unwrap_or(0);
        let update = update.as_u64().ok_or("total takes numbers")?;
        Ok(json!(current + update))
    });
    let agent = Agent::builder(model)
        .dyn_tool(Arc::new(updater()))
        .state_value("log", Reducer::Append)
        .state_value("last", Reducer::Replace)
        .state_value("seen", Reducer::MergeMap)
        .state_value("total", sum)
        .build()
        .unwrap();
    let output = agent.invoke("go").await.unwrap();
    let custom = &output.run.state.custom;
    assert_eq!(custom["log"], json!(["a", "bb", "ccc", "dddd"]));
    assert_eq!(custom["last"], json!("dddd"));
    assert_eq!(
        custom["seen"],
        json!({"a": true, "bb": true, "ccc": true, "dddd": true})
    );
    assert_eq!(custom["total"], json!(10));
}

#[test]
fn conflicting_declarations_are_refused_at_build_time() {
    let error = Agent::builder(scripted(json!([])))
        .state_value("k", Reducer::Append)
        .state_value("k", Reducer::Replace)
        .build()
        .err()
        .unwrap();
    assert!(error.to_string().contains("declared twice"), "{error}");
}
