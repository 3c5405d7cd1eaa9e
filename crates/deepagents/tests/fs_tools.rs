//! The file tools end to end: scripted runs on the state backend.

use std::sync::Arc;

use deepagents::backends::{Mode, Operation, PermissionRule, Permissions};
use deepagents::{Agent, ContentBlock, Message, RunOutput, ToolStatus};
use serde_json::{Value, json};

use crate::support::{assert_error_containing, scripted, text, tool_results};

fn turns(steps: Vec<Value>) -> Value {
    let mut all: Vec<Value> = steps
        .into_iter()
        .map(|calls| json!({"tool_calls": calls}))
        .collect();
    all.push(json!({"text": "done"}));
    Value::Array(all)
}

async fn run(
    steps: Vec<Value>,
    configure: impl FnOnce(deepagents::AgentBuilder) -> deepagents::AgentBuilder,
) -> RunOutput {
    let agent = configure(Agent::builder(scripted(turns(steps))))
        .build()
        .unwrap();
    agent.invoke("go").await.unwrap()
}

fn texts(output: &RunOutput) -> Vec<String> {
    tool_results(&output.run.state.messages)
        .into_iter()
        .map(text)
        .collect()
}

#[tokio::test]
async fn write_read_edit_glob_grep_ls_delete_round_trip() {
    let output = run(
        vec![
            json!([
                {"name": "write_file", "args": {"file_path": "/src/app.py", "content": "import os\nprint('hello')\n"}},
                {"name": "write_file", "args": {"file_path": "/docs/readme.md", "content": "# Readme\nhello docs\n"}}
            ]),
            json!([{"name": "edit_file", "args": {"file_path": "/src/app.py", "old_string": "hello", "new_string": "bye"}}]),
            json!([
                {"name": "read_file", "args": {"file_path": "/src/app.py"}},
                {"name": "glob", "args": {"pattern": "*.py"}},
                {"name": "grep", "args": {"pattern": "hello"}},
                {"name": "grep", "args": {"pattern": "hello", "output_mode": "content"}},
                {"name": "grep", "args": {"pattern": "o", "output_mode": "count", "path": "/src"}},
                {"name": "ls", "args": {}},
                {"name": "ls", "args": {"path": "/src"}}
            ]),
            json!([{"name": "delete", "args": {"path": "/docs"}}]),
            json!([{"name": "glob", "args": {"pattern": "**/*"}}])
        ],
        |b| b,
    )
    .await;
    let t = texts(&output);
    assert_eq!(t[0], "Wrote /src/app.py (2 lines, 25 bytes).");
    assert_eq!(t[2], "Replaced 1 occurrence in /src/app.py.");
    assert_eq!(t[3], "     1\timport os\n     2\tprint('bye')\n");
    assert_eq!(t[4], "/src/app.py");
    assert_eq!(t[5], "/docs/readme.md");
    assert_eq!(t[6], "/docs/readme.md:\n     2: hello docs");
    assert_eq!(t[7], "/src/app.py: 1");
    assert_eq!(t[8], "/docs/\n/src/");
    assert_eq!(t[9], "/src/app.py (23 bytes)");
    assert_eq!(t[10], "Deleted /docs (1 file).");
    assert_eq!(t[11], "/src/app.py");
    assert_eq!(output.run.state.files.len(), 1);
}

#[tokio::test]
async fn tool_errors_tell_the_model_what_to_do() {
    let output = run(
        vec![
            json!([{"name": "write_file", "args": {"file_path": "/a.txt", "content": "x x\n"}}]),
            json!([
                {"name": "read_file", "args": {"file_path": "/missing.txt"}},
                {"name": "read_file", "args": {"file_path": "relative.txt"}},
                {"name": "read_file", "args": {"file_path": "/../etc/passwd"}},
                {"name": "read_file", "args": {"file_path": "/a.txt", "offset": 10}},
                {"name": "edit_file", "args": {"file_path": "/a.txt", "old_string": "y", "new_string": "z"}},
                {"name": "edit_file", "args": {"file_path": "/a.txt", "old_string": "x", "new_string": "z"}},
                {"name": "ls", "args": {"path": "/nowhere"}},
                {"name": "delete", "args": {"path": "/nope"}},
                {"name": "grep", "args": {"pattern": "x+"}},
                {"name": "grep", "args": {"pattern": "(", "regex": true}},
                {"name": "glob", "args": {"pattern": "*.rs"}},
                {"name": "read_file", "args": {"path": "/a.txt"}}
            ])
        ],
        |b| b,
    )
    .await;
    let results = tool_results(&output.run.state.messages);
    assert_error_containing(
        results[1],
        "/missing.txt does not exist; check the path with ls or glob",
    );
    assert_error_containing(results[2], "paths must be absolute");
    assert_error_containing(results[3], "`..` is not allowed");
    assert_error_containing(
        results[4],
        "offset 10 is past the end of /a.txt, which has 1 lines",
    );
    assert_error_containing(
        results[5],
        "not found in /a.txt; read the file and copy the exact text",
    );
    assert_error_containing(results[6], "occurs 2 times in /a.txt");
    assert_error_containing(results[7], "/nowhere does not exist");
    assert_error_containing(results[8], "/nope does not exist");
    assert_eq!(results[9].status, ToolStatus::Ok);
    assert!(text(results[9]).contains("looks like a regular expression; set regex=true"));
    assert_error_containing(results[10], "invalid regex");
    assert_eq!(text(results[11]), "No files match `*.rs` under /.");
    assert_error_containing(results[12], "unknown field `path`");
    assert_eq!(output.text, "done");
}

