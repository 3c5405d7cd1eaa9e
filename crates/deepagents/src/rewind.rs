//! Rewind: a snapshot of what the agent may change, taken before each user turn of a thread,
//! and rewinding the thread's files, its conversation or both to the moment before a turn.
//!
//! A snapshot holds the agent state's files (`files` of [`AgentState`](crate::AgentState))
//! and the files on disk under a root (the directory of the filesystem and shell backends,
//! so what `execute` changed too). File contents are stored by their SHA-256 in the
//! snapshot directory of the thread, outside the root: a file unchanged between turns is
//! stored once, and an unchanged tree costs only its listing. The store is bounded by a size
//! cap: when it is passed, the oldest snapshots of the thread are dropped first (the newest
//! is always kept).
//!
//! What is recorded under the root: regular files (bytes and permission bits), symbolic links
//! (their targets) and directories. `.git` is skipped, and so is whatever `.gitignore`,
//! `.git/info/exclude` and `.ignore` files ignore (build outputs, dependencies): a rewind
//! neither restores nor removes them. Files larger than the per-file limit are listed but
//! not stored, and a rewind leaves them alone. Files outside the root are not recorded.
//!
//! Front ends call [`Snapshots::record`] before sending a user message on a thread and
//! [`Snapshots::record_after`] when its run ends (any way: finished, paused, failed); the
//! second tells what the agent left, so that a rewind can tell the user's own edits from the
//! agent's. The harness does not call them: library users call them around their runs.
//!
//! A rewind to turn `N` restores the files as they were before turn `N` (files created since
//! are removed, deleted ones recreated, changed ones restored with their modes), and/or makes
//! the conversation continue from the checkpoint before turn `N` (a new checkpoint on top of
//! the thread, so the history stays). A file whose content now differs both from the snapshot
//! and from every version the agent's later turns left was changed by hand: the rewind refuses
//! ([`RewindError::Conflicts`]) unless forced.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use deepagents_core::state::FileData;
use deepagents_core::{CheckpointError, Checkpointer, Message, Run, RunDelta};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

/// The default size cap of a thread's snapshots: 512 MiB.
pub const DEFAULT_CAP_BYTES: u64 = 512 * 1024 * 1024;
/// How long before a listing a file's modification must be for its hash to be reused by
/// the next listing: file times are coarse (a write a few milliseconds after another may
/// leave the time unchanged).
const RACY_NS: u64 = 2_000_000_000;

/// The default largest file a snapshot stores: 16 MiB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// What went wrong with a snapshot or a rewind.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RewindError {
    /// The thread has no snapshot of that turn.
    #[error(
        "thread `{thread}` has no snapshot of turn {turn} (never taken, or dropped by the size cap); its files cannot be rewound, but its conversation can"
    )]
    NoSnapshot {
        /// The thread.
        thread: String,
        /// The turn.
        turn: u64,
    },
    /// The conversation has no such turn.
    #[error("thread `{thread}` has no turn {turn}; it has {turns}")]
    NoTurn {
        /// The thread.
        thread: String,
        /// The turn asked for.
        turn: u64,
        /// How many turns it has.
        turns: u64,
    },
    /// Files were changed by hand since the snapshot; nothing was changed.
    #[error(
        "changed by hand since the snapshot, so not overwritten (force the rewind to overwrite them): {}",
        .0.join(", ")
    )]
    Conflicts(Vec<String>),
    /// The disk failed.
    #[error("{0}")]
    Io(String),
    /// The checkpointer failed (or another run holds the thread).
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

fn io(context: &str, path: &Path, error: std::io::Error) -> RewindError {
    RewindError::Io(format!("{context} {}: {error}", path.display()))
}

/// One path of a recorded tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Entry {
    /// A regular file: its content's hash, size, permission bits and modification time (the
    /// time lets the next snapshot reuse the hash without reading the file again).
    File {
        hash: String,
        size: u64,
        mode: u32,
        mtime_ns: u64,
    },
    /// A symbolic link and its target.
    Symlink { target: String },
    /// A directory.
    Dir { mode: u32 },
    /// A file too large to store: left alone by rewinds.
    TooLarge { size: u64 },
}

