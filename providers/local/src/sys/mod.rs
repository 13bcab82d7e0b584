//! Thin wrappers over the Linux system calls the provider needs.
//!
//! This is the only module of the crate allowed to contain `unsafe`. Every
//! wrapper is small, takes owned/borrowed safe types, converts `-1` returns
//! into `io::Error`, and carries a `// SAFETY:` comment on each unsafe block.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

pub use libc::pid_t;

// Pty, window size, controlling terminal and loopback connect for duplex channels.
mod duplex;
pub use duplex::*;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cvt_long(ret: libc::c_long) -> io::Result<libc::c_long> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cstr(p: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

// ---------------------------------------------------------------- namespaces

/// Namespace flags used by the sandbox.
pub const NS_ALL: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP;

/// Fork-like `clone(2)` into new namespaces. Returns `Ok(0)` in the child and
/// the child's pid (in the caller's pid namespace) in the parent.
///
/// Only call this from a single-threaded process: the child gets a copy of the
/// address space without glibc's fork bookkeeping (no atfork handlers).
pub fn clone_into_namespaces(ns_flags: libc::c_int) -> io::Result<pid_t> {
    // SAFETY: raw clone without CLONE_VM and with a null stack behaves like
    // fork(2): the child runs on a copy-on-write copy of the caller's stack and
    // memory. The caller guarantees the process is single-threaded, so no lock
    // can be held by another thread at the time of the copy. The remaining
    // arguments (parent_tid, child_tid, tls) are unused for these flags.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (ns_flags | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            0 as libc::c_ulong,
        )
    };
    Ok(cvt_long(ret)? as pid_t)
}

/// Plain fork(2). Only call from a single-threaded process.
pub fn fork() -> io::Result<pid_t> {
    // SAFETY: fork has no memory-safety preconditions; the caller is
    // single-threaded (the in-sandbox init), so the child's copy of the heap
    // and of every lock is consistent.
    cvt(unsafe { libc::fork() })
}

pub fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: pointer/length describe the bytes of `name`, valid for the call.
    cvt(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) }).map(drop)
}

// -------------------------------------------------------------------- mounts

pub use libc::{
    MNT_DETACH, MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_PRIVATE, MS_RDONLY, MS_REC, MS_REMOUNT,
};

/// mount(2). `None` arguments are passed as NULL.
pub fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = source.map(cstr).transpose()?;
    let target = cstr(target)?;
    let fstype = fstype.map(cstring).transpose()?;
    let data = data.map(cstring).transpose()?;
    let p = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is either NULL or a NUL-terminated string that
    // outlives the call.
    cvt(unsafe {
        libc::mount(
            p(&source),
            target.as_ptr(),
            p(&fstype),
            flags,
            p(&data).cast(),
        )
    })
    .map(drop)
}

pub fn umount2(target: &Path, flags: libc::c_int) -> io::Result<()> {
    let target = cstr(target)?;
    // SAFETY: target is a valid NUL-terminated path.
    cvt(unsafe { libc::umount2(target.as_ptr(), flags) }).map(drop)
}

pub fn pivot_root(new_root: &Path, put_old: &Path) -> io::Result<()> {
    let new_root = cstr(new_root)?;
    let put_old = cstr(put_old)?;
    // SAFETY: both arguments are valid NUL-terminated paths.
    cvt_long(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })
        .map(drop)
}

/// The per-mount flags of the mount containing `path` (ST_* from statvfs),
/// translated to MS_* flags that must be preserved on a bind remount inside a
/// user namespace (the kernel locks them).
pub fn locked_mount_flags(path: &Path) -> io::Result<libc::c_ulong> {
    let p = cstr(path)?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: p is a valid path and st points to writable storage of the right size.
    cvt(unsafe { libc::statvfs(p.as_ptr(), st.as_mut_ptr()) })?;
    // SAFETY: statvfs succeeded, so it initialised the structure.
    let st = unsafe { st.assume_init() };
    let f = st.f_flag;
    let mut out = 0;
    for (st_flag, ms_flag) in [
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if f & st_flag != 0 {
            out |= ms_flag;
        }
    }
    Ok(out)
}

// ------------------------------------------------------------ credentials

pub fn setresuid_root() -> io::Result<()> {
    // SAFETY: plain integer arguments.
    cvt(unsafe { libc::setresgid(0, 0, 0) })?;
    // SAFETY: plain integer arguments.
    cvt(unsafe { libc::setresuid(0, 0, 0) }).map(drop)
}

/// Drop every supplementary group.
pub fn clear_groups() -> io::Result<()> {
    // SAFETY: a zero-length list with a NULL pointer is the documented way to
    // clear the supplementary groups.
    cvt(unsafe { libc::setgroups(0, std::ptr::null()) }).map(drop)
}

// ------------------------------------------------------------------- prctl

pub fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    cvt(unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) }).map(drop)
}

pub fn set_dumpable(on: bool) -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    cvt(unsafe { libc::prctl(libc::PR_SET_DUMPABLE, on as libc::c_ulong, 0, 0, 0) }).map(drop)
}

