//! Table tests for the sandbox provider capability contract
//! (shared/spec/sandbox-provider-capability-contract.md). Each test is named after
//! the behaviour of the spec it pins; the section comments follow the spec.

use std::collections::BTreeSet;

use sandhost_contract::capability::{Declared, ProviderCapability as C};
use sandhost_contract::manifest::{
    parse_manifest, validate_manifest, validate_manifest_at, DriverKind, PluginManifest,
};
use sandhost_contract::prerequisites::{all_prerequisite_methods, required_methods};
use sandhost_contract::resolve::{
    establish_declaration, narrowing, resolve, DeclarationState, IdentityFailure, LeaseFacts,
    LeasePolicy, Narrow, NarrowReason, Reason, Resolution, ResolutionInput, Verified,
};
use sandhost_contract::scenario::parse_scenario;
use sandhost_contract::ContractError;
use serde_json::{json, Value};

// ---------------------------------------------------------------- helpers

const PLUGIN_ID: &str = "acme.sandbox";
const KEY: &str = "acme";

fn plugin_json(driver: Value) -> Value {
    json!({
        "id": PLUGIN_ID,
        "version": "1.0.0",
        "worker": {"command": ["./worker"]},
        "environmentDrivers": [driver],
    })
}

/// A sandbox_provider driver; `caps` = None leaves out `sandboxCapabilities`.
fn driver_json(caps: Option<Value>, legacy: Option<bool>) -> Value {
    let mut d = json!({"driverKey": KEY, "kind": "sandbox_provider"});
    if let Some(c) = caps {
        d["sandboxCapabilities"] = c;
    }
    if let Some(l) = legacy {
        d["supportsReusableLeases"] = json!(l);
    }
    d
}

fn manifest(caps: Option<Value>, legacy: Option<bool>) -> PluginManifest {
    validate_manifest(&plugin_json(driver_json(caps, legacy))).expect("valid manifest")
}

fn declaration(caps: Option<Value>, legacy: Option<bool>) -> DeclarationState {
    establish_declaration(Some(&manifest(caps, legacy)), KEY, None)
}

fn all_true() -> Value {
    let mut o = serde_json::Map::new();
    for c in C::ALL {
        o.insert(c.as_str().into(), json!(true));
    }
    Value::Object(o)
}

fn caps_with(cap: C, v: bool) -> Value {
    let mut o = serde_json::Map::new();
    o.insert(cap.as_str().into(), json!(v));
    Value::Object(o)
}

fn all_methods() -> Verified {
    Verified::methods(all_prerequisite_methods())
}

fn methods_without(drop: &str) -> Verified {
    Verified::methods(
        all_prerequisite_methods()
            .into_iter()
            .filter(|m| *m != drop),
    )
}

/// The most permissive run: a retained lease, no job backend, config resolved.
fn open_lease() -> LeaseFacts {
    LeaseFacts {
        policy: LeasePolicy::ReuseByEnvironment,
        ..LeaseFacts::default()
    }
}

fn run(declaration: DeclarationState, verified: Verified) -> Resolution {
    resolve(&ResolutionInput {
        declaration,
        verified,
        lease: open_lease(),
        config_resolution_failed: false,
    })
}

fn run_with(
    declaration: DeclarationState,
    verified: Verified,
    lease: LeaseFacts,
    config_resolution_failed: bool,
) -> Resolution {
    resolve(&ResolutionInput {
        declaration,
        verified,
        lease,
        config_resolution_failed,
    })
}

fn on(r: &Resolution, cap: C) -> bool {
    r.effective.value(cap)
}

fn assert_all_off(r: &Resolution) {
    for cap in C::ALL {
        assert!(!on(r, cap), "{cap} should be off: {}", r.explain.get(cap));
        assert!(
            r.explain.get(cap).starts_with("off: "),
            "{}",
            r.explain.get(cap)
        );
    }
}

fn declared_of(m: &PluginManifest, cap: C) -> Declared {
    m.driver(KEY).unwrap().declared.value(cap)
}

// ------------------------------------- how the host resolves an effective capability

#[test]
fn fully_declared_verified_unnarrowed_run_grants_every_capability() {
    // Baseline that makes every "off" test below meaningful.
    let r = run(declaration(Some(all_true()), None), all_methods());
    for cap in C::ALL {
        assert!(on(&r, cap), "{cap}: {}", r.explain.get(cap));
    }
}

#[test]
fn declaration_alone_never_grants_a_capability() {
    for verified in [Verified::missing(), Verified::methods(Vec::<String>::new())] {
        let r = run(declaration(Some(all_true()), None), verified);
        assert_all_off(&r);
    }
}

#[test]
fn capability_is_verified_only_when_every_required_method_is_advertised() {
    for cap in C::ALL {
        for method in required_methods(cap) {
            let r = run(declaration(Some(all_true()), None), methods_without(method));
            assert!(!on(&r, cap), "{cap} on without {method}");
            assert!(
                r.explain.get(cap).contains(method),
                "{}",
                r.explain.get(cap)
            );
        }
    }
}

#[test]
fn empty_method_list_verifies_nothing() {
    let r = run(
        declaration(Some(all_true()), None),
        Verified::methods(Vec::<String>::new()),
    );
    assert_all_off(&r);
    for cap in C::ALL {
        assert_eq!(r.reasons.get(cap), &Reason::EmptyMethodList);
    }
}

#[test]
fn missing_method_list_verifies_nothing() {
    for caps in [Some(all_true()), None] {
        let r = run(declaration(caps, None), Verified::missing());
        assert_all_off(&r);
    }
}

#[test]
fn unrelated_methods_verify_nothing() {
    let r = run(
        declaration(Some(all_true()), None),
        Verified::methods([
            "initialize",
            "health",
            "shutdown",
            "environmentAcquireLease",
        ]),
    );
    assert_all_off(&r);
}

#[test]
fn declared_true_still_requires_verified_prerequisites() {
    for cap in C::ALL {
        let others: Vec<&str> = all_prerequisite_methods()
            .into_iter()
            .filter(|m| !required_methods(cap).contains(m))
            .collect();
        let r = run(
            declaration(Some(caps_with(cap, true)), None),
            Verified::methods(others),
        );
        assert!(!on(&r, cap), "{cap} granted without its methods");
    }
}

#[test]
fn narrowing_never_adds_a_capability() {
    // With no narrowing at all, an unverified or declared-false key stays off.
    let n = narrowing(&open_lease(), false);
    for cap in C::ALL {
        assert_eq!(n.get(cap), Narrow::NotNarrowed);
    }
    let r = run(declaration(Some(all_true()), None), Verified::missing());
    assert_all_off(&r);
    let all_false = json!({
        "reusableLeases": false, "nativeSyncIn": false, "nativeSyncOut": false,
        "persistentProcessSessions": false, "independentControlCommands": false,
        "incrementalSessionOutput": false
    });
    assert_all_off(&run(declaration(Some(all_false), None), all_methods()));
}

