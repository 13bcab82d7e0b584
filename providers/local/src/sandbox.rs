//! The host-side handle of a sandbox.
use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cgroup::{Layout, Limits, SandboxCgroup};
use crate::config::{ExecRequest, ExecResult, SandboxConfig, SandboxStatus, Stream};
use crate::duplex::{PtyChannel, PtyRequest, TcpChannel};
use crate::error::{IoContext, LocalError};
use crate::init::InitConfig;
use crate::proto::{self, ExecDone, ExecSpec, Fail, Hello, Status};
use crate::sys;

const STATE_FILE: &str = "state.json";
const SOCKET: &str = "control.sock";

/// What the state directory remembers about a sandbox.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct State {
    id: String,
    nonce: String,
    init_pid: i32,
    init_start_time: u64,
    cgroup: SandboxCgroup,
}

/// A live sandbox. Dropping the handle leaves the sandbox running; call
/// [`LocalSandbox::destroy`] to tear it down.
#[derive(Debug)]
pub struct LocalSandbox {
    state_dir: PathBuf,
    state: State,
}

fn random_hex(bytes: usize) -> Result<String, LocalError> {
    let mut buf = vec![0u8; bytes];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .ctx(|| "read /dev/urandom".into())?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Start time (in clock ticks since boot) of a host pid: with the pid it
/// identifies one process for good.
fn start_time(pid: i32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(19)?.parse().ok()
}

/// Locate the `sandhost-init` binary.
pub(crate) fn find_init(explicit: Option<&Path>) -> Result<PathBuf, LocalError> {
    if let Some(p) = explicit {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(LocalError::InitBinaryNotFound(p.display().to_string()))
        };
    }
    if let Some(p) = std::env::var_os("SANDHOST_INIT") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
    }
    let exe = std::env::current_exe().ctx(|| "current_exe".into())?;
    let mut dir = exe.parent();
    for _ in 0..2 {
        let Some(d) = dir else { break };
        let c = d.join("sandhost-init");
        if c.is_file() {
            return Ok(c);
        }
        dir = d.parent();
    }
    Err(LocalError::InitBinaryNotFound(
        "set SandboxConfig::init_binary or SANDHOST_INIT".into(),
    ))
}

/// A sealed in-memory copy of the init binary, made once per process: the
/// sandbox's PID 1 never runs from a host file it could try to overwrite.
fn init_memfd(path: &Path) -> Result<&'static OwnedFd, LocalError> {
    static MEMFD: OnceLock<(PathBuf, OwnedFd)> = OnceLock::new();
    if let Some((p, fd)) = MEMFD.get() {
        if p == path {
            return Ok(fd);
        }
    }
    let bytes = fs::read(path).ctx(|| format!("read {}", path.display()))?;
    let fd = sys::sealed_memfd("sandhost-init", &bytes).ctx(|| "memfd".into())?;
    let _ = MEMFD.set((path.to_path_buf(), fd));
    match MEMFD.get() {
        Some((p, fd)) if p == path => Ok(fd),
        _ => Err(LocalError::InitBinaryNotFound(
            "init binary changed within one process".into(),
        )),
    }
}

