//! A host that died between the provider's acquire and its own store write
//! left a lease row in `acquiring`, whose id travelled as `runId`. The next
//! process to open the home destroys that lease at the provider (built-in
//! providers take the runId as their lease id) and marks the row destroyed.
//! Real local sandboxes (needs root).

use std::path::Path;

use sandhost_contract::manifest::parse_manifest;
use sandhost_contract::resolve::LeasePolicy;
use sandhost_protocol::{methods, AcquireLeaseParams, EnvironmentScope};
use sandhost_runtime::host::{Host, HostConfig};
use sandhost_runtime::plugins::{Plugin, PluginSource, Registry};
use sandhost_runtime::store::{LeaseState, NewLease, Store};
use sandhost_runtime::worker::{Worker, WorkerOptions};

fn local() -> Plugin {
    let exe = std::env::current_exe().unwrap();
    let bin_dir = exe.parent().and_then(Path::parent).unwrap().to_path_buf();
    assert!(
        bin_dir.join("sandhost-provider-local").exists(),
        "build the workspace binaries first"
    );
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../providers/local/plugin.json"),
    )
    .unwrap();
    Plugin {
        dir: bin_dir,
        manifest: parse_manifest(&text).unwrap(),
        source: PluginSource::Builtin,
    }
}

#[tokio::test]
async fn a_lease_stranded_between_acquire_and_the_store_write_is_destroyed_by_the_next_process() {
    let home = tempfile::tempdir().unwrap();
    let plugin = local();
    // the dead process: it wrote the row, then asked the provider, then died
    let row = {
        let store = Store::open(home.path()).unwrap();
        let env = store
            .environment_for("local", &serde_json::json!({}))
            .unwrap();
        store
            .insert_lease(&NewLease {
                environment_id: &env,
                policy: LeasePolicy::Ephemeral,
                plugin_id: &plugin.manifest.id,
                plugin_version: &plugin.manifest.version,
                driver_key: "local",
            })
            .unwrap()
    };
    let mut spec = plugin.worker_spec();
    spec.env
        .push(("SANDHOST_HOME".into(), home.path().display().to_string()));
    let worker = Worker::spawn(&spec, WorkerOptions::default())
        .await
        .unwrap();
    let lease = worker
        .call::<methods::AcquireLease>(&AcquireLeaseParams {
            scope: EnvironmentScope {
                driver_key: "local".into(),
                company_id: "sandhost".into(),
                environment_id: row.environment_id.clone(),
                issue_id: None,
                config: serde_json::json!({}),
            },
            run_id: row.id.clone(),
            requested_cwd: None,
            agent_id: None,
            requested_expires_at: None,
        })
        .await
        .unwrap();
    assert_eq!(
        lease.provider_lease_id.as_deref(),
        Some(row.id.as_str()),
        "runId is the lease id"
    );
    worker.shutdown().await;
    let sandbox_dir = home.path().join("local").join(&row.id);
    assert!(sandbox_dir.exists(), "the stranded sandbox is alive");
    // time passes: the row has been `acquiring` for longer than any acquire takes
    let db = rusqlite::Connection::open(home.path().join("sandhost.db")).unwrap();
    db.execute(
        "UPDATE leases SET updated_at = updated_at - 3600 WHERE id = ?1",
        [&row.id],
    )
    .unwrap();
    drop(db);

    // the next process
    let registry = Registry::discover(&[], None, vec![plugin.clone()]);
    let host = Host::open(HostConfig {
        home: home.path().into(),
        registry,
        worker_options: WorkerOptions::default(),
    })
    .await
    .unwrap();
    host.shutdown().await;
    assert!(!sandbox_dir.exists(), "the stranded sandbox was destroyed");
    let store = Store::open(home.path()).unwrap();
    assert_eq!(store.lease(&row.id).unwrap().state, LeaseState::Destroyed);
}

#[tokio::test]
async fn an_expired_sandbox_is_destroyed_by_the_next_process() {
    let home = tempfile::tempdir().unwrap();
    let plugin = local();
    let registry = Registry::discover(&[], None, vec![plugin.clone()]);
    let cfg = HostConfig {
        home: home.path().into(),
        registry,
        worker_options: WorkerOptions::default(),
    };
    let host = Host::open(cfg.clone()).await.unwrap();
    let sb = host
        .create(sandhost_runtime::host::CreateRequest {
            template: sandhost_contract::template::Template::builtin(),
            template_yaml: "name: default\n".into(),
            provider: None,
            config: serde_json::json!({}),
            ttl: Some(std::time::Duration::from_secs(600)),
            policy: LeasePolicy::ReuseByEnvironment,
        })
        .await
        .unwrap();
    let lease_id = sb.record.lease_id.clone();
    let sandbox_dir = home
        .path()
        .join("local")
        .join(sb.ctx.lease.provider_lease_id.clone().unwrap());
    host.shutdown().await;
    assert!(sandbox_dir.exists());
    let db = rusqlite::Connection::open(home.path().join("sandhost.db")).unwrap();
    db.execute(
        "UPDATE leases SET expires_at = 1 WHERE id = ?1",
        [&lease_id],
    )
    .unwrap();
    drop(db);
    let host = Host::open(cfg).await.unwrap();
    assert!(
        host.list().unwrap().is_empty(),
        "the expired sandbox is gone from the store"
    );
    host.shutdown().await;
    assert!(!sandbox_dir.exists(), "and from the machine");
}
