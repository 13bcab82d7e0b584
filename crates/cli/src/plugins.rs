//! `plugin inspect` and `providers`: commands that start plugin workers.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sandhost_contract::resolve::{LeaseFacts, LeasePolicy, Verified};
use sandhost_protocol::{methods, EnvironmentScope, ProbeParams};
use sandhost_runtime::plugins::{Plugin, PluginSource, Registry};
use sandhost_runtime::snapshot::{CapabilitySnapshot, RunFacts};
use sandhost_runtime::worker::{Worker, WorkerError, WorkerOptions};
use serde_json::{json, Map, Value};

use crate::inspect::{kind_str, manifest_path};
use crate::output::Failure;

fn worker_failure(e: WorkerError) -> Failure {
    Failure::Tool {
        code: e.code().as_str(),
        message: e.to_string(),
        suggestion: Some(
            "run the worker command by hand in the plugin directory to see its log".into(),
        ),
    }
}

/// A plugin directory (or its plugin.json), or the driver key of a
/// built-in provider.
fn load(dir: &Path) -> Result<Plugin, Failure> {
    if !dir.exists() {
        let key = dir.to_string_lossy();
        if let Some(p) = crate::builtins::builtin_plugins()
            .into_iter()
            .find(|p| p.manifest.driver(&key).is_some())
        {
            return Ok(p);
        }
    }
    let dir = if dir.is_file() {
        dir.parent().unwrap_or(Path::new("."))
    } else {
        dir
    };
    let file = manifest_path(dir);
    let text = std::fs::read_to_string(&file)
        .map_err(|e| Failure::read(&file.display().to_string(), e))?;
    let manifest = sandhost_contract::manifest::parse_manifest(&text)?;
    Ok(Plugin {
        dir: dir.to_path_buf(),
        manifest,
        source: PluginSource::Flag,
    })
}

/// The resolution `plugin inspect` reports: an ordinary ephemeral run with a
/// resolvable config.
fn ordinary_run(plugin: &Plugin, driver_key: &str, verified: Verified) -> CapabilitySnapshot {
    let facts = RunFacts {
        driver_key,
        lease: LeaseFacts::from_metadata(LeasePolicy::Ephemeral, &Value::Null),
        pinned_plugin_id: None,
        config_resolution_failed: false,
    };
    CapabilitySnapshot::resolve(Some(&plugin.manifest), verified, &facts)
}

pub fn inspect(dir: &Path) -> Result<ExitCode, Failure> {
    let plugin = load(dir)?;
    let rt = runtime()?;
    let worker = rt
        .block_on(Worker::spawn(
            &plugin.worker_spec(),
            WorkerOptions::default(),
        ))
        .map_err(worker_failure)?;
    let verified: Vec<String> = worker.supported_methods().iter().cloned().collect();
    let drivers: Vec<Value> = plugin
        .manifest
        .environment_drivers
        .iter()
        .map(|d| {
            let snap = ordinary_run(&plugin, &d.driver_key, Verified::methods(verified.clone()));
            let mut declared = Map::new();
            let mut effective = Map::new();
            for (cap, state) in d.declared.iter() {
                declared.insert(cap.as_str().into(), json!(state.as_option()));
            }
            for (cap, on) in snap.effective().iter() {
                effective.insert(cap.as_str().into(), json!(on));
            }
            json!({
                "driverKey": d.driver_key,
                "kind": kind_str(&d.kind),
                "verifiedMethods": verified,
                "declared": declared,
                "effective": effective,
            })
        })
        .collect();
    rt.block_on(worker.shutdown());
    let out =
        json!({"id": plugin.manifest.id, "version": plugin.manifest.version, "drivers": drivers});
    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    Ok(ExitCode::SUCCESS)
}

pub fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::Tool {
            code: "E9002",
            message: format!("cannot start the async runtime: {e}"),
            suggestion: None,
        })
}

