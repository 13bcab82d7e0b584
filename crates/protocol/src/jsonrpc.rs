//! JSON-RPC 2.0 envelopes and error codes.
//!
//! Envelopes carry `params` / `result` as raw [`serde_json::Value`]s; the typed
//! catalogue in [`crate::types`] and [`crate::method`] turns them into structs.
//! Ids are echoed exactly as received: strings verbatim, integers (any i64 or
//! u64) exactly; a non-integer number keeps its value (`1e3` comes back as `1000.0`).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::fmt;

/// The `"jsonrpc": "2.0"` marker. Serializes as `"2.0"` and accepts nothing else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct V2;

impl Serialize for V2 {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str("2.0")
    }
}

impl<'de> Deserialize<'de> for V2 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = String::deserialize(d)?;
        if v == "2.0" {
            Ok(V2)
        } else {
            Err(serde::de::Error::custom(format!(
                "unsupported jsonrpc version `{v}`"
            )))
        }
    }
}

/// A request id: a JSON number or a string. Echoed exactly in the response.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Id {
    Number(serde_json::Number),
    String(String),
}

impl Id {
    /// Parses an id from a JSON value; `None` when it is neither a number nor a string.
    pub fn from_value(v: &Value) -> Option<Id> {
        match v {
            Value::Number(n) => Some(Id::Number(n.clone())),
            Value::String(s) => Some(Id::String(s.clone())),
            _ => None,
        }
    }
}

impl From<u64> for Id {
    fn from(n: u64) -> Self {
        Id::Number(n.into())
    }
}

impl From<i64> for Id {
    fn from(n: i64) -> Self {
        Id::Number(n.into())
    }
}

impl From<&str> for Id {
    fn from(s: &str) -> Self {
        Id::String(s.to_owned())
    }
}

impl From<String> for Id {
    fn from(s: String) -> Self {
        Id::String(s)
    }
}

impl fmt::Display for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Id::Number(n) => write!(f, "{n}"),
            Id::String(s) => write!(f, "{s:?}"),
        }
    }
}

/// Every JSON-RPC error code the worker protocol uses.
///
/// Codes outside this list are kept as [`RpcErrorCode::Other`] so that a host never
/// loses a code a worker sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RpcErrorCode {
    /// -32700: the frame is not valid JSON.
    ParseError,
    /// -32600: the frame is JSON but not a valid JSON-RPC 2.0 request.
    InvalidRequest,
    /// -32601: no such method.
    MethodNotFound,
    /// -32602: the params do not match the method.
    InvalidParams,
    /// -32603: internal JSON-RPC error.
    InternalError,
    /// -32000: the worker is not available.
    WorkerUnavailable,
    /// -32001: the capability is denied.
    CapabilityDenied,
    /// -32002: the worker failed while handling the call.
    WorkerError,
    /// -32003: the call timed out.
    Timeout,
    /// -32004: a known optional method the worker does not implement.
    MethodNotImplemented,
    /// -32005: the invocation scope is denied.
    InvocationScopeDenied,
    /// -32006: a config that belongs to another tenant.
    CrossTenantConfig,
    /// -32099: unknown error.
    Unknown,
    /// Any other code a peer sent.
    Other(i64),
}

impl RpcErrorCode {
    /// All named codes (without [`RpcErrorCode::Other`]).
    pub const ALL: [RpcErrorCode; 13] = [
        RpcErrorCode::ParseError,
        RpcErrorCode::InvalidRequest,
        RpcErrorCode::MethodNotFound,
        RpcErrorCode::InvalidParams,
        RpcErrorCode::InternalError,
        RpcErrorCode::WorkerUnavailable,
        RpcErrorCode::CapabilityDenied,
        RpcErrorCode::WorkerError,
        RpcErrorCode::Timeout,
        RpcErrorCode::MethodNotImplemented,
        RpcErrorCode::InvocationScopeDenied,
        RpcErrorCode::CrossTenantConfig,
        RpcErrorCode::Unknown,
    ];

