//! The worker loop over an in-memory pipe.

use std::sync::Arc;
use std::time::Duration;

use sandhost_protocol::*;
use sandhost_provider::*;
use serde_json::{json, Value};
use tokio::io::{DuplexStream, ReadHalf, WriteHalf};
use tokio::task::JoinHandle;

struct HealthOnly;

#[async_trait]
impl Provider for HealthOnly {
    async fn health(&self) -> ProviderResult<HealthResult> {
        Ok(HealthResult {
            status: HealthStatus::Ok,
            message: None,
            details: None,
        })
    }
}

/// Implements exec only: `sleep:<ms>` waits, `log:<a>,<b>` emits chunks.
struct ExecOnly;

#[async_trait]
impl Provider for ExecOnly {
    async fn health(&self) -> ProviderResult<HealthResult> {
        Ok(HealthResult {
            status: HealthStatus::Ok,
            message: None,
            details: None,
        })
    }

    fn exec_ops(&self) -> Option<&dyn ExecOps> {
        Some(self)
    }
}

#[async_trait]
impl ExecOps for ExecOnly {
    async fn execute(
        &self,
        ctx: &RequestContext,
        params: ExecuteParams,
    ) -> ProviderResult<ExecuteResult> {
        let mut stdout = String::new();
        if let Some(ms) = params.command.strip_prefix("sleep:") {
            let ms: u64 = ms
                .parse()
                .map_err(|_| ProviderError::invalid_params("bad sleep"))?;
            tokio::time::sleep(Duration::from_millis(ms)).await;
        } else if let Some(chunks) = params.command.strip_prefix("log:") {
            for chunk in chunks.split(',') {
                ctx.execute_log()
                    .stdout(chunk)
                    .await
                    .map_err(|e| ProviderError::worker(e.to_string()))?;
                stdout.push_str(chunk);
            }
        } else if params.command == "panic" {
            panic!("handler panic on purpose");
        } else if params.command == "fail" {
            return Err(ProviderError::timeout("took too long"));
        }
        Ok(ExecuteResult {
            exit_code: Some(0),
            signal: None,
            timed_out: false,
            stdout,
            stderr: String::new(),
            metadata: None,
        })
    }
}

/// Every accessor returns `Some`; the ops answer trivially.
struct Everything;

#[async_trait]
impl Provider for Everything {
    async fn health(&self) -> ProviderResult<HealthResult> {
        Ok(HealthResult {
            status: HealthStatus::Ok,
            message: None,
            details: None,
        })
    }
    fn config_ops(&self) -> Option<&dyn ConfigOps> {
        Some(self)
    }
    fn probe_ops(&self) -> Option<&dyn ProbeOps> {
        Some(self)
    }
    fn lease_ops(&self) -> Option<&dyn LeaseOps> {
        Some(self)
    }
    fn lease_reuse_ops(&self) -> Option<&dyn LeaseReuseOps> {
        Some(self)
    }
    fn workspace_ops(&self) -> Option<&dyn WorkspaceOps> {
        Some(self)
    }
    fn exec_ops(&self) -> Option<&dyn ExecOps> {
        Some(self)
    }
    fn sync_ops(&self) -> Option<&dyn SyncOps> {
        Some(self)
    }
    fn duplex_ops(&self) -> Option<&dyn DuplexOps> {
        Some(self)
    }
}

fn worker_err<T>() -> ProviderResult<T> {
    Err(ProviderError::worker("not in this test"))
}

