//! [`ArchiveError`] and its stable codes.

use std::io;
use std::path::Path;

/// Which cap a tree or an archive went over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// [`Limits::max_entries`](crate::Limits::max_entries).
    Entries,
    /// [`Limits::max_bytes`](crate::Limits::max_bytes).
    Bytes,
}

impl Cap {
    /// `entry` or `byte`, as in "the entry cap".
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Entries => "entry",
            Self::Bytes => "byte",
        }
    }
}

/// Everything packing, unpacking, checking and staging can fail with.
///
/// Codes are stable and mapped once, in [`ArchiveError::code`]; the crate
/// owns the range E5150–E5169 (E5156–E5169 reserved):
///
/// | code  | variant                    | meaning                                                        |
/// |-------|----------------------------|----------------------------------------------------------------|
/// | E5150 | [`Rejected`]               | an archive entry or a staged entry breaks the unpack rules     |
/// | E5151 | [`CapExceeded`]            | the byte or entry cap was reached (checked before writing)     |
/// | E5152 | [`Io`]                     | a local filesystem operation failed                            |
/// | E5153 | [`SourceRejected`]         | a local tree to pack holds something that cannot be packed     |
/// | E5154 | [`WouldReplaceDirectory`]  | a single file was to replace a directory                       |
/// | E5155 | [`Read`]                   | the archive's reader failed (not the archive's fault)          |
///
/// [`Rejected`]: ArchiveError::Rejected
/// [`CapExceeded`]: ArchiveError::CapExceeded
/// [`Io`]: ArchiveError::Io
/// [`SourceRejected`]: ArchiveError::SourceRejected
/// [`WouldReplaceDirectory`]: ArchiveError::WouldReplaceDirectory
/// [`Read`]: ArchiveError::Read
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    /// `entry` is the name as the archive (or the staged tree) gave it,
    /// lossily decoded; `<archive>` when the archive as a whole is at fault.
    #[error("archive entry `{entry}` rejected: {reason}")]
    Rejected { entry: String, reason: String },

    #[error("tree exceeds the {what} cap of {limit}", what = .cap.as_str())]
    CapExceeded { cap: Cap, limit: u64 },

    #[error("cannot {doing} `{path}`: {source}")]
    Io {
        doing: &'static str,
        path: String,
        source: io::Error,
    },

    #[error("local entry `{path}` cannot be packed: {reason}")]
    SourceRejected { path: String, reason: String },

    #[error("`{path}` is a directory; a file cannot replace it")]
    WouldReplaceDirectory { path: String },

    #[error("cannot read the archive: {source}")]
    Read { source: io::Error },
}

impl ArchiveError {
    /// The stable code (E5150–E5169).
    pub fn code(&self) -> &'static str {
        match self {
            Self::Rejected { .. } => "E5150",
            Self::CapExceeded { .. } => "E5151",
            Self::Io { .. } => "E5152",
            Self::SourceRejected { .. } => "E5153",
            Self::WouldReplaceDirectory { .. } => "E5154",
            Self::Read { .. } => "E5155",
        }
    }
}

pub(crate) fn io_err<'a>(
    doing: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> ArchiveError + 'a {
    move |source| ArchiveError::Io {
        doing,
        path: path.display().to_string(),
        source,
    }
}

pub(crate) fn rejected(entry: impl Into<String>, reason: impl Into<String>) -> ArchiveError {
    ArchiveError::Rejected {
        entry: entry.into(),
        reason: reason.into(),
    }
}
