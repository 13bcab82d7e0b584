//! PID 1 of the sandbox: a single-threaded poll loop that accepts control
//! connections, forks and execs workloads, streams their output, enforces
//! timeouts and output caps, and reaps every zombie (including re-parented
//! daemons).
use std::ffi::CString;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::duplex::{self, Duplex};
use super::InitConfig;
use crate::proto::{self, ExecDone, ExecSpec, Fail, Hello, Status};
use crate::sys::{self, ChildStatus};

mod session;

pub(super) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How long output pipes may stay open after the command exited (a background
/// child holding them) before the result is sent anyway.
const LINGER: Duration = Duration::from_millis(50);
const READ_CHUNK: usize = 64 * 1024;

struct Conn {
    stream: UnixStream,
    rbuf: Vec<u8>,
    busy: bool,
    dead: bool,
}

struct Exec {
    conn: usize,
    pid: i32,
    out: [Option<File>; 2],
    stdin: Option<(File, Vec<u8>, usize)>,
    /// More stdin is coming in `STDIN` frames (keep the pipe open when drained).
    stdin_more: bool,
    deadline: Option<Instant>,
    grace: Duration,
    kill_at: Option<Instant>,
    status: Option<ChildStatus>,
    exited_at: Option<Instant>,
    timed_out: bool,
    cap: u64,
    sent: [u64; 2],
    dropped: [u64; 2],
    started: Instant,
}

#[derive(Clone, Copy)]
enum Tag {
    Listener,
    Signal,
    Conn(usize),
    Out(usize, usize),
    In(usize),
    /// The session shell: 0 stdout, 1 stderr, 2 stdin.
    Session(usize),
    /// A duplex channel's host connection or far end (pty master, socket).
    Duplex(duplex::Slot),
}

pub(super) struct Server {
    cfg: InitConfig,
    listener: UnixListener,
    sigfd: File,
    conns: Vec<Option<Conn>>,
    execs: Vec<Exec>,
    session: session::Session,
    duplex: Duplex,
    started: Instant,
}

fn kill_group(pid: i32, sig: i32) {
    let _ = sys::kill(-pid, sig);
    let _ = sys::kill(pid, sig);
}

impl Server {
    pub(super) fn new(cfg: InitConfig, listener: UnixListener, sigfd: OwnedFd) -> Server {
        Server {
            cfg,
            listener,
            sigfd: File::from(sigfd),
            conns: vec![],
            execs: vec![],
            session: session::Session::default(),
            duplex: Duplex::default(),
            started: Instant::now(),
        }
    }

    pub(super) fn run(mut self) -> ! {
        loop {
            let now = Instant::now();
            self.timers(now);
            self.finish_done(now);
            self.session_timers(now);
            self.session_progress(now);
            self.duplex.tick(now);
            let mut fds = vec![];
            let mut tags = vec![];
            let mut add = |fd: i32, events: i16, tag: Tag| {
                fds.push(sys::pollfd {
                    fd,
                    events,
                    revents: 0,
                });
                tags.push(tag);
            };
            add(self.listener.as_raw_fd(), sys::POLLIN, Tag::Listener);
            add(self.sigfd.as_raw_fd(), sys::POLLIN, Tag::Signal);
            for (i, c) in self.conns.iter().enumerate() {
                // A client streaming stdin faster than its command reads it
                // waits (backpressure) instead of growing our buffer.
                if let Some(c) = c.as_ref().filter(|_| !self.stdin_backlogged(i)) {
                    add(c.stream.as_raw_fd(), sys::POLLIN, Tag::Conn(i));
                }
            }
            for (i, e) in self.execs.iter().enumerate() {
                for s in 0..2 {
                    if let Some(f) = &e.out[s] {
                        add(f.as_raw_fd(), sys::POLLIN, Tag::Out(i, s));
                    }
                }
                if let Some((f, data, off)) = &e.stdin {
                    if *off < data.len() {
                        add(f.as_raw_fd(), sys::POLLOUT, Tag::In(i));
                    }
                }
            }
            self.session.add_fds(&mut add);
            self.duplex
                .add_fds(&mut |fd, ev, slot| add(fd, ev, Tag::Duplex(slot)));
            let timeout = self.next_timer().map_or(-1, |t| {
                let d = t.saturating_duration_since(Instant::now());
                (d.as_millis() as i32).saturating_add(1)
            });
            if sys::poll(&mut fds, timeout).is_err() {
                continue;
            }
            for (pfd, tag) in fds.iter().zip(tags) {
                if pfd.revents == 0 {
                    continue;
                }
                match tag {
                    Tag::Listener => self.accept(),
                    Tag::Signal => self.reap(),
                    Tag::Conn(i) => self.conn_readable(i),
                    Tag::Out(i, s) => self.out_readable(i, s),
                    Tag::In(i) => self.stdin_writable(i),
                    Tag::Session(k) => self.session_io(k),
                    Tag::Duplex(s) => self.duplex.ready(s, pfd.revents),
                }
            }
            self.conns.iter_mut().for_each(|c| {
                if c.as_ref().is_some_and(|c| c.dead) {
                    *c = None;
                }
            });
        }
    }

    fn next_timer(&self) -> Option<Instant> {
        self.execs
            .iter()
            .flat_map(|e| {
                let linger = e.exited_at.map(|t| t + LINGER);
                let deadline = if e.timed_out || e.status.is_some() {
                    None
                } else {
                    e.deadline
                };
                [deadline, e.kill_at.filter(|_| e.status.is_none()), linger]
            })
            .flatten()
            .chain(self.session.next_timer())
            .chain(self.duplex.next_timer())
            .min()
    }

    fn timers(&mut self, now: Instant) {
        for e in &mut self.execs {
            if e.status.is_some() {
                continue;
            }
            if let Some(d) = e.deadline {
                if now >= d && !e.timed_out {
                    e.timed_out = true;
                    kill_group(e.pid, sys::SIGTERM);
                    e.kill_at = Some(now + e.grace);
                }
            }
            if let Some(k) = e.kill_at {
                if now >= k {
                    kill_group(e.pid, sys::SIGKILL);
                    e.kill_at = None;
                }
            }
        }
    }

    fn send(&mut self, conn: usize, kind: u8, payload: &[u8]) {
        if let Some(Some(c)) = self.conns.get_mut(conn) {
            if c.dead {
                return;
            }
            if proto::write_frame(&mut c.stream, kind, payload).is_err() {
                c.dead = true;
            }
        }
    }

    fn send_json(&mut self, conn: usize, kind: u8, value: &impl serde::Serialize) {
        let payload = serde_json::to_vec(value).unwrap_or_default();
        self.send(conn, kind, &payload);
    }

    fn finish_done(&mut self, now: Instant) {
        let mut i = 0;
        while i < self.execs.len() {
            let e = &self.execs[i];
            let drained = e.out.iter().all(Option::is_none);
            let lingered = e.exited_at.is_some_and(|t| now >= t + LINGER);
            if e.status.is_some() && (drained || lingered) {
                let e = self.execs.remove(i);
                let (exit_code, signal) = match e.status {
                    Some(ChildStatus::Exited(c)) => (Some(c), None),
                    Some(ChildStatus::Signaled(s)) => (None, Some(s)),
                    None => (None, None),
                };
                let done = ExecDone {
                    exit_code,
                    signal,
                    timed_out: e.timed_out,
                    stdout_dropped: e.dropped[0],
                    stderr_dropped: e.dropped[1],
                    duration_us: e.started.elapsed().as_micros() as u64,
                    ..ExecDone::default()
                };
                self.send_json(e.conn, proto::RESULT, &done);
                if let Some(Some(c)) = self.conns.get_mut(e.conn) {
                    c.busy = false;
                }
            } else {
                i += 1;
            }
        }
    }

    fn accept(&mut self) {
        let Ok((stream, _)) = self.listener.accept() else {
            return;
        };
        let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
        let slot = match self.conns.iter().position(Option::is_none) {
            Some(s) => s,
            None => {
                self.conns.push(None);
                self.conns.len() - 1
            }
        };
        self.conns[slot] = Some(Conn {
            stream,
            rbuf: vec![],
            busy: false,
            dead: false,
        });
        let hello = Hello {
            id: self.cfg.id.clone(),
            nonce: self.cfg.nonce.clone(),
            version: 1,
        };
        self.send_json(slot, proto::HELLO, &hello);
    }

    fn reap(&mut self) {
        let mut buf = [0u8; 1024];
        while let Ok(n) = self.sigfd.read(&mut buf) {
            if n == 0 {
                break;
            }
        }
        while let Ok(Some((pid, st))) = sys::reap_any() {
            if let Some(e) = self.execs.iter_mut().find(|e| e.pid == pid) {
                e.status = Some(st);
                e.exited_at = Some(Instant::now());
            }
            self.session.reaped(pid, st);
            self.duplex.reaped(pid, st);
        }
    }

    fn conn_readable(&mut self, i: usize) {
        let mut buf = vec![0u8; READ_CHUNK];
        let n = {
            let Some(Some(c)) = self.conns.get_mut(i) else {
                return;
            };
            match c.stream.read(&mut buf) {
                Ok(0) | Err(_) => {
                    c.dead = true;
                    0
                }
                Ok(n) => {
                    c.rbuf.extend_from_slice(&buf[..n]);
                    n
                }
            }
        };
        if n == 0 {
            // The client went away: cancel what it was running.
            for e in &self.execs {
                if e.conn == i && e.status.is_none() {
                    kill_group(e.pid, sys::SIGKILL);
                }
            }
            self.session_conn_closed(i);
            return;
        }
        loop {
            let frame = {
                let Some(Some(c)) = self.conns.get_mut(i) else {
                    return;
                };
                match proto::take_frame(&mut c.rbuf) {
                    Ok(f) => f,
                    Err(_) => {
                        c.dead = true;
                        None
                    }
                }
            };
            let Some((kind, payload)) = frame else { break };
            self.handle(i, kind, &payload);
        }
    }

    fn fail(&mut self, conn: usize, code: &str, message: String) {
        let f = Fail {
            code: code.into(),
            message,
        };
        self.send_json(conn, proto::FAIL, &f);
    }

    fn handle(&mut self, conn: usize, kind: u8, payload: &[u8]) {
        match kind {
            proto::EXEC => {
                if self.conns[conn].as_ref().is_some_and(|c| c.busy) {
                    return self.fail(
                        conn,
                        "busy",
                        "an exec is already running on this connection".into(),
                    );
                }
                let (spec, stdin) = match proto::decode_exec(payload) {
                    Ok(x) => x,
                    Err(e) => return self.fail(conn, "invalid", e),
                };
                match self.spawn(conn, &spec, stdin) {
                    Ok(e) => {
                        self.execs.push(e);
                        if let Some(Some(c)) = self.conns.get_mut(conn) {
                            c.busy = true;
                        }
                    }
                    Err((code, msg)) => self.fail(conn, code, msg),
                }
            }
            proto::SESSION_EXEC => {
                if self.conns[conn].as_ref().is_some_and(|c| c.busy) {
                    return self.fail(
                        conn,
                        "busy",
                        "an exec is already running on this connection".into(),
                    );
                }
                match proto::decode_exec(payload) {
                    Ok((spec, stdin)) => self.session_request(conn, spec, stdin),
                    Err(e) => self.fail(conn, "invalid", e),
                }
            }
            proto::STDIN => self.stdin_chunk(conn, payload),
            proto::PTY_OPEN | proto::TCP_OPEN => {
                if self.conns[conn].as_ref().is_some_and(|c| c.busy) {
                    return self.fail(
                        conn,
                        "busy",
                        "an exec is already running on this connection".into(),
                    );
                }
                // The connection becomes the channel's own (see init::duplex).
                if let Some(c) = self.conns[conn].take() {
                    self.duplex.open(&self.cfg, c.stream, c.rbuf, kind, payload);
                }
            }
            proto::CHAN_KILL => {
                if self.duplex.kill(payload) {
                    self.send(conn, proto::OK, &[]);
                } else {
                    self.fail(conn, "not_found", "no such channel".into());
                }
            }
            proto::KILL_ALL => {
                let n = count_processes();
                let _ = sys::kill(-1, sys::SIGKILL);
                self.send(conn, proto::OK, n.to_string().as_bytes());
            }
            proto::STATUS => {
                let st = Status {
                    id: self.cfg.id.clone(),
                    processes: count_processes(),
                    running_execs: self.execs.len() as u32,
                    uptime_ms: self.started.elapsed().as_millis() as u64,
                };
                self.send_json(conn, proto::STATUS, &st);
            }
            _ => self.fail(conn, "invalid", format!("unknown frame kind {kind}")),
        }
    }

    /// Pending stdin beyond which a streaming client is not read from.
    const STDIN_BACKLOG: usize = 4 << 20;

    fn stdin_backlogged(&self, conn: usize) -> bool {
        self.execs.iter().any(|e| {
            e.conn == conn
                && e.stdin
                    .as_ref()
                    .is_some_and(|(_, d, off)| d.len() - off > Self::STDIN_BACKLOG)
        })
    }

    /// A `STDIN` frame: more input for the streaming exec of `conn` (late
    /// chunks for a command that stopped reading are dropped).
    fn stdin_chunk(&mut self, conn: usize, payload: &[u8]) {
        let Some(e) = self
            .execs
            .iter_mut()
            .find(|e| e.conn == conn && e.stdin_more)
        else {
            return;
        };
        if payload.is_empty() {
            e.stdin_more = false;
            if e.stdin.as_ref().is_some_and(|(_, d, off)| *off >= d.len()) {
                e.stdin = None;
            }
            return;
        }
        if let Some((_, d, off)) = e.stdin.as_mut() {
            d.drain(..*off);
            *off = 0;
            d.extend_from_slice(payload);
        }
    }

    fn out_readable(&mut self, i: usize, s: usize) {
        let mut buf = vec![0u8; READ_CHUNK];
        let e = &mut self.execs[i];
        let Some(f) = e.out[s].as_mut() else { return };
        let n = match f.read(&mut buf) {
            Ok(n) => n,
            Err(err)
                if err.kind() == ErrorKind::Interrupted || err.kind() == ErrorKind::WouldBlock =>
            {
                return
            }
            Err(_) => 0,
        };
        if n == 0 {
            e.out[s] = None;
            return;
        }
        let room = e.cap.saturating_sub(e.sent[s]) as usize;
        let keep = n.min(room);
        e.sent[s] += keep as u64;
        e.dropped[s] += (n - keep) as u64;
        let conn = e.conn;
        if keep > 0 {
            let kind = if s == 0 { proto::STDOUT } else { proto::STDERR };
            self.send(conn, kind, &buf[..keep]);
        }
    }

    fn stdin_writable(&mut self, i: usize) {
        let e = &mut self.execs[i];
        let Some((f, data, off)) = e.stdin.as_mut() else {
            return;
        };
        match f.write(&data[*off..]) {
            Ok(n) => {
                *off += n;
                if *off >= data.len() && !e.stdin_more {
                    e.stdin = None;
                }
            }
            Err(err)
                if err.kind() == ErrorKind::WouldBlock || err.kind() == ErrorKind::Interrupted => {}
            Err(_) => e.stdin = None,
        }
    }

    fn spawn(
        &mut self,
        conn: usize,
        spec: &ExecSpec,
        stdin: Vec<u8>,
    ) -> Result<Exec, (&'static str, String)> {
        let cmd = prepare_command(&self.cfg.hostname, &[], &spec.argv, &spec.env, &spec.cwd)?;
        let io = |e: std::io::Error| ("spawn", format!("pipe: {e}"));
        let (in_r, in_w) = sys::pipe().map_err(io)?;
        let (out_r, out_w) = sys::pipe().map_err(io)?;
        let (err_r, err_w) = sys::pipe().map_err(io)?;
        let (fail_r, fail_w) = sys::pipe().map_err(io)?;
        let (nofile, fsize) = (self.cfg.nofile, self.cfg.fsize);

        let pid = sys::fork().map_err(|e| ("spawn", format!("fork: {e}")))?;
        if pid == 0 {
            child(ChildSetup {
                stdio: ChildStdio::Pipes([in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()]),
                fail: fail_w.as_raw_fd(),
                nofile,
                fsize,
                cwd: &cmd.cwd,
                prog: &cmd.prog_c,
                argv: &cmd.argv,
                envp: &cmd.envp,
            });
        }
        drop((in_r, out_w, err_w, fail_w));
        if let Some(err) = exec_failure(fail_r) {
            let _ = sys::wait_pid(pid);
            return Err((
                "spawn",
                format!("cannot start {} in {}: {err}", cmd.prog.display(), spec.cwd),
            ));
        }
        let stdin = if stdin.is_empty() && !spec.stdin_stream {
            None
        } else {
            let _ = sys::set_nonblocking(in_w.as_fd(), true);
            Some((File::from(in_w), stdin, 0))
        };
        let now = Instant::now();
        Ok(Exec {
            conn,
            pid,
            out: [Some(File::from(out_r)), Some(File::from(err_r))],
            stdin,
            stdin_more: spec.stdin_stream,
            deadline: spec.timeout_ms.map(|t| now + Duration::from_millis(t)),
            grace: Duration::from_millis(spec.grace_ms),
            kill_at: None,
            status: None,
            exited_at: None,
            timed_out: false,
            cap: spec.max_output,
            sent: [0; 2],
            dropped: [0; 2],
            started: now,
        })
    }
}

/// What the forked child's stdin, stdout and stderr are.
pub(super) enum ChildStdio {
    /// Three pipe ends.
    Pipes([i32; 3]),
    /// A pty slave, which also becomes the controlling terminal.
    Pty(i32),
}

pub(super) struct ChildSetup<'a> {
    pub(super) stdio: ChildStdio,
    /// Where an exec failure's errno goes (see [`exec_failure`]).
    pub(super) fail: i32,
    pub(super) nofile: u64,
    pub(super) fsize: u64,
    pub(super) cwd: &'a CString,
    pub(super) prog: &'a CString,
    pub(super) argv: &'a [CString],
    pub(super) envp: &'a [CString],
}

