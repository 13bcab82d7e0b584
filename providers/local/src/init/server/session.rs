//! The sandbox's persistent process session: one long-lived `sh` that the
//! init starts on first use and keeps, with its stdin, stdout and stderr
//! pipes held by the init. Because the shell lives in the sandbox (not in
//! whoever asked), its working directory and exported variables persist
//! across commands sent by different host processes.
//!
//! One command runs at a time; later requests queue. A command is written to
//! the shell's stdin wrapped between markers that carry a fresh random token:
//!
//! ```text
//! printf '%s\n' 'T:b'; printf '%s\n' 'T:b' >&2
//! <save and export the request's env>
//! [if command cd -- CWD; then] command eval 'BODY' < STDIN_FILE_OR_/dev/null
//! (with a cwd: back to the previous directory after, unless BODY moved)
//! __sandhost_rc=$?
//! <restore env>
//! printf '\n%s %d\n' 'T:e' "$__sandhost_rc"; printf '\n%s\n' 'T:e' >&2
//! ```
//!
//! Output before the begin marker (left over from background jobs) is
//! dropped; output between the markers is streamed as it comes (holding back
//! only what could be the start of the end marker); the command is done when
//! both end markers arrived, the exit code is the one printed in stdout's.
//! `command eval` keeps a syntax error or a failing special builtin from
//! exiting the shell. `BODY` is the script of `sh -c SCRIPT` (so `cd` and
//! `export` act on the session) or else the quoted argv.
//!
//! Timeout (or the client going away): SIGTERM to every process of the
//! shell's process group except the shell, SIGKILL after the grace; the shell
//! then prints its end marker and stays. If it does not within
//! [`ABANDON_AFTER`] (the shell itself is busy, e.g. a builtin loop), the
//! whole group is killed and the result says `session_ended`; the next
//! command starts a fresh shell and says `session_started`.
use std::collections::VecDeque;
use std::ffi::CString;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::{
    child, exec_failure, resolve, ChildSetup, ChildStdio, Server, Tag, DEFAULT_PATH, LINGER,
    READ_CHUNK,
};
use crate::proto::{self, ExecDone, ExecSpec};
use crate::sys::{self, ChildStatus};

/// How long after the SIGKILL of its children the shell may take to print
/// its end marker before the whole session is killed.
const ABANDON_AFTER: Duration = Duration::from_secs(1);
/// Where stdin of session commands is staged (inside the sandbox).
const STDIN_DIR: &str = "/tmp/.sandhost-session";

struct Shell {
    pid: i32,
    stdin: Option<File>,
    out: [Option<File>; 2],
    wbuf: Vec<u8>,
    status: Option<ChildStatus>,
    exited_at: Option<Instant>,
}

struct Queued {
    conn: usize,
    spec: ExecSpec,
    stdin: Vec<u8>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Before,
    In,
    After,
}

struct Cmd {
    conn: usize,
    begin: Vec<u8>,
    end: Vec<u8>,
    phase: [Phase; 2],
    buf: [Vec<u8>; 2],
    rc: Option<i32>,
    cap: u64,
    sent: [u64; 2],
    dropped: [u64; 2],
    deadline: Option<Instant>,
    grace: Duration,
    kill_at: Option<Instant>,
    abandon_at: Option<Instant>,
    timed_out: bool,
    started: Instant,
    session_started: bool,
    stdin_file: Option<PathBuf>,
}

/// The session state the init keeps.
#[derive(Default)]
pub(super) struct Session {
    shell: Option<Shell>,
    queue: VecDeque<Queued>,
    cur: Option<Cmd>,
}

impl Session {
    pub(super) fn add_fds(&self, add: &mut impl FnMut(i32, i16, Tag)) {
        let Some(sh) = &self.shell else { return };
        for (s, f) in sh.out.iter().enumerate() {
            if let Some(f) = f {
                add(f.as_raw_fd(), sys::POLLIN, Tag::Session(s));
            }
        }
        if let Some(f) = sh.stdin.as_ref().filter(|_| !sh.wbuf.is_empty()) {
            add(f.as_raw_fd(), sys::POLLOUT, Tag::Session(2));
        }
    }

