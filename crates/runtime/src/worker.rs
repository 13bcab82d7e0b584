//! A provider worker process and the JSON-RPC client that talks to it.
//!
//! The worker runs with its plugin directory as working directory; stdin and
//! stdout carry NDJSON frames, stderr is its log (drained continuously into
//! `tracing`, with a bounded tail kept for error messages, so a worker that
//! floods stderr never blocks). Requests are multiplexed by id.
//!
//! Nothing a worker sends is trusted. A frame that is not valid JSON-RPC, an
//! oversized frame, or a response to an id we never sent is a protocol
//! violation: the worker is killed and every call in flight fails with a
//! typed error. A worker that exits fails every call in flight with
//! [`WorkerError::Crashed`]; a call that outlives its deadline fails with
//! [`WorkerError::Timeout`]. No call can hang.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandhost_contract::ErrorCode;
use sandhost_protocol::methods::{self, Initialize};
use sandhost_protocol::{
    parse_result, ExecuteLogParams, ExecuteParams, ExecuteResult, FrameReader, FrameWriter, Id,
    InitializeParams, Message, Notification, Request, ResponsePayload, RpcError, RpcErrorCode,
    RpcMethod, DEFAULT_MAX_FRAME_LEN,
};
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, oneshot, watch};

/// How to start a worker.
#[derive(Debug, Clone)]
pub struct WorkerSpec {
    /// argv; `argv[0]` is resolved against `cwd` when it is a relative path
    /// with a slash (`./worker`), else searched on PATH.
    pub argv: Vec<String>,
    /// The plugin directory: the worker's working directory.
    pub cwd: PathBuf,
    /// Extra environment variables.
    pub env: Vec<(String, String)>,
}

/// Deadlines and limits for one worker.
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    /// Deadline for the `initialize` handshake.
    pub init_timeout: Duration,
    /// Default deadline for a call (a call may pass its own).
    pub call_timeout: Duration,
    /// How long `shutdown` waits for the worker to exit before killing it.
    pub shutdown_grace: Duration,
    /// The largest frame accepted from the worker.
    pub max_frame_len: usize,
    /// A worker idle for longer than this is health-checked before reuse.
    pub health_interval: Duration,
    /// Deadline of a health check.
    pub health_timeout: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            init_timeout: Duration::from_secs(10),
            call_timeout: Duration::from_secs(120),
            shutdown_grace: Duration::from_secs(3),
            max_frame_len: DEFAULT_MAX_FRAME_LEN,
            health_interval: Duration::from_secs(30),
            health_timeout: Duration::from_secs(5),
        }
    }
}

/// What went wrong talking to a worker.
#[derive(Debug, Clone, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot start worker `{program}`: {detail}")]
    Spawn { program: String, detail: String },

    #[error("worker exited ({status}){stderr_tail}")]
    Crashed { status: String, stderr_tail: String },

    #[error("worker did not answer `{method}` within {timeout_ms} ms")]
    Timeout { method: String, timeout_ms: u64 },

    #[error("worker broke the protocol: {detail}")]
    ProtocolViolation { detail: String },

    #[error("worker does not implement `{method}`")]
    NotImplemented { method: String },

    #[error("worker answered `{}` with error {}: {}", .0.method, .0.code, .0.message)]
    Rpc(Box<RpcFailure>),

    #[error("worker initialize failed: {detail}")]
    Initialize { detail: String },

    #[error("worker answered `{method}` with a malformed result: {detail}")]
    BadResult { method: String, detail: String },
}

impl WorkerError {
    pub fn code(&self) -> ErrorCode {
        ErrorCode(match self {
            Self::Spawn { .. } => "E4101",
            Self::Crashed { .. } => "E4102",
            Self::Timeout { .. } => "E4103",
            Self::ProtocolViolation { .. } => "E4104",
            Self::NotImplemented { .. } => "E4105",
            Self::Rpc(_) => "E4106",
            Self::Initialize { .. } => "E4107",
            Self::BadResult { .. } => "E4108",
        })
    }
}

