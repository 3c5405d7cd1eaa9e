//! The event stream: order and content.

use deepagents::{Agent, EventKind};
use futures::StreamExt;
use serde_json::json;

use crate::support::scripted;

fn label(kind: &EventKind) -> String {
    match kind {
        EventKind::RunStarted { .. } => "run_started".into(),
        EventKind::ModelCallStarted { step } => format!("model_call_started {step}"),
        EventKind::TextDelta { text } => format!("text {text}"),
        EventKind::ModelCallFinished {
            step, tool_calls, ..
        } => {
            format!("model_call_finished {step} calls={tool_calls}")
        }
        EventKind::ToolCallStarted { name, .. } => format!("tool_call_started {name}"),
        EventKind::ToolCallFinished { name, .. } => format!("tool_call_finished {name}"),
        EventKind::StateUpdated { todos, .. } => {
            format!("state_updated todos={}", todos.as_ref().map_or(0, Vec::len))
        }
        EventKind::Final { text, steps, .. } => format!("final {text} steps={steps}"),
        EventKind::Error { kind, .. } => format!("error {}", json!(kind).as_str().unwrap_or("?")),
        EventKind::ToolCallDelta { .. } => "tool_call_delta".into(),
        other => panic!("unexpected event {other:?}"),
    }
}

#[tokio::test]
async fn events_arrive_in_run_order() {
    let agent = Agent::builder(scripted(json!([
        {"text": "Planning now", "tool_calls": [
            {"name": "write_todos", "args": {"todos": [{"content": "Ship", "status": "pending"}]}}
        ]},
        {"text": "Shipped."}
    ])))
    .todos(true)
    .build()
    .unwrap();
    let mut stream = agent.stream("ship it");
    let mut labels = Vec::new();
    while let Some(event) = stream.next().await {
        assert!(
            event.path.is_empty(),
            "main agent events have an empty path"
        );
        labels.push(label(&event.kind));
    }
    let output = stream.outcome().await.unwrap();
    assert_eq!(
        labels,
        [
            "run_started",
            "model_call_started 1",
            "text Planning ",
            "text now",
            "tool_call_delta",
            "model_call_finished 1 calls=1",
            "tool_call_started write_todos",
            "tool_call_finished write_todos",
            "state_updated todos=1",
            "model_call_started 2",
            "text Shipped.",
            "model_call_finished 2 calls=0",
            "final Shipped. steps=2",
        ]
    );
    assert_eq!(output.run.state.todos.len(), 1);
    assert!(output.run.usage.input_tokens > 0);
}

#[tokio::test]
async fn a_failed_run_ends_its_stream_with_an_error_event() {
    let agent = Agent::builder(scripted(json!([]))).build().unwrap();
    let mut stream = agent.stream("go");
    let mut last = None;
    while let Some(event) = stream.next().await {
        last = Some(event);
    }
    let last = last.unwrap();
    assert_eq!(label(&last.kind), "error model");
    assert!(stream.outcome().await.is_err());
}

#[test]
fn events_serialize_with_a_type_tag_and_path() {
    let event = deepagents::Event {
        run_id: "r".into(),
        seq: 3,
        time: "2026-12-01T00:00:00.000Z".into(),
        path: vec![deepagents::core::event::PathSegment {
            call_id: "call_1".into(),
            name: "researcher".into(),
        }],
        kind: EventKind::TextDelta { text: "hi".into() },
    };
    let value = serde_json::to_value(&event).unwrap();
    assert_eq!(
        value,
        json!({
            "run_id": "r", "seq": 3, "time": "2026-12-01T00:00:00.000Z",
            "path": [{"call_id": "call_1", "name": "researcher"}],
            "type": "text_delta", "text": "hi"
        })
    );
    let back: deepagents::Event = serde_json::from_value(value).unwrap();
    assert_eq!(back, event);
}

// ---- the protocol ----------------------------------------------------------------------

use deepagents::core::event::{
    ErrorKind, Event, OutputStream, PROTOCOL_VERSION, PathSegment, SummaryTrigger,
};
use std::sync::Arc;

