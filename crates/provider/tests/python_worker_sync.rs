//! Native sync obligations and lease lifecycle of the Python reference worker
//! (examples/python-provider), driven as a real child process over pipes:
//! confinement of the last path component, symlinks and special mode bits in
//! trees, source modes kept, size caps, temp-dir cleanup, counts, host-side
//! paths, release versus destroy, and absolute execute cwd.

use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use sandhost_protocol::*;
use serde_json::{json, Value};
use tempfile::TempDir;
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

struct Worker {
    _child: Child,
    writer: FrameWriter<ChildStdin>,
    reader: FrameReader<ChildStdout>,
    next_id: u64,
}

impl Worker {
    fn spawn(state_dir: &Path) -> Worker {
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
        Worker {
            writer: FrameWriter::new(child.stdin.take().unwrap()),
            reader: FrameReader::new(child.stdout.take().unwrap()),
            _child: child,
            next_id: 1,
        }
    }

    /// Calls `M` and returns its result; `execute.log` notifications are skipped.
    async fn call<M: RpcMethod>(&mut self, params: &M::Params) -> Result<M::Result, RpcError> {
        let id = Id::from(self.next_id);
        self.next_id += 1;
        let request = Request::typed::<M>(id.clone(), params).unwrap();
        self.writer.write_message(&request.into()).await.unwrap();
        loop {
            let message = tokio::time::timeout(Duration::from_secs(20), self.reader.next_message())
                .await
                .expect("worker answers in time")
                .expect("worker stdout open")
                .expect("valid frame");
            match message {
                Message::Notification(_) => {}
                Message::Response(r) if r.id.as_ref() == Some(&id) => {
                    return r.into_result().map(|v| parse_result::<M>(&v).unwrap());
                }
                other => panic!("unexpected message {other:?}"),
            }
        }
    }
}

/// A worker with one live lease, a host-side temp dir and a provider config.
struct Env {
    w: Worker,
    lease: Lease,
    id: String,
    /// The lease root on this machine (from the lease metadata).
    root: PathBuf,
    host: TempDir,
    config: Value,
    _state: TempDir,
}

fn scope(config: &Value) -> EnvironmentScope {
    EnvironmentScope {
        driver_key: "python-tempdir".into(),
        company_id: "c1".into(),
        environment_id: "e1".into(),
        issue_id: None,
        config: config.clone(),
    }
}

fn mapping(source: &Path, target: &Path, kind: FileKind, mode: Option<u32>) -> FileMapping {
    FileMapping {
        source_path: source.to_string_lossy().into_owned(),
        target_path: target.to_string_lossy().into_owned(),
        kind,
        mode: mode.map(FileMode),
        exclude: None,
        follow_symlinks: None,
        access: None,
    }
}

fn file(source: impl AsRef<Path>, target: impl AsRef<Path>) -> FileMapping {
    mapping(source.as_ref(), target.as_ref(), FileKind::File, None)
}

fn dir(source: impl AsRef<Path>, target: impl AsRef<Path>) -> FileMapping {
    mapping(source.as_ref(), target.as_ref(), FileKind::Directory, None)
}

fn write(path: &Path, bytes: &[u8], mode: u32) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, bytes).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn mkfifo(path: &Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mkfifo {}", path.display());
}

impl Env {
    async fn new(config: Value) -> Env {
        let state = TempDir::new().unwrap();
        let mut w = Worker::spawn(state.path());
        w.call::<methods::Initialize>(&InitializeParams::default())
            .await
            .unwrap();
        let lease = w
            .call::<methods::AcquireLease>(&AcquireLeaseParams {
                scope: scope(&config),
                run_id: "run-1".into(),
                requested_cwd: None,
                agent_id: None,
                requested_expires_at: None,
            })
            .await
            .unwrap();
        let root = PathBuf::from(lease.metadata.as_ref().unwrap()["root"].as_str().unwrap());
        Env {
            w,
            id: lease.provider_lease_id.clone().unwrap(),
            lease,
            root,
            host: TempDir::new().unwrap(),
            config,
            _state: state,
        }
    }

