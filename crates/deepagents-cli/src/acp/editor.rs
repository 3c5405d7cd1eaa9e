//! The editor's side of an ACP session, used when its `initialize` offers it: text files read
//! and written through its buffers (`fs/read_text_file`, `fs/write_text_file`), so the agent
//! sees unsaved changes and its edits land in the open buffers, and `execute` run in its
//! terminal (`terminal/*`), shown live in the tool call.
//!
//! It is a layer around the workspace's disk backend ([`DiskLayer`]), beneath the permission
//! rules and the mounts, so only paths they let through reach it. Before the editor is asked
//! about a path, the disk checks it as a read or a write of its own would (confinement to the
//! root, symlinks followed only inside it, protected names) and gives the real host path,
//! which is what the editor gets. Listing, searching, deleting and binary files stay on disk.
//!
//! The terminal runs commands unconfined, in the editor's environment: it is used only when
//! commands are unconfined anyway (`--sandbox off`, where each asks for approval unless
//! allowed); with a sandbox, commands stay in it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::v1::schema as acp;
use agent_client_protocol::{Error as AcpError, JsonRpcRequest};
use async_trait::async_trait;
use deepagents::backends::{
    Backend, BackendContext, BackendError, Changed, DEFAULT_MAX_FILE_SIZE, ExecuteResult, FileInfo,
    FileOpError, FilesystemBackend, GlobResult, GrepQuery, GrepResult, OutputSink, PathMapping,
    RawFile, ReadResult, Sandbox, VPath, mime, text,
};

use super::{Cx, lock};
use crate::workspace::{Disk, DiskLayer};

/// A command's timeout when neither the call nor `[shell] timeout` sets one (as the local
/// shell's).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
/// The longest timeout a call may ask for (as the local shell's).
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);
/// Output kept of a command unless `[shell] max_output` says otherwise (as the local shell's).
const DEFAULT_MAX_OUTPUT: usize = 100_000;
/// How long a command waits for its call to be announced to the editor before its terminal
/// is shown there: the announcement is on its way when the command starts, so this is only a
/// bound on a stuck front end.
const ANNOUNCE_WAIT: Duration = Duration::from_secs(5);

/// One session's connection to the editor and what the editor offers.
pub(super) struct Link {
    cx: Cx,
    session: acp::SessionId,
    /// `fs/read_text_file` is offered.
    read: bool,
    /// `fs/write_text_file` is offered.
    write: bool,
    /// `terminal/*` is offered.
    terminal: bool,
    /// The calls the session's turns announced, and the terminals commands run in.
    pub(super) calls: Arc<Calls>,
}

impl Link {
    /// The link of session `session`, with what the editor's `capabilities` offer.
    pub(super) fn new(cx: Cx, session: &str, capabilities: &acp::ClientCapabilities) -> Self {
        Self {
            cx,
            session: acp::SessionId::new(session.to_owned()),
            read: capabilities.fs.read_text_file,
            write: capabilities.fs.write_text_file,
            terminal: capabilities.terminal,
            calls: Arc::new(Calls::default()),
        }
    }

    /// Whether the editor offers anything the workspace would use.
    pub(super) fn offers_anything(&self) -> bool {
        self.read || self.write || self.terminal
    }

    /// Sends a request to the editor and waits for its answer. Only from tasks outside the
    /// connection's dispatch loop (the turns', which run the tools).
    async fn ask<R: JsonRpcRequest>(&self, request: R) -> Result<R::Response, AcpError> {
        self.cx.send_request(request).block_task().await
    }

    /// The text of the editor's buffer of `host` (the file on disk when it has none open).
    async fn read_text(&self, host: &Path, shown: &str) -> Result<String, BackendError> {
        let request = acp::ReadTextFileRequest::new(self.session.clone(), host.to_owned());
        self.ask(request)
            .await
            .map(|response| response.content)
            .map_err(|error| editor_error("read", shown, "read", &error))
    }

