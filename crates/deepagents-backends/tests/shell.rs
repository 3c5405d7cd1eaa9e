//! The local shell backend: exit codes, output marking and limits, timeouts that kill the whole
//! process group, the environment, stdin and the working directory.

use std::sync::Arc;
use std::time::{Duration, Instant};

use deepagents_backends::{
    Backend, BackendContext, BackendError, ExecuteResult, FilesystemBackend, LocalShellBackend,
    ReadResult, Sandbox, VPath,
};
use tempfile::TempDir;

use crate::conformance::check_backend;

fn cx() -> BackendContext {
    BackendContext::default()
}

fn shell() -> (TempDir, LocalShellBackend) {
    let tmp = TempDir::new().unwrap();
    let fs = FilesystemBackend::new(tmp.path().join("root")).unwrap();
    (tmp, LocalShellBackend::new(fs))
}

async fn run(sh: &LocalShellBackend, command: &str) -> ExecuteResult {
    sh.execute(&cx(), command, None).await.unwrap()
}

/// Live (non-zombie) processes whose process group is `pgid`.
fn live_members(pgid: u32) -> Vec<String> {
    let mut members = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...: comm may hold spaces, so split after the last ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[2] == pgid.to_string() && fields[0] != "Z" && fields[0] != "X"
        {
            members.push(stat);
        }
    }
    members
}

#[tokio::test]
async fn conformance_local_shell() {
    let (_tmp, sh) = shell();
    check_backend(Arc::new(sh)).await;
}

#[tokio::test]
async fn is_a_sandbox() {
    let (_tmp, sh) = shell();
    let backend: Arc<dyn Backend> = Arc::new(sh);
    let sandbox = backend.as_sandbox().expect("the shell backend executes");
    assert!(!sandbox.id().is_empty());
    let result = sandbox.execute(&cx(), "echo hi", None).await.unwrap();
    assert_eq!(result.output, "hi\n");
    let other = TempDir::new().unwrap();
    let plain = FilesystemBackend::new(other.path().join("r")).unwrap();
    assert!(plain.as_sandbox().is_none());
}

#[tokio::test]
async fn exit_codes_are_reported() {
    let (_tmp, sh) = shell();
    let ok = run(&sh, "true").await;
    assert_eq!(
        (ok.exit_code, ok.timed_out, ok.truncated),
        (Some(0), false, false)
    );
    assert_eq!(run(&sh, "exit 3").await.exit_code, Some(3));
    assert_eq!(run(&sh, "false").await.exit_code, Some(1));
    assert_eq!(
        run(&sh, "definitely-not-a-command-xyz").await.exit_code,
        Some(127)
    );
    // Killed by a signal: no exit code.
    let killed = run(&sh, "kill -9 $$").await;
    assert_eq!(killed.exit_code, None);
    assert!(!killed.timed_out);
}

#[tokio::test]
async fn stderr_lines_are_marked() {
    let (_tmp, sh) = shell();
    let result = run(&sh, "echo out; printf 'e1\\ne2\\n' >&2; echo out2").await;
    let lines: Vec<&str> = result.output.lines().collect();
    assert!(lines.contains(&"out"), "{lines:?}");
    assert!(lines.contains(&"out2"), "{lines:?}");
    assert!(lines.contains(&"[stderr] e1"), "{lines:?}");
    assert!(lines.contains(&"[stderr] e2"), "{lines:?}");
    assert_eq!(lines.len(), 4, "{lines:?}");
    // A final line without a newline is still marked.
    let partial = run(&sh, "printf tail >&2").await;
    assert_eq!(partial.output, "[stderr] tail");
    let missing = run(&sh, "ls /definitely/missing").await;
    assert!(
        missing.output.starts_with("[stderr] "),
        "{}",
        missing.output
    );
    assert_ne!(missing.exit_code, Some(0));
}

