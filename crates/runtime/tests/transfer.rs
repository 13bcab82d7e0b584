//! File transfer through real workers: the same scenarios run once through
//! the Python example provider as it is (native sync) and once through a
//! copy of its plugin that declares `nativeSyncIn: false` (the base64
//! fallback), and must give the same result. A hostile worker answers
//! fallback downloads with crafted archives, which must be refused with
//! nothing written outside the destination.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use sandhost_contract::resolve::{LeaseFacts, Verified};
use sandhost_contract::ProviderCapability;
use sandhost_protocol::{methods, AcquireLeaseParams, EnvironmentScope};
use sandhost_runtime::context::LeaseContext;
use sandhost_runtime::plugins::{Plugin, PluginSource};
use sandhost_runtime::snapshot::{CapabilitySnapshot, RunFacts};
use sandhost_runtime::transfer::{
    download, upload, TransferError, TransferLimits, TransferPath, TransferReport,
};
use sandhost_runtime::worker::{Worker, WorkerOptions};
use tempfile::TempDir;

const NATIVE: &str = "../../examples/python-provider";
const FALLBACK: &str = "tests/plugins/python-no-native-sync";
const HOSTILE: &str = "tests/plugins/hostile-tar";
const CHANGING: &str = "tests/plugins/changing-file";

fn plugin_dir(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// A live lease on a freshly spawned worker, with its state in a temp dir.
struct Leased {
    ctx: LeaseContext,
    /// The lease's root directory on this machine (the Python worker puts it
    /// in the lease metadata), to look at the remote side directly.
    root: Option<PathBuf>,
    _state: TempDir,
}

async fn lease(plugin: &str, env: Vec<(String, String)>) -> Leased {
    let plugin = Plugin::load(&plugin_dir(plugin), PluginSource::Flag).expect("plugin loads");
    lease_plugin(plugin, env).await
}

async fn lease_plugin(plugin: Plugin, env: Vec<(String, String)>) -> Leased {
    let state = TempDir::new().unwrap();
    let mut spec = plugin.worker_spec();
    spec.env.push((
        "SANDHOST_STATE_DIR".into(),
        state.path().to_string_lossy().into_owned(),
    ));
    spec.env.extend(env);
    let worker = Worker::spawn(&spec, WorkerOptions::default())
        .await
        .expect("worker starts");
    let driver_key = plugin.manifest.environment_drivers[0].driver_key.clone();
    let snapshot = CapabilitySnapshot::resolve(
        Some(&plugin.manifest),
        Verified::methods(worker.supported_methods().iter().cloned()),
        &RunFacts {
            driver_key: &driver_key,
            lease: LeaseFacts::default(),
            pinned_plugin_id: None,
            config_resolution_failed: false,
        },
    );
    let scope = EnvironmentScope {
        driver_key: driver_key.clone(),
        company_id: "tenant".into(),
        environment_id: "env".into(),
        issue_id: None,
        config: serde_json::json!({}),
    };
    let lease = worker
        .call::<methods::AcquireLease>(&AcquireLeaseParams {
            scope: scope.clone(),
            run_id: "run-1".into(),
            requested_cwd: None,
            agent_id: None,
            requested_expires_at: None,
        })
        .await
        .expect("lease acquired");
    let root = lease
        .metadata
        .as_ref()
        .and_then(|m| m.get("root"))
        .and_then(|r| r.as_str())
        .map(PathBuf::from);
    Leased {
        ctx: LeaseContext {
            worker: Arc::new(worker),
            scope,
            lease,
            snapshot,
        },
        root,
        _state: state,
    }
}

// ---------------------------------------------------------------- tree snapshots

#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Dir { mode: u32 },
    File { mode: u32, len: u64, hash: u64 },
    Link { target: String },
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf29ce484222325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x100000001b3)
    })
}

fn node(path: &Path) -> Node {
    let m = fs::symlink_metadata(path).unwrap();
    let mode = m.permissions().mode() & 0o7777;
    if m.file_type().is_symlink() {
        Node::Link {
            target: fs::read_link(path).unwrap().to_string_lossy().into_owned(),
        }
    } else if m.is_dir() {
        Node::Dir { mode }
    } else {
        let data = fs::read(path).unwrap();
        Node::File {
            mode,
            len: data.len() as u64,
            hash: fnv(&data),
        }
    }
}

