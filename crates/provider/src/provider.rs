//! The [`Provider`] trait and its capability accessors.
//!
//! # Why accessors, not a hand-kept method list
//! `initialize` must answer `supportedMethods`, and the host grants capabilities
//! from that list, so the list must never lie. Each group of optional worker
//! methods is a separate trait ([`ExecOps`], [`SyncOps`], ...) whose methods are
//! all required, and [`Provider`] has one accessor per group returning
//! `Option<&dyn Group>` (default `None`). A provider opts in by implementing the
//! group trait and returning `Some(self)`. The serve loop computes
//! `supportedMethods` *and* dispatches every call through the same accessors
//! (see [`crate::supported_methods`]): a method is advertised exactly when it is
//! answered, and a provider cannot advertise half of a group.
//!
//! The groups follow the capability contract's prerequisites:
//! [`LeaseReuseOps`] (resume + destroy, with release the `reusableLeases`
//! prerequisite) and [`SyncOps`] (sync in + out: "define both or neither")
//! cannot be implemented by halves.
//!
//! # Object safety
//! The traits use [`async_trait`](crate::async_trait) so that a provider is
//! usable as `Arc<dyn Provider>` (what [`crate::serve`] takes) and each group as
//! `&dyn Group`. Write `#[sandhost_provider::async_trait]` on your impls.

use async_trait::async_trait;
use sandhost_protocol::{
    methods, AcquireLeaseParams, Bytes, DuplexChannelParams, DuplexDataParams, DuplexExitParams,
    DuplexOpenParams, DuplexOpenResult, DuplexResizeParams, DuplexWriteParams, ExecuteLogParams,
    ExecuteParams, ExecuteResult, HealthResult, Id, InitializeParams, Lease, LeaseEndParams,
    LeaseEndResult, LogStream, Method, Notification, NotificationMethod, ProbeParams, ProbeResult,
    RealizeWorkspaceParams, RealizeWorkspaceResult, ResumeLeaseParams, SyncParams, SyncResult,
    ValidateConfigParams, ValidateConfigResult,
};
use tokio::sync::mpsc;

use crate::error::{ConnectionClosed, ProviderResult};
use crate::serve::Outgoing;

/// A sandbox provider worker. Only [`Provider::health`] is required; every
/// optional worker method is reached through a capability accessor.
#[async_trait]
pub trait Provider: Send + Sync + 'static {
    /// `health`: answered at any time, also concurrently with other calls.
    async fn health(&self) -> ProviderResult<HealthResult>;

    /// Hook run by `initialize` before it answers; the default accepts.
    async fn initialize(&self, _params: InitializeParams) -> ProviderResult<()> {
        Ok(())
    }

    /// Hook run by `shutdown` before it answers and the loop exits.
    async fn shutdown(&self) {}

    /// `environmentValidateConfig`.
    fn config_ops(&self) -> Option<&dyn ConfigOps> {
        None
    }

    /// `environmentProbe`.
    fn probe_ops(&self) -> Option<&dyn ProbeOps> {
        None
    }

    /// `environmentAcquireLease` and `environmentReleaseLease`.
    fn lease_ops(&self) -> Option<&dyn LeaseOps> {
        None
    }

    /// `environmentResumeLease` and `environmentDestroyLease`.
    fn lease_reuse_ops(&self) -> Option<&dyn LeaseReuseOps> {
        None
    }

    /// `environmentRealizeWorkspace`.
    fn workspace_ops(&self) -> Option<&dyn WorkspaceOps> {
        None
    }

    /// `environmentExecute`.
    fn exec_ops(&self) -> Option<&dyn ExecOps> {
        None
    }

    /// `environmentSyncIn` and `environmentSyncOut`.
    fn sync_ops(&self) -> Option<&dyn SyncOps> {
        None
    }

    /// The duplex channel family: open, write, resize, stop, close.
    fn duplex_ops(&self) -> Option<&dyn DuplexOps> {
        None
    }
}

#[async_trait]
pub trait ConfigOps: Send + Sync {
    async fn validate_config(
        &self,
        params: ValidateConfigParams,
    ) -> ProviderResult<ValidateConfigResult>;
}

#[async_trait]
pub trait ProbeOps: Send + Sync {
    async fn probe(&self, params: ProbeParams) -> ProviderResult<ProbeResult>;
}

#[async_trait]
pub trait LeaseOps: Send + Sync {
    async fn acquire_lease(&self, params: AcquireLeaseParams) -> ProviderResult<Lease>;
    async fn release_lease(&self, params: LeaseEndParams) -> ProviderResult<LeaseEndResult>;
}

#[async_trait]
pub trait LeaseReuseOps: Send + Sync {
    /// A lease that is gone answers `Ok(Lease::gone(reason))`, not an error.
    async fn resume_lease(&self, params: ResumeLeaseParams) -> ProviderResult<Lease>;
    async fn destroy_lease(&self, params: LeaseEndParams) -> ProviderResult<LeaseEndResult>;
}

#[async_trait]
pub trait WorkspaceOps: Send + Sync {
    async fn realize_workspace(
        &self,
        params: RealizeWorkspaceParams,
    ) -> ProviderResult<RealizeWorkspaceResult>;
}

#[async_trait]
pub trait ExecOps: Send + Sync {
    /// Runs a command. `ctx.execute_log()` streams `execute.log` chunks for this
    /// request; they reach the host before the result.
    async fn execute(
        &self,
        ctx: &RequestContext,
        params: ExecuteParams,
    ) -> ProviderResult<ExecuteResult>;
}

#[async_trait]
pub trait SyncOps: Send + Sync {
    async fn sync_in(&self, params: SyncParams) -> ProviderResult<SyncResult>;
    async fn sync_out(&self, params: SyncParams) -> ProviderResult<SyncResult>;
}

