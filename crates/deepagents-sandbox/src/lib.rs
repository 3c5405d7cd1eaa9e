//! Runs shell commands confined, on Linux, without a remote service.
//!
//! A [`Policy`] says what a command may see: its root (the workspace) read-write or read-only,
//! the system directories read-only, a few extra paths, and nothing else of the host — no home
//! directories, no other projects, no host `/tmp`. Protected names inside the root (`.git`,
//! `.deepagents`, `.agents` by default) stay read-only, and paths the agent may not read are
//! hidden. The network is off unless the policy turns it on.
//!
//! [`Policy::command`] prepares a [`std::process::Command`] that runs `SHELL -c COMMAND` under
//! [bubblewrap](https://github.com/containers/bubblewrap) (`bwrap`, found on `PATH`): new
//! user, mount, PID, IPC, UTS, cgroup and (unless allowed) network namespaces, the policy's
//! mounts, an empty environment but for what the caller passes, the command as a child of a
//! PID namespace that dies with it (so daemonized children are killed too), and a seccomp
//! filter ([`seccomp`]) that refuses `ptrace`, mounts, new namespaces, `bpf`, `io_uring`,
//! the kernel keyring, `perf_event_open`, module and kexec calls and, with the network off,
//! sockets other than Unix ones.
//!
//! [`check`] reports which layers work on this machine. Nothing here falls back silently: a
//! missing `bwrap` or unusable user namespaces is an error that says how to fix it.

mod bwrap;
pub mod seccomp;

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

pub use bwrap::find_bwrap;

/// Whether the root is writable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RootAccess {
    /// The root is read-write (protected names inside it stay read-only).
    #[default]
    Write,
    /// The root is read-only too.
    Read,
}

/// Whether commands reach the network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Network {
    /// A network namespace of its own with only a loopback device, and no sockets but Unix ones.
    #[default]
    Off,
    /// The host's network, unfiltered.
    On,
}

/// The system directories a command sees read-only by default (those that exist).
pub const SYSTEM_PATHS: [&str; 8] = [
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc", "/opt",
];

/// Host variables worth passing to a confined command that should keep some of the host's
/// environment: what programs need to behave, none of the host's credentials.
pub const HOST_ENV_ALLOWED: [&str; 7] =
    ["PATH", "LANG", "LC_ALL", "LC_CTYPE", "TERM", "TZ", "USER"];

/// The host's values of [`HOST_ENV_ALLOWED`] that are set.
pub fn allowed_host_env() -> Vec<(String, String)> {
    HOST_ENV_ALLOWED
        .iter()
        .filter_map(|name| Some(((*name).to_owned(), std::env::var(name).ok()?)))
        .collect()
}

/// Names inside the root that stay read-only by default.
pub const PROTECTED_NAMES: [&str; 3] = [".git", ".deepagents", ".agents"];

/// What a confined command may see and do.
#[derive(Clone, Debug)]
pub struct Policy {
    /// The workspace: the command's working directory, visible at the same path.
    pub root: PathBuf,
    /// Whether the root is writable.
    pub root_access: RootAccess,
    /// Host directories visible read-only at the same path (missing ones are skipped).
    pub system: Vec<PathBuf>,
    /// More host paths visible read-only.
    pub extra_read: Vec<PathBuf>,
    /// More host paths visible read-write.
    pub extra_write: Vec<PathBuf>,
    /// Names (relative paths) inside the root that stay read-only; a `.git` file's `gitdir:`
    /// target is protected with it.
    pub protected: Vec<PathBuf>,
    /// Paths inside the root the command may not read: hidden behind an empty file or
    /// directory.
    pub hidden: Vec<PathBuf>,
    /// Paths inside the root the command may read but not change.
    pub read_only: Vec<PathBuf>,
    /// Network access.
    pub network: Network,
    /// Resource limits of the command and everything it starts.
    pub limits: Limits,
}

/// Resource limits (`setrlimit`) of a confined command and its descendants; `None` leaves the
/// host's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// The largest file a command may write, in bytes (`RLIMIT_FSIZE`; a write past it fails
    /// and the writer gets `SIGXFSZ`).
    pub max_file_size: Option<u64>,
    /// CPU seconds each process may use (`RLIMIT_CPU`).
    pub max_cpu_seconds: Option<u64>,
}

