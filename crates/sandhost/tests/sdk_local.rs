//! The SDK end to end on the built-in local provider (the real
//! `sandhost-provider-local` worker and real sandboxes; needs root): a
//! template with all five command capabilities, terminals and forwarded
//! ports riding on the worker's duplex channels, and commands, files and
//! code on the same provider.
//!
//! The worker binaries are not built by `cargo test -p sandhost`: build
//! them first (`cargo build --workspace --bins` with the same target dir).

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandhost::{
    parse_template, CommandEvent, CommandHandle, Host, HostOptions, RunOptions, Sandbox,
    SandboxOptions, TerminalEvent, TerminalOptions,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long any one step may take.
const WAIT: Duration = Duration::from_secs(30);

/// The directory holding the built worker binaries: this test runs from
/// `<target>/<profile>/deps/`, the binaries are in `<target>/<profile>/`.
fn builtin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test binary is in <target>/<profile>/deps")
        .to_path_buf();
    for bin in ["sandhost-provider-local", "sandhost-init"] {
        assert!(
            dir.join(bin).is_file(),
            "{} is missing: build the workers first \
             (`cargo build --workspace --bins` with the same CARGO_TARGET_DIR)",
            dir.join(bin).display()
        );
    }
    dir
}

async fn host(home: &Path) -> Host {
    let mut o = HostOptions::new(home);
    o.plugin_path_env = false;
    o.builtins = sandhost::builtin_plugins(&builtin_dir());
    Host::open(o).await.unwrap()
}

const ALL_FIVE: &str = "name: all-five\ncapabilities: [shell, files, code, terminal, ports]\n";

async fn sandbox(host: &Host) -> Sandbox {
    host.create(SandboxOptions {
        template: Some(parse_template(ALL_FIVE).unwrap()),
        provider: Some("local".into()),
        ephemeral: true,
        ..SandboxOptions::default()
    })
    .await
    .unwrap()
}

async fn step<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("{what}: nothing within {WAIT:?}"))
}

/// Read the terminal until `needle`; fails on an exit or a timeout.
async fn expect_output(t: &mut sandhost::Terminal, needle: &str) -> String {
    let seen = step(needle, t.read_until(needle.as_bytes())).await;
    let text = String::from_utf8_lossy(&seen).into_owned();
    assert!(text.contains(needle), "no {needle:?} in {text:?}");
    text
}

#[tokio::test]
async fn a_terminal_runs_typed_commands_follows_resize_and_reports_its_exit_code() {
    let home = tempfile::tempdir().unwrap();
    let h = host(home.path()).await;
    let s = sandbox(&h).await;
    let mut t = s
        .terminal()
        .unwrap()
        .open(TerminalOptions::default())
        .await
        .unwrap();
    t.write(b"echo hi\n").await.unwrap();
    expect_output(&mut t, "hi").await;
    // only the shell's output, not the echo of what was typed, holds `hi-2`
    t.write(b"echo h\"\"i-$((1+1))\n").await.unwrap();
    expect_output(&mut t, "hi-2").await;
    t.write(b"tty\n").await.unwrap();
    expect_output(&mut t, "/dev/pts/").await;
    t.write(b"stty size\n").await.unwrap();
    expect_output(&mut t, "24 80").await;
    t.resize(120, 40).await.unwrap();
    t.write(b"stty size\n").await.unwrap();
    expect_output(&mut t, "40 120").await;
    t.write(b"exit 3\n").await.unwrap();
    let exit = step("exit", async {
        loop {
            match t.next().await {
                Some(TerminalEvent::Output(_)) => {}
                other => return other,
            }
        }
    })
    .await;
    assert_eq!(
        exit,
        Some(TerminalEvent::Exit {
            exit_code: Some(3),
            signal: None,
            error: None
        })
    );
    assert_eq!(t.next().await, None, "nothing after the exit");
    s.kill().await.unwrap();
}

