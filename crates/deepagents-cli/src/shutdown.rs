//! How the process ends on SIGINT, SIGTERM or SIGHUP: the same way for every front end.
//!
//! [`install`] runs once, first thing in `main`. It listens on a thread of its own (with a
//! small runtime), so a signal is seen even while the front end's thread is busy or blocked.
//! The first signal cancels [`token`]: the front ends select on it ([`signalled`],
//! [`or_signal`]) and on runs whose cancellation is a child of it, so a run is cancelled the
//! usual way — its commands killed, its thread checkpointed — start-up is abandoned (MCP
//! servers already started are killed with their process groups), and `main` exits with
//! 128 + the signal's number (130, 143, 129), as shells report a death by that signal.
//!
//! The process exits at once, killing its children's process groups, when a second signal
//! arrives, when the orderly stop takes longer than [`GRACE`], when a command does not stop
//! in an orderly way at all (`threads`, `repo`, `sandbox check`), and while the front end
//! waits in a blocking read of the terminal ([`blocking`]) — then nothing is running that
//! must be saved, and nothing else would notice the signal.

use std::future::Future;
use std::sync::Mutex;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use rustix::process::Pid;
use tokio::signal::unix::SignalKind;
use tokio_util::sync::CancellationToken;

/// How long an orderly stop may take before the process exits anyway: a cancelled run gives
/// its tools 5 s to wind down, then its checkpoint is written and its servers stopped.
pub const GRACE: Duration = Duration::from_secs(10);

/// A signal that stops the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    Hangup,
    Interrupt,
    Terminate,
}

impl Signal {
    const ALL: [Self; 3] = [Self::Hangup, Self::Interrupt, Self::Terminate];

    /// Its number on Linux.
    pub fn number(self) -> u8 {
        match self {
            Self::Hangup => 1,
            Self::Interrupt => 2,
            Self::Terminate => 15,
        }
    }

    /// The exit status after it: 128 + its number, as shells report a death by it.
    pub fn exit_code(self) -> u8 {
        128 + self.number()
    }

    /// The signal itself, to pass on to a child.
    pub fn raw(self) -> rustix::process::Signal {
        match self {
            Self::Hangup => rustix::process::Signal::HUP,
            Self::Interrupt => rustix::process::Signal::INT,
            Self::Terminate => rustix::process::Signal::TERM,
        }
    }

    fn kind(self) -> SignalKind {
        match self {
            Self::Hangup => SignalKind::hangup(),
            Self::Interrupt => SignalKind::interrupt(),
            Self::Terminate => SignalKind::terminate(),
        }
    }

    fn from_number(number: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.number() == number)
    }
}

struct State {
    /// Cancelled at the first signal.
    token: CancellationToken,
    /// The number of the first signal, 0 before one.
    received: AtomicU8,
    /// Whether the front end stops in an orderly way on the token.
    orderly: bool,
    /// Blocking reads of the terminal going on now.
    blocking: AtomicUsize,
    /// Set by whoever exits at once first; the others wait for the exit.
    exiting: AtomicBool,
    /// What must be put back before exiting at once (the TUI's terminal modes).
    restore: Mutex<Option<fn()>>,
}

static STATE: OnceLock<State> = OnceLock::new();

fn state() -> &'static State {
    STATE.get_or_init(|| State {
        token: CancellationToken::new(),
        received: AtomicU8::new(0),
        orderly: false,
        blocking: AtomicUsize::new(0),
        exiting: AtomicBool::new(false),
        restore: Mutex::new(None),
    })
}

/// Starts listening for SIGINT, SIGTERM and SIGHUP; returns once the handlers are in place.
/// `orderly`: the front end stops on [`token`] (else the first signal exits at once). A
/// signal this process was started ignoring (`nohup`, a background job's SIGINT) stays
/// ignored.
pub fn install(orderly: bool) -> std::io::Result<()> {
    let fresh = State {
        token: CancellationToken::new(),
        received: AtomicU8::new(0),
        orderly,
        blocking: AtomicUsize::new(0),
        exiting: AtomicBool::new(false),
        restore: Mutex::new(None),
    };
    if STATE.set(fresh).is_err() {
        return Err(std::io::Error::other(
            "the signal handlers are already installed",
        ));
    }
    let ignored = ignored_at_start();
    let (ready, registered) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("signals".to_owned())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = ready.send(Err(e));
                    return;
                }
            };
            runtime.block_on(listen(ignored, ready));
        })?;
    // Until the handlers are registered a signal would kill the process outright.
    registered
        .recv()
        .map_err(|_| std::io::Error::other("the signal thread ended before it listened"))?
}

/// The listener: registers the handlers, says so through `ready`, then acts on signals.
async fn listen(ignored: u64, ready: std::sync::mpsc::Sender<std::io::Result<()>>) {
    let mut streams = Vec::new();
    for signal in Signal::ALL {
        if ignored & (1 << (signal.number() - 1)) != 0 {
            continue;
        }
        match tokio::signal::unix::signal(signal.kind()) {
            Ok(stream) => streams.push((signal, stream)),
            Err(e) => {
                let _ = ready.send(Err(e));
                return;
            }
        }
    }
    let _ = ready.send(Ok(()));
    if streams.is_empty() {
        return;
    }
    loop {
        let next = futures::future::select_all(streams.iter_mut().map(|(signal, stream)| {
            Box::pin(async move { stream.recv().await.map(|()| *signal) })
        }));
        let (arrived, _, _) = next.await;
        let Some(signal) = arrived else {
            // The runtime's signal driver went away; nothing more will arrive.
            return;
        };
        on_signal(signal);
    }
}

