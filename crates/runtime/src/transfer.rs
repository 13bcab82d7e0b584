//! File transfer between the host and a lease: [`upload`] and [`download`],
//! files and directories.
//!
//! The path is chosen from the run's frozen snapshot and nothing else: native
//! sync (`environmentSyncIn` / `environmentSyncOut`) when
//! [`CapabilitySnapshot::native_sync`](crate::snapshot::CapabilitySnapshot::native_sync)
//! holds, else the base64-over-exec fallback. What the worker advertises in
//! `supportedMethods` is never consulted here.
//!
//! Both paths give the same result, because the host does the checking on
//! its side of either path:
//!
//! - An upload source is scanned first: regular files, directories and
//!   symlinks whose target stays inside the tree; anything else (an escaping
//!   symlink, a fifo, a device) refuses the whole upload. Caps are counted on
//!   the scan.
//! - A download never lands directly: it is staged in a fresh private
//!   directory next to the destination (the native path hands the worker a
//!   path inside it, the fallback unpacks its archive there), checked, and
//!   only then renamed into place. A rejected or oversized download leaves
//!   nothing behind.
//! - Report counts come from the host's own scan, never from the worker.
//!
//! Rules for what a downloaded tree may hold (an archive from the sandbox or
//! a tree the worker staged): regular files, directories, and relative
//! symlinks whose target stays inside the tree without passing through
//! another symlink. No `..`, no absolute paths, no hard links, no devices,
//! fifos or sockets, no entry below a symlink or a file, no duplicates, UTF-8
//! names only. Setuid, setgid and sticky bits are stripped. Byte and entry
//! caps are checked before the entry is written. A single downloaded file is
//! written with mode 0644 (neither `base64 < FILE` nor a sync mapping carries
//! the remote mode).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use base64::Engine as _;
use sandhost_contract::ErrorCode;
use sandhost_protocol::methods;
use sandhost_protocol::{
    ExecuteResult, FileKind, FileMapping, FileMode, SyncOperation, SyncParams,
};

use crate::context::{shell_quote, LeaseContext};
use crate::worker::WorkerError;

/// The size of one base64 chunk the fallback upload appends per exec.
pub const CHUNK_LEN: usize = 32 * 1024;

/// Raw bytes that encode to exactly one [`CHUNK_LEN`] base64 chunk.
const RAW_CHUNK_LEN: usize = CHUNK_LEN / 4 * 3;

/// The mode a single downloaded file is written with.
pub const DOWNLOADED_FILE_MODE: u32 = 0o644;

/// The longest path accepted, remote or inside an archive, in bytes.
pub const MAX_PATH_LEN: usize = 4096;

/// The longest single path component accepted, in bytes.
pub const MAX_NAME_LEN: usize = 255;

const TEMP_PREFIX: &str = ".sandhost-transfer-";

/// Bounds on one transfer, in either direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferLimits {
    /// Total bytes of regular files.
    pub max_bytes: u64,
    /// Entries (files, directories, symlinks; the root not counted).
    pub max_entries: u64,
    /// The raw bytes (file or tar archive) one fallback download may carry
    /// back in a single exec. The whole payload travels base64-encoded in one
    /// worker frame, so this must stay well below the frame limit.
    pub max_fallback_payload: u64,
}

impl Default for TransferLimits {
    fn default() -> Self {
        Self {
            max_bytes: 1 << 30,
            max_entries: 100_000,
            // 10 MiB encodes to about 13.5 MiB: inside the 16 MiB frame.
            max_fallback_payload: 10 << 20,
        }
    }
}

/// Which path carried a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransferPath {
    Native,
    Base64Fallback,
}

/// What a transfer moved, counted by the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferReport {
    pub path: TransferPath,
    /// Regular files.
    pub files: u64,
    /// Bytes of regular files.
    pub bytes: u64,
}

/// Everything a transfer can fail with; codes are mapped once, in
/// [`TransferError::code`].
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("invalid remote path `{path}`: {reason}")]
    RemotePathInvalid { path: String, reason: String },

    #[error("invalid local path `{path}`: {reason}")]
    LocalPathInvalid { path: String, reason: String },

    #[error("remote command failed while {step} (exit {exit}): {stderr}")]
    RemoteCommandFailed {
        step: &'static str,
        exit: String,
        stderr: String,
    },

    #[error("archive entry `{entry}` rejected: {reason}")]
    ArchiveRejected { entry: String, reason: String },

    #[error("transfer exceeds the {what} cap of {limit}")]
    CapExceeded { what: &'static str, limit: u64 },

    #[error("cannot {doing} `{path}`: {source}")]
    LocalIo {
        doing: &'static str,
        path: String,
        source: io::Error,
    },

    /// Boxed: a worker error is large, and this enum travels in every
    /// `Result` of the module.
    #[error("worker error {code}: {0}", code = .0.code())]
    Worker(Box<WorkerError>),

    #[error("worker output invalid: {detail}")]
    BadWorkerOutput { detail: String },

    #[error("local entry `{path}` cannot be uploaded: {reason}")]
    LocalEntryRejected { path: String, reason: String },

    #[error("remote path `{path}` does not exist")]
    RemoteNotFound { path: String },
}

impl From<WorkerError> for TransferError {
    fn from(e: WorkerError) -> Self {
        Self::Worker(Box::new(e))
    }
}

