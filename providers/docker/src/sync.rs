//! Native sync through the Engine's archive endpoints.
//!
//! Paths in the lease are relative to the lease's workdir (the sync root);
//! absolute paths, `..`, nul bytes and over-long names are refused. Before
//! any write or read the deepest existing ancestor is resolved physically
//! *inside the container* (`cd -P` in an exec) and must stay under the root,
//! so a symlink planted in the lease cannot redirect a transfer; the Engine
//! itself resolves archive paths inside the container's filesystem, never on
//! the host.
//!
//! Packing and unpacking are the shared `sandhost-archive` crate's, so the
//! rules on what a tree may hold are the same as the runtime's base64
//! fallback:
//!
//! - In: the host source is checked with [`sandhost_archive::scan_tree`]
//!   (regular files, directories, in-tree symlinks; caps counted) and packed
//!   with [`sandhost_archive::pack_tree`] (a single file: one entry with its
//!   mode). The archive is uploaded into a private (0700, `mktemp -d`)
//!   directory next to the target, so nothing is ever visible half-written;
//!   excluded paths are removed there, the mode is set, then a file is
//!   renamed over the target (`mv -f`, atomic) and a directory replaces it
//!   (destroy-then-replace). `followSymlinks: true` is refused: symlinks
//!   travel as links, and only those that stay inside the tree.
//! - Out: the Engine's tar stream (bounded) is unpacked on the host with
//!   [`sandhost_archive::unpack`] into a [`Staging`] directory next to
//!   `targetPath`; its single top entry (the downloaded name) is checked
//!   again as a tree of its own with [`sandhost_archive::check_staged`] (a
//!   symlink may not leave it), then [`swap_into_place`] renames it over the
//!   target.

use std::fs;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use bollard::query_parameters::{DownloadFromContainerOptions, UploadToContainerOptions};
use bollard::Docker;
use futures_util::StreamExt;
use sandhost_archive::{swap_into_place, Counts, Kind, Limits, Staging};
use sandhost_protocol::{FileKind, FileMapping, SyncOperation, SyncOperationResult, SyncResult};

use crate::engine::LeaseInfo;
use crate::error::{DockerError, Result};
use crate::exec::{self, ExecSpec};

/// Largest transfer of one mapping, in bytes.
pub const MAX_BYTES: u64 = 512 << 20;
/// Most entries in one mapping.
pub const MAX_ENTRIES: u64 = 100_000;
const MAX_PATH: usize = sandhost_archive::MAX_PATH_LEN;
const MAX_NAME: usize = sandhost_archive::MAX_NAME_LEN;

/// The caps of one mapping, in the shared crate's terms.
fn limits() -> Limits {
    Limits {
        max_bytes: MAX_BYTES,
        max_entries: MAX_ENTRIES,
    }
}

fn archive_kind(kind: FileKind) -> Kind {
    match kind {
        FileKind::File => Kind::File,
        FileKind::Directory => Kind::Directory,
    }
}

/// A validated lease path: the root, the parent and the last name.
#[derive(Debug, Clone)]
struct LeasePath {
    root: String,
    parent: String,
    name: String,
}

fn lease_path(root: &str, rel: &str) -> Result<LeasePath> {
    let refuse = |why: &str| DockerError::InvalidPath {
        path: rel.to_string(),
        why: why.to_string(),
    };
    if rel.contains('\0') {
        return Err(refuse("it contains a nul byte"));
    }
    if rel.starts_with('/') {
        return Err(refuse("absolute paths are outside the sync root"));
    }
    if rel.len() > MAX_PATH {
        return Err(refuse("it is too long"));
    }
    let mut parts = vec![];
    for c in rel.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(refuse("`..` leaves the sync root")),
            c if c.len() > MAX_NAME => return Err(refuse("a name is too long")),
            c => parts.push(c),
        }
    }
    let Some(name) = parts.pop() else {
        return Err(refuse("it names the sync root itself"));
    };
    let root = root.trim_end_matches('/').to_string();
    let parent = if parts.is_empty() {
        root.clone()
    } else {
        format!("{root}/{}", parts.join("/"))
    };
    Ok(LeasePath {
        root,
        parent,
        name: name.to_string(),
    })
}

