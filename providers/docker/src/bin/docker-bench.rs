//! Side-by-side latency of the provider's engine path against the docker CLI.
//!
//! - create + first exec output: provider path (create_lease + one exec of
//!   `true`, then remove) vs `docker run --rm --network none IMAGE true`;
//! - exec round trip in a live container: provider exec of `true` vs
//!   `docker exec C true`.
//!
//! p50 over N runs (default 30). Usage: `docker-bench [IMAGE] [N]`. The CLI is
//! used here only as the yardstick; the provider never shells out.
#![forbid(unsafe_code)]

use std::process::Command;
use std::time::{Duration, Instant};

use sandhost_provider_docker::config;
use sandhost_provider_docker::engine::{self, Owner};
use sandhost_provider_docker::exec::{self, ExecSpec};

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn cli(args: &[&str]) -> Duration {
    let t = Instant::now();
    let st = Command::new("docker")
        .args(args)
        .output()
        .expect("docker CLI runs");
    assert!(
        st.status.success(),
        "docker {args:?} failed: {}",
        String::from_utf8_lossy(&st.stderr)
    );
    t.elapsed()
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let image = args
        .next()
        .unwrap_or_else(|| "sandhost-test-busybox:latest".into());
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(30);
    let docker = engine::connect().await.expect("docker engine reachable");
    let cfg = config::parse_strict(&serde_json::json!({"image": image})).expect("config");
    let owner = Owner {
        tenant: "bench".into(),
        environment: "bench".into(),
    };
    let true_spec = |token: String| ExecSpec {
        argv: exec::oneshot_argv(&token, "/workspace", &["true".into()]),
        token: Some(token),
        timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    };

    let mut ours = vec![];
    let mut theirs = vec![];
    for i in 0..n {
        let id = format!("bench-{}-{i}", exec::token());
        let t = Instant::now();
        let info = engine::create_lease(&docker, &cfg, &id, &owner, engine::now_secs() + 120)
            .await
            .expect("create lease");
        let out = exec::run(&docker, &info.container_id, true_spec(exec::token()), None)
            .await
            .expect("exec");
        assert_eq!(out.exit_code, Some(0));
        ours.push(t.elapsed());
        engine::remove(&docker, &info.container_id)
            .await
            .expect("remove");
        theirs.push(cli(&["run", "--rm", "--network", "none", &image, "true"]));
    }
    let (a, b) = (p50(ours), p50(theirs));
    println!("create + first exec (p50 of {n}): provider {:.1} ms | docker run --rm {:.1} ms | ratio {:.2}", ms(a), ms(b), ms(a) / ms(b));

    let id = format!("bench-live-{}", exec::token());
    let info = engine::create_lease(&docker, &cfg, &id, &owner, engine::now_secs() + 300)
        .await
        .expect("create lease");
    let mut ours = vec![];
    let mut theirs = vec![];
    for _ in 0..n {
        let t = Instant::now();
        let out = exec::run(&docker, &info.container_id, true_spec(exec::token()), None)
            .await
            .expect("exec");
        assert_eq!(out.exit_code, Some(0));
        ours.push(t.elapsed());
        theirs.push(cli(&["exec", &info.container_id, "true"]));
    }
    engine::remove(&docker, &info.container_id)
        .await
        .expect("remove");
    let (a, b) = (p50(ours), p50(theirs));
    println!(
        "exec round trip (p50 of {n}): provider {:.1} ms | docker exec {:.1} ms | ratio {:.2}",
        ms(a),
        ms(b),
        ms(a) / ms(b)
    );
}