impl Entry {
    /// What a user sees of the entry: content, not times.
    fn content(&self) -> Content<'_> {
        match self {
            Self::File { hash, .. } => Content::File(hash),
            Self::Symlink { target } => Content::Symlink(target),
            Self::Dir { .. } => Content::Dir,
            Self::TooLarge { .. } => Content::TooLarge,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Content<'a> {
    File(&'a str),
    Symlink(&'a str),
    Dir,
    TooLarge,
}

type Tree = BTreeMap<String, Entry>;

/// One side of a turn: the disk tree and the state files (path → hash of their JSON).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Side {
    #[serde(default)]
    tree: Tree,
    /// When the tree was listed (nanoseconds since the Unix epoch): hashes of files modified
    /// shortly before are not reused, as a file's time may not change between two writes.
    #[serde(default)]
    scanned_at_ns: u64,
    #[serde(default)]
    state: BTreeMap<String, String>,
}

/// The stored record of one turn.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Manifest {
    turn: u64,
    created_at_ms: u64,
    preview: String,
    root: Option<PathBuf>,
    before: Side,
    #[serde(default)]
    after: Option<Side>,
}

/// A snapshot, as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The turn it was taken before (1 for the first user message).
    pub turn: u64,
    /// When, in milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// The start of the user message of the turn.
    pub preview: String,
    /// The root whose files it holds, if any.
    pub root: Option<PathBuf>,
    /// How many files (on disk and in the state) it holds.
    pub files: usize,
}

/// What to rewind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RewindOptions {
    /// Restore the files (on disk under the root, and in the state).
    pub files: bool,
    /// Make the conversation continue from before the turn.
    pub conversation: bool,
    /// Overwrite files changed by hand since the snapshot.
    pub force: bool,
}

impl Default for RewindOptions {
    fn default() -> Self {
        Self {
            files: true,
            conversation: true,
            force: false,
        }
    }
}

/// What a rewind changed (or, from [`Snapshots::plan`], would change).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RewindReport {
    /// The turn rewound to.
    pub turn: u64,
    /// Files given back their earlier content or mode.
    pub restored: Vec<String>,
    /// Files (and directories, links) created again.
    pub recreated: Vec<String>,
    /// Files (and directories, links) created since, removed.
    pub removed: Vec<String>,
    /// Files changed by hand since the snapshot (overwritten only when forced).
    pub conflicts: Vec<String>,
    /// Files too large to store, left as they are.
    pub skipped: Vec<String>,
    /// Directories not removed because they still hold ignored files.
    pub kept: Vec<String>,
    /// State files restored, recreated or removed.
    pub state_files: Vec<String>,
    /// The checkpoint the conversation now continues from (`Some(0)`: the empty thread),
    /// and the messages it dropped, when the conversation was rewound.
    pub conversation: Option<(u64, usize)>,
}

impl RewindReport {
    /// Whether the files were left as they are.
    pub fn files_unchanged(&self) -> bool {
        self.restored.is_empty()
            && self.recreated.is_empty()
            && self.removed.is_empty()
            && self.state_files.is_empty()
    }

    /// What it changed, one line each, for a person.
    pub fn lines(&self) -> Vec<String> {
        let mut lines = Vec::new();
        let mut list = |label: &str, paths: &[String]| {
            if !paths.is_empty() {
                lines.push(format!("{label}: {}", paths.join(", ")));
            }
        };
        list("restored", &self.restored);
        list("recreated", &self.recreated);
        list("removed", &self.removed);
        list("state files", &self.state_files);
        list("overwritten (changed by hand)", &self.conflicts);
        list("too large to restore, left as they are", &self.skipped);
        list("kept (hold ignored files)", &self.kept);
        if let Some((checkpoint, dropped)) = self.conversation {
            lines.push(format!(
                "conversation: continues from before turn {} (checkpoint {checkpoint}), {dropped} messages dropped",
                self.turn
            ));
        }
        if lines.is_empty() {
            lines.push("nothing to change".to_owned());
        }
        lines
    }
}

/// The snapshots of threads, one directory per thread under a base directory (the CLI's is
/// `snapshots/` in its data directory). Cheap to clone. Its methods do blocking file work:
/// from async code, call them on a blocking task (`rewind` does so itself).
#[derive(Clone, Debug)]
pub struct Snapshots {
    dir: PathBuf,
    cap_bytes: u64,
    max_file_bytes: u64,
}

