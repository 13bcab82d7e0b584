//! The inspection commands: `capabilities explain`, `plugin validate`,
//! `template check`. Pure contract calls around reading one input.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sandhost_contract::manifest::{parse_manifest, DriverKind, PluginManifest};
use sandhost_contract::resolve::Resolution;
use sandhost_contract::scenario::parse_scenario;
use sandhost_contract::template::parse_template;
use serde_json::{json, Map, Value};

use crate::output::Failure;

/// Read a file, or standard input for `-`.
fn read_input(arg: &str) -> Result<String, Failure> {
    if arg == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| Failure::read("standard input", e))?;
        return Ok(s);
    }
    std::fs::read_to_string(arg).map_err(|e| Failure::read(arg, e))
}

pub fn capabilities_explain(scenario: &str) -> Result<ExitCode, Failure> {
    let text = read_input(scenario)?;
    let scenario = parse_scenario(&text)?;
    println!("{}", pretty(&resolution_json(&scenario.resolve())));
    Ok(ExitCode::SUCCESS)
}

/// `{"effective": {six keys: bool}, "explain": {key: reason}}`, keys in the
/// spec's order.
pub fn resolution_json(r: &Resolution) -> Value {
    let mut effective = Map::new();
    let mut explain = Map::new();
    for (cap, on) in r.effective.iter() {
        effective.insert(cap.as_str().into(), Value::Bool(*on));
    }
    for (cap, why) in r.explain.iter() {
        explain.insert(cap.as_str().into(), Value::String(why.clone()));
    }
    json!({"effective": effective, "explain": explain})
}

/// A plugin directory means its `plugin.json`.
pub fn manifest_path(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.join("plugin.json")
    } else {
        path.to_path_buf()
    }
}

pub fn plugin_validate(path: &Path, json_out: bool) -> Result<ExitCode, Failure> {
    let file = manifest_path(path);
    let text = read_input(&file.to_string_lossy())?;
    let manifest = parse_manifest(&text)?;
    if json_out {
        println!("{}", pretty(&manifest_json(&manifest)));
    } else {
        println!(
            "ok: plugin {} {} ({} driver{})",
            manifest.id,
            manifest.version,
            manifest.environment_drivers.len(),
            if manifest.environment_drivers.len() == 1 {
                ""
            } else {
                "s"
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The validated manifest as JSON: declared keys stay tri-valued (null = omitted).
pub fn manifest_json(m: &PluginManifest) -> Value {
    let drivers: Vec<Value> = m
        .environment_drivers
        .iter()
        .map(|d| {
            let mut declared = Map::new();
            for (cap, state) in d.declared.iter() {
                declared.insert(cap.as_str().into(), json!(state.as_option()));
            }
            json!({
                "driverKey": d.driver_key,
                "kind": kind_str(&d.kind),
                "declared": declared,
            })
        })
        .collect();
    json!({"id": m.id, "version": m.version, "worker": {"command": m.worker.command}, "drivers": drivers})
}

pub fn kind_str(k: &DriverKind) -> &str {
    match k {
        DriverKind::SandboxProvider => "sandbox_provider",
        DriverKind::Other(s) => s,
    }
}

pub fn template_check(file: &Path) -> Result<ExitCode, Failure> {
    let text = read_input(&file.to_string_lossy())?;
    let template = parse_template(&text)?;
    let caps: Vec<&str> = template
        .effective_capabilities()
        .iter()
        .map(|c| c.as_str())
        .collect();
    println!("{}", json!({"name": template.name, "capabilities": caps}));
    Ok(ExitCode::SUCCESS)
}

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
}
