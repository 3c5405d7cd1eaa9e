//! The backend protocol: what every backend implements, and the values it returns.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deepagents_core::event::OutputStream;
use deepagents_core::{AgentState, Extensions, RunContext, RuntimeContext, StateUpdate};
use serde::{Deserialize, Serialize};

use crate::path::{PathError, VPath};

/// What a backend operation may use besides its arguments.
#[derive(Clone, Debug, Default)]
pub struct BackendContext {
    /// The agent state as of the current step (the state backend reads its files here).
    pub state: Arc<AgentState>,
    /// Application data of the run (store namespaces may be derived from it).
    pub runtime: RuntimeContext,
    /// The conversation thread, when the run has one.
    pub thread_id: Option<String>,
    /// The assistant (agent) id, when the application set one.
    pub assistant_id: Option<String>,
    /// Where the backend is mounted in the agent's tree (`/` unless a composite routed the
    /// call). Backends that key data by virtual path (the state backend) key it by the full
    /// path, so the agent state shows the paths the agent sees.
    pub mount: Option<VPath>,
    /// The run's per-run values ([`RunContext::extensions`]): a backend that makes a backend
    /// per run (see [`PerRunBackend`](crate::PerRunBackend)) keeps it here.
    pub extensions: Extensions,
    /// The tool call this operation serves, when a tool made it: a backend that shows its
    /// work elsewhere (an editor's terminal) attaches it to the call.
    pub call_id: Option<String>,
}

impl BackendContext {
    /// The context of a call made for `run` over `state`: its thread and assistant ids,
    /// runtime data and extensions.
    pub fn for_run(run: &RunContext, state: Arc<AgentState>) -> Self {
        Self {
            state,
            runtime: run.runtime.clone(),
            thread_id: run.thread_id.clone(),
            assistant_id: Some(run.assistant_id.clone()),
            mount: None,
            extensions: run.extensions.clone(),
            call_id: None,
        }
    }

    /// A context over `state`.
    pub fn with_state(state: Arc<AgentState>) -> Self {
        Self {
            state,
            ..Self::default()
        }
    }

    /// The full virtual path of a path the backend received.
    pub fn full_path(&self, path: &VPath) -> VPath {
        match &self.mount {
            Some(mount) => path.under(mount),
            None => path.clone(),
        }
    }
}

/// One entry of a listing or a glob.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileInfo {
    /// Absolute virtual path.
    pub path: VPathString,
    /// Whether it is a directory.
    pub is_dir: bool,
    /// Size in bytes (0 for directories).
    pub size: u64,
    /// Last modification in milliseconds since the Unix epoch, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_at_ms: Option<u64>,
    /// Set for a symlink the backend will not follow, saying why; `is_dir` and `size` then
    /// describe nothing (false and 0). A symlink that can be followed is listed as what it
    /// points to, with this `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broken_link: Option<BrokenLink>,
}

/// Why a listed symlink cannot be followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BrokenLink {
    /// It leads outside the root, or is absolute (never followed, wherever it points).
    OutsideRoot,
    /// Its target is missing or a loop, or this backend follows no symlinks.
    Unresolvable,
}

/// A virtual path in serialized results.
pub type VPathString = String;

/// A page of a text file, or a binary file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReadResult {
    /// Lines of a text file (see [`crate::mime`] for what is text).
    Text {
        /// The requested lines, without line terminators (`\r\n` and `\n` both end a line).
        /// Bytes that are not valid UTF-8 show as U+FFFD.
        lines: Vec<String>,
        /// 0-based index of the first returned line.
        offset: usize,
        /// Lines in the whole file.
        total_lines: usize,
    },
    /// A binary file.
    Binary {
        /// Detected media type.
        mime_type: String,
        /// The bytes.
        #[serde(with = "deepagents_core::content::base64_bytes")]
        data: Vec<u8>,
    },
}

impl ReadResult {
    /// The offset of the next page, when lines remain.
    pub fn next_offset(&self) -> Option<usize> {
        match self {
            Self::Text {
                lines,
                offset,
                total_lines,
            } => {
                let next = offset + lines.len();
                (next < *total_lines).then_some(next)
            }
            Self::Binary { .. } => None,
        }
    }
}

