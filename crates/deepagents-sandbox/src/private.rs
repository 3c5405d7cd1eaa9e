//! What only root may read among the host paths a command sees.
//!
//! A command started by root is host uid 0 inside the sandbox, without capabilities: it still
//! owns root's files, so owner permissions let it read `/etc/shadow`, SSH host keys or
//! `/etc/ssl/private`. Both engines take away what no other user may read: bubblewrap masks
//! it, Landlock leaves it out of its rules. Found by mode bits, not a list of names: a file
//! that others may not read, or a directory others may not open.
//!
//! The program directories (`/usr` but `/usr/local`, `/bin`, `/sbin`, `/lib*`) are not
//! searched: packages put programs there, not secrets, and walking them costs a second.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Directories left as they are (programs and libraries).
const PROGRAM_DIRS: [&str; 6] = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64"];

/// Entries looked at per search at most, so a huge extra path cannot stall every command.
const MAX_ENTRIES: usize = 200_000;

/// The paths under `visible` (or `visible` themselves) that only their owner or group may
/// read, outermost only; searched once per process and set of paths.
pub(crate) fn root_only(visible: &[PathBuf]) -> Arc<Vec<PathBuf>> {
    type Cache = BTreeMap<Vec<PathBuf>, Arc<Vec<PathBuf>>>;
    static CACHE: Mutex<Cache> = Mutex::new(BTreeMap::new());
    if let Ok(cache) = CACHE.lock()
        && let Some(found) = cache.get(visible)
    {
        return Arc::clone(found);
    }
    let mut found = Vec::new();
    let mut budget = MAX_ENTRIES;
    for path in visible {
        if let Ok(path) = path.canonicalize() {
            search(&path, &mut found, &mut budget);
        }
    }
    found.sort();
    found.dedup();
    let found = Arc::new(found);
    if let Ok(mut cache) = CACHE.lock() {
        cache.insert(visible.to_vec(), Arc::clone(&found));
    }
    found
}

fn is_program_dir(path: &Path) -> bool {
    !path.starts_with("/usr/local") && PROGRAM_DIRS.iter().any(|dir| path.starts_with(dir))
}

fn search(path: &Path, found: &mut Vec<PathBuf>, budget: &mut usize) {
    if *budget == 0 || is_program_dir(path) {
        return;
    }
    *budget -= 1;
    // Not followed: a symlink's target is searched where it is visible, if it is.
    let Ok(meta) = path.symlink_metadata() else {
        return;
    };
    let mode = meta.permissions().mode();
    if meta.is_dir() {
        // Others need both read and search to list and open what is inside.
        if mode & 0o005 != 0o005 {
            found.push(path.to_path_buf());
            return;
        }
        let Ok(entries) = std::fs::read_dir(path) else {
            return;
        };
        for entry in entries.flatten() {
            search(&entry.path(), found, budget);
        }
    } else if meta.is_file() && mode & 0o004 == 0 {
        found.push(path.to_path_buf());
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn finds_what_others_cannot_read_and_skips_program_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::write(root.join("open"), "x").unwrap();
        std::fs::write(root.join("secret"), "x").unwrap();
        std::fs::set_permissions(root.join("secret"), std::fs::Permissions::from_mode(0o640))
            .unwrap();
        std::fs::create_dir_all(root.join("keys/inner")).unwrap();
        std::fs::set_permissions(root.join("keys"), std::fs::Permissions::from_mode(0o710))
            .unwrap();
        let found = root_only(std::slice::from_ref(&root));
        assert_eq!(*found, vec![root.join("keys"), root.join("secret")]);
        assert!(is_program_dir(Path::new("/usr/bin")));
        assert!(!is_program_dir(Path::new("/usr/local/etc")));
        assert!(!is_program_dir(Path::new("/etc")));
    }
}
