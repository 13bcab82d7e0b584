//! The provider conformance suite behind `sandhost plugin check DIR`.
//!
//! [`check_plugin`] starts the plugin's worker for real and drives it through
//! scenarios chosen from what it advertises in `supportedMethods` and what its
//! driver declares. Nothing is taken on trust:
//!
//! - every advertised method is called at least once; a method that answers
//!   -32004 / -32601, crashes the worker, breaks the protocol, hangs or
//!   answers a malformed result is recorded as a *lying* method and fails the
//!   check by name;
//! - a method that is not advertised is never required (and never called);
//! - each scenario checks observable behaviour (exit codes, separated streams,
//!   stdin, env, cwd, timeouts, incremental `execute.log`, lease lifecycle,
//!   byte- and mode-exact sync, atomic replace, path confinement, duplex
//!   channels) rather than the mere absence of an error.
//!
//! A worker that crashes is restarted for the scenarios that follow, so one
//! broken method does not hide the behaviour of the others.
//!
//! The report types are plain runtime types; [`CheckReport::to_json`] and
//! [`CheckReport::render`] give the CLI its two output forms.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sandhost_contract::manifest::DriverKind;
use sandhost_contract::{Declared, DeclaredCapabilities, ProviderCapability};
use sandhost_protocol::methods::{self, Initialize};
use sandhost_protocol::{
    AcquireLeaseParams, Bytes, DuplexChannelParams, DuplexOpenParams, DuplexPurpose,
    DuplexResizeParams, DuplexWriteParams, EmptyParams, EnvironmentScope, ExecuteLogParams,
    ExecuteParams, ExecuteResult, FileKind, FileMapping, FileMode, HealthStatus, Lease,
    LeaseEndParams, LeaseEndState, LogStream, Method, MethodKind, Notification, ProbeParams,
    ResumeLeaseParams, RpcMethod, SyncOperation, SyncParams, SyncResult, ValidateConfigParams,
};
use serde_json::{json, Map, Value};

use crate::plugins::Plugin;
use crate::worker::{Worker, WorkerError, WorkerOptions};

/// The tenant every check runs under.
pub const CHECK_COMPANY_ID: &str = "sandhost-check";

/// The lease-relative directory the sync scenarios write into.
const CHECK_DIR: &str = "sandhost-check";

/// How to run a check.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// The driver to check; default: the manifest's first `sandbox_provider` driver.
    pub driver_key: Option<String>,
    /// The provider config sent with every environment call; default `{}`.
    pub config: Option<Value>,
    /// How the worker is started (handshake deadline, frame limit, ...).
    pub worker: WorkerOptions,
    /// The deadline of each call the suite makes.
    pub call_timeout: Duration,
}

impl Default for CheckOptions {
    fn default() -> Self {
        Self {
            driver_key: None,
            config: None,
            worker: WorkerOptions::default(),
            call_timeout: Duration::from_secs(30),
        }
    }
}

/// How one scenario ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScenarioStatus {
    Passed,
    Failed(String),
    Skipped(String),
}

impl ScenarioStatus {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Passed => "passed",
            Self::Failed(_) => "failed",
            Self::Skipped(_) => "skipped",
        }
    }

    /// The reason of a failure or a skip.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Passed => None,
            Self::Failed(r) | Self::Skipped(r) => Some(r),
        }
    }
}

/// One scenario of the suite.
#[derive(Debug, Clone)]
pub struct ScenarioOutcome {
    pub name: String,
    pub status: ScenarioStatus,
    /// The worker methods this scenario called, in first-call order.
    pub methods: Vec<String>,
    /// Observations that do not decide the outcome.
    pub notes: Vec<String>,
}

/// The result of [`check_plugin`].
#[derive(Debug, Clone)]
pub struct CheckReport {
    pub plugin_id: String,
    /// `None` when the plugin declares no usable driver.
    pub driver_key: Option<String>,
    /// `supportedMethods` as the worker advertised it.
    pub advertised_methods: Vec<String>,
    pub scenarios: Vec<ScenarioOutcome>,
    /// Every method the suite called at least once.
    pub exercised_methods: BTreeSet<String>,
    /// Advertised methods that are not really implemented, with why.
    pub lying_methods: BTreeMap<String, String>,
    /// Problems that do not fail the check (unknown advertised names, ...).
    pub warnings: Vec<String>,
}

impl CheckReport {
    /// Every scenario passed or was skipped, and no advertised method lied.
    pub fn passed(&self) -> bool {
        self.lying_methods.is_empty()
            && !self.scenarios.is_empty()
            && self
                .scenarios
                .iter()
                .all(|s| !matches!(s.status, ScenarioStatus::Failed(_)))
    }

    /// The scenario with this name.
    pub fn scenario(&self, name: &str) -> Option<&ScenarioOutcome> {
        self.scenarios.iter().find(|s| s.name == name)
    }

    pub fn failed_scenarios(&self) -> impl Iterator<Item = &ScenarioOutcome> {
        self.scenarios
            .iter()
            .filter(|s| matches!(s.status, ScenarioStatus::Failed(_)))
    }

    /// The machine form (`--json`).
    pub fn to_json(&self) -> Value {
        let scenarios: Vec<Value> = self
            .scenarios
            .iter()
            .map(|s| {
                let mut o = Map::new();
                o.insert("name".into(), Value::String(s.name.clone()));
                o.insert("status".into(), Value::String(s.status.as_str().into()));
                if let Some(r) = s.status.reason() {
                    o.insert("reason".into(), Value::String(r.into()));
                }
                o.insert("methods".into(), json!(s.methods));
                o.insert("notes".into(), json!(s.notes));
                Value::Object(o)
            })
            .collect();
        let lying: Vec<Value> = self
            .lying_methods
            .iter()
            .map(|(m, why)| json!({"method": m, "reason": why}))
            .collect();
        json!({
            "pluginId": self.plugin_id,
            "driverKey": self.driver_key,
            "passed": self.passed(),
            "advertisedMethods": self.advertised_methods,
            "exercisedMethods": self.exercised_methods.iter().collect::<Vec<_>>(),
            "lyingMethods": lying,
            "warnings": self.warnings,
            "scenarios": scenarios,
        })
    }

    /// The human form: one line per scenario, then warnings and lying methods.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "plugin {} driver {}",
            self.plugin_id,
            self.driver_key.as_deref().unwrap_or("(none)")
        );
        for s in &self.scenarios {
            let tag = match s.status {
                ScenarioStatus::Passed => "PASS",
                ScenarioStatus::Failed(_) => "FAIL",
                ScenarioStatus::Skipped(_) => "SKIP",
            };
            let _ = write!(out, "  {tag}  {}", s.name);
            if let Some(r) = s.status.reason() {
                let _ = write!(out, ": {r}");
            }
            if !s.methods.is_empty() {
                let _ = write!(out, "  [{}]", s.methods.join(", "));
            }
            out.push('\n');
            for n in &s.notes {
                let _ = writeln!(out, "        note: {n}");
            }
        }
        if !self.lying_methods.is_empty() {
            out.push_str("advertised but not implemented:\n");
            for (m, why) in &self.lying_methods {
                let _ = writeln!(out, "  - {m}: {why}");
            }
        }
        if !self.warnings.is_empty() {
            out.push_str("warnings:\n");
            for w in &self.warnings {
                let _ = writeln!(out, "  - {w}");
            }
        }
        let count = |k: &str| {
            self.scenarios
                .iter()
                .filter(|s| s.status.as_str() == k)
                .count()
        };
        let _ = writeln!(
            out,
            "result: {} ({} passed, {} failed, {} skipped)",
            if self.passed() { "PASS" } else { "FAIL" },
            count("passed"),
            count("failed"),
            count("skipped")
        );
        out
    }
}

/// Run the conformance suite against a live worker of `plugin`.
pub async fn check_plugin(plugin: &Plugin, opts: &CheckOptions) -> CheckReport {
    let mut report = CheckReport {
        plugin_id: plugin.manifest.id.clone(),
        driver_key: None,
        advertised_methods: vec![],
        scenarios: vec![],
        exercised_methods: BTreeSet::new(),
        lying_methods: BTreeMap::new(),
        warnings: vec![],
    };
    let driver = match &opts.driver_key {
        Some(key) => plugin.manifest.driver(key),
        None => plugin
            .manifest
            .environment_drivers
            .iter()
            .find(|d| d.kind == DriverKind::SandboxProvider),
    };
    let Some(driver) = driver else {
        let reason = match &opts.driver_key {
            Some(key) => format!("the plugin declares no driver `{key}`"),
            None => "the plugin declares no sandbox_provider driver".to_string(),
        };
        report.scenarios.push(ScenarioOutcome {
            name: "driver".into(),
            status: ScenarioStatus::Failed(reason),
            methods: vec![],
            notes: vec![],
        });
        return report;
    };
    if driver.kind != DriverKind::SandboxProvider {
        report.warnings.push(format!(
            "driver `{}` has kind `{}`, not sandbox_provider",
            driver.driver_key,
            driver.kind.as_str()
        ));
    }
    report.driver_key = Some(driver.driver_key.clone());
    let host = match HostDir::create() {
        Ok(h) => h,
        Err(e) => {
            report.scenarios.push(ScenarioOutcome {
                name: "host scratch directory".into(),
                status: ScenarioStatus::Failed(format!("cannot create a host temp dir: {e}")),
                methods: vec![],
                notes: vec![],
            });
            return report;
        }
    };
    let nonce = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let scope = EnvironmentScope {
        driver_key: driver.driver_key.clone(),
        company_id: CHECK_COMPANY_ID.into(),
        environment_id: format!("check-{nonce}"),
        issue_id: None,
        config: opts.config.clone().unwrap_or_else(|| json!({})),
    };
    let mut checker = Checker {
        plugin,
        opts,
        scope,
        declared: driver.declared.clone(),
        nonce,
        host,
        worker: None,
        advertised: BTreeSet::new(),
        lease: None,
        runs: 0,
        trace: Mutex::new(Vec::new()),
        exercised: Mutex::new(BTreeSet::new()),
        lying: Mutex::new(BTreeMap::new()),
        scenarios: vec![],
        warnings: vec![],
    };
    checker.run().await;
    report.advertised_methods = checker.advertised.iter().cloned().collect();
    report.scenarios = checker.scenarios;
    report.exercised_methods = checker.exercised.into_inner().unwrap_or_default();
    report.lying_methods = checker.lying.into_inner().unwrap_or_default();
    report.warnings.extend(checker.warnings);
    report
}

