//! Isolation tests against the real kernel. They need root (the local
//! provider maps uid ranges and creates cgroups); without it they fail.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use std::path::Path;

use sandhost_provider_local::{ExecRequest, ExecResult, LocalSandbox, SandboxConfig, Severity};

/// These tests need root (CI runs as root). A host that cannot create
/// sandboxes fails them, with the probe's errors: a test must be able to fail.
fn can_run() -> bool {
    let errors: Vec<_> = sandhost_provider_local::probe()
        .into_iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    assert!(
        errors.is_empty(),
        "this host cannot create local sandboxes (run as root): {errors:?}"
    );
    true
}

fn state_root() -> PathBuf {
    let p = std::env::temp_dir().join(format!("sandhost-local-test-{}", std::process::id()));
    std::fs::create_dir_all(&p).unwrap();
    p
}

fn config() -> SandboxConfig {
    let mut c = SandboxConfig::new(state_root());
    c.init_binary = Some(PathBuf::from(env!("CARGO_BIN_EXE_sandhost-init")));
    c
}

/// Destroys its sandbox on drop, so a failing assertion strands nothing.
struct Sb(Option<LocalSandbox>);

impl Sb {
    fn create(c: &SandboxConfig) -> Sb {
        Sb(Some(LocalSandbox::create(c).unwrap()))
    }
    fn destroy(mut self) -> Result<(), sandhost_provider_local::LocalError> {
        self.0.take().unwrap().destroy()
    }
}

impl std::ops::Deref for Sb {
    type Target = LocalSandbox;
    fn deref(&self) -> &LocalSandbox {
        self.0.as_ref().unwrap()
    }
}

impl Drop for Sb {
    fn drop(&mut self) {
        if let Some(sb) = self.0.take() {
            let _ = sb.destroy();
        }
    }
}

fn sh(sb: &LocalSandbox, script: &str) -> ExecResult {
    let mut req = ExecRequest::shell(script);
    req.timeout = Some(Duration::from_secs(30));
    sb.exec(&req, |_, _| {}).unwrap()
}

fn out(r: &ExecResult) -> String {
    String::from_utf8_lossy(&r.stdout).into_owned()
}

macro_rules! need_root {
    () => {
        if !can_run() {
            return;
        }
    };
}

#[test]
fn echo_hi() {
    need_root!();
    let sb = Sb::create(&config());
    let mut chunks = vec![];
    let r = sb
        .exec(&ExecRequest::new(["echo", "hi"]), |s, b| {
            chunks.push((s, b.to_vec()))
        })
        .unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_eq!(r.stdout, b"hi\n");
    assert!(!chunks.is_empty());
    sb.destroy().unwrap();
}

/// errno of a raw system call made inside the sandbox (perl's `syscall`), or 0.
fn syscall_errno(sb: &LocalSandbox, call: &str) -> i32 {
    let r = sh(sb, &format!("perl -e '@a = ({call}); $n = shift @a; $r = syscall($n, @a); print $r == -1 ? $!+0 : 0'"));
    assert_eq!(r.exit_code, Some(0), "{call}: {r:?}");
    out(&r).trim().parse().unwrap()
}

fn assert_gone(pids: &[i32]) {
    for p in pids {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").trim().chars().next();
        assert!(
            matches!(state, None | Some('Z') | Some('X')),
            "pid {p} still alive: {stat}"
        );
    }
}

#[test]
fn exit_codes_and_signals() {
    need_root!();
    let sb = Sb::create(&config());
    assert_eq!(sh(&sb, "exit 3").exit_code, Some(3));
    let r = sh(&sb, "kill -TERM $$");
    assert_eq!((r.exit_code, r.signal), (None, Some(15)));
    let e = sb
        .exec(&ExecRequest::new(["no-such-command-xyz"]), |_, _| {})
        .unwrap_err();
    assert_eq!(e.code(), "E6031", "{e}");
    let mut req = ExecRequest::new(["pwd"]);
    req.cwd = Some("/nonexistent".into());
    assert_eq!(sb.exec(&req, |_, _| {}).unwrap_err().code(), "E6031");
    sb.destroy().unwrap();
}