/// A file's raw bytes with its media type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawFile {
    /// Detected media type (`text/plain; charset=utf-8` for UTF-8 text, `text/plain` for other
    /// text).
    pub mime_type: String,
    /// The bytes.
    pub data: Vec<u8>,
}

/// Result of a change. `update` carries changes to the agent state (state backend only); the
/// tool returns it so the run merges it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Changed<T> {
    /// What the operation reports.
    pub value: T,
    /// Changes to merge into the agent state.
    pub update: StateUpdate,
}

impl<T> Changed<T> {
    /// A result that touches no agent state.
    pub fn outside_state(value: T) -> Self {
        Self {
            value,
            update: StateUpdate::default(),
        }
    }
}

/// A grep request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrepQuery {
    /// What to look for: a literal string unless `regex` is set.
    pub pattern: String,
    /// Treat `pattern` as a regular expression (Rust regex syntax).
    pub regex: bool,
    /// Ignore case.
    pub case_insensitive: bool,
    /// Directory (or file) to search.
    pub path: VPath,
    /// Only search files whose path relative to `path` matches this glob.
    pub include: Option<String>,
    /// Stop after this many matching lines in all.
    pub max_count: usize,
}

impl GrepQuery {
    /// A literal search under `path` with the default cap of 1,000 matches.
    pub fn literal(pattern: impl Into<String>, path: VPath) -> Self {
        Self {
            pattern: pattern.into(),
            regex: false,
            case_insensitive: false,
            path,
            include: None,
            max_count: DEFAULT_GREP_MAX_COUNT,
        }
    }
}

/// The largest file backends write, edit, upload, download or otherwise load whole unless
/// configured otherwise (10 MiB). Larger text files are still read page by page and searched.
pub const DEFAULT_MAX_FILE_SIZE: u64 = 10 * 1024 * 1024;

/// Matches returned by grep unless the query says otherwise.
pub const DEFAULT_GREP_MAX_COUNT: usize = 1_000;

/// One matching line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepMatch {
    /// Absolute virtual path of the file.
    pub path: VPathString,
    /// 1-based line number.
    pub line_number: usize,
    /// The line, without its terminator.
    pub line: String,
}

/// Matches found, in path then line order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrepResult {
    /// The matches.
    pub matches: Vec<GrepMatch>,
    /// Whether the search stopped early (max count or time budget): more may exist.
    pub truncated: bool,
    /// Files the search covered but did not search, in path order, so the model is told why a
    /// file it expected is missing. When the matches were cut at the cap, only files sorting
    /// before the last match are listed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<SkippedFile>,
}

impl GrepResult {
    /// When the matches were cut at the cap of `max_count`, drops the skipped files sorting
    /// after the last match: the search did not (or need not) cover them, so the list is the
    /// same whatever order the search walked in.
    pub(crate) fn trim_skipped(&mut self, max_count: usize) {
        if !self.truncated || self.matches.len() < max_count {
            return;
        }
        if let Some(last) = self.matches.last() {
            let last = last.path.clone();
            self.skipped.retain(|s| s.path < last);
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Binary { mime_type } => write!(f, "binary, {mime_type}"),
            Self::Unreadable { reason } => f.write_str(reason),
        }
    }
}

/// A file grep did not search.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedFile {
    /// Absolute virtual path.
    pub path: VPathString,
    /// Why it was not searched.
    pub reason: SkipReason,
}

/// Why grep did not search a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SkipReason {
    /// Binary content (a signature, a binary extension or a NUL byte; see [`crate::mime`]).
    Binary {
        /// Its detected media type.
        mime_type: String,
    },
    /// It could not be opened or read (permissions, a link leaving the root, not a regular
    /// file).
    Unreadable {
        /// A short reason, e.g. `permission denied`.
        reason: String,
    },
}

/// Files matched by a glob, sorted by path.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GlobResult {
    /// The files.
    pub files: Vec<FileInfo>,
    /// Whether the walk stopped early (time budget or cap): more may exist.
    pub truncated: bool,
}

