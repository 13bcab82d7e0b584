//! Property: for any declaration, any verified method set and any narrowing, the
//! resolution only grants what every input allows, and grants nothing when the
//! plugin identity cannot be established.
//!
//! The expected values are computed here from the spec's own words (its
//! prerequisite table, its legacy precedence, its narrowing list), not from the
//! crate's helpers, so a drift in the crate's table or fold makes this fail.

use std::collections::BTreeSet;

use proptest::collection::btree_set;
use proptest::option;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use sandhost_contract::capability::ProviderCapability as C;
use sandhost_contract::manifest::validate_manifest;
use sandhost_contract::resolve::{
    establish_declaration, resolve, LeaseFacts, LeasePolicy, ResolutionInput, Verified,
};
use serde_json::{json, Map, Value};

/// The spec's prerequisite table, restated.
fn spec_prerequisites(cap: C) -> &'static [&'static str] {
    match cap {
        C::ReusableLeases => &[
            "environmentResumeLease",
            "environmentReleaseLease",
            "environmentDestroyLease",
        ],
        C::NativeSyncIn | C::NativeSyncOut => &["environmentSyncIn", "environmentSyncOut"],
        C::PersistentProcessSessions
        | C::IndependentControlCommands
        | C::IncrementalSessionOutput => &["environmentExecute"],
    }
}

/// Methods a worker may advertise: every prerequisite plus unrelated ones.
const METHOD_POOL: [&str; 11] = [
    "environmentResumeLease",
    "environmentReleaseLease",
    "environmentDestroyLease",
    "environmentSyncIn",
    "environmentSyncOut",
    "environmentExecute",
    "environmentAcquireLease",
    "environmentProbe",
    "initialize",
    "health",
    "shutdown",
];

/// One generated run.
#[derive(Debug, Clone)]
struct Case {
    /// `None`: no `sandboxCapabilities` object; else per key None = omitted.
    nested: Option<[Option<bool>; 6]>,
    legacy: Option<bool>,
    verified: Option<BTreeSet<&'static str>>,
    policy: LeasePolicy,
    job_backend: bool,
    native_file_sync_unsupported: bool,
    config_resolution_failed: bool,
    /// 0: identified; 1: plugin absent; 2: driver key not declared; 3: wrong kind;
    /// 4: pinned to another plugin; 5: pinned to the same plugin (identified).
    identity: u8,
}

fn case() -> impl Strategy<Value = Case> {
    case_with_identity(0u8..6)
}

fn case_with_identity(identity: impl Strategy<Value = u8>) -> impl Strategy<Value = Case> {
    (
        option::of(proptest::array::uniform6(option::of(any::<bool>()))),
        option::of(any::<bool>()),
        option::of(btree_set(
            proptest::sample::select(&METHOD_POOL[..]),
            0..=METHOD_POOL.len(),
        )),
        prop_oneof![
            Just(LeasePolicy::Ephemeral),
            Just(LeasePolicy::ReuseByEnvironment)
        ],
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        identity,
    )
        .prop_map(
            |(nested, legacy, verified, policy, job_backend, nfsu, cfg, identity)| Case {
                nested,
                legacy,
                verified,
                policy,
                job_backend,
                native_file_sync_unsupported: nfsu,
                config_resolution_failed: cfg,
                identity,
            },
        )
}

fn manifest_json(c: &Case) -> Value {
    let mut driver = json!({
        "driverKey": "acme",
        "kind": if c.identity == 3 { "other_kind" } else { "sandbox_provider" },
    });
    if let Some(nested) = &c.nested {
        let mut obj = Map::new();
        for (cap, v) in C::ALL.into_iter().zip(nested) {
            if let Some(b) = v {
                obj.insert(cap.as_str().into(), json!(b));
            }
        }
        driver["sandboxCapabilities"] = Value::Object(obj);
    }
    if let Some(l) = c.legacy {
        driver["supportsReusableLeases"] = json!(l);
    }
    json!({
        "id": "acme.sandbox",
        "version": "1.0.0",
        "worker": {"command": ["./worker"]},
        "environmentDrivers": [driver],
    })
}

