//! How `execute` is confined (`--sandbox`, `[sandbox]` in the config), and the
//! `deepagents sandbox` commands that show it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::ValueEnum;
use deepagents::backends::sandbox::{
    self, DEFAULT_MAX_PROCESSES, Engine, Limits, Network, PROTECTED_NAMES, Policy,
};
use deepagents::backends::{Mode, Operation, Permissions};
use serde::Deserialize;

/// The `--sandbox` choices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SandboxMode {
    /// Commands may change the root; the system is read-only, the rest of the host invisible,
    /// the network off.
    #[default]
    WorkspaceWrite,
    /// Like workspace-write with the root read-only too.
    ReadOnly,
    /// Commands run unconfined, as you: they can read and change anything you can.
    Off,
}

/// `--sandbox-engine` and `engine` in `[sandbox]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineSetting {
    /// Bubblewrap where user namespaces work, else Landlock.
    #[default]
    Auto,
    /// Bubblewrap and seccomp only.
    Bubblewrap,
    /// Landlock and seccomp (the fallback; see `deepagents sandbox check` for what it cannot
    /// enforce).
    Landlock,
}

impl From<EngineSetting> for Engine {
    fn from(setting: EngineSetting) -> Self {
        match setting {
            EngineSetting::Auto => Engine::Auto,
            EngineSetting::Bubblewrap => Engine::Bubblewrap,
            EngineSetting::Landlock => Engine::Landlock,
        }
    }
}

/// `network` in `[sandbox]`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NetworkSetting {
    /// No network (the default).
    #[default]
    Off,
    /// The host's network, unfiltered.
    On,
}

/// `[sandbox]`: the confinement of `execute` with `--backend shell`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxConfig {
    /// The mode; `--sandbox` beats it.
    pub mode: Option<SandboxMode>,
    /// More host paths commands may read.
    #[serde(default)]
    pub extra_read: Vec<PathBuf>,
    /// More host paths commands may change.
    #[serde(default)]
    pub extra_write: Vec<PathBuf>,
    /// Names inside the root that stay read-only (default `.git`, `.deepagents`, `.agents`);
    /// this list replaces the default one.
    pub protected: Option<Vec<PathBuf>>,
    /// Paths inside the root commands may not read.
    #[serde(default)]
    pub hidden: Vec<PathBuf>,
    /// `"off"` (default) or `"on"` (the host's network, unfiltered).
    #[serde(default)]
    pub network: NetworkSetting,
    /// Domains commands may reach over HTTP and HTTPS through the sandbox's proxy while the
    /// network is otherwise off (`example.com`, `*.example.com`).
    #[serde(default)]
    pub allow_domains: Vec<String>,
    /// `"auto"` (default), `"bubblewrap"` or `"landlock"`; `--sandbox-engine` beats it.
    pub engine: Option<EngineSetting>,
    /// Whether `auto` may fall back to Landlock where bubblewrap cannot run (default
    /// `false`: Landlock enforces less; `deepagents sandbox check --sandbox-engine landlock`
    /// lists what).
    #[serde(default)]
    pub landlock_fallback: bool,
    /// Memory a command and its children may use together, in bytes (default: half the
    /// machine's memory, at most 8 GiB); needs a memory cgroup.
    pub max_memory: Option<u64>,
    /// The size of a command's private `/tmp`, in bytes (default: as `max_memory`).
    pub max_tmp_size: Option<u64>,
    /// Processes and threads a command may have at once (default 1024).
    pub max_processes: Option<u64>,
    /// The largest file a command may write, in bytes (default: no limit).
    pub max_file_size: Option<u64>,
    /// CPU seconds each process of a command may use (default: no limit; the timeout still
    /// bounds the wall time).
    pub max_cpu_seconds: Option<u64>,
}