/// Per-file error codes of batch uploads and downloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileOpError {
    /// No such file.
    FileNotFound,
    /// A permission rule or the host refused it.
    PermissionDenied,
    /// The path is a directory.
    IsDirectory,
    /// The path is not a valid virtual path.
    InvalidPath,
}

/// Output of a shell command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecuteResult {
    /// Combined stdout and stderr (stderr lines marked). When `truncated`, only the part kept,
    /// with no note appended: whoever shows it says it was cut (the `execute` tool does).
    pub output: String,
    /// Exit code; `None` when the process was killed by a signal.
    pub exit_code: Option<i32>,
    /// Whether output was cut at the limit.
    pub truncated: bool,
    /// Whether the command was killed at its timeout.
    pub timed_out: bool,
}

/// Why a backend operation failed. Messages say what to do next; the filesystem tools pass them
/// to the model as they are.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The path is not a valid virtual path.
    #[error(transparent)]
    InvalidPath(#[from] PathError),
    /// Nothing exists at the path.
    #[error("{path} does not exist; check the path with ls or glob")]
    NotFound {
        /// The path.
        path: String,
    },
    /// A file operation was given a directory.
    #[error("{path} is a directory; use ls to see its entries")]
    IsDirectory {
        /// The path.
        path: String,
    },
    /// write: a file already exists at the path; nothing was changed. `write` only creates;
    /// [`Backend::overwrite`] replaces.
    #[error(
        "{path} already exists: read it and change it with edit_file, or delete it first to replace it whole"
    )]
    AlreadyExists {
        /// The path.
        path: String,
    },
    /// Another writer changed the storage since it was read (a repository whose branch moved),
    /// so nothing was saved; the backend has read the new state, so a retry works on it.
    #[error(
        "{path} was not saved: another writer changed the repository since it was read. Read the file again (it now shows their change) and redo yours"
    )]
    Conflict {
        /// The path.
        path: String,
    },
    /// A directory operation was given a file, or a parent is a file.
    #[error("{path} is not a directory")]
    NotADirectory {
        /// The path.
        path: String,
    },
    /// Denied by a permission rule, a policy, or the host.
    #[error("permission denied for {path}: {reason}")]
    PermissionDenied {
        /// The path.
        path: String,
        /// Which rule or check refused it.
        reason: String,
    },
    /// The file is over the backend's size limit for operations that load it whole (read of a
    /// binary file, read_raw, download, edit). Text files are still read page by page.
    #[error(
        "{path} is {size} bytes, over the {max}-byte limit for loading a file whole; a text file can still be read in pages with read_file offset and limit, and searched with grep"
    )]
    TooLarge {
        /// The path.
        path: String,
        /// Its size.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// read: the first line asked for alone is over the size limit, so no page can hold it.
    #[error(
        "line {line} of {path} alone is over the {max}-byte limit on what one read returns; search it with grep instead"
    )]
    LineTooLong {
        /// The path.
        path: String,
        /// The 1-based line number.
        line: usize,
        /// The limit.
        max: u64,
    },
    /// A write or edit would leave the file over the backend's size limit; nothing was changed.
    #[error(
        "{path} would be {size} bytes, over the {max}-byte file size limit; nothing was written. Split the content into several smaller files"
    )]
    TooLargeToWrite {
        /// The path.
        path: String,
        /// The size the file would have had.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// A text operation was given a binary file.
    #[error("{path} is a binary file ({mime_type}); it cannot be edited as text")]
    Binary {
        /// The path.
        path: String,
        /// Its detected media type.
        mime_type: String,
    },
    /// edit: the file is text but not valid UTF-8, and the edit would have to write bytes the
    /// model cannot see or spell; nothing was changed.
    #[error("{path} is not valid UTF-8 (its invalid bytes read as U+FFFD); {reason}")]
    NotUtf8 {
        /// The path.
        path: String,
        /// Why the edit cannot be made, and what to do instead.
        reason: String,
    },
    /// edit: the old string does not occur.
    #[error(
        "the text to replace was not found in {path}; read the file and copy the exact text, including whitespace"
    )]
    StringNotFound {
        /// The path.
        path: String,
    },
    /// edit: the old string occurs more than once and `replace_all` is off.
    #[error(
        "the text to replace occurs {count} times in {path}; include more surrounding lines to make it unique, or set replace_all"
    )]
    NotUnique {
        /// The path.
        path: String,
        /// How often it occurs.
        count: usize,
    },
    /// The query itself is malformed (bad regex or glob).
    #[error("invalid {what}: {message}")]
    InvalidQuery {
        /// `regex` or `glob`.
        what: &'static str,
        /// The parser's message.
        message: String,
    },
    /// The backend cannot do this operation.
    #[error("the {backend} backend does not support {operation}")]
    Unsupported {
        /// The operation.
        operation: &'static str,
        /// The backend.
        backend: &'static str,
    },
    /// The host or the store failed.
    #[error("{operation} failed for {path}: {message}")]
    Io {
        /// The operation.
        operation: &'static str,
        /// The path.
        path: String,
        /// The underlying error.
        message: String,
    },
}