impl Snapshots {
    /// Snapshots kept under `dir` (created on first use), with the default caps.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            cap_bytes: DEFAULT_CAP_BYTES,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
        }
    }

    /// The size a thread's snapshots may take (default [`DEFAULT_CAP_BYTES`]); past it, the
    /// oldest are dropped, down to the newest one.
    pub fn with_cap(mut self, bytes: u64) -> Self {
        self.cap_bytes = bytes;
        self
    }

    /// The largest file a snapshot stores (default [`DEFAULT_MAX_FILE_BYTES`]); larger ones
    /// are listed and left alone by rewinds.
    pub fn with_max_file_size(mut self, bytes: u64) -> Self {
        self.max_file_bytes = bytes;
        self
    }

    /// The directory of `thread`'s snapshots.
    pub fn thread_dir(&self, thread: &str) -> Result<PathBuf, RewindError> {
        deepagents_core::validate_thread_id(thread)?;
        Ok(self.dir.join(thread))
    }

    /// Records the snapshot taken before turn `turn` of `thread` (see [`next_turn`]): the
    /// files under `root` (when the agent works on disk) and the state files `state`.
    /// `preview` is the user message. Replaces an earlier snapshot of that turn and drops
    /// those of later turns (a conversation rewound elsewhere), then keeps the thread under
    /// the size cap.
    pub fn record(
        &self,
        thread: &str,
        turn: u64,
        preview: &str,
        root: Option<&Path>,
        state: &BTreeMap<String, FileData>,
    ) -> Result<SnapshotInfo, RewindError> {
        let dir = self.thread_dir(thread)?;
        let manifests = manifest_turns(&dir)?;
        let previous = match manifests.last() {
            Some(&last) => read_manifest(&dir, last).ok(),
            None => None,
        };
        let cache = previous
            .as_ref()
            .map(|m| m.after.as_ref().unwrap_or(&m.before));
        let scanned_at_ns = now_ns();
        let tree = match root {
            Some(root) => self.scan(root, &dir, cache, true)?,
            None => Tree::new(),
        };
        let state = store_state(&dir, state)?;
        let manifest = Manifest {
            turn,
            created_at_ms: now_ms(),
            preview: preview_of(preview),
            root: root.map(Path::to_path_buf),
            before: Side {
                tree,
                scanned_at_ns,
                state,
            },
            after: None,
        };
        let mut dropped = false;
        for &later in manifests.iter().filter(|&&t| t > turn) {
            remove_manifest(&dir, later)?;
            dropped = true;
        }
        write_manifest(&dir, &manifest)?;
        self.enforce_cap(&dir, dropped || manifests.contains(&turn))?;
        Ok(info(&manifest))
    }

    /// Records what turn `turn` of `thread` left when its run ended: its files are then
    /// known to be the agent's, not the user's. Only hashes are kept; does nothing when the
    /// turn has no snapshot.
    pub fn record_after(
        &self,
        thread: &str,
        turn: u64,
        root: Option<&Path>,
        state: &BTreeMap<String, FileData>,
    ) -> Result<bool, RewindError> {
        let dir = self.thread_dir(thread)?;
        let Ok(mut manifest) = read_manifest(&dir, turn) else {
            return Ok(false);
        };
        let cache = manifest.after.as_ref().unwrap_or(&manifest.before).clone();
        let scanned_at_ns = now_ns();
        let tree = match root {
            Some(root) => self.scan(root, &dir, Some(&cache), false)?,
            None => Tree::new(),
        };
        let state = state
            .iter()
            .map(|(path, file)| Ok((path.clone(), hash(&state_bytes(file)?))))
            .collect::<Result<_, RewindError>>()?;
        manifest.after = Some(Side {
            tree,
            scanned_at_ns,
            state,
        });
        write_manifest(&dir, &manifest)?;
        Ok(true)
    }

    /// The snapshots of `thread`, oldest first.
    pub fn list(&self, thread: &str) -> Result<Vec<SnapshotInfo>, RewindError> {
        let dir = self.thread_dir(thread)?;
        manifest_turns(&dir)?
            .into_iter()
            .map(|turn| read_manifest(&dir, turn).map(|m| info(&m)))
            .collect()
    }

    /// The bytes `thread`'s snapshots take on disk.
    pub fn usage(&self, thread: &str) -> Result<u64, RewindError> {
        let dir = self.thread_dir(thread)?;
        Ok(dir_size(&dir))
    }

    /// Removes `thread`'s snapshots (when the thread is deleted).
    pub fn delete_thread(&self, thread: &str) -> Result<bool, RewindError> {
        let dir = self.thread_dir(thread)?;
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io("cannot remove", &dir, e)),
        }
    }

    /// What rewinding the files under `root` to before turn `turn` would change, conflicts
    /// included; changes nothing.
    pub fn plan(&self, thread: &str, turn: u64, root: &Path) -> Result<RewindReport, RewindError> {
        let dir = self.thread_dir(thread)?;
        let (target, turns) = self.turns_from(&dir, thread, turn)?;
        let current = self.scan(root, &dir, Some(&target.before), false)?;
        let mut report = plan_files(&target.before.tree, &current, &turns);
        report.turn = turn;
        Ok(report)
    }

    /// Rewinds `thread` to before turn `turn`: its files under `root` and in the state, its
    /// conversation (in `checkpointer`), or both, as `options` say. Holds the thread's lease
    /// throughout, so it fails with [`CheckpointError::Busy`] while a run holds the thread.
    /// Files changed by hand make it fail with [`RewindError::Conflicts`], having changed
    /// nothing, unless `options.force`.
    pub async fn rewind(
        &self,
        checkpointer: &dyn Checkpointer,
        thread: &str,
        turn: u64,
        root: Option<&Path>,
        options: RewindOptions,
    ) -> Result<RewindReport, RewindError> {
        let dir = self.thread_dir(thread)?;
        let _lease = checkpointer.try_lease(thread).await?;
        let head = checkpointer.load(thread, None).await?;
        let mut report = RewindReport {
            turn,
            ..RewindReport::default()
        };
        // The conversation's target first: a turn it lacks fails before anything changes.
        let conversation = if options.conversation {
            let head = head.clone().unwrap_or_default();
            let starts = turn_starts(&head);
            let Some(&start) = usize::try_from(turn)
                .ok()
                .and_then(|t| t.checked_sub(1))
                .and_then(|i| starts.get(i))
            else {
                return Err(RewindError::NoTurn {
                    thread: thread.to_owned(),
                    turn,
                    turns: starts.len() as u64,
                });
            };
            let at = checkpointer
                .checkpoints(thread)
                .await?
                .iter()
                .filter(|c| c.messages <= start)
                .map(|c| c.id)
                .max()
                .unwrap_or(0);
            let target = if at == 0 {
                Run::default()
            } else {
                checkpointer
                    .load(thread, Some(at))
                    .await?
                    .unwrap_or_default()
            };
            Some((head, target, at))
        } else {
            None
        };
        let mut state_target = None;
        let mut disk_root = None;
        if options.files {
            let (target, turns) = self.turns_from(&dir, thread, turn)?;
            if let Some(root) = root.or(target.root.as_deref()) {
                let this = self.clone();
                let (dir, root) = (dir.clone(), root.to_path_buf());
                disk_root = Some(root.clone());
                let force = options.force;
                let files =
                    tokio::task::spawn_blocking(move || this.restore(&dir, &root, &turns, force))
                        .await
                        .map_err(|e| RewindError::Io(format!("the rewind failed: {e}")))??;
                report = RewindReport { turn, ..files };
            }
            state_target = Some(load_state(&dir, &target.before.state)?);
        }
        let current_state = head
            .as_ref()
            .map(|run| run.state.files.clone())
            .unwrap_or_default();
        match (conversation, head) {
            (Some((head, mut target, at)), _) => {
                let dropped = head
                    .state
                    .messages
                    .len()
                    .saturating_sub(target.state.messages.len());
                if let Some(files) = state_target {
                    target.state.files = files;
                }
                report.state_files = changed_state(&current_state, &target.state.files);
                checkpointer
                    .append(thread, &RunDelta::replacing(&head, &target), &target)
                    .await?;
                report.conversation = Some((at, dropped));
                // The turns after this one belong to a future that no longer is; this one
                // has not happened yet.
                for later in manifest_turns(&dir)?.into_iter().filter(|&t| t >= turn) {
                    if later == turn {
                        if let Ok(mut manifest) = read_manifest(&dir, turn) {
                            manifest.after = None;
                            write_manifest(&dir, &manifest)?;
                        }
                    } else {
                        remove_manifest(&dir, later)?;
                    }
                }
                self.enforce_cap(&dir, true)?;
            }
            (None, head) => {
                let mut state = current_state.clone();
                if let (Some(files), Some(head)) = (state_target, head) {
                    report.state_files = changed_state(&current_state, &files);
                    if !report.state_files.is_empty() {
                        let mut run = head.clone();
                        run.state.files = files;
                        checkpointer
                            .append(thread, &RunDelta::replacing(&head, &run), &run)
                            .await?;
                        state = run.state.files;
                    }
                }
                // What the rewind left counts as the agent's side's, not the user's.
                if options.files
                    && let Some(&latest) = manifest_turns(&dir)?.last()
                {
                    self.record_after(thread, latest, disk_root.as_deref(), &state)?;
                }
            }
        }
        Ok(report)
    }

    /// The manifest of `turn`, and those of it and the turns after it.
    fn turns_from(
        &self,
        dir: &Path,
        thread: &str,
        turn: u64,
    ) -> Result<(Manifest, Vec<Manifest>), RewindError> {
        let turns = manifest_turns(dir)?;
        if !turns.contains(&turn) {
            return Err(RewindError::NoSnapshot {
                thread: thread.to_owned(),
                turn,
            });
        }
        let target = read_manifest(dir, turn)?;
        let later = turns
            .into_iter()
            .filter(|&t| t >= turn)
            .map(|t| read_manifest(dir, t))
            .collect::<Result<_, _>>()?;
        Ok((target, later))
    }

    /// Makes the tree under `root` that of the first of `turns` (the turn rewound to; the
    /// others are those after it).
    fn restore(
        &self,
        dir: &Path,
        root: &Path,
        turns: &[Manifest],
        force: bool,
    ) -> Result<RewindReport, RewindError> {
        let Some(target) = turns.first() else {
            return Ok(RewindReport::default());
        };
        let wanted = &target.before.tree;
        let current = self.scan(root, dir, Some(&target.before), false)?;
        let report = plan_files(wanted, &current, turns);
        if !report.conflicts.is_empty() && !force {
            return Err(RewindError::Conflicts(report.conflicts));
        }
        let mut report = report;
        // Removals deepest first, so directories are empty when their turn comes.
        for path in report.removed.clone().iter().rev() {
            let full = root.join(path);
            let result = match current.get(path) {
                Some(Entry::Dir { .. }) => std::fs::remove_dir(&full),
                _ => std::fs::remove_file(&full),
            };
            match result {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(_) if matches!(current.get(path), Some(Entry::Dir { .. })) => {
                    report.kept.push(path.clone());
                }
                Err(e) => return Err(io("cannot remove", &full, e)),
            }
        }
        report.removed.retain(|path| !report.kept.contains(path));
        // Then what the snapshot holds, parents before children.
        let mut writes: Vec<&String> = report
            .restored
            .iter()
            .chain(report.recreated.iter())
            .collect();
        writes.sort();
        for path in writes {
            let Some(entry) = wanted.get(path) else {
                continue;
            };
            let full = root.join(path);
            // Something of another kind in the way (a directory where a file was) goes.
            match (current.get(path), entry) {
                (Some(Entry::Dir { .. }), Entry::Dir { .. }) | (None, _) => {}
                (Some(Entry::Dir { .. }), _) => {
                    std::fs::remove_dir_all(&full).map_err(|e| io("cannot remove", &full, e))?;
                }
                (Some(_), Entry::File { .. }) => {}
                (Some(_), _) => {
                    std::fs::remove_file(&full).map_err(|e| io("cannot remove", &full, e))?;
                }
            }
            write_entry(dir, &full, entry)?;
        }
        Ok(report)
    }

    /// Lists the tree under `root`, hashing files (reusing `cache`'s hashes for files whose
    /// size and modification time are unchanged); with `store`, their contents are stored in
    /// `dir` as well.
    fn scan(
        &self,
        root: &Path,
        dir: &Path,
        cache: Option<&Side>,
        store: bool,
    ) -> Result<Tree, RewindError> {
        let mut tree = Tree::new();
        let own = dir.to_path_buf();
        let walker = ignore::WalkBuilder::new(root)
            .hidden(false)
            .git_global(false)
            .require_git(false)
            .follow_links(false)
            .filter_entry(move |entry| entry.file_name() != ".git" && entry.path() != own)
            .build();
        for entry in walker {
            let entry =
                entry.map_err(|e| RewindError::Io(format!("cannot list the files: {e}")))?;
            if entry.depth() == 0 {
                continue;
            }
            let Ok(relative) = entry.path().strip_prefix(root) else {
                continue;
            };
            // Paths that are not UTF-8 are not recorded.
            let Some(relative) = relative.to_str() else {
                continue;
            };
            let relative = relative.replace(std::path::MAIN_SEPARATOR, "/");
            let path = entry.path();
            let meta = std::fs::symlink_metadata(path).map_err(|e| io("cannot read", path, e))?;
            let kind = meta.file_type();
            let recorded = if kind.is_symlink() {
                let target = std::fs::read_link(path).map_err(|e| io("cannot read", path, e))?;
                Entry::Symlink {
                    target: target.to_string_lossy().into_owned(),
                }
            } else if kind.is_dir() {
                Entry::Dir { mode: mode(&meta) }
            } else if kind.is_file() {
                let size = meta.len();
                if size > self.max_file_bytes {
                    Entry::TooLarge { size }
                } else {
                    let mtime_ns = meta
                        .modified()
                        .ok()
                        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                        .map_or(0, |d| d.as_nanos() as u64);
                    let cached = cache.and_then(|side| match side.tree.get(&relative) {
                        Some(Entry::File {
                            hash,
                            size: s,
                            mtime_ns: m,
                            ..
                        }) if *s == size
                            && *m == mtime_ns
                            && mtime_ns != 0
                            && mtime_ns.saturating_add(RACY_NS) < side.scanned_at_ns =>
                        {
                            Some(hash.clone())
                        }
                        _ => None,
                    });
                    let hash = match cached {
                        Some(hash) if !store || object_path(dir, &hash).exists() => hash,
                        _ => {
                            let bytes =
                                std::fs::read(path).map_err(|e| io("cannot read", path, e))?;
                            let hash = hash(&bytes);
                            if store {
                                store_object(dir, &hash, &bytes)?;
                            }
                            hash
                        }
                    };
                    Entry::File {
                        hash,
                        size,
                        mode: mode(&meta),
                        mtime_ns,
                    }
                }
            } else {
                continue;
            };
            tree.insert(relative, recorded);
        }
        Ok(tree)
    }

    /// Drops the oldest snapshots while the thread's snapshots pass the cap, and the contents
    /// no snapshot refers to any more (`collect`: some may be unreferenced already).
    fn enforce_cap(&self, dir: &Path, collect: bool) -> Result<(), RewindError> {
        if !collect && dir_size(dir) <= self.cap_bytes {
            return Ok(());
        }
        let mut turns = manifest_turns(dir)?;
        loop {
            collect_garbage(dir, &turns)?;
            if dir_size(dir) <= self.cap_bytes || turns.len() <= 1 {
                return Ok(());
            }
            let oldest = turns.remove(0);
            remove_manifest(dir, oldest)?;
        }
    }
}

