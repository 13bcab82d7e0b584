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
//! - File in: upload a temp name in the target directory with the final mode
//!   in the tar header (no world-readable window), then `mv -f` over the
//!   target (an atomic rename in one directory).
//! - Directory in: upload into a temp directory beside the target, then
//!   destroy-then-replace (`rm -rf target && mv temp target`).
//! - Out: download the tar stream (bounded in bytes and entries) and unpack it
//!   on the host into a fresh temp path with [`unpack_safely`]: regular files
//!   and directories only, normal relative names only, permission bits only;
//!   then rename into place.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use bollard::query_parameters::{DownloadFromContainerOptions, UploadToContainerOptions};
use bollard::Docker;
use futures_util::StreamExt;
use sandhost_protocol::{FileKind, FileMapping, SyncOperation, SyncOperationResult, SyncResult};

use crate::engine::LeaseInfo;
use crate::error::{DockerError, Result};
use crate::exec::{self, ExecSpec};

/// Largest transfer of one mapping, in bytes.
pub const MAX_BYTES: u64 = 512 << 20;
/// Most entries in one mapping.
pub const MAX_ENTRIES: u64 = 100_000;
const MAX_PATH: usize = 4096;
const MAX_NAME: usize = 255;

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
/// physical path, which is under the root's physical path.
const RESOLVE: &str = r#"r=$(cd -P -- "$1" 2>/dev/null && pwd -P) || { echo "the sync root is missing" >&2; exit 4; }
d=$2
while [ ! -d "$d" ] && [ ! -L "$d" ]; do d=${d%/*}; [ -n "$d" ] || d=/; done
e=$(cd -P -- "$d" 2>/dev/null && pwd -P) || { echo "a path component is a dangling link" >&2; exit 5; }
case "$e/" in "$r"/*) ;; *) echo "it resolves outside the sync root" >&2; exit 5;; esac
if [ "$3" = create ]; then mkdir -p -- "$2" || exit 6; fi
p=$(cd -P -- "$2" 2>/dev/null && pwd -P) || { echo "the directory does not exist" >&2; exit 7; }
case "$p/" in "$r"/*) ;; *) echo "it resolves outside the sync root" >&2; exit 5;; esac
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

#[derive(Debug, Default)]
pub struct Counts {
    pub files: u64,
    pub bytes: u64,
    pub entries: u64,
}

impl Counts {
    fn add(&mut self, bytes: u64) -> Result<()> {
        self.entries += 1;
        self.bytes += bytes;
        if self.entries > MAX_ENTRIES {
            return Err(DockerError::SyncLimit(format!(
                "more than {MAX_ENTRIES} entries"
            )));
        }
        if self.bytes > MAX_BYTES {
            return Err(DockerError::SyncLimit(format!(
                "more than {MAX_BYTES} bytes"
            )));
        }
        Ok(())
    }
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode & 0o777);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(crate::engine::now_secs());
    h
}

/// Append the host tree at `dir` under `name` in the archive.
fn append_tree(
    b: &mut tar::Builder<Vec<u8>>,
    dir: &Path,
    name: &str,
    rel: &str,
    m: &FileMapping,
    counts: &mut Counts,
) -> Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(DockerError::host_io(dir))?
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(DockerError::host_io(dir))?;
    entries.sort_by_key(|e| e.file_name());
    let excludes = m.exclude.clone().unwrap_or_default();
    for e in entries {
        let fname = e.file_name();
        let Some(fname) = fname.to_str() else {
            tracing::warn!("skipping a non-utf-8 name in {}", dir.display());
            continue;
        };
        let child_rel = if rel.is_empty() {
            fname.to_string()
        } else {
            format!("{rel}/{fname}")
        };
        if excluded(&excludes, &child_rel) {
            continue;
        }
        let path = e.path();
        let arc = format!("{name}/{child_rel}");
        let lmeta = std::fs::symlink_metadata(&path).map_err(DockerError::host_io(&path))?;
        let meta = if lmeta.file_type().is_symlink() && m.follow_symlinks == Some(true) {
            std::fs::metadata(&path).map_err(DockerError::host_io(&path))?
        } else {
            lmeta
        };
        if meta.is_dir() {
            counts.add(0)?;
            let mut h = header(tar::EntryType::Directory, meta.mode(), 0);
            b.append_data(&mut h, &arc, std::io::empty())
                .map_err(DockerError::host_io(&path))?;
            append_tree(b, &path, name, &child_rel, m, counts)?;
        } else if meta.is_file() {
            counts.add(meta.len())?;
            counts.files += 1;
            let f = std::fs::File::open(&path).map_err(DockerError::host_io(&path))?;
            let mut h = header(tar::EntryType::Regular, meta.mode(), meta.len());
            b.append_data(&mut h, &arc, f.take(meta.len()))
                .map_err(DockerError::host_io(&path))?;
        } else if meta.file_type().is_symlink() {
            counts.add(0)?;
            let target = std::fs::read_link(&path).map_err(DockerError::host_io(&path))?;
            let mut h = header(tar::EntryType::Symlink, 0o777, 0);
            b.append_link(&mut h, &arc, &target)
                .map_err(DockerError::host_io(&path))?;
        }
    }
    Ok(())
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

async fn sync_in_one(docker: &Docker, lease: &LeaseInfo, m: &FileMapping) -> Result<Counts> {
    let lp = lease_path(&lease.workdir, &m.target_path)?;
    let src = PathBuf::from(&m.source_path);
    let meta = std::fs::metadata(&src).map_err(DockerError::host_io(&src))?;
    let tmp = format!(".sandhost-{}.tmp", exec::token());
    let mut counts = Counts::default();
    let mut b = tar::Builder::new(Vec::new());
    b.mode(tar::HeaderMode::Deterministic);
    match m.kind {
        FileKind::File => {
            if !meta.is_file() {
                return Err(DockerError::InvalidParams(format!(
                    "`{}` is not a regular file",
                    m.source_path
                )));
            }
            counts.add(meta.len())?;
            counts.files = 1;
            let mode = m.mode.map(|x| x.0).unwrap_or(meta.mode());
            let f = std::fs::File::open(&src).map_err(DockerError::host_io(&src))?;
            let mut h = header(tar::EntryType::Regular, mode, meta.len());
            b.append_data(&mut h, &tmp, f.take(meta.len()))
                .map_err(DockerError::host_io(&src))?;
        }
        FileKind::Directory => {
            if !meta.is_dir() {
                return Err(DockerError::InvalidParams(format!(
                    "`{}` is not a directory",
                    m.source_path
                )));
            }
            counts.add(0)?;
            let mode = m.mode.map(|x| x.0).unwrap_or(meta.mode());
            let mut h = header(tar::EntryType::Directory, mode, 0);
            b.append_data(&mut h, &tmp, std::io::empty())
                .map_err(DockerError::host_io(&src))?;
            append_tree(&mut b, &src, &tmp, "", m, &mut counts)?;
        }
    }
    let archive = b.into_inner().map_err(DockerError::host_io(&src))?;
    let parent = resolve_parent(docker, &lease.container_id, &lp, &m.target_path, true).await?;
    if let Err(e) = upload(docker, &lease.container_id, &parent, archive).await {
        let _ = exec::sh_ok(
            docker,
            &lease.container_id,
            r#"rm -rf -- "$1/$2""#,
            &[&parent, &tmp],
        )
        .await;
        return Err(e);
    }
    let script = match m.kind {
        FileKind::File => {
            r#"if [ -d "$1/$3" ] && [ ! -L "$1/$3" ]; then rm -f -- "$1/$2"; echo "the target is a directory" >&2; exit 3; fi
mv -f -- "$1/$2" "$1/$3" || { rm -f -- "$1/$2"; exit 4; }"#
        }
        FileKind::Directory => {
            r#"rm -rf -- "$1/$3" && mv -f -- "$1/$2" "$1/$3" || { rm -rf -- "$1/$2"; exit 4; }"#
        }
    };
    exec::sh_ok(
        docker,
        &lease.container_id,
        script,
        &[&parent, &tmp, &lp.name],
    )
    .await?;
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
    unpack_safely(&archive, &lp.name, m.kind, &target, m.mode.map(|x| x.0))
}

/// Unpack a downloaded archive (top entry `name`) to `target` on the host.
///
/// Only regular files and directories are written, under a fresh temp path
/// beside `target` and with permission bits only (no setuid, setgid,
/// sticky); names must be normal relative components; symlinks, hard links
/// and devices are skipped. Bytes and entries are counted against the caps
/// before anything is written. Then `target` is replaced by a rename.
pub fn unpack_safely(
    archive: &[u8],
    name: &str,
    kind: FileKind,
    target: &Path,
    mode: Option<u32>,
) -> Result<Counts> {
    let parent = target
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(DockerError::host_io(parent))?;
    let tmp = parent.join(format!(".sandhost-{}.tmp", exec::token()));
    let result = unpack_into(archive, name, kind, &tmp, mode);
    match result {
        Ok(counts) => {
            if kind == FileKind::Directory {
                if let Ok(meta) = std::fs::symlink_metadata(target) {
                    if meta.is_dir() {
                        std::fs::remove_dir_all(target).map_err(DockerError::host_io(target))?;
                    } else {
                        std::fs::remove_file(target).map_err(DockerError::host_io(target))?;
                    }
                }
            } else if std::fs::symlink_metadata(target).is_ok_and(|m| m.is_dir()) {
                let _ = std::fs::remove_file(&tmp);
                return Err(DockerError::InvalidParams(format!(
                    "`{}` is a directory",
                    target.display()
                )));
            }
            std::fs::rename(&tmp, target).map_err(DockerError::host_io(target))?;
            Ok(counts)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

fn unpack_into(
    archive: &[u8],
    name: &str,
    kind: FileKind,
    tmp: &Path,
    mode: Option<u32>,
) -> Result<Counts> {
    let mut counts = Counts::default();
    let mut ar = tar::Archive::new(archive);
    let bad =
        |why: String| DockerError::SyncFailed(format!("unsafe archive from the lease: {why}"));
    let mut dir_modes = vec![];
    let mut seen_top = false;
    for entry in ar.entries().map_err(DockerError::host_io(tmp))? {
        let mut entry = entry.map_err(DockerError::host_io(tmp))?;
        let size = entry.header().size().map_err(DockerError::host_io(tmp))?;
        counts.add(size)?;
        let path = entry
            .path()
            .map_err(DockerError::host_io(tmp))?
            .into_owned();
        let mut comps = vec![];
        for c in path.components() {
            match c {
                Component::Normal(s) => comps.push(s.to_owned()),
                Component::CurDir => {}
                _ => {
                    return Err(bad(format!(
                        "entry `{}` is not a plain relative name",
                        path.display()
                    )))
                }
            }
        }
        if comps.first().map(|c| c.as_os_str()) != Some(std::ffi::OsStr::new(name)) {
            return Err(bad(format!(
                "entry `{}` is outside `{name}`",
                path.display()
            )));
        }
        let rest: PathBuf = comps[1..].iter().collect();
        let etype = entry.header().entry_type();
        let emode = entry.header().mode().unwrap_or(0o644) & 0o777;
        match kind {
            FileKind::File => {
                if !rest.as_os_str().is_empty() || seen_top {
                    return Err(bad("more than one entry for a file".into()));
                }
                seen_top = true;
                if etype != tar::EntryType::Regular && etype != tar::EntryType::Continuous {
                    return Err(DockerError::InvalidParams(format!(
                        "`{name}` in the lease is not a regular file"
                    )));
                }
                write_file(&mut entry, tmp, mode.unwrap_or(emode) & 0o777, size)?;
                counts.files += 1;
            }
            FileKind::Directory => {
                let dest = if rest.as_os_str().is_empty() {
                    tmp.to_path_buf()
                } else {
                    tmp.join(&rest)
                };
                if rest.as_os_str().is_empty() {
                    if etype != tar::EntryType::Directory {
                        return Err(DockerError::InvalidParams(format!(
                            "`{name}` in the lease is not a directory"
                        )));
                    }
                    std::fs::create_dir(&dest).map_err(DockerError::host_io(&dest))?;
                    dir_modes.push((dest, mode.unwrap_or(emode)));
                    continue;
                }
                match etype {
                    tar::EntryType::Directory => {
                        std::fs::create_dir(&dest).map_err(DockerError::host_io(&dest))?;
                        dir_modes.push((dest, emode));
                    }
                    tar::EntryType::Regular | tar::EntryType::Continuous => {
                        write_file(&mut entry, &dest, emode, size)?;
                        counts.files += 1;
                    }
                    other => {
                        tracing::warn!(
                            "skipping `{}` ({other:?}): only files and directories are synced out",
                            path.display()
                        );
                    }
                }
            }
        }
    }
    if kind == FileKind::File && !seen_top {
        return Err(bad("the archive is empty".into()));
    }
    // Directory modes last, deepest first, so a read-only directory does not
    // block its own unpacking.
    for (dir, m) in dir_modes.into_iter().rev() {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(m | 0o700))
            .map_err(DockerError::host_io(&dir))?;
    }
    Ok(counts)
}

fn write_file(entry: &mut impl Read, dest: &Path, mode: u32, size: u64) -> Result<()> {
    // The parent was created by this unpacker (never a symlink); create_new
    // refuses anything already there.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode & 0o777)
        .open(dest)
        .map_err(DockerError::host_io(dest))?;
    let copied =
        std::io::copy(&mut entry.take(size), &mut f).map_err(DockerError::host_io(dest))?;
    if copied != size {
        return Err(DockerError::SyncFailed(format!(
            "short entry for `{}`",
            dest.display()
        )));
    }
    f.flush().map_err(DockerError::host_io(dest))?;
    // umask may have cleared bits: set them exactly
    std::fs::set_permissions(dest, std::fs::Permissions::from_mode(mode & 0o777))
        .map_err(DockerError::host_io(dest))?;
    Ok(())
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

    #[test]
    fn unpack_rejects_traversal_and_links() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        b.append_data(&mut h, "t", std::io::empty()).unwrap();
        let mut h = header(tar::EntryType::Symlink, 0o777, 0);
        b.append_link(&mut h, "t/link", "/etc/passwd").unwrap();
        let mut h = header(tar::EntryType::Regular, 0o4755, 2);
        b.append_data(&mut h, "t/f", &b"hi"[..]).unwrap();
        let ar = b.into_inner().unwrap();
        let target = dir.path().join("out");
        unpack_safely(&ar, "t", FileKind::Directory, &target, None).unwrap();
        assert!(!target.join("link").exists());
        let mode = std::fs::metadata(target.join("f")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o755);

        let mut raw = header(tar::EntryType::Regular, 0o644, 2);
        raw.as_old_mut().name[..7].copy_from_slice(b"t/../x\0");
        raw.set_cksum();
        let mut ar = raw.as_bytes().to_vec();
        ar.extend_from_slice(b"hi");
        ar.resize(512 * 4, 0);
        assert!(
            unpack_safely(&ar, "t", FileKind::Directory, &dir.path().join("o2"), None).is_err()
        );
        assert!(!dir.path().join("x").exists());
    }
}
