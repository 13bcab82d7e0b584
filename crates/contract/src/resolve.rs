//! Capability resolution: `effective = verified ∩ declared ∩ narrowing`, with a
//! one-line explanation per key.
//!
//! The host never trusts a declaration alone and never grants from an unknown
//! state: when the plugin identity cannot be established every key is off.
//!
//! # Which input an explanation names
//!
//! Several inputs can deny the same key (for example a key declared `false`
//! whose worker also lacks the method). The explanation names exactly one, by
//! this fixed precedence:
//!
//! 1. **identity** — without an established declaration no other input means
//!    anything, and nothing can be fixed before it is;
//! 2. **declaration** (`false`, or an omitted opt-in key) — the provider's own,
//!    run-independent statement; advertising more methods would not change it;
//! 3. **verification** — what the live worker advertised; a property of the
//!    worker build, the same for every run;
//! 4. **narrowing** — the per-run restriction (lease policy, backend, config
//!    failure), named last because it is the only reason that changes from one
//!    run of a correct provider to the next.
//!
//! The order goes from "cannot know anything" to "fine, but not for this run",
//! so the line always names the first thing a provider author or operator would
//! have to change.

use std::collections::BTreeSet;
use std::fmt;

use serde_json::Value;

use crate::capability::{
    CapabilityMap, Declared, DeclaredCapabilities, EffectiveCapabilities, ProviderCapability,
};
use crate::manifest::{DriverKind, PluginManifest, SANDBOX_PROVIDER_KIND};
use crate::prerequisites::{missing_methods, required_methods};

/// The lease policy of the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LeasePolicy {
    /// A lease the host does not retain: it never reuses.
    #[default]
    Ephemeral,
    /// A retained lease, reused by the same environment.
    ReuseByEnvironment,
}

impl LeasePolicy {
    pub fn from_wire(s: &str) -> Option<Self> {
        match s {
            "ephemeral" => Some(Self::Ephemeral),
            "reuse_by_environment" => Some(Self::ReuseByEnvironment),
            _ => None,
        }
    }

    pub fn as_wire(self) -> &'static str {
        match self {
            Self::Ephemeral => "ephemeral",
            Self::ReuseByEnvironment => "reuse_by_environment",
        }
    }
}

/// The per-run lease facts that narrow capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LeaseFacts {
    pub policy: LeasePolicy,
    /// The lease is backed by a Kubernetes Job (`metadata.backend == "job"`).
    pub job_backend: bool,
    /// The host marked the lease unable to run native file sync
    /// (`metadata.nativeFileSyncUnsupported == true`).
    pub native_file_sync_unsupported: bool,
}

impl LeaseFacts {
    /// Read the narrowing facts from a lease's metadata object. Only the exact
    /// values `"job"` and `true` count; anything else (absent, other types) does not.
    pub fn from_metadata(policy: LeasePolicy, metadata: &Value) -> Self {
        Self {
            policy,
            job_backend: metadata.get("backend").and_then(Value::as_str) == Some("job"),
            native_file_sync_unsupported: metadata
                .get("nativeFileSyncUnsupported")
                .and_then(Value::as_bool)
                == Some(true),
        }
    }
}

/// Why the declaration of a driver could not be established.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentityFailure {
    /// No plugin (or not the one the lease pinned, see `PinnedPluginMismatch`).
    PluginAbsent,
    /// The plugin no longer declares this driver key.
    DriverKeyNotDeclared { driver_key: String },
    /// The plugin declares the key, but not with kind `sandbox_provider`.
    WrongKind { driver_key: String, kind: String },
    /// A retained lease pinned another plugin than the one found.
    PinnedPluginMismatch { pinned: String, found: String },
}

