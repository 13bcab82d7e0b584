//! The upload side: scan a local tree, then pack exactly what was scanned.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::error::io_err;
use crate::names::{check_link_target, display, entry_path};
use crate::{ArchiveError, Counts, Kind, Limits};

#[derive(Debug, Clone)]
enum EntryKind {
    File,
    Dir,
    Symlink(PathBuf),
}

#[derive(Debug, Clone)]
struct Entry {
    rel: PathBuf,
    kind: EntryKind,
    mode: u32,
    size: u64,
    mtime: u64,
}

/// A local tree checked by [`scan_tree`]: what [`pack_tree`] will write.
#[derive(Debug, Clone)]
pub struct Scan {
    kind: Kind,
    mode: u32,
    /// Entries below a directory root, parents before children.
    entries: Vec<Entry>,
    counts: Counts,
}

impl Scan {
    /// Whether the scanned root is a file or a directory.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Permission bits (`0o777` at most) of the root.
    pub fn mode(&self) -> u32 {
        self.mode
    }

    /// Entries, files and bytes of the tree.
    pub fn counts(&self) -> Counts {
        self.counts
    }
}

fn mtime_of(meta: &fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs())
}

/// Check the local file or directory `root` and count it against `limits`.
///
/// `root` itself is followed if it is a symlink (it is the path the caller
/// named); nothing below it is. Below a directory root only regular files,
/// directories and symlinks whose target stays inside the tree (see the
/// crate docs) are accepted, with UTF-8 names; anything else fails the whole
/// scan with [`ArchiveError::SourceRejected`].
pub fn scan_tree(root: &Path, limits: &Limits) -> Result<Scan, ArchiveError> {
    let meta = fs::metadata(root).map_err(io_err("read", root))?;
    let mode = meta.permissions().mode() & 0o777;
    let mut counts = Counts::default();
    if meta.is_file() {
        counts.add_entry(limits)?;
        counts.add_file(meta.len(), limits)?;
        return Ok(Scan {
            kind: Kind::File,
            mode,
            entries: vec![],
            counts,
        });
    }
    if !meta.is_dir() {
        return Err(ArchiveError::SourceRejected {
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
            let reject = |reason: &str| ArchiveError::SourceRejected {
                path: display(&path),
                reason: reason.into(),
            };
            if entry_path(rel.as_os_str().as_bytes()).is_err() {
                return Err(reject("name is not UTF-8 or too long"));
            }
            counts.add_entry(limits)?;
            let m = fs::symlink_metadata(&path).map_err(io_err("inspect", &path))?;
            let ft = m.file_type();
            let kind = if ft.is_file() {
                counts.add_file(m.len(), limits)?;
                EntryKind::File
            } else if ft.is_dir() {
                stack.push(rel.clone());
                EntryKind::Dir
            } else if ft.is_symlink() {
                let target = fs::read_link(&path).map_err(io_err("read the symlink", &path))?;
                let is_link = |p: &Path| {
                    fs::symlink_metadata(root.join(p)).is_ok_and(|m| m.file_type().is_symlink())
                };
                check_link_target(&rel, target.as_os_str().as_bytes(), &is_link)
                    .map_err(|r| reject(&r))?;
                EntryKind::Symlink(target)
            } else {
                return Err(reject("not a regular file, directory or symlink"));
            };
            entries.push(Entry {
                rel,
                kind,
                mode: m.permissions().mode() & 0o777,
                size: m.len(),
                mtime: mtime_of(&m),
            });
        }
    }
    Ok(Scan {
        kind: Kind::Directory,
        mode,
        entries,
        counts,
    })
}

/// Write the entries of a scanned directory tree as a tar archive into
/// `out`: GNU headers, modes kept, owner and group 0, special bits dropped,
/// entries relative to the root (the root itself is not an entry; its mode
/// is [`Scan::mode`]). Each file is written with exactly its scanned size:
/// one that shrank since fails loudly. A scan of a single file is refused.
pub fn pack_tree(root: &Path, scan: &Scan, out: impl Write) -> Result<(), ArchiveError> {
    if scan.kind != Kind::Directory {
        return Err(ArchiveError::SourceRejected {
            path: display(root),
            reason: "not a directory; only a directory tree is packed".into(),
        });
    }
    let mut builder = tar::Builder::new(io::BufWriter::new(out));
    for e in &scan.entries {
        let path = root.join(&e.rel);
        let mut header = tar::Header::new_gnu();
        header.set_mode(e.mode);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(e.mtime);
        match &e.kind {
            EntryKind::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_size(0);
                builder
                    .append_data(&mut header, &e.rel, io::empty())
                    .map_err(io_err("archive", &path))?;
            }
            EntryKind::File => {
                let file = File::open(&path).map_err(io_err("open", &path))?;
                header.set_entry_type(tar::EntryType::Regular);
                header.set_size(e.size);
                let exact = Exact {
                    inner: file.take(e.size),
                    left: e.size,
                };
                builder
                    .append_data(&mut header, &e.rel, exact)
                    .map_err(io_err("archive", &path))?;
            }
            EntryKind::Symlink(target) => {
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

/// [`scan_tree`] then [`pack_tree`]: pack the directory `root` into `out`
/// and return what was packed.
pub fn pack(root: &Path, limits: &Limits, out: impl Write) -> Result<Scan, ArchiveError> {
    let scan = scan_tree(root, limits)?;
    pack_tree(root, &scan, out)?;
    Ok(scan)
}

/// A reader of exactly `left` more bytes: ending early is an error (tar
/// would otherwise pad a short file silently and misalign the archive).
struct Exact<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && self.left > 0 && !buf.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shrank while it was being archived",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}