#[test]
fn effective_requires_verified_declared_and_not_narrowed() {
    for cap in C::ALL {
        let mut seen_on = 0;
        for verified in [true, false] {
            for declared in [Declared::Omitted, Declared::False, Declared::True] {
                for narrowed in [true, false] {
                    let caps = match declared {
                        Declared::Omitted => json!({}),
                        d => caps_with(cap, d == Declared::True),
                    };
                    let methods = if verified {
                        all_methods()
                    } else {
                        methods_without(required_methods(cap)[0])
                    };
                    // A run that narrows exactly this key's family off.
                    let (lease, cfg) = if narrowed {
                        match cap {
                            C::ReusableLeases => (LeaseFacts::default(), false),
                            C::NativeSyncIn | C::NativeSyncOut => (
                                LeaseFacts {
                                    job_backend: true,
                                    ..open_lease()
                                },
                                false,
                            ),
                            C::PersistentProcessSessions | C::IncrementalSessionOutput => {
                                (open_lease(), true)
                            }
                            // Nothing in the contract narrows this key.
                            C::IndependentControlCommands => continue,
                        }
                    } else {
                        (open_lease(), false)
                    };
                    let r = run_with(declaration(Some(caps), None), methods, lease, cfg);
                    let allowed_by_declaration = match declared {
                        Declared::False => false,
                        Declared::True => true,
                        Declared::Omitted => !cap.is_opt_in(),
                    };
                    let expect = verified && allowed_by_declaration && !narrowed;
                    assert_eq!(
                        on(&r, cap),
                        expect,
                        "{cap} v={verified} d={declared:?} n={narrowed}"
                    );
                    seen_on += usize::from(expect);
                }
            }
        }
        assert!(seen_on > 0, "{cap} never on in the table");
    }
}

// -------------------------------------------- the declaration is optional and partial

#[test]
fn every_sandbox_capability_key_is_optional() {
    let m = manifest(Some(json!({})), None);
    let d = m.driver(KEY).unwrap();
    assert!(d.capabilities_object_present);
    for cap in C::ALL {
        assert_eq!(d.declared.value(cap), Declared::Omitted);
    }
    for cap in C::ALL {
        let m = manifest(Some(caps_with(cap, true)), None);
        for other in C::ALL {
            let expect = if other == cap {
                Declared::True
            } else {
                Declared::Omitted
            };
            assert_eq!(declared_of(&m, other), expect);
        }
    }
}

#[test]
fn spec_example_manifest_validates_and_keeps_each_declared_value() {
    let m = parse_manifest(include_str!("fixtures/spec_example_plugin.json")).unwrap();
    assert_eq!(m.id, "acme.sandbox");
    assert_eq!(m.version, "1.2.0");
    assert_eq!(m.worker.command, vec!["node", "dist/worker.js"]);
    let d = m.driver("my-provider").unwrap();
    assert_eq!(d.kind, DriverKind::SandboxProvider);
    assert_eq!(d.display_name.as_deref(), Some("My Provider"));
    assert_eq!(
        d.config_schema,
        Some(json!({"type": "object", "properties": {}}))
    );
    let expect = [
        (C::ReusableLeases, Declared::True),
        (C::NativeSyncIn, Declared::True),
        (C::NativeSyncOut, Declared::True),
        (C::PersistentProcessSessions, Declared::False),
        (C::IndependentControlCommands, Declared::False),
        (C::IncrementalSessionOutput, Declared::False),
    ];
    for (cap, v) in expect {
        assert_eq!(d.declared.value(cap), v, "{cap}");
    }
}

#[test]
fn omitted_key_defers_to_verified_discovery() {
    for cap in C::ALL.into_iter().filter(|c| !c.is_opt_in()) {
        let with = run(declaration(Some(json!({})), None), all_methods());
        assert!(on(&with, cap), "{cap}: {}", with.explain.get(cap));
        assert!(
            with.explain.get(cap).contains("omitted"),
            "{}",
            with.explain.get(cap)
        );
        let without = run(
            declaration(Some(json!({})), None),
            methods_without(required_methods(cap)[0]),
        );
        assert!(!on(&without, cap), "{cap}");
    }
}

#[test]
fn omitted_opt_in_keys_never_grant() {
    for caps in [Some(json!({})), None] {
        let r = run(declaration(caps.clone(), None), all_methods());
        for cap in [C::ReusableLeases, C::IncrementalSessionOutput] {
            assert!(!on(&r, cap), "{cap}");
            assert_eq!(
                r.explain.get(cap),
                &format!(
                    "off: opt-in key omitted{}; declare sandboxCapabilities.{cap}: true",
                    if caps.is_some() {
                        ""
                    } else {
                        " (no sandboxCapabilities object)"
                    }
                )
            );
        }
    }
}

#[test]
fn only_reusable_leases_and_incremental_session_output_are_opt_in() {
    let opt_in: Vec<C> = C::ALL.into_iter().filter(|c| c.is_opt_in()).collect();
    assert_eq!(opt_in, vec![C::ReusableLeases, C::IncrementalSessionOutput]);
}

#[test]
fn declared_false_is_never_effective_even_when_verified() {
    for cap in C::ALL {
        let r = run(
            declaration(Some(caps_with(cap, false)), None),
            all_methods(),
        );
        assert!(!on(&r, cap), "{cap}");
        assert_eq!(r.explain.get(cap), "off: declared false");
    }
}

#[test]
fn declared_false_narrows_only_its_own_key() {
    let r = run(
        declaration(Some(caps_with(C::NativeSyncIn, false)), None),
        all_methods(),
    );
    assert!(!on(&r, C::NativeSyncIn));
    assert!(
        on(&r, C::NativeSyncOut),
        "{}",
        r.explain.get(C::NativeSyncOut)
    );
    assert!(on(&r, C::PersistentProcessSessions));
}

#[test]
fn declared_true_is_effective_when_verified_and_not_narrowed() {
    for cap in C::ALL {
        let r = run(declaration(Some(caps_with(cap, true)), None), all_methods());
        assert!(on(&r, cap), "{cap}: {}", r.explain.get(cap));
        assert!(
            r.explain.get(cap).ends_with("and declared true"),
            "{}",
            r.explain.get(cap)
        );
    }
}

// ------------------------------------------------ reusable leases need an explicit opt-in

#[test]
fn reusable_leases_granted_only_when_declared_true() {
    for (caps, legacy, expect) in [
        (Some(json!({"reusableLeases": true})), None, true),
        (None, Some(true), true),
        (Some(json!({})), None, false),
        (None, None, false),
        (Some(json!({"reusableLeases": false})), None, false),
        (None, Some(false), false),
    ] {
        let r = run(declaration(caps.clone(), legacy), all_methods());
        assert_eq!(
            on(&r, C::ReusableLeases),
            expect,
            "caps={caps:?} legacy={legacy:?}"
        );
    }
}

#[test]
fn nested_reusable_leases_true_opts_in() {
    let r = run(
        declaration(Some(json!({"reusableLeases": true})), None),
        all_methods(),
    );
    assert!(on(&r, C::ReusableLeases));
}

#[test]
fn legacy_supports_reusable_leases_true_opts_in() {
    let r = run(declaration(None, Some(true)), all_methods());
    assert!(
        on(&r, C::ReusableLeases),
        "{}",
        r.explain.get(C::ReusableLeases)
    );
}

