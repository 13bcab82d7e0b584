//! The built-in providers: ordinary plugin workers shipped beside the
//! `sandhost` binary, so they need no plugin directory.

use sandhost_runtime::plugins::Plugin;

/// The built-in plugins whose worker binaries are installed beside this one.
pub fn builtin_plugins() -> Vec<Plugin> {
    Vec::new()
}