#[async_trait]
impl ConfigOps for Everything {
    async fn validate_config(
        &self,
        _: ValidateConfigParams,
    ) -> ProviderResult<ValidateConfigResult> {
        worker_err()
    }
}
#[async_trait]
impl ProbeOps for Everything {
    async fn probe(&self, _: ProbeParams) -> ProviderResult<ProbeResult> {
        worker_err()
    }
}
#[async_trait]
impl LeaseOps for Everything {
    async fn acquire_lease(&self, _: AcquireLeaseParams) -> ProviderResult<Lease> {
        worker_err()
    }
    async fn release_lease(&self, _: LeaseEndParams) -> ProviderResult<LeaseEndResult> {
        worker_err()
    }
}
#[async_trait]
impl LeaseReuseOps for Everything {
    async fn resume_lease(&self, _: ResumeLeaseParams) -> ProviderResult<Lease> {
        Ok(Lease::gone(LeaseGoneReason::NotFound))
    }
    async fn destroy_lease(&self, _: LeaseEndParams) -> ProviderResult<LeaseEndResult> {
        Ok(None)
    }
}
#[async_trait]
impl WorkspaceOps for Everything {
    async fn realize_workspace(
        &self,
        _: RealizeWorkspaceParams,
    ) -> ProviderResult<RealizeWorkspaceResult> {
        worker_err()
    }
}
#[async_trait]
impl ExecOps for Everything {
    async fn execute(
        &self,
        ctx: &RequestContext,
        p: ExecuteParams,
    ) -> ProviderResult<ExecuteResult> {
        ExecOnly.execute(ctx, p).await
    }
}
#[async_trait]
impl SyncOps for Everything {
    async fn sync_in(&self, _: SyncParams) -> ProviderResult<SyncResult> {
        worker_err()
    }
    async fn sync_out(&self, _: SyncParams) -> ProviderResult<SyncResult> {
        worker_err()
    }
}
#[async_trait]
impl DuplexOps for Everything {
    async fn open(
        &self,
        ctx: &RequestContext,
        _: DuplexOpenParams,
    ) -> ProviderResult<DuplexOpenResult> {
        let notifier = ctx.notifier().clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = notifier.duplex_data("ch-1", b"hello\x00".to_vec()).await;
            let _ = notifier
                .duplex_exit(DuplexExitParams {
                    channel_id: "ch-1".into(),
                    exit_code: Some(0),
                    signal: None,
                    error: None,
                })
                .await;
        });
        Ok(DuplexOpenResult {
            channel_id: "ch-1".into(),
        })
    }
    async fn write(&self, _: DuplexWriteParams) -> ProviderResult<()> {
        Ok(())
    }
    async fn resize(&self, _: DuplexResizeParams) -> ProviderResult<()> {
        Ok(())
    }
    async fn stop(&self, _: DuplexChannelParams) -> ProviderResult<()> {
        Ok(())
    }
    async fn close(&self, _: DuplexChannelParams) -> ProviderResult<()> {
        Ok(())
    }
}

struct Host {
    writer: FrameWriter<WriteHalf<DuplexStream>>,
    reader: FrameReader<ReadHalf<DuplexStream>>,
    worker: JoinHandle<Result<(), ServeError>>,
}

fn start(provider: Arc<dyn Provider>) -> Host {
    let (host_side, worker_side) = tokio::io::duplex(4096);
    let (wr, ww) = tokio::io::split(worker_side);
    let worker = tokio::spawn(serve(provider, wr, ww));
    let (hr, hw) = tokio::io::split(host_side);
    Host {
        writer: FrameWriter::new(hw),
        reader: FrameReader::new(hr),
        worker,
    }
}

impl Host {
    async fn send(&mut self, id: u64, method: &str, params: Value) {
        let request = Request::new(id, method, Some(params));
        self.writer.write_message(&request.into()).await.unwrap();
    }

    async fn send_raw(&mut self, line: &[u8]) {
        self.writer.write_encoded(line).await.unwrap();
    }

    async fn next(&mut self) -> Message {
        tokio::time::timeout(Duration::from_secs(5), self.reader.next_message())
            .await
            .expect("worker answered in time")
            .expect("stream open")
            .expect("valid frame")
    }

    async fn response(&mut self) -> Response {
        match self.next().await {
            Message::Response(r) => r,
            other => panic!("expected a response, got {other:?}"),
        }
    }

    async fn call(&mut self, id: u64, method: &str, params: Value) -> Result<Value, RpcError> {
        self.send(id, method, params).await;
        let response = self.response().await;
        assert_eq!(response.id, Some(Id::from(id)));
        response.into_result()
    }
}

fn exec_params(command: &str) -> Value {
    json!({
        "driverKey": "d", "companyId": "c", "environmentId": "e", "issueId": null, "config": {},
        "lease": {"providerLeaseId": "l", "expiresAt": null},
        "command": command,
    })
}

async fn supported(provider: Arc<dyn Provider>) -> Vec<String> {
    let mut host = start(provider);
    let result = host.call(1, "initialize", json!({})).await.unwrap();
    parse_result::<methods::Initialize>(&result)
        .unwrap()
        .supported_methods
}

