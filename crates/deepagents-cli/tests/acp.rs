//! `deepagents acp`: the agent driven as an editor drives it, with JSON-RPC lines on its
//! stdin and stdout (the ACP wire format Zed and the other clients speak).

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::bin;

/// A `deepagents acp` process and the client's side of its connection.
struct Editor {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<Value>,
    next_id: u64,
}

impl Editor {
    /// Starts `deepagents acp` with its data in `data` and these flags, as an editor that
    /// offers neither its files nor its terminal.
    fn start(data: &Path, model: &str, flags: &[&str]) -> Self {
        Self::start_offering(
            data,
            model,
            flags,
            json!({"fs": {"readTextFile": false, "writeTextFile": false}}),
        )
    }

    /// [`Editor::start`] as an editor offering `capabilities` (`clientCapabilities`).
    fn start_offering(data: &Path, model: &str, flags: &[&str], capabilities: Value) -> Self {
        let mut child = bin()
            .env("DEEPAGENTS_DATA_DIR", data)
            .args(["acp", "--model", model])
            .args(flags)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let value: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("not JSON on stdout: {line:?}: {e}"));
                if sender.send(value).is_err() {
                    break;
                }
            }
        });
        let mut editor = Self {
            stdin: child.stdin.take(),
            child,
            lines,
            next_id: 0,
        };
        let init = editor.call(
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": capabilities}),
        );
        assert_eq!(init["result"]["protocolVersion"], 1, "{init}");
        editor
    }

    fn send(&mut self, message: &Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
    }

    /// Sends a request; its id.
    fn request(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    fn receive(&self) -> Value {
        self.lines
            .recv_timeout(Duration::from_secs(60))
            .expect("no message from `deepagents acp` within 60 s")
    }

    /// Reads until the response to `id`; the messages before it. `answer` answers the
    /// agent's requests (permission requests, the editor's files and terminals); an answer
    /// `{"_error": MESSAGE}` is sent as an error.
    fn until(&mut self, id: u64, mut answer: impl FnMut(&Value) -> Value) -> (Vec<Value>, Value) {
        let mut seen = Vec::new();
        loop {
            let message = self.receive();
            if message.get("method").is_some() && message.get("id").is_some() {
                let result = answer(&message);
                let reply = match result.get("_error") {
                    Some(error) => json!({"jsonrpc": "2.0", "id": message["id"],
                        "error": {"code": -32603, "message": error}}),
                    None => json!({"jsonrpc": "2.0", "id": message["id"], "result": result}),
                };
                seen.push(message);
                self.send(&reply);
            } else if message.get("method").is_some() {
                seen.push(message);
            } else if message["id"] == id {
                return (seen, message);
            }
        }
    }

    /// A request answered; the response (its updates are dropped).
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.request(method, params);
        self.until(id, |request| panic!("unexpected request {request}"))
            .1
    }

    fn new_session(&mut self, cwd: &Path) -> (String, Value) {
        let response = self.call("session/new", json!({"cwd": cwd, "mcpServers": []}));
        let id = response["result"]["sessionId"].as_str().unwrap().to_owned();
        (id, response)
    }

    /// A prompt; the updates and requests it brought, and its stop reason.
    fn prompt(
        &mut self,
        session: &str,
        text: &str,
        answer: impl FnMut(&Value) -> Value,
    ) -> (Vec<Value>, String) {
        let id = self.request(
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
        );
        let (seen, response) = self.until(id, answer);
        let stop = response["result"]["stopReason"]
            .as_str()
            .unwrap_or_else(|| panic!("no stop reason: {response}"))
            .to_owned();
        (seen, stop)
    }

    /// Closes stdin (as an editor quitting does) and waits for the process to exit.
    fn finish(mut self) {
        drop(self.stdin.take());
        for _ in 0..200 {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "deepagents acp exited with {status}");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child.kill().unwrap();
        panic!("deepagents acp did not exit when stdin closed");
    }
}

