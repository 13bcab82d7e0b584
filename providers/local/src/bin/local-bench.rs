//! Create + first result of `true`, side by side with bubblewrap, and the exec
//! round trip in a live sandbox.
//!
//! Run as root: `cargo run --release -p sandhost-provider-local --bin local-bench [runs]`
use std::process::Command;
use std::time::{Duration, Instant};

use sandhost_provider_local::{ExecRequest, LocalSandbox, SandboxConfig};

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// A `/proc` field in KiB (`MemAvailable:` of meminfo, `Pss:` of smaps_rollup).
fn kib_field(file: &str, field: &str) -> u64 {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// `local-bench idle N`: create N sandboxes and keep them idle; report the
/// time to create them all and the host memory each costs, as the drop of
/// MemAvailable (kernel objects, tmpfs and page tables included) and as the
/// init's proportional set size.
fn idle(n: usize) -> Result<(), Box<dyn std::error::Error>> {
    let root = std::env::temp_dir().join(format!("sandhost-bench-idle-{}", std::process::id()));
    let cfg = SandboxConfig::new(&root);
    LocalSandbox::create(&cfg)?.destroy()?; // warm-up
    let before = kib_field("/proc/meminfo", "MemAvailable:");
    let start = Instant::now();
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        all.push(LocalSandbox::create(&cfg)?);
    }
    let took = start.elapsed();
    std::thread::sleep(std::time::Duration::from_secs(2));
    let after = kib_field("/proc/meminfo", "MemAvailable:");
    let pss: u64 = all
        .iter()
        .map(|sb| kib_field(&format!("/proc/{}/smaps_rollup", sb.init_pid()), "Pss:"))
        .sum();
    // every sandbox still answers
    let t = ExecRequest::new(["true"]);
    for sb in all.iter().step_by((n / 10).max(1)) {
        assert_eq!(sb.exec(&t, |_, _| {})?.exit_code, Some(0));
    }
    let d = Instant::now();
    for sb in all {
        sb.destroy()?;
    }
    let destroyed = d.elapsed();
    let _ = std::fs::remove_dir(&root);
    let per = before.saturating_sub(after) as f64 / n as f64 / 1024.0;
    println!(
        "{n} idle sandboxes: created in {:.2} s ({} each), destroyed in {:.2} s",
        took.as_secs_f64(),
        ms(took / n as u32),
        destroyed.as_secs_f64()
    );
    println!("host memory per idle sandbox: {per:.2} MiB (MemAvailable drop; target <= 2 MiB)");
    println!(
        "init PSS per idle sandbox: {:.0} KiB",
        pss as f64 / n as f64
    );
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut argv = std::env::args().skip(1);
    let first = argv.next();
    if first.as_deref() == Some("idle") {
        let n = argv.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
        return idle(n);
    }
    let runs: usize = first.and_then(|a| a.parse().ok()).unwrap_or(50);
    let root = std::env::temp_dir().join(format!("sandhost-bench-{}", std::process::id()));
    let cfg = SandboxConfig::new(&root);
    let t = ExecRequest::new(["true"]);

    // Warm-up (page cache, memfd copy of the init).
    LocalSandbox::create(&cfg)?.destroy()?;

    let mut create = vec![];
    let mut destroy = vec![];
    let mut rss_kib = 0;
    for _ in 0..runs {
        let start = Instant::now();
        let sb = LocalSandbox::create(&cfg)?;
        let r = sb.exec(&t, |_, _| {})?;
        create.push(start.elapsed());
        assert_eq!(r.exit_code, Some(0));
        if rss_kib == 0 {
            let st = std::fs::read_to_string(format!("/proc/{}/status", sb.init_pid()))?;
            rss_kib = st
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0u64);
        }
        let d = Instant::now();
        sb.destroy()?;
        destroy.push(d.elapsed());
    }

    let bwrap_args = [
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
        "--symlink",
        "usr/sbin",
        "/sbin",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--",
        "true",
    ];
    let mut bwrap = vec![];
    let have_bwrap = Command::new("bwrap")
        .args(bwrap_args)
        .status()
        .is_ok_and(|s| s.success());
    if have_bwrap {
        for _ in 0..runs {
            let start = Instant::now();
            let st = Command::new("bwrap").args(bwrap_args).status()?;
            bwrap.push(start.elapsed());
            assert!(st.success());
        }
    }

    let sb = LocalSandbox::create(&cfg)?;
    let mut rt = vec![];
    for _ in 0..runs.max(100) {
        let start = Instant::now();
        sb.exec(&t, |_, _| {})?;
        rt.push(start.elapsed());
    }
    sb.destroy()?;
    let _ = std::fs::remove_dir(&root);

    println!("runs: {runs}");
    let (c50, c95) = (pct(&mut create, 0.5), pct(&mut create, 0.95));
    println!(
        "sandhost local create + `true` result: p50 {}  p95 {}",
        ms(c50),
        ms(c95)
    );
    if have_bwrap {
        let (b50, b95) = (pct(&mut bwrap, 0.5), pct(&mut bwrap, 0.95));
        println!(
            "bwrap --unshare-all ... true:          p50 {}  p95 {}",
            ms(b50),
            ms(b95)
        );
        println!(
            "ratio local/bwrap: p50 {:.2}x  p95 {:.2}x",
            c50.as_secs_f64() / b50.as_secs_f64(),
            c95.as_secs_f64() / b95.as_secs_f64()
        );
    } else {
        println!("bwrap not installed (apt-get install -y bubblewrap): no comparison");
    }
    println!(
        "exec round trip (`true` in a live sandbox): p50 {}  p95 {}",
        ms(pct(&mut rt, 0.5)),
        ms(pct(&mut rt, 0.95))
    );
    println!("destroy: p50 {}", ms(pct(&mut destroy, 0.5)));
    println!("idle init VmRSS: {rss_kib} KiB");
    Ok(())
}