impl LocalSandbox {
    /// Create and start a sandbox. Returns once its init is ready to serve.
    pub fn create(cfg: &SandboxConfig) -> Result<LocalSandbox, LocalError> {
        let id = match &cfg.id {
            Some(id) if valid_id(id) => id.clone(),
            Some(id) => {
                return Err(LocalError::InvalidConfig(format!(
                    "invalid sandbox id {id:?}"
                )))
            }
            None => random_hex(8)?,
        };
        if cfg.memory_bytes < (16 << 20) || cfg.pids_max < 2 || cfg.cpu_millis < 10 {
            return Err(LocalError::InvalidConfig(
                "limits too small (memory >= 16 MiB, pids >= 2, cpu >= 10 millis)".into(),
            ));
        }
        let init = find_init(cfg.init_binary.as_deref())?;
        let memfd = init_memfd(&init)?;
        let nonce = random_hex(16)?;
        fs::create_dir_all(&cfg.state_root)
            .ctx(|| format!("create {}", cfg.state_root.display()))?;
        let state_dir = cfg.state_root.join(&id);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&state_dir)
            .ctx(|| format!("create state dir {}", state_dir.display()))?;
        let cleanup_dir = |e: LocalError| {
            let _ = fs::remove_dir_all(&state_dir);
            e
        };
        let limits = Limits {
            memory_bytes: cfg.memory_bytes,
            pids: cfg.pids_max,
            cpu_millis: cfg.cpu_millis,
        };
        let cgroup = SandboxCgroup::create(&Layout::detect(), &id, limits).map_err(cleanup_dir)?;
        let cleanup = |e: LocalError| {
            cgroup.remove(Duration::from_secs(2));
            let _ = fs::remove_dir_all(&state_dir);
            e
        };
        let init_cfg = InitConfig {
            id: id.clone(),
            nonce: nonce.clone(),
            socket_path: state_dir.join(SOCKET),
            log_path: state_dir.join("init.log"),
            cgroup_procs: cgroup.procs_files(),
            uid_base: cfg.uid_base,
            uid_count: cfg.uid_count,
            rootfs: cfg.rootfs.clone(),
            hostname: cfg.hostname.clone(),
            tmp_bytes: cfg.tmp_bytes,
            workspace_bytes: cfg.workspace_bytes,
            inodes: cfg.inodes,
            nofile: cfg.nofile,
            fsize: cfg.max_file_bytes.unwrap_or(cfg.workspace_bytes),
        };
        let init_pid = spawn_init(memfd, &init_cfg).map_err(cleanup)?;
        let state = State {
            id,
            nonce,
            init_pid,
            init_start_time: start_time(init_pid).unwrap_or(0),
            cgroup: cgroup.clone(),
        };
        let json = serde_json::to_vec(&state).expect("serializable");
        fs::write(state_dir.join(STATE_FILE), json)
            .ctx(|| "write state".into())
            .map_err(|e| {
                let _ = sys::kill(init_pid, sys::SIGKILL);
                cleanup(e)
            })?;
        Ok(LocalSandbox { state_dir, state })
    }

    /// Reattach to a sandbox created by another process; verifies that the
    /// process answering the socket is the sandbox's own init.
    pub fn open(state_root: &Path, id: &str) -> Result<LocalSandbox, LocalError> {
        if !valid_id(id) {
            return Err(LocalError::InvalidConfig(format!(
                "invalid sandbox id {id:?}"
            )));
        }
        let state_dir = state_root.join(id);
        let bytes = fs::read(state_dir.join(STATE_FILE))
            .map_err(|_| LocalError::NotFound(id.to_string()))?;
        let state: State = serde_json::from_slice(&bytes)
            .map_err(|e| LocalError::Protocol(format!("corrupt state file: {e}")))?;
        if state.id != id {
            return Err(LocalError::IdentityMismatch(format!(
                "state file names {}",
                state.id
            )));
        }
        let sb = LocalSandbox { state_dir, state };
        drop(sb.connect()?);
        Ok(sb)
    }

    /// Load a sandbox's recorded state without talking to its init, for
    /// [`LocalSandbox::destroy`] of one whose init is gone or does not answer
    /// (destroy kills the recorded init only when its start time still
    /// matches). Not for running commands: that needs [`LocalSandbox::open`].
    pub fn open_stale(state_root: &Path, id: &str) -> Result<LocalSandbox, LocalError> {
        if !valid_id(id) {
            return Err(LocalError::InvalidConfig(format!(
                "invalid sandbox id {id:?}"
            )));
        }
        let state_dir = state_root.join(id);
        let bytes = fs::read(state_dir.join(STATE_FILE))
            .map_err(|_| LocalError::NotFound(id.to_string()))?;
        let state: State = serde_json::from_slice(&bytes)
            .map_err(|e| LocalError::Protocol(format!("corrupt state file: {e}")))?;
        if state.id != id {
            return Err(LocalError::IdentityMismatch(format!(
                "state file names {}",
                state.id
            )));
        }
        Ok(LocalSandbox { state_dir, state })
    }

    pub fn id(&self) -> &str {
        &self.state.id
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    /// Host pid of the sandbox's init (PID 1 inside).
    pub fn init_pid(&self) -> i32 {
        self.state.init_pid
    }

    /// Host pids currently in the sandbox's cgroups.
    pub fn host_pids(&self) -> Vec<i32> {
        self.state.cgroup.procs()
    }

    /// The cgroup directories of this sandbox.
    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        self.state
            .cgroup
            .dirs
            .iter()
            .map(|(_, d, _)| d.clone())
            .collect()
    }

    /// Tasks counted by the pids controller right now.
    pub fn pids_current(&self) -> u64 {
        self.state.cgroup.pids_current()
    }

    pub(crate) fn connect(&self) -> Result<UnixStream, LocalError> {
        let id = &self.state.id;
        let mut s = UnixStream::connect(self.state_dir.join(SOCKET))
            .map_err(|_| LocalError::Gone(id.clone()))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .ctx(|| "socket timeout".into())?;
        // SO_PEERCRED would name stage A (it called listen()), not the init,
        // so identity rests on the nonce: it lives in the root-only state dir
        // and only the init it was handed to can answer it.
        let (kind, payload) =
            proto::read_frame(&mut s).map_err(|_| LocalError::Gone(id.clone()))?;
        let hello: Hello = match kind {
            proto::HELLO => serde_json::from_slice(&payload)
                .map_err(|e| LocalError::Protocol(format!("bad hello: {e}")))?,
            k => {
                return Err(LocalError::Protocol(format!(
                    "expected hello, got frame {k}"
                )))
            }
        };
        if hello.id != *id || hello.nonce != self.state.nonce {
            return Err(LocalError::IdentityMismatch(format!(
                "init answered as sandbox {}",
                hello.id
            )));
        }
        s.set_read_timeout(None).ctx(|| "socket timeout".into())?;
        Ok(s)
    }

    /// Run one command; `on_chunk` sees output as it is produced.
    pub fn exec(
        &self,
        req: &ExecRequest,
        on_chunk: impl FnMut(Stream, &[u8]),
    ) -> Result<ExecResult, LocalError> {
        self.run(proto::EXEC, req, None, on_chunk)
    }

    /// Run one command whose stdin is produced while it runs: `feed` writes
    /// it (from another thread) and its end is the end of input. For inputs
    /// larger than a frame, e.g. a tar stream; `req.stdin` is sent first.
    /// When the command ends before reading everything, `feed`'s writes fail.
    pub fn exec_streaming(
        &self,
        req: &ExecRequest,
        feed: impl FnOnce(&mut dyn Write) -> std::io::Result<()> + Send,
        on_chunk: impl FnMut(Stream, &[u8]),
    ) -> Result<ExecResult, LocalError> {
        self.run(proto::EXEC, req, Some(Box::new(feed)), on_chunk)
    }

    /// Run one command in the sandbox's persistent session shell: its
    /// working directory and exported variables persist across calls, from
    /// any process. `req.cwd`, when set, holds for this command only (the shell
    /// returns afterwards unless the command itself changed directory);
    /// `req.env` applies to this command only. Commands queue: one at a time.
    /// [`ExecResult::session_started`] / [`ExecResult::session_ended`] say when
    /// the shell was (re)started or lost.
    pub fn session_exec(
        &self,
        req: &ExecRequest,
        on_chunk: impl FnMut(Stream, &[u8]),
    ) -> Result<ExecResult, LocalError> {
        self.run(proto::SESSION_EXEC, req, None, on_chunk)
    }

    #[allow(clippy::type_complexity)]
    fn run(
        &self,
        kind: u8,
        req: &ExecRequest,
        feed: Option<Box<dyn FnOnce(&mut dyn Write) -> std::io::Result<()> + Send + '_>>,
        mut on_chunk: impl FnMut(Stream, &[u8]),
    ) -> Result<ExecResult, LocalError> {
        if req.argv.is_empty() || req.argv[0].is_empty() {
            return Err(LocalError::InvalidRequest("empty argv".into()));
        }
        if req.argv.iter().any(|a| a.contains('\0')) {
            return Err(LocalError::InvalidRequest("NUL byte in argv".into()));
        }
        let cwd = match (&req.cwd, kind) {
            (Some(c), _) => c.clone(),
            // the session keeps its own directory
            (None, proto::SESSION_EXEC) => String::new(),
            (None, _) => "/workspace".into(),
        };
        if !cwd.is_empty() && !cwd.starts_with('/') {
            return Err(LocalError::InvalidRequest(format!(
                "cwd must be absolute: {cwd:?}"
            )));
        }
        let spec = ExecSpec {
            argv: req.argv.clone(),
            cwd,
            env: req.env.clone(),
            timeout_ms: req.timeout.map(|t| t.as_millis() as u64),
            grace_ms: req.kill_grace.as_millis() as u64,
            max_output: req.max_output_bytes,
            stdin_stream: feed.is_some(),
        };
        let cg = &self.state.cgroup;
        let (oom_before, pids_before) = (cg.oom_kills(), cg.pids_limited());
        let mut s = self.connect()?;
        let gone = |_| LocalError::Gone(self.state.id.clone());
        proto::write_frame(&mut s, kind, &proto::encode_exec(&spec, &req.stdin)).map_err(gone)?;
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            let writer = match feed {
                Some(feed) => {
                    let w = s.try_clone().ctx(|| "clone control socket".into())?;
                    let stop = &stop;
                    Some(scope.spawn(move || {
                        let mut fw = StdinFrames { s: w, stop };
                        let r = feed(&mut fw);
                        // end of input, also after a failed feed: the command
                        // must not wait forever
                        let _ = proto::write_frame(&mut fw.s, proto::STDIN, &[]);
                        r
                    }))
                }
                None => None,
            };
            let res = self.read_result(&mut s, &mut on_chunk);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let fed = writer.map(|w| w.join());
            let mut res = res?;
            if let Some(Ok(Err(e))) = fed {
                if !res.timed_out && res.exit_code == Some(0) {
                    return Err(LocalError::io("feed stdin", e));
                }
            }
            res.oom_killed = res.signal == Some(sys::SIGKILL) && cg.oom_kills() > oom_before;
            res.pids_limited = cg.pids_limited() > pids_before;
            Ok(res)
        })
    }

    fn read_result(
        &self,
        s: &mut UnixStream,
        on_chunk: &mut impl FnMut(Stream, &[u8]),
    ) -> Result<ExecResult, LocalError> {
        let gone = |_| LocalError::Gone(self.state.id.clone());
        let mut res = ExecResult::default();
        loop {
            let (kind, payload) = proto::read_frame(s).map_err(gone)?;
            match kind {
                proto::STDOUT => {
                    on_chunk(Stream::Stdout, &payload);
                    res.stdout.extend_from_slice(&payload);
                }
                proto::STDERR => {
                    on_chunk(Stream::Stderr, &payload);
                    res.stderr.extend_from_slice(&payload);
                }
                proto::RESULT => {
                    let d: ExecDone = serde_json::from_slice(&payload)
                        .map_err(|e| LocalError::Protocol(format!("bad result: {e}")))?;
                    res.exit_code = d.exit_code;
                    res.signal = d.signal;
                    res.timed_out = d.timed_out;
                    res.stdout_dropped = d.stdout_dropped;
                    res.stderr_dropped = d.stderr_dropped;
                    res.stdout_truncated = d.stdout_dropped > 0;
                    res.stderr_truncated = d.stderr_dropped > 0;
                    res.duration = Duration::from_micros(d.duration_us);
                    res.session_started = d.session_started;
                    res.session_ended = d.session_ended;
                    return Ok(res);
                }
                proto::FAIL => return Err(fail_to_error(&payload)),
                k => return Err(LocalError::Protocol(format!("unexpected frame {k}"))),
            }
        }
    }

    /// Run `req.argv` on a fresh pty inside the sandbox, in a new session
    /// with the pty as its controlling terminal; see [`PtyChannel`].
    pub fn open_pty(&self, req: &PtyRequest) -> Result<PtyChannel, LocalError> {
        PtyChannel::open(self, req)
    }

    /// A byte stream to `127.0.0.1:port` inside the sandbox's network
    /// namespace (E6032 when nothing accepts there); see [`TcpChannel`].
    pub fn connect_tcp(&self, port: u16) -> Result<TcpChannel, LocalError> {
        TcpChannel::open(self, port)
    }

    /// Another handle on the same sandbox (for a channel's out-of-band kill).
    pub(crate) fn handle(&self) -> LocalSandbox {
        LocalSandbox {
            state_dir: self.state_dir.clone(),
            state: self.state.clone(),
        }
    }

    /// SIGKILL every process of the sandbox except its init; returns how many there were.
    pub fn kill_all(&self) -> Result<u32, LocalError> {
        let mut s = self.connect()?;
        let gone = |_| LocalError::Gone(self.state.id.clone());
        proto::write_frame(&mut s, proto::KILL_ALL, &[]).map_err(gone)?;
        let (kind, payload) = proto::read_frame(&mut s).map_err(gone)?;
        match kind {
            proto::OK => Ok(String::from_utf8_lossy(&payload).parse().unwrap_or(0)),
            proto::FAIL => Err(fail_to_error(&payload)),
            k => Err(LocalError::Protocol(format!("unexpected frame {k}"))),
        }
    }

    pub fn status(&self) -> Result<SandboxStatus, LocalError> {
        let mut s = self.connect()?;
        let gone = |_| LocalError::Gone(self.state.id.clone());
        proto::write_frame(&mut s, proto::STATUS, &[]).map_err(gone)?;
        let (kind, payload) = proto::read_frame(&mut s).map_err(gone)?;
        match kind {
            proto::STATUS => {
                let st: Status = serde_json::from_slice(&payload)
                    .map_err(|e| LocalError::Protocol(format!("bad status: {e}")))?;
                Ok(SandboxStatus {
                    id: st.id,
                    processes: st.processes,
                    running_execs: st.running_execs,
                    uptime: Duration::from_millis(st.uptime_ms),
                })
            }
            proto::FAIL => Err(fail_to_error(&payload)),
            k => Err(LocalError::Protocol(format!("unexpected frame {k}"))),
        }
    }

    /// Kill every process (the init first: the kernel then kills its whole pid
    /// namespace; then whatever the cgroups still list), remove the cgroups and
    /// the state directory. Mounts vanish with the mount namespace.
    pub fn destroy(self) -> Result<(), LocalError> {
        let pid = self.state.init_pid;
        if let Ok(pidfd) = sys::pidfd_open(pid) {
            // The pidfd pins the process; the start time proves it is ours.
            if start_time(pid) == Some(self.state.init_start_time) {
                let _ = sys::pidfd_send_signal(pidfd.as_fd(), sys::SIGKILL);
                // A pidfd turns readable once the process has exited: wait for
                // that, not just for the cgroup to look empty (a task leaves
                // its cgroup before it has finished exiting).
                let mut fds = [sys::pollfd {
                    fd: pidfd.as_raw_fd(),
                    events: sys::POLLIN,
                    revents: 0,
                }];
                let _ = sys::poll(&mut fds, 5000);
            }
        }
        let removed = self.state.cgroup.remove(Duration::from_secs(5));
        let _ = fs::remove_file(self.state_dir.join(SOCKET));
        fs::remove_dir_all(&self.state_dir)
            .ctx(|| format!("remove {}", self.state_dir.display()))?;
        if !removed {
            return Err(LocalError::Cgroup("cgroup still busy after kill".into()));
        }
        Ok(())
    }
}

