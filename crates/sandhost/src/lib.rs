//! The sandhost Rust SDK.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sandhost::Error> {
//! let host = sandhost::Host::open(sandhost::HostOptions::new("/tmp/sandhost-home")).await?;
//! let sandbox = host.create(sandhost::SandboxOptions::default()).await?;
//! let out = sandbox.commands()?.run(&["echo", "hi"], Default::default()).await?;
//! assert_eq!(out.stdout, "hi\n");
//! sandbox.files()?.write("notes.txt", b"kept").await?;
//! let value = sandbox.code()?.run("x = 40 + 2\nprint(x)").await?;
//! assert_eq!(value.stdout, "42\n");
//! sandbox.kill().await?;
//! # Ok(()) }
//! ```
//!
//! A sandbox offers the command capabilities its template declares (default
//! {shell, files, code}); every call outside that set fails fast with
//! [`Error::NotSupported`] (E3004) and a suggestion, before anything reaches
//! the provider.
#![forbid(unsafe_code)]

mod code;
mod commands;
mod error;
mod files;
mod ports;
mod terminal;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

pub use sandhost_contract::gate::CapabilityNotSupportedError;
pub use sandhost_contract::resolve::LeasePolicy;
pub use sandhost_contract::template::{parse_template, Template};
pub use sandhost_contract::{CommandCapability, CommandSet, ErrorCode, DEFAULT_CAPABILITIES};
use sandhost_runtime::host::{CreateRequest, HostConfig};
use sandhost_runtime::plugins::{Plugin, Registry};
use sandhost_runtime::worker::WorkerOptions;
use serde_json::Value;

pub use code::{Code, CodeError, Execution};
pub use commands::{CommandEvent, CommandHandle, CommandOutput, Commands, RunOptions};
pub use error::Error;
pub use files::{EntryKind, FileEntry, Files};
pub use ports::{PortForward, Ports};
pub use terminal::{Terminal, TerminalEvent, TerminalOptions, Terminals};

/// The built-in providers: ordinary plugin workers shipped beside the
/// application, whose manifests are compiled in. `dir` is the directory
/// holding their worker binaries (for the CLI: the directory of `sandhost`
/// itself). A missing binary shows up as a worker that cannot start (E4101),
/// never as a silently missing provider.
pub fn builtin_plugins(dir: &std::path::Path) -> Vec<Plugin> {
    use sandhost_runtime::plugins::PluginSource;
    [
        sandhost_provider_local::PLUGIN_JSON,
        // compiled in from the manifest file: the SDK needs the Docker
        // provider's declaration, not its code
        include_str!("../../../providers/docker/plugin.json"),
    ]
    .into_iter()
    .filter_map(
        |json| match sandhost_contract::manifest::parse_manifest(json) {
            Ok(manifest) => Some(Plugin {
                dir: dir.to_path_buf(),
                manifest,
                source: PluginSource::Builtin,
            }),
            Err(e) => {
                tracing::error!("a built-in manifest is invalid: {e}");
                None
            }
        },
    )
    .collect()
}

/// Where a host keeps state and finds plugins.
#[derive(Debug, Clone)]
pub struct HostOptions {
    pub home: PathBuf,
    pub plugin_dirs: Vec<PathBuf>,
    /// Also read `$SANDHOST_PLUGIN_PATH` (default true).
    pub plugin_path_env: bool,
    /// Built-in providers (plugins shipped beside the application).
    pub builtins: Vec<Plugin>,
}

impl HostOptions {
    pub fn new(home: impl Into<PathBuf>) -> Self {
        Self {
            home: home.into(),
            plugin_dirs: Vec::new(),
            plugin_path_env: true,
            builtins: Vec::new(),
        }
    }

    pub fn plugin_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.plugin_dirs.push(dir.into());
        self
    }
}

/// A sandbox host: open one per process.
#[derive(Debug, Clone)]
pub struct Host {
    inner: Arc<sandhost_runtime::host::Host>,
}

/// How to create a sandbox.
#[derive(Debug, Clone, Default)]
pub struct SandboxOptions {
    /// The template; `None` is the built-in one (DEFAULT_CAPABILITIES).
    pub template: Option<Template>,
    /// Provider (driver key); default the template's, else `local`.
    pub provider: Option<String>,
    /// Provider config merged over what the template implies.
    pub config: Option<Value>,
    pub ttl: Option<Duration>,
    /// Ephemeral sandboxes are never reused; default: retained (reachable
    /// from later processes by id until killed or expired).
    pub ephemeral: bool,
}

