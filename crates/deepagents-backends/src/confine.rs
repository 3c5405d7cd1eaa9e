//! Confinement: opening paths under a backend's root without ever leaving it.
//!
//! This module is the security boundary of [`FilesystemBackend`](crate::FilesystemBackend), and
//! so of the file operations of [`LocalShellBackend`](crate::LocalShellBackend). Everything the
//! disk backend opens, lists, writes or deletes is reached through a [`RootDir`], whose
//! descriptor of the root directory never leaves this module: no other code can resolve a path
//! against the root except through the methods below.
//!
//! # What it guarantees (virtual mode)
//!
//! - [`RootDir::open`] resolves a root-relative path *beneath* the root descriptor, never as a
//!   string checked first and opened later. With `openat2` (Linux 5.6+) it passes
//!   `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`: the kernel refuses (`EXDEV`) any resolution that
//!   would leave the root, by an absolute symlink, a relative one climbing out or a `/proc`
//!   magic link, atomically, so an entry swapped for a symlink between two calls cannot
//!   redirect the second. Absolute symlinks are refused even when they name a place inside the
//!   root. Loops end in `ELOOP`; `EAGAIN` (a concurrent rename) is retried a few times.
//! - Without `openat2` (old kernels, some seccomp filters), or with symlinks turned off, it walks
//!   one component at a time from the root with `O_NOFOLLOW` and refuses every symlink
//!   (`ELOOP`), including one at the last component of an `O_PATH` open.
//! - [`RootDir::write_target`] follows a symlink at a write's target hop by hop (at most 40),
//!   each hop's directory opened by [`RootDir::open`]; an absolute link target stays absolute,
//!   so the kernel refuses it as it would for a read. It hands back a directory descriptor and
//!   a single name in it (no `/`, never empty, `.` or `..`), so the write then creates and
//!   renames relative to a directory already resolved beneath the root.
//! - Walks (glob, grep) never list a directory by path: the base is opened beneath the root by
//!   [`RootDir::open_walk_base`], and each directory below it by [`open_subdir`], one name
//!   relative to its parent's descriptor with `O_NOFOLLOW | O_DIRECTORY`; entries are read from
//!   that descriptor and files opened relative to it by [`open_child`] (a symlink entry is
//!   resolved from the root, by the rule above). A directory swapped for a symlink during a walk
//!   can hide files, never show the names or contents of an outside one. [`addressable`] drops
//!   names that no [`VPath`] could hold.
//! - [`remove_tree`] deletes a tree through directory descriptors opened with `O_NOFOLLOW`: it
//!   removes symlinks, never what they point to.
//!
//! In non-virtual mode none of this holds: paths are opened with plain `openat` from the host's
//! `/`, symlinks followed freely.
//!
//! # What it relies on
//!
//! - Paths come in as [`VPath`]s (absolute, no `..`, no backslash, no control character) and are
//!   made root-relative by [`rel`], so no `openat` ever ignores the root descriptor. The
//!   `O_NOFOLLOW` walk does not refuse `..` itself: every path given to [`RootDir::open`] must
//!   be as clean as a [`VPath`]. Symlink targets, which may hold `..` or be absolute, only
//!   reach it where `openat2` checks them.
//! - Callers open anything further only relative to the descriptors handed out here, one name
//!   at a time with `O_NOFOLLOW` or `AT_SYMLINK_NOFOLLOW`; never by host path.
//! - The host: `openat2`, `O_PATH`, `O_NOFOLLOW` and the `*at` calls behave as on Linux.
//!   Confinement is by name: mount points inside the root are crossed like directories (a bind
//!   mount of an outside directory exposes it), and a hard link inside the root to an outside
//!   file is that file. The root is held by descriptor, so renaming or replacing the root
//!   directory itself does not redirect anything.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

use crate::path::VPath;

/// Retries of an `openat2` that failed with `EAGAIN` (a concurrent rename during resolution).
const EAGAIN_RETRIES: usize = 16;

/// Symlinks followed to find the file a write replaces (the kernel's `MAXSYMLINKS`).
const MAX_SYMLINKS: usize = 40;

/// Directory levels above a directory at most (`PATH_MAX` bytes of `a/`).
const MAX_DEPTH: usize = 2048;

