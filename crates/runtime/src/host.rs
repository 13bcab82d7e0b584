//! The host: sandboxes and their leases across `sandhost` processes.
//!
//! - `run` takes an ephemeral lease (never reused) and destroys it after.
//! - `create` takes a retained (`reuse_by_environment`) lease in an
//!   environment private to the new sandbox, pinned to the exact plugin that
//!   acquired it. A later process `connect`s: when reuse is effective it
//!   resumes the lease; when the provider says the lease is gone it destroys
//!   the stale lease and acquires a replacement, recording the outcome and
//!   why. When the pinned plugin is absent or changed, resolution yields
//!   nothing and the sandbox is refused, never driven by whatever worker
//!   answers now.
//! - Expired leases, and leases left `acquiring`/`destroying` by a process
//!   that died, are destroyed by whichever process next opens the host.
//!
//! One worker process per plugin per host process; all of them are shut
//! down with [`Host::shutdown`] (and killed on drop).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sandhost_contract::command::missing_provider_methods;
use sandhost_contract::gate::{gate, CapabilityNotSupportedError};
use sandhost_contract::resolve::{LeaseFacts, LeasePolicy, Verified};
use sandhost_contract::template::Template;
use sandhost_contract::{CommandCapability, CommandSet, ErrorCode, ProviderCapability};
use sandhost_protocol::{
    methods, AcquireLeaseParams, EnvironmentScope, Lease, LeaseEndParams, ResumeLeaseParams,
    ValidateConfigParams,
};
use serde_json::{json, Map, Value};

use crate::context::LeaseContext;
use crate::plugins::{Plugin, Registry};
use crate::snapshot::{CapabilitySnapshot, RunFacts};
use crate::store::{
    new_id, now_secs, LeaseOutcome, LeaseRecord, LeaseState, NewLease, SandboxRecord, Store,
};
use crate::worker::{Worker, WorkerError, WorkerOptions};
use crate::RuntimeError;

/// The tenant sandhost names itself on the wire (`companyId`).
pub const TENANT: &str = "sandhost";
/// The default provider.
pub const DEFAULT_PROVIDER: &str = "local";
/// The default lease TTL.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);
/// A lease row left `acquiring` or `destroying` this long belongs to a dead process.
pub const STUCK_AFTER_SECS: i64 = 120;

/// Errors of the host's own decisions (E52xx); store errors are E50xx.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(transparent)]
    Store(#[from] RuntimeError),
    #[error("no provider `{driver_key}`; available: {available}")]
    UnknownProvider {
        driver_key: String,
        available: String,
    },
    #[error("provider `{driver_key}` rejected its config: {errors}")]
    InvalidConfig { driver_key: String, errors: String },
    #[error("template `{template}` asks for `{capability}`, but provider `{driver_key}` does not implement `{method}`")]
    TemplateNotServable {
        template: String,
        capability: CommandCapability,
        driver_key: String,
        method: String,
    },
    #[error("sandbox `{sandbox}` was created by plugin `{pinned}`, which is {state}; refusing to drive it with another worker")]
    PluginIdentity {
        sandbox: String,
        pinned: String,
        state: String,
    },
    #[error("provider `{driver_key}` cannot {what}: it does not advertise `{method}`")]
    MissingMethod {
        driver_key: String,
        what: &'static str,
        method: &'static str,
    },
    #[error("sandbox `{0}` has expired")]
    Expired(String),
    #[error("the provider returned no lease id for `{0}`")]
    NoLeaseId(String),
    #[error("the worker of plugin `{plugin}` died {restarts} times in a row; last: {last}")]
    WorkerKeepsDying {
        plugin: String,
        restarts: u32,
        last: String,
    },
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error(transparent)]
    NotSupported(#[from] CapabilityNotSupportedError),
}

impl HostError {
    pub fn code(&self) -> ErrorCode {
        ErrorCode(match self {
            Self::Store(e) => return e.code(),
            Self::Worker(e) => return e.code(),
            Self::NotSupported(e) => return e.code(),
            Self::UnknownProvider { .. } => "E5201",
            Self::InvalidConfig { .. } => "E5202",
            Self::TemplateNotServable { .. } => "E5203",
            Self::PluginIdentity { .. } => "E5204",
            Self::MissingMethod { .. } => "E5205",
            Self::Expired(_) => "E5206",
            Self::NoLeaseId(_) => "E5207",
            Self::WorkerKeepsDying { .. } => "E5208",
        })
    }