/// The turn a new user message of `run` starts (1 for a new thread): one more than the user
/// messages it holds.
pub fn next_turn(run: Option<&Run>) -> u64 {
    run.map_or(0, |run| turn_starts(run).len() as u64) + 1
}

/// The user messages of `run`, numbered as turns, with their first line: what a front end
/// lists to rewind to.
pub fn turns(run: &Run) -> Vec<(u64, String)> {
    turn_starts(run)
        .into_iter()
        .enumerate()
        .map(|(i, at)| (i as u64 + 1, preview_of(&run.state.messages[at].text())))
        .collect()
}

/// Where each user message of `run` is.
fn turn_starts(run: &Run) -> Vec<usize> {
    run.state
        .messages
        .iter()
        .enumerate()
        .filter(|(_, m)| matches!(m, Message::User { .. }))
        .map(|(i, _)| i)
        .collect()
}

/// The start of `text`'s first line.
fn preview_of(text: &str) -> String {
    let line = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    if line.chars().count() > 72 {
        let mut short: String = line.chars().take(71).collect();
        short.push('…');
        short
    } else {
        line.to_owned()
    }
}

/// Compares the tree `wanted` with `current`: what to change, and which of those changes
/// would overwrite a hand edit. A current entry is the agent's when it is what the snapshot
/// holds or what one of the turns `turns` (the target's and later) left where that turn
/// changed it; with no record of what a turn left, none of its changes are known to be the
/// agent's.
fn plan_files(wanted: &Tree, current: &Tree, turns: &[Manifest]) -> RewindReport {
    let mut report = RewindReport::default();
    let paths: BTreeSet<&String> = wanted.keys().chain(current.keys()).collect();
    for path in paths {
        let want = wanted.get(path);
        let have = current.get(path);
        if matches!(want, Some(Entry::TooLarge { .. }))
            || matches!(have, Some(Entry::TooLarge { .. }))
        {
            if want.map(Entry::content) != have.map(Entry::content) || want.is_some() {
                report.skipped.push(path.clone());
            }
            continue;
        }
        let same = match (want, have) {
            (
                Some(Entry::File {
                    hash: a, mode: ma, ..
                }),
                Some(Entry::File {
                    hash: b, mode: mb, ..
                }),
            ) => a == b && ma == mb,
            (Some(Entry::Dir { .. }), Some(Entry::Dir { .. })) => true,
            (Some(a), Some(b)) => a.content() == b.content(),
            (None, None) => true,
            _ => false,
        };
        if same {
            continue;
        }
        let now = have.map(Entry::content);
        let agents = now == want.map(Entry::content)
            || matches!(now, Some(Content::Dir))
            || turns.iter().any(|turn| {
                turn.after.as_ref().is_some_and(|after| {
                    let left = after.tree.get(path).map(Entry::content);
                    left != turn.before.tree.get(path).map(Entry::content) && left == now
                })
            });
        if !agents {
            report.conflicts.push(path.clone());
        }
        match (want, have) {
            (Some(_), None) => report.recreated.push(path.clone()),
            (None, Some(_)) => report.removed.push(path.clone()),
            _ => report.restored.push(path.clone()),
        }
    }
    report
}

