//! The file tools end to end: scripted runs on the state backend and on the disk backend (a
//! temporary directory), and `execute` on the local shell backend.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use deepagents::backends::memory::file_data;
use deepagents::backends::{
    FilesystemBackend, LocalShellBackend, Mode, Operation, PermissionRule, Permissions, VPath,
};
use deepagents::core::message::{AssistantMessage, ToolCall};
use deepagents::core::{FileContent, ModelRequest, ModelResponse, StopReason};
use deepagents::{
    Agent, AgentBuilder, ContentBlock, EventSink, Message, Model, ModelError, Run, RunOutput,
    ToolStatus,
};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::{assert_error_containing, scripted, text, tool_results};

fn turns(steps: Vec<Value>) -> Value {
    let mut all: Vec<Value> = steps
        .into_iter()
        .map(|calls| json!({"tool_calls": calls}))
        .collect();
    all.push(json!({"text": "done"}));
    Value::Array(all)
}

fn texts(output: &RunOutput) -> Vec<String> {
    tool_results(&output.run.state.messages)
        .into_iter()
        .map(text)
        .collect()
}

/// Where the files of a test live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The default: files in the run state.
    State,
    /// A `FilesystemBackend` over a temporary directory.
    Disk,
}

/// A backend of one kind, with helpers to seed files and see what exists afterwards.
struct Fixture {
    kind: Kind,
    dir: Option<TempDir>,
    run: Run,
}

impl Fixture {
    fn new(kind: Kind) -> Self {
        Self {
            kind,
            dir: (kind == Kind::Disk).then(|| tempfile::tempdir().unwrap()),
            run: Run::from_task("go"),
        }
    }

    fn root(&self) -> &Path {
        self.dir.as_ref().unwrap().path()
    }

    /// Puts a file in place before the run, as the user (or an earlier run) would have.
    fn seed(&mut self, path: &str, bytes: &[u8]) {
        match self.kind {
            Kind::State => {
                // As an upload stores them: UTF-8 text as a string, anything else as bytes.
                let file = file_data(&VPath::parse(path).unwrap(), bytes.to_vec(), 0);
                self.run.state.files.insert(path.into(), file);
            }
            Kind::Disk => {
                let host = self.host(path);
                std::fs::create_dir_all(host.parent().unwrap()).unwrap();
                std::fs::write(host, bytes).unwrap();
            }
        }
    }

    fn host(&self, path: &str) -> PathBuf {
        self.root().join(path.trim_start_matches('/'))
    }

    fn configure(&self, builder: AgentBuilder) -> AgentBuilder {
        match self.kind {
            Kind::State => builder,
            Kind::Disk => builder.backend(Arc::new(FilesystemBackend::new(self.root()).unwrap())),
        }
    }

    /// Runs the scripted steps (then "done") with this backend.
    async fn run(self, steps: Vec<Value>) -> (RunOutput, Self) {
        self.run_with(steps, |b| b).await
    }

    async fn run_with(
        self,
        steps: Vec<Value>,
        configure: impl FnOnce(AgentBuilder) -> AgentBuilder,
    ) -> (RunOutput, Self) {
        self.run_model(scripted(turns(steps)), configure).await
    }

    async fn run_model(
        mut self,
        model: Arc<dyn Model>,
        configure: impl FnOnce(AgentBuilder) -> AgentBuilder,
    ) -> (RunOutput, Self) {
        let agent = configure(self.configure(Agent::builder(model)))
            .build()
            .unwrap();
        let run = std::mem::replace(&mut self.run, Run::from_task("go"));
        let output = agent
            .run(run, Default::default(), EventSink::discard())
            .await
            .unwrap();
        (output, self)
    }

    /// Every file that exists after the run, with its bytes, sorted by path.
    /// The files the agent sees: in the state, and on disk for the disk kind (where the
    /// harness's own files still live in the state).
    fn files(&self, output: &RunOutput) -> BTreeMap<String, Vec<u8>> {
        let in_state: BTreeMap<String, Vec<u8>> = output
            .run
            .state
            .files
            .iter()
            .map(|(path, file)| {
                let bytes = match &file.content {
                    FileContent::Text { text } => text.as_bytes().to_vec(),
                    FileContent::Binary { data, .. } => data.clone(),
                };
                (path.clone(), bytes)
            })
            .collect();
        match self.kind {
            Kind::State => in_state,
            Kind::Disk => {
                let mut found = in_state;
                walk(self.root(), self.root(), &mut found);
                found
            }
        }
    }
}

fn walk(root: &Path, dir: &Path, found: &mut BTreeMap<String, Vec<u8>>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            walk(root, &path, found);
        } else {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_str()
                .unwrap()
                .to_owned();
            found.insert(format!("/{rel}"), std::fs::read(&path).unwrap());
        }
    }
}

/// Runs each named `async fn(Kind)` once per backend, as `<name>::state` and `<name>::disk`.
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test]
            async fn state() {
                super::$name(super::Kind::State).await;
            }
            #[tokio::test]
            async fn disk() {
                super::$name(super::Kind::Disk).await;
            }
        }
    )*};
}

