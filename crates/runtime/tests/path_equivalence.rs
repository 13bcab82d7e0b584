//! Every capability path and its fallback give the same result.
//!
//! For each of the six provider capabilities, one scenario runs twice:
//! through the provider as it is (the capability effective) and through a
//! copy of its plugin whose manifest declares the capability `false` (so
//! the snapshot narrows it off and the runtime takes the fallback). The
//! observable results must be identical, and the path actually taken must
//! differ, so the test cannot pass by taking one path twice. It runs
//! against the examples/ Python plugin and the built-in local and Docker
//! providers (the capabilities each one has). The Docker tests need the
//! engine and its test image: run `scripts/docker.sh` first.

use std::path::Path;
use std::time::Duration;

use sandhost_contract::manifest::parse_manifest;
use sandhost_contract::resolve::LeasePolicy;
use sandhost_contract::template::Template;
use sandhost_contract::ProviderCapability as Cap;
use sandhost_runtime::exec::{exec, Collected, ExecOutcome, ExecRequest, OutputPath, SessionMode};
use sandhost_runtime::host::{CreateRequest, Host, HostConfig, Sandbox};
use sandhost_runtime::plugins::{Plugin, PluginSource, Registry};
use sandhost_runtime::store::LeaseOutcome;
use sandhost_runtime::transfer::{download, upload, TransferLimits, TransferPath};
use sandhost_runtime::worker::WorkerOptions;

/// A provider under test: its plugin, driver key and sandbox config.
#[derive(Debug, Clone)]
struct Provider {
    name: &'static str,
    plugin: Plugin,
    driver: &'static str,
    /// The `config` of every sandbox created (`{}` unless the provider
    /// needs one).
    config: serde_json::Value,
}

fn python() -> Provider {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/python-provider");
    let plugin = Plugin::load(&dir, PluginSource::Flag).unwrap();
    Provider {
        name: "python",
        plugin,
        driver: "python-tempdir",
        config: serde_json::json!({}),
    }
}

/// A built-in provider (`providers/<dir>`), with its worker binary
/// `sandhost-provider-<dir>` from this build (target/<profile>/, the
/// parent of the test's deps/).
fn builtin(dir: &str) -> Plugin {
    let exe = std::env::current_exe().unwrap();
    let bin_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    let worker = bin_dir.join(format!("sandhost-provider-{dir}"));
    assert!(
        worker.exists(),
        "{} is missing: build the workspace binaries first (cargo build --workspace --bins)",
        worker.display()
    );
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../providers/{dir}/plugin.json")),
    )
    .unwrap();
    let manifest = parse_manifest(&text).unwrap();
    Plugin {
        dir: bin_dir,
        manifest,
        source: PluginSource::Builtin,
    }
}

/// The built-in local provider.
fn local() -> Provider {
    Provider {
        name: "local",
        plugin: builtin("local"),
        driver: "local",
        config: serde_json::json!({}),
    }
}

/// The built-in Docker provider on the busybox test image.
fn docker() -> Provider {
    Provider {
        name: "docker",
        plugin: builtin("docker"),
        driver: "docker",
        config: serde_json::json!({"image": "sandhost-test-busybox:latest"}),
    }
}

/// The same provider with `cap` declared false.
fn narrowed(p: &Provider, cap: Cap) -> Provider {
    Provider {
        plugin: p.plugin.narrowed(p.driver, cap),
        ..p.clone()
    }
}

async fn host(p: &Provider, home: &Path) -> Host {
    let reg = Registry::discover(&[], None, vec![p.plugin.clone()]);
    assert!(reg.problems.is_empty(), "{:?}", reg.problems);
    Host::open(HostConfig {
        home: home.to_path_buf(),
        registry: reg,
        worker_options: WorkerOptions::default(),
    })
    .await
    .unwrap()
}

async fn create(h: &Host, p: &Provider, policy: LeasePolicy) -> Sandbox {
    h.create(CreateRequest {
        template: Template::builtin(),
        template_yaml: "name: default\n".into(),
        provider: Some(p.driver.into()),
        config: p.config.clone(),
        ttl: Some(Duration::from_secs(600)),
        policy,
    })
    .await
    .unwrap()
}

/// What a command scenario observes.
#[derive(Debug, PartialEq, Eq)]
struct Observed {
    stdout: String,
    stderr: String,
    exit: Option<i32>,
    timed_out: bool,
}

async fn run(s: &Sandbox, script: &str) -> (Observed, ExecOutcome, usize) {
    let req = ExecRequest {
        argv: vec!["sh".into(), "-c".into(), script.into()],
        ..ExecRequest::default()
    };
    let mut out = Collected::default();
    let o = exec(&s.ctx, &req, &mut out).await.unwrap();
    let obs = Observed {
        stdout: out.stdout,
        stderr: out.stderr,
        exit: o.exit_code,
        timed_out: o.timed_out,
    };
    (obs, o, out.deliveries)
}

const SLOW_OUTPUT: &str =
    "for i in 1 2 3; do echo out $i; echo err $i >&2; sleep 0.3; done; exit 7";

