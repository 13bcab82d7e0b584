//! The contract crate's one error enum and the single place its codes are mapped.
//!
//! Code families (the whole project uses them; see docs/ERRORS.md):
//! - E1xxx plugin manifests, driver declarations and capability scenarios
//! - E2xxx templates (`template.yaml`)
//! - E3xxx command execution and command capabilities (E3004: not supported)
//! - E4xxx worker protocol and plugin host
//! - E5xxx runtime: store, leases, sandboxes
//! - E6xxx providers and sandboxes (local, docker, ...)
//! - E9xxx internal errors

use std::fmt;

/// A stable, documented error code such as `E3004`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ErrorCode(pub &'static str);

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        self.0
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// Every error the contract crate reports. Messages are lowercase with no final
/// period; JSON paths use `$` for the document root (`$.environmentDrivers[0].kind`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContractError {
    // ---- E1xxx: manifests, declarations, scenarios ----
    #[error("{what} is not valid JSON: {detail}")]
    InvalidJson { what: &'static str, detail: String },

    #[error("missing required key `{key}` at {path}")]
    MissingKey { key: String, path: String },

    #[error("`{key}` at {path} must be {expected}, found {found}")]
    WrongType {
        key: String,
        path: String,
        expected: &'static str,
        found: &'static str,
    },

    #[error("unknown sandbox capability key `{key}` at {path}{hint}")]
    UnknownCapabilityKey {
        key: String,
        path: String,
        hint: String,
    },

    #[error("invalid value for `{key}` at {path}: {detail}")]
    InvalidValue {
        key: String,
        path: String,
        detail: String,
    },

    #[error("duplicate driverKey `{driver_key}` at {path}")]
    DuplicateDriverKey { driver_key: String, path: String },

    #[error("invalid scenario: `{key}` at {path}: {detail}")]
    InvalidScenario {
        key: String,
        path: String,
        detail: String,
    },

    // ---- E2xxx: templates ----
    #[error("template is not valid YAML{location}: {detail}")]
    TemplateSyntax { location: String, detail: String },

    #[error("unknown command capability `{token}` in template{location}; known: {known}")]
    UnknownCommandCapability {
        token: String,
        location: String,
        known: String,
    },

    #[error("unknown template field `{field}`{location}")]
    UnknownTemplateField { field: String, location: String },

    #[error("template is missing required field `{field}`")]
    MissingTemplateField { field: &'static str },

    #[error("invalid template field `{field}`{location}: {detail}")]
    InvalidTemplateField {
        field: String,
        location: String,
        detail: String,
    },

    // ---- E3xxx: command capabilities ----
    #[error("{0}")]
    CapabilityNotSupported(crate::gate::CapabilityNotSupportedError),
}

impl ContractError {
    /// The stable code of this error. This match is the one place codes are mapped.
    pub fn code(&self) -> ErrorCode {
        ErrorCode(match self {
            Self::InvalidJson { .. } => "E1001",
            Self::MissingKey { .. } => "E1002",
            Self::WrongType { .. } => "E1003",
            Self::UnknownCapabilityKey { .. } => "E1004",
            Self::InvalidValue { .. } => "E1005",
            Self::DuplicateDriverKey { .. } => "E1006",
            Self::InvalidScenario { .. } => "E1010",
            Self::TemplateSyntax { .. } => "E2001",
            Self::UnknownCommandCapability { .. } => "E2002",
            Self::UnknownTemplateField { .. } => "E2003",
            Self::MissingTemplateField { .. } => "E2004",
            Self::InvalidTemplateField { .. } => "E2005",
            // the gate error owns its code
            Self::CapabilityNotSupported(e) => return e.code(),
        })
    }

    /// The offending key, token or field, for CLI output (`exit 2` naming it).
    pub fn offending(&self) -> Option<&str> {
        match self {
            Self::InvalidJson { .. } | Self::TemplateSyntax { .. } => None,
            Self::MissingKey { key, .. }
            | Self::WrongType { key, .. }
            | Self::UnknownCapabilityKey { key, .. }
            | Self::InvalidValue { key, .. }
            | Self::InvalidScenario { key, .. } => Some(key),
            Self::DuplicateDriverKey { driver_key, .. } => Some(driver_key),
            Self::UnknownCommandCapability { token, .. } => Some(token),
            Self::UnknownTemplateField { field, .. } | Self::InvalidTemplateField { field, .. } => {
                Some(field)
            }
            Self::MissingTemplateField { field } => Some(field),
            Self::CapabilityNotSupported(e) => Some(e.capability.as_str()),
        }
    }

    /// The JSON path of the offending key, when the error has one.
    pub fn json_path(&self) -> Option<&str> {
        match self {
            Self::MissingKey { path, .. }
            | Self::WrongType { path, .. }
            | Self::UnknownCapabilityKey { path, .. }
            | Self::InvalidValue { path, .. }
            | Self::DuplicateDriverKey { path, .. }
            | Self::InvalidScenario { path, .. } => Some(path),
            _ => None,
        }
    }
}

/// The JSON type name of a value, for `WrongType { found }`.
pub fn json_type_name(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}