/// How paths are resolved against the root descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resolver {
    /// `openat2` with `RESOLVE_BENEATH`: in-root symlinks followed, escapes refused.
    Beneath,
    /// An `O_NOFOLLOW` walk: every symlink refused (hosts without `openat2`).
    NoSymlinks,
    /// Non-virtual mode: plain `openat` from `/`.
    Host,
}

/// The directory virtual `/` maps to, held open; every path is resolved relative to it.
#[derive(Debug)]
pub(crate) struct RootDir {
    /// The host directory virtual `/` maps to: the root, or `/` in non-virtual mode.
    host_root: PathBuf,
    /// An `O_PATH` descriptor of `host_root`.
    fd: OwnedFd,
    resolver: Resolver,
}

/// Why [`RootDir::write_target`] found no file to write.
#[derive(Debug)]
pub(crate) enum TargetError {
    /// A host call failed or refused: `ELOOP` for a symlink that may not be followed here (or
    /// too many of them), `EXDEV` for one that leaves the root.
    Host(Errno),
    /// The path, or a symlink on the way, names a directory (the root, or a link to `.`, `..`
    /// or `dir/`).
    Directory,
    /// A symlink on the way has a target that is not UTF-8.
    NotUtf8,
}

impl RootDir {
    /// Opens `root` (a canonical directory path). In virtual mode it is the root everything is
    /// confined to, with in-root symlinks followed when `follow_symlinks` is set and the host
    /// has `openat2`; otherwise virtual paths are host paths, resolved from `/`.
    pub(crate) fn new(
        root: &Path,
        virtual_mode: bool,
        follow_symlinks: bool,
    ) -> Result<Self, Errno> {
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let root_fd = rustix::fs::open(root, dir_flags, Mode::empty())?;
        if !virtual_mode {
            let slash = rustix::fs::open("/", dir_flags, Mode::empty())?;
            return Ok(Self {
                host_root: PathBuf::from("/"),
                fd: slash,
                resolver: Resolver::Host,
            });
        }
        let probe = rustix::fs::openat2(
            &root_fd,
            ".",
            dir_flags,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
        );
        let resolver = match probe {
            Ok(_) if !follow_symlinks => Resolver::NoSymlinks,
            Ok(_) => Resolver::Beneath,
            // Old kernels and some seccomp filters lack openat2.
            Err(Errno::NOSYS | Errno::PERM | Errno::INVAL) => Resolver::NoSymlinks,
            Err(e) => return Err(e),
        };
        Ok(Self {
            host_root: root.to_owned(),
            fd: root_fd,
            resolver,
        })
    }

    /// The host directory virtual `/` maps to: the root, or `/` in non-virtual mode.
    pub(crate) fn host_root(&self) -> &Path {
        &self.host_root
    }

    /// Whether virtual paths are confined to the root.
    pub(crate) fn is_virtual(&self) -> bool {
        !matches!(self.resolver, Resolver::Host)
    }

    /// Whether symlinks inside the root are followed.
    pub(crate) fn follows_symlinks(&self) -> bool {
        !matches!(self.resolver, Resolver::NoSymlinks)
    }

    /// Opens `rel` (relative to the host root) without ever leaving the root in virtual mode.
    pub(crate) fn open(&self, rel: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        let flags = flags | OFlags::CLOEXEC;
        match self.resolver {
            Resolver::Beneath => {
                let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
                let mut attempt = 0;
                loop {
                    match rustix::fs::openat2(&self.fd, rel, flags, mode, resolve) {
                        Err(Errno::AGAIN) if attempt < EAGAIN_RETRIES => attempt += 1,
                        result => return result,
                    }
                }
            }
            Resolver::Host => rustix::fs::openat(&self.fd, rel, flags, mode),
            Resolver::NoSymlinks => self.open_no_symlinks(rel, flags, mode),
        }
    }