/// After a fork: `None` when the child got as far as exec (the fail pipe
/// closed on exec), else the errno it reported.
pub(super) fn exec_failure(fail_r: std::os::fd::OwnedFd) -> Option<std::io::Error> {
    let mut errno = [0u8; 4];
    let mut fail_r = File::from(fail_r);
    let mut got = 0;
    while got < 4 {
        match fail_r.read(&mut errno[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    (got == 4).then(|| std::io::Error::from_raw_os_error(i32::from_le_bytes(errno)))
}

/// In the forked child: a new session, stdio (pipes, or a pty that becomes
/// the controlling terminal), signals reset, rlimits, chdir, exec; an errno
/// goes back through `fail` (read by [`exec_failure`]).
pub(super) fn child(s: ChildSetup<'_>) -> ! {
    let report = |e: std::io::Error| -> ! {
        let code = sys::errno_of(&e).to_le_bytes();
        let _ = sys::write_raw(s.fail, &code);
        sys::exit_now(127)
    };
    if let Err(e) = sys::setsid() {
        report(e)
    }
    match s.stdio {
        ChildStdio::Pipes(fds) => {
            for (target, fd) in fds.iter().enumerate() {
                if let Err(e) = sys::dup2(*fd, target as i32) {
                    report(e)
                }
            }
        }
        ChildStdio::Pty(slave) => {
            for target in 0..3 {
                if let Err(e) = sys::dup2(slave, target) {
                    report(e)
                }
            }
            if let Err(e) = sys::set_controlling_tty(0) {
                report(e)
            }
        }
    }
    if let Err(e) = sys::close_fds_except(&[s.fail]) {
        report(e)
    }
    sys::reset_signals();
    let limits = [
        (sys::RLIMIT_NOFILE, s.nofile),
        (sys::RLIMIT_FSIZE, s.fsize),
        (sys::RLIMIT_CORE, 0),
    ];
    for (res, v) in limits {
        if let Err(e) = sys::setrlimit(res, v, v) {
            report(e)
        }
    }
    if let Err(e) = std::env::set_current_dir(Path::new(s.cwd.to_str().unwrap_or("/"))) {
        report(e)
    }
    let e = sys::execve(s.prog, s.argv, s.envp);
    report(e)
}

/// A command ready to exec in the sandbox.
pub(super) struct Prepared {
    pub(super) prog: PathBuf,
    pub(super) prog_c: CString,
    pub(super) argv: Vec<CString>,
    pub(super) envp: Vec<CString>,
    pub(super) cwd: CString,
}

/// The sandbox's base environment (plus `extra`), the request's `env` over
/// it, the program resolved on its PATH, everything as C strings: what an
/// exec and a pty command both need before the fork.
pub(super) fn prepare_command(
    hostname: &str,
    extra: &[(&str, &str)],
    argv: &[String],
    request_env: &[(String, String)],
    cwd: &str,
) -> Result<Prepared, (&'static str, String)> {
    if argv.is_empty() {
        return Err(("invalid", "empty argv".into()));
    }
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), DEFAULT_PATH.into()),
        ("HOME".into(), "/workspace".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("HOSTNAME".into(), hostname.into()),
    ];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    for (k, v) in request_env {
        if k.is_empty() || k.contains('=') {
            return Err((
                "invalid",
                format!("invalid environment variable name {k:?}"),
            ));
        }
        env.retain(|(ek, _)| ek != k);
        env.push((k.clone(), v.clone()));
    }
    let path_var = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    let prog = resolve(&argv[0], &path_var)
        .ok_or_else(|| ("not_found", format!("command not found: {}", argv[0])))?;
    let c = |s: &str| CString::new(s).map_err(|_| ("invalid", "NUL byte in argument".to_string()));
    let prog_c = CString::new(prog.as_os_str().as_encoded_bytes())
        .map_err(|_| ("invalid", "NUL byte in path".to_string()))?;
    let argv = argv.iter().map(|a| c(a)).collect::<Result<Vec<_>, _>>()?;
    let envp = env
        .iter()
        .map(|(k, v)| c(&format!("{k}={v}")))
        .collect::<Result<Vec<_>, _>>()?;
    let cwd = c(cwd)?;
    Ok(Prepared {
        prog,
        prog_c,
        argv,
        envp,
        cwd,
    })
}

pub(super) fn resolve(prog: &str, path_var: &str) -> Option<PathBuf> {
    if prog.contains('/') {
        return Some(PathBuf::from(prog));
    }
    path_var
        .split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(prog))
        .find(|p| p.is_file() && sys::is_executable(p))
}

fn count_processes() -> u32 {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| {
                    e.file_name()
                        .to_str()
                        .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
                })
                .count() as u32
        })
        .unwrap_or(1)
        .saturating_sub(1)
}