/// A JSON-RPC error answer, kept whole (boxed: errors stay small).
#[derive(Debug, Clone, PartialEq)]
pub struct RpcFailure {
    pub method: String,
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

type Pending = HashMap<u64, oneshot::Sender<Result<Value, WorkerError>>>;

/// Routes notifications to whoever waits for them.
#[derive(Debug, Default)]
struct Routes {
    /// `execute.log` chunks by the running request's id.
    logs: HashMap<u64, mpsc::UnboundedSender<ExecuteLogParams>>,
    /// Other notifications (duplex channel data and exit) by method.
    other: Option<mpsc::UnboundedSender<Notification>>,
    /// Duplex channel notifications by `channelId`.
    channels: HashMap<String, mpsc::UnboundedSender<Notification>>,
    /// Channel notifications that arrived before anyone subscribed (a worker
    /// may send output before its `duplexChannelOpen` answer is read).
    early: HashMap<String, Vec<Notification>>,
}

/// Bounds on notifications held for channels nobody subscribed to yet.
const EARLY_CHANNELS: usize = 64;
const EARLY_PER_CHANNEL: usize = 1024;

#[derive(Debug)]
struct Shared {
    pending: Mutex<Pending>,
    routes: Mutex<Routes>,
    /// Set once: why the worker is gone.
    dead: Mutex<Option<WorkerError>>,
    stderr_tail: Mutex<VecDeque<u8>>,
}

const STDERR_TAIL: usize = 4096;

impl Shared {
    /// Mark the worker dead (first reason wins) and fail every call in flight.
    fn fail_all(&self, err: WorkerError) {
        let mut dead = self.dead.lock().unwrap();
        if dead.is_none() {
            *dead = Some(err.clone());
        }
        let reason = dead.clone().unwrap_or(err);
        drop(dead);
        let pending: Vec<_> = self.pending.lock().unwrap().drain().collect();
        for (_, tx) in pending {
            let _ = tx.send(Err(reason.clone()));
        }
        let mut routes = self.routes.lock().unwrap();
        routes.logs.clear();
        routes.other = None;
        routes.channels.clear();
        routes.early.clear();
    }

    fn tail(&self) -> String {
        let t = self.stderr_tail.lock().unwrap();
        if t.is_empty() {
            return String::new();
        }
        let (a, b) = t.as_slices();
        let s = String::from_utf8_lossy(&[a, b].concat()).trim().to_string();
        format!("; stderr: {s}")
    }
}

/// A live worker process.
#[derive(Debug)]
pub struct Worker {
    shared: Arc<Shared>,
    outgoing: mpsc::UnboundedSender<Message>,
    next_id: AtomicU64,
    supported: BTreeSet<String>,
    opts: WorkerOptions,
    kill: Mutex<Option<oneshot::Sender<()>>>,
    exited: watch::Receiver<bool>,
}

impl Worker {
    /// Start the worker and run the `initialize` handshake.
    pub async fn spawn(spec: &WorkerSpec, opts: WorkerOptions) -> Result<Self, WorkerError> {
        let program = spec.argv.first().cloned().unwrap_or_default();
        let spawn_err = |detail: String| WorkerError::Spawn {
            program: program.clone(),
            detail,
        };
        if program.is_empty() {
            return Err(spawn_err("empty worker command".into()));
        }
        let resolved = if program.contains('/') && !program.starts_with('/') {
            spec.cwd.join(&program)
        } else {
            PathBuf::from(&program)
        };
        let mut cmd = Command::new(resolved);
        cmd.args(&spec.argv[1..])
            .current_dir(&spec.cwd)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|e| spawn_err(e.to_string()))?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| spawn_err("no stdin pipe".into()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| spawn_err("no stdout pipe".into()))?;
        let mut stderr = child
            .stderr
            .take()
            .ok_or_else(|| spawn_err("no stderr pipe".into()))?;

        let shared = Arc::new(Shared {
            pending: Mutex::new(HashMap::new()),
            routes: Mutex::new(Routes::default()),
            dead: Mutex::new(None),
            stderr_tail: Mutex::new(VecDeque::with_capacity(STDERR_TAIL)),
        });