pub fn seccomp_mode() -> io::Result<i32> {
    // SAFETY: prctl with integer arguments only.
    cvt(unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) })
}

const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;

/// Drop every capability for good: lock the securebits so that root (uid 0 in
/// the user namespace) gains nothing on execve, empty the bounding and ambient
/// sets, then clear the effective, permitted and inheritable sets.
pub fn drop_all_capabilities() -> io::Result<()> {
    let bits = SECBIT_NOROOT
        | SECBIT_NOROOT_LOCKED
        | SECBIT_NO_SETUID_FIXUP
        | SECBIT_NO_SETUID_FIXUP_LOCKED
        | SECBIT_KEEP_CAPS_LOCKED
        | SECBIT_NO_CAP_AMBIENT_RAISE
        | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    // SAFETY: prctl with integer arguments only.
    cvt(unsafe { libc::prctl(libc::PR_SET_SECUREBITS, bits, 0, 0, 0) })?;
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments only; EINVAL marks the end of
        // the capabilities this kernel knows.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if r == -1 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) {
                break;
            }
            return Err(e);
        }
    }
    // SAFETY: prctl with integer arguments only.
    cvt(unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    })?;
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: header and data match the kernel's v3 capability ABI (one header,
    // two data words) and live for the duration of the call.
    cvt_long(unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) }).map(drop)
}

/// The effective capability mask of the calling process (from capget).
pub fn effective_capabilities() -> io::Result<u64> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    let mut header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: same ABI as above; data is writable storage for two words.
    cvt_long(unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) })?;
    Ok(u64::from(data[0].effective) | (u64::from(data[1].effective) << 32))
}

// ----------------------------------------------------------------- rlimits

pub use libc::{RLIMIT_CORE, RLIMIT_FSIZE, RLIMIT_NOFILE};

pub fn setrlimit(resource: libc::__rlimit_resource_t, soft: u64, hard: u64) -> io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: lim is a valid rlimit structure for the duration of the call.
    cvt(unsafe { libc::setrlimit(resource, &lim) }).map(drop)
}

// --------------------------------------------------------------------- fds

/// Close every descriptor >= `from`.
pub fn close_fds_from(from: u32) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; callers own every fd at or
    // above `from` (none of them is referenced by a live OwnedFd afterwards,
    // or the process is about to exec).
    cvt(unsafe { libc::close_range(from, u32::MAX, 0) }).map(drop)
}

/// Close every descriptor except stdio and those listed in `keep`.
pub fn close_fds_except(keep: &[RawFd]) -> io::Result<()> {
    let mut keep: Vec<u32> = keep.iter().map(|&f| f as u32).filter(|&f| f > 2).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut start = 3u32;
    for k in keep {
        if k > start {
            // SAFETY: see close_fds_from; the range excludes every kept fd.
            cvt(unsafe { libc::close_range(start, k - 1, 0) })?;
        }
        start = k + 1;
    }
    close_fds_from(start)
}

/// dup2 that clears O_CLOEXEC on the target (as dup2 does).
pub fn dup2(old: RawFd, new: RawFd) -> io::Result<()> {
    // SAFETY: dup2 only manipulates the descriptor table.
    cvt(unsafe { libc::dup2(old, new) }).map(drop)
}

pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds is writable storage for two descriptors.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, both descriptors are fresh and owned by us.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> io::Result<()> {
    // SAFETY: fcntl on a valid borrowed descriptor.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    let flags = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: fcntl on a valid borrowed descriptor.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) }).map(drop)
}