/// Duplex byte channels. Keep `ctx.notifier().clone()` from `open` to send
/// `duplexChannel.data` and, last, one `duplexChannel.exit` for the channel.
#[async_trait]
pub trait DuplexOps: Send + Sync {
    async fn open(
        &self,
        ctx: &RequestContext,
        params: DuplexOpenParams,
    ) -> ProviderResult<DuplexOpenResult>;
    async fn write(&self, params: DuplexWriteParams) -> ProviderResult<()>;
    /// Resize a `pty` channel; a `tcp` channel answers invalid params.
    async fn resize(&self, params: DuplexResizeParams) -> ProviderResult<()>;
    /// Close the input side; output flows until the far end exits.
    async fn stop(&self, params: DuplexChannelParams) -> ProviderResult<()>;
    /// Tear the channel down now.
    async fn close(&self, params: DuplexChannelParams) -> ProviderResult<()>;
}

/// Which optional methods `provider` answers, computed from its accessors.
pub fn implements(provider: &dyn Provider, method: Method) -> bool {
    use Method as M;
    match method {
        M::Initialize | M::Health | M::Shutdown => true,
        M::EnvironmentValidateConfig => provider.config_ops().is_some(),
        M::EnvironmentProbe => provider.probe_ops().is_some(),
        M::EnvironmentAcquireLease | M::EnvironmentReleaseLease => provider.lease_ops().is_some(),
        M::EnvironmentResumeLease | M::EnvironmentDestroyLease => {
            provider.lease_reuse_ops().is_some()
        }
        M::EnvironmentRealizeWorkspace => provider.workspace_ops().is_some(),
        M::EnvironmentExecute => provider.exec_ops().is_some(),
        M::EnvironmentSyncIn | M::EnvironmentSyncOut => provider.sync_ops().is_some(),
        M::DuplexChannelOpen
        | M::DuplexChannelWrite
        | M::DuplexChannelResize
        | M::DuplexChannelStop
        | M::DuplexChannelClose => provider.duplex_ops().is_some(),
        M::ExecuteLog | M::DuplexChannelData | M::DuplexChannelExit => false,
    }
}

/// The `supportedMethods` of `provider`: the required methods and every
/// optional method whose accessor returns `Some`.
pub fn supported_methods(provider: &dyn Provider) -> Vec<Method> {
    Method::REQUIRED
        .iter()
        .chain(Method::OPTIONAL)
        .copied()
        .filter(|m| implements(provider, *m))
        .collect()
}

/// Sends notifications to the host. Cheap to clone; may outlive the request
/// (duplex channels keep one to report data and exit).
#[derive(Debug, Clone)]
pub struct Notifier {
    tx: mpsc::Sender<Outgoing>,
}

impl Notifier {
    pub(crate) fn new(tx: mpsc::Sender<Outgoing>) -> Self {
        Notifier { tx }
    }

    /// Sends one typed notification. Waits when the writer is behind.
    pub async fn notify<N: NotificationMethod>(
        &self,
        params: &N::Params,
    ) -> Result<(), ConnectionClosed> {
        let notification = match Notification::typed::<N>(params) {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(method = %N::METHOD, error = %e, "cannot encode notification");
                return Ok(());
            }
        };
        self.tx
            .send(Outgoing::Message(notification.into()))
            .await
            .map_err(|_| ConnectionClosed)
    }

    /// `duplexChannel.data`.
    pub async fn duplex_data(
        &self,
        channel_id: &str,
        data: impl Into<Vec<u8>>,
    ) -> Result<(), ConnectionClosed> {
        let params = DuplexDataParams {
            channel_id: channel_id.to_owned(),
            data: Bytes(data.into()),
        };
        self.notify::<methods::DuplexData>(&params).await
    }

    /// `duplexChannel.exit`: the last notification of a channel.
    pub async fn duplex_exit(&self, params: DuplexExitParams) -> Result<(), ConnectionClosed> {
        self.notify::<methods::DuplexExit>(&params).await
    }
}

/// Emits `execute.log` chunks tagged with the running request's id.
#[derive(Debug, Clone)]
pub struct ExecuteSink {
    request_id: Id,
    notifier: Notifier,
}

impl ExecuteSink {
    pub async fn log(
        &self,
        stream: LogStream,
        chunk: impl Into<String>,
    ) -> Result<(), ConnectionClosed> {
        let params = ExecuteLogParams {
            request_id: self.request_id.clone(),
            stream,
            chunk: chunk.into(),
        };
        self.notifier.notify::<methods::ExecuteLog>(&params).await
    }

    pub async fn stdout(&self, chunk: impl Into<String>) -> Result<(), ConnectionClosed> {
        self.log(LogStream::Stdout, chunk).await
    }

    pub async fn stderr(&self, chunk: impl Into<String>) -> Result<(), ConnectionClosed> {
        self.log(LogStream::Stderr, chunk).await
    }
}

/// What a handler knows about the request it serves.
#[derive(Debug, Clone)]
pub struct RequestContext {
    request_id: Id,
    method: Method,
    notifier: Notifier,
}

impl RequestContext {
    pub(crate) fn new(request_id: Id, method: Method, notifier: Notifier) -> Self {
        RequestContext {
            request_id,
            method,
            notifier,
        }
    }

    /// The id of the request being served, as the host sent it.
    pub fn request_id(&self) -> &Id {
        &self.request_id
    }

    pub fn method(&self) -> Method {
        self.method
    }

    pub fn notifier(&self) -> &Notifier {
        &self.notifier
    }

    /// The `execute.log` sink for this request.
    pub fn execute_log(&self) -> ExecuteSink {
        ExecuteSink {
            request_id: self.request_id.clone(),
            notifier: self.notifier.clone(),
        }
    }
}