/// Every entry below `root` (and the root itself as ""), by relative path.
fn tree(root: &Path) -> BTreeMap<String, Node> {
    let mut out = BTreeMap::new();
    out.insert(String::new(), node(root));
    let mut stack = vec![PathBuf::new()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(root.join(&dir)).unwrap() {
            let rel = dir.join(e.unwrap().file_name());
            let n = node(&root.join(&rel));
            if matches!(n, Node::Dir { .. }) {
                stack.push(rel.clone());
            }
            out.insert(rel.to_string_lossy().into_owned(), n);
        }
    }
    out
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn write(path: &Path, data: &[u8], mode: u32) {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).unwrap();
    }
    fs::write(path, data).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn mkdir(path: &Path, mode: u32) {
    fs::create_dir_all(path).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// The scenario tree: nested dirs, an empty dir, modes 0644/0755/0600,
/// symlinks inside the tree, and a 5 MiB file holding every byte value.
fn build_tree(root: &Path) {
    mkdir(root, 0o755);
    write(&root.join("a.txt"), b"hello\n", 0o644);
    write(&root.join("run.sh"), b"#!/bin/sh\necho hi\n", 0o755);
    write(&root.join("secret"), b"s3cret", 0o600);
    mkdir(&root.join("empty"), 0o755);
    mkdir(&root.join("nested/deeper"), 0o755);
    fs::set_permissions(root.join("nested"), fs::Permissions::from_mode(0o750)).unwrap();
    write(&root.join("nested/deeper/leaf.txt"), b"leaf", 0o644);
    let blob: Vec<u8> = (0..5u32 * 1024 * 1024)
        .map(|i| (i.wrapping_mul(7) ^ (i >> 8)) as u8)
        .collect();
    assert_eq!(
        blob.iter()
            .copied()
            .collect::<std::collections::BTreeSet<u8>>()
            .len(),
        256,
        "the blob holds every byte value"
    );
    write(&root.join("blob.bin"), &blob, 0o644);
    symlink("a.txt", root.join("link-to-a")).unwrap();
    symlink("../../a.txt", root.join("nested/deeper/up")).unwrap();
}

/// What one run of the scenario observed; equal across paths.
#[derive(Debug, PartialEq)]
struct Outcome {
    reports: Vec<(u64, u64)>,
    remote_after_tree: BTreeMap<String, Node>,
    downloaded_tree: BTreeMap<String, Node>,
    remote_after_replace: BTreeMap<String, Node>,
    remote_file: Node,
    remote_cfg_names: Vec<String>,
    downloaded_file: Node,
    remote_top_names: Vec<String>,
    local_top_names: Vec<String>,
}

fn counts(r: &TransferReport) -> (u64, u64) {
    (r.files, r.bytes)
}

/// Upload a tree, download it back, replace it with another tree, and
/// replace a single file twice then download it; every report must name
/// `expect` as its path.
async fn scenario(plugin: &str, expect: TransferPath) -> Outcome {
    let l = lease(plugin, vec![]).await;
    let remote_root = l.root.clone().expect("the lease reports its root");
    let limits = TransferLimits::default();
    let work = TempDir::new().unwrap();
    let src = work.path().join("src");
    build_tree(&src);
    let mut reports = Vec::new();

    // tree up and back
    let r = upload(&l.ctx, &src, "proj", &limits).await.unwrap();
    assert_eq!(r.path, expect);
    reports.push(counts(&r));
    let remote_after_tree = tree(&remote_root.join("proj"));
    assert_eq!(
        remote_after_tree,
        tree(&src),
        "the remote tree is the source"
    );

    let out = work.path().join("out");
    fs::create_dir(&out).unwrap();
    // a stale tree at the destination is replaced, not merged
    write(&out.join("proj/stale.txt"), b"old", 0o644);
    let r = download(&l.ctx, "proj", &out.join("proj"), &limits)
        .await
        .unwrap();
    assert_eq!(r.path, expect);
    reports.push(counts(&r));
    let downloaded_tree = tree(&out.join("proj"));
    assert_eq!(
        downloaded_tree,
        tree(&src),
        "bytes, modes and links survive"
    );

    // a second upload destroys and replaces the remote tree
    let src2 = work.path().join("src2");
    mkdir(&src2, 0o700);
    write(&src2.join("new.txt"), b"v2", 0o640);
    let r = upload(&l.ctx, &src2, "proj", &limits).await.unwrap();
    assert_eq!(r.path, expect);
    reports.push(counts(&r));
    let remote_after_replace = tree(&remote_root.join("proj"));
    assert_eq!(remote_after_replace, tree(&src2));

    // single-file replace of an existing target
    let f1 = work.path().join("f1");
    let f2 = work.path().join("f2");
    write(&f1, b"first", 0o600);
    write(&f2, b"second version", 0o755);
    for f in [&f1, &f2] {
        let r = upload(&l.ctx, f, "cfg/app.conf", &limits).await.unwrap();
        assert_eq!(r.path, expect);
        reports.push(counts(&r));
    }
    let remote_file = node(&remote_root.join("cfg/app.conf"));
    assert_eq!(
        remote_file,
        Node::File {
            mode: 0o755,
            len: 14,
            hash: fnv(b"second version")
        }
    );
    let remote_cfg_names = names(&remote_root.join("cfg"));

    // single-file download replaces an existing local file
    let got = out.join("got.conf");
    write(&got, b"to be replaced", 0o600);
    let r = download(&l.ctx, "cfg/app.conf", &got, &limits)
        .await
        .unwrap();
    assert_eq!(r.path, expect);
    reports.push(counts(&r));
    let downloaded_file = node(&got);

    Outcome {
        reports,
        remote_after_tree,
        downloaded_tree,
        remote_after_replace,
        remote_file,
        remote_cfg_names,
        downloaded_file,
        remote_top_names: names(&remote_root),
        local_top_names: names(&out),
    }
}

#[tokio::test]
async fn tree_and_file_round_trips_give_the_same_result_on_native_sync_and_base64_fallback() {
    let native = scenario(NATIVE, TransferPath::Native).await;
    let fallback = scenario(FALLBACK, TransferPath::Base64Fallback).await;
    assert_eq!(native, fallback);
    // and the shared result is the right one
    assert_eq!(
        native.reports,
        vec![
            (5, 5 * 1024 * 1024 + 6 + 18 + 6 + 4),
            (5, 5 * 1024 * 1024 + 6 + 18 + 6 + 4),
            (1, 2),
            (1, 5),
            (1, 14),
            (1, 14),
        ]
    );
    assert_eq!(
        native.remote_cfg_names,
        vec!["app.conf"],
        "no temp files left"
    );
    assert_eq!(
        native.remote_top_names,
        vec!["cfg", "proj"],
        "no temp files left"
    );
    assert_eq!(
        native.local_top_names,
        vec!["got.conf", "proj"],
        "no staging left"
    );
    assert_eq!(
        native.downloaded_file,
        Node::File {
            mode: 0o644,
            len: 14,
            hash: fnv(b"second version")
        }
    );
}

#[tokio::test]
async fn the_path_follows_the_snapshot_not_the_methods_the_worker_advertises() {
    let l = lease(FALLBACK, vec![]).await;
    assert!(l.ctx.worker.supports("environmentSyncIn"));
    assert!(l.ctx.worker.supports("environmentSyncOut"));
    assert!(!l.ctx.snapshot.native_sync());
    let work = TempDir::new().unwrap();
    let f = work.path().join("f");
    write(&f, b"x", 0o644);
    let r = upload(&l.ctx, &f, "f", &TransferLimits::default())
        .await
        .unwrap();
    assert_eq!(r.path, TransferPath::Base64Fallback);
}

// ---------------------------------------------------------------- errors, both paths

async fn on_both<T: PartialEq + std::fmt::Debug>(
    f: impl for<'a> Fn(
        &'a Leased,
        &'a Path,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = T> + 'a>>,
) -> T {
    let mut results = Vec::new();
    for plugin in [NATIVE, FALLBACK] {
        let l = lease(plugin, vec![]).await;
        let work = TempDir::new().unwrap();
        results.push(f(&l, work.path()).await);
    }
    let fallback = results.pop().unwrap();
    let native = results.pop().unwrap();
    assert_eq!(native, fallback, "native and fallback disagree");
    native
}

fn code<T>(r: Result<T, TransferError>) -> &'static str {
    match r {
        Ok(_) => "ok",
        Err(e) => e.code().as_str(),
    }
}

