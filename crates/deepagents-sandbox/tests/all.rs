//! The escape suite: commands under the default policy try to get out, and fail; the things
//! commands need keep working. Every test runs under both engines, bubblewrap and the
//! Landlock fallback; where the fallback cannot enforce something, the test checks that it
//! says so instead.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::io::{Read, Write};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use deepagents_sandbox::{Engine, Network, Policy, RootAccess};

const ENGINES: [Engine; 2] = [Engine::Bubblewrap, Engine::Landlock];

/// Whether the suite can run: bubblewrap and Landlock are needed (CI has both, so there a
/// missing one fails the suite instead of skipping it).
fn available() -> bool {
    let report = deepagents_sandbox::check_for(&policy_for(&std::env::temp_dir(), Engine::Auto));
    let missing: Vec<_> = report
        .layers
        .iter()
        .filter(|layer| !layer.works && ["namespaces", "landlock", "helper"].contains(&layer.name))
        .collect();
    if missing.is_empty() {
        return true;
    }
    if std::env::var_os("CI").is_some() {
        panic!("{report}");
    }
    eprintln!("skipped: {report}");
    false
}

/// The default policy for `root` under `engine`, with this crate's helper program.
fn policy_for(root: &Path, engine: Engine) -> Policy {
    let mut policy = Policy::workspace_write(root);
    policy.engine = engine;
    policy.helper = Some(PathBuf::from(env!(
        "CARGO_BIN_EXE_deepagents-sandbox-helper"
    )));
    policy
}

/// Whether `engine` says it does not enforce something matching `what` for `policy`.
fn reported(engine: Engine, policy: &Policy, what: &str) -> bool {
    deepagents_sandbox::limitations(engine, policy)
        .iter()
        .any(|gap| gap.contains(what))
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
    assert_eq!(confined.engine(), policy.engine);
    let (mut process, mut guard) = confined.into_parts();
    let child = process
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    guard.spawned();
    child.wait_with_output().unwrap()
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
    for engine in ENGINES {
        let ws = workspace();
        let policy = policy_for(&ws.root, engine);
        let out = run(&policy, "cat notes.txt && echo made > new.txt && pwd");
        assert!(out.status.success(), "{engine:?}: {}", text(&out));
        assert_eq!(
            std::fs::read_to_string(ws.root.join("new.txt")).unwrap(),
            "made\n"
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains(ws.root.to_str().unwrap()));
        for secret in [
            ws.sibling.join("secret.txt"),
            ws.sibling.clone(),
            PathBuf::from("/root"),
            std::env::home_dir().unwrap_or_else(|| PathBuf::from("/root")),
        ] {
            let out = run(
                &policy,
                // Read it as a file or list it as a directory.
                &format!(
                    "cat '{}' || ls -la '{}/'",
                    secret.display(),
                    secret.display()
                ),
            );
            assert!(
                !out.status.success() && !text(&out).contains("s3cret"),
                "{engine:?}: {} is visible: {}",
                secret.display(),
                text(&out)
            );
        }
    }
}

#[test]
fn writes_outside_the_root_and_to_protected_paths_fail() {
    if !available() {
        return;
    }
    for engine in ENGINES {
        let ws = workspace();
        let policy = policy_for(&ws.root, engine);
        let mut targets = vec![
            PathBuf::from("/usr/evil"),
            PathBuf::from("/etc/evil"),
            ws.sibling.join("evil"),
        ];
        if reported(engine, &policy, ".git") {
            eprintln!("{engine:?} does not protect .git, and says so");
        } else {
            targets.extend([ws.root.join(".git/config"), ws.root.join(".git/hooks-new")]);
        }
        for target in &targets {
            let out = run(&policy, &format!("echo x > '{}'", target.display()));
            assert!(
                !out.status.success(),
                "{engine:?} wrote {}: {}",
                target.display(),
                text(&out)
            );
        }
        assert_eq!(
            std::fs::read_to_string(ws.root.join(".git/config")).unwrap(),
            "[core]\n"
        );
        assert!(!ws.sibling.join("evil").exists());
        // The temporary directory is the sandbox's own: usable, and nothing reaches the
        // host's `/tmp`.
        let marker = format!("deepagents-sandbox-{}", std::process::id());
        let out = run(
            &policy,
            &format!("t=${{TMPDIR:-/tmp}}/{marker}; echo x > $t && cat $t; echo y > /tmp/{marker}"),
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with("x\n"),
            "{engine:?}: {}",
            text(&out)
        );
        assert!(!Path::new("/tmp").join(&marker).exists());
        // Read-only mode: nothing in the root changes either.
        let mut read_only = Policy::read_only(&ws.root);
        read_only.engine = engine;
        read_only.helper = policy.helper.clone();
        let out = run(&read_only, "echo x > notes.txt");
        assert!(!out.status.success(), "{engine:?}: {}", text(&out));
        assert_eq!(read_only.root_access, RootAccess::Read);
        assert_eq!(
            std::fs::read_to_string(ws.root.join("notes.txt")).unwrap(),
            "hello\n"
        );
    }
}