#[tokio::test]
async fn supported_methods_are_derived_from_the_capability_accessors() {
    assert_eq!(
        supported(Arc::new(HealthOnly)).await,
        ["initialize", "health", "shutdown"]
    );
    assert_eq!(
        supported(Arc::new(ExecOnly)).await,
        ["initialize", "health", "shutdown", "environmentExecute"]
    );
    let all: Vec<&str> = Method::REQUIRED
        .iter()
        .chain(Method::OPTIONAL)
        .map(|m| m.as_str())
        .collect();
    assert_eq!(supported(Arc::new(Everything)).await, all);
}

#[tokio::test]
async fn unimplemented_optional_methods_answer_minus_32004() {
    let mut host = start(Arc::new(HealthOnly));
    for (i, method) in Method::OPTIONAL.iter().enumerate() {
        let err = host
            .call(i as u64, method.as_str(), json!({}))
            .await
            .unwrap_err();
        assert_eq!(err.code, RpcErrorCode::MethodNotImplemented, "{method}");
    }
}

#[tokio::test]
async fn advertised_methods_are_dispatched_not_refused() {
    let mut host = start(Arc::new(Everything));
    for (i, method) in Method::OPTIONAL.iter().enumerate() {
        // Empty params: every optional method needs some, so each answers -32602.
        let err = host
            .call(i as u64, method.as_str(), json!({}))
            .await
            .unwrap_err();
        assert_eq!(
            err.code,
            RpcErrorCode::InvalidParams,
            "{method}: {}",
            err.message
        );
    }
}

#[tokio::test]
async fn unknown_methods_and_notification_names_answer_minus_32601() {
    let mut host = start(Arc::new(Everything));
    let err = host
        .call(1, "environmentTeleport", json!({}))
        .await
        .unwrap_err();
    assert_eq!(err.code, RpcErrorCode::MethodNotFound);
    let err = host.call(2, "execute.log", json!({})).await.unwrap_err();
    assert_eq!(err.code, RpcErrorCode::MethodNotFound);
}

#[tokio::test]
async fn invalid_params_answer_minus_32602_and_provider_errors_keep_their_code() {
    let mut host = start(Arc::new(ExecOnly));
    let err = host
        .call(1, "environmentExecute", json!({"command": 5}))
        .await
        .unwrap_err();
    assert_eq!(err.code, RpcErrorCode::InvalidParams);
    let err = host
        .call(2, "environmentExecute", exec_params("fail"))
        .await
        .unwrap_err();
    assert_eq!(err.code, RpcErrorCode::Timeout);
    assert_eq!(err.message, "took too long");
}

#[tokio::test]
async fn concurrent_requests_are_answered_by_id_out_of_order() {
    let mut host = start(Arc::new(ExecOnly));
    host.send(1, "environmentExecute", exec_params("sleep:300"))
        .await;
    host.send(2, "environmentExecute", exec_params("sleep:0"))
        .await;
    host.send(3, "health", json!({})).await;
    let mut order = Vec::new();
    for _ in 0..3 {
        let r = host.response().await;
        assert!(r.clone().into_result().is_ok());
        order.push(r.id.unwrap());
    }
    assert_eq!(
        order.last(),
        Some(&Id::from(1u64)),
        "the slow request answers last: {order:?}"
    );
}

