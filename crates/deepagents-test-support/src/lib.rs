//! Helpers the deepagents test suites share, so each suite does not redefine them.
//!
//! Only test code depends on this crate (as a dev-dependency); it is never published.

use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};

/// The environment variable naming the test PostgreSQL server (`scripts/test` starts one).
pub const POSTGRES_URL_VAR: &str = "DEEPAGENTS_TEST_POSTGRES_URL";

/// The test PostgreSQL server's URL, or `None` (after saying so on stderr) when none is set.
///
/// # Panics
/// Under `CI=true` a missing server is a failure, not a skip: CI must exercise PostgreSQL.
#[allow(clippy::panic)]
pub fn postgres_url() -> Option<String> {
    match std::env::var(POSTGRES_URL_VAR) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!(
                    "CI=true but {POSTGRES_URL_VAR} is unset: start PostgreSQL (see scripts/test) and \
                     export its URL, e.g. postgres://postgres@127.0.0.1:55432/deepagents_test"
                );
            }
            eprintln!("skipped: no PostgreSQL (set {POSTGRES_URL_VAR})");
            None
        }
    }
}

/// A name starting with `prefix` that no other test, in this process or another, uses: for
/// schemas, thread ids and files in shared places. Only ASCII letters, digits, `_` and the
/// prefix's own characters, so it is a valid PostgreSQL identifier when the prefix is one.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{prefix}_{}_{}_{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A finished process's standard output, as text.
///
/// # Panics
/// When the output is not UTF-8: the programs under test must print valid text.
pub fn stdout(output: &Output) -> String {
    utf8("stdout", &output.stdout)
}

/// A finished process's standard error, as text.
///
/// # Panics
/// When the output is not UTF-8.
pub fn stderr(output: &Output) -> String {
    utf8("stderr", &output.stderr)
}

#[allow(clippy::panic)]
fn utf8(stream: &str, bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(error) => panic!("{stream} is not UTF-8: {error}"),
    }
}

/// Runs `git` in `dir` as a fixed author (`Someone <someone@example.com>`), panicking with
/// git's message when it fails; returns its stdout.
///
/// # Panics
/// When git cannot run or fails: the test's setup is broken.
#[allow(clippy::panic)]
pub fn git(dir: &std::path::Path, args: &[&str]) -> String {
    let output = std::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "Someone")
        .env("GIT_AUTHOR_EMAIL", "someone@example.com")
        .env("GIT_COMMITTER_NAME", "Someone")
        .env("GIT_COMMITTER_EMAIL", "someone@example.com")
        .output()
        .unwrap_or_else(|e| panic!("cannot run git: {e}"));
    assert!(output.status.success(), "git {args:?}: {}", stderr(&output));
    stdout(&output)
}

/// A bare repository `dir/NAME.git` on branch `main`, holding `files` (path, text) in one
/// commit `seed` when there are any.
pub fn bare_repo(dir: &std::path::Path, name: &str, files: &[(&str, &str)]) -> std::path::PathBuf {
    let bare = dir.join(format!("{name}.git"));
    git(
        dir,
        &[
            "init",
            "--bare",
            "--quiet",
            "--initial-branch=main",
            &bare.to_string_lossy(),
        ],
    );
    if !files.is_empty() {
        push_files(&bare, files, "seed");
    }
    bare
}

/// Commits `files` on top of `main` of the bare repository `bare` from a fresh clone and
/// pushes them, as another writer would.
///
/// # Panics
/// When git fails or the files cannot be written.
#[allow(clippy::panic)]
pub fn push_files(bare: &std::path::Path, files: &[(&str, &str)], message: &str) {
    let work = bare.with_extension(format!("work-{}", unique_name("clone")));
    let parent = bare.parent().unwrap_or(std::path::Path::new("/"));
    git(
        parent,
        &[
            "clone",
            "--quiet",
            &bare.to_string_lossy(),
            &work.to_string_lossy(),
        ],
    );
    git(&work, &["checkout", "--quiet", "-B", "main"]);
    for (path, text) in files {
        let file = work.join(path);
        if let Some(dir) = file.parent() {
            std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{e}"));
        }
        std::fs::write(file, text).unwrap_or_else(|e| panic!("{e}"));
    }
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "--quiet", "-m", message]);
    git(&work, &["push", "--quiet", "origin", "main"]);
    let _ = std::fs::remove_dir_all(&work);
}

