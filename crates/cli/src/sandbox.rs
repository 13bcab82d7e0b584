//! The sandbox commands: run, create, exec, ls, kill.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use sandhost_contract::resolve::LeasePolicy;
use sandhost_contract::template::{parse_template, Template};
use sandhost_contract::CommandCapability;
use sandhost_runtime::exec::{exec, ExecOutcome, ExecRequest, OutputSink};
use sandhost_runtime::host::{CreateRequest, Host, HostConfig, HostError, Sandbox};
use sandhost_runtime::transfer::{
    self, TransferError, TransferLimits, TransferPath, TransferReport,
};
use sandhost_runtime::worker::WorkerOptions;
use serde_json::{json, Value};

use crate::output::Failure;
use crate::plugins::{registry, runtime};

/// Exit status when the command timed out (as `timeout(1)`).
pub const EXIT_TIMED_OUT: u8 = 124;

/// Options every sandbox command shares.
#[derive(Debug, Clone)]
pub struct Globals {
    pub home: Option<PathBuf>,
    pub plugin_dirs: Vec<PathBuf>,
    pub json: bool,
}

/// How to make a sandbox.
#[derive(Debug, Clone, Default)]
pub struct SandboxSpec {
    pub template: Option<String>,
    pub provider: Option<String>,
    pub config: Option<String>,
    pub ttl: Option<u64>,
}

/// One command to run.
#[derive(Debug, Clone, Default)]
pub struct CommandSpec {
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub cwd: Option<String>,
    pub timeout: Option<u64>,
}

pub fn host_failure(e: HostError) -> Failure {
    Failure::Tool {
        code: e.code().as_str(),
        message: e.to_string(),
        suggestion: e.suggestion(),
    }
}

fn usage(message: String) -> Failure {
    Failure::Tool {
        code: "E9003",
        message,
        suggestion: Some("see `sandhost --help`".into()),
    }
}

/// The state directory: --home, else $SANDHOST_HOME (clap reads it), else
/// the user's data directory.
pub fn home_dir(g: &Globals) -> Result<PathBuf, Failure> {
    if let Some(h) = &g.home {
        return Ok(h.clone());
    }
    dirs::data_dir().map(|d| d.join("sandhost")).ok_or_else(|| {
        usage("cannot tell the user's data directory; pass --home or set SANDHOST_HOME".into())
    })
}

pub async fn open_host(g: &Globals) -> Result<Host, Failure> {
    let cfg = HostConfig {
        home: home_dir(g)?,
        registry: registry(&g.plugin_dirs),
        worker_options: WorkerOptions::default(),
    };
    Host::open(cfg).await.map_err(host_failure)
}

/// `--template FILE|NAME`: a file, else `default` (the built-in).
fn load_template(arg: Option<&str>) -> Result<(Template, String), Failure> {
    match arg {
        None | Some("default") => {
            let t = Template::builtin();
            Ok((t, "name: default\n".into()))
        }
        Some(path) => {
            let p = Path::new(path);
            let file = if p.is_dir() {
                p.join("template.yaml")
            } else {
                p.to_path_buf()
            };
            let text = std::fs::read_to_string(&file)
                .map_err(|e| Failure::read(&file.display().to_string(), e))?;
            let t = parse_template(&text)?;
            Ok((t, text))
        }
    }
}

fn parse_env(pairs: &[String]) -> Result<BTreeMap<String, String>, Failure> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
            _ => Err(usage(format!("--env takes KEY=VALUE, got `{p}`"))),
        })
        .collect()
}

fn parse_config(c: Option<&str>) -> Result<Value, Failure> {
    match c {
        None => Ok(json!({})),
        Some(s) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => Ok(v),
            Ok(_) => Err(usage("--config must be a JSON object".into())),
            Err(e) => Err(usage(format!("--config is not valid JSON: {e}"))),
        },
    }
}

pub async fn create_sandbox(
    host: &Host,
    spec: &SandboxSpec,
    policy: LeasePolicy,
) -> Result<Sandbox, Failure> {
    let (template, template_yaml) = load_template(spec.template.as_deref())?;
    let req = CreateRequest {
        template,
        template_yaml,
        provider: spec.provider.clone(),
        config: parse_config(spec.config.as_deref())?,
        ttl: spec.ttl.map(Duration::from_secs),
        policy,
    };
    host.create(req).await.map_err(host_failure)
}

/// Writes output to our own stdout/stderr as it arrives.
struct Passthrough;

impl OutputSink for Passthrough {
    fn stdout(&mut self, chunk: &str) {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(chunk.as_bytes());
        let _ = o.flush();
    }
    fn stderr(&mut self, chunk: &str) {
        let mut e = std::io::stderr().lock();
        let _ = e.write_all(chunk.as_bytes());
        let _ = e.flush();
    }
}

