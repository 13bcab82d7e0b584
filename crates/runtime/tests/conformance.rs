//! The provider conformance suite against live workers: the Python reference
//! provider must pass; a worker that advertises a method it does not
//! implement must fail, and the report must name that method.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandhost_runtime::conformance::{check_plugin, CheckOptions, CheckReport, ScenarioStatus};
use sandhost_runtime::plugins::{Plugin, PluginSource};
use sandhost_runtime::worker::WorkerOptions;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .unwrap()
        .to_path_buf()
}

fn opts() -> CheckOptions {
    CheckOptions {
        call_timeout: Duration::from_secs(20),
        worker: WorkerOptions {
            init_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(3),
            ..WorkerOptions::default()
        },
        ..CheckOptions::default()
    }
}

/// A plugin directory in a temp dir whose worker is `dishonest.py MODE`.
fn dishonest_plugin(mode: &str) -> (tempfile::TempDir, Plugin) {
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/dishonest.py");
    let manifest = serde_json::json!({
        "id": format!("sandhost-test-dishonest-{mode}"),
        "version": "0.0.1",
        "worker": {"command": ["python3", script.to_string_lossy(), mode]},
        "environmentDrivers": [{
            "driverKey": "dishonest",
            "kind": "sandbox_provider",
            "sandboxCapabilities": {"reusableLeases": true}
        }]
    });
    std::fs::write(
        dir.path().join("plugin.json"),
        serde_json::to_string_pretty(&manifest).unwrap(),
    )
    .unwrap();
    let plugin = Plugin::load(dir.path(), PluginSource::Flag).unwrap();
    (dir, plugin)
}

fn status<'a>(report: &'a CheckReport, name: &str) -> &'a ScenarioStatus {
    &report
        .scenario(name)
        .unwrap_or_else(|| panic!("no scenario `{name}` in\n{}", report.render()))
        .status
}

fn assert_passed(report: &CheckReport, name: &str) {
    assert_eq!(
        status(report, name),
        &ScenarioStatus::Passed,
        "{}",
        report.render()
    );
}

fn assert_failed(report: &CheckReport, name: &str) {
    assert!(
        matches!(status(report, name), ScenarioStatus::Failed(_)),
        "`{name}` should fail:\n{}",
        report.render()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_reference_provider_passes_every_scenario_it_advertises() {
    let dir = workspace_root().join("examples/python-provider");
    let plugin = Plugin::load(&dir, PluginSource::Flag).expect("examples/python-provider loads");
    let report = check_plugin(&plugin, &opts()).await;
    println!("{}", report.render());
    assert!(report.passed(), "{}", report.render());
    assert_eq!(report.driver_key.as_deref(), Some("python-tempdir"));
    // What it advertises is really exercised, behaviour included.
    for name in [
        "handshake",
        "health",
        "acquire lease",
        "execute: exit code",
        "execute: stdout and stderr separated",
        "execute: stdin delivered",
        "execute: env and cwd honoured",
        "execute: timeout",
        "execute.log streaming",
        "sync: round trip",
        "sync: atomic replace",
        "sync: path confinement",
        "resume lease",
        "release lease",
        "destroy lease",
        "shutdown",
        "every advertised method exercised",
    ] {
        assert_passed(&report, name);
    }
    for m in &report.advertised_methods {
        assert!(
            report.exercised_methods.contains(m),
            "{m} not exercised:\n{}",
            report.render()
        );
    }
    // Not advertised, so not required.
    assert!(matches!(
        status(&report, "duplex channels"),
        ScenarioStatus::Skipped(_)
    ));
    let json = report.to_json();
    assert_eq!(json["passed"], true);
    assert_eq!(json["pluginId"], "sandhost-example-python");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_advertising_sync_it_answers_not_implemented_fails_naming_both_methods() {
    let (_dir, plugin) = dishonest_plugin("sync-not-implemented");
    let report = check_plugin(&plugin, &opts()).await;
    assert!(!report.passed(), "{}", report.render());
    let lying: Vec<&str> = report.lying_methods.keys().map(String::as_str).collect();
    assert_eq!(
        lying,
        ["environmentSyncIn", "environmentSyncOut"],
        "{}",
        report.render()
    );
    assert!(report.lying_methods["environmentSyncIn"].contains("-32004"));
    assert_failed(&report, "sync: round trip");
    // The honest parts are still judged on their merits.
    assert_passed(&report, "execute: exit code");
    assert_passed(&report, "execute: timeout");
    let json = report.to_json();
    assert_eq!(json["passed"], false);
    assert_eq!(json["lyingMethods"][0]["method"], "environmentSyncIn");
    assert!(report.render().contains("environmentSyncOut"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_worker_crashing_on_an_advertised_resume_fails_naming_resume_and_is_restarted() {
    let (_dir, plugin) = dishonest_plugin("resume-crash");
    let report = check_plugin(&plugin, &opts()).await;
    assert!(!report.passed(), "{}", report.render());
    let lying: Vec<&str> = report.lying_methods.keys().map(String::as_str).collect();
    assert_eq!(lying, ["environmentResumeLease"], "{}", report.render());
    assert!(
        report.lying_methods["environmentResumeLease"].contains("crashed"),
        "{}",
        report.render()
    );
    assert_failed(&report, "resume lease");
    // The worker is restarted: the scenarios after the crash still run.
    assert_passed(&report, "shutdown");
    assert!(report.exercised_methods.contains("environmentDestroyLease"));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_honest_worker_without_sync_passes_with_the_sync_scenarios_skipped() {
    let (_dir, plugin) = dishonest_plugin("honest");
    let report = check_plugin(&plugin, &opts()).await;
    assert!(report.passed(), "{}", report.render());
    assert!(matches!(
        status(&report, "sync: round trip"),
        ScenarioStatus::Skipped(_)
    ));
    assert!(!report.exercised_methods.contains("environmentSyncIn"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_driver_key_the_plugin_does_not_declare_fails_without_starting_a_worker() {
    let (_dir, plugin) = dishonest_plugin("honest");
    let opts = CheckOptions {
        driver_key: Some("nope".into()),
        ..opts()
    };
    let report = check_plugin(&plugin, &opts).await;
    assert!(!report.passed());
    assert_failed(&report, "driver");
    assert!(report.exercised_methods.is_empty());
}