// ---------------------------------------------------------------- host scratch

/// A host temp dir for sync sources and targets, removed on drop.
#[derive(Debug)]
struct HostDir {
    path: PathBuf,
}

impl HostDir {
    fn create() -> std::io::Result<Self> {
        let path =
            std::env::temp_dir().join(format!("sandhost-check-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700))?;
        Ok(Self { path })
    }

    fn join(&self, rel: &str) -> PathBuf {
        self.path.join(rel)
    }
}

impl Drop for HostDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<(), String> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    std::fs::write(path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot chmod {}: {e}", path.display()))
}

fn host_mode(path: &Path) -> Result<u32, String> {
    std::fs::symlink_metadata(path)
        .map(|m| m.permissions().mode() & 0o7777)
        .map_err(|e| format!("cannot stat {}: {e}", path.display()))
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Every regular file under `root`, relative, with its bytes and mode.
fn snapshot_tree(root: &Path) -> Result<BTreeMap<String, (Vec<u8>, u32)>, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let entries =
            std::fs::read_dir(&dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path)
                .map_err(|e| format!("cannot stat {}: {e}", path.display()))?;
            let rel = path
                .strip_prefix(root)
                .map(path_str)
                .unwrap_or_else(|_| path_str(&path));
            if meta.is_dir() {
                out.insert(
                    format!("{rel}/"),
                    (vec![], meta.permissions().mode() & 0o7777),
                );
                stack.push(path);
            } else {
                let bytes = std::fs::read(&path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                out.insert(rel, (bytes, meta.permissions().mode() & 0o7777));
            }
        }
    }
    Ok(out)
}

/// The permission bits of an `ls -l` mode string such as `-rwxr-x---`.
fn parse_ls_mode(s: &str) -> Option<u32> {
    let chars: Vec<char> = s.chars().collect();
    if chars.len() < 10 {
        return None;
    }
    let mut mode = 0u32;
    for (i, c) in chars[1..10].iter().enumerate() {
        let bit = 1u32 << (8 - i);
        let set = match (i % 3, c) {
            (_, '-') => false,
            (0, 'r') | (1, 'w') | (2, 'x') => true,
            (2, 's' | 't') => true,
            (2, 'S' | 'T') => false,
            _ => return None,
        };
        if set {
            mode |= bit;
        }
    }
    Some(mode)
}

/// Quote for a POSIX shell.
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

// ---------------------------------------------------------------- checker

type Outcome = Result<(), String>;

/// What a failed call means for the suite.
#[derive(Debug)]
struct CallFailure {
    error: Box<WorkerError>,
}

impl std::fmt::Display for CallFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.error, self.error.code())
    }
}

impl CallFailure {
    /// An ordinary refusal (an RPC error other than "not implemented").
    fn is_refusal(&self) -> bool {
        matches!(&*self.error, WorkerError::Rpc(f) if f.code != -32601)
    }
}

struct Checker<'a> {
    plugin: &'a Plugin,
    opts: &'a CheckOptions,
    scope: EnvironmentScope,
    declared: DeclaredCapabilities,
    nonce: String,
    host: HostDir,
    worker: Option<Worker>,
    advertised: BTreeSet<String>,
    /// The lease the execute and sync scenarios share.
    lease: Option<Lease>,
    runs: u32,
    /// Methods called by the current scenario.
    trace: Mutex<Vec<String>>,
    exercised: Mutex<BTreeSet<String>>,
    lying: Mutex<BTreeMap<String, String>>,
    scenarios: Vec<ScenarioOutcome>,
    warnings: Vec<String>,
}

/// The notes a scenario collects while it runs.
#[derive(Debug, Default)]
struct Notes(Vec<String>);

impl Notes {
    fn add(&mut self, note: impl Into<String>) {
        self.0.push(note.into());
    }
}