impl Host {
    pub async fn open(opts: HostOptions) -> Result<Self, Error> {
        let env = opts
            .plugin_path_env
            .then(|| std::env::var("SANDHOST_PLUGIN_PATH").ok())
            .flatten();
        let registry = Registry::discover(&opts.plugin_dirs, env.as_deref(), opts.builtins);
        let cfg = HostConfig {
            home: opts.home,
            registry,
            worker_options: WorkerOptions::default(),
        };
        let inner = sandhost_runtime::host::Host::open(cfg)
            .await
            .map_err(Error::from_host)?;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Create a sandbox.
    pub async fn create(&self, opts: SandboxOptions) -> Result<Sandbox, Error> {
        let template = opts.template.unwrap_or_else(Template::builtin);
        let req = CreateRequest {
            template_yaml: template.to_yaml(),
            template,
            provider: opts.provider,
            config: opts.config.unwrap_or(Value::Object(Default::default())),
            ttl: opts.ttl,
            policy: if opts.ephemeral {
                LeasePolicy::Ephemeral
            } else {
                LeasePolicy::ReuseByEnvironment
            },
        };
        let inner = self.inner.create(req).await.map_err(Error::from_host)?;
        Ok(Sandbox {
            host: self.inner.clone(),
            inner: Arc::new(inner),
        })
    }

    /// Reach a sandbox created earlier, by this process or another.
    pub async fn connect(&self, id: &str) -> Result<Sandbox, Error> {
        let inner = self.inner.connect(id).await.map_err(Error::from_host)?;
        Ok(Sandbox {
            host: self.inner.clone(),
            inner: Arc::new(inner),
        })
    }

    /// Every sandbox in this home: (id, provider, template).
    pub fn list(&self) -> Result<Vec<SandboxInfo>, Error> {
        Ok(self
            .inner
            .list()
            .map_err(Error::from_host)?
            .into_iter()
            .map(|r| SandboxInfo {
                id: r.id,
                provider: r.provider,
                template: r.template_name,
                state: r.state,
            })
            .collect())
    }

    /// Destroy a sandbox by id.
    pub async fn kill(&self, id: &str) -> Result<(), Error> {
        self.inner.kill(id).await.map_err(Error::from_host)
    }
}

/// One row of [`Host::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxInfo {
    pub id: String,
    pub provider: String,
    pub template: String,
    pub state: String,
}

/// A sandbox and its five capability handles.
#[derive(Debug, Clone)]
pub struct Sandbox {
    host: Arc<sandhost_runtime::host::Host>,
    inner: Arc<sandhost_runtime::host::Sandbox>,
}

impl Sandbox {
    pub fn id(&self) -> &str {
        &self.inner.record.id
    }

    /// The command capabilities this sandbox offers.
    pub fn capabilities(&self) -> CommandSet {
        self.inner.commands
    }

    /// The provider capabilities resolved for this sandbox's run, by key.
    pub fn provider_capabilities(&self) -> Vec<(&'static str, bool)> {
        self.inner
            .ctx
            .snapshot
            .effective()
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect()
    }

    pub(crate) fn gate(&self, cap: CommandCapability) -> Result<(), Error> {
        sandhost_contract::gate::gate(&self.inner.commands, cap, Some(&self.inner.template.name))
            .map_err(|e| Error::NotSupported(Box::new(e)))
    }

    pub(crate) fn runtime(&self) -> &sandhost_runtime::host::Sandbox {
        &self.inner
    }

    /// Run commands (`shell`).
    pub fn commands(&self) -> Result<Commands, Error> {
        self.gate(CommandCapability::Shell)?;
        Ok(Commands::new(self.clone()))
    }

    /// Read and write files (`files`).
    pub fn files(&self) -> Result<Files, Error> {
        self.gate(CommandCapability::Files)?;
        Ok(Files::new(self.clone()))
    }

    /// Run Python in a stateful context (`code`).
    pub fn code(&self) -> Result<Code, Error> {
        self.gate(CommandCapability::Code)?;
        Ok(Code::new(self.clone(), "default"))
    }

    /// Interactive terminals (`terminal`).
    pub fn terminal(&self) -> Result<Terminals, Error> {
        self.gate(CommandCapability::Terminal)?;
        Ok(Terminals::new(self.clone()))
    }

    /// Reach ports inside the sandbox from the host (`ports`).
    pub fn ports(&self) -> Result<Ports, Error> {
        self.gate(CommandCapability::Ports)?;
        Ok(Ports::new(self.clone()))
    }

    /// Destroy the sandbox; nothing of it is left running.
    pub async fn kill(self) -> Result<(), Error> {
        self.host
            .destroy(&self.inner)
            .await
            .map_err(Error::from_host)
    }
}
