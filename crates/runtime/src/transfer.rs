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

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use base64::Engine as _;
use sandhost_archive::{ArchiveError, Counts, Kind, Scan, Staging};
use sandhost_contract::ErrorCode;
use sandhost_protocol::methods;
use sandhost_protocol::{
    ExecuteResult, FileKind, FileMapping, FileMode, SyncOperation, SyncParams,
};
use sha2::{Digest, Sha256};

use crate::context::{shell_quote, LeaseContext};
use crate::worker::WorkerError;

/// The size of one base64 chunk the fallback upload appends per exec.
pub const CHUNK_LEN: usize = 32 * 1024;

/// Raw bytes that encode to exactly one [`CHUNK_LEN`] base64 chunk.
const RAW_CHUNK_LEN: usize = CHUNK_LEN / 4 * 3;

/// The mode a single downloaded file is written with; the longest path
/// accepted, remote or inside an archive, in bytes; the longest single path
/// component accepted, in bytes.
pub use sandhost_archive::{DOWNLOADED_FILE_MODE, MAX_NAME_LEN, MAX_PATH_LEN};

const TEMP_PREFIX: &str = sandhost_archive::STAGING_PREFIX;

/// Bounds on one transfer, in either direction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferLimits {
    /// Total bytes of regular files.
    pub max_bytes: u64,
    /// Entries (files, directories, symlinks; the root not counted).
    pub max_entries: u64,
    /// The raw bytes one exec answer of the fallback download carries: a
    /// payload (file or tar archive) up to this size comes back whole in the
    /// first answer, a larger one in chunks of this size, one exec each. It
    /// bounds a single answer, never the payload: that is bounded by
    /// `max_bytes` and `max_entries` alone. The answer is base64 (4/3 of the
    /// raw size plus line breaks), so this must stay well below what a worker
    /// captures of one command's stdout and below the frame limit.
    pub fallback_chunk: u64,
}

/// Archive bytes allowed per entry on top of its content: a header, the
/// padding, and a long name and a long link target with their own headers.
const ARCHIVE_OVERHEAD_PER_ENTRY: u64 = 3 * 512 + 2 * MAX_PATH_LEN as u64;

/// Archive bytes allowed on top of all entries: the end blocks and the
/// padding of the last record.
const ARCHIVE_SLACK: u64 = 64 * 1024;

impl TransferLimits {
    fn archive(&self) -> sandhost_archive::Limits {
        sandhost_archive::Limits {
            max_bytes: self.max_bytes,
            max_entries: self.max_entries,
        }
    }

    /// The largest tar archive of a tree within the byte and entry caps:
    /// what a fallback download refuses to move before it starts.
    pub fn max_archive_len(&self) -> u64 {
        self.max_bytes
            .saturating_add(self.max_entries.saturating_mul(ARCHIVE_OVERHEAD_PER_ENTRY))
            .saturating_add(ARCHIVE_SLACK)
    }
}