impl TransferError {
    pub fn code(&self) -> ErrorCode {
        ErrorCode(match self {
            Self::RemotePathInvalid { .. } => "E5101",
            Self::LocalPathInvalid { .. } => "E5102",
            Self::RemoteCommandFailed { .. } => "E5103",
            Self::ArchiveRejected { .. } => "E5104",
            Self::CapExceeded { .. } => "E5105",
            Self::LocalIo { .. } => "E5106",
            Self::Worker(_) => "E5107",
            Self::BadWorkerOutput { .. } => "E5108",
            Self::LocalEntryRejected { .. } => "E5109",
            Self::RemoteNotFound { .. } => "E5110",
        })
    }

    /// The wrapped worker error's own code, when this is a worker error.
    pub fn worker_code(&self) -> Option<ErrorCode> {
        match self {
            Self::Worker(e) => Some(e.code()),
            _ => None,
        }
    }
}

fn io_err<'a>(doing: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> TransferError + 'a {
    move |source| TransferError::LocalIo {
        doing,
        path: path.display().to_string(),
        source,
    }
}

fn rejected(entry: impl Into<String>, reason: impl Into<String>) -> TransferError {
    TransferError::ArchiveRejected {
        entry: entry.into(),
        reason: reason.into(),
    }
}

// ---------------------------------------------------------------- public API

/// Copy the local file or directory `local` to `remote` inside the lease,
/// replacing what is there (a file atomically, a directory
/// destroy-then-replace).
pub async fn upload(
    ctx: &LeaseContext,
    local: &Path,
    remote: &str,
    limits: &TransferLimits,
) -> Result<TransferReport, TransferError> {
    let remote = RemotePath::parse(remote)?;
    let src = absolute(local)?;
    let scan = {
        let (src, limits) = (src.clone(), limits.clone());
        blocking(move || scan_local(&src, &limits)).await?
    };
    let path = if ctx.snapshot.native_sync() {
        native_upload(ctx, &src, &remote, &scan).await?;
        TransferPath::Native
    } else {
        fallback_upload(ctx, &src, &remote, &scan).await?;
        TransferPath::Base64Fallback
    };
    Ok(TransferReport {
        path,
        files: scan.counts.files,
        bytes: scan.counts.bytes,
    })
}

/// Copy the file or directory `remote` inside the lease to `local`,
/// replacing what is there. `local`'s parent must exist; `local` itself, if
/// it exists, is replaced and never followed (a symlink there is replaced by
/// the download, not written through). A file cannot replace a directory.
pub async fn download(
    ctx: &LeaseContext,
    remote: &str,
    local: &Path,
    limits: &TransferLimits,
) -> Result<TransferReport, TransferError> {
    let remote = RemotePath::parse(remote)?;
    let dest = LocalDest::parse(local)?;
    let staging = Staging::create(&dest.parent)?;
    let payload = staging.dir.join("payload");
    let (path, kind) = if ctx.snapshot.native_sync() {
        let kind = native_download(ctx, &remote, &payload).await?;
        (TransferPath::Native, kind)
    } else {
        let kind = fallback_download(ctx, &remote, &payload, limits).await?;
        (TransferPath::Base64Fallback, kind)
    };
    let counts = {
        let (payload, limits) = (payload.clone(), limits.clone());
        blocking(move || check_staged(&payload, kind, &limits)).await?
    };
    dest.install(&payload, kind)?;
    drop(staging);
    Ok(TransferReport {
        path,
        files: counts.files,
        bytes: counts.bytes,
    })
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, TransferError> + Send + 'static,
) -> Result<T, TransferError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| TransferError::LocalIo {
            doing: "run a blocking transfer step",
            path: String::new(),
            source: io::Error::other(e.to_string()),
        })?
}

// ---------------------------------------------------------------- paths

/// A validated remote path: absolute or relative to the lease's working
/// directory, never empty, never ending in `.` or `..`, no `..` anywhere.
#[derive(Debug, Clone)]
struct RemotePath {
    full: String,
    parent: String,
}

impl RemotePath {
    fn parse(path: &str) -> Result<Self, TransferError> {
        let bad = |reason: &str| TransferError::RemotePathInvalid {
            path: path.escape_debug().to_string(),
            reason: reason.into(),
        };
        if path.is_empty() {
            return Err(bad("empty path"));
        }
        if path.contains('\0') {
            return Err(bad("contains a NUL byte"));
        }
        if path.chars().any(char::is_control) {
            return Err(bad("contains a control character"));
        }
        if path.len() > MAX_PATH_LEN {
            return Err(bad("path too long"));
        }
        let trimmed = path.trim_end_matches('/');
        if trimmed.is_empty() {
            return Err(bad("names the root directory"));
        }
        let parts: Vec<&str> = trimmed.split('/').collect();
        for part in &parts {
            if *part == ".." {
                return Err(bad("contains `..`"));
            }
            if part.len() > MAX_NAME_LEN {
                return Err(bad("a path component is too long"));
            }
        }
        let last = parts.last().copied().unwrap_or_default();
        if last.is_empty() || last == "." {
            return Err(bad("does not name a file or directory"));
        }
        let parent = match trimmed.rfind('/') {
            None => ".".to_string(),
            Some(0) => "/".to_string(),
            Some(i) => trimmed[..i].to_string(),
        };
        Ok(Self {
            full: trimmed.to_string(),
            parent,
        })
    }
}

fn absolute(local: &Path) -> Result<PathBuf, TransferError> {
    check_local_bytes(local)?;
    std::path::absolute(local).map_err(io_err("resolve", local))
}

fn check_local_bytes(local: &Path) -> Result<(), TransferError> {
    let bytes = local.as_os_str().as_bytes();
    let bad = |reason: &str| TransferError::LocalPathInvalid {
        path: local.display().to_string(),
        reason: reason.into(),
    };
    if bytes.is_empty() {
        return Err(bad("empty path"));
    }
    if bytes.contains(&0) {
        return Err(bad("contains a NUL byte"));
    }
    if bytes.len() > MAX_PATH_LEN {
        return Err(bad("path too long"));
    }
    Ok(())
}

