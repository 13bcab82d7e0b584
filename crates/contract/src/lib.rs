//! The sandhost capability contract: pure types and functions, no I/O, no async.
//!
//! Two capability layers live here and are never mixed up:
//! - provider capabilities ([`capability`], [`manifest`], [`prerequisites`],
//!   [`resolve`], [`scenario`]): what a provider worker may do for one run,
//!   resolved as `effective = verified ∩ declared ∩ narrowing`;
//! - command capabilities ([`command`], [`template`], [`gate`]): what a sandbox
//!   offers its caller, declared by its template and gated with E3004.
//!
//! Every other crate asks this one; nothing here touches a file, a socket or a
//! clock. Inner types are deliberately not `Serialize`: the wire types live in
//! `sandhost-protocol`.
#![forbid(unsafe_code)]

pub mod capability;
pub mod command;
pub mod error;
pub mod gate;
pub mod manifest;
pub mod prerequisites;
pub mod resolve;
pub mod scenario;
pub mod template;

pub use capability::{CapabilityMap, Declared, DeclaredCapabilities, ProviderCapability};
pub use command::{CommandCapability, CommandSet, DEFAULT_CAPABILITIES};
pub use error::{ContractError, ErrorCode};