#[tokio::test]
async fn invalid_remote_paths_are_refused_before_anything_runs() {
    let l = lease(FALLBACK, vec![]).await;
    let work = TempDir::new().unwrap();
    let f = work.path().join("f");
    write(&f, b"x", 0o644);
    let long = "a/".repeat(2100);
    let long_name = "n".repeat(300);
    for bad in [
        "",
        "a\0b",
        "../x",
        "a/../../x",
        "x/..",
        ".",
        "/",
        "a\nb",
        long.as_str(),
        long_name.as_str(),
    ] {
        let up = upload(&l.ctx, &f, bad, &TransferLimits::default()).await;
        assert_eq!(code(up), "E5101", "upload to {bad:?}");
        let down = download(
            &l.ctx,
            bad,
            &work.path().join("d"),
            &TransferLimits::default(),
        )
        .await;
        assert_eq!(code(down), "E5101", "download of {bad:?}");
    }
    assert_eq!(names(l.root.as_ref().unwrap()), Vec::<String>::new());
    assert_eq!(names(work.path()), vec!["f"]);
}

#[tokio::test]
async fn a_missing_remote_path_is_the_same_typed_error_on_both_paths() {
    let got = on_both(|l, dir| {
        Box::pin(async move {
            let r = download(&l.ctx, "nope", &dir.join("d"), &TransferLimits::default()).await;
            (code(r), names(dir))
        })
    })
    .await;
    assert_eq!(got, ("E5110", vec![]));
}

