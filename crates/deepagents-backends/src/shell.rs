//! A filesystem backend that can also run commands through a local shell.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use deepagents_core::event::{Confinement, OutputStream};
use rustix::process::{Pid, Signal};
use tokio::io::AsyncReadExt;

use deepagents_sandbox::{Policy, SharedPolicy};

use crate::delegate::delegate_backend;
use crate::filesystem::FilesystemBackend;
use crate::protocol::{
    BackendContext, BackendError, ExecuteResult, OutputSink, PathMapping, Sandbox,
};

/// Commands are killed after this long unless configured or overridden per call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// The longest timeout a call may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(3_600);

/// Output kept per command unless configured, in bytes.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 100_000;

/// The prefix of every line a command writes to stderr.
pub const STDERR_PREFIX: &str = "[stderr] ";

/// Exit code reported for a command killed at its timeout (as `timeout(1)` does).
pub const TIMEOUT_EXIT_CODE: i32 = 124;

/// A [`FilesystemBackend`] plus command execution through a local shell.
///
/// By itself this is **not** a sandbox: commands run as the host user with the host's view of
/// the disk; only the file operations are confined to the root. Confine the commands with
/// [`LocalShellBackend::with_sandbox`] (bubblewrap and seccomp: the root writable, the system
/// read-only, nothing else visible, no network), or use it unconfined only where the agent is
/// trusted or the whole process is already isolated (a container, a VM).
///
/// Each command runs as `sh -c COMMAND` in the root directory, in a new process group, with
/// stdin closed. On timeout the whole group is killed (background children included) and the
/// result says `timed_out` with exit code 124. The environment is empty, so no host secret
/// leaks into a command: `sh` still finds programs by name through its built-in search path
/// (`/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin` for dash and bash), but
/// exports no `PATH` to them. Add variables with [`LocalShellBackend::with_env`] (set
/// `PATH` there for programs that look it up themselves) or pass the host's through with
/// [`LocalShellBackend::inherit_env`].
///
/// The output is stdout and stderr interleaved by whole lines in arrival order, each stderr line
/// prefixed with `[stderr] `, cut at 100,000 bytes by default with a note saying so. The call
/// returns when the shell has exited and both pipes are closed: a background process that keeps
/// them open holds the call until the timeout (redirect its output to detach it), while one that
/// redirected its output keeps running after the call.
#[derive(Clone, Debug)]
pub struct LocalShellBackend {
    fs: FilesystemBackend,
    id: String,
    shell: PathBuf,
    timeout: Duration,
    max_output_bytes: usize,
    env: BTreeMap<String, String>,
    inherit_env: bool,
    sandbox: Option<SharedPolicy>,
}

impl LocalShellBackend {
    /// A shell over the root of `fs`, with the defaults: `/bin/sh`, 120 s timeout, 100,000
    /// bytes of output, empty environment but for `PATH`.
    pub fn new(fs: FilesystemBackend) -> Self {
        let id = format!("local:{}", fs.root().display());
        Self {
            fs,
            id,
            shell: PathBuf::from("/bin/sh"),
            timeout: DEFAULT_TIMEOUT,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            env: BTreeMap::new(),
            inherit_env: false,
            sandbox: None,
        }
    }

    /// Runs every command confined by `policy` (see [`deepagents_sandbox`]). A machine where
    /// the confinement cannot be applied refuses commands with an error that says how to fix
    /// it; nothing runs unconfined behind the caller's back. Its `root` should be this
    /// backend's root.
    ///
    /// The policy's protected names (`.git`, `.deepagents` and `.agents` by default) become
    /// the file operations' too ([`FilesystemBackend::with_protected`]): commands cannot change
    /// them, so neither can write, edit, delete or upload. Reads stay allowed.
    pub fn with_sandbox(mut self, policy: Policy) -> Self {
        self.fs = self.fs.with_protected(&policy.protected);
        self.sandbox = Some(SharedPolicy::new(policy));
        self
    }

    /// Lets the file operations change `path` although it lies inside a protected name of the
    /// sandbox (see [`FilesystemBackend::with_editable`]); commands still cannot.
    pub fn with_editable(mut self, path: impl AsRef<std::path::Path>) -> Self {
        self.fs = self.fs.with_editable(path);
        self
    }

    /// The policy commands run under, when confined: shared with this backend's clones, so
    /// what [`SharedPolicy::grant`] gives holds for every later command.
    pub fn sandbox(&self) -> Option<&SharedPolicy> {
        self.sandbox.as_ref()
    }

