//! The sandhost host runtime: it knows nothing of HTTP or the CLI.
//!
//! - [`store`]: SQLite state under the home directory (environments,
//!   sandboxes, leases, runs) with embedded, versioned migrations.
#![forbid(unsafe_code)]

pub mod error;
pub mod store;
pub mod worker;

pub use error::RuntimeError;