#[test]
fn omitted_reusable_leases_is_not_eligible_for_reuse_even_on_a_retained_lease() {
    // Every other input allows it: the worker verifies all three methods and the
    // lease is reuse_by_environment. Only the missing opt-in keeps it off.
    let r = run(
        declaration(Some(json!({"nativeSyncIn": true})), None),
        all_methods(),
    );
    assert!(!on(&r, C::ReusableLeases));
    assert!(matches!(
        r.reasons.get(C::ReusableLeases),
        Reason::OptInOmitted { .. }
    ));
}

#[test]
fn reusable_leases_opt_in_requires_all_three_lifecycle_methods() {
    assert_eq!(
        required_methods(C::ReusableLeases),
        [
            "environmentResumeLease",
            "environmentReleaseLease",
            "environmentDestroyLease"
        ]
    );
}

#[test]
fn worker_missing_any_lifecycle_method_never_gets_reusable_leases() {
    for method in [
        "environmentResumeLease",
        "environmentReleaseLease",
        "environmentDestroyLease",
    ] {
        let r = run(
            declaration(Some(json!({"reusableLeases": true})), None),
            methods_without(method),
        );
        assert!(!on(&r, C::ReusableLeases), "without {method}");
        assert_eq!(
            r.explain.get(C::ReusableLeases),
            &format!("off: worker did not advertise {method}")
        );
    }
}

#[test]
fn reusable_leases_opt_in_is_still_narrowed_per_run() {
    let r = run_with(
        declaration(Some(json!({"reusableLeases": true})), None),
        all_methods(),
        LeaseFacts::default(),
        false,
    );
    assert!(!on(&r, C::ReusableLeases));
    assert_eq!(
        r.explain.get(C::ReusableLeases),
        "off: narrowed by ephemeral lease policy"
    );
}

#[test]
fn legacy_only_is_read_as_reusable_leases() {
    assert_eq!(
        declared_of(&manifest(None, Some(true)), C::ReusableLeases),
        Declared::True
    );
    assert_eq!(
        declared_of(&manifest(None, Some(false)), C::ReusableLeases),
        Declared::False
    );
    // Legacy next to a nested object that omits the key: legacy still counts.
    let m = manifest(Some(json!({"nativeSyncIn": true})), Some(true));
    assert_eq!(declared_of(&m, C::ReusableLeases), Declared::True);
    // The legacy field touches no other key.
    for cap in C::ALL.into_iter().filter(|c| *c != C::ReusableLeases) {
        assert_eq!(
            declared_of(&manifest(None, Some(true)), cap),
            Declared::Omitted
        );
    }
}

#[test]
fn nested_reusable_leases_wins_over_legacy() {
    for legacy in [true, false] {
        for nested in [true, false] {
            let m = manifest(Some(json!({"reusableLeases": nested})), Some(legacy));
            assert_eq!(
                declared_of(&m, C::ReusableLeases),
                Declared::from_bool(nested)
            );
        }
    }
}

#[test]
fn legacy_true_nested_false_resolves_false() {
    let m = parse_manifest(include_str!(
        "fixtures/legacy_true_nested_false_plugin.json"
    ))
    .unwrap();
    let r = run(establish_declaration(Some(&m), KEY, None), all_methods());
    assert!(!on(&r, C::ReusableLeases));
    assert_eq!(r.explain.get(C::ReusableLeases), "off: declared false");
}

#[test]
fn legacy_false_nested_true_resolves_true() {
    let r = run(
        declaration(Some(json!({"reusableLeases": true})), Some(false)),
        all_methods(),
    );
    assert!(on(&r, C::ReusableLeases));
}

#[test]
fn non_boolean_legacy_field_is_rejected() {
    let err = validate_manifest(&plugin_json(json!({
        "driverKey": KEY, "kind": "sandbox_provider", "supportsReusableLeases": "yes"
    })))
    .unwrap_err();
    assert!(matches!(err, ContractError::WrongType { .. }), "{err:?}");
    assert_eq!(err.offending(), Some("supportsReusableLeases"));
    assert_eq!(
        err.json_path(),
        Some("$.environmentDrivers[0].supportsReusableLeases")
    );
}

// --------------------------------------- incremental session output needs an explicit opt-in

#[test]
fn incremental_session_output_requires_explicit_opt_in() {
    let omitted = run(declaration(Some(json!({})), None), all_methods());
    assert!(!on(&omitted, C::IncrementalSessionOutput));
    let declared = run(
        declaration(Some(json!({"incrementalSessionOutput": true})), None),
        all_methods(),
    );
    assert!(on(&declared, C::IncrementalSessionOutput));
}

#[test]
fn broad_session_capabilities_do_not_imply_incremental_output() {
    let r = run(
        declaration(
            Some(json!({"persistentProcessSessions": true, "independentControlCommands": true})),
            None,
        ),
        all_methods(),
    );
    assert!(on(&r, C::PersistentProcessSessions));
    assert!(on(&r, C::IndependentControlCommands));
    assert!(!on(&r, C::IncrementalSessionOutput));
}

#[test]
fn incremental_session_output_opt_in_requires_environment_execute() {
    assert_eq!(
        required_methods(C::IncrementalSessionOutput),
        ["environmentExecute"]
    );
    let r = run(
        declaration(Some(json!({"incrementalSessionOutput": true})), None),
        methods_without("environmentExecute"),
    );
    assert!(!on(&r, C::IncrementalSessionOutput));
    assert_eq!(
        r.explain.get(C::IncrementalSessionOutput),
        "off: worker did not advertise environmentExecute"
    );
}

#[test]
fn config_resolution_failure_narrows_incremental_session_output() {
    let r = run_with(
        declaration(Some(json!({"incrementalSessionOutput": true})), None),
        all_methods(),
        open_lease(),
        true,
    );
    assert!(!on(&r, C::IncrementalSessionOutput));
    assert_eq!(
        r.explain.get(C::IncrementalSessionOutput),
        "off: config resolution failed (fail closed)"
    );
}

// ------------------------------------- the capabilities and their worker-method prerequisites

#[test]
fn prerequisite_table_matches_the_contract() {
    let table = [
        (
            C::ReusableLeases,
            &[
                "environmentResumeLease",
                "environmentReleaseLease",
                "environmentDestroyLease",
            ][..],
        ),
        (
            C::NativeSyncIn,
            &["environmentSyncIn", "environmentSyncOut"][..],
        ),
        (
            C::NativeSyncOut,
            &["environmentSyncIn", "environmentSyncOut"][..],
        ),
        (C::PersistentProcessSessions, &["environmentExecute"][..]),
        (C::IndependentControlCommands, &["environmentExecute"][..]),
        (C::IncrementalSessionOutput, &["environmentExecute"][..]),
    ];
    for (cap, methods) in table {
        assert_eq!(required_methods(cap), methods, "{cap}");
    }
}

#[test]
fn native_sync_methods_are_required_as_a_pair() {
    let caps = json!({"nativeSyncIn": true, "nativeSyncOut": true});
    for lone in ["environmentSyncIn", "environmentSyncOut"] {
        let other = if lone == "environmentSyncIn" {
            "environmentSyncOut"
        } else {
            "environmentSyncIn"
        };
        let r = run(
            declaration(Some(caps.clone()), None),
            methods_without(other),
        );
        assert!(!on(&r, C::NativeSyncIn), "only {lone} advertised");
        assert!(!on(&r, C::NativeSyncOut), "only {lone} advertised");
        assert!(
            r.explain.get(C::NativeSyncIn).contains(other),
            "{}",
            r.explain.get(C::NativeSyncIn)
        );
        assert!(r.explain.get(C::NativeSyncIn).contains("pair"));
    }
    let both = run(declaration(Some(caps), None), all_methods());
    assert!(on(&both, C::NativeSyncIn) && on(&both, C::NativeSyncOut));
}

