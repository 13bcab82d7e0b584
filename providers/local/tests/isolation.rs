//! Isolation tests against the real kernel. They need root (the local
//! provider maps uid ranges and creates cgroups); without it they are skipped.
use std::path::PathBuf;
use std::time::{Duration, Instant};

use sandhost_provider_local::{ExecRequest, ExecResult, LocalSandbox, SandboxConfig, Severity};

fn can_run() -> bool {
    let errors: Vec<_> = sandhost_provider_local::probe()
        .into_iter()
        .filter(|d| d.severity == Severity::Error)
        .collect();
    if !errors.is_empty() {
        eprintln!("skipping: {errors:?}");
    }
    errors.is_empty()
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
    let sb = LocalSandbox::create(&config()).unwrap();
    let mut chunks = vec![];
    let r = sb
        .exec(&ExecRequest::new(["echo", "hi"]), |s, b| chunks.push((s, b.to_vec())))
        .unwrap();
    assert_eq!(r.exit_code, Some(0), "{r:?}");
    assert_eq!(r.stdout, b"hi\n");
    assert!(!chunks.is_empty());
    sb.destroy().unwrap();
}
