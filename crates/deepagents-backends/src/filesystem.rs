//! A backend over a real directory on disk.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use grep_matcher::LineTerminator;
use grep_regex::{RegexMatcher, RegexMatcherBuilder};
use grep_searcher::{BinaryDetection, MmapChoice, Searcher, SearcherBuilder, Sink, SinkMatch};
use rustix::fs::{AtFlags, Dir, FileType, FlockOperation, Mode, OFlags, RenameFlags, Stat};
use rustix::io::Errno;

use crate::confine::{RootDir, TargetError, join_rel, open_child, rel, remove_tree};
use crate::glob::GlobPattern;
use crate::mime;
use crate::path::VPath;
use crate::protect::{Change, Protected};
use crate::protocol::{
    Backend, BackendContext, BackendError, BrokenLink, Changed, DEFAULT_MAX_FILE_SIZE, FileInfo,
    FileOpError, GlobResult, GrepMatch, GrepQuery, GrepResult, PathMapping, RawFile, ReadResult,
    SkipReason, SkippedFile,
};
use crate::text;
use crate::walk::{self, Entry, Kind, Visitor, WalkOptions};

/// How long glob and grep may run before returning partial results, unless configured.
pub const DEFAULT_SEARCH_TIMEOUT: Duration = Duration::from_secs(10);

/// grep reads files up to this size whole (exact text/binary classification); larger files are
/// streamed and skipped at their first NUL byte.
const SLURP_LIMIT: u64 = 16 * 1024 * 1024;

/// Bytes read at a time when a file over the size limit is paged or sniffed.
const STREAM_CHUNK: usize = 64 * 1024;

/// Attempts at one write or edit while the file keeps being replaced under it.
const WRITE_ATTEMPTS: usize = 16;

/// Exchanges a write makes to put back an entry that another process swapped in at its target
/// at the last moment, while that process keeps moving entries: enough to outlast it in
/// practice.
const PUT_BACK_ATTEMPTS: usize = 10_000;

/// How long a write or edit waits for the others in the same directory.
const LOCK_TIMEOUT: Duration = Duration::from_secs(30);

/// Numbers the temporary files of this process, so concurrent writes never pick the same name.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A backend storing files in a directory on disk.
///
/// # Confinement (virtual mode, the default)
///
/// Virtual `/` is the root directory and nothing outside it is ever opened, listed, written or
/// deleted. Paths are never checked as strings and then opened: every operation opens its target
/// *relative to a directory descriptor of the root* that is held for the backend's lifetime, and
/// the kernel resolves it beneath that descriptor:
///
/// - On Linux with `openat2` (5.6+) each open uses `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`:
///   the kernel refuses (`EXDEV`) any resolution that would leave the root, whether by an
///   absolute symlink, a relative one climbing out, or `/proc` magic links, and it does so
///   atomically, so a directory swapped for a symlink between two operations cannot redirect
///   the second one. Loops end in `ELOOP`.
/// - Where `openat2` is missing (or with [`FilesystemBackendBuilder::follow_symlinks`] off), a
///   component-by-component `openat` walk with `O_NOFOLLOW` from the root descriptor is used
///   instead and refuses every symlink.
///
/// Symlink rule: a symlink is followed when (and only when) its whole resolution stays inside
/// the root; absolute symlinks are refused even when they name a place inside the root, because
/// the kernel cannot tell. Walks (glob, grep) never descend into symlinked directories (no loops,
/// no double counting) but report symlinked files whose targets are inside the root. They never
/// list a directory by path: the base is opened beneath the root, each directory below it
/// relative to its parent's descriptor with `O_NOFOLLOW | O_DIRECTORY`, and its entries are read
/// and its files opened through that descriptor, so a directory swapped for a symlink during a
/// walk can at most hide files, never show the names or contents of outside ones (in results or
/// in grep's skipped files). Deletion removes a symlink itself, never its target, and recursive
/// deletion walks directory descriptors opened with `O_NOFOLLOW`.
///
/// # Protected names
///
/// With [`FilesystemBackend::with_protected`] (which
/// [`LocalShellBackend::with_sandbox`](crate::LocalShellBackend::with_sandbox) sets from the
/// sandbox policy: `.git`, `.deepagents` and `.agents` by default) writes, edits, deletes and
/// uploads of those names and of anything beneath them are refused, checked by path and again
/// by descriptor, so symlinks inside the root do not get around it.
///
/// # Writes
///
/// `write` only creates: it is refused ([`BackendError::AlreadyExists`]) when a file exists at
/// the path, and a file that appears while it writes is never replaced (the new file is renamed
/// into place with `RENAME_NOREPLACE`, or hard-linked where the filesystem has no rename
/// flags).
///
/// Writes, overwrites, edits and uploads never change a file in place: the new content goes to
/// a temporary file created (`O_EXCL | O_NOFOLLOW`) in the target's directory, itself opened
/// beneath the root, is synced, and is renamed over the target relative to that directory's
/// descriptor. A reader or a crash sees the old content or the new, never a mix, and
/// concurrent writers of one file leave exactly one writer's content. Writers also take an
/// exclusive `flock` on the directory for the few moments of a write, so concurrent edits
/// apply one after the other instead of losing one (processes that do not take it still never
/// tear a file). The replaced file's permission bits are kept. A symlink at the target is
/// followed (by the symlink rule above, each hop resolved beneath the root) and its target
/// replaced (or, for `write`, refused as existing), so the link stays a link. Hard links to
/// the old file keep the old content. One exception: an overwrite or edit of a writable file
/// in a directory the host does not let us add entries to is done in place.
///
/// # Reading large files
///
/// A text file over the size limit is still read page by page: it is streamed once, keeping
/// only the requested lines, so memory stays bounded by the page. Binary files over the limit
/// (which can only be returned whole) are refused.
///
/// # Non-virtual mode
///
/// With `virtual_mode(false)` virtual paths are host paths (`/etc/hosts` is the host's) and
/// symlinks are followed freely; the root only serves as the shell's working directory. Use it
/// only for trusted setups.
///
/// # Search
///
/// glob and grep walk in parallel through directory descriptors (as above) and grep searches
/// with `grep-searcher`. `.gitignore` files are **not** respected by default, so glob and grep
/// agree with ls and with the other backends; turn it on with
/// [`FilesystemBackendBuilder::respect_gitignore`] for large repositories. grep skips `.git`
/// directories, and skips binary files (the same classification as [`crate::mime::classify`])
/// and unreadable ones, naming them in [`GrepResult::skipped`]. Text that is not UTF-8 is
/// searched byte-wise and its matching lines are shown with U+FFFD for invalid bytes. Both
/// stop at the search time budget and return what they found, marked `truncated`; the budget
/// is checked after each entry and after each match, so even a spent budget returns the results
/// of the entries the walk held.
#[derive(Clone, Debug)]
pub struct FilesystemBackend {
    inner: Arc<Inner>,
}

/// Options of a [`FilesystemBackend`]; build one with [`FilesystemBackend::builder`].
#[derive(Clone, Debug)]
pub struct FilesystemBackendBuilder {
    root: PathBuf,
    virtual_mode: bool,
    max_file_size: u64,
    search_timeout: Duration,
    respect_gitignore: bool,
    create_root: bool,
    follow_symlinks: bool,
}

impl FilesystemBackendBuilder {
    /// Whether virtual paths are confined to the root (default `true`). `false` makes virtual
    /// paths host paths: only for trusted setups.
    pub fn virtual_mode(mut self, yes: bool) -> Self {
        self.virtual_mode = yes;
        self
    }

    /// The largest file read, write, edit, upload and download accept, in bytes (default
    /// [`DEFAULT_MAX_FILE_SIZE`], 10 MiB). grep searches larger files all the same, and read
    /// pages through larger text files (keeping at most this many bytes of one page).
    pub fn max_file_size(mut self, bytes: u64) -> Self {
        self.max_file_size = bytes;
        self
    }

    /// How long glob and grep may walk before returning partial results (default 10 s).
    pub fn search_timeout(mut self, timeout: Duration) -> Self {
        self.search_timeout = timeout;
        self
    }

    /// Whether glob and grep skip files ignored by `.gitignore` files, and `.git/info/exclude`,
    /// in the searched directory and below it (default `false`: searches see what ls sees).
    /// Global git configuration, ignore files above the searched directory, symlinked ignore
    /// files and a worktree's exclude file (outside the tree) are never read.
    pub fn respect_gitignore(mut self, yes: bool) -> Self {
        self.respect_gitignore = yes;
        self
    }

