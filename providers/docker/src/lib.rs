//! The Docker sandbox provider: every lease is a hardened container driven
//! through the Docker Engine API with bollard (never the docker CLI).
//!
//! - [`engine`]: connection, lease containers, labels, expiry, sweep;
//! - [`exec`]: commands through exec instances, timeouts, sessions;
//! - [`sync`]: native sync through the archive endpoints;
//! - [`duplex`]: pty and tcp channels through exec instances;
//! - [`probe`]: engine, API version and image diagnostics;
//! - [`provider`]: the worker methods;
//! - [`error`]: `E61xx` codes.
#![forbid(unsafe_code)]

pub mod config;
pub mod duplex;
pub mod engine;
pub mod error;
pub mod exec;
pub mod probe;
pub mod provider;
pub mod sync;

pub use error::DockerError;
pub use provider::DockerProvider;