on_both_backends!(
    write_read_edit_glob_grep_ls_delete_round_trip,
    tool_errors_tell_the_model_what_to_do,
    write_file_errors,
    write_file_never_replaces_a_file,
    edit_file_errors,
    read_file_pages_long_files_and_splits_long_lines,
    paging_by_the_notes_reaches_every_character_of_huge_lines,
    a_row_past_the_end_of_a_line_is_an_error,
    images_and_pdfs_come_back_as_content_the_model_can_see,
    parallel_writes_in_one_turn_all_land,
    permissions_deny_and_filter,
    grep_says_when_it_stopped_at_max_count,
    ls_and_glob_cap_their_output_with_a_note,
    large_results_are_offloaded_and_can_be_read_back,
    text_that_is_not_utf8_is_read_searched_and_edited,
);

async fn write_read_edit_glob_grep_ls_delete_round_trip(kind: Kind) {
    let (output, fixture) = Fixture::new(kind)
        .run(vec![
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
            json!([{"name": "glob", "args": {"pattern": "**/*"}}]),
        ])
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
    assert_eq!(
        fixture.files(&output),
        BTreeMap::from([(
            "/src/app.py".to_owned(),
            b"import os\nprint('bye')\n".to_vec()
        )])
    );
}

async fn tool_errors_tell_the_model_what_to_do(kind: Kind) {
    let (output, _fixture) = Fixture::new(kind)
        .run(vec![
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
                {"name": "read_file", "args": {"path": "/a.txt"}},
                {"name": "glob", "args": {"pattern": "src/[a-"}},
                {"name": "glob", "args": {"pattern": "*.{rs,toml"}},
                {"name": "glob", "args": {"pattern": "/"}}
            ]),
        ])
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
    assert_error_containing(results[12], "'path' was unexpected");
    assert_error_containing(results[13], "invalid glob");
    assert_error_containing(results[14], "invalid glob");
    assert_error_containing(results[15], "the pattern is empty; try **/*");
    assert_eq!(output.text, "done");
}

async fn write_file_errors(kind: Kind) {
    let (output, fixture) = Fixture::new(kind)
        .run(vec![
            json!([{"name": "write_file", "args": {"file_path": "/src/app.py", "content": "x\n"}}]),
            json!([
                {"name": "write_file", "args": {"file_path": "/src", "content": "over a directory"}},
                {"name": "write_file", "args": {"file_path": "/src/app.py/inner.txt", "content": "under a file"}},
                {"name": "write_file", "args": {"file_path": "/../escape.txt", "content": "x"}},
                {"name": "write_file", "args": {"file_path": "/src/../../escape.txt", "content": "x"}},
                {"name": "write_file", "args": {"file_path": "~/escape.txt", "content": "x"}},
                {"name": "write_file", "args": {"file_path": "C:/escape.txt", "content": "x"}},
                {"name": "write_file", "args": {"file_path": "/a\\b.txt", "content": "x"}},
                {"name": "write_file", "args": {"file_path": "/bad\u{0}name.txt", "content": "x"}},
                {"name": "write_file", "args": {"file_path": "/", "content": "x"}},
                {"name": "write_file", "args": {"file_path": "/x.txt"}},
                {"name": "write_file", "args": {"file_path": "/src/app.py", "content": "over a file"}}
            ]),
        ])
        .await;
    let results = tool_results(&output.run.state.messages);
    assert_error_containing(results[1], "/src is a directory");
    assert_error_containing(results[2], "/src/app.py is not a directory");
    assert_error_containing(results[3], "`..` is not allowed");
    assert_error_containing(results[4], "`..` is not allowed");
    assert_error_containing(results[5], "`~` is not expanded");
    assert_error_containing(results[6], "Windows drive paths are not supported");
    assert_error_containing(results[7], "backslashes are not separators here");
    assert_error_containing(
        results[8],
        "control characters (such as NUL) are not allowed",
    );
    assert_error_containing(results[9], "/ is a directory");
    assert_error_containing(results[10], "\"content\" is a required property");
    assert_error_containing(results[11], "/src/app.py already exists");
    // Nothing but the first write landed.
    assert_eq!(
        fixture.files(&output),
        BTreeMap::from([("/src/app.py".to_owned(), b"x\n".to_vec())]),
        "{kind:?}"
    );
}

/// write_file only creates: over an existing file (seeded, or written earlier in the same
/// step) the model gets the error, which says what to do instead, and the file stays as it
/// was; delete then write replaces it.
async fn write_file_never_replaces_a_file(kind: Kind) {
    let mut fixture = Fixture::new(kind);
    fixture.seed("/seeded.txt", b"kept\n");
    let (output, fixture) = fixture
        .run(vec![
            json!([
                {"name": "write_file", "args": {"file_path": "/seeded.txt", "content": "lost\n"}},
                {"name": "write_file", "args": {"file_path": "/new.txt", "content": "first\n"}},
                {"name": "write_file", "args": {"file_path": "/new.txt", "content": "second\n"}}
            ]),
            json!([{"name": "read_file", "args": {"file_path": "/seeded.txt"}}]),
            json!([
                {"name": "delete", "args": {"path": "/seeded.txt"}},
                {"name": "write_file", "args": {"file_path": "/seeded.txt", "content": "replaced\n"}}
            ]),
        ])
        .await;
    let results = tool_results(&output.run.state.messages);
    assert_error_containing(
        results[0],
        "/seeded.txt already exists: read it and change it with edit_file, or delete it first",
    );
    assert_eq!(text(results[1]), "Wrote /new.txt (1 lines, 6 bytes).");
    assert_error_containing(results[2], "/new.txt already exists");
    assert_eq!(
        text(results[3]),
        "     1\tkept\n",
        "the refused write changed nothing"
    );
    assert_eq!(text(results[4]), "Deleted /seeded.txt (1 file).");
    assert_eq!(text(results[5]), "Wrote /seeded.txt (1 lines, 9 bytes).");
    assert_eq!(
        fixture.files(&output),
        BTreeMap::from([
            ("/new.txt".to_owned(), b"first\n".to_vec()),
            ("/seeded.txt".to_owned(), b"replaced\n".to_vec()),
        ]),
        "{kind:?}"
    );
}