/// The `session/update`s among `messages`, by kind.
fn updates<'a>(messages: &'a [Value], kind: &str) -> Vec<&'a Value> {
    messages
        .iter()
        .filter(|m| m["method"] == "session/update")
        .map(|m| &m["params"]["update"])
        .filter(|u| u["sessionUpdate"] == kind)
        .collect()
}

fn text_of(updates: &[&Value]) -> String {
    updates
        .iter()
        .filter_map(|u| u["content"]["text"].as_str())
        .collect()
}

fn script(dir: &Path, script: &Value) -> String {
    let path = dir.join("script.json");
    std::fs::write(&path, script.to_string()).unwrap();
    format!("scripted:{}", path.display())
}

fn write(id: &str, path: &str, content: &str) -> Value {
    json!({"id": id, "name": "write_file", "args": {"file_path": path, "content": content}})
}

fn permission(option: &'static str) -> impl FnMut(&Value) -> Value {
    move |request| {
        assert_eq!(request["method"], "session/request_permission", "{request}");
        json!({"outcome": {"outcome": "selected", "optionId": option}})
    }
}

#[test]
fn a_turn_streams_text_plan_and_a_diff_and_the_session_loads_back() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let model = script(
        work.path(),
        &json!({"turns": [{"text": "Default answer."}], "conversations": [
            {"when_task_contains": "write the notes", "turns": [
                {"text": "Planning first.", "tool_calls": [{"id": "t1", "name": "write_todos", "args": {"todos": [
                    {"content": "Write the notes", "status": "in_progress"},
                    {"content": "Review them", "status": "pending"}
                ]}}]},
                {"text": "Writing the notes.", "tool_calls": [write("w1", "/notes.md", "hello\n")]},
                {"text": "Done: notes.md holds them."},
                {"text": "Nothing more."}
            ]}
        ]}),
    );
    let mut editor = Editor::start(work.path(), &model, &["--todos"]);
    let (session, created) = editor.new_session(&root);
    assert_eq!(
        created["result"]["modes"]["currentModeId"], "auto",
        "{created}"
    );
    let (seen, stop) = editor.prompt(&session, "write the notes", |r| panic!("asked {r}"));
    assert_eq!(stop, "end_turn");
    let said = text_of(&updates(&seen, "agent_message_chunk"));
    assert!(said.contains("Writing the notes."), "{said}");
    assert!(said.contains("Done: notes.md holds them."), "{said}");

    let plans = updates(&seen, "plan");
    let entries = &plans.last().expect("a plan update")["entries"];
    assert_eq!(entries[0]["content"], "Write the notes");
    assert_eq!(entries[0]["status"], "in_progress");
    assert_eq!(entries[1]["status"], "pending");

    let calls = updates(&seen, "tool_call");
    let write_call = calls
        .iter()
        .find(|c| c["toolCallId"] == "w1")
        .expect("write_file announced");
    assert_eq!(write_call["kind"], "edit", "{write_call}");
    let changes: Vec<_> = updates(&seen, "tool_call_update")
        .into_iter()
        .filter(|u| u["toolCallId"] == "w1")
        .collect();
    let statuses: Vec<_> = changes
        .iter()
        .filter_map(|u| u["status"].as_str())
        .collect();
    assert_eq!(statuses, ["in_progress", "completed"], "{changes:?}");
    let finished = changes.last().unwrap();
    let diff = &finished["content"][0];
    assert_eq!(diff["type"], "diff", "{finished}");
    assert_eq!(diff["path"], root.join("notes.md").to_str().unwrap());
    assert_eq!(diff["newText"], "hello\n");
    assert_eq!(
        std::fs::read_to_string(root.join("notes.md")).unwrap(),
        "hello\n"
    );
    editor.finish();

    // Another editor process reopens the thread: its conversation comes back as updates.
    let mut editor = Editor::start(work.path(), &model, &["--todos"]);
    let id = editor.request(
        "session/load",
        json!({"sessionId": session, "cwd": root, "mcpServers": []}),
    );
    let (replayed, loaded) = editor.until(id, |r| panic!("asked {r}"));
    assert!(loaded.get("result").is_some(), "{loaded}");
    assert_eq!(
        text_of(&updates(&replayed, "user_message_chunk")),
        "write the notes"
    );
    let said = text_of(&updates(&replayed, "agent_message_chunk"));
    assert!(said.contains("Planning first."), "{said}");
    assert!(said.contains("Done: notes.md holds them."), "{said}");
    let calls = updates(&replayed, "tool_call");
    let write_call = calls.iter().find(|c| c["toolCallId"] == "w1").unwrap();
    assert_eq!(write_call["status"], "completed", "{write_call}");
    assert_eq!(write_call["content"][0]["newText"], "hello\n");
    assert_eq!(updates(&replayed, "plan").len(), 1);

    // The loaded session takes the next prompt on the same thread.
    let (seen, stop) = editor.prompt(&session, "and then?", |r| panic!("asked {r}"));
    assert_eq!(stop, "end_turn");
    assert_eq!(
        text_of(&updates(&seen, "agent_message_chunk")),
        "Nothing more."
    );
    editor.finish();
}