fn changed_state(
    current: &BTreeMap<String, FileData>,
    wanted: &BTreeMap<String, FileData>,
) -> Vec<String> {
    current
        .keys()
        .chain(wanted.keys())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .filter(|path| current.get(*path) != wanted.get(*path))
        .cloned()
        .collect()
}

fn info(manifest: &Manifest) -> SnapshotInfo {
    SnapshotInfo {
        turn: manifest.turn,
        created_at_ms: manifest.created_at_ms,
        preview: manifest.preview.clone(),
        root: manifest.root.clone(),
        files: manifest
            .before
            .tree
            .values()
            .filter(|e| !matches!(e, Entry::Dir { .. }))
            .count()
            + manifest.before.state.len(),
    }
}

fn hash(bytes: &[u8]) -> String {
    let digest = sha2::Sha256::digest(bytes);
    let mut hex = String::with_capacity(64);
    for byte in digest {
        hex.push_str(&format!("{byte:02x}"));
    }
    hex
}

fn object_path(dir: &Path, hash: &str) -> PathBuf {
    let (head, rest) = hash.split_at(2.min(hash.len()));
    dir.join("objects").join(head).join(rest)
}

fn store_object(dir: &Path, hash: &str, bytes: &[u8]) -> Result<(), RewindError> {
    let path = object_path(dir, hash);
    if path.exists() {
        return Ok(());
    }
    let parent = path.parent().unwrap_or(dir);
    std::fs::create_dir_all(parent).map_err(|e| io("cannot create", parent, e))?;
    write_atomically(&path, bytes)
}