    /// Puts `content` in the editor's buffer of `host`, which the editor saves or not.
    async fn write_text(
        &self,
        host: &Path,
        shown: &str,
        content: &str,
    ) -> Result<(), BackendError> {
        let request =
            acp::WriteTextFileRequest::new(self.session.clone(), host.to_owned(), content);
        self.ask(request)
            .await
            .map(|_| ())
            .map_err(|error| editor_error("write", shown, "write", &error))
    }
}

/// An error the editor answered with, as the model sees it.
fn editor_error(
    operation: &'static str,
    shown: &str,
    verb: &str,
    error: &AcpError,
) -> BackendError {
    BackendError::Io {
        operation,
        path: shown.to_owned(),
        message: format!(
            "the editor could not {verb} it: {} (the file goes through the editor's buffers in this session)",
            error.message
        ),
    }
}

/// The tool calls of a session's turns as the editor knows them, shared by the turn that
/// announces them and the commands that show their terminal in them.
#[derive(Default)]
pub(super) struct Calls {
    state: Mutex<CallsState>,
    /// Wakes commands waiting for their call to be announced.
    announced: tokio::sync::Notify,
}

#[derive(Default)]
struct CallsState {
    /// Calls started and not finished: whether the editor was told of each (the main
    /// agent's; a subagent's stay inside its `task` call).
    started: HashMap<String, bool>,
    /// The terminal each call's command runs in.
    terminals: HashMap<String, acp::TerminalId>,
}

impl Calls {
    /// A call started; `shown` when the editor was told of it.
    pub(super) fn started(&self, call: &str, shown: bool) {
        lock(&self.state).started.insert(call.to_owned(), shown);
        self.announced.notify_waiters();
    }

    /// A call finished: the terminal its command ran in, if it had one.
    pub(super) fn finished(&self, call: &str) -> Option<acp::TerminalId> {
        let mut state = lock(&self.state);
        state.started.remove(call);
        state.terminals.remove(call)
    }

    /// The terminal a call's command runs in.
    pub(super) fn terminal(&self, call: &str) -> Option<acp::TerminalId> {
        lock(&self.state).terminals.get(call).cloned()
    }

    /// Waits until `call` has started; whether the editor was told of it (`None` when it was
    /// not announced in time).
    async fn shown(&self, call: &str) -> Option<bool> {
        let deadline = tokio::time::Instant::now() + ANNOUNCE_WAIT;
        loop {
            let notified = self.announced.notified();
            tokio::pin!(notified);
            // Registered before looking, so an announcement in between is not missed.
            notified.as_mut().enable();
            if let Some(shown) = lock(&self.state).started.get(call) {
                return Some(*shown);
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return None;
            }
        }
    }
}

/// The editor as a [`DiskLayer`]: the workspace's disk wrapped in [`EditorBackend`].
pub(super) struct Layer(pub(super) Arc<Link>);

impl DiskLayer for Layer {
    fn wrap(&self, disk: Disk) -> Arc<dyn Backend> {
        let link = self.0.clone();
        // Commands go to the editor's terminal only where they would run unconfined anyway.
        let terminal = (link.terminal && !disk.confined && disk.backend.as_sandbox().is_some())
            .then(|| Terminal {
                cwd: disk.fs.root().to_owned(),
                timeout: disk.timeout.unwrap_or(DEFAULT_TIMEOUT),
                max_output: disk.max_output.unwrap_or(DEFAULT_MAX_OUTPUT),
                env: disk.env,
            });
        Arc::new(EditorBackend {
            inner: disk.backend,
            fs: disk.fs,
            link,
            terminal,
        })
    }
}

/// How commands run in the editor's terminal.
struct Terminal {
    /// The session's root.
    cwd: PathBuf,
    timeout: Duration,
    max_output: usize,
    /// `[shell] env`.
    env: Vec<(String, String)>,
}

/// The workspace's disk with text files read and written through the editor, and commands
/// run in its terminal, as far as the editor offers.
struct EditorBackend {
    /// The disk backend: everything the editor does not do.
    inner: Arc<dyn Backend>,
    /// The filesystem under it: the checks and host paths of what the editor is asked.
    fs: FilesystemBackend,
    link: Arc<Link>,
    /// Set when commands run in the editor's terminal.
    terminal: Option<Terminal>,
}