    /// The fallback walk: one component at a time from the root, never following a symlink.
    fn open_no_symlinks(&self, rel: &str, flags: OFlags, mode: Mode) -> Result<OwnedFd, Errno> {
        let segments: Vec<&str> = rel
            .split('/')
            .filter(|s| !s.is_empty() && *s != ".")
            .collect();
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let Some((last, dirs)) = segments.split_last() else {
            return rustix::fs::openat(&self.fd, ".", flags, mode);
        };
        let mut current = rustix::fs::openat(&self.fd, ".", dir_flags, Mode::empty())?;
        for dir in dirs {
            current = match rustix::fs::openat(&current, *dir, dir_flags, Mode::empty()) {
                Ok(fd) => fd,
                Err(Errno::NOTDIR) => {
                    let stat = rustix::fs::statat(&current, *dir, AtFlags::SYMLINK_NOFOLLOW)?;
                    return Err(match FileType::from_raw_mode(stat.st_mode) {
                        FileType::Symlink => Errno::LOOP,
                        _ => Errno::NOTDIR,
                    });
                }
                Err(e) => return Err(e),
            };
        }
        let fd = rustix::fs::openat(&current, *last, flags | OFlags::NOFOLLOW, mode)?;
        // O_PATH | O_NOFOLLOW opens a symlink itself instead of failing: refuse it like any
        // other open would, so nothing treats the link as its target.
        if flags.contains(OFlags::PATH)
            && FileType::from_raw_mode(rustix::fs::fstat(&fd)?.st_mode) == FileType::Symlink
        {
            return Err(Errno::LOOP);
        }
        Ok(fd)
    }

    /// Metadata of what `rel` resolves to (inside the root).
    pub(crate) fn stat(&self, rel: &str) -> Result<Stat, Errno> {
        let fd = self.open(rel, OFlags::PATH, Mode::empty())?;
        rustix::fs::fstat(&fd)
    }

    /// A directory descriptor to create, rename and sync in, resolved beneath the root.
    pub(crate) fn open_dir(&self, rel: &str) -> Result<OwnedFd, Errno> {
        match self.open(rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()) {
            // A directory we may write but not list: a path descriptor still serves the `*at`
            // calls; only its sync is lost.
            Err(Errno::ACCESS) => self.open(rel, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()),
            result => result,
        }
    }

    /// Opens the directory `rel` to walk it: resolved beneath the root like any path, except
    /// that a symlink at the last component is refused (`ELOOP`), since walks never descend
    /// into symlinked directories, their base included.
    pub(crate) fn open_walk_base(&self, rel: &str) -> Result<OwnedFd, Errno> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW;
        self.open(rel, flags, Mode::empty())
    }

    /// The identities of `dir` and of each directory above it, up to the host root (or up to
    /// the host's `/`, for a directory moved out of the root meanwhile), found through `..` of
    /// the descriptors: where a directory really is, whatever path led to it.
    pub(crate) fn lineage(&self, dir: BorrowedFd<'_>) -> Result<Vec<FileId>, Errno> {
        let root = FileId::of(&rustix::fs::fstat(&self.fd)?);
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let mut lineage = vec![FileId::of(&rustix::fs::fstat(dir)?)];
        let mut current = rustix::fs::openat(dir, ".", flags, Mode::empty())?;
        // Bounded like a path: PATH_MAX bytes hold at most this many levels.
        for _ in 0..MAX_DEPTH {
            if lineage.last() == Some(&root) {
                return Ok(lineage);
            }
            current = rustix::fs::openat(&current, "..", flags, Mode::empty())?;
            let id = FileId::of(&rustix::fs::fstat(&current)?);
            // `..` of `/` is `/` itself.
            if lineage.last() == Some(&id) {
                return Ok(lineage);
            }
            lineage.push(id);
        }
        Err(Errno::NAMETOOLONG)
    }

    /// The directory (opened beneath the root) and the name in it that a write of `path`
    /// replaces or creates. A symlink at the name is followed hop by hop, each hop's directory
    /// opened beneath the root like any path, since renaming over the link would replace the
    /// link instead of writing through it.
    pub(crate) fn write_target(&self, path: &VPath) -> Result<(OwnedFd, String), TargetError> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(TargetError::Directory);
        };
        let mut dir_rel = rel(&parent).to_owned();
        let mut name = name.to_owned();
        for _ in 0..=MAX_SYMLINKS {
            let dir = self.open_dir(&dir_rel).map_err(TargetError::Host)?;
            let stat = match rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(stat) => stat,
                Err(Errno::NOENT) => return Ok((dir, name)),
                Err(e) => return Err(TargetError::Host(e)),
            };
            if FileType::from_raw_mode(stat.st_mode) != FileType::Symlink {
                return Ok((dir, name));
            }
            if self.resolver == Resolver::NoSymlinks {
                return Err(TargetError::Host(Errno::LOOP));
            }
            let target = rustix::fs::readlinkat(&dir, name.as_str(), Vec::new())
                .map_err(TargetError::Host)?;
            let target = target.to_str().map_err(|_| TargetError::NotUtf8)?;
            let (link_dir, link_name) = match target.rsplit_once('/') {
                Some(("", last)) => ("/", last),
                Some((dir, last)) => (dir, last),
                None => ("", target),
            };
            if matches!(link_name, "" | "." | "..") {
                return Err(TargetError::Directory);
            }
            // An absolute target stays absolute: resolved beneath the root the kernel refuses
            // it, exactly as it does when a read goes through the same link.
            if link_dir.starts_with('/') {
                dir_rel = link_dir.to_owned();
            } else if !link_dir.is_empty() {
                dir_rel = join_rel(&dir_rel, link_dir);
            }
            name = link_name.to_owned();
        }
        Err(TargetError::Host(Errno::LOOP))
    }
}

