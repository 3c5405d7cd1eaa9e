//! The sandbox's helper: the calling program re-executed with [`ARG`] as its first argument,
//! to do inside the sandbox what a shell cannot.
//!
//! - `bridge --socket PATH -- PROGRAM ARGS…` runs inside bubblewrap's network namespace: it
//!   listens on `127.0.0.1:3128` and hands every connection to the [proxy](crate::proxy)'s
//!   socket, then runs the program and exits with its status.
//! - `landlock --scratch DIR --read PATH… --list DIR… --write PATH… --network
//!   off|on -- PROGRAM ARGS…` runs the program confined, as a child reaper (processes that
//!   detach from it become its children): it starts itself again as `landlock-exec` with the
//!   same options, which leaves the caller's session (no controlling terminal, so nothing can
//!   be typed into the user's shell), restricts itself with Landlock and seccomp and becomes
//!   the program. When the program ends — or the helper gets SIGTERM, SIGINT or SIGHUP, or
//!   its parent dies — it ends every process the program left, removes the scratch directory
//!   and exits with the program's status (128 + the signal when signalled).
//! - `probe` answers [`PROBE_ANSWER`], so a caller can tell the helper is wired.
//!
//! A program that confines commands with allowed domains or with the Landlock engine calls
//! [`dispatch`] first thing in `main`; [`Policy::helper`](crate::Policy::helper) names
//! another program that does, when the running one does not.

use std::ffi::{OsStr, OsString};
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use crate::proxy::{PORT_INSIDE, splice};
use crate::{Policy, SandboxError};

/// The first argument that makes a program act as the helper.
pub const ARG: &str = "__deepagents-sandbox";

/// What `probe` prints.
pub const PROBE_ANSWER: &str = "deepagents-sandbox helper";

/// The exit status of a helper that could not set up the sandbox (as `env` and `timeout`
/// use it for their own failures).
pub const SETUP_FAILED: i32 = 125;

/// Acts as the helper and exits when the program was started as one; returns at once
/// otherwise. Call it first thing in `main`.
pub fn dispatch() {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(OsStr::new(ARG)) {
        return;
    }
    let args: Vec<OsString> = args.collect();
    let code = match run(&args) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("deepagents sandbox: {message}");
            SETUP_FAILED
        }
    };
    std::process::exit(code);
}

/// The helper program for `policy`.
pub(crate) fn program(policy: &Policy) -> Result<PathBuf, SandboxError> {
    match &policy.helper {
        Some(path) => Ok(path.clone()),
        None => std::env::current_exe().map_err(|e| {
            SandboxError::Policy(format!(
                "cannot find the running program to use as the sandbox helper: {e}"
            ))
        }),
    }
}

/// Whether the helper of `policy` answers: its path, or why it does not.
pub(crate) fn probe(policy: &Policy) -> Result<String, String> {
    let program = program(policy).map_err(|e| e.to_string())?;
    let output = std::process::Command::new(&program)
        .args([ARG, "probe"])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    if String::from_utf8_lossy(&output.stdout).trim() == PROBE_ANSWER {
        Ok(program.display().to_string())
    } else {
        Err(format!(
            "{} does not act as the sandbox helper (its main must call deepagents_sandbox::helper::dispatch); allowed domains and the Landlock engine need it",
            program.display()
        ))
    }
}

fn run(args: &[OsString]) -> Result<i32, String> {
    let (request, rest) = args.split_first().ok_or("no request given")?;
    match request.to_str() {
        Some("probe") => {
            println!("{PROBE_ANSWER}");
            Ok(0)
        }
        Some("bridge") => {
            let (options, command) = split_command(rest)?;
            let socket = match options {
                [flag, socket] if flag == "--socket" => PathBuf::from(socket),
                _ => return Err("bridge takes --socket PATH".to_owned()),
            };
            bridge(&socket)?;
            run_command(command)
        }
        Some("landlock") => {
            let (options, _) = split_command(rest)?;
            let options = LandlockOptions::parse(options)?;
            supervise(&options, rest)
        }
        Some("landlock-exec") => {
            let (options, command) = split_command(rest)?;
            let options = LandlockOptions::parse(options)?;
            // A session of its own: no controlling terminal to read, write or type into.
            rustix::process::setsid().map_err(|e| format!("cannot start a new session: {e}"))?;
            // Dies with the supervising helper, whatever kills it.
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
                .map_err(|e| format!("cannot set the parent-death signal: {e}"))?;
            crate::landlock::restrict(
                &options.read,
                &options.list,
                &options.write,
                options.network_off,
            )?;
            let error = std::os::unix::process::CommandExt::exec(&mut command_of(command));
            Err(format!(
                "cannot start {}: {error}",
                command[0].to_string_lossy()
            ))
        }
        _ => Err(format!("unknown request {}", request.to_string_lossy())),
    }
}

/// Options before `--`, and the command after it.
fn split_command(args: &[OsString]) -> Result<(&[OsString], &[OsString]), String> {
    let dashes = args
        .iter()
        .position(|arg| arg == "--")
        .ok_or("no -- before the command")?;
    let (options, command) = (&args[..dashes], &args[dashes + 1..]);
    if command.is_empty() {
        return Err("no command after --".to_owned());
    }
    Ok((options, command))
}

