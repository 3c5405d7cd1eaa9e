//! Permission rules over paths, and a backend wrapper that enforces them.

use std::sync::Arc;

use async_trait::async_trait;
use globset::{GlobBuilder, GlobMatcher};
use serde::{Deserialize, Serialize};

use crate::filtered::grep_kept;
use crate::path::VPath;
use crate::protocol::{
    Backend, BackendContext, BackendError, Changed, ExecuteResult, FileInfo, FileOpError,
    GlobResult, GrepMatch, GrepQuery, GrepResult, PathMapping, RawFile, ReadResult, Sandbox,
};

/// What an operation does to a path: `ls`, `read_file`, `glob` and `grep` read; `write_file`,
/// `edit_file` and `delete` write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// ls, read, glob, grep, download.
    Read,
    /// write, overwrite, edit, delete, upload.
    Write,
}

/// What a matching rule decides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Go ahead.
    Allow,
    /// Refuse.
    Deny,
    /// Ask a human first. The approval layer turns these rules into approval prompts before
    /// the tool runs; at the backend they allow.
    Interrupt,
}

/// One rule: when an operation in `operations` touches a path matching one of `paths`, apply
/// `mode`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PermissionRule {
    /// The operations it covers.
    pub operations: Vec<Operation>,
    /// Absolute path globs, e.g. `/secrets/**` or `/**/*.env`. `*` stays within a segment.
    pub paths: Vec<String>,
    /// The decision.
    pub mode: Mode,
}

/// A rule could not be compiled.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid permission rule {index}{}: {reason}", shown_path(.path))]
pub struct RuleError {
    /// 0-based index of the rule.
    pub index: usize,
    /// The offending path glob; empty when the rule as a whole is wrong.
    pub path: String,
    /// What is wrong.
    pub reason: String,
}

fn shown_path(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!(" path `{path}`")
    }
}

#[derive(Clone, Debug)]
struct CompiledRule {
    rule: PermissionRule,
    matchers: Vec<GlobMatcher>,
    /// Literal leading directories of each glob, for subtree-overlap checks.
    literal_prefixes: Vec<VPath>,
}

/// Ordered permission rules: the first rule that matches decides; no match allows.
#[derive(Clone, Debug, Default)]
pub struct Permissions {
    rules: Vec<CompiledRule>,
}

impl Permissions {
    /// Compiles `rules`, checking that each names at least one operation and one path, and
    /// that every path is absolute and free of `..`.
    pub fn new(rules: Vec<PermissionRule>) -> Result<Self, RuleError> {
        let mut compiled = Vec::with_capacity(rules.len());
        for (index, rule) in rules.into_iter().enumerate() {
            // Such a rule could never match, so it is almost certainly a mistake that would
            // otherwise leave paths unprotected without a word.
            let empty = if rule.operations.is_empty() {
                Some("it lists no operations; give `read`, `write` or both")
            } else if rule.paths.is_empty() {
                Some("it lists no paths; give absolute globs such as `/secrets/**`")
            } else {
                None
            };
            if let Some(reason) = empty {
                return Err(RuleError {
                    index,
                    path: String::new(),
                    reason: reason.to_owned(),
                });
            }
            let mut matchers = Vec::new();
            let mut literal_prefixes = Vec::new();
            for path in &rule.paths {
                let refuse = |reason: String| RuleError {
                    index,
                    path: path.clone(),
                    reason,
                };
                if !path.starts_with('/') {
                    return Err(refuse(
                        "rule paths must be absolute (start with `/`)".to_owned(),
                    ));
                }
                if path.split('/').any(|segment| segment == "..") {
                    return Err(refuse("`..` is not allowed in rule paths".to_owned()));
                }
                let glob = GlobBuilder::new(path)
                    .literal_separator(true)
                    .backslash_escape(true)
                    .build()
                    .map_err(|e| refuse(e.to_string()))?;
                matchers.push(glob.compile_matcher());
                literal_prefixes.push(literal_prefix(path));
            }
            compiled.push(CompiledRule {
                rule,
                matchers,
                literal_prefixes,
            });
        }
        Ok(Self { rules: compiled })
    }