#[tokio::test]
async fn output_is_truncated_at_the_limit() {
    let (tmp, sh) = shell();
    let small = sh.clone().with_max_output_bytes(100);
    let result = run(&small, "yes line | head -n 1000").await;
    assert!(result.truncated);
    assert_eq!(result.exit_code, Some(0));
    // Only what was kept: the note is the `execute` tool's to write, once.
    assert_eq!(result.output, "line\n".repeat(20));
    // The default limit is 100,000 bytes, and a huge output does not block the command.
    let big = run(
        &sh,
        "head -c 3000000 /dev/zero | tr '\\0' a; echo; echo done",
    )
    .await;
    assert!(big.truncated);
    assert_eq!(big.exit_code, Some(0));
    assert_eq!(big.output, "a".repeat(100_000));
    // Exactly at the limit is not truncated.
    let exact = run(&small, "head -c 100 /dev/zero | tr '\\0' b").await;
    assert!(!exact.truncated);
    assert_eq!(exact.output, "b".repeat(100));
    // Multibyte characters are not split.
    let utf8 = run(&small, "for i in $(seq 60); do printf 'é'; done").await;
    assert!(utf8.truncated);
    assert_eq!(utf8.output, "é".repeat(50));
    drop(tmp);
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() {
    let (_tmp, sh) = shell();
    let started = Instant::now();
    let result = sh
        .execute(
            &cx(),
            "echo $$; sleep 30 & sh -c 'sleep 31' & sleep 32",
            Some(Duration::from_millis(500)),
        )
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert!(result.timed_out);
    assert_eq!(result.exit_code, Some(124));
    // Generous hang guard only: a leaked pipe holder would keep us for 30 s.
    assert!(elapsed < Duration::from_secs(20), "{elapsed:?}");
    let pgid: u32 = result.output.trim().parse().unwrap();
    // SIGKILL delivery is asynchronous: allow the kernel a moment, bounded.
    let mut members = live_members(pgid);
    for _ in 0..100 {
        if members.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        members = live_members(pgid);
    }
    assert!(members.is_empty(), "still running: {members:?}");
}

#[tokio::test]
async fn default_and_invalid_timeouts() {
    let (_tmp, sh) = shell();
    let short = sh.clone().with_timeout(Duration::from_millis(300));
    let result = run(&short, "sleep 20").await;
    assert!(result.timed_out);
    assert_eq!(result.exit_code, Some(124));
    // A per-call timeout overrides the default.
    let result = short
        .execute(
            &cx(),
            "sleep 0.5; echo finished",
            Some(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    assert!(!result.timed_out);
    assert_eq!(result.output, "finished\n");
    let error = sh
        .execute(&cx(), "true", Some(Duration::ZERO))
        .await
        .unwrap_err();
    assert!(matches!(
        error,
        BackendError::InvalidQuery {
            what: "timeout",
            ..
        }
    ));
}

#[tokio::test]
async fn environment_is_empty_by_default() {
    let (_tmp, sh) = shell();
    let result = run(&sh, "env").await;
    let mut names: Vec<&str> = result
        .output
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .collect();
    names.sort_unstable();
    // PWD is set by the shell itself.
    names.retain(|n| *n != "PWD" && *n != "SHLVL" && *n != "_" && *n != "OLDPWD");
    assert!(names.is_empty(), "{}", result.output);
    // Commands still run by name: the shell has its own search path.
    assert_eq!(run(&sh, "ls -d .").await.output, ".\n");
}

#[tokio::test]
async fn env_and_inherit_env_options() {
    let (_tmp, sh) = shell();
    let with = sh
        .clone()
        .with_env("FOO", "bar baz")
        .with_env("PATH", "/bin:/usr/bin");
    let result = run(&with, "printf '%s|%s' \"$FOO\" \"$PATH\"").await;
    assert_eq!(result.output, "bar baz|/bin:/usr/bin");
    // A host variable (whichever exists) passes through only with inherit_env.
    let (name, value) = std::env::vars()
        .find(|(k, v)| {
            !["PATH", "PWD", "SHLVL", "_", "OLDPWD"].contains(&k.as_str())
                && !v.is_empty()
                && !v.contains('\n')
                && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .expect("the test process has some environment variable");
    let probe = format!("printf '%s' \"${{{name}:-unset}}\"");
    assert_eq!(run(&sh, &probe).await.output, "unset");
    let inherited = sh.clone().inherit_env(true).with_env("FOO", "over");
    assert_eq!(run(&inherited, &probe).await.output, value);
    assert_eq!(run(&inherited, "printf %s \"$FOO\"").await.output, "over");
}

#[tokio::test]
async fn stdin_is_closed() {
    let (_tmp, sh) = shell();
    let started = Instant::now();
    let result = run(&sh, "cat; read line; echo \"read=$?\"").await;
    assert_eq!(result.output, "read=1\n");
    assert!(started.elapsed() < Duration::from_secs(20), "hang guard");
}

#[tokio::test]
async fn cwd_is_the_root_and_files_are_shared() {
    let (_tmp, sh) = shell();
    let result = run(&sh, "pwd").await;
    assert_eq!(
        result.output.trim_end(),
        sh.filesystem().root().to_str().unwrap()
    );
    run(&sh, "mkdir -p made && echo from-shell > made/f.txt").await;
    match sh
        .read(&cx(), &VPath::parse("/made/f.txt").unwrap(), 0, 10)
        .await
        .unwrap()
    {
        ReadResult::Text { lines, .. } => assert_eq!(lines, ["from-shell"]),
        other => panic!("{other:?}"),
    }
    sh.write(&cx(), &VPath::parse("/w.txt").unwrap(), "from-backend\n")
        .await
        .unwrap();
    assert_eq!(run(&sh, "cat w.txt").await.output, "from-backend\n");
}

#[tokio::test]
async fn cancelling_a_call_kills_its_process_group() {
    let (_tmp, sh) = shell();
    let context = cx();
    let call = sh.execute(&context, "echo $$ > pgid; sleep 30 & sleep 31", None);
    // The caller gives up (e.g. the run was cancelled): dropping the future must not leave the
    // commands running.
    let outcome = tokio::time::timeout(Duration::from_secs(2), call).await;
    assert!(outcome.is_err(), "the command cannot finish in time");
    let pgid_file = sh.filesystem().root().join("pgid");
    let pgid: u32 = std::fs::read_to_string(pgid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut members = live_members(pgid);
    for _ in 0..100 {
        if members.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        members = live_members(pgid);
    }
    assert!(members.is_empty(), "still running: {members:?}");
}