        // stderr: drain forever into tracing and a bounded tail.
        let s = shared.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 8192];
            loop {
                match stderr.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        tracing::debug!(target: "sandhost::worker::stderr", "{}", String::from_utf8_lossy(&buf[..n]).trim_end());
                        let mut t = s.stderr_tail.lock().unwrap();
                        t.extend(&buf[..n]);
                        while t.len() > STDERR_TAIL {
                            t.pop_front();
                        }
                    }
                }
            }
        });

        // writer task
        let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Message>();
        tokio::spawn(async move {
            let mut w = FrameWriter::new(stdin);
            while let Some(m) = out_rx.recv().await {
                if w.write_message(&m).await.is_err() {
                    break;
                }
            }
        });

        // reader task
        let s = shared.clone();
        let (violation_tx, violation_rx) = oneshot::channel::<()>();
        let max = opts.max_frame_len;
        tokio::spawn(async move {
            let mut r = FrameReader::with_max_frame_len(stdout, max);
            let mut violation_tx = Some(violation_tx);
            while let Some(frame) = r.next_message().await {
                let problem = match frame {
                    Ok(Message::Response(resp)) => route_response(&s, resp),
                    Ok(Message::Notification(n)) => {
                        route_notification(&s, n);
                        None
                    }
                    Ok(Message::Request(req)) => Some(format!(
                        "worker sent a request (`{}`); workers only answer",
                        req.method
                    )),
                    Err(e) => Some(format!("{} ({})", e, e.code())),
                };
                if let Some(detail) = problem {
                    tracing::warn!("worker protocol violation: {detail}");
                    s.fail_all(WorkerError::ProtocolViolation { detail });
                    if let Some(tx) = violation_tx.take() {
                        let _ = tx.send(());
                    }
                    return;
                }
            }
        });

        // reaper task: owns the child; kills it on request, on a violation,
        // or when the Worker is dropped; reports its exit.
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let (exited_tx, exited_rx) = watch::channel(false);
        let s = shared.clone();
        tokio::spawn(reap(child, kill_rx, violation_rx, s, exited_tx));

        let mut worker = Self {
            shared,
            outgoing: out_tx,
            next_id: AtomicU64::new(1),
            supported: BTreeSet::new(),
            opts,
            kill: Mutex::new(Some(kill_tx)),
            exited: exited_rx,
        };
        let init = worker
            .call_with_timeout::<Initialize>(&InitializeParams::default(), worker.opts.init_timeout)
            .await
            .map_err(|e| match e {
                WorkerError::Rpc(f) => WorkerError::Initialize { detail: f.message },
                other => other,
            })?;
        if !init.ok {
            return Err(WorkerError::Initialize {
                detail: "worker answered ok: false".into(),
            });
        }
        worker.supported = init.supported_methods.into_iter().collect();
        Ok(worker)
    }

    /// The methods the worker advertised in `initialize` (the verified set).
    pub fn supported_methods(&self) -> &BTreeSet<String> {
        &self.supported
    }

    pub fn supports(&self, method: &str) -> bool {
        self.supported.contains(method)
    }

    /// Why the worker is gone, if it is.
    pub fn dead_reason(&self) -> Option<WorkerError> {
        self.shared.dead.lock().unwrap().clone()
    }

    /// Call `M` with the default deadline.
    pub async fn call<M: RpcMethod>(&self, params: &M::Params) -> Result<M::Result, WorkerError> {
        self.call_with_timeout::<M>(params, self.opts.call_timeout)
            .await
    }

    /// Call `M` with an explicit deadline.
    pub async fn call_with_timeout<M: RpcMethod>(
        &self,
        params: &M::Params,
        timeout: Duration,
    ) -> Result<M::Result, WorkerError> {
        let (id, rx) = self.register();
        self.send_and_wait::<M>(id, rx, params, timeout).await
    }

    /// Run `environmentExecute`, handing every `execute.log` chunk for this
    /// request to `on_log` as it arrives, before the result.
    pub async fn execute(
        &self,
        params: &ExecuteParams,
        timeout: Duration,
        mut on_log: impl FnMut(ExecuteLogParams) + Send,
    ) -> Result<ExecuteResult, WorkerError> {
        let (id, rx) = self.register();
        let (log_tx, mut log_rx) = mpsc::unbounded_channel();
        self.shared.routes.lock().unwrap().logs.insert(id, log_tx);
        let call = self.send_and_wait::<methods::Execute>(id, rx, params, timeout);
        tokio::pin!(call);
        let result = loop {
            tokio::select! {
                biased;
                Some(chunk) = log_rx.recv() => on_log(chunk),
                r = &mut call => break r,
            }
        };
        self.shared.routes.lock().unwrap().logs.remove(&id);
        // chunks already queued were sent before the response: deliver them
        while let Ok(chunk) = log_rx.try_recv() {
            on_log(chunk);
        }
        result
    }

    /// Receive every notification that is not `execute.log` (duplex channel
    /// data and exit). One subscriber at a time; a new one replaces the old.
    pub fn subscribe_notifications(&self) -> mpsc::UnboundedReceiver<Notification> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.shared.routes.lock().unwrap().other = Some(tx);
        rx
    }

    /// Receive the `duplexChannel.data` / `duplexChannel.exit` notifications
    /// of one channel, including any that arrived before this call.
    pub fn subscribe_channel(&self, channel_id: &str) -> mpsc::UnboundedReceiver<Notification> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut routes = self.shared.routes.lock().unwrap();
        for n in routes.early.remove(channel_id).unwrap_or_default() {
            let _ = tx.send(n);
        }
        routes.channels.insert(channel_id.to_string(), tx);
        rx
    }

    /// Stop routing a channel's notifications.
    pub fn unsubscribe_channel(&self, channel_id: &str) {
        let mut routes = self.shared.routes.lock().unwrap();
        routes.channels.remove(channel_id);
        routes.early.remove(channel_id);
    }

    fn register(&self) -> (u64, oneshot::Receiver<Result<Value, WorkerError>>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let dead = self.shared.dead.lock().unwrap().clone();
        match dead {
            Some(e) => {
                let _ = tx.send(Err(e));
            }
            None => {
                self.shared.pending.lock().unwrap().insert(id, tx);
            }
        }
        (id, rx)
    }

    async fn send_and_wait<M: RpcMethod>(
        &self,
        id: u64,
        rx: oneshot::Receiver<Result<Value, WorkerError>>,
        params: &M::Params,
        timeout: Duration,
    ) -> Result<M::Result, WorkerError> {
        let method = M::METHOD.as_str();
        let req = Request::typed::<M>(id, params).map_err(|e| WorkerError::BadResult {
            method: method.into(),
            detail: format!("cannot encode params: {e}"),
        })?;
        if self.outgoing.send(Message::Request(req)).is_err() {
            self.shared.pending.lock().unwrap().remove(&id);
            return Err(self.dead_reason().unwrap_or(WorkerError::Crashed {
                status: "writer closed".into(),
                stderr_tail: self.shared.tail(),
            }));
        }
        let value = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(r)) => r.map_err(|e| rpc_method_name(e, method))?,
            Ok(Err(_)) => {
                return Err(self.dead_reason().unwrap_or(WorkerError::Crashed {
                    status: "unknown".into(),
                    stderr_tail: self.shared.tail(),
                }))
            }
            Err(_) => {
                self.shared.pending.lock().unwrap().remove(&id);
                return Err(WorkerError::Timeout {
                    method: method.into(),
                    timeout_ms: timeout.as_millis() as u64,
                });
            }
        };
        parse_result::<M>(&value).map_err(|e| WorkerError::BadResult {
            method: method.into(),
            detail: e.to_string(),
        })
    }

    /// Ask the worker to shut down, wait up to the grace period, then kill it.
    pub async fn shutdown(self) {
        let grace = self.opts.shutdown_grace;
        let _ = self
            .call_with_timeout::<methods::Shutdown>(&Default::default(), grace)
            .await;
        let mut exited = self.exited.clone();
        let exited_in_time = tokio::time::timeout(grace, exited.wait_for(|e| *e))
            .await
            .is_ok();
        if !exited_in_time {
            self.kill();
        }
        let _ = tokio::time::timeout(grace, exited.wait_for(|e| *e)).await;
    }

    /// Kill the worker now.
    pub fn kill(&self) {
        if let Some(tx) = self.kill.lock().unwrap().take() {
            let _ = tx.send(());
        }
    }

    /// Whether the process has exited.
    pub fn has_exited(&self) -> bool {
        *self.exited.borrow()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill();
    }
}

