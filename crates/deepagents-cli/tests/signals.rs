//! SIGTERM, SIGINT and SIGHUP: every front end stops what it runs, keeps what it did, and
//! exits with 128 + the signal's number; nothing it started outlives it.
//!
//! Commands carry a marker (`sleep 300.<digits>`, unique per test) so their processes are
//! found in `/proc` by their command line, whatever sandbox or shell runs them.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::bin;

/// A number no other test of this run uses, as digits (the fraction of a `sleep`).
fn marker() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    format!(
        "{}{:03}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The living processes whose command line contains `marker`: pid and command line.
fn processes_with(marker: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        // A zombie has an empty command line and is gone in every way that matters.
        let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let line = String::from_utf8_lossy(&raw).replace('\0', " ");
        if line.contains(marker) {
            found.push((pid, line));
        }
    }
    found
}

/// Waits up to `limit` for `ready`; whether it came.
fn wait_until(limit: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    ready()
}

/// Sends `signal` (`TERM`, `INT`, `HUP`) to `pid`.
fn send(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -s {signal} {pid} failed");
}

/// Waits up to `limit` for `child` to exit; kills it and fails when it does not.
fn exits_within(child: &mut Child, limit: Duration, log: &Path) -> ExitStatus {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!(
        "deepagents did not exit within {limit:?} of the signal; its stderr:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// Waits (up to 10 s) until no process with `marker` is left, and fails naming those left.
fn all_gone(marker: &str, log: &Path) {
    let gone = wait_until(Duration::from_secs(10), || {
        processes_with(marker).is_empty()
    });
    let left = processes_with(marker);
    // Left-overs must not outlive a failing test either.
    for (pid, _) in &left {
        let _ = std::process::Command::new("kill")
            .args(["-s", "KILL", &pid.to_string()])
            .status();
    }
    assert!(
        gone,
        "processes outlived deepagents: {left:?}; its stderr:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// Whether bubblewrap is here; outside CI its absence skips the test.
fn bubblewrap() -> bool {
    if std::process::Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok()
    {
        return true;
    }
    assert!(std::env::var_os("CI").is_none(), "bubblewrap is missing");
    eprintln!("skipped: bubblewrap is not installed");
    false
}

/// The pids cgroup directory of process `pid` (cgroup v1's `pids` hierarchy or v2), as
/// `deepagents-sandbox` finds its own.
fn pids_cgroup(pid: u32) -> Option<PathBuf> {
    let membership = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in membership.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "pids") {
            return Some(Path::new("/sys/fs/cgroup/pids").join(path));
        }
        if controllers.is_empty() {
            return Some(Path::new("/sys/fs/cgroup").join(path));
        }
    }
    None
}

/// The per-command cgroups process `pid` made under `dir`: `deepagents-<pid>-N`.
fn command_cgroups(dir: &Path, pid: u32) -> Vec<PathBuf> {
    let prefix = format!("deepagents-{pid}-");
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// A scripted model whose first step runs `command` with `execute`.
fn execute_script(dir: &Path, command: &str) -> String {
    let path = dir.join("script.json");
    let turns = json!({"turns": [
        {"tool_calls": [{"id": "c1", "name": "execute", "args": {"command": command}}]},
        {"text": "done"}
    ]});
    std::fs::write(&path, turns.to_string()).unwrap();
    format!("scripted:{}", path.display())
}

/// A file for a child's stderr, read when a test fails.
fn log_file(dir: &Path) -> (PathBuf, Stdio) {
    let path = dir.join("stderr.log");
    let file = std::fs::File::create(&path).unwrap();
    (path, Stdio::from(file))
}

/// `deepagents run --backend shell` whose command starts a background child and waits:
/// `signal` stops it with `code` within a few seconds, no process of the command is left (nor
/// its cgroup), and the thread keeps the call.
fn a_signal_stops_a_run(sandbox: &str, signal: &str, code: i32) {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let mark = marker();
    let command = format!("sleep 300.{mark} & echo started; sleep 300.{mark}");
    let model = execute_script(work.path(), &command);
    let thread = format!("signal-{mark}");
    let (log, stderr) = log_file(work.path());
    let mut child = bin()
        .args(["run", "--json", "--auto-approve", "--backend", "shell"])
        .args(["--sandbox", sandbox, "--model", &model, "--thread", &thread])
        .arg("--root")
        .arg(root.path())
        .arg("wait for it")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let running = wait_until(Duration::from_secs(30), || {
        processes_with(&mark)
            .iter()
            .filter(|(_, line)| line.starts_with("sleep "))
            .count()
            >= 2
    });
    if !running {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "the command never ran: {:?}; stderr:\n{}",
            processes_with(&mark),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let cgroup = pids_cgroup(child.id());
    send(child.id(), signal);
    let status = exits_within(&mut child, Duration::from_secs(20), &log);
    let shown = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(code), "{status:?}; stderr:\n{shown}");
    all_gone(&mark, &log);
    if let Some(dir) = cgroup {
        assert_eq!(command_cgroups(&dir, child.id()), Vec::<PathBuf>::new());
    }
    // The thread was saved with the call it was making.
    let output = bin().args(["threads", "show", &thread]).output().unwrap();
    let conversation = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{conversation}");
    assert!(conversation.contains("→ execute"), "{conversation}");
    assert!(conversation.contains(&mark), "{conversation}");
}

#[test]
fn sigterm_stops_a_confined_run_kills_its_command_and_keeps_the_thread() {
    if bubblewrap() {
        a_signal_stops_a_run("workspace-write", "TERM", 143);
    }
}

#[test]
fn sigint_stops_a_confined_run_kills_its_command_and_keeps_the_thread() {
    if bubblewrap() {
        a_signal_stops_a_run("workspace-write", "INT", 130);
    }
}

#[test]
fn sigterm_stops_an_unconfined_run_kills_its_command_and_keeps_the_thread() {
    a_signal_stops_a_run("off", "TERM", 143);
}

#[test]
fn sighup_stops_an_unconfined_run_kills_its_command_and_keeps_the_thread() {
    a_signal_stops_a_run("off", "HUP", 129);
}

/// An MCP stdio server (no SDK needed) that starts a child, then never answers `initialize`.
fn hanging_server(dir: &Path, mark: &str) -> PathBuf {
    let script = dir.join(format!("hang-{mark}.py"));
    std::fs::write(
        &script,
        format!(
            "import subprocess, sys, time\n\
             subprocess.Popen(['sleep', '300.{mark}'])\n\
             sys.stdin.readline()\n\
             time.sleep(300)\n"
        ),
    )
    .unwrap();
    let config = dir.join("hang.mcp.json");
    std::fs::write(
        &config,
        json!({"mcpServers": {"hang": {"command": "python3", "args": [script]}}}).to_string(),
    )
    .unwrap();
    config
}

/// `deepagents ARGS` with the hanging server's configuration: `signal` while the server starts
/// ends it with `code` at once, and neither the server nor its child is left.
fn a_signal_during_mcp_start_up(args: &[&str], signal: &str, code: i32) {
    let work = tempfile::tempdir().unwrap();
    let mark = marker();
    let config = hanging_server(work.path(), &mark);
    let (log, stderr) = log_file(work.path());
    let mut child = bin()
        .args(args)
        .arg("--mcp-config")
        .arg(&config)
        .arg("--root")
        .arg(work.path())
        .env("HOME", work.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    // Both the server and its child run.
    let started = wait_until(Duration::from_secs(30), || {
        let found = processes_with(&mark);
        found.iter().any(|(_, l)| l.starts_with("sleep "))
            && found.iter().any(|(_, l)| l.contains("python"))
    });
    if !started {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "the server never started: {:?}; stderr:\n{}",
            processes_with(&mark),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    send(child.id(), signal);
    let status = exits_within(&mut child, Duration::from_secs(5), &log);
    let shown = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(status.code(), Some(code), "{status:?}; stderr:\n{shown}");
    all_gone(&mark, &log);
}

#[test]
fn sigterm_while_an_mcp_server_starts_stops_the_run_and_the_server_s_children() {
    let work = tempfile::tempdir().unwrap();
    let model = execute_script(work.path(), "true");
    a_signal_during_mcp_start_up(&["run", "--model", &model, "never runs"], "TERM", 143);
}

#[test]
fn sigint_while_mcp_list_waits_for_a_server_stops_it_and_the_server_s_children() {
    a_signal_during_mcp_start_up(&["mcp", "list"], "INT", 130);
}

#[test]
fn sigterm_stops_sandbox_run_and_removes_the_command_s_cgroup() {
    if !bubblewrap() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mark = marker();
    let (log, stderr) = log_file(work.path());
    let mut child = bin()
        .args(["sandbox", "run", "--root"])
        .arg(work.path())
        .args(["--", &format!("sleep 300.{mark}")])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let running = wait_until(Duration::from_secs(30), || {
        processes_with(&mark)
            .iter()
            .any(|(_, l)| l.starts_with("sleep "))
    });
    assert!(
        running,
        "the command never ran; stderr:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let pid = child.id();
    let cgroup = pids_cgroup(pid);
    // Where commands get a cgroup (root, or a delegated one), this one has it now.
    let made = cgroup
        .as_deref()
        .map(|dir| command_cgroups(dir, pid))
        .unwrap_or_default();
    send(pid, "TERM");
    let status = exits_within(&mut child, Duration::from_secs(20), &log);
    assert_eq!(
        status.code(),
        Some(143),
        "{status:?}; stderr:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    all_gone(&mark, &log);
    for dir in &made {
        assert!(!dir.exists(), "{} was left behind", dir.display());
    }
    if let Some(dir) = &cgroup {
        assert_eq!(command_cgroups(dir, pid), Vec::<PathBuf>::new());
    }
}

/// One HTTP/1.1 request with a JSON body; the response's body.
fn post(address: &str, path: &str, body: &serde_json::Value) -> String {
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let body = body.to_string();
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

/// The value of `"key":"…"` in a JSON text (the body may be chunked).
fn string_field(text: &str, key: &str) -> String {
    let start = text
        .find(&format!("\"{key}\":\""))
        .unwrap_or_else(|| panic!("no {key} in {text}"))
        + key.len()
        + 4;
    text[start..].split('"').next().unwrap().to_owned()
}

#[test]
fn sigterm_stops_serve_s_runs_kills_their_commands_keeps_their_threads_and_exits_cleanly() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let mark = marker();
    let command = format!("sleep 300.{mark} & echo started; sleep 300.{mark}");
    let model = execute_script(work.path(), &command);
    let data = work.path().join("data");
    let (log, stderr) = log_file(work.path());
    let mut child = bin()
        .env("DEEPAGENTS_DATA_DIR", &data)
        .env("HOME", work.path())
        .args(["serve", "--listen", "127.0.0.1:0", "--model", &model])
        .args(["--backend", "shell", "--sandbox", "off", "--auto-approve"])
        .arg("--root")
        .arg(root.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut address = String::new();
    let listening = wait_until(Duration::from_secs(30), || {
        let shown = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(rest) = shown.split("listening on http://").nth(1) {
            address = rest
                .split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned();
        }
        !address.is_empty()
    });
    if !listening {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "the server did not start: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    let thread = string_field(&post(&address, "/threads", &json!({})), "thread_id");
    post(
        &address,
        &format!("/threads/{thread}/runs"),
        &json!({"assistant_id": "agent", "input": {"messages": [{"role": "user", "content": "wait for it"}]}}),
    );
    let running = wait_until(Duration::from_secs(30), || {
        processes_with(&mark)
            .iter()
            .filter(|(_, line)| line.starts_with("sleep "))
            .count()
            >= 2
    });
    if !running {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "the command never ran; stderr:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }
    send(child.id(), "TERM");
    let status = exits_within(&mut child, Duration::from_secs(20), &log);
    let shown = std::fs::read_to_string(&log).unwrap_or_default();
    // A server stopped by SIGTERM stopped cleanly.
    assert!(status.success(), "{status:?}; stderr:\n{shown}");
    all_gone(&mark, &log);
    // The API's thread T of the tenant `default` is the checkpointer's `default:T`.
    let output = bin()
        .env("DEEPAGENTS_DATA_DIR", &data)
        .args(["threads", "show", &format!("default:{thread}")])
        .output()
        .unwrap();
    let conversation = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{conversation}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(conversation.contains("→ execute"), "{conversation}");
    assert!(conversation.contains(&mark), "{conversation}");
}

#[test]
fn a_second_signal_exits_at_once_and_still_kills_what_was_started() {
    let work = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let mark = marker();
    let model = execute_script(work.path(), &format!("sleep 300.{mark}"));
    // The orderly stop is slow: the SessionEnd hook takes its time.
    let hooks = work.path().join("slow-hooks.json");
    std::fs::write(
        &hooks,
        json!({"hooks": {"SessionEnd": [{"hooks": [{"command": format!("sleep 301.{mark}")}]}]}})
            .to_string(),
    )
    .unwrap();
    let (log, stderr) = log_file(work.path());
    let mut child = bin()
        .args([
            "run",
            "--auto-approve",
            "--backend",
            "shell",
            "--sandbox",
            "off",
        ])
        .args(["--model", &model, "--hooks"])
        .arg(&hooks)
        .arg("--root")
        .arg(root.path())
        .arg("wait for it")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let running = wait_until(Duration::from_secs(30), || {
        processes_with(&format!("300.{mark}"))
            .iter()
            .any(|(_, l)| l.starts_with("sleep "))
    });
    assert!(
        running,
        "the command never ran; stderr:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    send(child.id(), "TERM");
    // The run stopped; the hook runs.
    let hooked = wait_until(Duration::from_secs(10), || {
        processes_with(&format!("301.{mark}"))
            .iter()
            .any(|(_, l)| l.starts_with("sleep "))
    });
    assert!(
        hooked,
        "the SessionEnd hook never ran; stderr:\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(
        child.try_wait().unwrap().is_none(),
        "it did not wait for the hook"
    );
    send(child.id(), "INT");
    let status = exits_within(&mut child, Duration::from_secs(2), &log);
    // The first signal's status.
    assert_eq!(status.code(), Some(143), "{status:?}");
    all_gone(&mark, &log);
}

fn tmux(args: &[&str]) -> std::process::Output {
    std::process::Command::new("tmux")
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn sigterm_stops_the_tui_s_turn_keeps_the_thread_and_puts_the_terminal_back() {
    let have_tmux = std::process::Command::new("tmux")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_tmux {
        assert!(std::env::var_os("CI").is_none(), "tmux is not installed");
        eprintln!("skipped: tmux is not installed");
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mark = marker();
    let command = format!("sleep 300.{mark} & echo started; sleep 300.{mark}");
    let model = execute_script(work.path(), &command);
    let thread = format!("tui-{mark}");
    let data = work.path().join("data");
    let name = deepagents_test_support::unique_name("tui-signal");
    let line = format!(
        "cd {dir} && env -u DEEPAGENTS_MODEL -u DEEPAGENTS_CONFIG DEEPAGENTS_DATA_DIR={data} HOME={dir} {bin} --backend shell --sandbox off --auto-approve --model {model} --thread {thread} -m 'wait for it' 2>{dir}/stderr.log; echo $? > {dir}/status",
        dir = work.path().display(),
        data = data.display(),
        bin = env!("CARGO_BIN_EXE_deepagents"),
    );
    // The pane is kept after the program exits, with its status (a window option).
    let started = tmux(&[
        "new-session",
        "-d",
        "-s",
        &name,
        "-x",
        "100",
        "-y",
        "32",
        &line,
        ";",
        "set-option",
        "-w",
        "-t",
        &name,
        "remain-on-exit",
        "on",
    ]);
    assert!(started.status.success(), "{started:?}");
    let log = work.path().join("stderr.log");
    let running = wait_until(Duration::from_secs(30), || {
        processes_with(&format!("300.{mark}"))
            .iter()
            .filter(|(_, l)| l.starts_with("sleep "))
            .count()
            >= 2
    });
    let screen =
        || String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &name]).stdout).into_owned();
    if !running {
        let shown = screen();
        tmux(&["kill-session", "-t", &name]);
        panic!("the command never ran:\n{shown}");
    }
    // The TUI itself: the process running the binary with this thread.
    let tui = processes_with(&thread)
        .into_iter()
        .find(|(_, l)| l.starts_with(env!("CARGO_BIN_EXE_deepagents")))
        .map(|(pid, _)| pid)
        .unwrap_or_else(|| panic!("no TUI process: {:?}", processes_with(&thread)));
    send(tui, "TERM");
    // The shell in the pane writes the exit status as it sees it (tmux's own record of a
    // dead pane's status races with the pane's terminal closing).
    let status_file = work.path().join("status");
    let dead = wait_until(Duration::from_secs(20), || {
        std::fs::read_to_string(&status_file).is_ok_and(|status| status.ends_with('\n'))
    });
    let status = std::fs::read_to_string(&status_file)
        .unwrap_or_default()
        .trim()
        .to_owned();
    let shown = screen();
    tmux(&["kill-session", "-t", &name]);
    assert!(dead, "the TUI did not exit:\n{shown}");
    assert_eq!(status, "143", "{shown}");
    all_gone(&format!("300.{mark}"), &log);
    // The alternate screen was left: the shell's screen shows no TUI status line.
    assert!(!shown.contains("/help"), "{shown}");
    let output = bin()
        .env("DEEPAGENTS_DATA_DIR", &data)
        .args(["threads", "show", &thread])
        .output()
        .unwrap();
    let conversation = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{conversation}");
    assert!(conversation.contains("→ execute"), "{conversation}");
    assert!(conversation.contains(&mark), "{conversation}");
}