/// Every event of a run — subagents' included — carries the run's id, a sequence number that
/// counts 0, 1, 2… without gaps, and an RFC 3339 time; the first is `run_started` with the
/// protocol version. The next run is numbered afresh under a new id.
#[tokio::test]
async fn every_event_of_a_run_has_its_run_id_a_gapless_seq_and_a_time() {
    let script = json!({
        "turns": [
            {"text": "Delegating", "tool_calls": [
                {"id": "t1", "name": "task", "args": {"description": "LEFT: look", "subagent_type": "general-purpose"}},
                {"id": "t2", "name": "task", "args": {"description": "RIGHT: look", "subagent_type": "general-purpose"}}
            ]},
            {"text": "Both looked."}
        ],
        "conversations": [
            {"when_task_contains": "LEFT", "turns": [
                {"tool_calls": [{"name": "ls", "args": {}}]}, {"text": "left saw"}
            ]},
            {"when_task_contains": "RIGHT", "turns": [
                {"tool_calls": [{"name": "ls", "args": {}}]}, {"text": "right saw"}
            ]}
        ]
    });
    let model: Arc<dyn deepagents::Model> =
        Arc::new(deepagents::models::ScriptedModel::from_json(&script.to_string()).unwrap());
    let agent = Agent::builder(model).build().unwrap();
    let collect = async || {
        let mut stream = agent.stream("go");
        let mut events: Vec<Event> = Vec::new();
        while let Some(event) = stream.next().await {
            events.push(event);
        }
        stream.outcome().await.unwrap();
        events
    };
    let first = collect().await;
    let run_id = first[0].run_id.clone();
    assert_eq!(run_id.len(), 36, "{run_id}");
    assert!(matches!(
        &first[0].kind,
        EventKind::RunStarted { protocol, .. } if *protocol == PROTOCOL_VERSION
    ));
    for (index, event) in first.iter().enumerate() {
        assert_eq!(event.run_id, run_id, "{event:?}");
        assert_eq!(event.seq, index as u64, "{event:?}");
        let time = &event.time;
        assert_eq!(time.len(), 24, "{time}");
        assert!(time.ends_with('Z') && &time[10..11] == "T", "{time}");
    }
    let nested: Vec<&AgentPathRef> = first.iter().map(|e| &e.path).collect();
    for call in ["t1", "t2"] {
        let segment = PathSegment {
            call_id: call.into(),
            name: "general-purpose".into(),
        };
        assert!(
            nested
                .iter()
                .any(|path| path.as_slice() == [segment.clone()]),
            "{call}"
        );
    }
    assert!(matches!(
        first.last().unwrap().kind,
        EventKind::Final { .. }
    ));

    let second = collect().await;
    assert_ne!(second[0].run_id, run_id);
    assert_eq!(second[0].seq, 0);
}

type AgentPathRef = deepagents::core::AgentPath;

