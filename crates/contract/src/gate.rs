//! The E3004 gate: every standard-capability call is checked against the
//! sandbox's effective command capability set before anything runs. No silent
//! degradation: a missing capability is an explicit error with a suggestion.

use std::fmt;

use crate::command::{CommandCapability, CommandSet, DEFAULT_CAPABILITIES};
use crate::error::{ContractError, ErrorCode};

/// A caller invoked a command capability outside the sandbox's effective set
/// (code E3004). `suggestion` lists what is available and how to declare the
/// missing capability in `template.yaml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityNotSupportedError {
    /// The capability the caller invoked.
    pub capability: CommandCapability,
    /// The sandbox's effective set.
    pub available: CommandSet,
    /// The sandbox's template, when known.
    pub template: Option<String>,
    /// What to do about it; never empty.
    pub suggestion: String,
}

impl CapabilityNotSupportedError {
    /// Builds the error with its suggestion.
    pub fn new(
        capability: CommandCapability,
        available: CommandSet,
        template: Option<&str>,
    ) -> Self {
        let suggestion = suggestion(capability, &available, template);
        Self {
            capability,
            available,
            template: template.map(str::to_owned),
            suggestion,
        }
    }

    /// Always `E3004`.
    pub fn code(&self) -> ErrorCode {
        ErrorCode("E3004")
    }
}

/// The message names the missing capability (and the template when known);
/// the suggestion is a separate field.
impl fmt::Display for CapabilityNotSupportedError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "sandbox does not support the `{}` capability",
            self.capability
        )?;
        if let Some(name) = &self.template {
            write!(f, " (template `{name}`)")?;
        }
        Ok(())
    }
}

impl std::error::Error for CapabilityNotSupportedError {}

impl From<CapabilityNotSupportedError> for ContractError {
    fn from(e: CapabilityNotSupportedError) -> Self {
        ContractError::CapabilityNotSupported(e)
    }
}

/// Checks one invocation of `cap` against the sandbox's `effective` set.
pub fn gate(
    effective: &CommandSet,
    cap: CommandCapability,
    template_name: Option<&str>,
) -> Result<(), CapabilityNotSupportedError> {
    if effective.contains(cap) {
        Ok(())
    } else {
        Err(CapabilityNotSupportedError::new(
            cap,
            *effective,
            template_name,
        ))
    }
}

fn suggestion(cap: CommandCapability, available: &CommandSet, template: Option<&str>) -> String {
    let mut s = if available.is_empty() {
        "this sandbox offers no command capabilities".to_owned()
    } else {
        let names: Vec<&str> = available.tokens();
        format!("available capabilities: {}", names.join(", "))
    };
    let file = match template {
        Some(name) => format!("template.yaml of template `{name}`"),
        None => "template.yaml".to_owned(),
    };
    let declared = available.with(cap);
    s.push_str(&format!(
        "; add \"{cap}\" to capabilities: in {file} (capabilities: {})",
        declared.to_yaml_flow()
    ));
    if cap.is_baseline() {
        s.push_str(&format!(
            "; `{cap}` is in the default baseline {DEFAULT_CAPABILITIES}, which a template \
             inherits when it omits capabilities:, but this template declares a set without it"
        ));
    } else {
        s.push_str(&format!(
            "; `{cap}` is not in the default baseline {DEFAULT_CAPABILITIES}, so it must be \
             declared explicitly"
        ));
    }
    s.push_str(&format!(
        ", and the sandbox's provider must implement {}",
        crate::command::provider_methods_for(cap).join(", ")
    ));
    s
}