/// A local destination: a parent directory that exists and a final name.
#[derive(Debug)]
struct LocalDest {
    parent: PathBuf,
    full: PathBuf,
}

impl LocalDest {
    fn parse(local: &Path) -> Result<Self, TransferError> {
        let full = absolute(local)?;
        let bad = |reason: &str| TransferError::LocalPathInvalid {
            path: local.display().to_string(),
            reason: reason.into(),
        };
        match full.components().next_back() {
            Some(Component::Normal(_)) => {}
            _ => return Err(bad("does not name a file or directory")),
        }
        if local
            .components()
            .any(|c| matches!(c, Component::ParentDir))
        {
            return Err(bad("contains `..`"));
        }
        let parent = full
            .parent()
            .ok_or_else(|| bad("has no parent directory"))?
            .to_path_buf();
        let meta = fs::metadata(&parent).map_err(io_err("open the parent directory", &parent))?;
        if !meta.is_dir() {
            return Err(bad("its parent is not a directory"));
        }
        Ok(Self { parent, full })
    }

    /// Rename the checked payload into place. What was there is moved aside
    /// first and removed after; it comes back if the rename fails.
    fn install(&self, payload: &Path, kind: FileKind) -> Result<(), TransferError> {
        let existing = match fs::symlink_metadata(&self.full) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err("inspect", &self.full)(e)),
        };
        let Some(existing) = existing else {
            return fs::rename(payload, &self.full).map_err(io_err("rename into", &self.full));
        };
        if kind == FileKind::File {
            if existing.is_dir() {
                return Err(TransferError::LocalPathInvalid {
                    path: self.full.display().to_string(),
                    reason: "is a directory; a file cannot replace it".into(),
                });
            }
            // rename(2) replaces a file or a symlink itself, atomically
            return fs::rename(payload, &self.full).map_err(io_err("rename into", &self.full));
        }
        let aside = self.parent.join(format!(
            "{TEMP_PREFIX}old-{}",
            uuid::Uuid::new_v4().simple()
        ));
        fs::rename(&self.full, &aside).map_err(io_err("move aside", &self.full))?;
        if let Err(e) = fs::rename(payload, &self.full) {
            let _ = fs::rename(&aside, &self.full);
            return Err(io_err("rename into", &self.full)(e));
        }
        remove_tree(&aside).map_err(io_err("remove the replaced", &aside))
    }
}

/// A private (0700) directory next to a local destination, removed on drop.
#[derive(Debug)]
struct Staging {
    dir: PathBuf,
}

impl Staging {
    fn create(parent: &Path) -> Result<Self, TransferError> {
        let dir = parent.join(format!("{TEMP_PREFIX}{}", uuid::Uuid::new_v4().simple()));
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io_err("create the staging directory", &dir))?;
        Ok(Self { dir })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = remove_tree(&self.dir);
    }
}

/// Remove a file, a symlink or a whole tree without following symlinks,
/// making read-only directories writable on the way.
fn remove_tree(path: &Path) -> io::Result<()> {
    let meta = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    if !meta.is_dir() {
        return fs::remove_file(path);
    }
    if meta.permissions().mode() & 0o700 != 0o700 {
        fs::set_permissions(path, fs::Permissions::from_mode(0o700))?;
    }
    for entry in fs::read_dir(path)? {
        remove_tree(&entry?.path())?;
    }
    fs::remove_dir(path)
}

// ---------------------------------------------------------------- counting

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counts {
    entries: u64,
    files: u64,
    bytes: u64,
}

impl Counts {
    fn entry(&mut self, limits: &TransferLimits) -> Result<(), TransferError> {
        self.entries += 1;
        if self.entries > limits.max_entries {
            return Err(TransferError::CapExceeded {
                what: "entry",
                limit: limits.max_entries,
            });
        }
        Ok(())
    }

