//! Duplex channels against the real kernel: a pty running an interactive
//! shell, and a TCP stream to a port on the sandbox's own loopback. These
//! need root; unlike a skip, a host that cannot run them fails them.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandhost_provider_local::{
    ChannelEvent, ChannelExit, ExecRequest, LocalSandbox, PtyChannel, PtyRequest, SandboxConfig,
    Severity, TcpChannel,
};

const STEP: Duration = Duration::from_secs(20);

fn config() -> SandboxConfig {
    let errors: Vec<_> = sandhost_provider_local::probe()
        .into_iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    assert!(
        errors.is_empty(),
        "these tests need root and a kernel with user namespaces, cgroups and seccomp: {errors:?}"
    );
    let root = std::env::temp_dir().join(format!("sandhost-duplex-test-{}", std::process::id()));
    std::fs::create_dir_all(&root).unwrap();
    let mut c = SandboxConfig::new(root);
    c.init_binary = Some(PathBuf::from(env!("CARGO_BIN_EXE_sandhost-init")));
    c
}

/// Destroys its sandbox on drop, so a failing assertion strands nothing.
struct Sb(Option<LocalSandbox>);

impl Sb {
    fn create() -> Sb {
        Sb(Some(LocalSandbox::create(&config()).unwrap()))
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

fn sh(sb: &LocalSandbox, script: &str) -> String {
    let mut req = ExecRequest::shell(script);
    req.timeout = Some(Duration::from_secs(30));
    let r = sb.exec(&req, |_, _| {}).unwrap();
    assert_eq!(r.exit_code, Some(0), "{script}: {r:?}");
    String::from_utf8_lossy(&r.stdout).into_owned()
}

/// Read a channel's output until it contains `needle` (returns all of it).
struct Output {
    seen: Vec<u8>,
}

impl Output {
    fn new() -> Output {
        Output { seen: vec![] }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.seen).into_owned()
    }

    fn until(
        &mut self,
        mut next: impl FnMut(Duration) -> Option<ChannelEvent>,
        needle: &str,
    ) -> String {
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(pos) = find(&self.seen, needle.as_bytes()) {
                let upto = pos + needle.len();
                let text = String::from_utf8_lossy(&self.seen[..upto]).into_owned();
                self.seen.drain(..upto);
                return text;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no {needle:?} in {:?}", self.text());
            match next(left) {
                Some(ChannelEvent::Data(d)) => self.seen.extend_from_slice(&d),
                Some(ChannelEvent::Exit(e)) => {
                    panic!(
                        "channel exited ({e:?}) before {needle:?}; got {:?}",
                        self.text()
                    )
                }
                _ => {}
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn pty_next(p: &PtyChannel) -> impl FnMut(Duration) -> Option<ChannelEvent> + '_ {
    |t| p.next_event_timeout(t).unwrap()
}

fn tcp_next(c: &TcpChannel) -> impl FnMut(Duration) -> Option<ChannelEvent> + '_ {
    |t| c.next_event_timeout(t).unwrap()
}

/// Wait for the exit event, keeping whatever output comes before it.
fn pty_exit(p: &PtyChannel, out: &mut Output) -> ChannelExit {
    let deadline = Instant::now() + STEP;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "no exit; output {:?}", out.text());
        match p.next_event_timeout(left).unwrap() {
            Some(ChannelEvent::Data(d)) => out.seen.extend_from_slice(&d),
            Some(ChannelEvent::Exit(e)) => return e,
            _ => {}
        }
    }
}

/// An interactive `sh` with the prompt `$ `, once it printed its first prompt
/// (input typed earlier is echoed before that prompt, which would interleave
/// the transcript).
fn interactive_sh(sb: &LocalSandbox, cols: u16, rows: u16) -> (PtyChannel, Output) {
    let mut req = PtyRequest::new(["/bin/sh"]);
    req.env.push(("PS1".into(), "$ ".into()));
    req.cols = cols;
    req.rows = rows;
    let p = sb.open_pty(&req).unwrap();
    let mut out = Output::new();
    out.until(pty_next(&p), "$ ");
    (p, out)
}

#[test]
fn pty_runs_an_interactive_shell_on_its_own_terminal() {
    let sb = Sb::create();
    let (p, mut out) = interactive_sh(&sb, 80, 24);
    assert!(p.tty().starts_with("/dev/pts/"), "{}", p.tty());
    // The terminal echoes the command line: look for the output line only.
    p.write(b"echo h\"\"i\n").unwrap();
    out.until(pty_next(&p), "\r\nhi\r\n$ ");
    p.write(b"tty; echo \"$$ $(cut -d' ' -f6 /proc/$$/stat)\"\n")
        .unwrap();
    let text = out.until(pty_next(&p), "\r\n$ ");
    assert!(text.contains(&format!("\r\n{}\r\n", p.tty())), "{text:?}");
    // The shell leads its own session (its session id is its pid).
    let pid = p.pid().to_string();
    assert!(text.contains(&format!("\r\n{pid} {pid}\r\n")), "{text:?}");
    p.write(b"exit 7\n").unwrap();
    let exit = pty_exit(&p, &mut out);
    assert_eq!((exit.exit_code, exit.signal), (Some(7), None), "{exit:?}");
    // The exit repeats; input after the end fails with a typed error or is dropped.
    assert_eq!(p.next_event().unwrap(), ChannelEvent::Exit(exit));
}

#[test]
fn pty_size_follows_resize() {
    let sb = Sb::create();
    let (p, mut out) = interactive_sh(&sb, 100, 30);
    p.write(b"stty size\n").unwrap();
    out.until(pty_next(&p), "\r\n30 100\r\n$ ");
    p.resize(132, 43).unwrap();
    p.write(b"stty size\n").unwrap();
    out.until(pty_next(&p), "\r\n43 132\r\n$ ");
    assert_eq!(p.resize(0, 10).unwrap_err().code(), "E6030");
    p.write(b"exit\n").unwrap();
    assert_eq!(pty_exit(&p, &mut out).exit_code, Some(0));
}

#[test]
fn pty_blocks_tiocsti_injection() {
    let sb = Sb::create();
    let (p, mut out) = interactive_sh(&sb, 80, 24);
    // ioctl(0, TIOCSTI, "x") on the process's own controlling terminal:
    // refused with EPERM, and nothing is pushed into the terminal's input.
    p.write(b"perl -e '$c = \"x\"; print ioctl(STDIN, 0x5412, $c) ? \"INJECTED\" : \"errno=\" . ($!+0), \"\\n\"'; echo done\n")
        .unwrap();
    let text = out.until(pty_next(&p), "\r\ndone\r\n$ ");
    assert!(text.contains("\r\nerrno=1\r\n"), "{text:?}");
    assert!(!text.contains("\r\nINJECTED"), "{text:?}");
    // Had a byte been injected, the shell would read it as the start of its
    // next line ("xecho ...": not found).
    p.write(b"echo \"[ok]\"\n").unwrap();
    out.until(pty_next(&p), "\r\n[ok]\r\n$ ");
    p.write(b"exit\n").unwrap();
    pty_exit(&p, &mut out);
}

#[test]
fn pty_kill_leaves_no_process_of_its_session() {
    let sb = Sb::create();
    let (p, mut out) = interactive_sh(&sb, 80, 24);
    let p = Arc::new(p);
    // Background jobs (their own process groups in an interactive shell) and
    // a process that ignores SIGHUP.
    p.write(b"sleep 1001 & sleep 1002 & nohup sleep 1003 >/dev/null 2>&1 & echo started\n")
        .unwrap();
    out.until(pty_next(&p), "\r\nstarted\r\n$ ");
    let count = "for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f; echo; done | grep -c '^sleep 100' || true";
    let wait_for = |n: &str| {
        let deadline = Instant::now() + STEP;
        while sh(&sb, count).trim() != n {
            assert!(Instant::now() < deadline, "never {n} sleeps");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    wait_for("3");
    // Kill from another thread while this one waits for the exit.
    let killer = {
        let p = Arc::clone(&p);
        std::thread::spawn(move || p.kill().unwrap())
    };
    let exit = pty_exit(&p, &mut out);
    killer.join().unwrap();
    assert_eq!(exit.signal, Some(9), "{exit:?}");
    wait_for("0");
    // Killing again is a no-op.
    p.kill().unwrap();
}

#[test]
fn pty_close_input_keeps_output_flowing() {
    let sb = Sb::create();
    let p = sb
        .open_pty(&PtyRequest::new([
            "sh",
            "-c",
            "read x; echo got $x; sleep 0.3; echo after",
        ]))
        .unwrap();
    let mut out = Output::new();
    p.write(b"abc\n").unwrap();
    p.close_input().unwrap();
    assert_eq!(p.write(b"more\n").unwrap_err().code(), "E6033");
    out.until(pty_next(&p), "got abc\r\n");
    out.until(pty_next(&p), "after\r\n");
    assert_eq!(pty_exit(&p, &mut out).exit_code, Some(0));
}

/// Anonymous memory of the sandbox's init, in kB.
fn init_anon_kb(sb: &LocalSandbox) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", sb.init_pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn pty_relays_large_output_without_loss_in_bounded_memory() {
    let sb = Sb::create();
    // Warm up (first allocations of the channel code), then measure.
    let p = sb.open_pty(&PtyRequest::new(["true"])).unwrap();
    assert_eq!(p.wait().unwrap().exit_code, Some(0));
    let before = init_anon_kb(&sb);
    let p = sb
        .open_pty(&PtyRequest::new(["sh", "-c", "seq 1 200000; exit 3"]))
        .unwrap();
    // Do not read at first: the init has to hold the terminal back.
    std::thread::sleep(Duration::from_millis(500));
    let mut all = vec![];
    let exit = p.wait_with(|d| all.extend_from_slice(d)).unwrap();
    assert_eq!(exit.exit_code, Some(3));
    let text = String::from_utf8(all).unwrap();
    let lines: Vec<&str> = text.split("\r\n").filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.len(), 200_000);
    assert_eq!(lines[199_999], "200000");
    // 1.3 MB went through; the init buffered at most its high-water marks.
    let after = init_anon_kb(&sb);
    assert!(
        after <= before + 256,
        "init anonymous memory grew from {before} kB to {after} kB"
    );
}

#[test]
fn pty_open_errors_are_typed() {
    let sb = Sb::create();
    let e = sb
        .open_pty(&PtyRequest::new(["no-such-command-xyz"]))
        .unwrap_err();
    assert_eq!(e.code(), "E6031", "{e}");
    let mut req = PtyRequest::new(["sh"]);
    req.cwd = Some("/nonexistent".into());
    assert_eq!(sb.open_pty(&req).unwrap_err().code(), "E6031");
    assert_eq!(
        sb.open_pty(&PtyRequest::new(Vec::<String>::new()))
            .unwrap_err()
            .code(),
        "E6030"
    );
}

/// A one-connection server inside the sandbox: greets, reads to end-of-file,
/// answers with the byte count, then closes.
const SERVER: &str = r#"
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(1)
open("/tmp/listening", "w").close()
c, _ = s.accept()
c.sendall(b"hello from inside\n")
n = 0
while True:
    b = c.recv(65536)
    if not b:
        break
    n += len(b)
c.sendall(b"got %d bytes\n" % n)
c.close()
"#;

fn connect_when_listening(sb: &LocalSandbox, port: u16) -> TcpChannel {
    let deadline = Instant::now() + STEP;
    loop {
        if sh(sb, "test -e /tmp/listening && echo yes || true").trim() == "yes" {
            return sb.connect_tcp(port).unwrap();
        }
        assert!(Instant::now() < deadline, "the server never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn tcp_relays_both_ways_with_half_close() {
    let sb = Sb::create();
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let mut req = ExecRequest::new(["python3", "-c", SERVER, "7000"]);
            req.timeout = Some(Duration::from_secs(60));
            sb.exec(&req, |_, _| {}).unwrap()
        });
        let c = connect_when_listening(&sb, 7000);
        assert_eq!(c.port(), 7000);
        let mut out = Output::new();
        out.until(tcp_next(&c), "hello from inside\n");
        // More than any buffer on the way, so flow control has to work.
        let data: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        c.write(&data).unwrap();
        c.close_input().unwrap();
        assert_eq!(c.write(b"x").unwrap_err().code(), "E6033");
        out.until(tcp_next(&c), "got 3000000 bytes\n");
        let mut closed = false;
        let exit = loop {
            match c.next_event_timeout(STEP).unwrap().expect("an event") {
                ChannelEvent::OutputClosed => closed = true,
                ChannelEvent::Exit(e) => break e,
                ChannelEvent::Data(d) => panic!("unexpected data {d:?}"),
            }
        };
        assert!(closed, "no end of output before the exit");
        assert_eq!(exit, ChannelExit::default());
        let r = server.join().unwrap();
        assert_eq!(r.exit_code, Some(0), "{r:?}");
    });
}

