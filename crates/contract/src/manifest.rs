//! `plugin.json`: the plugin manifest, its driver declarations and the strict validator.
//!
//! The validator is strict where the contract is closed and tolerant where the
//! ecosystem grows:
//! - `sandboxCapabilities` is a closed object of optional booleans. Any other key
//!   (the removed concurrency keys included) is [`ContractError::UnknownCapabilityKey`];
//!   a non-boolean value is [`ContractError::WrongType`].
//! - Unknown top-level, `worker` and driver keys (`description`, `apiVersion`,
//!   `categories`, ...) are tolerated, but every key this module reads has its
//!   type checked.
//!
//! Validation walks the document in a fixed order (top-level keys, then each
//! driver in array order, each capability key in document order) and returns the
//! first error it finds, so the same document always reports the same error.
//!
//! The legacy driver field `supportsReusableLeases` is folded into
//! `reusableLeases` here, once: only the legacy field present -> it is read as
//! `reusableLeases`; both present -> the nested value wins.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::capability::{Declared, DeclaredCapabilities, ProviderCapability};
use crate::error::{json_type_name, ContractError};

/// The `kind` string of a sandbox provider driver.
pub const SANDBOX_PROVIDER_KIND: &str = "sandbox_provider";

/// The legacy driver field folded into `sandboxCapabilities.reusableLeases`.
pub const LEGACY_REUSABLE_LEASES_KEY: &str = "supportsReusableLeases";

/// The nested capability object on a driver declaration.
pub const CAPABILITIES_KEY: &str = "sandboxCapabilities";

/// Capability keys that earlier drafts listed and the contract removed. The
/// validator rejects them as unknown, with a hint saying so.
pub const REMOVED_CAPABILITY_KEYS: [&str; 2] =
    ["concurrentSyncAndExec", "concurrentSyncOperations"];

/// A validated `plugin.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginManifest {
    pub id: String,
    pub version: String,
    pub worker: WorkerSpec,
    pub environment_drivers: Vec<DriverDeclaration>,
}

impl PluginManifest {
    /// The driver declaration with this `driverKey`, if the plugin declares it.
    pub fn driver(&self, key: &str) -> Option<&DriverDeclaration> {
        self.environment_drivers
            .iter()
            .find(|d| d.driver_key == key)
    }
}

/// How to start the plugin's worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// The worker's argv; never empty, no element empty.
    pub command: Vec<String>,
}

/// A driver's `kind`. Only [`DriverKind::SandboxProvider`] establishes a
/// sandbox-provider declaration; other kinds are kept verbatim.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DriverKind {
    SandboxProvider,
    Other(String),
}

impl DriverKind {
    pub fn from_wire(kind: &str) -> Self {
        if kind == SANDBOX_PROVIDER_KIND {
            Self::SandboxProvider
        } else {
            Self::Other(kind.to_owned())
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::SandboxProvider => SANDBOX_PROVIDER_KIND,
            Self::Other(kind) => kind,
        }
    }
}

/// One entry of `environmentDrivers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverDeclaration {
    pub driver_key: String,
    pub kind: DriverKind,
    pub display_name: Option<String>,
    pub config_schema: Option<Value>,
    /// Whether the driver had a `sandboxCapabilities` object at all.
    pub capabilities_object_present: bool,
    /// The declaration after folding the legacy `supportsReusableLeases`.
    pub declared: DeclaredCapabilities,
}

/// Parse and strictly validate a `plugin.json` text.
///
/// A key repeated within one JSON object is rejected as [`ContractError::InvalidJson`]:
/// a plain JSON parser would silently keep the last value, so
/// `{"reusableLeases": false, "reusableLeases": true}` would slip through.
pub fn parse_manifest(text: &str) -> Result<PluginManifest, ContractError> {
    validate_manifest(&parse_json_strict(text, "plugin.json")?)
}

/// Parse JSON text, rejecting any object that repeats a key.
pub(crate) fn parse_json_strict(text: &str, what: &'static str) -> Result<Value, ContractError> {
    let invalid = |e: serde_json::Error| ContractError::InvalidJson {
        what,
        detail: e.to_string(),
    };
    serde_json::from_str::<NoDuplicateKeys>(text).map_err(invalid)?;
    serde_json::from_str(text).map_err(invalid)
}

/// A deserialize-only walk of a JSON document that fails on a repeated object key.
struct NoDuplicateKeys;

impl<'de> serde::Deserialize<'de> for NoDuplicateKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicateKeysVisitor)
    }
}

struct NoDuplicateKeysVisitor;