impl fmt::Display for IdentityFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PluginAbsent => f.write_str("plugin absent"),
            Self::DriverKeyNotDeclared { driver_key } => {
                write!(f, "plugin does not declare driverKey `{driver_key}`")
            }
            Self::WrongKind { driver_key, kind } => write!(
                f,
                "driver `{driver_key}` has kind `{kind}`, not `{SANDBOX_PROVIDER_KIND}`"
            ),
            Self::PinnedPluginMismatch { pinned, found } => {
                write!(f, "lease pins plugin `{pinned}` but found `{found}`")
            }
        }
    }
}

/// The declaration input of a resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeclarationState {
    /// The exact plugin declares the driver as a sandbox provider.
    Established {
        capabilities_object_present: bool,
        declared: DeclaredCapabilities,
    },
    /// The declaration cannot be established: every capability resolves false.
    IdentityFailed(IdentityFailure),
}

/// Establish the declaration of `driver_key` from `plugin`, checking, in order:
/// the plugin is present; it is the pinned plugin when a lease pins one; it
/// declares the key; the key's kind is `sandbox_provider`.
pub fn establish_declaration(
    plugin: Option<&PluginManifest>,
    driver_key: &str,
    pinned_plugin_id: Option<&str>,
) -> DeclarationState {
    let fail = DeclarationState::IdentityFailed;
    let Some(plugin) = plugin else {
        return fail(IdentityFailure::PluginAbsent);
    };
    if let Some(pinned) = pinned_plugin_id {
        if pinned != plugin.id {
            return fail(IdentityFailure::PinnedPluginMismatch {
                pinned: pinned.to_owned(),
                found: plugin.id.clone(),
            });
        }
    }
    let Some(driver) = plugin.driver(driver_key) else {
        return fail(IdentityFailure::DriverKeyNotDeclared {
            driver_key: driver_key.to_owned(),
        });
    };
    if let DriverKind::Other(kind) = &driver.kind {
        return fail(IdentityFailure::WrongKind {
            driver_key: driver_key.to_owned(),
            kind: kind.clone(),
        });
    }
    DeclarationState::Established {
        capabilities_object_present: driver.capabilities_object_present,
        declared: driver.declared.clone(),
    }
}

/// The methods the live worker advertised in `InitializeResult.supportedMethods`.
/// `None` is a missing list; both `None` and an empty set verify nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Verified(pub Option<BTreeSet<String>>);

impl Verified {
    /// No `supportedMethods` list at all (or no worker).
    pub fn missing() -> Self {
        Self(None)
    }

    /// An advertised list (possibly empty).
    pub fn methods<I, S>(methods: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self(Some(methods.into_iter().map(Into::into).collect()))
    }

    /// From an optional wire list.
    pub fn from_list(list: Option<Vec<String>>) -> Self {
        Self(list.map(|l| l.into_iter().collect()))
    }

    pub fn advertises(&self, method: &str) -> bool {
        self.0.as_ref().is_some_and(|s| s.contains(method))
    }

    pub fn as_set(&self) -> Option<&BTreeSet<String>> {
        self.0.as_ref()
    }
}

/// Everything one resolution reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolutionInput {
    pub declaration: DeclarationState,
    pub verified: Verified,
    pub lease: LeaseFacts,
    pub config_resolution_failed: bool,
}

impl ResolutionInput {
    /// An ordinary run: ephemeral lease, no Job backend, config resolved (what
    /// `sandhost plugin inspect` reports as `effective`).
    pub fn ordinary_run(declaration: DeclarationState, verified: Verified) -> Self {
        Self {
            declaration,
            verified,
            lease: LeaseFacts::default(),
            config_resolution_failed: false,
        }
    }
}

/// Why a per-run narrowing removed a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NarrowReason {
    /// An ephemeral lease never reuses.
    EphemeralLeasePolicy,
    /// A Kubernetes Job-backed lease cannot run native sync.
    JobBackend,
    /// The host marked the lease unable to run native file sync.
    NativeFileSyncUnsupported,
    /// The provider config could not be resolved: fail closed.
    ConfigResolutionFailed,
}

