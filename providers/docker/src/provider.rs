//! The [`Provider`] implementation: the worker methods on top of
//! [`crate::engine`], [`crate::exec`], [`crate::sync`] and [`crate::duplex`].

use std::collections::BTreeMap;
use std::time::Duration;

use bollard::Docker;
use sandhost_protocol::{
    AcquireLeaseParams, Diagnostic, EnvironmentScope, ExecuteParams, ExecuteResult, HealthResult,
    HealthStatus, Lease, LeaseEndParams, LeaseEndResult, LeaseEndState, LeaseGoneReason,
    LeaseReceipt, ProbeParams, ProbeResult, ResumeLeaseParams, Severity, SyncParams, SyncResult,
    ValidateConfigParams, ValidateConfigResult,
};
use sandhost_provider::{
    async_trait, ConfigOps, DuplexOps, ExecOps, LeaseOps, LeaseReuseOps, ProbeOps, Provider,
    ProviderResult, RequestContext, SyncOps,
};
use serde_json::{json, Map, Value};
use tokio::sync::OnceCell;

use crate::config::{self, valid_env_name, Network};
use crate::duplex::Channels;
use crate::engine::{self, Found, LeaseInfo, Owner};
use crate::error::{DockerError, Result};
use crate::exec::{self, ExecSpec};

/// The Docker provider worker.
#[derive(Debug, Default)]
pub struct DockerProvider {
    docker: OnceCell<Docker>,
    pub(crate) channels: Channels,
}

impl DockerProvider {
    pub fn new() -> Self {
        Self::default()
    }

    /// The engine connection, made on first use.
    pub async fn docker(&self) -> Result<&Docker> {
        self.docker.get_or_try_init(engine::connect).await
    }

    pub(crate) async fn lease_of(
        &self,
        scope: &EnvironmentScope,
        lease: &Lease,
    ) -> Result<(Docker, LeaseInfo)> {
        let docker = self.docker().await?.clone();
        let info =
            engine::require(&docker, lease.provider_lease_id.as_deref(), &owner(scope)).await?;
        Ok((docker, info))
    }
}

pub(crate) fn owner(scope: &EnvironmentScope) -> Owner {
    Owner {
        tenant: scope.company_id.clone(),
        environment: scope.environment_id.clone(),
    }
}

fn lease_value(info: &LeaseInfo) -> Lease {
    let mut metadata = Map::new();
    metadata.insert("containerId".into(), json!(info.container_id));
    metadata.insert("workdir".into(), json!(info.workdir));
    Lease {
        provider_lease_id: Some(info.lease_id.clone()),
        metadata: Some(metadata),
        expires_at: Some(engine::iso8601(info.expires_at)),
    }
}

/// Resolve a lease-relative or absolute cwd against the workdir.
fn resolve_cwd(workdir: &str, cwd: &str) -> Result<String> {
    if cwd.contains('\0') {
        return Err(DockerError::InvalidParams("cwd contains a nul byte".into()));
    }
    Ok(if cwd.starts_with('/') {
        cwd.to_string()
    } else {
        format!("{}/{}", workdir.trim_end_matches('/'), cwd)
    })
}

#[async_trait]
impl Provider for DockerProvider {
    async fn health(&self) -> ProviderResult<HealthResult> {
        Ok(match self.docker().await {
            Ok(d) => match d.ping().await {
                Ok(_) => HealthResult {
                    status: HealthStatus::Ok,
                    message: None,
                    details: None,
                },
                Err(e) => HealthResult {
                    status: HealthStatus::Degraded,
                    message: Some(format!("the docker engine does not answer: {e}")),
                    details: Some(json!({"code": "E6101"})),
                },
            },
            Err(e) => HealthResult {
                status: HealthStatus::Degraded,
                message: Some(e.to_string()),
                details: Some(json!({"code": e.code()})),
            },
        })
    }