#[tokio::test]
async fn an_upload_tree_with_an_escaping_symlink_is_refused_on_both_paths() {
    let got = on_both(|l, dir| {
        Box::pin(async move {
            let src = dir.join("src");
            mkdir(&src, 0o755);
            write(&src.join("ok"), b"ok", 0o644);
            symlink("../../etc/passwd", src.join("out")).unwrap();
            let r = upload(&l.ctx, &src, "t", &TransferLimits::default()).await;
            let err = r
                .as_ref()
                .err()
                .map(ToString::to_string)
                .unwrap_or_default();
            (
                code(r),
                err.contains("leaves the tree"),
                names(l.root.as_ref().unwrap()),
            )
        })
    })
    .await;
    assert_eq!(got, ("E5109", true, vec![]));
}

#[tokio::test]
async fn download_caps_abort_before_the_destination_is_touched_on_both_paths() {
    let got = on_both(|l, dir| {
        Box::pin(async move {
            let src = dir.join("src");
            mkdir(&src, 0o755);
            for i in 0..5 {
                write(&src.join(format!("f{i}")), &[b'x'; 300], 0o644);
            }
            upload(&l.ctx, &src, "t", &TransferLimits::default())
                .await
                .unwrap();
            let dest = dir.join("dest");
            write(&dest.join("keep.txt"), b"keep", 0o644);
            let before = tree(&dest);
            let bytes = TransferLimits {
                max_bytes: 1000,
                ..TransferLimits::default()
            };
            let entries = TransferLimits {
                max_entries: 3,
                ..TransferLimits::default()
            };
            let a = download(&l.ctx, "t", &dest, &bytes).await;
            let a = a.err().map(|e| (e.code().as_str(), e.to_string()));
            let b = download(&l.ctx, "t", &dest, &entries).await;
            let b = b.err().map(|e| (e.code().as_str(), e.to_string()));
            assert_eq!(tree(&dest), before, "destination untouched");
            (a, b, names(dir))
        })
    })
    .await;
    let (a, b, left) = got;
    assert_eq!(a.unwrap().0, "E5105");
    let b = b.unwrap();
    assert_eq!(b.0, "E5105");
    assert!(b.1.contains("entry"), "{}", b.1);
    assert_eq!(left, vec!["dest", "src"], "no staging directory left");
}

