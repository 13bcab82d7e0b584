//! The host supervises its workers: a dead worker is restarted on next use
//! with growing backoff, one that keeps dying is given up with a typed
//! error, and an idle worker that no longer answers its health check is
//! replaced. Real worker processes (tests/workers/misbehave.py).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sandhost_contract::manifest::parse_manifest;
use sandhost_protocol::{methods, ExecuteParams};
use sandhost_runtime::host::{restart_backoff, Host, HostConfig};
use sandhost_runtime::plugins::{Plugin, PluginSource, Registry};
use sandhost_runtime::worker::{Worker, WorkerOptions};

fn plugin(mode: &str) -> Plugin {
    let manifest = parse_manifest(&format!(
        r#"{{"id":"test.{mode}","version":"1","worker":{{"command":["python3","misbehave.py","{mode}"]}},
            "environmentDrivers":[{{"driverKey":"{mode}","kind":"sandbox_provider"}}]}}"#
    ))
    .unwrap();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers");
    Plugin {
        dir,
        manifest,
        source: PluginSource::Flag,
    }
}

async fn host(home: &Path, p: &Plugin, opts: WorkerOptions) -> Host {
    let registry = Registry::discover(&[], None, vec![p.clone()]);
    Host::open(HostConfig {
        home: home.into(),
        registry,
        worker_options: opts,
    })
    .await
    .unwrap()
}

fn exec_params() -> ExecuteParams {
    serde_json::from_value(serde_json::json!({
        "driverKey": "t", "companyId": "c", "environmentId": "e", "issueId": null, "config": {},
        "lease": {"providerLeaseId": "l", "expiresAt": null}, "command": "x"
    }))
    .unwrap()
}

async fn crash(w: &Worker) {
    let err = w
        .execute(&exec_params(), Duration::from_secs(10), |_| {})
        .await
        .unwrap_err();
    assert_eq!(err.code().as_str(), "E4102", "{err}");
}

#[test]
fn restart_backoff_doubles_from_100_ms_and_is_capped() {
    let waits: Vec<u128> = (1..=8).map(|n| restart_backoff(n).as_millis()).collect();
    assert_eq!(waits, vec![100, 200, 400, 800, 1600, 3200, 5000, 5000]);
}

#[tokio::test]
async fn a_dead_worker_is_restarted_on_next_use_after_a_growing_backoff() {
    let home = tempfile::tempdir().unwrap();
    let p = plugin("crash");
    let h = host(home.path(), &p, WorkerOptions::default()).await;
    let first = h.worker(&p).await.unwrap();
    assert!(
        Arc::ptr_eq(&first, &h.worker(&p).await.unwrap()),
        "a live worker is reused"
    );
    crash(&first).await;
    let t = Instant::now();
    let second = h.worker(&p).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    assert!(!Arc::ptr_eq(&first, &second), "a new process");
    assert!(second.dead_reason().is_none());
    crash(&second).await;
    let t = Instant::now();
    let third = h.worker(&p).await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "{:?}",
        t.elapsed()
    );
    assert!(third.supports("environmentExecute"));
}

#[tokio::test]
async fn a_worker_that_keeps_dying_is_given_up_with_e5208() {
    let home = tempfile::tempdir().unwrap();
    let p = plugin("crash");
    let h = host(home.path(), &p, WorkerOptions::default()).await;
    let mut last = None;
    for _ in 0..=5 {
        match h.worker(&p).await {
            Ok(w) => crash(&w).await,
            Err(e) => {
                last = Some(e);
                break;
            }
        }
    }
    let err = match last {
        Some(e) => e,
        None => h.worker(&p).await.unwrap_err(),
    };
    assert_eq!(err.code().as_str(), "E5208", "{err}");
    assert!(err.to_string().contains("test.crash"));
}

#[tokio::test]
async fn an_idle_worker_that_fails_its_health_check_is_replaced() {
    let home = tempfile::tempdir().unwrap();
    let p = plugin("hang");
    let opts = WorkerOptions {
        health_interval: Duration::ZERO,
        health_timeout: Duration::from_millis(300),
        ..WorkerOptions::default()
    };
    let h = host(home.path(), &p, opts).await;
    let first = h.worker(&p).await.unwrap();
    // the scripted worker hangs whole on execute
    let hung = first.clone();
    tokio::spawn(async move {
        let _ = hung
            .execute(&exec_params(), Duration::from_secs(30), |_| {})
            .await;
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = h.worker(&p).await.unwrap();
    assert!(
        !Arc::ptr_eq(&first, &second),
        "the hung worker was replaced"
    );
    let health = second.call::<methods::Health>(&Default::default()).await;
    assert!(health.is_ok(), "{health:?}");
}