    pub(super) fn next_timer(&self) -> Option<Instant> {
        let linger = self
            .shell
            .as_ref()
            .and_then(|s| s.exited_at)
            .map(|t| t + LINGER);
        let cmd = self.cur.as_ref().map(|c| {
            let deadline = c.deadline.filter(|_| !c.timed_out);
            [deadline, c.kill_at, c.abandon_at]
        });
        cmd.into_iter().flatten().chain([linger]).flatten().min()
    }

    pub(super) fn reaped(&mut self, pid: i32, st: ChildStatus) {
        if let Some(sh) = self.shell.as_mut().filter(|s| s.pid == pid) {
            sh.status = Some(st);
            sh.exited_at = Some(Instant::now());
        }
    }
}

/// Quote one word for a POSIX shell.
fn sq(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn valid_name(k: &str) -> bool {
    let mut b = k.bytes();
    b.next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

fn token() -> String {
    let mut buf = [0u8; 12];
    let ok = File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut buf));
    if ok.is_err() {
        // Never reached in practice (/dev/urandom is bound in); a clock-based
        // token still separates consecutive commands.
        let t = Instant::now().elapsed().as_nanos() ^ u128::from(std::process::id());
        buf.copy_from_slice(&t.to_le_bytes()[..12]);
    }
    let hex: String = buf.iter().map(|b| format!("{b:02x}")).collect();
    format!("sandhost-{hex}")
}

/// Pids (in our pid namespace) whose process group is `pgid`, except `pgid` itself.
fn group_members(pgid: i32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != pgid && pid != 1)
        .filter(|&pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            let Some(close) = stat.rfind(')') else {
                return false;
            };
            // after "(comm) ": state ppid pgrp ...
            stat[close + 2..].split(' ').nth(2) == Some(pgid.to_string().as_str())
        })
        .collect()
}