// ---------------------------------------------------------- target and config narrowing

#[test]
fn ephemeral_lease_policy_narrows_reusable_leases_off() {
    let n = narrowing(&LeaseFacts::default(), false);
    assert_eq!(
        n.get(C::ReusableLeases),
        Narrow::Off(NarrowReason::EphemeralLeasePolicy)
    );
    for cap in C::ALL.into_iter().filter(|c| *c != C::ReusableLeases) {
        assert!(!n.is_narrowed(cap), "{cap}");
    }
}

#[test]
fn reuse_by_environment_lease_keeps_reusable_leases() {
    let n = narrowing(&open_lease(), false);
    assert!(!n.is_narrowed(C::ReusableLeases));
    let r = run(
        declaration(Some(json!({"reusableLeases": true})), None),
        all_methods(),
    );
    assert!(on(&r, C::ReusableLeases));
}

#[test]
fn job_backend_lease_narrows_native_sync_off() {
    let lease =
        LeaseFacts::from_metadata(LeasePolicy::ReuseByEnvironment, &json!({"backend": "job"}));
    assert!(lease.job_backend);
    let r = run_with(
        declaration(Some(all_true()), None),
        all_methods(),
        lease,
        false,
    );
    for cap in [C::NativeSyncIn, C::NativeSyncOut] {
        assert!(!on(&r, cap));
        assert!(
            r.explain
                .get(cap)
                .starts_with("off: narrowed by job backend lease"),
            "{}",
            r.explain.get(cap)
        );
    }
}

#[test]
fn native_file_sync_unsupported_lease_narrows_native_sync_off() {
    let lease = LeaseFacts::from_metadata(
        LeasePolicy::ReuseByEnvironment,
        &json!({"nativeFileSyncUnsupported": true}),
    );
    assert!(lease.native_file_sync_unsupported && !lease.job_backend);
    let r = run_with(
        declaration(Some(all_true()), None),
        all_methods(),
        lease,
        false,
    );
    assert!(!on(&r, C::NativeSyncIn));
    assert!(!on(&r, C::NativeSyncOut));
    assert_eq!(
        r.reasons.get(C::NativeSyncOut),
        &Reason::Narrowed(NarrowReason::NativeFileSyncUnsupported)
    );
}

#[test]
fn job_backend_narrows_only_native_sync() {
    let lease = LeaseFacts {
        job_backend: true,
        native_file_sync_unsupported: true,
        ..open_lease()
    };
    let r = run_with(
        declaration(Some(all_true()), None),
        all_methods(),
        lease,
        false,
    );
    for cap in [
        C::ReusableLeases,
        C::PersistentProcessSessions,
        C::IndependentControlCommands,
        C::IncrementalSessionOutput,
    ] {
        assert!(on(&r, cap), "{cap}: {}", r.explain.get(cap));
    }
}

#[test]
fn lease_metadata_narrows_only_on_exact_values() {
    for metadata in [
        json!({}),
        json!({"backend": "pod"}),
        json!({"backend": "Job"}),
        json!({"backend": true}),
        json!({"nativeFileSyncUnsupported": false}),
        json!({"nativeFileSyncUnsupported": "true"}),
        json!(null),
    ] {
        let lease = LeaseFacts::from_metadata(LeasePolicy::Ephemeral, &metadata);
        assert!(
            !lease.job_backend && !lease.native_file_sync_unsupported,
            "{metadata}"
        );
    }
}

#[test]
fn lease_policy_wire_names_round_trip() {
    for p in [LeasePolicy::Ephemeral, LeasePolicy::ReuseByEnvironment] {
        assert_eq!(LeasePolicy::from_wire(p.as_wire()), Some(p));
    }
    assert_eq!(LeasePolicy::from_wire("reuse"), None);
    assert_eq!(LeasePolicy::default(), LeasePolicy::Ephemeral);
}

#[test]
fn narrowing_removes_a_verified_and_declared_capability() {
    // Same run twice, differing only by the narrowing input: it is the narrowing
    // that turns the key off.
    let decl = || declaration(Some(all_true()), None);
    let open = run(decl(), all_methods());
    let narrowed = run_with(
        decl(),
        all_methods(),
        LeaseFacts {
            job_backend: true,
            ..open_lease()
        },
        true,
    );
    for cap in [
        C::NativeSyncIn,
        C::NativeSyncOut,
        C::PersistentProcessSessions,
        C::IncrementalSessionOutput,
    ] {
        assert!(on(&open, cap) && !on(&narrowed, cap), "{cap}");
    }
}

// ------------------------------------------------------------------- failure behavior

#[test]
fn config_resolution_failure_narrows_persistent_sessions_and_incremental_output() {
    let r = run_with(
        declaration(Some(all_true()), None),
        all_methods(),
        open_lease(),
        true,
    );
    for cap in [C::PersistentProcessSessions, C::IncrementalSessionOutput] {
        assert!(!on(&r, cap), "{cap}");
        assert_eq!(
            r.explain.get(cap),
            "off: config resolution failed (fail closed)"
        );
    }
    for cap in [
        C::ReusableLeases,
        C::NativeSyncIn,
        C::NativeSyncOut,
        C::IndependentControlCommands,
    ] {
        assert!(on(&r, cap), "{cap}: {}", r.explain.get(cap));
    }
}

#[test]
fn config_resolution_failure_narrows_even_omitted_persistent_sessions() {
    let r = run_with(declaration(None, None), all_methods(), open_lease(), true);
    assert!(!on(&r, C::PersistentProcessSessions));
    assert!(on(&r, C::IndependentControlCommands));
}

#[test]
fn identity_failure_resolves_everything_false_even_when_worker_advertises_all() {
    let r = run(establish_declaration(None, KEY, None), all_methods());
    assert_all_off(&r);
    for cap in C::ALL {
        assert_eq!(
            r.explain.get(cap),
            "off: plugin identity not established: plugin absent"
        );
    }
}

#[test]
fn plugin_no_longer_declaring_driver_key_resolves_everything_false() {
    let m = manifest(Some(all_true()), None);
    let decl = establish_declaration(Some(&m), "other-key", None);
    assert_eq!(
        decl,
        DeclarationState::IdentityFailed(IdentityFailure::DriverKeyNotDeclared {
            driver_key: "other-key".into()
        })
    );
    assert_all_off(&run(decl, all_methods()));
}

#[test]
fn driver_without_sandbox_provider_kind_resolves_everything_false() {
    let m = validate_manifest(&plugin_json(json!({
        "driverKey": KEY, "kind": "secret_provider", "sandboxCapabilities": all_true()
    })))
    .unwrap();
    let decl = establish_declaration(Some(&m), KEY, None);
    assert_eq!(
        decl,
        DeclarationState::IdentityFailed(IdentityFailure::WrongKind {
            driver_key: KEY.into(),
            kind: "secret_provider".into()
        })
    );
    let r = run(decl, all_methods());
    assert_all_off(&r);
    assert!(r.explain.get(C::NativeSyncIn).contains("secret_provider"));
}