#[test]
fn stdin_larger_than_a_pipe_is_fed() {
    need_root!();
    let sb = Sb::create(&config());
    let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    let mut req = ExecRequest::new(["cat"]);
    req.stdin = data.clone();
    let r = sb.exec(&req, |_, _| {}).unwrap();
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.stdout, data);
    sb.destroy().unwrap();
}

#[test]
fn output_streams_while_running() {
    need_root!();
    let sb = Sb::create(&config());
    let start = Instant::now();
    let mut first = None;
    let r = sb
        .exec(
            &ExecRequest::shell("echo a; sleep 0.5; echo b >&2"),
            |_, _| {
                first.get_or_insert(start.elapsed());
            },
        )
        .unwrap();
    assert!(first.unwrap() < Duration::from_millis(400), "{first:?}");
    assert_eq!(
        (r.stdout.as_slice(), r.stderr.as_slice()),
        (&b"a\n"[..], &b"b\n"[..])
    );
    sb.destroy().unwrap();
}

#[test]
fn timeout_kills_and_reports() {
    need_root!();
    let sb = Sb::create(&config());
    let mut req = ExecRequest::shell("sleep 30");
    req.timeout = Some(Duration::from_millis(300));
    let t = Instant::now();
    let r = sb.exec(&req, |_, _| {}).unwrap();
    assert!(r.timed_out);
    assert_eq!(r.signal, Some(15));
    assert!(t.elapsed() < Duration::from_secs(5));
    // SIGTERM ignored -> SIGKILL after the grace period.
    let mut req = ExecRequest::shell("trap '' TERM; sleep 30; echo survived");
    req.timeout = Some(Duration::from_millis(200));
    req.kill_grace = Duration::from_millis(300);
    let r = sb.exec(&req, |_, _| {}).unwrap();
    assert!(r.timed_out);
    assert_eq!(r.signal, Some(9), "{r:?}");
    assert!(!out(&r).contains("survived"));
    sb.destroy().unwrap();
}

#[test]
fn output_flood_is_capped_and_drained() {
    need_root!();
    let sb = Sb::create(&config());
    let mut req = ExecRequest::new(["head", "-c", "50000000", "/dev/zero"]);
    req.max_output_bytes = 1 << 20;
    req.timeout = Some(Duration::from_secs(60));
    let r = sb.exec(&req, |_, _| {}).unwrap();
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.stdout.len(), 1 << 20);
    assert!(r.stdout_truncated);
    assert_eq!(r.stdout_dropped, 50_000_000 - (1 << 20));
    assert!(!r.stderr_truncated);
    sb.destroy().unwrap();
}

#[test]
fn fork_bomb_hits_pids_limit() {
    need_root!();
    let mut c = config();
    c.pids_max = 32;
    let sb = Sb::create(&c);
    let r = sh(
        &sb,
        "i=0; while [ $i -lt 100 ]; do sleep 20 & i=$((i+1)); done 2>/tmp/err",
    );
    assert!(r.pids_limited, "{r:?}");
    assert!(sb.pids_current() <= 32);
    assert!(sb.kill_all().unwrap() > 0);
    let r = sh(
        &sb,
        "grep -c -i -e fork -e 'resource temporarily unavailable' /tmp/err",
    );
    assert!(out(&r).trim().parse::<u32>().unwrap_or(0) > 0, "{r:?}");
    // The host is fine and the sandbox recovers.
    assert_eq!(out(&sh(&sb, "echo ok")), "ok\n");
    sb.destroy().unwrap();
}

#[test]
fn memory_bomb_is_oom_killed() {
    need_root!();
    let mut c = config();
    c.memory_bytes = 64 << 20;
    let sb = Sb::create(&c);
    let mut req = ExecRequest::new(["tail", "/dev/zero"]);
    req.timeout = Some(Duration::from_secs(60));
    let r = sb.exec(&req, |_, _| {}).unwrap();
    assert_eq!(r.signal, Some(9), "{r:?}");
    assert!(r.oom_killed, "{r:?}");
    assert!(!r.timed_out);
    assert_eq!(out(&sh(&sb, "echo ok")), "ok\n");
    sb.destroy().unwrap();
}

