//! The Landlock engine: the fallback where user namespaces are unavailable.
//!
//! The command runs under the [helper](crate::helper), which starts it in a session of its
//! own (no controlling terminal) restricted first: Landlock lets the processes read (and
//! run) only the system directories (less what only root may read, when run by root), the
//! extra read-only paths, `/proc` and the root, write only the root (unless read-only), the
//! extra writable paths, a private temporary directory (`TMPDIR`) and the usual devices;
//! with the network off, TCP is refused too; signals and abstract Unix sockets stay inside
//! the sandbox. Then the same seccomp filter as under bubblewrap, which here also refuses
//! new Unix sockets (a path socket of the host is otherwise reachable: Landlock does not
//! govern `connect`). What this cannot express is listed by [`crate::limitations`].

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, path_beneath_rules,
};

use crate::{Guard, Network, Policy, RootAccess, SandboxError, helper, seccomp};

/// Devices commands may read and write.
const DEVICES: [&str; 8] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/dev/ptmx",
    "/dev/pts",
];

/// The helper's program and arguments that run `shell -c command` under `policy`, and the
/// private temporary directory it gets (kept in `guard`).
pub(crate) fn command(
    policy: &Policy,
    guard: &mut Guard,
    shell: &Path,
    command: &str,
) -> Result<(OsString, Vec<OsString>), SandboxError> {
    let root = policy.root.canonicalize().map_err(|e| {
        SandboxError::Policy(format!(
            "the root {} is not usable: {e}",
            policy.root.display()
        ))
    })?;
    let helper = helper::program(policy)?;
    let scratch = scratch_dir()?;
    let mut visible: Vec<PathBuf> = policy.system.clone();
    visible.extend(policy.extra_read.iter().cloned());
    // Run as root, the command owns root's files: what no one else may read is left out.
    let (mut read, list) = if rustix::process::geteuid().is_root() {
        split_around(&visible, &crate::private::root_only(&visible))
    } else {
        (visible, Vec::new())
    };
    read.push(PathBuf::from("/proc"));
    let mut write: Vec<PathBuf> = policy.extra_write.clone();
    write.extend(DEVICES.iter().map(PathBuf::from));
    write.push(scratch.clone());
    match policy.root_access {
        RootAccess::Write => write.push(root),
        RootAccess::Read => read.push(root),
    }
    let mut args: Vec<OsString> = vec![helper::ARG.into(), "landlock".into()];
    args.push("--scratch".into());
    args.push(scratch.as_os_str().to_owned());
    for (flag, paths) in [("--read", &read), ("--list", &list), ("--write", &write)] {
        for path in paths.iter().filter(|path| path.exists()) {
            args.push(flag.into());
            args.push(path.as_os_str().to_owned());
        }
    }
    args.push("--network".into());
    args.push(
        if policy.network == Network::On {
            "on"
        } else {
            "off"
        }
        .into(),
    );
    args.push("--".into());
    args.extend(crate::shell_invocation(policy, guard, shell, command));
    guard.scratch = Some(scratch);
    Ok((helper.into_os_string(), args))
}

/// `paths` less `excluded`, as Landlock rules can say it: paths readable whole, and
/// directories only listable, on the way to an excluded path (their other entries readable
/// whole). Names inside an excluded directory stay listable; their contents do not.
fn split_around(paths: &[PathBuf], excluded: &[PathBuf]) -> (Vec<PathBuf>, Vec<PathBuf>) {
    fn split(path: &Path, excluded: &[PathBuf], read: &mut Vec<PathBuf>, list: &mut Vec<PathBuf>) {
        if excluded.iter().any(|e| path.starts_with(e)) {
            return;
        }
        if !excluded.iter().any(|e| e.starts_with(path)) || !path.is_dir() {
            read.push(path.to_path_buf());
            return;
        }
        list.push(path.to_path_buf());
        for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
            split(&entry.path(), excluded, read, list);
        }
    }
    let (mut read, mut list) = (Vec::new(), Vec::new());
    for path in paths {
        let path = path.canonicalize().unwrap_or_else(|_| path.clone());
        split(&path, excluded, &mut read, &mut list);
    }
    (read, list)
}

/// The prefix of the private temporary directories, `deepagents-tmp-PID-N`.
const SCRATCH_PREFIX: &str = "deepagents-tmp-";

/// A new private directory in the host's temporary directory. The first one of a process
/// also removes those left by processes that are gone (killed before they could).
fn scratch_dir() -> Result<PathBuf, SandboxError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(sweep_stale_scratch);
    let dir = std::env::temp_dir().join(format!(
        "{SCRATCH_PREFIX}{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir(&dir)?;
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    Ok(dir)
}

/// Removes the private temporary directories of processes that no longer exist.
fn sweep_stale_scratch() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let creator = name
            .to_str()
            .and_then(|name| name.strip_prefix(SCRATCH_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok());
        if let Some(creator) = creator
            && !crate::alive(creator)
        {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Restricts the calling process (the helper, before it starts the command): Landlock, then
/// seccomp. `list` are directories whose entries may be listed, not read. Landlock older
/// than ABI 3 (Linux 6.2) is refused: without it truncation is not controlled, and a
/// half-applied policy is worse than a clear error.
pub(crate) fn restrict(
    read: &[PathBuf],
    list: &[PathBuf],
    write: &[PathBuf],
    network_off: bool,
) -> Result<(), String> {
    let failed = |e: landlock::RulesetError| format!("cannot apply Landlock: {e}");
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(ABI::V3))
        .map_err(failed)?
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(ABI::V6))
        .map_err(failed)?
        .scope(Scope::from_all(ABI::V6))
        .map_err(failed)?;
    if network_off {
        ruleset = ruleset
            .handle_access(AccessNet::from_all(ABI::V6))
            .map_err(failed)?;
    }
    let status = ruleset
        .create()
        .map_err(failed)?
        .add_rules(path_beneath_rules(read, AccessFs::from_read(ABI::V6)))
        .map_err(failed)?
        .add_rules(path_beneath_rules(list, AccessFs::ReadDir))
        .map_err(failed)?
        .add_rules(path_beneath_rules(write, AccessFs::from_all(ABI::V6)))
        .map_err(failed)?
        .restrict_self()
        .map_err(failed)?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err(
            "Landlock is not enforced by this kernel (enable it with lsm=landlock)".to_owned(),
        );
    }
    // Root keeps no capability (CAP_SYS_PTRACE would open other processes' memory and
    // environment); with no-new-privileges, which Landlock set, `execve` gives none back.
    let none = rustix::thread::CapabilitySet::empty();
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: none,
            permitted: none,
            inheritable: none,
        },
    )
    .map_err(|e| format!("cannot drop capabilities: {e}"))?;
    let network = if network_off {
        Network::Off
    } else {
        Network::On
    };
    seccomp::apply(&network, crate::Engine::Landlock).map_err(|e| e.to_string())
}

/// Makes the calling program's memory and environment unreadable to commands of the same
/// user (`PR_SET_DUMPABLE` 0): without a PID namespace they can see it in `/proc`, and it
/// holds what commands must not read (API keys). Also means no core dumps of it.
pub(crate) fn shield_caller() {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        // Best effort: where it fails, the limitation is the one the report names.
        let _ =
            rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable);
    });
}
