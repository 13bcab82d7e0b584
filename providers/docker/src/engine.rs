//! The connection to the Docker engine and the lease lifecycle.
//!
//! A lease is one container named `sandhost-<leaseId>` and labelled
//! `sandhost.managed=true`, `sandhost.lease=<leaseId>`, `sandhost.tenant`,
//! `sandhost.environment` and `sandhost.expiresAt` (unix seconds). Everything
//! a later worker process needs is in the engine, so any worker can resume,
//! execute in or destroy a lease another worker acquired.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bollard::models::{
    ContainerCreateBody, HostConfig, Mount, MountType, MountVolumeOptions,
    MountVolumeOptionsDriverConfig, ResourcesUlimits,
};
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, ListContainersOptions, RemoveContainerOptions,
    StartContainerOptions,
};
use bollard::Docker;

use crate::config::{DockerConfig, Network, DEFAULT_TMP};
use crate::error::{is_not_found, DockerError, Result};

pub const LABEL_MANAGED: &str = "sandhost.managed";
pub const LABEL_LEASE: &str = "sandhost.lease";
pub const LABEL_TENANT: &str = "sandhost.tenant";
pub const LABEL_ENVIRONMENT: &str = "sandhost.environment";
pub const LABEL_EXPIRES: &str = "sandhost.expiresAt";
pub const LABEL_WORKDIR: &str = "sandhost.workdir";
/// Keep-alive beyond the expiry, so the sweep (not the sleep) normally ends it.
const KEEPALIVE_GRACE_SECS: u64 = 60;

/// Where the engine listens: `DOCKER_HOST` (unix:// only) or the default socket.
pub fn socket_path() -> String {
    match std::env::var("DOCKER_HOST") {
        Ok(h) if h.starts_with("unix://") => h.trim_start_matches("unix://").to_string(),
        _ => "/var/run/docker.sock".to_string(),
    }
}

/// Connect and agree on an API version the engine speaks.
pub async fn connect() -> Result<Docker> {
    let socket = socket_path();
    let unreachable = |detail: String| DockerError::EngineUnreachable {
        socket: socket.clone(),
        detail,
    };
    let docker = Docker::connect_with_unix(&socket, 120, bollard::API_DEFAULT_VERSION)
        .map_err(|e| unreachable(e.to_string()))?;
    docker
        .negotiate_version()
        .await
        .map_err(|e| unreachable(e.to_string()))
}

pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub fn iso8601(secs: u64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs)).to_string()
}

pub fn parse_iso8601(s: &str) -> Option<u64> {
    humantime::parse_rfc3339_weak(s)
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
}

/// A lease id is `[A-Za-z0-9_-]{1,64}`.
pub fn valid_lease_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub fn container_name(lease_id: &str) -> String {
    format!("sandhost-{lease_id}")
}

/// Who may use a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub tenant: String,
    pub environment: String,
}

/// A live lease container as found on the engine.
#[derive(Debug, Clone)]
pub struct LeaseInfo {
    pub lease_id: String,
    pub container_id: String,
    pub expires_at: u64,
    pub workdir: String,
    pub running: bool,
    pub paused: bool,
}

/// What resuming a lease found.
#[derive(Debug)]
pub enum Found {
    Live(LeaseInfo),
    Missing,
    Expired,
    Mismatch,
}

