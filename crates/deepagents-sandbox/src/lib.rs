//! Runs shell commands confined, on Linux, without a remote service.
//!
//! A [`Policy`] says what a command may see: its root (the workspace) read-write or read-only,
//! the system directories read-only, a few extra paths, and nothing else of the host — no home
//! directories, no other projects, no host `/tmp`. Protected names inside the root (`.git`,
//! `.deepagents`, `.agents` by default) stay read-only, and paths the agent may not read are
//! hidden. The network is off unless the policy turns it on.
//!
//! [`Policy::command`] prepares a [`std::process::Command`] that runs `SHELL -c COMMAND`
//! confined by one of two engines ([`Engine`]):
//!
//! - **bubblewrap** (`bwrap`, found on `PATH`): new user, mount, PID, IPC, UTS, cgroup and
//!   (unless allowed) network namespaces, the policy's mounts, the command as a child of a PID
//!   namespace that dies with it (so daemonized children are killed too);
//! - **Landlock** (Linux ≥ 6.2, ABI 3), the fallback where user namespaces are unavailable,
//!   used only when chosen ([`Engine::Landlock`], or [`Policy::landlock_fallback`] with
//!   [`Engine::Auto`]): the same paths readable and writable as far as Landlock can say it, the
//!   command in a session of its own (no controlling terminal); what it cannot enforce is
//!   listed by [`limitations`].
//!
//! Both add a seccomp filter ([`seccomp`]) that refuses `ptrace`, mounts, new namespaces,
//! `bpf`, `io_uring`, the kernel keyring, `perf_event_open`, module and kexec calls, typing
//! into a terminal (`TIOCSTI`, `TIOCLINUX`) and, with the network off, sockets other than
//! Unix ones (under Landlock, Unix ones too); an environment that holds only what the caller
//! passes; and resource limits: the number of processes and the memory through a cgroup where
//! one can be created (then every process left when the command ends is killed too).
//!
//! Run by root, a command is host uid 0 without capabilities: it cannot write the system,
//! and what only root may read there is masked ([`private`]); `/proc/sys` and the other
//! kernel controls under `/proc` are read-only.
//!
//! [`Network::Domains`] lets commands reach chosen domains over HTTP and HTTPS through a
//! proxy on a Unix socket that checks each request ([`proxy`]); a helper process
//! ([`helper`]) bridges it into the sandbox's network namespace. The helper is the calling
//! program itself, re-executed: a program that confines commands this way or with Landlock
//! calls [`helper::dispatch`] first thing in `main`.
//!
//! [`check`] reports which layers work on this machine. Nothing here falls back silently: a
//! machine where no engine works is an error that says how to fix it.

mod bwrap;
mod cgroup;
pub mod helper;
mod landlock;
mod outside;
mod private;
pub mod proxy;
pub mod seccomp;

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

pub use bwrap::find_bwrap;
pub use outside::{Outside, SharedPolicy};

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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Network {
    /// A network namespace of its own with only a loopback device, and no sockets but Unix ones.
    #[default]
    Off,
    /// HTTP and HTTPS to these domains only, through a proxy that checks every request (see
    /// [`proxy::DomainRules`] for the rules); nothing else leaves the sandbox. Needs the
    /// bubblewrap engine: under Landlock the network stays off.
    Domains(Vec<String>),
    /// The host's network, unfiltered.
    On,
}

impl Network {
    /// A short description: `off`, `on`, or the allowed domains.
    pub fn describe(&self) -> String {
        match self {
            Self::Off => "off".to_owned(),
            Self::On => "on".to_owned(),
            Self::Domains(domains) => format!("only {}", domains.join(", ")),
        }
    }
}

/// What confines commands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Engine {
    /// Bubblewrap where user namespaces work on this machine, else Landlock.
    #[default]
    Auto,
    /// Bubblewrap and seccomp (an error where it cannot run).
    Bubblewrap,
    /// Landlock and seccomp, without namespaces: the fallback (an error where Landlock is
    /// older than ABI 3 or disabled). Makes the calling program non-dumpable, so commands
    /// cannot read its environment through `/proc`.
    Landlock,
}

impl Engine {
    /// The engine's name as `check` and the configuration spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Bubblewrap => "bubblewrap",
            Self::Landlock => "landlock",
        }
    }
}