    fn file(&mut self, size: u64, limits: &TransferLimits) -> Result<(), TransferError> {
        self.files += 1;
        self.bytes = self.bytes.saturating_add(size);
        if self.bytes > limits.max_bytes {
            return Err(TransferError::CapExceeded {
                what: "byte",
                limit: limits.max_bytes,
            });
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- names and symlinks

/// A relative, normalised entry path: `None` for the root itself.
fn entry_path(raw: &[u8]) -> Result<Option<PathBuf>, String> {
    if raw.is_empty() {
        return Err("empty path".into());
    }
    if raw.contains(&0) {
        return Err("NUL byte in path".into());
    }
    if raw.len() > MAX_PATH_LEN {
        return Err("path too long".into());
    }
    if std::str::from_utf8(raw).is_err() {
        return Err("path is not UTF-8".into());
    }
    if raw[0] == b'/' {
        return Err("absolute path".into());
    }
    let mut out = PathBuf::new();
    for part in raw.split(|b| *b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err("`..` in path".into()),
            p if p.len() > MAX_NAME_LEN => return Err("path component too long".into()),
            p => out.push(OsStr::from_bytes(p)),
        }
    }
    Ok((!out.as_os_str().is_empty()).then_some(out))
}

/// Check a symlink at `link` (relative to the tree root) pointing at
/// `target`: relative, never leaving the tree at any step, and never passing
/// through another symlink (whose own target could lead anywhere). The last
/// component may be a symlink: that one is checked on its own.
fn check_link_target(
    link: &Path,
    target: &[u8],
    is_symlink: &dyn Fn(&Path) -> bool,
) -> Result<(), String> {
    if target.is_empty() {
        return Err("empty symlink target".into());
    }
    if target.contains(&0) || target.len() > MAX_PATH_LEN {
        return Err("invalid symlink target".into());
    }
    if std::str::from_utf8(target).is_err() {
        return Err("symlink target is not UTF-8".into());
    }
    if target[0] == b'/' {
        return Err("absolute symlink target".into());
    }
    let mut at: PathBuf = link.parent().map(Path::to_path_buf).unwrap_or_default();
    for part in target.split(|b| *b == b'/') {
        if part.is_empty() || part == b"." {
            continue;
        }
        if !at.as_os_str().is_empty() && is_symlink(&at) {
            return Err("symlink target passes through another symlink".into());
        }
        if part == b".." {
            if !at.pop() {
                return Err("symlink target leaves the tree".into());
            }
        } else {
            at.push(OsStr::from_bytes(part));
        }
    }
    Ok(())
}

fn display(p: &Path) -> String {
    p.display().to_string()
}

// ---------------------------------------------------------------- local scan (upload)

#[derive(Debug, Clone)]
enum LocalKind {
    File,
    Dir,
    Symlink(PathBuf),
}

#[derive(Debug, Clone)]
struct LocalEntry {
    rel: PathBuf,
    kind: LocalKind,
    mode: u32,
    size: u64,
    mtime: u64,
}

#[derive(Debug, Clone)]
struct LocalScan {
    kind: FileKind,
    /// Permission bits of the root (the file, or the directory).
    mode: u32,
    /// Entries below a directory root, parents before children.
    entries: Vec<LocalEntry>,
    counts: Counts,
}

fn mtime_of(meta: &fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

fn scan_local(root: &Path, limits: &TransferLimits) -> Result<LocalScan, TransferError> {
    // the root is the path the caller named: follow it if it is a symlink
    let meta = fs::metadata(root).map_err(io_err("read", root))?;
    let mode = meta.permissions().mode() & 0o777;
    let mut counts = Counts::default();
    if meta.is_file() {
        counts.entry(limits)?;
        counts.file(meta.len(), limits)?;
        return Ok(LocalScan {
            kind: FileKind::File,
            mode,
            entries: vec![],
            counts,
        });
    }
    if !meta.is_dir() {
        return Err(TransferError::LocalEntryRejected {
            path: display(root),
            reason: "not a regular file or directory".into(),
        });
    }
    let mut entries = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(dir) = stack.pop() {
        let full = root.join(&dir);
        let mut names: Vec<_> = fs::read_dir(&full)
            .map_err(io_err("list", &full))?
            .map(|e| e.map(|e| e.file_name()))
            .collect::<Result<_, _>>()
            .map_err(io_err("list", &full))?;
        names.sort();
        for name in names {
            let rel = dir.join(&name);
            let path = root.join(&rel);
            let reject = |reason: &str| TransferError::LocalEntryRejected {
                path: display(&path),
                reason: reason.into(),
            };
            if entry_path(rel.as_os_str().as_bytes()).is_err() {
                return Err(reject("name is not UTF-8 or too long"));
            }
            counts.entry(limits)?;
            let m = fs::symlink_metadata(&path).map_err(io_err("inspect", &path))?;
            let ft = m.file_type();
            let kind = if ft.is_file() {
                counts.file(m.len(), limits)?;
                LocalKind::File
            } else if ft.is_dir() {
                stack.push(rel.clone());
                LocalKind::Dir
            } else if ft.is_symlink() {
                let target = fs::read_link(&path).map_err(io_err("read the symlink", &path))?;
                let is_link = |p: &Path| {
                    fs::symlink_metadata(root.join(p)).is_ok_and(|m| m.file_type().is_symlink())
                };
                check_link_target(&rel, target.as_os_str().as_bytes(), &is_link)
                    .map_err(|r| reject(&r))?;
                LocalKind::Symlink(target)
            } else {
                return Err(reject("not a regular file, directory or symlink"));
            };
            entries.push(LocalEntry {
                rel,
                kind,
                mode: m.permissions().mode() & 0o777,
                size: m.len(),
                mtime: mtime_of(&m),
            });
        }
    }
    Ok(LocalScan {
        kind: FileKind::Directory,
        mode,
        entries,
        counts,
    })
}

/// Write the scanned tree as a tar archive (modes kept, owner 0, special
/// bits dropped) into `out`.
fn build_archive(root: &Path, scan: &LocalScan, out: File) -> Result<(), TransferError> {
    let mut builder = tar::Builder::new(io::BufWriter::new(out));
    for e in &scan.entries {
        let path = root.join(&e.rel);
        let mut header = tar::Header::new_gnu();
        header.set_mode(e.mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(e.mtime);
        match &e.kind {
            LocalKind::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder
                    .append_data(&mut header, &e.rel, io::empty())
                    .map_err(io_err("archive", &path))?;
            }
            LocalKind::File => {
                let file = File::open(&path).map_err(io_err("open", &path))?;
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(e.size);
                // exactly the scanned size: a file that shrank fails loudly
                builder
                    .append_data(&mut header, &e.rel, file.take(e.size))
                    .map_err(io_err("archive", &path))?;
            }
            LocalKind::Symlink(target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_size(0);
                builder
                    .append_link(&mut header, &e.rel, target)
                    .map_err(io_err("archive", &path))?;
            }
        }
    }
    let mut w = builder.into_inner().map_err(io_err("archive", root))?;
    w.flush().map_err(io_err("archive", root))
}

// ---------------------------------------------------------------- native

fn operation_id() -> String {
    format!("transfer-{}", uuid::Uuid::new_v4().simple())
}

fn check_sync_result(
    result: &sandhost_protocol::SyncResult,
    id: &str,
) -> Result<(), TransferError> {
    if result.operations.iter().any(|o| o.operation_id == id) {
        Ok(())
    } else {
        Err(TransferError::BadWorkerOutput {
            detail: format!("sync result does not report operation `{id}`"),
        })
    }
}

async fn native_upload(
    ctx: &LeaseContext,
    src: &Path,
    remote: &RemotePath,
    scan: &LocalScan,
) -> Result<(), TransferError> {
    let id = operation_id();
    let params = SyncParams {
        scope: ctx.scope.clone(),
        lease: ctx.lease.clone(),
        operations: vec![SyncOperation {
            operation_id: id.clone(),
            files: vec![FileMapping {
                source_path: src.to_string_lossy().into_owned(),
                target_path: remote.full.clone(),
                kind: scan.kind,
                mode: Some(FileMode(scan.mode)),
                exclude: None,
                follow_symlinks: Some(false),
                access: None,
            }],
            post_upload_commands: None,
        }],
    };
    let result = ctx.worker.call::<methods::SyncIn>(&params).await?;
    check_sync_result(&result, &id)
}

/// What kind of thing `remote` is, by one exec.
async fn remote_kind(ctx: &LeaseContext, remote: &RemotePath) -> Result<FileKind, TransferError> {
    let script = format!(
        "p={}; if [ -d \"$p\" ]; then echo directory; elif [ -f \"$p\" ]; then echo file; \
         elif [ -e \"$p\" ] || [ -L \"$p\" ]; then echo other; else echo missing; fi",
        shell_quote(&remote.full)
    );
    let out = run(ctx, "inspecting the remote path", &script).await?;
    match out.stdout.trim_end() {
        "directory" => Ok(FileKind::Directory),
        "file" => Ok(FileKind::File),
        other => Err(kind_marker_error(remote, other)),
    }
}

fn kind_marker_error(remote: &RemotePath, marker: &str) -> TransferError {
    match marker {
        "missing" => TransferError::RemoteNotFound {
            path: remote.full.clone(),
        },
        "other" => TransferError::RemotePathInvalid {
            path: remote.full.clone(),
            reason: "not a regular file or directory".into(),
        },
        other => TransferError::BadWorkerOutput {
            detail: format!("unexpected answer `{}`", truncate(other, 80)),
        },
    }
}

async fn native_download(
    ctx: &LeaseContext,
    remote: &RemotePath,
    payload: &Path,
) -> Result<FileKind, TransferError> {
    let kind = remote_kind(ctx, remote).await?;
    let id = operation_id();
    let params = SyncParams {
        scope: ctx.scope.clone(),
        lease: ctx.lease.clone(),
        operations: vec![SyncOperation {
            operation_id: id.clone(),
            files: vec![FileMapping {
                source_path: remote.full.clone(),
                target_path: payload.to_string_lossy().into_owned(),
                kind,
                mode: (kind == FileKind::File).then_some(FileMode(DOWNLOADED_FILE_MODE)),
                exclude: None,
                follow_symlinks: Some(false),
                access: None,
            }],
            post_upload_commands: None,
        }],
    };
    let result = ctx.worker.call::<methods::SyncOut>(&params).await?;
    check_sync_result(&result, &id)?;
    Ok(kind)
}

// ---------------------------------------------------------------- fallback

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut cut = s.len() - max;
    while !s.is_char_boundary(cut) {
        cut += 1;
    }
    format!("...{}", &s[cut..])
}

/// One control command; a non-zero exit is a loud, typed failure.
async fn run(
    ctx: &LeaseContext,
    step: &'static str,
    script: &str,
) -> Result<ExecuteResult, TransferError> {
    let out = ctx.sh(script, None).await?;
    if out.exit_code == Some(0) && !out.timed_out {
        return Ok(out);
    }
    let exit = if out.timed_out {
        "timed out".to_string()
    } else {
        match (out.exit_code, &out.signal) {
            (Some(c), _) => c.to_string(),
            (None, Some(s)) => format!("signal {s}"),
            (None, None) => "unknown".to_string(),
        }
    };
    Err(TransferError::RemoteCommandFailed {
        step,
        exit,
        stderr: truncate(out.stderr.trim(), 2000),
    })
}

/// Stream `reader` into a fresh temp file beside the target, one base64
/// chunk per exec; returns the temp file's path.
async fn send_chunks(
    ctx: &LeaseContext,
    remote: &RemotePath,
    source: &Path,
) -> Result<String, TransferError> {
    let prefix = format!("{}/{TEMP_PREFIX}", remote.parent.trim_end_matches('/'));
    let script = format!(
        "set -e; p={}; mkdir -p \"$p\"; mktemp {}",
        shell_quote(&remote.parent),
        shell_quote(&format!("{prefix}XXXXXXXX"))
    );
    let out = run(ctx, "creating the upload temp file", &script).await?;
    let tmp = out.stdout.trim_end_matches('\n').to_string();
    if !tmp.starts_with(&prefix) || tmp.contains('\n') || tmp.contains('\0') {
        return Err(TransferError::BadWorkerOutput {
            detail: format!("mktemp answered `{}`", truncate(&tmp, 200)),
        });
    }
    if let Err(e) = append_chunks(ctx, &tmp, source).await {
        let _ = ctx.sh(&format!("rm -f {}", shell_quote(&tmp)), None).await;
        return Err(e);
    }
    Ok(tmp)
}

async fn append_chunks(ctx: &LeaseContext, tmp: &str, source: &Path) -> Result<(), TransferError> {
    let mut file = File::open(source).map_err(io_err("open", source))?;
    let quoted_tmp = shell_quote(tmp);
    let mut buf = vec![0u8; RAW_CHUNK_LEN];
    loop {
        let n = read_full(&mut file, &mut buf).map_err(io_err("read", source))?;
        if n == 0 {
            return Ok(());
        }
        let chunk = base64::engine::general_purpose::STANDARD.encode(&buf[..n]);
        let script = format!("printf '%s' {} >> {quoted_tmp}", shell_quote(&chunk));
        run(ctx, "appending an upload chunk", &script).await?;
        if n < buf.len() {
            return Ok(());
        }
    }
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match r.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// A host temp file removed on drop.
struct HostTemp(PathBuf);

impl Drop for HostTemp {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

async fn fallback_upload(
    ctx: &LeaseContext,
    src: &Path,
    remote: &RemotePath,
    scan: &LocalScan,
) -> Result<(), TransferError> {
    let target = shell_quote(&remote.full);
    let parent = shell_quote(&remote.parent);
    let template = shell_quote(&format!(
        "{}/{TEMP_PREFIX}XXXXXXXX",
        remote.parent.trim_end_matches('/')
    ));
    if scan.kind == FileKind::File {
        let tmp = send_chunks(ctx, remote, src).await?;
        let script = format!(
            "set -e; a={tmp}; t={target}; p={parent}; b=$(mktemp {template}); \
             trap 'rm -f \"$a\" \"$b\"' EXIT; \
             base64 -d \"$a\" > \"$b\"; chmod {mode:o} \"$b\"; \
             if [ -d \"$t\" ] && [ ! -L \"$t\" ]; then echo \"target is a directory\" >&2; exit 3; fi; \
             if [ -L \"$t\" ]; then rm -f \"$t\"; fi; \
             mv -f \"$b\" \"$t\"",
            tmp = shell_quote(&tmp),
            mode = scan.mode,
        );
        run(ctx, "installing the uploaded file", &script).await?;
        return Ok(());
    }
    // a directory travels as a tar archive built on the host
    let archive = std::env::temp_dir().join(format!(
        "{TEMP_PREFIX}{}.tar",
        uuid::Uuid::new_v4().simple()
    ));
    let out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&archive)
        .map_err(io_err("create", &archive))?;
    let guard = HostTemp(archive.clone());
    {
        let (src, scan) = (src.to_path_buf(), scan.clone());
        blocking(move || build_archive(&src, &scan, out)).await?;
    }
    let tmp = send_chunks(ctx, remote, &guard.0).await?;
    drop(guard);
    let script = format!(
        "set -e; a={tmp}; t={target}; p={parent}; d=''; b=$(mktemp {template}); \
         trap 'rm -f \"$a\" \"$b\"; if [ -n \"$d\" ]; then rm -rf \"$d\"; fi' EXIT; \
         base64 -d \"$a\" > \"$b\"; d=$(mktemp -d {template}); \
         tar -x -o -p -f \"$b\" -C \"$d\"; chmod {mode:o} \"$d\"; \
         if [ -d \"$t\" ] && [ ! -L \"$t\" ]; then rm -rf \"$t\"; \
         elif [ -e \"$t\" ] || [ -L \"$t\" ]; then rm -f \"$t\"; fi; \
         mv \"$d\" \"$t\"; d=''",
        tmp = shell_quote(&tmp),
        mode = scan.mode,
    );
    run(ctx, "unpacking the uploaded directory", &script).await?;
    Ok(())
}

async fn fallback_download(
    ctx: &LeaseContext,
    remote: &RemotePath,
    payload: &Path,
    limits: &TransferLimits,
) -> Result<FileKind, TransferError> {
    // one exec: a marker line (directory / file / missing / other /
    // too-large), then the base64 payload, bounded by the cap in the sandbox
    // (and checked again here: nothing from the sandbox is trusted)
    let script = format!(
        "p={p}; cap={cap}; t=''; \
         if [ -d \"$p\" ]; then kind=directory; t=$(mktemp) || exit 1; \
           tar -c -C \"$p\" . > \"$t\" || {{ rm -f \"$t\"; exit 2; }}; src=$t; \
         elif [ -f \"$p\" ]; then kind=file; src=$p; \
         elif [ -e \"$p\" ] || [ -L \"$p\" ]; then echo other; exit 0; \
         else echo missing; exit 0; fi; \
         n=$(wc -c < \"$src\" | tr -d ' ') || n=''; \
         if [ -z \"$n\" ] || [ \"$n\" -gt \"$cap\" ]; then \
           if [ -n \"$t\" ]; then rm -f \"$t\"; fi; echo \"too-large $n\"; exit 0; fi; \
         echo \"$kind\"; base64 < \"$src\"; rc=$?; \
         if [ -n \"$t\" ]; then rm -f \"$t\"; fi; exit $rc",
        p = shell_quote(&remote.full),
        cap = limits.max_fallback_payload,
    );
    let out = run(ctx, "reading the remote path", &script).await?;
    let (marker, body) = out.stdout.split_once('\n').unwrap_or((&out.stdout, ""));
    let kind = match marker {
        "directory" => FileKind::Directory,
        "file" => FileKind::File,
        m if m.starts_with("too-large") => {
            return Err(TransferError::CapExceeded {
                what: "fallback payload",
                limit: limits.max_fallback_payload,
            })
        }
        m => return Err(kind_marker_error(remote, m)),
    };
    let clean: Vec<u8> = body.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    // a base64 payload of n bytes decodes to at most 3n/4
    if clean.len() as u64 / 4 * 3 > limits.max_fallback_payload + 3 {
        return Err(TransferError::CapExceeded {
            what: "fallback payload",
            limit: limits.max_fallback_payload,
        });
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&clean)
        .map_err(|e| TransferError::BadWorkerOutput {
            detail: format!("payload is not base64: {e}"),
        })?;
    if bytes.len() as u64 > limits.max_fallback_payload {
        return Err(TransferError::CapExceeded {
            what: "fallback payload",
            limit: limits.max_fallback_payload,
        });
    }
    let (payload, limits) = (payload.to_path_buf(), limits.clone());
    blocking(move || match kind {
        FileKind::File => {
            let mut counts = Counts::default();
            counts.entry(&limits)?;
            counts.file(bytes.len() as u64, &limits)?;
            let mut f = create_private(&payload)?;
            f.write_all(&bytes).map_err(io_err("write", &payload))?;
            Ok(FileKind::File)
        }
        FileKind::Directory => {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&payload)
                .map_err(io_err("create", &payload))?;
            unpack_archive(&bytes, &payload, &limits)?;
            Ok(FileKind::Directory)
        }
    })
    .await
}

fn create_private(path: &Path) -> Result<File, TransferError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("create", path))
}