#[test]
fn symlinks_out_of_the_root_and_hidden_paths_grant_nothing() {
    if !available() {
        return;
    }
    for engine in ENGINES {
        let ws = workspace();
        std::os::unix::fs::symlink(ws.sibling.join("secret.txt"), ws.root.join("link")).unwrap();
        std::os::unix::fs::symlink(&ws.sibling, ws.root.join("dirlink")).unwrap();
        std::fs::create_dir(ws.root.join("private")).unwrap();
        std::fs::write(ws.root.join("private/key"), "k3y\n").unwrap();
        std::fs::write(ws.root.join("token"), "t0ken\n").unwrap();
        let mut policy = policy_for(&ws.root, engine);
        policy.hidden = vec!["private".into(), "token".into()];
        policy.read_only = vec!["notes.txt".into()];
        let out = run(
            &policy,
            "cat link; cat dirlink/secret.txt; cat private/key; cat token; echo x >> notes.txt; echo x > dirlink/new",
        );
        let shown = text(&out);
        assert!(!shown.contains("s3cret"), "{engine:?}: {shown}");
        assert!(!ws.sibling.join("new").exists());
        if reported(engine, &policy, "hidden paths") {
            assert!(reported(engine, &policy, "private, token"), "{engine:?}");
            assert!(reported(engine, &policy, "notes.txt"), "{engine:?}");
            continue;
        }
        for secret in ["k3y", "t0ken"] {
            assert!(
                !shown.contains(secret),
                "{engine:?}: {secret} leaked: {shown}"
            );
        }
        assert_eq!(
            std::fs::read_to_string(ws.root.join("notes.txt")).unwrap(),
            "hello\n"
        );
    }
}

