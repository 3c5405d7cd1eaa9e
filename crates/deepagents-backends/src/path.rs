//! Virtual paths: what the agent sees, independent of where a file really lives.

use std::fmt;

/// A normalized absolute virtual path such as `/src/main.rs`; `/` is the root.
///
/// Parsing accepts only paths that cannot name anything outside the virtual tree: they start
/// with `/`, and contain no `..` segment, no backslash, no NUL or other control character, no
/// leading `~` and no Windows drive. `.` segments, repeated slashes and a trailing slash are
/// normalized away.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VPath(String);

/// Why a path was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid path `{path}`: {reason}")]
pub struct PathError {
    /// The path as given (control characters escaped).
    pub path: String,
    /// What is wrong and how to write it instead.
    pub reason: &'static str,
}

impl VPath {
    /// The root, `/`.
    pub fn root() -> Self {
        Self("/".to_owned())
    }

    /// Parses and normalizes a virtual path.
    pub fn parse(raw: &str) -> Result<Self, PathError> {
        let refuse = |reason| PathError {
            path: raw.escape_debug().to_string(),
            reason,
        };
        if raw.is_empty() {
            return Err(refuse(
                "the path is empty; use an absolute path such as /notes.md",
            ));
        }
        if raw.starts_with('~') {
            return Err(refuse(
                "`~` is not expanded; use an absolute path such as /notes.md",
            ));
        }
        if raw.contains('\\') {
            return Err(refuse("backslashes are not separators here; use `/`"));
        }
        if raw.chars().any(char::is_control) {
            return Err(refuse(
                "control characters (such as NUL) are not allowed in paths",
            ));
        }
        let bytes = raw.as_bytes();
        if bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':' {
            return Err(refuse(
                "Windows drive paths are not supported; use an absolute path such as /notes.md",
            ));
        }
        if !raw.starts_with('/') {
            return Err(refuse("paths must be absolute; start it with `/`"));
        }
        let mut normalized = String::with_capacity(raw.len());
        for segment in raw.split('/') {
            match segment {
                "" | "." => {}
                ".." => {
                    return Err(refuse(
                        "`..` is not allowed; write the absolute path of the target",
                    ));
                }
                segment => {
                    normalized.push('/');
                    normalized.push_str(segment);
                }
            }
        }
        if normalized.is_empty() {
            normalized.push('/');
        }
        Ok(Self(normalized))
    }

    /// The path as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Whether this is `/`.
    pub fn is_root(&self) -> bool {
        self.0 == "/"
    }

    /// The segments, without the root: `/a/b` → `["a", "b"]`.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|s| !s.is_empty())
    }

    /// The last segment, `None` for the root.
    pub fn file_name(&self) -> Option<&str> {
        self.segments().last()
    }

    /// The parent directory, `None` for the root.
    pub fn parent(&self) -> Option<VPath> {
        if self.is_root() {
            return None;
        }
        match self.0.rfind('/') {
            Some(0) => Some(Self::root()),
            Some(i) => Some(Self(self.0[..i].to_owned())),
            None => None,
        }
    }

    /// This path with `name` appended; `name` is a single segment or a relative path.
    pub fn join(&self, name: &str) -> Result<VPath, PathError> {
        if self.is_root() {
            Self::parse(&format!("/{name}"))
        } else {
            Self::parse(&format!("{}/{name}", self.0))
        }
    }

    /// Whether `self` is `ancestor` or lies below it, on segment boundaries: `/mem` is not an
    /// ancestor of `/memories/x`.
    pub fn starts_with(&self, ancestor: &VPath) -> bool {
        ancestor.is_root()
            || self.0 == ancestor.0
            || (self.0.starts_with(&ancestor.0)
                && self.0.as_bytes().get(ancestor.0.len()) == Some(&b'/'))
    }

    /// The part below `ancestor` as a virtual path (`/a/b` under `/a` is `/b`), if it is below.
    pub fn strip_prefix(&self, ancestor: &VPath) -> Option<VPath> {
        if !self.starts_with(ancestor) {
            return None;
        }
        if ancestor.is_root() {
            return Some(self.clone());
        }
        let rest = &self.0[ancestor.0.len()..];
        Some(if rest.is_empty() {
            Self::root()
        } else {
            Self(rest.to_owned())
        })
    }

    /// The path relative to `ancestor`, without a leading slash (`""` when equal).
    pub fn relative_to(&self, ancestor: &VPath) -> Option<&str> {
        if !self.starts_with(ancestor) {
            return None;
        }
        let rest = if ancestor.is_root() {
            &self.0[..]
        } else {
            &self.0[ancestor.0.len()..]
        };
        Some(rest.trim_start_matches('/'))
    }

    /// `prefix` followed by this path: `/b` under `/a` is `/a/b`.
    pub fn under(&self, prefix: &VPath) -> VPath {
        if prefix.is_root() {
            self.clone()
        } else if self.is_root() {
            prefix.clone()
        } else {
            Self(format!("{}{}", prefix.0, self.0))
        }
    }
}

impl fmt::Display for VPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

// Ordering, equality and hashing are those of the string, so maps keyed by `VPath` can be
// searched by `str` bounds such as `"/dir/"`, which are not valid `VPath`s themselves.
impl std::borrow::Borrow<str> for VPath {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for VPath {
    fn as_ref(&self) -> &str {
        &self.0
    }
}