fn read_object(dir: &Path, hash: &str) -> Result<Vec<u8>, RewindError> {
    let path = object_path(dir, hash);
    std::fs::read(&path).map_err(|e| io("cannot read the stored content", &path, e))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), RewindError> {
    let parent = path.parent().unwrap_or(Path::new("."));
    let mut file =
        tempfile::NamedTempFile::new_in(parent).map_err(|e| io("cannot write in", parent, e))?;
    file.write_all(bytes)
        .map_err(|e| io("cannot write", path, e))?;
    file.persist(path)
        .map_err(|e| io("cannot write", path, e.error))?;
    Ok(())
}

fn state_bytes(file: &FileData) -> Result<Vec<u8>, RewindError> {
    serde_json::to_vec(file)
        .map_err(|e| RewindError::Io(format!("cannot encode a state file: {e}")))
}

fn store_state(
    dir: &Path,
    state: &BTreeMap<String, FileData>,
) -> Result<BTreeMap<String, String>, RewindError> {
    state
        .iter()
        .map(|(path, file)| {
            let bytes = state_bytes(file)?;
            let hash = hash(&bytes);
            store_object(dir, &hash, &bytes)?;
            Ok((path.clone(), hash))
        })
        .collect()
}

fn load_state(
    dir: &Path,
    state: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, FileData>, RewindError> {
    state
        .iter()
        .map(|(path, hash)| {
            let bytes = read_object(dir, hash)?;
            let file = serde_json::from_slice(&bytes).map_err(|e| {
                RewindError::Io(format!("the stored state file {path} is unreadable: {e}"))
            })?;
            Ok((path.clone(), file))
        })
        .collect()
}

/// Writes `entry` at `full`, creating its parents.
fn write_entry(dir: &Path, full: &Path, entry: &Entry) -> Result<(), RewindError> {
    if let Some(parent) = full.parent() {
        std::fs::create_dir_all(parent).map_err(|e| io("cannot create", parent, e))?;
    }
    match entry {
        Entry::File { hash, mode, .. } => {
            let bytes = read_object(dir, hash)?;
            // Through a new file renamed over the old: a read-only file is replaced too.
            write_atomically(full, &bytes)?;
            set_mode(full, *mode)?;
        }
        Entry::Dir { mode } => {
            std::fs::create_dir_all(full).map_err(|e| io("cannot create", full, e))?;
            set_mode(full, *mode)?;
        }
        Entry::Symlink { target } => {
            #[cfg(unix)]
            std::os::unix::fs::symlink(target, full).map_err(|e| io("cannot link", full, e))?;
            #[cfg(not(unix))]
            let _ = target;
        }
        Entry::TooLarge { .. } => {}
    }
    Ok(())
}

#[cfg(unix)]
fn mode(meta: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    meta.permissions().mode() & 0o7777
}

#[cfg(not(unix))]
fn mode(meta: &std::fs::Metadata) -> u32 {
    if meta.permissions().readonly() {
        0o444
    } else {
        0o644
    }
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> Result<(), RewindError> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| io("cannot set the mode of", path, e))
}