    /// What the user can do about it.
    pub fn suggestion(&self) -> Option<String> {
        match self {
            Self::UnknownProvider { .. } => Some("list providers with `sandhost providers`; add plugins with --plugin-dir".into()),
            Self::TemplateNotServable { capability, .. } => Some(format!(
                "remove `{capability}` from the template's capabilities, or pick a provider that serves it"
            )),
            Self::PluginIdentity { .. } => Some("restore that plugin, or destroy the sandbox with `sandhost kill`".into()),
            Self::NotSupported(e) => Some(e.suggestion.clone()),
            Self::Expired(_) => Some("create a new sandbox; raise --ttl for longer-lived ones".into()),
            _ => None,
        }
    }
}

type Result<T> = std::result::Result<T, HostError>;

/// How a host process is set up.
#[derive(Debug, Clone)]
pub struct HostConfig {
    pub home: PathBuf,
    pub registry: Registry,
    pub worker_options: WorkerOptions,
}

/// What to create.
#[derive(Debug, Clone)]
pub struct CreateRequest {
    pub template: Template,
    /// The template's source text, kept with the sandbox.
    pub template_yaml: String,
    /// Overrides the template's provider; default `local`.
    pub provider: Option<String>,
    /// Provider config, merged over what the template implies.
    pub config: Value,
    pub ttl: Option<Duration>,
    pub policy: LeasePolicy,
}

/// A sandbox this process can act on.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub record: SandboxRecord,
    pub template: Template,
    /// The template's effective command capabilities: every call is gated on it.
    pub commands: CommandSet,
    pub ctx: LeaseContext,
    /// How this process came to hold the lease, and why.
    pub outcome: LeaseOutcome,
    pub outcome_reason: String,
}

impl Sandbox {
    /// The E3004 gate: fail fast when the template does not offer `cap`.
    pub fn gate(&self, cap: CommandCapability) -> Result<()> {
        Ok(gate(&self.commands, cap, Some(&self.template.name))?)
    }
}

/// One plugin's worker and its restart history.
#[derive(Debug)]
struct WorkerSlot {
    worker: Option<Arc<Worker>>,
    /// Restarts since the worker last lived long enough to count as healthy.
    restarts: u32,
    started: Instant,
    checked: Instant,
}

/// The first restart waits this long; each next one twice as long.
const RESTART_BACKOFF: Duration = Duration::from_millis(100);
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A worker that dies this many times in a row is given up on.
const MAX_RESTARTS: u32 = 5;
/// A worker that lived this long resets the restart count.
const HEALTHY_AFTER: Duration = Duration::from_secs(60);

/// The wait before restart number `n` (1-based).
pub fn restart_backoff(n: u32) -> Duration {
    RESTART_BACKOFF
        .saturating_mul(1u32 << n.saturating_sub(1).min(16))
        .min(RESTART_BACKOFF_MAX)
}

/// The host of one `sandhost` process.
#[derive(Debug)]
pub struct Host {
    cfg: HostConfig,
    store: Mutex<Store>,
    workers: tokio::sync::Mutex<HashMap<String, WorkerSlot>>,
}

/// The provider config a template implies (keys a provider reads if it can).
pub fn template_config(t: &Template) -> Value {
    let mut c = Map::new();
    if let Some(i) = &t.image {
        c.insert("image".into(), json!(i));
    }
    if let Some(r) = &t.rootfs {
        c.insert("rootfs".into(), json!(r));
    }
    if !t.env.is_empty() {
        c.insert("env".into(), json!(t.env));
    }
    if let Some(w) = &t.workdir {
        c.insert("workdir".into(), json!(w));
    }
    let r = &t.resources;
    let mut res = Map::new();
    if let Some(v) = r.memory_bytes {
        res.insert("memoryBytes".into(), json!(v));
    }
    if let Some(v) = r.cpus_milli {
        res.insert("cpusMilli".into(), json!(v));
    }
    if let Some(v) = r.pids {
        res.insert("pids".into(), json!(v));
    }
    if let Some(v) = r.disk_bytes {
        res.insert("diskBytes".into(), json!(v));
    }
    if !res.is_empty() {
        c.insert("resources".into(), Value::Object(res));
    }
    c.insert("network".into(), json!(t.network.as_str()));
    Value::Object(c)
}