/// Run `scenario` on the provider as it is and on the narrowed copy.
async fn both<T, F, Fut>(p: &Provider, cap: Cap, scenario: F) -> (T, T)
where
    F: Fn(Host, Provider) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let tmp = tempfile::tempdir().unwrap();
    let n = narrowed(p, cap);
    let on = scenario(host(p, &tmp.path().join("home-on")).await, p.clone()).await;
    let off = scenario(host(&n, &tmp.path().join("home-off")).await, n.clone()).await;
    (on, off)
}

async fn incremental_output_streams_or_falls_back_with_the_same_result(p: Provider) {
    let (on, off) = both(&p, Cap::IncrementalSessionOutput, |h, p| async move {
        let s = create(&h, &p, LeasePolicy::Ephemeral).await;
        let r = run(&s, SLOW_OUTPUT).await;
        h.destroy(&s).await.unwrap();
        r
    })
    .await;
    assert_eq!(on.0, off.0, "{}: same output, same exit", p.name);
    assert_eq!(on.0.exit, Some(7));
    assert_eq!(on.1.output_path, OutputPath::Stream);
    assert_ne!(off.1.output_path, OutputPath::Stream, "{}", p.name);
    assert!(
        on.2 > 2,
        "{}: streamed in several deliveries, got {}",
        p.name,
        on.2
    );
}

async fn sessions_or_one_shot_give_the_same_result(p: Provider) {
    let (on, off) = both(&p, Cap::PersistentProcessSessions, |h, p| async move {
        let s = create(&h, &p, LeasePolicy::Ephemeral).await;
        let r = run(&s, "echo one; echo two >&2; exit 3").await;
        h.destroy(&s).await.unwrap();
        r
    })
    .await;
    assert_eq!(on.0, off.0, "{}", p.name);
    assert_eq!(on.1.session, SessionMode::Session);
    assert_eq!(off.1.session, SessionMode::OneShot);
}

async fn control_commands_poll_or_run_once_with_the_same_result(p: Provider) {
    // poll needs control commands; narrowing them off leaves the one-shot
    // delivery. Incremental output is narrowed off on both sides so that
    // the choice is between poll and once.
    let base = narrowed(&p, Cap::IncrementalSessionOutput);
    let (on, off) = both(&base, Cap::IndependentControlCommands, |h, p| async move {
        let s = create(&h, &p, LeasePolicy::Ephemeral).await;
        let r = run(&s, SLOW_OUTPUT).await;
        h.destroy(&s).await.unwrap();
        r
    })
    .await;
    assert_eq!(on.0, off.0, "{}", p.name);
    assert_eq!(on.1.output_path, OutputPath::Poll, "{}", p.name);
    assert_eq!(off.1.output_path, OutputPath::Once, "{}", p.name);
    assert_eq!(off.2, 2, "{}: once = one delivery per stream", p.name);
}

async fn a_large_multibyte_flood_polls_in_bounded_reads_with_the_same_result(p: Provider) {
    // 300,000 three-byte characters (900 kB) and 300,000 two-byte ones, several bounded poll
    // reads, with characters cut at read boundaries
    let flood = "python3 -c \"import sys; sys.stdout.write('\\u20ac' * 300000); sys.stderr.write('\\u00fc' * 300000)\"";
    let base = narrowed(&p, Cap::IncrementalSessionOutput);
    let (on, off) = both(&base, Cap::IndependentControlCommands, |h, p| async move {
        let s = create(&h, &p, LeasePolicy::Ephemeral).await;
        let r = run(&s, flood).await;
        h.destroy(&s).await.unwrap();
        r
    })
    .await;
    assert_eq!(on.1.output_path, OutputPath::Poll);
    assert_eq!(on.0.stdout.chars().count(), 300_000, "{}", p.name);
    assert!(on.0.stdout.chars().all(|c| c == '\u{20ac}'));
    assert_eq!(on.0.stderr.chars().count(), 300_000);
    // under the provider's 1 MiB capture cap, so run-once keeps it all
    assert!(on.0 == off.0, "{}: poll and once disagree", p.name);
}

fn sample_tree(root: &Path) {
    std::fs::create_dir_all(root.join("a/b")).unwrap();
    std::fs::create_dir_all(root.join("empty")).unwrap();
    std::fs::write(
        root.join("a/b/data.bin"),
        (0..=255u8).cycle().take(300_000).collect::<Vec<_>>(),
    )
    .unwrap();
    std::fs::write(root.join("top.txt"), "top\n").unwrap();
}