/// What the given engine cannot enforce of `policy` on this machine, one sentence each
/// (empty when it enforces all of it).
pub fn limitations(engine: Engine, policy: &Policy) -> Vec<String> {
    let mut gaps = Vec::new();
    let cgroup = cgroup::available();
    if policy.limits.max_processes.is_some() && !cgroup && rustix::process::getuid().is_root() {
        gaps.push("the process limit: no pids cgroup can be created, and RLIMIT_NPROC does not hold for root".to_owned());
    }
    if policy.limits.max_memory.is_some() && !cgroup::memory_available() {
        gaps.push("the memory limit for all of a command's processes together: no memory cgroup can be created, so it holds per process (RLIMIT_DATA)".to_owned());
    }
    if engine != Engine::Landlock {
        return gaps;
    }
    gaps.push(
        "a private /tmp: commands get their own TMPDIR and cannot use the host's /tmp".to_owned(),
    );
    gaps.push("a PID namespace: commands see the host's processes, and can read the command lines and environments of other processes of the same user that are not this program".to_owned());
    gaps.push("file names and metadata outside the policy: a command can stat a path it knows, not read or list it".to_owned());
    if policy.limits.max_tmp_size.is_some() {
        gaps.push("the size of the temporary directory: it is on the host's disk".to_owned());
    }
    if policy.root_access == RootAccess::Write
        && (!policy.protected.is_empty() || !policy.read_only.is_empty())
    {
        gaps.push(format!(
            "read-only paths inside the writable root: {} stay writable, and missing ones can be created",
            names(policy.protected.iter().chain(&policy.read_only))
        ));
    }
    if !policy.hidden.is_empty() {
        gaps.push(format!(
            "hidden paths inside the root: {} stay readable",
            names(policy.hidden.iter())
        ));
    }
    if matches!(policy.network, Network::Domains(_)) {
        gaps.push(
            "allowed domains (they need a network namespace): the network stays off".to_owned(),
        );
    }
    if !cgroup {
        gaps.push(
            "ending daemonized processes on timeout (no pids cgroup): they are ended when the command finishes, not when it is killed"
                .to_owned(),
        );
    }
    gaps
}

fn names<'a>(paths: impl Iterator<Item = &'a PathBuf>) -> String {
    paths
        .map(|path| path.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
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
    /// Names (relative paths) inside the root that stay read-only, whether or not they exist
    /// (a missing one cannot be created; one reached through a symlink is refused, since a
    /// command could replace the link).
    pub protected: Vec<PathBuf>,
    /// Host git directories visible read-only: those of a worktree root, decided by
    /// [`worktree_git_dirs`] when the policy is made, never from a file commands can change.
    pub git_dirs: Vec<PathBuf>,
    /// Paths inside the root the command may not read: hidden behind an empty file or
    /// directory.
    pub hidden: Vec<PathBuf>,
    /// Paths inside the root the command may read but not change.
    pub read_only: Vec<PathBuf>,
    /// Network access.
    pub network: Network,
    /// Resource limits of the command and everything it starts.
    pub limits: Limits,
    /// What confines the command.
    pub engine: Engine,
    /// Whether [`Engine::Auto`] may fall back to Landlock where bubblewrap cannot run (off by
    /// default: Landlock enforces less, see [`limitations`]).
    pub landlock_fallback: bool,
    /// The program that carries the [`helper`] (it calls [`helper::dispatch`] first in
    /// `main`); `None` is the running program. Needed for [`Network::Domains`] and the
    /// Landlock engine.
    pub helper: Option<PathBuf>,
}

/// The process limit of the default policies: room for builds and test runners, not for a
/// fork bomb.
pub const DEFAULT_MAX_PROCESSES: u64 = 1024;

/// Resource limits (`setrlimit`) of a confined command and its descendants; `None` leaves the
/// host's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// The largest file a command may write, in bytes (`RLIMIT_FSIZE`; a write past it fails
    /// and the writer gets `SIGXFSZ`).
    pub max_file_size: Option<u64>,
    /// CPU seconds each process may use (`RLIMIT_CPU`).
    pub max_cpu_seconds: Option<u64>,
    /// How many processes and threads the command may have at once: a pids cgroup where
    /// one can be created (as root, or in a delegated cgroup), else `RLIMIT_NPROC`, which
    /// the kernel does not apply to root.
    pub max_processes: Option<u64>,
    /// Memory the command and its children may use together, in bytes: a memory cgroup
    /// where one can be created (over it, the kernel's OOM killer ends a process of the
    /// command).
    pub max_memory: Option<u64>,
    /// The size of the command's private `/tmp`, in bytes (bubblewrap).
    pub max_tmp_size: Option<u64>,
}