#[test]
fn the_network_is_off_unless_turned_on() {
    if !available() {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let connect = format!(
        "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=2); print(\"connected\")'"
    );
    for engine in ENGINES {
        let ws = workspace();
        let off = run(&policy_for(&ws.root, engine), &connect);
        assert!(!off.status.success(), "{engine:?}: {}", text(&off));
        assert!(!String::from_utf8_lossy(&off.stdout).contains("connected"));
        let mut on = policy_for(&ws.root, engine);
        on.network = Network::On;
        let out = run(&on, &connect);
        assert!(out.status.success(), "{engine:?}: {}", text(&out));
    }
    drop(listener);
}

/// A web server on the host's loopback that answers every request with `body` (one request
/// per connection; CONNECT tunnels land here as plain requests).
fn web_server(body: &'static str) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut head = [0u8; 4096];
            let _ = stream.read(&mut head);
            let _ = write!(
                stream,
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

#[test]
fn allowed_domains_are_reached_through_the_proxy_and_nothing_else() {
    if !available() {
        return;
    }
    let port = web_server("hello-from-the-host");
    let ws = workspace();
    let mut policy = policy_for(&ws.root, Engine::Bubblewrap);
    policy.network = Network::Domains(vec!["localhost".to_owned()]);
    let fetch = |url: &str| {
        format!(
            "curl -sS --max-time 5 {url} || python3 -c 'import urllib.request,sys; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' {url}"
        )
    };
    // An allowed name, through the proxy the environment names.
    let out = run(&policy, &fetch(&format!("http://localhost:{port}/")));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("hello-from-the-host"),
        "{}",
        text(&out)
    );
    // A tunnel (what HTTPS uses) to the allowed name.
    let tunnel = format!(
        "python3 -c 'import socket; s=socket.create_connection((\"127.0.0.1\", 3128)); s.sendall(b\"CONNECT localhost:{port} HTTP/1.1\\r\\n\\r\\n\"); print(s.recv(100)); s.sendall(b\"GET / HTTP/1.0\\r\\n\\r\\n\"); import time; time.sleep(0.3); print(s.recv(200))'"
    );
    let out = run(&policy, &tunnel);
    let shown = text(&out);
    assert!(
        shown.contains("200 Connection Established") && shown.contains("hello-from-the-host"),
        "{shown}"
    );
    // The same server by address is not allowed, neither through the proxy nor directly.
    let confined = policy
        .command(
            Path::new("/bin/sh"),
            &format!(
                "{}; python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), timeout=2); print(\"direct\")'",
                fetch(&format!("http://127.0.0.1:{port}/"))
            ),
            &[],
        )
        .unwrap();
    let (mut process, mut guard) = confined.into_parts();
    let child = process
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    guard.spawned();
    let out = child.wait_with_output().unwrap();
    let shown = text(&out);
    assert!(
        !shown.contains("hello-from-the-host") && !shown.contains("stdout: direct"),
        "{shown}"
    );
    assert!(shown.contains("does not allow 127.0.0.1"), "{shown}");
    assert_eq!(guard.refused_hosts(), vec!["127.0.0.1".to_owned()]);
    // A wildcard never reaches the host's own addresses, whatever the name resolves to.
    let mut wildcard = policy_for(&ws.root, Engine::Bubblewrap);
    wildcard.network = Network::Domains(vec!["*.localhost".to_owned(), "*.0.0.1".to_owned()]);
    let out = run(&wildcard, &fetch(&format!("http://127.0.0.1:{port}/")));
    assert!(
        !text(&out).contains("hello-from-the-host"),
        "{}",
        text(&out)
    );
    // Under Landlock there is no namespace to bridge into: the network stays off, and the
    // report says so.
    assert!(reported(Engine::Landlock, &policy, "allowed domains"));
}

#[test]
fn escapes_through_the_kernel_are_refused() {
    if !available() {
        return;
    }
    for engine in ENGINES {
        let ws = workspace();
        let policy = policy_for(&ws.root, engine);
        // PTRACE_ATTACH to the parent, a new user namespace, a mount, io_uring.
        for (what, code) in [
            (
                "ptrace",
                "import ctypes,os; l=ctypes.CDLL(None, use_errno=True); print(l.ptrace(16, os.getppid(), 0, 0), ctypes.get_errno())",
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
                "{engine:?}: {what} was not refused: {shown}"
            );
        }
        let out = run(&policy, "mount -t tmpfs none /usr");
        assert!(!out.status.success(), "{engine:?}: {}", text(&out));
    }
}

#[test]
fn the_environment_holds_only_what_the_caller_passes() {
    if !available() {
        return;
    }
    for engine in ENGINES {
        let ws = workspace();
        let out = run_with(
            &policy_for(&ws.root, engine),
            "env",
            &[("GREETING".to_owned(), "hi".to_owned())],
        );
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(shown.contains("GREETING=hi"), "{engine:?}: {shown}");
        assert!(!shown.contains("PATH="), "{engine:?}: {shown}");
        assert!(
            !shown.contains("CARGO") && !shown.contains("HOME=/root"),
            "{engine:?}: {shown}"
        );
        // Nor can a command read its parents' environment through /proc.
        let out = run(
            &policy_for(&ws.root, engine),
            "for p in /proc/[0-9]*/environ; do cat $p; done 2>/dev/null | tr '\\0' '\\n'",
        );
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(!shown.contains("CARGO_PKG_NAME"), "{engine:?}: {shown}");
    }
}

/// The host's processes running `sleep MARKER`, as `pgrep` lists them.
fn still_sleeping(marker: u64) -> String {
    let found = std::process::Command::new("pgrep")
        .args(["-f", &format!("sleep {marker}")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&found.stdout).into_owned()
}

#[test]
fn background_processes_die_with_the_command() {
    if !available() {
        return;
    }
    for (n, engine) in ENGINES.into_iter().enumerate() {
        let ws = workspace();
        let marker = 1000 + 10 * u64::from(std::process::id() % 1000) + n as u64;
        let out = run(
            &policy_for(&ws.root, engine),
            &format!("setsid sleep {marker} </dev/null >/dev/null 2>&1 & echo started"),
        );
        assert!(out.status.success(), "{engine:?}: {}", text(&out));
        std::thread::sleep(std::time::Duration::from_millis(200));
        let left = still_sleeping(marker);
        assert!(
            left.is_empty(),
            "{engine:?}: a daemonized child outlived its command: {left}"
        );
    }
}

#[test]
fn a_daemon_is_killed_when_its_command_is_killed() {
    if !available() {
        return;
    }
    for (n, engine) in ENGINES.into_iter().enumerate() {
        let ws = workspace();
        let policy = policy_for(&ws.root, engine);
        if reported(engine, &policy, "daemonized") {
            eprintln!("{engine:?} cannot end daemons on kill here, and says so");
            continue;
        }
        let marker = 2000 + 10 * u64::from(std::process::id() % 1000) + n as u64;
        let confined = policy
            .command(
                Path::new("/bin/sh"),
                &format!("setsid sleep {marker} </dev/null >/dev/null 2>&1 & sleep 60"),
                &[],
            )
            .unwrap();
        let (mut process, mut guard) = confined.into_parts();
        process.process_group(0);
        let mut child = process.spawn().unwrap();
        guard.spawned();
        std::thread::sleep(std::time::Duration::from_millis(500));
        // What a timeout does: the process group is killed, then the guard goes.
        let group = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
        rustix::process::kill_process_group(group, rustix::process::Signal::KILL).unwrap();
        child.wait().unwrap();
        drop(guard);
        std::thread::sleep(std::time::Duration::from_millis(200));
        let left = still_sleeping(marker);
        assert!(
            left.is_empty(),
            "{engine:?}: a daemon outlived its killed command: {left}"
        );
    }
}

#[test]
fn a_fork_bomb_is_contained() {
    if !available() {
        return;
    }
    for engine in ENGINES {
        let ws = workspace();
        let mut policy = policy_for(&ws.root, engine);
        policy.limits.max_processes = Some(64);
        if reported(engine, &policy, "process limit") {
            eprintln!("{engine:?}: the process limit does not hold here, and says so");
            continue;
        }
        // Many more processes than allowed: the surplus fails to start.
        let out = run(
            &policy,
            "sh -c 'i=0; while [ $i -lt 200 ]; do sleep 3 & i=$((i+1)); done'; echo tried",
        );
        let shown = text(&out);
        assert!(shown.contains("tried"), "{engine:?}: {shown}");
        assert!(shown.to_lowercase().contains("fork"), "{engine:?}: {shown}");
        // The classic bomb, given two seconds: the host keeps working meanwhile, and
        // nothing of it is left afterwards.
        let confined = policy
            .command(
                Path::new("/bin/sh"),
                "bomb() { bomb | bomb & }; bomb; sleep 2",
                &[],
            )
            .unwrap();
        let (mut process, mut guard) = confined.into_parts();
        let child = process
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        guard.spawned();
        assert!(guard.has_cgroup() || !rustix::process::getuid().is_root());
        std::thread::sleep(std::time::Duration::from_millis(700));
        let host = std::process::Command::new("true").status().unwrap();
        assert!(host.success());
        let pid = child.id();
        let _ = child.wait_with_output();
        drop(guard);
        let group = rustix::process::Pid::from_raw(i32::try_from(pid).unwrap()).unwrap();
        // The group is gone: signalling it finds no one (once the killed processes are
        // reaped, which their new parent does in its own time on a busy machine).
        let gone = (0..200).any(|_| {
            let absent = rustix::process::test_kill_process_group(group).is_err();
            if !absent {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            absent
        });
        assert!(
            gone,
            "{engine:?}: the bomb's processes outlived the command"
        );
    }
}

#[test]
fn limits_hold_for_the_command_and_its_children() {
    if !available() {
        return;
    }
    for engine in ENGINES {
        let ws = workspace();
        let mut policy = policy_for(&ws.root, engine);
        policy.limits.max_file_size = Some(1 << 20);
        policy.limits.max_cpu_seconds = Some(1);
        let out = run(
            &policy,
            "head -c 2000000 /dev/zero > big; sh -c 'ulimit -f; ulimit -t'; echo \"$0 $1\" done",
        );
        let shown = text(&out);
        let written = std::fs::metadata(ws.root.join("big")).unwrap().len();
        assert!(
            written <= 1 << 20,
            "{engine:?}: {written} bytes written: {shown}"
        );
        assert!(shown.contains("2048\n1\n"), "{engine:?}: {shown}");
        // The command itself sees no trace of the wrapper.
        assert!(shown.contains("/bin/sh  done"), "{engine:?}: {shown}");
        let out = run(&policy, "while :; do :; done");
        assert!(!out.status.success(), "{engine:?}: {}", text(&out));
    }
}

#[test]
fn everyday_commands_work() {
    if !available() {
        return;
    }
    for engine in ENGINES {
        let ws = workspace();
        let policy = policy_for(&ws.root, engine);
        let out = run_with(
            &policy,
            "printf 'b\\na\\n' | sort | head -1 && python3 -c 'print(6*7)' && t=${TMPDIR:-/tmp}/w && mkdir -p $t && echo t > $t/f && cat $t/f && git --version >/dev/null && ls .git && git init -q repo && cd repo && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m one && git log --format=%s && echo 'int main(void){return 0;}' > m.c && { ! command -v cc >/dev/null || { cc m.c -o m && ./m; }; }",
            &[("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned())],
        );
        assert!(out.status.success(), "{engine:?}: {}", text(&out));
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            shown.contains("a\n42\nt\nconfig\none\n"),
            "{engine:?}: {shown}"
        );
    }
    let report = deepagents_sandbox::check_for(&policy_for(&std::env::temp_dir(), Engine::Auto));
    assert!(report.usable(), "{report}");
    assert_eq!(report.engine, Some(Engine::Bubblewrap), "{report}");
    let mut fallback = policy_for(&std::env::temp_dir(), Engine::Landlock);
    fallback.hidden = vec!["secret".into()];
    let report = deepagents_sandbox::check_for(&fallback);
    assert_eq!(report.engine, Some(Engine::Landlock), "{report}");
    assert!(
        report.to_string().contains("not enforced") && report.to_string().contains("secret"),
        "{report}"
    );
}

/// Whether the tests run as root (the attacks on root's files apply then).
fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[test]
fn a_planted_gitdir_file_opens_nothing_of_the_host() {
    if !available() {
        return;
    }
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        let home = dir.path().join("home");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(home.join("id_rsa"), "PRIVATE-KEY\n").unwrap();
        let home = home.canonicalize().unwrap();
        let policy = policy_for(&root, engine);
        // Planted by a command, and by the agent's own file write (the same file on disk).
        let out = run(
            &policy,
            &format!("printf 'gitdir: {}\\n' > .git", home.display()),
        );
        let planted = root.join(".git").exists();
        if !reported(engine, &policy, ".git") {
            assert!(
                !planted,
                "{engine:?} let a command create .git: {}",
                text(&out)
            );
        }
        std::fs::remove_dir_all(root.join(".git")).ok();
        std::fs::remove_file(root.join(".git")).ok();
        for target in [
            format!("gitdir: {}", home.display()),
            "gitdir: /".to_owned(),
        ] {
            std::fs::write(root.join(".git"), format!("{target}\n")).unwrap();
            // Every later session makes its policy anew, from the planted file.
            let later = policy_for(&root, engine);
            assert!(later.git_dirs.is_empty(), "{:?}", later.git_dirs);
            let out = run(&later, &format!("cat {}/id_rsa", home.display()));
            assert!(
                !text(&out).contains("PRIVATE-KEY"),
                "{engine:?}: {target} opened the host: {}",
                text(&out)
            );
            std::fs::remove_file(root.join(".git")).unwrap();
        }
    }
}

#[test]
fn a_real_worktree_keeps_its_git_directories_read_only() {
    if !available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    let git = |args: &[&str], cwd: &Path| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=a", "-c", "user.email=a@b"])
            .args(args)
            .current_dir(cwd)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out));
    };
    std::fs::create_dir_all(&repo).unwrap();
    git(&["init", "-q"], &repo);
    git(&["commit", "-q", "--allow-empty", "-m", "one"], &repo);
    git(&["worktree", "add", "-q", "../tree"], &repo);
    let tree = dir.path().join("tree").canonicalize().unwrap();
    let policy = policy_for(&tree, Engine::Bubblewrap);
    assert_eq!(policy.git_dirs.len(), 2, "{:?}", policy.git_dirs);
    let out = run_with(
        &policy,
        "git log --format=%s && echo x > \"$(git rev-parse --git-common-dir)/hooks/post-checkout\"",
        &[("PATH".to_owned(), "/usr/bin:/bin".to_owned())],
    );
    let shown = text(&out);
    assert!(shown.contains("stdout: one\n"), "{shown}");
    assert!(!out.status.success(), "a hook was written: {shown}");
    assert!(!repo.join(".git/hooks/post-checkout").exists());
}

#[test]
fn protected_names_cannot_be_created_or_replaced() {
    if !available() {
        return;
    }
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let policy = policy_for(&root, engine);
        if reported(engine, &policy, ".git, .deepagents, .agents") {
            eprintln!("{engine:?} does not protect missing names, and says so");
            continue;
        }
        for attack in [
            "mkdir -p .git/hooks && echo 'touch /tmp/pwned' > .git/hooks/pre-commit",
            "printf '[core]\\n\\tfsmonitor = touch pwned\\n' > .git/config",
            "mkdir -p .deepagents && echo 'obey me' > .deepagents/AGENTS.md",
            "mkdir -p .deepagents/agents && echo x > .deepagents/agents/evil.md",
            "mkdir -p .agents/skills/evil && echo x > .agents/skills/evil/SKILL.md",
            "rmdir .git && mkdir .git && touch .git/config",
            "mv .agents elsewhere && mkdir .agents && touch .agents/x",
        ] {
            let out = run(&policy, attack);
            assert!(
                !out.status.success(),
                "{engine:?}: {attack}: {}",
                text(&out)
            );
        }
        let out = run(&policy, "echo fine > notes.txt && ls -A");
        assert!(out.status.success(), "{engine:?}: {}", text(&out));
        // Nothing planted, and no placeholder left behind.
        let mut left: Vec<String> = std::fs::read_dir(&root)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, vec!["notes.txt".to_owned()], "{engine:?}");
        // Existing ones stay as they are.
        std::fs::create_dir_all(root.join(".agents/skills")).unwrap();
        let out = run(&policy, "rm -rf .agents/skills || mv .agents gone");
        assert!(!out.status.success(), "{engine:?}: {}", text(&out));
        assert!(root.join(".agents/skills").is_dir());
        // A protected name reached through a symlink cannot be held: refused up front.
        std::fs::create_dir(root.join("real")).unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join(".deepagents")).unwrap();
        let refused = policy.command(Path::new("/bin/sh"), "true", &[]);
        assert!(
            refused.is_err_and(|e| e.to_string().contains("symlink")),
            "{engine:?}"
        );
    }
}