#[tokio::test]
async fn read_file_pages_long_files_and_splits_long_lines() {
    let body: String = (1..=1200).map(|i| format!("line {i}\n")).collect();
    let long_line = "x".repeat(12_000);
    let output = run(
        vec![
            json!([
                {"name": "write_file", "args": {"file_path": "/big.txt", "content": body}},
                {"name": "write_file", "args": {"file_path": "/long.txt", "content": format!("short\n{long_line}\nend\n")}},
                {"name": "write_file", "args": {"file_path": "/empty.txt", "content": ""}}
            ]),
            json!([
                {"name": "read_file", "args": {"file_path": "/big.txt"}},
                {"name": "read_file", "args": {"file_path": "/big.txt", "offset": 1195, "limit": 3}},
                {"name": "read_file", "args": {"file_path": "/long.txt"}},
                {"name": "read_file", "args": {"file_path": "/empty.txt"}}
            ])
        ],
        |b| b,
    )
    .await;
    let t = texts(&output);
    let first_page = &t[3];
    assert!(first_page.starts_with("     1\tline 1\n"));
    assert!(first_page.contains("   500\tline 500\n"));
    assert!(!first_page.contains("line 501"));
    assert!(
        first_page.ends_with(
            "[Lines 1-500 of 1200 shown from /big.txt; 700 more. Continue with offset=500.]"
        ),
        "{first_page}"
    );
    assert_eq!(
        t[4],
        "  1196\tline 1196\n  1197\tline 1197\n  1198\tline 1198\n\n[Lines 1196-1198 of 1200 shown from /big.txt; 2 more. Continue with offset=1198.]"
    );
    let rows: Vec<&str> = t[5].lines().collect();
    assert_eq!(rows[0], "     1\tshort");
    assert_eq!(rows[1], format!("     2\t{}", "x".repeat(5_000)));
    assert_eq!(rows[2], format!("   2.1\t{}", "x".repeat(5_000)));
    assert_eq!(rows[3], format!("   2.2\t{}", "x".repeat(2_000)));
    assert_eq!(rows[4], "     3\tend");
    assert_eq!(t[6], "/empty.txt is empty.");
}

#[tokio::test]
async fn a_line_longer_than_a_page_is_shown_in_part_and_paging_moves_on() {
    let huge = "y".repeat(200_000);
    let output = run(
        vec![
            json!([{"name": "write_file", "args": {"file_path": "/min.js", "content": format!("{huge}\nnext\n")}}]),
            json!([{"name": "read_file", "args": {"file_path": "/min.js"}}])
        ],
        |b| b,
    )
    .await;
    let page = &texts(&output)[1];
    assert!(page.len() <= 80_000 + 300, "capped: {}", page.len());
    assert!(
        page.contains("Line 1 is longer than one page"),
        "{}",
        &page[page.len() - 300..]
    );
    assert!(
        page.ends_with("Continue with offset=1.]"),
        "{}",
        &page[page.len() - 200..]
    );
}

