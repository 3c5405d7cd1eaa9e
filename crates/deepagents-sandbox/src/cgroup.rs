//! A cgroup per command: the kernel's count of the command's processes and threads, which a
//! fork bomb cannot get around (unlike `RLIMIT_NPROC`, it also holds for root), its memory
//! limit, and the list of every process the command left, however it detached, to end them.
//!
//! Created under this process's own cgroup in the `pids` and `memory` hierarchies (cgroup
//! v1's `/sys/fs/cgroup/pids` and `/sys/fs/cgroup/memory`, or one directory of cgroup v2
//! with both controllers), where it is writable: as root, or in a cgroup delegated to the
//! user. Elsewhere there is none, and the process limit falls back to `RLIMIT_NPROC`.
//!
//! A process killed by a signal cannot remove its cgroups; the first command of the next
//! process removes those whose creator is dead ([`sweep_stale`]).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustix::process::{Pid, Signal};

/// The prefix of every cgroup made here: `deepagents-PID-N`.
const PREFIX: &str = "deepagents-";

/// One controller's parent directory and its version.
#[derive(Clone, Debug)]
struct Hierarchy {
    dir: PathBuf,
    v2: bool,
}

/// Where new cgroups go for each controller (v2 has one directory for both).
#[derive(Debug, Default)]
struct Parents {
    pids: Option<Hierarchy>,
    memory: Option<Hierarchy>,
}

/// One command's cgroups, removed (their processes killed first) when dropped.
#[derive(Debug)]
pub(crate) struct Cgroup {
    /// One directory per hierarchy (one for v2, up to two for v1), each joined by the command.
    dirs: Vec<PathBuf>,
}

fn parents() -> &'static Parents {
    static PARENTS: OnceLock<Parents> = OnceLock::new();
    PARENTS.get_or_init(|| {
        let parents = Parents {
            pids: usable(own_cgroup("pids")),
            memory: usable(own_cgroup("memory")),
        };
        for hierarchy in [&parents.pids, &parents.memory].into_iter().flatten() {
            sweep_stale(&hierarchy.dir);
        }
        parents
    })
}

/// `hierarchy` if children can be made in it with the controller's files (creating and
/// removing a trial child proves we may).
fn usable(hierarchy: Option<(Hierarchy, &'static str)>) -> Option<Hierarchy> {
    let (hierarchy, controller) = hierarchy?;
    let trial = hierarchy
        .dir
        .join(format!("{PREFIX}trial-{}-{controller}", std::process::id()));
    std::fs::create_dir(&trial).ok()?;
    let enabled = enable(&hierarchy, controller, &trial);
    let _ = std::fs::remove_dir(&trial);
    enabled.then_some(hierarchy)
}

/// Whether commands get a pids cgroup on this machine.
pub(crate) fn available() -> bool {
    parents().pids.is_some()
}

/// Whether commands get a memory cgroup on this machine.
pub(crate) fn memory_available() -> bool {
    parents().memory.is_some()
}

/// This process's cgroup directory in the hierarchy that has `controller`, with the
/// controller's name (for the trial).
fn own_cgroup(controller: &'static str) -> Option<(Hierarchy, &'static str)> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let v1 = Path::new("/sys/fs/cgroup").join(controller);
    for line in membership.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == controller) && v1.is_dir() {
            let dir = v1.join(path);
            return Some((Hierarchy { dir, v2: false }, controller));
        }
        if controllers.is_empty() {
            let v2 = Path::new("/sys/fs/cgroup");
            let has = std::fs::read_to_string(v2.join("cgroup.controllers"))
                .is_ok_and(|list| list.split_whitespace().any(|c| c == controller));
            if has {
                let dir = v2.join(path);
                return Some((Hierarchy { dir, v2: true }, controller));
            }
        }
    }
    None
}

/// The file that sets a controller's limit.
fn limit_file(controller: &str, v2: bool) -> &'static str {
    match (controller, v2) {
        ("memory", true) => "memory.max",
        ("memory", false) => "memory.limit_in_bytes",
        _ => "pids.max",
    }
}

