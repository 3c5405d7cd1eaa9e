//! Parallel directory walks through descriptors: what glob and grep of the disk backend walk.
//!
//! A walk never lists a directory by its path. The base is opened beneath the root
//! ([`RootDir::open_walk_base`]); every directory below it is opened relative to its parent's
//! descriptor, one name at a time with `O_NOFOLLOW | O_DIRECTORY` ([`open_subdir`]), and its
//! entries are read from that descriptor. So whatever is renamed or swapped for a symlink
//! while a walk runs, the names it sees are those of directories that were inside the root
//! when they were opened: a directory swapped for a symlink is not descended (`ELOOP`), never
//! listed wherever the link points. Visitors open the files they are given relative to the
//! same descriptor ([`open_child`]), and resolve a symlink entry from the root by its
//! root-relative path ([`RootDir::open`]), so the symlink rule is the one of direct paths.
//!
//! [`RootDir::open_walk_base`]: crate::confine::RootDir::open_walk_base
//! [`RootDir::open`]: crate::confine::RootDir::open
//!
//! Symlinked directories are never descended (no loops, no double counting), the base
//! included. Names that are not UTF-8 or that no [`VPath`](crate::VPath) can hold (backslashes,
//! control characters) are skipped with everything below them: the agent could not name them.
//!
//! With `.gitignore` support on, each directory's `.gitignore` and, where it holds a `.git`
//! directory, `.git/info/exclude` are read through the same descriptors; the deepest file that
//! has a say decides, `.gitignore` files before exclude files, as ripgrep does. Ignore files
//! above the base are not read, nor a worktree's exclude file (its `.git` is a file naming a
//! directory that may lie outside the root).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::num::NonZero;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use rustix::fs::{AtFlags, Dir, FileType, OFlags};
use rustix::io::Errno;

use crate::confine::{addressable, join_rel, open_child, open_subdir};

/// Walk threads at most, as ripgrep's walker has.
const MAX_THREADS: usize = 12;

/// The largest ignore file read; the rest of a larger one is not (a hostile tree must not make
/// a walk load gigabytes of patterns).
const IGNORE_FILE_LIMIT: u64 = 4 * 1024 * 1024;

/// What an entry of a walked directory is, by its directory entry (not following symlinks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A regular file.
    File,
    /// A directory (only given to [`Visitor::descend`]).
    Dir,
    /// A symlink, to anything.
    Symlink,
    /// A device, pipe or socket.
    Other,
}

/// One entry of a walked directory.
pub(crate) struct Entry<'a> {
    /// The directory holding the entry, opened beneath the root.
    pub(crate) dir: BorrowedFd<'a>,
    /// The entry's name in `dir`: a single segment, UTF-8, never `.` or `..`.
    pub(crate) name: &'a str,
    /// The entry's path relative to the host root (`src/main.rs`), for what is shown and for
    /// resolving a symlink from the root.
    pub(crate) root_rel: &'a str,
    pub(crate) kind: Kind,
}

