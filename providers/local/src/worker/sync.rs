//! Native sync: the file work happens INSIDE the sandbox, so every sandbox
//! path resolves in the sandbox's own mount namespace (a symlink planted by a
//! workload can only lead elsewhere inside the sandbox, whose root is
//! read-only apart from /workspace and /tmp).
//!
//! - Sync in: the worker packs the host `sourcePath` (trusted host files)
//!   into a tar stream and streams it into `tar -x` run in the sandbox (exec
//!   stdin, streamed frame by frame) into a private temp directory next to
//!   the target; modes are applied there (the temp directory is 0700: no
//!   world-readable window), then a single file is renamed over the target
//!   (atomic) and a directory replaces the old one (old moved aside, new
//!   renamed in, old removed).
//! - Sync out: `tar -c` runs in the sandbox, its stdout is the archive, which
//!   the host unpacks with `sandhost-archive` (regular files, directories and
//!   relative in-tree symlinks only) into a private staging directory next to
//!   `targetPath`, then renames it into place.
//!
//! Sandbox paths must be absolute, below `/workspace` or `/tmp`, without
//! `.`/`..` components (else -32602). Both directions are capped at
//! [`MAX_SYNC_BYTES`] of file data and [`MAX_SYNC_ENTRIES`] entries.
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use sandhost_archive::{swap_into_place, Kind, Limits, Staging};
use sandhost_protocol::{FileKind, FileMapping, SyncOperation, SyncOperationResult, SyncResult};

use super::config::LocalConfig;
use super::WorkerError;
use crate::config::ExecRequest;
use crate::sandbox::LocalSandbox;

/// File bytes one mapping may move.
pub const MAX_SYNC_BYTES: u64 = 1 << 30;
/// Entries one mapping may move.
pub const MAX_SYNC_ENTRIES: u64 = 100_000;
const SYNC_TIMEOUT: Duration = Duration::from_secs(600);

