//! The sandhost host runtime: it knows nothing of HTTP or the CLI.
//!
//! - [`store`]: SQLite state under the home directory (environments,
//!   sandboxes, leases, runs) with embedded, versioned migrations.
//! - [`plugins`]: plugin discovery and the registry of drivers.
//! - [`worker`]: a provider worker process and its JSON-RPC client.
//! - [`snapshot`]: the frozen per-run capability resolution.
#![forbid(unsafe_code)]

pub mod conformance;
pub mod context;
pub mod duplex;
pub mod error;
pub mod exec;
pub mod host;
pub mod plugins;
pub mod snapshot;
pub mod store;
pub mod transfer;
pub mod worker;

pub use error::RuntimeError;