#[cfg(not(unix))]
fn set_mode(_path: &Path, _mode: u32) -> Result<(), RewindError> {
    Ok(())
}

fn manifest_path(dir: &Path, turn: u64) -> PathBuf {
    dir.join("turns").join(format!("{turn:08}.json"))
}

fn manifest_turns(dir: &Path) -> Result<Vec<u64>, RewindError> {
    let turns_dir = dir.join("turns");
    let entries = match std::fs::read_dir(&turns_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io("cannot list", &turns_dir, e)),
    };
    let mut turns: Vec<u64> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json")?.parse().ok())
        .collect();
    turns.sort_unstable();
    Ok(turns)
}

fn read_manifest(dir: &Path, turn: u64) -> Result<Manifest, RewindError> {
    let path = manifest_path(dir, turn);
    let bytes = std::fs::read(&path).map_err(|e| io("cannot read", &path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        RewindError::Io(format!(
            "the snapshot {} is unreadable: {e}",
            path.display()
        ))
    })
}

fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), RewindError> {
    let path = manifest_path(dir, manifest.turn);
    let parent = path.parent().unwrap_or(dir);
    std::fs::create_dir_all(parent).map_err(|e| io("cannot create", parent, e))?;
    let bytes = serde_json::to_vec(manifest)
        .map_err(|e| RewindError::Io(format!("cannot encode a snapshot: {e}")))?;
    write_atomically(&path, &bytes)
}

