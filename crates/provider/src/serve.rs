//! The worker loop: reads requests, runs each in its own task, writes every
//! response and notification through one writer task.

use std::collections::HashMap;
use std::sync::Arc;

use sandhost_protocol::{
    encode_message, methods, result_value, FrameError, FrameReader, FrameWriter, Id, Message,
    Method, Request, Response, RpcError, RpcErrorCode, RpcMethod, DEFAULT_MAX_FRAME_LEN,
};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::error::{ProviderError, ServeError};
use crate::provider::{implements, supported_methods, Notifier, Provider, RequestContext};

/// What the writer task receives.
#[derive(Debug)]
pub(crate) enum Outgoing {
    Message(Message),
    /// Everything queued before this is written; then the writer stops.
    Finish,
}

/// Tunables of [`serve_with`].
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Longest accepted request line in bytes (default 16 MiB).
    pub max_frame_len: usize,
    /// Capacity of the outgoing queue; notifications wait when it is full.
    pub outgoing_capacity: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            max_frame_len: DEFAULT_MAX_FRAME_LEN,
            outgoing_capacity: 1024,
        }
    }
}

/// Serves `provider` on stdin/stdout until `shutdown` or end of input.
///
/// Stdin is read on a dedicated thread so that the process can exit after
/// `shutdown` even while the host keeps stdin open.
pub async fn serve_stdio(provider: Arc<dyn Provider>) -> Result<(), ServeError> {
    let (reader, mut pipe_writer) = tokio::io::simplex(64 * 1024);
    let handle = tokio::runtime::Handle::current();
    std::thread::Builder::new()
        .name("sandhost-stdin".into())
        .spawn(move || {
            use std::io::Read;
            let mut stdin = std::io::stdin().lock();
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read stdin");
                        break;
                    }
                };
                let chunk = &buf[..n];
                let written = handle.block_on(async {
                    use tokio::io::AsyncWriteExt;
                    pipe_writer.write_all(chunk).await
                });
                if written.is_err() {
                    break;
                }
            }
        })
        .map_err(|e| ServeError::Read(FrameError::Io(e)))?;
    serve(provider, reader, tokio::io::stdout()).await
}

/// Serves `provider` over any reader/writer pair (tests use in-memory pipes).
pub async fn serve<R, W>(
    provider: Arc<dyn Provider>,
    reader: R,
    writer: W,
) -> Result<(), ServeError>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    serve_with(ServeOptions::default(), provider, reader, writer).await
}

/// [`serve`] with explicit options.
pub async fn serve_with<R, W>(
    options: ServeOptions,
    provider: Arc<dyn Provider>,
    reader: R,
    writer: W,
) -> Result<(), ServeError>
where
    R: AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel(options.outgoing_capacity.max(1));
    let writer_task = tokio::spawn(write_loop(rx, FrameWriter::new(writer)));
    let mut frames = FrameReader::with_max_frame_len(reader, options.max_frame_len);
    let mut tasks = JoinSet::new();
    let mut in_flight: HashMap<tokio::task::Id, Id> = HashMap::new();
    let mut read_error = None;

    let shutdown_requested = loop {
        tokio::select! {
            frame = frames.next_message() => match frame {
                None => break false,
                Some(Err(FrameError::Io(e))) => {
                    read_error = Some(FrameError::Io(e));
                    break false;
                }
                Some(Err(e)) => {
                    tracing::warn!(code = e.code(), error = %e, "rejected frame");
                    let response = Response::err(e.request_id().cloned(), e.to_rpc_error());
                    send(&tx, response).await;
                }
                Some(Ok(Message::Request(request))) => {
                    if request.method == Method::Shutdown.as_str() {
                        provider.shutdown().await;
                        let result = result_value::<methods::Shutdown>(&sandhost_protocol::Ack)
                            .unwrap_or(Value::Null);
                        send(&tx, Response::ok(request.id, result)).await;
                        break true;
                    }
                    let id = request.id.clone();
                    let provider = provider.clone();
                    let tx = tx.clone();
                    let handle = tasks.spawn(async move {
                        let response = handle_request(provider.as_ref(), &tx, request).await;
                        send(&tx, response).await;
                    });
                    in_flight.insert(handle.id(), id);
                }
                Some(Ok(Message::Notification(n))) => {
                    tracing::debug!(method = %n.method, "ignoring notification from host");
                }
                Some(Ok(Message::Response(r))) => {
                    tracing::debug!(id = ?r.id, "ignoring response from host");
                }
            },
            Some(joined) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                reap(joined, &mut in_flight, &tx).await;
            }
        }
    };

    if shutdown_requested {
        // The host asked us to stop: calls still running are abandoned.
        tasks.shutdown().await;
    } else {
        // End of input: let running calls finish and answer.
        while let Some(joined) = tasks.join_next_with_id().await {
            reap(joined, &mut in_flight, &tx).await;
        }
    }
    let _ = tx.send(Outgoing::Finish).await;
    drop(tx);
    let write_result = match writer_task.await {
        Ok(result) => result,
        Err(e) => Err(FrameError::Encode {
            detail: format!("writer task failed: {e}"),
        }),
    };
    if let Some(e) = read_error {
        return Err(ServeError::Read(e));
    }
    write_result.map_err(ServeError::Write)
}

