//! Typed params and results of every worker method and notification.
//!
//! Wire names are camelCase, exactly those of the worker protocol. Unknown
//! fields are tolerated on input (the ecosystem adds fields over time), so no
//! type here uses `deny_unknown_fields`. Optional fields are omitted on output
//! when absent; fields the protocol calls nullable (`issueId`, `expiresAt`,
//! `providerLeaseId` of a lease, `exitCode`) are always written, as `null`.

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::fmt;

use crate::jsonrpc::Id;

// ---------------------------------------------------------------- helpers

/// A result with no content: written as `null`, and any value is accepted on input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ack;

impl Serialize for Ack {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_unit()
    }
}

impl<'de> Deserialize<'de> for Ack {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(d)?;
        Ok(Ack)
    }
}

/// Params with no fields: written as `{}`, and any object is accepted on input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct EmptyParams {}

/// Bytes carried as a standard base64 string (duplex channel data).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Bytes(pub Vec<u8>);

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Bytes({} bytes)", self.0.len())
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Self {
        Bytes(v)
    }
}

impl From<&[u8]> for Bytes {
    fn from(v: &[u8]) -> Self {
        Bytes(v.to_vec())
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(s.as_bytes())
            .map(Bytes)
            .map_err(|e| serde::de::Error::custom(format!("invalid base64: {e}")))
    }
}

/// A file mode such as `0o644`. Written as a JSON number; a number or an octal
/// string (`"0644"`, `"644"`) is accepted on input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileMode(pub u32);

impl Serialize for FileMode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.0)
    }
}

impl<'de> Deserialize<'de> for FileMode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Num(u32),
            Str(String),
        }
        let mode = match Raw::deserialize(d)? {
            Raw::Num(n) => n,
            Raw::Str(s) => {
                let digits = s.trim_start_matches("0o");
                u32::from_str_radix(digits, 8)
                    .map_err(|_| serde::de::Error::custom(format!("invalid octal mode `{s}`")))?
            }
        };
        if mode > 0o7777 {
            return Err(serde::de::Error::custom(format!(
                "mode {mode:o} is out of range"
            )));
        }
        Ok(FileMode(mode))
    }
}

// ---------------------------------------------------------------- common

/// The params every `environment*` method carries (flattened into each).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentScope {
    pub driver_key: String,
    /// The tenant. sandhost calls it a tenant internally; the wire name stays.
    pub company_id: String,
    pub environment_id: String,
    #[serde(default)]
    pub issue_id: Option<String>,
    /// The provider config object.
    #[serde(default)]
    pub config: Value,
}

/// A lease as the provider reports it. A `null` `providerLeaseId` from
/// resume means the lease is gone; `metadata.reason` says why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    #[serde(default)]
    pub provider_lease_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
    /// ISO-8601 timestamp, or `null` for no expiry.
    #[serde(default)]
    pub expires_at: Option<String>,
}

// ---------------------------------------------------------------- lifecycle

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<Value>,
}