    /// Whether symlinks that stay inside the root are followed (default `true`). With `false`
    /// every symlink is refused, the strictest setting (and what hosts without `openat2` get
    /// anyway). Virtual mode only.
    pub fn follow_symlinks(mut self, yes: bool) -> Self {
        self.follow_symlinks = yes;
        self
    }

    /// Whether to create the root directory when it is missing (default `true`).
    pub fn create_root(mut self, yes: bool) -> Self {
        self.create_root = yes;
        self
    }

    /// Opens the root and builds the backend.
    pub fn build(self) -> Result<FilesystemBackend, BackendError> {
        let shown = self.root.display().to_string();
        let io_error = |message: String| BackendError::Io {
            operation: "open root",
            path: shown.clone(),
            message,
        };
        if self.create_root {
            std::fs::create_dir_all(&self.root).map_err(|e| io_error(e.to_string()))?;
        }
        let root = self
            .root
            .canonicalize()
            .map_err(|e| io_error(format!("{e}; check that the root directory exists")))?;
        let root_dir = RootDir::new(&root, self.virtual_mode, self.follow_symlinks)
            .map_err(|e| io_error(e.to_string()))?;
        Ok(FilesystemBackend {
            inner: Arc::new(Inner {
                root,
                root_dir: Arc::new(root_dir),
                max_file_size: self.max_file_size,
                search_timeout: self.search_timeout,
                respect_gitignore: self.respect_gitignore,
                protected: Protected::default(),
            }),
        })
    }
}

impl FilesystemBackend {
    /// A backend over `root` with the default options (virtual mode, 10 MiB files, 10 s search
    /// budget, `.gitignore` not respected); creates `root` when missing.
    pub fn new(root: impl Into<PathBuf>) -> Result<Self, BackendError> {
        Self::builder(root).build()
    }

    /// Options for a backend over `root`.
    pub fn builder(root: impl Into<PathBuf>) -> FilesystemBackendBuilder {
        FilesystemBackendBuilder {
            root: root.into(),
            virtual_mode: true,
            max_file_size: DEFAULT_MAX_FILE_SIZE,
            search_timeout: DEFAULT_SEARCH_TIMEOUT,
            respect_gitignore: false,
            create_root: true,
            follow_symlinks: true,
        }
    }

    /// The root directory on the host (canonical).
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Whether virtual paths are confined to the root.
    pub fn is_virtual(&self) -> bool {
        self.inner.root_dir.is_virtual()
    }

    /// Whether symlinks inside the root are followed (`false` when the host lacks `openat2` and
    /// every symlink is refused instead).
    pub fn follows_symlinks(&self) -> bool {
        self.inner.root_dir.follows_symlinks()
    }

    /// This backend refusing every change (write, overwrite, edit, delete, upload) of `names`
    /// and of everything beneath them, with a permission error that names the protected name,
    /// whether they exist yet or not; reads stay allowed. Names are relative to the root (an
    /// absolute host path inside the root works too; names outside it are left out) and
    /// replace those protected before; an empty list protects nothing.
    ///
    /// These are the sandbox's protected names ([`deepagents_sandbox::Policy::protected`]),
    /// which [`LocalShellBackend::with_sandbox`](crate::LocalShellBackend::with_sandbox) sets,
    /// so the file tools are no way around the read-only mounts commands get. A change is
    /// refused by its virtual path (any spelling), and again by where its target really is once
    /// its directory is open: a symlink inside the root that leads into a protected name, such
    /// as `link -> .git` for `link/config`, is refused too. A delete is also refused when the
    /// directory deleted holds a protected name.
    pub fn with_protected<P: AsRef<Path>>(self, names: impl IntoIterator<Item = P>) -> Self {
        self.with_protection(|protected, root, base| protected.set_names(root, base, names))
    }

    /// This backend letting the file tools change `path` (relative to the root, like the
    /// names of [`with_protected`](Self::with_protected)) although it lies inside a protected
    /// name: a file a product feature asks the agent to keep up to date, such as a memory
    /// file. Exactly that file: not a directory it would need created, nor its siblings.
    pub fn with_editable(self, path: impl AsRef<Path>) -> Self {
        self.with_protection(|protected, root, base| {
            protected.add_editable(root, base, path.as_ref());
        })
    }

    /// This backend with its protection changed by `change`, given the root and its virtual
    /// path.
    fn with_protection(self, change: impl FnOnce(&mut Protected, &Path, &VPath)) -> Self {
        let mut inner = Inner::clone(&self.inner);
        // In non-virtual mode virtual paths are host paths, so the names are the root's own.
        let base = if inner.root_dir.is_virtual() {
            Some(VPath::root())
        } else {
            inner.root.to_str().and_then(|root| VPath::parse(root).ok())
        };
        if let Some(base) = base {
            change(&mut inner.protected, &inner.root, &base);
        }
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Where the file at `path` really is on the host, after the checks that reading it
    /// (`change` false) or changing it (`change` true) makes, without reading or changing
    /// anything: for a caller that hands the file to another program (an editor holding it
    /// in a buffer), which must never be given a path outside the root or inside a protected
    /// name.
    ///
    /// For a read the file must exist and be a regular file; the answer is where it resolves
    /// (symlinks inside the root followed). For a change the path is checked as a write
    /// checks it — by its virtual path against the protected names, then where it would land
    /// once symlinks at the name are followed hop by hop beneath the root — and the answer is
    /// that place, existing or not; missing parent directories are checked as a write would
    /// create them, but not created. The answer holds when it is given: a process changing
    /// the tree meanwhile may move what it names.
    pub async fn host_path(&self, path: &VPath, change: bool) -> Result<PathBuf, BackendError> {
        let owned = path.clone();
        let operation = if change { "write" } else { "read" };
        self.blocking(operation, path.to_string(), move |inner| {
            if change {
                inner.host_path_to_change(&owned)
            } else {
                inner.host_path_to_read(&owned)
            }
        })
        .await
    }

    /// Runs blocking filesystem work off the async runtime.
    async fn blocking<T, F>(
        &self,
        operation: &'static str,
        path: String,
        f: F,
    ) -> Result<T, BackendError>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T, BackendError> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| BackendError::Io {
                operation,
                path,
                message: e.to_string(),
            })?
    }
}

#[derive(Clone, Debug)]
struct Inner {
    /// The canonical root (shell working directory; shown in messages).
    root: PathBuf,
    /// Where virtual `/` is (`root`, or `/` in non-virtual mode): every path is opened through
    /// it. Shared by the backends [`FilesystemBackend::with_protected`] derives.
    root_dir: Arc<RootDir>,
    max_file_size: u64,
    search_timeout: Duration,
    respect_gitignore: bool,
    /// What the file tools may not change.
    protected: Protected,
}

fn is_dir(stat: &Stat) -> bool {
    FileType::from_raw_mode(stat.st_mode) == FileType::Directory
}

fn is_file(stat: &Stat) -> bool {
    FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile
}

#[allow(clippy::useless_conversion)]
fn size_of(stat: &Stat) -> u64 {
    u64::try_from(stat.st_size).unwrap_or(0)
}

// The stat field types differ between architectures; the conversions are no-ops on some.
#[allow(clippy::useless_conversion)]
fn modified_ms(stat: &Stat) -> Option<u64> {
    let secs = u64::try_from(stat.st_mtime).ok()?;
    let nanos = u64::try_from(stat.st_mtime_nsec).ok()?;
    secs.checked_mul(1000)?.checked_add(nanos / 1_000_000)
}

fn info(path: String, stat: &Stat) -> FileInfo {
    let dir = is_dir(stat);
    FileInfo {
        path,
        is_dir: dir,
        size: if dir { 0 } else { size_of(stat) },
        modified_at_ms: modified_ms(stat),
        broken_link: None,
    }
}

/// The error the model sees for a failed host call on `path`.
fn host_error(errno: Errno, operation: &'static str, path: &str) -> BackendError {
    let path = path.to_owned();
    match errno {
        Errno::NOENT => BackendError::NotFound { path },
        Errno::NOTDIR => BackendError::NotADirectory { path },
        Errno::ISDIR => BackendError::IsDirectory { path },
        Errno::XDEV => BackendError::PermissionDenied {
            path,
            reason: "it resolves outside the backend root (through a symlink or mount); use a \
                     path inside the root"
                .to_owned(),
        },
        Errno::LOOP => BackendError::PermissionDenied {
            path,
            reason: "it goes through a symlink that cannot be followed here (a symlink loop, or \
                     symlinks are refused on this host); use the target's real path"
                .to_owned(),
        },
        Errno::ACCESS | Errno::PERM | Errno::ROFS => BackendError::PermissionDenied {
            path,
            reason: format!("the host refused it ({errno})"),
        },
        _ => BackendError::Io {
            operation,
            path,
            message: std::io::Error::from(errno).to_string(),
        },
    }
}

