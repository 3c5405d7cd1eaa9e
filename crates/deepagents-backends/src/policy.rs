//! User checks around any backend: audit logs, rate limits, content inspection.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::path::VPath;
use crate::protocol::{
    Backend, BackendContext, BackendError, Changed, ExecuteResult, FileInfo, FileOpError,
    GlobResult, GrepQuery, GrepResult, PathMapping, RawFile, ReadResult, Sandbox,
};

/// One backend operation, as a policy sees it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum BackendOp<'a> {
    /// `ls`.
    Ls {
        /// The directory.
        path: &'a VPath,
    },
    /// `read` or `read_raw`.
    Read {
        /// The file.
        path: &'a VPath,
    },
    /// `write` or `overwrite`.
    Write {
        /// The file.
        path: &'a VPath,
        /// The new content.
        content: &'a str,
    },
    /// `edit`.
    Edit {
        /// The file.
        path: &'a VPath,
        /// Text to replace.
        old: &'a str,
        /// Replacement.
        new: &'a str,
    },
    /// `delete`.
    Delete {
        /// The file or directory.
        path: &'a VPath,
    },
    /// `glob`.
    Glob {
        /// The pattern.
        pattern: &'a str,
        /// The search base.
        base: &'a VPath,
    },
    /// `grep`.
    Grep {
        /// The query.
        query: &'a GrepQuery,
    },
    /// `upload_files`, one file at a time.
    Upload {
        /// The path as given.
        path: &'a str,
        /// The bytes.
        data: &'a [u8],
    },
    /// `download_files`, one file at a time.
    Download {
        /// The path as given.
        path: &'a str,
    },
    /// `execute`.
    Execute {
        /// The shell command.
        command: &'a str,
    },
}

/// Checks run around every operation of a [`PolicyBackend`].
#[async_trait]
pub trait BackendPolicy: Send + Sync {
    /// Before the operation: an error refuses it (the error is what the caller sees).
    async fn check(&self, _cx: &BackendContext, _op: BackendOp<'_>) -> Result<(), BackendError> {
        Ok(())
    }

    /// After the operation, with its outcome (for audit logs and metrics).
    async fn observe(
        &self,
        _cx: &BackendContext,
        _op: BackendOp<'_>,
        _outcome: Result<(), &BackendError>,
    ) {
    }
}

/// Runs a [`BackendPolicy`] around every operation of any backend.
#[derive(Clone)]
pub struct PolicyBackend {
    inner: Arc<dyn Backend>,
    policy: Arc<dyn BackendPolicy>,
}

impl PolicyBackend {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Backend>, policy: Arc<dyn BackendPolicy>) -> Self {
        Self { inner, policy }
    }

    async fn guarded<T>(
        &self,
        cx: &BackendContext,
        op: BackendOp<'_>,
        run: impl std::future::Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        if let Err(error) = self.policy.check(cx, op).await {
            self.policy.observe(cx, op, Err(&error)).await;
            return Err(error);
        }
        let result = run.await;
        self.policy
            .observe(cx, op, result.as_ref().map(|_| ()))
            .await;
        result
    }
}