fn signal_number(s: &str) -> u8 {
    if let Ok(n) = s.parse::<u8>() {
        return n;
    }
    match s.trim_start_matches("SIG") {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "ABRT" => 6,
        "KILL" => 9,
        "SEGV" => 11,
        "PIPE" => 13,
        "ALRM" => 14,
        "TERM" => 15,
        "XCPU" => 24,
        "XFSZ" => 25,
        _ => 0,
    }
}

/// The exit status `run`/`exec` ends with, as docker and shells do.
pub fn exit_status(o: &ExecOutcome) -> u8 {
    if o.timed_out {
        return EXIT_TIMED_OUT;
    }
    if let Some(c) = o.exit_code {
        return (c & 0xff) as u8;
    }
    match &o.signal {
        Some(s) => 128u8.saturating_add(signal_number(s)),
        None => 125,
    }
}

/// Run one command in a sandbox, gated on `shell`, streaming its output.
pub async fn run_command(sandbox: &Sandbox, cmd: &CommandSpec) -> Result<ExecOutcome, Failure> {
    sandbox
        .gate(CommandCapability::Shell)
        .map_err(host_failure)?;
    if cmd.argv.is_empty() {
        return Err(usage("no command given: put it after `--`".into()));
    }
    let req = ExecRequest {
        argv: cmd.argv.clone(),
        cwd: cmd.cwd.clone(),
        env: parse_env(&cmd.env)?,
        stdin: None,
        timeout: cmd.timeout.map(Duration::from_secs),
        beside_session: false,
    };
    exec(&sandbox.ctx, &req, &mut Passthrough)
        .await
        .map_err(|e| Failure::Tool {
            code: e.code().as_str(),
            message: e.to_string(),
            suggestion: None,
        })
}

pub fn run(
    g: &Globals,
    spec: &SandboxSpec,
    cmd: &CommandSpec,
    put: &[String],
    get: &[String],
) -> Result<ExitCode, Failure> {
    let puts = put
        .iter()
        .map(|p| split_pair(p, "--put", "LOCAL:REMOTE"))
        .collect::<Result<Vec<_>, _>>()?;
    let gets = get
        .iter()
        .map(|p| split_pair(p, "--get", "REMOTE:LOCAL"))
        .collect::<Result<Vec<_>, _>>()?;
    let rt = runtime()?;
    rt.block_on(async {
        let host = open_host(g).await?;
        let sandbox = create_sandbox(&host, spec, LeasePolicy::Ephemeral).await?;
        let outcome = async {
            for (local, remote) in &puts {
                upload(&sandbox, Path::new(local), remote).await?;
            }
            let outcome = run_command(&sandbox, cmd).await?;
            for (remote, local) in &gets {
                download(&sandbox, remote, Path::new(local)).await?;
            }
            Ok::<_, Failure>(outcome)
        }
        .await;
        let destroyed = host.destroy(&sandbox).await;
        host.shutdown().await;
        let outcome = outcome?;
        destroyed.map_err(host_failure)?;
        Ok(ExitCode::from(exit_status(&outcome)))
    })
}

fn split_pair(s: &str, flag: &str, shape: &str) -> Result<(String, String), Failure> {
    match s.split_once(':') {
        Some((a, b)) if !a.is_empty() && !b.is_empty() => Ok((a.to_string(), b.to_string())),
        _ => Err(usage(format!("{flag} takes {shape}, got `{s}`"))),
    }
}

fn transfer_failure(e: TransferError) -> Failure {
    Failure::Tool {
        code: e.code().as_str(),
        message: e.to_string(),
        suggestion: None,
    }
}