#[tokio::test]
async fn execute_log_chunks_carry_the_request_id_and_precede_the_result() {
    let mut host = start(Arc::new(ExecOnly));
    let request = Request::new(
        "exec-a",
        "environmentExecute",
        Some(exec_params("log:one,two")),
    );
    host.writer.write_message(&request.into()).await.unwrap();
    let mut chunks = Vec::new();
    loop {
        match host.next().await {
            Message::Notification(n) => {
                let p = n.params_as::<methods::ExecuteLog>().unwrap();
                assert_eq!(p.request_id, Id::from("exec-a"));
                assert_eq!(p.stream, LogStream::Stdout);
                chunks.push(p.chunk);
            }
            Message::Response(r) => {
                assert_eq!(r.id, Some(Id::from("exec-a")));
                let result = parse_result::<methods::Execute>(&r.into_result().unwrap()).unwrap();
                assert_eq!(result.stdout, "onetwo");
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(chunks, ["one", "two"]);
}

#[tokio::test]
async fn duplex_open_answers_a_channel_and_later_notifies_data_then_exit() {
    let mut host = start(Arc::new(Everything));
    let params = json!({
        "driverKey": "d", "companyId": "c", "environmentId": "e", "issueId": null, "config": {},
        "lease": {"providerLeaseId": "l", "expiresAt": null},
        "purpose": {"kind": "pty", "command": "/bin/sh", "cols": 80, "rows": 24},
    });
    let result = host.call(1, "duplexChannelOpen", params).await.unwrap();
    assert_eq!(
        parse_result::<methods::DuplexOpen>(&result)
            .unwrap()
            .channel_id,
        "ch-1"
    );
    let Message::Notification(data) = host.next().await else {
        panic!("expected data")
    };
    let data = data.params_as::<methods::DuplexData>().unwrap();
    assert_eq!(data.data.0, b"hello\x00");
    let Message::Notification(exit) = host.next().await else {
        panic!("expected exit")
    };
    assert_eq!(exit.method, "duplexChannel.exit");
}

#[tokio::test]
async fn malformed_frames_are_answered_and_the_loop_keeps_serving() {
    let mut host = start(Arc::new(HealthOnly));
    host.send_raw(b"{oops\n").await;
    let r = host.response().await;
    assert_eq!(r.id, None);
    assert_eq!(r.into_result().unwrap_err().code, RpcErrorCode::ParseError);
    host.send_raw(b"{\"jsonrpc\":\"1.0\",\"id\":9,\"method\":\"health\"}\n")
        .await;
    let r = host.response().await;
    assert_eq!(r.id, Some(Id::from(9u64)));
    assert_eq!(
        r.into_result().unwrap_err().code,
        RpcErrorCode::InvalidRequest
    );
    assert!(host.call(10, "health", json!({})).await.is_ok());
}

#[tokio::test]
async fn oversized_frames_are_refused_without_killing_the_loop() {
    let (host_side, worker_side) = tokio::io::duplex(4096);
    let (wr, ww) = tokio::io::split(worker_side);
    let options = ServeOptions {
        max_frame_len: 256,
        ..ServeOptions::default()
    };
    let worker = tokio::spawn(serve_with(options, Arc::new(HealthOnly), wr, ww));
    let (hr, hw) = tokio::io::split(host_side);
    let mut host = Host {
        writer: FrameWriter::new(hw),
        reader: FrameReader::new(hr),
        worker,
    };
    let big = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"health\",\"params\":{{\"x\":\"{}\"}}}}\n",
        "a".repeat(10_000)
    );
    host.send_raw(big.as_bytes()).await;
    let r = host.response().await;
    let err = r.into_result().unwrap_err();
    assert_eq!(err.code, RpcErrorCode::InvalidRequest);
    assert_eq!(err.data, Some(json!({"code": "E4001"})));
    assert!(host.call(2, "health", json!({})).await.is_ok());
}

#[tokio::test]
async fn a_panicking_handler_answers_minus_32603() {
    let mut host = start(Arc::new(ExecOnly));
    let err = host
        .call(1, "environmentExecute", exec_params("panic"))
        .await
        .unwrap_err();
    assert_eq!(err.code, RpcErrorCode::InternalError);
    assert!(host.call(2, "health", json!({})).await.is_ok());
}

#[tokio::test]
async fn shutdown_is_answered_then_the_loop_exits_even_with_work_in_flight() {
    let mut host = start(Arc::new(ExecOnly));
    host.send(1, "environmentExecute", exec_params("sleep:60000"))
        .await;
    let result = host.call(2, "shutdown", json!({})).await.unwrap();
    assert_eq!(result, Value::Null);
    let exit = tokio::time::timeout(Duration::from_secs(5), host.worker).await;
    exit.expect("loop exits").unwrap().unwrap();
    assert!(
        host.reader.next_message().await.is_none(),
        "nothing after the shutdown answer"
    );
}

#[tokio::test]
async fn end_of_input_lets_running_calls_answer_then_exits_cleanly() {
    let mut host = start(Arc::new(ExecOnly));
    host.send(1, "environmentExecute", exec_params("sleep:50"))
        .await;
    tokio::io::AsyncWriteExt::shutdown(&mut host.writer.into_inner())
        .await
        .unwrap();
    let r = tokio::time::timeout(Duration::from_secs(5), host.reader.next_message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(matches!(r, Message::Response(r) if r.id == Some(Id::from(1u64))));
    tokio::time::timeout(Duration::from_secs(5), host.worker)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