fn merge(base: Value, over: &Value) -> Value {
    match (base, over) {
        (Value::Object(mut b), Value::Object(o)) => {
            for (k, v) in o {
                let merged = match b.remove(k) {
                    Some(old) => merge(old, v),
                    None => v.clone(),
                };
                b.insert(k.clone(), merged);
            }
            Value::Object(b)
        }
        (_, o) => o.clone(),
    }
}

fn iso8601(secs: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64);
    humantime::format_rfc3339_seconds(t).to_string()
}

fn parse_iso8601(s: &str) -> Option<i64> {
    humantime::parse_rfc3339_weak(s)
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs() as i64)
}

fn metadata_map(v: &Value) -> Option<Map<String, Value>> {
    v.as_object().cloned()
}

fn scope(driver_key: &str, environment_id: &str, config: &Value) -> EnvironmentScope {
    EnvironmentScope {
        driver_key: driver_key.into(),
        company_id: TENANT.into(),
        environment_id: environment_id.into(),
        issue_id: None,
        config: config.clone(),
    }
}

impl Host {
    /// Open the host on `cfg.home`. Expired and stranded leases are cleaned
    /// up first (see [`Host::reap`]).
    pub async fn open(cfg: HostConfig) -> Result<Self> {
        let store = Store::open(&cfg.home)?;
        let host = Self {
            cfg,
            store: Mutex::new(store),
            workers: Default::default(),
        };
        host.reap().await;
        Ok(host)
    }

    pub fn registry(&self) -> &Registry {
        &self.cfg.registry
    }

    fn with_store<T>(&self, f: impl FnOnce(&Store) -> crate::store::Result<T>) -> Result<T> {
        let s = self.store.lock().unwrap_or_else(|p| p.into_inner());
        Ok(f(&s)?)
    }

    /// The worker of `plugin`, started on first use (and restarted when the
    /// one we had has died).
    pub async fn worker(&self, plugin: &Plugin) -> Result<Arc<Worker>> {
        let opts = &self.cfg.worker_options;
        let mut workers = self.workers.lock().await;
        let slot = workers
            .entry(plugin.manifest.id.clone())
            .or_insert_with(|| WorkerSlot {
                worker: None,
                restarts: 0,
                started: Instant::now(),
                checked: Instant::now(),
            });
        if let Some(w) = slot.worker.clone() {
            if w.dead_reason().is_none() {
                if slot.checked.elapsed() < opts.health_interval {
                    return Ok(w);
                }
                // idle for a while: make sure it still answers before reuse
                let health = w
                    .call_with_timeout::<methods::Health>(&Default::default(), opts.health_timeout)
                    .await;
                if health.is_ok() {
                    slot.checked = Instant::now();
                    return Ok(w);
                }
                tracing::warn!(
                    "worker of `{}` failed its health check; restarting it",
                    plugin.manifest.id
                );
                w.kill();
            }
            // it died (or was killed above): restart, with backoff
            if slot.started.elapsed() >= HEALTHY_AFTER {
                slot.restarts = 0;
            }
            slot.restarts += 1;
            if slot.restarts > MAX_RESTARTS {
                return Err(HostError::WorkerKeepsDying {
                    plugin: plugin.manifest.id.clone(),
                    restarts: MAX_RESTARTS,
                    last: w
                        .dead_reason()
                        .map(|e| e.to_string())
                        .unwrap_or_else(|| "unhealthy".into()),
                });
            }
            tokio::time::sleep(restart_backoff(slot.restarts)).await;
        }
        slot.worker = None;
        let w = Arc::new(Worker::spawn(&self.worker_spec(plugin), opts.clone()).await?);
        slot.worker = Some(w.clone());
        slot.started = Instant::now();
        slot.checked = Instant::now();
        Ok(w)
    }

    /// Every worker learns the home, so built-in providers keep their state
    /// beside the store.
    fn worker_spec(&self, plugin: &Plugin) -> crate::worker::WorkerSpec {
        let mut spec = plugin.worker_spec();
        spec.env
            .push(("SANDHOST_HOME".into(), self.cfg.home.display().to_string()));
        spec
    }

