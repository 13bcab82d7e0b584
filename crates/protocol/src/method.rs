//! The method catalogue: every method and notification name, and the typed
//! pairing of each name with its params and result.

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::fmt;
use std::str::FromStr;

use crate::error::FrameError;
use crate::jsonrpc::{Id, Notification, Request};
use crate::types::*;

/// Whether a method is required, optional, or a notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MethodKind {
    /// Every worker answers it: `initialize`, `health`, `shutdown`.
    Required,
    /// A worker may implement it; otherwise it answers -32004.
    Optional,
    /// Worker -> host notification, never answered.
    Notification,
}

macro_rules! methods {
    ($( $variant:ident = $name:literal, $kind:ident; )*) => {
        /// Every method and notification name of the worker protocol.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Method {
            $( $variant, )*
        }

        impl Method {
            /// Every method and notification, in catalogue order.
            pub const ALL: &'static [Method] = &[ $( Method::$variant, )* ];

            /// The wire name.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $( Method::$variant => $name, )*
                }
            }

            pub const fn kind(self) -> MethodKind {
                match self {
                    $( Method::$variant => MethodKind::$kind, )*
                }
            }

            /// The method with this wire name, if any.
            pub fn from_name(name: &str) -> Option<Method> {
                match name {
                    $( $name => Some(Method::$variant), )*
                    _ => None,
                }
            }
        }
    };
}

methods! {
    Initialize = "initialize", Required;
    Health = "health", Required;
    Shutdown = "shutdown", Required;
    EnvironmentValidateConfig = "environmentValidateConfig", Optional;
    EnvironmentProbe = "environmentProbe", Optional;
    EnvironmentAcquireLease = "environmentAcquireLease", Optional;
    EnvironmentResumeLease = "environmentResumeLease", Optional;
    EnvironmentReleaseLease = "environmentReleaseLease", Optional;
    EnvironmentDestroyLease = "environmentDestroyLease", Optional;
    EnvironmentRealizeWorkspace = "environmentRealizeWorkspace", Optional;
    EnvironmentExecute = "environmentExecute", Optional;
    EnvironmentSyncIn = "environmentSyncIn", Optional;
    EnvironmentSyncOut = "environmentSyncOut", Optional;
    DuplexChannelOpen = "duplexChannelOpen", Optional;
    DuplexChannelWrite = "duplexChannelWrite", Optional;
    DuplexChannelResize = "duplexChannelResize", Optional;
    DuplexChannelStop = "duplexChannelStop", Optional;
    DuplexChannelClose = "duplexChannelClose", Optional;
    ExecuteLog = "execute.log", Notification;
    DuplexChannelData = "duplexChannel.data", Notification;
    DuplexChannelExit = "duplexChannel.exit", Notification;
}

impl Method {
    /// The three methods every worker answers.
    pub const REQUIRED: &'static [Method] = &[Method::Initialize, Method::Health, Method::Shutdown];

    /// Every optional host -> worker method.
    pub const OPTIONAL: &'static [Method] = &[
        Method::EnvironmentValidateConfig,
        Method::EnvironmentProbe,
        Method::EnvironmentAcquireLease,
        Method::EnvironmentResumeLease,
        Method::EnvironmentReleaseLease,
        Method::EnvironmentDestroyLease,
        Method::EnvironmentRealizeWorkspace,
        Method::EnvironmentExecute,
        Method::EnvironmentSyncIn,
        Method::EnvironmentSyncOut,
        Method::DuplexChannelOpen,
        Method::DuplexChannelWrite,
        Method::DuplexChannelResize,
        Method::DuplexChannelStop,
        Method::DuplexChannelClose,
    ];

    /// Every worker -> host notification.
    pub const NOTIFICATIONS: &'static [Method] = &[
        Method::ExecuteLog,
        Method::DuplexChannelData,
        Method::DuplexChannelExit,
    ];

    pub const fn is_optional(self) -> bool {
        matches!(self.kind(), MethodKind::Optional)
    }

    pub const fn is_notification(self) -> bool {
        matches!(self.kind(), MethodKind::Notification)
    }
}

/// The name is not a method of the catalogue.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown method `{0}`")]
pub struct UnknownMethod(pub String);

impl FromStr for Method {
    type Err = UnknownMethod;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Method::from_name(s).ok_or_else(|| UnknownMethod(s.to_owned()))
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request method with its typed params and result.
pub trait RpcMethod {
    const METHOD: Method;
    type Params: Serialize + DeserializeOwned + Send + 'static;
    type Result: Serialize + DeserializeOwned + Send + 'static;
}

/// A notification with its typed params.
pub trait NotificationMethod {
    const METHOD: Method;
    type Params: Serialize + DeserializeOwned + Send + 'static;
}

/// Marker types pairing each method name with its params and result.
pub mod methods {
    use super::*;