#[tokio::test]
async fn a_download_onto_a_local_symlink_replaces_the_link_and_never_writes_through_it() {
    let got = on_both(|l, dir| {
        Box::pin(async move {
            let f = dir.join("f");
            write(&f, b"payload", 0o644);
            upload(&l.ctx, &f, "f", &TransferLimits::default())
                .await
                .unwrap();
            let victim = dir.join("victim");
            write(&victim, b"precious", 0o600);
            let dest = dir.join("dest");
            symlink(&victim, &dest).unwrap();
            download(&l.ctx, "f", &dest, &TransferLimits::default())
                .await
                .unwrap();
            (node(&victim), node(&dest))
        })
    })
    .await;
    assert_eq!(
        got.0,
        Node::File {
            mode: 0o600,
            len: 8,
            hash: fnv(b"precious")
        }
    );
    assert_eq!(
        got.1,
        Node::File {
            mode: 0o644,
            len: 7,
            hash: fnv(b"payload")
        }
    );
}

#[tokio::test]
async fn a_file_download_never_replaces_a_local_directory() {
    let got = on_both(|l, dir| {
        Box::pin(async move {
            let f = dir.join("f");
            write(&f, b"payload", 0o644);
            upload(&l.ctx, &f, "f", &TransferLimits::default())
                .await
                .unwrap();
            let dest = dir.join("dest");
            write(&dest.join("inside"), b"x", 0o644);
            let r = download(&l.ctx, "f", &dest, &TransferLimits::default()).await;
            (code(r), names(&dest), names(dir))
        })
    })
    .await;
    assert_eq!(
        got,
        (
            "E5102",
            vec!["inside".to_string()],
            vec!["dest".to_string(), "f".to_string()]
        )
    );
}

// ---------------------------------------------------------------- hostile sandbox

struct Hostile {
    l: Leased,
    work: TempDir,
}

impl Hostile {
    async fn new() -> Self {
        let work = TempDir::new().unwrap();
        mkdir(&work.path().join("outside"), 0o755);
        let outside = work.path().join("outside").to_string_lossy().into_owned();
        let l = lease(HOSTILE, vec![("HOSTILE_OUTSIDE".into(), outside)]).await;
        assert!(!l.ctx.snapshot.native_sync());
        Self { l, work }
    }

    /// Download `case-NAME` into `<work>/dest` (which holds `keep.txt`).
    async fn fetch(
        &self,
        case: &str,
        limits: &TransferLimits,
    ) -> Result<TransferReport, TransferError> {
        let dest = self.work.path().join("dest");
        if !dest.exists() {
            write(&dest.join("keep.txt"), b"keep", 0o644);
        }
        download(&self.l.ctx, &format!("case-{case}"), &dest, limits).await
    }

    /// Nothing outside the destination changed and no staging is left.
    fn assert_contained(&self) {
        assert_eq!(names(self.work.path()), vec!["dest", "outside"]);
        assert_eq!(
            names(&self.work.path().join("outside")),
            Vec::<String>::new()
        );
        assert!(!Path::new("/etc/sandhost-transfer-canary").exists());
    }

    fn assert_dest_untouched(&self) {
        assert_eq!(names(&self.work.path().join("dest")), vec!["keep.txt"]);
    }
}

async fn refused(case: &str, limits: TransferLimits) -> TransferError {
    let h = Hostile::new().await;
    let err = h.fetch(case, &limits).await.unwrap_err();
    h.assert_contained();
    h.assert_dest_untouched();
    err
}

fn rejected_entry(err: &TransferError) -> (&str, &str) {
    match err {
        TransferError::ArchiveRejected { entry, reason } => (entry.as_str(), reason.as_str()),
        other => panic!("expected an archive rejection, got {other:?}"),
    }
}

