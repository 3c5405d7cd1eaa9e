//! The escape suite: commands under the default policy try to get out, and fail; the things
//! commands need keep working.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use deepagents_sandbox::{Network, Policy, RootAccess};

/// Whether the suite can run: bubblewrap is needed (CI installs it, so there a missing one
/// fails the suite instead of skipping it).
fn available() -> bool {
    match deepagents_sandbox::find_bwrap() {
        Ok(_) => true,
        Err(e) if std::env::var_os("CI").is_some() => panic!("{e}"),
        Err(e) => {
            eprintln!("skipped: {e}");
            false
        }
    }
}

struct Workspace {
    _dir: tempfile::TempDir,
    root: PathBuf,
    sibling: PathBuf,
}

/// A root with a file and a `.git` directory, and a secret in a sibling directory.
fn workspace() -> Workspace {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("project");
    let sibling = dir.path().join("other");
    std::fs::create_dir_all(root.join(".git")).unwrap();
    std::fs::create_dir_all(&sibling).unwrap();
    std::fs::write(root.join("notes.txt"), "hello\n").unwrap();
    std::fs::write(root.join(".git/config"), "[core]\n").unwrap();
    std::fs::write(sibling.join("secret.txt"), "s3cret\n").unwrap();
    Workspace {
        root: root.canonicalize().unwrap(),
        sibling: sibling.canonicalize().unwrap(),
        _dir: dir,
    }
}

fn run(policy: &Policy, command: &str) -> Output {
    run_with(policy, command, &[])
}

fn run_with(policy: &Policy, command: &str, env: &[(String, String)]) -> Output {
    let confined = policy.command(Path::new("/bin/sh"), command, env).unwrap();
    let (mut process, filters) = confined.into_parts();
    let output = process
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    drop(filters);
    output
}

fn text(output: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn the_root_is_usable_and_nothing_else_of_the_host_is_visible() {
    if !available() {
        return;
    }
    let ws = workspace();
    let policy = Policy::workspace_write(&ws.root);
    let out = run(&policy, "cat notes.txt && echo made > new.txt && pwd");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        std::fs::read_to_string(ws.root.join("new.txt")).unwrap(),
        "made\n"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(ws.root.to_str().unwrap()));
    for secret in [
        ws.sibling.join("secret.txt"),
        PathBuf::from("/root"),
        std::env::home_dir().unwrap_or_else(|| PathBuf::from("/root")),
    ] {
        let out = run(
            &policy,
            &format!(
                "ls -la '{}' || cat '{}'",
                secret.display(),
                secret.display()
            ),
        );
        assert!(
            !out.status.success(),
            "{} is visible: {}",
            secret.display(),
            text(&out)
        );
    }
}

#[test]
fn writes_outside_the_root_and_to_protected_paths_fail() {
    if !available() {
        return;
    }
    let ws = workspace();
    let policy = Policy::workspace_write(&ws.root);
    for target in [
        ws.root.join(".git/config"),
        ws.root.join(".git/hooks-new"),
        PathBuf::from("/usr/evil"),
        PathBuf::from("/etc/evil"),
        ws.sibling.join("evil"),
    ] {
        let out = run(&policy, &format!("echo x > '{}'", target.display()));
        assert!(
            !out.status.success(),
            "wrote {}: {}",
            target.display(),
            text(&out)
        );
    }
    assert_eq!(
        std::fs::read_to_string(ws.root.join(".git/config")).unwrap(),
        "[core]\n"
    );
    assert!(!ws.sibling.join("evil").exists());
    // `/tmp` is the sandbox's own: usable, and nothing reaches the host's.
    let marker = format!("/tmp/deepagents-sandbox-{}", std::process::id());
    let out = run(&policy, &format!("echo x > {marker} && cat {marker}"));
    assert!(out.status.success(), "{}", text(&out));
    assert!(!Path::new(&marker).exists());
    // Read-only mode: nothing in the root changes either.
    let read_only = Policy::read_only(&ws.root);
    let out = run(&read_only, "echo x > notes.txt");
    assert!(!out.status.success(), "{}", text(&out));
    assert_eq!(read_only.root_access, RootAccess::Read);
    assert_eq!(
        std::fs::read_to_string(ws.root.join("notes.txt")).unwrap(),
        "hello\n"
    );
}

#[test]
fn symlinks_out_of_the_root_and_hidden_paths_grant_nothing() {
    if !available() {
        return;
    }
    let ws = workspace();
    std::os::unix::fs::symlink(ws.sibling.join("secret.txt"), ws.root.join("link")).unwrap();
    std::os::unix::fs::symlink(&ws.sibling, ws.root.join("dirlink")).unwrap();
    std::fs::create_dir(ws.root.join("private")).unwrap();
    std::fs::write(ws.root.join("private/key"), "k3y\n").unwrap();
    std::fs::write(ws.root.join("token"), "t0ken\n").unwrap();
    let mut policy = Policy::workspace_write(&ws.root);
    policy.hidden = vec!["private".into(), "token".into()];
    policy.read_only = vec!["notes.txt".into()];
    let out = run(
        &policy,
        "cat link; cat dirlink/secret.txt; cat private/key; cat token; echo x >> notes.txt; echo x > dirlink/new",
    );
    let shown = text(&out);
    for secret in ["s3cret", "k3y", "t0ken"] {
        assert!(!shown.contains(secret), "{secret} leaked: {shown}");
    }
    assert_eq!(
        std::fs::read_to_string(ws.root.join("notes.txt")).unwrap(),
        "hello\n"
    );
    assert!(!ws.sibling.join("new").exists());
}

