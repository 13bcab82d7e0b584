//! Entry names and symlink targets.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::{MAX_NAME_LEN, MAX_PATH_LEN};

/// A relative, normalised entry path: `None` for the root itself.
pub(crate) fn entry_path(raw: &[u8]) -> Result<Option<PathBuf>, String> {
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
pub(crate) fn check_link_target(
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

pub(crate) fn display(p: &Path) -> String {
    p.display().to_string()
}