/// What a walk does with the entries it finds; each walk thread has its own.
pub(crate) trait Visitor {
    /// Whether to descend into the directory `entry`.
    fn descend(&mut self, entry: &Entry<'_>) -> bool;

    /// A file, symlink or other non-directory entry.
    fn visit(&mut self, entry: &Entry<'_>);

    /// A directory below the base that could not be opened or listed (not one that vanished or
    /// turned into something else meanwhile): everything below it is missed.
    fn unlistable(&mut self, root_rel: &str, errno: Errno);
}

/// How a walk goes.
pub(crate) struct WalkOptions<'a> {
    /// Whether `.gitignore` and `.git/info/exclude` files decide what is walked.
    pub(crate) gitignore: bool,
    /// When the walk stops, checked after each entry (so the entry in hand is always finished).
    pub(crate) deadline: Instant,
    /// Set when the walk stopped at the deadline, or when a visitor found the budget spent.
    pub(crate) timed_out: &'a AtomicBool,
}

/// Walks the directory `base` (opened by [`RootDir::open_walk_base`], at `base_rel` relative to
/// the host root) in parallel, giving each entry below it to a visitor made by `visitor` per
/// thread. Returns when every directory has been read or the deadline has passed.
///
/// [`RootDir::open_walk_base`]: crate::confine::RootDir::open_walk_base
pub(crate) fn walk<V, F>(base: OwnedFd, base_rel: &str, options: &WalkOptions<'_>, visitor: F)
where
    V: Visitor,
    F: Fn() -> V + Sync,
{
    let queue = Queue {
        state: Mutex::new(QueueState {
            jobs: vec![Job {
                source: Source::Base(base),
                root_rel: base_rel.to_owned(),
                ignores: None,
            }],
            busy: 0,
            finished: false,
        }),
        changed: Condvar::new(),
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, NonZero::get)
        .min(MAX_THREADS);
    let work = || {
        let mut visitor = visitor();
        while let Some(job) = queue.next() {
            let mut busy = Busy {
                queue: &queue,
                children: Vec::new(),
                stop: false,
            };
            busy.stop = !list(job, options, &mut visitor, &mut busy.children);
        }
    };
    std::thread::scope(|scope| {
        for _ in 1..threads {
            // A thread the host refuses only makes the walk slower.
            let _ = std::thread::Builder::new().spawn_scoped(scope, work);
        }
        // The calling thread (a blocking-pool thread) walks too.
        work();
    });
}

/// A directory to list.
struct Job {
    source: Source,
    root_rel: String,
    /// The ignore files that apply in the directory's parent.
    ignores: Option<Arc<Ignores>>,
}

/// Where a directory to list is.
enum Source {
    /// The base, already opened beneath the root.
    Base(OwnedFd),
    /// A subdirectory, by its name in its parent (held open until its children are opened).
    Child { parent: Arc<Dir>, name: String },
}

/// The directories left to list, shared by the walk threads.
struct Queue {
    state: Mutex<QueueState>,
    changed: Condvar,
}

struct QueueState {
    /// Taken last in, first out: depth first, so few directories are held open at once.
    jobs: Vec<Job>,
    /// Threads listing a directory (which may add more).
    busy: usize,
    /// Every directory is listed, or the walk was stopped.
    finished: bool,
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The next directory to list, waiting while other threads may still add some; `None` when
    /// the walk is over.
    fn next(&self) -> Option<Job> {
        let mut state = self.lock();
        loop {
            if state.finished {
                return None;
            }
            if let Some(job) = state.jobs.pop() {
                state.busy += 1;
                return Some(job);
            }
            if state.busy == 0 {
                state.finished = true;
                self.changed.notify_all();
                return None;
            }
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// A thread's turn at a directory: when it ends (even by a panic in a visitor, so the other
/// threads are not left waiting), the subdirectories found are queued and the thread counts as
/// idle again.
struct Busy<'q> {
    queue: &'q Queue,
    children: Vec<Job>,
    /// The walk is to stop (deadline).
    stop: bool,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut state = self.queue.lock();
        state.busy -= 1;
        if self.stop || std::thread::panicking() {
            state.finished = true;
            state.jobs.clear();
        } else {
            state.jobs.append(&mut self.children);
        }
        self.queue.changed.notify_all();
    }
}

/// Whether the walk may go on after an entry: `false` once the deadline has passed. Checking
/// after rather than before means the entry in hand is always finished, so a budget spent
/// before the walk reached its first file (a slow disk, a busy machine) still yields that
/// file's results; the cost is at most one entry per walk thread past the deadline.
fn within_budget(options: &WalkOptions<'_>) -> bool {
    if options.timed_out.load(Ordering::Relaxed) || Instant::now() >= options.deadline {
        options.timed_out.store(true, Ordering::Relaxed);
        false
    } else {
        true
    }
}

/// Lists one directory: its files go to the visitor, its subdirectories to `children`.
/// Returns `false` when the walk is to stop.
fn list<V: Visitor>(
    job: Job,
    options: &WalkOptions<'_>,
    visitor: &mut V,
    children: &mut Vec<Job>,
) -> bool {
    let Job {
        source,
        root_rel,
        ignores,
    } = job;
    let fd = match source {
        Source::Base(fd) => fd,
        Source::Child { parent, name } => {
            let opened = parent.fd().and_then(|parent| open_subdir(parent, &name));
            match opened {
                Ok(fd) => fd,
                // Removed, or swapped for a symlink or a file since its parent was listed: there
                // is nothing of the root's to list here.
                Err(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => return true,
                Err(errno) => {
                    visitor.unlistable(&root_rel, errno);
                    return true;
                }
            }
        }
    };
    let mut dir = match Dir::new(fd) {
        Ok(dir) => dir,
        Err(errno) => {
            visitor.unlistable(&root_rel, errno);
            return true;
        }
    };
    let mut names = Vec::new();
    while let Some(entry) = dir.read() {
        match entry {
            Ok(entry) => {
                // Names the agent cannot address are skipped with what is below them.
                let Ok(name) = entry.file_name().to_str() else {
                    continue;
                };
                if name == "." || name == ".." || !addressable(name) {
                    continue;
                }
                names.push((name.to_owned(), entry.file_type()));
            }
            Err(errno) => {
                visitor.unlistable(&root_rel, errno);
                break;
            }
        }
    }
    let dir = Arc::new(dir);
    let Ok(dir_fd) = dir.fd() else {
        return true;
    };
    let ignores = if options.gitignore {
        Ignores::below(ignores, dir_fd, &root_rel, &names)
    } else {
        None
    };
    for (name, file_type) in &names {
        let kind = match file_type {
            FileType::RegularFile => Kind::File,
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Symlink,
            FileType::Unknown => {
                match rustix::fs::statat(dir_fd, name, AtFlags::SYMLINK_NOFOLLOW) {
                    // Filesystems that do not fill in the type in directory entries.
                    Ok(stat) => kind_of(FileType::from_raw_mode(stat.st_mode)),
                    Err(_) => continue,
                }
            }
            other => kind_of(*other),
        };
        let entry_rel = join_rel(&root_rel, name);
        if ignores
            .as_ref()
            .is_some_and(|i| i.ignores(&entry_rel, kind == Kind::Dir))
        {
            continue;
        }
        let entry = Entry {
            dir: dir_fd,
            name,
            root_rel: &entry_rel,
            kind,
        };
        if kind == Kind::Dir {
            if visitor.descend(&entry) {
                children.push(Job {
                    source: Source::Child {
                        parent: Arc::clone(&dir),
                        name: name.clone(),
                    },
                    root_rel: entry_rel,
                    ignores: ignores.clone(),
                });
            }
        } else {
            visitor.visit(&entry);
        }
        if !within_budget(options) {
            return false;
        }
    }
    true
}

fn kind_of(file_type: FileType) -> Kind {
    match file_type {
        FileType::RegularFile => Kind::File,
        FileType::Directory => Kind::Dir,
        FileType::Symlink => Kind::Symlink,
        _ => Kind::Other,
    }
}

/// The ignore files that apply in a directory: its own, then its parent's, up to the base.
struct Ignores {
    parent: Option<Arc<Ignores>>,
    gitignore: Gitignore,
    exclude: Gitignore,
}

impl Ignores {
    /// The ignore files that apply in the directory `dir` (at `dir_rel`, holding `names`):
    /// `parent`'s, plus the directory's own when it has any.
    fn below(
        parent: Option<Arc<Ignores>>,
        dir: BorrowedFd<'_>,
        dir_rel: &str,
        names: &[(String, FileType)],
    ) -> Option<Arc<Ignores>> {
        let has = |wanted: &str| names.iter().any(|(name, _)| name == wanted);
        let (has_gitignore, has_git) = (has(".gitignore"), has(".git"));
        if !has_gitignore && !has_git {
            return parent;
        }
        let shown = shown_path(dir_rel);
        let gitignore = if has_gitignore {
            read_ignore_file(dir, &[".gitignore"], &shown)
        } else {
            Gitignore::empty()
        };
        let exclude = if has_git {
            read_ignore_file(dir, &[".git", "info", "exclude"], &shown)
        } else {
            Gitignore::empty()
        };
        if gitignore.is_empty() && exclude.is_empty() {
            return parent;
        }
        Some(Arc::new(Ignores {
            parent,
            gitignore,
            exclude,
        }))
    }

    /// Whether the entry at `root_rel` is ignored.
    fn ignores(&self, root_rel: &str, is_dir: bool) -> bool {
        let path = shown_path(root_rel);
        let decide = |pick: fn(&Ignores) -> &Gitignore| {
            let mut level = Some(self);
            while let Some(ignores) = level {
                match pick(ignores).matched(&path, is_dir) {
                    Match::Ignore(_) => return Some(true),
                    Match::Whitelist(_) => return Some(false),
                    Match::None => level = ignores.parent.as_deref(),
                }
            }
            None
        };
        decide(|i| &i.gitignore)
            .or_else(|| decide(|i| &i.exclude))
            .unwrap_or(false)
    }
}

/// The virtual path of `root_rel` (`/` for the root): how entries are shown, and the paths
/// ignore patterns are matched against (ignore files are rooted at their directory's).
pub(crate) fn shown_path(root_rel: &str) -> String {
    if root_rel == "." {
        "/".to_owned()
    } else {
        format!("/{root_rel}")
    }
}

/// The patterns of the ignore file at `path` (single names, each opened with `O_NOFOLLOW`
/// relative to the one before, starting at `dir`), rooted at `dir_shown`. A missing,
/// unreadable or symlinked file has none; lines that are not valid patterns are skipped, as
/// ripgrep skips them.
fn read_ignore_file(dir: BorrowedFd<'_>, path: &[&str], dir_shown: &str) -> Gitignore {
    let mut builder = GitignoreBuilder::new(dir_shown);
    if let Some(file) = open_ignore_file(dir, path) {
        let reader = BufReader::new(file.take(IGNORE_FILE_LIMIT));
        for (i, line) in reader.lines().enumerate() {
            let line = match line {
                Ok(line) => line,
                // Not UTF-8: that line only.
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => continue,
                Err(_) => break,
            };
            // Git ignores a byte order mark at the start of the file.
            let line = if i == 0 {
                line.trim_start_matches('\u{feff}')
            } else {
                &line
            };
            let _ = builder.add_line(None, line);
        }
    }
    builder.build().unwrap_or_else(|_| Gitignore::empty())
}

fn open_ignore_file(dir: BorrowedFd<'_>, path: &[&str]) -> Option<File> {
    let (last, dirs) = path.split_last()?;
    let mut held: Option<OwnedFd> = None;
    for name in dirs {
        let parent = held.as_ref().map_or(dir, AsFd::as_fd);
        held = Some(open_subdir(parent, name).ok()?);
    }
    let parent = held.as_ref().map_or(dir, AsFd::as_fd);
    let fd = open_child(
        parent,
        last,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
    )
    .ok()?;
    let stat = rustix::fs::fstat(&fd).ok()?;
    (FileType::from_raw_mode(stat.st_mode) == FileType::RegularFile).then(|| File::from(fd))
}