impl BackendError {
    /// The same error with each path it names passed through `map`. A composite uses it to put
    /// the mount prefix back, so errors name the path the agent used, as results do.
    pub(crate) fn map_paths(self, map: impl Fn(&str) -> String) -> Self {
        match self {
            Self::InvalidPath(PathError { path, reason }) => Self::InvalidPath(PathError {
                path: map(&path),
                reason,
            }),
            Self::NotFound { path } => Self::NotFound { path: map(&path) },
            Self::IsDirectory { path } => Self::IsDirectory { path: map(&path) },
            Self::AlreadyExists { path } => Self::AlreadyExists { path: map(&path) },
            Self::Conflict { path } => Self::Conflict { path: map(&path) },
            Self::NotADirectory { path } => Self::NotADirectory { path: map(&path) },
            Self::PermissionDenied { path, reason } => Self::PermissionDenied {
                path: map(&path),
                reason,
            },
            Self::TooLarge { path, size, max } => Self::TooLarge {
                path: map(&path),
                size,
                max,
            },
            Self::LineTooLong { path, line, max } => Self::LineTooLong {
                path: map(&path),
                line,
                max,
            },
            Self::TooLargeToWrite { path, size, max } => Self::TooLargeToWrite {
                path: map(&path),
                size,
                max,
            },
            Self::Binary { path, mime_type } => Self::Binary {
                path: map(&path),
                mime_type,
            },
            Self::NotUtf8 { path, reason } => Self::NotUtf8 {
                path: map(&path),
                reason,
            },
            Self::StringNotFound { path } => Self::StringNotFound { path: map(&path) },
            Self::NotUnique { path, count } => Self::NotUnique {
                path: map(&path),
                count,
            },
            Self::Io {
                operation,
                path,
                message,
            } => Self::Io {
                operation,
                path: map(&path),
                message,
            },
            error @ (Self::InvalidQuery { .. } | Self::Unsupported { .. }) => error,
        }
    }

    /// The batch error code of this error. Uploads replace files, so
    /// [`AlreadyExists`](Self::AlreadyExists) does not arise there; should a backend report it
    /// anyway it counts as refused (`permission_denied`).
    pub fn file_op_code(&self) -> FileOpError {
        match self {
            Self::NotFound { .. } => FileOpError::FileNotFound,
            Self::IsDirectory { .. } => FileOpError::IsDirectory,
            Self::InvalidPath(_) => FileOpError::InvalidPath,
            _ => FileOpError::PermissionDenied,
        }
    }
}

/// Where a part of the virtual tree lives on the host machine, so the model can be told how
/// shell paths relate to file-tool paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathMapping {
    /// The virtual prefix (`/` for the whole tree of a backend).
    pub prefix: VPath,
    /// The host directory it maps to; `None` when it is not on the host's disk (agent state,
    /// a store, a remote machine).
    pub host: Option<std::path::PathBuf>,
}