impl Policy {
    /// The default policy for `root`: root read-write, the system read-only, protected names
    /// read-only, no network.
    pub fn workspace_write(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            root_access: RootAccess::Write,
            system: SYSTEM_PATHS.iter().map(PathBuf::from).collect(),
            extra_read: Vec::new(),
            extra_write: Vec::new(),
            protected: PROTECTED_NAMES.iter().map(PathBuf::from).collect(),
            hidden: Vec::new(),
            read_only: Vec::new(),
            network: Network::Off,
            limits: Limits::default(),
        }
    }

    /// Like [`workspace_write`](Self::workspace_write) with the root read-only.
    pub fn read_only(root: impl Into<PathBuf>) -> Self {
        Self {
            root_access: RootAccess::Read,
            ..Self::workspace_write(root)
        }
    }

    /// A command that runs `shell -c command` in the root under this policy, with exactly the
    /// environment `env` (without `PATH`, `sh` finds programs through its built-in search
    /// path but exports none). Keep the returned
    /// [`Confined`] alive until the command is spawned: it holds the seccomp filter the
    /// child reads at start.
    pub fn command(
        &self,
        shell: &Path,
        command: &str,
        env: &[(String, String)],
    ) -> Result<Confined, SandboxError> {
        let bwrap = find_bwrap()?;
        let filters = seccomp::filter_fds(self.network)?;
        let args = bwrap::arguments(self, &filters, shell, command, env)?;
        let mut process = std::process::Command::new(bwrap);
        process.args(&args).env_clear().current_dir(&self.root);
        Ok(Confined {
            process,
            filters,
            arguments: args,
        })
    }
}

/// A command prepared to run confined.
#[derive(Debug)]
pub struct Confined {
    /// The process to spawn (stdin, stdout and stderr are the caller's to set).
    pub process: std::process::Command,
    /// The seccomp filters the child reads when it starts; dropped once it is spawned.
    filters: Vec<OwnedFd>,
    arguments: Vec<OsString>,
}

impl Confined {
    /// The arguments given to `bwrap`, for logs and tests.
    pub fn arguments(&self) -> &[OsString] {
        &self.arguments
    }

    /// Splits into the process to spawn and the filters to keep open until it is spawned.
    pub fn into_parts(self) -> (std::process::Command, Vec<OwnedFd>) {
        (self.process, self.filters)
    }
}

/// Why a command cannot run confined.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A layer the policy needs is missing on this machine.
    #[error("the sandbox is unavailable: {reason}. {hint}")]
    Unavailable {
        /// What is missing.
        reason: String,
        /// What to do about it.
        hint: &'static str,
    },
    /// The policy cannot be expressed (a path that cannot be mounted).
    #[error("the sandbox policy is invalid: {0}")]
    Policy(String),
    /// Preparing the sandbox failed.
    #[error("cannot prepare the sandbox: {0}")]
    Io(#[from] std::io::Error),
}

/// The hint for a machine without bubblewrap.
pub const INSTALL_HINT: &str = "Install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap), or run commands unconfined with --sandbox off";

/// One layer of confinement and whether it works here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layer {
    /// The layer, e.g. `bubblewrap`.
    pub name: &'static str,
    /// Whether it applies on this machine.
    pub works: bool,
    /// What was found, or why it does not work.
    pub detail: String,
}

/// What confinement works on this machine: each layer, tried for real.
#[derive(Clone, Debug)]
pub struct Report {
    /// The layers, in the order they apply.
    pub layers: Vec<Layer>,
}

impl Report {
    /// Whether commands can run confined.
    pub fn usable(&self) -> bool {
        self.layers.iter().all(|layer| layer.works)
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for layer in &self.layers {
            let mark = if layer.works { "ok " } else { "NO " };
            writeln!(f, "{mark} {:<18} {}", layer.name, layer.detail)?;
        }
        if self.usable() {
            write!(f, "commands run confined")
        } else {
            write!(f, "commands cannot run confined here. {INSTALL_HINT}")
        }
    }
}

/// Tries each layer: bubblewrap present, namespaces usable (a confined `true` runs), and the
/// seccomp filter accepted.
pub fn check() -> Report {
    let mut layers = Vec::new();
    let bwrap = find_bwrap();
    layers.push(Layer {
        name: "bubblewrap",
        works: bwrap.is_ok(),
        detail: match &bwrap {
            Ok(path) => path.display().to_string(),
            Err(e) => e.to_string(),
        },
    });
    let filter = seccomp::filters(Network::Off);
    layers.push(Layer {
        name: "seccomp filter",
        works: filter.is_ok(),
        detail: match &filter {
            Ok(_) => "compiled for this architecture".to_owned(),
            Err(e) => e.to_string(),
        },
    });
    if bwrap.is_ok() && filter.is_ok() {
        let root = std::env::temp_dir();
        let trial = Policy::read_only(&root)
            .command(Path::new("/bin/sh"), "exit 0", &[])
            .and_then(|confined| {
                let (mut process, filter) = confined.into_parts();
                let output = process
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::piped())
                    .output()?;
                drop(filter);
                Ok(output)
            });
        let (works, detail) = match trial {
            Ok(output) if output.status.success() => (
                true,
                "user, mount, PID and network namespaces; seccomp applied".to_owned(),
            ),
            Ok(output) => (
                false,
                format!(
                    "a confined command failed: {}",
                    String::from_utf8_lossy(&output.stderr).trim()
                ),
            ),
            Err(e) => (false, e.to_string()),
        };
        layers.push(Layer {
            name: "namespaces",
            works,
            detail,
        });
    }
    Report { layers }
}