/// Create and start the container of a new lease.
pub async fn create_lease(
    docker: &Docker,
    cfg: &DockerConfig,
    lease_id: &str,
    owner: &Owner,
    expires_at: u64,
) -> Result<LeaseInfo> {
    match docker.inspect_image(&cfg.image).await {
        Ok(_) => {}
        Err(e) if is_not_found(&e) => return Err(DockerError::ImageMissing(cfg.image.clone())),
        Err(e) => return Err(DockerError::engine("inspect image")(e)),
    }
    let mut labels = HashMap::new();
    labels.insert(LABEL_MANAGED.to_string(), "true".to_string());
    labels.insert(LABEL_LEASE.to_string(), lease_id.to_string());
    labels.insert(LABEL_TENANT.to_string(), owner.tenant.clone());
    labels.insert(LABEL_ENVIRONMENT.to_string(), owner.environment.clone());
    labels.insert(LABEL_EXPIRES.to_string(), expires_at.to_string());
    labels.insert(LABEL_WORKDIR.to_string(), cfg.workdir.clone());

    let tmpfs_opts = |size: i64, mode: &str| format!("rw,nosuid,nodev,size={size},mode={mode}");
    // The workspace is an anonymous volume of the local driver backed by a
    // size-limited tmpfs: the archive endpoints (native sync) reach volumes,
    // not `HostConfig.tmpfs` mounts. It goes with the container (`v=true`,
    // auto-remove).
    let mut vol_labels = HashMap::new();
    vol_labels.insert(LABEL_MANAGED.to_string(), "true".to_string());
    vol_labels.insert(LABEL_LEASE.to_string(), lease_id.to_string());
    let mut driver_opts = HashMap::new();
    driver_opts.insert("type".to_string(), "tmpfs".to_string());
    driver_opts.insert("device".to_string(), "tmpfs".to_string());
    driver_opts.insert(
        "o".to_string(),
        format!("size={},mode=0755,nosuid,nodev", cfg.disk_bytes),
    );
    let workspace = Mount {
        target: Some(cfg.workdir.clone()),
        typ: Some(MountType::VOLUME),
        volume_options: Some(MountVolumeOptions {
            no_copy: Some(true),
            labels: Some(vol_labels),
            driver_config: Some(MountVolumeOptionsDriverConfig {
                name: Some("local".into()),
                options: Some(driver_opts),
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut tmpfs = HashMap::new();
    if cfg.workdir != "/tmp" {
        tmpfs.insert(
            "/tmp".to_string(),
            tmpfs_opts(cfg.disk_bytes.min(DEFAULT_TMP), "1777"),
        );
    }
    let network_mode = match cfg.network {
        Network::None => "none",
        Network::Egress => "bridge",
    };
    let host_config = HostConfig {
        cap_drop: Some(vec!["ALL".into()]),
        security_opt: Some(vec!["no-new-privileges".into()]),
        readonly_rootfs: Some(cfg.read_only_root),
        tmpfs: Some(tmpfs),
        mounts: Some(vec![workspace]),
        memory: Some(cfg.memory_bytes),
        memory_swap: Some(cfg.memory_bytes),
        nano_cpus: Some(cfg.cpus_milli * 1_000_000),
        pids_limit: Some(cfg.pids),
        network_mode: Some(network_mode.into()),
        init: Some(true),
        auto_remove: Some(true),
        privileged: Some(false),
        ipc_mode: Some("private".into()),
        ulimits: Some(vec![
            ResourcesUlimits {
                name: Some("nofile".into()),
                soft: Some(4096),
                hard: Some(4096),
            },
            ResourcesUlimits {
                name: Some("core".into()),
                soft: Some(0),
                hard: Some(0),
            },
        ]),
        ..Default::default()
    };
    let keepalive = expires_at.saturating_sub(now_secs()) + KEEPALIVE_GRACE_SECS;
    let mut env: Vec<String> = cfg.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if !cfg.env.contains_key("HOME") {
        env.push(format!("HOME={}", cfg.workdir));
    }
    let body = ContainerCreateBody {
        image: Some(cfg.image.clone()),
        cmd: Some(vec!["sleep".into(), keepalive.to_string()]),
        entrypoint: Some(vec![]),
        env: Some(env),
        working_dir: Some(cfg.workdir.clone()),
        labels: Some(labels),
        user: cfg.user.clone(),
        network_disabled: Some(cfg.network == Network::None),
        host_config: Some(host_config),
        ..Default::default()
    };
    let name = container_name(lease_id);
    let created = docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.clone()),
                ..Default::default()
            }),
            body,
        )
        .await
        .map_err(DockerError::engine("create container"))?;
    for w in &created.warnings {
        tracing::warn!(lease = lease_id, "engine warning: {w}");
    }
    if let Err(e) = docker
        .start_container(&created.id, None::<StartContainerOptions>)
        .await
    {
        let _ = remove(docker, &created.id).await;
        return Err(DockerError::engine("start container")(e));
    }
    Ok(LeaseInfo {
        lease_id: lease_id.to_string(),
        container_id: created.id,
        expires_at,
        workdir: cfg.workdir.clone(),
        running: true,
        paused: false,
    })
}

/// Find a lease's container and check it belongs to `owner` (when given).
pub async fn find(docker: &Docker, lease_id: &str, owner: Option<&Owner>) -> Result<Found> {
    if !valid_lease_id(lease_id) {
        return Ok(Found::Missing);
    }
    let inspect = match docker
        .inspect_container(&container_name(lease_id), None::<InspectContainerOptions>)
        .await
    {
        Ok(i) => i,
        Err(e) if is_not_found(&e) => return Ok(Found::Missing),
        Err(e) => return Err(DockerError::engine("inspect container")(e)),
    };
    let labels = inspect
        .config
        .as_ref()
        .and_then(|c| c.labels.clone())
        .unwrap_or_default();
    let label = |k: &str| labels.get(k).map(String::as_str);
    if label(LABEL_MANAGED) != Some("true") || label(LABEL_LEASE) != Some(lease_id) {
        // Same name, but not ours: never touch it.
        return Ok(Found::Missing);
    }
    if let Some(o) = owner {
        if label(LABEL_TENANT) != Some(o.tenant.as_str())
            || label(LABEL_ENVIRONMENT) != Some(o.environment.as_str())
        {
            return Ok(Found::Mismatch);
        }
    }
    let expires_at = label(LABEL_EXPIRES)
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(0);
    let container_id = inspect.id.clone().unwrap_or_default();
    let state = inspect.state.clone().unwrap_or_default();
    let running = state.running.unwrap_or(false);
    if expires_at <= now_secs() {
        let _ = remove(docker, &container_id).await;
        return Ok(Found::Expired);
    }
    if !running {
        // A stopped lease container cannot come back: its tmpfs are gone.
        let _ = remove(docker, &container_id).await;
        return Ok(Found::Missing);
    }
    Ok(Found::Live(LeaseInfo {
        lease_id: lease_id.to_string(),
        container_id,
        expires_at,
        workdir: label(LABEL_WORKDIR).unwrap_or("/workspace").to_string(),
        running,
        paused: state.paused.unwrap_or(false),
    }))
}

/// The live lease named by `lease_id`, or why it cannot be used.
pub async fn require(docker: &Docker, lease_id: Option<&str>, owner: &Owner) -> Result<LeaseInfo> {
    let id = lease_id
        .ok_or_else(|| DockerError::InvalidParams("the lease has no providerLeaseId".into()))?;
    if !valid_lease_id(id) {
        return Err(DockerError::InvalidLeaseId(id.to_string()));
    }
    match find(docker, id, Some(owner)).await? {
        Found::Live(l) => Ok(l),
        Found::Missing => Err(DockerError::LeaseNotFound(id.to_string())),
        Found::Expired => Err(DockerError::LeaseExpired(id.to_string())),
        Found::Mismatch => Err(DockerError::LeaseMismatch(id.to_string())),
    }
}

/// Force-remove a container with its anonymous volumes; gone already is fine.
pub async fn remove(docker: &Docker, container: &str) -> Result<()> {
    match docker
        .remove_container(
            container,
            Some(RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        )
        .await
    {
        Ok(()) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        // 409: removal already in progress (auto-remove raced us).
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409, ..
        }) => Ok(()),
        Err(e) => Err(DockerError::engine("remove container")(e)),
    }
}

