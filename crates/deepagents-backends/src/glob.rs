//! Glob semantics shared by every backend.
//!
//! - A pattern without `/` matches file names at any depth: `*.py` finds `/a.py` and `/x/y/b.py`.
//! - A pattern with `/` matches the path relative to the search base: `src/*.rs` finds
//!   `src/main.rs` but not `src/bin/x.rs`; a leading `/` only anchors (`/src/*.rs` is the same).
//! - `*` and `?` stay within one segment; `**` crosses segments; `{a,b}` and `[abc]` work.
//! - Hidden entries (a segment starting with `.`) match only when the pattern names a hidden
//!   segment itself, e.g. `.github/**/*.yml`, `**/.env` or `**/{.*,*}`.
//! - Only files match, never directories.

use globset::{GlobBuilder, GlobMatcher};

use crate::protocol::BackendError;

/// A compiled glob pattern.
#[derive(Clone, Debug)]
pub struct GlobPattern {
    matcher: GlobMatcher,
    allows_hidden: bool,
}

impl GlobPattern {
    /// Compiles `pattern`.
    pub fn new(pattern: &str) -> Result<Self, BackendError> {
        let anchored = pattern.trim_start_matches('/');
        if anchored.is_empty() {
            return Err(BackendError::InvalidQuery {
                what: "glob",
                message: "the pattern is empty; try **/* for every file".to_owned(),
            });
        }
        let full = if anchored.contains('/') || pattern.starts_with('/') {
            anchored.to_owned()
        } else {
            format!("**/{anchored}")
        };
        let glob = GlobBuilder::new(&full)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| BackendError::InvalidQuery {
                what: "glob",
                message: e.to_string(),
            })?;
        // A segment names hidden entries when it starts with `.` or offers a `.` alternative.
        let allows_hidden = anchored.split('/').any(|segment| {
            (segment.starts_with('.') && segment != "." && segment != "..")
                || segment.contains("{.")
                || segment.contains(",.")
        });
        Ok(Self {
            matcher: glob.compile_matcher(),
            allows_hidden,
        })
    }

    /// Whether a file at `relative` (relative to the search base, no leading `/`) matches.
    pub fn matches(&self, relative: &str) -> bool {
        if !self.allows_hidden && relative.split('/').any(|s| s.starts_with('.')) {
            return false;
        }
        self.matcher.is_match(relative)
    }

    /// Whether a directory at `relative` may hold matches (hidden directories are skipped unless
    /// the pattern names hidden segments).
    pub fn may_descend(&self, relative_dir: &str) -> bool {
        self.allows_hidden || !relative_dir.split('/').any(|s| s.starts_with('.'))
    }
}