#[test]
fn permission_requests_allow_once_always_and_reject() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let model = script(
        work.path(),
        &json!({"turns": [{"text": "Default answer."}], "conversations": [
            {"when_task_contains": "two files", "turns": [
                {"tool_calls": [write("a1", "/a1.md", "one\n")]},
                {"tool_calls": [write("a2", "/a2.md", "two\n")]},
                {"text": "Both written."}
            ]},
            {"when_task_contains": "ask each time", "turns": [
                {"tool_calls": [write("b1", "/b1.md", "one\n")]},
                {"tool_calls": [write("b2", "/b2.md", "two\n")]},
                {"text": "One written, one refused."}
            ]}
        ]}),
    );
    let mut editor = Editor::start(work.path(), &model, &[]);

    // Manual mode asks before every change; "always" allows write_file for the session.
    let (first, _) = editor.new_session(&root);
    let mode = editor.call(
        "session/set_mode",
        json!({"sessionId": first, "modeId": "manual"}),
    );
    assert!(mode.get("result").is_some(), "{mode}");
    let mut asked = Vec::new();
    let (_, stop) = editor.prompt(&first, "two files", |request| {
        asked.push(request.clone());
        json!({"outcome": {"outcome": "selected", "optionId": "allow_always"}})
    });
    assert_eq!(stop, "end_turn");
    assert_eq!(asked.len(), 1, "{asked:?}");
    let request = &asked[0]["params"];
    let options: Vec<_> = request["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["kind"].as_str().unwrap())
        .collect();
    assert_eq!(options, ["allow_once", "allow_always", "reject_once"]);
    assert_eq!(request["toolCall"]["toolCallId"], "a1");
    assert_eq!(request["toolCall"]["content"][0]["type"], "diff");
    assert_eq!(request["toolCall"]["content"][0]["newText"], "one\n");
    assert!(root.join("a1.md").exists() && root.join("a2.md").exists());

    // Allowed once, then asked again and rejected: the second file is not written.
    let (second, _) = editor.new_session(&root);
    editor.call(
        "session/set_mode",
        json!({"sessionId": second, "modeId": "manual"}),
    );
    let mut answers = vec!["reject_once", "allow_once"];
    let mut asked = 0;
    let (seen, stop) = editor.prompt(&second, "ask each time", |request| {
        asked += 1;
        permission(answers.pop().unwrap())(request)
    });
    assert_eq!(stop, "end_turn");
    assert_eq!(asked, 2);
    assert_eq!(
        std::fs::read_to_string(root.join("b1.md")).unwrap(),
        "one\n"
    );
    assert!(!root.join("b2.md").exists());
    let refused = updates(&seen, "tool_call_update")
        .into_iter()
        .filter(|u| u["toolCallId"] == "b2")
        .filter_map(|u| u["status"].as_str())
        .collect::<Vec<_>>();
    assert!(refused.contains(&"failed"), "{refused:?}");
    assert!(!refused.contains(&"completed"), "{refused:?}");
    editor.finish();
}