/// The memory limit of the default policies: half the machine's memory, at most 8 GiB —
/// room for a build, not for a runaway process to take the machine.
pub fn default_max_memory() -> u64 {
    const CAP: u64 = 8 << 30;
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("MemTotal:"))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
        })
        .map_or(CAP, |kib| kib * 1024);
    (total / 2).clamp(256 << 20, CAP)
}

/// The git directories a worktree at `root` uses, when its `.git` is a file that names a
/// `…/worktrees/NAME` directory of a repository whose back-link (`gitdir` there) names this
/// root: that directory and the repository's common directory. Anything else — a `gitdir:`
/// pointing at an arbitrary host directory — gives nothing.
pub fn worktree_git_dirs(root: &Path) -> Vec<PathBuf> {
    fn find(root: &Path) -> Option<Vec<PathBuf>> {
        let root = root.canonicalize().ok()?;
        let dot_git = root.join(".git");
        if !dot_git.symlink_metadata().ok()?.is_file() {
            return None;
        }
        let text = std::fs::read_to_string(&dot_git).ok()?;
        let target = text
            .lines()
            .find_map(|line| line.strip_prefix("gitdir:"))?
            .trim();
        let git_dir = root.join(target).canonicalize().ok()?;
        if git_dir.parent()?.file_name()? != "worktrees" {
            return None;
        }
        let back = std::fs::read_to_string(git_dir.join("gitdir")).ok()?;
        if Path::new(back.trim()).canonicalize().ok()? != dot_git {
            return None;
        }
        let common = git_dir.parent()?.parent()?.to_path_buf();
        if !common.join("objects").is_dir() || !common.join("HEAD").is_file() {
            return None;
        }
        Some(vec![git_dir, common])
    }
    find(root).unwrap_or_default()
}

/// Whether the process `pid` exists (a zombie counts).
pub(crate) fn alive(pid: i32) -> bool {
    rustix::process::Pid::from_raw(pid).is_some_and(|pid| {
        !matches!(
            rustix::process::test_kill_process(pid),
            Err(rustix::io::Errno::SRCH)
        )
    })
}

