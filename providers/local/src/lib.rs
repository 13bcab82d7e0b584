//! sandhost's local provider core: real Linux isolation with no daemon.
//!
//! A sandbox is a tree of processes in fresh user, mount, pid, network, ipc,
//! uts and cgroup namespaces, limited by cgroups (v1 or v2), with a read-only
//! root built on tmpfs, capabilities dropped, `no_new_privs` and a seccomp
//! filter. Its PID 1 is the small `sandhost-init` program, which serves a unix
//! socket in the sandbox's state directory, so a sandbox outlives the process
//! that created it and any later process can [`LocalSandbox::open`] it.
//!
//! All `unsafe` lives in the private `sys` module.
#![deny(unsafe_code)]

mod cgroup;
mod config;
mod duplex;
mod error;
pub mod init;
mod probe;
mod proto;
mod sandbox;
mod seccomp;
pub mod worker;
// The only module with `unsafe` (it carries `#![allow(unsafe_code)]`).
mod sys;

pub use config::{ExecRequest, ExecResult, SandboxConfig, SandboxStatus, Stream};
pub use duplex::{ChannelEvent, ChannelExit, PtyChannel, PtyRequest, TcpChannel};
pub use error::LocalError;
pub use probe::{probe, Diagnostic, Severity};
pub use sandbox::LocalSandbox;

/// The built-in plugin manifest of this provider (`plugin.json`): the host
/// runs `./sandhost-provider-local` with the directory holding it as cwd.
pub const PLUGIN_JSON: &str = include_str!("../plugin.json");