    fn host(&self, rel: &str) -> PathBuf {
        self.host.path().join(rel)
    }

    fn params(&self, files: Vec<FileMapping>) -> SyncParams {
        SyncParams {
            scope: scope(&self.config),
            lease: self.lease.clone(),
            operations: vec![SyncOperation {
                operation_id: "op".into(),
                files,
                post_upload_commands: None,
            }],
        }
    }

    async fn sync_in(&mut self, files: Vec<FileMapping>) -> Result<(u64, u64), RpcError> {
        let p = self.params(files);
        let r = self.w.call::<methods::SyncIn>(&p).await?;
        Ok((
            r.operations[0].files_transferred,
            r.operations[0].bytes_transferred,
        ))
    }

    async fn sync_out(&mut self, files: Vec<FileMapping>) -> Result<(u64, u64), RpcError> {
        let p = self.params(files);
        let r = self.w.call::<methods::SyncOut>(&p).await?;
        Ok((
            r.operations[0].files_transferred,
            r.operations[0].bytes_transferred,
        ))
    }

    async fn exec(
        &mut self,
        lease: &Lease,
        argv: &[&str],
        cwd: Option<&str>,
    ) -> Result<ExecuteResult, RpcError> {
        let p = ExecuteParams {
            scope: scope(&self.config),
            lease: lease.clone(),
            command: argv[0].into(),
            args: Some(argv[1..].iter().map(|a| a.to_string()).collect()),
            cwd: cwd.map(str::to_string),
            env: None,
            stdin: None,
            timeout_ms: Some(10_000),
            bypass_session: Some(true),
        };
        self.w.call::<methods::Execute>(&p).await
    }

    fn end(&self) -> LeaseEndParams {
        LeaseEndParams {
            scope: scope(&self.config),
            provider_lease_id: self.id.clone(),
            lease_metadata: None,
            cancel_active_work: None,
        }
    }

    async fn resume(&mut self) -> Lease {
        let p = ResumeLeaseParams {
            scope: scope(&self.config),
            provider_lease_id: self.id.clone(),
            lease_metadata: None,
        };
        self.w.call::<methods::ResumeLease>(&p).await.unwrap()
    }
}

fn assert_refused(r: Result<(u64, u64), RpcError>, code: RpcErrorCode, needle: &str) {
    let e = r.expect_err("refused");
    assert_eq!(e.code, code, "{}", e.message);
    assert!(
        e.message.contains(needle),
        "{:?} in {:?}",
        needle,
        e.message
    );
}

// 1. The last path component is resolved too: a symlink leaf out of the lease is refused.
#[tokio::test]
async fn sync_refuses_a_lease_symlink_whose_last_component_points_outside() {
    let mut e = Env::new(json!({})).await;
    let secret = e.host("secret.txt");
    write(&secret, b"host secret\n", 0o600);
    symlink(&secret, e.root.join("leak")).unwrap();
    symlink(e.host.path(), e.root.join("hostdir")).unwrap();

    let r = e.sync_out(vec![file("leak", e.host("leaked"))]).await;
    assert_refused(r, RpcErrorCode::InvalidParams, "escapes the lease root");
    let r = e.sync_out(vec![dir("hostdir", e.host("leaked-dir"))]).await;
    assert_refused(r, RpcErrorCode::InvalidParams, "escapes the lease root");
    assert_eq!(names(e.host.path()), ["secret.txt"], "nothing copied out");

    // writing through the leaf is refused as well, and the host file is untouched
    let payload = e.host("payload");
    write(&payload, b"payload", 0o644);
    let r = e.sync_in(vec![file(&payload, "leak")]).await;
    assert_refused(r, RpcErrorCode::InvalidParams, "escapes the lease root");
    assert_eq!(fs::read(&secret).unwrap(), b"host secret\n");

    // a link that stays inside the lease is fine
    write(&e.root.join("real.txt"), b"inside", 0o644);
    symlink("real.txt", e.root.join("alias")).unwrap();
    e.sync_out(vec![file("alias", e.host("alias"))])
        .await
        .unwrap();
    assert_eq!(fs::read(e.host("alias")).unwrap(), b"inside");
}