/// A sealed, close-on-exec memfd holding `bytes` (used to run the init from an
/// immutable copy, never from the host file).
pub fn sealed_memfd(name: &str, bytes: &[u8]) -> io::Result<OwnedFd> {
    use std::io::Write;
    let name = cstring(name)?;
    // SAFETY: name is a valid NUL-terminated string.
    let fd = cvt(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    })?;
    // SAFETY: memfd_create returned a fresh descriptor that we own.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut f = std::fs::File::from(fd);
    f.write_all(bytes)?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on a descriptor we own.
    cvt(unsafe { libc::fcntl(f.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
    Ok(OwnedFd::from(f))
}

// ------------------------------------------------------------------- poll

pub use libc::{pollfd, POLLIN, POLLOUT};

pub fn poll(fds: &mut [pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: the pointer/length pair describes a valid mutable slice.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if r == -1 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(r as usize)
}

// ---------------------------------------------------------------- signals

/// Block SIGCHLD and return a non-blocking signalfd that reports it.
pub fn sigchld_fd() -> io::Result<OwnedFd> {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the set; sigaddset/sigprocmask/signalfd
    // read the initialised set.
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        libc::sigaddset(set.as_mut_ptr(), libc::SIGCHLD);
        cvt(libc::sigprocmask(
            libc::SIG_BLOCK,
            set.as_ptr(),
            std::ptr::null_mut(),
        ))?;
        let fd = cvt(libc::signalfd(
            -1,
            set.as_ptr(),
            libc::SFD_CLOEXEC | libc::SFD_NONBLOCK,
        ))?;
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Restore default signal dispositions and an empty mask (used in a freshly
/// forked workload before execve: the init blocks SIGCHLD and Rust's runtime
/// ignores SIGPIPE, both of which would otherwise leak into the workload).
pub fn reset_signals() {
    // SAFETY: setting SIG_DFL for ordinary signals and emptying the mask have
    // no memory-safety preconditions; errors (for SIGKILL/SIGSTOP) are ignored.
    unsafe {
        for sig in 1..32 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
        libc::sigemptyset(set.as_mut_ptr());
        libc::sigprocmask(libc::SIG_SETMASK, set.as_ptr(), std::ptr::null_mut());
    }
}

pub fn ignore_sigpipe() {
    // SAFETY: installing SIG_IGN has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

pub use libc::{SIGKILL, SIGTERM};

pub fn kill(pid: pid_t, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: kill takes plain integers.
    cvt(unsafe { libc::kill(pid, sig) }).map(drop)
}

pub fn setsid() -> io::Result<()> {
    // SAFETY: no arguments.
    cvt(unsafe { libc::setsid() }).map(drop)
}

/// Exit status of a reaped child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildStatus {
    Exited(i32),
    Signaled(i32),
}

/// Reap one exited child of any pid without blocking.
pub fn reap_any() -> io::Result<Option<(pid_t, ChildStatus)>> {
    let mut status = 0;
    // SAFETY: status is writable storage for the call.
    let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
    if r == -1 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ECHILD) {
            return Ok(None);
        }
        return Err(e);
    }
    if r == 0 {
        return Ok(None);
    }
    let st = if libc::WIFEXITED(status) {
        ChildStatus::Exited(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        ChildStatus::Signaled(libc::WTERMSIG(status))
    } else {
        return Ok(None);
    };
    Ok(Some((r, st)))
}

/// Blocking wait for one specific child.
pub fn wait_pid(pid: pid_t) -> io::Result<ChildStatus> {
    let mut status = 0;
    loop {
        // SAFETY: status is writable storage for the call.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == -1 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        break;
    }
    if libc::WIFSIGNALED(status) {
        Ok(ChildStatus::Signaled(libc::WTERMSIG(status)))
    } else {
        Ok(ChildStatus::Exited(libc::WEXITSTATUS(status)))
    }
}

/// execve(2); only returns on failure.
pub fn execve(path: &CStr, argv: &[CString], envp: &[CString]) -> io::Error {
    let mut a: Vec<*const libc::c_char> = argv.iter().map(|s| s.as_ptr()).collect();
    a.push(std::ptr::null());
    let mut e: Vec<*const libc::c_char> = envp.iter().map(|s| s.as_ptr()).collect();
    e.push(std::ptr::null());
    // SAFETY: path, and every element of the NULL-terminated argv/envp arrays,
    // are valid NUL-terminated strings that outlive the call.
    unsafe { libc::execve(path.as_ptr(), a.as_ptr(), e.as_ptr()) };
    io::Error::last_os_error()
}

/// _exit(2): leave a forked child without running destructors or atexit hooks.
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and has no preconditions.
    unsafe { libc::_exit(code) }
}

pub fn is_executable(path: &Path) -> bool {
    let Ok(p) = cstr(path) else { return false };
    // SAFETY: p is a valid NUL-terminated path.
    unsafe { libc::access(p.as_ptr(), libc::X_OK) == 0 }
}

// --------------------------------------------------------------- pidfds

pub fn pidfd_open(pid: pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes integers and returns a fresh descriptor.
    let fd = cvt_long(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: the kernel returned a fresh descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

pub fn pidfd_send_signal(fd: BorrowedFd<'_>, sig: libc::c_int) -> io::Result<()> {
    // SAFETY: fd is a valid pidfd; info is NULL (kernel fills a default siginfo).
    cvt_long(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            fd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    })
    .map(drop)
}

// -------------------------------------------------------------- sockets

/// Bring the loopback interface up (in the current network namespace).
pub fn loopback_up() -> io::Result<()> {
    // SAFETY: socket takes integers and returns a fresh descriptor we own.
    let s = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: s is a fresh descriptor.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: ifreq is plain data, all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (i, b) in b"lo".iter().enumerate() {
        req.ifr_name[i] = *b as libc::c_char;
    }
    // SAFETY: req is a valid ifreq for SIOCGIFFLAGS/SIOCSIFFLAGS; the union
    // member read/written is ifru_flags, which those ioctls use.
    unsafe {
        cvt(libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req))?;
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        cvt(libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &req))?;
    }
    Ok(())
}

pub fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// write(2) on a raw descriptor the caller knows to be open (used in a forked
/// child to report an errno through a pipe without taking ownership).
pub fn write_raw(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is a valid readable slice; a stale fd only yields EBADF.
    let r = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}