/// Every plugin from `--plugin-dir` and `$SANDHOST_PLUGIN_PATH`.
pub fn registry(dirs: &[PathBuf]) -> Registry {
    let env = std::env::var("SANDHOST_PLUGIN_PATH").ok();
    Registry::discover(dirs, env.as_deref(), crate::builtins::builtin_plugins())
}

async fn probe_one(plugin: &Plugin, driver_key: &str) -> Value {
    let worker = match Worker::spawn(&plugin.worker_spec(), WorkerOptions::default()).await {
        Ok(w) => w,
        Err(e) => {
            return json!({"ok": false, "error": {"code": e.code().as_str(), "message": e.to_string()}})
        }
    };
    let probe = if worker.supports("environmentProbe") {
        let params = ProbeParams {
            scope: EnvironmentScope {
                driver_key: driver_key.into(),
                company_id: "sandhost".into(),
                environment_id: "probe".into(),
                issue_id: None,
                config: json!({}),
            },
        };
        match worker.call::<methods::Probe>(&params).await {
            Ok(r) => serde_json::to_value(&r).unwrap_or(Value::Null),
            Err(e) => {
                json!({"ok": false, "error": {"code": e.code().as_str(), "message": e.to_string()}})
            }
        }
    } else {
        json!({"ok": true, "summary": "worker does not advertise environmentProbe"})
    };
    worker.shutdown().await;
    probe
}

pub fn providers(dirs: &[PathBuf], json_out: bool) -> Result<ExitCode, Failure> {
    let reg = registry(dirs);
    let rt = runtime()?;
    let mut rows = Vec::new();
    for p in &reg.plugins {
        for d in &p.manifest.environment_drivers {
            let probe = rt.block_on(probe_one(p, &d.driver_key));
            rows.push(json!({
                "driverKey": d.driver_key,
                "kind": kind_str(&d.kind),
                "plugin": p.manifest.id,
                "version": p.manifest.version,
                "source": match p.source { PluginSource::Flag => "plugin-dir", PluginSource::EnvPath => "SANDHOST_PLUGIN_PATH", PluginSource::Builtin => "builtin" },
                "dir": p.dir.display().to_string(),
                "probe": probe,
            }));
        }
    }
    let problems: Vec<String> = reg.problems.iter().map(|p| p.to_string()).collect();
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"providers": rows, "problems": problems}))
                .unwrap_or_default()
        );
    } else {
        println!("{:<16} {:<24} {:<14} PROBE", "DRIVER", "PLUGIN", "SOURCE");
        for r in &rows {
            let ok = r["probe"]["ok"].as_bool().unwrap_or(false);
            let summary = r["probe"]["summary"]
                .as_str()
                .or(r["probe"]["error"]["message"].as_str())
                .unwrap_or("");
            println!(
                "{:<16} {:<24} {:<14} {} {}",
                r["driverKey"].as_str().unwrap_or(""),
                format!(
                    "{}@{}",
                    r["plugin"].as_str().unwrap_or(""),
                    r["version"].as_str().unwrap_or("")
                ),
                r["source"].as_str().unwrap_or(""),
                if ok { "ok" } else { "FAILED" },
                summary
            );
        }
        for p in &problems {
            eprintln!("warning: {p}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn check(
    dir: &Path,
    driver: Option<String>,
    config: Option<&str>,
    json_out: bool,
) -> Result<ExitCode, Failure> {
    use sandhost_runtime::conformance::{check_plugin, CheckOptions};
    let plugin = load(dir)?;
    let config = match config {
        None => None,
        Some(c) => Some(serde_json::from_str::<Value>(c).map_err(|e| Failure::Tool {
            code: "E9003",
            message: format!("--config is not valid JSON: {e}"),
            suggestion: None,
        })?),
    };
    let opts = CheckOptions {
        driver_key: driver,
        config,
        ..CheckOptions::default()
    };
    let rt = runtime()?;
    let report = rt.block_on(check_plugin(&plugin, &opts));
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(&report.to_json()).unwrap_or_default()
        );
    } else {
        print!("{}", report.render());
    }
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
