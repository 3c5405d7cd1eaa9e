//! Summarization with a small window: trigger, tail, tool pairs, history file, chaining,
//! overflow recovery, and a long run.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use deepagents::core::{ModelRequest, ModelResponse, ModelStream};
use deepagents::middleware::{SUMMARY_KEY, SummarizationConfig, Threshold};
use deepagents::models::ScriptedModel;
use deepagents::{Agent, DynamicTool, Message, Model, ModelError, ToolOutput};
use serde_json::{Value, json};

/// Records every request, then answers with the script.
struct Recording {
    inner: ScriptedModel,
    requests: Mutex<Vec<ModelRequest>>,
    /// Fail with an overflow when a request holds more messages than this.
    overflow_above: Option<usize>,
    /// Report this many times the input tokens the script estimates (another tokenizer).
    usage_multiplier: u64,
}

#[async_trait]
impl Model for Recording {
    fn id(&self) -> &str {
        "recording"
    }
    async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        self.requests.lock().unwrap().push(request.clone());
        if let Some(limit) = self.overflow_above
            && request.messages.len() > limit
        {
            return Err(ModelError::ContextWindowExceeded {
                message: "prompt is too long".into(),
            });
        }
        let mut response = self.inner.generate(request).await?;
        response.usage.input_tokens *= self.usage_multiplier;
        Ok(response)
    }
    async fn stream(&self, request: &ModelRequest) -> Result<ModelStream, ModelError> {
        let response = self.generate(request).await?;
        Ok(Box::pin(futures::stream::iter(vec![Ok(
            deepagents::core::StreamEvent::Completed(response),
        )])))
    }
}

fn recording(script: Value, overflow_above: Option<usize>) -> Arc<Recording> {
    Arc::new(Recording {
        inner: ScriptedModel::from_json(&script.to_string()).unwrap(),
        requests: Mutex::new(Vec::new()),
        overflow_above,
        usage_multiplier: 1,
    })
}

/// A tool whose output is 1,200 characters, to fill the window quickly.
fn blob() -> Arc<DynamicTool> {
    Arc::new(
        DynamicTool::new(
            "blob",
            "Bulk output",
            json!({"type": "object"}),
            |_, _| async { Ok(ToolOutput::text("x".repeat(1_200))) },
        )
        .unwrap(),
    )
}

fn script(steps: usize, summaries: bool) -> Value {
    let mut turns: Vec<Value> = (0..steps)
        .map(|i| json!({"text": format!("step {i}"), "tool_calls": [{"id": format!("c{i}"), "name": "blob", "args": {}}]}))
        .collect();
    turns.push(json!({"text": "finished"}));
    let mut script = json!({"turns": turns});
    if summaries {
        script["conversations"] = json!([
            {"when_task_contains": "Summary of the conversation before this part", "turns": [
                {"text": "## Goal\nFill the window.\n## Decisions\nChained.\n## Files and artifacts\nnone\n## Open items\nmore blobs\n## Next step\ncall blob"}
            ]},
            {"when_task_contains": "Conversation to summarize", "turns": [
                {"text": "## Goal\nFill the window.\n## Decisions\nFirst.\n## Files and artifacts\nnone\n## Open items\nmore blobs\n## Next step\ncall blob"}
            ]}
        ]);
    }
    script
}

fn main_requests(model: &Recording) -> Vec<ModelRequest> {
    model
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| {
            r.system_prompt
                .as_deref()
                .is_none_or(|p| !p.starts_with("You compress"))
        })
        .cloned()
        .collect()
}

fn summarizer_requests(model: &Recording) -> Vec<ModelRequest> {
    model
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| {
            r.system_prompt
                .as_deref()
                .is_some_and(|p| p.starts_with("You compress"))
        })
        .cloned()
        .collect()
}