impl Default for TransferLimits {
    fn default() -> Self {
        Self {
            max_bytes: 1 << 30,
            max_entries: 100_000,
            // 512 KiB answers in about 700 KB of base64: inside the 1 MiB of
            // stdout the local provider captures per command, the 4 MiB of
            // the Docker provider and the 16 MiB frame
            fallback_chunk: 512 << 10,
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

    /// A chunked fallback download read a file that changed between its
    /// chunks: a torn copy is never returned.
    #[error("remote file `{path}` changed during the download: {detail}")]
    RemoteChanged { path: String, detail: String },
}

impl From<WorkerError> for TransferError {
    fn from(e: WorkerError) -> Self {
        Self::Worker(Box::new(e))
    }
}

/// The archive crate's errors, in the transfer codes they always had:
/// a refused entry E5104, a cap E5105, local I/O E5106, an upload source
/// that cannot be packed E5109, a file onto a directory E5102.
impl From<ArchiveError> for TransferError {
    fn from(e: ArchiveError) -> Self {
        match e {
            ArchiveError::Rejected { entry, reason } => Self::ArchiveRejected { entry, reason },
            ArchiveError::CapExceeded { cap, limit } => Self::CapExceeded {
                what: cap.as_str(),
                limit,
            },
            ArchiveError::Io {
                doing,
                path,
                source,
            } => Self::LocalIo {
                doing,
                path,
                source,
            },
            ArchiveError::SourceRejected { path, reason } => {
                Self::LocalEntryRejected { path, reason }
            }
            ArchiveError::WouldReplaceDirectory { path } => Self::LocalPathInvalid {
                path,
                reason: "is a directory; a file cannot replace it".into(),
            },
            ArchiveError::Read { source } => Self::LocalIo {
                doing: "read",
                path: "<archive>".into(),
                source,
            },
        }
    }
}

fn to_kind(kind: FileKind) -> Kind {
    match kind {
        FileKind::File => Kind::File,
        FileKind::Directory => Kind::Directory,
    }
}

fn from_kind(kind: Kind) -> FileKind {
    match kind {
        Kind::File => FileKind::File,
        Kind::Directory => FileKind::Directory,
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
            Self::RemoteChanged { .. } => "E5111",
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
        blocking(move || Ok(sandhost_archive::scan_tree(&src, &limits.archive())?)).await?
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
        files: scan.counts().files,
        bytes: scan.counts().bytes,
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
    let payload = staging.payload();
    let (path, kind) = if ctx.snapshot.native_sync() {
        let kind = native_download(ctx, &remote, &payload).await?;
        (TransferPath::Native, kind)
    } else {
        let kind = fallback_download(ctx, &remote, &payload, limits).await?;
        (TransferPath::Base64Fallback, kind)
    };
    let counts = {
        let (payload, limits) = (payload.clone(), limits.clone());
        blocking(move || {
            Ok(sandhost_archive::check_staged(
                &payload,
                to_kind(kind),
                &limits.archive(),
            )?)
        })
        .await?
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
        Ok(sandhost_archive::swap_into_place(
            payload,
            &self.full,
            to_kind(kind),
        )?)
    }
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
    scan: &Scan,
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
                kind: from_kind(scan.kind()),
                mode: Some(FileMode(scan.mode())),
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
    scan: &Scan,
) -> Result<(), TransferError> {
    let target = shell_quote(&remote.full);
    let parent = shell_quote(&remote.parent);
    let template = shell_quote(&format!(
        "{}/{TEMP_PREFIX}XXXXXXXX",
        remote.parent.trim_end_matches('/')
    ));
    if scan.kind() == Kind::File {
        let tmp = send_chunks(ctx, remote, src).await?;
        let script = format!(
            "set -e; a={tmp}; t={target}; p={parent}; b=$(mktemp {template}); \
             trap 'rm -f \"$a\" \"$b\"' EXIT; \
             base64 -d \"$a\" > \"$b\"; chmod {mode:o} \"$b\"; \
             if [ -d \"$t\" ] && [ ! -L \"$t\" ]; then echo \"target is a directory\" >&2; exit 3; fi; \
             if [ -L \"$t\" ]; then rm -f \"$t\"; fi; \
             mv -f \"$b\" \"$t\"",
            tmp = shell_quote(&tmp),
            mode = scan.mode(),
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
        blocking(move || Ok(sandhost_archive::pack_tree(&src, &scan, out)?)).await?;
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
        mode = scan.mode(),
    );
    run(ctx, "unpacking the uploaded directory", &script).await?;
    Ok(())
}

/// A fallback download, by the exec answers of the sandbox alone.
///
/// The first exec names what `remote` is and how large its payload is: the
/// file itself, or for a directory a tar archive written to a temp file in
/// the sandbox (`$TMPDIR`, else `/tmp`). The payload is checked against the
/// caps there before anything moves (and again here: nothing from the sandbox
/// is trusted). A payload up to [`TransferLimits::fallback_chunk`] comes back
/// in that same answer, base64-encoded after the marker line; a larger one is
/// read in chunks of that size, one exec each (`dd` with `skip`, which GNU
/// coreutils and busybox both seek), streamed into the staged file or the
/// unpacker as they arrive. Each chunk must have exactly the length the
/// first answer promised, and after the last one the sandbox's SHA-256 of
/// the payload must match the bytes received: a file that grows, shrinks or
/// changes meanwhile fails with [`TransferError::RemoteChanged`]. The temp
/// archive is removed by the last exec, or after any failure.
async fn fallback_download(
    ctx: &LeaseContext,
    remote: &RemotePath,
    payload: &Path,
    limits: &TransferLimits,
) -> Result<FileKind, TransferError> {
    let chunk = limits.fallback_chunk.max(1);
    // markers: directory / file (then the whole payload), chunked KIND SIZE
    // [TMP], too-large KIND SIZE, missing, other
    let script = format!(
        "p={p}; fcap={fcap}; acap={acap}; inl={chunk}; t=''; \
         if [ -d \"$p\" ]; then kind=directory; cap=$acap; \
           t=$(mktemp \"${{TMPDIR:-/tmp}}/{TEMP_PREFIX}XXXXXXXX\") || exit 1; \
           tar -c -C \"$p\" . > \"$t\" || {{ rm -f \"$t\"; exit 2; }}; src=$t; \
         elif [ -f \"$p\" ]; then kind=file; cap=$fcap; src=$p; \
         elif [ -e \"$p\" ] || [ -L \"$p\" ]; then echo other; exit 0; \
         else echo missing; exit 0; fi; \
         n=$(wc -c < \"$src\" | tr -d ' ') || n=''; \
         if [ -z \"$n\" ] || [ \"$n\" -gt \"$cap\" ]; then \
           if [ -n \"$t\" ]; then rm -f \"$t\"; fi; echo \"too-large $kind $n\"; exit 0; fi; \
         if [ \"$n\" -gt \"$inl\" ]; then echo \"chunked $kind $n $t\"; exit 0; fi; \
         echo \"$kind\"; base64 < \"$src\"; rc=$?; \
         if [ -n \"$t\" ]; then rm -f \"$t\"; fi; exit $rc",
        p = shell_quote(&remote.full),
        fcap = limits.max_bytes,
        acap = limits.max_archive_len(),
    );
    let out = run(ctx, "reading the remote path", &script).await?;
    let (marker, body) = out.stdout.split_once('\n').unwrap_or((&out.stdout, ""));
    let mut words = marker.splitn(4, ' ');
    let (first, kind_word) = (words.next().unwrap_or_default(), words.next());
    let kind = match kind_word {
        Some("file") => FileKind::File,
        Some("directory") => FileKind::Directory,
        _ => FileKind::File,
    };
    match (first, kind_word) {
        ("directory", None) | ("file", None) => {
            let kind = if first == "file" {
                FileKind::File
            } else {
                FileKind::Directory
            };
            let bytes = decode_answer(body, chunk)?;
            if kind == FileKind::File {
                check_file_caps(bytes.len() as u64, limits)?;
            }
            let (payload, limits) = (payload.to_path_buf(), limits.clone());
            blocking(move || consume(kind, &bytes[..], &payload, &limits)).await?;
            Ok(kind)
        }
        ("too-large", Some(_)) => Err(match kind {
            FileKind::File => TransferError::CapExceeded {
                what: "byte",
                limit: limits.max_bytes,
            },
            FileKind::Directory => TransferError::CapExceeded {
                what: "archive size",
                limit: limits.max_archive_len(),
            },
        }),
        ("chunked", Some("file" | "directory")) => {
            let bad = |detail: String| TransferError::BadWorkerOutput { detail };
            let size: u64 = words
                .next()
                .and_then(|n| n.parse().ok())
                .ok_or_else(|| bad(format!("unexpected answer `{}`", truncate(marker, 80))))?;
            let tmp = words.next().unwrap_or_default();
            let source = match kind {
                FileKind::File => {
                    check_file_caps(size, limits)?;
                    Chunked {
                        path: remote.full.clone(),
                        temp: false,
                    }
                }
                FileKind::Directory => {
                    check_remote_temp(tmp)?;
                    let source = Chunked {
                        path: tmp.to_string(),
                        temp: true,
                    };
                    if size > limits.max_archive_len() {
                        source.cleanup(ctx).await;
                        return Err(TransferError::CapExceeded {
                            what: "archive size",
                            limit: limits.max_archive_len(),
                        });
                    }
                    source
                }
            };
            let got = fetch_chunks(ctx, &source, kind, size, chunk, payload, limits).await;
            if got.is_err() {
                source.cleanup(ctx).await;
            }
            got.map_err(|e| match e {
                TransferError::RemoteChanged { detail, .. } => TransferError::RemoteChanged {
                    path: remote.full.clone(),
                    detail,
                },
                e => e,
            })?;
            Ok(kind)
        }
        _ => Err(kind_marker_error(remote, marker)),
    }
}

/// A single downloaded file's size against the caps, before any byte moves.
fn check_file_caps(size: u64, limits: &TransferLimits) -> Result<(), TransferError> {
    let mut counts = Counts::default();
    let archive_limits = limits.archive();
    counts.add_entry(&archive_limits)?;
    counts.add_file(size, &archive_limits)?;
    Ok(())
}

/// The sandbox's temp archive, as `mktemp` named it: absolute, ours, one line.
fn check_remote_temp(tmp: &str) -> Result<(), TransferError> {
    let name = tmp.rsplit('/').next().unwrap_or_default();
    if !tmp.starts_with('/')
        || !name.starts_with(TEMP_PREFIX)
        || tmp.chars().any(char::is_control)
        || tmp.split('/').any(|c| c == "..")
    {
        return Err(TransferError::BadWorkerOutput {
            detail: format!("temp archive named `{}`", truncate(tmp, 200)),
        });
    }
    Ok(())
}

/// Where the chunks of a download are read from inside the sandbox.
struct Chunked {
    path: String,
    /// Our temp archive: removed when the download ends, either way.
    temp: bool,
}

impl Chunked {
    /// Remove the temp archive after a failure; best effort, the failure
    /// already being reported.
    async fn cleanup(&self, ctx: &LeaseContext) {
        if self.temp {
            let _ = ctx
                .sh(&format!("rm -f {}", shell_quote(&self.path)), None)
                .await;
        }
    }
}

/// Base64 from one exec answer, at most `cap` raw bytes.
fn decode_answer(body: &str, cap: u64) -> Result<Vec<u8>, TransferError> {
    let clean: Vec<u8> = body.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    let too_large = || TransferError::CapExceeded {
        what: "fallback chunk",
        limit: cap,
    };
    // n base64 bytes decode to at most 3n/4
    if clean.len() as u64 / 4 * 3 > cap + 3 {
        return Err(too_large());
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&clean)
        .map_err(|e| TransferError::BadWorkerOutput {
            detail: format!("payload is not base64: {e}"),
        })?;
    if bytes.len() as u64 > cap {
        return Err(too_large());
    }
    Ok(bytes)
}

/// Write a payload into the staging: a file as is, an archive unpacked.
fn consume(
    kind: FileKind,
    mut payload_bytes: impl Read,
    payload: &Path,
    limits: &TransferLimits,
) -> Result<(), TransferError> {
    match kind {
        FileKind::File => {
            let mut f = create_private(payload)?;
            io::copy(&mut payload_bytes, &mut f).map_err(io_err("write", payload))?;
            Ok(())
        }
        FileKind::Directory => {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(payload)
                .map_err(io_err("create", payload))?;
            sandhost_archive::unpack(payload_bytes, payload, &limits.archive())?;
            Ok(())
        }
    }
}

/// Chunks arriving from the async side, read by the blocking consumer; the
/// sender dropped is the end of the payload.
struct ChunkReader {
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
    chunk: Vec<u8>,
    pos: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.chunk.len() {
            match self.rx.recv() {
                Ok(next) => {
                    self.chunk = next;
                    self.pos = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.chunk.len() - self.pos);
        buf[..n].copy_from_slice(&self.chunk[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Read `size` bytes of `source` in chunks into the staging, then compare
/// digests (and remove the temp archive).
async fn fetch_chunks(
    ctx: &LeaseContext,
    source: &Chunked,
    kind: FileKind,
    size: u64,
    chunk: u64,
    payload: &Path,
    limits: &TransferLimits,
) -> Result<(), TransferError> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(2);
    let consumer = {
        let (payload, limits) = (payload.to_path_buf(), limits.clone());
        let reader = ChunkReader {
            rx,
            chunk: Vec::new(),
            pos: 0,
        };
        tokio::task::spawn_blocking(move || consume(kind, reader, &payload, &limits))
    };
    let mut consumer = Some(consumer);
    let mut tx = Some(tx);
    let quoted = shell_quote(&source.path);
    let mut digest = Sha256::new();
    let mut offset = 0u64;
    let mut fetched = Ok(());
    while offset < size {
        let want = chunk.min(size - offset);
        let script = format!(
            "p={quoted}; if [ ! -r \"$p\" ]; then echo \"cannot read $p\" >&2; exit 1; fi; \
             dd if=\"$p\" bs={chunk} skip={index} count=1 2>/dev/null | base64",
            index = offset / chunk,
        );
        let bytes = match run(ctx, "reading a download chunk", &script).await {
            Ok(out) => decode_answer(&out.stdout, chunk),
            Err(e) => Err(e),
        };
        let bytes = match bytes {
            Ok(b) if b.len() as u64 == want => b,
            Ok(b) => {
                fetched = Err(changed(format!(
                    "{} bytes at offset {offset} where {want} were expected of {size}",
                    b.len()
                )));
                break;
            }
            Err(e) => {
                fetched = Err(e);
                break;
            }
        };
        offset += want;
        digest.update(&bytes);
        let sent = tx.as_ref().is_some_and(|tx| tx.send(bytes).is_ok());
        if !sent {
            // the consumer stopped: a refusal ends the download now; after a
            // complete archive (its end blocks read), the rest is padding
            // that only the digest still needs
            tx = None;
            if let Some(c) = consumer.take() {
                join_consumer(c).await?;
            }
        }
    }
    drop(tx);
    let consumed = match consumer {
        Some(c) => join_consumer(c).await,
        None => Ok(()),
    };
    // a failed fetch explains a consumer that saw the payload end early
    fetched?;
    consumed?;
    let script = format!(
        "p={quoted}; sha256sum \"$p\"{rm}",
        rm = if source.temp {
            "; rc=$?; rm -f \"$p\"; exit $rc"
        } else {
            ""
        },
    );
    let out = run(ctx, "computing the payload digest", &script).await?;
    let theirs = out.stdout.get(..64).unwrap_or_default();
    if !theirs.bytes().all(|b| b.is_ascii_hexdigit()) || theirs.len() != 64 {
        return Err(TransferError::BadWorkerOutput {
            detail: format!("sha256sum answered `{}`", truncate(out.stdout.trim(), 200)),
        });
    }
    let ours: String = digest
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if !theirs.eq_ignore_ascii_case(&ours) {
        return Err(changed(format!(
            "its sha256 is now {theirs}, the bytes read hash to {ours}"
        )));
    }
    Ok(())
}

fn changed(detail: String) -> TransferError {
    TransferError::RemoteChanged {
        path: String::new(),
        detail,
    }
}

async fn join_consumer(
    handle: tokio::task::JoinHandle<Result<(), TransferError>>,
) -> Result<(), TransferError> {
    handle.await.map_err(|e| TransferError::LocalIo {
        doing: "run a blocking transfer step",
        path: String::new(),
        source: io::Error::other(e.to_string()),
    })?
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

/// What [`unpack_archive`] wrote.
pub type UnpackCounts = sandhost_archive::Counts;

/// Unpack an in-memory tar archive into `root` (an existing, empty, private
/// directory) by the rules in the module docs; see [`sandhost_archive::unpack`],
/// which this wraps.
pub fn unpack_archive(
    archive: &[u8],
    root: &Path,
    limits: &TransferLimits,
) -> Result<UnpackCounts, TransferError> {
    Ok(sandhost_archive::unpack(archive, root, &limits.archive())?)
}