impl<'de> serde::de::Visitor<'de> for NoDuplicateKeysVisitor {
    type Value = NoDuplicateKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(NoDuplicateKeys)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<NoDuplicateKeys>()?.is_some() {}
        Ok(NoDuplicateKeys)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut seen = BTreeSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(serde::de::Error::custom(format_args!(
                    "duplicate key `{key}`"
                )));
            }
            map.next_value::<NoDuplicateKeys>()?;
        }
        Ok(NoDuplicateKeys)
    }
}

/// Strictly validate a parsed `plugin.json`; JSON paths are rooted at `$`.
pub fn validate_manifest(value: &Value) -> Result<PluginManifest, ContractError> {
    validate_manifest_at(value, "$")
}

/// Strictly validate a manifest embedded at `root` (for example `$.plugin` in a
/// scenario file); every reported path starts with `root`.
pub fn validate_manifest_at(value: &Value, root: &str) -> Result<PluginManifest, ContractError> {
    let obj = expect_object(value, last_segment(root), root)?;

    let id = required_string(obj, "id", root)?;
    if id.is_empty() {
        return Err(invalid_value("id", &child(root, "id"), "must not be empty"));
    }
    let version = required_string(obj, "version", root)?;

    let worker_path = child(root, "worker");
    let worker = expect_object(required(obj, "worker", root)?, "worker", &worker_path)?;
    let command = parse_command(required(worker, "command", &worker_path)?, &worker_path)?;

    let drivers_path = child(root, "environmentDrivers");
    let drivers = match required(obj, "environmentDrivers", root)? {
        Value::Array(items) => items,
        other => {
            return Err(wrong_type(
                "environmentDrivers",
                &drivers_path,
                "an array",
                other,
            ))
        }
    };

    let mut seen = BTreeSet::new();
    let mut environment_drivers = Vec::with_capacity(drivers.len());
    for (i, item) in drivers.iter().enumerate() {
        let path = format!("{drivers_path}[{i}]");
        let driver = parse_driver(item, &path, &mut seen)?;
        environment_drivers.push(driver);
    }

    Ok(PluginManifest {
        id: id.to_owned(),
        version: version.to_owned(),
        worker: WorkerSpec { command },
        environment_drivers,
    })
}

fn parse_command(value: &Value, worker_path: &str) -> Result<Vec<String>, ContractError> {
    let path = child(worker_path, "command");
    let items = match value {
        Value::Array(items) => items,
        other => return Err(wrong_type("command", &path, "an array of strings", other)),
    };
    if items.is_empty() {
        return Err(invalid_value(
            "command",
            &path,
            "must name the worker program (empty argv)",
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let item_path = format!("{path}[{i}]");
            match item {
                Value::String(s) if s.is_empty() => Err(invalid_value(
                    "command",
                    &item_path,
                    "argv elements must not be empty",
                )),
                Value::String(s) => Ok(s.clone()),
                other => Err(wrong_type("command", &item_path, "a string", other)),
            }
        })
        .collect()
}

fn parse_driver(
    value: &Value,
    path: &str,
    seen: &mut BTreeSet<String>,
) -> Result<DriverDeclaration, ContractError> {
    let obj = expect_object(value, "environmentDrivers", path)?;

    let driver_key = required_string(obj, "driverKey", path)?;
    if driver_key.is_empty() {
        return Err(invalid_value(
            "driverKey",
            &child(path, "driverKey"),
            "must not be empty",
        ));
    }
    if !seen.insert(driver_key.to_owned()) {
        return Err(ContractError::DuplicateDriverKey {
            driver_key: driver_key.to_owned(),
            path: child(path, "driverKey"),
        });
    }
    let kind = DriverKind::from_wire(required_string(obj, "kind", path)?);

    let display_name = match obj.get("displayName") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(wrong_type(
                "displayName",
                &child(path, "displayName"),
                "a string",
                other,
            ))
        }
    };
    let config_schema = match obj.get("configSchema") {
        None => None,
        // A JSON Schema is an object, or a boolean schema.
        Some(v @ (Value::Object(_) | Value::Bool(_))) => Some(v.clone()),
        Some(other) => {
            return Err(wrong_type(
                "configSchema",
                &child(path, "configSchema"),
                "an object or a boolean",
                other,
            ))
        }
    };

    let legacy = match obj.get(LEGACY_REUSABLE_LEASES_KEY) {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            return Err(wrong_type(
                LEGACY_REUSABLE_LEASES_KEY,
                &child(path, LEGACY_REUSABLE_LEASES_KEY),
                "a boolean",
                other,
            ))
        }
    };

    let (capabilities_object_present, nested) = match obj.get(CAPABILITIES_KEY) {
        None => (false, DeclaredCapabilities::default()),
        Some(v) => (true, parse_capabilities(v, &child(path, CAPABILITIES_KEY))?),
    };
    let declared = fold_legacy_reusable_leases(nested, legacy);

    Ok(DriverDeclaration {
        driver_key: driver_key.to_owned(),
        kind,
        display_name,
        config_schema,
        capabilities_object_present,
        declared,
    })
}