    fn driver(&self, driver_key: &str) -> Result<&Plugin> {
        self.cfg
            .registry
            .driver(driver_key)
            .map(|(p, _)| p)
            .ok_or_else(|| {
                let mut keys: Vec<&str> = self
                    .cfg
                    .registry
                    .plugins
                    .iter()
                    .flat_map(|p| {
                        p.manifest
                            .environment_drivers
                            .iter()
                            .map(|d| d.driver_key.as_str())
                    })
                    .collect();
                keys.sort_unstable();
                HostError::UnknownProvider {
                    driver_key: driver_key.into(),
                    available: keys.join(", "),
                }
            })
    }

    /// Ask the worker to validate the config when it can. `Ok(true)` means
    /// the config could not be resolved (the call failed): the snapshot then
    /// fails closed on sessions and incremental output.
    async fn validate_config(
        &self,
        worker: &Worker,
        driver_key: &str,
        config: &Value,
    ) -> Result<bool> {
        if !worker.supports("environmentValidateConfig") {
            return Ok(false);
        }
        let params: ValidateConfigParams = serde_json::from_value(
            json!({"driverKey": driver_key, "config": config}),
        )
        .map_err(|e| HostError::InvalidConfig {
            driver_key: driver_key.into(),
            errors: e.to_string(),
        })?;
        match worker.call::<methods::ValidateConfig>(&params).await {
            Ok(r) if r.ok => Ok(false),
            Ok(r) => Err(HostError::InvalidConfig {
                driver_key: driver_key.into(),
                errors: serde_json::to_string(&r.errors).unwrap_or_default(),
            }),
            Err(e) => {
                tracing::warn!("config of `{driver_key}` could not be resolved: {e}");
                Ok(true)
            }
        }
    }

    /// Create a sandbox: acquire a lease (ephemeral for `run`, retained for
    /// `create`) and record it.
    pub async fn create(&self, req: CreateRequest) -> Result<Sandbox> {
        let driver_key = req
            .provider
            .clone()
            .or_else(|| req.template.provider.clone())
            .unwrap_or_else(|| DEFAULT_PROVIDER.to_string());
        let plugin = self.driver(&driver_key)?.clone();
        let worker = self.worker(&plugin).await?;
        let config = merge(template_config(&req.template), &req.config);
        let config_failed = self.validate_config(&worker, &driver_key, &config).await?;
        let commands = req.template.effective_capabilities();
        if let Some((capability, method)) =
            missing_provider_methods(&commands, &|m: &str| worker.supports(m))
                .into_iter()
                .next()
        {
            return Err(HostError::TemplateNotServable {
                template: req.template.name.clone(),
                capability,
                driver_key,
                method: method.into(),
            });
        }
        let environment_id = self.with_store(|s| match req.policy {
            LeasePolicy::Ephemeral => s.environment_for(&driver_key, &config),
            LeasePolicy::ReuseByEnvironment => s.private_environment(&driver_key, &config),
        })?;
        let facts = RunFacts {
            driver_key: &driver_key,
            lease: LeaseFacts::from_metadata(req.policy, &Value::Null),
            pinned_plugin_id: None,
            config_resolution_failed: config_failed,
        };
        let snapshot = CapabilitySnapshot::resolve(
            Some(&plugin.manifest),
            Verified::methods(worker.supported_methods().iter().cloned()),
            &facts,
        );
        let scope = scope(&driver_key, &environment_id, &config);
        let ttl = req.ttl.or(req.template.timeout).unwrap_or(DEFAULT_TTL);
        let (record, lease) = self
            .acquire(
                &worker,
                &plugin,
                &scope,
                req.policy,
                ttl,
                LeaseOutcome::Created,
                "new sandbox",
            )
            .await?;
        let sandbox = SandboxRecord {
            id: new_id("sbx"),
            lease_id: record.id.clone(),
            provider: driver_key.clone(),
            template_name: req.template.name.clone(),
            template_yaml: req.template_yaml.clone(),
            state: "running".into(),
            created_at: now_secs(),
            expires_at: record.expires_at,
        };
        self.with_store(|s| s.insert_sandbox(&sandbox))?;
        Ok(Sandbox {
            record: sandbox,
            template: req.template,
            commands,
            ctx: LeaseContext {
                worker,
                scope,
                lease,
                snapshot,
            },
            outcome: LeaseOutcome::Created,
            outcome_reason: "new sandbox".into(),
        })
    }