fn rpc_method_name(e: WorkerError, method: &str) -> WorkerError {
    match e {
        WorkerError::Rpc(mut f) => {
            f.method = method.into();
            WorkerError::Rpc(f)
        }
        WorkerError::NotImplemented { .. } => WorkerError::NotImplemented {
            method: method.into(),
        },
        other => other,
    }
}

async fn reap(
    mut child: Child,
    kill_rx: oneshot::Receiver<()>,
    violation_rx: oneshot::Receiver<()>,
    shared: Arc<Shared>,
    exited: watch::Sender<bool>,
) {
    let status = tokio::select! {
        s = child.wait() => s,
        _ = kill_rx => { let _ = child.start_kill(); child.wait().await }
        Ok(()) = violation_rx => { let _ = child.start_kill(); child.wait().await }
    };
    let status = match status {
        Ok(s) => s.to_string(),
        Err(e) => e.to_string(),
    };
    // give the stderr drain a moment to collect the last words
    tokio::time::sleep(Duration::from_millis(20)).await;
    let tail = shared.tail();
    shared.fail_all(WorkerError::Crashed {
        status,
        stderr_tail: tail,
    });
    let _ = exited.send(true);
}

fn route_response(s: &Shared, resp: sandhost_protocol::Response) -> Option<String> {
    let id = match resp.id {
        Some(Id::Number(n)) if n.as_u64().is_some() => n.as_u64().unwrap_or_default(),
        other => return Some(format!("response with an id we never sent: {other:?}")),
    };
    let Some(tx) = s.pending.lock().unwrap().remove(&id) else {
        // a late answer to a call that timed out is not a violation
        return None;
    };
    let outcome = match resp.payload {
        ResponsePayload::Result(v) => Ok(v),
        ResponsePayload::Error(e) => Err(rpc_error(e)),
    };
    let _ = tx.send(outcome);
    None
}