async fn reap(
    joined: Result<(tokio::task::Id, ()), tokio::task::JoinError>,
    in_flight: &mut HashMap<tokio::task::Id, Id>,
    tx: &mpsc::Sender<Outgoing>,
) {
    match joined {
        Ok((task, ())) => {
            in_flight.remove(&task);
        }
        Err(e) => {
            let id = in_flight.remove(&e.id());
            tracing::error!(request = ?id, error = %e, "request handler panicked");
            if let Some(id) = id {
                let error = RpcError::new(RpcErrorCode::InternalError, "request handler panicked");
                send(tx, Response::err(Some(id), error)).await;
            }
        }
    }
}

async fn send(tx: &mpsc::Sender<Outgoing>, response: Response) {
    if tx.send(Outgoing::Message(response.into())).await.is_err() {
        tracing::debug!("writer is gone, dropping response");
    }
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut rx: mpsc::Receiver<Outgoing>,
    mut writer: FrameWriter<W>,
) -> Result<(), FrameError> {
    while let Some(out) = rx.recv().await {
        let message = match out {
            Outgoing::Message(m) => m,
            Outgoing::Finish => break,
        };
        let line = match encode_message(&message) {
            Ok(line) => line,
            Err(e) => {
                tracing::error!(error = %e, "cannot encode outgoing message");
                continue;
            }
        };
        writer.write_encoded(&line).await?;
    }
    Ok(())
}

async fn handle_request(
    provider: &dyn Provider,
    tx: &mpsc::Sender<Outgoing>,
    request: Request,
) -> Response {
    let id = request.id.clone();
    match dispatch(provider, tx, &request).await {
        Ok(result) => Response::ok(id, result),
        Err(error) => {
            tracing::debug!(method = %request.method, code = error.code.code(), error = %error.message, "request failed");
            Response::err(Some(id), error)
        }
    }
}

fn not_implemented(method: Method) -> RpcError {
    RpcError::new(
        RpcErrorCode::MethodNotImplemented,
        format!("method `{method}` is not implemented by this worker"),
    )
}

fn params<M: RpcMethod>(request: &Request) -> Result<M::Params, RpcError> {
    request.params_as::<M>().map_err(|e| e.to_rpc_error())
}

fn reply<M: RpcMethod>(result: Result<M::Result, ProviderError>) -> Result<Value, RpcError> {
    let result = result.map_err(|e| e.to_rpc_error())?;
    result_value::<M>(&result).map_err(|e| e.to_rpc_error())
}

