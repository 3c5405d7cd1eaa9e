//! A pids cgroup per command: the kernel's count of the command's processes and threads,
//! which a fork bomb cannot get around (unlike `RLIMIT_NPROC`, it also holds for root), and
//! the list of every process the command left, however it detached, to end them.
//!
//! Created under this process's own cgroup in the pids hierarchy (cgroup v1's
//! `/sys/fs/cgroup/pids`, or cgroup v2 with the pids controller), where it is writable:
//! as root, or in a cgroup delegated to the user. Elsewhere there is none, and the limit
//! falls back to `RLIMIT_NPROC`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rustix::process::{Pid, Signal};

/// One command's cgroup, removed (its processes killed first) when dropped.
#[derive(Debug)]
pub(crate) struct Cgroup {
    dir: PathBuf,
}

/// Where this process's pids cgroup is, and whether children can be made in it.
fn parent() -> Option<&'static Path> {
    static PARENT: OnceLock<Option<PathBuf>> = OnceLock::new();
    PARENT
        .get_or_init(|| {
            let dir = own_pids_cgroup()?;
            // Creating and removing a trial child proves we may.
            let trial = dir.join(format!("deepagents-trial-{}", std::process::id()));
            std::fs::create_dir(&trial).ok()?;
            let limited = enable_pids(&dir, &trial);
            let _ = std::fs::remove_dir(&trial);
            limited.then_some(dir)
        })
        .as_deref()
}

/// Whether commands get a pids cgroup on this machine.
pub(crate) fn available() -> bool {
    parent().is_some()
}

/// This process's cgroup directory in the hierarchy that has the pids controller.
fn own_pids_cgroup() -> Option<PathBuf> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let v1 = Path::new("/sys/fs/cgroup/pids");
    for line in membership.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "pids") && v1.is_dir() {
            return Some(v1.join(path));
        }
        if controllers.is_empty() {
            let v2 = Path::new("/sys/fs/cgroup");
            let has_pids = std::fs::read_to_string(v2.join("cgroup.controllers"))
                .is_ok_and(|list| list.split_whitespace().any(|c| c == "pids"));
            if has_pids {
                return Some(v2.join(path));
            }
        }
    }
    None
}

/// Makes sure `child` has a `pids.max` (cgroup v2 needs the controller enabled in the
/// parent's subtree first, which the kernel refuses when the parent holds processes).
fn enable_pids(parent: &Path, child: &Path) -> bool {
    if child.join("pids.max").exists() {
        return true;
    }
    std::fs::write(parent.join("cgroup.subtree_control"), "+pids").is_ok()
        && child.join("pids.max").exists()
}

impl Cgroup {
    /// A new cgroup allowing `max_processes`, or `None` where none can be made.
    pub(crate) fn create(max_processes: u64) -> Option<Self> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let parent = parent()?;
        let dir = parent.join(format!(
            "deepagents-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir).ok()?;
        let cgroup = Self { dir };
        std::fs::write(
            cgroup.dir.join("pids.max"),
            max_processes.max(1).to_string(),
        )
        .ok()?;
        Some(cgroup)
    }

    /// The file a process writes its pid to, to join.
    pub(crate) fn procs_file(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }

    fn members(&self) -> Vec<Pid> {
        std::fs::read_to_string(self.procs_file())
            .unwrap_or_default()
            .lines()
            .filter_map(|line| line.trim().parse::<i32>().ok())
            .filter_map(Pid::from_raw)
            .collect()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // cgroup.kill (Linux 5.14+) kills every member at once, forks in progress included;
        // the loop finishes the job where it is missing. Processes may fork while being
        // killed, so repeat until none is left; a process exits only once the kernel has
        // delivered the signal, hence the short waits.
        let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
        for _ in 0..200 {
            let members = self.members();
            if members.is_empty() && std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            for pid in members {
                // ESRCH: it ended on its own meanwhile.
                let _ = rustix::process::kill_process(pid, Signal::KILL);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
