//! The `sandhost-init` program: stage A runs on the host (as root, in the host
//! namespaces, a fresh single-threaded process), joins the cgroups, binds the
//! control socket, and clones stage B into new namespaces; stage B builds the
//! root, drops every privilege and becomes PID 1 of the sandbox, serving the
//! control socket (see `server`). Stage A then exits, so the sandbox outlives
//! whoever created it.
use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::sys;

mod duplex;
mod rootfs;
mod server;

/// Everything stage A needs, sent as JSON on its stdin by the host library.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct InitConfig {
    pub id: String,
    pub nonce: String,
    pub socket_path: PathBuf,
    pub log_path: PathBuf,
    pub cgroup_procs: Vec<PathBuf>,
    pub uid_base: u32,
    pub uid_count: u32,
    /// A root filesystem directory; `None` = the host's /usr, /bin, /lib*, /sbin.
    pub rootfs: Option<PathBuf>,
    pub hostname: String,
    pub tmp_bytes: u64,
    pub workspace_bytes: u64,
    pub inodes: u64,
    pub nofile: u64,
    pub fsize: u64,
}

/// Entry point of the `sandhost-init` binary.
pub fn main() -> ! {
    match stage_a() {
        Ok(pid) => {
            println!("ok {pid}");
            std::process::exit(0)
        }
        Err(e) => {
            println!("err {}", e.replace('\n', " "));
            std::process::exit(1)
        }
    }
}

fn stage_a() -> Result<i32, String> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .map_err(|e| format!("read config: {e}"))?;
    let cfg: InitConfig = serde_json::from_str(&input).map_err(|e| format!("parse config: {e}"))?;
    // Leave the caller's session and process group: the sandbox must not die
    // with the caller's terminal.
    sys::setsid().map_err(|e| format!("setsid: {e}"))?;
    // Host root's supplementary groups (gid 0...) must not follow us inside.
    sys::clear_groups().map_err(|e| format!("setgroups: {e}"))?;
    let me = std::process::id().to_string();
    for p in &cfg.cgroup_procs {
        fs::write(p, &me).map_err(|e| format!("join cgroup {}: {e}", p.display()))?;
    }
    let _ = fs::remove_file(&cfg.socket_path);
    let listener = UnixListener::bind(&cfg.socket_path)
        .map_err(|e| format!("bind {}: {e}", cfg.socket_path.display()))?;
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&cfg.log_path)
        .map_err(|e| format!("open log: {e}"))?;
    let (p2c_r, p2c_w) = sys::pipe().map_err(|e| format!("pipe: {e}"))?;
    let (c2p_r, c2p_w) = sys::pipe().map_err(|e| format!("pipe: {e}"))?;

    let pid = sys::clone_into_namespaces(sys::NS_ALL).map_err(|e| format!("clone: {e}"))?;
    if pid == 0 {
        drop(p2c_w);
        drop(c2p_r);
        stage_b(cfg, listener, OwnedFd::from(log), p2c_r, c2p_w)
    }
    drop(p2c_r);
    drop(c2p_w);
    let fail = |msg: String| {
        let _ = sys::kill(pid, sys::SIGKILL);
        let _ = sys::wait_pid(pid);
        msg
    };
    let map = format!("0 {} {}\n", cfg.uid_base, cfg.uid_count);
    fs::write(format!("/proc/{pid}/uid_map"), &map).map_err(|e| fail(format!("uid_map: {e}")))?;
    fs::write(format!("/proc/{pid}/setgroups"), "deny")
        .map_err(|e| fail(format!("setgroups: {e}")))?;
    fs::write(format!("/proc/{pid}/gid_map"), &map).map_err(|e| fail(format!("gid_map: {e}")))?;
    let mut w = fs::File::from(p2c_w);
    w.write_all(b"g").map_err(|e| fail(format!("sync: {e}")))?;
    drop(w);
    let mut answer = String::new();
    let _ = fs::File::from(c2p_r).read_to_string(&mut answer);
    if answer.starts_with("ok") {
        Ok(pid)
    } else if answer.is_empty() {
        Err(fail("init died during setup".into()))
    } else {
        Err(fail(answer.trim_start_matches("err ").trim().to_string()))
    }
}

fn stage_b(cfg: InitConfig, listener: UnixListener, log: OwnedFd, p2c: OwnedFd, c2p: OwnedFd) -> ! {
    let mut go = [0u8; 1];
    if !matches!(fs::File::from(p2c).read(&mut go), Ok(1)) {
        sys::exit_now(1);
    }
    let mut report = fs::File::from(c2p);
    match setup(&cfg, &listener, &log, report.as_raw_fd()) {
        Ok(sigfd) => {
            let _ = report.write_all(b"ok\n");
            drop(report);
            drop(log);
            server::Server::new(cfg, listener, sigfd).run()
        }
        Err(e) => {
            let _ = report.write_all(format!("err {e}\n").as_bytes());
            sys::exit_now(1)
        }
    }
}

/// Everything between "the uid map is written" and "ready to serve", in the
/// order of SECURITY.md.
fn setup(
    cfg: &InitConfig,
    listener: &UnixListener,
    log: &OwnedFd,
    report_fd: i32,
) -> Result<OwnedFd, String> {
    sys::setresuid_root().map_err(|e| format!("setresuid: {e}"))?;
    rootfs::build(cfg)?;
    sys::sethostname(&cfg.hostname).map_err(|e| format!("sethostname: {e}"))?;
    sys::loopback_up().map_err(|e| format!("lo up: {e}"))?;

    // stdio: /dev/null in, /dev/null out, the log file as stderr.
    let null = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| format!("open /dev/null: {e}"))?;
    sys::dup2(null.as_raw_fd(), 0).map_err(|e| format!("dup2: {e}"))?;
    sys::dup2(null.as_raw_fd(), 1).map_err(|e| format!("dup2: {e}"))?;
    sys::dup2(log.as_raw_fd(), 2).map_err(|e| format!("dup2: {e}"))?;
    drop(null);
    sys::close_fds_except(&[listener.as_raw_fd(), report_fd, log.as_fd().as_raw_fd()])
        .map_err(|e| format!("close fds: {e}"))?;
    let sigfd = sys::sigchld_fd().map_err(|e| format!("signalfd: {e}"))?;
    sys::ignore_sigpipe();
    sys::set_dumpable(false).map_err(|e| format!("dumpable: {e}"))?;
    sys::drop_all_capabilities().map_err(|e| format!("drop capabilities: {e}"))?;
    sys::set_no_new_privs().map_err(|e| format!("no_new_privs: {e}"))?;
    crate::seccomp::install()?;
    Ok(sigfd)
}