fn io_error(error: &std::io::Error, operation: &'static str, path: &str) -> BackendError {
    match error.raw_os_error() {
        Some(code) => host_error(Errno::from_raw_os_error(code), operation, path),
        None => BackendError::Io {
            operation,
            path: path.to_owned(),
            message: error.to_string(),
        },
    }
}

/// Refuses anything but a regular file, naming the kind.
/// Where an open descriptor is on the host, as the kernel says (`/proc/self/fd`): the path
/// it was really opened at, whatever spelling led there.
fn fd_path(
    fd: BorrowedFd<'_>,
    operation: &'static str,
    shown: &str,
) -> Result<PathBuf, BackendError> {
    use std::os::fd::AsRawFd as _;
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| io_error(&e, operation, shown))
}

fn check_regular(stat: &Stat, shown: &str) -> Result<(), BackendError> {
    if is_dir(stat) {
        return Err(BackendError::IsDirectory {
            path: shown.to_owned(),
        });
    }
    if !is_file(stat) {
        return Err(BackendError::PermissionDenied {
            path: shown.to_owned(),
            reason: "it is not a regular file (a device, pipe or socket)".to_owned(),
        });
    }
    Ok(())
}

/// Whether two stats are of one file.
fn same_file(a: &Stat, b: &Stat) -> bool {
    a.st_dev == b.st_dev && a.st_ino == b.st_ino
}

/// Takes an exclusive `flock` on `fd`, waiting up to [`LOCK_TIMEOUT`] for another writer. The
/// lock lasts until `fd` is closed.
fn lock(fd: BorrowedFd<'_>) -> Result<(), Errno> {
    let deadline = Instant::now() + LOCK_TIMEOUT;
    let mut pause = Duration::from_millis(1);
    loop {
        match rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(Errno::WOULDBLOCK) if Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            // Filesystems without flock, or a path descriptor (a directory we may not list): the
            // write is still atomic, only not ordered.
            Err(Errno::NOLCK | Errno::OPNOTSUPP | Errno::NOSYS | Errno::BADF) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

/// Overwrites `file` with `data`: written first and cut to length after, so a reader never
/// finds it empty.
fn write_in_place(file: &File, data: &[u8]) -> std::io::Result<()> {
    file.write_all_at(data, 0)?;
    file.set_len(u64::try_from(data.len()).unwrap_or(u64::MAX))?;
    file.sync_data()
}

/// Makes a rename in `dir` durable. Best effort: a path descriptor cannot be synced, and the
/// new content is already in place either way.
fn sync_dir(dir: &OwnedFd) {
    let _ = rustix::fs::fsync(dir);
}

/// A temporary file beside the target of a write, removed when dropped unless it was renamed
/// into place.
struct TempFile<'d> {
    dir: BorrowedFd<'d>,
    name: String,
    file: File,
    /// Whether our name still holds our file, to remove on drop.
    armed: bool,
}

impl<'d> TempFile<'d> {
    /// Creates a new file in `dir` named after `target`. `like` is the file it will replace,
    /// whose permission bits (and owner, where the host allows) it takes.
    fn create(dir: BorrowedFd<'d>, target: &str, like: Option<&Stat>) -> Result<Self, Errno> {
        // Short enough that the name stays under NAME_MAX whatever the target's length.
        let mut cut = target.len().min(64);
        while !target.is_char_boundary(cut) {
            cut -= 1;
        }
        let short = &target[..cut];
        // O_EXCL never opens an existing entry, and never follows a symlink planted at the name.
        let flags = OFlags::WRONLY
            | OFlags::CREATE
            | OFlags::EXCL
            | OFlags::NOFOLLOW
            | OFlags::NOCTTY
            | OFlags::CLOEXEC;
        // A new file gets the mode a plain create gave (0o644 less the umask); a replacement
        // starts private and then gets the old file's bits exactly.
        let mode = Mode::from_raw_mode(if like.is_some() { 0o600 } else { 0o644 });
        for _ in 0..WRITE_ATTEMPTS {
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = format!(".{short}.{}-{n}.tmp", std::process::id());
            let fd = match rustix::fs::openat(dir, name.as_str(), flags, mode) {
                Ok(fd) => fd,
                // Left by a crashed process that had our pid.
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(e),
            };
            let temp = Self {
                dir,
                name,
                file: File::from(fd),
                armed: true,
            };
            if let Some(like) = like {
                // Only a privileged process may give a file away; others keep it as theirs,
                // as any editor saving a copy does.
                let _ = rustix::fs::fchown(
                    &temp.file,
                    Some(rustix::fs::Uid::from_raw(like.st_uid)),
                    Some(rustix::fs::Gid::from_raw(like.st_gid)),
                );
                // Permission bits only: set-id bits are not carried onto new content, as the
                // kernel clears them when a file is written in place.
                rustix::fs::fchmod(&temp.file, Mode::from_raw_mode(like.st_mode & 0o777))?;
            }
            return Ok(temp);
        }
        Err(Errno::EXIST)
    }

    /// Writes `data` and syncs it, so the rename never exposes a file whose data is not on disk.
    fn fill(&self, data: &[u8]) -> std::io::Result<()> {
        (&self.file).write_all(data)?;
        rustix::fs::fdatasync(&self.file).map_err(std::io::Error::from)
    }

    /// Renames the file to `target`, which did not exist when checked. `EEXIST` when it has
    /// been created meanwhile (then nothing was changed). `exclusive`: never replace what was
    /// created meanwhile, even where the filesystem has no rename flags.
    fn commit_new(mut self, target: &str, exclusive: bool) -> Result<(), Errno> {
        let (dir, name) = (self.dir, self.name.as_str());
        match rustix::fs::renameat_with(dir, name, dir, target, RenameFlags::NOREPLACE) {
            Ok(()) => {}
            // Filesystems without rename flags: a hard link fails on an existing name as the
            // flag does (our name is then removed on drop).
            Err(Errno::INVAL | Errno::NOSYS) if exclusive => {
                match rustix::fs::linkat(dir, name, dir, target, AtFlags::empty()) {
                    Ok(()) => return Ok(()),
                    Err(Errno::EXIST) => return Err(Errno::EXIST),
                    // Nor hard links: a plain rename, which replaces a file created in the
                    // moment since the check (only by a writer that does not lock).
                    Err(_) => rustix::fs::renameat(dir, name, dir, target)?,
                }
            }
            // A plain rename, which replaces what was created in the meantime, as the caller
            // would have anyway.
            Err(Errno::INVAL | Errno::NOSYS) => rustix::fs::renameat(dir, name, dir, target)?,
            Err(e) => return Err(e),
        }
        self.armed = false;
        Ok(())
    }

    /// Puts the file in place of the regular file at `target`. The two are exchanged
    /// atomically, then what came out is checked: a regular file (the old version) is removed,
    /// while anything else (a symlink or directory swapped in after the check) is put back
    /// rather than deleted. `Ok(false)` when the write was undone that way (look again).
    fn commit_over(mut self, target: &str) -> Result<bool, Errno> {
        let (dir, name) = (self.dir, self.name.clone());
        let ours = rustix::fs::fstat(&self.file)?;
        match rustix::fs::renameat_with(dir, name.as_str(), dir, target, RenameFlags::EXCHANGE) {
            Ok(()) => {}
            // Filesystems without exchange: a plain rename over the target.
            Err(Errno::INVAL | Errno::NOSYS) => {
                rustix::fs::renameat(dir, name.as_str(), dir, target)?;
                self.armed = false;
                return Ok(true);
            }
            // Gone since it was checked: nothing changed, our file is removed on drop.
            Err(Errno::NOENT) => return Ok(false),
            Err(e) => return Err(e),
        }
        // Our name now holds what the target held; never remove it blindly.
        self.armed = false;
        for attempt in 0..PUT_BACK_ATTEMPTS {
            if attempt > 0 {
                // Another process is swapping entries at the target: let it run.
                std::thread::yield_now();
            }
            let displaced = rustix::fs::statat(dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)?;
            if same_file(&displaced, &ours) {
                // Our own file came back from putting something back: nothing was written.
                rustix::fs::unlinkat(dir, name.as_str(), AtFlags::empty())?;
                return Ok(false);
            }
            if is_file(&displaced) {
                rustix::fs::unlinkat(dir, name.as_str(), AtFlags::empty())?;
                return Ok(true);
            }
            rustix::fs::renameat_with(dir, name.as_str(), dir, target, RenameFlags::EXCHANGE)?;
        }
        // Still swapping after every attempt: leave what our name holds, it is not ours to
        // remove.
        Err(Errno::BUSY)
    }
}

impl Drop for TempFile<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: a failed write must not leave its temporary file behind.
            let _ = rustix::fs::unlinkat(self.dir, self.name.as_str(), AtFlags::empty());
        }
    }
}

