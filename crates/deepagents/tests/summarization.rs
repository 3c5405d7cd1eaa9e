//! Summarization with a small window: trigger, tail, tool pairs, history file per thread,
//! chaining, events, overflow recovery, the summarizer's own budget, and a long run.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use deepagents::backends::FilesystemBackend;
use deepagents::context::estimate_tokens;
use deepagents::core::{Event, EventKind, ModelRequest, ModelResponse, ModelStream};
use deepagents::middleware::{SUMMARY_KEY, SummarizationConfig, Threshold};
use deepagents::models::ScriptedModel;
use deepagents::{
    Agent, DynamicTool, EventSink, InMemoryCheckpointer, Message, Model, ModelError, Run,
    RunOptions, RunOutput, ToolOutput, open_thread,
};
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
    blob_of(1_200)
}

/// A tool whose output is `size` characters, each call's different from the others'.
fn blob_of(size: usize) -> Arc<DynamicTool> {
    Arc::new(
        DynamicTool::new(
            "blob",
            "Bulk output",
            json!({"type": "object"}),
            move |_, ctx| async move {
                let id = ctx.call_id.clone();
                Ok(ToolOutput::text(format!(
                    "{id}:{}",
                    "x".repeat(size.saturating_sub(id.len() + 1))
                )))
            },
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

fn text_of(file: &deepagents::core::FileData) -> String {
    match &file.content {
        deepagents::core::FileContent::Text { text } => text.clone(),
        other => panic!("{other:?}"),
    }
}

/// The run's history file and its text: exactly one, and the one its marker names.
fn history(output: &RunOutput) -> (String, String) {
    let files: Vec<_> = output
        .run
        .state
        .files
        .iter()
        .filter(|(path, _)| path.starts_with("/conversation_history/"))
        .collect();
    assert_eq!(
        files.len(),
        1,
        "one history file per run: {:?}",
        files.iter().map(|(p, _)| p).collect::<Vec<_>>()
    );
    let (path, file) = files[0];
    assert_eq!(output.run.state.custom[SUMMARY_KEY]["history_file"], **path);
    assert!(path.ends_with(".md"), "{path}");
    (path.clone(), text_of(file))
}

/// Asserts that every message before `upto` can be read back from `history`: its header
/// appears once, and its section holds its text, its tool calls and their arguments.
fn assert_recoverable(history: &str, messages: &[Message], upto: usize) {
    for (index, message) in messages[..upto].iter().enumerate() {
        let header = format!("### [{index}] ");
        assert_eq!(
            history.matches(&header).count(),
            1,
            "message {index} is in the history once"
        );
        let start = history.find(&header).unwrap();
        let rest = &history[start + header.len()..];
        let section = &rest[..rest.find("\n### [").unwrap_or(rest.len())];
        assert!(
            section.contains(&message.text()),
            "message {index}'s text is in its section: {section}"
        );
        match message {
            Message::Assistant(assistant) => {
                for call in &assistant.tool_calls {
                    assert!(section.contains(&format!(
                        "`{}` ({}): {}",
                        call.name, call.id, call.arguments
                    )));
                }
            }
            Message::Tool(result) => {
                assert!(section.contains(&result.tool_call_id));
                assert!(section.contains(&format!("tool `{}`", result.name)));
            }
            Message::User { .. } => assert!(section.starts_with("user\n")),
            Message::System { .. } => assert!(section.starts_with("system\n")),
        }
    }
}

/// Runs `run` and returns its output with every event it emitted.
async fn run_with_events(agent: &Agent, run: Run, options: RunOptions) -> (RunOutput, Vec<Event>) {
    let (sink, mut receiver) = EventSink::channel();
    let output = agent.run(run, options, sink).await.unwrap();
    let mut events = Vec::new();
    while let Ok(event) = receiver.try_recv() {
        events.push(event);
    }
    (output, events)
}

/// The `summarized` events among `events`, as JSON.
fn summarized(events: &[Event]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Summarized { .. }))
        .map(|e| serde_json::to_value(e).unwrap())
        .collect()
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
    let (output, events) = run_with_events(
        &agent,
        Run::from_task("fill the window"),
        RunOptions::default(),
    )
    .await;
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
    let (history_file, history) = history(&output);
    assert!(last.messages[0].text().starts_with(&format!(
        "[Earlier conversation, summarized. The full transcript is in {history_file};"
    )));
    assert!(last.messages[0].text().contains("## Next step"));
    // The first kept message is never a tool result cut off from its call.
    assert!(!matches!(last.messages[1], Message::Tool(_)));
    // The whole run stays in the state; the request is much smaller.
    assert_eq!(output.run.state.messages.len(), 1 + 20 * 2 + 1);
    assert!(last.messages.len() < output.run.state.messages.len() / 2);
    // Every replaced message is in the history file.
    assert_recoverable(&history, &output.run.state.messages, upto);
    // Each summarization was announced once, saying what it replaced and where it went.
    let announced = summarized(&events);
    assert_eq!(announced.len() as u64, marker["count"].as_u64().unwrap());
    let mut kept_from = 0;
    for event in &announced {
        assert_eq!(event["path"], json!([]));
        assert_eq!(event["trigger"], "threshold");
        assert_eq!(event["history_file"], history_file);
        let replaced = event["replaced"].as_u64().unwrap();
        assert!(replaced > 0);
        assert_eq!(event["kept_from"].as_u64().unwrap(), kept_from + replaced);
        kept_from += replaced;
    }
    assert_eq!(kept_from as usize, upto);
    // Each is announced with the model call whose request it shortened.
    let kinds: Vec<&EventKind> = events.iter().map(|e| &e.kind).collect();
    for (index, kind) in kinds.iter().enumerate() {
        if matches!(kind, EventKind::Summarized { .. }) {
            assert!(matches!(
                kinds[index - 1],
                EventKind::ModelCallStarted { .. }
            ));
        }
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
    let (output, events) =
        run_with_events(&agent, Run::from_task("go"), RunOptions::default()).await;
    assert_eq!(output.text, "finished");
    // The overflow's summary is the run's: recorded in the marker, its transcript in the
    // run's one history file, numbered as in the run.
    let (history_file, history) = history(&output);
    let marker = &output.run.state.custom[SUMMARY_KEY];
    let upto = marker["upto"].as_u64().unwrap() as usize;
    assert_eq!(
        upto, 5,
        "all but the latest exchange of the 7 messages sent"
    );
    assert_recoverable(&history, &output.run.state.messages, upto);
    let announced = summarized(&events);
    assert_eq!(announced.len(), 1, "{announced:?}");
    assert_eq!(announced[0]["trigger"], "context_overflow");
    assert_eq!(announced[0]["replaced"], 5);
    assert_eq!(announced[0]["kept_from"], 5);
    assert_eq!(announced[0]["history_file"], history_file);
    // After the retry the requests carry the recorded summary; none overflowed again.
    let requests = main_requests(&model);
    let overflowed = requests.iter().filter(|r| r.messages.len() > 6).count();
    assert_eq!(overflowed, 1);
    assert!(
        requests.last().unwrap().messages[0]
            .text()
            .starts_with("[Earlier")
    );

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
async fn each_thread_appends_to_its_own_history_file() {
    let root = tempfile::tempdir().unwrap();
    let backend = Arc::new(FilesystemBackend::builder(root.path()).build().unwrap());
    // Twelve blobs, an answer, then twelve more and another answer for the thread's next turn.
    let mut turns: Vec<Value> = Vec::new();
    for round in 0..2 {
        for i in 0..12 {
            turns.push(json!({"text": format!("step {round}.{i}"), "tool_calls": [{"id": format!("c{round}_{i}"), "name": "blob", "args": {}}]}));
        }
        turns.push(json!({"text": format!("finished {round}")}));
    }
    let mut script = script(0, true);
    script["turns"] = json!(turns);
    let agent = Agent::builder(recording(script, None))
        .dyn_tool(blob())
        .backend(backend)
        .context_window(4_000)
        .general_purpose_subagent(false)
        .build()
        .unwrap();
    let store = Arc::new(InMemoryCheckpointer::new());
    let turn = |thread: &'static str, input: &'static str| {
        let agent = agent.clone();
        let store = store.clone();
        async move {
            let (run, checkpoint) = open_thread(store, thread, Some(input.to_owned()))
                .await
                .unwrap();
            let options = RunOptions {
                checkpoint: Some(checkpoint),
                ..RunOptions::default()
            };
            agent.run(run, options, EventSink::discard()).await.unwrap()
        }
    };
    let marker = |output: &RunOutput| output.run.state.custom[SUMMARY_KEY].clone();
    // The transcripts are the threads' own data: kept in their state, not in the workspace.
    let in_state = |output: &RunOutput, file: &Value| match &output.run.state.files
        [file.as_str().unwrap()]
    .content
    {
        deepagents::core::FileContent::Text { text } => text.clone(),
        other => panic!("{other:?}"),
    };

    let alpha = turn("alpha", "the alpha task").await;
    let beta = turn("beta", "the beta task").await;
    let (alpha_file, beta_file) = (
        marker(&alpha)["history_file"].clone(),
        marker(&beta)["history_file"].clone(),
    );
    assert_ne!(alpha_file, beta_file, "two threads, two files");
    assert_eq!(alpha_file, "/conversation_history/alpha.md");
    assert_eq!(beta_file, "/conversation_history/beta.md");
    let alpha_history = in_state(&alpha, &alpha_file);
    assert!(alpha_history.contains("the alpha task") && !alpha_history.contains("the beta task"));
    let beta_history = in_state(&beta, &beta_file);
    assert!(beta_history.contains("the beta task") && !beta_history.contains("the alpha task"));
    let first_upto = marker(&alpha)["upto"].as_u64().unwrap() as usize;
    assert_recoverable(&alpha_history, &alpha.run.state.messages, first_upto);

    // The thread's next turn summarizes again, into the same file, after what it held.
    let again = turn("alpha", "carry on").await;
    assert_eq!(again.text, "finished 1");
    assert_eq!(marker(&again)["history_file"], alpha_file);
    assert!(marker(&again)["count"].as_u64() > marker(&alpha)["count"].as_u64());
    let upto = marker(&again)["upto"].as_u64().unwrap() as usize;
    assert!(
        upto > alpha.run.state.messages.len(),
        "the new turn's messages were summarized"
    );
    let grown = in_state(&again, &alpha_file);
    assert!(grown.starts_with(&alpha_history), "appended, not rewritten");
    assert_recoverable(&grown, &again.run.state.messages, upto);
    assert!(!root.path().join("conversation_history").exists());
    let histories = |output: &RunOutput| -> Vec<String> {
        output
            .run
            .state
            .files
            .keys()
            .filter(|path| path.starts_with("/conversation_history/"))
            .cloned()
            .collect()
    };
    assert_eq!(histories(&again), ["/conversation_history/alpha.md"]);
    assert_eq!(histories(&beta), ["/conversation_history/beta.md"]);
}

#[tokio::test]
async fn the_summarizer_input_is_clipped_to_fit_the_window() {
    // Forty messages of 4,000 characters each are ten times the window; the summarizer must
    // still get a request that fits.
    let window = 4_000;
    let model = recording(script(20, true), None);
    let agent = Agent::builder(model.clone())
        .dyn_tool(blob_of(4_000))
        .context_window(window)
        .summarization_config(SummarizationConfig {
            trigger: Threshold::Messages(40),
            keep: Threshold::Messages(2),
        })
        .general_purpose_subagent(false)
        .build()
        .unwrap();
    let output = agent.invoke("go").await.unwrap();
    assert_eq!(output.text, "finished");
    let summarizer = summarizer_requests(&model);
    assert_eq!(summarizer.len(), 1);
    let request = &summarizer[0];
    let replaced: usize = output.run.state.messages[..39]
        .iter()
        .map(|m| m.text().len())
        .sum();
    assert!(
        replaced / 4 > 4 * window as usize,
        "the conversation is far over the window"
    );
    assert!(
        estimate_tokens(request) < window,
        "the summarizer's request is {} tokens",
        estimate_tokens(request)
    );
    // Its start and its end survive; the middle is marked as left out.
    let input = request.messages[0].text();
    assert!(input.contains("### [0] user\ngo"));
    assert!(input.contains("[… middle of the conversation omitted to fit …]"));
    assert!(
        input.contains("### [38] tool `blob`"),
        "the latest replaced message is kept"
    );
    // The history file still has everything.
    let (_, history) = history(&output);
    assert_recoverable(&history, &output.run.state.messages, 39);
}

#[tokio::test]
async fn the_system_prompt_and_tool_schemas_count_toward_the_trigger() {
    let bare = |model: Arc<Recording>| {
        Agent::builder(model)
            .dyn_tool(blob())
            .base_prompt(false)
            .file_tools(false)
            .general_purpose_subagent(false)
            .context_window(4_000)
    };
    let summarizes = |builder: deepagents::AgentBuilder| async move {
        let output = builder.build().unwrap().invoke("go").await.unwrap();
        output.run.state.custom.contains_key(SUMMARY_KEY)
    };
    // Three blobs are about 1,000 tokens: far under the trigger (3,400) on their own…
    assert!(!summarizes(bare(recording(script(3, true), None))).await);
    // …but not next to a 2,500-token system prompt…
    let prompt = "p".repeat(10_000);
    assert!(summarizes(bare(recording(script(3, true), None)).system_prompt(prompt.clone())).await);
    // …or a tool whose schema is as large.
    let big_tool = Arc::new(
        DynamicTool::new(
            "documented",
            "d".repeat(10_000),
            json!({"type": "object"}),
            |_, _| async { Ok(ToolOutput::text("ok")) },
        )
        .unwrap(),
    );
    assert!(summarizes(bare(recording(script(3, true), None)).dyn_tool(big_tool)).await);

    // The estimate itself: system prompt and schemas at four characters a token.
    let mut request = ModelRequest {
        messages: vec![Message::user("hi")].into(),
        ..ModelRequest::default()
    };
    let messages_only = estimate_tokens(&request);
    request.system_prompt = Some(prompt);
    assert_eq!(estimate_tokens(&request), messages_only + 2_500);
    let agent = bare(recording(script(0, true), None)).build().unwrap();
    request.tools = agent.tool_specs().to_vec();
    let schema_chars: usize = request
        .tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters.to_string().len())
        .sum();
    assert_eq!(
        estimate_tokens(&request),
        (10_000 + schema_chars as u64).div_ceil(4) + messages_only
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
    let (_, history) = history(&output);
    assert_recoverable(&history, &output.run.state.messages, upto);
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
async fn a_run_can_ask_for_compaction_before_its_first_model_call() {
    let mut turns: Vec<Value> = (0..6)
        .map(|i| json!({"text": format!("step {i}"), "tool_calls": [{"id": format!("c{i}"), "name": "blob", "args": {}}]}))
        .collect();
    turns.push(json!({"text": "first done"}));
    turns.push(json!({"text": "second done"}));
    let mut script = script(0, true);
    script["turns"] = json!(turns);
    let model = recording(script, None);
    // A window this run fits in without summarizing, unless asked.
    let agent = Agent::builder(model.clone())
        .dyn_tool(blob())
        .context_window(6_000)
        .general_purpose_subagent(false)
        .build()
        .unwrap();
    let first = agent.invoke("go").await.unwrap();
    assert_eq!(first.text, "first done");
    assert!(summarizer_requests(&model).is_empty());
    let mut run = first.run;
    run.push_user_input(vec![deepagents::ContentBlock::text("and now?")]);
    let (output, events) = run_with_events(
        &agent,
        run,
        RunOptions {
            compact_first: true,
            ..RunOptions::default()
        },
    )
    .await;
    assert_eq!(output.text, "second done");
    let summaries = summarized(&events);
    assert_eq!(summaries.len(), 1, "{summaries:?}");
    assert_eq!(summaries[0]["trigger"], "requested");
    let last = main_requests(&model).pop().unwrap();
    assert!(
        last.messages[0]
            .text()
            .starts_with("[Earlier conversation, summarized.")
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
