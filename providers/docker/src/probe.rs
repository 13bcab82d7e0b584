//! `environmentProbe`: engine reachable, API version, image present.
//!
//! Codes: E6101 engine unreachable, E6118 engine version (info), E6103 image
//! missing, E6104 config invalid, E6119 image present (info).

use sandhost_protocol::{ProbeResult, Severity};
use serde_json::{json, Map, Value};

use crate::config;
use crate::provider::{diag, DockerProvider};

pub async fn probe(p: &DockerProvider, config_value: &Value) -> ProbeResult {
    let mut diagnostics = vec![];
    let mut metadata = Map::new();
    let docker = match p.docker().await {
        Ok(d) => d,
        Err(e) => {
            diagnostics.push(diag(Severity::Error, e.code(), e.to_string()));
            return ProbeResult {
                ok: false,
                summary: Some("the docker engine is unreachable".into()),
                diagnostics,
                metadata: None,
            };
        }
    };
    match docker.version().await {
        Ok(v) => {
            let version = v.version.unwrap_or_default();
            let api = v.api_version.unwrap_or_default();
            metadata.insert("engineVersion".into(), json!(version));
            metadata.insert("apiVersion".into(), json!(api));
            metadata.insert(
                "clientApiVersion".into(),
                json!(docker.client_version().to_string()),
            );
            diagnostics.push(diag(
                Severity::Info,
                "E6118",
                format!("docker engine {version} (api {api})"),
            ));
        }
        Err(e) => {
            diagnostics.push(diag(
                Severity::Error,
                "E6101",
                format!("the docker engine does not answer: {e}"),
            ));
            return ProbeResult {
                ok: false,
                summary: Some("the docker engine is unreachable".into()),
                diagnostics,
                metadata: Some(metadata),
            };
        }
    }
    let mut ok = true;
    match config::parse(config_value) {
        Err(errors) => {
            for e in errors {
                diagnostics.push(diag(Severity::Warning, "E6104", e));
            }
        }
        Ok((cfg, _)) => match docker.inspect_image(&cfg.image).await {
            Ok(_) => diagnostics.push(diag(
                Severity::Info,
                "E6119",
                format!("image `{}` is present", cfg.image),
            )),
            Err(e) if crate::error::is_not_found(&e) => {
                ok = false;
                diagnostics.push(diag(
                    Severity::Error,
                    "E6103",
                    format!(
                        "image `{}` is not present on the engine (this provider never pulls)",
                        cfg.image
                    ),
                ));
            }
            Err(e) => {
                ok = false;
                diagnostics.push(diag(
                    Severity::Error,
                    "E6102",
                    format!("cannot inspect image `{}`: {e}", cfg.image),
                ));
            }
        },
    }
    ProbeResult {
        ok,
        summary: Some(if ok {
            "docker engine ready".into()
        } else {
            "docker engine reachable, image missing".into()
        }),
        diagnostics,
        metadata: Some(metadata),
    }
}
