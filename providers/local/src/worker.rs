//! The local provider as a sandhost worker (`sandhost-provider-local`): the
//! JSON-RPC methods of the worker protocol mapped onto [`LocalSandbox`].
//!
//! The worker keeps no lease state of its own: every lease is a sandbox
//! directory under the state root (its init is PID 1 of the sandbox and
//! outlives any worker), so a lease acquired by one worker process is
//! resumed, used and destroyed by another. (Open duplex channels are the
//! exception: they belong to the worker process that opened them.)
//!
//! - State root: `$SANDHOST_HOME/local` when `SANDHOST_HOME` is set (the
//!   host sets it for its workers), else `config.stateRoot`, else
//!   `/var/lib/sandhost/local`.
//! - Lease id convention: `providerLeaseId` is the host's `runId` when it
//!   matches `[A-Za-z0-9_-]{1,64}` (the sandbox is created under that id),
//!   else a generated sandbox id. A host that crashed between acquire and
//!   recording the answer can therefore destroy the lease by its `runId`.
//! - Expiry: `min(requestedExpiresAt, now + 300 s)`, kept in the sandbox's
//!   state directory (`lease.json`); resume of an expired lease destroys it
//!   and answers `reason: expired`.
//! - Execute: `bypassSession: true` runs one-shot; otherwise the command runs
//!   in the sandbox's persistent session shell (see
//!   [`LocalSandbox::session_exec`]). Output is streamed as `execute.log`
//!   chunks as the init sends them.
//! - Native sync runs `tar` inside the sandbox (see the `sync` module).
//! - Duplex channels (`pty` and `tcp`, for the `terminal` and `ports`
//!   capabilities) are the one piece of per-process state: a table of open
//!   channels, each pumped by its own thread (see the `duplex` module).
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sandhost_protocol::{
    AcquireLeaseParams, Diagnostic as WireDiagnostic, ExecuteParams, ExecuteResult, HealthResult,
    HealthStatus, Lease, LeaseEndParams, LeaseEndResult, LeaseEndState, LeaseGoneReason,
    LeaseReceipt, LogStream, ProbeParams, ProbeResult, ResumeLeaseParams, Severity as WireSeverity,
    SyncParams, SyncResult, ValidateConfigParams, ValidateConfigResult,
};
use sandhost_provider::{
    async_trait, ConfigOps, DuplexOps, ExecOps, LeaseOps, LeaseReuseOps, ProbeOps, Provider,
    ProviderError, ProviderResult, RequestContext, SyncOps,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::config::{ExecRequest, ExecResult, Stream};
use crate::error::LocalError;
use crate::probe::Severity;
use crate::sandbox::LocalSandbox;

mod config;
mod duplex;
mod sync;
mod utf8;

pub use config::{parse as parse_config, LocalConfig, Parsed, DEFAULT_STATE_ROOT};
pub use utf8::ChunkDecoder;

/// The longest a lease lives: `expiresAt` is at most this far from acquire.
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(300);
/// Captured output per stream of one command.
pub const MAX_OUTPUT_BYTES: u64 = 1 << 20;
/// The lease record kept in the sandbox's state directory.
const LEASE_FILE: &str = "lease.json";

/// Failures of the worker's own decisions; sandbox failures are [`LocalError`].
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Local(#[from] LocalError),
    #[error("invalid provider config: {0}")]
    Config(String),
    #[error("invalid lease: {0}")]
    Lease(String),
    #[error(
        "path {0:?} is not allowed: sync targets must be under /workspace or /tmp, without `..`"
    )]
    PathNotAllowed(String),
    #[error("sync failed: {0}")]
    Sync(String),
    #[error("sync exceeds its limit: {0}")]
    SyncLimit(String),
    #[error("{context}: {source}")]
    HostIo {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("worker task failed: {0}")]
    Task(String),
    #[error("no open duplex channel {0:?} (it ended, or was never opened by this worker)")]
    UnknownChannel(String),
    #[error(transparent)]
    Archive(#[from] sandhost_archive::ArchiveError),
}

