//! The `sandhost` command line. The names and shapes of its commands are a
//! contract (docs: ../shared/design/CLI.md); anyhow is used only here.
#![forbid(unsafe_code)]

mod builtins;
mod inspect;
mod output;
mod plugins;
mod sandbox;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use output::Failure;

/// Run untrusted code in sandboxes through pluggable providers.
#[derive(Debug, Parser)]
#[command(name = "sandhost", version, about, propagate_version = true)]
struct Cli {
    #[command(flatten)]
    global: GlobalOpts,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Args)]
struct GlobalOpts {
    /// State directory (SQLite store, sandboxes' runtime files)
    #[arg(long, global = true, env = "SANDHOST_HOME", value_name = "DIR")]
    home: Option<PathBuf>,
    /// A plugin directory, or a directory of plugin directories (repeatable)
    #[arg(long = "plugin-dir", global = true, value_name = "DIR")]
    plugin_dirs: Vec<PathBuf>,
    /// Machine-readable output
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Args)]
struct SandboxArgs {
    /// template.yaml (or a directory holding one); default: the built-in template
    #[arg(long, value_name = "FILE|NAME")]
    template: Option<String>,
    /// Provider (driver key); default: the template's, else `local`
    #[arg(long, value_name = "KEY")]
    provider: Option<String>,
    /// Provider config as a JSON object, merged over what the template implies
    #[arg(long, value_name = "JSON")]
    config: Option<String>,
}

#[derive(Debug, Args)]
struct CommandArgs {
    /// Environment variable for the command (repeatable)
    #[arg(long = "env", short = 'e', value_name = "K=V")]
    env: Vec<String>,
    /// Working directory inside the sandbox
    #[arg(long, value_name = "DIR")]
    cwd: Option<String>,
    /// Kill the command after SECS seconds (exit status 124)
    #[arg(long, value_name = "SECS")]
    timeout: Option<u64>,
    /// The command and its arguments
    #[arg(last = true, required = true, value_name = "CMD")]
    argv: Vec<String>,
}

impl CommandArgs {
    fn spec(&self) -> sandbox::CommandSpec {
        sandbox::CommandSpec {
            argv: self.argv.clone(),
            env: self.env.clone(),
            cwd: self.cwd.clone(),
            timeout: self.timeout,
        }
    }
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command in a new ephemeral sandbox, then destroy it
    Run {
        #[command(flatten)]
        sandbox: SandboxArgs,
        /// Upload LOCAL to REMOTE before the command (repeatable)
        #[arg(long = "put", value_name = "LOCAL:REMOTE")]
        put: Vec<String>,
        /// Download REMOTE to LOCAL after the command (repeatable)
        #[arg(long = "get", value_name = "REMOTE:LOCAL")]
        get: Vec<String>,
        #[command(flatten)]
        command: CommandArgs,
    },
    /// Create a long-lived sandbox and print its id
    Create {
        #[command(flatten)]
        sandbox: SandboxArgs,
        /// Lifetime in seconds (default: the template's timeout, else 300)
        #[arg(long, value_name = "SECS")]
        ttl: Option<u64>,
    },
    /// Run a command in an existing sandbox
    Exec {
        /// Sandbox id
        id: String,
        #[command(flatten)]
        command: CommandArgs,
    },
    /// Copy files and directories between the host and a sandbox
    Cp {
        /// LOCAL or ID:REMOTE
        src: String,
        /// ID:REMOTE or LOCAL
        dst: String,
    },
    /// List sandboxes
    Ls,
    /// Destroy sandboxes
    Kill {
        #[arg(required = true, value_name = "ID")]
        ids: Vec<String>,
    },
    /// Provider capability resolution
    #[command(subcommand)]
    Capabilities(CapabilitiesCmd),
    /// Plugin manifests and workers
    #[command(subcommand)]
    Plugin(PluginCmd),
    /// Sandbox templates (template.yaml)
    #[command(subcommand)]
    Template(TemplateCmd),
    /// Every provider available (built-in and from plugins) with its probe result
    Providers,
}

#[derive(Debug, Subcommand)]
enum CapabilitiesCmd {
    /// Resolve one scenario and explain every capability
    Explain {
        /// Scenario file, or - for standard input
        #[arg(long, value_name = "FILE|-")]
        scenario: String,
    },
}

#[derive(Debug, Subcommand)]
enum PluginCmd {
    /// Strictly validate a plugin.json (or a plugin directory holding one)
    Validate {
        #[arg(value_name = "FILE|DIR")]
        path: PathBuf,
    },
    /// Start the worker, run the handshake, print verified, declared and effective capabilities
    Inspect {
        /// A plugin directory, or the driver key of a built-in provider
        #[arg(value_name = "DIR|BUILTIN")]
        dir: PathBuf,
    },
    /// Run the provider conformance suite against the live worker
    Check {
        /// A plugin directory, or the driver key of a built-in provider
        #[arg(value_name = "DIR|BUILTIN")]
        dir: PathBuf,
        /// The driver to check (default: the first sandbox_provider driver)
        #[arg(long, value_name = "KEY")]
        driver: Option<String>,
        /// Provider config sent with every call, as a JSON object
        #[arg(long, value_name = "JSON")]
        config: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum TemplateCmd {
    /// Validate a template.yaml and print its name and effective capabilities
    Check {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = cli.global.json;
    let g = sandbox::Globals {
        home: cli.global.home.clone(),
        plugin_dirs: cli.global.plugin_dirs.clone(),
        json,
    };
    let result = match cli.command {
        Command::Run {
            sandbox: s,
            put,
            get,
            command,
        } => {
            let spec = sandbox::SandboxSpec {
                template: s.template,
                provider: s.provider,
                config: s.config,
                ttl: None,
            };
            sandbox::run(&g, &spec, &command.spec(), &put, &get)
        }
        Command::Create { sandbox: s, ttl } => {
            let spec = sandbox::SandboxSpec {
                template: s.template,
                provider: s.provider,
                config: s.config,
                ttl,
            };
            sandbox::create(&g, &spec)
        }
        Command::Exec { id, command } => sandbox::exec_in(&g, &id, &command.spec()),
        Command::Cp { src, dst } => sandbox::cp(&g, &src, &dst),
        Command::Ls => sandbox::ls(&g),
        Command::Kill { ids } => sandbox::kill(&g, &ids),
        Command::Capabilities(CapabilitiesCmd::Explain { scenario }) => {
            inspect::capabilities_explain(&scenario)
        }
        Command::Plugin(PluginCmd::Validate { path }) => inspect::plugin_validate(&path, json),
        Command::Template(TemplateCmd::Check { file }) => inspect::template_check(&file),
        Command::Plugin(PluginCmd::Inspect { dir }) => plugins::inspect(&dir),
        Command::Plugin(PluginCmd::Check {
            dir,
            driver,
            config,
        }) => plugins::check(&dir, driver, config.as_deref(), json),
        Command::Providers => plugins::providers(&cli.global.plugin_dirs, json),
    };
    match result {
        Ok(code) => code,
        Err(failure) => failure.report(json),
    }
}

impl Failure {
    fn report(self, json: bool) -> ExitCode {
        output::print_failure(&self, json);
        ExitCode::from(self.exit_code())
    }
}
