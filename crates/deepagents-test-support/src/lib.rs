//! Helpers the deepagents test suites share, so each suite does not redefine them.
//!
//! Only test code depends on this crate (as a dev-dependency); it is never published.

use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};

/// The environment variable naming the test PostgreSQL server (`.ci/run` starts one).
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
                    "CI=true but {POSTGRES_URL_VAR} is unset: start PostgreSQL (see .ci/run) and \
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