#[test]
fn cancel_ends_a_running_turn_as_cancelled() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let model = script(
        work.path(),
        &json!({"turns": [
            {"text": "Waiting.", "tool_calls": [{"id": "s1", "name": "execute", "args": {"command": "sleep 120"}}]},
            {"text": "Not reached."}
        ]}),
    );
    let flags = ["--backend", "shell", "--sandbox", "off", "--auto-approve"];
    let mut editor = Editor::start(work.path(), &model, &flags);
    let (session, _) = editor.new_session(root.path());
    let id = editor.request(
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text", "text": "wait a while"}]}),
    );
    // Once the command runs, the editor cancels.
    loop {
        let message = editor.receive();
        let update = &message["params"]["update"];
        if update["sessionUpdate"] == "tool_call_update" && update["status"] == "in_progress" {
            assert_eq!(update["kind"], "execute", "{update}");
            break;
        }
        assert!(message.get("result").is_none(), "the turn ended: {message}");
    }
    let started = std::time::Instant::now();
    editor.send(
        &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}),
    );
    let (_, response) = editor.until(id, |r| panic!("asked {r}"));
    assert_eq!(response["result"]["stopReason"], "cancelled", "{response}");
    assert!(started.elapsed() < Duration::from_secs(30));
    editor.finish();
}

#[test]
fn a_permission_request_cancelled_ends_the_turn_and_the_session_goes_on() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let model = script(
        work.path(),
        &json!({"turns": [
            {"tool_calls": [write("c1", "/c1.md", "one\n")]},
            {"text": "Understood, nothing written."}
        ]}),
    );
    let mut editor = Editor::start(work.path(), &model, &["--interrupt-on", "write_file"]);
    let (session, _) = editor.new_session(&root);
    // The editor cancels the turn while it asks, and answers the request `cancelled`.
    let (seen, stop) = editor.prompt(&session, "write c1", |request| {
        assert_eq!(request["method"], "session/request_permission");
        json!({"outcome": {"outcome": "cancelled"}})
    });
    assert_eq!(stop, "cancelled");
    assert!(!root.join("c1.md").exists());
    let statuses: Vec<_> = updates(&seen, "tool_call_update")
        .into_iter()
        .filter_map(|u| u["status"].as_str())
        .collect();
    assert_eq!(statuses, ["failed"], "{seen:?}");
    // The refused call is settled in the thread: the next prompt continues the conversation.
    let (seen, stop) = editor.prompt(&session, "never mind", |r| panic!("asked {r}"));
    assert_eq!(stop, "end_turn", "{seen:?}");
    editor.finish();
}

/// The requests among `messages` with this method.
fn requests<'a>(messages: &'a [Value], method: &str) -> Vec<&'a Value> {
    messages
        .iter()
        .filter(|m| m["method"] == method && m.get("id").is_some())
        .collect()
}

/// The last `tool_call_update` of call `id` that carries `field`.
fn last_update<'a>(messages: &'a [Value], id: &str, field: &str) -> &'a Value {
    updates(messages, "tool_call_update")
        .into_iter()
        .rfind(|u| u["toolCallId"] == id && u.get(field).is_some())
        .unwrap_or_else(|| panic!("no update of {id} with {field}: {messages:?}"))
}

