//! The `sandhost` command line. The names and shapes of its commands are a
//! contract (docs: ../shared/design/CLI.md); anyhow is used only here.
#![forbid(unsafe_code)]

mod builtins;
mod inspect;
mod output;
mod plugins;

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

#[derive(Debug, Subcommand)]
enum Command {
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
        #[arg(value_name = "DIR")]
        dir: PathBuf,
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
    let result = match cli.command {
        Command::Capabilities(CapabilitiesCmd::Explain { scenario }) => {
            inspect::capabilities_explain(&scenario)
        }
        Command::Plugin(PluginCmd::Validate { path }) => inspect::plugin_validate(&path, json),
        Command::Template(TemplateCmd::Check { file }) => inspect::template_check(&file),
        Command::Plugin(PluginCmd::Inspect { dir }) => plugins::inspect(&dir),
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
