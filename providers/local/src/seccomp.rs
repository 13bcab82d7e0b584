//! The seccomp policy installed by the in-sandbox init (and inherited by every
//! workload).
//!
//! Design (see README.md, "seccomp"): a default-ALLOW filter built with
//! `seccompiler` that answers EPERM for an explicit deny list of kernel-surface
//! system calls, plus a tiny hand-written filter that kills the process on a
//! foreign architecture or an x32 system call number and answers ENOSYS to
//! `clone3` (whose flags live in memory a filter cannot inspect, so callers
//! fall back to `clone`, whose namespace flags are checked).
use std::collections::BTreeMap;

use seccompiler::{
    sock_filter, BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

/// System calls answered with EPERM whatever their arguments.
pub const DENIED: &[(&str, i64)] = &[
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("chroot", libc::SYS_chroot),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("settimeofday", libc::SYS_settimeofday),
    ("adjtimex", libc::SYS_adjtimex),
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("syslog", libc::SYS_syslog),
    ("vhangup", libc::SYS_vhangup),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    #[cfg(target_arch = "x86_64")]
    ("iopl", libc::SYS_iopl),
    #[cfg(target_arch = "x86_64")]
    ("ioperm", libc::SYS_ioperm),
    #[cfg(target_arch = "x86_64")]
    ("uselib", libc::SYS_uselib),
];

/// Personalities a workload may still select (Linux default, and the flags
/// common tools set); anything else (e.g. READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE
/// combinations) is refused.
const ALLOWED_PERSONALITIES: &[u64] = &[0x0, 0x0008, 0x20000, 0x20008, 0xffff_ffff];

const NAMESPACE_FLAGS: &[u64] = &[
    libc::CLONE_NEWUSER as u64,
    libc::CLONE_NEWNS as u64,
    libc::CLONE_NEWPID as u64,
    libc::CLONE_NEWNET as u64,
    libc::CLONE_NEWIPC as u64,
    libc::CLONE_NEWUTS as u64,
    libc::CLONE_NEWCGROUP as u64,
    0x80, // CLONE_NEWTIME
];

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> SeccompCondition {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value).expect("valid condition")
}

fn target_arch() -> TargetArch {
    #[cfg(target_arch = "x86_64")]
    {
        TargetArch::x86_64
    }
    #[cfg(target_arch = "aarch64")]
    {
        TargetArch::aarch64
    }
}

/// The deny-list filter (default allow, EPERM on match, arch-checked).
pub fn deny_filter() -> Result<BpfProgram, String> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (_, nr) in DENIED {
        rules.insert(*nr, vec![]);
    }
    // clone(flags, ...): refuse any new namespace.
    let clone_rules = NAMESPACE_FLAGS
        .iter()
        .map(|f| SeccompRule::new(vec![cond(0, SeccompCmpOp::MaskedEq(*f), *f)]).unwrap())
        .collect();
    rules.insert(libc::SYS_clone, clone_rules);
    // ioctl(fd, TIOCSTI/TIOCLINUX): no terminal input injection.
    rules.insert(
        libc::SYS_ioctl,
        vec![
            SeccompRule::new(vec![cond(1, SeccompCmpOp::Eq, libc::TIOCSTI)]).unwrap(),
            SeccompRule::new(vec![cond(1, SeccompCmpOp::Eq, libc::TIOCLINUX)]).unwrap(),
        ],
    );
    // personality(p) for p outside the allowed set.
    rules.insert(
        libc::SYS_personality,
        vec![SeccompRule::new(
            ALLOWED_PERSONALITIES
                .iter()
                .map(|p| cond(0, SeccompCmpOp::Ne, *p))
                .collect(),
        )
        .unwrap()],
    );
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        target_arch(),
    )
    .map_err(|e| format!("seccomp filter: {e}"))?;
    BpfProgram::try_from(filter).map_err(|e| format!("seccomp compile: {e}"))
}

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;
const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;

fn ins(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// Architecture/ABI guard: kill on a foreign `AUDIT_ARCH` or an x32 syscall
/// number, ENOSYS for clone3, allow everything else (the deny filter decides).
pub fn abi_filter() -> BpfProgram {
    #[cfg(target_arch = "x86_64")]
    let (arch, x32_bit) = (0xC000_003Eu32, 0x4000_0000u32);
    #[cfg(target_arch = "aarch64")]
    let (arch, x32_bit) = (0xC000_00B7u32, 0xFFFF_FFFFu32);
    vec![
        ins(BPF_LD_W_ABS, 0, 0, 4),                            // 0: A = arch
        ins(BPF_JEQ_K, 0, 5, arch),                            // 1: foreign -> 7
        ins(BPF_LD_W_ABS, 0, 0, 0),                            // 2: A = nr
        ins(BPF_JGE_K, 3, 0, x32_bit),                         // 3: x32 -> 7
        ins(BPF_JEQ_K, 1, 0, libc::SYS_clone3 as u32),         // 4: clone3 -> 6
        ins(BPF_RET_K, 0, 0, RET_ALLOW),                       // 5
        ins(BPF_RET_K, 0, 0, RET_ERRNO | libc::ENOSYS as u32), // 6
        ins(BPF_RET_K, 0, 0, RET_KILL_PROCESS),                // 7
    ]
}

/// Install both filters on the calling thread (no_new_privs must be set).
pub fn install() -> Result<(), String> {
    let deny = deny_filter()?;
    seccompiler::apply_filter(&abi_filter()).map_err(|e| format!("seccomp abi filter: {e}"))?;
    seccompiler::apply_filter(&deny).map_err(|e| format!("seccomp deny filter: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile() {
        assert!(deny_filter().unwrap().len() > DENIED.len());
        assert_eq!(abi_filter().len(), 8);
    }
}
