//! Public configuration and result types of the local provider.
use std::path::PathBuf;
use std::time::Duration;

/// How to build a sandbox. Defaults: 1 GiB memory (swap included), 512 pids,
/// 1 CPU, 1 GiB workspace, host /usr-based root.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Directory holding one state directory per sandbox.
    pub state_root: PathBuf,
    /// Sandbox id (`[A-Za-z0-9_-]{1,64}`); generated when `None`.
    pub id: Option<String>,
    /// Root filesystem directory; `None` binds the host's /usr, /bin, /lib*, /sbin read-only.
    pub rootfs: Option<PathBuf>,
    pub memory_bytes: u64,
    pub pids_max: u64,
    /// CPU quota in thousandths of a CPU (1000 = one core).
    pub cpu_millis: u64,
    pub workspace_bytes: u64,
    pub tmp_bytes: u64,
    /// Inode limit of /tmp and /workspace each.
    pub inodes: u64,
    /// RLIMIT_NOFILE of workloads.
    pub nofile: u64,
    /// RLIMIT_FSIZE of workloads; `None` = the workspace size.
    pub max_file_bytes: Option<u64>,
    /// First host uid/gid of the range that uid/gid 0.. inside map to.
    pub uid_base: u32,
    pub uid_count: u32,
    pub hostname: String,
    /// Path of the `sandhost-init` binary; `None` = `$SANDHOST_INIT`, then next
    /// to the current executable (or its parent directory).
    pub init_binary: Option<PathBuf>,
}

impl SandboxConfig {
    pub fn new(state_root: impl Into<PathBuf>) -> SandboxConfig {
        SandboxConfig {
            state_root: state_root.into(),
            id: None,
            rootfs: None,
            memory_bytes: 1 << 30,
            pids_max: 512,
            cpu_millis: 1000,
            workspace_bytes: 1 << 30,
            tmp_bytes: 256 << 20,
            inodes: 65536,
            nofile: 1024,
            max_file_bytes: None,
            uid_base: 100_000,
            uid_count: 65536,
            hostname: "sandbox".into(),
            init_binary: None,
        }
    }
}

/// One command to run in a sandbox.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    /// Program and arguments; the program is looked up in `PATH` when it has no `/`.
    pub argv: Vec<String>,
    /// Working directory inside the sandbox (default `/workspace`).
    pub cwd: Option<String>,
    /// Added to (and overriding) the default environment
    /// (PATH, HOME=/workspace, LANG=C.UTF-8, HOSTNAME).
    pub env: Vec<(String, String)>,
    pub stdin: Vec<u8>,
    /// SIGTERM to the command's process group after this, SIGKILL after `kill_grace`.
    pub timeout: Option<Duration>,
    pub kill_grace: Duration,
    /// Captured bytes per stream; the rest is drained and counted as dropped.
    pub max_output_bytes: u64,
}

impl ExecRequest {
    pub fn new<S: Into<String>>(argv: impl IntoIterator<Item = S>) -> ExecRequest {
        ExecRequest {
            argv: argv.into_iter().map(Into::into).collect(),
            cwd: None,
            env: vec![],
            stdin: vec![],
            timeout: None,
            kill_grace: Duration::from_secs(2),
            max_output_bytes: 1 << 20,
        }
    }

    /// `sh -c script`.
    pub fn shell(script: &str) -> ExecRequest {
        ExecRequest::new(["/bin/sh", "-c", script])
    }
}

/// Which output stream a chunk belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// The outcome of one command.
#[derive(Debug, Clone, Default)]
pub struct ExecResult {
    /// Exit code, when the command exited normally.
    pub exit_code: Option<i32>,
    /// Terminating signal, when it was killed.
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub stdout_dropped: u64,
    pub stderr_dropped: u64,
    /// The memory cgroup OOM-killed a process during this command and the command died of SIGKILL.
    pub oom_killed: bool,
    /// The pids limit refused at least one fork during this command.
    pub pids_limited: bool,
    pub duration: Duration,
    /// Session exec only: a new session shell was started for this command
    /// (first use, or the previous one ended: cwd and exports were reset).
    pub session_started: bool,
    /// Session exec only: the session shell ended during this command.
    pub session_ended: bool,
}

/// What the init reports about its sandbox.
#[derive(Debug, Clone)]
pub struct SandboxStatus {
    pub id: String,
    /// Processes in the sandbox besides its init.
    pub processes: u32,
    pub running_execs: u32,
    pub uptime: Duration,
}