async fn edit_file_errors(kind: Kind) {
    let mut fixture = Fixture::new(kind);
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    fixture.seed("/shot.png", &png);
    let (output, fixture) = fixture
        .run(vec![json!([
            {"name": "edit_file", "args": {"file_path": "/missing.txt", "old_string": "a", "new_string": "b"}},
            {"name": "edit_file", "args": {"file_path": "/shot.png", "old_string": "PNG", "new_string": "JPG"}},
            {"name": "edit_file", "args": {"file_path": "/", "old_string": "a", "new_string": "b"}}
        ])])
        .await;
    let results = tool_results(&output.run.state.messages);
    assert_error_containing(results[0], "/missing.txt does not exist");
    assert_error_containing(
        results[1],
        "/shot.png is a binary file (image/png); it cannot be edited as text",
    );
    assert_error_containing(results[2], "/ is a directory");
    assert_eq!(
        fixture.files(&output),
        BTreeMap::from([("/shot.png".to_owned(), png)]),
        "nothing was created or changed"
    );
}

async fn read_file_pages_long_files_and_splits_long_lines(kind: Kind) {
    let body: String = (1..=1200).map(|i| format!("line {i}\n")).collect();
    let long_line = "x".repeat(12_000);
    let (output, _fixture) = Fixture::new(kind)
        .run(vec![
            json!([
                {"name": "write_file", "args": {"file_path": "/big.txt", "content": body}},
                {"name": "write_file", "args": {"file_path": "/long.txt", "content": format!("short\n{long_line}\nend\n")}},
                {"name": "write_file", "args": {"file_path": "/empty.txt", "content": ""}}
            ]),
            json!([
                {"name": "read_file", "args": {"file_path": "/big.txt"}},
                {"name": "read_file", "args": {"file_path": "/big.txt", "offset": 1195, "limit": 3}},
                {"name": "read_file", "args": {"file_path": "/long.txt"}},
                {"name": "read_file", "args": {"file_path": "/empty.txt"}},
                {"name": "read_file", "args": {"file_path": "/long.txt", "offset": 1, "limit": 1, "row": 2}}
            ]),
        ])
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
    // Starting at a continuation row shows that row and the rest of its line only.
    assert_eq!(
        t[7],
        format!(
            "   2.2\t{}\n\n[Lines 2-2 of 3 shown from /long.txt; 1 more. Continue with offset=2.]",
            "x".repeat(2_000)
        )
    );
}

/// A model that reads one file by following read_file's notes, the way a model would, until a
/// page has no note.
struct NoteFollower {
    path: String,
    calls: Mutex<usize>,
}

/// The `offset` and `row` a page's note says to continue with.
fn continuation(page: &str) -> Option<(u64, u64)> {
    let note = page.rsplit_once("Continue with offset=")?.1;
    let number = |s: &str| -> u64 {
        s.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap()
    };
    let offset = number(note);
    let row = note
        .split_once(" and row=")
        .map_or(0, |(_, rest)| number(rest));
    Some((offset, row))
}

#[async_trait]
impl Model for NoteFollower {
    fn id(&self) -> &str {
        "note-follower"
    }

    async fn generate(&self, request: &ModelRequest) -> Result<ModelResponse, ModelError> {
        let mut calls = self.calls.lock().unwrap();
        *calls += 1;
        assert!(*calls < 100, "paging does not end");
        let next = match request.messages.last() {
            Some(Message::Tool(result)) => {
                assert_eq!(result.status, ToolStatus::Ok, "{result:?}");
                continuation(&text(result))
            }
            _ => Some((0, 0)),
        };
        let (content, tool_calls) = match next {
            Some((offset, row)) => (
                vec![],
                vec![ToolCall {
                    id: format!("read_{calls}"),
                    name: "read_file".into(),
                    arguments: json!({"file_path": self.path, "offset": offset, "row": row}),
                }],
            ),
            None => (vec![ContentBlock::text("done")], vec![]),
        };
        let stop_reason = if tool_calls.is_empty() {
            StopReason::EndTurn
        } else {
            StopReason::ToolUse
        };
        Ok(ModelResponse {
            message: AssistantMessage {
                content,
                tool_calls,
            },
            usage: Default::default(),
            stop_reason,
        })
    }
}