    /// Write the lease row, ask the provider, record its answer. The row is
    /// written first, so a crash between the two leaves a row recovery finds;
    /// the lease row id travels as `runId`.
    #[allow(clippy::too_many_arguments)]
    async fn acquire(
        &self,
        worker: &Worker,
        plugin: &Plugin,
        scope: &EnvironmentScope,
        policy: LeasePolicy,
        ttl: Duration,
        outcome: LeaseOutcome,
        reason: &str,
    ) -> Result<(LeaseRecord, Lease)> {
        if !worker.supports("environmentAcquireLease") {
            return Err(HostError::MissingMethod {
                driver_key: scope.driver_key.clone(),
                what: "create sandboxes",
                method: "environmentAcquireLease",
            });
        }
        let row = self.with_store(|s| {
            s.insert_lease(&NewLease {
                environment_id: &scope.environment_id,
                policy,
                plugin_id: &plugin.manifest.id,
                plugin_version: &plugin.manifest.version,
                driver_key: &scope.driver_key,
            })
        })?;
        let requested = now_secs() + ttl.as_secs() as i64;
        let params = AcquireLeaseParams {
            scope: scope.clone(),
            run_id: row.id.clone(),
            requested_cwd: None,
            agent_id: None,
            requested_expires_at: Some(iso8601(requested)),
        };
        let lease = match worker.call::<methods::AcquireLease>(&params).await {
            Ok(l) => l,
            Err(e) => {
                let _ = self.with_store(|s| {
                    s.transition_lease(&row.id, LeaseState::Acquiring, LeaseState::Destroyed)
                });
                return Err(e.into());
            }
        };
        let Some(pid) = lease.provider_lease_id.clone() else {
            let _ = self.with_store(|s| {
                s.transition_lease(&row.id, LeaseState::Acquiring, LeaseState::Destroyed)
            });
            return Err(HostError::NoLeaseId(row.id));
        };
        // the provider sets its own expiry at or before the requested one
        let expires = lease
            .expires_at
            .as_deref()
            .and_then(parse_iso8601)
            .map(|e| e.min(requested))
            .or(Some(requested));
        let meta = lease
            .metadata
            .clone()
            .map(Value::Object)
            .unwrap_or(json!({}));
        self.with_store(|s| s.lease_acquired(&row.id, &pid, &meta, expires, outcome, reason))?;
        let row = self.with_store(|s| s.lease(&row.id))?;
        Ok((row, lease))
    }