/// What a write may find at its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    /// Nothing: a create-only write, refused with [`BackendError::AlreadyExists`] otherwise.
    New,
    /// A file, which it replaces (edit); nothing is [`BackendError::NotFound`].
    Existing,
    /// A file or nothing (overwrite, upload).
    Any,
}

impl Inner {
    fn ls(&self, path: &VPath) -> Result<Vec<FileInfo>, BackendError> {
        let shown = path.as_str();
        let dir_rel = rel(path);
        let fd = self
            .root_dir
            .open(dir_rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .map_err(|e| host_error(e, "ls", shown))?;
        let mut dir = Dir::new(fd).map_err(|e| host_error(e, "ls", shown))?;
        let mut names = Vec::new();
        while let Some(entry) = dir.read() {
            let entry = entry.map_err(|e| host_error(e, "ls", shown))?;
            // Names that are not UTF-8 or not valid path segments cannot be addressed by the
            // agent, so listing them would only produce errors.
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            if let Ok(child) = path.join(name)
                && child.file_name() == Some(name)
            {
                names.push((name.to_owned(), child));
            }
        }
        let dir_fd = dir.fd().map_err(|e| host_error(e, "ls", shown))?;
        let mut entries = Vec::with_capacity(names.len());
        for (name, child) in names {
            let Ok(own) = rustix::fs::statat(dir_fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            else {
                continue; // removed since listed
            };
            if FileType::from_raw_mode(own.st_mode) != FileType::Symlink {
                entries.push(info(child.to_string(), &own));
                continue;
            }
            // A link is shown as what it resolves to inside the root. One that cannot be
            // followed is marked as such, without a size: shown as an empty file it would pass
            // for one (reading it explains why it fails).
            match self.root_dir.stat(&join_rel(dir_rel, &name)) {
                Ok(target) => entries.push(info(child.to_string(), &target)),
                Err(errno) => entries.push(FileInfo {
                    path: child.to_string(),
                    is_dir: false,
                    size: 0,
                    modified_at_ms: modified_ms(&own),
                    broken_link: Some(if errno == Errno::XDEV {
                        BrokenLink::OutsideRoot
                    } else {
                        BrokenLink::Unresolvable
                    }),
                }),
            }
        }
        entries.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(entries)
    }

    /// [`FilesystemBackend::host_path`] for a read.
    fn host_path_to_read(&self, path: &VPath) -> Result<PathBuf, BackendError> {
        // Opened for reading (openat2 refuses O_PATH with the flags `open_regular` adds).
        let (file, _) = self.open_regular(path, OFlags::RDONLY, "read")?;
        fd_path(file.as_fd(), "read", path.as_str())
    }

    /// [`FilesystemBackend::host_path`] for a change.
    fn host_path_to_change(&self, path: &VPath) -> Result<PathBuf, BackendError> {
        let shown = path.as_str();
        if path.is_root() {
            return Err(BackendError::IsDirectory {
                path: shown.to_owned(),
            });
        }
        self.protected.check_path(path, Change::Entry)?;
        // The deepest directory on the way that exists: the parents a write would create
        // below it are checked as `ensure_parents` checks them before creating each.
        let segments: Vec<&str> = path.segments().collect();
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY;
        let mut depth = segments.len() - 1;
        let ancestor = loop {
            let prefix = if depth == 0 {
                ".".to_owned()
            } else {
                segments[..depth].join("/")
            };
            match self.root_dir.open(&prefix, dir_flags, Mode::empty()) {
                Ok(fd) => break fd,
                Err(Errno::NOENT) if depth > 0 => depth -= 1,
                Err(Errno::NOTDIR) => {
                    return Err(BackendError::NotADirectory {
                        path: format!("/{prefix}"),
                    });
                }
                Err(e) => return Err(host_error(e, "write", shown)),
            }
        };
        if depth + 1 < segments.len() {
            self.protected.check_entry(
                &self.root_dir,
                ancestor.as_fd(),
                segments[depth],
                Change::Entry,
                path,
            )?;
            let mut host = fd_path(ancestor.as_fd(), "write", shown)?;
            host.extend(&segments[depth..]);
            return Ok(host);
        }
        // The parent exists: where the write lands, through any symlink at the name.
        let (dir, name) = self.write_target(path, "write")?;
        self.protected
            .check_entry(&self.root_dir, dir.as_fd(), &name, Change::Entry, path)?;
        if let Ok(stat) = rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            check_regular(&stat, shown)?;
        }
        Ok(fd_path(dir.as_fd(), "write", shown)?.join(name))
    }

    /// Opens an existing regular file for `flags`, whatever its size.
    fn open_regular(
        &self,
        path: &VPath,
        flags: OFlags,
        operation: &'static str,
    ) -> Result<(File, u64), BackendError> {
        let shown = path.as_str();
        if path.is_root() {
            return Err(BackendError::IsDirectory {
                path: shown.to_owned(),
            });
        }
        // NONBLOCK: opening a FIFO must not hang; NOCTTY: a terminal must not become ours.
        let fd = self
            .root_dir
            .open(
                rel(path),
                flags | OFlags::NONBLOCK | OFlags::NOCTTY,
                Mode::empty(),
            )
            .map_err(|e| match e {
                // A file where a directory was expected on the way: nothing is there.
                Errno::NOTDIR => BackendError::NotFound {
                    path: shown.to_owned(),
                },
                e => host_error(e, operation, shown),
            })?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| host_error(e, operation, shown))?;
        check_regular(&stat, shown)?;
        Ok((File::from(fd), size_of(&stat)))
    }

    /// Opens an existing regular file for `flags` and checks its size.
    fn open_file(
        &self,
        path: &VPath,
        flags: OFlags,
        operation: &'static str,
    ) -> Result<(File, u64), BackendError> {
        let (file, size) = self.open_regular(path, flags, operation)?;
        self.check_size(path, size)?;
        Ok((file, size))
    }

    /// Refuses to load a file of `size` bytes whole when it is over the limit.
    fn check_size(&self, path: &VPath, size: u64) -> Result<(), BackendError> {
        if size > self.max_file_size {
            return Err(BackendError::TooLarge {
                path: path.to_string(),
                size,
                max: self.max_file_size,
            });
        }
        Ok(())
    }