impl WorkerError {
    /// The stable code (the one place worker codes are assigned).
    pub fn code(&self) -> &'static str {
        match self {
            WorkerError::Local(e) => e.code(),
            WorkerError::Config(_) => "E6070",
            WorkerError::Lease(_) => "E6071",
            WorkerError::PathNotAllowed(_) => "E6072",
            WorkerError::Sync(_) => "E6073",
            WorkerError::SyncLimit(_) => "E6074",
            WorkerError::HostIo { .. } => "E6075",
            WorkerError::Task(_) => "E6076",
            WorkerError::UnknownChannel(_) => "E6077",
            // the archive's own stable codes (E515x)
            WorkerError::Archive(e) => e.code(),
        }
    }

    /// The JSON-RPC error: invalid requests are -32602, the rest -32002;
    /// `data.code` carries the E6xxx code.
    pub fn to_provider_error(&self) -> ProviderError {
        let invalid = matches!(
            self,
            WorkerError::Config(_)
                | WorkerError::Lease(_)
                | WorkerError::PathNotAllowed(_)
                | WorkerError::UnknownChannel(_)
                | WorkerError::Local(LocalError::InvalidRequest(_))
                | WorkerError::Local(LocalError::InvalidConfig(_))
        );
        let e = if invalid {
            ProviderError::invalid_params(self.to_string())
        } else {
            ProviderError::worker(self.to_string())
        };
        e.with_data(json!({ "code": self.code() }))
    }

    pub(crate) fn host_io(context: impl Into<String>, source: std::io::Error) -> Self {
        WorkerError::HostIo {
            context: context.into(),
            source,
        }
    }
}

impl From<WorkerError> for ProviderError {
    fn from(e: WorkerError) -> Self {
        e.to_provider_error()
    }
}

/// Run blocking sandbox work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, WorkerError> + Send + 'static,
) -> Result<T, WorkerError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| WorkerError::Task(e.to_string()))?
}

/// What `lease.json` in a sandbox's state directory records.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeaseRecord {
    run_id: String,
    /// Seconds since the epoch.
    expires_at: u64,
    created_at: u64,
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn iso8601(secs: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

fn parse_iso8601(s: &str) -> Option<u64> {
    humantime::parse_rfc3339_weak(s)
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
}

/// A sandbox id the host may also use as lease id.
pub fn valid_lease_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn read_record(state_root: &std::path::Path, id: &str) -> Option<LeaseRecord> {
    let bytes = std::fs::read(state_root.join(id).join(LEASE_FILE)).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn parsed_config(config: &Value) -> Result<LocalConfig, WorkerError> {
    let p = parse_config(config);
    if p.errors.is_empty() {
        Ok(p.config)
    } else {
        Err(WorkerError::Config(p.errors.join("; ")))
    }
}

fn lease_id(lease: &Lease) -> Result<String, WorkerError> {
    match lease.provider_lease_id.as_deref() {
        Some(id) if valid_lease_id(id) => Ok(id.to_string()),
        Some(id) => Err(WorkerError::Lease(format!("unknown lease id {id:?}"))),
        None => Err(WorkerError::Lease(
            "the lease has no providerLeaseId".into(),
        )),
    }
}

/// The name of a signal number (`SIGKILL`), or `SIG<n>` for the rare ones.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        10 => "SIGUSR1",
        11 => "SIGSEGV",
        12 => "SIGUSR2",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        24 => "SIGXCPU",
        25 => "SIGXFSZ",
        31 => "SIGSYS",
        n => return format!("SIG{n}"),
    };
    name.into()
}

/// The local provider worker. Its only state is the table of duplex
/// channels open in this process.
#[derive(Debug, Default)]
pub struct LocalProvider {
    channels: Arc<duplex::Channels>,
}

