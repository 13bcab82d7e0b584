//! Duplex channels inside the init: a command on a fresh pty, or a TCP
//! connection to a port on the sandbox's own loopback, each relayed over the
//! control connection that opened it (the host side is `crate::duplex`).
//!
//! Everything runs in the init's single poll loop with non-blocking
//! descriptors and bounded buffers in both directions: when the host does not
//! read, the far end (pty master or socket) is not read either; when the far
//! end does not take input, the host connection is not read. A host that
//! disconnects kills what its channel runs.
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use super::server::{child, exec_failure, prepare_command, ChildSetup, ChildStdio};
use super::InitConfig;
use crate::proto::{self, ChanExit, ChanKill, ChanOpened, Fail, PtySpec, TcpSpec};
use crate::sys::{self, ChildStatus};

/// Pending bytes in one direction beyond which the source is not read.
const HIGH_WATER: usize = 64 * 1024;
const READ_CHUNK: usize = 16 * 1024;
/// After the pty's command exited: how long the terminal may stay silent
/// (a background process still holding it) before the exit is reported.
const PTY_LINGER: Duration = Duration::from_millis(100);
/// ...and the most output drained after exit, however busy the terminal is.
const PTY_MAX_DRAIN: Duration = Duration::from_secs(2);
const TCP_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Which descriptor of which channel a poll entry is.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    idx: usize,
    far: bool,
}

#[derive(Default)]
pub(super) struct Duplex {
    chans: Vec<Option<Chan>>,
    next_token: u64,
}

enum Far {
    Pty(File),
    Tcp(TcpStream),
}

impl Far {
    fn fd(&self) -> RawFd {
        match self {
            Far::Pty(f) => f.as_raw_fd(),
            Far::Tcp(s) => s.as_raw_fd(),
        }
    }
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Far::Pty(f) => f.read(buf),
            Far::Tcp(s) => s.read(buf),
        }
    }
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Far::Pty(f) => f.write(buf),
            Far::Tcp(s) => s.write(buf),
        }
    }
}

enum Kind {
    Pty {
        pid: i32,
        status: Option<ChildStatus>,
        exited_at: Option<Instant>,
        last_output: Instant,
    },
    Tcp {
        /// Connect still in progress: give up at this instant.
        connecting: Option<Instant>,
        read_eof: bool,
        write_shut: bool,
    },
}

struct Chan {
    token: u64,
    host: UnixStream,
    /// Undecoded bytes from the host.
    rbuf: Vec<u8>,
    /// Encoded frames waiting for the host to read them.
    to_host: Vec<u8>,
    far: Option<Far>,
    to_far: Vec<u8>,
    /// The host sent `CHAN_EOF`: no more input.
    input_closed: bool,
    kind: Kind,
    /// The exit frame is queued: drop the channel once `to_host` is flushed.
    finished: bool,
}

impl Chan {
    fn queue(&mut self, kind: u8, payload: &[u8]) {
        self.to_host
            .extend_from_slice(&proto::encode(kind, payload));
    }

    fn queue_json(&mut self, kind: u8, value: &impl serde::Serialize) {
        let payload = serde_json::to_vec(value).unwrap_or_default();
        self.queue(kind, &payload);
    }

