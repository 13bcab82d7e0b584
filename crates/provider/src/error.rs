//! The errors of the provider crate.

use sandhost_protocol::{FrameError, RpcError, RpcErrorCode};
use serde_json::Value;

/// The error a provider method returns; it becomes the JSON-RPC `error` of the
/// response, with this code, message and data.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct ProviderError {
    pub code: RpcErrorCode,
    pub message: String,
    pub data: Option<Value>,
}

impl ProviderError {
    pub fn new(code: RpcErrorCode, message: impl Into<String>) -> Self {
        ProviderError {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// -32002: the worker failed while handling the call.
    pub fn worker(message: impl Into<String>) -> Self {
        Self::new(RpcErrorCode::WorkerError, message)
    }

    /// -32602: the params are not valid for this provider.
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(RpcErrorCode::InvalidParams, message)
    }

    /// -32000: the worker cannot serve the call right now.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(RpcErrorCode::WorkerUnavailable, message)
    }

    /// -32001: the capability is denied.
    pub fn capability_denied(message: impl Into<String>) -> Self {
        Self::new(RpcErrorCode::CapabilityDenied, message)
    }

    /// -32003: the call timed out.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(RpcErrorCode::Timeout, message)
    }

    /// -32005: the invocation scope is denied.
    pub fn scope_denied(message: impl Into<String>) -> Self {
        Self::new(RpcErrorCode::InvocationScopeDenied, message)
    }

    /// -32006: the config belongs to another tenant.
    pub fn cross_tenant(message: impl Into<String>) -> Self {
        Self::new(RpcErrorCode::CrossTenantConfig, message)
    }

    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    pub fn to_rpc_error(&self) -> RpcError {
        RpcError {
            code: self.code,
            message: self.message.clone(),
            data: self.data.clone(),
        }
    }
}

impl From<FrameError> for ProviderError {
    fn from(e: FrameError) -> Self {
        let rpc = e.to_rpc_error();
        ProviderError {
            code: rpc.code,
            message: rpc.message,
            data: rpc.data,
        }
    }
}

impl From<std::io::Error> for ProviderError {
    fn from(e: std::io::Error) -> Self {
        ProviderError::worker(e.to_string())
    }
}

pub type ProviderResult<T> = Result<T, ProviderError>;

/// The connection to the host is closed: a notification could not be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the connection to the host is closed")]
pub struct ConnectionClosed;

/// Why [`crate::serve`] stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot read from the host: {0}")]
    Read(FrameError),
    #[error("cannot write to the host: {0}")]
    Write(FrameError),
}

impl ServeError {
    /// The stable code of this error. This match is the one place codes are mapped.
    pub fn code(&self) -> &'static str {
        match self {
            ServeError::Read(_) => "E4201",
            ServeError::Write(_) => "E4202",
        }
    }
}