/// The first signal starts the orderly stop (or exits at once where there is none); any
/// later one exits at once.
fn on_signal(signal: Signal) {
    let state = state();
    let first = state
        .received
        .compare_exchange(0, signal.number(), Ordering::SeqCst, Ordering::SeqCst)
        .is_ok();
    if !first || !state.orderly || state.blocking.load(Ordering::SeqCst) > 0 {
        exit_now();
    }
    state.token.cancel();
    // The orderly stop is bounded: a front end stuck somewhere must not keep the process.
    // Without the thread the stop is unbounded, but a second signal still ends it.
    let _ = std::thread::Builder::new()
        .name("stop-deadline".to_owned())
        .spawn(|| {
            std::thread::sleep(GRACE);
            exit_now();
        });
}

/// The first signal, once one arrived.
pub fn received() -> Option<Signal> {
    Signal::from_number(state().received.load(Ordering::SeqCst))
}

/// Cancelled at the first signal; a run's cancellation is a child of it.
pub fn token() -> &'static CancellationToken {
    &state().token
}

/// Waits for the first signal.
pub async fn signalled() -> Signal {
    token().cancelled().await;
    // The token is cancelled only after the signal is recorded.
    received().unwrap_or(Signal::Interrupt)
}

/// `work`, unless a signal comes first: then `work` is dropped (whatever it started and
/// holds is dropped with it) and the signal returned.
pub async fn or_signal<T>(work: impl Future<Output = T>) -> Result<T, Signal> {
    tokio::select! {
        // A signal that already arrived wins over work that would also be ready.
        biased;
        signal = signalled() => Err(signal),
        done = work => Ok(done),
    }
}

/// Marks a blocking read of the terminal: while it lasts, a signal exits at once (the front
/// end cannot notice it, and nothing runs then that needs saving). Entered after a signal,
/// it exits at once.
pub fn blocking() -> Blocking {
    let state = state();
    state.blocking.fetch_add(1, Ordering::SeqCst);
    if state.received.load(Ordering::SeqCst) != 0 {
        exit_now();
    }
    Blocking
}

/// See [`blocking`].
pub struct Blocking;

impl Drop for Blocking {
    fn drop(&mut self) {
        state().blocking.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `restore` runs before the process exits at once (the TUI puts the terminal back); `None`
/// forgets it.
pub fn on_exit_now(restore: Option<fn()>) {
    if let Ok(mut slot) = state().restore.lock() {
        *slot = restore;
    }
}

/// Exits now with the first signal's status, after killing what this process started.
fn exit_now() -> ! {
    let state = state();
    if state.exiting.swap(true, Ordering::SeqCst) {
        // Another thread is exiting; `exit` must not run twice at once.
        loop {
            std::thread::park();
        }
    }
    if let Some(restore) = state.restore.lock().ok().and_then(|slot| *slot) {
        restore();
    }
    kill_children();
    let code = received().map_or(1, Signal::exit_code);
    std::process::exit(i32::from(code))
}

/// Kills every child of this process: the whole process group of each child that leads one
/// (an `execute` command, an MCP server: what they started goes with them), the child alone
/// otherwise (never this process's own group). The last line of defence on the way out after
/// a signal; the orderly stop has already ended them through their guards.
pub fn kill_children() {
    let me = rustix::process::getpid();
    let own_group = rustix::process::getpgrp();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
            .and_then(Pid::from_raw)
        else {
            continue;
        };
        let Some((parent, group)) = parent_and_group(pid) else {
            continue;
        };
        if parent != me.as_raw_nonzero().get() {
            continue;
        }
        // ESRCH: it ended meanwhile.
        if group == pid.as_raw_nonzero().get() && group != own_group.as_raw_nonzero().get() {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        } else {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    }
}

/// A process's parent and process group, from `/proc/PID/stat` (after the command's name,
/// which may hold spaces and parentheses: state, parent, group).
fn parent_and_group(pid: Pid) -> Option<(i32, i32)> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(1);
    let parent = fields.next()?.parse().ok()?;
    let group = fields.next()?.parse().ok()?;
    Some((parent, group))
}

/// The signals this process was started ignoring, as the kernel's mask (bit n-1 for signal
/// n): `SigIgn` of `/proc/self/status`, read before any handler replaces them.
fn ignored_at_start() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                line.strip_prefix("SigIgn:")
                    .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            })
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt as _;

    use super::*;

    #[test]
    fn exit_codes_are_what_shells_report_for_the_signal() {
        assert_eq!(Signal::Interrupt.exit_code(), 130);
        assert_eq!(Signal::Terminate.exit_code(), 143);
        assert_eq!(Signal::Hangup.exit_code(), 129);
        for signal in Signal::ALL {
            assert_eq!(Signal::from_number(signal.number()), Some(signal));
            assert_eq!(i32::from(signal.number()), signal.raw().as_raw());
        }
    }

    #[test]
    fn a_child_s_parent_and_group_are_read_from_proc() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let pid = Pid::from_raw(i32::try_from(child.id()).unwrap_or_default())
            .unwrap_or_else(|| panic!("no pid"));
        let found = parent_and_group(pid);
        let _ = child.kill();
        let _ = child.wait();
        let me = rustix::process::getpid().as_raw_nonzero().get();
        assert_eq!(found, Some((me, pid.as_raw_nonzero().get())));
    }
}