    /// Queue the exit frame (once) and stop relaying.
    fn finish(&mut self, exit: ChanExit) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.far = None;
        self.to_far = Vec::new();
        self.queue_json(proto::RESULT, &exit);
    }

    fn fail_open(&mut self, code: &str, message: String) {
        let f = Fail {
            code: code.into(),
            message,
        };
        self.queue_json(proto::FAIL, &f);
        self.finished = true;
        self.far = None;
    }

    /// Write as much of `to_host` as the connection takes; false when the host is gone.
    fn flush_host(&mut self) -> bool {
        while !self.to_host.is_empty() {
            match self.host.write(&self.to_host) {
                Ok(0) => return false,
                Ok(n) => {
                    self.to_host.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        if self.to_host.capacity() > HIGH_WATER {
            self.to_host = Vec::new();
        }
        true
    }

    fn flush_far(&mut self) {
        if matches!(
            self.kind,
            Kind::Tcp {
                connecting: Some(_),
                ..
            }
        ) {
            return;
        }
        while !self.to_far.is_empty() {
            let Some(far) = self.far.as_mut() else { return };
            match far.write(&self.to_far) {
                Ok(n) => {
                    self.to_far.drain(..n);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    self.to_far = Vec::new();
                    if matches!(self.kind, Kind::Tcp { .. }) {
                        self.finish(ChanExit {
                            error: Some(format!("write to the port failed: {e}")),
                            ..ChanExit::default()
                        });
                    }
                    // A pty whose terminal is gone: input is dropped, the exit
                    // comes with the command's status.
                    return;
                }
            }
        }
        if self.to_far.capacity() > HIGH_WATER {
            self.to_far = Vec::new();
        }
        self.maybe_shut_write();
    }

    /// TCP half-close: once the host's input ended and is written, shut our write side.
    fn maybe_shut_write(&mut self) {
        if let (
            Kind::Tcp {
                write_shut,
                connecting: None,
                ..
            },
            Some(Far::Tcp(s)),
        ) = (&mut self.kind, &self.far)
        {
            if self.input_closed && self.to_far.is_empty() && !*write_shut {
                let _ = s.shutdown(Shutdown::Write);
                *write_shut = true;
            }
        }
    }

    fn read_far(&mut self) {
        let mut buf = [0u8; READ_CHUNK];
        let Some(far) = self.far.as_mut() else { return };
        let r = far.read(&mut buf);
        let pty = matches!(self.kind, Kind::Pty { .. });
        match r {
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {}
            Ok(n) if n > 0 => {
                if let Kind::Pty { last_output, .. } = &mut self.kind {
                    *last_output = Instant::now();
                }
                self.queue(proto::CHAN_DATA, &buf[..n]);
            }
            // EIO (every slave descriptor closed) or EOF: the terminal is done.
            _ if pty => self.far = None,
            Ok(_) => {
                if let Kind::Tcp { read_eof, .. } = &mut self.kind {
                    *read_eof = true;
                }
                self.queue(proto::CHAN_EOF, &[]);
            }
            Err(e) => self.finish(ChanExit {
                error: Some(format!("read from the port failed: {e}")),
                ..ChanExit::default()
            }),
        }
    }

    /// A frame from the host; false on a protocol violation.
    fn host_frame(&mut self, kind: u8, payload: &[u8]) -> bool {
        match kind {
            proto::CHAN_DATA => {
                let running = match &self.kind {
                    Kind::Pty { status, .. } => status.is_none(),
                    Kind::Tcp { .. } => true,
                };
                if !self.input_closed && !self.finished && running && self.far.is_some() {
                    self.to_far.extend_from_slice(payload);
                }
                true
            }
            proto::CHAN_RESIZE => {
                if payload.len() != 4 {
                    return false;
                }
                let cols = u16::from_le_bytes([payload[0], payload[1]]);
                let rows = u16::from_le_bytes([payload[2], payload[3]]);
                if let Some(Far::Pty(m)) = &self.far {
                    let _ = sys::set_winsize(m.as_fd(), cols, rows);
                }
                true
            }
            proto::CHAN_EOF => {
                self.input_closed = true;
                self.maybe_shut_write();
                true
            }
            _ => false,
        }
    }

    fn kill(&mut self) {
        match &self.kind {
            Kind::Pty { pid, status, .. } => {
                // The exit follows from the reaped status (SIGKILL).
                if status.is_none() {
                    kill_session(*pid);
                }
            }
            Kind::Tcp { .. } => self.finish(ChanExit {
                error: Some("killed".into()),
                ..ChanExit::default()
            }),
        }
    }

    /// Report the exit once the command is gone and its output drained.
    fn tick(&mut self, now: Instant) {
        if self.finished {
            return;
        }
        match &self.kind {
            Kind::Pty {
                status: Some(st),
                exited_at: Some(at),
                last_output,
                ..
            } => {
                // Silence only counts while we are free to read the terminal.
                let quiet =
                    now >= (*last_output).max(*at) + PTY_LINGER && self.to_host.len() < HIGH_WATER;
                if self.far.is_none() || quiet || now >= *at + PTY_MAX_DRAIN {
                    let (exit_code, signal) = match *st {
                        ChildStatus::Exited(c) => (Some(c), None),
                        ChildStatus::Signaled(s) => (None, Some(s)),
                    };
                    self.finish(ChanExit {
                        exit_code,
                        signal,
                        error: None,
                    });
                }
            }
            Kind::Tcp {
                connecting: Some(deadline),
                ..
            } if now >= *deadline => self.fail_open("connect", "connect timed out".into()),
            Kind::Tcp {
                read_eof: true,
                write_shut: true,
                ..
            } => self.finish(ChanExit::default()),
            _ => {}
        }
    }

    fn next_timer(&self) -> Option<Instant> {
        if self.finished {
            return None;
        }
        match &self.kind {
            Kind::Pty {
                exited_at: Some(at),
                last_output,
                ..
            } => {
                let max = *at + PTY_MAX_DRAIN;
                if self.to_host.len() >= HIGH_WATER {
                    Some(max)
                } else {
                    Some(((*last_output).max(*at) + PTY_LINGER).min(max))
                }
            }
            Kind::Tcp { connecting, .. } => *connecting,
            _ => None,
        }
    }

    /// The TCP connect finished (POLLOUT on the connecting socket).
    fn connected(&mut self) {
        let Some(Far::Tcp(s)) = &self.far else { return };
        let err = match sys::socket_error(s.as_fd()) {
            Ok(e) => e,
            Err(e) => Some(e),
        };
        if let Some(e) = err {
            return self.fail_open("connect", e.to_string());
        }
        if let Kind::Tcp { connecting, .. } = &mut self.kind {
            *connecting = None;
        }
        let opened = ChanOpened {
            token: self.token,
            pid: None,
            tty: None,
        };
        self.queue_json(proto::OK, &opened);
        // Input the host pipelined behind its open request.
        self.flush_far();
    }
}

impl Duplex {
    /// Take over a control connection whose first request was `PTY_OPEN` or
    /// `TCP_OPEN`; `rbuf` holds whatever the host already sent after it.
    pub(super) fn open(
        &mut self,
        cfg: &InitConfig,
        host: UnixStream,
        rbuf: Vec<u8>,
        kind: u8,
        payload: &[u8],
    ) {
        self.next_token += 1;
        let token = self.next_token;
        let _ = host.set_nonblocking(true);
        let mut chan = Chan {
            token,
            host,
            rbuf,
            to_host: Vec::new(),
            far: None,
            to_far: Vec::new(),
            input_closed: false,
            kind: Kind::Tcp {
                connecting: None,
                read_eof: false,
                write_shut: false,
            },
            finished: false,
        };
        let started = match kind {
            proto::PTY_OPEN => serde_json::from_slice::<PtySpec>(payload)
                .map_err(|e| ("invalid", format!("bad pty spec: {e}")))
                .and_then(|spec| spawn_pty(cfg, &spec))
                .map(|(master, pid, tty)| {
                    chan.far = Some(Far::Pty(File::from(master)));
                    chan.kind = Kind::Pty {
                        pid,
                        status: None,
                        exited_at: None,
                        last_output: Instant::now(),
                    };
                    let opened = ChanOpened {
                        token,
                        pid: Some(pid),
                        tty: Some(tty),
                    };
                    chan.queue_json(proto::OK, &opened);
                }),
            _ => serde_json::from_slice::<TcpSpec>(payload)
                .map_err(|e| ("invalid", format!("bad tcp spec: {e}")))
                .and_then(|spec| {
                    sys::connect_loopback(spec.port).map_err(|e| ("connect", e.to_string()))
                })
                .map(|(sock, done)| {
                    chan.far = Some(Far::Tcp(TcpStream::from(sock)));
                    if done {
                        chan.connected();
                    } else if let Kind::Tcp { connecting, .. } = &mut chan.kind {
                        *connecting = Some(Instant::now() + TCP_CONNECT_TIMEOUT);
                    }
                }),
        };
        if let Err((code, message)) = started {
            chan.fail_open(code, message);
        }
        let idx = match self.chans.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                self.chans.push(None);
                self.chans.len() - 1
            }
        };
        self.chans[idx] = Some(chan);
        // Frames the host pipelined behind the open request.
        self.host_frames(idx);
    }

    /// Kill the channel named by a `CHAN_KILL` request; false when there is none.
    pub(super) fn kill(&mut self, payload: &[u8]) -> bool {
        let Ok(k) = serde_json::from_slice::<ChanKill>(payload) else {
            return false;
        };
        match self.chans.iter_mut().flatten().find(|c| c.token == k.token) {
            Some(c) => {
                c.kill();
                true
            }
            None => false,
        }
    }

    pub(super) fn add_fds(&self, add: &mut impl FnMut(RawFd, i16, Slot)) {
        for (idx, c) in self.chans.iter().enumerate() {
            let Some(c) = c else { continue };
            // Always watched: POLLHUP reports a host that went away.
            let mut ev = 0;
            if !c.finished && c.to_far.len() < HIGH_WATER {
                ev |= sys::POLLIN;
            }
            if !c.to_host.is_empty() {
                ev |= sys::POLLOUT;
            }
            add(c.host.as_raw_fd(), ev, Slot { idx, far: false });
            let Some(far) = &c.far else { continue };
            let connecting = matches!(
                c.kind,
                Kind::Tcp {
                    connecting: Some(_),
                    ..
                }
            );
            let read_eof = matches!(c.kind, Kind::Tcp { read_eof: true, .. });
            let mut ev = 0;
            if !connecting && !read_eof && c.to_host.len() < HIGH_WATER {
                ev |= sys::POLLIN;
            }
            if connecting || !c.to_far.is_empty() {
                ev |= sys::POLLOUT;
            }
            // A hung-up pty reports POLLHUP whatever we ask: only watch it
            // when we can read it.
            if ev != 0 {
                add(far.fd(), ev, Slot { idx, far: true });
            }
        }
    }

    pub(super) fn ready(&mut self, slot: Slot, revents: i16) {
        let Some(Some(c)) = self.chans.get_mut(slot.idx) else {
            return;
        };
        if slot.far {
            if c.far.as_ref().is_none() {
                return;
            }
            if matches!(
                c.kind,
                Kind::Tcp {
                    connecting: Some(_),
                    ..
                }
            ) {
                if revents & (sys::POLLOUT | sys::POLLERR | sys::POLLHUP) != 0 {
                    c.connected();
                }
                return;
            }
            if revents & sys::POLLOUT != 0 {
                c.flush_far();
            }
            if revents & (sys::POLLIN | sys::POLLHUP | sys::POLLERR) != 0 {
                c.read_far();
            }
            return;
        }
        if revents & sys::POLLOUT != 0 && !c.flush_host() {
            return self.host_gone(slot.idx);
        }
        if revents & sys::POLLIN != 0 {
            let mut buf = [0u8; READ_CHUNK];
            match c.host.read(&mut buf) {
                Ok(0) => return self.host_gone(slot.idx),
                Ok(n) => c.rbuf.extend_from_slice(&buf[..n]),
                Err(e)
                    if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return self.host_gone(slot.idx),
            }
            self.host_frames(slot.idx);
        } else if revents & (sys::POLLHUP | sys::POLLERR) != 0 {
            self.host_gone(slot.idx);
        }
    }

    fn host_frames(&mut self, idx: usize) {
        let Some(Some(c)) = self.chans.get_mut(idx) else {
            return;
        };
        loop {
            match proto::take_frame(&mut c.rbuf) {
                Ok(Some((kind, payload))) => {
                    if !c.host_frame(kind, &payload) {
                        return self.host_gone(idx);
                    }
                }
                Ok(None) => break,
                Err(_) => return self.host_gone(idx),
            }
        }
        if c.rbuf.capacity() > HIGH_WATER && c.rbuf.is_empty() {
            c.rbuf = Vec::new();
        }
        c.flush_far();
    }

    /// The host disconnected (or broke the protocol): kill and forget the channel.
    fn host_gone(&mut self, idx: usize) {
        if let Some(mut c) = self.chans[idx].take() {
            if !c.finished {
                c.kill();
            }
        }
    }

    /// A child was reaped: maybe a pty's command.
    pub(super) fn reaped(&mut self, pid: i32, st: ChildStatus) {
        for c in self.chans.iter_mut().flatten() {
            if let Kind::Pty {
                pid: p,
                status,
                exited_at,
                ..
            } = &mut c.kind
            {
                if *p == pid && status.is_none() {
                    *status = Some(st);
                    *exited_at = Some(Instant::now());
                }
            }
        }
    }

    /// Report exits that are due, flush what is queued, drop finished channels.
    pub(super) fn tick(&mut self, now: Instant) {
        for slot in self.chans.iter_mut() {
            let Some(c) = slot else { continue };
            c.tick(now);
            if !c.flush_host() || (c.finished && c.to_host.is_empty()) {
                if !c.finished {
                    c.kill();
                }
                *slot = None;
            }
        }
        if self.chans.iter().all(Option::is_none) {
            self.chans = Vec::new();
        }
    }

    pub(super) fn next_timer(&self) -> Option<Instant> {
        self.chans
            .iter()
            .flatten()
            .filter_map(Chan::next_timer)
            .min()
    }
}