    /// Reads a whole file, at most `max_file_size` bytes even if it grows meanwhile.
    fn read_all(
        &self,
        path: &VPath,
        file: &mut File,
        size: u64,
        operation: &'static str,
    ) -> Result<Vec<u8>, BackendError> {
        let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
        file.take(self.max_file_size.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(|e| io_error(&e, operation, path.as_str()))?;
        let read = u64::try_from(data.len()).unwrap_or(u64::MAX);
        self.check_size(path, read)?;
        Ok(data)
    }

    fn read_bytes(&self, path: &VPath, operation: &'static str) -> Result<Vec<u8>, BackendError> {
        let (mut file, size) = self.open_file(path, OFlags::RDONLY, operation)?;
        self.read_all(path, &mut file, size, operation)
    }

    /// A page of the file at `path`: a text file of any size, or a binary file whole (within
    /// the size limit).
    fn read_page(
        &self,
        path: &VPath,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError> {
        let (mut file, size) = self.open_regular(path, OFlags::RDONLY, "read")?;
        if size > self.max_file_size {
            return self.read_large(path, file, size, offset, limit);
        }
        let bytes = self.read_all(path, &mut file, size, "read")?;
        Ok(match mime::binary_type(path.as_str(), &bytes) {
            Some(mime_type) => ReadResult::Binary {
                mime_type: mime_type.to_owned(),
                data: bytes,
            },
            None => text::page_bytes(&bytes, offset, limit),
        })
    }

    /// Pages a file over the size limit by streaming it once: only the selected lines are kept
    /// (at most `max_file_size` bytes of them), the rest is only counted. A binary file, told
    /// by its first chunk or a NUL byte anywhere, cannot be paged and is refused.
    fn read_large(
        &self,
        path: &VPath,
        file: File,
        size: u64,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError> {
        let shown = path.as_str();
        let too_large = || BackendError::TooLarge {
            path: shown.to_owned(),
            size,
            max: self.max_file_size,
        };
        let budget = usize::try_from(self.max_file_size).unwrap_or(usize::MAX);
        let mut pager = text::Pager::new(offset, limit, budget);
        let mut reader = BufReader::with_capacity(STREAM_CHUNK, file);
        let mut first = true;
        loop {
            let chunk = reader.fill_buf().map_err(|e| io_error(&e, "read", shown))?;
            if chunk.is_empty() {
                break;
            }
            let binary = if first {
                mime::binary_type(shown, chunk).is_some()
            } else {
                chunk.contains(&0)
            };
            if binary {
                return Err(too_large());
            }
            first = false;
            pager.feed(chunk);
            let read = chunk.len();
            reader.consume(read);
        }
        if pager.over_budget() {
            return Err(BackendError::LineTooLong {
                path: shown.to_owned(),
                line: offset.saturating_add(1),
                max: self.max_file_size,
            });
        }
        Ok(pager.finish())
    }

    /// Creates the missing parent directories of `path`, one checked component at a time.
    fn ensure_parents(&self, path: &VPath) -> Result<(), BackendError> {
        let segments: Vec<&str> = path.segments().collect();
        let dir_flags = OFlags::PATH | OFlags::DIRECTORY;
        for depth in 1..segments.len() {
            let prefix = segments[..depth].join("/");
            let shown = format!("/{prefix}");
            match self.root_dir.open(&prefix, dir_flags, Mode::empty()) {
                Ok(_) => {}
                Err(Errno::NOENT) => {
                    let parent = if depth == 1 {
                        ".".to_owned()
                    } else {
                        segments[..depth - 1].join("/")
                    };
                    // mkdirat gets a single name relative to a parent resolved beneath the root,
                    // so no symlink in the prefix can redirect it.
                    let parent_fd = self
                        .root_dir
                        .open(&parent, dir_flags, Mode::empty())
                        .map_err(|e| host_error(e, "write", &shown))?;
                    // The prefix may reach a protected name through a symlink the path check
                    // could not see.
                    self.protected.check_entry(
                        &self.root_dir,
                        parent_fd.as_fd(),
                        segments[depth - 1],
                        Change::Entry,
                        path,
                    )?;
                    match rustix::fs::mkdirat(
                        &parent_fd,
                        segments[depth - 1],
                        Mode::from_raw_mode(0o755),
                    ) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(host_error(e, "write", &shown)),
                    }
                }
                Err(Errno::NOTDIR) => return Err(BackendError::NotADirectory { path: shown }),
                Err(e) => return Err(host_error(e, "write", &shown)),
            }
        }
        Ok(())
    }

    /// Refuses a write that would leave `path` over the size limit.
    fn check_size_to_write(&self, path: &VPath, size: usize) -> Result<(), BackendError> {
        let size = u64::try_from(size).unwrap_or(u64::MAX);
        if size > self.max_file_size {
            return Err(BackendError::TooLargeToWrite {
                path: path.to_string(),
                size,
                max: self.max_file_size,
            });
        }
        Ok(())
    }

    /// Puts `data` at `path`, creating parent directories: a new file only
    /// ([`Target::New`]) or a new or existing one ([`Target::Any`]).
    fn write_bytes(&self, path: &VPath, data: &[u8], target: Target) -> Result<(), BackendError> {
        if path.is_root() {
            return Err(BackendError::IsDirectory {
                path: path.to_string(),
            });
        }
        // Before anything is created, so a refused write leaves no parent directories behind.
        self.protected.check_path(path, Change::Entry)?;
        self.check_size_to_write(path, data.len())?;
        self.ensure_parents(path)?;
        self.replace_file(path, "write", target, |_| Ok((Cow::Borrowed(data), ())))
    }

    fn edit(
        &self,
        path: &VPath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<usize, BackendError> {
        let shown = path.as_str();
        self.protected.check_path(path, Change::Entry)?;
        self.replace_file(path, "edit", Target::Existing, |current| {
            let Some((file, size)) = current else {
                return Err(BackendError::NotFound {
                    path: shown.to_owned(),
                });
            };
            self.check_size(path, size)?;
            let data = self.read_all(path, file, size, "edit")?;
            if let Some(mime_type) = mime::binary_type(shown, &data) {
                return Err(BackendError::Binary {
                    path: shown.to_owned(),
                    mime_type: mime_type.to_owned(),
                });
            }
            let (updated, count) = match std::str::from_utf8(&data) {
                Ok(text) => {
                    let (updated, count) = text::replace(shown, text, old, new, replace_all)?;
                    (updated.into_bytes(), count)
                }
                // Byte-wise, so the bytes that are not UTF-8 stay as they are.
                Err(_) => text::replace_bytes(shown, &data, old, new, replace_all)?,
            };
            self.check_size_to_write(path, updated.len())?;
            Ok((Cow::Owned(updated), count))
        })
    }

    /// Replaces the content of the file at `path` with what `build` makes of the current file
    /// (`None` when there is none yet, unless `target` is [`Target::Existing`]), atomically:
    /// the new bytes go to a temporary file in the same directory, which is synced and renamed
    /// over the target (see the type's docs). `build` may run more than once when the file is
    /// replaced meanwhile.
    fn replace_file<'d, T>(
        &self,
        path: &VPath,
        operation: &'static str,
        target: Target,
        mut build: impl FnMut(Option<(&mut File, u64)>) -> Result<(Cow<'d, [u8]>, T), BackendError>,
    ) -> Result<T, BackendError> {
        let shown = path.as_str();
        let fail = |e: Errno| host_error(e, operation, shown);
        for _ in 0..WRITE_ATTEMPTS {
            let (dir, name) = self.write_target(path, operation)?;
            // Where the write really lands, symlinks resolved: maybe inside a protected name.
            self.protected
                .check_entry(&self.root_dir, dir.as_fd(), &name, Change::Entry, path)?;
            // Writers of one directory take turns (the lock goes with `dir`), so none builds on
            // a file another is replacing: concurrent edits apply one after the other, and a
            // writer never has to retry because a cooperating one got there first.
            lock(dir.as_fd()).map_err(|e| match e {
                Errno::WOULDBLOCK => BackendError::Io {
                    operation,
                    path: shown.to_owned(),
                    message: "other writes kept its directory locked; nothing was changed, try \
                              again"
                        .to_owned(),
                },
                e => fail(e),
            })?;
            // What the name holds now, under the lock.
            let existing = match rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            {
                // A symlink planted meanwhile: resolve it again.
                Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Symlink => continue,
                Ok(stat) => {
                    check_regular(&stat, shown)?;
                    Some(stat)
                }
                Err(Errno::NOENT) => None,
                Err(e) => return Err(fail(e)),
            };
            let Some(checked) = existing else {
                if target == Target::Existing {
                    return Err(BackendError::NotFound {
                        path: shown.to_owned(),
                    });
                }
                let (data, value) = build(None)?;
                let temp = TempFile::create(dir.as_fd(), &name, None).map_err(fail)?;
                temp.fill(&data)
                    .map_err(|e| io_error(&e, operation, shown))?;
                match temp.commit_new(&name, target == Target::New) {
                    Ok(()) => {
                        sync_dir(&dir);
                        return Ok(value);
                    }
                    // Created meanwhile (by a writer that does not lock): look again, so it is
                    // replaced as an existing file, or refused by a create-only write.
                    Err(Errno::EXIST) => continue,
                    Err(e) => return Err(fail(e)),
                }
            };
            if target == Target::New {
                return Err(BackendError::AlreadyExists {
                    path: shown.to_owned(),
                });
            }
            let access = if target == Target::Any {
                OFlags::WRONLY
            } else {
                OFlags::RDWR
            };
            // Opening the file checks the host lets us write it, as writing in place did; the
            // rename alone would only need the directory to be writable.
            let flags = access | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY;
            let fd = match rustix::fs::openat(
                &dir,
                name.as_str(),
                flags | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                // Became a symlink or vanished since it was checked: look again.
                Err(Errno::LOOP | Errno::NOENT) => continue,
                Err(e) => return Err(fail(e)),
            };
            let stat = rustix::fs::fstat(&fd).map_err(fail)?;
            // Replaced since it was checked, by a process that does not take the lock.
            if !same_file(&stat, &checked) {
                continue;
            }
            let mut file = File::from(fd);
            let (data, value) = build(Some((&mut file, size_of(&stat))))?;
            let temp = match TempFile::create(dir.as_fd(), &name, Some(&stat)) {
                Ok(temp) => temp,
                // A directory we may not add to, holding a file we may write: write in place,
                // as the host allows (not atomic, which needs a new entry beside the file).
                Err(Errno::ACCESS | Errno::PERM) => {
                    write_in_place(&file, &data).map_err(|e| io_error(&e, operation, shown))?;
                    return Ok(value);
                }
                Err(e) => return Err(fail(e)),
            };
            temp.fill(&data)
                .map_err(|e| io_error(&e, operation, shown))?;
            match temp.commit_over(&name) {
                Ok(true) => {
                    sync_dir(&dir);
                    return Ok(value);
                }
                Ok(false) => continue,
                Err(e) => return Err(fail(e)),
            }
        }
        Err(BackendError::Io {
            operation,
            path: shown.to_owned(),
            message: "the file kept being replaced while it was written; nothing was changed, \
                      try again"
                .to_owned(),
        })
    }

    /// The directory (opened beneath the root) and the name in it that a write of `path`
    /// replaces or creates, through any symlinks at the name (see [`RootDir::write_target`]).
    fn write_target(
        &self,
        path: &VPath,
        operation: &'static str,
    ) -> Result<(OwnedFd, String), BackendError> {
        let shown = path.as_str();
        self.root_dir.write_target(path).map_err(|e| match e {
            // A file where a directory was expected on the way: nothing is there.
            TargetError::Host(Errno::NOTDIR) => BackendError::NotFound {
                path: shown.to_owned(),
            },
            TargetError::Host(e) => host_error(e, operation, shown),
            TargetError::Directory => BackendError::IsDirectory {
                path: shown.to_owned(),
            },
            TargetError::NotUtf8 => BackendError::PermissionDenied {
                path: shown.to_owned(),
                reason: "it is a symlink whose target is not UTF-8".to_owned(),
            },
        })
    }

    fn delete(&self, path: &VPath) -> Result<usize, BackendError> {
        let shown = path.as_str();
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(BackendError::PermissionDenied {
                path: "/".to_owned(),
                reason: "the root cannot be deleted; delete its entries one by one".to_owned(),
            });
        };
        self.protected.check_path(path, Change::Tree)?;
        let parent_fd = self
            .root_dir
            .open(
                rel(&parent),
                OFlags::PATH | OFlags::DIRECTORY,
                Mode::empty(),
            )
            .map_err(|e| match e {
                Errno::NOTDIR => BackendError::NotFound {
                    path: shown.to_owned(),
                },
                e => host_error(e, "delete", shown),
            })?;
        self.protected
            .check_entry(&self.root_dir, parent_fd.as_fd(), name, Change::Tree, path)?;
        // The entry itself, not what a symlink points to.
        let stat = rustix::fs::statat(&parent_fd, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| host_error(e, "delete", shown))?;
        if is_dir(&stat) {
            remove_tree(parent_fd.as_fd(), name).map_err(|e| host_error(e, "delete", shown))
        } else {
            rustix::fs::unlinkat(&parent_fd, name, AtFlags::empty())
                .map_err(|e| host_error(e, "delete", shown))?;
            Ok(1)
        }
    }

    /// What a walk of `base` starts from: the directory opened beneath the root, or why there
    /// is none.
    fn walk_base(&self, base: &VPath, operation: &'static str) -> Result<Base, BackendError> {
        let base_rel = rel(base);
        let stat = self.root_dir.stat(base_rel).map_err(|e| match e {
            Errno::NOTDIR => BackendError::NotFound {
                path: base.to_string(),
            },
            e => host_error(e, operation, base.as_str()),
        })?;
        if !is_dir(&stat) {
            return Ok(Base::NotADirectory);
        }
        Ok(match self.root_dir.open_walk_base(base_rel) {
            Ok(fd) => Base::Dir(fd),
            // A symlink to a directory (walks do not descend those), or no longer a directory.
            Err(Errno::LOOP | Errno::NOTDIR | Errno::NOENT) => Base::NotADirectory,
            Err(errno) => Base::Unlistable(errno),
        })
    }

    fn glob(&self, pattern: &str, base: &VPath) -> Result<GlobResult, BackendError> {
        let pattern = GlobPattern::new(pattern)?;
        let deadline = Instant::now() + self.search_timeout;
        let Base::Dir(base_fd) = self.walk_base(base, "glob")? else {
            // glob lists files below the base: a file has none, and a directory it cannot
            // list shows none, as a subdirectory it cannot list does.
            return Ok(GlobResult::default());
        };
        let base_rel = rel(base);
        let found = Mutex::new(Vec::new());
        let timed_out = AtomicBool::new(false);
        let options = WalkOptions {
            gitignore: self.respect_gitignore,
            deadline,
            timed_out: &timed_out,
        };
        walk::walk(base_fd, base_rel, &options, || GlobVisitor {
            inner: self,
            pattern: &pattern,
            base_rel,
            found: Batch {
                items: Vec::new(),
                into: &found,
            },
        });
        let mut files = found.into_inner().unwrap_or_else(PoisonError::into_inner);
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(GlobResult {
            files,
            truncated: timed_out.into_inner(),
        })
    }

    /// The file a glob walk reports for `entry`, if it matches.
    fn glob_entry(
        &self,
        entry: &Entry<'_>,
        pattern: &GlobPattern,
        base_rel: &str,
    ) -> Option<FileInfo> {
        let relative = below_base(base_rel, entry.root_rel);
        if relative.is_empty() || !pattern.matches(relative) {
            return None;
        }
        let own = rustix::fs::statat(entry.dir, entry.name, AtFlags::SYMLINK_NOFOLLOW).ok()?;
        let stat = if FileType::from_raw_mode(own.st_mode) == FileType::Symlink {
            // Resolved from the root like a direct path: reported when it is a file inside.
            self.root_dir.stat(entry.root_rel).ok()?
        } else {
            own
        };
        is_file(&stat).then(|| info(format!("/{}", entry.root_rel), &stat))
    }

    fn grep(&self, query: &GrepQuery) -> Result<GrepResult, BackendError> {
        let include = query.include.as_deref().map(GlobPattern::new).transpose()?;
        let matcher = if !query.regex && query.pattern.contains('\n') {
            // A literal with a line break can never match within a line.
            None
        } else {
            let mut builder = RegexMatcherBuilder::new();
            builder
                .case_insensitive(query.case_insensitive)
                .fixed_strings(!query.regex)
                // The searcher hands the matcher whole buffers: `^`/`$` must mean line starts
                // and ends, and `$` must match before `\r\n` as it does on stripped lines.
                .multi_line(true)
                .crlf(true);
            Some(
                builder
                    .build(&query.pattern)
                    .map_err(|e| BackendError::InvalidQuery {
                        what: "regex",
                        message: e.to_string(),
                    })?,
            )
        };
        let deadline = Instant::now() + self.search_timeout;
        let base = self.walk_base(&query.path, "grep")?;
        let Some(matcher) = matcher else {
            return Ok(GrepResult::default());
        };
        let base_rel = rel(&query.path);
        let collector = Collector::new(query.max_count);
        let timed_out = AtomicBool::new(false);
        let walk = GrepWalk {
            matcher: &matcher,
            include: include.as_ref(),
            collector: &collector,
            base_rel,
            deadline,
            timed_out: &timed_out,
        };
        match base {
            Base::Dir(base_fd) => {
                let options = WalkOptions {
                    gitignore: self.respect_gitignore,
                    deadline,
                    timed_out: &timed_out,
                };
                walk::walk(base_fd, base_rel, &options, || GrepVisitor {
                    inner: self,
                    walk: &walk,
                    worker: GrepWorker::new(),
                });
            }
            // The one file asked for (or a symlink to a directory, which is not searched).
            Base::NotADirectory => {
                let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY;
                self.grep_file(&walk, &mut GrepWorker::new(), base_rel, || {
                    self.root_dir.open(base_rel, flags, Mode::empty())
                });
            }
            Base::Unlistable(errno) => {
                collector.skip(query.path.to_string(), unreadable(errno));
            }
        }
        let (matches, truncated, skipped) = collector.finish(query.max_count);
        let mut result = GrepResult {
            matches,
            truncated: truncated || timed_out.into_inner(),
            skipped,
        };
        result.trim_skipped(query.max_count);
        Ok(result)
    }

    /// Searches the file at `root_rel` (opened by `open`) when the query covers it, adding its
    /// matches to the collector.
    fn grep_file(
        &self,
        walk: &GrepWalk<'_>,
        worker: &mut GrepWorker,
        root_rel: &str,
        open: impl FnOnce() -> Result<OwnedFd, Errno>,
    ) {
        let shown = format!("/{root_rel}");
        if let Some(include) = walk.include {
            let relative = below_base(walk.base_rel, root_rel);
            let name = root_rel.rsplit('/').next().unwrap_or(root_rel);
            let target = if relative.is_empty() { name } else { relative };
            if !include.matches(target) {
                return;
            }
        }
        if walk.collector.skips(&shown) {
            return;
        }
        let mut sink = LineSink {
            lines: Vec::new(),
            cap: walk.collector.cap,
            binary: false,
            deadline: walk.deadline,
            timed_out: walk.timed_out,
        };
        match self.search_file(worker, &shown, open, walk.matcher, &mut sink) {
            Searched::Yes if sink.binary => walk.collector.skip(
                shown,
                SkipReason::Binary {
                    mime_type: mime::OCTET_STREAM.to_owned(),
                },
            ),
            Searched::Yes if !sink.lines.is_empty() => walk.collector.add(&shown, sink.lines),
            Searched::Yes | Searched::Gone => {}
            Searched::Skipped(reason) => walk.collector.skip(shown, reason),
        }
    }

    /// Opens a file a grep walk found: relative to its directory, or from the root when it is
    /// a symlink (or became one since it was listed), by the symlink rule of direct paths.
    fn open_found(&self, entry: &Entry<'_>) -> Result<OwnedFd, Errno> {
        let flags = OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY;
        let from_root = || self.root_dir.open(entry.root_rel, flags, Mode::empty());
        match entry.kind {
            Kind::Symlink => from_root(),
            _ => match open_child(entry.dir, entry.name, flags) {
                Err(Errno::LOOP) => from_root(),
                result => result,
            },
        }
    }

    /// Searches one file (opened by `open`, with `O_NONBLOCK`), or says why not.
    fn search_file(
        &self,
        worker: &mut GrepWorker,
        shown: &str,
        open: impl FnOnce() -> Result<OwnedFd, Errno>,
        matcher: &RegexMatcher,
        sink: &mut LineSink<'_>,
    ) -> Searched {
        let GrepWorker { searcher, buffer } = worker;
        let binary = |mime_type: &str| {
            Searched::Skipped(SkipReason::Binary {
                mime_type: mime_type.to_owned(),
            })
        };
        // The extension alone may mark it binary (e.g. .png, .svg): no need to open it.
        if let Some(mime_type) = mime::binary_type(shown, &[]) {
            return binary(mime_type);
        }
        let fd = match open() {
            Ok(fd) => fd,
            // Removed since the walk listed it, or a dangling link: nothing to search.
            Err(Errno::NOENT) => return Searched::Gone,
            Err(e) => return Searched::Skipped(unreadable(e)),
        };
        let stat = match rustix::fs::fstat(&fd) {
            Ok(stat) => stat,
            Err(e) => return Searched::Skipped(unreadable(e)),
        };
        if is_dir(&stat) {
            // A symlink to a directory: walks do not descend into those.
            return Searched::Gone;
        }
        if !is_file(&stat) {
            return Searched::Skipped(SkipReason::Unreadable {
                reason: "not a regular file (a device, pipe or socket)".to_owned(),
            });
        }
        let file = File::from(fd);
        let failed = |e: &std::io::Error| {
            Searched::Skipped(match e.raw_os_error() {
                Some(code) => unreadable(Errno::from_raw_os_error(code)),
                None => SkipReason::Unreadable {
                    reason: e.to_string(),
                },
            })
        };
        if size_of(&stat) <= SLURP_LIMIT {
            buffer.clear();
            if let Err(e) = (&file).take(SLURP_LIMIT).read_to_end(buffer) {
                return failed(&e);
            }
            // The same test as read: text unless it sniffs as a binary format or holds a NUL.
            if let Some(mime_type) = mime::binary_type(shown, buffer) {
                return binary(mime_type);
            }
            match searcher.search_slice(matcher, buffer, &mut *sink) {
                Ok(()) => Searched::Yes,
                Err(e) => failed(&e),
            }
        } else {
            // Signatures are at the start; NUL bytes anywhere are caught while streaming.
            let mut head = vec![0; STREAM_CHUNK];
            match file.read_at(&mut head, 0) {
                Ok(read) => head.truncate(read),
                Err(e) => return failed(&e),
            }
            if let Some(mime_type) = mime::binary_type(shown, &head) {
                return binary(mime_type);
            }
            let mut streaming = SearcherBuilder::new()
                .line_number(true)
                .line_terminator(LineTerminator::crlf())
                .binary_detection(BinaryDetection::quit(0))
                .memory_map(MmapChoice::never())
                .build();
            match streaming.search_file(matcher, &file, &mut *sink) {
                Ok(()) => Searched::Yes,
                Err(e) => failed(&e),
            }
        }
    }
}

/// What became of a file grep was given.
enum Searched {
    /// Searched (matches are in the sink; it may still turn out binary past the first chunk).
    Yes,
    /// Not searched, for a reason worth telling.
    Skipped(SkipReason),
    /// Not a file any more (removed meanwhile, or a link to a directory).
    Gone,
}

/// A short reason for an error opening or reading a file grep was given.
fn unreadable(errno: Errno) -> SkipReason {
    let reason = match errno {
        Errno::ACCESS | Errno::PERM => "permission denied".to_owned(),
        Errno::XDEV => "it resolves outside the backend root".to_owned(),
        Errno::LOOP => "a symlink that cannot be followed here".to_owned(),
        e => std::io::Error::from(e).to_string(),
    };
    SkipReason::Unreadable { reason }
}

/// Where a walk of a search base starts.
enum Base {
    /// A directory, opened beneath the root to walk.
    Dir(OwnedFd),
    /// A file or other non-directory, or a symlink to a directory (not walked).
    NotADirectory,
    /// A directory the host does not let us list.
    Unlistable(Errno),
}

/// `root_rel` relative to the search base `base_rel` (`""` for the base itself).
fn below_base<'r>(base_rel: &str, root_rel: &'r str) -> &'r str {
    if base_rel == "." {
        return root_rel;
    }
    root_rel
        .strip_prefix(base_rel)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or("")
}

