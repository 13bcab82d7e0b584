//! Tests against a real Docker engine. Run `scripts/docker.sh` first (it
//! starts `dockerd --bridge=none` and builds `sandhost-test-busybox:latest`).
//! Without an engine every test fails with a clear message; none is skipped.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use sandhost_runtime::conformance::{check_plugin, CheckOptions};
use sandhost_runtime::plugins::{Plugin, PluginSource};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

const IMAGE: &str = "sandhost-test-busybox:latest";

fn worker_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_sandhost-provider-docker"))
}

async fn engine() -> bollard::Docker {
    let docker = match sandhost_provider_docker::engine::connect().await {
        Ok(d) => d,
        Err(e) => panic!("no docker engine answers ({e}): run scripts/docker.sh first"),
    };
    if docker.inspect_image(IMAGE).await.is_err() {
        panic!("test image {IMAGE} is missing: run scripts/docker.sh first");
    }
    docker
}

fn config() -> Value {
    json!({"image": IMAGE, "resources": {"memoryBytes": 64 << 20, "pids": 64, "diskBytes": 64 << 20}})
}

fn plugin() -> Plugin {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut p = Plugin::load(&dir, PluginSource::Flag).expect("plugin.json loads");
    p.manifest.worker.command = vec![worker_bin().display().to_string()];
    p
}

#[tokio::test(flavor = "multi_thread")]
async fn conformance_suite_passes() {
    engine().await;
    let opts = CheckOptions {
        config: Some(config()),
        ..Default::default()
    };
    let report = check_plugin(&plugin(), &opts).await;
    println!("{}", report.render());
    assert!(
        report.passed() && report.lying_methods.is_empty(),
        "plugin check failed:\n{}",
        report.render()
    );
    for s in &report.scenarios {
        if let sandhost_runtime::conformance::ScenarioStatus::Skipped(r) = &s.status {
            assert_eq!(
                s.name, "realize workspace",
                "scenario {} was skipped: {r}",
                s.name
            );
        }
    }
}

/// A worker process spoken to over JSON-RPC, as the host does.
struct Worker {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    next: u64,
    /// Notifications read while waiting for a response.
    held: std::collections::VecDeque<Value>,
}

impl Worker {
    async fn start() -> Worker {
        let mut child = tokio::process::Command::new(worker_bin())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("worker starts");
        let stdin = child.stdin.take().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut w = Worker {
            child,
            stdin,
            lines,
            next: 1,
            held: Default::default(),
        };
        w.call("initialize", json!({})).await.expect("initialize");
        w
    }

    async fn call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        let id = self.next;
        self.next += 1;
        let req = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.stdin
            .write_all(format!("{req}\n").as_bytes())
            .await
            .unwrap();
        loop {
            let line = tokio::time::timeout(Duration::from_secs(60), self.lines.next_line())
                .await
                .expect("worker answers in time")
                .unwrap()
                .expect("worker is alive");
            let v: Value = serde_json::from_str(&line).unwrap();
            if v.get("id") == Some(&json!(id)) {
                if let Some(e) = v.get("error") {
                    return Err(e.clone());
                }
                return Ok(v["result"].clone());
            }
            if v.get("method").is_some() {
                self.held.push_back(v);
            }
        }
    }

    async fn stop(mut self) {
        let _ = self.call("shutdown", json!({})).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
    }
}

fn scope(env: &str) -> Value {
    json!({"driverKey": "docker", "companyId": "t1", "environmentId": env, "config": config()})
}

fn with(mut base: Value, extra: Value) -> Value {
    for (k, v) in extra.as_object().unwrap() {
        base[k] = v.clone();
    }
    base
}

async fn acquire(w: &mut Worker, env: &str, run: &str) -> Value {
    w.call(
        "environmentAcquireLease",
        with(scope(env), json!({"runId": run})),
    )
    .await
    .expect("acquire")
}

async fn sh(w: &mut Worker, env: &str, lease: &Value, script: &str) -> Value {
    w.call(
        "environmentExecute",
        with(
            scope(env),
            json!({"lease": lease, "command": "sh", "args": ["-c", script], "bypassSession": true, "timeoutMs": 30000}),
        ),
    )
    .await
    .expect("execute")
}

async fn destroy(w: &mut Worker, env: &str, id: &str) {
    w.call(
        "environmentDestroyLease",
        with(scope(env), json!({"providerLeaseId": id})),
    )
    .await
    .expect("destroy");
}

