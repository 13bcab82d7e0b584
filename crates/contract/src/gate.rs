//! (being written)
use crate::command::CommandCapability;
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CapabilityNotSupportedError { pub capability: CommandCapability }
impl std::fmt::Display for CapabilityNotSupportedError { fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { write!(f, "x") } }