#[tokio::test]
async fn images_come_back_as_content_the_model_can_see() {
    let png: Vec<u8> = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    let mut run = deepagents::Run::from_task("look");
    run.state.files.insert(
        "/shot.png".into(),
        deepagents::core::FileData {
            content: deepagents::core::FileContent::Binary {
                mime_type: "image/png".into(),
                data: png.clone(),
            },
            modified_at_ms: 0,
        },
    );
    run.state.files.insert(
        "/blob.bin".into(),
        deepagents::core::FileData {
            content: deepagents::core::FileContent::Binary {
                mime_type: "application/octet-stream".into(),
                data: vec![0, 1, 2],
            },
            modified_at_ms: 0,
        },
    );
    let agent = Agent::builder(scripted(turns(vec![json!([
        {"name": "read_file", "args": {"file_path": "/shot.png"}},
        {"name": "read_file", "args": {"file_path": "/blob.bin"}}
    ])])))
    .build()
    .unwrap();
    let output = agent
        .run(run, Default::default(), deepagents::EventSink::discard())
        .await
        .unwrap();
    let results = tool_results(&output.run.state.messages);
    assert_eq!(
        results[0].content,
        [
            ContentBlock::text("/shot.png (image/png, 16 bytes):"),
            ContentBlock::data("image/png", png)
        ]
    );
    assert!(text(results[1]).contains("binary file (application/octet-stream, 3 bytes)"));
}

#[tokio::test]
async fn parallel_writes_in_one_turn_all_land() {
    let calls: Vec<Value> = (0..8)
        .map(|i| json!({"name": "write_file", "args": {"file_path": format!("/out/{i}.txt"), "content": format!("{i}\n")}}))
        .collect();
    let output = run(vec![Value::Array(calls)], |b| b).await;
    assert_eq!(output.run.state.files.len(), 8);
    assert!(texts(&output).iter().all(|t| t.starts_with("Wrote /out/")));
}

#[tokio::test]
async fn permissions_deny_and_filter() {
    let rules = vec![
        PermissionRule {
            operations: vec![Operation::Read, Operation::Write],
            paths: vec!["/secrets/**".into()],
            mode: Mode::Deny,
        },
        PermissionRule {
            operations: vec![Operation::Write],
            paths: vec!["/readonly/**".into()],
            mode: Mode::Deny,
        },
    ];
    let mut run = deepagents::Run::from_task("go");
    for path in ["/secrets/key.txt", "/readonly/a.txt", "/open.txt"] {
        run.state.files.insert(
            path.into(),
            deepagents::core::FileData {
                content: deepagents::core::FileContent::Text {
                    text: "token\n".into(),
                },
                modified_at_ms: 0,
            },
        );
    }
    let agent = Agent::builder(scripted(turns(vec![json!([
        {"name": "read_file", "args": {"file_path": "/secrets/key.txt"}},
        {"name": "grep", "args": {"pattern": "token"}},
        {"name": "glob", "args": {"pattern": "*.txt"}},
        {"name": "read_file", "args": {"file_path": "/readonly/a.txt"}},
        {"name": "write_file", "args": {"file_path": "/readonly/a.txt", "content": "changed"}},
        {"name": "delete", "args": {"path": "/readonly"}}
    ])])))
    .permissions(Permissions::new(rules).unwrap())
    .build()
    .unwrap();
    let output = agent
        .run(run, Default::default(), deepagents::EventSink::discard())
        .await
        .unwrap();
    let results = tool_results(&output.run.state.messages);
    assert_error_containing(results[0], "permission denied for /secrets/key.txt");
    assert_eq!(text(results[1]), "/open.txt\n/readonly/a.txt");
    assert_eq!(text(results[2]), "/open.txt\n/readonly/a.txt");
    assert_eq!(results[3].status, ToolStatus::Ok);
    assert_error_containing(results[4], "denies writing");
    assert_error_containing(results[5], "permission denied for /readonly");
}

#[tokio::test]
async fn large_results_are_offloaded_and_can_be_read_back() {
    use deepagents::{DynamicTool, ToolOutput};
    let big: String = (0..20_000).map(|i| format!("row {i}\n")).collect();
    let expected_len = big.len();
    let dump = DynamicTool::new("dump", "dump", json!({"type": "object"}), move |_, _| {
        let big = big.clone();
        async move { Ok(ToolOutput::text(big)) }
    })
    .unwrap();
    let output = run(
        vec![
            json!([{"id": "call_dump", "name": "dump", "args": {}}]),
            json!([{"name": "read_file", "args": {"file_path": "/large_tool_results/call_dump", "offset": 19998}}])
        ],
        |b| b.dyn_tool(Arc::new(dump)),
    )
    .await;
    let t = texts(&output);
    assert!(t[0].starts_with(&format!(
        "The result was too large to show ({expected_len} characters, 20000 lines) and was saved to /large_tool_results/call_dump."
    )), "{}", &t[0][..200]);
    assert!(
        t[0].contains("row 0\nrow 1\nrow 2\nrow 3\nrow 4\n[… 19990 lines omitted …]\nrow 19995")
    );
    assert!(t[0].len() < 2_000);
    assert_eq!(t[1], " 19999\trow 19998\n 20000\trow 19999\n");
    assert!(
        output
            .run
            .state
            .files
            .contains_key("/large_tool_results/call_dump")
    );
}