#[tokio::test]
async fn a_dotdot_entry_from_the_sandbox_is_rejected() {
    let err = refused("dotdot", TransferLimits::default()).await;
    assert_eq!(err.code().as_str(), "E5104");
    assert_eq!(rejected_entry(&err), ("../escape.txt", "`..` in path"));
}

#[tokio::test]
async fn an_absolute_entry_from_the_sandbox_is_rejected() {
    let err = refused("absolute", TransferLimits::default()).await;
    let (entry, reason) = rejected_entry(&err);
    assert!(entry.ends_with("/outside/absolute.txt"), "{entry}");
    assert_eq!(reason, "absolute path");
}

#[tokio::test]
async fn a_symlink_to_etc_then_a_file_through_it_is_rejected() {
    let err = refused("symlink-etc", TransferLimits::default()).await;
    assert_eq!(rejected_entry(&err), ("etc", "absolute symlink target"));
}

#[tokio::test]
async fn a_relative_symlink_out_then_a_file_through_it_is_rejected() {
    let err = refused("symlink-out", TransferLimits::default()).await;
    assert_eq!(
        rejected_entry(&err),
        ("up/through.txt", "path goes through a symlink")
    );
}

#[tokio::test]
async fn a_symlink_whose_target_passes_through_another_symlink_is_rejected() {
    // d/l -> .. is inside; x -> d/l/.. looks inside lexically but really
    // resolves to the parent of the tree
    let err = refused("symlink-chain", TransferLimits::default()).await;
    assert_eq!(
        rejected_entry(&err),
        ("x", "symlink target passes through another symlink")
    );
}

#[tokio::test]
async fn a_hard_link_from_the_sandbox_is_rejected() {
    let err = refused("hardlink", TransferLimits::default()).await;
    assert_eq!(rejected_entry(&err), ("passwd", "hard link"));
}

#[tokio::test]
async fn a_device_node_from_the_sandbox_is_rejected() {
    let err = refused("device", TransferLimits::default()).await;
    assert_eq!(rejected_entry(&err), ("null", "device node"));
}

#[tokio::test]
async fn a_fifo_from_the_sandbox_is_rejected() {
    let err = refused("fifo", TransferLimits::default()).await;
    assert_eq!(rejected_entry(&err), ("pipe", "fifo"));
}