#[async_trait]
impl Provider for LocalProvider {
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

#[async_trait]
impl ConfigOps for LocalProvider {
    async fn validate_config(
        &self,
        params: ValidateConfigParams,
    ) -> ProviderResult<ValidateConfigResult> {
        let p = parse_config(&params.config);
        Ok(ValidateConfigResult {
            ok: p.errors.is_empty(),
            warnings: p.warnings,
            errors: p.errors,
            normalized_config: None,
        })
    }
}

#[async_trait]
impl ProbeOps for LocalProvider {
    async fn probe(&self, params: ProbeParams) -> ProviderResult<ProbeResult> {
        let mut diagnostics: Vec<WireDiagnostic> = crate::probe::probe()
            .into_iter()
            .map(|d| WireDiagnostic {
                severity: match d.severity {
                    Severity::Info => WireSeverity::Info,
                    Severity::Warning => WireSeverity::Warning,
                    Severity::Error => WireSeverity::Error,
                },
                message: d.message,
                code: d.code.map(str::to_string),
                details: None,
            })
            .collect();
        let parsed = parse_config(&params.scope.config);
        for e in &parsed.errors {
            diagnostics.push(WireDiagnostic {
                severity: WireSeverity::Error,
                message: e.clone(),
                code: Some("E6070".into()),
                details: None,
            });
        }
        let root = parsed.config.state_root();
        diagnostics.push(WireDiagnostic {
            severity: WireSeverity::Info,
            message: format!("state root {}", root.display()),
            code: None,
            details: None,
        });
        let errors = diagnostics
            .iter()
            .filter(|d| d.severity == WireSeverity::Error)
            .count();
        Ok(ProbeResult {
            ok: errors == 0,
            summary: Some(if errors == 0 {
                "local sandboxes can be created".into()
            } else {
                format!("{errors} problem(s) prevent local sandboxes")
            }),
            diagnostics,
            metadata: None,
        })
    }
}

#[async_trait]
impl LeaseOps for LocalProvider {
    async fn acquire_lease(&self, params: AcquireLeaseParams) -> ProviderResult<Lease> {
        let cfg = parsed_config(&params.scope.config)?;
        let now = now_secs();
        let cap = now + MAX_LEASE_TTL.as_secs();
        let expires = params
            .requested_expires_at
            .as_deref()
            .and_then(parse_iso8601)
            .map_or(cap, |r| r.min(cap));
        let run_id = params.run_id.clone();
        let id = valid_lease_id(&run_id).then(|| run_id.clone());
        let record = LeaseRecord {
            run_id,
            expires_at: expires,
            created_at: now,
        };
        let sb = blocking(move || {
            let mut sc = cfg.sandbox_config("x");
            sc.id = id;
            let sb = LocalSandbox::create(&sc)?;
            let json = serde_json::to_vec(&record).unwrap_or_default();
            if let Err(e) = std::fs::write(sb.state_dir().join(LEASE_FILE), json) {
                let _ = sb.destroy();
                return Err(WorkerError::host_io("write lease record", e));
            }
            Ok(sb)
        })
        .await?;
        let mut metadata = Map::new();
        metadata.insert("sandboxId".into(), json!(sb.id()));
        Ok(Lease {
            provider_lease_id: Some(sb.id().to_string()),
            metadata: Some(metadata),
            expires_at: Some(iso8601(expires)),
        })
    }

    async fn release_lease(&self, params: LeaseEndParams) -> ProviderResult<LeaseEndResult> {
        // A released lease keeps its sandbox (retained leases outlive
        // processes); the host destroys ephemeral ones.
        if params.cancel_active_work == Some(true) && valid_lease_id(&params.provider_lease_id) {
            let root = parsed_config(&params.scope.config)?.state_root();
            let id = params.provider_lease_id.clone();
            blocking(move || {
                if let Ok(sb) = LocalSandbox::open(&root, &id) {
                    sb.kill_all()?;
                }
                Ok(())
            })
            .await?;
        }
        Ok(None)
    }
}

#[async_trait]
impl LeaseReuseOps for LocalProvider {
    async fn resume_lease(&self, params: ResumeLeaseParams) -> ProviderResult<Lease> {
        let id = params.provider_lease_id.clone();
        if !valid_lease_id(&id) {
            return Ok(Lease::gone(LeaseGoneReason::NotFound));
        }
        let root = parsed_config(&params.scope.config)?.state_root();
        blocking(move || {
            let record = read_record(&root, &id);
            if record.as_ref().is_some_and(|r| r.expires_at <= now_secs()) {
                if let Ok(sb) = LocalSandbox::open_stale(&root, &id) {
                    sb.destroy()?;
                }
                return Ok(Lease::gone(LeaseGoneReason::Expired));
            }
            match LocalSandbox::open(&root, &id) {
                Ok(sb) => {
                    let mut metadata = Map::new();
                    metadata.insert("sandboxId".into(), json!(sb.id()));
                    Ok(Lease {
                        provider_lease_id: Some(id),
                        metadata: Some(metadata),
                        expires_at: record.map(|r| iso8601(r.expires_at)),
                    })
                }
                Err(LocalError::NotFound(_)) | Err(LocalError::InvalidConfig(_)) => {
                    Ok(Lease::gone(LeaseGoneReason::NotFound))
                }
                Err(LocalError::IdentityMismatch(_)) => {
                    Ok(Lease::gone(LeaseGoneReason::IdentityMismatch))
                }
                Err(LocalError::Gone(_)) => {
                    // its init is dead (host reboot, killed): clear the remains
                    if let Ok(sb) = LocalSandbox::open_stale(&root, &id) {
                        let _ = sb.destroy();
                    }
                    let mut lease = Lease::gone(LeaseGoneReason::NotFound);
                    if let Some(m) = lease.metadata.as_mut() {
                        m.insert("detail".into(), json!("the sandbox's init is gone"));
                    }
                    Ok(lease)
                }
                Err(e) => Err(e.into()),
            }
        })
        .await
        .map_err(Into::into)
    }