impl fmt::Display for NarrowReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::EphemeralLeasePolicy => "narrowed by ephemeral lease policy",
            Self::JobBackend => {
                "narrowed by job backend lease (host keeps the base64-over-exec fallback)"
            }
            Self::NativeFileSyncUnsupported => {
                "narrowed: lease marked nativeFileSyncUnsupported \
                 (host keeps the base64-over-exec fallback)"
            }
            Self::ConfigResolutionFailed => "config resolution failed (fail closed)",
        })
    }
}

/// One key's narrowing: left alone, or narrowed off. There is no "narrowed on".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Narrow {
    #[default]
    NotNarrowed,
    Off(NarrowReason),
}

/// The per-run narrowing of every key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Narrowing(pub CapabilityMap<Narrow>);

impl Narrowing {
    pub fn get(&self, cap: ProviderCapability) -> Narrow {
        self.0.value(cap)
    }

    pub fn is_narrowed(&self, cap: ProviderCapability) -> bool {
        matches!(self.get(cap), Narrow::Off(_))
    }
}

/// The narrowing of one run:
/// - an ephemeral lease narrows `reusableLeases`;
/// - a Job-backed lease, or one marked `nativeFileSyncUnsupported`, narrows both
///   native sync keys (the Job backend is named when both apply);
/// - a config-resolution failure narrows `persistentProcessSessions` and
///   `incrementalSessionOutput`.
pub fn narrowing(lease: &LeaseFacts, config_resolution_failed: bool) -> Narrowing {
    use ProviderCapability as C;
    let mut map = CapabilityMap::<Narrow>::default();
    if lease.policy == LeasePolicy::Ephemeral {
        map.set(
            C::ReusableLeases,
            Narrow::Off(NarrowReason::EphemeralLeasePolicy),
        );
    }
    let sync = if lease.job_backend {
        Some(NarrowReason::JobBackend)
    } else if lease.native_file_sync_unsupported {
        Some(NarrowReason::NativeFileSyncUnsupported)
    } else {
        None
    };
    if let Some(reason) = sync {
        map.set(C::NativeSyncIn, Narrow::Off(reason));
        map.set(C::NativeSyncOut, Narrow::Off(reason));
    }
    if config_resolution_failed {
        map.set(
            C::PersistentProcessSessions,
            Narrow::Off(NarrowReason::ConfigResolutionFailed),
        );
        map.set(
            C::IncrementalSessionOutput,
            Narrow::Off(NarrowReason::ConfigResolutionFailed),
        );
    }
    Narrowing(map)
}

/// The deciding input of one key, in the precedence order of the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// Off: the declaration could not be established.
    IdentityFailed(IdentityFailure),
    /// Off: the declaration sets the key to `false`.
    DeclaredFalse,
    /// Off: an opt-in key (`reusableLeases`, `incrementalSessionOutput`) is not declared `true`.
    OptInOmitted {
        cap: ProviderCapability,
        capabilities_object_present: bool,
    },
    /// Off: the worker sent no `supportedMethods` list.
    NoMethodList,
    /// Off: the worker's `supportedMethods` list is empty.
    EmptyMethodList,
    /// Off: the worker did not advertise these prerequisites (table order).
    MissingMethods {
        cap: ProviderCapability,
        missing: Vec<&'static str>,
    },
    /// Off: a per-run narrowing removed the key.
    Narrowed(NarrowReason),
    /// On: verified and declared `true`.
    OnDeclaredTrue { cap: ProviderCapability },
    /// On: verified and omitted, deferring to discovery.
    OnOmitted {
        cap: ProviderCapability,
        capabilities_object_present: bool,
    },
}