fn tree_listing(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if p.is_dir() {
                v.push((rel + "/", Vec::new()));
                stack.push(p);
            } else {
                v.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    v.sort();
    v
}

async fn sync_native_or_base64_gives_the_same_tree(p: Provider, cap: Cap) {
    let (on, off) = both(&p, cap, |h, p| async move {
        let s = create(&h, &p, LeasePolicy::Ephemeral).await;
        let src = tempfile::tempdir().unwrap();
        sample_tree(src.path());
        let limits = TransferLimits::default();
        let up = upload(&s.ctx, src.path(), "synced", &limits).await.unwrap();
        let back = tempfile::tempdir().unwrap();
        let dest = back.path().join("tree");
        let down = download(&s.ctx, "synced", &dest, &limits).await.unwrap();
        h.destroy(&s).await.unwrap();
        (
            tree_listing(&dest),
            up.path,
            down.path,
            (up.files, up.bytes),
        )
    })
    .await;
    assert_eq!(on.0, off.0, "{}: identical trees", p.name);
    assert_eq!(on.3, off.3);
    assert_eq!(
        (on.1, on.2),
        (TransferPath::Native, TransferPath::Native),
        "{}",
        p.name
    );
    assert_eq!(
        (off.1, off.2),
        (TransferPath::Base64Fallback, TransferPath::Base64Fallback)
    );
}

async fn reuse_resumes_or_uses_the_stored_lease_with_the_same_result(p: Provider) {
    let (on, off) = both(&p, Cap::ReusableLeases, |h, p| async move {
        let s = create(&h, &p, LeasePolicy::ReuseByEnvironment).await;
        run(&s, "echo kept > state.txt").await;
        let id = s.record.id.clone();
        let again = h.connect(&id).await.unwrap();
        let r = run(&again, "cat state.txt").await.0;
        let outcome = again.outcome;
        h.kill(&id).await.unwrap();
        (r, outcome, again.ctx.snapshot.allows(Cap::ReusableLeases))
    })
    .await;
    assert_eq!(on.0, off.0, "{}", p.name);
    assert_eq!(on.0.stdout, "kept\n");
    assert!(
        on.2 && !off.2,
        "{}: reuse effective only on the original",
        p.name
    );
    assert_eq!(on.1, LeaseOutcome::Resumed);
}

// ---------------------------------------------------------------- python

#[tokio::test]
async fn python_incremental_output_and_its_fallback_agree() {
    incremental_output_streams_or_falls_back_with_the_same_result(python()).await;
}

#[tokio::test]
async fn python_native_sync_in_and_the_base64_fallback_agree() {
    sync_native_or_base64_gives_the_same_tree(python(), Cap::NativeSyncIn).await;
}

#[tokio::test]
async fn python_native_sync_out_and_the_base64_fallback_agree() {
    sync_native_or_base64_gives_the_same_tree(python(), Cap::NativeSyncOut).await;
}

#[tokio::test]
async fn python_reusable_leases_and_the_stored_lease_path_agree() {
    reuse_resumes_or_uses_the_stored_lease_with_the_same_result(python()).await;
}

// ---------------------------------------------------------------- local

#[tokio::test]
async fn local_incremental_output_and_its_fallback_agree() {
    incremental_output_streams_or_falls_back_with_the_same_result(local()).await;
}

#[tokio::test]
async fn local_persistent_sessions_and_one_shot_agree() {
    sessions_or_one_shot_give_the_same_result(local()).await;
}

#[tokio::test]
async fn local_control_commands_poll_and_run_once_agree() {
    control_commands_poll_or_run_once_with_the_same_result(local()).await;
}

#[tokio::test]
async fn local_poll_path_delivers_a_large_multibyte_flood_intact() {
    a_large_multibyte_flood_polls_in_bounded_reads_with_the_same_result(local()).await;
}

#[tokio::test]
async fn local_native_sync_in_and_the_base64_fallback_agree() {
    sync_native_or_base64_gives_the_same_tree(local(), Cap::NativeSyncIn).await;
}

#[tokio::test]
async fn local_native_sync_out_and_the_base64_fallback_agree() {
    sync_native_or_base64_gives_the_same_tree(local(), Cap::NativeSyncOut).await;
}

#[tokio::test]
async fn local_reusable_leases_and_the_stored_lease_path_agree() {
    reuse_resumes_or_uses_the_stored_lease_with_the_same_result(local()).await;
}

// ---------------------------------------------------------------- docker

#[tokio::test]
async fn docker_incremental_output_and_its_fallback_agree() {
    incremental_output_streams_or_falls_back_with_the_same_result(docker()).await;
}

#[tokio::test]
async fn docker_persistent_sessions_and_one_shot_agree() {
    sessions_or_one_shot_give_the_same_result(docker()).await;
}

#[tokio::test]
async fn docker_control_commands_poll_and_run_once_agree() {
    control_commands_poll_or_run_once_with_the_same_result(docker()).await;
}

#[tokio::test]
async fn docker_native_sync_in_and_the_base64_fallback_agree() {
    sync_native_or_base64_gives_the_same_tree(docker(), Cap::NativeSyncIn).await;
}

#[tokio::test]
async fn docker_native_sync_out_and_the_base64_fallback_agree() {
    sync_native_or_base64_gives_the_same_tree(docker(), Cap::NativeSyncOut).await;
}

#[tokio::test]
async fn docker_reusable_leases_and_the_stored_lease_path_agree() {
    reuse_resumes_or_uses_the_stored_lease_with_the_same_result(docker()).await;
}