impl Policy {
    /// The default policy for `root`: root read-write, the system read-only, protected names
    /// read-only, no network.
    pub fn workspace_write(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        Self {
            git_dirs: worktree_git_dirs(&root),
            root,
            root_access: RootAccess::Write,
            system: SYSTEM_PATHS.iter().map(PathBuf::from).collect(),
            extra_read: Vec::new(),
            extra_write: Vec::new(),
            protected: PROTECTED_NAMES.iter().map(PathBuf::from).collect(),
            hidden: Vec::new(),
            read_only: Vec::new(),
            network: Network::Off,
            limits: Limits {
                max_processes: Some(DEFAULT_MAX_PROCESSES),
                max_memory: Some(default_max_memory()),
                max_tmp_size: Some(default_max_memory()),
                ..Limits::default()
            },
            engine: Engine::Auto,
            landlock_fallback: false,
            helper: None,
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
    /// path but exports none). Keep the [`Guard`] from [`Confined::into_parts`] until the
    /// command has ended: it holds what the command needs while it runs, and ends what is
    /// left of it when dropped.
    pub fn command(
        &self,
        shell: &Path,
        command: &str,
        env: &[(String, String)],
    ) -> Result<Confined, SandboxError> {
        let engine = self.resolve_engine()?;
        let cgroup = cgroup::Cgroup::create(self.limits.max_processes, self.limits.max_memory);
        let mut guard = Guard {
            filters: Vec::new(),
            cgroup,
            proxy: None,
            scratch: None,
            placeholders: Vec::new(),
        };
        let (program, args) = match engine {
            Engine::Landlock => {
                landlock::shield_caller();
                landlock::command(self, &mut guard, shell, command)?
            }
            _ => {
                guard.filters = seccomp::filter_fds(&self.network, Engine::Bubblewrap)?;
                let bwrap = find_bwrap()?;
                let args = bwrap::arguments(self, &mut guard, shell, command, env)?;
                (bwrap.into_os_string(), args)
            }
        };
        let mut process = match &guard.cgroup {
            // The outermost process joins the cgroups before it becomes the sandbox, so
            // everything the command starts is counted and can be ended.
            Some(cgroup) => {
                let files = cgroup.procs_files();
                let joins: String = (1..=files.len())
                    .map(|n| format!("echo $$ > \"${n}\" && "))
                    .collect();
                let mut process = std::process::Command::new("/bin/sh");
                process
                    .arg("-c")
                    .arg(format!("{joins}shift {} && exec \"$@\"", files.len()))
                    .arg("sh")
                    .args(files)
                    .arg(&program)
                    .args(&args);
                process
            }
            None => {
                let mut process = std::process::Command::new(&program);
                process.args(&args);
                process
            }
        };
        process.env_clear().current_dir(&self.root);
        if engine == Engine::Landlock {
            process.envs(env.iter().map(|(k, v)| (k, v)));
            if let Some(scratch) = &guard.scratch {
                process.env("TMPDIR", scratch);
            }
        }
        Ok(Confined {
            process,
            guard,
            arguments: args,
            engine,
        })
    }

    /// The engine that will run commands: the policy's, or for [`Engine::Auto`] bubblewrap
    /// where it works here (tried once per process), else Landlock when
    /// [`landlock_fallback`](Self::landlock_fallback) allows it.
    pub fn resolve_engine(&self) -> Result<Engine, SandboxError> {
        match self.engine {
            Engine::Auto => match namespaces_work() {
                Ok(()) => Ok(Engine::Bubblewrap),
                Err(_) if self.landlock_fallback && landlock_works(self.helper.as_deref()) => {
                    Ok(Engine::Landlock)
                }
                Err(reason) => Err(SandboxError::Unavailable {
                    reason: format!("bubblewrap cannot run here ({reason})"),
                    hint: FALLBACK_HINT,
                }),
            },
            engine => Ok(engine),
        }
    }
}

/// `shell -c command`, or with limits to set, a shell that sets them and then hands over to
/// the command, so they hold for everything the command starts with no window in which a
/// child escapes them. Without a cgroup for them, the process count falls back to
/// `ulimit -u` and the memory to `ulimit -d` (per process, not for all together).
fn shell_invocation(policy: &Policy, guard: &Guard, shell: &Path, command: &str) -> Vec<OsString> {
    let mut limits = Vec::new();
    // `-f` counts 512-byte blocks in POSIX shells.
    if let Some(bytes) = policy.limits.max_file_size {
        limits.push(format!("ulimit -f {}", bytes.div_ceil(512).max(1)));
    }
    if let Some(seconds) = policy.limits.max_cpu_seconds {
        limits.push(format!("ulimit -t {}", seconds.max(1)));
    }
    if let (Some(bytes), false) = (policy.limits.max_memory, guard.limits_memory()) {
        limits.push(format!("ulimit -d {}", (bytes / 1024).max(1)));
    }
    if let (Some(processes), false) = (policy.limits.max_processes, guard.has_cgroup()) {
        // bash spells it `-u`, dash `-p`.
        let n = processes.max(1);
        limits.push(format!("{{ ulimit -u {n} || ulimit -p {n}; }} 2>/dev/null"));
    }
    let mut args = vec![shell.as_os_str().to_owned(), "-c".into()];
    if limits.is_empty() {
        args.push(command.into());
    } else {
        // `sh -c SCRIPT SHELL COMMAND`: in the script `$0` is the shell, `$1` the command.
        args.push(format!("{} || exit 125; exec \"$0\" -c \"$1\"", limits.join(" && ")).into());
        args.push(shell.as_os_str().to_owned());
        args.push(command.into());
    }
    args
}

/// Whether a bubblewrap trial command succeeds here, or why not (tried once per process).
fn namespaces_work() -> Result<(), String> {
    static WORKS: OnceLock<Result<(), String>> = OnceLock::new();
    WORKS
        .get_or_init(|| {
            let outcome = trial(Engine::Bubblewrap, None);
            // One line: the reason goes into an error message of one line.
            outcome.map_err(|e| e.lines().next().unwrap_or_default().to_owned())
        })
        .clone()
}

/// Whether a Landlock trial command succeeds here with `helper` (tried once per process
/// and helper).
fn landlock_works(helper: Option<&Path>) -> bool {
    static TRIED: Mutex<Vec<(Option<PathBuf>, bool)>> = Mutex::new(Vec::new());
    let Ok(mut tried) = TRIED.lock() else {
        return false;
    };
    if let Some((_, works)) = tried.iter().find(|(path, _)| path.as_deref() == helper) {
        return *works;
    }
    let works = trial(Engine::Landlock, helper).is_ok();
    tried.push((helper.map(Path::to_path_buf), works));
    works
}

/// Runs `exit 0` confined by `engine` in the temporary directory; the error says why it
/// could not.
fn trial(engine: Engine, helper: Option<&Path>) -> Result<(), String> {
    let mut policy = Policy::read_only(std::env::temp_dir());
    policy.engine = engine;
    policy.helper = helper.map(Path::to_path_buf);
    policy.limits = Limits::default();
    let confined = policy
        .command(Path::new("/bin/sh"), "exit 0", &[])
        .map_err(|e| e.to_string())?;
    let (mut process, mut guard) = confined.into_parts();
    let child = process
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    guard.spawned();
    let output = child.wait_with_output().map_err(|e| e.to_string())?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "a confined command failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// A command prepared to run confined.
#[derive(Debug)]
pub struct Confined {
    /// The process to spawn (stdin, stdout and stderr are the caller's to set).
    pub process: std::process::Command,
    guard: Guard,
    arguments: Vec<OsString>,
    engine: Engine,
}

impl Confined {
    /// The arguments given to `bwrap` or the Landlock helper, for logs and tests.
    pub fn arguments(&self) -> &[OsString] {
        &self.arguments
    }

    /// The engine that confines this command.
    pub fn engine(&self) -> Engine {
        self.engine
    }

    /// Splits into the process to spawn and the guard to keep until it has ended.
    pub fn into_parts(self) -> (std::process::Command, Guard) {
        (self.process, self.guard)
    }
}

/// What a confined command needs while it runs: the seccomp filters bubblewrap reads as it
/// starts, the command's cgroups, the network proxy, the Landlock engine's temporary
/// directory, placeholders for missing read-only names. Dropping it kills every process
/// left in the command's cgroups and removes what was made for it.
#[derive(Debug)]
pub struct Guard {
    filters: Vec<OwnedFd>,
    cgroup: Option<cgroup::Cgroup>,
    proxy: Option<proxy::Proxy>,
    scratch: Option<PathBuf>,
    placeholders: Vec<bwrap::Placeholder>,
}

impl Guard {
    /// Call once the process is spawned: closes the filters' descriptors, which must not
    /// leak into other children.
    pub fn spawned(&mut self) {
        self.filters.clear();
    }

    /// Hosts the proxy refused so far, each once, in the order they were asked for.
    pub fn refused_hosts(&self) -> Vec<String> {
        self.proxy
            .as_ref()
            .map(proxy::Proxy::refused)
            .unwrap_or_default()
    }

    /// Whether the command's processes are counted and ended through a pids cgroup.
    pub fn has_cgroup(&self) -> bool {
        self.cgroup
            .as_ref()
            .is_some_and(cgroup::Cgroup::counts_processes)
    }

    /// Whether the command's memory is limited through a memory cgroup.
    fn limits_memory(&self) -> bool {
        self.cgroup
            .as_ref()
            .is_some_and(cgroup::Cgroup::limits_memory)
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        // The cgroup goes first: its processes may be using the proxy or the scratch space.
        self.cgroup = None;
        self.proxy = None;
        self.placeholders.clear();
        if let Some(scratch) = self.scratch.take() {
            // Best effort: a leftover directory in the host's temporary directory is harmless.
            let _ = std::fs::remove_dir_all(scratch);
        }
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
pub const INSTALL_HINT: &str = "Install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap), or turn the sandbox off to run commands unconfined";

/// The hint where bubblewrap cannot run and the Landlock fallback was not chosen.
pub const FALLBACK_HINT: &str = "Install bubblewrap and allow user namespaces, or accept the Landlock fallback, which enforces less (see `deepagents sandbox check --sandbox-engine landlock`), with engine = \"landlock\" or landlock_fallback = true in [sandbox]";

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
    /// The engine commands run under, `None` when none works here.
    pub engine: Option<Engine>,
    /// What that engine cannot enforce of the policy.
    pub limitations: Vec<String>,
}

impl Report {
    /// Whether commands can run confined.
    pub fn usable(&self) -> bool {
        self.engine.is_some()
    }

    /// One line: the engine, or why nothing works.
    pub fn summary(&self) -> String {
        match self.engine {
            Some(Engine::Landlock) => {
                "commands run confined by Landlock and seccomp (the fallback)".to_owned()
            }
            Some(_) => "commands run confined by bubblewrap and seccomp".to_owned(),
            None => format!("commands cannot run confined here. {INSTALL_HINT}"),
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for layer in &self.layers {
            let mark = if layer.works { "ok " } else { "NO " };
            writeln!(f, "{mark} {:<14} {}", layer.name, layer.detail)?;
        }
        write!(f, "{}", self.summary())?;
        if !self.limitations.is_empty() {
            write!(f, "; not enforced:")?;
            for gap in &self.limitations {
                write!(f, "\n  - {gap}")?;
            }
        }
        Ok(())
    }
}

/// Tries each layer for the default policy over the temporary directory.
pub fn check() -> Report {
    check_for(&Policy::workspace_write(std::env::temp_dir()))
}

/// Tries each layer — bubblewrap, namespaces, Landlock, seccomp, the pids cgroup, the
/// helper — and says which engine `policy` gets and what it leaves unenforced.
pub fn check_for(policy: &Policy) -> Report {
    fn layer(name: &'static str, outcome: Result<String, String>) -> Layer {
        match outcome {
            Ok(detail) => Layer {
                name,
                works: true,
                detail,
            },
            Err(detail) => Layer {
                name,
                works: false,
                detail,
            },
        }
    }
    let mut layers = vec![layer(
        "bubblewrap",
        find_bwrap()
            .map(|path| path.display().to_string())
            .map_err(|e| e.to_string()),
    )];
    layers.push(layer(
        "namespaces",
        namespaces_work()
            .map(|()| "user, mount, PID, IPC, UTS, cgroup and network namespaces".to_owned()),
    ));
    layers.push(layer(
        "landlock",
        trial(Engine::Landlock, policy.helper.as_deref())
            .map(|()| "ABI 3 or newer (the fallback engine)".to_owned()),
    ));
    layers.push(layer(
        "seccomp",
        seccomp::filters(&Network::Off, Engine::Bubblewrap)
            .map(|_| "filter compiled for this architecture".to_owned())
            .map_err(|e| e.to_string()),
    ));
    layers.push(layer(
        "memory cgroup",
        if cgroup::memory_available() {
            Ok(format!(
                "memory limit {}",
                policy.limits.max_memory.map_or_else(
                    || "none set".to_owned(),
                    |bytes| format!("{} MiB", bytes >> 20)
                )
            ))
        } else {
            Err("cannot create one; the memory limit is not enforced".to_owned())
        },
    ));
    layers.push(layer(
        "pids cgroup",
        if cgroup::available() {
            Ok("process limit and clean-up of every process a command leaves".to_owned())
        } else if rustix::process::getuid().is_root() {
            Err("cannot create one; RLIMIT_NPROC does not hold for root, so the process limit is not enforced".to_owned())
        } else {
            Err("cannot create one; the process limit is RLIMIT_NPROC".to_owned())
        },
    ));
    layers.push(layer("helper", helper::probe(policy)));
    let engine = match policy.engine {
        Engine::Auto => policy.resolve_engine().ok(),
        Engine::Bubblewrap => layers[1].works.then_some(Engine::Bubblewrap),
        Engine::Landlock => layers[2].works.then_some(Engine::Landlock),
    };
    let limitations = engine
        .map(|engine| limitations(engine, policy))
        .unwrap_or_default();
    Report {
        layers,
        engine,
        limitations,
    }
}