/// Rebuilds the lines of a file from read_file pages, checking that every row is shown once and
/// in order.
fn reassemble(pages: &[String]) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut last: Option<(usize, usize)> = None;
    for page in pages {
        for row in page.lines().take_while(|row| !row.is_empty()) {
            let (label, chunk) = row.split_once('\t').unwrap();
            let label = label.trim_start();
            let (number, part) = match label.split_once('.') {
                Some((n, k)) => (n.parse::<usize>().unwrap(), k.parse::<usize>().unwrap()),
                None => (label.parse::<usize>().unwrap(), 0),
            };
            let expected = match last {
                Some((n, k)) if number == n => (n, k + 1),
                Some((n, _)) => (n + 1, 0),
                None => (1, 0),
            };
            assert_eq!(
                (number, part),
                expected,
                "rows skipped or repeated at {label}"
            );
            if part == 0 {
                lines.push(String::new());
            }
            lines.last_mut().unwrap().push_str(chunk);
            last = Some((number, part));
        }
    }
    lines
}

async fn paging_by_the_notes_reaches_every_character_of_huge_lines(kind: Kind) {
    // Multi-byte characters make rows of very different byte sizes; tabs inside the text must
    // survive too.
    let alphabet: Vec<char> = "ab\tcdé中🙂0123456789".chars().collect();
    let huge = |len: usize, seed: usize| -> String {
        (0..len)
            .map(|i| alphabet[(i * 7 + seed) % alphabet.len()])
            .collect()
    };
    let lines = vec![
        "short".to_owned(),
        huge(200_000, 1),
        "next".to_owned(),
        String::new(),
        huge(12_345, 2),
        huge(5_000, 3),
        huge(95_001, 4),
        "end".to_owned(),
    ];
    let content = lines.join("\n") + "\n";
    let mut fixture = Fixture::new(kind);
    fixture.seed("/min.js", content.as_bytes());
    let model = Arc::new(NoteFollower {
        path: "/min.js".into(),
        calls: Mutex::new(0),
    });
    let (output, _fixture) = fixture.run_model(model, |b| b).await;
    assert_eq!(output.text, "done");
    let pages = texts(&output);
    assert!(pages.len() >= 5, "{} pages", pages.len());
    for page in &pages {
        // The cap counts bytes of rows; the note comes on top.
        assert!(page.len() <= 80_000 + 250, "page of {} bytes", page.len());
    }
    // A page that stops inside a line says exactly where it goes on.
    let (offset, row) = continuation(&pages[0]).unwrap();
    assert_eq!(offset, 1);
    assert!(row > 0);
    assert!(
        pages[0].ends_with(&format!(
            "\n\n[Lines 1-2 of 8 shown from /min.js; line 2 goes on at row 2.{row}. Continue with offset=1 and row={row}.]"
        )),
        "{}",
        &pages[0][pages[0].len() - 200..]
    );
    assert_eq!(reassemble(&pages), lines);
}

async fn a_row_past_the_end_of_a_line_is_an_error(kind: Kind) {
    let (output, _fixture) = Fixture::new(kind)
        .run(vec![
            json!([{"name": "write_file", "args": {"file_path": "/a.txt", "content": format!("short\n{}\n", "z".repeat(10_000))}}]),
            json!([
                {"name": "read_file", "args": {"file_path": "/a.txt", "row": 1}},
                {"name": "read_file", "args": {"file_path": "/a.txt", "offset": 1, "row": 2}},
                {"name": "read_file", "args": {"file_path": "/a.txt", "offset": 1, "row": 1}}
            ]),
        ])
        .await;
    let results = tool_results(&output.run.state.messages);
    assert_error_containing(
        results[1],
        "row 1 is past the end of line 1 of /a.txt, which has only row 1; use a row below 1, or row 0.",
    );
    assert_error_containing(
        results[2],
        "row 2 is past the end of line 2 of /a.txt, which has rows 2 to 2.1; use a row below 2",
    );
    assert_eq!(text(results[3]), format!("   2.1\t{}\n", "z".repeat(5_000)));
}

async fn images_and_pdfs_come_back_as_content_the_model_can_see(kind: Kind) {
    let png: Vec<u8> = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
    let pdf: Vec<u8> = b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<<>>\nendobj\n%%EOF\n".to_vec();
    let mut fixture = Fixture::new(kind);
    fixture.seed("/shot.png", &png);
    fixture.seed("/docs/spec.pdf", &pdf);
    fixture.seed("/blob.bin", &[0, 1, 2]);
    let (output, _fixture) = fixture
        .run(vec![json!([
            {"name": "read_file", "args": {"file_path": "/shot.png"}},
            {"name": "read_file", "args": {"file_path": "/docs/spec.pdf"}},
            {"name": "read_file", "args": {"file_path": "/blob.bin"}},
            {"name": "grep", "args": {"pattern": "PDF"}}
        ])])
        .await;
    let results = tool_results(&output.run.state.messages);
    assert_eq!(
        results[0].content,
        [
            ContentBlock::text("/shot.png (image/png, 16 bytes):"),
            ContentBlock::data("image/png", png)
        ]
    );
    assert_eq!(
        results[1].content,
        [
            ContentBlock::text(format!(
                "/docs/spec.pdf (application/pdf, {} bytes):",
                pdf.len()
            )),
            ContentBlock::data("application/pdf", pdf)
        ]
    );
    let blob = text(results[2]);
    assert!(blob.contains("binary file (application/octet-stream, 3 bytes)"));
    // No shell here, so none is suggested.
    assert!(!blob.contains("execute"), "{blob}");
    // Binary files are not searched, and the result says which were skipped.
    assert_eq!(
        text(results[3]),
        "No matches for `PDF` under /.\n[Skipped 3 binary files (not searched): /blob.bin, /docs/spec.pdf, /shot.png.]"
    );
}