    async fn destroy_lease(&self, params: LeaseEndParams) -> ProviderResult<LeaseEndResult> {
        let id = params.provider_lease_id.clone();
        if !valid_lease_id(&id) {
            return Err(WorkerError::Lease(format!("unknown lease id {id:?}")).into());
        }
        let root = parsed_config(&params.scope.config)?.state_root();
        let receipt_id = id.clone();
        let destroyed = blocking(move || match LocalSandbox::open_stale(&root, &id) {
            Ok(sb) => {
                sb.destroy()?;
                Ok(true)
            }
            // already gone: destroy is idempotent
            Err(LocalError::NotFound(_)) => Ok(false),
            Err(e) => Err(e.into()),
        })
        .await?;
        tracing::debug!(lease = %receipt_id, destroyed, "destroy");
        Ok(Some(LeaseReceipt {
            provider_lease_id: receipt_id,
            state: LeaseEndState::Destroyed,
        }))
    }
}

/// The request the sandbox runs for an `environmentExecute`.
fn exec_request(params: &ExecuteParams, cfg: &LocalConfig, session: bool) -> ExecRequest {
    let mut argv = vec![params.command.clone()];
    argv.extend(params.args.clone().unwrap_or_default());
    let mut req = ExecRequest::new(argv);
    // a session keeps its own directory unless asked
    // a relative cwd is relative to the lease root, /workspace
    req.cwd = params
        .cwd
        .clone()
        .map(|c| {
            if c.starts_with('/') {
                c
            } else {
                format!("/workspace/{c}")
            }
        })
        .or_else(|| (!session).then(|| cfg.workdir.clone()).flatten());
    req.env = cfg.env.clone();
    for (k, v) in params.env.clone().unwrap_or_default() {
        req.env.retain(|(ek, _)| *ek != k);
        req.env.push((k, v));
    }
    req.stdin = params.stdin.clone().unwrap_or_default().into_bytes();
    req.timeout = params.timeout_ms.map(Duration::from_millis);
    req.max_output_bytes = MAX_OUTPUT_BYTES;
    req
}

fn result_metadata(r: &ExecResult, session: bool) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("stdoutTruncated".into(), json!(r.stdout_truncated));
    m.insert("stderrTruncated".into(), json!(r.stderr_truncated));
    m.insert("stdoutDroppedBytes".into(), json!(r.stdout_dropped));
    m.insert("stderrDroppedBytes".into(), json!(r.stderr_dropped));
    m.insert("oomKilled".into(), json!(r.oom_killed));
    m.insert("pidsLimited".into(), json!(r.pids_limited));
    m.insert("durationMs".into(), json!(r.duration.as_millis() as u64));
    m.insert("session".into(), json!(session));
    if session {
        m.insert("sessionStarted".into(), json!(r.session_started));
        m.insert("sessionEnded".into(), json!(r.session_ended));
    }
    m
}