/// Resolve (and with `create`, make) the parent inside the container; its
/// physical path, which is under the root's physical path. With `create` the
/// script also makes a private temp directory in it and prints its name on
/// a first line.
const RESOLVE: &str = r#"r=$(cd -P -- "$1" 2>/dev/null && pwd -P) || { echo "the sync root is missing" >&2; exit 4; }
d=$2
while [ ! -d "$d" ] && [ ! -L "$d" ]; do d=${d%/*}; [ -n "$d" ] || d=/; done
e=$(cd -P -- "$d" 2>/dev/null && pwd -P) || { echo "a path component is a dangling link" >&2; exit 5; }
case "$e/" in "$r"/*) ;; *) echo "it resolves outside the sync root" >&2; exit 5;; esac
if [ "$3" = create ]; then mkdir -p -- "$2" || exit 6; fi
p=$(cd -P -- "$2" 2>/dev/null && pwd -P) || { echo "the directory does not exist" >&2; exit 7; }
case "$p/" in "$r"/*) ;; *) echo "it resolves outside the sync root" >&2; exit 5;; esac
if [ "$3" = create ]; then t=$(mktemp -d "$p/.sandhost-sync.XXXXXX") || exit 6; printf '%s\n' "${t##*/}"; fi
printf '%s' "$p""#;

async fn resolve_parent(
    docker: &Docker,
    container: &str,
    lp: &LeasePath,
    rel: &str,
    create: bool,
) -> Result<String> {
    let argv = vec![
        "sh".into(),
        "-c".into(),
        RESOLVE.into(),
        "sh".into(),
        lp.root.clone(),
        lp.parent.clone(),
        if create { "create" } else { "" }.into(),
    ];
    let out = exec::run(
        docker,
        container,
        ExecSpec {
            argv,
            timeout: Some(Duration::from_secs(30)),
            ..Default::default()
        },
        None,
    )
    .await?;
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    match out.exit_code {
        Some(0) => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        Some(5) | Some(7) => Err(DockerError::InvalidPath {
            path: rel.to_string(),
            why: err,
        }),
        other => Err(DockerError::SyncFailed(format!(
            "cannot prepare `{rel}` in the lease (exit {other:?}): {err}"
        ))),
    }
}

/// A tiny glob: `*` (not `/`), `**` (anything), `?`.
fn glob(pattern: &str, text: &str) -> bool {
    fn m(p: &[u8], t: &[u8]) -> bool {
        match p.first() {
            None => t.is_empty(),
            Some(b'*') if p.get(1) == Some(&b'*') => (0..=t.len()).any(|i| m(&p[2..], &t[i..])),
            Some(b'*') => (0..=t.len())
                .take_while(|&i| i == 0 || t[i - 1] != b'/')
                .any(|i| m(&p[1..], &t[i..])),
            Some(b'?') => !t.is_empty() && t[0] != b'/' && m(&p[1..], &t[1..]),
            Some(c) => t.first() == Some(c) && m(&p[1..], &t[1..]),
        }
    }
    m(pattern.as_bytes(), text.as_bytes())
}

fn excluded(excludes: &[String], rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    excludes.iter().any(|p| {
        let p = p.trim_end_matches('/');
        glob(p, rel) || glob(p, name)
    })
}