/// The bytes of `caf\xe9 cr\xe8me` and more: Latin-1, not UTF-8.
const LATIN1: &[u8] = b"caf\xe9 cr\xe8me\nneedle here\n";

/// A Latin-1 file is text: grep finds its lines (naming the binary files it skipped), read
/// shows its invalid bytes as U+FFFD, and an edit keeps the bytes it does not replace.
async fn text_that_is_not_utf8_is_read_searched_and_edited(kind: Kind) {
    let mut fixture = Fixture::new(kind);
    fixture.seed("/menu.txt", LATIN1);
    fixture.seed("/a.png", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR");
    fixture.seed("/b.bin", b"needle\0here");
    let (output, fixture) = fixture
        .run(vec![
            json!([
                {"name": "grep", "args": {"pattern": "needle"}},
                {"name": "grep", "args": {"pattern": "cr", "output_mode": "content"}},
                {"name": "read_file", "args": {"file_path": "/menu.txt"}}
            ]),
            json!([{"name": "edit_file", "args": {"file_path": "/menu.txt", "old_string": "needle here", "new_string": "needle there"}}]),
        ])
        .await;
    let t = texts(&output);
    let skipped = "[Skipped 2 binary files (not searched): /a.png, /b.bin.]";
    assert_eq!(t[0], format!("/menu.txt\n{skipped}"), "{kind:?}");
    assert_eq!(
        t[1],
        format!("/menu.txt:\n     1: caf\u{FFFD} cr\u{FFFD}me\n{skipped}")
    );
    assert_eq!(
        t[2],
        "     1\tcaf\u{FFFD} cr\u{FFFD}me\n     2\tneedle here\n"
    );
    assert_eq!(t[3], "Replaced 1 occurrence in /menu.txt.");
    assert_eq!(
        fixture.files(&output)["/menu.txt"],
        b"caf\xe9 cr\xe8me\nneedle there\n",
        "the bytes that are not UTF-8 are kept"
    );
}

async fn parallel_writes_in_one_turn_all_land(kind: Kind) {
    let calls: Vec<Value> = (0..8)
        .map(|i| json!({"name": "write_file", "args": {"file_path": format!("/out/{i}.txt"), "content": format!("{i}\n")}}))
        .collect();
    let (output, fixture) = Fixture::new(kind).run(vec![Value::Array(calls)]).await;
    let files = fixture.files(&output);
    assert_eq!(files.len(), 8);
    assert_eq!(files["/out/7.txt"], b"7\n");
    assert!(texts(&output).iter().all(|t| t.starts_with("Wrote /out/")));
}

async fn permissions_deny_and_filter(kind: Kind) {
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
    let mut fixture = Fixture::new(kind);
    for path in ["/secrets/key.txt", "/readonly/a.txt", "/open.txt"] {
        fixture.seed(path, b"token\n");
    }
    let (output, fixture) = fixture
        .run_with(
            vec![json!([
                {"name": "read_file", "args": {"file_path": "/secrets/key.txt"}},
                {"name": "grep", "args": {"pattern": "token"}},
                {"name": "glob", "args": {"pattern": "*.txt"}},
                {"name": "read_file", "args": {"file_path": "/readonly/a.txt"}},
                {"name": "write_file", "args": {"file_path": "/readonly/a.txt", "content": "changed"}},
                {"name": "delete", "args": {"path": "/readonly"}},
                {"name": "edit_file", "args": {"file_path": "/secrets/key.txt", "old_string": "token", "new_string": "x"}}
            ])],
            |b| b.permissions(Permissions::new(rules).unwrap()),
        )
        .await;
    let results = tool_results(&output.run.state.messages);
    assert_error_containing(results[0], "permission denied for /secrets/key.txt");
    assert_eq!(text(results[1]), "/open.txt\n/readonly/a.txt");
    assert_eq!(text(results[2]), "/open.txt\n/readonly/a.txt");
    assert_eq!(results[3].status, ToolStatus::Ok);
    assert_error_containing(results[4], "denies writing");
    assert_error_containing(results[5], "permission denied for /readonly");
    assert_error_containing(results[6], "permission denied for /secrets/key.txt");
    assert!(
        fixture
            .files(&output)
            .values()
            .all(|bytes| bytes == b"token\n"),
        "no file changed"
    );
}

async fn grep_says_when_it_stopped_at_max_count(kind: Kind) {
    let mut fixture = Fixture::new(kind);
    let body: String = (1..=10).map(|i| format!("match {i}\n")).collect();
    fixture.seed("/log.txt", body.as_bytes());
    let (output, _fixture) = fixture
        .run(vec![json!([
            {"name": "grep", "args": {"pattern": "match", "output_mode": "content", "max_count": 3}},
            {"name": "grep", "args": {"pattern": "match", "output_mode": "count"}},
            {"name": "grep", "args": {"pattern": "match", "output_mode": "content", "max_count": 10}}
        ])])
        .await;
    let t = texts(&output);
    assert_eq!(
        t[0],
        "/log.txt:\n     1: match 1\n     2: match 2\n     3: match 3\n[Stopped after 3 matching lines; more may exist. Narrow the search with path or glob.]"
    );
    assert_eq!(t[1], "/log.txt: 10");
    assert!(!t[2].contains("Stopped after"), "{}", t[2]);
    assert!(t[2].ends_with("    10: match 10"), "{}", t[2]);
}

async fn ls_and_glob_cap_their_output_with_a_note(kind: Kind) {
    let mut fixture = Fixture::new(kind);
    // 500 names of ~200 characters: about 110,000 characters listed.
    let names: Vec<String> = (0..500)
        .map(|i| format!("/many/f{i:04}{}.txt", "n".repeat(190)))
        .collect();
    for name in &names {
        fixture.seed(name, b"x");
    }
    let (output, _fixture) = fixture
        .run(vec![json!([
            {"name": "ls", "args": {"path": "/many"}},
            {"name": "glob", "args": {"pattern": "*.txt"}}
        ])])
        .await;
    let t = texts(&output);
    for (listing, what) in [(&t[0], "entries"), (&t[1], "paths")] {
        assert!(listing.len() <= 80_000 + 100, "{} bytes", listing.len());
        let (shown, note) = listing.rsplit_once("\n\n").unwrap();
        let shown = shown.lines().count();
        assert!((300..500).contains(&shown), "{shown} shown");
        let omitted = 500 - shown;
        assert!(
            note.starts_with(&format!("[{omitted} of 500 {what} not shown;")),
            "{note}"
        );
    }
    assert!(t[0].starts_with(&format!("{} (1 bytes)\n", names[0])));
    assert!(t[1].starts_with(&format!("{}\n", names[0])));
    assert!(t[1].ends_with("use a narrower pattern or path.]"));
    assert!(t[0].ends_with("list a subdirectory or use glob.]"));
}

async fn large_results_are_offloaded_and_can_be_read_back(kind: Kind) {
    use deepagents::{DynamicTool, ToolOutput};
    let big: String = (0..20_000).map(|i| format!("row {i}\n")).collect();
    let expected_len = big.len();
    let dump = DynamicTool::new("dump", "dump", json!({"type": "object"}), move |_, _| {
        let big = big.clone();
        async move { Ok(ToolOutput::text(big)) }
    })
    .unwrap();
    let (output, fixture) = Fixture::new(kind)
        .run_with(
            vec![
                json!([{"id": "call_dump", "name": "dump", "args": {}}]),
                json!([{"name": "read_file", "args": {"file_path": "/large_tool_results/call_dump", "offset": 19998}}]),
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
    assert_eq!(
        fixture.files(&output)["/large_tool_results/call_dump"].len(),
        expected_len
    );
    // The harness's own files stay out of the user's working tree.
    if kind == Kind::Disk {
        assert!(!fixture.root().join("large_tool_results").exists());
        assert!(
            output
                .run
                .state
                .files
                .contains_key("/large_tool_results/call_dump")
        );
    }
}

/// Call ids need not be unique across the runs of one thread: a later run's large result
/// under an id already used replaces the saved file rather than failing to save.
#[tokio::test]
async fn a_repeated_call_id_in_a_later_run_saves_its_own_large_result() {
    use deepagents::{DynamicTool, ToolOutput};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let calls = Arc::new(AtomicUsize::new(0));
    let dump = DynamicTool::new("dump", "dump", json!({"type": "object"}), move |_, _| {
        let round = calls.fetch_add(1, Ordering::Relaxed);
        async move {
            let big: String = (0..20_000)
                .map(|i| format!("run {round} row {i}\n"))
                .collect();
            Ok(ToolOutput::text(big))
        }
    })
    .unwrap();
    let model = scripted(json!([
        {"tool_calls": [{"id": "call_dump", "name": "dump", "args": {}}]},
        {"text": "first done"},
        {"tool_calls": [{"id": "call_dump", "name": "dump", "args": {}}]},
        {"tool_calls": [{"name": "read_file", "args": {"file_path": "/large_tool_results/call_dump", "limit": 1}}]},
        {"text": "second done"}
    ]));
    let agent = Agent::builder(model)
        .dyn_tool(Arc::new(dump))
        .build()
        .unwrap();
    let first = agent
        .run(
            Run::from_task("go"),
            Default::default(),
            EventSink::discard(),
        )
        .await
        .unwrap();
    assert_eq!(first.text, "first done");
    let mut run = first.run;
    run.push_user_input(vec![ContentBlock::text("again")]);
    let second = agent
        .run(run, Default::default(), EventSink::discard())
        .await
        .unwrap();
    assert_eq!(second.text, "second done");
    let t = texts(&second);
    assert!(
        t[1].starts_with("The result was too large to show")
            && t[1].contains("saved to /large_tool_results/call_dump"),
        "{}",
        &t[1][..t[1].len().min(300)]
    );
    assert!(
        t[2].starts_with("     1\trun 1 row 0\n"),
        "the file holds the later run's result: {}",
        t[2]
    );
}

/// The disk backend refuses to follow a symlink out of its root, for reads and writes alike.
#[tokio::test]
async fn disk_writes_never_leave_the_root_through_symlinks() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "outside\n").unwrap();
    let mut fixture = Fixture::new(Kind::Disk);
    std::os::unix::fs::symlink(outside.path(), fixture.root().join("link")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        fixture.root().join("file-link.txt"),
    )
    .unwrap();
    fixture.seed("/inside.txt", b"in\n");
    let (output, _fixture) = fixture
        .run(vec![json!([
            {"name": "write_file", "args": {"file_path": "/link/new.txt", "content": "escaped"}},
            {"name": "write_file", "args": {"file_path": "/file-link.txt", "content": "escaped"}},
            {"name": "edit_file", "args": {"file_path": "/link/secret.txt", "old_string": "outside", "new_string": "escaped"}},
            {"name": "read_file", "args": {"file_path": "/link/secret.txt"}},
            {"name": "delete", "args": {"path": "/link/secret.txt"}}
        ])])
        .await;
    let results = tool_results(&output.run.state.messages);
    for result in &results {
        assert_eq!(result.status, ToolStatus::Error, "{result:?}");
    }
    assert!(!outside.path().join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(),
        "outside\n"
    );
}

/// Mutating calls of one step run one after another; each should see the changes of the calls
/// before it, as on disk.
async fn mutating_calls_in_one_turn_see_each_other(kind: Kind) {
    let (output, fixture) = Fixture::new(kind)
        .run(vec![json!([
            {"name": "write_file", "args": {"file_path": "/new.txt", "content": "draft\n"}},
            {"name": "edit_file", "args": {"file_path": "/new.txt", "old_string": "draft", "new_string": "final"}},
            {"name": "write_file", "args": {"file_path": "/gone.txt", "content": "x\n"}},
            {"name": "delete", "args": {"path": "/gone.txt"}}
        ])])
        .await;
    let t = texts(&output);
    assert_eq!(t[1], "Replaced 1 occurrence in /new.txt.", "{kind:?}");
    assert_eq!(t[3], "Deleted /gone.txt (1 file).", "{kind:?}");
    assert_eq!(
        fixture.files(&output),
        BTreeMap::from([("/new.txt".to_owned(), b"final\n".to_vec())])
    );
}

#[tokio::test]
async fn mutating_calls_in_one_turn_see_each_other_on_disk() {
    mutating_calls_in_one_turn_see_each_other(Kind::Disk).await;
}

/// On the state backend, file changes are state updates merged at the end of the step; the
/// driver hands each mutating call the state with the earlier mutating calls' updates applied.
#[tokio::test]
async fn mutating_calls_in_one_turn_see_each_other_in_state() {
    mutating_calls_in_one_turn_see_each_other(Kind::State).await;
}

/// A symlink the disk backend will not follow is listed as one, with why, and no size.
#[tokio::test]
async fn ls_shows_symlinks_that_cannot_be_followed_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    std::fs::write(dir.path().join("secret.txt"), "outside").unwrap();
    std::fs::write(root.join("real.txt"), "four").unwrap();
    std::os::unix::fs::symlink("../secret.txt", root.join("escape")).unwrap();
    std::os::unix::fs::symlink("gone.txt", root.join("dangling")).unwrap();
    let backend = FilesystemBackend::new(&root).unwrap();
    let agent = Agent::builder(scripted(turns(vec![json!([
        {"name": "ls", "args": {"path": "/"}}
    ])])))
    .backend(Arc::new(backend))
    .build()
    .unwrap();
    let output = agent.invoke("go").await.unwrap();
    assert_eq!(
        texts(&output)[0],
        "/dangling -> (symlink that cannot be followed: missing target, a loop, or links are off)\n\
         /escape -> (symlink leading outside the workspace; not followed)\n\
         /real.txt (4 bytes)"
    );
}

