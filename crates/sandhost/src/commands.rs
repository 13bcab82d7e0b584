//! The `shell` capability: run commands to completion, or spawn them with a
//! handle that streams their output.

use std::collections::BTreeMap;
use std::time::Duration;

use sandhost_contract::CommandCapability;
use sandhost_runtime::context::shell_quote;
use sandhost_runtime::exec::{exec, ExecRequest, OutputSink};
use sandhost_runtime::store::new_id;
use tokio::sync::mpsc;

use crate::{Error, Sandbox};

/// Options of one command.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    /// Standard input, given whole when the command starts.
    pub stdin: Option<String>,
    pub timeout: Option<Duration>,
}

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommandOutput {
    pub stdout: String,
    pub stderr: String,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub timed_out: bool,
}

impl CommandOutput {
    pub fn success(&self) -> bool {
        self.exit_code == Some(0) && !self.timed_out
    }
}

/// What a spawned command sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandEvent {
    Stdout(String),
    Stderr(String),
    /// The last event: how the command ended (output fields empty: it came
    /// as events).
    Exit(CommandOutput),
    /// The command could not run or finish; the last event.
    Failed {
        code: String,
        message: String,
    },
}

/// Run commands in a sandbox.
#[derive(Debug, Clone)]
pub struct Commands {
    sandbox: Sandbox,
}

struct Collect(CommandOutput);

impl OutputSink for Collect {
    fn stdout(&mut self, chunk: &str) {
        self.0.stdout.push_str(chunk);
    }
    fn stderr(&mut self, chunk: &str) {
        self.0.stderr.push_str(chunk);
    }
}

struct Forward(mpsc::UnboundedSender<CommandEvent>);

impl OutputSink for Forward {
    fn stdout(&mut self, chunk: &str) {
        let _ = self.0.send(CommandEvent::Stdout(chunk.to_string()));
    }
    fn stderr(&mut self, chunk: &str) {
        let _ = self.0.send(CommandEvent::Stderr(chunk.to_string()));
    }
}

fn request(argv: &[&str], opts: &RunOptions) -> ExecRequest {
    ExecRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        cwd: opts.cwd.clone(),
        env: opts.env.clone(),
        stdin: opts.stdin.clone(),
        timeout: opts.timeout,
        beside_session: false,
    }
}

impl Commands {
    pub(crate) fn new(sandbox: Sandbox) -> Self {
        Self { sandbox }
    }

    /// Run `argv` to completion.
    pub async fn run(&self, argv: &[&str], opts: RunOptions) -> Result<CommandOutput, Error> {
        self.sandbox.gate(CommandCapability::Shell)?;
        let mut sink = Collect(CommandOutput::default());
        let o = exec(
            &self.sandbox.runtime().ctx,
            &request(argv, &opts),
            &mut sink,
        )
        .await?;
        Ok(CommandOutput {
            exit_code: o.exit_code,
            signal: o.signal,
            timed_out: o.timed_out,
            ..sink.0
        })
    }

    /// Start `argv` and return at once with a handle that streams its
    /// output. Dropping the handle detaches: the command keeps running.
    pub async fn spawn(&self, argv: &[&str], opts: RunOptions) -> Result<CommandHandle, Error> {
        self.sandbox.gate(CommandCapability::Shell)?;
        if argv.is_empty() {
            return Err(Error::Exec(Box::new(
                sandhost_runtime::exec::ExecError::EmptyCommand,
            )));
        }
        // the wrapper records its pid (exec keeps it) so kill can find it
        let pidfile = format!("/tmp/.sandhost-spawn-{}.pid", new_id("p"));
        let script = format!("echo $$ > {}; exec \"$@\"", shell_quote(&pidfile));
        let mut wrapped = vec!["sh", "-c", &script, "sh"];
        wrapped.extend_from_slice(argv);
        // beside the session: a long-running spawn must not hold the
        // session shell that later `run` calls share
        let req = ExecRequest {
            beside_session: true,
            ..request(&wrapped, &opts)
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let ctx = self.sandbox.runtime().ctx.clone();
        tokio::spawn(async move {
            let mut sink = Forward(tx.clone());
            let ev = match exec(&ctx, &req, &mut sink).await {
                Ok(o) => CommandEvent::Exit(CommandOutput {
                    exit_code: o.exit_code,
                    signal: o.signal,
                    timed_out: o.timed_out,
                    ..CommandOutput::default()
                }),
                Err(e) => CommandEvent::Failed {
                    code: e.code().to_string(),
                    message: e.to_string(),
                },
            };
            let _ = tx.send(ev);
        });
        Ok(CommandHandle {
            sandbox: self.sandbox.clone(),
            rx,
            pidfile,
        })
    }
}

/// A running command. Dropping it detaches (the command is not killed).
#[derive(Debug)]
pub struct CommandHandle {
    sandbox: Sandbox,
    rx: mpsc::UnboundedReceiver<CommandEvent>,
    pidfile: String,
}

impl CommandHandle {
    /// The next event; `None` after the last one.
    pub async fn next(&mut self) -> Option<CommandEvent> {
        self.rx.recv().await
    }

    /// Wait for the end, collecting the output.
    pub async fn wait(mut self) -> Result<CommandOutput, Error> {
        let mut out = CommandOutput::default();
        while let Some(ev) = self.rx.recv().await {
            match ev {
                CommandEvent::Stdout(s) => out.stdout.push_str(&s),
                CommandEvent::Stderr(s) => out.stderr.push_str(&s),
                CommandEvent::Exit(o) => {
                    return Ok(CommandOutput {
                        stdout: out.stdout,
                        stderr: out.stderr,
                        ..o
                    })
                }
                CommandEvent::Failed { code, message } => {
                    return Err(Error::Remote {
                        what: "spawned command",
                        exit: code,
                        stderr: message,
                    })
                }
            }
        }
        Err(Error::Remote {
            what: "spawned command",
            exit: "unknown".into(),
            stderr: "no result".into(),
        })
    }

    /// Send SIGTERM, then SIGKILL after `grace`, to the command's process
    /// group (workers start each command as a group leader), else to its
    /// pid; sent by an independent control command beside it.
    pub async fn kill(&self, grace: Duration) -> Result<(), Error> {
        let pf = shell_quote(&self.pidfile);
        let secs = grace.as_secs_f64().max(0.0);
        let script = format!(
            "i=0; while [ ! -s {pf} ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done; \
             p=$(cat {pf} 2>/dev/null) || exit 0; \
             kill -TERM \"-$p\" 2>/dev/null || kill -TERM \"$p\" 2>/dev/null || exit 0; \
             sleep {secs}; kill -KILL \"-$p\" 2>/dev/null || kill -KILL \"$p\" 2>/dev/null; exit 0"
        );
        let r = self.sandbox.runtime().ctx.sh(&script, None).await?;
        if r.exit_code != Some(0) {
            return Err(Error::Remote {
                what: "kill",
                exit: format!("{:?}", r.exit_code),
                stderr: r.stderr,
            });
        }
        Ok(())
    }
}