/// Listens inside the sandbox and hands each connection to the proxy's socket.
fn bridge(socket: &Path) -> Result<(), String> {
    let listener = TcpListener::bind(("127.0.0.1", PORT_INSIDE))
        .map_err(|e| format!("cannot listen on 127.0.0.1:{PORT_INSIDE}: {e}"))?;
    let socket = socket.to_owned();
    std::thread::Builder::new()
        .name("sandbox-bridge".to_owned())
        .spawn(move || {
            for client in listener.incoming().flatten() {
                let socket = socket.clone();
                let _ = std::thread::Builder::new().spawn(move || {
                    if let Ok(proxy) = UnixStream::connect(&socket) {
                        splice(client, proxy);
                    }
                });
            }
        })
        .map_err(|e| format!("cannot start the bridge: {e}"))?;
    Ok(())
}

fn command_of(command: &[OsString]) -> std::process::Command {
    let mut process = std::process::Command::new(&command[0]);
    process.args(&command[1..]);
    process
}

/// Runs the command and returns its exit status (128 + the signal that ended it, as shells
/// report it).
fn run_command(command: &[OsString]) -> Result<i32, String> {
    let status = command_of(command)
        .status()
        .map_err(|e| format!("cannot start {}: {e}", command[0].to_string_lossy()))?;
    Ok(exit_code(status))
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt as _;
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(SETUP_FAILED)
}

/// The options of `landlock` and `landlock-exec`.
struct LandlockOptions {
    scratch: Option<PathBuf>,
    read: Vec<PathBuf>,
    list: Vec<PathBuf>,
    write: Vec<PathBuf>,
    network_off: bool,
}

impl LandlockOptions {
    fn parse(options: &[OsString]) -> Result<Self, String> {
        let mut parsed = Self {
            scratch: None,
            read: Vec::new(),
            list: Vec::new(),
            write: Vec::new(),
            network_off: true,
        };
        let mut options = options.iter();
        while let Some(flag) = options.next() {
            let value = options
                .next()
                .ok_or_else(|| format!("{} needs a value", flag.to_string_lossy()))?;
            match flag.to_str() {
                Some("--scratch") => parsed.scratch = Some(PathBuf::from(value)),
                Some("--read") => parsed.read.push(PathBuf::from(value)),
                Some("--list") => parsed.list.push(PathBuf::from(value)),
                Some("--write") => parsed.write.push(PathBuf::from(value)),
                Some("--network") => parsed.network_off = value != "on",
                _ => return Err(format!("unknown option {}", flag.to_string_lossy())),
            }
        }
        Ok(parsed)
    }
}

/// Runs `landlock-exec` with `arguments` (the options, `--` and the command) as a child
/// reaper, then ends whatever it left behind and removes the scratch directory. A signal
/// that ends the helper, or its parent's death, ends the command the same way first.
fn supervise(options: &LandlockOptions, arguments: &[OsString]) -> Result<i32, String> {
    use rustix::process::{Signal, getpid, set_child_subreaper, set_parent_process_death_signal};
    let parent = rustix::process::getppid();
    set_parent_process_death_signal(Some(Signal::TERM))
        .map_err(|e| format!("cannot set the parent-death signal: {e}"))?;
    // The parent may have died just before: then no signal would come.
    if rustix::process::getppid() != parent {
        return Err("the caller is gone".to_owned());
    }
    set_child_subreaper(Some(getpid()))
        .map_err(|e| format!("cannot become a child reaper: {e}"))?;
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGHUP,
    ])
    .map_err(|e| format!("cannot handle signals: {e}"))?;
    let program =
        std::env::current_exe().map_err(|e| format!("cannot find the helper program: {e}"))?;
    let mut child = std::process::Command::new(program)
        .arg(ARG)
        .arg("landlock-exec")
        .args(arguments)
        .spawn()
        .map_err(|e| format!("cannot start the confined command: {e}"))?;
    let session = i32::try_from(child.id())
        .ok()
        .and_then(rustix::process::Pid::from_raw);
    let received = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
    let handle = signals.handle();
    let watcher = {
        let received = std::sync::Arc::clone(&received);
        std::thread::Builder::new()
            .name("sandbox-signals".to_owned())
            .spawn(move || {
                if let Some(signal) = signals.forever().next() {
                    received.store(signal, std::sync::atomic::Ordering::SeqCst);
                    // The command leads its own session and group: end the group at once;
                    // `end_children` below finds what left it.
                    if let Some(session) = session {
                        let _ = rustix::process::kill_process_group(session, Signal::KILL);
                    }
                }
            })
            .map_err(|e| format!("cannot watch signals: {e}"))?
    };
    let status = child
        .wait()
        .map_err(|e| format!("waiting for the command failed: {e}"));
    end_children();
    handle.close();
    let _ = watcher.join();
    if let Some(scratch) = &options.scratch {
        let _ = std::fs::remove_dir_all(scratch);
    }
    match received.load(std::sync::atomic::Ordering::SeqCst) {
        0 => Ok(exit_code(status?)),
        signal => Ok(128 + signal),
    }
}

/// Kills every child (orphans of the command are re-parented here) until none is left.
fn end_children() {
    let me = rustix::process::getpid().as_raw_nonzero().get();
    loop {
        for pid in children_of(me) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        // Reaps one; its own children, now orphans, are found on the next round. ECHILD
        // (no children left) ends the loop.
        if rustix::process::wait(rustix::process::WaitOptions::empty()).is_err() {
            return;
        }
    }
}

fn children_of(parent: i32) -> Vec<rustix::process::Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            // `/proc/PID/stat`: `pid (comm) state ppid …`; comm may hold spaces and parens.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let after = &stat[stat.rfind(')')? + 1..];
                    after.split_whitespace().nth(1)?.parse::<i32>().ok()
                })
                == Some(parent)
        })
        .filter_map(rustix::process::Pid::from_raw)
        .collect()
}