#[tokio::test]
async fn too_many_entries_from_the_sandbox_abort_the_download() {
    let err = refused(
        "many-entries",
        TransferLimits {
            max_entries: 10,
            ..TransferLimits::default()
        },
    )
    .await;
    assert!(
        matches!(
            err,
            TransferError::CapExceeded {
                what: "entry",
                limit: 10
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn too_many_bytes_from_the_sandbox_abort_the_download() {
    let err = refused(
        "many-bytes",
        TransferLimits {
            max_bytes: 1000,
            ..TransferLimits::default()
        },
    )
    .await;
    assert!(
        matches!(
            err,
            TransferError::CapExceeded {
                what: "byte",
                limit: 1000
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_entry_claiming_a_huge_size_is_refused_before_any_byte_is_written() {
    let err = refused("claims-huge", TransferLimits::default()).await;
    assert!(
        matches!(err, TransferError::CapExceeded { what: "byte", .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_fallback_answer_over_the_chunk_bound_is_refused() {
    let err = refused(
        "huge-file",
        TransferLimits {
            fallback_chunk: 1000,
            ..TransferLimits::default()
        },
    )
    .await;
    assert!(
        matches!(
            err,
            TransferError::CapExceeded {
                what: "fallback chunk",
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn setuid_setgid_and_sticky_bits_from_the_sandbox_are_stripped() {
    let h = Hostile::new().await;
    let r = h.fetch("setuid", &TransferLimits::default()).await.unwrap();
    assert_eq!((r.files, r.path), (2, TransferPath::Base64Fallback));
    h.assert_contained();
    let dest = h.work.path().join("dest");
    assert_eq!(
        names(&dest),
        vec!["group", "shared", "tool"],
        "replaced, not merged"
    );
    let mode = |p: &str| {
        fs::symlink_metadata(dest.join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("tool"), 0o755);
    assert_eq!(mode("group"), 0o750);
    assert_eq!(mode("shared"), 0o777);
}

#[tokio::test]
async fn worker_errors_keep_their_own_code_visible() {
    // the Python worker refuses an absolute sync path: the native path turns
    // that into a worker error whose own code shows
    let l = lease(NATIVE, vec![]).await;
    let work = TempDir::new().unwrap();
    let f = work.path().join("f");
    write(&f, b"x", 0o644);
    let err = upload(&l.ctx, &f, "/abs/f", &TransferLimits::default())
        .await
        .unwrap_err();
    assert_eq!(err.code().as_str(), "E5107");
    assert_eq!(err.worker_code().map(|c| c.as_str()), Some("E4106"));
    assert!(err.to_string().contains("E4106"), "{err}");
}

// ---------------------------------------------------------------- chunked fallback download

/// A lease on the Python example provider narrowed to the fallback (native
/// sync in declared off), with the sandbox's `$TMPDIR` in `tmp`.
async fn fallback_lease(tmp: &Path) -> Leased {
    let plugin = Plugin::load(&plugin_dir(NATIVE), PluginSource::Flag)
        .unwrap()
        .narrowed("python-tempdir", ProviderCapability::NativeSyncIn);
    let l = lease_plugin(plugin, vec![("TMPDIR".into(), tmp.display().to_string())]).await;
    assert!(!l.ctx.snapshot.native_sync());
    l
}

/// Pseudo-random bytes (xorshift), every byte value present.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The transfer temp files the sandbox left in its `$TMPDIR`.
fn leftover_temps(tmp: &Path) -> Vec<String> {
    names(tmp)
        .into_iter()
        .filter(|n| n.starts_with(".sandhost-"))
        .collect()
}

#[tokio::test]
async fn a_64_mib_file_comes_back_byte_identical_through_the_chunked_fallback() {
    let tmp = TempDir::new().unwrap();
    let l = fallback_lease(tmp.path()).await;
    let work = TempDir::new().unwrap();
    let data = noise(64 << 20, 0x9e37_79b9_7f4a_7c15);
    // written straight into the sandbox: the upload fallback (32 KiB per
    // exec) is not what this measures
    write(&l.root.as_ref().unwrap().join("big.bin"), &data, 0o600);
    let dest = work.path().join("big.bin");
    let limits = TransferLimits::default();
    let t = std::time::Instant::now();
    let r = download(&l.ctx, "big.bin", &dest, &limits).await.unwrap();
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "fallback download of 64 MiB in {} chunks: {secs:.2} s, {:.1} MiB/s",
        (64 << 20) / limits.fallback_chunk,
        64.0 / secs
    );
    assert_eq!(
        (r.path, r.files, r.bytes),
        (TransferPath::Base64Fallback, 1, 64 << 20)
    );
    assert!(fs::read(&dest).unwrap() == data, "byte-identical");
    assert_eq!(
        node(&dest),
        Node::File {
            mode: 0o644,
            len: 64 << 20,
            hash: fnv(&data)
        }
    );
    assert_eq!(names(work.path()), vec!["big.bin"], "no staging left");
    assert_eq!(leftover_temps(tmp.path()), Vec::<String>::new());
}

#[tokio::test]
async fn a_tree_over_the_frame_limit_round_trips_through_the_fallback() {
    let tmp = TempDir::new().unwrap();
    let l = fallback_lease(tmp.path()).await;
    let work = TempDir::new().unwrap();
    let src = work.path().join("src");
    build_tree(&src);
    for i in 0..3u64 {
        write(
            &src.join(format!("nested/big{i}.bin")),
            &noise(6 << 20, i + 1),
            0o640,
        );
    }
    for i in 0..200 {
        write(
            &src.join(format!("many/f{i:03}")),
            format!("{i}\n").as_bytes(),
            0o644,
        );
    }
    let limits = TransferLimits::default();
    let up = upload(&l.ctx, &src, "proj", &limits).await.unwrap();
    assert_eq!(up.path, TransferPath::Base64Fallback);
    assert!(up.bytes > 16 << 20, "{} bytes", up.bytes);
    let dest = work.path().join("back");
    let down = download(&l.ctx, "proj", &dest, &limits).await.unwrap();
    assert_eq!(down.path, TransferPath::Base64Fallback);
    assert_eq!((down.files, down.bytes), (up.files, up.bytes));
    assert_eq!(tree(&dest), tree(&src), "bytes, modes and links survive");
    assert_eq!(names(work.path()), vec!["back", "src"], "no staging left");
    assert_eq!(leftover_temps(tmp.path()), Vec::<String>::new());
    assert_eq!(names(l.root.as_ref().unwrap()), vec!["proj"]);
}

#[tokio::test]
async fn a_file_changed_between_chunks_fails_loudly_and_nothing_lands() {
    let l = lease(CHANGING, vec![]).await;
    assert!(!l.ctx.snapshot.native_sync());
    let root = l.root.clone().unwrap();
    let work = TempDir::new().unwrap();
    let dest = work.path().join("dest");
    write(&dest, b"keep", 0o600);
    let limits = TransferLimits {
        fallback_chunk: 64 << 10,
        ..TransferLimits::default()
    };
    // a size that is a multiple of the chunk: growth shows only in the digest
    for (name, len) in [
        ("flip-a", 300_000),
        ("grow-b", 256 << 10),
        ("grow-c", 300_000),
        ("shrink-d", 300_000),
    ] {
        write(&root.join(name), &noise(len, 7), 0o644);
        let err = download(&l.ctx, name, &dest, &limits).await.unwrap_err();
        assert_eq!(err.code().as_str(), "E5111", "{name}: {err}");
        assert!(
            matches!(&err, TransferError::RemoteChanged { path, .. } if path == name),
            "{err:?}"
        );
        assert_eq!(
            fs::read(&dest).unwrap(),
            b"keep",
            "{name}: destination untouched"
        );
        assert_eq!(names(work.path()), vec!["dest"], "{name}: no staging left");
    }
    // unchanged, the same download goes through
    write(&root.join("still"), &noise(300_000, 9), 0o644);
    download(&l.ctx, "still", &dest, &limits).await.unwrap();
    assert_eq!(fs::read(&dest).unwrap(), noise(300_000, 9));
}

#[tokio::test]
async fn the_sandbox_temp_archive_is_removed_after_a_failed_download() {
    let tmp = TempDir::new().unwrap();
    let l = fallback_lease(tmp.path()).await;
    let work = TempDir::new().unwrap();
    let remote = l.root.clone().unwrap().join("proj");
    write(&remote.join("big.bin"), &noise(3 << 20, 3), 0o644);
    for i in 0..20 {
        write(&remote.join(format!("f{i:02}")), b"x", 0o644);
    }
    let dest = work.path().join("dest");
    // refused while streaming: the entry cap, many chunks in
    let entries = TransferLimits {
        max_entries: 5,
        ..TransferLimits::default()
    };
    let err = download(&l.ctx, "proj", &dest, &entries).await.unwrap_err();
    assert!(
        matches!(err, TransferError::CapExceeded { what: "entry", .. }),
        "{err:?}"
    );
    assert_eq!(leftover_temps(tmp.path()), Vec::<String>::new());
    // refused in the sandbox before anything moves: the archive is too large
    let bytes = TransferLimits {
        max_bytes: 1 << 20,
        max_entries: 30,
        ..TransferLimits::default()
    };
    let err = download(&l.ctx, "proj", &dest, &bytes).await.unwrap_err();
    assert!(
        matches!(
            err,
            TransferError::CapExceeded {
                what: "archive size",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(leftover_temps(tmp.path()), Vec::<String>::new());
    // and after a success
    download(&l.ctx, "proj", &dest, &TransferLimits::default())
        .await
        .unwrap();
    assert_eq!(tree(&dest), tree(&remote));
    assert_eq!(leftover_temps(tmp.path()), Vec::<String>::new());
    assert_eq!(names(work.path()), vec!["dest"], "no staging left");
}