// 2. Trees: symlinks kept only inside the tree, setuid/setgid/sticky stripped.
#[tokio::test]
async fn sync_out_of_a_tree_refuses_escaping_symlinks_and_strips_special_bits() {
    let mut e = Env::new(json!({})).await;
    let t = e.root.join("tree");
    write(&t.join("a.txt"), b"a", 0o644);
    write(&t.join("suid.sh"), b"#!/bin/sh\n", 0o4755);
    fs::create_dir_all(t.join("sub/sticky")).unwrap();
    fs::set_permissions(t.join("sub/sticky"), fs::Permissions::from_mode(0o1755)).unwrap();
    fs::set_permissions(t.join("sub"), fs::Permissions::from_mode(0o2750)).unwrap();
    symlink("a.txt", t.join("link-a")).unwrap();
    symlink("../a.txt", t.join("sub/up")).unwrap();

    e.sync_out(vec![dir("tree", e.host("tree"))]).await.unwrap();
    let out = e.host("tree");
    assert_eq!(
        fs::read_link(out.join("link-a")).unwrap(),
        Path::new("a.txt")
    );
    assert_eq!(
        fs::read_link(out.join("sub/up")).unwrap(),
        Path::new("../a.txt")
    );
    assert_eq!(mode_of(&out.join("suid.sh")), 0o755);
    assert_eq!(mode_of(&out.join("sub")), 0o750);
    assert_eq!(mode_of(&out.join("sub/sticky")), 0o755);

    // a single file loses its setuid bit too
    write(&e.root.join("suid-file"), b"x", 0o4750);
    e.sync_out(vec![file("suid-file", e.host("suid-file"))])
        .await
        .unwrap();
    assert_eq!(mode_of(&e.host("suid-file")), 0o750);

    let secret = e.host("secret.txt");
    write(&secret, b"host secret\n", 0o600);
    for (name, target) in [
        ("abs", secret.to_string_lossy().into_owned()),
        (
            "rel",
            "../../../../../../../../../../etc/hostname".to_string(),
        ),
        ("up", "../../a.txt".to_string()),
    ] {
        let bad = e.root.join(format!("bad-{name}"));
        write(&bad.join("ok.txt"), b"ok", 0o644);
        fs::create_dir_all(bad.join("d")).unwrap();
        symlink(&target, bad.join("d/out")).unwrap();
        let before = names(e.host.path());
        let r = e
            .sync_out(vec![dir(
                format!("bad-{name}"),
                e.host(&format!("bad-{name}")),
            )])
            .await;
        assert_refused(r, RpcErrorCode::WorkerError, "leaves the tree");
        assert_eq!(names(e.host.path()), before, "{name}: nothing written");
    }
}

// 3. With no explicit mode the source's permission bits are kept, both ways.
#[tokio::test]
async fn sync_keeps_the_source_mode_when_no_mode_is_given() {
    let mut e = Env::new(json!({})).await;
    for mode in [0o600, 0o755, 0o640] {
        let src = e.host(&format!("in-{mode:o}"));
        write(&src, b"data", mode);
        e.sync_in(vec![file(&src, format!("m/{mode:o}"))])
            .await
            .unwrap();
        assert_eq!(
            mode_of(&e.root.join(format!("m/{mode:o}"))),
            mode,
            "in {mode:o}"
        );

        write(&e.root.join(format!("o/{mode:o}")), b"data", mode);
        let dst = e.host(&format!("out-{mode:o}"));
        e.sync_out(vec![file(format!("o/{mode:o}"), &dst)])
            .await
            .unwrap();
        assert_eq!(mode_of(&dst), mode, "out {mode:o}");
    }
    // an explicit mode still wins
    let src = e.host("in-600");
    let m = mapping(&src, Path::new("explicit"), FileKind::File, Some(0o644));
    e.sync_in(vec![m]).await.unwrap();
    assert_eq!(mode_of(&e.root.join("explicit")), 0o644);
}