async fn labelled(docker: &bollard::Docker, id: &str) -> usize {
    sandhost_provider_docker::engine::managed_containers(docker, Some(id))
        .await
        .unwrap()
        .len()
}

fn run_id(tag: &str) -> String {
    format!(
        "test-{tag}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..10]
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn hardening_is_visible_from_inside() {
    let docker = engine().await;
    let env = "hardening";
    let id = run_id("hard");
    let mut w = Worker::start().await;
    let lease = acquire(&mut w, env, &id).await;
    assert_eq!(
        lease["providerLeaseId"],
        json!(id),
        "the runId is the lease id"
    );

    let r = sh(&mut w, env, &lease, "grep CapEff /proc/self/status").await;
    assert!(
        r["stdout"].as_str().unwrap().contains("0000000000000000"),
        "{r}"
    );

    let r = sh(&mut w, env, &lease, "grep NoNewPrivs /proc/self/status").await;
    assert!(r["stdout"].as_str().unwrap().contains('1'), "{r}");

    let r = sh(
        &mut w,
        env,
        &lease,
        "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
    )
    .await;
    assert_eq!(
        r["stdout"].as_str().unwrap().trim(),
        "lo",
        "only loopback: {r}"
    );

    let r = sh(&mut w, env, &lease, "echo x > /etc/owned").await;
    assert_ne!(r["exitCode"], json!(0), "root filesystem is read-only: {r}");
    assert!(r["stderr"].as_str().unwrap().contains("Read-only"), "{r}");

    let r = sh(
        &mut w,
        env,
        &lease,
        "echo ok > /workspace/w && cat /workspace/w",
    )
    .await;
    assert_eq!(r["stdout"], json!("ok\n"), "workspace is writable: {r}");

    // fork bomb: the pids limit (64) stops it inside; the host is untouched
    let r = sh(
        &mut w,
        env,
        &lease,
        "i=0; while [ $i -lt 200 ]; do sleep 3 & i=$((i+1)); done; echo started $i",
    )
    .await;
    assert_ne!(
        r["stdout"],
        json!("started 200\n"),
        "200 forks cannot succeed under pids 64: {r}"
    );
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("fork"),
        "fork failures were reported: {r}"
    );
    let hc = docker
        .inspect_container(&format!("sandhost-{id}"), None)
        .await
        .unwrap()
        .host_config
        .unwrap();
    assert_eq!(hc.pids_limit, Some(64));
    assert_eq!(
        hc.memory_swap, hc.memory,
        "swap counts against the memory limit"
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    let r = sh(&mut w, env, &lease, "ls /proc | grep -c '^[0-9]'").await;
    let n: u32 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(n < 10, "the bomb is cleaned up: {n} processes left");

    // memory bomb: a 64 MiB limit (swap included) OOM-kills it
    let r = w
        .call(
            "environmentExecute",
            with(
                scope(env),
                json!({"lease": lease, "command": "sh", "args": ["-c", "x=aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa; while :; do x=$x$x; done"], "bypassSession": true, "timeoutMs": 30000}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(r["timedOut"], json!(false), "{r}");
    assert_eq!(r["exitCode"], json!(137), "SIGKILL by the OOM killer: {r}");
    let r = sh(&mut w, env, &lease, "echo alive").await;
    assert_eq!(r["stdout"], json!("alive\n"), "the lease survives the bomb");

    destroy(&mut w, env, &id).await;
    assert_eq!(
        labelled(&docker, &id).await,
        0,
        "nothing left after destroy"
    );
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_across_worker_processes() {
    let docker = engine().await;
    let env = "across";
    let id = run_id("across");
    let mut a = Worker::start().await;
    let lease = acquire(&mut a, env, &id).await;
    // the session state lives in the container: a later process sees it
    let r = a
        .call(
            "environmentExecute",
            with(scope(env), json!({"lease": lease, "command": "sh", "args": ["-c", "mkdir -p d && cd d && export FOO=bar"]})),
        )
        .await
        .unwrap();
    assert_eq!(r["exitCode"], json!(0), "{r}");
    a.stop().await;

    let mut b = Worker::start().await;
    let resumed = b
        .call(
            "environmentResumeLease",
            with(scope(env), json!({"providerLeaseId": id})),
        )
        .await
        .unwrap();
    assert_eq!(resumed["providerLeaseId"], json!(id));
    let r = b
        .call(
            "environmentExecute",
            with(
                scope(env),
                json!({"lease": resumed, "command": "sh", "args": ["-c", "pwd; echo $FOO"]}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(r["stdout"], json!("/workspace/d\nbar\n"), "{r}");

    // another tenant's environment cannot resume or use it
    let other = b
        .call(
            "environmentResumeLease",
            with(scope("someone-else"), json!({"providerLeaseId": id})),
        )
        .await
        .unwrap();
    assert_eq!(other["providerLeaseId"], Value::Null);
    assert_eq!(other["metadata"]["reason"], json!("identity_mismatch"));

    destroy(&mut b, env, &id).await;
    assert_eq!(
        labelled(&docker, &id).await,
        0,
        "nothing left after destroy"
    );
    let gone = b
        .call(
            "environmentResumeLease",
            with(scope(env), json!({"providerLeaseId": id})),
        )
        .await
        .unwrap();
    assert_eq!(gone["metadata"]["reason"], json!("not_found"));
    b.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn expired_leases_are_swept() {
    let docker = engine().await;
    let env = "expiry";
    let id = run_id("exp");
    let mut w = Worker::start().await;
    let soon =
        sandhost_provider_docker::engine::iso8601(sandhost_provider_docker::engine::now_secs() + 2);
    let lease = w
        .call(
            "environmentAcquireLease",
            with(scope(env), json!({"runId": id, "requestedExpiresAt": soon})),
        )
        .await
        .unwrap();
    assert_eq!(
        lease["expiresAt"],
        json!(soon),
        "the requested expiry is kept when sooner"
    );
    assert_eq!(labelled(&docker, &id).await, 1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    // any acquire sweeps expired leases
    let other = run_id("exp2");
    acquire(&mut w, env, &other).await;
    assert_eq!(
        labelled(&docker, &id).await,
        0,
        "the expired lease was swept"
    );
    let r = w
        .call(
            "environmentResumeLease",
            with(scope(env), json!({"providerLeaseId": id})),
        )
        .await
        .unwrap();
    assert_eq!(r["providerLeaseId"], Value::Null);
    destroy(&mut w, env, &other).await;
    w.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn duplex_pty_and_tcp() {
    engine().await;
    let env = "duplex";
    let id = run_id("dup");
    let mut w = Worker::start().await;
    let lease = acquire(&mut w, env, &id).await;
    let open = w
        .call(
            "duplexChannelOpen",
            with(scope(env), json!({"lease": lease, "purpose": {"kind": "pty", "command": "sh", "cols": 80, "rows": 24}})),
        )
        .await
        .unwrap();
    let ch = open["channelId"].as_str().unwrap().to_string();
    let b64 = |s: &str| base64_encode(s.as_bytes());
    w.call(
        "duplexChannelResize",
        json!({"channelId": ch, "cols": 100, "rows": 30}),
    )
    .await
    .unwrap();
    w.call(
        "duplexChannelWrite",
        json!({"channelId": ch, "data": b64("stty size; tty; exit 7\n")}),
    )
    .await
    .unwrap();
    let (data, exit) = collect_channel(&mut w, &ch).await;
    assert!(data.contains("30 100"), "resize reached the pty: {data:?}");
    assert!(data.contains("/dev/pts/"), "a real terminal: {data:?}");
    assert_eq!(exit["exitCode"], json!(7), "{exit}");

    // tcp to a port inside the container, which has no network but loopback
    let r = w
        .call(
            "environmentExecute",
            with(scope(env), json!({"lease": lease, "command": "sh", "args": ["-c", "nc -l -p 8077 -e sh -c 'echo hello-tcp; cat' >/dev/null 2>&1 &"], "bypassSession": true})),
        )
        .await
        .unwrap();
    assert_eq!(r["exitCode"], json!(0), "{r}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let open = w
        .call(
            "duplexChannelOpen",
            with(
                scope(env),
                json!({"lease": lease, "purpose": {"kind": "tcp", "port": 8077}}),
            ),
        )
        .await
        .unwrap();
    let ch = open["channelId"].as_str().unwrap().to_string();
    w.call(
        "duplexChannelWrite",
        json!({"channelId": ch, "data": b64("echoed\n")}),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    w.call("duplexChannelClose", json!({"channelId": ch}))
        .await
        .unwrap();
    let (data, _) = collect_channel(&mut w, &ch).await;
    assert!(
        data.contains("hello-tcp") && data.contains("echoed"),
        "tcp bytes both ways: {data:?}"
    );

    destroy(&mut w, env, &id).await;
    w.stop().await;
}

fn base64_encode(b: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn base64_decode(s: &str) -> Vec<u8> {
    let v = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let mut out = vec![];
    for c in s.as_bytes().chunks(4) {
        let n = c.iter().take_while(|&&x| x != b'=').count();
        let mut acc = 0u32;
        for (i, &x) in c.iter().enumerate() {
            acc |= (if x == b'=' { 0 } else { v(x) as u32 }) << (18 - 6 * i);
        }
        for i in 0..n.saturating_sub(1) {
            out.push((acc >> (16 - 8 * i)) as u8);
        }
    }
    out
}

/// Read notifications of `ch` until its exit; the data and the exit params.
async fn collect_channel(w: &mut Worker, ch: &str) -> (String, Value) {
    let mut data = Vec::new();
    loop {
        let v: Value = match w.held.pop_front() {
            Some(v) => v,
            None => {
                let line = tokio::time::timeout(Duration::from_secs(20), w.lines.next_line())
                    .await
                    .expect("channel ends in time")
                    .unwrap()
                    .expect("worker alive");
                serde_json::from_str(&line).unwrap()
            }
        };
        if v["params"]["channelId"] != json!(ch) {
            continue;
        }
        match v["method"].as_str() {
            Some("duplexChannel.data") => {
                data.extend(base64_decode(v["params"]["data"].as_str().unwrap()))
            }
            Some("duplexChannel.exit") => {
                return (
                    String::from_utf8_lossy(&data).into_owned(),
                    v["params"].clone(),
                )
            }
            _ => {}
        }
    }
}

/// A host that died between acquire and its store write left a lease row
/// `acquiring` whose id went out as `runId` (the provider's lease id): the
/// next host's reaper destroys the container and marks the row destroyed,
/// once the row is old enough to belong to a dead process.
#[tokio::test(flavor = "multi_thread")]
async fn a_lease_stranded_in_acquiring_is_reaped_by_the_next_host() {
    use sandhost_runtime::host::{Host, HostConfig, STUCK_AFTER_SECS, TENANT};
    use sandhost_runtime::plugins::Registry;
    use sandhost_runtime::store::{LeaseState, NewLease, Store};

    let docker = engine().await;
    let home = tempfile::tempdir().unwrap();
    let p = plugin();
    let (row, env, db) = {
        let store = Store::open(home.path()).unwrap();
        let env = store.environment_for("docker", &config()).unwrap();
        let row = store
            .insert_lease(&NewLease {
                environment_id: &env,
                policy: sandhost_contract::resolve::LeasePolicy::Ephemeral,
                plugin_id: &p.manifest.id,
                plugin_version: &p.manifest.version,
                driver_key: "docker",
            })
            .unwrap();
        (row, env, store.path().to_path_buf())
    };
    assert_eq!(row.state, LeaseState::Acquiring);

    // the dead host's acquire reached the provider; its answer was lost
    let mut w = Worker::start().await;
    let scope = json!({"driverKey": "docker", "companyId": TENANT, "environmentId": env, "config": config()});
    let lease = w
        .call(
            "environmentAcquireLease",
            with(scope, json!({"runId": row.id})),
        )
        .await
        .expect("acquire");
    assert_eq!(lease["providerLeaseId"], json!(row.id));
    drop(w); // the host and its worker are gone
    assert_eq!(labelled(&docker, &row.id).await, 1);

    let open_host = || async {
        let reg = Registry::discover(&[], None, vec![plugin()]);
        assert!(reg.problems.is_empty(), "{:?}", reg.problems);
        Host::open(HostConfig {
            home: home.path().to_path_buf(),
            registry: reg,
            worker_options: Default::default(),
        })
        .await
        .unwrap()
    };
    let lease_state = || {
        Store::open(home.path())
            .unwrap()
            .lease(&row.id)
            .unwrap()
            .state
    };

    // a fresh row may still be some live host's acquire: left alone
    open_host().await.shutdown().await;
    assert_eq!(lease_state(), LeaseState::Acquiring);
    assert_eq!(
        labelled(&docker, &row.id).await,
        1,
        "a fresh row is not reaped"
    );

    let conn = rusqlite::Connection::open(&db).unwrap();
    let n = conn
        .execute(
            "UPDATE leases SET updated_at = updated_at - ?1 WHERE id = ?2",
            rusqlite::params![STUCK_AFTER_SECS + 60, row.id],
        )
        .unwrap();
    assert_eq!(n, 1);
    drop(conn);

    let host = open_host().await;
    assert_eq!(
        labelled(&docker, &row.id).await,
        0,
        "the reaper destroyed the stranded container"
    );
    assert_eq!(lease_state(), LeaseState::Destroyed);
    host.shutdown().await;
}