#[test]
fn the_editors_buffers_are_read_and_written_instead_of_the_disk() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(root.join("notes.md"), "on disk\n").unwrap();
    std::fs::write(root.join("closed.md"), "closed\n").unwrap();
    std::fs::write(outside.path().join("secret.txt"), "secret\n").unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), root.join("escape.txt")).unwrap();
    std::fs::create_dir(root.join("private")).unwrap();
    std::fs::write(root.join("private/key.txt"), "key\n").unwrap();
    let rules = work.path().join("permissions.toml");
    std::fs::write(
        &rules,
        "[[rules]]\noperations = [\"read\", \"write\"]\npaths = [\"/private/**\"]\nmode = \"deny\"\n",
    )
    .unwrap();
    let call = |id: &str, name: &str, args: Value| json!({"id": id, "name": name, "args": args});
    let model = script(
        work.path(),
        &json!({"turns": [
            {"tool_calls": [call("r1", "read_file", json!({"file_path": "/notes.md"}))]},
            {"tool_calls": [call("r2", "read_file", json!({"file_path": "/closed.md"}))]},
            {"tool_calls": [call("e1", "edit_file", json!({"file_path": "/notes.md", "old_string": "unsaved", "new_string": "edited"}))]},
            {"tool_calls": [write("w1", "/new.md", "fresh\n")]},
            {"tool_calls": [call("x1", "read_file", json!({"file_path": "/escape.txt"}))]},
            {"tool_calls": [call("x2", "edit_file", json!({"file_path": "/escape.txt", "old_string": "secret", "new_string": "mine"}))]},
            {"tool_calls": [call("x3", "read_file", json!({"file_path": "/private/key.txt"}))]},
            {"tool_calls": [write("x4", "/private/new.txt", "no\n")]},
            {"text": "Done."}
        ]}),
    );
    let flags = ["--permissions", rules.to_str().unwrap()];
    let offered = json!({"fs": {"readTextFile": true, "writeTextFile": true}});
    let mut editor = Editor::start_offering(work.path(), &model, &flags, offered);
    let (session, _) = editor.new_session(&root);
    let notes = root.join("notes.md");
    let mut buffer = "an unsaved buffer\n".to_owned();
    let mut written = Vec::new();
    let (seen, stop) = editor.prompt(&session, "work on the notes", |request| {
        let params = &request["params"];
        assert_eq!(params["sessionId"], session.as_str(), "{request}");
        let path = params["path"].as_str().unwrap();
        match request["method"].as_str().unwrap() {
            "fs/read_text_file" if path == notes.to_str().unwrap() => json!({"content": buffer}),
            "fs/read_text_file" => {
                assert_eq!(path, root.join("closed.md").to_str().unwrap(), "{request}");
                json!({"_error": "the buffer could not be opened"})
            }
            "fs/write_text_file" => {
                let content = params["content"].as_str().unwrap().to_owned();
                if path == notes.to_str().unwrap() {
                    buffer = content.clone();
                }
                written.push((path.to_owned(), content));
                json!({})
            }
            other => panic!("unexpected request {other}: {request}"),
        }
    });
    assert_eq!(stop, "end_turn");

    // The read saw the buffer, not the disk.
    let read = last_update(&seen, "r1", "rawOutput");
    assert_eq!(read["status"], "completed", "{read}");
    assert!(
        read["rawOutput"]
            .as_str()
            .unwrap()
            .contains("an unsaved buffer"),
        "{read}"
    );
    // The edit and the new file went to the editor; the disk is as it was.
    assert_eq!(
        written,
        [
            (
                notes.to_str().unwrap().to_owned(),
                "an edited buffer\n".to_owned()
            ),
            (
                root.join("new.md").to_str().unwrap().to_owned(),
                "fresh\n".to_owned()
            ),
        ]
    );
    assert_eq!(last_update(&seen, "e1", "rawOutput")["status"], "completed");
    // The editor's error is the call's, said as such.
    let failed = last_update(&seen, "r2", "rawOutput");
    assert_eq!(failed["status"], "failed", "{failed}");
    let said = failed["rawOutput"].as_str().unwrap();
    assert!(
        said.contains("the editor could not read it: the buffer could not be opened"),
        "{said}"
    );
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "on disk\n");
    assert!(!root.join("new.md").exists());
    // A symlink out of the root and the paths the rules deny fail, the editor never asked.
    for id in ["x1", "x2", "x3", "x4"] {
        let refused = last_update(&seen, id, "rawOutput");
        assert_eq!(refused["status"], "failed", "{refused}");
        let said = refused["rawOutput"].as_str().unwrap();
        assert!(said.starts_with("permission denied for /"), "{said}");
    }
    assert_eq!(requests(&seen, "fs/read_text_file").len(), 3, "{seen:?}");
    assert_eq!(requests(&seen, "fs/write_text_file").len(), 2, "{seen:?}");
    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret.txt")).unwrap(),
        "secret\n"
    );
    editor.finish();
}