/// Answers one request. Every optional method goes through the same accessor
/// that [`supported_methods`] reads, so what is advertised is what is answered.
async fn dispatch(
    provider: &dyn Provider,
    tx: &mpsc::Sender<Outgoing>,
    request: &Request,
) -> Result<Value, RpcError> {
    use methods as m;
    use Method as M;
    let method = match Method::from_name(&request.method) {
        Some(method) if !method.is_notification() => method,
        _ => {
            return Err(RpcError::new(
                RpcErrorCode::MethodNotFound,
                format!("method `{}` not found", request.method),
            ))
        }
    };
    if !implements(provider, method) {
        return Err(not_implemented(method));
    }
    let ctx = RequestContext::new(request.id.clone(), method, Notifier::new(tx.clone()));
    let missing = || not_implemented(method);
    match method {
        M::Initialize => {
            let p = params::<m::Initialize>(request)?;
            provider.initialize(p).await.map_err(|e| e.to_rpc_error())?;
            let supported = supported_methods(provider)
                .iter()
                .map(|m| m.as_str().to_owned())
                .collect();
            reply::<m::Initialize>(Ok(sandhost_protocol::InitializeResult {
                ok: true,
                supported_methods: supported,
            }))
        }
        M::Health => {
            let _ = params::<m::Health>(request)?;
            reply::<m::Health>(provider.health().await)
        }
        M::Shutdown => {
            // Normally handled by the loop; answered here for completeness.
            reply::<m::Shutdown>(Ok(sandhost_protocol::Ack))
        }
        M::EnvironmentValidateConfig => {
            let ops = provider.config_ops().ok_or_else(missing)?;
            reply::<m::ValidateConfig>(
                ops.validate_config(params::<m::ValidateConfig>(request)?)
                    .await,
            )
        }
        M::EnvironmentProbe => {
            let ops = provider.probe_ops().ok_or_else(missing)?;
            reply::<m::Probe>(ops.probe(params::<m::Probe>(request)?).await)
        }
        M::EnvironmentAcquireLease => {
            let ops = provider.lease_ops().ok_or_else(missing)?;
            reply::<m::AcquireLease>(ops.acquire_lease(params::<m::AcquireLease>(request)?).await)
        }
        M::EnvironmentReleaseLease => {
            let ops = provider.lease_ops().ok_or_else(missing)?;
            reply::<m::ReleaseLease>(ops.release_lease(params::<m::ReleaseLease>(request)?).await)
        }
        M::EnvironmentResumeLease => {
            let ops = provider.lease_reuse_ops().ok_or_else(missing)?;
            reply::<m::ResumeLease>(ops.resume_lease(params::<m::ResumeLease>(request)?).await)
        }
        M::EnvironmentDestroyLease => {
            let ops = provider.lease_reuse_ops().ok_or_else(missing)?;
            reply::<m::DestroyLease>(ops.destroy_lease(params::<m::DestroyLease>(request)?).await)
        }
        M::EnvironmentRealizeWorkspace => {
            let ops = provider.workspace_ops().ok_or_else(missing)?;
            let p = params::<m::RealizeWorkspace>(request)?;
            reply::<m::RealizeWorkspace>(ops.realize_workspace(p).await)
        }
        M::EnvironmentExecute => {
            let ops = provider.exec_ops().ok_or_else(missing)?;
            reply::<m::Execute>(ops.execute(&ctx, params::<m::Execute>(request)?).await)
        }
        M::EnvironmentSyncIn => {
            let ops = provider.sync_ops().ok_or_else(missing)?;
            reply::<m::SyncIn>(ops.sync_in(params::<m::SyncIn>(request)?).await)
        }
        M::EnvironmentSyncOut => {
            let ops = provider.sync_ops().ok_or_else(missing)?;
            reply::<m::SyncOut>(ops.sync_out(params::<m::SyncOut>(request)?).await)
        }
        M::DuplexChannelOpen => {
            let ops = provider.duplex_ops().ok_or_else(missing)?;
            reply::<m::DuplexOpen>(ops.open(&ctx, params::<m::DuplexOpen>(request)?).await)
        }
        M::DuplexChannelWrite => {
            let ops = provider.duplex_ops().ok_or_else(missing)?;
            let done = ops.write(params::<m::DuplexWrite>(request)?).await;
            reply::<m::DuplexWrite>(done.map(|()| sandhost_protocol::Ack))
        }
        M::DuplexChannelResize => {
            let ops = provider.duplex_ops().ok_or_else(missing)?;
            let done = ops.resize(params::<m::DuplexResize>(request)?).await;
            reply::<m::DuplexResize>(done.map(|()| sandhost_protocol::Ack))
        }
        M::DuplexChannelStop => {
            let ops = provider.duplex_ops().ok_or_else(missing)?;
            let done = ops.stop(params::<m::DuplexStop>(request)?).await;
            reply::<m::DuplexStop>(done.map(|()| sandhost_protocol::Ack))
        }
        M::DuplexChannelClose => {
            let ops = provider.duplex_ops().ok_or_else(missing)?;
            let done = ops.close(params::<m::DuplexClose>(request)?).await;
            reply::<m::DuplexClose>(done.map(|()| sandhost_protocol::Ack))
        }
        M::ExecuteLog | M::DuplexChannelData | M::DuplexChannelExit => Err(RpcError::new(
            RpcErrorCode::MethodNotFound,
            format!("`{method}` is a notification, not a method"),
        )),
    }
}