    /// The decision for `operation` on `path`.
    pub fn check(&self, operation: Operation, path: &VPath) -> Mode {
        self.rules
            .iter()
            .find(|r| {
                r.rule.operations.contains(&operation)
                    && r.matchers.iter().any(|m| m.is_match(path.as_str()))
            })
            .map_or(Mode::Allow, |r| r.rule.mode)
    }

    /// The first deny rule for `operation` that could match `dir` or anything below it.
    fn deny_overlapping(&self, operation: Operation, dir: &VPath) -> Option<&PermissionRule> {
        self.rules
            .iter()
            .filter(|r| r.rule.mode == Mode::Deny && r.rule.operations.contains(&operation))
            .find(|r| {
                r.matchers.iter().any(|m| m.is_match(dir.as_str()))
                    || r.literal_prefixes
                        .iter()
                        .any(|prefix| prefix.starts_with(dir) || dir.starts_with(prefix))
            })
            .map(|r| &r.rule)
    }

    /// The rules in order.
    pub fn rules(&self) -> impl Iterator<Item = &PermissionRule> {
        self.rules.iter().map(|r| &r.rule)
    }
}

/// The directories of a glob before its first wildcard: `/a/b*/c` → `/a`.
fn literal_prefix(glob: &str) -> VPath {
    let cut = glob.find(['*', '?', '[', '{']).unwrap_or(glob.len());
    let literal = &glob[..cut];
    let dir = if cut == glob.len() {
        literal
    } else {
        literal.rfind('/').map_or("/", |i| &literal[..i.max(1)])
    };
    VPath::parse(dir).unwrap_or_else(|_| VPath::root())
}

/// Enforces [`Permissions`] over any backend: denied operations fail with
/// [`BackendError::PermissionDenied`]; `ls`, `glob` and `grep` silently drop denied paths;
/// deleting a directory is refused when any deny rule for writes overlaps it. `execute` is not
/// path-based and passes through.
#[derive(Clone)]
pub struct PermissionedBackend {
    inner: Arc<dyn Backend>,
    permissions: Arc<Permissions>,
}

impl PermissionedBackend {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Backend>, permissions: Permissions) -> Self {
        Self {
            inner,
            permissions: Arc::new(permissions),
        }
    }

    fn require(&self, operation: Operation, path: &VPath) -> Result<(), BackendError> {
        match self.permissions.check(operation, path) {
            Mode::Deny => Err(BackendError::PermissionDenied {
                path: path.to_string(),
                reason: format!(
                    "a permission rule denies {} here; work elsewhere or ask the user to change the rules",
                    match operation {
                        Operation::Read => "reading",
                        Operation::Write => "writing",
                    }
                ),
            }),
            Mode::Allow | Mode::Interrupt => Ok(()),
        }
    }

    fn readable(&self, path: &str) -> bool {
        VPath::parse(path).is_ok_and(|p| self.permissions.check(Operation::Read, &p) != Mode::Deny)
    }
}

