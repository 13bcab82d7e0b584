//! Retained leases: a later connection resumes the lease; when the provider
//! says it is gone, the stale lease is destroyed and a replacement acquired,
//! with the outcome and its reason recorded. Through the examples/ Python
//! plugin (a real worker process).

use std::path::Path;
use std::time::Duration;

use sandhost_contract::resolve::LeasePolicy;
use sandhost_contract::template::Template;
use sandhost_protocol::{methods, LeaseEndParams};
use sandhost_runtime::exec::{exec, Collected, ExecRequest};
use sandhost_runtime::host::{CreateRequest, Host, HostConfig};
use sandhost_runtime::plugins::{Plugin, PluginSource, Registry};
use sandhost_runtime::store::{LeaseOutcome, LeaseState, Store};
use sandhost_runtime::worker::WorkerOptions;

async fn host(home: &Path) -> Host {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/python-provider");
    let plugin = Plugin::load(&dir, PluginSource::Flag).unwrap();
    let registry = Registry::discover(&[], None, vec![plugin]);
    Host::open(HostConfig {
        home: home.into(),
        registry,
        worker_options: WorkerOptions::default(),
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn a_lease_gone_at_the_provider_is_destroyed_and_replaced_with_the_reason_recorded() {
    let home = tempfile::tempdir().unwrap();
    let h = host(home.path()).await;
    let sb = h
        .create(CreateRequest {
            template: Template::builtin(),
            template_yaml: "name: default\n".into(),
            provider: Some("python-tempdir".into()),
            config: serde_json::json!({}),
            ttl: Some(Duration::from_secs(600)),
            policy: LeasePolicy::ReuseByEnvironment,
        })
        .await
        .unwrap();
    let (id, old_lease) = (sb.record.id.clone(), sb.record.lease_id.clone());
    // the provider loses the lease behind the host's back
    sb.ctx
        .worker
        .call::<methods::DestroyLease>(&LeaseEndParams {
            scope: sb.ctx.scope.clone(),
            provider_lease_id: sb.ctx.lease.provider_lease_id.clone().unwrap(),
            lease_metadata: None,
            cancel_active_work: None,
        })
        .await
        .unwrap();
    h.shutdown().await;

    let h = host(home.path()).await;
    let again = h.connect(&id).await.unwrap();
    assert_eq!(again.outcome, LeaseOutcome::Replacement);
    assert!(
        again.outcome_reason.contains("not_found"),
        "{}",
        again.outcome_reason
    );
    assert_ne!(
        again.record.lease_id, old_lease,
        "the sandbox points at a new lease"
    );
    // the replacement works
    let mut out = Collected::default();
    let req = ExecRequest {
        argv: vec!["echo".into(), "fresh".into()],
        ..ExecRequest::default()
    };
    let o = exec(&again.ctx, &req, &mut out).await.unwrap();
    assert_eq!((o.exit_code, out.stdout.as_str()), (Some(0), "fresh\n"));
    // and the store says so
    let store = Store::open(home.path()).unwrap();
    assert_eq!(
        store.lease(&old_lease).unwrap().state,
        LeaseState::Destroyed
    );
    let new = store.lease(&again.record.lease_id).unwrap();
    assert_eq!(new.outcome.as_deref(), Some("replacement"));
    assert!(new.outcome_reason.unwrap().contains("not_found"));
    // a later connection resumes the replacement
    let third = h.connect(&id).await.unwrap();
    assert_eq!(third.outcome, LeaseOutcome::Resumed);
    assert_eq!(third.record.lease_id, again.record.lease_id);
    h.kill(&id).await.unwrap();
}