#[tokio::test]
async fn dangling_tool_calls_are_answered_before_the_model_sees_them() {
    use deepagents::core::message::{AssistantMessage, ToolCall};
    let mut run = deepagents::Run::from_task("first");
    run.state
        .messages
        .push(Message::Assistant(AssistantMessage {
            content: vec![],
            tool_calls: vec![ToolCall {
                id: "lost".into(),
                name: "ls".into(),
                arguments: json!({}),
            }],
        }));
    run.push_user_input(vec![ContentBlock::text("second")]);
    let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
    let agent = Agent::builder(scripted(json!([{"text": "unused"}, {"text": "ok"}])))
        .middleware(crate::middleware_capture::Capture {
            requests: requests.clone(),
        })
        .build()
        .unwrap();
    let output = agent
        .run(run, Default::default(), deepagents::EventSink::discard())
        .await
        .unwrap();
    assert_eq!(output.text, "ok");
    let sent = &requests.lock().unwrap()[0].messages;
    let Message::Tool(patched) = &sent[2] else {
        panic!("expected a patched result after the dangling call: {sent:?}");
    };
    assert_eq!(patched.tool_call_id, "lost");
    assert!(text(patched).starts_with("Cancelled"));
    // The stored conversation is left as it was.
    assert_eq!(output.run.state.messages.len(), 4);
}

#[tokio::test]
async fn old_long_edits_are_shortened_near_the_context_limit() {
    let long = "z".repeat(6_000);
    let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
    let agent = Agent::builder(scripted(turns(vec![
        json!([{"name": "write_file", "args": {"file_path": "/a.txt", "content": long}}]),
        json!([{"name": "ls", "args": {}}]),
        json!([{"name": "ls", "args": {}}]),
    ])))
    .context_window(3_000)
    .middleware(crate::middleware_capture::Capture {
        requests: requests.clone(),
    })
    .build()
    .unwrap();
    let output = agent.invoke("go").await.unwrap();
    let requests = requests.lock().unwrap();
    let content_sent = |request: &deepagents::ModelRequest| -> String {
        request
            .messages
            .iter()
            .find_map(|m| match m {
                Message::Assistant(a) => {
                    a.tool_calls.first().map(|c| c.arguments["content"].clone())
                }
                _ => None,
            })
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    // While the write is among the last two turns it goes whole.
    assert_eq!(content_sent(&requests[1]).len(), 6_000);
    assert_eq!(content_sent(&requests[2]).len(), 6_000);
    let shortened = content_sent(&requests[3]);
    assert!(shortened.starts_with(&"z".repeat(500)));
    assert!(
        shortened.ends_with(
            "[5500 characters omitted from this earlier call; the file has the full text]"
        )
    );
    // The run keeps the whole argument.
    let kept = output.run.state.messages.iter().find_map(|m| match m {
        Message::Assistant(a) => a.tool_calls.first().map(|c| c.arguments["content"].clone()),
        _ => None,
    });
    assert_eq!(kept.unwrap().as_str().unwrap().len(), 6_000);
}

#[tokio::test]
async fn a_huge_user_message_is_saved_and_previewed() {
    let huge: String = (0..30_000)
        .map(|i| format!("line {i} of the pasted log\n"))
        .collect();
    let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
    let agent = Agent::builder(scripted(turns(vec![json!([
        {"name": "read_file", "args": {"file_path": "/conversation_history/input-0.md", "offset": 29999}}
    ])])))
    .middleware(crate::middleware_capture::Capture { requests: requests.clone() })
    .build()
    .unwrap();
    let output = agent.invoke(huge.clone()).await.unwrap();
    let sent = requests.lock().unwrap()[0].messages[0].text();
    assert!(sent.starts_with(&format!(
        "[A long message ({} characters) was saved to /conversation_history/input-0.md",
        huge.len()
    )));
    assert!(sent.len() < 2_000);
    assert_eq!(texts(&output)[0], " 30000\tline 29999 of the pasted log\n");
    assert_eq!(
        output.run.state.messages[0].text(),
        huge,
        "the run keeps the message whole"
    );
}
