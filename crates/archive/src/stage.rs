//! A private staging directory next to the destination, and the swap into
//! place.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::error::io_err;
use crate::{ArchiveError, Kind};

/// The name prefix of staging directories and of a replaced tree moved
/// aside; a leftover (after a crash) is recognisable by it.
pub const STAGING_PREFIX: &str = ".sandhost-transfer-";

/// A private (0700) directory, removed with everything in it when dropped.
///
/// Create it in the destination's parent, so that [`swap_into_place`] is a
/// rename within one filesystem.
#[derive(Debug)]
pub struct Staging {
    dir: PathBuf,
}

impl Staging {
    /// Create `<parent>/.sandhost-transfer-<random>`, mode 0700.
    pub fn create(parent: &Path) -> Result<Self, ArchiveError> {
        let dir = parent.join(format!("{STAGING_PREFIX}{}", uuid::Uuid::new_v4().simple()));
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io_err("create the staging directory", &dir))?;
        Ok(Self { dir })
    }

    /// The staging directory itself.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// `<staging>/payload`: where the file or tree being downloaded goes (a
    /// tree is unpacked into it after creating it 0700), then checked and
    /// handed to [`swap_into_place`].
    pub fn payload(&self) -> PathBuf {
        self.dir.join("payload")
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = remove_tree(&self.dir);
    }
}

/// Rename the checked `payload` (a [`Kind::File`] or a [`Kind::Directory`])
/// to `dest`, replacing what is there without following it: a symlink at
/// `dest` is replaced, never written through.
///
/// A file replaces a file or a symlink atomically, and never replaces a
/// directory ([`ArchiveError::WouldReplaceDirectory`]). A directory replaces
/// anything: what was at `dest` is moved aside next to it first, and removed
/// once the payload is in place, or moved back if the rename fails.
/// `payload` and `dest` must be on the same filesystem.
pub fn swap_into_place(payload: &Path, dest: &Path, kind: Kind) -> Result<(), ArchiveError> {
    let existing = match fs::symlink_metadata(dest) {
        Ok(m) => Some(m),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err("inspect", dest)(e)),
    };
    let Some(existing) = existing else {
        return fs::rename(payload, dest).map_err(io_err("rename into", dest));
    };
    if kind == Kind::File {
        if existing.is_dir() {
            return Err(ArchiveError::WouldReplaceDirectory {
                path: dest.display().to_string(),
            });
        }
        // rename(2) replaces a file or a symlink itself, atomically
        return fs::rename(payload, dest).map_err(io_err("rename into", dest));
    }
    let parent = dest.parent().unwrap_or(Path::new("."));
    let aside = parent.join(format!(
        "{STAGING_PREFIX}old-{}",
        uuid::Uuid::new_v4().simple()
    ));
    fs::rename(dest, &aside).map_err(io_err("move aside", dest))?;
    if let Err(e) = fs::rename(payload, dest) {
        let _ = fs::rename(&aside, dest);
        return Err(io_err("rename into", dest)(e));
    }
    remove_tree(&aside).map_err(io_err("remove the replaced", &aside))
}

/// Remove a file, a symlink or a whole tree without following symlinks,
/// making read-only directories writable on the way. A missing `path` is
/// not an error.
pub fn remove_tree(path: &Path) -> io::Result<()> {
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
