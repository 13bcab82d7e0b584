//! The worker-method prerequisites of each provider capability.
//!
//! A capability is *verified* only when the live worker advertises every method
//! listed here in `InitializeResult.supportedMethods`. A declaration never
//! replaces a prerequisite.

use std::collections::BTreeSet;

use crate::capability::ProviderCapability;

pub const ENVIRONMENT_RESUME_LEASE: &str = "environmentResumeLease";
pub const ENVIRONMENT_RELEASE_LEASE: &str = "environmentReleaseLease";
pub const ENVIRONMENT_DESTROY_LEASE: &str = "environmentDestroyLease";
pub const ENVIRONMENT_SYNC_IN: &str = "environmentSyncIn";
pub const ENVIRONMENT_SYNC_OUT: &str = "environmentSyncOut";
pub const ENVIRONMENT_EXECUTE: &str = "environmentExecute";

const LEASE_LIFECYCLE: &[&str] = &[
    ENVIRONMENT_RESUME_LEASE,
    ENVIRONMENT_RELEASE_LEASE,
    ENVIRONMENT_DESTROY_LEASE,
];
const NATIVE_SYNC_PAIR: &[&str] = &[ENVIRONMENT_SYNC_IN, ENVIRONMENT_SYNC_OUT];
const EXECUTE: &[&str] = &[ENVIRONMENT_EXECUTE];

/// The worker methods `cap` requires, in a fixed order.
///
/// - `reusableLeases`: resume, release **and** destroy. The reuse path destroys a
///   stale lease when a resume fails, so a worker that cannot destroy would strand it.
/// - `nativeSyncIn` and `nativeSyncOut`: **both** `environmentSyncIn` and
///   `environmentSyncOut`, for either key. The contract says the host advertises
///   and consumes the two native sync methods as a pair ("define both or
///   neither"), and the host only takes the native path when both directions are
///   effective. A worker advertising one sync method alone is therefore treated
///   as advertising neither: both keys resolve off and the host keeps the
///   base64-over-exec fallback in both directions, rather than mixing a native
///   upload with a fallback download.
/// - `persistentProcessSessions`, `independentControlCommands`,
///   `incrementalSessionOutput`: `environmentExecute`.
pub fn required_methods(cap: ProviderCapability) -> &'static [&'static str] {
    match cap {
        ProviderCapability::ReusableLeases => LEASE_LIFECYCLE,
        ProviderCapability::NativeSyncIn | ProviderCapability::NativeSyncOut => NATIVE_SYNC_PAIR,
        ProviderCapability::PersistentProcessSessions
        | ProviderCapability::IndependentControlCommands
        | ProviderCapability::IncrementalSessionOutput => EXECUTE,
    }
}

/// The prerequisites of `cap` that `advertised` lacks, in table order.
pub fn missing_methods(
    cap: ProviderCapability,
    advertised: &BTreeSet<String>,
) -> Vec<&'static str> {
    required_methods(cap)
        .iter()
        .copied()
        .filter(|m| !advertised.contains(*m))
        .collect()
}

/// Whether `advertised` holds every prerequisite of `cap`.
pub fn is_verified(cap: ProviderCapability, advertised: &BTreeSet<String>) -> bool {
    missing_methods(cap, advertised).is_empty()
}

/// Every method some capability requires, deduplicated, in table order.
pub fn all_prerequisite_methods() -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for cap in ProviderCapability::ALL {
        for m in required_methods(cap) {
            if !out.contains(m) {
                out.push(m);
            }
        }
    }
    out
}
