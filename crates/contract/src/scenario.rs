//! The scenario file of `sandhost capabilities explain`: one run's inputs, parsed
//! strictly and resolved.
//!
//! ```json
//! {
//!   "plugin": { ...plugin.json... },          // or null: plugin absent
//!   "driverKey": "acme",
//!   "worker": {"supportedMethods": [...]},    // null, or no list: verifies nothing
//!   "lease": {
//!     "policy": "ephemeral" | "reuse_by_environment",   // default ephemeral
//!     "metadata": {"backend": "job", "nativeFileSyncUnsupported": true},
//!     "pinnedPluginId": "acme.sandbox"
//!   },
//!   "configResolutionFailed": false
//! }
//! ```
//!
//! Error policy:
//! - an invalid embedded manifest is the manifest's own E1xxx error, with paths
//!   under `$.plugin` (the CLI exits 2); a `null` plugin is *not* an error: it is
//!   an identity failure and every key resolves false;
//! - any other bad shape is [`ContractError::InvalidScenario`] naming the key and
//!   its path; unknown keys of the scenario, `lease` and `worker` objects are
//!   rejected (a typo such as `pinnedPluginID` would otherwise silently drop a pin);
//! - `plugin` and `driverKey` are required: an absent plugin is spelled `null`.

use serde_json::{Map, Value};

use crate::error::{json_type_name, ContractError};
use crate::manifest::{child, parse_json_strict, validate_manifest_at, PluginManifest};
use crate::resolve::{
    establish_declaration, resolve, LeaseFacts, LeasePolicy, Resolution, ResolutionInput, Verified,
};

const TOP_LEVEL_KEYS: [&str; 5] = [
    "plugin",
    "driverKey",
    "worker",
    "lease",
    "configResolutionFailed",
];
const LEASE_KEYS: [&str; 3] = ["policy", "metadata", "pinnedPluginId"];
const WORKER_KEYS: [&str; 2] = ["ok", "supportedMethods"];

/// The worker half of a scenario: its `InitializeResult`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScenarioWorker {
    /// `InitializeResult.ok`; `Some(false)` means the handshake failed, which
    /// verifies nothing whatever list came with it. Absent counts as success.
    pub ok: Option<bool>,
    /// `InitializeResult.supportedMethods`; `None` when absent or `null`.
    pub supported_methods: Option<Vec<String>>,
}

/// The lease half of a scenario.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScenarioLease {
    pub policy: LeasePolicy,
    /// The lease metadata object (`{}` when absent).
    pub metadata: Value,
    /// The exact plugin a retained lease pins.
    pub pinned_plugin_id: Option<String>,
}

/// A parsed `capabilities explain` scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    /// The validated manifest; `None` when the scenario says `"plugin": null`.
    pub plugin: Option<PluginManifest>,
    pub driver_key: String,
    /// `None` when the scenario says `"worker": null` or has no `worker` key.
    pub worker: Option<ScenarioWorker>,
    pub lease: ScenarioLease,
    pub config_resolution_failed: bool,
}

impl Scenario {
    /// The verified-method input this scenario gives.
    pub fn verified(&self) -> Verified {
        match &self.worker {
            None
            | Some(ScenarioWorker {
                ok: Some(false), ..
            }) => Verified::missing(),
            Some(w) => Verified::from_list(w.supported_methods.clone()),
        }
    }

    pub fn to_input(&self) -> ResolutionInput {
        ResolutionInput {
            declaration: establish_declaration(
                self.plugin.as_ref(),
                &self.driver_key,
                self.lease.pinned_plugin_id.as_deref(),
            ),
            verified: self.verified(),
            lease: LeaseFacts::from_metadata(self.lease.policy, &self.lease.metadata),
            config_resolution_failed: self.config_resolution_failed,
        }
    }

    pub fn resolve(&self) -> Resolution {
        resolve(&self.to_input())
    }
}

/// Parse and validate a scenario file. A key repeated within one JSON object is
/// [`ContractError::InvalidJson`], as in [`crate::manifest::parse_manifest`].
pub fn parse_scenario(text: &str) -> Result<Scenario, ContractError> {
    scenario_from_value(&parse_json_strict(text, "scenario")?)
}