#[test]
fn retained_lease_pinned_to_another_plugin_resolves_everything_false() {
    let m = manifest(Some(all_true()), None);
    let decl = establish_declaration(Some(&m), KEY, Some("someone.else"));
    assert_eq!(
        decl,
        DeclarationState::IdentityFailed(IdentityFailure::PinnedPluginMismatch {
            pinned: "someone.else".into(),
            found: PLUGIN_ID.into()
        })
    );
    assert_all_off(&run(decl, all_methods()));
}

#[test]
fn retained_lease_pinned_to_the_same_plugin_establishes_the_declaration() {
    let m = manifest(Some(all_true()), None);
    let decl = establish_declaration(Some(&m), KEY, Some(PLUGIN_ID));
    assert!(matches!(decl, DeclarationState::Established { .. }));
    assert!(on(&run(decl, all_methods()), C::ReusableLeases));
}

#[test]
fn omitted_capabilities_object_defers_to_verified_discovery() {
    let decl = declaration(None, None);
    assert_eq!(
        decl,
        DeclarationState::Established {
            capabilities_object_present: false,
            declared: Default::default()
        }
    );
    let r = run(decl, all_methods());
    for cap in [
        C::NativeSyncIn,
        C::NativeSyncOut,
        C::PersistentProcessSessions,
        C::IndependentControlCommands,
    ] {
        assert!(on(&r, cap), "{cap}");
        assert!(r.explain.get(cap).contains("no sandboxCapabilities object"));
    }
    assert!(!on(&r, C::ReusableLeases));
    assert!(!on(&r, C::IncrementalSessionOutput));
}

// ---------------------------------------- concurrency capabilities are not part of the contract