/// Makes sure `child` has the controller's limit file (cgroup v2 needs the controller
/// enabled in the parent's subtree first, which the kernel refuses when the parent holds
/// processes).
fn enable(parent: &Hierarchy, controller: &str, child: &Path) -> bool {
    let file = limit_file(controller, parent.v2);
    if child.join(file).exists() {
        return true;
    }
    parent.v2
        && std::fs::write(
            parent.dir.join("cgroup.subtree_control"),
            format!("+{controller}"),
        )
        .is_ok()
        && child.join(file).exists()
}

/// Removes the cgroups under `parent` that a process now dead made (killed by a signal, it
/// could not remove them), ending what is left in them first.
fn sweep_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|name| name.strip_prefix(PREFIX)) else {
            continue;
        };
        let creator = rest
            .strip_prefix("trial-")
            .unwrap_or(rest)
            .split('-')
            .next()
            .and_then(|pid| pid.parse::<i32>().ok());
        let Some(creator) = creator else {
            continue;
        };
        if crate::alive(creator) {
            continue;
        }
        end(&entry.path());
    }
}

/// Kills every member of the cgroup at `dir` and removes it (best effort, bounded).
fn end(dir: &Path) {
    // cgroup.kill (v2, Linux 5.14+) kills every member at once, forks in progress included;
    // the loop finishes the job where it is missing. Processes may fork while being killed,
    // so repeat until none is left; a process exits only once the kernel has delivered the
    // signal, hence the short waits.
    let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    for _ in 0..200 {
        let members = members(dir);
        if members.is_empty() && std::fs::remove_dir(dir).is_ok() {
            return;
        }
        for pid in members {
            // ESRCH: it ended on its own meanwhile.
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn members(dir: &Path) -> Vec<Pid> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.trim().parse::<i32>().ok())
        .filter_map(Pid::from_raw)
        .collect()
}

impl Cgroup {
    /// New cgroups allowing `max_processes` and `max_memory` bytes (each where set and its
    /// controller is available), or `None` where none is needed or none can be made.
    pub(crate) fn create(max_processes: Option<u64>, max_memory: Option<u64>) -> Option<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let parents = parents();
        let name = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut cgroup = Self { dirs: Vec::new() };
        let wanted = [
            ("pids", max_processes.map(|n| n.max(1)), &parents.pids),
            ("memory", max_memory, &parents.memory),
        ];
        for (controller, limit, parent) in wanted {
            let (Some(limit), Some(parent)) = (limit, parent) else {
                continue;
            };
            let dir = parent.dir.join(&name);
            if !cgroup.dirs.contains(&dir) {
                std::fs::create_dir(&dir).ok()?;
                cgroup.dirs.push(dir.clone());
            }
            std::fs::write(
                dir.join(limit_file(controller, parent.v2)),
                limit.to_string(),
            )
            .ok()?;
            if controller == "memory" {
                // No swap beyond the limit: a hog is stopped, not paged out (the files exist
                // only where swap accounting is on).
                let swap = if parent.v2 {
                    ("memory.swap.max", "0".to_owned())
                } else {
                    ("memory.memsw.limit_in_bytes", limit.to_string())
                };
                let _ = std::fs::write(dir.join(swap.0), swap.1);
            }
        }
        (!cgroup.dirs.is_empty()).then_some(cgroup)
    }

    /// The files a process writes its pid to, to join every cgroup of the command.
    pub(crate) fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|dir| dir.join("cgroup.procs"))
            .collect()
    }

    /// Whether the command's processes are counted (a pids cgroup): then every process it
    /// leaves is found and ended.
    pub(crate) fn counts_processes(&self) -> bool {
        self.under(parents().pids.as_ref())
    }

    /// Whether the command's memory is limited (a memory cgroup).
    pub(crate) fn limits_memory(&self) -> bool {
        self.under(parents().memory.as_ref())
    }

    fn under(&self, parent: Option<&Hierarchy>) -> bool {
        parent.is_some_and(|parent| {
            self.dirs
                .iter()
                .any(|dir| dir.parent() == Some(parent.dir.as_path()))
        })
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for dir in &self.dirs {
            end(dir);
        }
    }
}