    /// The default timeout of commands (capped at one hour).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.min(MAX_TIMEOUT);
        self
    }

    /// How many bytes of output a command may return before it is cut.
    pub fn with_max_output_bytes(mut self, bytes: usize) -> Self {
        self.max_output_bytes = bytes;
        self
    }

    /// Sets an environment variable of every command (it wins over inherited ones).
    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Whether commands inherit this process's environment (default `false`). Confined
    /// commands inherit only `PATH`, `LANG`, `LC_ALL`, `LC_CTYPE`, `TERM`, `TZ` and `USER`.
    pub fn inherit_env(mut self, yes: bool) -> Self {
        self.inherit_env = yes;
        self
    }

    /// The shell run as `SHELL -c COMMAND` (default `/bin/sh`).
    pub fn with_shell(mut self, shell: impl Into<PathBuf>) -> Self {
        self.shell = shell.into();
        self
    }

    /// Sets the sandbox id (default `local:<root>`).
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// The filesystem backend this shell runs in.
    pub fn filesystem(&self) -> &FilesystemBackend {
        &self.fs
    }

    /// The process that runs `command`: the shell itself, or the shell inside the sandbox
    /// (with the sandbox's guard to keep until the command has ended).
    fn command(
        &self,
        command: &str,
    ) -> Result<(tokio::process::Command, Option<deepagents_sandbox::Guard>), BackendError> {
        let Some(policy) = self.sandbox.as_ref().map(SharedPolicy::get) else {
            let mut cmd = tokio::process::Command::new(&self.shell);
            cmd.arg("-c").arg(command).current_dir(self.fs.root());
            if !self.inherit_env {
                cmd.env_clear();
            }
            cmd.envs(&self.env);
            return Ok((cmd, None));
        };
        // Confined, inheriting means only the allowed host variables.
        let mut env: BTreeMap<String, String> = if self.inherit_env {
            deepagents_sandbox::allowed_host_env().into_iter().collect()
        } else {
            BTreeMap::new()
        };
        env.extend(self.env.iter().map(|(k, v)| (k.clone(), v.clone())));
        let env: Vec<(String, String)> = env.into_iter().collect();
        let confined = policy
            .command(&self.shell, command, &env)
            .map_err(|e| self.io_error(e.to_string()))?;
        let (process, guard) = confined.into_parts();
        Ok((tokio::process::Command::from(process), Some(guard)))
    }

    fn io_error(&self, message: String) -> BackendError {
        BackendError::Io {
            operation: "execute",
            path: "/".to_owned(),
            message,
        }
    }
}

/// Ends a process group when dropped unless disarmed: a cancelled `execute` must not leave
/// its commands running.
struct GroupGuard {
    pid: Option<Pid>,
    /// SIGKILL for a plain shell; SIGTERM for a confined one, whose sandbox (bubblewrap, or
    /// the Landlock helper) then ends everything the command started, detached processes
    /// and temporary files included, which a SIGKILL would not let it do.
    signal: Signal,
}

impl GroupGuard {
    fn kill(&mut self) {
        if let Some(pid) = self.pid.take() {
            // ESRCH (already gone) is the expected outcome for a finished group.
            let _ = rustix::process::kill_process_group(pid, self.signal);
        }
    }
}

/// How long a confined command's sandbox gets to end it after SIGTERM before SIGKILL.
const SANDBOX_GRACE: Duration = Duration::from_secs(2);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stream {
    Out,
    Err,
}

/// Combined output: whole lines in arrival order, stderr lines marked, cut at a byte limit.
struct Output {
    text: Vec<u8>,
    max: usize,
    truncated: bool,
    pending: [Vec<u8>; 2],
}

impl Output {
    fn new(max: usize) -> Self {
        Self {
            text: Vec::new(),
            max,
            truncated: false,
            pending: [Vec::new(), Vec::new()],
        }
    }

    fn slot(stream: Stream) -> usize {
        match stream {
            Stream::Out => 0,
            Stream::Err => 1,
        }
    }