/// Results of one walk thread, added to the shared list once when the thread is done (one lock
/// per thread instead of one per file).
struct Batch<'a, T> {
    items: Vec<T>,
    into: &'a Mutex<Vec<T>>,
}

impl<T> Drop for Batch<'_, T> {
    fn drop(&mut self) {
        self.into
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .append(&mut self.items);
    }
}

/// What one glob walk thread does with the entries it is given.
struct GlobVisitor<'a> {
    inner: &'a Inner,
    pattern: &'a GlobPattern,
    base_rel: &'a str,
    found: Batch<'a, FileInfo>,
}

impl Visitor for GlobVisitor<'_> {
    fn descend(&mut self, entry: &Entry<'_>) -> bool {
        self.pattern
            .may_descend(below_base(self.base_rel, entry.root_rel))
    }

    fn visit(&mut self, entry: &Entry<'_>) {
        if let Some(found) = self.inner.glob_entry(entry, self.pattern, self.base_rel) {
            self.found.items.push(found);
        }
    }

    // glob reports files only: a directory it cannot list shows nothing, as in ls of its
    // parent it is still shown.
    fn unlistable(&mut self, _root_rel: &str, _errno: Errno) {}
}

/// What one grep walk thread does with the entries it is given.
struct GrepVisitor<'a> {
    inner: &'a Inner,
    walk: &'a GrepWalk<'a>,
    worker: GrepWorker,
}