/// Writes stdin as `STDIN` frames; fails once the command has ended.
struct StdinFrames<'a> {
    s: UnixStream,
    stop: &'a std::sync::atomic::AtomicBool,
}

impl Write for StdinFrames<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the command has ended",
            ));
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let n = buf.len().min(256 << 10);
        proto::write_frame(&mut self.s, proto::STDIN, &buf[..n])?;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub(crate) fn fail_to_error(payload: &[u8]) -> LocalError {
    match serde_json::from_slice::<Fail>(payload) {
        Ok(f) => match f.code.as_str() {
            "not_found" | "spawn" => LocalError::Spawn(f.message),
            "invalid" => LocalError::InvalidRequest(f.message),
            _ => LocalError::Protocol(f.message),
        },
        Err(e) => LocalError::Protocol(format!("bad failure frame: {e}")),
    }
}

/// Run stage A of the init from the sealed memfd and wait for "ok <pid>".
fn spawn_init(memfd: &OwnedFd, cfg: &InitConfig) -> Result<i32, LocalError> {
    let path = format!("/proc/self/fd/{}", memfd.as_raw_fd());
    let mut child = Command::new(&path)
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ctx(|| "spawn sandhost-init".into())?;
    let json = serde_json::to_vec(cfg).expect("serializable");
    let mut stdin = child.stdin.take().expect("piped");
    let wrote = stdin.write_all(&json);
    drop(stdin);
    let mut out = String::new();
    let _ = child.stdout.take().expect("piped").read_to_string(&mut out);
    let _ = child.wait();
    wrote.ctx(|| "send init config".into())?;
    let line = out.lines().next().unwrap_or("").trim();
    if let Some(pid) = line.strip_prefix("ok ") {
        return pid
            .parse()
            .map_err(|_| LocalError::Protocol(format!("bad init answer {line:?}")));
    }
    let msg = line.strip_prefix("err ").unwrap_or(if line.is_empty() {
        "init exited without answer"
    } else {
        line
    });
    Err(LocalError::Setup(msg.to_string()))
}
