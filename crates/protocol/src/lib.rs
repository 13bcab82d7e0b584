//! The sandhost worker protocol: the only crate that defines wire types.
//!
//! - [`jsonrpc`]: JSON-RPC 2.0 envelopes ([`Request`], [`Response`],
//!   [`Notification`], [`Message`]) and [`RpcErrorCode`].
//! - [`codec`]: the NDJSON framing with a maximum frame size, and the pure
//!   [`decode_frame`] that the fuzz target calls.
//! - [`method`]: the [`Method`] catalogue and the typed pairing of each method
//!   with its params and result ([`RpcMethod`], [`methods`]).
//! - [`types`]: params and results, with the exact camelCase wire names of the
//!   worker protocol. Unknown fields are tolerated on input.
//! - [`error`]: [`FrameError`], E4xxx codes mapped in one place.
//!
//! ## How `execute.log` names its request
//! A notification has no id, so [`ExecuteLogParams::request_id`] (`requestId`
//! on the wire) carries the id of the running `environmentExecute` request,
//! exactly as the host sent it (number or string).
//!
//! ## Duplex channels
//! `duplexChannelOpen` takes the common environment params, the `lease` and a
//! [`DuplexPurpose`] (`{kind:"pty", command, args?, cwd?, env?, cols, rows}` or
//! `{kind:"tcp", port}`) and answers a worker-chosen `channelId`. Then:
//! `duplexChannelWrite {channelId, data}` sends bytes (base64) to the far end;
//! `duplexChannelResize {channelId, cols, rows}` (sandhost's extension) resizes
//! a pty; `duplexChannelStop {channelId}` closes the input side (EOF to the pty
//! / TCP write shutdown) while output keeps flowing until the far end exits;
//! `duplexChannelClose {channelId}` tears the channel down at once. The worker
//! sends `duplexChannel.data {channelId, data}` for output and exactly one
//! `duplexChannel.exit {channelId, exitCode?, signal?, error?}` last.
#![forbid(unsafe_code)]

pub mod codec;
pub mod error;
pub mod jsonrpc;
pub mod method;
pub mod types;

pub use codec::{
    decode_frame, encode_message, message_from_value, FrameReader, FrameWriter,
    DEFAULT_MAX_FRAME_LEN,
};
pub use error::FrameError;
pub use jsonrpc::{
    Id, Message, Notification, Request, Response, ResponsePayload, RpcError, RpcErrorCode, V2,
};
pub use method::{
    methods, parse_result, result_value, Method, MethodKind, NotificationMethod, RpcMethod,
    UnknownMethod,
};
pub use types::*;
