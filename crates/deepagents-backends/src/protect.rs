//! Names inside the root that the file tools may not change: the sandbox's protected names
//! (`.git`, `.deepagents`, `.agents` by default), so that writing through the file tools is no
//! way around the read-only mounts commands get.
//!
//! Each change is checked twice. First by its virtual path, normalized, which refuses names
//! that do not exist yet and every spelling of the path (`/./.git/x`). Then by where its target
//! really is, once the target's directory is open: the directory's identity and those of the
//! directories above it ([`RootDir::lineage`]) are compared with the identity of each
//! protected name that exists, and a target that would create a protected name is recognized
//! by its directory and name. So a symlink inside the root that resolves to a protected name
//! (`link -> .git`, then `link/config`) is caught, as is a protected name reached through a
//! different spelling on a case-insensitive filesystem. A protected name is itself resolved
//! beneath the root, following in-root symlinks, since the sandbox protects what such a link
//! points to.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Component, Path};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::confine::{FileId, RootDir, rel};
use crate::path::VPath;
use crate::protocol::BackendError;

/// The protected names of a backend, as virtual paths, and the files inside them that stay
/// editable.
#[derive(Clone, Debug, Default)]
pub(crate) struct Protected {
    names: Vec<VPath>,
    editable: Vec<VPath>,
}

/// How a change touches its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Change {
    /// Creates or replaces the entry (write, edit, upload, a new parent directory).
    Entry,
    /// Removes the entry and, for a directory, everything below it (delete).
    Tree,
}

impl Protected {
    /// Protects `names` (relative to `root`, or absolute host paths inside it), replacing the
    /// names protected before. `base` is the virtual path of `root`: `/`, or the root itself
    /// in non-virtual mode. Names outside the root, or that no virtual path can hold, are
    /// left out, as the sandbox leaves out names outside the root.
    pub(crate) fn set_names<P: AsRef<Path>>(
        &mut self,
        root: &Path,
        base: &VPath,
        names: impl IntoIterator<Item = P>,
    ) {
        self.names = names
            .into_iter()
            .filter_map(|name| virtual_of(root, base, name.as_ref()))
            .collect();
    }

    /// Keeps `path` (relative to `root`, like a name) editable inside a protected name.
    pub(crate) fn add_editable(&mut self, root: &Path, base: &VPath, path: &Path) {
        if let Some(path) = virtual_of(root, base, path)
            && !self.editable.contains(&path)
        {
            self.editable.push(path);
        }
    }

    /// Refuses a change of `path` when, by its virtual path, it is or lies beneath a protected
    /// name, or (for [`Change::Tree`]) holds one.
    pub(crate) fn check_path(&self, path: &VPath, change: Change) -> Result<(), BackendError> {
        if self.editable.contains(path) {
            return Ok(());
        }
        let hit = self.names.iter().find(|name| {
            path.starts_with(name) || (change == Change::Tree && name.starts_with(path))
        });
        match hit {
            Some(name) => Err(refusal(path, name)),
            None => Ok(()),
        }
    }

    /// Refuses a change of the entry `name` in `dir` (a directory opened beneath the root, any
    /// symlink at the name already resolved by the caller) when it really is, or lies beneath,
    /// a protected name, or (for [`Change::Tree`]) holds one. `path` is what the change is
    /// shown as.
    pub(crate) fn check_entry(
        &self,
        root_dir: &RootDir,
        dir: BorrowedFd<'_>,
        name: &str,
        change: Change,
        path: &VPath,
    ) -> Result<(), BackendError> {
        if self.names.is_empty() {
            return Ok(());
        }
        let host = |errno: Errno| BackendError::PermissionDenied {
            path: path.to_string(),
            reason: format!(
                "cannot tell whether it is inside a protected name ({})",
                std::io::Error::from(errno)
            ),
        };
        let lineage = root_dir.lineage(dir).map_err(host)?;
        let dir_id = lineage[0];
        let is_at = |target: &VPath| {
            let (Some(parent), Some(last)) = (target.parent(), target.file_name()) else {
                return false;
            };
            last == name
                && root_dir
                    .stat(rel(&parent))
                    .is_ok_and(|stat| FileId::of(&stat) == dir_id)
        };
        if self.editable.iter().any(is_at) {
            return Ok(());
        }
        let entry = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => Some(stat),
            Err(Errno::NOENT) => None,
            Err(errno) => return Err(host(errno)),
        };
        for protected in &self.names {
            // The entry is the name, existing or about to be created.
            if is_at(protected) {
                return Err(refusal(path, protected));
            }
            let Ok(found) = root_dir.open(rel(protected), OFlags::PATH, Mode::empty()) else {
                continue;
            };
            let id = FileId::of(&rustix::fs::fstat(&found).map_err(host)?);
            // The entry lies beneath the name, or is it under another path (a hard link, or
            // another spelling on a case-insensitive filesystem).
            if lineage.contains(&id) || entry.as_ref().is_some_and(|e| FileId::of(e) == id) {
                return Err(refusal(path, protected));
            }
            // Removing the entry's tree would remove the name below it.
            if change == Change::Tree
                && let Some(entry) = &entry
                && FileType::from_raw_mode(entry.st_mode) == FileType::Directory
                && root_dir
                    .lineage(found.as_fd())
                    .map_err(host)?
                    .contains(&FileId::of(entry))
            {
                return Err(refusal(path, protected));
            }
        }
        Ok(())
    }
}

/// The error for a change of `path` refused because of the protected name `name`.
fn refusal(path: &VPath, name: &VPath) -> BackendError {
    BackendError::PermissionDenied {
        path: path.to_string(),
        reason: format!(
            "{name} is protected: the sandbox keeps it read-only, for commands and the file \
             tools alike (reading it is allowed). To let the agent change it, remove it from \
             `protected` under `[sandbox]` in the deepagents config (or from the sandbox \
             policy's protected names)"
        ),
    }
}

/// The virtual path of `name` (relative to `root`, or an absolute host path inside it), with
/// `.` and `..` resolved by name; `None` when it leaves the root or is not UTF-8.
fn virtual_of(root: &Path, base: &VPath, name: &Path) -> Option<VPath> {
    let relative = if name.is_absolute() {
        name.strip_prefix(root).ok()?
    } else {
        name
    };
    let mut segments: Vec<&str> = Vec::new();
    for component in relative.components() {
        match component {
            Component::Normal(segment) => segments.push(segment.to_str()?),
            Component::CurDir => {}
            Component::ParentDir => {
                segments.pop()?;
            }
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    if segments.is_empty() {
        return Some(base.clone());
    }
    base.join(&segments.join("/")).ok()
}
