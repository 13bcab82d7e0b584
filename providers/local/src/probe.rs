//! What this host can and cannot do for the local provider.
use std::fs;

use crate::cgroup::{Layout, Placement, CONTROLLERS};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Info,
    Warning,
    Error,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub severity: Severity,
    /// Stable code for warnings and errors (E6xxx).
    pub code: Option<&'static str>,
    pub message: String,
}

fn d(severity: Severity, code: Option<&'static str>, message: String) -> Diagnostic {
    Diagnostic {
        severity,
        code,
        message,
    }
}

/// Check every host feature the local provider relies on. An empty list of
/// `Severity::Error` entries means sandboxes can be created.
pub fn probe() -> Vec<Diagnostic> {
    use Severity::*;
    let mut out = vec![];
    const CAP_SYS_ADMIN: u64 = 1 << 21;
    match crate::sys::effective_capabilities() {
        Ok(caps) if caps & CAP_SYS_ADMIN != 0 => out.push(d(Info, None, "running with CAP_SYS_ADMIN".into())),
        _ => out.push(d(Error, Some("E6004"), "the local provider needs root on the host (CAP_SYS_ADMIN) to map uid ranges and create cgroups".into())),
    }
    match fs::read_to_string("/proc/sys/user/max_user_namespaces").map(|s| s.trim().parse::<u64>())
    {
        Ok(Ok(n)) if n > 0 => out.push(d(
            Info,
            None,
            format!("user namespaces available (max {n})"),
        )),
        Ok(Ok(_)) => out.push(d(
            Error,
            Some("E6001"),
            "user namespaces are disabled (user.max_user_namespaces = 0)".into(),
        )),
        _ => out.push(d(
            Error,
            Some("E6001"),
            "user namespaces are not supported by this kernel".into(),
        )),
    }
    for ns in ["mnt", "pid", "net", "ipc", "uts", "cgroup", "user"] {
        if fs::symlink_metadata(format!("/proc/self/ns/{ns}")).is_err() {
            out.push(d(
                Error,
                Some("E6001"),
                format!("{ns} namespaces are not supported by this kernel"),
            ));
        }
    }
    let layout = Layout::detect();
    for c in CONTROLLERS {
        match layout.locate(c) {
            Some(Placement::V1(p)) => out.push(d(Info, None, format!("cgroup v1 controller {c} at {}", p.display()))),
            Some(Placement::V2(p)) => out.push(d(Info, None, format!("cgroup v2 controller {c} at {}", p.display()))),
            None => out.push(d(Error, Some("E6002"), format!("no cgroup controller {c} (neither a v1 hierarchy nor in cgroup2's cgroup.controllers)"))),
        }
    }
    match layout.locate("memory") {
        Some(Placement::V1(p)) if !p.join("memory.memsw.limit_in_bytes").exists() => out.push(d(
            Warning,
            Some("E6002"),
            "memory.memsw.limit_in_bytes is missing (swap accounting off): swap is not limited"
                .into(),
        )),
        _ => {}
    }
    let status = fs::read_to_string("/proc/self/status").unwrap_or_default();
    if !status.contains("Seccomp:") || crate::sys::seccomp_mode().is_err() {
        out.push(d(
            Error,
            Some("E6003"),
            "seccomp is not available in this kernel".into(),
        ));
    } else {
        out.push(d(Info, None, "seccomp filter mode available".into()));
    }
    match crate::sandbox::find_init(None) {
        Ok(p) => out.push(d(Info, None, format!("sandhost-init at {}", p.display()))),
        Err(e) => out.push(d(Error, Some("E6005"), e.to_string())),
    }
    out
}