impl Reason {
    pub fn is_on(&self) -> bool {
        matches!(self, Self::OnDeclaredTrue { .. } | Self::OnOmitted { .. })
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::IdentityFailed(failure) => {
                write!(f, "off: plugin identity not established: {failure}")
            }
            Self::DeclaredFalse => f.write_str("off: declared false"),
            Self::OptInOmitted {
                cap,
                capabilities_object_present,
            } => {
                let whence = if *capabilities_object_present {
                    ""
                } else {
                    " (no sandboxCapabilities object)"
                };
                write!(
                    f,
                    "off: opt-in key omitted{whence}; declare sandboxCapabilities.{cap}: true"
                )
            }
            Self::NoMethodList => {
                f.write_str("off: worker sent no supportedMethods list (verifies nothing)")
            }
            Self::EmptyMethodList => f.write_str(
                "off: worker advertised an empty supportedMethods list (verifies nothing)",
            ),
            Self::MissingMethods { cap, missing } => {
                write!(f, "off: worker did not advertise {}", missing.join(", "))?;
                if matches!(
                    cap,
                    ProviderCapability::NativeSyncIn | ProviderCapability::NativeSyncOut
                ) {
                    f.write_str(
                        " (native sync needs the environmentSyncIn/environmentSyncOut pair)",
                    )?;
                }
                Ok(())
            }
            Self::Narrowed(reason) => write!(f, "off: {reason}"),
            Self::OnDeclaredTrue { cap } => {
                write!(
                    f,
                    "on: verified ({}) and declared true",
                    required_methods(*cap).join(", ")
                )
            }
            Self::OnOmitted {
                cap,
                capabilities_object_present,
            } => {
                let whence = if *capabilities_object_present {
                    ""
                } else {
                    "no sandboxCapabilities object, "
                };
                write!(
                    f,
                    "on: verified ({}) and omitted ({whence}defers to discovery)",
                    required_methods(*cap).join(", ")
                )
            }
        }
    }
}

/// The outcome of one resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolution {
    pub effective: EffectiveCapabilities,
    /// One line per key: `on: ...` or `off: ...`, naming the deciding input.
    pub explain: CapabilityMap<String>,
    /// The structured deciding input behind each line of `explain`.
    pub reasons: CapabilityMap<Reason>,
}

/// Resolve every key: `effective = verified ∩ declared ∩ narrowing`.
pub fn resolve(input: &ResolutionInput) -> Resolution {
    let narrow = narrowing(&input.lease, input.config_resolution_failed);
    let reasons = CapabilityMap::from_fn(|cap| decide(cap, input, &narrow));
    Resolution {
        effective: CapabilityMap::from_fn(|cap| reasons.get(cap).is_on()),
        explain: CapabilityMap::from_fn(|cap| reasons.get(cap).to_string()),
        reasons,
    }
}

fn decide(cap: ProviderCapability, input: &ResolutionInput, narrow: &Narrowing) -> Reason {
    // 1. identity
    let (capabilities_object_present, declared) = match &input.declaration {
        DeclarationState::IdentityFailed(failure) => {
            return Reason::IdentityFailed(failure.clone())
        }
        DeclarationState::Established {
            capabilities_object_present,
            declared,
        } => (*capabilities_object_present, declared.value(cap)),
    };
    // 2. declaration
    match declared {
        Declared::False => return Reason::DeclaredFalse,
        Declared::Omitted if cap.is_opt_in() => {
            return Reason::OptInOmitted {
                cap,
                capabilities_object_present,
            }
        }
        Declared::Omitted | Declared::True => {}
    }
    // 3. verification
    match input.verified.as_set() {
        None => return Reason::NoMethodList,
        Some(set) if set.is_empty() => return Reason::EmptyMethodList,
        Some(set) => {
            let missing = missing_methods(cap, set);
            if !missing.is_empty() {
                return Reason::MissingMethods { cap, missing };
            }
        }
    }
    // 4. narrowing
    if let Narrow::Off(reason) = narrow.get(cap) {
        return Reason::Narrowed(reason);
    }
    if declared == Declared::True {
        Reason::OnDeclaredTrue { cap }
    } else {
        Reason::OnOmitted {
            cap,
            capabilities_object_present,
        }
    }
}