/// The length of the longest suffix of `buf` that is a proper prefix of `marker`.
fn partial_suffix(buf: &[u8], marker: &[u8]) -> usize {
    let max = marker.len().saturating_sub(1).min(buf.len());
    (1..=max)
        .rev()
        .find(|&l| buf.ends_with(&marker[..l]))
        .unwrap_or(0)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The script sent to the shell for one command (see the module docs).
fn wrap(spec: &ExecSpec, t: &str, stdin_src: &str) -> Result<String, String> {
    let body = match spec.argv.as_slice() {
        [sh, c, script] if (sh == "sh" || sh == "/bin/sh") && c == "-c" => script.clone(),
        argv => argv.iter().map(|a| sq(a)).collect::<Vec<_>>().join(" "),
    };
    let mut save = String::new();
    let mut restore = String::new();
    for (i, (k, v)) in spec.env.iter().enumerate() {
        if !valid_name(k) {
            return Err(format!("invalid environment variable name {k:?}"));
        }
        save.push_str(&format!(
            "__sandhost_s{i}=${{{k}+x}}; __sandhost_v{i}=${{{k}-}}; export {k}={}\n",
            sq(v)
        ));
        restore.push_str(&format!(
            "if [ -n \"$__sandhost_s{i}\" ]; then {k}=$__sandhost_v{i}; else unset {k}; fi; unset __sandhost_s{i} __sandhost_v{i}\n"
        ));
    }
    let run = format!("command eval {} < {}", sq(&body), sq(stdin_src));
    // An explicit cwd holds for this command only: the shell goes back
    // afterwards unless the command itself changed directory.
    let run = if spec.cwd.is_empty() {
        format!("{run}\n__sandhost_rc=$?\n")
    } else {
        format!(
            "__sandhost_old=$PWD\n\
             if command cd -- {cwd}; then __sandhost_new=$PWD; {run}\n\
             __sandhost_rc=$?; if [ \"$PWD\" = \"$__sandhost_new\" ]; then command cd -- \"$__sandhost_old\"; fi\n\
             else __sandhost_rc=$?; fi\nunset __sandhost_old __sandhost_new\n",
            cwd = sq(&spec.cwd)
        )
    };
    Ok(format!(
        "printf '%s\\n' '{t}:b'; printf '%s\\n' '{t}:b' >&2\n\
         {save}{run}\
         {restore}printf '\\n%s %d\\n' '{t}:e' \"$__sandhost_rc\"; printf '\\n%s\\n' '{t}:e' >&2\n",
    ))
}

impl Server {
    pub(super) fn session_request(&mut self, conn: usize, spec: ExecSpec, stdin: Vec<u8>) {
        if spec.stdin_stream {
            return self.fail(
                conn,
                "invalid",
                "session commands take their stdin in one piece".into(),
            );
        }
        if spec.argv.is_empty() {
            return self.fail(conn, "invalid", "empty argv".into());
        }
        if let Some(Some(c)) = self.conns.get_mut(conn) {
            c.busy = true;
        }
        self.session.queue.push_back(Queued { conn, spec, stdin });
    }

    pub(super) fn session_conn_closed(&mut self, conn: usize) {
        self.session.queue.retain(|q| q.conn != conn);
        let pgid = self.session.shell.as_ref().map(|s| s.pid);
        if let (Some(c), Some(pgid)) = (self.session.cur.as_mut(), pgid) {
            if c.conn == conn && c.abandon_at.is_none() {
                for pid in group_members(pgid) {
                    let _ = sys::kill(pid, sys::SIGKILL);
                }
                c.kill_at = None;
                c.abandon_at = Some(Instant::now() + ABANDON_AFTER);
            }
        }
    }

    pub(super) fn session_timers(&mut self, now: Instant) {
        let Some(pgid) = self.session.shell.as_ref().map(|s| s.pid) else {
            return;
        };
        let Some(c) = self.session.cur.as_mut() else {
            return;
        };
        if let Some(d) = c.deadline {
            if now >= d && !c.timed_out {
                c.timed_out = true;
                for pid in group_members(pgid) {
                    let _ = sys::kill(pid, sys::SIGTERM);
                }
                c.kill_at = Some(now + c.grace);
            }
        }
        if c.kill_at.is_some_and(|k| now >= k) {
            for pid in group_members(pgid) {
                let _ = sys::kill(pid, sys::SIGKILL);
            }
            c.kill_at = None;
            c.abandon_at = Some(now + ABANDON_AFTER);
        }
        if c.abandon_at.is_some_and(|a| now >= a) {
            c.abandon_at = None;
            let _ = sys::kill(-pgid, sys::SIGKILL);
            let _ = sys::kill(pgid, sys::SIGKILL);
        }
    }

    pub(super) fn session_io(&mut self, k: usize) {
        let Some(sh) = self.session.shell.as_mut() else {
            return;
        };
        if k == 2 {
            let Some(f) = sh.stdin.as_mut() else { return };
            match f.write(&sh.wbuf) {
                Ok(n) => {
                    sh.wbuf.drain(..n);
                }
                Err(e)
                    if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    sh.stdin = None;
                    sh.wbuf.clear();
                }
            }
            return;
        }
        let mut buf = vec![0u8; READ_CHUNK];
        let Some(f) = sh.out[k].as_mut() else { return };
        let n = match f.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted || e.kind() == ErrorKind::WouldBlock => {
                return
            }
            Err(_) => 0,
        };
        if n == 0 {
            sh.out[k] = None;
            return;
        }
        let Some(c) = self.session.cur.as_mut() else {
            return; // idle: output of background jobs goes nowhere
        };
        c.buf[k].extend_from_slice(&buf[..n]);
        self.session_scan(k);
    }

    /// Move what is known to be command output from the stream's buffer to
    /// the client, advancing over the markers.
    fn session_scan(&mut self, k: usize) {
        let Some(c) = self.session.cur.as_mut() else {
            return;
        };
        let mut emit = vec![];
        if c.phase[k] == Phase::Before {
            match find(&c.buf[k], &c.begin) {
                Some(p) => {
                    c.buf[k].drain(..p + c.begin.len());
                    c.phase[k] = Phase::In;
                }
                None => {
                    let keep = c.begin.len().saturating_sub(1).min(c.buf[k].len());
                    let cut = c.buf[k].len() - keep;
                    c.buf[k].drain(..cut);
                }
            }
        }
        if c.phase[k] == Phase::In {
            match find(&c.buf[k], &c.end) {
                Some(p) => {
                    let tail = &c.buf[k][p + c.end.len()..];
                    let done = if k == 0 {
                        // stdout's end marker is followed by " RC\n"
                        tail.iter().position(|&b| b == b'\n').map(|nl| {
                            let rc = String::from_utf8_lossy(&tail[..nl]);
                            c.rc = rc.trim().parse().ok();
                        })
                    } else {
                        Some(())
                    };
                    emit = c.buf[k][..p].to_vec();
                    c.buf[k].drain(..p);
                    if done.is_some() {
                        c.phase[k] = Phase::After;
                        c.buf[k].clear();
                    }
                }
                None => {
                    // hold back only what could be the start of the end marker
                    let keep = partial_suffix(&c.buf[k], &c.end);
                    let cut = c.buf[k].len() - keep;
                    emit = c.buf[k].drain(..cut).collect();
                }
            }
        }
        if c.phase[k] == Phase::After {
            c.buf[k].clear();
        }
        self.session_emit(k, &emit);
    }

    fn session_emit(&mut self, k: usize, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let Some(c) = self.session.cur.as_mut() else {
            return;
        };
        let room = c.cap.saturating_sub(c.sent[k]) as usize;
        let keep = data.len().min(room);
        c.sent[k] += keep as u64;
        c.dropped[k] += (data.len() - keep) as u64;
        let conn = c.conn;
        if keep > 0 {
            let kind = if k == 0 { proto::STDOUT } else { proto::STDERR };
            self.send(conn, kind, &data[..keep]);
        }
    }

    /// Finish the running command when its markers arrived or the shell
    /// ended; start the next queued one.
    pub(super) fn session_progress(&mut self, now: Instant) {
        let shell_gone = self.session.shell.as_ref().is_some_and(|s| {
            s.status.is_some()
                && (s.out.iter().all(Option::is_none)
                    || s.exited_at.is_some_and(|t| now >= t + LINGER))
        });
        if let Some(c) = self.session.cur.as_ref() {
            let finished = c.phase.iter().all(|p| *p == Phase::After);
            if finished || shell_gone {
                self.session_finish(shell_gone);
            }
        }
        if shell_gone {
            self.session.shell = None;
        }
        if self.session.cur.is_none() {
            if let Some(q) = self.session.queue.pop_front() {
                self.session_start(q);
            }
        }
    }

    fn session_finish(&mut self, ended: bool) {
        if ended {
            // what the command printed before the shell died is still its output
            for k in 0..2 {
                if self
                    .session
                    .cur
                    .as_ref()
                    .is_some_and(|c| c.phase[k] == Phase::In)
                {
                    let rest = self
                        .session
                        .cur
                        .as_mut()
                        .map(|c| std::mem::take(&mut c.buf[k]))
                        .unwrap_or_default();
                    self.session_emit(k, &rest);
                }
            }
        }
        let Some(c) = self.session.cur.take() else {
            return;
        };
        if let Some(p) = &c.stdin_file {
            let _ = std::fs::remove_file(p);
        }
        let (mut exit_code, mut signal) = (c.rc, None);
        if ended && c.rc.is_none() {
            match self.session.shell.as_ref().and_then(|s| s.status) {
                Some(ChildStatus::Exited(code)) => exit_code = Some(code),
                Some(ChildStatus::Signaled(s)) => signal = Some(s),
                None => {}
            }
        }
        // A command the shell reports as killed by a signal after a timeout
        // is reported like a one-shot one: by its signal.
        if c.timed_out {
            if let Some(rc) = exit_code.filter(|rc| *rc > 128 && *rc < 160) {
                exit_code = None;
                signal = Some(rc - 128);
            }
        }
        let done = ExecDone {
            exit_code,
            signal,
            timed_out: c.timed_out,
            stdout_dropped: c.dropped[0],
            stderr_dropped: c.dropped[1],
            duration_us: c.started.elapsed().as_micros() as u64,
            session_started: c.session_started,
            session_ended: ended,
        };
        self.send_json(c.conn, proto::RESULT, &done);
        if let Some(Some(conn)) = self.conns.get_mut(c.conn) {
            conn.busy = false;
        }
    }

    fn session_start(&mut self, q: Queued) {
        let mut session_started = false;
        if self.session.shell.is_none() {
            match self.spawn_shell() {
                Ok(sh) => {
                    self.session.shell = Some(sh);
                    session_started = true;
                }
                Err(e) => return self.session_refuse(q.conn, "spawn", e),
            }
        }
        let t = token();
        let stdin_file = if q.stdin.is_empty() {
            None
        } else {
            match stage_stdin(&t, &q.stdin) {
                Ok(p) => Some(p),
                Err(e) => return self.session_refuse(q.conn, "spawn", e),
            }
        };
        let src = stdin_file
            .as_ref()
            .map_or("/dev/null".to_string(), |p| p.display().to_string());
        let script = match wrap(&q.spec, &t, &src) {
            Ok(s) => s,
            Err(e) => {
                if let Some(p) = &stdin_file {
                    let _ = std::fs::remove_file(p);
                }
                return self.session_refuse(q.conn, "invalid", e);
            }
        };
        let now = Instant::now();
        if let Some(sh) = self.session.shell.as_mut() {
            sh.wbuf.extend_from_slice(script.as_bytes());
        }
        self.session.cur = Some(Cmd {
            conn: q.conn,
            begin: format!("{t}:b\n").into_bytes(),
            end: format!("\n{t}:e").into_bytes(),
            phase: [Phase::Before; 2],
            buf: [vec![], vec![]],
            rc: None,
            cap: q.spec.max_output,
            sent: [0; 2],
            dropped: [0; 2],
            deadline: q.spec.timeout_ms.map(|t| now + Duration::from_millis(t)),
            grace: Duration::from_millis(q.spec.grace_ms),
            kill_at: None,
            abandon_at: None,
            timed_out: false,
            started: now,
            session_started,
            stdin_file,
        });
    }

    fn session_refuse(&mut self, conn: usize, code: &str, msg: String) {
        self.fail(conn, code, msg);
        if let Some(Some(c)) = self.conns.get_mut(conn) {
            c.busy = false;
        }
    }

    fn spawn_shell(&mut self) -> Result<Shell, String> {
        let env = [
            ("PATH", DEFAULT_PATH.to_string()),
            ("HOME", "/workspace".to_string()),
            ("LANG", "C.UTF-8".to_string()),
            ("HOSTNAME", self.cfg.hostname.clone()),
        ];
        let prog = resolve("sh", DEFAULT_PATH).ok_or("no sh in the sandbox")?;
        let prog_c =
            CString::new(prog.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
        let argv = [CString::new("sh").map_err(|e| e.to_string())?];
        let envp = env
            .iter()
            .map(|(k, v)| CString::new(format!("{k}={v}")))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let cwd = CString::new("/workspace").map_err(|e| e.to_string())?;
        let io = |e: std::io::Error| format!("pipe: {e}");
        let (in_r, in_w) = sys::pipe().map_err(io)?;
        let (out_r, out_w) = sys::pipe().map_err(io)?;
        let (err_r, err_w) = sys::pipe().map_err(io)?;
        let (fail_r, fail_w) = sys::pipe().map_err(io)?;
        let pid = sys::fork().map_err(|e| format!("fork: {e}"))?;
        if pid == 0 {
            child(ChildSetup {
                stdio: ChildStdio::Pipes([in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()]),
                fail: fail_w.as_raw_fd(),
                nofile: self.cfg.nofile,
                fsize: self.cfg.fsize,
                cwd: &cwd,
                prog: &prog_c,
                argv: &argv,
                envp: &envp,
            });
        }
        drop((in_r, out_w, err_w, fail_w));
        if let Some(err) = exec_failure(fail_r) {
            let _ = sys::wait_pid(pid);
            return Err(format!("cannot start the session shell: {err}"));
        }
        let _ = sys::set_nonblocking(in_w.as_fd(), true);
        Ok(Shell {
            pid,
            stdin: Some(File::from(in_w)),
            out: [Some(File::from(out_r)), Some(File::from(err_r))],
            wbuf: vec![],
            status: None,
            exited_at: None,
        })
    }
}