/// `supportedMethods` is what the host verifies; missing means empty.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitializeResult {
    pub ok: bool,
    #[serde(default)]
    pub supported_methods: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    Ok,
    Degraded,
    Error,
    /// Any status this version does not know.
    #[serde(other)]
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HealthResult {
    pub status: HealthStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

// ---------------------------------------------------------------- config and probe

/// `environmentValidateConfig` carries only `driverKey` and `config`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValidateConfigParams {
    pub driver_key: String,
    #[serde(default)]
    pub config: Value,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValidateConfigResult {
    pub ok: bool,
    #[serde(default)]
    pub warnings: Vec<String>,
    #[serde(default)]
    pub errors: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub normalized_config: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeParams {
    #[serde(flatten)]
    pub scope: EnvironmentScope,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Diagnostic {
    pub severity: Severity,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeResult {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    #[serde(default)]
    pub diagnostics: Vec<Diagnostic>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

// ---------------------------------------------------------------- leases

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcquireLeaseParams {
    #[serde(flatten)]
    pub scope: EnvironmentScope,
    pub run_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// ISO-8601; the provider sets its own expiry at or before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_expires_at: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeLeaseParams {
    #[serde(flatten)]
    pub scope: EnvironmentScope,
    pub provider_lease_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_metadata: Option<Map<String, Value>>,
}

/// Why a resumed lease is gone (`metadata.reason` of a null-id lease).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseGoneReason {
    Expired,
    NotFound,
    IdentityMismatch,
}

impl LeaseGoneReason {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseGoneReason::Expired => "expired",
            LeaseGoneReason::NotFound => "not_found",
            LeaseGoneReason::IdentityMismatch => "identity_mismatch",
        }
    }
}

impl Lease {
    /// The answer to a resume of a lease that is gone.
    pub fn gone(reason: LeaseGoneReason) -> Lease {
        let mut metadata = Map::new();
        metadata.insert("reason".into(), Value::String(reason.as_str().into()));
        Lease {
            provider_lease_id: None,
            metadata: Some(metadata),
            expires_at: None,
        }
    }
}

/// Params of `environmentReleaseLease` and `environmentDestroyLease`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseEndParams {
    #[serde(flatten)]
    pub scope: EnvironmentScope,
    pub provider_lease_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_metadata: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_active_work: Option<bool>,
}

pub type ReleaseLeaseParams = LeaseEndParams;
pub type DestroyLeaseParams = LeaseEndParams;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaseEndState {
    Stopped,
    Destroyed,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseReceipt {
    pub provider_lease_id: String,
    pub state: LeaseEndState,
}

/// Release and destroy answer nothing (`null`) or a receipt.
pub type LeaseEndResult = Option<LeaseReceipt>;

// ---------------------------------------------------------------- workspace

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Workspace {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_path: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RealizeWorkspaceParams {
    #[serde(flatten)]
    pub scope: EnvironmentScope,
    pub lease: Lease,
    pub workspace: Workspace,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RealizeWorkspaceResult {
    pub cwd: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

// ---------------------------------------------------------------- execute

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecuteParams {
    #[serde(flatten)]
    pub scope: EnvironmentScope,
    pub lease: Lease,
    pub command: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// `true`: one-shot, do not use the persistent session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bypass_session: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecuteResult {
    /// `null` when the process did not exit normally (signal, timeout).
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    #[serde(default)]
    pub timed_out: bool,
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    Stdout,
    Stderr,
}

/// Params of the `execute.log` notification.
///
/// The notification envelope has no id of its own, so `requestId` in params
/// carries the id of the running `environmentExecute` request, exactly as it
/// was sent (number or string). `invocationId` is accepted as an alias on input.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecuteLogParams {
    #[serde(alias = "invocationId")]
    pub request_id: Id,
    pub stream: LogStream,
    pub chunk: String,
}

// ---------------------------------------------------------------- sync

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    File,
    Directory,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Access {
    Rw,
    Ro,
}

/// One file or directory to transfer. For sync in, `sourcePath` is on the host
/// and `targetPath` in the lease; for sync out the other way round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileMapping {
    pub source_path: String,
    pub target_path: String,
    pub kind: FileKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<FileMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclude: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub follow_symlinks: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<Access>,
}

/// Run in order after an upload; the first failure stops the sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PostUploadCommand {
    pub command: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncOperation {
    pub operation_id: String,
    #[serde(default)]
    pub files: Vec<FileMapping>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub post_upload_commands: Option<Vec<PostUploadCommand>>,
}

/// Params of `environmentSyncIn` and `environmentSyncOut`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncParams {
    #[serde(flatten)]
    pub scope: EnvironmentScope,
    pub lease: Lease,
    pub operations: Vec<SyncOperation>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncOperationResult {
    pub operation_id: String,
    pub files_transferred: u64,
    pub bytes_transferred: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SyncResult {
    #[serde(default)]
    pub operations: Vec<SyncOperationResult>,
}

// ---------------------------------------------------------------- duplex channels

/// What a duplex channel carries (sandhost's extension of the family).
///
/// - `pty`: an interactive terminal running `command` in the lease, sized
///   `cols` x `rows`; channel bytes are the terminal's input and output.
/// - `tcp`: a connection to `port` inside the lease; channel bytes are the
///   TCP stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum DuplexPurpose {
    Pty {
        command: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        args: Option<Vec<String>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cwd: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        env: Option<BTreeMap<String, String>>,
        cols: u16,
        rows: u16,
    },
    Tcp {
        port: u16,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DuplexOpenParams {
    #[serde(flatten)]
    pub scope: EnvironmentScope,
    pub lease: Lease,
    pub purpose: DuplexPurpose,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DuplexOpenResult {
    /// Chosen by the worker; names the channel in every later call and notification.
    pub channel_id: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DuplexWriteParams {
    pub channel_id: String,
    pub data: Bytes,
}

/// `duplexChannelResize`: a new terminal size for a `pty` channel (a `tcp`
/// channel answers -32602).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DuplexResizeParams {
    pub channel_id: String,
    pub cols: u16,
    pub rows: u16,
}

/// Params of `duplexChannelStop` and `duplexChannelClose`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DuplexChannelParams {
    pub channel_id: String,
}

/// `duplexChannel.data`: bytes the far end produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DuplexDataParams {
    pub channel_id: String,
    pub data: Bytes,
}

/// `duplexChannel.exit`: the channel ended; the last notification of a channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DuplexExitParams {
    pub channel_id: String,
    /// The process exit code (`pty`), `null` otherwise or when killed by a signal.
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<String>,
    /// Why the channel failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