fn history(output: &deepagents::RunOutput) -> String {
    match &output.run.state.files["/conversation_history/session.md"].content {
        deepagents::core::FileContent::Text { text } => text.clone(),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn older_messages_are_summarized_with_the_tail_and_tool_pairs_intact() {
    let model = recording(script(20, true), None);
    let agent = Agent::builder(model.clone())
        .dyn_tool(blob())
        .context_window(4_000)
        .general_purpose_subagent(false)
        .build()
        .unwrap();
    let output = agent.invoke("fill the window").await.unwrap();
    assert_eq!(output.text, "finished");
    let marker = &output.run.state.custom[SUMMARY_KEY];
    let upto = marker["upto"].as_u64().unwrap() as usize;
    assert!(upto > 0);
    assert!(
        marker["count"].as_u64().unwrap() >= 2,
        "summarized more than once: {marker}"
    );

    let requests = main_requests(&model);
    let last = requests.last().unwrap();
    let Message::User { .. } = &last.messages[0] else {
        panic!("the summary leads the request");
    };
    assert!(last.messages[0].text().starts_with(
        "[Earlier conversation, summarized. The full transcript is in /conversation_history/session.md"
    ));
    assert!(last.messages[0].text().contains("## Next step"));
    // The first kept message is never a tool result cut off from its call.
    assert!(!matches!(last.messages[1], Message::Tool(_)));
    // The whole run stays in the state; the request is much smaller.
    assert_eq!(output.run.state.messages.len(), 1 + 20 * 2 + 1);
    assert!(last.messages.len() < output.run.state.messages.len() / 2);
    // Every replaced message is in the history file.
    let history = history(&output);
    for index in 0..upto {
        assert!(
            history.contains(&format!("### [{index}] ")),
            "message {index} missing"
        );
    }
    // The second summary was written from the first.
    let summarizer = summarizer_requests(&model);
    assert!(summarizer.len() >= 2);
    assert!(
        summarizer[1].messages[0]
            .text()
            .contains("Decisions\nFirst.")
    );
}

#[tokio::test]
async fn summarization_waits_for_the_trigger_and_can_be_configured_in_messages() {
    let model = recording(script(3, true), None);
    let agent = Agent::builder(model.clone())
        .dyn_tool(blob())
        .summarization_config(SummarizationConfig {
            trigger: Threshold::Messages(6),
            keep: Threshold::Messages(2),
        })
        .general_purpose_subagent(false)
        .build()
        .unwrap();
    let output = agent.invoke("go").await.unwrap();
    let requests = main_requests(&model);
    // 1, 3 and 5 messages fit; the 4th call (7 messages) triggers.
    assert!(
        requests[..3]
            .iter()
            .all(|r| !r.messages[0].text().starts_with("[Earlier"))
    );
    assert!(requests[3].messages[0].text().starts_with("[Earlier"));
    assert_eq!(
        requests[3].messages.len(),
        1 + 2,
        "summary plus the two kept messages"
    );
    assert_eq!(output.run.state.custom[SUMMARY_KEY]["upto"], 5);
}

#[tokio::test]
async fn a_provider_overflow_is_summarized_and_retried_once() {
    // The provider refuses more than 6 messages although our estimate says they fit.
    let model = recording(script(4, true), Some(6));
    let agent = Agent::builder(model.clone())
        .dyn_tool(blob())
        .general_purpose_subagent(false)
        .build()
        .unwrap();
    let output = agent.invoke("go").await.unwrap();
    assert_eq!(output.text, "finished");
    let overflow_file = output
        .run
        .state
        .files
        .keys()
        .find(|k| k.starts_with("/conversation_history/overflow-"))
        .expect("the transcript replaced on overflow is kept");
    assert!(overflow_file.ends_with(".md"));
    // After the overflow the run summarizes on its own, before the provider complains again.
    assert!(output.run.state.custom.contains_key(SUMMARY_KEY));

    // When even the retry overflows, the run fails clearly.
    let model = recording(script(4, true), Some(1));
    let agent = Agent::builder(model)
        .dyn_tool(blob())
        .general_purpose_subagent(false)
        .build()
        .unwrap();
    let failure = agent.invoke("go").await.unwrap_err();
    assert!(
        failure.to_string().contains("even after summarizing"),
        "{failure}"
    );
}

#[tokio::test]
async fn a_300_step_run_in_a_small_window_keeps_everything_recoverable() {
    let model = recording(script(300, true), None);
    let agent = Agent::builder(model.clone())
        .dyn_tool(blob())
        .context_window(8_000)
        .max_turns(400)
        .general_purpose_subagent(false)
        .build()
        .unwrap();
    let output = agent.invoke("a long task").await.unwrap();
    assert_eq!(output.text, "finished");
    let marker = &output.run.state.custom[SUMMARY_KEY];
    let count = marker["count"].as_u64().unwrap();
    assert!(count >= 10, "summarized {count} times");
    let upto = marker["upto"].as_u64().unwrap() as usize;
    let history = history(&output);
    for index in 0..upto {
        assert!(
            history.contains(&format!("### [{index}] ")),
            "message {index} missing"
        );
    }
    // No request ever exceeded the window by our own estimate.
    for request in main_requests(&model) {
        assert!(deepagents::context::estimate_tokens(&request) < 8_000);
    }
}

#[tokio::test]
async fn compact_conversation_is_refused_when_small_and_compacts_otherwise() {
    let mut turns =
        vec![json!({"tool_calls": [{"id": "early", "name": "compact_conversation", "args": {}}]})];
    for i in 0..6 {
        turns.push(json!({"text": format!("step {i}"), "tool_calls": [{"id": format!("c{i}"), "name": "blob", "args": {}}]}));
    }
    turns.push(json!({"tool_calls": [{"id": "late", "name": "compact_conversation", "args": {}}]}));
    turns.push(json!({"text": "finished"}));
    let mut script = script(0, true);
    script["turns"] = json!(turns);
    let model = recording(script, None);
    let agent = Agent::builder(model.clone())
        .dyn_tool(blob())
        .context_window(4_000)
        .compact_tool(true)
        .general_purpose_subagent(false)
        .build()
        .unwrap();
    let output = agent.invoke("go").await.unwrap();
    let results = crate::support::tool_results(&output.run.state.messages);
    crate::support::assert_error_containing(results[0], "compacting now would save little");
    assert_eq!(
        crate::support::text(results.last().unwrap()),
        "The conversation will be compacted before your next step."
    );
    let last = main_requests(&model).pop().unwrap();
    assert!(
        last.messages[0]
            .text()
            .starts_with("[Earlier conversation, summarized.")
    );
    assert_eq!(output.run.state.custom["compact_requested"], json!(false));

    let error = Agent::builder(recording(json!({"turns": []}), None))
        .summarization(false)
        .compact_tool(true)
        .build()
        .err()
        .unwrap();
    assert!(
        error
            .to_string()
            .contains("compact_tool needs summarization")
    );
}

#[tokio::test]
async fn reported_usage_corrects_the_estimate() {
    let run = |multiplier: u64| async move {
        let model = Arc::new(Recording {
            inner: ScriptedModel::from_json(&script(10, true).to_string()).unwrap(),
            requests: Mutex::new(Vec::new()),
            overflow_above: None,
            usage_multiplier: multiplier,
        });
        let agent = Agent::builder(model)
            .dyn_tool(blob())
            .context_window(8_000)
            .general_purpose_subagent(false)
            .build()
            .unwrap();
        agent.invoke("go").await.unwrap()
    };
    // By our own estimate ten blobs fit in the window…
    assert!(!run(1).await.run.state.custom.contains_key(SUMMARY_KEY));
    // …but a provider counting four times as many tokens makes the run summarize in time.
    assert!(run(4).await.run.state.custom.contains_key(SUMMARY_KEY));
}