#[test]
fn host_files_are_not_visible() {
    need_root!();
    let c = config();
    let secret = c.state_root.join("host-secret");
    std::fs::write(&secret, "s3cret").unwrap();
    let sb = Sb::create(&c);
    let r = sh(&sb, "cat /etc/shadow");
    assert_ne!(r.exit_code, Some(0));
    assert!(!out(&sh(&sb, "ls -a /etc")).contains("shadow"));
    let r = sh(&sb, &format!("cat {}", secret.display()));
    assert_ne!(r.exit_code, Some(0));
    assert!(!out(&r).contains("s3cret"));
    assert_eq!(
        out(&sh(&sb, "ls /"))
            .split_whitespace()
            .filter(|e| *e == "root" || *e == "home")
            .count(),
        0
    );
    sb.destroy().unwrap();
}

#[test]
fn proc_shows_only_sandbox_processes() {
    need_root!();
    let sb = Sb::create(&config());
    let r = sh(&sb, "ls /proc | grep -E '^[0-9]+$'");
    let pids: Vec<u32> = out(&r).lines().map(|l| l.parse().unwrap()).collect();
    assert!(pids.contains(&1), "{pids:?}");
    assert!(pids.len() <= 4, "{pids:?}");
    // The init is not dumpable: its exe and fds are out of reach.
    assert_ne!(sh(&sb, "ls -l /proc/1/exe /proc/1/fd/").exit_code, Some(0));
    assert_eq!(out(&sh(&sb, "hostname")), "sandbox\n");
    sb.destroy().unwrap();
}

#[test]
fn only_stdio_fds_are_inherited() {
    need_root!();
    let sb = Sb::create(&config());
    // ls opens the directory it lists as fd 3.
    let r = sb
        .exec(&ExecRequest::new(["ls", "/proc/self/fd"]), |_, _| {})
        .unwrap();
    assert_eq!(out(&r), "0\n1\n2\n3\n");
    sb.destroy().unwrap();
}

#[test]
fn privileges_are_dropped() {
    need_root!();
    let sb = Sb::create(&config());
    let st = out(&sh(&sb, "cat /proc/self/status"));
    for line in [
        "CapEff:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
    ] {
        assert!(st.contains(line), "missing {line:?} in {st}");
    }
    assert_eq!(out(&sh(&sb, "id -u")), "0\n");
    // uid 0 inside is an unprivileged host uid outside.
    let host = std::fs::read_to_string(format!("/proc/{}/status", sb.init_pid())).unwrap();
    assert!(
        host.lines().any(|l| l.starts_with("Uid:\t100000\t")),
        "{host}"
    );
    assert_eq!(out(&sh(&sb, "ulimit -n; ulimit -c")), "1024\n0\n");
    sb.destroy().unwrap();
}

#[test]
fn filesystem_is_read_only_except_scratch() {
    need_root!();
    let mut c = config();
    c.workspace_bytes = 8 << 20;
    c.max_file_bytes = Some(64 << 20);
    let sb = Sb::create(&c);
    for p in [
        "/usr/x",
        "/x",
        "/etc/x",
        "/proc/sys/kernel/hostname",
        "/proc/sysrq-trigger",
    ] {
        let r = sh(&sb, &format!("echo 1 > {p}"));
        assert_ne!(r.exit_code, Some(0), "{p} writable");
    }
    assert_eq!(
        sh(
            &sb,
            "echo hi > /workspace/f && cat /workspace/f && echo t > /tmp/t"
        )
        .exit_code,
        Some(0)
    );
    let r = sh(&sb, "head -c 20000000 /dev/zero > /workspace/big");
    assert_ne!(r.exit_code, Some(0));
    assert!(
        String::from_utf8_lossy(&r.stderr).contains("No space left"),
        "{r:?}"
    );
    // RLIMIT_FSIZE: SIGXFSZ past the file size limit.
    let mut c = config();
    c.max_file_bytes = Some(1 << 20);
    let sb2 = Sb::create(&c);
    let r = sh(&sb2, "head -c 2000000 /dev/zero > /tmp/big");
    assert_ne!(r.exit_code, Some(0), "{r:?}");
    sb.destroy().unwrap();
    sb2.destroy().unwrap();
}

