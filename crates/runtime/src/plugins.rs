//! Plugin discovery: `--plugin-dir` directories, `$SANDHOST_PLUGIN_PATH`
//! (colon-separated), and the built-in providers.
//!
//! A directory given is either a plugin (it holds `plugin.json`) or a
//! directory of plugin directories. Every manifest passes the contract's
//! strict validator; an invalid one is recorded as a problem with its path
//! and never loaded. When two plugins declare the same driver key, the first
//! found wins (explicit directories before the environment path before the
//! built-ins) and the clash is recorded.

use std::path::{Path, PathBuf};

use sandhost_contract::manifest::{parse_manifest, DriverDeclaration, PluginManifest};
use sandhost_contract::{ContractError, Declared, ProviderCapability};

use crate::worker::WorkerSpec;

/// The manifest file a plugin directory holds.
pub const MANIFEST_FILE: &str = "plugin.json";

/// Where a plugin came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PluginSource {
    /// `--plugin-dir`
    Flag,
    /// `$SANDHOST_PLUGIN_PATH`
    EnvPath,
    /// shipped with sandhost
    Builtin,
}

/// One loaded plugin.
#[derive(Debug, Clone)]
pub struct Plugin {
    /// The plugin directory: the worker's working directory.
    pub dir: PathBuf,
    pub manifest: PluginManifest,
    pub source: PluginSource,
}

impl Plugin {
    /// Load the plugin in `dir` (which must hold `plugin.json`).
    pub fn load(dir: &Path, source: PluginSource) -> Result<Self, DiscoveryProblem> {
        let file = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&file).map_err(|e| DiscoveryProblem::Unreadable {
            path: file.clone(),
            detail: e.to_string(),
        })?;
        let manifest = parse_manifest(&text).map_err(|error| DiscoveryProblem::Invalid {
            path: file.clone(),
            error,
        })?;
        Ok(Self {
            dir: dir.to_path_buf(),
            manifest,
            source,
        })
    }

    /// This plugin with `cap` declared `false` for `driver_key` (and a
    /// distinct id), so that every run through it takes the capability's
    /// fallback path: how tests and benchmarks compare a path with its
    /// fallback on the same worker.
    pub fn narrowed(&self, driver_key: &str, cap: ProviderCapability) -> Plugin {
        let mut p = self.clone();
        p.manifest.id = format!("{}+no-{}", self.manifest.id, cap.as_str());
        for d in &mut p.manifest.environment_drivers {
            if d.driver_key == driver_key {
                d.declared.set(cap, Declared::False);
                d.capabilities_object_present = true;
            }
        }
        p
    }

    /// How to start this plugin's worker.
    pub fn worker_spec(&self) -> WorkerSpec {
        WorkerSpec {
            argv: self.manifest.worker.command.clone(),
            cwd: self.dir.clone(),
            env: vec![],
        }
    }
}

/// Something discovery found wrong; the rest still loads.
#[derive(Debug, Clone)]
pub enum DiscoveryProblem {
    Unreadable {
        path: PathBuf,
        detail: String,
    },
    Invalid {
        path: PathBuf,
        error: ContractError,
    },
    NotAPluginDir {
        path: PathBuf,
    },
    DuplicateDriver {
        driver_key: String,
        kept: PathBuf,
        ignored: PathBuf,
    },
}

impl std::fmt::Display for DiscoveryProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unreadable { path, detail } => {
                write!(f, "cannot read {}: {detail}", path.display())
            }
            Self::Invalid { path, error } => {
                write!(f, "{}: {} ({})", path.display(), error, error.code())
            }
            Self::NotAPluginDir { path } => write!(
                f,
                "{} holds no {MANIFEST_FILE} and no plugin directories",
                path.display()
            ),
            Self::DuplicateDriver {
                driver_key,
                kept,
                ignored,
            } => write!(
                f,
                "driver `{driver_key}` is declared by {} and {}; the first is used",
                kept.display(),
                ignored.display()
            ),
        }
    }
}

/// Every plugin found, in precedence order, and what went wrong.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    pub plugins: Vec<Plugin>,
    pub problems: Vec<DiscoveryProblem>,
}

impl Registry {
    /// Discover plugins from explicit directories, then the colon-separated
    /// `env_path`, then the built-ins (already loaded by the caller).
    pub fn discover(dirs: &[PathBuf], env_path: Option<&str>, builtins: Vec<Plugin>) -> Self {
        let mut reg = Self::default();
        for d in dirs {
            reg.scan(d, PluginSource::Flag);
        }
        for d in env_path.unwrap_or("").split(':').filter(|s| !s.is_empty()) {
            reg.scan(Path::new(d), PluginSource::EnvPath);
        }
        for p in builtins {
            reg.add(p);
        }
        reg
    }

    fn scan(&mut self, dir: &Path, source: PluginSource) {
        if dir.join(MANIFEST_FILE).is_file() {
            match Plugin::load(dir, source) {
                Ok(p) => self.add(p),
                Err(e) => self.problems.push(e),
            }
            return;
        }
        let mut subdirs: Vec<PathBuf> = match std::fs::read_dir(dir) {
            Ok(rd) => rd
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.join(MANIFEST_FILE).is_file())
                .collect(),
            Err(e) => {
                self.problems.push(DiscoveryProblem::Unreadable {
                    path: dir.to_path_buf(),
                    detail: e.to_string(),
                });
                return;
            }
        };
        if subdirs.is_empty() {
            self.problems.push(DiscoveryProblem::NotAPluginDir {
                path: dir.to_path_buf(),
            });
        }
        subdirs.sort();
        for sub in subdirs {
            match Plugin::load(&sub, source.clone()) {
                Ok(p) => self.add(p),
                Err(e) => self.problems.push(e),
            }
        }
    }

    fn add(&mut self, plugin: Plugin) {
        for d in &plugin.manifest.environment_drivers {
            if let Some((kept, _)) = self.driver(&d.driver_key) {
                self.problems.push(DiscoveryProblem::DuplicateDriver {
                    driver_key: d.driver_key.clone(),
                    kept: kept.dir.clone(),
                    ignored: plugin.dir.clone(),
                });
            }
        }
        self.plugins.push(plugin);
    }

    /// The plugin that serves `driver_key` (the first that declares it).
    pub fn driver(&self, driver_key: &str) -> Option<(&Plugin, &DriverDeclaration)> {
        self.plugins
            .iter()
            .find_map(|p| p.manifest.driver(driver_key).map(|d| (p, d)))
    }

    /// The plugin with this exact id.
    pub fn plugin(&self, id: &str) -> Option<&Plugin> {
        self.plugins.iter().find(|p| p.manifest.id == id)
    }
}