#[test]
fn without_the_editors_offer_files_and_commands_stay_local() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let model = script(
        work.path(),
        &json!({"turns": [
            {"tool_calls": [write("w1", "/local.md", "here\n")]},
            {"tool_calls": [{"id": "c1", "name": "execute", "args": {"command": "cat local.md; exit 2"}}]},
            {"text": "Done."}
        ]}),
    );
    let flags = ["--backend", "shell", "--sandbox", "off", "--auto-approve"];
    let offered = json!({"fs": {"readTextFile": false, "writeTextFile": false}, "terminal": false});
    let mut editor = Editor::start_offering(work.path(), &model, &flags, offered);
    let (session, _) = editor.new_session(&root);
    let (seen, stop) = editor.prompt(&session, "go", |r| panic!("asked {r}"));
    assert_eq!(stop, "end_turn");
    assert_eq!(
        std::fs::read_to_string(root.join("local.md")).unwrap(),
        "here\n"
    );
    let ran = last_update(&seen, "c1", "rawOutput");
    let output = ran["rawOutput"].as_str().unwrap();
    assert!(
        output.contains("here") && output.contains("[Exit code 2]"),
        "{ran}"
    );
    assert_eq!(ran["content"][0]["type"], "content", "{ran}");
    editor.finish();
}

#[test]
fn commands_run_in_the_editors_terminal_after_approval() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let model = script(
        work.path(),
        &json!({"turns": [
            {"tool_calls": [{"id": "c1", "name": "execute", "args": {"command": "make test"}}]},
            {"text": "It failed."}
        ]}),
    );
    // Unconfined commands ask first, as they do without an editor's terminal.
    let flags = ["--backend", "shell", "--sandbox", "off"];
    let offered = json!({"terminal": true});
    let mut editor = Editor::start_offering(work.path(), &model, &flags, offered);
    let (session, _) = editor.new_session(&root);
    let (seen, stop) = editor.prompt(&session, "run the tests", |request| {
        let params = &request["params"];
        match request["method"].as_str().unwrap() {
            "session/request_permission" => {
                json!({"outcome": {"outcome": "selected", "optionId": "allow_once"}})
            }
            "terminal/create" => {
                assert_eq!(params["command"], "/bin/sh", "{request}");
                assert_eq!(params["args"], json!(["-c", "make test"]), "{request}");
                assert_eq!(params["cwd"], root.to_str().unwrap(), "{request}");
                json!({"terminalId": "term-1"})
            }
            "terminal/wait_for_exit" => {
                assert_eq!(params["terminalId"], "term-1");
                json!({"exitCode": 2})
            }
            "terminal/output" => json!({"output": "1 test failed\n", "truncated": false}),
            "terminal/release" => json!({}),
            other => panic!("unexpected request {other}: {request}"),
        }
    });
    assert_eq!(stop, "end_turn");
    let methods: Vec<&str> = seen
        .iter()
        .filter(|m| m.get("id").is_some())
        .filter_map(|m| m["method"].as_str())
        .collect();
    assert_eq!(
        methods,
        [
            "session/request_permission",
            "terminal/create",
            "terminal/wait_for_exit",
            "terminal/output",
            "terminal/release"
        ]
    );
    // The terminal is shown in the call before it is released, and stays there.
    let position = |pred: &dyn Fn(&Value) -> bool| seen.iter().position(pred).unwrap();
    let embedded = position(&|m| {
        m["params"]["update"]["toolCallId"] == "c1"
            && m["params"]["update"]["content"][0]["terminalId"] == "term-1"
    });
    let released = position(&|m| m["method"] == "terminal/release");
    assert!(embedded < released, "{seen:?}");
    let finished = last_update(&seen, "c1", "rawOutput");
    assert_eq!(finished["status"], "completed", "{finished}");
    assert_eq!(finished["content"][0]["type"], "terminal", "{finished}");
    assert_eq!(finished["content"][0]["terminalId"], "term-1", "{finished}");
    let output = finished["rawOutput"].as_str().unwrap();
    assert!(
        output.contains("1 test failed") && output.contains("[Exit code 2]"),
        "{output}"
    );
    editor.finish();
}

