//! `plugin inspect` and `providers` through the built binary, against the
//! examples/ Python plugin (a real worker process over real pipes).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sandhost"));
    c.env_remove("SANDHOST_PLUGIN_PATH");
    c
}

fn example_plugin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/python-provider")
}

fn json_of(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn inspect_reports_verified_declared_and_ordinary_run_effective_capabilities() {
    let o = bin()
        .args(["plugin", "inspect"])
        .arg(example_plugin())
        .output()
        .unwrap();
    let v = json_of(&o);
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(example_plugin().join("plugin.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(v["id"], manifest["id"]);
    let d = &v["drivers"][0];
    assert_eq!(
        d["driverKey"],
        manifest["environmentDrivers"][0]["driverKey"]
    );
    assert_eq!(d["kind"], "sandbox_provider");
    let verified: Vec<&str> = d["verifiedMethods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    assert!(verified.contains(&"environmentExecute"), "{verified:?}");
    // an ordinary run is ephemeral: reuse is narrowed off whatever is declared
    assert_eq!(d["effective"]["reusableLeases"], Value::Bool(false));
    // every effective key is consistent with verification and declaration
    for (key, on) in d["effective"].as_object().unwrap() {
        if on.as_bool().unwrap() {
            assert_ne!(
                d["declared"][key],
                Value::Bool(false),
                "{key} on though declared false"
            );
        }
    }
    // declared keys the manifest sets are echoed tri-valued, omitted ones as null
    for (key, declared) in d["declared"].as_object().unwrap() {
        let in_manifest = &manifest["environmentDrivers"][0]["sandboxCapabilities"][key];
        assert_eq!(declared, in_manifest, "{key}");
    }
}

#[test]
fn inspect_of_a_worker_that_cannot_start_exits_125_with_a_worker_error_code() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("plugin.json"),
        r#"{"id":"broken","version":"1","worker":{"command":["./missing-worker"]},
            "environmentDrivers":[{"driverKey":"b","kind":"sandbox_provider"}]}"#,
    )
    .unwrap();
    let o = bin()
        .args(["plugin", "inspect"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&o.stderr).contains("E4101"));
}

#[test]
fn providers_lists_plugins_from_plugin_dir_and_the_env_path_with_probe_results() {
    let examples = example_plugin().parent().unwrap().to_path_buf();
    let o = bin()
        .arg("--json")
        .arg("--plugin-dir")
        .arg(&examples)
        .arg("providers")
        .output()
        .unwrap();
    let v = json_of(&o);
    let rows = v["providers"].as_array().unwrap();
    let row = rows
        .iter()
        .find(|r| r["plugin"] == "sandhost-example-python")
        .expect("example listed");
    assert_eq!(row["source"], "plugin-dir");
    assert_eq!(row["probe"]["ok"], Value::Bool(true));

    let o = bin()
        .arg("--json")
        .arg("providers")
        .env("SANDHOST_PLUGIN_PATH", &examples)
        .output()
        .unwrap();
    let v = json_of(&o);
    let row = v["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["plugin"] == "sandhost-example-python")
        .cloned();
    assert_eq!(
        row.expect("found through the env path")["source"],
        "SANDHOST_PLUGIN_PATH"
    );
}

#[test]
fn providers_reports_an_invalid_plugin_as_a_problem_and_still_lists_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad");
    std::fs::create_dir(&bad).unwrap();
    std::fs::write(bad.join("plugin.json"), r#"{"id":"bad"}"#).unwrap();
    let o = bin()
        .arg("--json")
        .arg("--plugin-dir")
        .arg(dir.path())
        .arg("--plugin-dir")
        .arg(example_plugin())
        .arg("providers")
        .output()
        .unwrap();
    let v = json_of(&o);
    let problems = v["problems"].as_array().unwrap();
    assert!(
        problems
            .iter()
            .any(|p| p.as_str().unwrap().contains("E1002")),
        "{problems:?}"
    );
    assert!(v["providers"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["plugin"] == "sandhost-example-python"));
}
