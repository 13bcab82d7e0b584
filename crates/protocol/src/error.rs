//! The protocol crate's one error enum and the single place its codes are mapped.
//!
//! Codes are in the project's E4xxx family (worker protocol and plugin host):
//!
//! | code  | variant                         | JSON-RPC answer |
//! |-------|---------------------------------|-----------------|
//! | E4001 | [`FrameError::FrameTooLarge`]   | -32600          |
//! | E4002 | [`FrameError::Parse`]           | -32700          |
//! | E4003 | [`FrameError::InvalidRequest`]  | -32600          |
//! | E4004 | [`FrameError::Io`]              | -32603 (never sent: the transport is gone) |
//! | E4005 | [`FrameError::InvalidParams`]   | -32602          |
//! | E4006 | [`FrameError::Encode`]          | -32603          |

use crate::jsonrpc::{Id, RpcError, RpcErrorCode};

/// Everything that can go wrong reading, decoding or encoding one frame.
///
/// None of these ends a reader: after any of them the next call reads the
/// next line (except [`FrameError::Io`], after which the stream is unusable).
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {len} bytes exceeds the limit of {limit} bytes")]
    FrameTooLarge { len: usize, limit: usize },

    #[error("frame is not valid json: {detail}")]
    Parse { detail: String },

    #[error("invalid json-rpc message: {detail}")]
    InvalidRequest {
        detail: String,
        /// The id of the offending request when it could be read.
        id: Option<Id>,
    },

    #[error("transport error: {0}")]
    Io(#[from] std::io::Error),

    #[error("invalid params for `{method}`: {detail}")]
    InvalidParams { method: String, detail: String },

    #[error("cannot encode message: {detail}")]
    Encode { detail: String },
}

impl FrameError {
    /// The stable code of this error. This match is the one place codes are mapped.
    pub fn code(&self) -> &'static str {
        match self {
            FrameError::FrameTooLarge { .. } => "E4001",
            FrameError::Parse { .. } => "E4002",
            FrameError::InvalidRequest { .. } => "E4003",
            FrameError::Io(_) => "E4004",
            FrameError::InvalidParams { .. } => "E4005",
            FrameError::Encode { .. } => "E4006",
        }
    }

    /// The JSON-RPC error code a peer answers this error with.
    pub fn rpc_code(&self) -> RpcErrorCode {
        match self {
            FrameError::FrameTooLarge { .. } | FrameError::InvalidRequest { .. } => {
                RpcErrorCode::InvalidRequest
            }
            FrameError::Parse { .. } => RpcErrorCode::ParseError,
            FrameError::InvalidParams { .. } => RpcErrorCode::InvalidParams,
            FrameError::Io(_) | FrameError::Encode { .. } => RpcErrorCode::InternalError,
        }
    }

    /// The id to answer with, when the offending frame had a readable one.
    pub fn request_id(&self) -> Option<&Id> {
        match self {
            FrameError::InvalidRequest { id, .. } => id.as_ref(),
            _ => None,
        }
    }

    /// The error object to send back; `data.code` carries the stable E-code.
    pub fn to_rpc_error(&self) -> RpcError {
        RpcError::new(self.rpc_code(), self.to_string())
            .with_data(serde_json::json!({ "code": self.code() }))
    }
}