/// The top-most paths below `src` (relative, `/`-separated) that `excludes`
/// match; what is below a match is not looked at.
fn excluded_paths(src: &Path, excludes: &[String]) -> Result<Vec<String>> {
    let mut out = vec![];
    if excludes.is_empty() {
        return Ok(out);
    }
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let dir = src.join(&rel);
        for e in fs::read_dir(&dir).map_err(DockerError::host_io(&dir))? {
            let e = e.map_err(DockerError::host_io(&dir))?;
            // a name that is not UTF-8 fails the scan anyway
            let Some(name) = e.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let child = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if excluded(excludes, &child) {
                out.push(child);
            } else if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(child);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// A one-entry archive of the regular file `src`, named `f`, with `mode`.
fn pack_file(src: &Path, size: u64, mode: u32) -> Result<Vec<u8>> {
    let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    fs::File::open(src)
        .and_then(|f| f.take(size.saturating_add(1)).read_to_end(&mut data))
        .map_err(DockerError::host_io(src))?;
    if data.len() as u64 != size {
        return Err(DockerError::SyncFailed(format!(
            "`{}` changed size while it was being sent",
            src.display()
        )));
    }
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(mode & 0o777);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(crate::engine::now_secs());
    let mut b = tar::Builder::new(Vec::new());
    b.append_data(&mut h, "f", data.as_slice())
        .map_err(DockerError::host_io(src))?;
    b.into_inner().map_err(DockerError::host_io(src))
}

async fn upload(docker: &Docker, container: &str, dir: &str, tar: Vec<u8>) -> Result<()> {
    docker
        .upload_to_container(
            container,
            Some(UploadToContainerOptions {
                path: dir.to_string(),
                no_overwrite_dir_non_dir: Some("true".into()),
                ..Default::default()
            }),
            bollard::body_full(tar.into()),
        )
        .await
        .map_err(DockerError::engine("upload archive"))
}

/// `environmentSyncIn`.
pub async fn sync_in(
    docker: &Docker,
    lease: &LeaseInfo,
    ops: &[SyncOperation],
) -> Result<SyncResult> {
    let mut results = vec![];
    for op in ops {
        let mut total = Counts::default();
        for m in &op.files {
            let c = sync_in_one(docker, lease, m).await?;
            total.files += c.files;
            total.bytes += c.bytes;
        }
        for cmd in op.post_upload_commands.iter().flatten() {
            let cwd = match cmd.cwd.as_deref() {
                Some(c) if c.starts_with('/') => c.to_string(),
                Some(c) => format!("{}/{c}", lease.workdir),
                None => lease.workdir.clone(),
            };
            let token = exec::token();
            let argv = exec::oneshot_argv(
                &token,
                &cwd,
                &["sh".into(), "-c".into(), cmd.command.clone()],
            );
            let out = exec::run(
                docker,
                &lease.container_id,
                ExecSpec {
                    argv,
                    timeout: Some(Duration::from_millis(cmd.timeout_ms.unwrap_or(120_000))),
                    token: Some(token),
                    ..Default::default()
                },
                None,
            )
            .await?;
            if out.exit_code != Some(0) {
                return Err(DockerError::SyncFailed(format!(
                    "post-upload command `{}` {}: {}",
                    cmd.command,
                    if out.timed_out {
                        "timed out".to_string()
                    } else {
                        format!("exited {:?}", out.exit_code)
                    },
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        }
        results.push(SyncOperationResult {
            operation_id: op.operation_id.clone(),
            files_transferred: total.files,
            bytes_transferred: total.bytes,
        });
    }
    Ok(SyncResult {
        operations: results,
    })
}

/// Place the uploaded temp directory `$1/$2` at `$1/$3`: a file (`$2/f`)
/// by an atomic rename (a symlink there is removed first, so `mv` cannot
/// move the file into the directory it points to; `mv -T` is no help, as
/// busybox's refuses a symlink to a directory), a directory by destroy-then-replace after removing
/// the excluded paths given as `$5...` and setting its mode `$4`. The temp
/// directory is gone afterwards, whatever happened.
const PLACE_FILE: &str = r#"trap 'rm -rf -- "$1/$2"' EXIT
if [ -d "$1/$3" ] && [ ! -L "$1/$3" ]; then echo "the target is a directory" >&2; exit 3; fi
if [ -L "$1/$3" ]; then rm -f -- "$1/$3" || exit 4; fi
mv -f -- "$1/$2/f" "$1/$3" || exit 4"#;
const PLACE_DIR: &str = r#"p=$1 t=$2 n=$3 m=$4; shift 4
trap 'rm -rf -- "$p/$t"' EXIT
for x in "$@"; do rm -rf -- "$p/$t/$x" || exit 4; done
chmod "$m" "$p/$t" || exit 4
rm -rf -- "$p/$n" && mv -f -- "$p/$t" "$p/$n" || exit 4"#;

async fn sync_in_one(docker: &Docker, lease: &LeaseInfo, m: &FileMapping) -> Result<Counts> {
    let lp = lease_path(&lease.workdir, &m.target_path)?;
    if m.follow_symlinks == Some(true) {
        return Err(DockerError::Unsupported(
            "followSymlinks: symlinks are synced as links, and only those inside the tree".into(),
        ));
    }
    let src = PathBuf::from(&m.source_path);
    let scan = sandhost_archive::scan_tree(&src, &limits())?;
    if scan.kind() != archive_kind(m.kind) {
        return Err(DockerError::InvalidParams(format!(
            "`{}` is not a {}",
            m.source_path,
            match m.kind {
                FileKind::File => "regular file",
                FileKind::Directory => "directory",
            }
        )));
    }
    let counts = scan.counts();
    let mode = m.mode.map_or(scan.mode(), |x| x.0) & 0o777;
    let (archive, excludes) = match m.kind {
        FileKind::File => (pack_file(&src, counts.bytes, mode)?, vec![]),
        FileKind::Directory => {
            let mut out = Vec::new();
            sandhost_archive::pack_tree(&src, &scan, &mut out)?;
            let excludes = excluded_paths(&src, m.exclude.as_deref().unwrap_or_default())?;
            (out, excludes)
        }
    };
    let prepared = resolve_parent(docker, &lease.container_id, &lp, &m.target_path, true).await?;
    let Some((tmp, parent)) = prepared
        .split_once('\n')
        .filter(|(t, _)| t.starts_with(".sandhost-sync.") && !t.contains('/'))
    else {
        return Err(DockerError::SyncFailed(format!(
            "cannot prepare `{}` in the lease: no temp directory was made",
            m.target_path
        )));
    };
    let tmp_path = format!("{parent}/{tmp}");
    if let Err(e) = upload(docker, &lease.container_id, &tmp_path, archive).await {
        let _ = exec::sh_ok(
            docker,
            &lease.container_id,
            r#"rm -rf -- "$1""#,
            &[&tmp_path],
        )
        .await;
        return Err(e);
    }
    let mode = format!("{mode:o}");
    let mut args = vec![parent, tmp, lp.name.as_str(), mode.as_str()];
    let script = match m.kind {
        FileKind::File => PLACE_FILE,
        FileKind::Directory => {
            args.extend(excludes.iter().map(String::as_str));
            PLACE_DIR
        }
    };
    exec::sh_ok(docker, &lease.container_id, script, &args).await?;
    Ok(counts)
}

/// `environmentSyncOut`.
pub async fn sync_out(
    docker: &Docker,
    lease: &LeaseInfo,
    ops: &[SyncOperation],
) -> Result<SyncResult> {
    let mut results = vec![];
    for op in ops {
        let mut total = Counts::default();
        for m in &op.files {
            let c = sync_out_one(docker, lease, m).await?;
            total.files += c.files;
            total.bytes += c.bytes;
        }
        results.push(SyncOperationResult {
            operation_id: op.operation_id.clone(),
            files_transferred: total.files,
            bytes_transferred: total.bytes,
        });
    }
    Ok(SyncResult {
        operations: results,
    })
}

async fn sync_out_one(docker: &Docker, lease: &LeaseInfo, m: &FileMapping) -> Result<Counts> {
    let lp = lease_path(&lease.workdir, &m.source_path)?;
    if m.follow_symlinks == Some(true) {
        return Err(DockerError::Unsupported(
            "followSymlinks: symlinks are synced as links, and only those inside the tree".into(),
        ));
    }
    let parent = resolve_parent(docker, &lease.container_id, &lp, &m.source_path, false).await?;
    let mut stream = docker.download_from_container(
        &lease.container_id,
        Some(DownloadFromContainerOptions {
            path: format!("{parent}/{}", lp.name),
        }),
    );
    let mut archive = Vec::new();
    // the tar framing adds headers and padding beyond the content bytes
    let limit = MAX_BYTES + MAX_ENTRIES * 1024 + (1 << 20);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| match &e {
            bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            } => DockerError::InvalidPath {
                path: m.source_path.clone(),
                why: "it does not exist in the lease".into(),
            },
            _ => DockerError::engine("download archive")(e),
        })?;
        archive.extend_from_slice(&chunk);
        if archive.len() as u64 > limit {
            return Err(DockerError::SyncLimit(format!(
                "the archive of `{}` exceeds {limit} bytes",
                m.source_path
            )));
        }
    }
    let target = PathBuf::from(&m.target_path);
    let counts = install_download(
        &archive,
        &lp.name,
        m.kind,
        &target,
        m.mode.map(|x| x.0),
        |top| {
            for x in excluded_paths(top, m.exclude.as_deref().unwrap_or_default())? {
                let p = top.join(&x);
                sandhost_archive::remove_tree(&p).map_err(DockerError::host_io(&p))?;
            }
            Ok(())
        },
    )?;
    Ok(counts)
}

/// Unpack a downloaded archive (one top entry, `name`) to `target` on the
/// host by the shared rules, and count what was installed.
///
/// The archive is unpacked into a private [`Staging`] directory beside
/// `target`; `name` must be its only top entry and of the expected kind; it
/// is then checked again as a tree of its own (no symlink may leave it),
/// `prune` may remove what is not wanted, the mode is set (`mode`, else the
/// remote one, permission bits only) and it is swapped into place. On any
/// error `target` is untouched and the staging directory is removed.
pub fn install_download(
    archive: &[u8],
    name: &str,
    kind: FileKind,
    target: &Path,
    mode: Option<u32>,
    prune: impl FnOnce(&Path) -> Result<()>,
) -> Result<Counts> {
    let parent = target
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(DockerError::host_io(parent))?;
    let stage = Staging::create(parent)?;
    let payload = stage.payload();
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&payload)
        .map_err(DockerError::host_io(&payload))?;
    sandhost_archive::unpack(archive, &payload, &limits())?;
    let mut tops = vec![];
    for e in fs::read_dir(&payload).map_err(DockerError::host_io(&payload))? {
        tops.push(e.map_err(DockerError::host_io(&payload))?.file_name());
    }
    if tops.len() != 1 || tops[0] != name {
        return Err(DockerError::SyncFailed(format!(
            "unsafe archive from the lease: expected the single top entry `{name}`, got {} entries",
            tops.len()
        )));
    }
    let top = payload.join(name);
    let meta = fs::symlink_metadata(&top).map_err(DockerError::host_io(&top))?;
    let (ok, what) = match kind {
        FileKind::File => (meta.file_type().is_file(), "a regular file"),
        FileKind::Directory => (meta.file_type().is_dir(), "a directory"),
    };
    if !ok {
        return Err(DockerError::InvalidParams(format!(
            "`{name}` in the lease is not {what}"
        )));
    }
    let remote_mode = meta.mode() & 0o777;
    if kind == FileKind::Directory {
        prune(&top)?;
    }
    let counts = sandhost_archive::check_staged(&top, archive_kind(kind), &limits())?;
    fs::set_permissions(
        &top,
        fs::Permissions::from_mode(mode.unwrap_or(remote_mode) & 0o777),
    )
    .map_err(DockerError::host_io(&top))?;
    swap_into_place(&top, target, archive_kind(kind))?;
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_paths_are_confined() {
        assert!(lease_path("/workspace", "../x").is_err());
        assert!(lease_path("/workspace", "a/../../x").is_err());
        assert!(lease_path("/workspace", "/etc/passwd").is_err());
        assert!(lease_path("/workspace", "a\0b").is_err());
        assert!(lease_path("/workspace", "").is_err());
        let p = lease_path("/workspace", "a/./b/c.txt").unwrap();
        assert_eq!(
            (p.parent.as_str(), p.name.as_str()),
            ("/workspace/a/b", "c.txt")
        );
    }

    #[test]
    fn globs_match() {
        assert!(glob("*.log", "x.log"));
        assert!(!glob("*.log", "d/x.log"));
        assert!(glob("**/*.log", "d/x.log"));
        assert!(excluded(&["node_modules/".into()], "a/node_modules"));
    }

    fn dir_header(mode: u32) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(mode);
        h.set_size(0);
        h
    }

    fn file_header(mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(mode);
        h.set_size(size);
        h
    }

    fn link(b: &mut tar::Builder<Vec<u8>>, name: &str, target: &str) {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Symlink);
        h.set_mode(0o777);
        h.set_size(0);
        b.append_link(&mut h, name, target).unwrap();
    }

    fn install(ar: &[u8], kind: FileKind, target: &Path) -> Result<Counts> {
        install_download(ar, "t", kind, target, None, |_| Ok(()))
    }

    #[test]
    fn downloads_keep_in_tree_links_and_strip_special_bits() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        b.append_data(&mut dir_header(0o750), "t", std::io::empty())
            .unwrap();
        b.append_data(&mut file_header(0o4755, 2), "t/f", &b"hi"[..])
            .unwrap();
        link(&mut b, "t/l", "f");
        let ar = b.into_inner().unwrap();
        let target = dir.path().join("out");
        std::fs::write(&target, "old").unwrap();
        let c = install(&ar, FileKind::Directory, &target).unwrap();
        assert_eq!((c.files, c.bytes, c.entries), (1, 2, 2));
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&target.join("f")), 0o755, "setuid stripped");
        assert_eq!(mode(&target), 0o750, "the remote directory mode");
        assert_eq!(
            std::fs::read_link(target.join("l")).unwrap(),
            Path::new("f")
        );
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no staging directory is left behind");
    }

    #[test]
    fn downloads_that_break_the_rules_leave_the_target_alone() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out");
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("an absolute link", {
                let mut b = tar::Builder::new(Vec::new());
                b.append_data(&mut dir_header(0o755), "t", std::io::empty())
                    .unwrap();
                link(&mut b, "t/l", "/etc/passwd");
                b.into_inner().unwrap()
            }),
            ("a link out of the downloaded tree", {
                let mut b = tar::Builder::new(Vec::new());
                b.append_data(&mut dir_header(0o755), "t", std::io::empty())
                    .unwrap();
                link(&mut b, "t/l", "..");
                b.into_inner().unwrap()
            }),
            ("a second top entry", {
                let mut b = tar::Builder::new(Vec::new());
                b.append_data(&mut dir_header(0o755), "t", std::io::empty())
                    .unwrap();
                b.append_data(&mut file_header(0o644, 2), "x", &b"hi"[..])
                    .unwrap();
                b.into_inner().unwrap()
            }),
            ("`..` in a name", {
                let mut raw = file_header(0o644, 2);
                raw.as_old_mut().name[..7].copy_from_slice(b"t/../x\0");
                raw.set_cksum();
                let mut ar = raw.as_bytes().to_vec();
                ar.extend_from_slice(b"hi");
                ar.resize(512 * 4, 0);
                ar
            }),
        ];
        for (what, ar) in cases {
            std::fs::write(&target, "old").unwrap();
            let e = install(&ar, FileKind::Directory, &target).unwrap_err();
            assert_eq!(e.code(), "E6112", "{what}: {e}");
            assert_eq!(std::fs::read(&target).unwrap(), b"old", "{what}");
            assert!(!dir.path().join("x").exists(), "{what}");
            let left = std::fs::read_dir(dir.path()).unwrap().count();
            assert_eq!(left, 1, "{what}: the staging directory is removed");
        }
    }

    #[test]
    fn a_file_download_keeps_its_mode_unless_told_and_never_replaces_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        b.append_data(&mut file_header(0o700, 2), "t", &b"hi"[..])
            .unwrap();
        let ar = b.into_inner().unwrap();
        let target = dir.path().join("f");
        install(&ar, FileKind::File, &target).unwrap();
        let mode = std::fs::metadata(&target).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        install_download(&ar, "t", FileKind::File, &target, Some(0o640), |_| Ok(())).unwrap();
        let mode = std::fs::metadata(&target).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o640);
        let e = install(&ar, FileKind::Directory, &dir.path().join("d")).unwrap_err();
        assert_eq!(e.code(), "E6115", "{e}");
        std::fs::create_dir(dir.path().join("d")).unwrap();
        let e = install(&ar, FileKind::File, &dir.path().join("d")).unwrap_err();
        assert_eq!(e.code(), "E6115", "{e}");
    }

    #[test]
    fn archive_errors_keep_the_sync_codes() {
        let cap = sandhost_archive::ArchiveError::CapExceeded {
            cap: sandhost_archive::Cap::Bytes,
            limit: 1,
        };
        assert_eq!(DockerError::from(cap).code(), "E6111");
        let src = sandhost_archive::ArchiveError::SourceRejected {
            path: "x".into(),
            reason: "fifo".into(),
        };
        assert_eq!(DockerError::from(src).code(), "E6115");
    }
}
