//! The seccomp filters a confined command runs under, compiled with `seccompiler` and handed
//! to bubblewrap as file descriptors, or applied by the Landlock engine's helper.
//!
//! The first filter answers `EPERM` to calls that could leave or weaken the sandbox: tracing
//! other processes, mounting, creating or joining namespaces (`unshare`, `setns`, `clone` with
//! a namespace flag), `bpf`, `io_uring_*`, the kernel keyring, `perf_event_open`, kernel
//! modules, `kexec`, `reboot`, swap and `userfaultfd`; the terminal `ioctl`s that push input
//! into a terminal (`TIOCSTI`, `TIOCLINUX`), so no command can type into the user's shell;
//! with the network off also `socket` for any family but `AF_UNIX`, and under the Landlock
//! engine `socket` for `AF_UNIX` too (without a mount namespace, host Unix sockets — a tmux
//! server, an SSH agent, Docker — would otherwise be reachable by path; `socketpair` stays).
//! The second answers `ENOSYS` to `clone3`, whose flags a filter cannot read, so the C library
//! falls back to `clone`, which the first filter checks.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::fd::OwnedFd;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

use crate::{Engine, Network, SandboxError};

/// `ioctl` requests refused: `TIOCSTI` (push a byte into a terminal's input) and `TIOCLINUX`
/// (its subcommands include pasting the console's selection). The generic Linux numbers,
/// which every architecture the filters are built for (x86_64, aarch64, riscv64) uses.
const DENIED_IOCTLS: [u64; 2] = [0x5412, 0x541C];

/// Calls refused outright.
const DENIED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_bpf,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_perf_event_open,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_userfaultfd,
];

/// `clone` flags that create a namespace.
const NAMESPACE_FLAGS: [u64; 8] = [
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWCGROUP as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    0x80, // CLONE_NEWTIME
];

fn invalid(e: seccompiler::BackendError) -> SandboxError {
    SandboxError::Policy(format!("the seccomp filter does not compile: {e}"))
}

/// The two filters for `network` under `engine`, compiled for this machine's architecture.
pub fn filters(network: &Network, engine: Engine) -> Result<[BpfProgram; 2], SandboxError> {
    let arch = std::env::consts::ARCH.try_into().map_err(|_| SandboxError::Unavailable {
        reason: format!("seccomp filters are not built for {}", std::env::consts::ARCH),
        hint: "Run on x86_64, aarch64 or riscv64, or turn the sandbox off to run commands unconfined",
    })?;
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        DENIED.iter().map(|&call| (call, Vec::new())).collect();
    let namespaces = NAMESPACE_FLAGS
        .iter()
        .map(|&flag| {
            let flag_set = SeccompCondition::new(
                0,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )?;
            SeccompRule::new(vec![flag_set])
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(invalid)?;
    rules.insert(libc::SYS_clone, namespaces);
    // The request is an `unsigned int`: compare the low 32 bits only.
    let ioctls = DENIED_IOCTLS
        .iter()
        .map(|&request| {
            SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Eq, request)
                .and_then(|condition| SeccompRule::new(vec![condition]))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(invalid)?;
    rules.insert(libc::SYS_ioctl, ioctls);
    let family = |op: SeccompCmpOp| {
        SeccompCondition::new(0, SeccompCmpArgLen::Dword, op, libc::AF_UNIX as u64)
            .and_then(|condition| SeccompRule::new(vec![condition]))
            .map_err(invalid)
    };
    let mut sockets = Vec::new();
    if *network == Network::Off {
        sockets.push(family(SeccompCmpOp::Ne)?);
    }
    if engine == Engine::Landlock {
        sockets.push(family(SeccompCmpOp::Eq)?);
    }
    if !sockets.is_empty() {
        rules.insert(libc::SYS_socket, sockets);
    }
    let deny = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(invalid)?;
    let clone3 = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(invalid)?;
    Ok([
        deny.try_into().map_err(invalid)?,
        clone3.try_into().map_err(invalid)?,
    ])
}

/// The filters written to anonymous files, ready to be inherited by bubblewrap (each read
/// from its start). They are open without close-on-exec, so spawn the command soon and
/// drop them right after.
pub fn filter_fds(network: &Network, engine: Engine) -> Result<Vec<OwnedFd>, SandboxError> {
    filters(network, engine)?
        .iter()
        .map(|program| {
            let fd =
                rustix::fs::memfd_create("deepagents-seccomp", rustix::fs::MemfdFlags::empty())
                    .map_err(std::io::Error::from)?;
            let mut file = std::fs::File::from(fd);
            let mut bytes = Vec::with_capacity(program.len() * 8);
            for instruction in program {
                bytes.extend_from_slice(&instruction.code.to_ne_bytes());
                bytes.push(instruction.jt);
                bytes.push(instruction.jf);
                bytes.extend_from_slice(&instruction.k.to_ne_bytes());
            }
            file.write_all(&bytes)?;
            let fd = OwnedFd::from(file);
            rustix::fs::seek(&fd, rustix::fs::SeekFrom::Start(0)).map_err(std::io::Error::from)?;
            Ok(fd)
        })
        .collect()
}

/// Applies both filters to the calling thread and every process it starts from now on (the
/// Landlock engine's helper, just before it starts the command). Sets no-new-privileges,
/// which the kernel requires of unprivileged filters.
pub fn apply(network: &Network, engine: Engine) -> Result<(), SandboxError> {
    for program in filters(network, engine)? {
        seccompiler::apply_filter(&program).map_err(|e| SandboxError::Unavailable {
            reason: format!("the seccomp filter cannot be applied: {e}"),
            hint: "Run on a kernel with seccomp filters (CONFIG_SECCOMP_FILTER)",
        })?;
    }
    Ok(())
}