#[async_trait]
impl Backend for PermissionedBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn ls(&self, cx: &BackendContext, path: &VPath) -> Result<Vec<FileInfo>, BackendError> {
        self.require(Operation::Read, path)?;
        let mut entries = self.inner.ls(cx, path).await?;
        entries.retain(|e| self.readable(&e.path));
        Ok(entries)
    }

    async fn read(
        &self,
        cx: &BackendContext,
        path: &VPath,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError> {
        self.require(Operation::Read, path)?;
        self.inner.read(cx, path, offset, limit).await
    }

    async fn read_raw(&self, cx: &BackendContext, path: &VPath) -> Result<RawFile, BackendError> {
        self.require(Operation::Read, path)?;
        self.inner.read_raw(cx, path).await
    }

    async fn write(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        self.require(Operation::Write, path)?;
        self.inner.write(cx, path, content).await
    }

    async fn overwrite(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        self.require(Operation::Write, path)?;
        self.inner.overwrite(cx, path, content).await
    }

    async fn edit(
        &self,
        cx: &BackendContext,
        path: &VPath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<Changed<usize>, BackendError> {
        self.require(Operation::Write, path)?;
        self.inner.edit(cx, path, old, new, replace_all).await
    }

    async fn delete(
        &self,
        cx: &BackendContext,
        path: &VPath,
    ) -> Result<Changed<usize>, BackendError> {
        self.require(Operation::Write, path)?;
        if let Some(rule) = self.permissions.deny_overlapping(Operation::Write, path) {
            return Err(BackendError::PermissionDenied {
                path: path.to_string(),
                reason: format!(
                    "a deny rule ({}) covers part of this tree; delete the allowed entries one by one",
                    rule.paths.join(", ")
                ),
            });
        }
        self.inner.delete(cx, path).await
    }

    async fn glob(
        &self,
        cx: &BackendContext,
        pattern: &str,
        base: &VPath,
    ) -> Result<GlobResult, BackendError> {
        self.require(Operation::Read, base)?;
        let mut result = self.inner.glob(cx, pattern, base).await?;
        result.files.retain(|f| self.readable(&f.path));
        Ok(result)
    }

    async fn grep(
        &self,
        cx: &BackendContext,
        query: &GrepQuery,
    ) -> Result<GrepResult, BackendError> {
        self.require(Operation::Read, &query.path)?;
        grep_kept(self.inner.as_ref(), cx, query, &|m: &GrepMatch| {
            self.readable(&m.path)
        })
        .await
    }

    async fn upload_files(
        &self,
        cx: &BackendContext,
        files: Vec<(String, Vec<u8>)>,
    ) -> Changed<Vec<Result<(), FileOpError>>> {
        let mut answers: Vec<Option<Result<(), FileOpError>>> = Vec::with_capacity(files.len());
        let mut allowed = Vec::new();
        for (raw, bytes) in files {
            match VPath::parse(&raw) {
                Err(_) => answers.push(Some(Err(FileOpError::InvalidPath))),
                Ok(path) if self.require(Operation::Write, &path).is_err() => {
                    answers.push(Some(Err(FileOpError::PermissionDenied)));
                }
                Ok(_) => {
                    answers.push(None);
                    allowed.push((raw, bytes));
                }
            }
        }
        let done = self.inner.upload_files(cx, allowed).await;
        let mut inner_answers = done.value.into_iter();
        let value = answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    inner_answers
                        .next()
                        .unwrap_or(Err(FileOpError::InvalidPath))
                })
            })
            .collect();
        Changed {
            value,
            update: done.update,
        }
    }

    async fn download_files(
        &self,
        cx: &BackendContext,
        paths: Vec<String>,
    ) -> Vec<Result<Vec<u8>, FileOpError>> {
        let mut answers = Vec::with_capacity(paths.len());
        for raw in paths {
            let answer = match VPath::parse(&raw) {
                Err(_) => Err(FileOpError::InvalidPath),
                Ok(path) if self.require(Operation::Read, &path).is_err() => {
                    Err(FileOpError::PermissionDenied)
                }
                Ok(_) => self
                    .inner
                    .download_files(cx, vec![raw])
                    .await
                    .pop()
                    .unwrap_or(Err(FileOpError::FileNotFound)),
            };
            answers.push(answer);
        }
        answers
    }

    fn as_sandbox(&self) -> Option<&dyn Sandbox> {
        self.inner.as_sandbox().map(|_| self as &dyn Sandbox)
    }

    fn path_mappings(&self) -> Vec<PathMapping> {
        self.inner.path_mappings()
    }
}

#[async_trait]
impl Sandbox for PermissionedBackend {
    fn id(&self) -> &str {
        self.inner.as_sandbox().map_or("", |s| s.id())
    }

    fn confinement(&self) -> Option<deepagents_core::event::Confinement> {
        self.inner.as_sandbox()?.confinement()
    }

    fn shows_host_path(&self, path: &std::path::Path) -> bool {
        self.inner
            .as_sandbox()
            .is_none_or(|sandbox| sandbox.shows_host_path(path))
    }

    async fn execute_streaming(
        &self,
        cx: &BackendContext,
        command: &str,
        timeout: Option<std::time::Duration>,
        on_output: &crate::protocol::OutputSink<'_>,
    ) -> Result<ExecuteResult, BackendError> {
        match self.inner.as_sandbox() {
            Some(sandbox) => {
                sandbox
                    .execute_streaming(cx, command, timeout, on_output)
                    .await
            }
            None => Err(BackendError::Unsupported {
                operation: "execute",
                backend: self.inner.name(),
            }),
        }
    }
}
