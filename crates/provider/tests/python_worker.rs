//! Runs the Python reference worker (examples/python-provider) as a real child
//! process over real pipes and speaks to it with the protocol crate's types.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use sandhost_protocol::*;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

struct Worker {
    child: Child,
    writer: FrameWriter<ChildStdin>,
    reader: FrameReader<ChildStdout>,
    next_id: u64,
}

impl Worker {
    fn spawn(state_dir: &std::path::Path) -> Worker {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/python-provider");
        let mut child = Command::new("python3")
            .arg("worker.py")
            .current_dir(dir)
            .env("SANDHOST_STATE_DIR", state_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 runs");
        let writer = FrameWriter::new(child.stdin.take().unwrap());
        let reader = FrameReader::new(child.stdout.take().unwrap());
        Worker {
            child,
            writer,
            reader,
            next_id: 1,
        }
    }

    /// Calls `M`; returns the result and the `execute.log` chunks seen before it.
    async fn call<M: RpcMethod>(
        &mut self,
        params: &M::Params,
    ) -> (Result<M::Result, RpcError>, Vec<ExecuteLogParams>) {
        let id = Id::from(self.next_id);
        self.next_id += 1;
        let request = Request::typed::<M>(id.clone(), params).unwrap();
        self.writer.write_message(&request.into()).await.unwrap();
        let mut logs = Vec::new();
        loop {
            let message = tokio::time::timeout(Duration::from_secs(20), self.reader.next_message())
                .await
                .expect("worker answers in time")
                .expect("worker stdout open")
                .expect("valid frame");
            match message {
                Message::Notification(n) if n.method == Method::ExecuteLog.as_str() => {
                    let log = n.params_as::<methods::ExecuteLog>().unwrap();
                    assert_eq!(log.request_id, id, "execute.log names its request");
                    logs.push(log);
                }
                Message::Response(r) if r.id.as_ref() == Some(&id) => {
                    let result = r.into_result().map(|v| parse_result::<M>(&v).unwrap());
                    return (result, logs);
                }
                other => panic!("unexpected message {other:?}"),
            }
        }
    }
}

fn scope() -> EnvironmentScope {
    EnvironmentScope {
        driver_key: "python-tempdir".into(),
        company_id: "c1".into(),
        environment_id: "e1".into(),
        issue_id: None,
        config: serde_json::json!({}),
    }
}

fn exec(lease: &Lease, command: &str, args: &[&str], timeout_ms: Option<u64>) -> ExecuteParams {
    ExecuteParams {
        scope: scope(),
        lease: lease.clone(),
        command: command.into(),
        args: Some(args.iter().map(|s| s.to_string()).collect()),
        cwd: None,
        env: Some([("GREETING".to_string(), "hi".to_string())].into()),
        stdin: Some("from-stdin".into()),
        timeout_ms,
        bypass_session: Some(true),
    }
}

#[tokio::test]
async fn python_reference_worker_serves_the_lease_exec_and_sync_lifecycle() {
    let state = tempfile::tempdir().unwrap();
    let host_dir = tempfile::tempdir().unwrap();
    let mut w = Worker::spawn(state.path());

    let (init, _) = w
        .call::<methods::Initialize>(&InitializeParams::default())
        .await;
    let supported = init.unwrap().supported_methods;
    for m in [
        "environmentAcquireLease",
        "environmentExecute",
        "environmentSyncIn",
        "environmentSyncOut",
    ] {
        assert!(
            supported.iter().any(|s| s == m),
            "{m} advertised: {supported:?}"
        );
    }

    let acquire = AcquireLeaseParams {
        scope: scope(),
        run_id: "run-1".into(),
        requested_cwd: None,
        agent_id: None,
        requested_expires_at: None,
    };
    let lease = w.call::<methods::AcquireLease>(&acquire).await.0.unwrap();
    let lease_id = lease.provider_lease_id.clone().expect("a lease id");

    // stdout, env, stdin and exit code
    let script = "import sys,os; print(os.environ['GREETING'], sys.stdin.read()); sys.exit(3)";
    let (result, logs) = w
        .call::<methods::Execute>(&exec(&lease, "python3", &["-c", script], None))
        .await;
    let result = result.unwrap();
    assert_eq!(result.exit_code, Some(3));
    assert!(!result.timed_out);
    assert_eq!(result.stdout, "hi from-stdin\n");
    let streamed: String = logs
        .iter()
        .filter(|l| l.stream == LogStream::Stdout)
        .map(|l| l.chunk.as_str())
        .collect();
    assert_eq!(
        streamed, result.stdout,
        "execute.log chunks carry the output before the result"
    );

    // timeout
    let (result, _) = w
        .call::<methods::Execute>(&exec(&lease, "sleep", &["30"], Some(300)))
        .await;
    let result = result.unwrap();
    assert!(result.timed_out);
    assert_eq!(result.exit_code, None);

    // sync in: a file with a mode, then read it from inside the lease
    let src = host_dir.path().join("hello.txt");
    std::fs::write(&src, b"synced").unwrap();
    let mapping = |source: &str, target: &str| FileMapping {
        source_path: source.into(),
        target_path: target.into(),
        kind: FileKind::File,
        mode: Some(FileMode(0o640)),
        exclude: None,
        follow_symlinks: None,
        access: None,
    };
    let sync_params = |m: FileMapping| SyncParams {
        scope: scope(),
        lease: lease.clone(),
        operations: vec![SyncOperation {
            operation_id: "op".into(),
            files: vec![m],
            post_upload_commands: None,
        }],
    };
    let (synced, _) = w
        .call::<methods::SyncIn>(&sync_params(mapping(src.to_str().unwrap(), "in/hello.txt")))
        .await;
    let synced = synced.unwrap();
    assert_eq!(synced.operations[0].files_transferred, 1);
    assert_eq!(synced.operations[0].bytes_transferred, 6);
    let (cat, _) = w
        .call::<methods::Execute>(&exec(&lease, "cat", &["in/hello.txt"], None))
        .await;
    assert_eq!(cat.unwrap().stdout, "synced");

    // sync in refuses escapes from the lease root
    for target in ["../escape.txt", "/tmp/escape.txt"] {
        let (refused, _) = w
            .call::<methods::SyncIn>(&sync_params(mapping(src.to_str().unwrap(), target)))
            .await;
        assert_eq!(
            refused.unwrap_err().code,
            RpcErrorCode::InvalidParams,
            "{target}"
        );
    }

    // sync out back to the host
    let out = host_dir.path().join("back.txt");
    let (back, _) = w
        .call::<methods::SyncOut>(&sync_params(mapping("in/hello.txt", out.to_str().unwrap())))
        .await;
    assert_eq!(back.unwrap().operations[0].files_transferred, 1);
    assert_eq!(std::fs::read(&out).unwrap(), b"synced");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o640
    );