impl Visitor for GrepVisitor<'_> {
    fn descend(&mut self, entry: &Entry<'_>) -> bool {
        // VCS internals are large, binary and never what the agent means.
        entry.name != ".git"
    }

    fn visit(&mut self, entry: &Entry<'_>) {
        let inner = self.inner;
        inner.grep_file(self.walk, &mut self.worker, entry.root_rel, || {
            inner.open_found(entry)
        });
    }

    /// A directory grep cannot list hides every file below it: named in the skipped files.
    fn unlistable(&mut self, root_rel: &str, errno: Errno) {
        self.walk
            .collector
            .skip(walk::shown_path(root_rel), unreadable(errno));
    }
}

/// What every grep thread shares.
struct GrepWalk<'a> {
    matcher: &'a RegexMatcher,
    include: Option<&'a GlobPattern>,
    collector: &'a Collector,
    base_rel: &'a str,
    deadline: Instant,
    timed_out: &'a AtomicBool,
}

/// What one grep thread reuses from file to file.
struct GrepWorker {
    searcher: Searcher,
    buffer: Vec<u8>,
}

impl GrepWorker {
    fn new() -> Self {
        Self {
            searcher: SearcherBuilder::new()
                .line_number(true)
                .line_terminator(LineTerminator::crlf())
                .binary_detection(BinaryDetection::none())
                .memory_map(MmapChoice::never())
                .build(),
            buffer: Vec::new(),
        }
    }
}