impl EditorBackend {
    /// Whether the file at `path` is text (so the editor can hold it); the disk's errors
    /// (confinement, missing, a directory) as they are.
    async fn is_text(&self, cx: &BackendContext, path: &VPath) -> Result<bool, BackendError> {
        Ok(matches!(
            self.inner.read(cx, path, 0, 1).await?,
            ReadResult::Text { .. }
        ))
    }

    /// The current text of the file at `path`: the editor's, when it reads files.
    async fn current_text(
        &self,
        cx: &BackendContext,
        path: &VPath,
    ) -> Result<String, BackendError> {
        let shown = path.as_str();
        if self.link.read {
            let host = self.fs.host_path(path, false).await?;
            return self.link.read_text(&host, shown).await;
        }
        let raw = self.inner.read_raw(cx, path).await?;
        if let Some(mime_type) = mime::binary_type(shown, &raw.data) {
            return Err(BackendError::Binary {
                path: shown.to_owned(),
                mime_type: mime_type.to_owned(),
            });
        }
        String::from_utf8(raw.data).map_err(|_| BackendError::NotUtf8 {
            path: shown.to_owned(),
            reason: "the editor takes text only; change it with execute".to_owned(),
        })
    }

    /// Puts `content` at `path` through the editor, after the checks a write makes; with
    /// `create_only`, a file there is [`BackendError::AlreadyExists`].
    async fn put(
        &self,
        path: &VPath,
        content: &str,
        create_only: bool,
    ) -> Result<(), BackendError> {
        let shown = path.as_str();
        let host = self.fs.host_path(path, true).await?;
        if create_only && std::fs::symlink_metadata(&host).is_ok() {
            return Err(BackendError::AlreadyExists {
                path: shown.to_owned(),
            });
        }
        let size = u64::try_from(content.len()).unwrap_or(u64::MAX);
        if size > DEFAULT_MAX_FILE_SIZE {
            return Err(BackendError::TooLargeToWrite {
                path: shown.to_owned(),
                size,
                max: DEFAULT_MAX_FILE_SIZE,
            });
        }
        self.link.write_text(&host, shown, content).await
    }
}

