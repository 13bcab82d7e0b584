//! Tar packing of a checked local tree, and safe unpacking of an untrusted
//! one, shared by every path that moves a tree between the host and a
//! sandbox (the runtime's base64 fallback, a provider's native sync-out).
//!
//! # Packing (the upload side)
//!
//! [`scan_tree`] looks at a local file or directory first: regular files,
//! directories and symlinks whose target stays inside the tree; anything
//! else (an escaping symlink, a fifo, a device, a name that is not UTF-8)
//! refuses the whole tree, and the caps are counted on the scan.
//! [`pack_tree`] then writes exactly what was scanned (modes kept, owner 0,
//! special bits dropped); [`pack`] does both.
//!
//! # Unpacking (the download side)
//!
//! [`unpack`] streams an archive from any reader into an existing, empty,
//! private directory. What an archive may hold:
//!
//! - regular files, directories, and relative symlinks whose target stays
//!   inside the tree at every step without passing through another symlink;
//! - no `..`, no absolute paths, no hard links, no devices, fifos or
//!   sockets, no sparse files, no entry below a symlink or a file, no
//!   duplicates, UTF-8 names only (at most [`MAX_PATH_LEN`] bytes, components
//!   at most [`MAX_NAME_LEN`]);
//! - setuid, setgid and sticky bits are stripped;
//! - the byte and entry caps ([`Limits`]) are checked from each header
//!   before anything of the entry is written, so a header claiming 1 TiB
//!   writes nothing;
//! - header metadata (GNU long names, pax records) is bounded per entry, so a
//!   hostile stream cannot make the reader buffer without end;
//! - the archive must end with its end-of-archive marker: a stream cut short
//!   is refused rather than taken for a smaller tree.
//!
//! Symlinks are created last, after every file was written, so nothing is
//! ever written through one. On error the directory may hold a partial tree:
//! always unpack into a [`Staging`] directory and [`swap_into_place`] only
//! after success.
//!
//! A tree that reached the staging directory some other way (a provider
//! copied it there) is checked by the same rules with [`check_staged`].
//!
//! # Staging
//!
//! [`Staging::create`] makes a private (0700) directory next to the
//! destination, removed with everything in it when dropped. The caller puts
//! the payload inside it (conventionally [`Staging::payload`]), checks it,
//! then calls [`swap_into_place`], which renames it over the destination: a
//! file atomically, a directory by moving the old one aside first and
//! bringing it back if the rename fails.
//!
//! # Errors
//!
//! [`ArchiveError`] carries stable codes E5150–E5169, see its docs.
#![forbid(unsafe_code)]

mod error;
mod names;
mod pack;
mod stage;
mod staged;
mod unpack;

pub use error::{ArchiveError, Cap};
pub use pack::{pack, pack_tree, scan_tree, Scan};
pub use stage::{remove_tree, swap_into_place, Staging, STAGING_PREFIX};
pub use staged::check_staged;
pub use unpack::{unpack, METADATA_PER_ENTRY};

/// The longest path accepted inside an archive or a tree, in bytes.
pub const MAX_PATH_LEN: usize = 4096;

/// The longest single path component accepted, in bytes.
pub const MAX_NAME_LEN: usize = 255;

/// The mode [`check_staged`] gives a single downloaded file (its remote mode
/// does not travel with it).
pub const DOWNLOADED_FILE_MODE: u32 = 0o644;

/// Whether a tree's root is a single file or a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Directory,
}

/// Bounds on one tree, packed or unpacked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Total bytes of regular files.
    pub max_bytes: u64,
    /// Entries (files, directories, symlinks; the root not counted).
    pub max_entries: u64,
}

impl Default for Limits {
    /// 1 GiB and 100,000 entries.
    fn default() -> Self {
        Self {
            max_bytes: 1 << 30,
            max_entries: 100_000,
        }
    }
}

/// What a tree holds, counted against [`Limits`] as it is walked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Files, directories and symlinks, the root not counted (a single-file
    /// tree counts one).
    pub entries: u64,
    /// Regular files.
    pub files: u64,
    /// Bytes of regular files.
    pub bytes: u64,
}

impl Counts {
    /// Count one more entry; fails once the entry cap is exceeded.
    pub fn add_entry(&mut self, limits: &Limits) -> Result<(), ArchiveError> {
        self.entries += 1;
        if self.entries > limits.max_entries {
            return Err(ArchiveError::CapExceeded {
                cap: Cap::Entries,
                limit: limits.max_entries,
            });
        }
        Ok(())
    }

    /// Count one more regular file of `size` bytes (its entry is counted by
    /// [`add_entry`](Self::add_entry)); fails once the byte cap is exceeded.
    pub fn add_file(&mut self, size: u64, limits: &Limits) -> Result<(), ArchiveError> {
        self.files += 1;
        self.bytes = self.bytes.saturating_add(size);
        if self.bytes > limits.max_bytes {
            return Err(ArchiveError::CapExceeded {
                cap: Cap::Bytes,
                limit: limits.max_bytes,
            });
        }
        Ok(())
    }
}
