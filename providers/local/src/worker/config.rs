//! The provider config the host sends with every environment call.
use std::path::PathBuf;

use serde_json::Value;

use crate::config::SandboxConfig;

/// Where sandboxes live when neither `$SANDHOST_HOME` nor `stateRoot` says.
pub const DEFAULT_STATE_ROOT: &str = "/var/lib/sandhost/local";

/// What this provider reads from a config object.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LocalConfig {
    pub rootfs: Option<PathBuf>,
    /// Added to every command's environment (the request's env wins).
    pub env: Vec<(String, String)>,
    /// Default working directory of one-shot commands.
    pub workdir: Option<String>,
    pub memory_bytes: Option<u64>,
    pub cpus_milli: Option<u64>,
    pub pids: Option<u64>,
    pub disk_bytes: Option<u64>,
    pub state_root: Option<PathBuf>,
}

/// A parsed config, or why not, plus warnings either way.
#[derive(Debug, Clone, Default)]
pub struct Parsed {
    pub config: LocalConfig,
    pub warnings: Vec<String>,
    pub errors: Vec<String>,
}

fn uint(v: &Value, key: &str, errors: &mut Vec<String>) -> Option<u64> {
    match v.as_u64() {
        Some(n) => Some(n),
        None => {
            errors.push(format!("resources.{key} must be a non-negative integer"));
            None
        }
    }
}

/// Parse `config`; `null` is an empty config.
pub fn parse(config: &Value) -> Parsed {
    let mut p = Parsed::default();
    let empty = serde_json::Map::new();
    let obj = match config {
        Value::Null => &empty,
        Value::Object(o) => o,
        _ => {
            p.errors.push("config must be an object".into());
            return p;
        }
    };
    for (k, v) in obj {
        match k.as_str() {
            "image" => p.warnings.push(
                "image is ignored by the local provider (it runs on the host's /usr or a rootfs directory)"
                    .into(),
            ),
            "rootfs" => match v.as_str() {
                Some(s) if s.starts_with('/') => p.config.rootfs = Some(PathBuf::from(s)),
                _ => p.errors.push("rootfs must be an absolute host path".into()),
            },
            "env" => match v.as_object() {
                Some(env) => {
                    for (name, val) in env {
                        match val.as_str() {
                            Some(s) if !name.is_empty() && !name.contains('=') && !name.contains('\0') => {
                                p.config.env.push((name.clone(), s.to_string()))
                            }
                            _ => p.errors.push(format!(
                                "env.{name} must be a string with a valid variable name"
                            )),
                        }
                    }
                }
                None => p.errors.push("env must be an object of strings".into()),
            },
            "workdir" => match v.as_str() {
                Some(s) if s.starts_with('/') && !s.contains('\0') => {
                    p.config.workdir = Some(s.to_string())
                }
                _ => p.errors.push("workdir must be an absolute path".into()),
            },
            "resources" => match v.as_object() {
                Some(r) => {
                    for (rk, rv) in r {
                        match rk.as_str() {
                            "memoryBytes" => p.config.memory_bytes = uint(rv, rk, &mut p.errors),
                            "cpusMilli" => p.config.cpus_milli = uint(rv, rk, &mut p.errors),
                            "pids" => p.config.pids = uint(rv, rk, &mut p.errors),
                            "diskBytes" => p.config.disk_bytes = uint(rv, rk, &mut p.errors),
                            other => p
                                .warnings
                                .push(format!("unknown key resources.{other} is ignored")),
                        }
                    }
                }
                None => p.errors.push("resources must be an object".into()),
            },
            "network" => match v.as_str() {
                Some("none") => {}
                Some("egress") => p.errors.push(
                    "network egress is not supported by the local provider yet (sandboxes only have loopback); use network: none"
                        .into(),
                ),
                _ => p.errors.push("network must be \"none\" or \"egress\"".into()),
            },
            "stateRoot" => match v.as_str() {
                Some(s) if s.starts_with('/') => p.config.state_root = Some(PathBuf::from(s)),
                _ => p.errors.push("stateRoot must be an absolute host path".into()),
            },
            other => p.warnings.push(format!("unknown key {other} is ignored")),
        }
    }
    p
}

impl LocalConfig {
    /// `$SANDHOST_HOME/local` when set (the host sets it for its workers),
    /// else `stateRoot`, else [`DEFAULT_STATE_ROOT`].
    pub fn state_root(&self) -> PathBuf {
        match std::env::var_os("SANDHOST_HOME").filter(|h| !h.is_empty()) {
            Some(home) => PathBuf::from(home).join("local"),
            None => self
                .state_root
                .clone()
                .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE_ROOT)),
        }
    }

    /// The sandbox to create for a lease with this config.
    pub fn sandbox_config(&self, id: &str) -> SandboxConfig {
        let mut c = SandboxConfig::new(self.state_root());
        c.id = Some(id.to_string());
        c.rootfs = self.rootfs.clone();
        if let Some(v) = self.memory_bytes {
            c.memory_bytes = v;
        }
        if let Some(v) = self.cpus_milli {
            c.cpu_millis = v;
        }
        if let Some(v) = self.pids {
            c.pids_max = v;
        }
        if let Some(v) = self.disk_bytes {
            c.workspace_bytes = v;
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn host_keys_parse_and_unknown_keys_warn() {
        let p = parse(&json!({
            "image": "debian", "rootfs": "/srv/root", "env": {"A": "1"}, "workdir": "/workspace/x",
            "resources": {"memoryBytes": 1u64 << 28, "cpusMilli": 500, "pids": 64, "diskBytes": 1u64 << 26},
            "network": "none", "stateRoot": "/tmp/s", "colour": "blue"
        }));
        assert!(p.errors.is_empty(), "{:?}", p.errors);
        assert_eq!(p.warnings.len(), 2, "{:?}", p.warnings);
        assert_eq!(p.config.env, vec![("A".into(), "1".into())]);
        assert_eq!(p.config.pids, Some(64));
        let c = p.config.sandbox_config("x");
        assert_eq!(c.memory_bytes, 1 << 28);
        assert_eq!(c.workspace_bytes, 1 << 26);
    }

    #[test]
    fn egress_and_bad_values_are_errors() {
        let p = parse(&json!({"network": "egress"}));
        assert!(
            p.errors[0].contains("egress is not supported"),
            "{:?}",
            p.errors
        );
        let p = parse(&json!({"rootfs": "rel", "resources": {"pids": -1}, "workdir": 3}));
        assert_eq!(p.errors.len(), 3, "{:?}", p.errors);
        assert!(parse(&json!(null)).errors.is_empty());
        assert!(!parse(&json!([1])).errors.is_empty());
    }
}
