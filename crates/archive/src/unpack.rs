//! The download side: stream an untrusted archive into a private directory.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{io_err, rejected};
use crate::names::{check_link_target, display, entry_path};
use crate::{ArchiveError, Counts, Limits};

/// The most header metadata (the header block, GNU long names and links,
/// pax records) read for one entry. Tar buffers such metadata whole, so
/// without this bound a hostile stream could make it buffer without end.
pub const METADATA_PER_ENTRY: u64 = 1 << 20;

const BLOCK: u64 = 512;

/// What the reader underneath the tar parser did, shared with [`unpack`].
#[derive(Default)]
struct Watch {
    /// Bytes read from the source so far.
    read: Cell<u64>,
    /// Read no further than this: the end of the current entry's data plus
    /// [`METADATA_PER_ENTRY`] for the headers of the next one.
    allowed: Cell<u64>,
    over_budget: Cell<bool>,
    eof: Cell<bool>,
    /// The source's own error, kept whole (tar sees a copy).
    failed: RefCell<Option<io::Error>>,
}

impl Watch {
    /// Why the tar parser failed, when it was not the archive's content.
    fn cause(&self) -> Option<ArchiveError> {
        if let Some(source) = self.failed.borrow_mut().take() {
            return Some(ArchiveError::Read { source });
        }
        self.over_budget.get().then(|| {
            rejected(
                "<archive>",
                format!("entry metadata larger than {METADATA_PER_ENTRY} bytes"),
            )
        })
    }
}

struct Watched<'w, R> {
    inner: R,
    watch: &'w Watch,
}

impl<R: Read> Read for Watched<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let w = self.watch;
        let room = w.allowed.get().saturating_sub(w.read.get());
        if room == 0 {
            w.over_budget.set(true);
            return Err(io::Error::other("entry metadata over budget"));
        }
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        match self.inner.read(&mut buf[..want]) {
            Ok(0) => {
                w.eof.set(true);
                Ok(0)
            }
            Ok(n) => {
                w.read.set(w.read.get() + n as u64);
                Ok(n)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Err(e),
            Err(e) => {
                let copy = io::Error::new(e.kind(), e.to_string());
                w.failed.borrow_mut().get_or_insert(e);
                Err(copy)
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Dir,
    File,
    Symlink,
}

/// Unpack the tar archive read from `archive` into `root`, an existing,
/// empty, private directory, by the rules in the crate docs, and count what
/// was written.
///
/// The archive is streamed: it is read once, front to back, and only one
/// entry's header metadata is held at a time (file data goes straight to
/// disk), so a reader over a pipe works and nothing is buffered whole. A
/// `&[u8]` is a reader too. Reading stops at the end-of-archive marker: pass
/// `&mut reader` to drain what follows (tar's record padding) afterwards.
///
/// Caps are checked from each header before the entry is written. On error
/// `root` may hold a partial tree; the caller removes it (unpack into a
/// [`Staging`](crate::Staging) directory, never in place).
pub fn unpack(archive: impl Read, root: &Path, limits: &Limits) -> Result<Counts, ArchiveError> {
    let watch = Watch::default();
    watch.allowed.set(METADATA_PER_ENTRY);
    let mut ar = tar::Archive::new(Watched {
        inner: archive,
        watch: &watch,
    });
    let mut counts = Counts::default();
    let mut seen: HashMap<PathBuf, Seen> = HashMap::new();
    let mut dir_modes: Vec<(PathBuf, u32)> = Vec::new();
    let mut root_mode: Option<u32> = None;
    let mut links: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    let malformed = |e: io::Error| {
        watch
            .cause()
            .unwrap_or_else(|| rejected("<archive>", format!("malformed archive: {e}")))
    };

    for entry in ar.entries().map_err(malformed)? {
        let mut entry = entry.map_err(malformed)?;
        let size = entry.size();
        // this entry's data, then the next entry's headers
        watch.allowed.set(
            entry
                .raw_file_position()
                .saturating_add(size.div_ceil(BLOCK).saturating_mul(BLOCK))
                .saturating_add(METADATA_PER_ENTRY),
        );
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
        counts.add_entry(limits)?;
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
                counts.add_file(size, limits)?;
                make_parents(root, &rel, &mut seen, &mut dir_modes)?;
                let full = root.join(&rel);
                let mut out = create_private(&full)?;
                let copied = io::copy(&mut (&mut entry).take(size), &mut out)
                    .map_err(|e| watch.cause().unwrap_or_else(|| io_err("write", &full)(e)))?;
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
    if watch.eof.get() {
        // tar takes a clean end of input for the end of the archive; a
        // stream cut short on a block boundary must not pass for a smaller
        // tree
        return Err(rejected(
            "<archive>",
            "archive ends without its end-of-archive marker",
        ));
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
    Ok(counts)
}

pub(crate) fn create_private(path: &Path) -> Result<File, ArchiveError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err("create", path))
}

/// Create the missing parents of `rel` (0700 now, 0755 at the end).
fn make_parents(
    root: &Path,
    rel: &Path,
    seen: &mut HashMap<PathBuf, Seen>,
    dir_modes: &mut Vec<(PathBuf, u32)>,
) -> Result<(), ArchiveError> {
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
) -> Result<(), ArchiveError> {
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