    macro_rules! rpc {
        ($( $(#[$m:meta])* $ty:ident => $method:ident ($params:ty) -> $result:ty; )*) => {$(
            $(#[$m])*
            #[derive(Debug, Clone, Copy)]
            pub struct $ty;
            impl RpcMethod for $ty {
                const METHOD: Method = Method::$method;
                type Params = $params;
                type Result = $result;
            }
        )*};
    }

    rpc! {
        Initialize => Initialize(InitializeParams) -> InitializeResult;
        Health => Health(EmptyParams) -> HealthResult;
        Shutdown => Shutdown(EmptyParams) -> Ack;
        ValidateConfig => EnvironmentValidateConfig(ValidateConfigParams) -> ValidateConfigResult;
        Probe => EnvironmentProbe(ProbeParams) -> ProbeResult;
        AcquireLease => EnvironmentAcquireLease(AcquireLeaseParams) -> Lease;
        ResumeLease => EnvironmentResumeLease(ResumeLeaseParams) -> Lease;
        ReleaseLease => EnvironmentReleaseLease(LeaseEndParams) -> LeaseEndResult;
        DestroyLease => EnvironmentDestroyLease(LeaseEndParams) -> LeaseEndResult;
        RealizeWorkspace => EnvironmentRealizeWorkspace(RealizeWorkspaceParams) -> RealizeWorkspaceResult;
        Execute => EnvironmentExecute(ExecuteParams) -> ExecuteResult;
        SyncIn => EnvironmentSyncIn(SyncParams) -> SyncResult;
        SyncOut => EnvironmentSyncOut(SyncParams) -> SyncResult;
        DuplexOpen => DuplexChannelOpen(DuplexOpenParams) -> DuplexOpenResult;
        DuplexWrite => DuplexChannelWrite(DuplexWriteParams) -> Ack;
        DuplexResize => DuplexChannelResize(DuplexResizeParams) -> Ack;
        DuplexStop => DuplexChannelStop(DuplexChannelParams) -> Ack;
        DuplexClose => DuplexChannelClose(DuplexChannelParams) -> Ack;
    }

    macro_rules! notification {
        ($( $ty:ident => $method:ident ($params:ty); )*) => {$(
            #[derive(Debug, Clone, Copy)]
            pub struct $ty;
            impl NotificationMethod for $ty {
                const METHOD: Method = Method::$method;
                type Params = $params;
            }
        )*};
    }

    notification! {
        ExecuteLog => ExecuteLog(ExecuteLogParams);
        DuplexData => DuplexChannelData(DuplexDataParams);
        DuplexExit => DuplexChannelExit(DuplexExitParams);
    }
}

fn to_value<T: Serialize>(v: &T) -> Result<Value, FrameError> {
    serde_json::to_value(v).map_err(|e| FrameError::Encode {
        detail: e.to_string(),
    })
}

/// Decodes params (or a result) of `method`; absent params read as `{}`.
fn from_params<T: DeserializeOwned>(method: &str, params: Option<&Value>) -> Result<T, FrameError> {
    let empty = Value::Object(Default::default());
    let value = params.unwrap_or(&empty);
    T::deserialize(value).map_err(|e| FrameError::InvalidParams {
        method: method.to_owned(),
        detail: e.to_string(),
    })
}

impl Request {
    /// A request for `M` with typed params.
    pub fn typed<M: RpcMethod>(
        id: impl Into<Id>,
        params: &M::Params,
    ) -> Result<Request, FrameError> {
        Ok(Request::new(
            id,
            M::METHOD.as_str(),
            Some(to_value(params)?),
        ))
    }

    /// This request's params as `M`'s params type ([`FrameError::InvalidParams`] otherwise).
    pub fn params_as<M: RpcMethod>(&self) -> Result<M::Params, FrameError> {
        from_params(&self.method, self.params.as_ref())
    }
}

impl Notification {
    /// A notification for `N` with typed params.
    pub fn typed<N: NotificationMethod>(params: &N::Params) -> Result<Notification, FrameError> {
        Ok(Notification::new(
            N::METHOD.as_str(),
            Some(to_value(params)?),
        ))
    }

    /// This notification's params as `N`'s params type.
    pub fn params_as<N: NotificationMethod>(&self) -> Result<N::Params, FrameError> {
        from_params(&self.method, self.params.as_ref())
    }
}

/// Encodes a typed result as the JSON value of a response.
pub fn result_value<M: RpcMethod>(result: &M::Result) -> Result<Value, FrameError> {
    to_value(result)
}

/// Decodes the JSON value of a response as `M`'s result type.
pub fn parse_result<M: RpcMethod>(value: &Value) -> Result<M::Result, FrameError> {
    M::Result::deserialize(value).map_err(|e| FrameError::InvalidParams {
        method: format!("{} result", M::METHOD),
        detail: e.to_string(),
    })
}

use serde::Deserialize as _;
