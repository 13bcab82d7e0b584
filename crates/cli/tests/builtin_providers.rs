//! The CLI on the built-in providers, on a fresh home, as a user runs it:
//! the default local provider (needs root: namespaces and cgroups) and the
//! Docker provider through a template (needs the engine scripts/docker.sh
//! starts).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

struct Env {
    home: tempfile::TempDir,
}

impl Env {
    fn new() -> Self {
        Self {
            home: tempfile::tempdir().unwrap(),
        }
    }
    fn sandhost(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_sandhost"))
            .env_remove("SANDHOST_PLUGIN_PATH")
            .env_remove("SANDHOST_BUILTIN_DIR")
            .arg("--home")
            .arg(self.home.path())
            .args(args)
            .output()
            .unwrap()
    }
    /// Entries under the local provider's state root (one per live sandbox).
    fn local_state(&self) -> usize {
        std::fs::read_dir(self.home.path().join("local"))
            .map(|d| d.flatten().filter(|e| e.path().is_dir()).count())
            .unwrap_or(0)
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn run_on_the_default_local_provider_is_isolated_and_leaves_nothing() {
    let e = Env::new();
    let o = e.sandhost(&[
        "run", "--", "sh", "-c",
        "echo $(hostname) $(id -u); test -e /etc/shadow && echo shadow-visible; ip link 2>/dev/null | grep -c '^[0-9]' || ls /sys/class/net",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.starts_with("sandbox 0\n"), "{out}");
    assert!(!out.contains("shadow-visible"), "{out}");
    assert_eq!(e.local_state(), 0, "the run's sandbox state is gone");
}

#[test]
fn local_create_exec_cp_and_kill_across_processes() {
    let e = Env::new();
    let o = e.sandhost(&["create", "--ttl", "300"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let id = text(&o.stdout).trim().to_string();
    assert_eq!(e.local_state(), 1);
    // the session keeps cwd and exported env between separate processes
    e.sandhost(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "cd /tmp && export GREETING=kept",
    ]);
    let o = e.sandhost(&["exec", &id, "--", "sh", "-c", "echo \"$PWD $GREETING\""]);
    assert_eq!(text(&o.stdout), "/tmp kept\n", "{}", text(&o.stderr));
    let f = e.home.path().join("in.txt");
    std::fs::write(&f, "payload\n").unwrap();
    let o = e.sandhost(&["cp", f.to_str().unwrap(), &format!("{id}:in.txt")]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let back = e.home.path().join("back.txt");
    let o = e.sandhost(&[
        "cp",
        &format!("{id}:/workspace/in.txt"),
        back.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "payload\n");
    let o = e.sandhost(&["exec", &id, "--timeout", "1", "--", "sleep", "30"]);
    assert_eq!(o.status.code(), Some(124));
    let o = e.sandhost(&["kill", &id]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(e.local_state(), 0, "kill leaves no state dir");
    let ls: Value = serde_json::from_slice(&e.sandhost(&["--json", "ls"]).stdout).unwrap();
    assert_eq!(ls, Value::Array(vec![]));
}

#[test]
fn a_local_template_memory_limit_kills_a_memory_bomb_with_sigkill() {
    let e = Env::new();
    let t = e.home.path().join("small.yaml");
    std::fs::write(&t, "name: small\nresources:\n  memory: 64Mi\n").unwrap();
    let o = e.sandhost(&[
        "run",
        "--template",
        t.to_str().unwrap(),
        "--",
        "python3",
        "-c",
        "b = []\nwhile True: b.append(bytearray(8 << 20))",
    ]);
    assert_eq!(o.status.code(), Some(128 + 9), "{}", text(&o.stderr));
}

#[test]
fn plugin_check_passes_on_the_built_in_local_provider() {
    let e = Env::new();
    let o = Command::new(env!("CARGO_BIN_EXE_sandhost"))
        .env("SANDHOST_HOME", e.home.path())
        .args(["plugin", "check", "local"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    assert!(
        text(&o.stdout).contains("result: PASS"),
        "{}",
        text(&o.stdout)
    );
}

#[test]
fn a_docker_template_runs_hardened_with_no_network_and_a_read_only_root() {
    let e = Env::new();
    let t = examples().join("templates/busybox-docker.yaml");
    let o = e.sandhost(&[
        "run", "--template", t.to_str().unwrap(), "--", "sh", "-c",
        "grep CapEff /proc/self/status; cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '; touch /etc/x 2>/dev/null || echo ro",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "CapEff:\t0000000000000000\nlo\nro\n");
}

#[test]
fn plugin_check_passes_on_the_built_in_docker_provider() {
    let e = Env::new();
    let o = Command::new(env!("CARGO_BIN_EXE_sandhost"))
        .env("SANDHOST_HOME", e.home.path())
        .args([
            "plugin",
            "check",
            "docker",
            "--config",
            r#"{"image":"sandhost-test-busybox:latest"}"#,
        ])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
}