#[test]
fn the_network_is_off_unless_turned_on() {
    if !available() {
        return;
    }
    let ws = workspace();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let connect = format!(
        "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=2); print(\"connected\")'"
    );
    let off = run(&Policy::workspace_write(&ws.root), &connect);
    assert!(!off.status.success(), "{}", text(&off));
    assert!(!String::from_utf8_lossy(&off.stdout).contains("connected"));
    let mut on = Policy::workspace_write(&ws.root);
    on.network = Network::On;
    let out = run(&on, &connect);
    assert!(out.status.success(), "{}", text(&out));
    drop(listener);
}

#[test]
fn escapes_through_the_kernel_are_refused() {
    if !available() {
        return;
    }
    let ws = workspace();
    let policy = Policy::workspace_write(&ws.root);
    // PTRACE_ATTACH to the sandbox's init, a new user namespace, a mount, io_uring.
    for (what, code) in [
        (
            "ptrace",
            "import ctypes; l=ctypes.CDLL(None, use_errno=True); print(l.ptrace(16, 1, 0, 0), ctypes.get_errno())",
        ),
        (
            "unshare",
            "import ctypes; l=ctypes.CDLL(None, use_errno=True); print(l.unshare(0x10000000), ctypes.get_errno())",
        ),
        (
            "mount",
            "import ctypes; l=ctypes.CDLL(None, use_errno=True); print(l.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno())",
        ),
        (
            "io_uring",
            "import ctypes; l=ctypes.CDLL(None, use_errno=True); print(l.syscall(425, 1, ctypes.create_string_buffer(120)), ctypes.get_errno())",
        ),
    ] {
        let out = run(&policy, &format!("python3 -c \"{code}\""));
        let shown = text(&out);
        // -1 with EPERM (1): refused by the filter, not by a missing program or module.
        assert!(
            shown.contains("stdout: -1 1\n"),
            "{what} was not refused: {shown}"
        );
    }
    let out = run(&policy, "mount -t tmpfs none /usr");
    assert!(!out.status.success(), "{}", text(&out));
}

#[test]
fn the_environment_holds_only_what_the_caller_passes() {
    if !available() {
        return;
    }
    let ws = workspace();
    let out = run_with(
        &Policy::workspace_write(&ws.root),
        "env",
        &[("GREETING".to_owned(), "hi".to_owned())],
    );
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("GREETING=hi"), "{shown}");
    assert!(!shown.contains("PATH="), "{shown}");
    assert!(
        !shown.contains("CARGO") && !shown.contains("HOME=/root"),
        "{shown}"
    );
}

#[test]
fn background_processes_die_with_the_command() {
    if !available() {
        return;
    }
    let ws = workspace();
    let marker = 1000 + u64::from(std::process::id() % 1000);
    let out = run(
        &Policy::workspace_write(&ws.root),
        &format!("setsid sleep {marker} </dev/null >/dev/null 2>&1 & echo started"),
    );
    assert!(out.status.success(), "{}", text(&out));
    std::thread::sleep(std::time::Duration::from_millis(200));
    let left = std::process::Command::new("pgrep")
        .args(["-f", &format!("sleep {marker}")])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "a daemonized child outlived its command: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}

#[test]
fn limits_hold_for_the_command_and_its_children() {
    if !available() {
        return;
    }
    let ws = workspace();
    let mut policy = Policy::workspace_write(&ws.root);
    policy.limits.max_file_size = Some(1 << 20);
    policy.limits.max_cpu_seconds = Some(1);
    let out = run(
        &policy,
        "head -c 2000000 /dev/zero > big; sh -c 'ulimit -f; ulimit -t'; echo \"$0 $1\" done",
    );
    let shown = text(&out);
    let written = std::fs::metadata(ws.root.join("big")).unwrap().len();
    assert!(written <= 1 << 20, "{written} bytes written: {shown}");
    assert!(shown.contains("2048\n1\n"), "{shown}");
    // The command itself sees no trace of the wrapper.
    assert!(shown.contains("/bin/sh  done"), "{shown}");
    let out = run(&policy, "while :; do :; done");
    assert!(!out.status.success(), "{}", text(&out));
}

#[test]
fn everyday_commands_work() {
    if !available() {
        return;
    }
    let ws = workspace();
    let policy = Policy::workspace_write(&ws.root);
    let out = run(
        &policy,
        "printf 'b\\na\\n' | sort | head -1 && python3 -c 'print(6*7)' && mkdir -p /tmp/w && echo t > /tmp/w/f && cat /tmp/w/f && git --version >/dev/null && ls .git",
    );
    assert!(out.status.success(), "{}", text(&out));
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("a\n42\nt\nconfig"), "{shown}");
    let report = deepagents_sandbox::check();
    assert!(report.usable(), "{report}");
}