/// The ids of containers labelled `sandhost.managed=true` (optionally one lease).
pub async fn managed_containers(
    docker: &Docker,
    lease_id: Option<&str>,
) -> Result<Vec<(String, HashMap<String, String>)>> {
    let mut label = vec![format!("{LABEL_MANAGED}=true")];
    if let Some(id) = lease_id {
        label.push(format!("{LABEL_LEASE}={id}"));
    }
    let mut filters = HashMap::new();
    filters.insert("label".to_string(), label);
    let list = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(filters),
            ..Default::default()
        }))
        .await
        .map_err(DockerError::engine("list containers"))?;
    Ok(list
        .into_iter()
        .filter_map(|c| Some((c.id?, c.labels.unwrap_or_default())))
        .collect())
}

/// Remove every managed container whose expiry passed (or that has none).
/// Returns how many were removed.
pub async fn sweep(docker: &Docker) -> Result<usize> {
    let now = now_secs();
    let mut removed = 0;
    for (id, labels) in managed_containers(docker, None).await? {
        let expires = labels
            .get(LABEL_EXPIRES)
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0);
        if expires <= now {
            tracing::info!(container = %id, "sweeping expired lease container");
            remove(docker, &id).await?;
            removed += 1;
        }
    }
    Ok(removed)
}