fn remove_manifest(dir: &Path, turn: u64) -> Result<(), RewindError> {
    let path = manifest_path(dir, turn);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io("cannot remove", &path, e)),
    }
}

/// Removes the stored contents none of the snapshots of `turns` refers to.
fn collect_garbage(dir: &Path, turns: &[u64]) -> Result<(), RewindError> {
    let mut referenced = BTreeSet::new();
    for &turn in turns {
        let manifest = read_manifest(dir, turn)?;
        for entry in manifest.before.tree.values() {
            if let Entry::File { hash, .. } = entry {
                referenced.insert(hash.clone());
            }
        }
        referenced.extend(manifest.before.state.into_values());
    }
    let objects = dir.join("objects");
    let Ok(heads) = std::fs::read_dir(&objects) else {
        return Ok(());
    };
    for head in heads.filter_map(Result::ok) {
        let head_name = head.file_name().to_string_lossy().into_owned();
        let Ok(files) = std::fs::read_dir(head.path()) else {
            continue;
        };
        for file in files.filter_map(Result::ok) {
            let name = format!("{head_name}{}", file.file_name().to_string_lossy());
            if !referenced.contains(&name) {
                let _ = std::fs::remove_file(file.path());
            }
        }
    }
    Ok(())
}

/// The bytes of the files under `dir`.
fn dir_size(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(Result::ok)
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => dir_size(&entry.path()),
            Ok(_) => entry.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