    fn push(&mut self, stream: Stream, bytes: &[u8]) {
        let slot = Self::slot(stream);
        self.pending[slot].extend_from_slice(bytes);
        while let Some(end) = self.pending[slot].iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending[slot].drain(..=end).collect();
            self.emit(stream, &line);
        }
        // A line longer than the whole budget can be let through in parts.
        if self.pending[slot].len() > self.max {
            self.flush(stream);
        }
    }

    fn flush(&mut self, stream: Stream) {
        let slot = Self::slot(stream);
        if !self.pending[slot].is_empty() {
            let rest = std::mem::take(&mut self.pending[slot]);
            self.emit(stream, &rest);
        }
    }

    fn emit(&mut self, stream: Stream, line: &[u8]) {
        if self.truncated {
            return;
        }
        if stream == Stream::Err {
            self.text.extend_from_slice(STDERR_PREFIX.as_bytes());
        }
        self.text.extend_from_slice(line);
        if self.text.len() > self.max {
            self.text.truncate(self.max);
            self.truncated = true;
        }
    }

    fn finish(mut self) -> (String, bool) {
        self.flush(Stream::Out);
        self.flush(Stream::Err);
        // Cutting may split a character; drop the partial one rather than show garbage.
        let valid = match std::str::from_utf8(&self.text) {
            Ok(_) => self.text.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.text.len(),
        };
        self.text.truncate(valid);
        // No note is added when cut: `truncated` says so, and the `execute` tool writes the
        // one note the model sees (a second one here would repeat it).
        let output = String::from_utf8_lossy(&self.text).into_owned();
        (output, self.truncated)
    }
}

/// Output handed to a listener while the command runs: decoded as UTF-8 without splitting a
/// character across pieces, and no more in total than the result may hold.
struct LiveOutput<'a> {
    sink: &'a OutputSink<'a>,
    budget: usize,
    partial: [Vec<u8>; 2],
}

impl<'a> LiveOutput<'a> {
    fn new(budget: usize, sink: &'a OutputSink<'a>) -> Self {
        Self {
            sink,
            budget,
            partial: [Vec::new(), Vec::new()],
        }
    }

    fn push(&mut self, stream: Stream, bytes: &[u8]) {
        if self.budget == 0 {
            return;
        }
        let bytes = &bytes[..bytes.len().min(self.budget)];
        self.budget -= bytes.len();
        let slot = Output::slot(stream);
        self.partial[slot].extend_from_slice(bytes);
        // Hold back an incomplete character at the end until its other bytes arrive.
        let complete = match std::str::from_utf8(&self.partial[slot]) {
            Ok(_) => self.partial[slot].len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.partial[slot].len(),
        };
        if complete > 0 {
            let ready: Vec<u8> = self.partial[slot].drain(..complete).collect();
            self.send(stream, &ready);
        }
    }

    fn finish(&mut self, stream: Stream) {
        let rest = std::mem::take(&mut self.partial[Output::slot(stream)]);
        if !rest.is_empty() {
            self.send(stream, &rest);
        }
    }

    fn send(&self, stream: Stream, bytes: &[u8]) {
        let stream = match stream {
            Stream::Out => OutputStream::Stdout,
            Stream::Err => OutputStream::Stderr,
        };
        (self.sink)(stream, &String::from_utf8_lossy(bytes));
    }
}

#[async_trait]
impl Sandbox for LocalShellBackend {
    fn id(&self) -> &str {
        &self.id
    }

    fn shows_host_path(&self, path: &std::path::Path) -> bool {
        self.sandbox
            .as_ref()
            .is_none_or(|policy| policy.get().shows(path))
    }

    fn confinement(&self) -> Option<Confinement> {
        let Some(policy) = self.sandbox.as_ref().map(SharedPolicy::get) else {
            return Some(Confinement {
                engine: "none".to_owned(),
                network: "on".to_owned(),
                unenforced: vec![
                    "commands run unconfined, with the rights of this process".to_owned(),
                ],
            });
        };
        let network = policy.network.describe();
        Some(match policy.resolve_engine() {
            Ok(engine) => Confinement {
                engine: engine.name().to_owned(),
                network,
                unenforced: deepagents_sandbox::limitations(engine, &policy),
            },
            Err(e) => Confinement {
                engine: "unavailable".to_owned(),
                network,
                unenforced: vec![format!("commands are refused: {e}")],
            },
        })
    }

