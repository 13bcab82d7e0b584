//! The state store on a real SQLite file, including several connections
//! (as several `sandhost` processes have) racing on one home.

use std::sync::{Arc, Barrier};

use sandhost_contract::resolve::LeasePolicy;
use sandhost_runtime::store::{LeaseOutcome, LeaseState, NewLease, SandboxRecord, Store};
use serde_json::json;

fn new_lease<'a>(env: &'a str, policy: LeasePolicy) -> NewLease<'a> {
    NewLease {
        environment_id: env,
        policy,
        plugin_id: "sandhost.local",
        plugin_version: "0.1.0",
        driver_key: "local",
    }
}

#[test]
fn opening_a_fresh_home_applies_every_migration_and_reopening_keeps_the_version() {
    let home = tempfile::tempdir().unwrap();
    let s = Store::open(home.path()).unwrap();
    assert_eq!(
        s.schema_version().unwrap(),
        Store::supported_schema_version()
    );
    drop(s);
    let s = Store::open(home.path()).unwrap();
    assert_eq!(
        s.schema_version().unwrap(),
        Store::supported_schema_version()
    );
}

#[test]
fn a_store_newer_than_this_build_is_refused_with_e5003() {
    let home = tempfile::tempdir().unwrap();
    drop(Store::open(home.path()).unwrap());
    let conn = rusqlite::Connection::open(home.path().join("sandhost.db")).unwrap();
    conn.pragma_update(None, "user_version", 999).unwrap();
    drop(conn);
    let err = Store::open(home.path()).unwrap_err();
    assert_eq!(err.code().as_str(), "E5003");
}

#[test]
fn the_same_driver_and_config_map_to_one_environment() {
    let home = tempfile::tempdir().unwrap();
    let s = Store::open(home.path()).unwrap();
    let a = s.environment_for("local", &json!({"image": "x"})).unwrap();
    let b = s.environment_for("local", &json!({"image": "x"})).unwrap();
    let c = s.environment_for("local", &json!({"image": "y"})).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
}

#[test]
fn a_lease_starts_acquiring_and_records_provider_id_outcome_and_reason() {
    let home = tempfile::tempdir().unwrap();
    let s = Store::open(home.path()).unwrap();
    let env = s.environment_for("local", &json!({})).unwrap();
    let l = s
        .insert_lease(&new_lease(&env, LeasePolicy::ReuseByEnvironment))
        .unwrap();
    assert_eq!(l.state, LeaseState::Acquiring);
    assert_eq!(l.provider_lease_id, None);
    s.lease_acquired(
        &l.id,
        "p-1",
        &json!({"k": 1}),
        Some(10),
        LeaseOutcome::Created,
        "no retained lease",
    )
    .unwrap();
    let l = s.lease(&l.id).unwrap();
    assert_eq!(l.state, LeaseState::Active);
    assert_eq!(l.provider_lease_id.as_deref(), Some("p-1"));
    assert_eq!(l.metadata, json!({"k": 1}));
    assert_eq!(l.outcome.as_deref(), Some("created"));
    assert_eq!(l.outcome_reason.as_deref(), Some("no retained lease"));
    assert_eq!(l.plugin_id, "sandhost.local");
}

#[test]
fn retained_lease_lookup_ignores_ephemeral_and_destroyed_leases() {
    let home = tempfile::tempdir().unwrap();
    let s = Store::open(home.path()).unwrap();
    let env = s.environment_for("local", &json!({})).unwrap();
    let eph = s
        .insert_lease(&new_lease(&env, LeasePolicy::Ephemeral))
        .unwrap();
    s.lease_acquired(&eph.id, "p-e", &json!({}), None, LeaseOutcome::Created, "")
        .unwrap();
    assert_eq!(s.retained_lease(&env).unwrap(), None);
    let kept = s
        .insert_lease(&new_lease(&env, LeasePolicy::ReuseByEnvironment))
        .unwrap();
    s.lease_acquired(&kept.id, "p-k", &json!({}), None, LeaseOutcome::Created, "")
        .unwrap();
    assert_eq!(s.retained_lease(&env).unwrap().unwrap().id, kept.id);
    assert!(s
        .transition_lease(&kept.id, LeaseState::Active, LeaseState::Destroyed)
        .unwrap());
    assert_eq!(s.retained_lease(&env).unwrap(), None);
}