#[test]
fn cancel_kills_the_editors_terminal() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let model = script(
        work.path(),
        &json!({"turns": [
            {"tool_calls": [{"id": "s1", "name": "execute", "args": {"command": "sleep 120"}}]},
            {"text": "Not reached."}
        ]}),
    );
    let flags = ["--backend", "shell", "--sandbox", "off", "--auto-approve"];
    let mut editor = Editor::start_offering(work.path(), &model, &flags, json!({"terminal": true}));
    let (session, _) = editor.new_session(root.path());
    let id = editor.request(
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text", "text": "wait"}]}),
    );
    let answer = |editor: &mut Editor, request: &Value, result: Value| {
        editor.send(&json!({"jsonrpc": "2.0", "id": request["id"], "result": result}));
    };
    // The command starts; while the editor waits for it to exit, the person cancels.
    loop {
        let message = editor.receive();
        match message["method"].as_str() {
            Some("terminal/create") => answer(&mut editor, &message, json!({"terminalId": "t-9"})),
            Some("terminal/wait_for_exit") => break,
            _ => assert!(message.get("result").is_none(), "the turn ended: {message}"),
        }
    }
    editor.send(
        &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}),
    );
    let (mut killed, mut released, mut stopped) = (false, false, None);
    while !(killed && released && stopped.is_some()) {
        let message = editor.receive();
        match message["method"].as_str() {
            Some("terminal/kill") => {
                assert!(!released, "released before killed");
                assert_eq!(message["params"]["terminalId"], "t-9");
                killed = true;
                answer(&mut editor, &message, json!({}));
            }
            Some("terminal/release") => {
                assert_eq!(message["params"]["terminalId"], "t-9");
                released = true;
                answer(&mut editor, &message, json!({}));
            }
            Some("terminal/output" | "terminal/wait_for_exit") => {
                panic!("asked after the cancel: {message}")
            }
            _ if message["id"] == id => stopped = Some(message["result"]["stopReason"].clone()),
            _ => {}
        }
    }
    assert_eq!(stopped.unwrap(), "cancelled");
    editor.finish();
}

#[test]
fn a_turn_from_the_editor_is_rewound() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    std::fs::write(root.join("kept.md"), "before\n").unwrap();
    let model = script(
        work.path(),
        &json!({"turns": [
            {"tool_calls": [
                write("w1", "/made.md", "new\n"),
                {"id": "e1", "name": "edit_file", "args": {"file_path": "/kept.md", "old_string": "before", "new_string": "after"}}
            ]},
            {"text": "Changed."}
        ]}),
    );
    let mut editor = Editor::start(work.path(), &model, &[]);
    let (session, _) = editor.new_session(&root);
    let (_, stop) = editor.prompt(&session, "change the files", |r| panic!("asked {r}"));
    assert_eq!(stop, "end_turn");
    editor.finish();
    assert_eq!(
        std::fs::read_to_string(root.join("kept.md")).unwrap(),
        "after\n"
    );

    let deepagents = |args: &[&str]| {
        bin()
            .env("DEEPAGENTS_DATA_DIR", work.path())
            .args(args)
            .output()
            .unwrap()
    };
    let listed = deepagents(&["threads", "rewind", &session]);
    let said = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert_eq!(said, "  1  change the files\n");
    let rewound = deepagents(&["threads", "rewind", &session, "1"]);
    assert!(
        rewound.status.success(),
        "{}",
        String::from_utf8_lossy(&rewound.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(root.join("kept.md")).unwrap(),
        "before\n"
    );
    assert!(!root.join("made.md").exists());
}