    /// Reach an existing sandbox from this process.
    pub async fn connect(&self, id: &str) -> Result<Sandbox> {
        let record = self.with_store(|s| s.sandbox(id))?;
        let lease_row = self.with_store(|s| s.lease(&record.lease_id))?;
        if lease_row.expires_at.is_some_and(|e| e <= now_secs()) {
            return Err(HostError::Expired(id.into()));
        }
        let template = sandhost_contract::template::parse_template(&record.template_yaml)
            .unwrap_or_else(|_| Template::builtin());
        // the exact plugin that acquired the lease, or nothing
        let plugin = self.cfg.registry.plugin(&lease_row.plugin_id).cloned();
        let identity_ok = plugin.as_ref().is_some_and(|p| {
            p.manifest
                .driver(&lease_row.driver_key)
                .is_some_and(|d| d.kind == sandhost_contract::manifest::DriverKind::SandboxProvider)
        });
        let Some(plugin) = plugin.filter(|_| identity_ok) else {
            let state = if self.cfg.registry.plugin(&lease_row.plugin_id).is_some() {
                format!(
                    "changed: it no longer declares `{}` as a sandbox provider",
                    lease_row.driver_key
                )
            } else {
                "absent".to_string()
            };
            return Err(HostError::PluginIdentity {
                sandbox: id.into(),
                pinned: lease_row.plugin_id,
                state,
            });
        };
        if plugin.manifest.version != lease_row.plugin_version {
            tracing::warn!(
                "sandbox {id} was created by {}@{}; now {}",
                lease_row.plugin_id,
                lease_row.plugin_version,
                plugin.manifest.version
            );
        }
        let worker = self.worker(&plugin).await?;
        let (driver_key, config) = self.with_store(|s| s.environment(&lease_row.environment_id))?;
        let config_failed = self.validate_config(&worker, &driver_key, &config).await?;
        let facts = RunFacts {
            driver_key: &driver_key,
            lease: LeaseFacts::from_metadata(lease_row.policy, &lease_row.metadata),
            pinned_plugin_id: Some(&lease_row.plugin_id),
            config_resolution_failed: config_failed,
        };
        let snapshot = CapabilitySnapshot::resolve(
            Some(&plugin.manifest),
            Verified::methods(worker.supported_methods().iter().cloned()),
            &facts,
        );
        if snapshot.grants_nothing() && !worker.supports("environmentExecute") {
            return Err(HostError::MissingMethod {
                driver_key,
                what: "run commands",
                method: "environmentExecute",
            });
        }
        let scope = scope(&driver_key, &lease_row.environment_id, &config);
        let stored = Lease {
            provider_lease_id: lease_row.provider_lease_id.clone(),
            metadata: metadata_map(&lease_row.metadata),
            expires_at: lease_row.expires_at.map(iso8601),
        };
        let commands = template.effective_capabilities();
        let mut sandbox = Sandbox {
            record,
            template,
            commands,
            ctx: LeaseContext {
                worker: worker.clone(),
                scope: scope.clone(),
                lease: stored,
                snapshot,
            },
            outcome: LeaseOutcome::Resumed,
            outcome_reason: "stored lease used as is (reuse not effective)".into(),
        };
        if !sandbox
            .ctx
            .snapshot
            .allows(ProviderCapability::ReusableLeases)
        {
            return Ok(sandbox);
        }
        // reuse: resume, or destroy the stale lease and acquire a replacement
        let pid = lease_row.provider_lease_id.clone().unwrap_or_default();
        let resumed = worker
            .call::<methods::ResumeLease>(&ResumeLeaseParams {
                scope: scope.clone(),
                provider_lease_id: pid.clone(),
                lease_metadata: metadata_map(&lease_row.metadata),
            })
            .await?;
        if let Some(new_pid) = resumed.provider_lease_id.clone() {
            let meta = resumed
                .metadata
                .clone()
                .map(Value::Object)
                .unwrap_or(lease_row.metadata.clone());
            self.with_store(|s| {
                s.lease_acquired(
                    &lease_row.id,
                    &new_pid,
                    &meta,
                    lease_row.expires_at,
                    LeaseOutcome::Resumed,
                    "provider resumed the lease",
                )
            })?;
            sandbox.ctx.lease = Lease {
                expires_at: lease_row.expires_at.map(iso8601),
                ..resumed
            };
            sandbox.outcome_reason = "provider resumed the lease".into();
            return Ok(sandbox);
        }
        let why = resumed
            .metadata
            .as_ref()
            .and_then(|m| m.get("reason"))
            .and_then(Value::as_str)
            .unwrap_or("gone")
            .to_string();
        self.destroy_lease_row(&worker, &scope, &lease_row).await;
        let ttl = lease_row
            .expires_at
            .map(|e| Duration::from_secs((e - lease_row.created_at).max(1) as u64))
            .unwrap_or(DEFAULT_TTL);
        let reason = format!("previous lease {why}: replaced");
        let (row, lease) = self
            .acquire(
                &worker,
                &plugin,
                &scope,
                lease_row.policy,
                ttl,
                LeaseOutcome::Replacement,
                &reason,
            )
            .await?;
        self.with_store(|s| s.set_sandbox_lease(&sandbox.record.id, &row.id, row.expires_at))?;
        sandbox.record.lease_id = row.id;
        sandbox.record.expires_at = row.expires_at;
        sandbox.ctx.lease = lease;
        sandbox.outcome = LeaseOutcome::Replacement;
        sandbox.outcome_reason = reason;
        Ok(sandbox)
    }

    /// End a lease at the provider: destroy when it can, else release.
    async fn destroy_lease_row(
        &self,
        worker: &Worker,
        scope: &EnvironmentScope,
        row: &LeaseRecord,
    ) {
        // a row that never got a provider id travelled as runId = row id
        let pid = row
            .provider_lease_id
            .clone()
            .unwrap_or_else(|| row.id.clone());
        let params = LeaseEndParams {
            scope: scope.clone(),
            provider_lease_id: pid,
            lease_metadata: metadata_map(&row.metadata),
            cancel_active_work: Some(true),
        };
        let r = if worker.supports("environmentDestroyLease") {
            worker.call::<methods::DestroyLease>(&params).await
        } else {
            worker.call::<methods::ReleaseLease>(&params).await
        };
        if let Err(e) = r {
            tracing::warn!("ending lease {} failed: {e}", row.id);
        }
        let _ = self.with_store(|s| s.transition_lease(&row.id, row.state, LeaseState::Destroyed));
        let _ = self.with_store(|s| {
            let l = s.lease(&row.id)?;
            if l.state != LeaseState::Destroyed {
                s.claim_lease(&l, LeaseState::Destroyed)?;
            }
            Ok(())
        });
    }