// 4. Byte and entry caps per call, checked before anything is written.
#[tokio::test]
async fn sync_caps_bytes_and_entries_before_writing_anything() {
    let mut e = Env::new(json!({"maxSyncBytes": 10, "maxSyncEntries": 3})).await;
    let (a, b) = (e.host("a"), e.host("b"));
    write(&a, b"123456", 0o644);
    write(&b, b"654321", 0o644);
    e.sync_in(vec![file(&a, "one")]).await.unwrap();
    // 6 + 6 bytes over two mappings: the first is not written either
    let r = e.sync_in(vec![file(&a, "x/a"), file(&b, "x/b")]).await;
    assert_refused(r, RpcErrorCode::WorkerError, "maxSyncBytes=10");
    assert!(!e.root.join("x").exists(), "nothing written");

    let tree = e.host("tree");
    for i in 0..5 {
        write(&tree.join(format!("f{i}")), b"x", 0o644);
    }
    let r = e.sync_in(vec![dir(&tree, "tree")]).await;
    assert_refused(r, RpcErrorCode::WorkerError, "maxSyncEntries=3");
    assert_eq!(names(&e.root), ["one"], "nothing written, no temp dir");

    let r = e
        .sync_out(vec![
            file("one", e.host("back")),
            file("one", e.host("back2")),
        ])
        .await;
    assert_refused(r, RpcErrorCode::WorkerError, "maxSyncBytes=10");
    assert!(!e.host("back").exists());

    e.config = json!({"maxSyncBytes": "lots"});
    let r = e.sync_in(vec![file(&a, "y")]).await;
    assert_refused(r, RpcErrorCode::InvalidParams, "maxSyncBytes");
}

