//! The SDK's one error type; every variant has a stable code.

use sandhost_contract::gate::CapabilityNotSupportedError;
use sandhost_contract::{ContractError, ErrorCode};
use sandhost_runtime::exec::ExecError;
use sandhost_runtime::host::HostError;
use sandhost_runtime::transfer::TransferError;
use sandhost_runtime::worker::WorkerError;

/// Everything an SDK call can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The sandbox's template does not offer this capability (E3004).
    #[error(transparent)]
    NotSupported(Box<CapabilityNotSupportedError>),
    #[error(transparent)]
    Host(Box<HostError>),
    #[error(transparent)]
    Exec(Box<ExecError>),
    #[error(transparent)]
    Transfer(Box<TransferError>),
    #[error(transparent)]
    Worker(Box<WorkerError>),
    #[error(transparent)]
    Template(Box<ContractError>),
    /// The command did not end the way the operation needs.
    #[error("{what} failed in the sandbox (exit {exit}): {stderr}")]
    Remote {
        what: &'static str,
        exit: String,
        stderr: String,
    },
    /// The code kernel could not run.
    #[error("code kernel unavailable: {0}")]
    Kernel(String),
    #[error("local i/o failed while {doing}: {source}")]
    Io {
        doing: &'static str,
        source: std::io::Error,
    },
}

impl Error {
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::NotSupported(e) => e.code(),
            Self::Host(e) => e.code(),
            Self::Exec(e) => e.code(),
            Self::Transfer(e) => e.code(),
            Self::Worker(e) => e.code(),
            Self::Template(e) => e.code(),
            Self::Remote { .. } => ErrorCode("E3005"),
            Self::Kernel(_) => ErrorCode("E3006"),
            Self::Io { .. } => ErrorCode("E9004"),
        }
    }

    /// What to do about it, when there is something to say.
    pub fn suggestion(&self) -> Option<String> {
        match self {
            Self::NotSupported(e) => Some(e.suggestion.clone()),
            Self::Host(e) => e.suggestion(),
            Self::Kernel(_) => Some("the code capability needs python3 inside the sandbox".into()),
            _ => None,
        }
    }

    pub(crate) fn from_host(e: HostError) -> Self {
        match e {
            HostError::NotSupported(n) => Self::NotSupported(Box::new(n)),
            other => Self::Host(Box::new(other)),
        }
    }
}

impl From<ExecError> for Error {
    fn from(e: ExecError) -> Self {
        Self::Exec(Box::new(e))
    }
}

impl From<TransferError> for Error {
    fn from(e: TransferError) -> Self {
        Self::Transfer(Box::new(e))
    }
}

impl From<WorkerError> for Error {
    fn from(e: WorkerError) -> Self {
        Self::Worker(Box::new(e))
    }
}

impl From<ContractError> for Error {
    fn from(e: ContractError) -> Self {
        Self::Template(Box::new(e))
    }
}