#[async_trait]
impl Backend for PolicyBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn ls(&self, cx: &BackendContext, path: &VPath) -> Result<Vec<FileInfo>, BackendError> {
        self.guarded(cx, BackendOp::Ls { path }, self.inner.ls(cx, path))
            .await
    }

    async fn read(
        &self,
        cx: &BackendContext,
        path: &VPath,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError> {
        self.guarded(
            cx,
            BackendOp::Read { path },
            self.inner.read(cx, path, offset, limit),
        )
        .await
    }

    async fn read_raw(&self, cx: &BackendContext, path: &VPath) -> Result<RawFile, BackendError> {
        self.guarded(cx, BackendOp::Read { path }, self.inner.read_raw(cx, path))
            .await
    }

    async fn write(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        self.guarded(
            cx,
            BackendOp::Write { path, content },
            self.inner.write(cx, path, content),
        )
        .await
    }

    async fn overwrite(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        // The same change as far as a policy goes: content put at a path.
        self.guarded(
            cx,
            BackendOp::Write { path, content },
            self.inner.overwrite(cx, path, content),
        )
        .await
    }

    async fn edit(
        &self,
        cx: &BackendContext,
        path: &VPath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<Changed<usize>, BackendError> {
        self.guarded(
            cx,
            BackendOp::Edit { path, old, new },
            self.inner.edit(cx, path, old, new, replace_all),
        )
        .await
    }

    async fn delete(
        &self,
        cx: &BackendContext,
        path: &VPath,
    ) -> Result<Changed<usize>, BackendError> {
        self.guarded(cx, BackendOp::Delete { path }, self.inner.delete(cx, path))
            .await
    }

    async fn glob(
        &self,
        cx: &BackendContext,
        pattern: &str,
        base: &VPath,
    ) -> Result<GlobResult, BackendError> {
        self.guarded(
            cx,
            BackendOp::Glob { pattern, base },
            self.inner.glob(cx, pattern, base),
        )
        .await
    }

    async fn grep(
        &self,
        cx: &BackendContext,
        query: &GrepQuery,
    ) -> Result<GrepResult, BackendError> {
        self.guarded(cx, BackendOp::Grep { query }, self.inner.grep(cx, query))
            .await
    }

    async fn upload_files(
        &self,
        cx: &BackendContext,
        files: Vec<(String, Vec<u8>)>,
    ) -> Changed<Vec<Result<(), FileOpError>>> {
        let mut answers: Vec<Option<Result<(), FileOpError>>> = Vec::with_capacity(files.len());
        let mut allowed = Vec::new();
        for (path, data) in files {
            let op = BackendOp::Upload {
                path: &path,
                data: &data,
            };
            match self.policy.check(cx, op).await {
                Ok(()) => {
                    answers.push(None);
                    allowed.push((path, data));
                }
                Err(error) => {
                    self.policy.observe(cx, op, Err(&error)).await;
                    answers.push(Some(Err(error.file_op_code())));
                }
            }
        }
        let done = self.inner.upload_files(cx, allowed.clone()).await;
        for ((path, data), answer) in allowed.iter().zip(&done.value) {
            let op = BackendOp::Upload { path, data };
            let error = answer.err().map(|code| BackendError::Io {
                operation: "upload",
                path: path.clone(),
                message: format!("{code:?}"),
            });
            self.policy
                .observe(cx, op, error.as_ref().map_or(Ok(()), Err))
                .await;
        }
        let mut inner_answers = done.value.into_iter();
        Changed {
            value: answers
                .into_iter()
                .map(|a| {
                    a.unwrap_or_else(|| {
                        inner_answers
                            .next()
                            .unwrap_or(Err(FileOpError::InvalidPath))
                    })
                })
                .collect(),
            update: done.update,
        }
    }

    async fn download_files(
        &self,
        cx: &BackendContext,
        paths: Vec<String>,
    ) -> Vec<Result<Vec<u8>, FileOpError>> {
        let mut answers = Vec::with_capacity(paths.len());
        for path in paths {
            let op = BackendOp::Download { path: &path };
            let answer = match self.policy.check(cx, op).await {
                Err(error) => {
                    self.policy.observe(cx, op, Err(&error)).await;
                    Err(error.file_op_code())
                }
                Ok(()) => {
                    let answer = self
                        .inner
                        .download_files(cx, vec![path.clone()])
                        .await
                        .pop()
                        .unwrap_or(Err(FileOpError::FileNotFound));
                    let error = answer.as_ref().err().map(|code| BackendError::Io {
                        operation: "download",
                        path: path.clone(),
                        message: format!("{code:?}"),
                    });
                    self.policy
                        .observe(cx, op, error.as_ref().map_or(Ok(()), Err))
                        .await;
                    answer
                }
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
impl Sandbox for PolicyBackend {
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
        timeout: Option<Duration>,
        on_output: &crate::protocol::OutputSink<'_>,
    ) -> Result<ExecuteResult, BackendError> {
        let Some(sandbox) = self.inner.as_sandbox() else {
            return Err(BackendError::Unsupported {
                operation: "execute",
                backend: self.inner.name(),
            });
        };
        self.guarded(
            cx,
            BackendOp::Execute { command },
            sandbox.execute_streaming(cx, command, timeout, on_output),
        )
        .await
    }
}

/// A [`BackendPolicy`] that makes a backend read-only: writes, `delete`, uploads and `execute`
/// are refused, and so are edits except of the files named by [`editable`](Self::editable).
/// Mount directories from outside the workspace with it (skills, the user's agent directory),
/// so the agent can read them but neither change, delete nor plant files there.
#[derive(Clone, Debug, Default)]
pub struct ReadOnlyPolicy {
    editable: Vec<VPath>,
}

impl ReadOnlyPolicy {
    /// Refuses every change.
    pub fn new() -> Self {
        Self::default()
    }

    /// Allows `edit` (and only `edit`) of `file`: a notes file the agent may keep up to date.
    pub fn editable(mut self, file: VPath) -> Self {
        self.editable.push(file);
        self
    }

    fn refuse(path: &str, what: &str) -> BackendError {
        BackendError::PermissionDenied {
            path: path.to_owned(),
            reason: format!(
                "this directory is mounted read-only (it lies outside the workspace), so {what} is not allowed; work in the workspace instead"
            ),
        }
    }
}

#[async_trait]
impl BackendPolicy for ReadOnlyPolicy {
    async fn check(&self, _cx: &BackendContext, op: BackendOp<'_>) -> Result<(), BackendError> {
        match op {
            BackendOp::Ls { .. }
            | BackendOp::Read { .. }
            | BackendOp::Glob { .. }
            | BackendOp::Grep { .. }
            | BackendOp::Download { .. } => Ok(()),
            BackendOp::Edit { path, .. } if self.editable.contains(path) => Ok(()),
            BackendOp::Edit { path, .. } => Err(Self::refuse(path.as_str(), "editing files")),
            BackendOp::Write { path, .. } => Err(Self::refuse(path.as_str(), "writing files")),
            BackendOp::Delete { path } => Err(Self::refuse(path.as_str(), "deleting")),
            BackendOp::Upload { path, .. } => Err(Self::refuse(path, "writing files")),
            BackendOp::Execute { .. } => Err(Self::refuse("/", "running commands")),
        }
    }
}
