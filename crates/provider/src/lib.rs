//! What a sandhost provider author links.
//!
//! Implement [`Provider`] (only `health` is required), opt into optional
//! worker methods through its capability accessors, and run
//! [`serve_stdio`] from `main`:
//!
//! ```no_run
//! use std::sync::Arc;
//! use sandhost_provider::{async_trait, Provider, ProviderResult};
//! use sandhost_provider::protocol::{HealthResult, HealthStatus};
//!
//! struct Hello;
//!
//! #[async_trait]
//! impl Provider for Hello {
//!     async fn health(&self) -> ProviderResult<HealthResult> {
//!         Ok(HealthResult { status: HealthStatus::Ok, message: None, details: None })
//!     }
//! }
//!
//! #[tokio::main]
//! async fn main() {
//!     sandhost_provider::init_stderr_logging();
//!     sandhost_provider::serve_stdio(Arc::new(Hello)).await.unwrap();
//! }
//! ```
//!
//! `supportedMethods` is derived from the accessors (see [`provider`]); a
//! method whose accessor returns `None` answers -32004, an unknown name
//! -32601, bad params -32602. Requests run concurrently, one task each; all
//! output goes through one writer task, so an `execute.log` chunk sent by a
//! handler always precedes that handler's response. stdout is protocol only:
//! log with `tracing`, which [`init_stderr_logging`] sends to stderr.
#![forbid(unsafe_code)]

pub mod error;
pub mod provider;
mod serve;

pub use async_trait::async_trait;
pub use sandhost_protocol as protocol;

pub use error::{ConnectionClosed, ProviderError, ProviderResult, ServeError};
pub use provider::{
    implements, supported_methods, ConfigOps, DuplexOps, ExecOps, ExecuteSink, LeaseOps,
    LeaseReuseOps, Notifier, ProbeOps, Provider, RequestContext, SyncOps, WorkspaceOps,
};
pub use serve::{serve, serve_stdio, serve_with, ServeOptions};

/// Sends `tracing` output to stderr (never stdout, which is the protocol),
/// filtered by `RUST_LOG` (default `info`). Does nothing if a subscriber is set.
pub fn init_stderr_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}
