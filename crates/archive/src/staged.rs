//! Checking a tree that reached the staging directory without an archive.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::{io_err, rejected};
use crate::names::{check_link_target, display, entry_path};
use crate::{ArchiveError, Counts, Kind, Limits, DOWNLOADED_FILE_MODE};

/// Check what landed at `payload` (something other than [`unpack`] wrote
/// it, e.g. a provider's native sync) by the same rules as an archive, strip
/// setuid, setgid and sticky bits, and count it. A [`Kind::File`] payload
/// must be a regular file and gets mode [`DOWNLOADED_FILE_MODE`]; a
/// [`Kind::Directory`] payload is walked without following symlinks, and a
/// file with more than one link is refused as a hard link (it may share its
/// inode with a file outside).
///
/// [`unpack`]: crate::unpack
pub fn check_staged(payload: &Path, kind: Kind, limits: &Limits) -> Result<Counts, ArchiveError> {
    let meta = fs::symlink_metadata(payload).map_err(io_err("inspect", payload))?;
    let mut counts = Counts::default();
    let strip = |path: &Path, m: &fs::Metadata| -> Result<(), ArchiveError> {
        let mode = m.permissions().mode();
        if mode & 0o7000 != 0 {
            fs::set_permissions(path, fs::Permissions::from_mode(mode & 0o777))
                .map_err(io_err("set the mode of", path))?;
        }
        Ok(())
    };
    match kind {
        Kind::File => {
            if !meta.file_type().is_file() {
                return Err(rejected("<file>", "the download is not a regular file"));
            }
            counts.add_entry(limits)?;
            counts.add_file(meta.len(), limits)?;
            fs::set_permissions(payload, fs::Permissions::from_mode(DOWNLOADED_FILE_MODE))
                .map_err(io_err("set the mode of", payload))?;
            return Ok(counts);
        }
        Kind::Directory => {
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
            counts.add_entry(limits)?;
            let full = payload.join(&rel);
            let m = fs::symlink_metadata(&full).map_err(io_err("inspect", &full))?;
            let ft = m.file_type();
            if ft.is_file() {
                if m.nlink() > 1 {
                    return Err(rejected(&name, "hard link"));
                }
                counts.add_file(m.len(), limits)?;
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