impl Checker<'_> {
    fn advertises(&self, m: Method) -> bool {
        self.advertised.contains(m.as_str())
    }

    fn declared(&self, cap: ProviderCapability) -> Declared {
        self.declared.value(cap)
    }

    fn record(&self, name: impl Into<String>, status: ScenarioStatus, notes: Notes) -> Finished {
        Finished {
            name: name.into(),
            status,
            notes: notes.0,
        }
    }

    fn push(&mut self, o: Finished) {
        let methods = std::mem::take(&mut *self.trace.lock().unwrap());
        match &o.status {
            ScenarioStatus::Passed => tracing::info!(scenario = %o.name, "passed"),
            ScenarioStatus::Failed(r) => tracing::warn!(scenario = %o.name, "failed: {r}"),
            ScenarioStatus::Skipped(r) => tracing::info!(scenario = %o.name, "skipped: {r}"),
        }
        self.scenarios.push(ScenarioOutcome {
            name: o.name,
            status: o.status,
            methods,
            notes: o.notes,
        });
    }

    fn skip(&mut self, name: &str, reason: impl Into<String>) {
        let o = self.record(
            name,
            ScenarioStatus::Skipped(reason.into()),
            Notes::default(),
        );
        self.push(o);
    }

    fn note_call(&self, method: &str) {
        let mut t = self.trace.lock().unwrap();
        if !t.iter().any(|m| m == method) {
            t.push(method.to_string());
        }
        self.exercised.lock().unwrap().insert(method.to_string());
    }

    /// Record an advertised method that failed in a way only a missing or
    /// broken implementation explains.
    fn classify(&self, method: &str, e: &WorkerError) {
        if !self.advertised.contains(method) {
            return;
        }
        let why = match e {
            WorkerError::NotImplemented { .. } => {
                "advertised but answered -32004 (method not implemented)".to_string()
            }
            WorkerError::Rpc(f) if f.code == -32601 => {
                "advertised but answered -32601 (method not found)".to_string()
            }
            WorkerError::Crashed { .. } => format!("the worker crashed on it: {e}"),
            WorkerError::ProtocolViolation { .. } => format!("it broke the protocol: {e}"),
            WorkerError::Timeout { .. } => format!("it did not answer: {e}"),
            WorkerError::BadResult { .. } => format!("it answered a malformed result: {e}"),
            _ => return,
        };
        self.lying
            .lock()
            .unwrap()
            .entry(method.to_string())
            .or_insert(why);
    }

    fn live_worker(&self) -> Result<&Worker, CallFailure> {
        self.worker.as_ref().ok_or_else(|| CallFailure {
            error: Box::new(WorkerError::Crashed {
                status: "not running".into(),
                stderr_tail: String::new(),
            }),
        })
    }

    async fn call<M: RpcMethod>(&self, params: &M::Params) -> Result<M::Result, CallFailure> {
        let method = M::METHOD.as_str();
        self.note_call(method);
        let worker = self.live_worker()?;
        let r = worker
            .call_with_timeout::<M>(params, self.opts.call_timeout)
            .await;
        r.map_err(|error| {
            self.classify(method, &error);
            CallFailure {
                error: Box::new(error),
            }
        })
    }

    async fn execute_logged(
        &self,
        params: &ExecuteParams,
        timeout: Duration,
        on_log: impl FnMut(ExecuteLogParams) + Send,
    ) -> Result<ExecuteResult, CallFailure> {
        let method = Method::EnvironmentExecute.as_str();
        self.note_call(method);
        let worker = self.live_worker()?;
        worker
            .execute(params, timeout, on_log)
            .await
            .map_err(|error| {
                self.classify(method, &error);
                CallFailure {
                    error: Box::new(error),
                }
            })
    }

    fn exec_params(&self, lease: &Lease, script: &str) -> ExecuteParams {
        ExecuteParams {
            scope: self.scope.clone(),
            lease: lease.clone(),
            command: "sh".into(),
            args: Some(vec!["-c".into(), script.into()]),
            cwd: None,
            env: None,
            stdin: None,
            timeout_ms: Some(self.opts.call_timeout.as_millis() as u64),
            bypass_session: None,
        }
    }

    /// Run `sh -c script` in the lease.
    async fn sh(&self, lease: &Lease, script: &str) -> Result<ExecuteResult, String> {
        self.execute_logged(
            &self.exec_params(lease, script),
            self.opts.call_timeout,
            |_| {},
        )
        .await
        .map_err(|e| format!("environmentExecute of `{script}` failed: {e}"))
    }

    /// Run `sh -c script` and require exit 0; its stdout.
    async fn sh_ok(&self, lease: &Lease, script: &str) -> Result<String, String> {
        let r = self.sh(lease, script).await?;
        if r.exit_code != Some(0) {
            return Err(format!(
                "`{script}` exited {:?}: {}",
                r.exit_code,
                r.stderr.trim()
            ));
        }
        Ok(r.stdout)
    }

    fn sync_params(&self, lease: &Lease, op: &str, files: Vec<FileMapping>) -> SyncParams {
        SyncParams {
            scope: self.scope.clone(),
            lease: lease.clone(),
            operations: vec![SyncOperation {
                operation_id: format!("{op}-{}", self.nonce),
                files,
                post_upload_commands: None,
            }],
        }
    }

    fn lease_end(&self, id: &str) -> LeaseEndParams {
        LeaseEndParams {
            scope: self.scope.clone(),
            provider_lease_id: id.to_string(),
            lease_metadata: None,
            cancel_active_work: None,
        }
    }

    fn resume_params(&self, id: &str) -> ResumeLeaseParams {
        ResumeLeaseParams {
            scope: self.scope.clone(),
            provider_lease_id: id.to_string(),
            lease_metadata: None,
        }
    }

    // ------------------------------------------------------------ worker lifecycle

    async fn spawn(&mut self) -> Result<(), WorkerError> {
        let worker = Worker::spawn(&self.plugin.worker_spec(), self.opts.worker.clone()).await?;
        self.advertised = worker.supported_methods().clone();
        self.worker = Some(worker);
        Ok(())
    }

    /// Restart a worker that died in an earlier scenario.
    async fn ensure_worker(&mut self, notes: &mut Notes) -> bool {
        let dead = match &self.worker {
            Some(w) => w.has_exited() || w.dead_reason().is_some(),
            None => true,
        };
        if !dead {
            return true;
        }
        self.lease = None;
        if let Some(w) = self.worker.take() {
            w.kill();
        }
        match Worker::spawn(&self.plugin.worker_spec(), self.opts.worker.clone()).await {
            Ok(w) => {
                notes.add("the worker had died; restarted it");
                self.worker = Some(w);
                true
            }
            Err(e) => {
                notes.add(format!("cannot restart the worker: {e}"));
                false
            }
        }
    }

    /// The shared lease: acquire one when none is held.
    async fn ensure_lease(&mut self, notes: &mut Notes) -> Result<Lease, String> {
        if !self.ensure_worker(notes).await {
            return Err("the worker is not running".into());
        }
        if let Some(l) = &self.lease {
            return Ok(l.clone());
        }
        let lease = self.acquire().await?;
        self.lease = Some(lease.clone());
        Ok(lease)
    }

    async fn acquire(&mut self) -> Result<Lease, String> {
        if !self.advertises(Method::EnvironmentAcquireLease) {
            // Nothing to acquire with: a lease without id is all there is.
            return Ok(Lease {
                provider_lease_id: None,
                metadata: None,
                expires_at: None,
            });
        }
        self.runs += 1;
        let params = AcquireLeaseParams {
            scope: self.scope.clone(),
            run_id: format!("sandhost-check-run-{}-{}", self.nonce, self.runs),
            requested_cwd: None,
            agent_id: None,
            requested_expires_at: None,
        };
        let lease = self
            .call::<methods::AcquireLease>(&params)
            .await
            .map_err(|e| format!("environmentAcquireLease failed: {e}"))?;
        match lease.provider_lease_id.as_deref() {
            None | Some("") => Err("environmentAcquireLease answered no providerLeaseId".into()),
            Some(_) => Ok(lease),
        }
    }

    async fn run(&mut self) {
        if !self.handshake().await {
            return;
        }
        self.health().await;
        self.validate_config().await;
        self.probe().await;
        self.acquire_scenario().await;
        self.realize_workspace().await;
        self.execute_scenarios().await;
        self.execute_log().await;
        self.sync_scenarios().await;
        self.duplex().await;
        self.resume().await;
        self.release().await;
        self.destroy().await;
        self.coverage().await;
        self.cleanup().await;
        self.shutdown().await;
    }

    // ------------------------------------------------------------ scenarios

    async fn handshake(&mut self) -> bool {
        self.note_call(Initialize::METHOD.as_str());
        let mut notes = Notes::default();
        if let Err(e) = self.spawn().await {
            let o = self.record(
                "handshake",
                ScenarioStatus::Failed(format!("{e} ({})", e.code())),
                notes,
            );
            self.push(o);
            return false;
        }
        let mut unknown = vec![];
        for name in &self.advertised {
            match Method::from_name(name) {
                None => unknown.push(name.clone()),
                Some(m) if m.kind() == MethodKind::Notification => self.warnings.push(format!(
                    "supportedMethods lists `{name}`, a notification, not a method"
                )),
                Some(_) => {}
            }
        }
        for name in unknown {
            self.warnings.push(format!(
                "supportedMethods lists `{name}`, not a protocol method"
            ));
        }
        for m in [Method::Health, Method::Shutdown] {
            if !self.advertises(m) {
                notes.add(format!(
                    "`{m}` is required but not listed in supportedMethods"
                ));
            }
        }
        for cap in ProviderCapability::ALL {
            if self.declared(cap) != Declared::True {
                continue;
            }
            let missing = sandhost_contract::prerequisites::missing_methods(cap, &self.advertised);
            if !missing.is_empty() {
                self.warnings.push(format!(
                    "driver declares {cap} but the worker does not advertise {}; it will never be effective",
                    missing.join(", ")
                ));
            }
        }
        let in_adv = self.advertises(Method::EnvironmentSyncIn);
        let out_adv = self.advertises(Method::EnvironmentSyncOut);
        if in_adv != out_adv {
            self.warnings.push(
                "the worker advertises only one of environmentSyncIn / environmentSyncOut; the contract wants both or neither".into(),
            );
        }
        let status = if self.advertised.is_empty() {
            ScenarioStatus::Failed(
                "initialize answered no supportedMethods: the host verifies nothing".into(),
            )
        } else {
            ScenarioStatus::Passed
        };
        let o = self.record("handshake", status, notes);
        self.push(o);
        true
    }

    async fn health(&mut self) {
        let notes = Notes::default();
        let status = match self.call::<methods::Health>(&EmptyParams {}).await {
            Ok(h) => match h.status {
                HealthStatus::Ok | HealthStatus::Degraded => ScenarioStatus::Passed,
                other => ScenarioStatus::Failed(format!(
                    "health status {other:?}: {}",
                    h.message.unwrap_or_default()
                )),
            },
            Err(e) => ScenarioStatus::Failed(format!("health failed: {e}")),
        };
        let o = self.record("health", status, notes);
        self.push(o);
    }

    async fn validate_config(&mut self) {
        const NAME: &str = "validate config";
        if !self.advertises(Method::EnvironmentValidateConfig) {
            return self.skip(NAME, "environmentValidateConfig is not advertised");
        }
        let mut notes = Notes::default();
        self.ensure_worker(&mut notes).await;
        let params = ValidateConfigParams {
            driver_key: self.scope.driver_key.clone(),
            config: self.scope.config.clone(),
        };
        let status = match self.call::<methods::ValidateConfig>(&params).await {
            Err(e) => ScenarioStatus::Failed(format!("environmentValidateConfig failed: {e}")),
            Ok(r) if r.ok && !r.errors.is_empty() => ScenarioStatus::Failed(format!(
                "answered ok: true with errors: {}",
                r.errors.join("; ")
            )),
            Ok(r) if !r.ok && r.errors.is_empty() => {
                ScenarioStatus::Failed("answered ok: false without any error".into())
            }
            Ok(r) if !r.ok => ScenarioStatus::Failed(format!(
                "the check config is rejected: {}",
                r.errors.join("; ")
            )),
            Ok(r) => {
                for w in r.warnings {
                    notes.add(format!("config warning: {w}"));
                }
                ScenarioStatus::Passed
            }
        };
        let o = self.record(NAME, status, notes);
        self.push(o);
    }

    async fn probe(&mut self) {
        const NAME: &str = "probe";
        if !self.advertises(Method::EnvironmentProbe) {
            return self.skip(NAME, "environmentProbe is not advertised");
        }
        let mut notes = Notes::default();
        self.ensure_worker(&mut notes).await;
        let params = ProbeParams {
            scope: self.scope.clone(),
        };
        let status = match self.call::<methods::Probe>(&params).await {
            Err(e) => ScenarioStatus::Failed(format!("environmentProbe failed: {e}")),
            Ok(r) => {
                let blank = r.diagnostics.iter().any(|d| d.message.trim().is_empty());
                let has_error = r
                    .diagnostics
                    .iter()
                    .any(|d| d.severity == sandhost_protocol::Severity::Error);
                if blank {
                    ScenarioStatus::Failed("a diagnostic has an empty message".into())
                } else if !r.ok && !has_error {
                    ScenarioStatus::Failed(
                        "answered ok: false without an error diagnostic saying why".into(),
                    )
                } else {
                    if !r.ok {
                        notes.add(format!(
                            "probe reports the environment unusable: {}",
                            r.summary.unwrap_or_default()
                        ));
                    }
                    ScenarioStatus::Passed
                }
            }
        };
        let o = self.record(NAME, status, notes);
        self.push(o);
    }

    async fn acquire_scenario(&mut self) {
        const NAME: &str = "acquire lease";
        if !self.advertises(Method::EnvironmentAcquireLease) {
            return self.skip(NAME, "environmentAcquireLease is not advertised");
        }
        let mut notes = Notes::default();
        let status = match self.ensure_lease(&mut notes).await {
            Err(e) => ScenarioStatus::Failed(e),
            Ok(lease) => match lease.expires_at.as_deref() {
                Some(t) if !looks_like_iso8601(t) => {
                    ScenarioStatus::Failed(format!("expiresAt `{t}` is not an ISO-8601 timestamp"))
                }
                _ => ScenarioStatus::Passed,
            },
        };
        let o = self.record(NAME, status, notes);
        self.push(o);
    }

    async fn realize_workspace(&mut self) {
        const NAME: &str = "realize workspace";
        if !self.advertises(Method::EnvironmentRealizeWorkspace) {
            return self.skip(NAME, "environmentRealizeWorkspace is not advertised");
        }
        let mut notes = Notes::default();
        let status = match self.realize_inner(&mut notes).await {
            Ok(()) => ScenarioStatus::Passed,
            Err(e) => ScenarioStatus::Failed(e),
        };
        let o = self.record(NAME, status, notes);
        self.push(o);
    }

    async fn realize_inner(&mut self, notes: &mut Notes) -> Outcome {
        let lease = self.ensure_lease(notes).await?;
        let local = self.host.join("workspace");
        std::fs::create_dir_all(&local).map_err(|e| format!("cannot create workspace: {e}"))?;
        let params = sandhost_protocol::RealizeWorkspaceParams {
            scope: self.scope.clone(),
            lease: lease.clone(),
            workspace: sandhost_protocol::Workspace {
                local_path: Some(path_str(&local)),
                remote_path: None,
                mode: None,
            },
        };
        let r = self
            .call::<methods::RealizeWorkspace>(&params)
            .await
            .map_err(|e| format!("environmentRealizeWorkspace failed: {e}"))?;
        if r.cwd.trim().is_empty() {
            return Err("answered an empty cwd".into());
        }
        notes.add(format!("workspace cwd: {}", r.cwd));
        Ok(())
    }

    async fn execute_scenarios(&mut self) {
        let names = [
            "execute: exit code",
            "execute: stdout and stderr separated",
            "execute: stdin delivered",
            "execute: env and cwd honoured",
            "execute: timeout",
        ];
        if !self.advertises(Method::EnvironmentExecute) {
            for n in names {
                self.skip(n, "environmentExecute is not advertised");
            }
            return;
        }
        for (i, name) in names.into_iter().enumerate() {
            let mut notes = Notes::default();
            let status = match self.ensure_lease(&mut notes).await {
                Err(e) => ScenarioStatus::Failed(format!("no lease to execute in: {e}")),
                Ok(lease) => {
                    let r = match i {
                        0 => self.exec_exit_code(&lease).await,
                        1 => self.exec_streams(&lease).await,
                        2 => self.exec_stdin(&lease).await,
                        3 => self.exec_env_cwd(&lease).await,
                        _ => self.exec_timeout(&lease, &mut notes).await,
                    };
                    match r {
                        Ok(()) => ScenarioStatus::Passed,
                        Err(e) => ScenarioStatus::Failed(e),
                    }
                }
            };
            let o = self.record(name, status, notes);
            self.push(o);
        }
    }

    async fn exec_exit_code(&self, lease: &Lease) -> Outcome {
        let r = self.sh(lease, "exit 3").await?;
        if r.exit_code != Some(3) {
            return Err(format!(
                "`sh -c 'exit 3'` answered exitCode {:?}",
                r.exit_code
            ));
        }
        if r.timed_out {
            return Err("a command that exited at once is reported timedOut".into());
        }
        let r = self.sh(lease, "true").await?;
        if r.exit_code != Some(0) {
            return Err(format!("`sh -c true` answered exitCode {:?}", r.exit_code));
        }
        Ok(())
    }

    async fn exec_streams(&self, lease: &Lease) -> Outcome {
        let r = self
            .sh(lease, "printf 'to-stdout\\n'; printf 'to-stderr\\n' >&2")
            .await?;
        if r.stdout != "to-stdout\n" || r.stderr != "to-stderr\n" {
            return Err(format!(
                "expected stdout \"to-stdout\\n\" and stderr \"to-stderr\\n\", got stdout {:?} and stderr {:?}",
                r.stdout, r.stderr
            ));
        }
        Ok(())
    }

    async fn exec_stdin(&self, lease: &Lease) -> Outcome {
        let input = "line one\nline 'two' with $dollar\n";
        let mut params = self.exec_params(lease, "cat");
        params.stdin = Some(input.into());
        let r = self
            .execute_logged(&params, self.opts.call_timeout, |_| {})
            .await
            .map_err(|e| format!("environmentExecute failed: {e}"))?;
        if r.stdout != input || r.exit_code != Some(0) {
            return Err(format!(
                "`cat` with stdin {input:?} answered exitCode {:?} stdout {:?}",
                r.exit_code, r.stdout
            ));
        }
        Ok(())
    }

    async fn exec_env_cwd(&self, lease: &Lease) -> Outcome {
        let value = "value with spaces and 'quotes'";
        let mut params = self.exec_params(lease, "printf '%s' \"$SANDHOST_CHECK_VAR\"");
        params.env = Some(BTreeMap::from([(
            "SANDHOST_CHECK_VAR".to_string(),
            value.to_string(),
        )]));
        let r = self
            .execute_logged(&params, self.opts.call_timeout, |_| {})
            .await
            .map_err(|e| format!("environmentExecute failed: {e}"))?;
        if r.stdout != value {
            return Err(format!(
                "env SANDHOST_CHECK_VAR={value:?} was not honoured: the command printed {:?}",
                r.stdout
            ));
        }
        let dir = format!("{CHECK_DIR}/cwd");
        let marker = format!("marker-{}", self.nonce);
        self.sh_ok(
            lease,
            &format!(
                "mkdir -p {d} && printf '%s' {m} > {d}/marker",
                d = sh_quote(&dir),
                m = sh_quote(&marker)
            ),
        )
        .await?;
        let mut params = self.exec_params(lease, "cat marker");
        params.cwd = Some(dir.clone());
        let r = self
            .execute_logged(&params, self.opts.call_timeout, |_| {})
            .await
            .map_err(|e| format!("environmentExecute with cwd `{dir}` failed: {e}"))?;
        if r.exit_code != Some(0) || r.stdout != marker {
            return Err(format!(
                "cwd `{dir}` was not honoured: `cat marker` answered exitCode {:?} stdout {:?} stderr {:?}",
                r.exit_code,
                r.stdout,
                r.stderr.trim()
            ));
        }
        Ok(())
    }

    async fn exec_timeout(&self, lease: &Lease, notes: &mut Notes) -> Outcome {
        let mut params = self.exec_params(lease, "sleep 5");
        params.timeout_ms = Some(500);
        let started = Instant::now();
        let r = self
            .execute_logged(&params, Duration::from_secs(15), |_| {})
            .await
            .map_err(|e| format!("environmentExecute with timeoutMs 500 failed: {e}"))?;
        let took = started.elapsed();
        if !r.timed_out {
            return Err(format!(
                "`sleep 5` with timeoutMs 500 answered timedOut false (exitCode {:?})",
                r.exit_code
            ));
        }
        if took >= Duration::from_millis(4500) {
            return Err(format!(
                "`sleep 5` with timeoutMs 500 took {} ms: the command was not stopped at its deadline",
                took.as_millis()
            ));
        }
        if r.exit_code == Some(0) {
            return Err("a timed-out command reported exitCode 0".into());
        }
        notes.add(format!(
            "timed out after {} ms (exitCode {:?}, signal {:?})",
            took.as_millis(),
            r.exit_code,
            r.signal
        ));
        Ok(())
    }

    async fn execute_log(&mut self) {
        const NAME: &str = "execute.log streaming";
        if !self.advertises(Method::EnvironmentExecute) {
            return self.skip(NAME, "environmentExecute is not advertised");
        }
        if self.declared(ProviderCapability::IncrementalSessionOutput) != Declared::True {
            return self.skip(NAME, "the driver does not declare incrementalSessionOutput");
        }
        let mut notes = Notes::default();
        let status = match self.ensure_lease(&mut notes).await {
            Err(e) => ScenarioStatus::Failed(format!("no lease to execute in: {e}")),
            Ok(lease) => match self.execute_log_inner(&lease, &mut notes).await {
                Ok(()) => ScenarioStatus::Passed,
                Err(e) => ScenarioStatus::Failed(e),
            },
        };
        let o = self.record(NAME, status, notes);
        self.push(o);
    }

    async fn execute_log_inner(&self, lease: &Lease, notes: &mut Notes) -> Outcome {
        let params = self.exec_params(
            lease,
            "printf 'first\\n'; printf 'err-first\\n' >&2; sleep 1; printf 'second\\n'",
        );
        let chunks: Mutex<Vec<(Instant, ExecuteLogParams)>> = Mutex::new(Vec::new());
        let r = self
            .execute_logged(&params, self.opts.call_timeout, |c| {
                chunks.lock().unwrap().push((Instant::now(), c))
            })
            .await
            .map_err(|e| format!("environmentExecute failed: {e}"))?;
        let done = Instant::now();
        let chunks = chunks.into_inner().unwrap_or_default();
        let joined = |s: LogStream| -> String {
            chunks
                .iter()
                .filter(|(_, c)| c.stream == s)
                .map(|(_, c)| c.chunk.as_str())
                .collect()
        };
        if chunks.is_empty() {
            return Err("declares incrementalSessionOutput but sent no execute.log chunk".into());
        }
        let out = joined(LogStream::Stdout);
        if out != r.stdout {
            return Err(format!(
                "the stdout chunks concatenate to {out:?} but the result's stdout is {:?}",
                r.stdout
            ));
        }
        let err = joined(LogStream::Stderr);
        if err != r.stderr {
            return Err(format!(
                "the stderr chunks concatenate to {err:?} but the result's stderr is {:?}",
                r.stderr
            ));
        }
        let first = chunks[0].0;
        let lead = done.saturating_duration_since(first);
        if lead < Duration::from_millis(400) {
            return Err(format!(
                "the first chunk arrived only {} ms before the result of a command that sleeps 1 s: output is not incremental",
                lead.as_millis()
            ));
        }
        notes.add(format!(
            "{} chunks; the first arrived {} ms before the result",
            chunks.len(),
            lead.as_millis()
        ));
        Ok(())
    }

    // ------------------------------------------------------------ sync

    async fn sync_scenarios(&mut self) {
        let names = [
            "sync: round trip",
            "sync: atomic replace",
            "sync: path confinement",
        ];
        let in_adv = self.advertises(Method::EnvironmentSyncIn);
        let out_adv = self.advertises(Method::EnvironmentSyncOut);
        if !in_adv && !out_adv {
            for n in names {
                self.skip(
                    n,
                    "environmentSyncIn / environmentSyncOut are not advertised",
                );
            }
            return;
        }
        if in_adv != out_adv {
            // Exercise the lone method, and fail the pairing rule.
            let mut notes = Notes::default();
            let status = match self.lone_sync(in_adv, &mut notes).await {
                Ok(()) => ScenarioStatus::Failed(
                    "only one native sync direction is advertised; the contract requires both or neither".into(),
                ),
                Err(e) => ScenarioStatus::Failed(e),
            };
            let o = self.record("sync: pair", status, notes);
            self.push(o);
            return;
        }
        for (i, name) in names.into_iter().enumerate() {
            let mut notes = Notes::default();
            let status = match self.ensure_lease(&mut notes).await {
                Err(e) => ScenarioStatus::Failed(format!("no lease to sync with: {e}")),
                Ok(lease) => {
                    let r = match i {
                        0 => self.sync_round_trip(&lease, &mut notes).await,
                        1 => self.sync_atomic(&lease, &mut notes).await,
                        _ => self.sync_confinement(&lease, &mut notes).await,
                    };
                    match r {
                        Ok(()) => ScenarioStatus::Passed,
                        Err(e) => ScenarioStatus::Failed(e),
                    }
                }
            };
            let o = self.record(name, status, notes);
            self.push(o);
        }
    }

    async fn lone_sync(&mut self, sync_in: bool, notes: &mut Notes) -> Outcome {
        let lease = self.ensure_lease(notes).await?;
        let src = self.host.join("lone/in.txt");
        write_file(&src, b"lone\n", 0o644)?;
        if sync_in {
            let p = self.sync_params(
                &lease,
                "lone-in",
                vec![mapping(
                    &path_str(&src),
                    &format!("{CHECK_DIR}/lone.txt"),
                    FileKind::File,
                )],
            );
            self.call::<methods::SyncIn>(&p)
                .await
                .map_err(|e| format!("environmentSyncIn failed: {e}"))?;
        } else {
            if self.advertises(Method::EnvironmentExecute) {
                self.sh_ok(
                    &lease,
                    &format!("mkdir -p {CHECK_DIR} && printf 'lone\\n' > {CHECK_DIR}/lone.txt"),
                )
                .await?;
            }
            let dst = self.host.join("lone/out.txt");
            let p = self.sync_params(
                &lease,
                "lone-out",
                vec![mapping(
                    &format!("{CHECK_DIR}/lone.txt"),
                    &path_str(&dst),
                    FileKind::File,
                )],
            );
            self.call::<methods::SyncOut>(&p)
                .await
                .map_err(|e| format!("environmentSyncOut failed: {e}"))?;
        }
        Ok(())
    }

    fn check_sync_result(&self, p: &SyncParams, r: &SyncResult, what: &str) -> Outcome {
        let want: Vec<&str> = p
            .operations
            .iter()
            .map(|o| o.operation_id.as_str())
            .collect();
        let got: Vec<&str> = r
            .operations
            .iter()
            .map(|o| o.operation_id.as_str())
            .collect();
        if want != got {
            return Err(format!(
                "{what} answered operations {got:?} for operations {want:?}"
            ));
        }
        Ok(())
    }

    async fn sync_in(
        &self,
        lease: &Lease,
        op: &str,
        files: Vec<FileMapping>,
    ) -> Result<SyncResult, CallFailure> {
        let p = self.sync_params(lease, op, files);
        self.call::<methods::SyncIn>(&p).await
    }

    async fn sync_out(
        &self,
        lease: &Lease,
        op: &str,
        files: Vec<FileMapping>,
    ) -> Result<SyncResult, CallFailure> {
        let p = self.sync_params(lease, op, files);
        self.call::<methods::SyncOut>(&p).await
    }

    async fn sync_round_trip(&self, lease: &Lease, notes: &mut Notes) -> Outcome {
        let up = self.host.join("up");
        let file_bytes: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        write_file(&up.join("blob.bin"), &file_bytes, 0o644)?;
        let tree = up.join("tree");
        write_file(&tree.join("plain.txt"), b"plain text\n", 0o644)?;
        write_file(&tree.join("sub/run.sh"), b"#!/bin/sh\necho run\n", 0o755)?;
        write_file(&tree.join("sub/private.txt"), b"private\n", 0o600)?;
        write_file(&tree.join("sub/deeper/empty"), b"", 0o640)?;

        let remote_file = format!("{CHECK_DIR}/blob.bin");
        let remote_tree = format!("{CHECK_DIR}/tree");
        let mut blob = mapping(
            &path_str(&up.join("blob.bin")),
            &remote_file,
            FileKind::File,
        );
        blob.mode = Some(FileMode(0o640));
        let files = vec![
            blob,
            mapping(&path_str(&tree), &remote_tree, FileKind::Directory),
        ];
        let p = self.sync_params(lease, "round-trip-in", files.clone());
        let r = self
            .call::<methods::SyncIn>(&p)
            .await
            .map_err(|e| format!("environmentSyncIn of a file and a directory failed: {e}"))?;
        self.check_sync_result(&p, &r, "environmentSyncIn")?;
        if let Some(op) = r.operations.first() {
            if op.files_transferred == 0 {
                notes.add("environmentSyncIn reports filesTransferred 0");
            }
        }

        if self.advertises(Method::EnvironmentExecute) {
            let ls = self
                .sh_ok(lease, &format!("ls -ln {}", sh_quote(&remote_file)))
                .await?;
            let mode = ls.split_whitespace().next().and_then(parse_ls_mode);
            match mode {
                Some(0o640) => {}
                Some(m) => {
                    return Err(format!(
                        "the file uploaded with mode 0640 has mode {m:04o} in the lease"
                    ))
                }
                None => notes.add(format!("cannot read the mode from `ls -ln`: {}", ls.trim())),
            }
        }

        let down = self.host.join("down");
        std::fs::create_dir_all(&down)
            .map_err(|e| format!("cannot create {}: {e}", down.display()))?;
        let mut blob_back = mapping(
            &remote_file,
            &path_str(&down.join("blob.bin")),
            FileKind::File,
        );
        blob_back.mode = Some(FileMode(0o600));
        let back = vec![
            blob_back,
            mapping(
                &remote_tree,
                &path_str(&down.join("tree")),
                FileKind::Directory,
            ),
        ];
        let p = self.sync_params(lease, "round-trip-out", back);
        let r = self
            .call::<methods::SyncOut>(&p)
            .await
            .map_err(|e| format!("environmentSyncOut of a file and a directory failed: {e}"))?;
        self.check_sync_result(&p, &r, "environmentSyncOut")?;

        let got = std::fs::read(down.join("blob.bin"))
            .map_err(|e| format!("the downloaded file is missing: {e}"))?;
        if got != file_bytes {
            return Err(format!(
                "the file came back with {} bytes differing from the {} uploaded",
                got.len(),
                file_bytes.len()
            ));
        }
        let mode = host_mode(&down.join("blob.bin"))?;
        if mode != 0o600 {
            return Err(format!(
                "the file downloaded with mode 0600 has mode {mode:04o} on the host"
            ));
        }
        let sent = snapshot_tree(&tree)?;
        let came = snapshot_tree(&down.join("tree"))?;
        if sent != came {
            let mut diffs = vec![];
            for (k, (bytes, mode)) in &sent {
                match came.get(k) {
                    None => diffs.push(format!("{k} missing")),
                    Some((b, _)) if b != bytes => diffs.push(format!("{k} content differs")),
                    Some((_, m)) if k.ends_with('/') => {
                        let _ = m; // directory modes are not compared
                    }
                    Some((_, m)) if m != mode => {
                        diffs.push(format!("{k} mode {m:04o}, uploaded {mode:04o}"))
                    }
                    _ => {}
                }
            }
            for k in came.keys().filter(|k| !sent.contains_key(*k)) {
                diffs.push(format!("{k} appeared"));
            }
            if !diffs.is_empty() {
                return Err(format!(
                    "the directory did not survive the round trip: {}",
                    diffs.join(", ")
                ));
            }
        }
        Ok(())
    }

    async fn sync_atomic(&self, lease: &Lease, notes: &mut Notes) -> Outcome {
        const N: usize = 1 << 20;
        let version = |digit: u8| -> Vec<u8> {
            let mut v = Vec::with_capacity(N + 2);
            v.push(b'A');
            v.resize(N + 1, digit);
            v.push(b'Z');
            v
        };
        let old = version(b'1');
        let new = version(b'2');
        let remote = format!("{CHECK_DIR}/atomic/data.bin");
        let old_src = self.host.join("atomic/old.bin");
        let new_src = self.host.join("atomic/new.bin");
        write_file(&old_src, &old, 0o644)?;
        write_file(&new_src, &new, 0o644)?;
        let up = |src: &Path| {
            let mut m = mapping(&path_str(src), &remote, FileKind::File);
            m.mode = Some(FileMode(0o644));
            vec![m]
        };
        self.sync_in(lease, "atomic-old", up(&old_src))
            .await
            .map_err(|e| format!("environmentSyncIn of the first version failed: {e}"))?;

        let exec = self.advertises(Method::EnvironmentExecute);
        let inode = |s: String| s.split_whitespace().next().unwrap_or_default().to_string();
        let before = if exec {
            Some(inode(
                self.sh_ok(lease, &format!("ls -i {}", sh_quote(&remote)))
                    .await?,
            ))
        } else {
            None
        };

        // Read the file over and over while it is replaced: every read must
        // see a whole version (`tr -s` squeezes it to A1Z or A2Z).
        let reader = async {
            if !exec {
                return Ok(String::new());
            }
            let script = format!(
                "i=0; while [ $i -lt 60 ]; do tr -s 12 < {f}; echo; i=$((i+1)); done",
                f = sh_quote(&remote)
            );
            self.sh(lease, &script).await.map(|r| r.stdout)
        };
        let writer = async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            self.sync_in(lease, "atomic-new", up(&new_src)).await
        };
        let (reads, written) = tokio::join!(reader, writer);
        written.map_err(|e| format!("environmentSyncIn over an existing file failed: {e}"))?;
        let reads = reads?;
        let torn: Vec<&str> = reads
            .lines()
            .filter(|l| *l != "A1Z" && *l != "A2Z")
            .collect();
        if let Some(first) = torn.first() {
            return Err(format!(
                "a reader saw a partial file while it was replaced ({} of {} reads, e.g. {first:?})",
                torn.len(),
                reads.lines().count()
            ));
        }

        if exec {
            let after = inode(
                self.sh_ok(lease, &format!("ls -i {}", sh_quote(&remote)))
                    .await?,
            );
            if Some(&after) == before.as_ref() {
                return Err(
                    "the file kept its inode across the replace: it was rewritten in place, not renamed over"
                        .into(),
                );
            }
            let listing = self
                .sh_ok(
                    lease,
                    &format!("ls -A {}", sh_quote(&format!("{CHECK_DIR}/atomic"))),
                )
                .await?;
            let names: Vec<&str> = listing.split_whitespace().collect();
            if names != ["data.bin"] {
                return Err(format!(
                    "the target directory holds {names:?} after the replace: temp files are left behind"
                ));
            }
        }
        let back = self.host.join("atomic/back.bin");
        self.sync_out(
            lease,
            "atomic-back",
            vec![mapping(&remote, &path_str(&back), FileKind::File)],
        )
        .await
        .map_err(|e| format!("environmentSyncOut of the replaced file failed: {e}"))?;
        let got =
            std::fs::read(&back).map_err(|e| format!("the downloaded file is missing: {e}"))?;
        if got != new {
            return Err("the replaced file does not hold the new version".into());
        }
        if !exec {
            notes.add("no environmentExecute: concurrent reads and the inode were not checked");
        }
        Ok(())
    }

    async fn sync_confinement(&self, lease: &Lease, notes: &mut Notes) -> Outcome {
        let exec = self.advertises(Method::EnvironmentExecute);
        let src = self.host.join("confine/payload.txt");
        write_file(&src, b"escaped\n", 0o644)?;
        let src = path_str(&src);
        let n = &self.nonce;

        let mut problems = vec![];
        // (targetPath, host path that must stay absent, lease path that must stay absent)
        let abs_target = self.host.join("confine/absolute-escape.txt");
        let link_target_dir = self.host.join("confine/linked");
        std::fs::create_dir_all(&link_target_dir).map_err(|e| format!("cannot create dir: {e}"))?;
        let mut cases: Vec<(String, Option<PathBuf>, Option<String>)> = vec![
            (
                format!("../sandhost-check-escape-{n}"),
                None,
                Some(format!("../sandhost-check-escape-{n}")),
            ),
            (
                format!("{CHECK_DIR}/../../sandhost-check-escape2-{n}"),
                None,
                Some(format!("../sandhost-check-escape2-{n}")),
            ),
            (path_str(&abs_target), Some(abs_target.clone()), None),
        ];
        if exec {
            // A symlink inside the lease pointing at a host directory.
            self.sh_ok(
                lease,
                &format!(
                    "mkdir -p {CHECK_DIR} && rm -f {CHECK_DIR}/link && ln -s {} {CHECK_DIR}/link",
                    sh_quote(&path_str(&link_target_dir))
                ),
            )
            .await?;
            cases.push((
                format!("{CHECK_DIR}/link/escaped.txt"),
                Some(link_target_dir.join("escaped.txt")),
                None,
            ));
        }
        for (target, host_path, lease_path) in &cases {
            // Accepting an absolute target is no escape by itself: a provider
            // whose lease has its own filesystem (a real sandbox) reads it as
            // a path inside the sandbox. The escape is a write on the host,
            // checked below either way.
            let via_symlink = target.contains("/link/") || target.starts_with('/');
            let r = self
                .sync_in(
                    lease,
                    "confine-in",
                    vec![mapping(&src, target, FileKind::File)],
                )
                .await;
            match r {
                Ok(_) if !via_symlink => {
                    problems.push(format!("environmentSyncIn accepted targetPath `{target}`"))
                }
                Ok(_) => notes.add(format!(
                    "environmentSyncIn accepted `{target}` (inside the lease's own filesystem)"
                )),
                Err(e) if e.is_refusal() => {}
                Err(e) => return Err(format!("environmentSyncIn of targetPath `{target}`: {e}")),
            }
            if let Some(h) = host_path {
                if h.exists() {
                    problems.push(format!("`{target}` wrote {} on the host", h.display()));
                }
            }
            if let (Some(l), true) = (lease_path, exec) {
                let r = self.sh(lease, &format!("test -e {}", sh_quote(l))).await?;
                if r.exit_code == Some(0) {
                    problems.push(format!("`{target}` wrote {l} outside the sync root"));
                }
            }
        }

        // Sync out must not read outside the root either.
        let secret = self.host.join("confine/secret.txt");
        write_file(&secret, b"host secret\n", 0o600)?;
        for source in [
            path_str(&secret),
            format!("../../../../../../../..{}", path_str(&secret)),
        ] {
            let leaked = self
                .host
                .join(&format!("confine/leaked-{}", problems.len()));
            let r = self
                .sync_out(
                    lease,
                    "confine-out",
                    vec![mapping(&source, &path_str(&leaked), FileKind::File)],
                )
                .await;
            match r {
                Ok(_) => {
                    problems.push(format!("environmentSyncOut accepted sourcePath `{source}`"))
                }
                Err(e) if e.is_refusal() => {}
                Err(e) => return Err(format!("environmentSyncOut of sourcePath `{source}`: {e}")),
            }
            if leaked.exists() {
                problems.push(format!(
                    "environmentSyncOut of `{source}` copied a host file out"
                ));
                let _ = std::fs::remove_file(&leaked);
            }
        }
        if !exec {
            notes.add("no environmentExecute: lease-side escapes were not looked for");
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    // ------------------------------------------------------------ duplex

    async fn duplex(&mut self) {
        const NAME: &str = "duplex channels";
        let any = [
            Method::DuplexChannelOpen,
            Method::DuplexChannelWrite,
            Method::DuplexChannelResize,
            Method::DuplexChannelStop,
            Method::DuplexChannelClose,
        ]
        .iter()
        .any(|m| self.advertises(*m));
        if !any {
            return self.skip(NAME, "no duplexChannel method is advertised");
        }
        let mut notes = Notes::default();
        let status = match self.duplex_inner(&mut notes).await {
            Ok(()) => ScenarioStatus::Passed,
            Err(e) => ScenarioStatus::Failed(e),
        };
        let o = self.record(NAME, status, notes);
        self.push(o);
    }

    async fn duplex_inner(&mut self, notes: &mut Notes) -> Outcome {
        if !self.advertises(Method::DuplexChannelOpen) {
            return Err("duplexChannel methods are advertised without duplexChannelOpen".into());
        }
        let lease = self.ensure_lease(notes).await?;
        let open = |lease: &Lease| DuplexOpenParams {
            scope: self.scope.clone(),
            lease: lease.clone(),
            purpose: DuplexPurpose::Pty {
                command: "cat".into(),
                args: None,
                cwd: None,
                env: None,
                cols: 80,
                rows: 24,
            },
        };
        let ch = self
            .call::<methods::DuplexOpen>(&open(&lease))
            .await
            .map_err(|e| format!("duplexChannelOpen of a pty running `cat` failed: {e}"))?
            .channel_id;
        // the client holds what the channel sent before this subscription
        let mut rx = self
            .worker
            .as_ref()
            .ok_or("the worker is not running")?
            .subscribe_channel(&ch);
        let deadline = Duration::from_secs(10);
        if self.advertises(Method::DuplexChannelWrite) {
            let ping = format!("ping-{}\n", self.nonce);
            self.call::<methods::DuplexWrite>(&DuplexWriteParams {
                channel_id: ch.clone(),
                data: Bytes(ping.clone().into_bytes()),
            })
            .await
            .map_err(|e| format!("duplexChannelWrite failed: {e}"))?;
            let want = ping.trim_end().to_string();
            let mut seen = Vec::new();
            let got = tokio::time::timeout(deadline, async {
                while let Some(n) = rx.recv().await {
                    if let Some(d) = duplex_data(&n, &ch) {
                        seen.extend(d);
                        if String::from_utf8_lossy(&seen).contains(&want) {
                            return true;
                        }
                    }
                }
                false
            })
            .await
            .unwrap_or(false);
            if !got {
                return Err(format!(
                    "wrote {want:?} to a pty running `cat` but no duplexChannel.data carried it back"
                ));
            }
        }
        if self.advertises(Method::DuplexChannelResize) {
            self.call::<methods::DuplexResize>(&DuplexResizeParams {
                channel_id: ch.clone(),
                cols: 100,
                rows: 30,
            })
            .await
            .map_err(|e| format!("duplexChannelResize failed: {e}"))?;
        }
        let mut open_channel = Some(ch.clone());
        if self.advertises(Method::DuplexChannelStop) {
            self.call::<methods::DuplexStop>(&DuplexChannelParams {
                channel_id: ch.clone(),
            })
            .await
            .map_err(|e| format!("duplexChannelStop failed: {e}"))?;
            let exited = tokio::time::timeout(deadline, async {
                while let Some(n) = rx.recv().await {
                    if n.method == Method::DuplexChannelExit.as_str()
                        && n.params_as::<methods::DuplexExit>()
                            .map(|p| p.channel_id == ch)
                            .unwrap_or(false)
                    {
                        return true;
                    }
                }
                false
            })
            .await
            .unwrap_or(false);
            if !exited {
                return Err(
                    "after duplexChannelStop, `cat` on the pty never ended with duplexChannel.exit"
                        .into(),
                );
            }
            open_channel = None;
        }
        if self.advertises(Method::DuplexChannelClose) {
            let target = match open_channel.take() {
                Some(c) => c,
                None => {
                    self.call::<methods::DuplexOpen>(&open(&lease))
                        .await
                        .map_err(|e| format!("duplexChannelOpen of a second channel failed: {e}"))?
                        .channel_id
                }
            };
            self.call::<methods::DuplexClose>(&DuplexChannelParams { channel_id: target })
                .await
                .map_err(|e| format!("duplexChannelClose failed: {e}"))?;
        }
        if open_channel.is_some() {
            notes.add("neither duplexChannelStop nor duplexChannelClose is advertised: the channel was left open");
        }
        Ok(())
    }

    // ------------------------------------------------------------ lease lifecycle

    async fn resume(&mut self) {
        const NAME: &str = "resume lease";
        if !self.advertises(Method::EnvironmentResumeLease) {
            return self.skip(NAME, "environmentResumeLease is not advertised");
        }
        let mut notes = Notes::default();
        let status = match self.resume_inner(&mut notes).await {
            Ok(()) => ScenarioStatus::Passed,
            Err(e) => ScenarioStatus::Failed(e),
        };
        let o = self.record(NAME, status, notes);
        self.push(o);
    }

    async fn resume_inner(&mut self, notes: &mut Notes) -> Outcome {
        if !self.ensure_worker(notes).await {
            return Err("the worker is not running".into());
        }
        let unknown = format!("sandhost-check-unknown-{}", self.nonce);
        let r = self
            .call::<methods::ResumeLease>(&self.resume_params(&unknown))
            .await
            .map_err(|e| format!("resume of an unknown providerLeaseId must answer a null lease, not an error: {e}"))?;
        if let Some(id) = r.provider_lease_id {
            return Err(format!(
                "resume of the unknown providerLeaseId `{unknown}` answered lease `{id}`"
            ));
        }
        check_gone_reason(&r, notes)?;

        if !self.advertises(Method::EnvironmentAcquireLease) {
            notes.add("environmentAcquireLease is not advertised: only an unknown id was resumed");
            return Ok(());
        }
        let lease = self.ensure_lease(notes).await?;
        let id = lease.provider_lease_id.clone().unwrap_or_default();
        let r = self
            .call::<methods::ResumeLease>(&self.resume_params(&id))
            .await
            .map_err(|e| format!("resume of the live lease `{id}` failed: {e}"))?;
        match r.provider_lease_id {
            None => {
                return Err(format!(
                    "resume of the live lease `{id}` answered a null lease"
                ))
            }
            Some(got) if got != id => notes.add(format!("resume of `{id}` answered `{got}`")),
            Some(_) => {}
        }
        Ok(())
    }

    async fn release(&mut self) {
        const NAME: &str = "release lease";
        if !self.advertises(Method::EnvironmentReleaseLease) {
            return self.skip(NAME, "environmentReleaseLease is not advertised");
        }
        let mut notes = Notes::default();
        let status = match self.release_inner(&mut notes).await {
            Ok(()) => ScenarioStatus::Passed,
            Err(e) => ScenarioStatus::Failed(e),
        };
        let o = self.record(NAME, status, notes);
        self.push(o);
    }

    async fn release_inner(&mut self, notes: &mut Notes) -> Outcome {
        let lease = self.ensure_lease(notes).await?;
        let id = lease
            .provider_lease_id
            .clone()
            .ok_or("no lease to release: environmentAcquireLease is not advertised")?;
        let receipt = self
            .call::<methods::ReleaseLease>(&self.lease_end(&id))
            .await
            .map_err(|e| format!("environmentReleaseLease failed: {e}"))?;
        self.lease = None;
        if let Some(r) = &receipt {
            if r.provider_lease_id != id {
                return Err(format!(
                    "release of `{id}` answered a receipt for `{}`",
                    r.provider_lease_id
                ));
            }
            notes.add(format!("release receipt state: {:?}", r.state));
        }
        if !self.advertises(Method::EnvironmentResumeLease) {
            return Ok(());
        }
        let r = self
            .call::<methods::ResumeLease>(&self.resume_params(&id))
            .await
            .map_err(|e| format!("resume of the released lease `{id}` failed: {e}"))?;
        match r.provider_lease_id.clone() {
            None => {
                check_gone_reason(&r, notes)?;
                notes.add("a released lease resumes as gone (null providerLeaseId)");
            }
            Some(_) if matches!(receipt, Some(ref r) if r.state == LeaseEndState::Destroyed) => {
                return Err(format!(
                    "release of `{id}` answered state destroyed, yet resume answered a live lease"
                ));
            }
            Some(got) => {
                notes.add(format!("the released lease resumed as `{got}`"));
                if self.advertises(Method::EnvironmentExecute) {
                    self.sh_ok(&r, "true")
                        .await
                        .map_err(|e| format!("the resumed released lease is not usable: {e}"))?;
                }
                self.lease = Some(r);
            }
        }
        Ok(())
    }

    async fn destroy(&mut self) {
        const NAME: &str = "destroy lease";
        if !self.advertises(Method::EnvironmentDestroyLease) {
            return self.skip(NAME, "environmentDestroyLease is not advertised");
        }
        let mut notes = Notes::default();
        let status = match self.destroy_inner(&mut notes).await {
            Ok(()) => ScenarioStatus::Passed,
            Err(e) => ScenarioStatus::Failed(e),
        };
        let o = self.record(NAME, status, notes);
        self.push(o);
    }

    async fn destroy_inner(&mut self, notes: &mut Notes) -> Outcome {
        let lease = self.ensure_lease(notes).await?;
        let id = lease
            .provider_lease_id
            .clone()
            .ok_or("no lease to destroy: environmentAcquireLease is not advertised")?;
        let receipt = self
            .call::<methods::DestroyLease>(&self.lease_end(&id))
            .await
            .map_err(|e| format!("environmentDestroyLease failed: {e}"))?;
        self.lease = None;
        if let Some(r) = &receipt {
            if r.provider_lease_id != id {
                return Err(format!(
                    "destroy of `{id}` answered a receipt for `{}`",
                    r.provider_lease_id
                ));
            }
            if r.state != LeaseEndState::Destroyed {
                return Err(format!("destroy of `{id}` answered state {:?}", r.state));
            }
        }
        if self.advertises(Method::EnvironmentResumeLease) {
            let r = self
                .call::<methods::ResumeLease>(&self.resume_params(&id))
                .await
                .map_err(|e| format!("resume of the destroyed lease `{id}` failed: {e}"))?;
            if let Some(got) = &r.provider_lease_id {
                return Err(format!(
                    "resume of the destroyed lease `{id}` answered live lease `{got}`"
                ));
            }
            check_gone_reason(&r, notes)?;
        }
        // The reuse path destroys a stale lease after resume found it gone:
        // destroying a lease that no longer exists must not be an error.
        self.call::<methods::DestroyLease>(&self.lease_end(&id))
            .await
            .map_err(|e| format!("destroying the already destroyed lease `{id}` failed (the host destroys stale leases): {e}"))?;
        Ok(())
    }

    /// End the shared lease, if one is still held (not a scenario).
    async fn cleanup(&mut self) {
        let Some(id) = self.lease.take().and_then(|l| l.provider_lease_id) else {
            return;
        };
        let params = self.lease_end(&id);
        let Some(w) = self.worker.as_ref() else {
            return;
        };
        let r = if self.advertises(Method::EnvironmentDestroyLease) {
            w.call_with_timeout::<methods::DestroyLease>(&params, self.opts.call_timeout)
                .await
        } else if self.advertises(Method::EnvironmentReleaseLease) {
            w.call_with_timeout::<methods::ReleaseLease>(&params, self.opts.call_timeout)
                .await
        } else {
            return;
        };
        if let Err(e) = r {
            tracing::debug!("cleanup of lease `{id}` failed: {e}");
        }
    }

    async fn shutdown(&mut self) {
        let mut notes = Notes::default();
        self.note_call(Method::Shutdown.as_str());
        self.ensure_worker(&mut notes).await;
        let Some(w) = self.worker.take() else {
            let o = self.record(
                "shutdown",
                ScenarioStatus::Skipped("the worker is not running".into()),
                notes,
            );
            return self.push(o);
        };
        let grace = self.opts.worker.shutdown_grace;
        let answered = w
            .call_with_timeout::<methods::Shutdown>(&EmptyParams {}, grace)
            .await;
        let started = Instant::now();
        while !w.has_exited() && started.elapsed() < grace {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let exited = w.has_exited();
        w.shutdown().await;
        let status = match (answered, exited) {
            (_, true) => ScenarioStatus::Passed,
            (Err(e), false) => {
                self.classify(Method::Shutdown.as_str(), &e);
                ScenarioStatus::Failed(format!("shutdown failed: {e}"))
            }
            (Ok(_), false) => ScenarioStatus::Failed(format!(
                "the worker answered shutdown but did not exit within {} ms",
                grace.as_millis()
            )),
        };
        let o = self.record("shutdown", status, notes);
        self.push(o);
    }

    /// Every advertised method is called at least once: one whose scenario
    /// did not reach it (an earlier step failed) is called directly, with
    /// plausible params, to tell "not implemented" from a refusal.
    async fn coverage(&mut self) {
        let mut notes = Notes::default();
        // `shutdown` has its own scenario, which always runs last.
        self.exercised
            .lock()
            .unwrap()
            .insert(Method::Shutdown.as_str().to_string());
        let exercised = self.exercised.lock().unwrap().clone();
        let missing: Vec<Method> = self
            .advertised
            .iter()
            .filter_map(|m| Method::from_name(m))
            .filter(|m| m.kind() != MethodKind::Notification && !exercised.contains(m.as_str()))
            .collect();
        let mut failures = vec![];
        if !missing.is_empty() && self.ensure_worker(&mut notes).await {
            for m in missing {
                match self.exercise_directly(m).await {
                    Ok(()) => notes.add(format!(
                        "{m} was called directly (its scenario did not reach it)"
                    )),
                    Err(e) => {
                        notes.add(format!("{m} called directly: {e}"));
                        if self.lying.lock().unwrap().contains_key(m.as_str()) {
                            failures.push(m.to_string());
                        }
                    }
                }
            }
        }
        let never: Vec<String> = self
            .advertised
            .iter()
            .filter(|m| {
                Method::from_name(m).is_some_and(|m| m.kind() != MethodKind::Notification)
                    && !self.exercised.lock().unwrap().contains(*m)
            })
            .cloned()
            .collect();
        let status = if !never.is_empty() {
            ScenarioStatus::Failed(format!(
                "advertised but never exercised: {}",
                never.join(", ")
            ))
        } else if !failures.is_empty() {
            ScenarioStatus::Failed(format!(
                "advertised but not implemented: {}",
                failures.join(", ")
            ))
        } else {
            ScenarioStatus::Passed
        };
        let o = self.record("every advertised method exercised", status, notes);
        self.push(o);
    }

    /// One call of `m` with plausible params; any answer but an error counts.
    async fn exercise_directly(&mut self, m: Method) -> Result<(), CallFailure> {
        let lease = self.lease.clone().unwrap_or(Lease {
            provider_lease_id: Some(format!("sandhost-check-none-{}", self.nonce)),
            metadata: None,
            expires_at: None,
        });
        let id = lease.provider_lease_id.clone().unwrap_or_default();
        let channel = format!("sandhost-check-none-{}", self.nonce);
        let empty_sync = || self.sync_params(&lease, "direct", vec![]);
        match m {
            Method::Initialize | Method::Shutdown => Ok(()),
            Method::Health => self
                .call::<methods::Health>(&EmptyParams {})
                .await
                .map(drop),
            Method::EnvironmentValidateConfig => self
                .call::<methods::ValidateConfig>(&ValidateConfigParams {
                    driver_key: self.scope.driver_key.clone(),
                    config: self.scope.config.clone(),
                })
                .await
                .map(drop),
            Method::EnvironmentProbe => self
                .call::<methods::Probe>(&ProbeParams {
                    scope: self.scope.clone(),
                })
                .await
                .map(drop),
            Method::EnvironmentAcquireLease => {
                let _ = self.acquire().await;
                Ok(())
            }
            Method::EnvironmentResumeLease => self
                .call::<methods::ResumeLease>(&self.resume_params(&id))
                .await
                .map(drop),
            Method::EnvironmentReleaseLease => self
                .call::<methods::ReleaseLease>(&self.lease_end(&id))
                .await
                .map(drop),
            Method::EnvironmentDestroyLease => self
                .call::<methods::DestroyLease>(&self.lease_end(&id))
                .await
                .map(drop),
            Method::EnvironmentRealizeWorkspace => self
                .call::<methods::RealizeWorkspace>(&sandhost_protocol::RealizeWorkspaceParams {
                    scope: self.scope.clone(),
                    lease: lease.clone(),
                    workspace: Default::default(),
                })
                .await
                .map(drop),
            Method::EnvironmentExecute => self
                .execute_logged(
                    &self.exec_params(&lease, "true"),
                    self.opts.call_timeout,
                    |_| {},
                )
                .await
                .map(drop),
            Method::EnvironmentSyncIn => {
                self.call::<methods::SyncIn>(&empty_sync()).await.map(drop)
            }
            Method::EnvironmentSyncOut => {
                self.call::<methods::SyncOut>(&empty_sync()).await.map(drop)
            }
            Method::DuplexChannelOpen => self
                .call::<methods::DuplexOpen>(&DuplexOpenParams {
                    scope: self.scope.clone(),
                    lease: lease.clone(),
                    purpose: DuplexPurpose::Pty {
                        command: "true".into(),
                        args: None,
                        cwd: None,
                        env: None,
                        cols: 80,
                        rows: 24,
                    },
                })
                .await
                .map(drop),
            Method::DuplexChannelWrite => self
                .call::<methods::DuplexWrite>(&DuplexWriteParams {
                    channel_id: channel,
                    data: Bytes(vec![]),
                })
                .await
                .map(drop),
            Method::DuplexChannelResize => self
                .call::<methods::DuplexResize>(&DuplexResizeParams {
                    channel_id: channel,
                    cols: 80,
                    rows: 24,
                })
                .await
                .map(drop),
            Method::DuplexChannelStop => self
                .call::<methods::DuplexStop>(&DuplexChannelParams {
                    channel_id: channel,
                })
                .await
                .map(drop),
            Method::DuplexChannelClose => self
                .call::<methods::DuplexClose>(&DuplexChannelParams {
                    channel_id: channel,
                })
                .await
                .map(drop),
            Method::ExecuteLog | Method::DuplexChannelData | Method::DuplexChannelExit => Ok(()),
        }
    }
}

/// A scenario's result before its traced methods are attached.
#[derive(Debug)]
struct Finished {
    name: String,
    status: ScenarioStatus,
    notes: Vec<String>,
}

fn mapping(source: &str, target: &str, kind: FileKind) -> FileMapping {
    FileMapping {
        source_path: source.into(),
        target_path: target.into(),
        kind,
        mode: None,
        exclude: None,
        follow_symlinks: None,
        access: None,
    }
}

fn duplex_data(n: &Notification, channel: &str) -> Option<Vec<u8>> {
    if n.method != Method::DuplexChannelData.as_str() {
        return None;
    }
    let p = n.params_as::<methods::DuplexData>().ok()?;
    (p.channel_id == channel).then_some(p.data.0)
}

/// A gone lease says why in `metadata.reason`, from the protocol's three.
fn check_gone_reason(lease: &Lease, notes: &mut Notes) -> Outcome {
    let reason = lease
        .metadata
        .as_ref()
        .and_then(|m| m.get("reason"))
        .cloned();
    match reason {
        None => {
            notes.add("a gone lease carries no metadata.reason");
            Ok(())
        }
        Some(Value::String(r))
            if ["expired", "not_found", "identity_mismatch"].contains(&r.as_str()) =>
        {
            Ok(())
        }
        Some(other) => Err(format!(
            "a gone lease's metadata.reason is {other}, not expired / not_found / identity_mismatch"
        )),
    }
}

/// `YYYY-MM-DDTHH:MM...`: enough to tell a timestamp from anything else.
fn looks_like_iso8601(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 16
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'-'
        && b[8..10].iter().all(u8::is_ascii_digit)
        && (b[10] == b'T' || b[10] == b't' || b[10] == b' ')
        && b[11..13].iter().all(u8::is_ascii_digit)
        && b[13] == b':'
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ls_mode_strings_parse_to_permission_bits() {
        assert_eq!(parse_ls_mode("-rw-r-----"), Some(0o640));
        assert_eq!(parse_ls_mode("-rwxr-xr-x"), Some(0o755));
        assert_eq!(parse_ls_mode("-rwsr-S--T"), Some(0o740));
        assert_eq!(parse_ls_mode("total"), None);
    }

    #[test]
    fn iso8601_shape_is_recognised() {
        assert!(looks_like_iso8601("2030-01-02T03:04:05Z"));
        assert!(!looks_like_iso8601("tomorrow at noon"));
    }
}