/// Matches of all files, kept to the first `cap` in (path, line) order so the result does not
/// depend on the order the parallel walk visits files.
struct Collector {
    cap: usize,
    full: AtomicBool,
    kept: Mutex<BTreeMap<(String, usize), String>>,
    /// Files not searched, by path.
    skipped: Mutex<BTreeMap<String, SkipReason>>,
}

impl Collector {
    fn new(max_count: usize) -> Self {
        Self {
            // One over the limit tells whether more exist.
            cap: max_count.saturating_add(1),
            full: AtomicBool::new(false),
            kept: Mutex::new(BTreeMap::new()),
            skipped: Mutex::new(BTreeMap::new()),
        }
    }

    fn skip(&self, path: String, reason: SkipReason) {
        self.skipped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(path, reason);
    }

    /// Whether a file at `path` cannot contribute any more (all kept matches sort before it).
    fn skips(&self, path: &str) -> bool {
        self.full.load(Ordering::Relaxed)
            && self
                .kept
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .last_key_value()
                .is_some_and(|((last, _), _)| path > last.as_str())
    }

    fn add(&self, path: &str, lines: Vec<(usize, String)>) {
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        for (number, line) in lines {
            kept.insert((path.to_owned(), number), line);
        }
        while kept.len() > self.cap {
            kept.pop_last();
        }
        if kept.len() >= self.cap {
            self.full.store(true, Ordering::Relaxed);
        }
    }

    fn finish(self, max_count: usize) -> (Vec<GrepMatch>, bool, Vec<SkippedFile>) {
        let kept = self
            .kept
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner);
        let truncated = kept.len() > max_count;
        let matches = kept
            .into_iter()
            .take(max_count)
            .map(|((path, line_number), line)| GrepMatch {
                path,
                line_number,
                line,
            })
            .collect();
        let skipped = self
            .skipped
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
            .into_iter()
            .map(|(path, reason)| SkippedFile { path, reason })
            .collect();
        (matches, truncated, skipped)
    }
}

/// Collects the matching lines of one file.
struct LineSink<'a> {
    lines: Vec<(usize, String)>,
    cap: usize,
    /// A NUL byte turned up while streaming: the file is binary and its matches are dropped.
    binary: bool,
    deadline: Instant,
    timed_out: &'a AtomicBool,
}

impl Sink for LineSink<'_> {
    type Error = std::io::Error;

    fn matched(&mut self, _: &Searcher, mat: &SinkMatch<'_>) -> Result<bool, Self::Error> {
        let mut number = usize::try_from(mat.line_number().unwrap_or(0)).unwrap_or(usize::MAX);
        for raw in mat.lines() {
            let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
            let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
            // Text need not be UTF-8: show invalid bytes as U+FFFD, as read does.
            self.lines.push((number, text::lossy(raw)));
            number = number.saturating_add(1);
            if self.lines.len() >= self.cap {
                return Ok(false);
            }
        }
        if Instant::now() >= self.deadline {
            self.timed_out.store(true, Ordering::Relaxed);
            return Ok(false);
        }
        Ok(true)
    }

    fn binary_data(&mut self, _: &Searcher, _: u64) -> Result<bool, Self::Error> {
        // A NUL byte in a large streamed file: binary, even if lines matched before it.
        self.binary = true;
        Ok(false)
    }
}

#[async_trait]
impl Backend for FilesystemBackend {
    fn name(&self) -> &'static str {
        "filesystem"
    }

    fn path_mappings(&self) -> Vec<PathMapping> {
        vec![PathMapping {
            prefix: VPath::root(),
            host: Some(self.inner.root_dir.host_root().to_path_buf()),
        }]
    }

    async fn ls(&self, _cx: &BackendContext, path: &VPath) -> Result<Vec<FileInfo>, BackendError> {
        let path = path.clone();
        self.blocking("ls", path.to_string(), move |inner| inner.ls(&path))
            .await
    }

    async fn read(
        &self,
        _cx: &BackendContext,
        path: &VPath,
        offset: usize,
        limit: usize,
    ) -> Result<ReadResult, BackendError> {
        let owned = path.clone();
        self.blocking("read", path.to_string(), move |inner| {
            inner.read_page(&owned, offset, limit)
        })
        .await
    }

    async fn read_raw(&self, _cx: &BackendContext, path: &VPath) -> Result<RawFile, BackendError> {
        let owned = path.clone();
        let data = self
            .blocking("read", path.to_string(), move |inner| {
                inner.read_bytes(&owned, "read")
            })
            .await?;
        Ok(RawFile {
            mime_type: mime::mime_type(path.as_str(), &data),
            data,
        })
    }

    async fn write(
        &self,
        _cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        let owned = path.clone();
        let content = content.to_owned();
        self.blocking("write", path.to_string(), move |inner| {
            inner.write_bytes(&owned, content.as_bytes(), Target::New)
        })
        .await?;
        Ok(Changed::outside_state(()))
    }

    async fn overwrite(
        &self,
        _cx: &BackendContext,
        path: &VPath,
        content: &str,
    ) -> Result<Changed<()>, BackendError> {
        let owned = path.clone();
        let content = content.to_owned();
        self.blocking("write", path.to_string(), move |inner| {
            inner.write_bytes(&owned, content.as_bytes(), Target::Any)
        })
        .await?;
        Ok(Changed::outside_state(()))
    }

    async fn edit(
        &self,
        _cx: &BackendContext,
        path: &VPath,
        old: &str,
        new: &str,
        replace_all: bool,
    ) -> Result<Changed<usize>, BackendError> {
        let owned = path.clone();
        let (old, new) = (old.to_owned(), new.to_owned());
        let count = self
            .blocking("edit", path.to_string(), move |inner| {
                inner.edit(&owned, &old, &new, replace_all)
            })
            .await?;
        Ok(Changed::outside_state(count))
    }

    async fn delete(
        &self,
        _cx: &BackendContext,
        path: &VPath,
    ) -> Result<Changed<usize>, BackendError> {
        let owned = path.clone();
        let count = self
            .blocking("delete", path.to_string(), move |inner| {
                inner.delete(&owned)
            })
            .await?;
        Ok(Changed::outside_state(count))
    }

    async fn glob(
        &self,
        _cx: &BackendContext,
        pattern: &str,
        base: &VPath,
    ) -> Result<GlobResult, BackendError> {
        let base = base.clone();
        let pattern = pattern.to_owned();
        self.blocking("glob", base.to_string(), move |inner| {
            inner.glob(&pattern, &base)
        })
        .await
    }

    async fn grep(
        &self,
        _cx: &BackendContext,
        query: &GrepQuery,
    ) -> Result<GrepResult, BackendError> {
        let query = query.clone();
        self.blocking("grep", query.path.to_string(), move |inner| {
            inner.grep(&query)
        })
        .await
    }

    async fn upload_files(
        &self,
        _cx: &BackendContext,
        files: Vec<(String, Vec<u8>)>,
    ) -> Changed<Vec<Result<(), FileOpError>>> {
        let count = files.len();
        let results = self
            .blocking("upload", "/".to_owned(), move |inner| {
                Ok(files
                    .into_iter()
                    .map(|(raw, data)| {
                        let path = VPath::parse(&raw).map_err(|_| FileOpError::InvalidPath)?;
                        inner
                            .write_bytes(&path, &data, Target::Any)
                            .map_err(|e| e.file_op_code())
                    })
                    .collect::<Vec<_>>())
            })
            .await;
        Changed::outside_state(
            results.unwrap_or_else(|_| vec![Err(FileOpError::PermissionDenied); count]),
        )
    }

    async fn download_files(
        &self,
        _cx: &BackendContext,
        paths: Vec<String>,
    ) -> Vec<Result<Vec<u8>, FileOpError>> {
        let count = paths.len();
        let results = self
            .blocking("download", "/".to_owned(), move |inner| {
                Ok(paths
                    .iter()
                    .map(|raw| {
                        let path = VPath::parse(raw).map_err(|_| FileOpError::InvalidPath)?;
                        inner
                            .read_bytes(&path, "download")
                            .map_err(|e| e.file_op_code())
                    })
                    .collect::<Vec<_>>())
            })
            .await;
        results.unwrap_or_else(|_| vec![Err(FileOpError::PermissionDenied); count])
    }
}