/// A shell command's output reaches the stream while the command still runs: here the command
/// waits for a file that the test creates only after it has seen the first line.
#[tokio::test]
async fn execute_output_streams_before_the_command_ends() {
    let root = tempfile::tempdir().unwrap();
    let command = "echo first; while [ ! -f go ]; do sleep 0.02; done; echo second";
    let agent = Agent::builder(scripted(json!([
        {"tool_calls": [{"id": "x", "name": "execute", "args": {"command": command}}]},
        {"text": "done"}
    ])))
    .backend(Arc::new(deepagents::backends::LocalShellBackend::new(
        deepagents::backends::FilesystemBackend::new(root.path()).unwrap(),
    )))
    .build()
    .unwrap();
    let mut stream = agent.stream("go");
    let mut streamed = String::new();
    let watch = async {
        while let Some(event) = stream.next().await {
            match event.kind {
                EventKind::ToolOutputDelta {
                    call_id,
                    stream: OutputStream::Stdout,
                    text,
                } => {
                    assert_eq!(call_id, "x");
                    streamed.push_str(&text);
                    if streamed.contains("first") {
                        std::fs::write(root.path().join("go"), "").unwrap();
                    }
                }
                EventKind::ToolCallFinished { content, .. } => {
                    assert!(
                        streamed.contains("first"),
                        "nothing streamed before the end"
                    );
                    let text = content[0].as_text().unwrap().to_owned();
                    assert!(text.contains("first\nsecond\n"), "{text}");
                }
                _ => {}
            }
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(30), watch)
        .await
        .expect("the command's first line never arrived while it ran");
    assert_eq!(stream.outcome().await.unwrap().text, "done");
    assert!(streamed.contains("second"), "{streamed}");
}

/// Versions of the event protocol and a hash of each JSON shape they had, oldest first. A
/// change to the shape of any event adds a line here and is described in docs/PROTOCOL.md:
/// an addition (new kinds, new fields, which listeners skip) under the same version; any
/// other change (a rename, a removal, a new meaning) under a new `PROTOCOL_VERSION`. The
/// earlier lines hashed hand-written samples of 15 kinds; since the fifth, the hash is of the
/// schema the types generate (`docs/events.schema.json`), which covers every kind and field.
const PROTOCOL_SHAPES: &[(u32, u64)] = &[
    (1, 0xcd6c_b582_a5e6_77d2),
    (1, 0x1d7f_2c84_c965_aedc),
    (1, 0x92bd_8e78_74b3_37f4),
    (1, 0xd6f1_c80e_6d5d_6f48),
    (1, 0xfc8b_b679_7064_bc66),
];

/// One event of every kind, as JSON lines, in the order the schema lists the kinds.
fn protocol_samples() -> String {
    use deepagents::core::interrupt::{DecisionKind, PendingAction};
    use deepagents::core::{FileContent, StopReason, Todo, TodoStatus, Usage};
    let path = vec![PathSegment {
        call_id: "call_1".into(),
        name: "researcher".into(),
    }];
    let kinds = vec![
        EventKind::RunStarted {
            protocol: PROTOCOL_VERSION,
            agent: "agent".into(),
            model: "scripted".into(),
            thread_id: Some("chat".into()),
        },
        EventKind::ModelCallStarted { step: 1 },
        EventKind::TextDelta { text: "Hi".into() },
        EventKind::ReasoningDelta {
            text: "Think".into(),
        },
        EventKind::ToolCallDelta {
            index: 0,
            call_id: Some("call_2".into()),
            name: Some("ls".into()),
            arguments_delta: "{}".into(),
        },
        EventKind::ModelCallFinished {
            step: 1,
            usage: Usage::default(),
            stop_reason: StopReason::ToolUse,
            tool_calls: 1,
        },
        EventKind::ToolCallStarted {
            call_id: "call_2".into(),
            name: "execute".into(),
            arguments: json!({"command": "ls"}),
        },
        EventKind::ToolOutputDelta {
            call_id: "call_2".into(),
            stream: OutputStream::Stderr,
            text: "warn\n".into(),
        },
        EventKind::ToolProgress {
            call_id: "call_4".into(),
            progress: 2.0,
            total: Some(5.0),
            message: Some("indexing".into()),
        },
        EventKind::ToolCallFinished {
            call_id: "call_2".into(),
            name: "execute".into(),
            status: deepagents::ToolStatus::Ok,
            content: vec![deepagents::ContentBlock::text("[Exit code 0]")],
            duration_ms: 5,
        },
        EventKind::StateUpdated {
            todos: Some(vec![Todo {
                content: "Ship".into(),
                status: TodoStatus::Pending,
            }]),
            files_changed: vec!["/a.md".into()],
            custom: [("k".to_owned(), json!(1))].into(),
        },
        EventKind::Checkpointed { checkpoint: 7 },
        EventKind::Interrupted {
            actions: vec![PendingAction {
                call_id: "call_3".into(),
                name: "execute".into(),
                arguments: json!({"command": "rm -rf build"}),
                description: Some("Run a shell command".into()),
                allowed: vec![DecisionKind::Approve, DecisionKind::Reject],
                request: None,
                path: path.clone(),
            }],
        },
        EventKind::Summarized {
            replaced: 10,
            kept_from: Some(11),
            history_file: "/conversation_history/chat.md".into(),
            trigger: SummaryTrigger::Threshold,
        },
        EventKind::Final {
            text: "Done".into(),
            usage: Usage::default(),
            steps: 2,
            spent: deepagents::core::Spent {
                usage: Usage {
                    input_tokens: 1200,
                    output_tokens: 80,
                    ..Usage::default()
                },
                cost_usd: 0.0048,
                unpriced_tokens: 0,
            },
            total_spent: deepagents::core::Spent::default(),
            stop_reason: deepagents::core::StopReason::EndTurn,
            files: [(
                "/a.md".to_owned(),
                FileContent::Text {
                    text: "# A\n".into(),
                },
            )]
            .into(),
        },
        EventKind::Sandbox {
            confinement: deepagents::core::event::Confinement {
                engine: "bubblewrap".into(),
                network: "off".into(),
                unenforced: Vec::new(),
            },
        },
        EventKind::BackgroundTaskFinished {
            task_id: "bg-0123456789abcdef".into(),
            subagent: "researcher".into(),
            status: "success".into(),
            answer: "Found 3 sources.".into(),
        },
        EventKind::Error {
            kind: ErrorKind::TurnLimit,
            message: "the run made 100 model calls".into(),
        },
    ];
    kinds
        .into_iter()
        .enumerate()
        .map(|(seq, kind)| {
            let event = Event {
                run_id: "00000000-0000-4000-8000-000000000000".into(),
                seq: seq as u64,
                time: "2026-12-01T00:00:00.000Z".into(),
                path: path.clone(),
                kind,
            };
            serde_json::to_string(&event).unwrap()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `value` with every object's keys in sorted order: what serializes the same whether or not
/// a crate of the build turned on serde_json's `preserve_order` (the workspace's tests do).
fn keys_sorted(value: serde_json::Value) -> serde_json::Value {
    match value {
        serde_json::Value::Object(map) => {
            let mut entries: Vec<_> = map.into_iter().collect();
            entries.sort_by(|(a, _), (b, _)| a.cmp(b));
            serde_json::Value::Object(
                entries
                    .into_iter()
                    .map(|(key, value)| (key, keys_sorted(value)))
                    .collect(),
            )
        }
        serde_json::Value::Array(items) => {
            serde_json::Value::Array(items.into_iter().map(keys_sorted).collect())
        }
        other => other,
    }
}

/// FNV-1a: a hash that stays the same across builds and platforms.
fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The `--json` protocol: the snapshot shows every event kind's JSON (one sample of each kind
/// the schema enumerates), and the schema is tied to the protocol version, so a kind or field
/// cannot change without a version bump.
#[test]
fn the_event_protocol_changes_only_with_its_version() {
    let samples = protocol_samples();
    let sampled: Vec<String> = samples
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let schema = deepagents::core::event::json_schema();
    assert_eq!(
        sampled,
        schema_kinds(&schema),
        "one sample per kind, in the schema's order"
    );
    insta::assert_snapshot!(format!("protocol_v{PROTOCOL_VERSION}"), samples);
    let hash = stable_hash(&serde_json::to_string(&keys_sorted(schema)).unwrap());
    let (version, known) = *PROTOCOL_SHAPES.last().unwrap();
    assert_eq!(
        (version, known),
        (PROTOCOL_VERSION, hash),
        "the event protocol's JSON shape changed: add ({PROTOCOL_VERSION}, {hash:#x}) to \
         PROTOCOL_SHAPES if it only adds kinds or fields, else bump PROTOCOL_VERSION and add \
         ({}, {hash:#x}); describe the change in docs/PROTOCOL.md",
        PROTOCOL_VERSION + u32::from(version == PROTOCOL_VERSION)
    );
}

// ---- the schema --------------------------------------------------------------------------

/// Where the events' JSON Schema is committed.
const SCHEMA_FILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/events.schema.json");

/// The event kinds the schema enumerates: the `type` constant of each variant of its `oneOf`.
fn schema_kinds(schema: &serde_json::Value) -> Vec<String> {
    schema["oneOf"]
        .as_array()
        .expect("the schema lists the event kinds under oneOf")
        .iter()
        .map(|variant| {
            variant["properties"]["type"]["const"]
                .as_str()
                .expect("each kind names its type as a constant")
                .to_owned()
        })
        .collect()
}

/// `docs/events.schema.json` is the schema the event types generate; set
/// `UPDATE_EVENTS_SCHEMA=1` to write it after changing them.
#[test]
fn the_events_schema_in_docs_is_the_one_the_types_generate() {
    let generated =
        serde_json::to_string_pretty(&keys_sorted(deepagents::core::event::json_schema())).unwrap()
            + "\n";
    if std::env::var_os("UPDATE_EVENTS_SCHEMA").is_some() {
        std::fs::write(SCHEMA_FILE, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(SCHEMA_FILE).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/events.schema.json differs from the schema the event types generate; update it with \
         `UPDATE_EVENTS_SCHEMA=1 cargo nextest run -p deepagents events::the_events_schema` \
         and describe the change in docs/PROTOCOL.md"
    );
}