#[test]
fn expired_and_stuck_leases_are_found_for_cleanup_but_live_ones_are_not() {
    let home = tempfile::tempdir().unwrap();
    let s = Store::open(home.path()).unwrap();
    let env = s.environment_for("local", &json!({})).unwrap();
    let now = sandhost_runtime::store::now_secs();
    let expired = s
        .insert_lease(&new_lease(&env, LeasePolicy::Ephemeral))
        .unwrap();
    s.lease_acquired(
        &expired.id,
        "a",
        &json!({}),
        Some(now - 1),
        LeaseOutcome::Created,
        "",
    )
    .unwrap();
    let live = s
        .insert_lease(&new_lease(&env, LeasePolicy::Ephemeral))
        .unwrap();
    s.lease_acquired(
        &live.id,
        "b",
        &json!({}),
        Some(now + 3600),
        LeaseOutcome::Created,
        "",
    )
    .unwrap();
    let stuck = s
        .insert_lease(&new_lease(&env, LeasePolicy::Ephemeral))
        .unwrap();
    // `stuck` has been acquiring since `now`: stuck after 0 s, not after an hour
    let ids = |v: Vec<sandhost_runtime::store::LeaseRecord>| {
        v.into_iter().map(|l| l.id).collect::<Vec<_>>()
    };
    let found = ids(s.leases_needing_cleanup(now, 0).unwrap());
    assert!(
        found.contains(&expired.id) && found.contains(&stuck.id) && !found.contains(&live.id),
        "{found:?}"
    );
    let found = ids(s.leases_needing_cleanup(now, 3600).unwrap());
    assert_eq!(found, vec![expired.id]);
}

#[test]
fn of_many_connections_racing_to_claim_one_lease_exactly_one_wins() {
    let home = tempfile::tempdir().unwrap();
    let s = Store::open(home.path()).unwrap();
    let env = s.environment_for("local", &json!({})).unwrap();
    let l = s
        .insert_lease(&new_lease(&env, LeasePolicy::Ephemeral))
        .unwrap();
    s.lease_acquired(&l.id, "p", &json!({}), None, LeaseOutcome::Created, "")
        .unwrap();
    let n = 8;
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (home, id, barrier) = (home.path().to_path_buf(), l.id.clone(), barrier.clone());
            std::thread::spawn(move || {
                let s = Store::open(&home).unwrap();
                barrier.wait();
                s.transition_lease(&id, LeaseState::Active, LeaseState::Destroying)
                    .unwrap()
            })
        })
        .collect();
    let wins = handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .filter(|w| *w)
        .count();
    assert_eq!(wins, 1);
}

#[test]
fn concurrent_writers_on_one_home_lose_no_rows() {
    let home = tempfile::tempdir().unwrap();
    drop(Store::open(home.path()).unwrap());
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let home = home.path().to_path_buf();
            std::thread::spawn(move || {
                let s = Store::open(&home).unwrap();
                let env = s.environment_for("local", &json!({})).unwrap();
                for i in 0..25 {
                    let l = s
                        .insert_lease(&new_lease(&env, LeasePolicy::Ephemeral))
                        .unwrap();
                    s.insert_sandbox(&SandboxRecord {
                        id: format!("sbx-{t}-{i}"),
                        lease_id: l.id,
                        provider: "local".into(),
                        template_name: "default".into(),
                        template_yaml: "name: default\n".into(),
                        state: "running".into(),
                        created_at: 0,
                        expires_at: None,
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let s = Store::open(home.path()).unwrap();
    assert_eq!(s.sandboxes().unwrap().len(), 100);
    assert!(s.delete_sandbox("sbx-0-0").unwrap());
    assert!(!s.delete_sandbox("sbx-0-0").unwrap());
    assert_eq!(s.sandbox("sbx-0-0").unwrap_err().code().as_str(), "E5004");
}