// --- execute, on the local shell backend ---

async fn run_shell(
    shell: impl FnOnce(FilesystemBackend) -> LocalShellBackend,
    steps: Vec<Value>,
) -> (RunOutput, TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let backend = shell(FilesystemBackend::new(dir.path()).unwrap());
    let agent = Agent::builder(scripted(turns(steps)))
        .backend(Arc::new(backend))
        .build()
        .unwrap();
    (agent.invoke("go").await.unwrap(), dir)
}

#[tokio::test]
async fn execute_reports_output_stderr_and_exit_code() {
    let (output, dir) = run_shell(LocalShellBackend::new, vec![
        json!([{"name": "write_file", "args": {"file_path": "/src/app.py", "content": "print('hi')\n"}}]),
        json!([
            {"name": "execute", "args": {"command": "cat src/app.py; echo oops >&2; exit 3"}},
            {"name": "execute", "args": {"command": "echo made > out.txt"}},
            {"name": "execute", "args": {"command": "true"}},
            {"name": "execute", "args": {"command": "printf 'no newline'"}}
        ]),
        json!([{"name": "read_file", "args": {"file_path": "/out.txt"}}]),
    ])
    .await;
    let t = texts(&output);
    // stdout and stderr are separate pipes, so their lines may arrive in either order.
    let (lines, status) = t[1].rsplit_once('\n').unwrap();
    let mut lines: Vec<&str> = lines.lines().collect();
    lines.sort_unstable();
    assert_eq!(lines, ["[stderr] oops", "print('hi')"], "{}", t[1]);
    assert_eq!(status, "[Exit code 3]");
    assert_eq!(t[2], "[Exit code 0]");
    assert_eq!(t[3], "[Exit code 0]");
    assert_eq!(t[4], "no newline\n[Exit code 0]");
    // What the shell wrote, the file tools see.
    assert_eq!(t[5], "     1\tmade\n");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).unwrap(),
        "made\n"
    );
}

