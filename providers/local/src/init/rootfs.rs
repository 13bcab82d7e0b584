//! Build the sandbox's root filesystem inside the new mount namespace and
//! pivot into it.
use std::fs;
use std::os::unix::fs::{symlink, DirBuilderExt, PermissionsExt};
use std::path::Path;

use super::InitConfig;
use crate::sys::{self, MS_BIND, MS_NODEV, MS_NOEXEC, MS_NOSUID, MS_RDONLY, MS_REC, MS_REMOUNT};

/// Where the new root's tmpfs is mounted before pivot_root (in our private
/// mount namespace only).
const STAGING: &str = "/tmp";

/// Host directories bound read-only in the default (host) layout.
const HOST_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Host /etc entries bound read-only (when present); everything else in /etc
/// (shadow, ssh keys, ...) stays invisible.
const HOST_ETC: &[&str] = &[
    "alternatives",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "nsswitch.conf",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "mime.types",
    "profile",
    "bash.bashrc",
    "inputrc",
    "terminfo",
    "gai.conf",
    "protocols",
    "services",
];

/// Entries of a rootfs directory that are never bound (we provide them).
const ROOTFS_SKIP: &[&str] = &["proc", "dev", "sys", "tmp", "workspace", "run"];

fn m(
    src: Option<&Path>,
    dst: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> Result<(), String> {
    sys::mount(src, dst, fstype, flags, data).map_err(|e| {
        format!(
            "mount {} on {}: {e}",
            src.map_or("-".into(), |s| s.display().to_string()),
            dst.display()
        )
    })
}

fn mkdir(p: &Path, mode: u32) -> Result<(), String> {
    match fs::DirBuilder::new().mode(mode).create(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("mkdir {}: {e}", p.display())),
    }
}

fn touch(p: &Path) -> Result<(), String> {
    fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(p)
        .map(drop)
        .map_err(|e| format!("create {}: {e}", p.display()))
}

/// Bind `src` on `dst` (creating `dst` as a dir or file, or copying a
/// symlink), read-only, nosuid, nodev, keeping the flags the kernel locks.
fn bind_ro(src: &Path, dst: &Path) -> Result<(), String> {
    let md = match fs::symlink_metadata(src) {
        Ok(md) => md,
        Err(_) => return Ok(()), // optional entry
    };
    if md.file_type().is_symlink() {
        let target = fs::read_link(src).map_err(|e| format!("readlink {}: {e}", src.display()))?;
        return symlink(&target, dst).map_err(|e| format!("symlink {}: {e}", dst.display()));
    }
    if md.is_dir() {
        mkdir(dst, 0o755)?;
    } else {
        touch(dst)?;
    }
    m(Some(src), dst, None, MS_BIND | MS_REC, None)?;
    let locked =
        sys::locked_mount_flags(src).map_err(|e| format!("statvfs {}: {e}", src.display()))?;
    m(
        None,
        dst,
        None,
        MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | locked,
        None,
    )
}

fn tmpfs(
    dst: &Path,
    mode: &str,
    bytes: u64,
    inodes: u64,
    flags: libc::c_ulong,
) -> Result<(), String> {
    mkdir(dst, 0o755)?;
    let data = format!("mode={mode},size={bytes},nr_inodes={inodes}");
    m(
        Some(Path::new("tmpfs")),
        dst,
        Some("tmpfs"),
        flags,
        Some(&data),
    )
}