// ---------------------------------------------------------------- unpacking

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Dir,
    File,
    Symlink,
}

/// Unpack a tar archive into `root` (an existing, empty, private directory)
/// by the rules in the module docs. Caps are checked before each entry is
/// written. On error `root` may hold a partial tree: the caller removes it
/// (a download unpacks into its staging directory, never in place).
pub fn unpack_archive(
    archive: &[u8],
    root: &Path,
    limits: &TransferLimits,
) -> Result<UnpackCounts, TransferError> {
    let mut ar = tar::Archive::new(archive);
    let mut counts = Counts::default();
    let mut seen: HashMap<PathBuf, Seen> = HashMap::new();
    let mut dir_modes: Vec<(PathBuf, u32)> = Vec::new();
    let mut root_mode: Option<u32> = None;
    let mut links: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    let malformed = |e: io::Error| rejected("<archive>", format!("malformed archive: {e}"));

    for entry in ar.entries().map_err(malformed)? {
        let mut entry = entry.map_err(malformed)?;
        let raw = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw).into_owned();
        let kind = entry.header().entry_type();
        if kind == tar::EntryType::XGlobalHeader {
            continue;
        }
        let rel = entry_path(&raw).map_err(|r| rejected(&name, r))?;
        let mode = entry
            .header()
            .mode()
            .map_err(|e| rejected(&name, e.to_string()))?
            & 0o777;
        let Some(rel) = rel else {
            if kind != tar::EntryType::Directory {
                return Err(rejected(&name, "the archive root is not a directory"));
            }
            root_mode = Some(mode);
            continue;
        };
        counts.entry(limits)?;
        // nothing may live below a symlink or a file
        for anc in rel.ancestors().skip(1) {
            match seen.get(anc) {
                Some(Seen::Symlink) => return Err(rejected(&name, "path goes through a symlink")),
                Some(Seen::File) => return Err(rejected(&name, "path goes through a file")),
                _ => {}
            }
        }
        let previous = seen.get(&rel).copied();
        match kind {
            tar::EntryType::Directory => {
                match previous {
                    None => {
                        make_parents(root, &rel, &mut seen, &mut dir_modes)?;
                        let full = root.join(&rel);
                        fs::DirBuilder::new()
                            .mode(0o700)
                            .create(&full)
                            .map_err(io_err("create", &full))?;
                        seen.insert(rel.clone(), Seen::Dir);
                    }
                    Some(Seen::Dir) => {}
                    Some(_) => return Err(rejected(&name, "duplicate entry")),
                }
                dir_modes.retain(|(p, _)| p != &rel);
                dir_modes.push((rel, mode));
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if previous.is_some() {
                    return Err(rejected(&name, "duplicate entry"));
                }
                let size = entry.size();
                counts.file(size, limits)?;
                make_parents(root, &rel, &mut seen, &mut dir_modes)?;
                let full = root.join(&rel);
                let mut out = create_private(&full)?;
                let copied = io::copy(&mut (&mut entry).take(size), &mut out)
                    .map_err(io_err("write", &full))?;
                if copied != size {
                    return Err(rejected(&name, "archive ends inside the entry"));
                }
                fs::set_permissions(&full, fs::Permissions::from_mode(mode))
                    .map_err(io_err("set the mode of", &full))?;
                seen.insert(rel, Seen::File);
            }
            tar::EntryType::Symlink => {
                if previous.is_some() {
                    return Err(rejected(&name, "duplicate entry"));
                }
                let target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .ok_or_else(|| rejected(&name, "symlink without a target"))?;
                if target.first() == Some(&b'/') {
                    return Err(rejected(&name, "absolute symlink target"));
                }
                seen.insert(rel.clone(), Seen::Symlink);
                links.push((rel, target));
            }
            tar::EntryType::Link => return Err(rejected(&name, "hard link")),
            tar::EntryType::Char | tar::EntryType::Block => {
                return Err(rejected(&name, "device node"))
            }
            tar::EntryType::Fifo => return Err(rejected(&name, "fifo")),
            tar::EntryType::GNUSparse => return Err(rejected(&name, "sparse file")),
            other => {
                return Err(rejected(
                    &name,
                    format!("unsupported entry type {}", other.as_byte()),
                ))
            }
        }
    }

    // symlinks last: while files were written there were none to follow
    let is_link = |p: &Path| seen.get(p) == Some(&Seen::Symlink);
    for (rel, target) in &links {
        check_link_target(rel, target, &is_link).map_err(|r| rejected(display(rel), r))?;
    }
    let mut seen_after = seen.clone();
    for (rel, target) in &links {
        make_parents(root, rel, &mut seen_after, &mut dir_modes)?;
        let full = root.join(rel);
        std::os::unix::fs::symlink(OsStr::from_bytes(target), &full)
            .map_err(io_err("create the symlink", &full))?;
    }
    apply_dir_modes(root, dir_modes, root_mode)?;
    Ok(UnpackCounts {
        entries: counts.entries,
        files: counts.files,
        bytes: counts.bytes,
    })
}