fn rpc_error(e: RpcError) -> WorkerError {
    if e.code == RpcErrorCode::MethodNotImplemented {
        return WorkerError::NotImplemented {
            method: String::new(),
        };
    }
    WorkerError::Rpc(Box::new(RpcFailure {
        method: String::new(),
        code: e.code.code(),
        message: e.message,
        data: e.data,
    }))
}

fn route_notification(s: &Shared, n: Notification) {
    if n.method == "execute.log" {
        if let Ok(p) = n.params_as::<methods::ExecuteLog>() {
            if let Some(id) = match &p.request_id {
                Id::Number(n) => n.as_u64(),
                _ => None,
            } {
                if let Some(tx) = s.routes.lock().unwrap().logs.get(&id) {
                    let _ = tx.send(p);
                }
            }
        }
        return;
    }
    let mut routes = s.routes.lock().unwrap();
    let channel = n
        .params
        .as_ref()
        .and_then(|p| p.get("channelId"))
        .and_then(Value::as_str)
        .map(str::to_string);
    if let Some(id) = channel {
        if let Some(tx) = routes.channels.get(&id) {
            let _ = tx.send(n);
            return;
        }
        if routes.early.len() < EARLY_CHANNELS || routes.early.contains_key(&id) {
            let held = routes.early.entry(id).or_default();
            if held.len() < EARLY_PER_CHANNEL {
                held.push(n);
            }
        }
        return;
    }
    if let Some(tx) = &routes.other {
        let _ = tx.send(n);
    }
}