    async fn shutdown(&self) {
        self.channels.close_all().await;
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
impl ConfigOps for DockerProvider {
    async fn validate_config(
        &self,
        params: ValidateConfigParams,
    ) -> ProviderResult<ValidateConfigResult> {
        let (cfg, mut warnings) = match config::parse(&params.config) {
            Ok(v) => v,
            Err(errors) => {
                return Ok(ValidateConfigResult {
                    ok: false,
                    warnings: vec![],
                    errors,
                    normalized_config: None,
                })
            }
        };
        let mut errors = vec![];
        if cfg.network == Network::Egress {
            match self.docker().await {
                Ok(d) => {
                    let bridge = d
                        .inspect_network(
                            "bridge",
                            None::<bollard::query_parameters::InspectNetworkOptions>,
                        )
                        .await;
                    if bridge.is_err() {
                        errors.push("network egress is not supported on this engine: it has no `bridge` network (dockerd runs with --bridge=none)".to_string());
                    }
                }
                Err(e) => warnings.push(format!("cannot check network egress: {e}")),
            }
        }
        Ok(ValidateConfigResult {
            ok: errors.is_empty(),
            warnings,
            normalized_config: errors.is_empty().then(|| cfg.normalized()),
            errors,
        })
    }
}

#[async_trait]
impl ProbeOps for DockerProvider {
    async fn probe(&self, params: ProbeParams) -> ProviderResult<ProbeResult> {
        Ok(crate::probe::probe(self, &params.scope.config).await)
    }
}

#[async_trait]
impl LeaseOps for DockerProvider {
    async fn acquire_lease(&self, params: AcquireLeaseParams) -> ProviderResult<Lease> {
        let cfg = config::parse_strict(&params.scope.config)?;
        let docker = self.docker().await?;
        if let Err(e) = engine::sweep(docker).await {
            tracing::warn!("sweep of expired leases failed: {e}");
        }
        let lease_id = if engine::valid_lease_id(&params.run_id) {
            params.run_id.clone()
        } else {
            format!("lease-{}", exec::token())
        };
        let now = engine::now_secs();
        let cap = now + cfg.max_lease_secs;
        let expires_at = params
            .requested_expires_at
            .as_deref()
            .and_then(engine::parse_iso8601)
            .map(|r| r.min(cap))
            .unwrap_or(cap)
            .max(now + 1);
        let own = owner(&params.scope);
        // A host that retries an acquire for the same run gets the same lease.
        if let Found::Live(info) = engine::find(docker, &lease_id, Some(&own)).await? {
            return Ok(lease_value(&info));
        }
        let info = engine::create_lease(docker, &cfg, &lease_id, &own, expires_at).await?;
        tracing::info!(lease = %lease_id, container = %info.container_id, "acquired");
        Ok(lease_value(&info))
    }

    /// Release stops nothing: a retained lease outlives the worker and the
    /// run; it ends at its expiry (sweep) or on destroy.
    async fn release_lease(&self, params: LeaseEndParams) -> ProviderResult<LeaseEndResult> {
        let docker = self.docker().await?;
        if params.cancel_active_work == Some(true) {
            if let Found::Live(info) = engine::find(
                docker,
                &params.provider_lease_id,
                Some(&owner(&params.scope)),
            )
            .await?
            {
                // Kill every command running beside the keep-alive.
                let _ = exec::sh_ok(
                    docker,
                    &info.container_id,
                    "for f in /tmp/.sandhost/*.pid; do [ -f \"$f\" ] && kill -KILL -\"$(cat \"$f\")\" 2>/dev/null; rm -f \"$f\"; done; exit 0",
                    &[],
                )
                .await;
            }
        }
        Ok(None)
    }
}

#[async_trait]
impl LeaseReuseOps for DockerProvider {
    async fn resume_lease(&self, params: ResumeLeaseParams) -> ProviderResult<Lease> {
        let docker = self.docker().await?;
        Ok(
            match engine::find(
                docker,
                &params.provider_lease_id,
                Some(&owner(&params.scope)),
            )
            .await?
            {
                Found::Live(info) => lease_value(&info),
                Found::Missing => Lease::gone(LeaseGoneReason::NotFound),
                Found::Expired => Lease::gone(LeaseGoneReason::Expired),
                Found::Mismatch => Lease::gone(LeaseGoneReason::IdentityMismatch),
            },
        )
    }

    async fn destroy_lease(&self, params: LeaseEndParams) -> ProviderResult<LeaseEndResult> {
        let docker = self.docker().await?;
        let id = &params.provider_lease_id;
        if !engine::valid_lease_id(id) {
            return Err(DockerError::InvalidLeaseId(id.clone()).into());
        }
        match engine::find(docker, id, Some(&owner(&params.scope))).await? {
            Found::Mismatch => return Err(DockerError::LeaseMismatch(id.clone()).into()),
            Found::Live(info) => engine::remove(docker, &info.container_id).await?,
            Found::Missing | Found::Expired => {}
        }
        self.channels.close_lease(id).await;
        Ok(Some(LeaseReceipt {
            provider_lease_id: id.clone(),
            state: LeaseEndState::Destroyed,
        }))
    }
}

#[async_trait]
impl ExecOps for DockerProvider {
    async fn execute(
        &self,
        ctx: &RequestContext,
        params: ExecuteParams,
    ) -> ProviderResult<ExecuteResult> {
        let (docker, info) = self.lease_of(&params.scope, &params.lease).await?;
        let args = params.args.clone().unwrap_or_default();
        let env: BTreeMap<String, String> = params.env.clone().unwrap_or_default();
        for (k, v) in &env {
            if !valid_env_name(k) || v.contains('\0') {
                return Err(DockerError::InvalidParams(format!("invalid env entry `{k}`")).into());
            }
        }
        let cwd = params
            .cwd
            .as_deref()
            .map(|c| resolve_cwd(&info.workdir, c))
            .transpose()?;
        let token = exec::token();
        let session = params.bypass_session != Some(true);
        let argv = if session {
            let body = exec::session_body(&params.command, &args);
            let pairs: Vec<(String, String)> = env.into_iter().collect();
            exec::session_argv(&token, &info.workdir, cwd.as_deref(), &body, &pairs)
        } else {
            let mut full = vec![params.command.clone()];
            full.extend(args);
            exec::oneshot_argv(&token, cwd.as_deref().unwrap_or(&info.workdir), &full)
        };
        let exec_env = if session {
            vec![]
        } else {
            params
                .env
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        };
        let spec = ExecSpec {
            argv,
            env: exec_env,
            stdin: params.stdin.map(String::into_bytes),
            timeout: params.timeout_ms.map(Duration::from_millis),
            token: Some(token),
            output_cap: exec::DEFAULT_OUTPUT_CAP,
            user: None,
        };
        let sink = ctx.execute_log();
        let out = exec::run(&docker, &info.container_id, spec, Some(&sink)).await?;
        let mut metadata = Map::new();
        metadata.insert("session".into(), Value::Bool(session));
        if out.stdout_dropped > 0 || out.stderr_dropped > 0 {
            metadata.insert("truncated".into(), Value::Bool(true));
            metadata.insert("stdoutDroppedBytes".into(), json!(out.stdout_dropped));
            metadata.insert("stderrDroppedBytes".into(), json!(out.stderr_dropped));
        }
        Ok(ExecuteResult {
            exit_code: out.exit_code.map(|c| c as i32),
            signal: out.timed_out.then(|| "SIGKILL".to_string()),
            timed_out: out.timed_out,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            metadata: Some(metadata),
        })
    }
}

#[async_trait]
impl SyncOps for DockerProvider {
    async fn sync_in(&self, params: SyncParams) -> ProviderResult<SyncResult> {
        let (docker, info) = self.lease_of(&params.scope, &params.lease).await?;
        Ok(crate::sync::sync_in(&docker, &info, &params.operations).await?)
    }

    async fn sync_out(&self, params: SyncParams) -> ProviderResult<SyncResult> {
        let (docker, info) = self.lease_of(&params.scope, &params.lease).await?;
        Ok(crate::sync::sync_out(&docker, &info, &params.operations).await?)
    }
}

/// Severity helper for the probe.
pub(crate) fn diag(severity: Severity, code: &str, message: impl Into<String>) -> Diagnostic {
    Diagnostic {
        severity,
        message: message.into(),
        code: Some(code.to_string()),
        details: None,
    }
}