#[test]
fn tcp_kill_closes_the_connection() {
    let sb = Sb::create();
    std::thread::scope(|s| {
        let server = s.spawn(|| {
            let mut req = ExecRequest::new(["python3", "-c", SERVER, "7001"]);
            req.timeout = Some(Duration::from_secs(60));
            sb.exec(&req, |_, _| {}).unwrap()
        });
        let c = connect_when_listening(&sb, 7001);
        let mut out = Output::new();
        out.until(tcp_next(&c), "hello from inside\n");
        c.write(b"abc").unwrap();
        c.kill().unwrap();
        let exit = loop {
            match c.next_event_timeout(STEP).unwrap().expect("an event") {
                ChannelEvent::Exit(e) => break e,
                _ => continue,
            }
        };
        assert_eq!(exit.error.as_deref(), Some("killed"));
        // The server saw its peer go away (it finishes instead of waiting).
        server.join().unwrap();
    });
}

#[test]
fn tcp_to_a_closed_port_is_a_typed_error() {
    let sb = Sb::create();
    let e = sb.connect_tcp(7002).unwrap_err();
    assert_eq!(e.code(), "E6032", "{e}");
    assert!(e.to_string().contains("7002"), "{e}");
    assert_eq!(sb.connect_tcp(0).unwrap_err().code(), "E6030");
}

#[test]
fn tcp_reaches_the_sandbox_loopback_not_the_hosts() {
    // A listener on the host's loopback is not what connect_tcp reaches.
    let host = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port();
    let sb = Sb::create();
    let e = sb.connect_tcp(port).unwrap_err();
    assert_eq!(e.code(), "E6032", "{e}");
    // And the sandbox still has only its loopback: no route anywhere else.
    let ifaces = sh(&sb, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '");
    assert_eq!(ifaces.trim(), "lo");
}