#[test]
fn kernel_surface_is_denied() {
    need_root!();
    let sb = Sb::create(&config());
    const EPERM: i32 = 1;
    const ENOSYS: i32 = 38;
    let calls = [
        ("mount", "165, \"none\", \"/tmp\", \"tmpfs\", 0, 0"),
        ("umount2", "166, \"/tmp\", 0"),
        ("pivot_root", "155, \"/tmp\", \"/tmp\""),
        ("keyctl", "250, 0, 0, 0, 0, 0"),
        ("add_key", "248, \"user\", \"k\", \"v\", 1, -2"),
        ("bpf", "321, 0, 0, 0"),
        ("perf_event_open", "298, 0, 0, -1, -1, 0"),
        ("ptrace", "101, 16, 1, 0, 0"),
        ("init_module", "175, 0, 0, \"\""),
        ("kexec_load", "246, 0, 0, 0, 0"),
        ("reboot", "169, 0, 0, 0, 0"),
        ("swapon", "167, \"/tmp\", 0"),
        ("userfaultfd", "323, 0"),
        ("clock_settime", "227, 0, 0"),
        ("settimeofday", "164, 0, 0"),
        ("unshare(user)", "272, 0x10000000"),
        ("setns", "308, 0, 0"),
        ("open_by_handle_at", "304, 0, 0, 0"),
        ("io_uring_setup", "425, 1, 0"),
        ("clone(newuser)", "56, 0x10000000|17, 0, 0, 0, 0"),
        ("personality", "135, 0x0400000"),
        ("ioctl(TIOCSTI)", "16, 0, 0x5412, \"x\""),
    ];
    for (name, args) in calls {
        assert_eq!(syscall_errno(&sb, args), EPERM, "{name}");
    }
    assert_eq!(syscall_errno(&sb, "435, 0, 0"), ENOSYS, "clone3");
    // An x32 system call number kills the process (seccomp, SIGSYS).
    let r = sh(&sb, "exec perl -e 'syscall(0x40000027)'");
    assert_eq!(r.signal, Some(31), "{r:?}");
    // A shell-level mount fails too.
    assert_ne!(
        sh(&sb, "mkdir -p /tmp/m && mount -t tmpfs none /tmp/m").exit_code,
        Some(0)
    );
    sb.destroy().unwrap();
}

#[test]
fn network_has_only_loopback() {
    need_root!();
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port();
    let sb = Sb::create(&config());
    let ifaces: Vec<String> = out(&sh(&sb, "tail -n +3 /proc/net/dev | cut -d: -f1"))
        .lines()
        .map(|l| l.trim().to_string())
        .collect();
    assert_eq!(ifaces, ["lo"]);
    let r = sh(
        &sb,
        &format!("bash -c 'echo x > /dev/tcp/127.0.0.1/{port}' 2>&1"),
    );
    assert_ne!(r.exit_code, Some(0));
    assert!(out(&r).contains("refused"), "{r:?}");
    let r = sh(&sb, "bash -c 'echo x > /dev/tcp/192.0.2.1/80' 2>&1");
    assert!(out(&r).contains("unreachable"), "{r:?}");
    // Loopback inside works.
    let r = sh(&sb, "perl -MIO::Socket::INET -e '$l = IO::Socket::INET->new(Listen => 1, LocalAddr => \"127.0.0.1:7777\") or die; $c = IO::Socket::INET->new(\"127.0.0.1:7777\") or die; print \"lo ok\"'");
    assert_eq!(out(&r), "lo ok", "{r:?}");
    sb.destroy().unwrap();
}

#[test]
fn kill_minus_one_kills_only_sandbox_processes() {
    need_root!();
    let mut host_child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let sb = Sb::create(&config());
    let r = sh(&sb, "sleep 30 & kill -9 -1; wait; echo alive");
    assert_eq!(out(&r), "alive\n");
    assert!(
        host_child.try_wait().unwrap().is_none(),
        "host process killed"
    );
    assert_eq!(sb.status().unwrap().processes, 0);
    host_child.kill().unwrap();
    host_child.wait().unwrap();
    sb.destroy().unwrap();
}

