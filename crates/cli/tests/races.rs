//! Several `sandhost` processes on one home at once, as users and scripts
//! run them: nothing is lost, nothing is done twice. Local sandboxes (root).

use std::process::{Command, Output};

use serde_json::Value;

fn sandhost(home: &std::path::Path, args: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_sandhost"))
        .env_remove("SANDHOST_PLUGIN_PATH")
        .arg("--home")
        .arg(home)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

fn wait_all(children: Vec<std::process::Child>) -> Vec<Output> {
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

#[test]
fn concurrent_creates_and_runs_on_one_home_all_succeed_and_are_all_recorded() {
    let home = tempfile::tempdir().unwrap();
    let mut kids = Vec::new();
    for i in 0..4 {
        kids.push(sandhost(home.path(), &["create"]));
        kids.push(sandhost(
            home.path(),
            &["run", "--", "sh", "-c", &format!("echo run-{i}")],
        ));
    }
    let outs = wait_all(kids);
    for o in &outs {
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let ls = wait_all(vec![sandhost(home.path(), &["--json", "ls"])]).remove(0);
    let listed: Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(
        listed.as_array().unwrap().len(),
        4,
        "four created, the runs left nothing"
    );
    let ids: Vec<String> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    let kill: Vec<&str> = std::iter::once("kill")
        .chain(ids.iter().map(String::as_str))
        .collect();
    assert!(wait_all(vec![sandhost(home.path(), &kill)])[0]
        .status
        .success());
}

#[test]
fn two_processes_killing_one_sandbox_destroy_it_once() {
    let home = tempfile::tempdir().unwrap();
    let o = wait_all(vec![sandhost(home.path(), &["create"])]).remove(0);
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    let outs = wait_all(vec![
        sandhost(home.path(), &["kill", &id]),
        sandhost(home.path(), &["kill", &id]),
    ]);
    let ok = outs.iter().filter(|o| o.status.success()).count();
    assert_eq!(ok, 1, "exactly one kill wins");
    let loser = outs.iter().find(|o| !o.status.success()).unwrap();
    assert_eq!(loser.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&loser.stderr).contains("E5004"));
    let state = std::fs::read_dir(home.path().join("local"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(state, 0, "no sandbox state left");
}