#[test]
fn the_kernels_settings_stay_read_only() {
    if !available() {
        return;
    }
    let before = std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap();
    for engine in ENGINES {
        let ws = workspace();
        let out = run(
            &policy_for(&ws.root, engine),
            "v=$(cat /proc/sys/kernel/core_pattern); printf '%s\\n' \"$v\" > /proc/sys/kernel/core_pattern && echo WROTE-SYS; echo h > /proc/sysrq-trigger && echo WROTE-SYSRQ; echo 1 > /proc/sys/vm/drop_caches && echo WROTE-VM; true",
        );
        assert!(!text(&out).contains("WROTE"), "{engine:?}: {}", text(&out));
    }
    assert_eq!(
        std::fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap(),
        before
    );
}

#[test]
fn what_only_root_may_read_stays_unreadable_to_root_commands() {
    if !available() || !is_root() {
        return;
    }
    use std::os::unix::fs::PermissionsExt as _;
    let extra = tempfile::tempdir().unwrap();
    let extra_dir = extra.path().canonicalize().unwrap();
    std::fs::write(extra_dir.join("open.txt"), "OPEN\n").unwrap();
    std::fs::write(extra_dir.join("key.pem"), "ROOT-ONLY\n").unwrap();
    std::fs::set_permissions(
        extra_dir.join("key.pem"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    std::fs::create_dir(extra_dir.join("private")).unwrap();
    std::fs::write(extra_dir.join("private/inner.txt"), "ROOT-DIR\n").unwrap();
    std::fs::set_permissions(
        extra_dir.join("private"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    for engine in ENGINES {
        let ws = workspace();
        let mut policy = policy_for(&ws.root, engine);
        policy.extra_read.push(extra_dir.clone());
        let out = run(
            &policy,
            &format!(
                "cat /etc/shadow; cat /etc/gshadow; cat {0}/key.pem; cat {0}/private/inner.txt; cat {0}/open.txt",
                extra_dir.display()
            ),
        );
        let shown = text(&out);
        assert!(shown.contains("OPEN"), "{engine:?}: {shown}");
        for secret in ["root:", "ROOT-ONLY", "ROOT-DIR"] {
            assert!(
                !shown.contains(secret),
                "{engine:?}: {secret} read: {shown}"
            );
        }
    }
}

/// Runs `command` confined, as the session leader of a new pseudo-terminal that is its
/// controlling terminal (as in a user's shell); returns what the terminal showed.
fn run_on_a_terminal(policy: &Policy, command: &str) -> String {
    let confined = policy.command(Path::new("/bin/sh"), command, &[]).unwrap();
    let (process, mut guard) = confined.into_parts();
    let mut wrapper = std::process::Command::new("python3");
    wrapper
        .arg("-c")
        .arg(
            "import os, pty, sys\n\
             pid, fd = pty.fork()\n\
             if pid == 0:\n    os.execv(sys.argv[1], sys.argv[1:])\n\
             out = b''\n\
             while True:\n    try:\n        chunk = os.read(fd, 4096)\n    except OSError:\n        break\n    if not chunk:\n        break\n    out += chunk\n\
             os.waitpid(pid, 0)\n\
             sys.stdout.write(out.decode(errors='replace'))\n",
        )
        .arg(process.get_program())
        .args(process.get_args())
        .env_clear()
        .envs(process.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .current_dir(&policy.root);
    let out = wrapper.output().unwrap();
    guard.spawned();
    text(&out)
}

#[test]
fn nothing_can_be_typed_into_the_users_terminal() {
    if !available() {
        return;
    }
    for engine in ENGINES {
        let ws = workspace();
        let policy = policy_for(&ws.root, engine);
        let shown = run_on_a_terminal(
            &policy,
            "python3 -c \"\nimport fcntl, os, termios\nfor fd in (0, 1):\n    try:\n        fcntl.ioctl(fd, termios.TIOCSTI, b'X'); print('TIOCSTI-WORKED')\n    except OSError as e: print('sti', e.errno)\ntry:\n    t = os.open('/dev/tty', os.O_RDWR); fcntl.ioctl(t, termios.TIOCSTI, b'X'); print('TTY-TIOCSTI-WORKED')\nexcept OSError as e: print('tty', e.errno)\n\"",
        );
        assert!(
            shown.contains("sti "),
            "{engine:?}: the probe did not run: {shown}"
        );
        assert!(!shown.contains("WORKED"), "{engine:?}: {shown}");
        // No controlling terminal at all: /dev/tty cannot be opened (ENXIO).
        assert!(shown.contains("tty 6"), "{engine:?}: {shown}");
    }
}

#[test]
fn host_unix_sockets_are_out_of_reach() {
    if !available() {
        return;
    }
    let ws = workspace();
    let socket = ws.sibling.join("agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let _ = stream.write_all(b"HOST-SOCKET-ANSWERED\n");
        }
    });
    for engine in ENGINES {
        let out = run(
            &policy_for(&ws.root, engine),
            &format!(
                "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('{}'); print(s.recv(100))\"",
                socket.display()
            ),
        );
        assert!(
            !text(&out).contains("HOST-SOCKET-ANSWERED"),
            "{engine:?}: {}",
            text(&out)
        );
        // What programs use between their own processes still works.
        let out = run(
            &policy_for(&ws.root, engine),
            "python3 -c \"import socket; a, b = socket.socketpair(); a.sendall(b'pair'); print(b.recv(4).decode())\"",
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("pair"),
            "{engine:?}: {}",
            text(&out)
        );
    }
}

#[test]
fn memory_and_the_private_tmp_are_bounded() {
    if !available() {
        return;
    }
    for engine in ENGINES {
        let ws = workspace();
        let mut policy = policy_for(&ws.root, engine);
        policy.limits.max_memory = Some(64 << 20);
        policy.limits.max_tmp_size = Some(8 << 20);
        // A memory cgroup stops the processes together; without one, each process is held
        // to the limit (RLIMIT_DATA): a single hog is stopped either way.
        let out = run(
            &policy,
            "python3 -c \"b = bytearray(512 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); print('ALLOCATED')\"",
        );
        assert!(
            !out.status.success() && !text(&out).contains("ALLOCATED"),
            "{engine:?}: {}",
            text(&out)
        );
        // Within the limit, fine.
        let out = run(
            &policy,
            "python3 -c \"b = bytearray(8 * 1024 * 1024); print('small')\"",
        );
        assert!(out.status.success(), "{engine:?}: {}", text(&out));
        if !reported(engine, &policy, "temporary directory") {
            let out = run(
                &policy,
                "head -c 16777216 /dev/zero > /tmp/big && echo FILLED",
            );
            assert!(!text(&out).contains("FILLED"), "{engine:?}: {}", text(&out));
        }
    }
    // The defaults suit a developer machine: bounded, and room for a build.
    let defaults = Policy::workspace_write("/tmp").limits;
    let memory = defaults.max_memory.unwrap();
    assert!((256 << 20..=8 << 30).contains(&memory), "{memory}");
    assert!(defaults.max_tmp_size.is_some());
}

#[test]
fn a_signalled_landlock_helper_ends_its_command_and_cleans_up() {
    if !available() {
        return;
    }
    for signal in [rustix::process::Signal::TERM, rustix::process::Signal::INT] {
        let ws = workspace();
        let mut policy = policy_for(&ws.root, Engine::Landlock);
        // No cgroup: the helper alone must end what the command started.
        policy.limits = deepagents_sandbox::Limits::default();
        let marker = 3000
            + 10 * u64::from(std::process::id() % 1000)
            + u64::try_from(signal.as_raw()).unwrap();
        let confined = policy
            .command(
                Path::new("/bin/sh"),
                &format!(
                    "setsid sleep {marker} </dev/null >/dev/null 2>&1 & sleep {}",
                    marker + 1
                ),
                &[],
            )
            .unwrap();
        let scratch = confined
            .process
            .get_envs()
            .find(|(k, _)| *k == "TMPDIR")
            .and_then(|(_, v)| v)
            .map(PathBuf::from)
            .unwrap();
        let (mut process, mut guard) = confined.into_parts();
        let mut child = process.spawn().unwrap();
        guard.spawned();
        let started = (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(50));
            !still_sleeping(marker).is_empty() && !still_sleeping(marker + 1).is_empty()
        });
        assert!(started, "the command did not start");
        let pid = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap()).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(128 + signal.as_raw()), "{status:?}");
        // Checked before the guard goes: the helper did it.
        assert!(!scratch.exists(), "{} was left", scratch.display());
        let gone = (0..100).any(|_| {
            let left = still_sleeping(marker) + &still_sleeping(marker + 1);
            if !left.is_empty() {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            left.is_empty()
        });
        assert!(gone, "{signal:?}: processes outlived the helper");
        drop(guard);
    }
}

