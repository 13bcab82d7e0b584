//! The worker client against real processes over real pipes: a scripted
//! Python worker that crashes, hangs, floods stderr, answers out of order or
//! sends garbage. Every case ends in a typed error or the right answer, never
//! a hang.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use sandhost_protocol::methods;
use sandhost_protocol::ExecuteParams;
use sandhost_runtime::worker::{Worker, WorkerError, WorkerOptions, WorkerSpec};

fn spec(mode: &str) -> WorkerSpec {
    WorkerSpec {
        argv: vec!["python3".into(), "misbehave.py".into(), mode.into()],
        cwd: PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/workers"),
        env: vec![],
    }
}

fn opts() -> WorkerOptions {
    WorkerOptions {
        call_timeout: Duration::from_secs(5),
        max_frame_len: 64 * 1024,
        ..WorkerOptions::default()
    }
}

fn exec_params(cmd: &str) -> ExecuteParams {
    serde_json::from_value(serde_json::json!({
        "driverKey": "t", "companyId": "c", "environmentId": "e", "issueId": null, "config": {},
        "lease": {"providerLeaseId": "l", "expiresAt": null},
        "command": cmd
    }))
    .unwrap()
}

async fn exec(w: &Worker, cmd: &str, timeout: Duration) -> Result<String, WorkerError> {
    w.execute(&exec_params(cmd), timeout, |_| {})
        .await
        .map(|r| r.stdout)
}

#[tokio::test]
async fn handshake_records_supported_methods_as_the_verified_set() {
    let w = Worker::spawn(&spec("honest"), opts()).await.unwrap();
    assert_eq!(
        w.supported_methods().iter().collect::<Vec<_>>(),
        vec!["environmentExecute"]
    );
    assert_eq!(
        exec(&w, "hello", Duration::from_secs(5)).await.unwrap(),
        "hello"
    );
    w.shutdown().await;
}

#[tokio::test]
async fn initialize_answering_not_ok_is_a_typed_initialize_error() {
    let err = Worker::spawn(&spec("init-not-ok"), opts())
        .await
        .unwrap_err();
    assert_eq!(err.code().as_str(), "E4107", "{err}");
}

#[tokio::test]
async fn a_missing_worker_program_is_a_typed_spawn_error() {
    let mut s = spec("honest");
    s.argv = vec!["./no-such-worker".into()];
    let err = Worker::spawn(&s, opts()).await.unwrap_err();
    assert_eq!(err.code().as_str(), "E4101", "{err}");
}

#[tokio::test]
async fn a_worker_crashing_mid_call_fails_the_call_with_its_exit_and_stderr() {
    let w = Worker::spawn(&spec("crash"), opts()).await.unwrap();
    let err = exec(&w, "x", Duration::from_secs(30)).await.unwrap_err();
    match &err {
        WorkerError::Crashed {
            status,
            stderr_tail,
        } => {
            assert!(status.contains('3'), "{status}");
            assert!(stderr_tail.contains("about to crash"), "{stderr_tail}");
        }
        other => panic!("expected Crashed, got {other:?}"),
    }
    // later calls fail at once with the same reason
    let again = exec(&w, "y", Duration::from_secs(30)).await.unwrap_err();
    assert_eq!(again.code().as_str(), "E4102");
}

#[tokio::test]
async fn a_hanging_worker_turns_the_call_into_a_timeout_not_a_hang() {
    let w = Worker::spawn(&spec("hang"), opts()).await.unwrap();
    let t = Instant::now();
    let err = exec(&w, "x", Duration::from_millis(300)).await.unwrap_err();
    assert_eq!(err.code().as_str(), "E4103", "{err}");
    assert!(t.elapsed() < Duration::from_secs(5));
    // a wholly hung worker also fails its health check by deadline: that is
    // what the supervisor restarts it on
    let health = w
        .call_with_timeout::<methods::Health>(&Default::default(), Duration::from_millis(200))
        .await
        .unwrap_err();
    assert_eq!(health.code().as_str(), "E4103");
}

#[tokio::test]
async fn garbage_on_stdout_kills_the_worker_and_fails_calls_in_flight() {
    let w = Worker::spawn(&spec("garbage"), opts()).await.unwrap();
    let err = exec(&w, "x", Duration::from_secs(30)).await.unwrap_err();
    assert_eq!(err.code().as_str(), "E4104", "{err}");
    // the process is really gone
    for _ in 0..100 {
        if w.has_exited() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(w.has_exited());
}

#[tokio::test]
async fn an_oversized_frame_is_a_protocol_violation_not_an_allocation() {
    let w = Worker::spawn(&spec("oversized"), opts()).await.unwrap();
    let err = exec(&w, "x", Duration::from_secs(30)).await.unwrap_err();
    assert!(
        matches!(err, WorkerError::ProtocolViolation { ref detail } if detail.contains("E4001")),
        "{err}"
    );
}

#[tokio::test]
async fn a_worker_flooding_stderr_never_blocks_and_its_answer_arrives() {
    let w = Worker::spawn(&spec("stderr-flood"), opts()).await.unwrap();
    assert_eq!(
        exec(&w, "still here", Duration::from_secs(20))
            .await
            .unwrap(),
        "still here"
    );
}

#[tokio::test]
async fn concurrent_calls_answered_out_of_order_are_matched_by_id_with_their_logs() {
    let w = Worker::spawn(&spec("out-of-order"), opts()).await.unwrap();
    let run = |cmd: &'static str| {
        let w = &w;
        async move {
            let mut logs = Vec::new();
            let r = w
                .execute(&exec_params(cmd), Duration::from_secs(10), |l| {
                    logs.push(l.chunk)
                })
                .await
                .unwrap();
            (r.stdout, logs)
        }
    };
    let (a, b, c) = tokio::join!(run("a"), run("b"), run("c"));
    assert_eq!(a, ("a".to_string(), vec!["log:a".to_string()]));
    assert_eq!(b, ("b".to_string(), vec!["log:b".to_string()]));
    assert_eq!(c, ("c".to_string(), vec!["log:c".to_string()]));
}

#[tokio::test]
async fn an_unimplemented_method_is_a_typed_not_implemented_error() {
    let w = Worker::spawn(&spec("honest"), opts()).await.unwrap();
    let err = w.call::<methods::Probe>(&serde_json::from_value(serde_json::json!({
        "driverKey": "t", "companyId": "c", "environmentId": "e", "issueId": null, "config": {}
    })).unwrap()).await.unwrap_err();
    assert!(
        matches!(err, WorkerError::NotImplemented { ref method } if method == "environmentProbe"),
        "{err}"
    );
}

#[tokio::test]
async fn shutdown_kills_a_worker_that_ignores_it_after_the_grace_period() {
    let mut o = opts();
    o.shutdown_grace = Duration::from_millis(300);
    let w = Worker::spawn(&spec("ignore-shutdown"), o).await.unwrap();
    let t = Instant::now();
    w.shutdown().await;
    assert!(t.elapsed() < Duration::from_secs(3));
}