    /// The numeric wire code.
    pub const fn code(self) -> i64 {
        match self {
            RpcErrorCode::ParseError => -32700,
            RpcErrorCode::InvalidRequest => -32600,
            RpcErrorCode::MethodNotFound => -32601,
            RpcErrorCode::InvalidParams => -32602,
            RpcErrorCode::InternalError => -32603,
            RpcErrorCode::WorkerUnavailable => -32000,
            RpcErrorCode::CapabilityDenied => -32001,
            RpcErrorCode::WorkerError => -32002,
            RpcErrorCode::Timeout => -32003,
            RpcErrorCode::MethodNotImplemented => -32004,
            RpcErrorCode::InvocationScopeDenied => -32005,
            RpcErrorCode::CrossTenantConfig => -32006,
            RpcErrorCode::Unknown => -32099,
            RpcErrorCode::Other(c) => c,
        }
    }

    /// The code for a numeric wire code.
    pub fn from_code(code: i64) -> RpcErrorCode {
        Self::ALL
            .into_iter()
            .find(|c| c.code() == code)
            .unwrap_or(RpcErrorCode::Other(code))
    }
}

impl Serialize for RpcErrorCode {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(self.code())
    }
}

impl<'de> Deserialize<'de> for RpcErrorCode {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(RpcErrorCode::from_code(i64::deserialize(d)?))
    }
}

/// The `error` member of a response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RpcError {
    pub code: RpcErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: RpcErrorCode, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }
}

impl fmt::Display for RpcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.message, self.code.code())
    }
}

impl std::error::Error for RpcError {}

/// A request: has an `id` and expects exactly one response with the same id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub jsonrpc: V2,
    pub id: Id,
    pub method: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

impl Request {
    pub fn new(id: impl Into<Id>, method: impl Into<String>, params: Option<Value>) -> Self {
        Request {
            jsonrpc: V2,
            id: id.into(),
            method: method.into(),
            params,
        }
    }
}

/// A notification: no `id`, never answered.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Notification {
    pub jsonrpc: V2,
    pub method: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
}

impl Notification {
    pub fn new(method: impl Into<String>, params: Option<Value>) -> Self {
        Notification {
            jsonrpc: V2,
            method: method.into(),
            params,
        }
    }
}

/// The outcome a response carries: exactly one of `result` or `error`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ResponsePayload {
    #[serde(rename = "result")]
    Result(Value),
    #[serde(rename = "error")]
    Error(RpcError),
}

/// A response. `id` is `null` only when the request's id could not be read
/// (parse errors, invalid requests).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Response {
    pub jsonrpc: V2,
    pub id: Option<Id>,
    #[serde(flatten)]
    pub payload: ResponsePayload,
}

impl Response {
    pub fn ok(id: Id, result: Value) -> Self {
        Response {
            jsonrpc: V2,
            id: Some(id),
            payload: ResponsePayload::Result(result),
        }
    }

    pub fn err(id: Option<Id>, error: RpcError) -> Self {
        Response {
            jsonrpc: V2,
            id,
            payload: ResponsePayload::Error(error),
        }
    }

    /// The result, or the error as `Err`.
    pub fn into_result(self) -> Result<Value, RpcError> {
        match self.payload {
            ResponsePayload::Result(v) => Ok(v),
            ResponsePayload::Error(e) => Err(e),
        }
    }
}

/// Any one frame of the protocol.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Message {
    Request(Request),
    Response(Response),
    Notification(Notification),
}

impl From<Request> for Message {
    fn from(r: Request) -> Self {
        Message::Request(r)
    }
}

impl From<Response> for Message {
    fn from(r: Response) -> Self {
        Message::Response(r)
    }
}

impl From<Notification> for Message {
    fn from(n: Notification) -> Self {
        Message::Notification(n)
    }
}