/// Quote one word for a POSIX shell.
fn sq(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A sandbox path a sync may touch: absolute, normal components only,
/// strictly below /workspace or /tmp.
/// A relative path is relative to the lease root, `/workspace`.
pub fn confined(given: &str) -> Result<String, WorkerError> {
    let bad = || WorkerError::PathNotAllowed(given.to_string());
    let joined;
    let path = if given.starts_with('/') || given.is_empty() {
        given
    } else {
        joined = format!("/workspace/{given}");
        &joined
    };
    if path.contains('\0') || !path.starts_with('/') || path.len() > 4096 {
        return Err(bad());
    }
    let mut parts = vec![];
    for c in Path::new(path).components() {
        match c {
            Component::RootDir => {}
            Component::Normal(p) => {
                let s = p.to_str().ok_or_else(bad)?;
                if s.len() > 255 {
                    return Err(bad());
                }
                parts.push(s);
            }
            Component::CurDir | Component::ParentDir | Component::Prefix(_) => return Err(bad()),
        }
    }
    // `Path::components` drops interior `.`; refuse it literally too
    if path.split('/').any(|c| c == "." || c == "..") {
        return Err(bad());
    }
    if parts.len() < 2 || !(parts[0] == "workspace" || parts[0] == "tmp") {
        return Err(bad());
    }
    Ok(format!("/{}", parts.join("/")))
}

fn excluded(rel: &Path, patterns: &[String]) -> bool {
    let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let rel = rel.to_str().unwrap_or("");
    patterns
        .iter()
        .any(|p| glob(p, name) || glob(p, rel) || rel.starts_with(&format!("{p}/")))
}

/// `*` and `?` wildcards.
fn glob(p: &str, s: &str) -> bool {
    let (p, s) = (p.as_bytes(), s.as_bytes());
    let (mut pi, mut si, mut star, mut mark) = (0, 0, None, 0);
    while si < s.len() {
        if pi < p.len() && (p[pi] == b'?' || p[pi] == s[si]) {
            pi += 1;
            si += 1;
        } else if pi < p.len() && p[pi] == b'*' {
            star = Some(pi);
            mark = si;
            pi += 1;
        } else if let Some(st) = star {
            pi = st + 1;
            mark += 1;
            si = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// One host entry to pack.
enum Item {
    Dir(PathBuf, u32),
    File(PathBuf, PathBuf, u64, u32),
    Link(PathBuf, PathBuf),
}

/// Walk the host source and decide what goes in the archive (and check the
/// caps) before anything is sent.
fn plan(m: &FileMapping) -> Result<(Vec<Item>, u64, u64), WorkerError> {
    let src = PathBuf::from(&m.source_path);
    let follow = m.follow_symlinks.unwrap_or(false);
    let excludes = m.exclude.clone().unwrap_or_default();
    let meta = |p: &Path| {
        if follow {
            fs::metadata(p)
        } else {
            fs::symlink_metadata(p)
        }
    };
    let top = fs::metadata(&src)
        .map_err(|e| WorkerError::host_io(format!("read {}", src.display()), e))?;
    let (mut items, mut files, mut bytes) = (vec![], 0u64, 0u64);
    let limit = |files: u64, bytes: u64, n: usize| {
        if bytes > MAX_SYNC_BYTES {
            Err(WorkerError::SyncLimit(format!(
                "more than {MAX_SYNC_BYTES} bytes"
            )))
        } else if n as u64 > MAX_SYNC_ENTRIES || files > MAX_SYNC_ENTRIES {
            Err(WorkerError::SyncLimit(format!(
                "more than {MAX_SYNC_ENTRIES} entries"
            )))
        } else {
            Ok(())
        }
    };
    match m.kind {
        FileKind::File => {
            if !top.is_file() {
                return Err(WorkerError::Sync(format!(
                    "{} is not a regular file",
                    src.display()
                )));
            }
            items.push(Item::File(
                src.clone(),
                "f".into(),
                top.len(),
                top.mode() & 0o777,
            ));
            limit(1, top.len(), 1)?;
            return Ok((items, 1, top.len()));
        }
        FileKind::Directory => {
            if !top.is_dir() {
                return Err(WorkerError::Sync(format!(
                    "{} is not a directory",
                    src.display()
                )));
            }
            items.push(Item::Dir("d".into(), top.mode() & 0o777));
        }
    }
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = src.join(&rel);
        let mut entries: Vec<_> = fs::read_dir(&dir)
            .map_err(|e| WorkerError::host_io(format!("read {}", dir.display()), e))?
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        entries.sort();
        for name in entries {
            let r = rel.join(&name);
            if excluded(&r, &excludes) {
                continue;
            }
            let full = src.join(&r);
            let md = meta(&full)
                .map_err(|e| WorkerError::host_io(format!("stat {}", full.display()), e))?;
            let in_ar = Path::new("d").join(&r);
            let ft = md.file_type();
            if ft.is_dir() {
                items.push(Item::Dir(in_ar, md.mode() & 0o777));
                stack.push(r);
            } else if ft.is_file() {
                files += 1;
                bytes += md.len();
                items.push(Item::File(full, in_ar, md.len(), md.mode() & 0o777));
            } else if ft.is_symlink() {
                let target = fs::read_link(&full)
                    .map_err(|e| WorkerError::host_io(format!("readlink {}", full.display()), e))?;
                items.push(Item::Link(in_ar, target));
            }
            // sockets, fifos and devices are not synced
            limit(files, bytes, items.len())?;
        }
    }
    Ok((items, files, bytes))
}

fn pack(items: &[Item], out: &mut dyn Write) -> io::Result<()> {
    let mut b = tar::Builder::new(out);
    b.mode(tar::HeaderMode::Deterministic);
    for it in items {
        let mut h = tar::Header::new_gnu();
        match it {
            Item::Dir(p, mode) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(*mode);
                h.set_size(0);
                b.append_data(&mut h, p, io::empty())?;
            }
            Item::File(src, p, len, mode) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(*len);
                let f = fs::File::open(src)?;
                // a file that changed size since the plan fails the stream
                b.append_data(&mut h, p, io::Read::take(f, *len))?;
            }
            Item::Link(p, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, p, target)?;
            }
        }
    }
    b.finish()
}

fn mode_of(m: &FileMapping) -> Option<u32> {
    m.mode.map(|m| m.0 & 0o1777)
}

