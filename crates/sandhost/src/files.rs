//! The `files` capability. Contents travel by the path the run's snapshot
//! selects (native sync, else base64 over execute); metadata comes from
//! one-shot commands with every path shell-quoted.

use std::path::Path;

use sandhost_contract::CommandCapability;
use sandhost_runtime::context::shell_quote;
use sandhost_runtime::transfer::{self, TransferLimits, TransferReport};

use crate::{Error, Sandbox};

/// What a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
    Other,
}

/// One file's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    pub name: String,
    pub kind: EntryKind,
    pub size: u64,
    /// Permission bits, e.g. 0o644.
    pub mode: u32,
}

/// Files of one sandbox.
#[derive(Debug, Clone)]
pub struct Files {
    sandbox: Sandbox,
}

/// `stat` output: size, octal mode, type word, name (last: it may hold tabs).
const STAT_FMT: &str = "%s\t%a\t%F\t%n";

fn parse_stat_line(line: &str) -> Option<FileEntry> {
    let mut it = line.splitn(4, '\t');
    let size = it.next()?.parse().ok()?;
    let mode = u32::from_str_radix(it.next()?, 8).ok()?;
    let kind = match it.next()? {
        "regular file" | "regular empty file" => EntryKind::File,
        "directory" => EntryKind::Directory,
        "symbolic link" => EntryKind::Symlink,
        _ => EntryKind::Other,
    };
    let path = it.next()?;
    let name = path.rsplit('/').next().unwrap_or(path).to_string();
    Some(FileEntry {
        name,
        kind,
        size,
        mode,
    })
}

impl Files {
    pub(crate) fn new(sandbox: Sandbox) -> Self {
        Self { sandbox }
    }

    fn gate(&self) -> Result<(), Error> {
        self.sandbox.gate(CommandCapability::Files)
    }

    async fn sh(&self, what: &'static str, script: &str) -> Result<String, Error> {
        let r = self.sandbox.runtime().ctx.sh(script, None).await?;
        if r.exit_code != Some(0) {
            return Err(Error::Remote {
                what,
                exit: r
                    .exit_code
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "none".into()),
                stderr: r.stderr.trim().to_string(),
            });
        }
        Ok(r.stdout)
    }

    /// Upload a local file or directory tree to `remote`.
    pub async fn upload(&self, local: &Path, remote: &str) -> Result<TransferReport, Error> {
        self.gate()?;
        Ok(transfer::upload(
            &self.sandbox.runtime().ctx,
            local,
            remote,
            &TransferLimits::default(),
        )
        .await?)
    }

    /// Download `remote` (file or tree) to a local path.
    pub async fn download(&self, remote: &str, local: &Path) -> Result<TransferReport, Error> {
        self.gate()?;
        Ok(transfer::download(
            &self.sandbox.runtime().ctx,
            remote,
            local,
            &TransferLimits::default(),
        )
        .await?)
    }

    /// Write `data` to the file `remote`, replacing it atomically.
    pub async fn write(&self, remote: &str, data: &[u8]) -> Result<(), Error> {
        self.gate()?;
        let dir = tempfile::tempdir().map_err(|source| Error::Io {
            doing: "making a temp dir",
            source,
        })?;
        let f = dir.path().join("payload");
        std::fs::write(&f, data).map_err(|source| Error::Io {
            doing: "staging a file",
            source,
        })?;
        self.upload(&f, remote).await.map(|_| ())
    }

    /// Read the file `remote` whole.
    pub async fn read(&self, remote: &str) -> Result<Vec<u8>, Error> {
        self.gate()?;
        let dir = tempfile::tempdir().map_err(|source| Error::Io {
            doing: "making a temp dir",
            source,
        })?;
        let f = dir.path().join("payload");
        self.download(remote, &f).await?;
        std::fs::read(&f).map_err(|source| Error::Io {
            doing: "reading a downloaded file",
            source,
        })
    }

    /// Metadata of one path (a symlink itself, not its target).
    pub async fn stat(&self, remote: &str) -> Result<FileEntry, Error> {
        self.gate()?;
        let out = self
            .sh(
                "stat",
                &format!("stat -c '{STAT_FMT}' -- {}", shell_quote(remote)),
            )
            .await?;
        out.lines()
            .next()
            .and_then(parse_stat_line)
            .ok_or_else(|| Error::Remote {
                what: "stat",
                exit: "0".into(),
                stderr: format!("unexpected stat output: {out:?}"),
            })
    }

    /// The entries of a directory, sorted by name.
    pub async fn list(&self, remote: &str) -> Result<Vec<FileEntry>, Error> {
        self.gate()?;
        let d = shell_quote(remote);
        let script = format!(
            "[ -d {d} ] || {{ echo 'not a directory' >&2; exit 2; }}; \
             for f in {d}/* {d}/.*; do case \"${{f##*/}}\" in .|..) continue;; esac; \
             [ -e \"$f\" ] || [ -L \"$f\" ] || continue; stat -c '{STAT_FMT}' -- \"$f\"; done"
        );
        let out = self.sh("list", &script).await?;
        let mut v: Vec<FileEntry> = out.lines().filter_map(parse_stat_line).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(v)
    }

    /// Whether `remote` exists.
    pub async fn exists(&self, remote: &str) -> Result<bool, Error> {
        self.gate()?;
        let q = shell_quote(remote);
        let out = self
            .sh(
                "exists",
                &format!("if [ -e {q} ] || [ -L {q} ]; then echo y; else echo n; fi"),
            )
            .await?;
        Ok(out.trim() == "y")
    }

    /// Make a directory and its parents.
    pub async fn mkdir(&self, remote: &str) -> Result<(), Error> {
        self.gate()?;
        self.sh("mkdir", &format!("mkdir -p -- {}", shell_quote(remote)))
            .await
            .map(|_| ())
    }

    /// Remove a file, or a directory tree when `recursive`.
    pub async fn remove(&self, remote: &str, recursive: bool) -> Result<(), Error> {
        self.gate()?;
        let flag = if recursive { "-rf" } else { "-f" };
        self.sh("remove", &format!("rm {flag} -- {}", shell_quote(remote)))
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_kind_size_mode_and_a_name_holding_tabs() {
        let e = parse_stat_line("12\t755\tregular file\t/w/a\tb").unwrap();
        assert_eq!(
            e,
            FileEntry {
                name: "a\tb".into(),
                kind: EntryKind::File,
                size: 12,
                mode: 0o755
            }
        );
        assert_eq!(
            parse_stat_line("0\t700\tdirectory\t/w/d").unwrap().kind,
            EntryKind::Directory
        );
        assert_eq!(
            parse_stat_line("0\t644\tregular empty file\t/w/e")
                .unwrap()
                .kind,
            EntryKind::File
        );
        assert!(parse_stat_line("garbage").is_none());
    }
}