#[tokio::test]
async fn execute_rejects_bad_arguments() {
    let (output, _dir) = run_shell(
        LocalShellBackend::new,
        vec![json!([
            {"name": "execute", "args": {"command": ""}},
            {"name": "execute", "args": {"command": "  \n\t"}},
            {"name": "execute", "args": {"command": "true", "timeout": 0}},
            {"name": "execute", "args": {"command": "true", "timeout": 3601}},
            {"name": "execute", "args": {"command": "true", "timeout": -1}},
            {"name": "execute", "args": {}},
            {"name": "execute", "args": {"command": "true", "timeout": 3600}}
        ])],
    )
    .await;
    let results = tool_results(&output.run.state.messages);
    assert_error_containing(results[0], "The command is empty");
    assert_error_containing(results[1], "The command is empty");
    assert_error_containing(results[2], "at /timeout: 0 is less than the minimum of 1");
    assert_error_containing(
        results[3],
        "at /timeout: 3601 is greater than the maximum of 3600",
    );
    assert_eq!(results[4].status, ToolStatus::Error, "{:?}", results[4]);
    assert_error_containing(results[5], "command");
    assert_eq!(text(results[6]), "[Exit code 0]");
}

#[tokio::test]
async fn execute_kills_at_the_timeout_and_reports_exit_124() {
    let started = std::time::Instant::now();
    let (output, _dir) = run_shell(LocalShellBackend::new, vec![json!([
        {"name": "execute", "args": {"command": "echo started; sleep 30; echo never", "timeout": 1}}
    ])])
    .await;
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
    let t = texts(&output);
    assert_eq!(
        t[0],
        "started\n[Killed: the command ran past its timeout. Exit code 124.]"
    );
}