#[async_trait]
impl Backend for EditorBackend {
    fn name(&self) -> &'static str {
        "editor"
    }

    async fn ls(&self, cx: &BackendContext, path: &VPath) -> Result<Vec<FileInfo>, BackendError> {
        self.inner.ls(cx, path).await
    }

    async fn read(
        &self,
        cx: &BackendContext,
        path: &VPath,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError> {
        // A binary file is no buffer's: the disk reads it.
        if !self.link.read || !self.is_text(cx, path).await? {
            return self.inner.read(cx, path, offset, limit).await;
        }
        let text = self.current_text(cx, path).await?;
        Ok(text::page(&text, offset, limit))
    }

    async fn read_raw(&self, cx: &BackendContext, path: &VPath) -> Result<RawFile, BackendError> {
        let raw = self.inner.read_raw(cx, path).await?;
        if !self.link.read || !mime::is_text_mime(&raw.mime_type) {
            return Ok(raw);
        }
        let text = self.current_text(cx, path).await?;
        Ok(RawFile {
            mime_type: mime::mime_type(path.as_str(), text.as_bytes()),
            data: text.into_bytes(),
        })
    }

    async fn write(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        if !self.link.write {
            return self.inner.write(cx, path, content).await;
        }
        self.put(path, content, true).await?;
        Ok(Changed::outside_state(()))
    }

    async fn overwrite(
        &self,
        cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        if !self.link.write {
            return self.inner.overwrite(cx, path, content).await;
        }
        self.put(path, content, false).await?;
        Ok(Changed::outside_state(()))
    }

    async fn edit(
        &self,
        cx: &BackendContext,
        path: &VPath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<Changed<usize>, BackendError> {
        if !self.link.write {
            return self.inner.edit(cx, path, old, new, replace_all).await;
        }
        let shown = path.as_str();
        // Checked as a change before anything is read, so a refused edit asks the editor
        // nothing.
        self.fs.host_path(path, true).await?;
        if !self.is_text(cx, path).await? {
            let raw = self.inner.read_raw(cx, path).await?;
            return Err(BackendError::Binary {
                path: shown.to_owned(),
                mime_type: raw.mime_type,
            });
        }
        let current = self.current_text(cx, path).await?;
        let (updated, count) = text::replace(shown, &current, old, new, replace_all)?;
        self.put(path, &updated, false).await?;
        Ok(Changed::outside_state(count))
    }

    async fn delete(
        &self,
        cx: &BackendContext,
        path: &VPath,
    ) -> Result<Changed<usize>, BackendError> {
        self.inner.delete(cx, path).await
    }

    async fn glob(
        &self,
        cx: &BackendContext,
        pattern: &str,
        base: &VPath,
    ) -> Result<GlobResult, BackendError> {
        self.inner.glob(cx, pattern, base).await
    }

    async fn grep(
        &self,
        cx: &BackendContext,
        query: &GrepQuery,
    ) -> Result<GrepResult, BackendError> {
        self.inner.grep(cx, query).await
    }

    // Uploads and downloads are the application's, not the agent's: bytes on disk.
    async fn upload_files(
        &self,
        cx: &BackendContext,
        files: Vec<(String, Vec<u8>)>,
    ) -> Changed<Vec<Result<(), FileOpError>>> {
        self.inner.upload_files(cx, files).await
    }

    async fn download_files(
        &self,
        cx: &BackendContext,
        paths: Vec<String>,
    ) -> Vec<Result<Vec<u8>, FileOpError>> {
        self.inner.download_files(cx, paths).await
    }

    fn as_sandbox(&self) -> Option<&dyn Sandbox> {
        self.inner.as_sandbox().map(|_| self as &dyn Sandbox)
    }

    fn path_mappings(&self) -> Vec<PathMapping> {
        self.inner.path_mappings()
    }
}

#[async_trait]
impl Sandbox for EditorBackend {
    fn id(&self) -> &str {
        self.inner.as_sandbox().map_or("editor", |shell| shell.id())
    }

    fn confinement(&self) -> Option<deepagents::core::event::Confinement> {
        match &self.terminal {
            Some(_) => None,
            None => self
                .inner
                .as_sandbox()
                .and_then(|shell| shell.confinement()),
        }
    }

    fn shows_host_path(&self, path: &Path) -> bool {
        self.inner
            .as_sandbox()
            .is_none_or(|shell| shell.shows_host_path(path))
    }

    async fn execute_streaming(
        &self,
        cx: &BackendContext,
        command: &str,
        timeout: Option<Duration>,
        on_output: &OutputSink<'_>,
    ) -> Result<ExecuteResult, BackendError> {
        if let Some(terminal) = &self.terminal {
            return self.run_in_terminal(terminal, cx, command, timeout).await;
        }
        match self.inner.as_sandbox() {
            Some(shell) => {
                shell
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

impl EditorBackend {
    /// Runs `command` in a terminal of the editor, in the root, shown in its call; the
    /// terminal is killed when the call is dropped (the run cancelled) or the timeout passes,
    /// and released once its output is read.
    async fn run_in_terminal(
        &self,
        terminal: &Terminal,
        cx: &BackendContext,
        command: &str,
        timeout: Option<Duration>,
    ) -> Result<ExecuteResult, BackendError> {
        let timeout = timeout.unwrap_or(terminal.timeout);
        if timeout.is_zero() {
            return Err(BackendError::InvalidQuery {
                what: "timeout",
                message: "the timeout must be positive; omit it for the default".to_owned(),
            });
        }
        let timeout = timeout.min(MAX_TIMEOUT);
        let link = &self.link;
        let failed = |error: AcpError| BackendError::Io {
            operation: "execute",
            path: "/".to_owned(),
            message: format!("the editor's terminal failed: {}", error.message),
        };
        // `sh -c`, as the local shell runs commands, whatever the editor's own shell is.
        let create = acp::CreateTerminalRequest::new(link.session.clone(), "/bin/sh")
            .args(vec!["-c".to_owned(), command.to_owned()])
            .env(
                terminal
                    .env
                    .iter()
                    .map(|(name, value)| acp::EnvVariable::new(name.clone(), value.clone()))
                    .collect(),
            )
            .cwd(terminal.cwd.clone())
            .output_byte_limit(u64::try_from(terminal.max_output).unwrap_or(u64::MAX));
        let id = link.ask(create).await.map_err(failed)?.terminal_id;
        let mut guard = TerminalGuard {
            link: link.clone(),
            id: Some(id.clone()),
        };
        // Shown in the call before anything else happens to it: the editor must have it
        // before it is released.
        if let Some(call) = &cx.call_id {
            lock(&link.calls.state)
                .terminals
                .insert(call.clone(), id.clone());
            if link.calls.shown(call).await == Some(true) {
                let fields =
                    acp::ToolCallUpdateFields::new().content(vec![acp::ToolCallContent::Terminal(
                        acp::Terminal::new(id.clone()),
                    )]);
                let update = acp::ToolCallUpdate::new(call.clone(), fields);
                // A closed connection fails the wait below.
                let _ = link.cx.send_notification(acp::SessionNotification::new(
                    link.session.clone(),
                    acp::SessionUpdate::ToolCallUpdate(update),
                ));
            }
        }
        let wait = acp::WaitForTerminalExitRequest::new(link.session.clone(), id.clone());
        let exit = match tokio::time::timeout(timeout, link.ask(wait)).await {
            Ok(exit) => Some(exit.map_err(failed)?.exit_status),
            Err(_) => {
                let kill = acp::KillTerminalRequest::new(link.session.clone(), id.clone());
                link.ask(kill).await.map_err(failed)?;
                None
            }
        };
        let output = acp::TerminalOutputRequest::new(link.session.clone(), id.clone());
        let output = link.ask(output).await.map_err(failed)?;
        guard.release().await;
        let status = exit.clone().or(output.exit_status);
        let mut text = output.output;
        // The editor keeps the end of a long output, where the local shell keeps the start:
        // said here, so the execute tool's note (about the start) does not apply.
        if output.truncated {
            text.insert_str(
                0,
                &format!(
                    "[Output cut: only its last {} bytes are shown. To see all of it, redirect it to a file (`COMMAND > out.txt 2>&1`) and read or grep that file.]\n",
                    terminal.max_output
                ),
            );
        }
        Ok(ExecuteResult {
            output: text,
            exit_code: status
                .and_then(|status| status.exit_code)
                .map(|code| i32::try_from(code).unwrap_or(i32::MAX)),
            truncated: false,
            timed_out: exit.is_none(),
        })
    }
}

/// A terminal of the editor's that must be released: when dropped before [`release`]
/// (the call was dropped, the run cancelled), it is killed then released on a task of its
/// own, so the command does not outlive the call.
///
/// [`release`]: TerminalGuard::release
struct TerminalGuard {
    link: Arc<Link>,
    id: Option<acp::TerminalId>,
}

impl TerminalGuard {
    /// Releases the terminal (the editor keeps showing its output).
    async fn release(&mut self) {
        if let Some(id) = self.id.take() {
            let release = acp::ReleaseTerminalRequest::new(self.link.session.clone(), id);
            // Released or not, the command is over: the editor frees it when the session ends.
            let _ = self.link.ask(release).await;
        }
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let link = self.link.clone();
        runtime.spawn(async move {
            let kill = acp::KillTerminalRequest::new(link.session.clone(), id.clone());
            let _ = link.ask(kill).await;
            let release = acp::ReleaseTerminalRequest::new(link.session.clone(), id);
            let _ = link.ask(release).await;
        });
    }
}
