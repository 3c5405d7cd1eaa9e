//! The bubblewrap command line that expresses a [`Policy`].

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

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
    args.flags(&["--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]);
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
    for name in &policy.protected {
        let path = root.join(name);
        if let Some(inside) = inside_root(&root, &path) {
            args.mount("--ro-bind", &inside, &inside);
        }
        // A worktree's `.git` file names the real git directory, which stays read-only too.
        if let Some(gitdir) = gitdir_of(&root, &path) {
            args.mount("--ro-bind", &gitdir, &gitdir);
        }
    }
    for path in &policy.read_only {
        if let Some(inside) = inside_root(&root, &root.join(path)) {
            args.mount("--ro-bind", &inside, &inside);
        }
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
    args.0.extend(crate::shell_invocation(
        policy,
        guard.cgroup.is_some(),
        shell,
        command,
    ));
    Ok(args.0)
}

/// `path` resolved, when it exists and stays inside `root` (a symlink out of the root is not
/// followed: its target is not in the sandbox anyway).
fn inside_root(root: &Path, path: &Path) -> Option<PathBuf> {
    let resolved = path.canonicalize().ok()?;
    resolved.starts_with(root).then_some(resolved)
}

/// The git directory a `.git` file points to (`gitdir: PATH`), resolved.
fn gitdir_of(root: &Path, path: &Path) -> Option<PathBuf> {
    if path.file_name()? != ".git" || !path.is_file() {
        return None;
    }
    let text = std::fs::read_to_string(path).ok()?;
    let target = text
        .lines()
        .find_map(|line| line.strip_prefix("gitdir:"))?
        .trim();
    root.join(target).canonicalize().ok()
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