/// `path` relative to the host root, `.` for the root.
pub(crate) fn rel(path: &VPath) -> &str {
    if path.is_root() {
        "."
    } else {
        path.as_str().trim_start_matches('/')
    }
}

/// `name` inside the root-relative directory `dir`.
pub(crate) fn join_rel(dir: &str, name: &str) -> String {
    if dir == "." {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

/// Whether a name found by a walk can be part of a [`VPath`]: directory entries are never
/// empty, `.` or `..` (walks skip those) and hold no `/`, so only backslashes and control
/// characters can spoil it.
pub(crate) fn addressable(name: &str) -> bool {
    !name.contains('\\') && !name.chars().any(char::is_control)
}

/// Opens the subdirectory `name` of `parent` (a directory opened beneath the root) to list it:
/// a single name with `O_NOFOLLOW | O_DIRECTORY`, so it is the directory `parent` holds under
/// that name, or nothing: `ELOOP` for a symlink (swapped in or not), `ENOTDIR` for a file.
pub(crate) fn open_subdir(parent: BorrowedFd<'_>, name: &str) -> Result<OwnedFd, Errno> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(parent, name, flags, Mode::empty())
}

/// Opens the entry `name` of `parent` (a directory opened beneath the root) with `flags`, never
/// following a symlink at it (`ELOOP`).
pub(crate) fn open_child(
    parent: BorrowedFd<'_>,
    name: &str,
    flags: OFlags,
) -> Result<OwnedFd, Errno> {
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat(parent, name, flags, Mode::empty())
}

/// A file's identity: its device and inode numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    // The stat field types differ between architectures; the conversions are no-ops on some.
    #[allow(clippy::useless_conversion)]
    pub(crate) fn of(stat: &Stat) -> Self {
        Self {
            dev: u64::from(stat.st_dev),
            ino: u64::from(stat.st_ino),
        }
    }
}

/// Deletes the directory `name` in `parent` and everything below it, without following
/// symlinks: each level is opened with `O_NOFOLLOW` relative to its parent's descriptor.
/// Returns the number of non-directory entries removed.
pub(crate) fn remove_tree<P: rustix::path::Arg + Copy>(
    parent: BorrowedFd<'_>,
    name: P,
) -> Result<usize, Errno> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(parent, name, flags, Mode::empty())?;
    let mut dir = Dir::new(fd)?;
    let mut names = Vec::new();
    while let Some(entry) = dir.read() {
        let entry = entry?;
        let entry_name = entry.file_name().to_bytes();
        if entry_name != b"." && entry_name != b".." {
            names.push(entry.file_name().to_owned());
        }
    }
    let dir_fd = dir.fd()?;
    let mut removed = 0;
    for child in &names {
        let stat = rustix::fs::statat(dir_fd, child.as_c_str(), AtFlags::SYMLINK_NOFOLLOW)?;
        if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
            removed += remove_tree(dir_fd, child.as_c_str())?;
        } else {
            rustix::fs::unlinkat(dir_fd, child.as_c_str(), AtFlags::empty())?;
            removed += 1;
        }
    }
    rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)?;
    Ok(removed)
}
