//! The bubblewrap command line that expresses a [`Policy`].

use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::{INSTALL_HINT, Network, Policy, RootAccess, SandboxError};

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
/// paths, then the read-only and hidden paths inside the root.
pub(crate) fn arguments(
    policy: &Policy,
    filters: &[OwnedFd],
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
    for filter in filters {
        args.flags(&["--add-seccomp-fd", &filter.as_raw_fd().to_string()]);
    }
    args.flags(&["--"]);
    args.path(shell);
    match limits(policy) {
        // Limits set by the shell before it hands over to the command, so they hold for
        // everything the command starts, with no window in which a child escapes them.
        Some(ulimit) => {
            // `sh -c SCRIPT SHELL COMMAND`: in the script `$0` is the shell, `$1` the command.
            args.flags(&[
                "-c",
                &format!("{ulimit} || exit 125; exec \"$0\" -c \"$1\""),
            ]);
            args.path(shell);
            args.flags(&[command]);
        }
        None => args.flags(&["-c", command]),
    }
    Ok(args.0)
}

/// The `ulimit` command that sets the policy's limits, if it has any. `-f` counts 512-byte
/// blocks in POSIX shells.
fn limits(policy: &Policy) -> Option<String> {
    let mut parts = Vec::new();
    if let Some(bytes) = policy.limits.max_file_size {
        parts.push(format!("ulimit -f {}", bytes.div_ceil(512).max(1)));
    }
    if let Some(seconds) = policy.limits.max_cpu_seconds {
        parts.push(format!("ulimit -t {}", seconds.max(1)));
    }
    (!parts.is_empty()).then(|| parts.join(" && "))
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
