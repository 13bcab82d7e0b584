//! The capability snapshot of one run: resolved once from the live worker's
//! verified methods, the driver declaration and the run's narrowing, then
//! frozen. Whatever chooses a path (reuse or ephemeral lease, native sync or
//! base64, session or one-shot, stream or poll) reads it and nothing else.

use sandhost_contract::capability::EffectiveCapabilities;
use sandhost_contract::manifest::PluginManifest;
use sandhost_contract::resolve::{
    establish_declaration, resolve, LeaseFacts, Resolution, ResolutionInput, Verified,
};
use sandhost_contract::{CapabilityMap, ProviderCapability};

/// The per-run inputs besides the worker and the plugin.
#[derive(Debug, Clone)]
pub struct RunFacts<'a> {
    pub driver_key: &'a str,
    pub lease: LeaseFacts,
    /// The plugin id a retained lease pins, when resuming one.
    pub pinned_plugin_id: Option<&'a str>,
    pub config_resolution_failed: bool,
}

/// A read-only resolution for one run. There are no setters: a path that
/// wants a capability asks [`CapabilitySnapshot::allows`].
#[derive(Debug, Clone)]
pub struct CapabilitySnapshot {
    plugin_id: Option<String>,
    plugin_version: Option<String>,
    driver_key: String,
    resolution: Resolution,
}

impl CapabilitySnapshot {
    /// Resolve the contract for one run. `plugin` is `None` when the plugin
    /// is absent (every capability then resolves false).
    pub fn resolve(
        plugin: Option<&PluginManifest>,
        verified: Verified,
        facts: &RunFacts<'_>,
    ) -> Self {
        let input = ResolutionInput {
            declaration: establish_declaration(plugin, facts.driver_key, facts.pinned_plugin_id),
            verified,
            lease: facts.lease,
            config_resolution_failed: facts.config_resolution_failed,
        };
        Self {
            plugin_id: plugin.map(|p| p.id.clone()),
            plugin_version: plugin.map(|p| p.version.clone()),
            driver_key: facts.driver_key.to_string(),
            resolution: resolve(&input),
        }
    }

    pub fn allows(&self, cap: ProviderCapability) -> bool {
        self.resolution.effective.value(cap)
    }

    /// Native sync is used only when both directions are effective.
    pub fn native_sync(&self) -> bool {
        self.allows(ProviderCapability::NativeSyncIn)
            && self.allows(ProviderCapability::NativeSyncOut)
    }

    pub fn effective(&self) -> &EffectiveCapabilities {
        &self.resolution.effective
    }

    pub fn explain(&self) -> &CapabilityMap<String> {
        &self.resolution.explain
    }

    pub fn plugin_id(&self) -> Option<&str> {
        self.plugin_id.as_deref()
    }

    pub fn plugin_version(&self) -> Option<&str> {
        self.plugin_version.as_deref()
    }

    pub fn driver_key(&self) -> &str {
        &self.driver_key
    }

    /// True when nothing at all is granted (e.g. identity failure).
    pub fn grants_nothing(&self) -> bool {
        ProviderCapability::ALL.iter().all(|c| !self.allows(*c))
    }
}