#[tokio::test]
async fn closing_a_terminal_ends_its_process() {
    let home = tempfile::tempdir().unwrap();
    let h = host(home.path()).await;
    let s = sandbox(&h).await;
    let opts = TerminalOptions {
        argv: vec!["sh".into(), "-c".into(), "echo up; exec sleep 321".into()],
        ..TerminalOptions::default()
    };
    let mut t = s.terminal().unwrap().open(opts).await.unwrap();
    expect_output(&mut t, "up").await;
    let count = "n=0; for f in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $f | grep -q '^sleep 321' && n=$((n+1)); done; echo $n";
    let cmds = s.commands().unwrap();
    let before = cmds
        .run(&["sh", "-c", count], RunOptions::default())
        .await
        .unwrap();
    assert_eq!(before.stdout, "1\n", "{before:?}");
    t.close().await.unwrap();
    let after = step("process gone", async {
        loop {
            let r = cmds
                .run(&["sh", "-c", count], RunOptions::default())
                .await
                .unwrap();
            if r.stdout == "0\n" {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert_eq!(after.stdout, "0\n");
    s.kill().await.unwrap();
}

/// Start `argv` with `spawn` and wait until its output holds `ready`.
async fn spawn_server(s: &Sandbox, argv: &[&str], ready: &str) -> CommandHandle {
    let mut p = s
        .commands()
        .unwrap()
        .spawn(argv, RunOptions::default())
        .await
        .unwrap();
    let mut seen = String::new();
    step("server start", async {
        while !seen.contains(ready) {
            match p.next().await {
                Some(CommandEvent::Stdout(o)) | Some(CommandEvent::Stderr(o)) => seen.push_str(&o),
                other => panic!("the server ended before it was ready: {other:?}; {seen}"),
            }
        }
    })
    .await;
    p
}

/// Upper-cases what each connection sends until it ends its output, then closes.
const ECHO_SERVER: &str = r#"
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8000))
s.listen(8)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    while True:
        b = c.recv(65536)
        if not b:
            break
        c.sendall(b.upper())
    c.close()
"#;

#[tokio::test]
async fn a_forwarded_port_carries_bytes_both_ways_between_host_and_a_sandbox_server() {
    let home = tempfile::tempdir().unwrap();
    let h = host(home.path()).await;
    let s = sandbox(&h).await;
    let _server = spawn_server(&s, &["python3", "-c", ECHO_SERVER], "ready").await;
    let fwd = s.ports().unwrap().forward(8000).await.unwrap();
    assert!(fwd.local_addr().ip().is_loopback());

    // a conversation: each line comes back upper-cased before the next
    let mut c = TcpStream::connect(fwd.local_addr()).await.unwrap();
    for line in ["hello ports\n", "second line\n"] {
        c.write_all(line.as_bytes()).await.unwrap();
        let mut back = vec![0u8; line.len()];
        step("echo", c.read_exact(&mut back)).await.unwrap();
        assert_eq!(back, line.to_uppercase().as_bytes());
    }
    drop(c);

    // a bulk transfer ended by the client's half-close
    let mut c = TcpStream::connect(fwd.local_addr()).await.unwrap();
    let payload: Vec<u8> = (0..200_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let (mut rd, mut wr) = c.split();
    let send = async {
        wr.write_all(&payload).await.unwrap();
        wr.shutdown().await.unwrap();
    };
    let mut back = Vec::new();
    let recv = rd.read_to_end(&mut back);
    let ((), n) = step("bulk", async { tokio::join!(send, recv) }).await;
    n.unwrap();
    assert_eq!(back.len(), payload.len());
    assert_eq!(back, payload.to_ascii_uppercase());
    s.kill().await.unwrap();
}

#[tokio::test]
async fn a_forwarded_port_serves_http_from_the_sandbox_and_a_closed_port_refuses() {
    let home = tempfile::tempdir().unwrap();
    let h = host(home.path()).await;
    let s = sandbox(&h).await;
    s.files()
        .unwrap()
        .write("site/hello.txt", b"served from the sandbox\n")
        .await
        .unwrap();
    let _server = spawn_server(
        &s,
        &[
            "python3",
            "-u",
            "-m",
            "http.server",
            "8001",
            "--bind",
            "127.0.0.1",
            "--directory",
            "/workspace/site",
        ],
        "Serving HTTP",
    )
    .await;
    let fwd = s.ports().unwrap().forward(8001).await.unwrap();
    // HTTP/1.0: the server ends the connection after the response, the
    // client never half-closes
    let mut c = TcpStream::connect(fwd.local_addr()).await.unwrap();
    c.write_all(b"GET /hello.txt HTTP/1.0\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut resp = Vec::new();
    step("http response", c.read_to_end(&mut resp))
        .await
        .unwrap();
    let resp = String::from_utf8_lossy(&resp);
    assert!(resp.starts_with("HTTP/1.0 200"), "{resp}");
    assert!(
        resp.ends_with("\r\n\r\nserved from the sandbox\n"),
        "{resp}"
    );

    // nothing listens on 8002: the forwarded connection is refused (closed
    // without a byte)
    let closed = s.ports().unwrap().forward(8002).await.unwrap();
    let mut c = TcpStream::connect(closed.local_addr()).await.unwrap();
    let _ = c.write_all(b"anyone?\n").await;
    let mut got = Vec::new();
    let r = step("refused", c.read_to_end(&mut got)).await;
    assert!(r.is_err() || got.is_empty(), "{got:?}");
    s.kill().await.unwrap();
}

#[tokio::test]
async fn commands_files_and_code_work_on_the_local_provider() {
    let home = tempfile::tempdir().unwrap();
    let h = host(home.path()).await;
    let s = sandbox(&h).await;
    let mut opts = RunOptions {
        stdin: Some("from stdin".into()),
        ..RunOptions::default()
    };
    opts.env.insert("WHO".into(), "local".into());
    let out = s
        .commands()
        .unwrap()
        .run(&["sh", "-c", "cat; echo \" $WHO $(id -u)\"; exit 4"], opts)
        .await
        .unwrap();
    assert_eq!(out.stdout, "from stdin local 0\n");
    assert_eq!(out.exit_code, Some(4));

    let f = s.files().unwrap();
    f.write("d/a.txt", b"alpha").await.unwrap();
    assert_eq!(f.read("d/a.txt").await.unwrap(), b"alpha");
    let seen = s
        .commands()
        .unwrap()
        .run(&["cat", "/workspace/d/a.txt"], RunOptions::default())
        .await
        .unwrap();
    assert_eq!(seen.stdout, "alpha");
    let names: Vec<String> = f
        .list("d")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, vec!["a.txt".to_string()]);
    f.remove("d", true).await.unwrap();
    assert!(!f.exists("d").await.unwrap());

    let code = s.code().unwrap();
    let r = code.run("x = 40\nprint('set')").await.unwrap();
    assert_eq!(r.stdout, "set\n", "{r:?}");
    let r = code.run("print(x + 2)").await.unwrap();
    assert_eq!(r.stdout, "42\n", "{r:?}");
    let r = code.run("1/0").await.unwrap();
    assert_eq!(r.error.expect("an error").name, "ZeroDivisionError");
    s.kill().await.unwrap();
}

#[tokio::test]
async fn a_spawned_long_running_command_does_not_hold_the_session_for_later_runs() {
    let home = tempfile::tempdir().unwrap();
    let h = host(home.path()).await;
    let s = sandbox(&h).await;
    let cmds = s.commands().unwrap();
    let mut bg = cmds
        .spawn(&["sh", "-c", "echo up; sleep 60"], RunOptions::default())
        .await
        .unwrap();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), bg.next())
            .await
            .unwrap(),
        Some(CommandEvent::Stdout("up\n".into()))
    );
    // the session stays free: a later run answers at once, and keeps state
    let t = std::time::Instant::now();
    cmds.run(
        &["sh", "-c", "cd /tmp && export KEPT=yes"],
        RunOptions::default(),
    )
    .await
    .unwrap();
    let out = cmds
        .run(&["sh", "-c", "echo $PWD $KEPT"], RunOptions::default())
        .await
        .unwrap();
    assert_eq!(out.stdout, "/tmp yes\n");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "runs waited for the spawn: {:?}",
        t.elapsed()
    );
    bg.kill(Duration::from_millis(100)).await.unwrap();
    s.kill().await.unwrap();
}