/// Write a session command's stdin to a private file the command reads.
fn stage_stdin(t: &str, data: &[u8]) -> Result<PathBuf, String> {
    let _ = std::fs::DirBuilder::new().mode(0o700).create(STDIN_DIR);
    let p = PathBuf::from(STDIN_DIR).join(format!("stdin-{t}"));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&p)
        .map_err(|e| format!("stage stdin: {e}"))?;
    f.write_all(data).map_err(|e| {
        let _ = std::fs::remove_file(&p);
        format!("stage stdin: {e}")
    })?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(argv: &[&str], cwd: &str, env: &[(&str, &str)]) -> ExecSpec {
        ExecSpec {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            cwd: cwd.into(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            timeout_ms: None,
            grace_ms: 0,
            max_output: 0,
            stdin_stream: false,
        }
    }

    #[test]
    fn wrapped_sh_c_scripts_run_in_the_session_shell_and_argv_is_quoted() {
        let w = wrap(
            &spec(&["sh", "-c", "cd /tmp; export A=1"], "", &[]),
            "T",
            "/dev/null",
        )
        .unwrap();
        assert!(
            w.contains("command eval 'cd /tmp; export A=1' < '/dev/null'"),
            "{w}"
        );
        let w = wrap(&spec(&["echo", "it's"], "/w d", &[]), "T", "/dev/null").unwrap();
        assert!(
            w.contains(
                "if command cd -- '/w d'; then __sandhost_new=$PWD; command eval ''\\''echo'\\'' "
            ),
            "{w}"
        );
        assert!(wrap(&spec(&["true"], "", &[("A-B", "1")]), "T", "x").is_err());
    }

    #[test]
    fn wrapped_command_prints_markers_and_keeps_state_in_a_real_shell() {
        let t = "tok";
        let mut script = wrap(
            &spec(
                &["sh", "-c", "cd /; export Q=7; echo hi"],
                "",
                &[("E", "x y")],
            ),
            t,
            "/dev/null",
        )
        .unwrap();
        script.push_str(
            &wrap(
                &spec(
                    &[
                        "sh",
                        "-c",
                        "echo $PWD $Q ${E-unset}; exit_ok() { return 3; }; exit_ok",
                    ],
                    "",
                    &[],
                ),
                t,
                "/dev/null",
            )
            .unwrap(),
        );
        script.push_str(&wrap(&spec(&["sh", "-c", "if"], "", &[]), t, "/dev/null").unwrap());
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        let s = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            s,
            "tok:b\nhi\n\ntok:e 0\ntok:b\n/ 7 unset\n\ntok:e 3\ntok:b\n\ntok:e 2\n"
        );
    }

    #[test]
    fn only_a_possible_marker_start_is_held_back() {
        assert_eq!(partial_suffix(b"first\n", b"\nT:e"), 1);
        assert_eq!(partial_suffix(b"first\nT:", b"\nT:e"), 3);
        assert_eq!(partial_suffix(b"first", b"\nT:e"), 0);
        assert_eq!(partial_suffix(b"", b"\nT:e"), 0);
    }

    #[test]
    fn env_names_must_be_shell_identifiers() {
        assert!(valid_name("A_1") && valid_name("_x"));
        assert!(!valid_name("1A") && !valid_name("") && !valid_name("A=B"));
    }
}
