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
    assert!(report.passed(), "plugin check failed:\n{}", report.render());
    for s in &report.scenarios {
        assert!(
            !matches!(
                s.status,
                sandhost_runtime::conformance::ScenarioStatus::Skipped(_)
            ),
            "scenario {} was skipped",
            s.name
        );
    }
}

/// A worker process spoken to over JSON-RPC, as the host does.
struct Worker {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    next: u64,
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

    // fork bomb: the pids limit (64) stops it; the command is then killed by its timeout
    let r = w
        .call(
            "environmentExecute",
            with(
                scope(env),
                json!({"lease": lease, "command": "sh", "args": ["-c", "i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); done 2>/tmp/err; wait"], "bypassSession": true, "timeoutMs": 3000}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(r["timedOut"], json!(true), "{r}");
    let r = sh(&mut w, env, &lease, "grep -c -i 'resource\\|fork' /tmp/err; cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max").await;
    let out = r["stdout"].as_str().unwrap().to_string();
    assert!(
        out.lines().next().unwrap().trim().parse::<u32>().unwrap() > 0,
        "fork failures were reported: {out}"
    );
    assert!(out.contains("64"), "pids.max is 64: {out}");
    let r = sh(&mut w, env, &lease, "ls /proc | grep -c '^[0-9]'").await;
    let n: u32 = r["stdout"].as_str().unwrap().trim().parse().unwrap();
    assert!(
        n < 10,
        "the timeout killed the bomb's process group: {n} processes left"
    );

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