/// The in-sandbox script that receives one mapping on stdin.
fn receive_script(target: &str, m: &FileMapping) -> String {
    let chmod = |p: &str| {
        mode_of(m)
            .map(|mode| format!("chmod {mode:o} -- {p}\n"))
            .unwrap_or_default()
    };
    let place = match m.kind {
        FileKind::File => format!(
            "{}mv -f -T -- \"$tmp/f\" \"$t\"\n",
            chmod("\"$tmp/f\"")
        ),
        FileKind::Directory => format!(
            "{}if [ -e \"$t\" ] || [ -L \"$t\" ]; then mv -T -- \"$t\" \"$tmp/old\"; fi\nmv -T -- \"$tmp/d\" \"$t\"\n",
            chmod("\"$tmp/d\"")
        ),
    };
    format!(
        "set -eu\nt={t}\nd=$(dirname -- \"$t\")\nmkdir -p -- \"$d\"\n\
         tmp=$(mktemp -d \"$d/.sandhost-sync.XXXXXX\")\n\
         trap 'rm -rf -- \"$tmp\"' EXIT\n\
         tar -x -p --no-same-owner -f - -C \"$tmp\"\n{place}",
        t = sq(target)
    )
}

fn run_checked(sb: &LocalSandbox, req: &ExecRequest, what: &str) -> Result<(), WorkerError> {
    let r = sb.exec(req, |_, _| {})?;
    if r.exit_code != Some(0) {
        return Err(WorkerError::Sync(format!(
            "{what} failed ({}): {}",
            r.exit_code
                .map_or("killed".to_string(), |c| format!("exit {c}")),
            String::from_utf8_lossy(&r.stderr).trim()
        )));
    }
    Ok(())
}

pub fn sync_in(
    root: &Path,
    id: &str,
    _cfg: &LocalConfig,
    ops: &[SyncOperation],
) -> Result<SyncResult, WorkerError> {
    // every path is checked before anything is written
    for op in ops {
        for m in &op.files {
            confined(&m.target_path)?;
        }
    }
    let sb = LocalSandbox::open(root, id)?;
    let mut out = vec![];
    for op in ops {
        let (mut files, mut bytes) = (0, 0);
        for m in &op.files {
            let target = confined(&m.target_path)?;
            let (items, f, b) = plan(m)?;
            let mut req = ExecRequest::new(["/bin/sh", "-c", &receive_script(&target, m)]);
            req.cwd = Some("/".into());
            req.timeout = Some(SYNC_TIMEOUT);
            let r = sb.exec_streaming(&req, |w| pack(&items, w), |_, _| {})?;
            if r.exit_code != Some(0) {
                return Err(WorkerError::Sync(format!(
                    "writing {target} in the sandbox failed ({}): {}",
                    r.exit_code
                        .map_or("killed".to_string(), |c| format!("exit {c}")),
                    String::from_utf8_lossy(&r.stderr).trim()
                )));
            }
            files += f;
            bytes += b;
        }
        for (i, c) in op.post_upload_commands.iter().flatten().enumerate() {
            let mut req = ExecRequest::new(["/bin/sh", "-c", &c.command]);
            req.cwd = c.cwd.clone();
            req.timeout = Some(c.timeout_ms.map_or(SYNC_TIMEOUT, Duration::from_millis));
            run_checked(&sb, &req, &format!("post-upload command {}", i + 1))?;
        }
        out.push(SyncOperationResult {
            operation_id: op.operation_id.clone(),
            files_transferred: files,
            bytes_transferred: bytes,
        });
    }
    Ok(SyncResult { operations: out })
}