/// A filesystem the agent can use. Every operation takes absolute virtual paths and returns
/// errors as values.
///
/// The core is `name`, `ls`, `read`, `write`, `edit`, `glob` and `grep`; the rest have defaults
/// built on it: `read_raw` rebuilds a text file from `read` (its line terminators become
/// `\n`), `overwrite` is `write`, or `delete` then `write` when the file exists,
/// `upload_files` writes UTF-8 files with `overwrite` (other bytes are refused per path as
/// `invalid_path`), `download_files` uses `read_raw`, and `delete` reports that the backend
/// cannot delete. Override them to keep bytes exact, to store binary files, to delete, or to
/// replace a file in one step.
///
/// `write` only creates: a file that exists is [`BackendError::AlreadyExists`] and stays as it
/// was, so the model never loses a file it did not read. [`overwrite`](Self::overwrite)
/// replaces, for callers that mean to (the harness's own files, uploads).
/// [`crate::memory`] has helpers for backends that keep whole files in memory, and the
/// `testing` feature's suite checks a backend against every rule.
#[async_trait]
pub trait Backend: Send + Sync {
    /// A short name for messages, e.g. `state` or `filesystem`.
    fn name(&self) -> &'static str;

    /// Entries directly under `path`, sorted by path.
    async fn ls(&self, cx: &BackendContext, path: &VPath) -> Result<Vec<FileInfo>, BackendError>;

