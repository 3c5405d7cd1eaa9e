//! How `execute` is confined (`--sandbox`, `[sandbox]` in the config), and the
//! `deepagents sandbox` commands that show it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::ValueEnum;
use deepagents::backends::sandbox::{self, Limits, Network, PROTECTED_NAMES, Policy};
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
    /// `"off"` (default) or `"on"`.
    #[serde(default)]
    pub network: NetworkSetting,
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
    policy.network = match config.network {
        NetworkSetting::Off => Network::Off,
        NetworkSetting::On => Network::On,
    };
    policy.limits = Limits {
        max_file_size: config.max_file_size,
        max_cpu_seconds: config.max_cpu_seconds,
    };
    let mut warnings = Vec::new();
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

/// One line for stderr saying how commands run, printed once per run.
pub fn describe(policy: Option<&Policy>) -> String {
    let Some(policy) = policy else {
        return "warning: commands run unconfined (--sandbox off): they can read and change anything you can".to_owned();
    };
    let report = sandbox::check();
    if !report.usable() {
        let why = report
            .layers
            .iter()
            .filter(|layer| !layer.works)
            .map(|layer| format!("{}: {}", layer.name, layer.detail))
            .collect::<Vec<_>>()
            .join("; ");
        return format!(
            "warning: commands will be refused: the sandbox does not work here ({why})"
        );
    }
    format!(
        "sandbox: {} in {} (bubblewrap, seccomp; network {})",
        match policy.root_access {
            sandbox::RootAccess::Write => "workspace-write",
            sandbox::RootAccess::Read => "read-only",
        },
        policy.root.display(),
        match policy.network {
            Network::Off => "off",
            Network::On => "on",
        }
    )
}

/// `deepagents sandbox check`: each layer, and whether commands can run confined.
pub fn check() -> ExitCode {
    let report = sandbox::check();
    println!("{report}");
    if report.usable() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `deepagents sandbox run -- COMMAND`: runs a command under the policy, as `execute` would,
/// and exits with its status.
pub fn run(
    root: Option<PathBuf>,
    mode: SandboxMode,
    config: &SandboxConfig,
    command: &[String],
) -> anyhow::Result<ExitCode> {
    let root = match root {
        Some(root) => root,
        None => {
            std::env::current_dir().context("cannot read the current directory; pass --root")?
        }
    };
    let command = command.join(" ");
    let status = match policy(&root, mode, config, None).0 {
        None => std::process::Command::new("/bin/sh")
            .args(["-c", &command])
            .current_dir(&root)
            .status()?,
        Some(policy) => {
            let (mut process, filters) = policy
                .command(Path::new("/bin/sh"), &command, &sandbox::allowed_host_env())?
                .into_parts();
            let status = process.status();
            drop(filters);
            status?
        }
    };
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}
