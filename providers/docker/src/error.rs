//! The errors of the Docker provider, each with a stable `E61xx` code.
//!
//! [`DockerError::code`] is the one place codes are mapped;
//! [`DockerError::to_provider_error`] the one place they become JSON-RPC
//! errors (the code travels in `data.code`).

use sandhost_provider::ProviderError;
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    #[error("the docker engine does not answer at {socket}: {detail}")]
    EngineUnreachable { socket: String, detail: String },
    #[error("docker engine call `{call}` failed: {source}")]
    Engine {
        call: &'static str,
        #[source]
        source: bollard::errors::Error,
    },
    #[error("image `{0}` is not present on the engine (this provider never pulls)")]
    ImageMissing(String),
    #[error("invalid provider config: {0}")]
    InvalidConfig(String),
    #[error("no lease `{0}` on this engine")]
    LeaseNotFound(String),
    #[error("lease `{0}` belongs to another tenant or environment")]
    LeaseMismatch(String),
    #[error("lease `{0}` has expired")]
    LeaseExpired(String),
    #[error("lease `{0}` is not running")]
    LeaseNotRunning(String),
    #[error("invalid lease id `{0}`")]
    InvalidLeaseId(String),
    #[error("path `{path}` is refused: {why}")]
    InvalidPath { path: String, why: String },
    #[error("sync limit exceeded: {0}")]
    SyncLimit(String),
    #[error("sync step failed: {0}")]
    SyncFailed(String),
    #[error("command failed to start: {0}")]
    ExecFailed(String),
    #[error("host i/o on `{path}` failed: {source}")]
    HostIo {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid params: {0}")]
    InvalidParams(String),
    #[error("no duplex channel `{0}`")]
    ChannelNotFound(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
}

pub type Result<T, E = DockerError> = std::result::Result<T, E>;

impl DockerError {
    /// The stable code of this error. This match is the one place codes are mapped.
    pub fn code(&self) -> &'static str {
        match self {
            DockerError::EngineUnreachable { .. } => "E6101",
            DockerError::Engine { .. } => "E6102",
            DockerError::ImageMissing(_) => "E6103",
            DockerError::InvalidConfig(_) => "E6104",
            DockerError::LeaseNotFound(_) => "E6105",
            DockerError::LeaseMismatch(_) => "E6106",
            DockerError::LeaseExpired(_) => "E6107",
            DockerError::LeaseNotRunning(_) => "E6108",
            DockerError::InvalidLeaseId(_) => "E6109",
            DockerError::InvalidPath { .. } => "E6110",
            DockerError::SyncLimit(_) => "E6111",
            DockerError::SyncFailed(_) => "E6112",
            DockerError::ExecFailed(_) => "E6113",
            DockerError::HostIo { .. } => "E6114",
            DockerError::InvalidParams(_) => "E6115",
            DockerError::ChannelNotFound(_) => "E6116",
            DockerError::Unsupported(_) => "E6117",
        }
    }

    pub fn engine(call: &'static str) -> impl FnOnce(bollard::errors::Error) -> DockerError {
        move |source| DockerError::Engine { call, source }
    }

    pub fn host_io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> DockerError + '_ {
        move |source| DockerError::HostIo {
            path: path.display().to_string(),
            source,
        }
    }

    /// An engine answer with this HTTP status.
    pub fn engine_status(&self) -> Option<u16> {
        match self {
            DockerError::Engine {
                source: bollard::errors::Error::DockerResponseServerError { status_code, .. },
                ..
            } => Some(*status_code),
            _ => None,
        }
    }

    pub fn to_provider_error(&self) -> ProviderError {
        let message = self.to_string();
        let e = match self {
            DockerError::EngineUnreachable { .. } => ProviderError::unavailable(message),
            DockerError::InvalidConfig(_)
            | DockerError::InvalidLeaseId(_)
            | DockerError::InvalidPath { .. }
            | DockerError::InvalidParams(_)
            | DockerError::ChannelNotFound(_) => ProviderError::invalid_params(message),
            DockerError::Unsupported(_) => ProviderError::capability_denied(message),
            _ => ProviderError::worker(message),
        };
        e.with_data(json!({ "code": self.code() }))
    }
}

impl From<DockerError> for ProviderError {
    fn from(e: DockerError) -> Self {
        e.to_provider_error()
    }
}

/// Packing, unpacking and staging errors of the shared archive crate, in the
/// sync codes: a cap is [`DockerError::SyncLimit`] (E6111); an archive from
/// the lease that breaks the rules, or cannot be read, is
/// [`DockerError::SyncFailed`] (E6112); a local filesystem failure is
/// [`DockerError::HostIo`] (E6114); a host source that cannot be packed, or
/// a file that would replace a directory, is [`DockerError::InvalidParams`]
/// (E6115). The archive crate's own code stays in the message.
impl From<sandhost_archive::ArchiveError> for DockerError {
    fn from(e: sandhost_archive::ArchiveError) -> Self {
        use sandhost_archive::ArchiveError as A;
        let code = e.code();
        match e {
            A::CapExceeded { .. } => DockerError::SyncLimit(format!("{e} ({code})")),
            A::Rejected { .. } => {
                DockerError::SyncFailed(format!("unsafe archive from the lease: {e} ({code})"))
            }
            A::Read { .. } => DockerError::SyncFailed(format!("{e} ({code})")),
            A::Io {
                doing,
                path,
                source,
            } => DockerError::HostIo {
                path: format!("{path} ({doing}, {code})"),
                source,
            },
            A::SourceRejected { .. } | A::WouldReplaceDirectory { .. } => {
                DockerError::InvalidParams(format!("{e} ({code})"))
            }
        }
    }
}

/// Whether a bollard error is an engine 404.
pub fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}