// 5. A directory sync that fails leaves no `.sync-` temp directory behind.
#[tokio::test]
async fn a_failed_directory_sync_leaves_no_temp_directory_behind() {
    let mut e = Env::new(json!({})).await;
    // a named pipe inside the tree (copytree used to fail on it after staging)
    let t = e.root.join("tree");
    write(&t.join("a.txt"), b"a", 0o644);
    mkfifo(&t.join("pipe"));
    let out = e.host("out");
    fs::create_dir(&out).unwrap();
    let r = e.sync_out(vec![dir("tree", out.join("tree"))]).await;
    assert_refused(r, RpcErrorCode::WorkerError, "pipe");
    assert_eq!(names(&out), Vec::<String>::new());

    // the final rename fails (name too long) after the tree was staged
    let ok = e.root.join("ok");
    write(&ok.join("sub/a.txt"), b"a", 0o644);
    fs::set_permissions(ok.join("sub"), fs::Permissions::from_mode(0o500)).unwrap();
    let r = e.sync_out(vec![dir("ok", out.join("x".repeat(300)))]).await;
    assert_eq!(r.expect_err("refused").code, RpcErrorCode::WorkerError);
    assert_eq!(names(&out), Vec::<String>::new(), "temp dir cleaned up");

    // and the same into the lease
    let src = e.host("src");
    write(&src.join("a.txt"), b"a", 0o644);
    mkfifo(&src.join("pipe"));
    let r = e.sync_in(vec![dir(&src, "in/tree")]).await;
    assert_refused(r, RpcErrorCode::WorkerError, "pipe");
    let left: Vec<String> = names(&e.root)
        .into_iter()
        .filter(|n| n.starts_with(".sync-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(!e.root.join("in/tree").exists());
}

// 6. Counts are regular files and their sizes; symlinks are neither.
#[tokio::test]
async fn sync_counts_regular_files_and_their_bytes_only() {
    let mut e = Env::new(json!({})).await;
    let src = e.host("src");
    write(&src.join("f1"), b"abc", 0o644);
    write(&src.join("sub/f2"), b"defg", 0o644);
    symlink("f1", src.join("link-file")).unwrap();
    symlink("sub", src.join("link-dir")).unwrap();
    assert_eq!(e.sync_in(vec![dir(&src, "t")]).await.unwrap(), (2, 7));
    assert_eq!(
        e.sync_out(vec![dir("t", e.host("back"))]).await.unwrap(),
        (2, 7)
    );
    assert_eq!(
        e.sync_out(vec![file("t/f1", e.host("f1"))]).await.unwrap(),
        (1, 3)
    );
}

// 7. Host-side paths must be absolute.
#[tokio::test]
async fn relative_host_paths_are_refused_clearly() {
    let mut e = Env::new(json!({})).await;
    write(&e.root.join("f"), b"f", 0o644);
    let r = e.sync_out(vec![file("f", "bare.txt")]).await;
    assert_refused(r, RpcErrorCode::InvalidParams, "must be absolute");
    let r = e.sync_in(vec![file("bare.txt", "g")]).await;
    assert_refused(r, RpcErrorCode::InvalidParams, "must be absolute");
    let worker_dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/python-provider");
    assert!(!worker_dir.join("bare.txt").exists());
}

// Release keeps the lease for a resume; destroy deletes it.
#[tokio::test]
async fn release_keeps_the_lease_for_resume_and_destroy_deletes_it() {
    let mut e = Env::new(json!({})).await;
    write(&e.root.join("kept.txt"), b"kept", 0o644);
    let receipt =
        e.w.call::<methods::ReleaseLease>(&e.end())
            .await
            .unwrap()
            .unwrap();
    assert_eq!(receipt.state, LeaseEndState::Stopped);
    assert!(
        e.root.join("kept.txt").exists(),
        "release keeps the directory"
    );
    let lease = e.lease.clone();
    let r = e.exec(&lease, &["true"], None).await;
    assert!(
        r.unwrap_err().message.contains("released"),
        "no work on a released lease"
    );

    let resumed = e.resume().await;
    assert_eq!(resumed.provider_lease_id.as_deref(), Some(e.id.as_str()));
    let cat = e.exec(&resumed, &["cat", "kept.txt"], None).await.unwrap();
    assert_eq!(cat.stdout, "kept");

    let receipt =
        e.w.call::<methods::DestroyLease>(&e.end())
            .await
            .unwrap()
            .unwrap();
    assert_eq!(receipt.state, LeaseEndState::Destroyed);
    assert!(
        !e.root.parent().unwrap().exists(),
        "destroy deletes the directory"
    );
    assert_eq!(e.resume().await, Lease::gone(LeaseGoneReason::NotFound));
    e.w.call::<methods::DestroyLease>(&e.end()).await.unwrap();
}

// execute's cwd: absolute only when it resolves inside the lease root.
#[tokio::test]
async fn execute_accepts_an_absolute_cwd_only_inside_the_lease_root() {
    let mut e = Env::new(json!({})).await;
    fs::create_dir_all(e.root.join("sub")).unwrap();
    let lease = e.lease.clone();
    let sub = e.root.join("sub");
    let pwd = e
        .exec(&lease, &["pwd"], Some(sub.to_str().unwrap()))
        .await
        .unwrap();
    assert_eq!(
        pwd.stdout.trim_end(),
        fs::canonicalize(&sub).unwrap().to_str().unwrap()
    );
    let pwd = e.exec(&lease, &["pwd"], Some("sub")).await.unwrap();
    assert_eq!(
        pwd.stdout.trim_end(),
        fs::canonicalize(&sub).unwrap().to_str().unwrap()
    );

    symlink(e.host.path(), e.root.join("out")).unwrap();
    let host = e.host.path().to_string_lossy().into_owned();
    for cwd in [host.as_str(), "out", "/"] {
        let r = e.exec(&lease, &["pwd"], Some(cwd)).await;
        assert_eq!(r.unwrap_err().code, RpcErrorCode::InvalidParams, "{cwd}");
    }
}