    /// Destroy a sandbox: its lease is ended at the provider and its rows go.
    pub async fn destroy(&self, sandbox: &Sandbox) -> Result<()> {
        let row = self.with_store(|s| s.lease(&sandbox.record.lease_id))?;
        self.destroy_lease_row(&sandbox.ctx.worker, &sandbox.ctx.scope, &row)
            .await;
        self.with_store(|s| s.delete_sandbox(&sandbox.record.id))?;
        Ok(())
    }

    /// Destroy a sandbox by id, whether or not it can still be resumed.
    pub async fn kill(&self, id: &str) -> Result<()> {
        let record = self.with_store(|s| s.sandbox(id))?;
        let row = self.with_store(|s| s.lease(&record.lease_id))?;
        let Some(plugin) = self.cfg.registry.plugin(&row.plugin_id).cloned() else {
            return Err(HostError::PluginIdentity {
                sandbox: id.into(),
                pinned: row.plugin_id,
                state: "absent".into(),
            });
        };
        // claim it: of several processes killing one sandbox, one does it and
        // the others are told it is gone
        // only a live lease can be claimed: one already `destroying` belongs
        // to the process that claimed it first
        let live = matches!(row.state, LeaseState::Active | LeaseState::Released);
        if !live || !self.with_store(|s| s.claim_lease(&row, LeaseState::Destroying))? {
            return Err(RuntimeError::NotFound {
                what: "sandbox",
                id: id.into(),
            }
            .into());
        }
        let claimed = self.with_store(|s| s.lease(&row.id))?;
        let worker = self.worker(&plugin).await?;
        let (driver_key, config) = self.with_store(|s| s.environment(&row.environment_id))?;
        self.destroy_lease_row(
            &worker,
            &scope(&driver_key, &row.environment_id, &config),
            &claimed,
        )
        .await;
        self.with_store(|s| s.delete_sandbox(id))?;
        Ok(())
    }

    pub fn list(&self) -> Result<Vec<SandboxRecord>> {
        self.with_store(|s| s.sandboxes())
    }

    /// Destroy expired leases and leases a dead process left half-done.
    /// Returns how many were cleaned. Failures are logged, never fatal.
    pub async fn reap(&self) -> usize {
        let Ok(found) = self.with_store(|s| s.leases_needing_cleanup(now_secs(), STUCK_AFTER_SECS))
        else {
            return 0;
        };
        let mut cleaned = 0;
        for row in found {
            if !self
                .with_store(|s| s.claim_lease(&row, LeaseState::Destroying))
                .unwrap_or(false)
            {
                continue; // another process has it
            }
            let claimed = match self.with_store(|s| s.lease(&row.id)) {
                Ok(l) => l,
                Err(_) => continue,
            };
            if let Some(plugin) = self.cfg.registry.plugin(&row.plugin_id).cloned() {
                if let (Ok(worker), Ok((key, config))) = (
                    self.worker(&plugin).await,
                    self.with_store(|s| s.environment(&row.environment_id)),
                ) {
                    self.destroy_lease_row(
                        &worker,
                        &scope(&key, &row.environment_id, &config),
                        &claimed,
                    )
                    .await;
                }
            }
            let _ = self.with_store(|s| {
                for sb in s.sandboxes_of_lease(&row.id)? {
                    s.delete_sandbox(&sb.id)?;
                }
                s.transition_lease(&row.id, LeaseState::Destroying, LeaseState::Destroyed)
            });
            cleaned += 1;
        }
        cleaned
    }

    /// Shut every worker down gracefully.
    pub async fn shutdown(self) {
        let workers: Vec<_> = self
            .workers
            .lock()
            .await
            .drain()
            .filter_map(|(_, slot)| slot.worker)
            .collect();
        for w in workers {
            match Arc::try_unwrap(w) {
                Ok(w) => w.shutdown().await,
                Err(w) => w.kill(),
            }
        }
    }
}

/// Seconds since the epoch as an instant, for callers that print times.
pub fn system_time(secs: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64)
}