#[test]
fn destroy_leaves_nothing_behind() {
    need_root!();
    let c = config();
    let sb = Sb::create(&c);
    let r = sh(&sb, "(setsid sleep 1000 >/dev/null 2>&1 &); echo started");
    assert_eq!(out(&r), "started\n");
    let pids = sb.host_pids();
    assert!(pids.len() >= 2, "{pids:?}");
    assert_eq!(sb.status().unwrap().processes, 1);
    let (dirs, state_dir, id) = (
        sb.cgroup_dirs(),
        sb.state_dir().to_path_buf(),
        sb.id().to_string(),
    );
    sb.destroy().unwrap();
    assert_gone(&pids);
    for d in dirs {
        assert!(!d.exists(), "{} left behind", d.display());
    }
    assert!(!state_dir.exists());
    let e = LocalSandbox::open(&c.state_root, &id).unwrap_err();
    assert_eq!(e.code(), "E6020");
}

#[test]
fn identity_is_verified_on_open() {
    need_root!();
    let c = config();
    let sb = Sb::create(&c);
    let state = sb.state_dir().join("state.json");
    let good = std::fs::read_to_string(&state).unwrap();
    let v: serde_json::Value = serde_json::from_str(&good).unwrap();
    let nonce = v["nonce"].as_str().unwrap().to_string();
    std::fs::write(&state, good.replace(&nonce, "00")).unwrap();
    let e = LocalSandbox::open(&c.state_root, sb.id()).unwrap_err();
    assert_eq!(e.code(), "E6021", "{e}");
    std::fs::write(&state, good).unwrap();
    LocalSandbox::open(&c.state_root, sb.id()).unwrap();
    sb.destroy().unwrap();
}

#[test]
fn concurrent_execs_in_one_sandbox() {
    need_root!();
    let sb = Sb::create(&config());
    std::thread::scope(|s| {
        for i in 0..8 {
            let sb = &sb;
            s.spawn(move || {
                let r = sh(sb, &format!("sleep 0.2; echo {i}"));
                assert_eq!(out(&r), format!("{i}\n"));
            });
        }
    });
    sb.destroy().unwrap();
}

#[test]
fn sandbox_outlives_its_creator() {
    need_root!();
    let root = state_root().join("outlive");
    // the creator: the worker binary, in its own process, which acquires a
    // lease (creating the sandbox), writes a mark into it and exits
    let run_id = format!("outlive-{}", std::process::id());
    let lines = [
        serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}),
        serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "environmentAcquireLease", "params": {
            "driverKey": "local", "companyId": "t", "environmentId": "e", "issueId": null,
            "config": {"stateRoot": root.display().to_string()}, "runId": run_id}}),
        serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "environmentExecute", "params": {
            "driverKey": "local", "companyId": "t", "environmentId": "e", "issueId": null,
            "config": {"stateRoot": root.display().to_string()},
            "lease": {"providerLeaseId": run_id, "expiresAt": null},
            "command": "sh", "args": ["-c", "echo from-creator > /workspace/mark"], "bypassSession": true}}),
        serde_json::json!({"jsonrpc": "2.0", "id": 4, "method": "shutdown", "params": {}}),
    ];
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sandhost-provider-local"))
        .env_remove("SANDHOST_HOME")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut answers = Vec::new();
    for line in &lines {
        use std::io::{BufRead, Write};
        writeln!(stdin, "{line}").unwrap();
        // one request at a time: shutdown drops calls still running
        loop {
            let mut answer = String::new();
            assert!(
                stdout.read_line(&mut answer).unwrap() > 0,
                "the creator answers {line}"
            );
            let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
            if v["id"] == line["id"] {
                answers.push(v);
                break;
            }
        }
    }
    drop(stdin);
    assert!(
        child.wait().unwrap().success(),
        "the creator exited cleanly"
    );
    let id = answers[1]["result"]["providerLeaseId"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(id, run_id);
    let exec = &answers[2];
    assert_eq!(exec["result"]["exitCode"], 0, "{exec}");
    let sb = Sb(Some(LocalSandbox::open(Path::new(&root), &id).unwrap()));
    assert_eq!(out(&sh(&sb, "cat /workspace/mark")), "from-creator\n");
    sb.destroy().unwrap();
}