#[test]
fn a_command_past_its_timeout_is_killed_in_the_editors_terminal() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let model = script(
        work.path(),
        &json!({"turns": [
            {"tool_calls": [{"id": "s1", "name": "execute", "args": {"command": "sleep 120", "timeout": 1}}]},
            {"text": "It hung."}
        ]}),
    );
    let flags = ["--backend", "shell", "--sandbox", "off", "--auto-approve"];
    let offered = json!({"terminal": true});
    let mut editor = Editor::start_offering(work.path(), &model, &flags, offered);
    let (session, _) = editor.new_session(root.path());
    let id = editor.request(
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text", "text": "wait"}]}),
    );
    let mut seen = Vec::new();
    let response = loop {
        let message = editor.receive();
        if message["id"] == id && message.get("method").is_none() {
            break message;
        }
        seen.push(message.clone());
        let result = match message["method"].as_str() {
            Some("terminal/create") => json!({"terminalId": "t-1"}),
            Some("terminal/output") => json!({"output": "partial\n", "truncated": false,
                "exitStatus": {"signal": "SIGKILL"}}),
            Some("terminal/kill" | "terminal/release") => json!({}),
            // The wait is never answered: the command runs on until it is killed.
            _ => continue,
        };
        editor.send(&json!({"jsonrpc": "2.0", "id": message["id"], "result": result}));
    };
    assert_eq!(response["result"]["stopReason"], "end_turn", "{response}");
    let asked: Vec<&str> = seen
        .iter()
        .filter(|m| m.get("id").is_some())
        .filter_map(|m| m["method"].as_str())
        .collect();
    assert_eq!(
        asked,
        [
            "terminal/create",
            "terminal/wait_for_exit",
            "terminal/kill",
            "terminal/output",
            "terminal/release"
        ]
    );
    let finished = last_update(&seen, "s1", "rawOutput");
    let output = finished["rawOutput"].as_str().unwrap();
    assert!(output.contains("partial"), "{output}");
    assert!(output.contains("ran past its timeout"), "{output}");
    editor.finish();
}

#[test]
fn with_a_sandbox_commands_stay_in_it_though_the_editor_offers_a_terminal() {
    if std::process::Command::new("bwrap")
        .arg("--version")
        .output()
        .is_err()
    {
        assert!(std::env::var_os("CI").is_none(), "bubblewrap is missing");
        eprintln!("skipped: bubblewrap is not installed");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let model = script(
        work.path(),
        &json!({"turns": [
            {"tool_calls": [{"id": "c1", "name": "execute", "args": {"command": "echo confined"}}]},
            {"text": "Done."}
        ]}),
    );
    let flags = ["--backend", "shell"];
    let offered = json!({"terminal": true});
    let mut editor = Editor::start_offering(work.path(), &model, &flags, offered);
    let (session, _) = editor.new_session(root.path());
    // No terminal/* request: the answer closure refuses any.
    let (seen, stop) = editor.prompt(&session, "run it", |r| panic!("asked {r}"));
    assert_eq!(stop, "end_turn");
    let ran = last_update(&seen, "c1", "rawOutput");
    let output = ran["rawOutput"].as_str().unwrap();
    assert!(
        output.contains("confined") && output.contains("[Exit code 0]"),
        "{ran}"
    );
    editor.finish();
}
