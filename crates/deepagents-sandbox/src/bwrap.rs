//! The bubblewrap command line that expresses a [`Policy`].

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::proxy::{DomainRules, PORT_INSIDE, Proxy};
use crate::{Guard, INSTALL_HINT, Network, Policy, RootAccess, SandboxError, helper};

/// Where the helper and the proxy's socket appear inside the sandbox.
const HELPER_INSIDE: &str = "/run/deepagents/helper";
const PROXY_DIR_INSIDE: &str = "/run/deepagents/proxy";

/// The `bwrap` program: the first on `PATH`, else `/usr/bin/bwrap`.
pub fn find_bwrap() -> Result<PathBuf, SandboxError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("bwrap"))
        .find(|candidate| candidate.is_file())
        .ok_or(SandboxError::Unavailable {
            reason: "bubblewrap (bwrap) is not installed".to_owned(),
            hint: INSTALL_HINT,
        })
}

/// Builds the arguments. Mounts apply in order, later ones over earlier ones: the system,
/// a private `/tmp`, `/proc` and `/dev`, extra read-only paths, the root, extra writable
/// paths, then the read-only and hidden paths inside the root. With allowed domains it starts
/// the proxy (kept in `guard`) and runs the command under the helper's bridge.
pub(crate) fn arguments(
    policy: &Policy,
    guard: &mut Guard,
    shell: &Path,
    command: &str,
    env: &[(String, String)],
) -> Result<Vec<OsString>, SandboxError> {
    let root = policy.root.canonicalize().map_err(|e| {
        SandboxError::Policy(format!(
            "the root {} is not usable: {e}",
            policy.root.display()
        ))
    })?;
    let mut args = Args::default();
    args.flags(&[
        "--die-with-parent",
        "--new-session",
        "--unshare-all",
        "--cap-drop",
        "ALL",
    ]);
    if policy.network == Network::On {
        args.flags(&["--share-net"]);
    }
    let bridge = match &policy.network {
        Network::Domains(domains) => {
            let helper = helper::program(policy)?;
            let proxy = Proxy::start(DomainRules::new(domains))?;
            args.mount("--ro-bind", &helper, Path::new(HELPER_INSIDE));
            args.mount("--ro-bind", proxy.dir(), Path::new(PROXY_DIR_INSIDE));
            let url = format!("http://127.0.0.1:{PORT_INSIDE}");
            for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                args.flags(&["--setenv", name, &url]);
            }
            let socket = Path::new(PROXY_DIR_INSIDE).join("proxy.sock");
            guard.proxy = Some(proxy);
            Some(socket)
        }
        Network::Off | Network::On => None,
    };
    for dir in &policy.system {
        args.mount("--ro-bind-try", dir, dir);
    }
    if let Some(bytes) = policy.limits.max_tmp_size {
        args.flags(&["--size", &bytes.max(1 << 20).to_string()]);
    }
    args.flags(&["--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]);
    // The kernel's settings and hardware controls stay read-only whoever runs the command
    // (bubblewrap covers them itself only when it could write them, which misses root).
    for dir in PROC_READ_ONLY {
        let path = Path::new("/proc").join(dir);
        args.mount("--ro-bind-try", &path, &path);
    }
    for path in &policy.extra_read {
        args.mount("--ro-bind-try", path, path);
    }
    let root_bind = match policy.root_access {
        RootAccess::Write => "--bind",
        RootAccess::Read => "--ro-bind",
    };
    args.mount(root_bind, &root, &root);
    for path in &policy.extra_write {
        args.mount("--bind-try", path, path);
    }
    // Run as root, the command still owns root's files: mask those no one else may read.
    if rustix::process::geteuid().is_root() {
        let visible: Vec<PathBuf> = policy
            .system
            .iter()
            .chain(&policy.extra_read)
            .cloned()
            .collect();
        // The root and the writable paths are the command's to use, whatever their modes.
        let writable = |path: &Path| {
            path.starts_with(&root) || policy.extra_write.iter().any(|w| path.starts_with(w))
        };
        for path in crate::private::root_only(&visible)
            .iter()
            .filter(|path| !writable(path))
        {
            if path.is_dir() {
                args.flags(&["--tmpfs"]);
                args.path(path);
                args.flags(&["--remount-ro"]);
                args.path(path);
            } else {
                args.mount("--ro-bind", Path::new("/dev/null"), path);
            }
        }
    }
    if policy.root_access == RootAccess::Write {
        // Read-only names stay read-only whether or not they exist: a missing one gets an
        // empty placeholder directory, so a command cannot create it (a `.git/hooks` or an
        // `.agents/` planted for later runs).
        for name in policy.protected.iter().chain(&policy.read_only) {
            let path = protected_path(&root, name)?;
            if let Some(placeholder) = Placeholder::acquire(&path)? {
                guard.placeholders.push(placeholder);
            }
            args.mount("--ro-bind", &path, &path);
        }
    }
    // A worktree's git directories, as decided when the policy was made.
    for dir in &policy.git_dirs {
        args.mount("--ro-bind-try", dir, dir);
    }
    for path in &policy.hidden {
        let Some(inside) = inside_root(&root, &root.join(path)) else {
            continue;
        };
        if inside.is_dir() {
            args.flags(&["--tmpfs"]);
            args.path(&inside);
            args.flags(&["--remount-ro"]);
            args.path(&inside);
        } else {
            args.mount("--ro-bind", Path::new("/dev/null"), &inside);
        }
    }
    for (name, value) in env {
        args.flags(&["--setenv", name, value]);
    }
    args.flags(&["--chdir"]);
    args.path(&root);
    for filter in &guard.filters {
        args.flags(&["--add-seccomp-fd", &filter.as_raw_fd().to_string()]);
    }
    args.flags(&["--"]);
    if let Some(socket) = bridge {
        args.flags(&[HELPER_INSIDE, helper::ARG, "bridge", "--socket"]);
        args.path(&socket);
        args.flags(&["--"]);
    }
    args.0
        .extend(crate::shell_invocation(policy, guard, shell, command));
    Ok(args.0)
}

/// `path` resolved, when it exists and stays inside `root` (a symlink out of the root is not
/// followed: its target is not in the sandbox anyway).
fn inside_root(root: &Path, path: &Path) -> Option<PathBuf> {
    let resolved = path.canonicalize().ok()?;
    resolved.starts_with(root).then_some(resolved)
}

/// Entries of `/proc` mounted read-only over the sandbox's own `/proc`.
const PROC_READ_ONLY: [&str; 8] = [
    "sys",
    "sysrq-trigger",
    "irq",
    "bus",
    "fs",
    "acpi",
    "scsi",
    "driver",
];

/// Where a read-only name of the root is, refusing one reached through a symlink: a command
/// could replace the link itself, which no mount can hold.
fn protected_path(root: &Path, name: &Path) -> Result<PathBuf, SandboxError> {
    let mut path = root.to_path_buf();
    for part in name.components() {
        match part {
            std::path::Component::Normal(part) => path.push(part),
            std::path::Component::CurDir => {}
            _ => {
                return Err(SandboxError::Policy(format!(
                    "the read-only name {} must be a plain path inside the root",
                    name.display()
                )));
            }
        }
        if path
            .symlink_metadata()
            .is_ok_and(|meta| meta.file_type().is_symlink())
        {
            return Err(SandboxError::Policy(format!(
                "the read-only name {} is reached through the symlink {}, which commands could replace; make it a real directory or file, or take it off the protected names",
                name.display(),
                path.display()
            )));
        }
    }
    Ok(path)
}

/// Placeholders in use, by path: how many commands use each, and the directories made for
/// it (outermost first). The last command to end removes them.
static PLACEHOLDERS: Mutex<BTreeMap<PathBuf, (usize, Vec<PathBuf>)>> = Mutex::new(BTreeMap::new());

/// An empty directory standing in for a missing read-only name while a command runs, removed
/// afterwards when still empty (the host may have made it real meanwhile).
#[derive(Debug)]
pub(crate) struct Placeholder {
    path: PathBuf,
}

impl Placeholder {
    /// A placeholder at `path` when nothing real is there (`None` when something is).
    fn acquire(path: &Path) -> Result<Option<Self>, SandboxError> {
        let mut users = PLACEHOLDERS.lock().map_err(|_| {
            SandboxError::Policy("the placeholder registry was poisoned".to_owned())
        })?;
        if let Some((count, _)) = users.get_mut(path) {
            *count += 1;
            return Ok(Some(Self {
                path: path.to_path_buf(),
            }));
        }
        if path.exists() {
            return Ok(None);
        }
        let mut missing: Vec<PathBuf> = path
            .ancestors()
            .take_while(|dir| !dir.exists())
            .map(Path::to_path_buf)
            .collect();
        missing.reverse();
        for (made, dir) in missing.iter().enumerate() {
            if let Err(e) = std::fs::create_dir(dir) {
                for dir in missing[..made].iter().rev() {
                    let _ = std::fs::remove_dir(dir);
                }
                return Err(SandboxError::Policy(format!(
                    "cannot make a read-only placeholder at {}: {e}",
                    dir.display()
                )));
            }
        }
        users.insert(path.to_path_buf(), (1, missing));
        Ok(Some(Self {
            path: path.to_path_buf(),
        }))
    }
}

impl Drop for Placeholder {
    fn drop(&mut self) {
        let Ok(mut users) = PLACEHOLDERS.lock() else {
            return;
        };
        let Some((count, _)) = users.get_mut(&self.path) else {
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        if let Some((_, made)) = users.remove(&self.path) {
            for dir in made.iter().rev() {
                // Fails, and keeps it, when something was put there since.
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

#[derive(Default)]
struct Args(Vec<OsString>);

impl Args {
    fn flags(&mut self, flags: &[&str]) {
        self.0.extend(flags.iter().map(OsString::from));
    }

    fn path(&mut self, path: &Path) {
        self.0.push(path.as_os_str().to_owned());
    }

    fn mount(&mut self, how: &str, source: &Path, target: &Path) {
        self.flags(&[how]);
        self.path(source);
        self.path(target);
    }
}
