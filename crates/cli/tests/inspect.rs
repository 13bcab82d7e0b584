//! The inspection commands, run as a user runs them: the built binary on files.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sandhost"))
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("sandhost runs")
}

fn run_stdin(args: &[&str], input: &str) -> Output {
    let mut child = bin()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

fn stdout_json(o: &Output) -> Value {
    assert!(
        o.status.success(),
        "exit {:?}, stderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("stdout is JSON")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn explain(file: &str) -> Value {
    let path = examples().join("scenarios").join(file);
    stdout_json(&run(&[
        "capabilities",
        "explain",
        "--scenario",
        path.to_str().unwrap(),
    ]))
}

const KEYS: [&str; 6] = [
    "reusableLeases",
    "nativeSyncIn",
    "nativeSyncOut",
    "persistentProcessSessions",
    "independentControlCommands",
    "incrementalSessionOutput",
];

fn effective(v: &Value) -> Vec<(String, bool)> {
    KEYS.iter()
        .map(|k| (k.to_string(), v["effective"][k].as_bool().expect(k)))
        .collect()
}

#[test]
fn explain_prints_all_six_keys_in_spec_order_each_with_a_one_line_reason() {
    let v = explain("reuse-by-environment.json");
    let eff: Vec<&String> = v["effective"].as_object().unwrap().keys().collect();
    let exp: Vec<&String> = v["explain"].as_object().unwrap().keys().collect();
    assert_eq!(eff, KEYS);
    assert_eq!(exp, KEYS);
    for k in KEYS {
        let why = v["explain"][k].as_str().unwrap();
        assert!(!why.is_empty() && !why.contains('\n'), "{k}: {why:?}");
    }
}

#[test]
fn explain_reuse_scenario_grants_opt_ins_declared_true_and_honours_declared_false() {
    let v = explain("reuse-by-environment.json");
    let want = [
        ("reusableLeases", true),
        ("nativeSyncIn", true),
        ("nativeSyncOut", true),
        ("persistentProcessSessions", true),
        ("independentControlCommands", false),
        ("incrementalSessionOutput", true),
    ];
    let want: Vec<(String, bool)> = want.iter().map(|(k, b)| (k.to_string(), *b)).collect();
    assert_eq!(effective(&v), want);
}

#[test]
fn explain_job_backend_with_config_failure_narrows_sync_sessions_and_ephemeral_reuse() {
    let v = explain("job-backend.json");
    let want = [
        ("reusableLeases", false),
        ("nativeSyncIn", false),
        ("nativeSyncOut", false),
        ("persistentProcessSessions", false),
        ("independentControlCommands", true),
        ("incrementalSessionOutput", false),
    ];
    let want: Vec<(String, bool)> = want.iter().map(|(k, b)| (k.to_string(), *b)).collect();
    assert_eq!(effective(&v), want);
}

#[test]
fn explain_absent_plugin_resolves_every_capability_false() {
    let v = explain("plugin-absent.json");
    assert!(effective(&v).iter().all(|(_, on)| !on), "{v}");
}

#[test]
fn explain_reads_the_scenario_from_stdin_with_dash() {
    let text =
        std::fs::read_to_string(examples().join("scenarios/reuse-by-environment.json")).unwrap();
    let from_stdin = stdout_json(&run_stdin(
        &["capabilities", "explain", "--scenario", "-"],
        &text,
    ));
    assert_eq!(from_stdin, explain("reuse-by-environment.json"));
}

#[test]
fn explain_invalid_manifest_exits_2_naming_the_removed_key_and_its_json_path() {
    let path = examples().join("scenarios/removed-key.json");
    let o = run(&[
        "capabilities",
        "explain",
        "--scenario",
        path.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("concurrentSyncOperations"), "{err}");
    assert!(
        err.contains("$.plugin.environmentDrivers[0].sandboxCapabilities.concurrentSyncOperations"),
        "{err}"
    );
    assert!(err.contains("E1004"), "{err}");
    assert!(o.stdout.is_empty());
}

#[test]
fn explain_unreadable_scenario_file_exits_125_with_e9001() {
    let o = run(&[
        "capabilities",
        "explain",
        "--scenario",
        "/nonexistent/scenario.json",
    ]);
    assert_eq!(o.status.code(), Some(125));
    assert!(stderr(&o).contains("E9001"));
}

fn write_plugin(dir: &Path, manifest: &str) -> PathBuf {
    std::fs::write(dir.join("plugin.json"), manifest).unwrap();
    dir.to_path_buf()
}

#[test]
fn plugin_validate_accepts_a_directory_holding_plugin_json() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_plugin(
        dir.path(),
        r#"{"id":"acme.sandbox","version":"1.0.0","worker":{"command":["./w"]},
            "environmentDrivers":[{"driverKey":"acme","kind":"sandbox_provider",
            "sandboxCapabilities":{"nativeSyncIn":true}}]}"#,
    );
    let o = run(&["plugin", "validate", p.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = stdout_json(&run(&["--json", "plugin", "validate", p.to_str().unwrap()]));
    assert_eq!(v["id"], "acme.sandbox");
    assert_eq!(
        v["drivers"][0]["declared"]["nativeSyncIn"],
        Value::Bool(true)
    );
    // omitted stays omitted (null), it is not reported as false
    assert_eq!(v["drivers"][0]["declared"]["nativeSyncOut"], Value::Null);
}

#[test]
fn plugin_validate_non_boolean_capability_exits_2_naming_key_and_path() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_plugin(
        dir.path(),
        r#"{"id":"a","version":"1","worker":{"command":["./w"]},
            "environmentDrivers":[{"driverKey":"a","kind":"sandbox_provider",
            "sandboxCapabilities":{"nativeSyncOut":"yes"}}]}"#,
    );
    let o = run(&[
        "plugin",
        "validate",
        p.join("plugin.json").to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("nativeSyncOut"), "{err}");
    assert!(
        err.contains("$.environmentDrivers[0].sandboxCapabilities.nativeSyncOut"),
        "{err}"
    );
}

#[test]
fn plugin_validate_json_error_is_one_object_with_code_key_and_path() {
    let dir = tempfile::tempdir().unwrap();
    let p = write_plugin(
        dir.path(),
        r#"{"id":"a","version":"1","worker":{"command":["./w"]},
            "environmentDrivers":[{"driverKey":"a","kind":"sandbox_provider",
            "sandboxCapabilities":{"concurrentSyncAndExec":false}}]}"#,
    );
    let o = run(&["--json", "plugin", "validate", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2));
    let v: Value = serde_json::from_str(stderr(&o).trim()).unwrap();
    assert_eq!(v["error"]["code"], "E1004");
    assert_eq!(v["error"]["key"], "concurrentSyncAndExec");
    assert_eq!(
        v["error"]["path"],
        "$.environmentDrivers[0].sandboxCapabilities.concurrentSyncAndExec"
    );
}

fn template_check(file: &Path) -> Output {
    run(&["template", "check", file.to_str().unwrap()])
}

#[test]
fn template_check_prints_name_and_declared_capabilities() {
    let v = stdout_json(&template_check(
        &examples().join("templates/python-terminal.yaml"),
    ));
    assert_eq!(
        v,
        serde_json::json!({"name": "python-terminal", "capabilities": ["shell", "files", "code", "terminal"]})
    );
    let v = stdout_json(&template_check(
        &examples().join("templates/files-only.yaml"),
    ));
    assert_eq!(v["capabilities"], serde_json::json!(["files"]));
}

#[test]
fn template_check_omitted_capabilities_prints_the_default_baseline() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("template.yaml");
    std::fs::write(&f, "name: plain\n").unwrap();
    let v = stdout_json(&template_check(&f));
    assert_eq!(
        v["capabilities"],
        serde_json::json!(["shell", "files", "code"])
    );
}

#[test]
fn template_check_unknown_token_exits_2_naming_it() {
    let o = template_check(&examples().join("templates/typo.yaml"));
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("termnal") && err.contains("E2002"), "{err}");
    assert!(
        o.stdout.is_empty(),
        "a malformed template must not print a capability set"
    );
}

#[test]
fn template_check_malformed_yaml_fails_closed_with_exit_2_and_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("template.yaml");
    std::fs::write(&f, "name: x\ncapabilities: [shell, files\n").unwrap();
    let o = template_check(&f);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("E2001"), "{}", stderr(&o));
    assert!(o.stdout.is_empty());
}