/// SIGKILL every process of the session `sid` (a pty command may have
/// started jobs in other process groups of its session). A process that left
/// the session with `setsid` is not the channel's any more.
fn kill_session(sid: i32) {
    let _ = sys::kill(-sid, sys::SIGKILL);
    let _ = sys::kill(sid, sys::SIGKILL);
    for _ in 0..3 {
        let members = session_members(sid);
        if members.is_empty() {
            break;
        }
        for p in members {
            let _ = sys::kill(p, sys::SIGKILL);
        }
    }
}

/// Live (not zombie) processes whose session id is `sid`.
fn session_members(sid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            let Some(close) = stat.rfind(')') else {
                return false;
            };
            // After "pid (comm) ": state ppid pgrp session ...
            let mut f = stat[close + 1..].split_whitespace();
            let state = f.next();
            let session = f.nth(2).and_then(|s| s.parse::<i32>().ok());
            session == Some(sid) && !matches!(state, Some("Z" | "X"))
        })
        .collect()
}

/// Fork the pty's command: a new session whose controlling terminal is the
/// slave. Returns the master, the command's pid and the slave's path.
fn spawn_pty(
    cfg: &InitConfig,
    spec: &PtySpec,
) -> Result<(OwnedFd, i32, String), (&'static str, String)> {
    let cmd = prepare_command(
        &cfg.hostname,
        &[("TERM", "xterm-256color")],
        &spec.argv,
        &spec.env,
        &spec.cwd,
    )?;
    let (master, slave, number) =
        sys::open_pty().map_err(|e| ("spawn", format!("cannot allocate a pty: {e}")))?;
    sys::set_winsize(master.as_fd(), spec.cols, spec.rows)
        .map_err(|e| ("spawn", format!("cannot size the pty: {e}")))?;
    let (fail_r, fail_w) = sys::pipe().map_err(|e| ("spawn", format!("pipe: {e}")))?;
    let pid = sys::fork().map_err(|e| ("spawn", format!("fork: {e}")))?;
    if pid == 0 {
        child(ChildSetup {
            stdio: ChildStdio::Pty(slave.as_raw_fd()),
            fail: fail_w.as_raw_fd(),
            nofile: cfg.nofile,
            fsize: cfg.fsize,
            cwd: &cmd.cwd,
            prog: &cmd.prog_c,
            argv: &cmd.argv,
            envp: &cmd.envp,
        });
    }
    drop((slave, fail_w));
    if let Some(err) = exec_failure(fail_r) {
        let _ = sys::wait_pid(pid);
        return Err((
            "spawn",
            format!("cannot start {} in {}: {err}", cmd.prog.display(), spec.cwd),
        ));
    }
    Ok((master, pid, format!("/dev/pts/{number}")))
}
