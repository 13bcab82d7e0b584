//! Terminal and socket calls for duplex channels (pty allocation, window
//! size, controlling terminal, a non-blocking connect on the sandbox's
//! loopback).
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use super::cvt;

/// A new pty pair from the devpts instance behind `/dev/ptmx` (inside the
/// sandbox: its own `newinstance` mount). Returns the master (non-blocking,
/// close-on-exec), the slave (blocking, close-on-exec, `O_NOCTTY`) and the
/// slave's number (`/dev/pts/N`).
pub fn open_pty() -> io::Result<(OwnedFd, OwnedFd, u32)> {
    let master = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK)
        .open("/dev/ptmx")?;
    let master = OwnedFd::from(master);
    let unlock: libc::c_int = 0;
    // SAFETY: TIOCSPTLCK reads one int through the pointer, which points to a
    // live local; the descriptor is a pty master we own.
    cvt(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSPTLCK, &unlock) })?;
    let mut number: libc::c_uint = 0;
    // SAFETY: TIOCGPTN writes one unsigned int to the pointer, which points to
    // a live local.
    cvt(unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGPTN, &mut number) })?;
    // TIOCGPTPEER opens the slave from the master itself: no path lookup that
    // a process of the sandbox could race.
    // SAFETY: TIOCGPTPEER takes the open flags by value and returns a fresh
    // descriptor.
    let slave = cvt(unsafe {
        libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    })?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    Ok((master, slave, number))
}

/// TIOCSWINSZ: set a terminal's window size (on the master, the foreground
/// process group of the slave gets SIGWINCH).
pub fn set_winsize(fd: BorrowedFd<'_>, cols: u16, rows: u16) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one winsize through the pointer, which points
    // to a live local.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, &ws) }).map(drop)
}

/// TIOCSCTTY: make the terminal open on `fd` the controlling terminal of the
/// calling session leader (never stealing one that belongs to another session).
pub fn set_controlling_tty(fd: RawFd) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument (0 = do not steal); a stale
    // descriptor only yields EBADF.
    cvt(unsafe { libc::ioctl(fd, libc::TIOCSCTTY, 0) }).map(drop)
}

/// Start a non-blocking TCP connect to `127.0.0.1:port` in the caller's
/// network namespace. Returns the socket and whether it is already connected
/// (otherwise wait for POLLOUT, then read [`socket_error`]).
pub fn connect_loopback(port: u16) -> io::Result<(OwnedFd, bool)> {
    // SAFETY: socket takes integers and returns a fresh descriptor.
    let fd = cvt(unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    })?;
    // SAFETY: fd was just returned by socket and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let addr = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(std::net::Ipv4Addr::LOCALHOST).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: addr is a fully initialised sockaddr_in and the length passed
    // is its size.
    let r = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r == 0 {
        return Ok((fd, true));
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EINPROGRESS) {
        Ok((fd, false))
    } else {
        Err(e)
    }
}

/// SO_ERROR of a socket: the outcome of a non-blocking connect.
pub fn socket_error(fd: BorrowedFd<'_>) -> io::Result<Option<io::Error>> {
    let mut err: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: err and len are live locals of the sizes getsockopt expects for
    // SO_ERROR.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ERROR,
            (&mut err as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok((err != 0).then(|| io::Error::from_raw_os_error(err)))
}

pub use libc::{POLLERR, POLLHUP};