    // release keeps the lease for a resume; destroy, then resume reports it gone
    let end = LeaseEndParams {
        scope: scope(),
        provider_lease_id: lease_id.clone(),
        lease_metadata: None,
        cancel_active_work: None,
    };
    w.call::<methods::ReleaseLease>(&end).await.0.unwrap();
    let resume = ResumeLeaseParams {
        scope: scope(),
        provider_lease_id: lease_id.clone(),
        lease_metadata: None,
    };
    let resumed = w.call::<methods::ResumeLease>(&resume).await.0.unwrap();
    assert_eq!(
        resumed.provider_lease_id.as_deref(),
        Some(lease_id.as_str())
    );
    w.call::<methods::DestroyLease>(&end).await.0.unwrap();
    let gone = w.call::<methods::ResumeLease>(&resume).await.0.unwrap();
    assert_eq!(gone, Lease::gone(LeaseGoneReason::NotFound));

    // unimplemented optional method
    let (probe, _) = w
        .call::<methods::Probe>(&ProbeParams { scope: scope() })
        .await;
    assert_eq!(probe.unwrap_err().code, RpcErrorCode::MethodNotImplemented);

    // shutdown: answered, then the process exits by itself
    w.call::<methods::Shutdown>(&EmptyParams {})
        .await
        .0
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), w.child.wait()).await;
    assert!(status
        .expect("worker exits after shutdown")
        .unwrap()
        .success());
}