#[test]
fn auto_falls_back_to_landlock_only_when_allowed() {
    let mut policy = Policy::workspace_write(std::env::temp_dir());
    assert!(!policy.landlock_fallback);
    // Where bubblewrap works, auto is bubblewrap either way; where it does not, the error
    // says how to opt in.
    match policy.resolve_engine() {
        Ok(engine) => assert_eq!(engine, Engine::Bubblewrap),
        Err(e) => {
            let message = e.to_string();
            assert!(message.contains("landlock_fallback"), "{message}");
            policy.landlock_fallback = true;
            policy.helper = Some(PathBuf::from(env!(
                "CARGO_BIN_EXE_deepagents-sandbox-helper"
            )));
            assert_eq!(policy.resolve_engine().unwrap(), Engine::Landlock);
        }
    }
}

#[test]
fn the_suite_holds_for_an_ordinary_user_too() {
    // Run as root, the suite runs itself again as `nobody` (no cgroups, no capabilities to
    // lose, RLIMIT_NPROC and RLIMIT_DATA instead): every attack above must fail there too.
    if !available() || !is_root() {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let runs = |args: &[&std::ffi::OsStr]| {
        std::process::Command::new("runuser")
            .args(["-u", "nobody", "--"])
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("HOME", "/nonexistent")
            .current_dir("/")
            .output()
    };
    let reachable = runs(&["test".as_ref(), "-x".as_ref(), me.as_os_str()])
        .is_ok_and(|out| out.status.success());
    if !reachable {
        eprintln!(
            "skipped: runuser is missing or nobody cannot run {}",
            me.display()
        );
        return;
    }
    let out = runs(&[
        me.as_os_str(),
        "--test-threads".as_ref(),
        "2".as_ref(),
        "--skip".as_ref(),
        "the_suite_holds_for_an_ordinary_user_too".as_ref(),
    ])
    .unwrap();
    assert!(out.status.success(), "as nobody: {}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("0 failed"),
        "{}",
        text(&out)
    );
}
