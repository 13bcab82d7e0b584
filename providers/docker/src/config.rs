//! The provider config: what the host derives from a template (`image`,
//! `env`, `workdir`, `resources`, `network`) plus this provider's own keys.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use crate::error::{DockerError, Result};

pub const DEFAULT_WORKDIR: &str = "/workspace";
pub const DEFAULT_MEMORY: i64 = 1 << 30;
pub const DEFAULT_PIDS: i64 = 512;
pub const DEFAULT_CPUS_MILLI: i64 = 1000;
pub const DEFAULT_DISK: i64 = 1 << 30;
pub const DEFAULT_TMP: i64 = 256 << 20;
/// Default cap of a lease's lifetime.
pub const DEFAULT_MAX_LEASE_SECS: u64 = 300;
/// Highest `maxLeaseSeconds` accepted.
pub const MAX_LEASE_SECS: u64 = 24 * 3600;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    None,
    Egress,
}

/// A validated provider config.
#[derive(Debug, Clone, PartialEq)]
pub struct DockerConfig {
    pub image: String,
    pub env: BTreeMap<String, String>,
    pub workdir: String,
    pub memory_bytes: i64,
    pub cpus_milli: i64,
    pub pids: i64,
    pub disk_bytes: i64,
    pub network: Network,
    pub read_only_root: bool,
    pub max_lease_secs: u64,
    /// `user` of the container (`uid[:gid]` or a name); default: the image's.
    pub user: Option<String>,
}

const KNOWN: &[&str] = &[
    "image",
    "env",
    "workdir",
    "resources",
    "network",
    "readOnlyRoot",
    "maxLeaseSeconds",
    "user",
    "rootfs",
];

/// Parse `config`; `Ok((config, warnings))` or every problem found.
pub fn parse(config: &Value) -> std::result::Result<(DockerConfig, Vec<String>), Vec<String>> {
    let empty = Map::new();
    let obj = match config {
        Value::Object(o) => o,
        Value::Null => &empty,
        _ => return Err(vec!["config must be an object".into()]),
    };
    let mut errors = vec![];
    let mut warnings = vec![];
    for k in obj.keys() {
        if !KNOWN.contains(&k.as_str()) {
            warnings.push(format!("unknown config key `{k}` is ignored"));
        }
    }
    if obj.contains_key("rootfs") {
        warnings.push("`rootfs` is ignored by the docker provider (use `image`)".into());
    }
    let image = match obj.get("image") {
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(_) => {
            errors.push("`image` must be a non-empty string".into());
            String::new()
        }
        None => {
            errors.push(
                "`image` is required (this provider never pulls: build or load it first)".into(),
            );
            String::new()
        }
    };
    let mut env = BTreeMap::new();
    match obj.get("env") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                if !valid_env_name(k) {
                    errors.push(format!("env name `{k}` is invalid"));
                }
                match v {
                    Value::String(s) => {
                        if s.contains('\0') {
                            errors.push(format!("env `{k}` contains a nul byte"));
                        }
                        env.insert(k.clone(), s.clone());
                    }
                    _ => errors.push(format!("env `{k}` must be a string")),
                }
            }
        }
        Some(_) => errors.push("`env` must be an object of strings".into()),
    }
    let workdir = match obj.get("workdir") {
        None | Some(Value::Null) => DEFAULT_WORKDIR.to_string(),
        Some(Value::String(s)) if s.starts_with('/') && !s.contains('\0') => s.clone(),
        Some(_) => {
            errors.push("`workdir` must be an absolute path".into());
            DEFAULT_WORKDIR.to_string()
        }
    };
    let res = obj.get("resources").and_then(Value::as_object);
    if obj
        .get("resources")
        .is_some_and(|r| !r.is_object() && !r.is_null())
    {
        errors.push("`resources` must be an object".into());
    }
    let mut num = |key: &str, default: i64, min: i64| -> i64 {
        match res.and_then(|r| r.get(key)) {
            None | Some(Value::Null) => default,
            Some(v) => match v.as_i64() {
                Some(n) if n >= min => n,
                _ => {
                    errors.push(format!("resources.{key} must be an integer >= {min}"));
                    default
                }
            },
        }
    };
    let memory_bytes = num("memoryBytes", DEFAULT_MEMORY, 6 << 20);
    let cpus_milli = num("cpusMilli", DEFAULT_CPUS_MILLI, 10);
    let pids = num("pids", DEFAULT_PIDS, 8);
    let disk_bytes = num("diskBytes", DEFAULT_DISK, 1 << 20);
    let network = match obj.get("network") {
        None | Some(Value::Null) => Network::None,
        Some(Value::String(s)) if s == "none" => Network::None,
        Some(Value::String(s)) if s == "egress" => Network::Egress,
        Some(v) => {
            errors.push(format!("`network` must be \"none\" or \"egress\", not {v}"));
            Network::None
        }
    };
    let read_only_root = match obj.get("readOnlyRoot") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            errors.push("`readOnlyRoot` must be a boolean".into());
            true
        }
    };
    let max_lease_secs = match obj.get("maxLeaseSeconds") {
        None | Some(Value::Null) => DEFAULT_MAX_LEASE_SECS,
        Some(v) => match v.as_u64() {
            Some(n) if (10..=MAX_LEASE_SECS).contains(&n) => n,
            _ => {
                errors.push(format!(
                    "`maxLeaseSeconds` must be an integer between 10 and {MAX_LEASE_SECS}"
                ));
                DEFAULT_MAX_LEASE_SECS
            }
        },
    };
    let user = match obj.get("user") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if !s.is_empty() && !s.contains('\0') => Some(s.clone()),
        Some(_) => {
            errors.push("`user` must be a non-empty string".into());
            None
        }
    };
    if !errors.is_empty() {
        return Err(errors);
    }
    Ok((
        DockerConfig {
            image,
            env,
            workdir,
            memory_bytes,
            cpus_milli,
            pids,
            disk_bytes,
            network,
            read_only_root,
            max_lease_secs,
            user,
        },
        warnings,
    ))
}

/// Parse `config` or fail with every problem joined.
pub fn parse_strict(config: &Value) -> Result<DockerConfig> {
    parse(config)
        .map(|(c, _)| c)
        .map_err(|e| DockerError::InvalidConfig(e.join("; ")))
}

impl DockerConfig {
    /// The config with every default spelled out.
    pub fn normalized(&self) -> Value {
        json!({
            "image": self.image,
            "env": self.env,
            "workdir": self.workdir,
            "resources": {
                "memoryBytes": self.memory_bytes,
                "cpusMilli": self.cpus_milli,
                "pids": self.pids,
                "diskBytes": self.disk_bytes,
            },
            "network": match self.network { Network::None => "none", Network::Egress => "egress" },
            "readOnlyRoot": self.read_only_root,
            "maxLeaseSeconds": self.max_lease_secs,
            "user": self.user,
        })
    }
}

/// A POSIX shell identifier (what `export` accepts).
pub fn valid_env_name(k: &str) -> bool {
    let mut chars = k.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_apply_and_image_is_required() {
        let (c, w) = parse(&json!({"image": "x"})).unwrap();
        assert!(w.is_empty());
        assert_eq!(c.memory_bytes, DEFAULT_MEMORY);
        assert_eq!(c.network, Network::None);
        assert!(c.read_only_root);
        assert!(parse(&json!({})).is_err());
        assert!(parse(&json!({"image": "x", "network": "host"})).is_err());
        assert!(parse(&json!({"image": "x", "env": {"A B": "1"}})).is_err());
    }
}