#[async_trait]
impl ExecOps for LocalProvider {
    async fn execute(
        &self,
        ctx: &RequestContext,
        params: ExecuteParams,
    ) -> ProviderResult<ExecuteResult> {
        let cfg = parsed_config(&params.scope.config)?;
        let id = lease_id(&params.lease)?;
        if params.command.is_empty() {
            return Err(ProviderError::invalid_params("empty command"));
        }
        let session = params.bypass_session != Some(true);
        let req = exec_request(&params, &cfg, session);
        let root = cfg.state_root();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Stream, Vec<u8>)>();
        let task = blocking(move || {
            let sb = LocalSandbox::open(&root, &id)?;
            let on_chunk = |s: Stream, b: &[u8]| {
                let _ = tx.send((s, b.to_vec()));
            };
            let r = if session {
                sb.session_exec(&req, on_chunk)?
            } else {
                sb.exec(&req, on_chunk)?
            };
            Ok(r)
        });
        let sink = ctx.execute_log();
        let forward = async {
            let mut dec = [ChunkDecoder::default(), ChunkDecoder::default()];
            let streams = [LogStream::Stdout, LogStream::Stderr];
            while let Some((s, bytes)) = rx.recv().await {
                let i = usize::from(s == Stream::Stderr);
                let text = dec[i].push(&bytes);
                if !text.is_empty() {
                    let _ = sink.log(streams[i], text).await;
                }
            }
            for i in 0..2 {
                let text = dec[i].finish();
                if !text.is_empty() {
                    let _ = sink.log(streams[i], text).await;
                }
            }
        };
        let (r, ()) = tokio::join!(task, forward);
        let r = r?;
        Ok(ExecuteResult {
            exit_code: r.exit_code,
            signal: r.signal.map(signal_name),
            timed_out: r.timed_out,
            stdout: String::from_utf8_lossy(&r.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&r.stderr).into_owned(),
            metadata: Some(result_metadata(&r, session)),
        })
    }
}

#[async_trait]
impl SyncOps for LocalProvider {
    async fn sync_in(&self, params: SyncParams) -> ProviderResult<SyncResult> {
        let cfg = parsed_config(&params.scope.config)?;
        let id = lease_id(&params.lease)?;
        let root = cfg.state_root();
        Ok(blocking(move || sync::sync_in(&root, &id, &cfg, &params.operations)).await?)
    }

    async fn sync_out(&self, params: SyncParams) -> ProviderResult<SyncResult> {
        let cfg = parsed_config(&params.scope.config)?;
        let id = lease_id(&params.lease)?;
        let root = cfg.state_root();
        Ok(blocking(move || sync::sync_out(&root, &id, &params.operations)).await?)
    }
}

/// The worker binary's `main`: serve the protocol on stdin/stdout.
pub fn main() -> ! {
    sandhost_provider::init_stderr_logging();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandhost-provider-local: cannot start the async runtime: {e}");
            std::process::exit(1)
        }
    };
    let code = rt.block_on(async {
        match sandhost_provider::serve_stdio(Arc::new(LocalProvider::default())).await {
            Ok(()) => 0,
            Err(e) => {
                tracing::error!(code = e.code(), "{e}");
                1
            }
        }
    });
    std::process::exit(code)
}

/// Where a sandbox of `state_root` keeps its lease record (for tests and tools).
pub fn lease_file(state_root: &std::path::Path, id: &str) -> PathBuf {
    state_root.join(id).join(LEASE_FILE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_codes_are_unique_and_messages_follow_the_style() {
        let all = [
            WorkerError::Config("x".into()),
            WorkerError::Lease("x".into()),
            WorkerError::PathNotAllowed("x".into()),
            WorkerError::Sync("x".into()),
            WorkerError::SyncLimit("x".into()),
            WorkerError::host_io("x", std::io::Error::from(std::io::ErrorKind::NotFound)),
            WorkerError::Task("x".into()),
            WorkerError::UnknownChannel("x".into()),
        ];
        let mut codes: Vec<_> = all.iter().map(WorkerError::code).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
        for e in &all {
            let m = e.to_string();
            assert!(
                !m.ends_with('.') && !m.starts_with(char::is_uppercase),
                "{m}"
            );
            assert_eq!(e.to_provider_error().data.unwrap()["code"], e.code());
        }
        assert_eq!(
            WorkerError::PathNotAllowed("/etc".into())
                .to_provider_error()
                .code,
            sandhost_protocol::RpcErrorCode::InvalidParams
        );
    }

    #[test]
    fn lease_ids_follow_the_run_id_convention() {
        assert!(valid_lease_id("lease_01-AB"));
        assert!(!valid_lease_id("a/b") && !valid_lease_id("") && !valid_lease_id(&"a".repeat(65)));
    }

    #[test]
    fn times_round_trip_and_signals_have_names() {
        assert_eq!(parse_iso8601(&iso8601(1_700_000_000)), Some(1_700_000_000));
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_name(40), "SIG40");
    }
}
