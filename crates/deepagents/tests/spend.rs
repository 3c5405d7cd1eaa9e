//! Cost tracking and spend caps: every model call of a run's tree charged at its model's
//! prices, caps checked before each call, a stopped run resumable with a higher cap.

use std::sync::Arc;

use deepagents::core::{Prices, SpendLimits};
use deepagents::models::ScriptedModel;
use deepagents::{Agent, RunError, RunOptions};
use serde_json::{Value, json};

/// One turn reporting 1,000 prompt tokens and 100 answer tokens.
fn turn(extra: Value) -> Value {
    let mut turn = json!({"usage": {"input_tokens": 1000, "output_tokens": 100}});
    if let (Some(turn), Some(extra)) = (turn.as_object_mut(), extra.as_object()) {
        turn.extend(extra.clone());
    }
    turn
}

/// $1 per million prompt tokens, $10 per million answer tokens: each turn costs $0.002.
fn prices(_model: &str) -> Option<Prices> {
    Some(Prices {
        input: 1.0,
        cached_input: 0.1,
        cache_write: 1.0,
        output: 10.0,
    })
}

fn ls(id: &str) -> Value {
    json!({"tool_calls": [{"id": id, "name": "ls", "args": {}}]})
}

/// A cost cap on a model without prices could never stop a run: the agent is not built.
#[test]
fn a_cost_cap_without_prices_is_refused_when_the_agent_is_built() {
    let model = Arc::new(ScriptedModel::from_json(r#"{"turns": [{"text": "x"}]}"#).unwrap());
    let refused = Agent::builder(model.clone())
        .spend_limits(SpendLimits {
            max_cost_usd: Some(1.0),
            max_tokens: None,
        })
        .build()
        .err()
        .unwrap();
    assert!(
        matches!(refused, deepagents::BuildError::UnpricedCostCap { .. }),
        "{refused}"
    );
    assert!(refused.to_string().contains("max_tokens"), "{refused}");
    // A token cap needs no prices.
    Agent::builder(model)
        .spend_limits(SpendLimits {
            max_cost_usd: None,
            max_tokens: Some(10),
        })
        .build()
        .unwrap();
}

#[tokio::test]
async fn a_run_stops_before_the_call_that_would_cross_its_cap_and_resumes_with_a_higher_one() {
    let script = json!({"turns": [
        turn(ls("a")), turn(ls("b")), turn(ls("c")), turn(ls("d")), turn(json!({"text": "done"}))
    ]});
    let model = Arc::new(ScriptedModel::from_json(&script.to_string()).unwrap());
    let agent = Agent::builder(model)
        .spend_limits(SpendLimits {
            max_cost_usd: Some(0.0065),
            max_tokens: None,
        })
        .prices(prices)
        .build()
        .unwrap();
    let failure = agent.invoke("go").await.err().unwrap();
    // $0.004 after two calls, $0.006 after three; the fourth, with its ~1.7k-token prompt
    // ($0.0017), would cross $0.0065 and is not made.
    let RunError::SpendCap(cap) = &failure.error else {
        panic!("{failure}")
    };
    assert!((cap.spent.cost_usd - 0.006).abs() < 1e-9, "{cap:?}");
    assert!(
        failure.to_string().contains("higher cost cap") && !failure.to_string().contains("--"),
        "{failure}"
    );
    assert_eq!(failure.run.steps, 3);
    assert_eq!(failure.run.spent.usage.input_tokens, 3000);
    // Resumed with a higher cap, it goes on from where it stopped: nothing made twice.
    let output = agent
        .run(
            *failure.run,
            RunOptions {
                spend_limits: Some(SpendLimits {
                    max_cost_usd: Some(1.0),
                    max_tokens: None,
                }),
                ..RunOptions::default()
            },
            deepagents::core::EventSink::discard(),
        )
        .await
        .unwrap();
    assert_eq!(output.text, "done");
    assert_eq!(output.run.steps, 5);
    assert!((output.run.spent.cost_usd - 0.010).abs() < 1e-9);
    assert_eq!(output.run.spent.usage.output_tokens, 500);
    assert!((output.run.total_spent.cost_usd - 0.010).abs() < 1e-9);
}

#[tokio::test]
async fn subagents_spend_from_their_parent_s_budget() {
    let script = json!({
        "turns": [
            turn(json!({"tool_calls": [{"id": "t", "name": "task", "args": {"description": "alpha: look", "subagent_type": "general-purpose"}}]})),
            turn(json!({"text": "done"}))
        ],
        "conversations": [{"when_task_contains": "alpha:", "turns": [
            turn(ls("s1")), turn(ls("s2")), turn(json!({"text": "looked"}))
        ]}]
    });
    let model = Arc::new(ScriptedModel::from_json(&script.to_string()).unwrap());
    let roomy = Agent::builder(model.clone())
        .prices(prices)
        .build()
        .unwrap();
    let output = roomy.invoke("go").await.unwrap();
    // Two calls of its own, three of the subagent's.
    assert_eq!(output.run.spent.usage.input_tokens, 5000);
    assert!((output.run.spent.cost_usd - 0.010).abs() < 1e-9);

    // A token cap stops the subagent mid-task; the parent learns why.
    let script = json!({
        "turns": [
            turn(json!({"tool_calls": [{"id": "t", "name": "task", "args": {"description": "alpha: look", "subagent_type": "general-purpose"}}]})),
            turn(json!({"text": "done"}))
        ],
        "conversations": [{"when_task_contains": "alpha:", "turns": [
            turn(ls("s1")), turn(ls("s2")), turn(json!({"text": "looked"}))
        ]}]
    });
    let model = Arc::new(ScriptedModel::from_json(&script.to_string()).unwrap());
    let capped = Agent::builder(model)
        .spend_limits(SpendLimits {
            max_cost_usd: None,
            max_tokens: Some(3_000),
        })
        .build()
        .unwrap();
    let outcome = capped.invoke("go").await;
    let spent = match &outcome {
        Ok(output) => output.run.spent,
        Err(failure) => failure.run.spent,
    };
    assert!(
        spent.tokens() <= 3_000 + 1_100,
        "past the cap by more than one call: {spent:?}"
    );
    assert!(spent.usage.input_tokens < 5_000, "{spent:?}");
}