/// Validate an already parsed scenario; paths are rooted at `$`.
pub fn scenario_from_value(value: &Value) -> Result<Scenario, ContractError> {
    let root = "$";
    let obj = object(value, "scenario", root)?;
    reject_unknown(obj, &TOP_LEVEL_KEYS, root)?;

    let plugin = match obj.get("plugin") {
        None => {
            return Err(invalid(
                "plugin",
                &child(root, "plugin"),
                "missing required key (use null for an absent plugin)",
            ))
        }
        Some(Value::Null) => None,
        Some(v) => Some(validate_manifest_at(v, &child(root, "plugin"))?),
    };

    let driver_key = match obj.get("driverKey") {
        None => {
            return Err(invalid(
                "driverKey",
                &child(root, "driverKey"),
                "missing required key",
            ))
        }
        Some(Value::String(s)) if s.is_empty() => {
            return Err(invalid(
                "driverKey",
                &child(root, "driverKey"),
                "must not be empty",
            ))
        }
        Some(Value::String(s)) => s.clone(),
        Some(other) => {
            return Err(expected(
                "driverKey",
                &child(root, "driverKey"),
                "a string",
                other,
            ))
        }
    };

    let worker = match obj.get("worker") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_worker(v, &child(root, "worker"))?),
    };

    let lease = match obj.get("lease") {
        None | Some(Value::Null) => ScenarioLease {
            metadata: empty_object(),
            ..Default::default()
        },
        Some(v) => parse_lease(v, &child(root, "lease"))?,
    };

    let config_resolution_failed = match obj.get("configResolutionFailed") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(expected(
                "configResolutionFailed",
                &child(root, "configResolutionFailed"),
                "a boolean",
                other,
            ))
        }
    };

    Ok(Scenario {
        plugin,
        driver_key,
        worker,
        lease,
        config_resolution_failed,
    })
}

fn parse_worker(value: &Value, path: &str) -> Result<ScenarioWorker, ContractError> {
    let obj = object(value, "worker", path)?;
    reject_unknown(obj, &WORKER_KEYS, path)?;
    let ok = match obj.get("ok") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => return Err(expected("ok", &child(path, "ok"), "a boolean", other)),
    };
    let list_path = child(path, "supportedMethods");
    let supported_methods = match obj.get("supportedMethods") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(expected(
                        "supportedMethods",
                        &format!("{list_path}[{i}]"),
                        "a string",
                        other,
                    )),
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(other) => {
            return Err(expected(
                "supportedMethods",
                &list_path,
                "an array of strings",
                other,
            ))
        }
    };
    Ok(ScenarioWorker {
        ok,
        supported_methods,
    })
}

fn parse_lease(value: &Value, path: &str) -> Result<ScenarioLease, ContractError> {
    let obj = object(value, "lease", path)?;
    reject_unknown(obj, &LEASE_KEYS, path)?;
    let policy_path = child(path, "policy");
    let policy = match obj.get("policy") {
        None | Some(Value::Null) => LeasePolicy::default(),
        Some(Value::String(s)) => LeasePolicy::from_wire(s).ok_or_else(|| {
            invalid(
                "policy",
                &policy_path,
                &format!(
                    "unknown lease policy `{s}`; expected `ephemeral` or `reuse_by_environment`"
                ),
            )
        })?,
        Some(other) => return Err(expected("policy", &policy_path, "a string", other)),
    };
    let metadata = match obj.get("metadata") {
        None | Some(Value::Null) => empty_object(),
        Some(v @ Value::Object(_)) => v.clone(),
        Some(other) => {
            return Err(expected(
                "metadata",
                &child(path, "metadata"),
                "an object",
                other,
            ))
        }
    };
    let pinned_path = child(path, "pinnedPluginId");
    let pinned_plugin_id = match obj.get("pinnedPluginId") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => {
            return Err(invalid("pinnedPluginId", &pinned_path, "must not be empty"))
        }
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => return Err(expected("pinnedPluginId", &pinned_path, "a string", other)),
    };
    Ok(ScenarioLease {
        policy,
        metadata,
        pinned_plugin_id,
    })
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

fn object<'a>(
    value: &'a Value,
    key: &str,
    path: &str,
) -> Result<&'a Map<String, Value>, ContractError> {
    match value {
        Value::Object(map) => Ok(map),
        other => Err(expected(key, path, "an object", other)),
    }
}

fn reject_unknown(
    obj: &Map<String, Value>,
    known: &[&str],
    path: &str,
) -> Result<(), ContractError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(key) => Err(invalid(
            key,
            &child(path, key),
            &format!("unknown key; known keys: {}", known.join(", ")),
        )),
    }
}

fn expected(key: &str, path: &str, what: &str, found: &Value) -> ContractError {
    invalid(
        key,
        path,
        &format!("must be {what}, found {}", json_type_name(found)),
    )
}

fn invalid(key: &str, path: &str, detail: &str) -> ContractError {
    ContractError::InvalidScenario {
        key: key.to_owned(),
        path: path.to_owned(),
        detail: detail.to_owned(),
    }
}
