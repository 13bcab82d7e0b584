//! Every message of the catalogue: round trips through the codec and schema
//! snapshots under `tests/snapshots/` (re-bless with `SANDHOST_BLESS=1`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use sandhost_protocol::*;
use serde_json::{json, Map, Value};

fn scope() -> EnvironmentScope {
    EnvironmentScope {
        driver_key: "my-provider".into(),
        company_id: "company-1".into(),
        environment_id: "env-1".into(),
        issue_id: None,
        config: json!({ "image": "alpine" }),
    }
}

fn meta(pairs: &[(&str, Value)]) -> Option<Map<String, Value>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect(),
    )
}

fn lease() -> Lease {
    Lease {
        provider_lease_id: Some("lease-1".into()),
        metadata: meta(&[("root", json!("/tmp/lease-1"))]),
        expires_at: Some("2030-01-01T00:00:00Z".into()),
    }
}

/// (snapshot name, method, typed request or notification, typed result).
struct Entry {
    name: &'static str,
    message: Message,
    typed_check: Box<dyn Fn(&Message)>,
}

fn request<M: RpcMethod>(name: &'static str, id: u64, params: M::Params) -> Entry
where
    M::Params: PartialEq + std::fmt::Debug + Clone + 'static,
{
    let message = Message::Request(Request::typed::<M>(id, &params).unwrap());
    Entry {
        name,
        message,
        typed_check: Box::new(move |m| match m {
            Message::Request(r) => {
                assert_eq!(r.method, M::METHOD.as_str());
                assert_eq!(r.params_as::<M>().unwrap(), params);
            }
            other => panic!("expected a request, got {other:?}"),
        }),
    }
}

fn result<M: RpcMethod>(name: &'static str, id: Id, result: M::Result) -> Entry
where
    M::Result: PartialEq + std::fmt::Debug + Clone + 'static,
{
    let message = Message::Response(Response::ok(id, result_value::<M>(&result).unwrap()));
    Entry {
        name,
        message,
        typed_check: Box::new(move |m| match m {
            Message::Response(r) => {
                let value = r.clone().into_result().unwrap();
                assert_eq!(parse_result::<M>(&value).unwrap(), result);
            }
            other => panic!("expected a response, got {other:?}"),
        }),
    }
}

fn notification<N: NotificationMethod>(name: &'static str, params: N::Params) -> Entry
where
    N::Params: PartialEq + std::fmt::Debug + Clone + 'static,
{
    let message = Message::Notification(Notification::typed::<N>(&params).unwrap());
    Entry {
        name,
        message,
        typed_check: Box::new(move |m| match m {
            Message::Notification(n) => assert_eq!(n.params_as::<N>().unwrap(), params),
            other => panic!("expected a notification, got {other:?}"),
        }),
    }
}

fn sync_params() -> SyncParams {
    SyncParams {
        scope: scope(),
        lease: lease(),
        operations: vec![SyncOperation {
            operation_id: "op-1".into(),
            files: vec![
                FileMapping {
                    source_path: "/host/src/main.py".into(),
                    target_path: "work/main.py".into(),
                    kind: FileKind::File,
                    mode: Some(FileMode(0o644)),
                    exclude: None,
                    follow_symlinks: Some(false),
                    access: Some(Access::Rw),
                },
                FileMapping {
                    source_path: "/host/data".into(),
                    target_path: "work/data".into(),
                    kind: FileKind::Directory,
                    mode: None,
                    exclude: Some(vec!["*.tmp".into()]),
                    follow_symlinks: None,
                    access: Some(Access::Ro),
                },
            ],
            post_upload_commands: Some(vec![PostUploadCommand {
                command: "chmod +x work/main.py".into(),
                cwd: Some("work".into()),
                timeout_ms: Some(5000),
            }]),
        }],
    }
}

fn catalogue() -> Vec<Entry> {
    use methods as m;
    let end = LeaseEndParams {
        scope: scope(),
        provider_lease_id: "lease-1".into(),
        lease_metadata: meta(&[("root", json!("/tmp/lease-1"))]),
        cancel_active_work: Some(true),
    };
    vec![
        request::<m::Initialize>(
            "initialize.request",
            1,
            InitializeParams {
                protocol_version: Some("1".into()),
                config: None,
            },
        ),
        result::<m::Initialize>(
            "initialize.result",
            Id::from(1u64),
            InitializeResult {
                ok: true,
                supported_methods: vec!["initialize".into(), "health".into(), "shutdown".into()],
            },
        ),
        request::<m::Health>("health.request", 2, EmptyParams {}),
        result::<m::Health>(
            "health.result",
            Id::from(2u64),
            HealthResult {
                status: HealthStatus::Ok,
                message: Some("ready".into()),
                details: None,
            },
        ),
        request::<m::Shutdown>("shutdown.request", 3, EmptyParams {}),
        result::<m::Shutdown>("shutdown.result", Id::from(3u64), Ack),
        request::<m::ValidateConfig>(
            "environmentValidateConfig.request",
            4,
            ValidateConfigParams {
                driver_key: "my-provider".into(),
                config: json!({"cpu": 2}),
            },
        ),
        result::<m::ValidateConfig>(
            "environmentValidateConfig.result",
            Id::from(4u64),
            ValidateConfigResult {
                ok: true,
                warnings: vec!["cpu is ignored".into()],
                errors: vec![],
                normalized_config: Some(json!({})),
            },
        ),
        request::<m::Probe>(
            "environmentProbe.request",
            5,
            ProbeParams { scope: scope() },
        ),
        result::<m::Probe>(
            "environmentProbe.result",
            Id::from(5u64),
            ProbeResult {
                ok: false,
                summary: Some("docker is not reachable".into()),
                diagnostics: vec![
                    Diagnostic {
                        severity: Severity::Error,
                        message: "cannot connect".into(),
                        code: Some("docker_unreachable".into()),
                        details: Some(json!({"socket": "/var/run/docker.sock"})),
                    },
                    Diagnostic {
                        severity: Severity::Info,
                        message: "python3 found".into(),
                        code: None,
                        details: None,
                    },
                ],
                metadata: None,
            },
        ),
        request::<m::AcquireLease>(
            "environmentAcquireLease.request",
            6,
            AcquireLeaseParams {
                scope: EnvironmentScope {
                    issue_id: Some("issue-9".into()),
                    ..scope()
                },
                run_id: "run-1".into(),
                requested_cwd: Some("/work".into()),
                agent_id: Some("agent-1".into()),
                requested_expires_at: Some("2030-01-01T00:00:00Z".into()),
            },
        ),
        result::<m::AcquireLease>("environmentAcquireLease.result", Id::from(6u64), lease()),
        request::<m::ResumeLease>(
            "environmentResumeLease.request",
            7,
            ResumeLeaseParams {
                scope: scope(),
                provider_lease_id: "lease-1".into(),
                lease_metadata: None,
            },
        ),
        result::<m::ResumeLease>(
            "environmentResumeLease.result.gone",
            Id::from(7u64),
            Lease::gone(LeaseGoneReason::NotFound),
        ),
        request::<m::ReleaseLease>("environmentReleaseLease.request", 8, end.clone()),
        result::<m::ReleaseLease>(
            "environmentReleaseLease.result",
            Id::from(8u64),
            Some(LeaseReceipt {
                provider_lease_id: "lease-1".into(),
                state: LeaseEndState::Stopped,
            }),
        ),
        request::<m::DestroyLease>("environmentDestroyLease.request", 9, end),
        result::<m::DestroyLease>("environmentDestroyLease.result.empty", Id::from(9u64), None),
        request::<m::RealizeWorkspace>(
            "environmentRealizeWorkspace.request",
            10,
            RealizeWorkspaceParams {
                scope: scope(),
                lease: lease(),
                workspace: Workspace {
                    local_path: Some("/home/me/project".into()),
                    remote_path: Some("/work".into()),
                    mode: Some("copy".into()),
                },
            },
        ),
        result::<m::RealizeWorkspace>(
            "environmentRealizeWorkspace.result",
            Id::from(10u64),
            RealizeWorkspaceResult {
                cwd: "/work".into(),
                metadata: None,
            },
        ),
        request::<m::Execute>(
            "environmentExecute.request",
            11,
            ExecuteParams {
                scope: scope(),
                lease: lease(),
                command: "python3".into(),
                args: Some(vec!["-c".into(), "print(1)".into()]),
                cwd: Some("work".into()),
                env: Some(BTreeMap::from([("LANG".into(), "C.UTF-8".into())])),
                stdin: Some("input".into()),
                timeout_ms: Some(30_000),
                bypass_session: Some(true),
            },
        ),
        result::<m::Execute>(
            "environmentExecute.result",
            Id::from(11u64),
            ExecuteResult {
                exit_code: Some(0),
                signal: None,
                timed_out: false,
                stdout: "1\n".into(),
                stderr: String::new(),
                metadata: meta(&[("durationMs", json!(12))]),
            },
        ),
        result::<m::Execute>(
            "environmentExecute.result.timedOut",
            "exec-string-id".into(),
            ExecuteResult {
                exit_code: None,
                signal: Some("SIGKILL".into()),
                timed_out: true,
                stdout: String::new(),
                stderr: String::new(),
                metadata: None,
            },
        ),
        notification::<m::ExecuteLog>(
            "execute.log",
            ExecuteLogParams {
                request_id: Id::from(11u64),
                stream: LogStream::Stdout,
                chunk: "1\n".into(),
            },
        ),
        request::<m::SyncIn>("environmentSyncIn.request", 12, sync_params()),
        request::<m::SyncOut>("environmentSyncOut.request", 13, sync_params()),
        result::<m::SyncIn>(
            "environmentSyncIn.result",
            Id::from(12u64),
            SyncResult {
                operations: vec![SyncOperationResult {
                    operation_id: "op-1".into(),
                    files_transferred: 3,
                    bytes_transferred: 1024,
                }],
            },
        ),
        request::<m::DuplexOpen>(
            "duplexChannelOpen.request.pty",
            14,
            DuplexOpenParams {
                scope: scope(),
                lease: lease(),
                purpose: DuplexPurpose::Pty {
                    command: "/bin/sh".into(),
                    args: Some(vec!["-l".into()]),
                    cwd: None,
                    env: Some(BTreeMap::from([("TERM".into(), "xterm-256color".into())])),
                    cols: 80,
                    rows: 24,
                },
            },
        ),
        request::<m::DuplexOpen>(
            "duplexChannelOpen.request.tcp",
            15,
            DuplexOpenParams {
                scope: scope(),
                lease: lease(),
                purpose: DuplexPurpose::Tcp { port: 8080 },
            },
        ),
        result::<m::DuplexOpen>(
            "duplexChannelOpen.result",
            Id::from(14u64),
            DuplexOpenResult {
                channel_id: "ch-1".into(),
            },
        ),
        request::<m::DuplexWrite>(
            "duplexChannelWrite.request",
            16,
            DuplexWriteParams {
                channel_id: "ch-1".into(),
                data: Bytes(b"ls\n".to_vec()),
            },
        ),
        request::<m::DuplexResize>(
            "duplexChannelResize.request",
            17,
            DuplexResizeParams {
                channel_id: "ch-1".into(),
                cols: 120,
                rows: 40,
            },
        ),
        request::<m::DuplexStop>(
            "duplexChannelStop.request",
            18,
            DuplexChannelParams {
                channel_id: "ch-1".into(),
            },
        ),
        request::<m::DuplexClose>(
            "duplexChannelClose.request",
            19,
            DuplexChannelParams {
                channel_id: "ch-1".into(),
            },
        ),
        result::<m::DuplexClose>("duplexChannelClose.result", Id::from(19u64), Ack),
        notification::<m::DuplexData>(
            "duplexChannel.data",
            DuplexDataParams {
                channel_id: "ch-1".into(),
                data: Bytes(vec![0, 159, 146, 150, b'\n']),
            },
        ),
        notification::<m::DuplexExit>(
            "duplexChannel.exit",
            DuplexExitParams {
                channel_id: "ch-1".into(),
                exit_code: Some(0),
                signal: None,
                error: None,
            },
        ),
        Entry {
            name: "error.methodNotImplemented",
            message: Message::Response(Response::err(
                Some("req-7".into()),
                RpcError::new(
                    RpcErrorCode::MethodNotImplemented,
                    "method `environmentProbe` is not implemented",
                ),
            )),
            typed_check: Box::new(|m| match m {
                Message::Response(r) => {
                    let e = r.clone().into_result().unwrap_err();
                    assert_eq!(e.code, RpcErrorCode::MethodNotImplemented);
                    assert_eq!(e.code.code(), -32004);
                }
                other => panic!("expected a response, got {other:?}"),
            }),
        },
        Entry {
            name: "error.parse.nullId",
            message: Message::Response(Response::err(
                None,
                FrameError::Parse {
                    detail: "expected value".into(),
                }
                .to_rpc_error(),
            )),
            typed_check: Box::new(|m| match m {
                Message::Response(r) => assert_eq!(r.id, None),
                other => panic!("expected a response, got {other:?}"),
            }),
        },
    ]
}

#[test]
fn every_catalogue_message_round_trips_through_the_codec() {
    for entry in catalogue() {
        let line = encode_message(&entry.message).unwrap();
        assert_eq!(line.last(), Some(&b'\n'), "{}", entry.name);
        assert_eq!(
            line.iter().filter(|&&b| b == b'\n').count(),
            1,
            "{}: one line",
            entry.name
        );
        let decoded = decode_frame(&line).unwrap_or_else(|e| panic!("{}: {e}", entry.name));
        assert_eq!(decoded, entry.message, "{}", entry.name);
        (entry.typed_check)(&decoded);
    }
}

#[test]
fn catalogue_covers_every_method_and_notification() {
    let names: Vec<String> = catalogue()
        .iter()
        .filter_map(|e| match &e.message {
            Message::Request(r) => Some(r.method.clone()),
            Message::Notification(n) => Some(n.method.clone()),
            Message::Response(_) => None,
        })
        .collect();
    for method in Method::ALL {
        assert!(
            names.iter().any(|n| n == method.as_str()),
            "no catalogue entry for {method}"
        );
    }
}

fn snapshot_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("snapshots")
}

#[test]
fn wire_schema_matches_the_snapshots() {
    let bless = std::env::var("SANDHOST_BLESS").is_ok_and(|v| v == "1");
    let dir = snapshot_dir();
    let mut failures = Vec::new();
    for entry in catalogue() {
        let mut pretty = serde_json::to_string_pretty(&entry.message).unwrap();
        pretty.push('\n');
        let path = dir.join(format!("{}.json", entry.name));
        if bless {
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(&path, &pretty).unwrap();
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(expected) if expected == pretty => {}
            Ok(expected) => failures.push(format!(
                "{} differs\n--- snapshot\n{expected}--- now\n{pretty}",
                path.display()
            )),
            Err(_) => failures.push(format!("{} is missing", path.display())),
        }
    }
    assert!(
        failures.is_empty(),
        "wire schema changed (re-bless with SANDHOST_BLESS=1 if intended):\n{}",
        failures.join("\n")
    );
}

#[test]
fn snapshot_directory_has_no_stale_files() {
    if std::env::var("SANDHOST_BLESS").is_ok_and(|v| v == "1") {
        return;
    }
    let names: Vec<String> = catalogue()
        .iter()
        .map(|e| format!("{}.json", e.name))
        .collect();
    for entry in std::fs::read_dir(snapshot_dir()).unwrap() {
        let file = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(names.contains(&file), "stale snapshot {file}");
    }
}
