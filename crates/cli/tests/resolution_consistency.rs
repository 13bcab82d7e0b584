//! Resolution through a live worker (`plugin inspect`) equals the pure
//! resolution (`capabilities explain`) for the same inputs: the manifest,
//! the methods the worker advertised, an ordinary ephemeral run.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

fn sandhost(args: &[&str], stdin: Option<&str>) -> Value {
    let mut c = Command::new(env!("CARGO_BIN_EXE_sandhost"));
    c.env_remove("SANDHOST_PLUGIN_PATH")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = c.spawn().unwrap();
    if let Some(s) = stdin {
        child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
    }
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Inspect `target` and check every driver against `explain`.
fn assert_consistent(target: &str, manifest: &Value) {
    let inspected = sandhost(&["plugin", "inspect", target], None);
    for d in inspected["drivers"].as_array().unwrap() {
        let scenario = json!({
            "plugin": manifest,
            "driverKey": d["driverKey"],
            "worker": {"supportedMethods": d["verifiedMethods"]},
            "lease": {"policy": "ephemeral"},
            "configResolutionFailed": false,
        });
        let explained = sandhost(
            &["capabilities", "explain", "--scenario", "-"],
            Some(&scenario.to_string()),
        );
        assert_eq!(
            d["effective"], explained["effective"],
            "{target} driver {}",
            d["driverKey"]
        );
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn the_python_plugin_resolves_live_as_it_does_purely() {
    let dir = root().join("examples/python-provider");
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("plugin.json")).unwrap()).unwrap();
    assert_consistent(dir.to_str().unwrap(), &manifest);
}

#[test]
fn every_key_declared_false_resolves_live_as_it_does_purely() {
    let src = root().join("examples/python-provider");
    let base: Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("plugin.json")).unwrap()).unwrap();
    for key in [
        "reusableLeases",
        "nativeSyncIn",
        "nativeSyncOut",
        "persistentProcessSessions",
        "independentControlCommands",
        "incrementalSessionOutput",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut m = base.clone();
        m["worker"]["command"] = json!(["python3", src.join("worker.py").display().to_string()]);
        m["environmentDrivers"][0]["sandboxCapabilities"][key] = json!(false);
        std::fs::write(dir.path().join("plugin.json"), m.to_string()).unwrap();
        let inspected = sandhost(&["plugin", "inspect", dir.path().to_str().unwrap()], None);
        assert_eq!(
            inspected["drivers"][0]["effective"][key],
            json!(false),
            "{key}"
        );
        assert_consistent(dir.path().to_str().unwrap(), &m);
    }
}

#[test]
fn the_built_in_local_provider_resolves_live_as_it_does_purely() {
    let manifest: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("providers/local/plugin.json")).unwrap(),
    )
    .unwrap();
    assert_consistent("local", &manifest);
}