/// The policy for commands run in `root`, or `None` when the mode is `off`. Permission rules
/// that deny reading a directory or file (`/secrets/**`, `/.env`) hide it from commands too,
/// and rules that deny only writing make it read-only; a rule whose paths are patterns
/// (`/**/*.env`) cannot become a mount, and is named in the returned warnings.
pub fn policy(
    root: &Path,
    mode: SandboxMode,
    engine: Option<EngineSetting>,
    config: &SandboxConfig,
    permissions: Option<&Permissions>,
) -> (Option<Policy>, Vec<String>) {
    let mut policy = match mode {
        SandboxMode::Off => return (None, Vec::new()),
        SandboxMode::WorkspaceWrite => Policy::workspace_write(root),
        SandboxMode::ReadOnly => Policy::read_only(root),
    };
    policy.extra_read.clone_from(&config.extra_read);
    policy.extra_write.clone_from(&config.extra_write);
    policy.protected = config
        .protected
        .clone()
        .unwrap_or_else(|| PROTECTED_NAMES.iter().map(PathBuf::from).collect());
    policy.hidden.clone_from(&config.hidden);
    let mut warnings = Vec::new();
    policy.network = match (config.network, config.allow_domains.is_empty()) {
        (NetworkSetting::Off, true) => Network::Off,
        (NetworkSetting::Off, false) => Network::Domains(config.allow_domains.clone()),
        (NetworkSetting::On, empty) => {
            if !empty {
                warnings.push("warning: [sandbox] allow_domains has no effect with network = \"on\", which allows every host".to_owned());
            }
            Network::On
        }
    };
    policy.limits = Limits {
        max_file_size: config.max_file_size,
        max_cpu_seconds: config.max_cpu_seconds,
        max_processes: Some(config.max_processes.unwrap_or(DEFAULT_MAX_PROCESSES)),
        max_memory: config.max_memory.or(policy.limits.max_memory),
        max_tmp_size: config.max_tmp_size.or(policy.limits.max_tmp_size),
    };
    policy.engine = engine.or(config.engine).unwrap_or_default().into();
    policy.landlock_fallback = config.landlock_fallback;
    for rule in permissions.into_iter().flat_map(Permissions::rules) {
        if rule.mode != Mode::Deny {
            continue;
        }
        let reads = rule.operations.contains(&Operation::Read);
        for glob in &rule.paths {
            match mountable(glob) {
                Some(path) if reads => policy.hidden.push(path),
                Some(path) => policy.read_only.push(path),
                None => warnings.push(format!(
                    "warning: the permission rule for {glob} holds for the file tools but not inside `execute` (only a directory/** or a plain path can be hidden from commands)"
                )),
            }
        }
    }
    (Some(policy), warnings)
}

/// The path inside the root a permission glob names whole: `/secrets/**` or `/secrets`
/// → `secrets`; `None` for patterns.
fn mountable(glob: &str) -> Option<PathBuf> {
    let path = glob.strip_suffix("/**").unwrap_or(glob);
    let relative = path.strip_prefix('/')?;
    let plain = !relative.is_empty() && !relative.contains(['*', '?', '[', '{']);
    plain.then(|| PathBuf::from(relative))
}

/// The lines for stderr saying how commands run, printed once per run.
pub fn describe(policy: Option<&Policy>) -> String {
    let Some(policy) = policy else {
        return "warning: commands run unconfined (--sandbox off): they can read and change anything you can".to_owned();
    };
    let engine = match policy.resolve_engine() {
        Ok(engine) => engine,
        Err(e) => return format!("warning: commands will be refused: {e}"),
    };
    let mut text = format!(
        "sandbox: {} in {} ({}, seccomp; network {})",
        match policy.root_access {
            sandbox::RootAccess::Write => "workspace-write",
            sandbox::RootAccess::Read => "read-only",
        },
        policy.root.display(),
        engine.name(),
        policy.network.describe()
    );
    for gap in sandbox::limitations(engine, policy) {
        text.push_str(&format!("\nwarning: the sandbox does not enforce {gap}"));
    }
    text
}