/// The declared value of `cap` per the spec: nested wins, legacy folds into
/// `reusableLeases` only when the nested key is absent.
fn spec_declared(c: &Case, cap: C) -> Option<bool> {
    let nested = c.nested.as_ref().and_then(|n| n[cap as usize]);
    if cap == C::ReusableLeases {
        nested.or(c.legacy)
    } else {
        nested
    }
}

fn spec_narrowed(c: &Case, cap: C) -> bool {
    match cap {
        C::ReusableLeases => c.policy == LeasePolicy::Ephemeral,
        C::NativeSyncIn | C::NativeSyncOut => c.job_backend || c.native_file_sync_unsupported,
        C::PersistentProcessSessions | C::IncrementalSessionOutput => c.config_resolution_failed,
        C::IndependentControlCommands => false,
    }
}

fn identity_established(c: &Case) -> bool {
    matches!(c.identity, 0 | 5)
}

fn run(c: &Case) -> sandhost_contract::resolve::Resolution {
    let manifest = validate_manifest(&manifest_json(c)).expect("generated manifest is valid");
    let plugin = if c.identity == 1 {
        None
    } else {
        Some(&manifest)
    };
    let driver_key = if c.identity == 2 { "zeta" } else { "acme" };
    let pinned = match c.identity {
        4 => Some("someone.else"),
        5 => Some("acme.sandbox"),
        _ => None,
    };
    let input = ResolutionInput {
        declaration: establish_declaration(plugin, driver_key, pinned),
        verified: Verified(
            c.verified
                .as_ref()
                .map(|s| s.iter().map(|m| m.to_string()).collect()),
        ),
        lease: LeaseFacts {
            policy: c.policy,
            job_backend: c.job_backend,
            native_file_sync_unsupported: c.native_file_sync_unsupported,
        },
        config_resolution_failed: c.config_resolution_failed,
    };
    resolve(&input)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 2048,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_effective_capability_is_verified_declared_and_not_narrowed(c in case()) {
        let r = run(&c);
        for cap in C::ALL {
            if !r.effective.value(cap) {
                continue;
            }
            // (a) verified: every prerequisite advertised (an empty or missing list verifies nothing)
            let advertised = c.verified.as_ref();
            prop_assert!(advertised.is_some_and(|s| !s.is_empty()), "{cap} on with no methods");
            for m in spec_prerequisites(cap) {
                prop_assert!(advertised.unwrap().contains(m), "{cap} on without {m}");
            }
            // (b) not declared false
            prop_assert_ne!(spec_declared(&c, cap), Some(false), "{} on though declared false", cap);
            // (c) not narrowed off
            prop_assert!(!spec_narrowed(&c, cap), "{cap} on though narrowed");
            // (d) opt-ins only when declared true
            if cap.is_opt_in() {
                prop_assert_eq!(spec_declared(&c, cap), Some(true), "{} on without opt-in", cap);
            }
            // identity established
            prop_assert!(identity_established(&c), "{cap} on without identity");
        }
    }

    #[test]
    fn identity_failure_gives_all_false(c in case_with_identity(1u8..5)) {
        prop_assert!(!identity_established(&c));
        let r = run(&c);
        for cap in C::ALL {
            prop_assert!(!r.effective.value(cap), "{cap}");
            prop_assert!(r.explain.get(cap).starts_with("off: plugin identity not established"));
        }
    }

    /// The converse: whenever every input allows a key, it is on. Together with
    /// the property above, effective is exactly the intersection.
    #[test]
    fn every_capability_all_inputs_allow_is_effective(c in case()) {
        let r = run(&c);
        for cap in C::ALL {
            let verified = c.verified.as_ref().is_some_and(|s| {
                spec_prerequisites(cap).iter().all(|m| s.contains(m))
            });
            let declared_ok = match spec_declared(&c, cap) {
                Some(b) => b,
                None => !cap.is_opt_in(),
            };
            let expect = identity_established(&c) && verified && declared_ok && !spec_narrowed(&c, cap);
            prop_assert_eq!(r.effective.value(cap), expect, "{}: {}", cap, r.explain.get(cap));
            prop_assert_eq!(r.explain.get(cap).starts_with("on: "), expect);
        }
    }
}