pub(super) fn build(cfg: &InitConfig) -> Result<(), String> {
    // Nothing we do may propagate back to the host.
    m(None, Path::new("/"), None, MS_REC | sys::MS_PRIVATE, None)?;
    // The rootfs (if any) is opened before the staging tmpfs can hide it.
    let rootfs = match &cfg.rootfs {
        Some(p) => Some(fs::canonicalize(p).map_err(|e| format!("rootfs {}: {e}", p.display()))?),
        None => None,
    };
    let root = Path::new(STAGING);
    m(
        Some(Path::new("tmpfs")),
        root,
        Some("tmpfs"),
        MS_NOSUID | MS_NODEV,
        Some("mode=0755,size=4m,nr_inodes=4096"),
    )?;

    match &rootfs {
        None => {
            for d in HOST_DIRS {
                bind_ro(&Path::new("/").join(d), &root.join(d))?;
            }
            let etc = root.join("etc");
            mkdir(&etc, 0o755)?;
            let files: [(&str, String); 5] = [
                ("passwd", "root:x:0:0:root:/workspace:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n".into()),
                ("group", "root:x:0:\ntty:x:5:\nnogroup:x:65534:\n".into()),
                ("hosts", format!("127.0.0.1\tlocalhost {0}\n::1\tlocalhost ip6-localhost {0}\n", cfg.hostname)),
                ("hostname", format!("{}\n", cfg.hostname)),
                ("resolv.conf", String::new()),
            ];
            for (name, content) in files {
                fs::write(etc.join(name), content)
                    .map_err(|e| format!("write /etc/{name}: {e}"))?;
            }
            for e in HOST_ETC {
                bind_ro(&Path::new("/etc").join(e), &etc.join(e))?;
            }
        }
        Some(rootfs) => {
            let entries = fs::read_dir(rootfs).map_err(|e| format!("read rootfs: {e}"))?;
            for entry in entries {
                let entry = entry.map_err(|e| format!("read rootfs: {e}"))?;
                let name = entry.file_name();
                if ROOTFS_SKIP.iter().any(|s| name == *s) {
                    continue;
                }
                bind_ro(&entry.path(), &root.join(&name))?;
            }
        }
    }

    // /proc: a fresh procfs of our pid namespace, with the knobs read-only.
    let proc_ = root.join("proc");
    mkdir(&proc_, 0o555)?;
    m(
        Some(Path::new("proc")),
        &proc_,
        Some("proc"),
        MS_NOSUID | MS_NODEV | MS_NOEXEC,
        None,
    )?;
    for p in ["sys", "sysrq-trigger", "irq", "bus", "fs"] {
        let p = proc_.join(p);
        if p.exists() {
            m(Some(&p), &p, None, MS_BIND | MS_REC, None)?;
            m(
                None,
                &p,
                None,
                MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                None,
            )?;
        }
    }

    // /dev: a tiny tmpfs with the harmless character devices bound from the host.
    let dev = root.join("dev");
    tmpfs(&dev, "0755", 1 << 20, 64, MS_NOSUID | MS_NOEXEC)?;
    for d in ["null", "zero", "full", "random", "urandom", "tty"] {
        let dst = dev.join(d);
        touch(&dst)?;
        m(Some(&Path::new("/dev").join(d)), &dst, None, MS_BIND, None)?;
    }
    let pts = dev.join("pts");
    mkdir(&pts, 0o755)?;
    m(
        Some(Path::new("devpts")),
        &pts,
        Some("devpts"),
        MS_NOSUID | MS_NOEXEC,
        Some("newinstance,ptmxmode=0666,mode=0620"),
    )?;
    let links: [(&str, &str); 5] = [
        ("ptmx", "pts/ptmx"),
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ];
    for (name, target) in links {
        symlink(target, dev.join(name)).map_err(|e| format!("symlink /dev/{name}: {e}"))?;
    }
    tmpfs(
        &dev.join("shm"),
        "1777",
        64 << 20,
        1024,
        MS_NOSUID | MS_NODEV,
    )?;

    // Writable, size- and inode-limited scratch space.
    tmpfs(
        &root.join("tmp"),
        "1777",
        cfg.tmp_bytes,
        cfg.inodes,
        MS_NOSUID | MS_NODEV,
    )?;
    tmpfs(
        &root.join("workspace"),
        "0755",
        cfg.workspace_bytes,
        cfg.inodes,
        MS_NOSUID | MS_NODEV,
    )?;
    fs::set_permissions(root.join("tmp"), fs::Permissions::from_mode(0o1777)).ok();

    // pivot_root into the new root and detach the old one.
    std::env::set_current_dir(root).map_err(|e| format!("chdir new root: {e}"))?;
    sys::pivot_root(Path::new("."), Path::new(".")).map_err(|e| format!("pivot_root: {e}"))?;
    sys::umount2(Path::new("."), sys::MNT_DETACH).map_err(|e| format!("detach old root: {e}"))?;
    std::env::set_current_dir("/").map_err(|e| format!("chdir /: {e}"))?;
    // The root itself becomes read-only; /tmp, /workspace and /dev/shm stay writable.
    m(
        None,
        Path::new("/"),
        None,
        MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV,
        None,
    )?;
    Ok(())
}