    /// Lines `offset..offset + limit` of a text file, or a binary file whole.
    async fn read(
        &self,
        cx: &BackendContext,
        path: &VPath,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError>;

    /// The whole file as bytes. The default rebuilds it from [`read`](Self::read).
    async fn read_raw(&self, cx: &BackendContext, path: &VPath) -> Result<RawFile, BackendError> {
        match self.read(cx, path, 0, usize::MAX).await? {
            ReadResult::Binary { mime_type, data } => Ok(RawFile { mime_type, data }),
            ReadResult::Text { lines, .. } => {
                let mut data = lines.join("\n").into_bytes();
                if !lines.is_empty() {
                    data.push(b'\n');
                }
                Ok(RawFile {
                    mime_type: crate::mime::TEXT_MIME.to_owned(),
                    data,
                })
            }
        }
    }

    /// Creates a text file, creating parent directories. Create-only: when a file exists at
    /// the path it fails with [`BackendError::AlreadyExists`] and changes nothing (a directory
    /// there is [`BackendError::IsDirectory`]). Use [`overwrite`](Self::overwrite) to replace.
    async fn write(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError>;

    /// Creates or replaces a text file, creating parent directories. The built-in backends
    /// replace in one step and keep a replaced file's creation time where they record one.
    ///
    /// The default is [`write`](Self::write), and when that reports
    /// [`AlreadyExists`](BackendError::AlreadyExists), [`delete`](Self::delete) then `write`
    /// again: not atomic (a reader may find the file missing in between, and the file is
    /// created anew), and on a backend that cannot delete it fails with `delete`'s
    /// [`Unsupported`](BackendError::Unsupported) error, the file unchanged. Override it to
    /// replace in one step.
    async fn overwrite(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        match self.write(cx, path, content).await {
            Err(BackendError::AlreadyExists { .. }) => {}
            done => return done,
        }
        let deleted = self.delete(cx, path).await?;
        // The write must see the delete: a state backend only returns updates, so its context
        // is advanced by them before writing again.
        let mut after = cx.clone();
        if !deleted.update.is_empty() {
            let mut state = AgentState::clone(&cx.state);
            for (key, file) in &deleted.update.files {
                match file {
                    Some(file) => state.files.insert(key.clone(), file.clone()),
                    None => state.files.remove(key),
                };
            }
            after.state = Arc::new(state);
        }
        let written = self.write(&after, path, content).await?;
        let mut update = deleted.update;
        update.files.extend(written.update.files);
        Ok(Changed { value: (), update })
    }

    /// Replaces `old` by `new`; `old` must occur exactly once unless `replace_all`. Returns the
    /// number of replacements.
    async fn edit(
        &self,
        cx: &BackendContext,
        path: &VPath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<Changed<usize>, BackendError>;

    /// Deletes a file or a directory tree. Returns how many files were removed. The default
    /// cannot delete.
    async fn delete(
        &self,
        _cx: &BackendContext,
        _path: &VPath,
    ) -> Result<Changed<usize>, BackendError> {
        Err(BackendError::Unsupported {
            operation: "delete",
            backend: self.name(),
        })
    }

    /// Files under `base` matching `pattern` (see [`crate::glob`] for the semantics).
    async fn glob(
        &self,
        cx: &BackendContext,
        pattern: &str,
        base: &VPath,
    ) -> Result<GlobResult, BackendError>;

    /// Lines matching a query.
    async fn grep(
        &self,
        cx: &BackendContext,
        query: &GrepQuery,
    ) -> Result<GrepResult, BackendError>;

    /// Writes files as bytes, creating or replacing each; one answer per file, in input order.
    /// The default writes UTF-8 files with [`overwrite`](Self::overwrite) and refuses other
    /// bytes as `invalid_path`.
    async fn upload_files(
        &self,
        cx: &BackendContext,
        files: Vec<(String, Vec<u8>)>,
    ) -> Changed<Vec<Result<(), FileOpError>>> {
        let mut update = StateUpdate::default();
        let mut answers = Vec::with_capacity(files.len());
        for (raw, bytes) in files {
            let answer = match (VPath::parse(&raw), String::from_utf8(bytes)) {
                (Ok(path), Ok(text)) => match self.overwrite(cx, &path, &text).await {
                    Ok(changed) => {
                        update.files.extend(changed.update.files);
                        Ok(())
                    }
                    Err(error) => Err(error.file_op_code()),
                },
                _ => Err(FileOpError::InvalidPath),
            };
            answers.push(answer);
        }
        Changed {
            value: answers,
            update,
        }
    }

    /// Reads files as bytes; one answer per path, in input order. The default uses
    /// [`read_raw`](Self::read_raw).
    async fn download_files(
        &self,
        cx: &BackendContext,
        paths: Vec<String>,
    ) -> Vec<Result<Vec<u8>, FileOpError>> {
        let mut answers = Vec::with_capacity(paths.len());
        for raw in paths {
            answers.push(match VPath::parse(&raw) {
                Ok(path) => self
                    .read_raw(cx, &path)
                    .await
                    .map(|file| file.data)
                    .map_err(|error| error.file_op_code()),
                Err(_) => Err(FileOpError::InvalidPath),
            });
        }
        answers
    }

    /// The shell of this backend, when it has one.
    fn as_sandbox(&self) -> Option<&dyn Sandbox> {
        None
    }

    /// Where this backend's tree lives on the host, prefix by prefix.
    fn path_mappings(&self) -> Vec<PathMapping> {
        vec![PathMapping {
            prefix: VPath::root(),
            host: None,
        }]
    }
}

/// A backend that can also run shell commands.
#[async_trait]
pub trait Sandbox: Backend {
    /// A stable id of this sandbox (for logs and reconnection).
    fn id(&self) -> &str;

    /// How commands are confined here, when this sandbox can say (a run reports it once).
    fn confinement(&self) -> Option<deepagents_core::event::Confinement> {
        None
    }

    /// Whether commands here see host path `path` (absolute); a confining sandbox hides most
    /// of the host. `true` when this sandbox cannot say.
    fn shows_host_path(&self, path: &std::path::Path) -> bool {
        let _ = path;
        true
    }

    /// Runs `command` through a shell; `timeout` overrides the backend's default. Hands
    /// `on_output` each piece of output as the command produces it (at most as much as the
    /// result may hold); a sandbox that cannot stream hands over its whole output at the end.
    async fn execute_streaming(
        &self,
        cx: &BackendContext,
        command: &str,
        timeout: Option<Duration>,
        on_output: &OutputSink<'_>,
    ) -> Result<ExecuteResult, BackendError>;

    /// [`execute_streaming`](Self::execute_streaming) without a listener.
    async fn execute(
        &self,
        cx: &BackendContext,
        command: &str,
        timeout: Option<Duration>,
    ) -> Result<ExecuteResult, BackendError> {
        self.execute_streaming(cx, command, timeout, &|_, _| {})
            .await
    }
}

/// Receives a running command's output: which stream, and the next piece of text (invalid
/// UTF-8 shown as U+FFFD).
pub type OutputSink<'a> = dyn Fn(OutputStream, &str) + Send + Sync + 'a;