/// What [`unpack_archive`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnpackCounts {
    pub entries: u64,
    pub files: u64,
    pub bytes: u64,
}

/// Create the missing parents of `rel` (0700 now, 0755 at the end).
fn make_parents(
    root: &Path,
    rel: &Path,
    seen: &mut HashMap<PathBuf, Seen>,
    dir_modes: &mut Vec<(PathBuf, u32)>,
) -> Result<(), TransferError> {
    let mut parents: Vec<&Path> = rel
        .ancestors()
        .skip(1)
        .filter(|a| !a.as_os_str().is_empty())
        .collect();
    parents.reverse();
    for p in parents {
        match seen.get(p) {
            Some(Seen::Dir) => {}
            Some(_) => return Err(rejected(display(rel), "path goes through a non-directory")),
            None => {
                let full = root.join(p);
                fs::DirBuilder::new()
                    .mode(0o700)
                    .create(&full)
                    .map_err(io_err("create", &full))?;
                seen.insert(p.to_path_buf(), Seen::Dir);
                dir_modes.push((p.to_path_buf(), 0o755));
            }
        }
    }
    Ok(())
}

/// Directory modes go on last, deepest first, so a read-only directory does
/// not block writing its children.
fn apply_dir_modes(
    root: &Path,
    mut dir_modes: Vec<(PathBuf, u32)>,
    root_mode: Option<u32>,
) -> Result<(), TransferError> {
    dir_modes.sort_by_key(|(p, _)| std::cmp::Reverse(p.components().count()));
    for (rel, mode) in dir_modes {
        let full = root.join(&rel);
        fs::set_permissions(&full, fs::Permissions::from_mode(mode))
            .map_err(io_err("set the mode of", &full))?;
    }
    if let Some(mode) = root_mode {
        fs::set_permissions(root, fs::Permissions::from_mode(mode))
            .map_err(io_err("set the mode of", root))?;
    }
    Ok(())
}