/// A spinner on a terminal; nothing when stderr is piped.
fn spinner(msg: String) -> indicatif::ProgressBar {
    let pb =
        indicatif::ProgressBar::with_draw_target(None, indicatif::ProgressDrawTarget::stderr());
    pb.set_message(msg);
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// Upload, gated on `files`.
pub async fn upload(
    sandbox: &Sandbox,
    local: &Path,
    remote: &str,
) -> Result<TransferReport, Failure> {
    sandbox
        .gate(CommandCapability::Files)
        .map_err(host_failure)?;
    let pb = spinner(format!("uploading {} to {remote}", local.display()));
    let r = transfer::upload(&sandbox.ctx, local, remote, &TransferLimits::default()).await;
    pb.finish_and_clear();
    r.map_err(transfer_failure)
}

/// Download, gated on `files`.
pub async fn download(
    sandbox: &Sandbox,
    remote: &str,
    local: &Path,
) -> Result<TransferReport, Failure> {
    sandbox
        .gate(CommandCapability::Files)
        .map_err(host_failure)?;
    let pb = spinner(format!("downloading {remote} to {}", local.display()));
    let r = transfer::download(&sandbox.ctx, remote, local, &TransferLimits::default()).await;
    pb.finish_and_clear();
    r.map_err(transfer_failure)
}

/// `ID:PATH` names a sandbox path; anything else is local. An id never
/// holds a `/`, so `./a:b` and `/tmp/x:y` stay local.
fn remote_of(arg: &str) -> Option<(&str, &str)> {
    let (id, path) = arg.split_once(':')?;
    (!id.is_empty() && !id.contains('/') && !path.is_empty()).then_some((id, path))
}

pub fn cp(g: &Globals, src: &str, dst: &str) -> Result<ExitCode, Failure> {
    let (id, upload_dir) = match (remote_of(src), remote_of(dst)) {
        (None, Some((id, _))) => (id, true),
        (Some((id, _)), None) => (id, false),
        _ => {
            return Err(usage(
                "cp copies between the host and one sandbox: `cp LOCAL ID:REMOTE` or `cp ID:REMOTE LOCAL`".into(),
            ))
        }
    };
    let rt = runtime()?;
    rt.block_on(async {
        let host = open_host(g).await?;
        let result = async {
            let sandbox = host.connect(id).await.map_err(host_failure)?;
            let report = if upload_dir {
                upload(&sandbox, Path::new(src), remote_of(dst).map(|r| r.1).unwrap_or_default()).await?
            } else {
                download(&sandbox, remote_of(src).map(|r| r.1).unwrap_or_default(), Path::new(dst)).await?
            };
            if g.json {
                println!(
                    "{}",
                    json!({"files": report.files, "bytes": report.bytes,
                           "path": match report.path { TransferPath::Native => "native", TransferPath::Base64Fallback => "base64" }})
                );
            }
            Ok::<_, Failure>(())
        }
        .await;
        host.shutdown().await;
        result?;
        Ok(ExitCode::SUCCESS)
    })
}

pub fn create(g: &Globals, spec: &SandboxSpec) -> Result<ExitCode, Failure> {
    let rt = runtime()?;
    rt.block_on(async {
        let host = open_host(g).await?;
        let sandbox = create_sandbox(&host, spec, LeasePolicy::ReuseByEnvironment).await;
        host.shutdown().await;
        let sandbox = sandbox?;
        if g.json {
            println!("{}", sandbox_json(&sandbox.record));
        } else {
            println!("{}", sandbox.record.id);
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub fn exec_in(g: &Globals, id: &str, cmd: &CommandSpec) -> Result<ExitCode, Failure> {
    let rt = runtime()?;
    rt.block_on(async {
        let host = open_host(g).await?;
        let result = async {
            let sandbox = host.connect(id).await.map_err(host_failure)?;
            if sandbox.outcome == sandhost_runtime::store::LeaseOutcome::Replacement {
                eprintln!(
                    "warning: sandbox {id} was replaced: {}",
                    sandbox.outcome_reason
                );
            }
            run_command(&sandbox, cmd).await
        }
        .await;
        host.shutdown().await;
        Ok(ExitCode::from(exit_status(&result?)))
    })
}

pub fn kill(g: &Globals, ids: &[String]) -> Result<ExitCode, Failure> {
    let rt = runtime()?;
    rt.block_on(async {
        let host = open_host(g).await?;
        let mut result = Ok(ExitCode::SUCCESS);
        for id in ids {
            match host.kill(id).await {
                Ok(()) => println!("{id}"),
                Err(e) => {
                    result = Err(host_failure(e));
                    break;
                }
            }
        }
        host.shutdown().await;
        result
    })
}

fn when(secs: i64) -> String {
    humantime::format_rfc3339_seconds(sandhost_runtime::host::system_time(secs)).to_string()
}

fn sandbox_json(r: &sandhost_runtime::store::SandboxRecord) -> Value {
    json!({
        "id": r.id,
        "provider": r.provider,
        "template": r.template_name,
        "state": r.state,
        "created": when(r.created_at),
        "expires": r.expires_at.map(when),
    })
}

pub fn ls(g: &Globals) -> Result<ExitCode, Failure> {
    let rt = runtime()?;
    rt.block_on(async {
        let host = open_host(g).await?;
        let list = host.list().map_err(host_failure);
        host.shutdown().await;
        let list = list?;
        if g.json {
            let rows: Vec<Value> = list.iter().map(sandbox_json).collect();
            println!("{}", Value::Array(rows));
        } else {
            println!(
                "{:<22} {:<16} {:<18} {:<9} {:<21} EXPIRES",
                "ID", "PROVIDER", "TEMPLATE", "STATE", "CREATED"
            );
            for r in &list {
                println!(
                    "{:<22} {:<16} {:<18} {:<9} {:<21} {}",
                    r.id,
                    r.provider,
                    r.template_name,
                    r.state,
                    when(r.created_at),
                    r.expires_at.map(when).unwrap_or_else(|| "-".into())
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