/// `deepagents sandbox check`: each layer, the engine the policy for `root` gets, and what
/// it leaves unenforced.
pub fn check(
    root: Option<PathBuf>,
    engine: Option<EngineSetting>,
    config: &SandboxConfig,
) -> anyhow::Result<ExitCode> {
    let root = root_or_current(root)?;
    let (policy, _) = policy(&root, SandboxMode::WorkspaceWrite, engine, config, None);
    let Some(policy) = policy else {
        return Ok(ExitCode::FAILURE);
    };
    let report = sandbox::check_for(&policy);
    println!("{report}");
    Ok(if report.usable() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn root_or_current(root: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match root {
        Some(root) => Ok(root),
        None => std::env::current_dir().context("cannot read the current directory; pass --root"),
    }
}

/// `deepagents sandbox run -- COMMAND`: runs a command under the policy, as `execute` would,
/// and exits with its status. A signal is passed on to the command, which gets
/// [`FORWARD_GRACE`] to end before it is killed; then the sandbox's guard is dropped (what the
/// command left in its cgroup is killed and the cgroup removed) and the status is the
/// signal's.
pub async fn run(
    root: Option<PathBuf>,
    mode: SandboxMode,
    engine: Option<EngineSetting>,
    config: &SandboxConfig,
    command: &[String],
) -> anyhow::Result<ExitCode> {
    let root = root_or_current(root)?;
    let command = shell_line(command);
    let (policy, warnings) = policy(&root, mode, engine, config, None);
    for warning in warnings {
        eprintln!("{warning}");
    }
    let (process, mut guard) = match policy {
        None => {
            let mut process = std::process::Command::new("/bin/sh");
            process.args(["-c", &command]).current_dir(&root);
            (process, None)
        }
        Some(policy) => {
            let (process, guard) = policy
                .command(Path::new("/bin/sh"), &command, &sandbox::allowed_host_env())?
                .into_parts();
            (process, Some(guard))
        }
    };
    let mut process = tokio::process::Command::from(process);
    // Whatever way this function is left, the command does not outlive it.
    process.kill_on_drop(true);
    let spawned = process.spawn();
    if let Some(guard) = &mut guard {
        guard.spawned();
    }
    let mut child = spawned?;
    let ended = tokio::select! {
        status = child.wait() => Ok(status?),
        signal = crate::shutdown::signalled() => {
            if let Some(pid) = child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .and_then(rustix::process::Pid::from_raw)
            {
                // ESRCH: it ended meanwhile.
                let _ = rustix::process::kill_process(pid, signal.raw());
            }
            if tokio::time::timeout(FORWARD_GRACE, child.wait()).await.is_err() {
                // SIGKILL, then reaped.
                let _ = child.kill().await;
            }
            Err(signal)
        }
    };
    if let Some(guard) = guard {
        for host in guard.refused_hosts() {
            eprintln!("sandbox: refused network access to {host} (not in allow_domains)");
        }
        // Before exiting: the drop kills what the command left and removes its cgroup.
        drop(guard);
    }
    Ok(match ended {
        Err(signal) => ExitCode::from(signal.exit_code()),
        Ok(status) => match status.code() {
            Some(0) => ExitCode::SUCCESS,
            Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
            None => ExitCode::FAILURE,
        },
    })
}

/// The line `/bin/sh -c` runs for the words after `--`. One word is a command line already
/// (`-- "ls | wc -l"`), kept as written. Several are a command and its arguments as the
/// user's shell split them (`-- sh -c 'echo "a b"; ls'`), so each is single-quoted: joining
/// them with spaces would let `sh` split and expand them a second time.
fn shell_line(words: &[String]) -> String {
    match words {
        [line] => line.clone(),
        words => words
            .iter()
            .map(|word| shell_quote(word))
            .collect::<Vec<_>>()
            .join(" "),
    }
}

/// `word` as one POSIX shell word: inside single quotes nothing is special, and a single
/// quote is written as `'\''` (close, escaped quote, reopen).
fn shell_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// How long `deepagents sandbox run` waits for its command to end after passing a signal on.
const FORWARD_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// Whether `command` may run without approval with the sandbox off: it starts with one of
/// `allowed`, word for word, and chains, redirects or substitutes nothing.
pub fn shell_allowed(command: &str, allowed: &[String]) -> bool {
    if command.contains([';', '&', '|', '>', '<', '`', '$', '\n', '(', ')']) {
        return false;
    }
    let words: Vec<&str> = command.split_whitespace().collect();
    allowed.iter().any(|entry| {
        let prefix: Vec<&str> = entry.split_whitespace().collect();
        !prefix.is_empty() && words.starts_with(&prefix)
    })
}

#[cfg(test)]
mod tests {
    use super::{shell_allowed, shell_line};

    #[test]
    fn several_words_after_the_separator_keep_their_boundaries() {
        let words = |w: &[&str]| w.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(shell_line(&words(&["echo hi | wc -c"])), "echo hi | wc -c");
        assert_eq!(
            shell_line(&words(&["sh", "-c", "echo \"a b\"; ls"])),
            "'sh' '-c' 'echo \"a b\"; ls'"
        );
        assert_eq!(shell_line(&words(&["echo", "it's"])), r"'echo' 'it'\''s'");
        assert_eq!(shell_line(&words(&["printf", ""])), "'printf' ''");
    }

    #[test]
    fn the_shell_allow_list_matches_whole_words_and_refuses_chains() {
        let allowed = vec!["git status".to_owned(), "ls".to_owned()];
        assert!(shell_allowed("git status --short", &allowed));
        assert!(shell_allowed("  ls -la src", &allowed));
        assert!(!shell_allowed("git statusx", &allowed));
        assert!(!shell_allowed("git push", &allowed));
        assert!(!shell_allowed("ls; rm -rf /", &allowed));
        assert!(!shell_allowed("ls && curl evil", &allowed));
        assert!(!shell_allowed("ls $(rm x)", &allowed));
        assert!(!shell_allowed("ls > /etc/passwd", &allowed));
        assert!(!shell_allowed("lsof", &allowed));
        assert!(!shell_allowed("anything", &[String::new()]));
    }
}