#[test]
fn removed_concurrency_keys_are_rejected_as_unknown() {
    for key in ["concurrentSyncAndExec", "concurrentSyncOperations"] {
        let mut caps = json!({"nativeSyncIn": true});
        caps[key] = json!(true);
        let err = validate_manifest(&plugin_json(driver_json(Some(caps), None))).unwrap_err();
        match &err {
            ContractError::UnknownCapabilityKey { key: k, path, hint } => {
                assert_eq!(k, key);
                assert_eq!(
                    path,
                    &format!("$.environmentDrivers[0].sandboxCapabilities.{key}")
                );
                assert!(hint.contains("removed"), "{hint}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(err.code().as_str(), "E1004");
        assert!(
            err.to_string()
                .contains("removed from the capability contract"),
            "{err}"
        );
    }
}

#[test]
fn removed_concurrency_key_is_rejected_even_when_false() {
    let err = validate_manifest(&plugin_json(driver_json(
        Some(json!({"concurrentSyncOperations": false})),
        None,
    )))
    .unwrap_err();
    assert_eq!(err.offending(), Some("concurrentSyncOperations"));
}

#[test]
fn removed_concurrency_key_fixture_reports_the_second_driver_path() {
    let err =
        parse_manifest(include_str!("fixtures/removed_concurrency_key_plugin.json")).unwrap_err();
    assert_eq!(
        err.json_path(),
        Some("$.environmentDrivers[1].sandboxCapabilities.concurrentSyncAndExec")
    );
}

// ------------------------------------------------------------- the strict validator

#[test]
fn unknown_capability_key_is_rejected_with_its_json_path() {
    let err = validate_manifest(&plugin_json(driver_json(
        Some(json!({"fastBoot": true})),
        None,
    )))
    .unwrap_err();
    assert_eq!(err.code().as_str(), "E1004");
    assert_eq!(err.offending(), Some("fastBoot"));
    assert_eq!(
        err.json_path(),
        Some("$.environmentDrivers[0].sandboxCapabilities.fastBoot")
    );
    assert!(
        err.to_string().contains("known keys: reusableLeases"),
        "{err}"
    );
}

#[test]
fn miscased_capability_key_is_rejected_with_a_suggestion() {
    let err = validate_manifest(&plugin_json(driver_json(
        Some(json!({"ReusableLeases": true})),
        None,
    )))
    .unwrap_err();
    assert_eq!(err.offending(), Some("ReusableLeases"));
    assert!(
        err.to_string().contains("did you mean `reusableLeases`"),
        "{err}"
    );
}

#[test]
fn non_boolean_capability_value_is_rejected_with_its_json_path() {
    for bad in [
        json!("true"),
        json!(1),
        json!(null),
        json!({}),
        json!([true]),
    ] {
        let err = validate_manifest(&plugin_json(driver_json(
            Some(json!({"nativeSyncOut": bad})),
            None,
        )))
        .unwrap_err();
        assert!(
            matches!(
                err,
                ContractError::WrongType {
                    expected: "a boolean",
                    ..
                }
            ),
            "{err:?}"
        );
        assert_eq!(err.code().as_str(), "E1003");
        assert_eq!(err.offending(), Some("nativeSyncOut"));
        assert_eq!(
            err.json_path(),
            Some("$.environmentDrivers[0].sandboxCapabilities.nativeSyncOut")
        );
    }
}

#[test]
fn sandbox_capabilities_must_be_an_object() {
    for bad in [json!(null), json!(true), json!(["reusableLeases"])] {
        let err = validate_manifest(&plugin_json(driver_json(Some(bad), None))).unwrap_err();
        assert_eq!(
            err.json_path(),
            Some("$.environmentDrivers[0].sandboxCapabilities")
        );
        assert_eq!(err.code().as_str(), "E1003");
    }
}

#[test]
fn capability_key_with_odd_characters_gets_a_bracketed_path() {
    let err = validate_manifest(&plugin_json(driver_json(
        Some(json!({"native sync": true})),
        None,
    )))
    .unwrap_err();
    assert_eq!(
        err.json_path(),
        Some("$.environmentDrivers[0].sandboxCapabilities['native sync']")
    );
}

/// Set (`Some`) or remove (`None`) the value at a JSON pointer.
fn edit(v: &mut Value, pointer: &str, new: Option<Value>) {
    let (parent, last) = pointer.rsplit_once('/').unwrap();
    let parent = v.pointer_mut(parent).unwrap();
    match (parent, new) {
        (Value::Object(o), Some(n)) => {
            o.insert(last.to_owned(), n);
        }
        (Value::Object(o), None) => {
            o.remove(last);
        }
        (Value::Array(a), Some(n)) => a[last.parse::<usize>().unwrap()] = n,
        (other, _) => panic!("cannot edit {pointer} in {other}"),
    }
}

#[test]
fn required_manifest_keys_are_enforced_with_paths() {
    let base = plugin_json(driver_json(None, None));
    let d0 = "/environmentDrivers/0";
    // (pointer, new value or None = remove, code, offending key, JSON path)
    let cases = [
        ("/id", None, "E1002", "id", "$.id"),
        ("/id", Some(json!("")), "E1005", "id", "$.id"),
        ("/id", Some(json!(7)), "E1003", "id", "$.id"),
        ("/version", None, "E1002", "version", "$.version"),
        (
            "/version",
            Some(json!(1.0)),
            "E1003",
            "version",
            "$.version",
        ),
        ("/worker", None, "E1002", "worker", "$.worker"),
        (
            "/worker",
            Some(json!("./worker")),
            "E1003",
            "worker",
            "$.worker",
        ),
        (
            "/worker",
            Some(json!({})),
            "E1002",
            "command",
            "$.worker.command",
        ),
        (
            "/worker/command",
            Some(json!("./w")),
            "E1003",
            "command",
            "$.worker.command",
        ),
        (
            "/worker/command",
            Some(json!([])),
            "E1005",
            "command",
            "$.worker.command",
        ),
        (
            "/worker/command",
            Some(json!(["node", ""])),
            "E1005",
            "command",
            "$.worker.command[1]",
        ),
        (
            "/worker/command",
            Some(json!(["node", 3])),
            "E1003",
            "command",
            "$.worker.command[1]",
        ),
        (
            "/environmentDrivers",
            None,
            "E1002",
            "environmentDrivers",
            "$.environmentDrivers",
        ),
        (
            "/environmentDrivers",
            Some(json!({})),
            "E1003",
            "environmentDrivers",
            "$.environmentDrivers",
        ),
        (
            d0,
            Some(json!("acme")),
            "E1003",
            "environmentDrivers",
            "$.environmentDrivers[0]",
        ),
        (
            "/environmentDrivers/0/driverKey",
            None,
            "E1002",
            "driverKey",
            "$.environmentDrivers[0].driverKey",
        ),
        (
            "/environmentDrivers/0/driverKey",
            Some(json!("")),
            "E1005",
            "driverKey",
            "$.environmentDrivers[0].driverKey",
        ),
        (
            "/environmentDrivers/0/kind",
            None,
            "E1002",
            "kind",
            "$.environmentDrivers[0].kind",
        ),
        (
            "/environmentDrivers/0/kind",
            Some(json!(null)),
            "E1003",
            "kind",
            "$.environmentDrivers[0].kind",
        ),
        (
            "/environmentDrivers/0/displayName",
            Some(json!(1)),
            "E1003",
            "displayName",
            "$.environmentDrivers[0].displayName",
        ),
        (
            "/environmentDrivers/0/configSchema",
            Some(json!("object")),
            "E1003",
            "configSchema",
            "$.environmentDrivers[0].configSchema",
        ),
    ];
    assert!(validate_manifest(&base).is_ok());
    for (pointer, new, code, key, path) in cases {
        let mut v = base.clone();
        edit(&mut v, pointer, new);
        let err = validate_manifest(&v).unwrap_err();
        let got = (err.code().as_str(), err.offending(), err.json_path());
        assert_eq!(got, (code, Some(key), Some(path)), "{pointer}: {err}");
    }
}

#[test]
fn manifest_root_must_be_an_object() {
    let err = validate_manifest(&json!([1])).unwrap_err();
    assert_eq!(err.json_path(), Some("$"));
    assert_eq!(err.code().as_str(), "E1003");
}

#[test]
fn invalid_json_manifest_is_reported_as_e1001() {
    let err = parse_manifest("{\"id\": ").unwrap_err();
    assert!(matches!(
        err,
        ContractError::InvalidJson {
            what: "plugin.json",
            ..
        }
    ));
    assert_eq!(err.code().as_str(), "E1001");
}

#[test]
fn duplicate_driver_key_is_rejected() {
    let mut v = plugin_json(driver_json(None, None));
    v["environmentDrivers"] = json!([
        {"driverKey": "a", "kind": "sandbox_provider"},
        {"driverKey": "b", "kind": "sandbox_provider"},
        {"driverKey": "a", "kind": "other"},
    ]);
    let err = validate_manifest(&v).unwrap_err();
    assert_eq!(err.code().as_str(), "E1006");
    assert_eq!(err.offending(), Some("a"));
    assert_eq!(err.json_path(), Some("$.environmentDrivers[2].driverKey"));
}

#[test]
fn unknown_top_level_and_driver_keys_are_tolerated() {
    let v = json!({
        "id": PLUGIN_ID, "version": "1", "apiVersion": 2, "description": "d",
        "categories": ["x"], "author": {"name": "a"},
        "worker": {"command": ["./w"], "env": {"A": "1"}},
        "environmentDrivers": [{
            "driverKey": KEY, "kind": "sandbox_provider", "description": "x",
            "icon": "a.svg", "configSchema": true
        }],
    });
    let m = validate_manifest(&v).unwrap();
    assert_eq!(m.driver(KEY).unwrap().config_schema, Some(json!(true)));
}

#[test]
fn other_driver_kinds_are_kept_verbatim() {
    let m = validate_manifest(&plugin_json(json!({"driverKey": KEY, "kind": "runner"}))).unwrap();
    assert_eq!(
        m.driver(KEY).unwrap().kind,
        DriverKind::Other("runner".into())
    );
    assert!(m.driver("nope").is_none());
}

#[test]
fn validator_reports_the_first_error_in_document_order() {
    // Two errors: driver 0 has a bad capability value, driver 1 an unknown key.
    let mut v = plugin_json(driver_json(None, None));
    v["environmentDrivers"] = json!([
        {"driverKey": "a", "kind": "sandbox_provider",
         "sandboxCapabilities": {"nativeSyncIn": "yes", "concurrentSyncAndExec": true}},
        {"driverKey": "b", "kind": "sandbox_provider", "sandboxCapabilities": {"bogus": true}},
    ]);
    for _ in 0..3 {
        let err = validate_manifest(&v).unwrap_err();
        assert_eq!(
            err.json_path(),
            Some("$.environmentDrivers[0].sandboxCapabilities.nativeSyncIn")
        );
    }
    // Top-level keys come before drivers.
    v["version"] = json!(null);
    assert_eq!(
        validate_manifest(&v).unwrap_err().json_path(),
        Some("$.version")
    );
}

#[test]
fn embedded_manifest_paths_are_rooted_where_it_is_embedded() {
    let v = plugin_json(driver_json(Some(json!({"foo": true})), None));
    let err = validate_manifest_at(&v, "$.plugin").unwrap_err();
    assert_eq!(
        err.json_path(),
        Some("$.plugin.environmentDrivers[0].sandboxCapabilities.foo")
    );
}

// -------------------------------------------------------------- explanation precedence

#[test]
fn explanation_precedence_identity_beats_everything() {
    let r = run_with(
        establish_declaration(None, KEY, None),
        Verified::missing(),
        LeaseFacts::default(),
        true,
    );
    for cap in C::ALL {
        assert!(
            matches!(r.reasons.get(cap), Reason::IdentityFailed(_)),
            "{cap}"
        );
    }
}

#[test]
fn explanation_precedence_declaration_beats_verification_and_narrowing() {
    let caps = json!({"nativeSyncIn": false});
    let r = run_with(
        declaration(Some(caps), None),
        Verified::missing(),
        LeaseFacts::default(),
        true,
    );
    assert_eq!(r.explain.get(C::NativeSyncIn), "off: declared false");
    assert!(matches!(
        r.reasons.get(C::ReusableLeases),
        Reason::OptInOmitted { .. }
    ));
    assert!(matches!(
        r.reasons.get(C::IncrementalSessionOutput),
        Reason::OptInOmitted { .. }
    ));
}

#[test]
fn explanation_precedence_verification_beats_narrowing() {
    let lease = LeaseFacts {
        job_backend: true,
        ..LeaseFacts::default()
    };
    let r = run_with(
        declaration(Some(all_true()), None),
        methods_without("environmentDestroyLease"),
        lease,
        true,
    );
    assert_eq!(
        r.explain.get(C::ReusableLeases),
        "off: worker did not advertise environmentDestroyLease"
    );
    // Narrowing explains only keys that every earlier input allows.
    assert_eq!(
        r.reasons.get(C::NativeSyncIn),
        &Reason::Narrowed(NarrowReason::JobBackend)
    );
    assert_eq!(
        r.reasons.get(C::PersistentProcessSessions),
        &Reason::Narrowed(NarrowReason::ConfigResolutionFailed)
    );
}

#[test]
fn explanation_names_every_missing_prerequisite_in_table_order() {
    let r = run(
        declaration(Some(all_true()), None),
        Verified::methods(["environmentReleaseLease", "environmentExecute"]),
    );
    assert_eq!(
        r.explain.get(C::ReusableLeases),
        "off: worker did not advertise environmentResumeLease, environmentDestroyLease"
    );
}

#[test]
fn explanation_for_a_missing_list_differs_from_an_empty_list() {
    let missing = run(declaration(Some(all_true()), None), Verified::missing());
    let empty = run(
        declaration(Some(all_true()), None),
        Verified::methods(Vec::<String>::new()),
    );
    assert!(missing
        .explain
        .get(C::NativeSyncIn)
        .contains("no supportedMethods list"));
    assert!(empty
        .explain
        .get(C::NativeSyncIn)
        .contains("empty supportedMethods list"));
}

#[test]
fn explanation_is_one_line_and_matches_the_effective_value() {
    let cases = [
        run(declaration(Some(all_true()), None), all_methods()),
        run(
            declaration(None, None),
            methods_without("environmentSyncIn"),
        ),
        run_with(
            declaration(None, Some(true)),
            all_methods(),
            LeaseFacts::default(),
            true,
        ),
        run(establish_declaration(None, KEY, None), all_methods()),
    ];
    for r in &cases {
        for cap in C::ALL {
            let line = r.explain.get(cap);
            assert!(!line.contains('\n'), "{line}");
            assert_eq!(line.starts_with("on: "), on(r, cap), "{line}");
            assert_eq!(line, &r.reasons.get(cap).to_string());
        }
    }
}

#[test]
fn on_explanation_names_verified_methods_and_declaration() {
    let r = run(
        declaration(Some(json!({"incrementalSessionOutput": true})), None),
        all_methods(),
    );
    assert_eq!(
        r.explain.get(C::IncrementalSessionOutput),
        "on: verified (environmentExecute) and declared true"
    );
    assert_eq!(
        r.explain.get(C::PersistentProcessSessions),
        "on: verified (environmentExecute) and omitted (defers to discovery)"
    );
}

// ------------------------------------------------------------------------ scenario file

#[test]
fn cli_example_scenario_resolves_with_job_backend_narrowing() {
    let s = parse_scenario(include_str!("fixtures/cli_example_scenario.json")).unwrap();
    assert_eq!(s.driver_key, "acme");
    assert_eq!(s.lease.policy, LeasePolicy::ReuseByEnvironment);
    assert_eq!(s.lease.pinned_plugin_id.as_deref(), Some("acme.sandbox"));
    let r = s.resolve();
    let expect = [
        (C::ReusableLeases, true),
        (C::NativeSyncIn, false),
        (C::NativeSyncOut, false),
        (C::PersistentProcessSessions, true),
        (C::IndependentControlCommands, true),
        (C::IncrementalSessionOutput, true),
    ];
    for (cap, v) in expect {
        assert_eq!(on(&r, cap), v, "{cap}: {}", r.explain.get(cap));
    }
    assert_eq!(
        r.reasons.get(C::NativeSyncIn),
        &Reason::Narrowed(NarrowReason::JobBackend)
    );
}

fn scenario_value() -> Value {
    serde_json::from_str(include_str!("fixtures/cli_example_scenario.json")).unwrap()
}

fn parse_value(v: &Value) -> Result<sandhost_contract::scenario::Scenario, ContractError> {
    parse_scenario(&v.to_string())
}

#[test]
fn scenario_with_null_plugin_is_identity_failure_not_an_error() {
    let mut v = scenario_value();
    v["plugin"] = Value::Null;
    let s = parse_value(&v).unwrap();
    assert!(s.plugin.is_none());
    let r = s.resolve();
    assert_all_off(&r);
    assert!(matches!(
        r.reasons.get(C::NativeSyncIn),
        Reason::IdentityFailed(IdentityFailure::PluginAbsent)
    ));
}

#[test]
fn scenario_without_plugin_key_is_rejected() {
    let mut v = scenario_value();
    v.as_object_mut().unwrap().remove("plugin");
    let err = parse_value(&v).unwrap_err();
    assert_eq!(
        (err.code().as_str(), err.json_path()),
        ("E1010", Some("$.plugin"))
    );
}

#[test]
fn scenario_with_invalid_plugin_reports_manifest_error_under_plugin_path() {
    let mut v = scenario_value();
    v["plugin"]["environmentDrivers"][0]["sandboxCapabilities"]["concurrentSyncOperations"] =
        json!(true);
    let err = parse_value(&v).unwrap_err();
    assert_eq!(err.code().as_str(), "E1004");
    assert_eq!(
        err.json_path(),
        Some("$.plugin.environmentDrivers[0].sandboxCapabilities.concurrentSyncOperations")
    );
    v["plugin"] = json!("acme");
    let err = parse_value(&v).unwrap_err();
    assert_eq!(
        (err.code().as_str(), err.json_path()),
        ("E1003", Some("$.plugin"))
    );
}

#[test]
fn scenario_pinned_plugin_mismatch_resolves_everything_false() {
    let mut v = scenario_value();
    v["lease"]["pinnedPluginId"] = json!("acme.other");
    let r = parse_value(&v).unwrap().resolve();
    assert_all_off(&r);
    assert!(r.explain.get(C::ReusableLeases).contains("acme.other"));
}

#[test]
fn scenario_driver_key_not_declared_resolves_everything_false() {
    let mut v = scenario_value();
    v["driverKey"] = json!("zeta");
    assert_all_off(&parse_value(&v).unwrap().resolve());
}

#[test]
fn scenario_worker_null_or_without_list_verifies_nothing() {
    for worker in [
        Some(Value::Null),
        Some(json!({})),
        Some(json!({"supportedMethods": null})),
        None,
    ] {
        let mut v = scenario_value();
        match &worker {
            Some(w) => v["worker"] = w.clone(),
            None => {
                v.as_object_mut().unwrap().remove("worker");
            }
        }
        let s = parse_value(&v).unwrap();
        assert_eq!(s.to_input().verified, Verified::missing(), "{worker:?}");
        assert_all_off(&s.resolve());
    }
}

#[test]
fn scenario_worker_with_failed_handshake_verifies_nothing() {
    let mut v = scenario_value();
    v["worker"]["ok"] = json!(false);
    assert_all_off(&parse_value(&v).unwrap().resolve());
    v["worker"]["ok"] = json!(true);
    assert!(on(&parse_value(&v).unwrap().resolve(), C::ReusableLeases));
}

#[test]
fn scenario_lease_defaults_to_ephemeral_without_narrowing_metadata() {
    let mut v = scenario_value();
    v.as_object_mut().unwrap().remove("lease");
    let s = parse_value(&v).unwrap();
    assert_eq!(s.lease.policy, LeasePolicy::Ephemeral);
    let input = s.to_input();
    assert_eq!(input.lease, LeaseFacts::default());
    let r = s.resolve();
    assert_eq!(
        r.explain.get(C::ReusableLeases),
        "off: narrowed by ephemeral lease policy"
    );
    assert!(on(&r, C::NativeSyncIn));
    v["lease"] = json!({});
    assert_eq!(
        parse_value(&v).unwrap().lease.policy,
        LeasePolicy::Ephemeral
    );
}

#[test]
fn scenario_config_resolution_failed_defaults_to_false() {
    let mut v = scenario_value();
    v.as_object_mut().unwrap().remove("configResolutionFailed");
    assert!(!parse_value(&v).unwrap().config_resolution_failed);
    v["configResolutionFailed"] = json!(true);
    let r = parse_value(&v).unwrap().resolve();
    assert!(!on(&r, C::PersistentProcessSessions));
    assert!(!on(&r, C::IncrementalSessionOutput));
}

#[test]
fn scenario_bad_shapes_are_invalid_scenario_with_key_and_path() {
    // (pointer, new value or None = remove, offending key, JSON path)
    let cases = [
        (
            "/pinnedPluginID",
            Some(json!("x")),
            "pinnedPluginID",
            "$.pinnedPluginID",
        ),
        (
            "/configResolutionFailed",
            Some(json!("no")),
            "configResolutionFailed",
            "$.configResolutionFailed",
        ),
        (
            "/configResolutionFailed",
            Some(json!(null)),
            "configResolutionFailed",
            "$.configResolutionFailed",
        ),
        ("/driverKey", None, "driverKey", "$.driverKey"),
        ("/driverKey", Some(json!(1)), "driverKey", "$.driverKey"),
        ("/driverKey", Some(json!("")), "driverKey", "$.driverKey"),
        ("/worker", Some(json!([])), "worker", "$.worker"),
        (
            "/worker/supportedMethods",
            Some(json!("environmentExecute")),
            "supportedMethods",
            "$.worker.supportedMethods",
        ),
        (
            "/worker/supportedMethods/2",
            Some(json!(5)),
            "supportedMethods",
            "$.worker.supportedMethods[2]",
        ),
        (
            "/worker/methods",
            Some(json!([])),
            "methods",
            "$.worker.methods",
        ),
        ("/worker/ok", Some(json!("yes")), "ok", "$.worker.ok"),
        ("/lease", Some(json!("ephemeral")), "lease", "$.lease"),
        (
            "/lease/policy",
            Some(json!("reuse")),
            "policy",
            "$.lease.policy",
        ),
        ("/lease/policy", Some(json!(1)), "policy", "$.lease.policy"),
        (
            "/lease/metadata",
            Some(json!([])),
            "metadata",
            "$.lease.metadata",
        ),
        (
            "/lease/pinnedPluginID",
            Some(json!("x")),
            "pinnedPluginID",
            "$.lease.pinnedPluginID",
        ),
        (
            "/lease/pinnedPluginId",
            Some(json!(3)),
            "pinnedPluginId",
            "$.lease.pinnedPluginId",
        ),
        (
            "/lease/pinnedPluginId",
            Some(json!("")),
            "pinnedPluginId",
            "$.lease.pinnedPluginId",
        ),
    ];
    assert!(parse_value(&scenario_value()).is_ok());
    for (pointer, new, key, path) in cases {
        let mut v = scenario_value();
        edit(&mut v, pointer, new);
        let err = parse_value(&v).unwrap_err();
        assert!(
            matches!(err, ContractError::InvalidScenario { .. }),
            "{err:?}"
        );
        let got = (err.code().as_str(), err.offending(), err.json_path());
        assert_eq!(got, ("E1010", Some(key), Some(path)), "{pointer}: {err}");
    }
}

#[test]
fn scenario_that_is_not_json_or_not_an_object_is_rejected() {
    assert_eq!(parse_scenario("nope").unwrap_err().code().as_str(), "E1001");
    let err = parse_scenario("[]").unwrap_err();
    assert_eq!((err.code().as_str(), err.json_path()), ("E1010", Some("$")));
}

#[test]
fn scenario_to_input_carries_every_input() {
    let s = parse_scenario(include_str!("fixtures/cli_example_scenario.json")).unwrap();
    let input = s.to_input();
    assert!(matches!(
        input.declaration,
        DeclarationState::Established {
            capabilities_object_present: true,
            ..
        }
    ));
    let set: &BTreeSet<String> = input.verified.as_set().unwrap();
    assert_eq!(set.len(), 10);
    assert_eq!(
        input.lease,
        LeaseFacts {
            policy: LeasePolicy::ReuseByEnvironment,
            job_backend: true,
            native_file_sync_unsupported: true
        }
    );
    assert!(!input.config_resolution_failed);
    assert_eq!(s.resolve(), resolve(&input));
}

// ------------------------------------------------------------ duplicate keys in the text

#[test]
fn repeated_capability_key_in_manifest_text_is_rejected() {
    // A plain JSON parser keeps the last value: this would read as `true`.
    let text = r#"{"id": "a", "version": "1", "worker": {"command": ["w"]},
        "environmentDrivers": [{"driverKey": "acme", "kind": "sandbox_provider",
        "sandboxCapabilities": {"reusableLeases": false, "reusableLeases": true}}]}"#;
    let err = parse_manifest(text).unwrap_err();
    assert_eq!(err.code().as_str(), "E1001");
    assert!(
        err.to_string().contains("duplicate key `reusableLeases`"),
        "{err}"
    );
}

#[test]
fn repeated_key_in_scenario_text_is_rejected() {
    let text = r#"{"plugin": null, "driverKey": "acme", "driverKey": "zeta"}"#;
    let err = parse_scenario(text).unwrap_err();
    assert_eq!(err.code().as_str(), "E1001");
    assert!(
        err.to_string().contains("duplicate key `driverKey`"),
        "{err}"
    );
}

#[test]
fn same_key_in_sibling_objects_is_not_a_duplicate() {
    let text = r#"{"id": "a", "version": "1", "worker": {"command": ["w"]},
        "environmentDrivers": [
          {"driverKey": "x", "kind": "sandbox_provider", "sandboxCapabilities": {"nativeSyncIn": true}},
          {"driverKey": "y", "kind": "sandbox_provider", "sandboxCapabilities": {"nativeSyncIn": false}}]}"#;
    let m = parse_manifest(text).unwrap();
    assert_eq!(
        m.driver("y").unwrap().declared.value(C::NativeSyncIn),
        Declared::False
    );
}

#[test]
fn ordinary_run_is_ephemeral_with_a_resolved_config() {
    let input = ResolutionInput::ordinary_run(declaration(Some(all_true()), None), all_methods());
    assert_eq!(input.lease, LeaseFacts::default());
    assert!(!input.config_resolution_failed);
    let r = resolve(&input);
    assert!(!on(&r, C::ReusableLeases));
    assert!(on(&r, C::IncrementalSessionOutput));
}