/// The value of the test environment variable `name` (set by `scripts/test`), or `None` (after
/// saying on stderr that the test is skipped and that `needs` is missing) when it is unset.
///
/// # Panics
/// Under `CI` a missing variable is a failure, not a skip.
#[allow(clippy::panic)]
pub fn test_env(name: &str, needs: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => Some(value),
        _ if std::env::var_os("CI").is_some() => panic!("{name} is not set ({needs})"),
        _ => {
            eprintln!("skipped: set {name} to {needs}");
            None
        }
    }
}

/// A Python with the official MCP SDK (`mcp` from PyPI).
pub fn mcp_python() -> Option<String> {
    test_env(
        "DEEPAGENTS_TEST_MCP_PYTHON",
        "a Python with `mcp` installed",
    )
}

/// The test Redis server's URL (started by `scripts/test`).
pub fn redis_url() -> Option<String> {
    test_env("DEEPAGENTS_TEST_REDIS_URL", "a Redis server's URL")
}

/// A Python with the official `langgraph-sdk` client installed (pinned by `scripts/test`).
pub fn langgraph_python() -> Option<String> {
    test_env(
        "DEEPAGENTS_TEST_LANGGRAPH_PYTHON",
        "a Python with `langgraph-sdk` installed",
    )
}

/// The `node_modules` of the web-client tests (playwright-core, the LangGraph JS SDK,
/// `@langchain/react`, React, esbuild; pinned by `scripts/test`).
pub fn web_node_modules() -> Option<String> {
    test_env(
        "DEEPAGENTS_TEST_WEB",
        "a node_modules with playwright-core, esbuild, react, react-dom, @langchain/langgraph-sdk and @langchain/react (scripts/test installs them)",
    )
}

/// The web-client tests' `node_modules` and the Chromium that playwright-core drives.
pub fn browser() -> Option<(String, String)> {
    let modules = web_node_modules()?;
    let chromium = test_env("DEEPAGENTS_TEST_CHROMIUM", "a Chromium executable")?;
    Some((modules, chromium))
}

/// The `node_modules` holding the reference MCP servers from npm
/// (`@modelcontextprotocol/server-everything`, `@modelcontextprotocol/server-filesystem`).
pub fn mcp_node_modules() -> Option<std::path::PathBuf> {
    test_env(
        "DEEPAGENTS_TEST_MCP_NPM",
        "a node_modules with the reference MCP servers",
    )
    .map(std::path::PathBuf::from)
}

/// The entry point of the reference "everything" MCP server in `modules`.
pub fn everything_server(modules: &std::path::Path) -> std::path::PathBuf {
    modules.join("@modelcontextprotocol/server-everything/dist/index.js")
}

/// The reference "everything" MCP server over HTTP on a free port of 127.0.0.1, stopped when
/// dropped.
pub struct EverythingHttp {
    child: std::process::Child,
    /// Its MCP endpoint (streamable HTTP) or event stream (legacy SSE).
    pub url: String,
}

impl EverythingHttp {
    /// Starts it on streamable HTTP and waits until it listens.
    pub fn start(modules: &std::path::Path) -> Self {
        Self::serve(modules, "streamableHttp", "/mcp")
    }

    /// Starts it on the legacy HTTP+SSE transport and waits until it listens.
    pub fn start_legacy_sse(modules: &std::path::Path) -> Self {
        Self::serve(modules, "sse", "/sse")
    }

    /// # Panics
    /// When it cannot be started.
    #[allow(clippy::expect_used)]
    fn serve(modules: &std::path::Path, transport: &str, path: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        // The server takes a port but no address: the preload keeps it on 127.0.0.1.
        let loopback =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/loopback.cjs");
        let child = std::process::Command::new("node")
            .arg("--require")
            .arg(loopback)
            .arg(everything_server(modules))
            .arg(transport)
            .env("PORT", port.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("node starts the everything server");
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        Self {
            child,
            url: format!("http://127.0.0.1:{port}{path}"),
        }
    }
}

impl Drop for EverythingHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