    async fn execute_streaming(
        &self,
        _cx: &BackendContext,
        command: &str,
        timeout: Option<Duration>,
        on_output: &OutputSink<'_>,
    ) -> Result<ExecuteResult, BackendError> {
        let timeout = timeout.unwrap_or(self.timeout);
        if timeout.is_zero() {
            return Err(BackendError::InvalidQuery {
                what: "timeout",
                message: "the timeout must be positive; omit it for the default".to_owned(),
            });
        }
        let timeout = timeout.min(MAX_TIMEOUT);
        // Dropped last: it ends whatever the command left and stops its network proxy.
        let (mut cmd, mut sandbox) = self.command(command)?;
        // A confined command is ended through its sandbox (GroupGuard's SIGTERM), never
        // SIGKILLed on drop before the sandbox could clean up.
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(sandbox.is_none());
        let spawned = cmd.spawn();
        if let Some(sandbox) = &mut sandbox {
            sandbox.spawned();
        }
        let mut child = spawned
            .map_err(|e| self.io_error(format!("cannot start {}: {e}", self.shell.display())))?;
        let mut guard = GroupGuard {
            pid: child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .and_then(Pid::from_raw),
            signal: if sandbox.is_some() {
                Signal::TERM
            } else {
                Signal::KILL
            },
        };
        let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take())
        else {
            return Err(self.io_error("the command's output pipes are missing".to_owned()));
        };
        let mut output = Output::new(self.max_output_bytes);
        let mut live = LiveOutput::new(self.max_output_bytes, on_output);
        let run = async {
            let (mut out_buf, mut err_buf) = (vec![0; 16 * 1024], vec![0; 16 * 1024]);
            let (mut out_open, mut err_open) = (true, true);
            // Read until both pipes close: background children that keep them open are part of
            // the command (redirect their output to let the call end without them).
            while out_open || err_open {
                tokio::select! {
                    read = stdout.read(&mut out_buf), if out_open => match read {
                        Ok(0) | Err(_) => {
                            out_open = false;
                            output.flush(Stream::Out);
                            live.finish(Stream::Out);
                        }
                        Ok(n) => {
                            output.push(Stream::Out, &out_buf[..n]);
                            live.push(Stream::Out, &out_buf[..n]);
                        }
                    },
                    read = stderr.read(&mut err_buf), if err_open => match read {
                        Ok(0) | Err(_) => {
                            err_open = false;
                            output.flush(Stream::Err);
                            live.finish(Stream::Err);
                        }
                        Ok(n) => {
                            output.push(Stream::Err, &err_buf[..n]);
                            live.push(Stream::Err, &err_buf[..n]);
                        }
                    },
                }
            }
            child.wait().await
        };
        let outcome = tokio::time::timeout(timeout, run).await;
        match outcome {
            Ok(Ok(status)) => {
                // The group may live on in processes that detached from the pipes (servers
                // started with `&` and redirected output): they are the user's to keep.
                guard.pid = None;
                let (mut output, truncated) = output.finish();
                note_refused_hosts(&mut output, sandbox.as_ref());
                Ok(ExecuteResult {
                    output,
                    exit_code: status.code(),
                    truncated,
                    timed_out: false,
                })
            }
            Ok(Err(e)) => Err(self.io_error(format!("waiting for the command failed: {e}"))),
            Err(_) => {
                guard.kill();
                if tokio::time::timeout(SANDBOX_GRACE, child.wait())
                    .await
                    .is_err()
                {
                    // Reap the shell so no zombie is left (SIGKILL first if it is still there).
                    let _ = child.kill().await;
                }
                let (mut output, truncated) = output.finish();
                note_refused_hosts(&mut output, sandbox.as_ref());
                Ok(ExecuteResult {
                    output,
                    exit_code: Some(TIMEOUT_EXIT_CODE),
                    truncated,
                    timed_out: true,
                })
            }
        }
    }
}

/// Tells the model which hosts the sandbox's proxy refused, so it does not mistake the
/// refusal for a network failure.
fn note_refused_hosts(output: &mut String, sandbox: Option<&deepagents_sandbox::Guard>) {
    let refused = sandbox
        .map(deepagents_sandbox::Guard::refused_hosts)
        .unwrap_or_default();
    if refused.is_empty() {
        return;
    }
    if !output.is_empty() && !output.ends_with('\n') {
        output.push('\n');
    }
    output.push_str(&format!(
        "[sandbox] network access refused to {}: not in the allowed domains",
        refused.join(", ")
    ));
}

delegate_backend! {
    impl Backend for LocalShellBackend {
        forward [
            ls, read, read_raw, write, overwrite, edit, delete, glob, grep, upload_files,
            download_files,
        ] to |self, cx| self.fs;

        fn name(&self) -> &'static str {
            "local_shell"
        }

        fn as_sandbox(&self) -> Option<&dyn Sandbox> {
            Some(self)
        }

        fn path_mappings(&self) -> Vec<PathMapping> {
            self.fs.path_mappings()
        }
    }
}