#[tokio::test]
async fn execute_notes_cut_output() {
    let (output, _dir) = run_shell(
        |fs| LocalShellBackend::new(fs).with_max_output_bytes(100),
        vec![json!([{"name": "execute", "args": {"command": "seq 1 1000"}}])],
    )
    .await;
    let t = &texts(&output)[0];
    assert!(t.starts_with("1\n2\n3\n"), "{t}");
    assert!(!t.contains("\n1000\n"), "{t}");
    // One note, after the output, saying how much is shown and how to see the rest.
    let (shown, notes) = t.split_at(t.find("\n[").unwrap() + 1);
    assert_eq!(shown.len(), 101, "{t}");
    assert_eq!(
        notes,
        "[Output cut: only its first 100 bytes are shown. To see the rest, redirect it to a file (`COMMAND > out.txt 2>&1`) and read or grep that file.]\n[Exit code 0]",
        "{t}"
    );
    assert_eq!(t.matches("cut").count(), 1, "{t}");
    assert!(!t.contains("truncated"), "{t}");
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

/// Only an agent with a shell is told to inspect a binary file with a command.
#[tokio::test]
async fn binary_files_suggest_a_command_only_with_a_shell() {
    let (output, _dir) = run_shell(
        LocalShellBackend::new,
        vec![
            json!([{"name": "execute", "args": {"command": "printf 'a\\0b' > blob.bin"}}]),
            json!([{"name": "read_file", "args": {"file_path": "/blob.bin"}}]),
        ],
    )
    .await;
    let t = texts(&output);
    assert!(t[1].contains("cannot be shown as text"), "{}", t[1]);
    assert!(t[1].contains("through execute"), "{}", t[1]);
}

/// A small model's `read_file` page holds a quarter of its window, so one default read cannot
/// fill it; large windows keep the 80,000-character page.
#[tokio::test]
async fn read_file_pages_fit_a_small_window() {
    // 500 lines of about 100 characters: 50,000 characters, ≈ 12,500 tokens in one page.
    let body: String = (1..=500)
        .map(|i| format!("{i:>5} {}\n", "lorem ipsum ".repeat(8)))
        .collect();
    let read = |window: Option<u64>| {
        let body = body.clone();
        async move {
            let mut fixture = Fixture::new(Kind::State);
            fixture.seed("/log.txt", body.as_bytes());
            let (output, _fixture) = fixture
                .run_with(
                    vec![json!([{"name": "read_file", "args": {"file_path": "/log.txt"}}])],
                    |b| match window {
                        Some(tokens) => b.context_window(tokens),
                        None => b,
                    },
                )
                .await;
            texts(&output)[0].clone()
        }
    };
    let small = read(Some(8_192)).await;
    assert!(small.len() <= 8_192 + 250, "page of {} bytes", small.len());
    assert!(small.contains("Continue with offset="), "{small}");
    // A quarter of the window at most, at four characters a token.
    assert!((small.len() as u64).div_ceil(4) <= 8_192 / 4 + 100);
    let large = read(None).await;
    assert!(large.len() > 50_000, "page of {} bytes", large.len());
    assert!(!large.contains("Continue with offset="), "{large}");
}