/// Receive one mapping from the sandbox into `target` on the host.
fn receive(sb: &LocalSandbox, m: &FileMapping, source: &str) -> Result<(u64, u64), WorkerError> {
    let excludes: String = m
        .exclude
        .iter()
        .flatten()
        .map(|p| format!(" --exclude={}", sq(p)))
        .collect();
    let follow = if m.follow_symlinks == Some(true) {
        " -h"
    } else {
        ""
    };
    // the archive root is always a directory entry `.`
    let script = match m.kind {
        // a symlink `f` to the file, archived dereferenced: entries `.` and `f`
        FileKind::File => format!(
            "set -eu\n[ -f {s} ] || {{ echo 'not a regular file' >&2; exit 1; }}\n\
             tmp=$(mktemp -d)\ntrap 'rm -rf -- \"$tmp\"' EXIT\n\
             ln -s -- {s} \"$tmp/f\"\n\
             tar -c -h --no-recursion -f - -C \"$tmp\" . f",
            s = sq(source)
        ),
        FileKind::Directory => format!(
            "set -eu\n[ -d {s} ] || {{ echo 'not a directory' >&2; exit 1; }}\ntar -c{follow}{excludes} -f - -C {s} .",
            s = sq(source),
        ),
    };
    let mut req = ExecRequest::new(["/bin/sh", "-c", &script]);
    req.cwd = Some("/".into());
    req.timeout = Some(SYNC_TIMEOUT);
    // headers and padding on top of the file bytes
    req.max_output_bytes = MAX_SYNC_BYTES + MAX_SYNC_ENTRIES * 1536 + (1 << 20);
    let r = sb.exec(&req, |_, _| {})?;
    if r.stdout_truncated {
        return Err(WorkerError::SyncLimit(format!(
            "the archive of {source} is larger than {} bytes",
            req.max_output_bytes
        )));
    }
    if r.exit_code != Some(0) {
        return Err(WorkerError::Sync(format!(
            "reading {source} in the sandbox failed ({}): {}",
            r.exit_code
                .map_or("killed".to_string(), |c| format!("exit {c}")),
            String::from_utf8_lossy(&r.stderr).trim()
        )));
    }
    let target = PathBuf::from(&m.target_path);
    let parent = target
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .ok_or_else(|| {
            WorkerError::Sync(format!("{} has no parent directory", target.display()))
        })?;
    fs::create_dir_all(parent)
        .map_err(|e| WorkerError::host_io(format!("create {}", parent.display()), e))?;
    // unpacked by the shared safe unpacker into a private staging directory
    // next to the target, then swapped into place
    let stage = Staging::create(parent)?;
    let payload = stage.payload();
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&payload)
        .map_err(|e| WorkerError::host_io(format!("create {}", payload.display()), e))?;
    let limits = Limits {
        max_bytes: MAX_SYNC_BYTES,
        max_entries: MAX_SYNC_ENTRIES,
    };
    let counts = sandhost_archive::unpack(r.stdout.as_slice(), &payload, &limits)?;
    let chmod = |p: &Path, mode: u32| {
        fs::set_permissions(p, fs::Permissions::from_mode(mode))
            .map_err(|e| WorkerError::host_io(format!("chmod {}", p.display()), e))
    };
    match m.kind {
        FileKind::File => {
            let f = payload.join("f");
            if !fs::symlink_metadata(&f).is_ok_and(|md| md.is_file()) {
                return Err(WorkerError::Sync("the sandbox sent no regular file".into()));
            }
            if let Some(mode) = mode_of(m) {
                chmod(&f, mode & 0o777)?;
            }
            swap_into_place(&f, &target, Kind::File)?;
            Ok((1, counts.bytes))
        }
        FileKind::Directory => {
            if let Some(mode) = mode_of(m) {
                chmod(&payload, mode & 0o777)?;
            }
            swap_into_place(&payload, &target, Kind::Directory)?;
            Ok((counts.files, counts.bytes))
        }
    }
}

pub fn sync_out(root: &Path, id: &str, ops: &[SyncOperation]) -> Result<SyncResult, WorkerError> {
    for op in ops {
        for m in &op.files {
            confined(&m.source_path)?;
            if !m.target_path.starts_with('/') {
                return Err(WorkerError::PathNotAllowed(m.target_path.clone()));
            }
        }
    }
    let sb = LocalSandbox::open(root, id)?;
    let mut out = vec![];
    for op in ops {
        let (mut files, mut bytes) = (0, 0);
        for m in &op.files {
            let (f, b) = receive(&sb, m, &confined(&m.source_path)?)?;
            files += f;
            bytes += b;
        }
        out.push(SyncOperationResult {
            operation_id: op.operation_id.clone(),
            files_transferred: files,
            bytes_transferred: bytes,
        });
    }
    Ok(SyncResult { operations: out })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_paths_are_confined_to_workspace_and_tmp() {
        assert_eq!(confined("/workspace/a/b").unwrap(), "/workspace/a/b");
        assert_eq!(confined("/tmp/x/").unwrap(), "/tmp/x");
        assert_eq!(confined("rel/f").unwrap(), "/workspace/rel/f");
        for bad in [
            "/etc/passwd",
            "/workspace",
            "/tmp",
            "/workspace/../etc",
            "/workspace/./a",
            "",
            "../x",
            "a/../../x",
            "/workspace/a\0b",
            "/workspacex/a",
        ] {
            assert!(confined(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn globs_match_names_and_prefixes() {
        assert!(glob("*.o", "a.o") && glob("a?c", "abc") && !glob("*.o", "a.c"));
        assert!(excluded(Path::new("target/x"), &["target".into()]));
        assert!(excluded(Path::new("src/a.o"), &["*.o".into()]));
        assert!(!excluded(Path::new("src/a.rs"), &["*.o".into()]));
    }
}
