//! The built-in providers: ordinary plugin workers installed beside the
//! `sandhost` binary, so they need no plugin directory.

use std::path::PathBuf;

use sandhost_runtime::plugins::Plugin;

/// Where the built-in workers live: `$SANDHOST_BUILTIN_DIR`, else the
/// directory of this executable.
fn builtin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SANDHOST_BUILTIN_DIR") {
        return PathBuf::from(d);
    }
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.to_path_buf()))
        .unwrap_or_else(|| PathBuf::from("."))
}

pub fn builtin_plugins() -> Vec<Plugin> {
    sandhost::builtin_plugins(&builtin_dir())
}