// ---------------------------------------------------------------- staged check

/// Check what landed in the staging directory by the same rules as an
/// archive (the native path wrote it; the fallback path unpacked it) and
/// count it. Special mode bits are stripped here.
fn check_staged(
    payload: &Path,
    kind: FileKind,
    limits: &TransferLimits,
) -> Result<Counts, TransferError> {
    let meta = fs::symlink_metadata(payload).map_err(io_err("inspect", payload))?;
    let mut counts = Counts::default();
    let strip = |path: &Path, m: &fs::Metadata| -> Result<(), TransferError> {
        let mode = m.permissions().mode();
        if mode & 0o7000 != 0 {
            fs::set_permissions(path, fs::Permissions::from_mode(mode & 0o777))
                .map_err(io_err("set the mode of", path))?;
        }
        Ok(())
    };
    match kind {
        FileKind::File => {
            if !meta.file_type().is_file() {
                return Err(rejected("<file>", "the download is not a regular file"));
            }
            counts.entry(limits)?;
            counts.file(meta.len(), limits)?;
            fs::set_permissions(payload, fs::Permissions::from_mode(DOWNLOADED_FILE_MODE))
                .map_err(io_err("set the mode of", payload))?;
            return Ok(counts);
        }
        FileKind::Directory => {
            if !meta.file_type().is_dir() {
                return Err(rejected("<root>", "the download is not a directory"));
            }
            strip(payload, &meta)?;
        }
    }
    let is_link =
        |p: &Path| fs::symlink_metadata(payload.join(p)).is_ok_and(|m| m.file_type().is_symlink());
    let mut stack = vec![PathBuf::new()];
    while let Some(dir) = stack.pop() {
        let full_dir = payload.join(&dir);
        for entry in fs::read_dir(&full_dir).map_err(io_err("list", &full_dir))? {
            let entry = entry.map_err(io_err("list", &full_dir))?;
            let rel = dir.join(entry.file_name());
            let name = display(&rel);
            entry_path(rel.as_os_str().as_bytes()).map_err(|r| rejected(&name, r))?;
            counts.entry(limits)?;
            let full = payload.join(&rel);
            let m = fs::symlink_metadata(&full).map_err(io_err("inspect", &full))?;
            let ft = m.file_type();
            if ft.is_file() {
                if m.nlink() > 1 {
                    // a hard link may share its inode with a file outside
                    return Err(rejected(&name, "hard link"));
                }
                counts.file(m.len(), limits)?;
                strip(&full, &m)?;
            } else if ft.is_dir() {
                strip(&full, &m)?;
                stack.push(rel);
            } else if ft.is_symlink() {
                let target = fs::read_link(&full).map_err(io_err("read the symlink", &full))?;
                check_link_target(&rel, target.as_os_str().as_bytes(), &is_link)
                    .map_err(|r| rejected(&name, r))?;
            } else {
                return Err(rejected(&name, "not a regular file, directory or symlink"));
            }
        }
    }
    Ok(counts)
}
