//! Locks of the operating system on files beside a SQLite database: they serialize processes
//! opening it and make thread leases that die with the process holding them.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read as _, Write as _};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use deepagents_core::{CheckpointError, ThreadLease, validate_thread_id};

/// An exclusive lock on a file, released when dropped (or when the process dies).
#[derive(Debug)]
pub(super) struct FileLock {
    _file: File,
}

/// Where the lease files of the threads of database `db` live.
pub(super) fn lease_dir(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".threads");
    db.with_file_name(name)
}

/// The lock file that serializes opening database `db`.
pub(super) fn open_lock_path(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push(".open-lock");
    db.with_file_name(name)
}

/// Waits (up to `timeout`) for the exclusive lock on `path`, creating the file if needed.
pub(super) async fn lock(path: &Path, timeout: Duration) -> std::io::Result<FileLock> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    let deadline = Instant::now() + timeout;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(FileLock { _file: file }),
            Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(TryLockError::WouldBlock) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "another process held {} for over {} s",
                        path.display(),
                        timeout.as_secs()
                    ),
                ));
            }
            Err(TryLockError::Error(error)) => return Err(error),
        }
    }
}

fn storage(what: &str, path: &Path, error: std::io::Error) -> CheckpointError {
    CheckpointError::Storage(format!("cannot {what} {}: {error}", path.display()))
}

/// Takes the lease of `thread_id` as a lock on `<dir>/<thread_id>.lock`, which records the
/// holder's process id for the refusal message.
pub(super) fn try_lease(dir: &Path, thread_id: &str) -> Result<ThreadLease, CheckpointError> {
    validate_thread_id(thread_id)?;
    std::fs::create_dir_all(dir).map_err(|e| storage("create", dir, e))?;
    let path = dir.join(format!("{thread_id}.lock"));
    loop {
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| storage("open", &path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                return Err(CheckpointError::Busy {
                    thread_id: thread_id.to_owned(),
                    holder: (!holder.is_empty()).then(|| holder.to_owned()),
                });
            }
            Err(TryLockError::Error(e)) => return Err(storage("lock", &path, e)),
        }
        // Deleting a thread unlinks its lock file while holding it; a file opened just before
        // that is no longer the thread's lock, so take the new one.
        let same = match (file.metadata(), std::fs::metadata(&path)) {
            (Ok(held), Ok(current)) => held.ino() == current.ino() && held.dev() == current.dev(),
            _ => false,
        };
        if !same {
            continue;
        }
        // Best effort: the holder's pid only improves the message another run shows.
        let _ = file.set_len(0);
        let _ = write!(file, "pid {}", std::process::id());
        return Ok(ThreadLease::new(thread_id, FileLock { _file: file }));
    }
}

/// Removes the lease file of a deleted thread, unless a run holds it.
pub(super) fn remove_lease(dir: &Path, thread_id: &str) {
    if validate_thread_id(thread_id).is_err() {
        return;
    }
    if let Ok(lease) = try_lease(dir, thread_id) {
        let _ = std::fs::remove_file(dir.join(format!("{thread_id}.lock")));
        drop(lease);
    }
}