/// Validate a `sandboxCapabilities` object (closed, optional booleans) found at `path`.
pub fn parse_capabilities(
    value: &Value,
    path: &str,
) -> Result<DeclaredCapabilities, ContractError> {
    let obj = expect_object(value, CAPABILITIES_KEY, path)?;
    let mut declared = DeclaredCapabilities::default();
    for (key, v) in obj {
        let key_path = child(path, key);
        let Some(cap) = ProviderCapability::from_key(key) else {
            return Err(ContractError::UnknownCapabilityKey {
                key: key.clone(),
                path: key_path,
                hint: unknown_key_hint(key),
            });
        };
        match v {
            Value::Bool(b) => declared.set(cap, Declared::from_bool(*b)),
            other => return Err(wrong_type(key, &key_path, "a boolean", other)),
        }
    }
    Ok(declared)
}

/// The spec's fixed precedence for the two reusable-lease opt-in fields: the
/// nested key wins when present; otherwise the legacy field is read as it.
pub fn fold_legacy_reusable_leases(
    mut nested: DeclaredCapabilities,
    legacy: Option<bool>,
) -> DeclaredCapabilities {
    if nested.value(ProviderCapability::ReusableLeases) == Declared::Omitted {
        if let Some(b) = legacy {
            nested.set(ProviderCapability::ReusableLeases, Declared::from_bool(b));
        }
    }
    nested
}

fn unknown_key_hint(key: &str) -> String {
    if REMOVED_CAPABILITY_KEYS.contains(&key) {
        return format!(
            "; `{key}` was removed from the capability contract (no runtime path read it), \
             delete it"
        );
    }
    if let Some(cap) = ProviderCapability::ALL
        .into_iter()
        .find(|c| c.as_str().eq_ignore_ascii_case(key))
    {
        return format!("; did you mean `{cap}`?");
    }
    if key == LEGACY_REUSABLE_LEASES_KEY {
        return format!(
            "; `{LEGACY_REUSABLE_LEASES_KEY}` belongs on the driver declaration, \
             or use `reusableLeases` here"
        );
    }
    let known: Vec<&str> = ProviderCapability::ALL.iter().map(|c| c.as_str()).collect();
    format!("; known keys: {}", known.join(", "))
}

// ---- small helpers shared with the scenario parser ----

/// `path.key`, or `path['key']` when the key is not a plain identifier.
pub(crate) fn child(path: &str, key: &str) -> String {
    let plain = !key.is_empty()
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !key.starts_with(|c: char| c.is_ascii_digit());
    if plain {
        format!("{path}.{key}")
    } else {
        format!(
            "{path}['{}']",
            key.replace('\\', "\\\\").replace('\'', "\\'")
        )
    }
}

/// The key a root path names: `$.plugin` -> `plugin`, `$` -> `$`.
fn last_segment(root: &str) -> &str {
    root.rsplit('.')
        .next()
        .filter(|s| !s.is_empty())
        .unwrap_or(root)
}

fn expect_object<'a>(
    value: &'a Value,
    key: &str,
    path: &str,
) -> Result<&'a Map<String, Value>, ContractError> {
    match value {
        Value::Object(map) => Ok(map),
        other => Err(wrong_type(key, path, "an object", other)),
    }
}

fn required<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'a Value, ContractError> {
    obj.get(key).ok_or_else(|| ContractError::MissingKey {
        key: key.to_owned(),
        path: child(path, key),
    })
}

fn required_string<'a>(
    obj: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<&'a str, ContractError> {
    match required(obj, key, path)? {
        Value::String(s) => Ok(s),
        other => Err(wrong_type(key, &child(path, key), "a string", other)),
    }
}

fn wrong_type(key: &str, path: &str, expected: &'static str, found: &Value) -> ContractError {
    ContractError::WrongType {
        key: key.to_owned(),
        path: path.to_owned(),
        expected,
        found: json_type_name(found),
    }
}

fn invalid_value(key: &str, path: &str, detail: &str) -> ContractError {
    ContractError::InvalidValue {
        key: key.to_owned(),
        path: path.to_owned(),
        detail: detail.to_owned(),
    }
}
