//! Running a command on a lease: the output path and the session mode are
//! chosen from the capability snapshot and nothing else.
//!
//! | snapshot | output path |
//! |---|---|
//! | incrementalSessionOutput | [`OutputPath::Stream`]: `execute.log` chunks as they come |
//! | else persistentProcessSessions and independentControlCommands | [`OutputPath::Poll`]: output redirected to files inside the sandbox, polled by one-shot control commands beside the running command |
//! | else | [`OutputPath::Once`]: the command runs once, its output is delivered at the end |
//!
//! The command shares the lease's persistent session when
//! persistentProcessSessions is effective, else it runs one-shot
//! (`bypassSession: true`). Every path yields the same bytes, exit status
//! and timeout flag for the same command; only when the caller sees output
//! differs.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use sandhost_contract::ProviderCapability;
use sandhost_protocol::{ExecuteResult, LogStream};

use crate::context::{shell_quote, LeaseContext, RawExec};
use crate::store::new_id;
use crate::worker::WorkerError;

/// What to run.
#[derive(Debug, Clone, Default)]
pub struct ExecRequest {
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub stdin: Option<String>,
    pub timeout: Option<Duration>,
    /// Run beside the lease's session (one-shot) even when sessions are
    /// effective: for long-running or background commands, which would
    /// otherwise hold the session and make every later command wait.
    pub beside_session: bool,
}

/// Where output goes as it is produced.
pub trait OutputSink: Send {
    fn stdout(&mut self, chunk: &str);
    fn stderr(&mut self, chunk: &str);
}

/// A sink that keeps everything (tests, the SDK's run-to-completion).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Collected {
    pub stdout: String,
    pub stderr: String,
    /// Number of deliveries, to tell streaming from one final delivery.
    pub deliveries: usize,
}

impl OutputSink for Collected {
    fn stdout(&mut self, chunk: &str) {
        self.stdout.push_str(chunk);
        self.deliveries += 1;
    }
    fn stderr(&mut self, chunk: &str) {
        self.stderr.push_str(chunk);
        self.deliveries += 1;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputPath {
    Stream,
    Poll,
    Once,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionMode {
    Session,
    OneShot,
}

/// How a command ended, and which paths carried it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutcome {
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub timed_out: bool,
    pub output_path: OutputPath,
    pub session: SessionMode,
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("empty command")]
    EmptyCommand,
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error("output poll of the running command failed: {detail}")]
    Poll { detail: String },
}

impl ExecError {
    pub fn code(&self) -> sandhost_contract::ErrorCode {
        match self {
            Self::EmptyCommand => sandhost_contract::ErrorCode("E3001"),
            Self::Worker(w) => w.code(),
            Self::Poll { .. } => sandhost_contract::ErrorCode("E3002"),
        }
    }
}

/// The output path this snapshot selects.
pub fn output_path(ctx: &LeaseContext) -> OutputPath {
    let s = &ctx.snapshot;
    if s.allows(ProviderCapability::IncrementalSessionOutput) {
        OutputPath::Stream
    } else if s.allows(ProviderCapability::PersistentProcessSessions)
        && s.allows(ProviderCapability::IndependentControlCommands)
    {
        OutputPath::Poll
    } else {
        OutputPath::Once
    }
}

/// The session mode this snapshot selects.
pub fn session_mode(ctx: &LeaseContext) -> SessionMode {
    if ctx
        .snapshot
        .allows(ProviderCapability::PersistentProcessSessions)
    {
        SessionMode::Session
    } else {
        SessionMode::OneShot
    }
}

/// Run `req` on the lease, delivering output to `sink` by the selected path.
pub async fn exec(
    ctx: &LeaseContext,
    req: &ExecRequest,
    sink: &mut dyn OutputSink,
) -> Result<ExecOutcome, ExecError> {
    if req.argv.is_empty() || req.argv[0].is_empty() {
        return Err(ExecError::EmptyCommand);
    }
    let path = output_path(ctx);
    let session = if req.beside_session {
        SessionMode::OneShot
    } else {
        session_mode(ctx)
    };
    let raw = RawExec {
        command: req.argv[0].clone(),
        args: req.argv[1..].to_vec(),
        cwd: req.cwd.clone(),
        env: req.env.clone(),
        stdin: req.stdin.clone(),
        timeout: req.timeout,
        bypass_session: session == SessionMode::OneShot,
    };
    let result = match path {
        OutputPath::Stream => stream(ctx, &raw, sink).await?,
        OutputPath::Poll => poll(ctx, &raw, sink).await?,
        OutputPath::Once => {
            let r = ctx.execute(&raw, |_| {}).await?;
            deliver(sink, &r.stdout, &r.stderr);
            r
        }
    };
    Ok(ExecOutcome {
        exit_code: result.exit_code,
        signal: result.signal,
        timed_out: result.timed_out,
        output_path: path,
        session,
    })
}

fn deliver(sink: &mut dyn OutputSink, out: &str, err: &str) {
    if !out.is_empty() {
        sink.stdout(out);
    }
    if !err.is_empty() {
        sink.stderr(err);
    }
}

/// Streaming: chunks as they come; whatever the final result holds beyond
/// what was streamed (a provider that streamed nothing) is delivered last.
async fn stream(
    ctx: &LeaseContext,
    raw: &RawExec,
    sink: &mut dyn OutputSink,
) -> Result<ExecuteResult, ExecError> {
    let mut seen_out = String::new();
    let mut seen_err = String::new();
    let r = ctx
        .execute(raw, |log| match log.stream {
            LogStream::Stdout => {
                sink.stdout(&log.chunk);
                seen_out.push_str(&log.chunk);
            }
            LogStream::Stderr => {
                sink.stderr(&log.chunk);
                seen_err.push_str(&log.chunk);
            }
        })
        .await?;
    let rest = |all: &str, seen: &str| -> String {
        all.strip_prefix(seen)
            .map(str::to_string)
            .unwrap_or_default()
    };
    deliver(
        sink,
        &rest(&r.stdout, &seen_out),
        &rest(&r.stderr, &seen_err),
    );
    Ok(r)
}

/// Polling: the command runs with its output redirected to files inside the
/// sandbox; one-shot control commands beside it read what is new.
async fn poll(
    ctx: &LeaseContext,
    raw: &RawExec,
    sink: &mut dyn OutputSink,
) -> Result<ExecuteResult, ExecError> {
    let dir = format!("/tmp/.sandhost-run-{}", new_id("out"));
    let (out, err) = (format!("{dir}/stdout"), format!("{dir}/stderr"));
    let words: Vec<String> = std::iter::once(&raw.command)
        .chain(&raw.args)
        .map(|w| shell_quote(w))
        .collect();
    let prep = ctx
        .sh(
            &format!(
                "mkdir -p {d} && : > {o} && : > {e}",
                d = shell_quote(&dir),
                o = shell_quote(&out),
                e = shell_quote(&err)
            ),
            None,
        )
        .await?;
    if prep.exit_code != Some(0) {
        return Err(ExecError::Poll {
            detail: format!("cannot prepare output files: {}", prep.stderr.trim()),
        });
    }
    let wrapped = RawExec {
        command: "sh".into(),
        args: vec![
            "-c".into(),
            format!(
                "{} > {} 2> {}",
                words.join(" "),
                shell_quote(&out),
                shell_quote(&err)
            ),
        ],
        ..raw.clone()
    };
    let main = ctx.execute(&wrapped, |_| {});
    tokio::pin!(main);
    let (mut off_out, mut off_err) = (0usize, 0usize);
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    let result = loop {
        tokio::select! {
            r = &mut main => break r?,
            _ = tick.tick() => {
                poll_once(ctx, &out, &err, &mut off_out, &mut off_err, sink).await?;
            }
        }
    };
    // drain what was written after the last tick, then clean up
    while poll_once(ctx, &out, &err, &mut off_out, &mut off_err, sink).await? > 0 {}
    let _ = ctx.sh(&format!("rm -rf {}", shell_quote(&dir)), None).await;
    Ok(ExecuteResult {
        stdout: String::new(),
        stderr: String::new(),
        ..result
    })
}

async fn poll_once(
    ctx: &LeaseContext,
    out: &str,
    err: &str,
    off_out: &mut usize,
    off_err: &mut usize,
    sink: &mut dyn OutputSink,
) -> Result<usize, ExecError> {
    // base64 keeps the two streams apart and binary-safe through JSON
    let script = format!(
        "tail -c +{} {} | head -c {POLL_READ} | base64; echo .; tail -c +{} {} | head -c {POLL_READ} | base64",
        *off_out + 1,
        shell_quote(out),
        *off_err + 1,
        shell_quote(err)
    );
    let r = ctx.sh(&script, None).await?;
    let (a, b) = r
        .stdout
        .split_once("\n.\n")
        .or_else(|| r.stdout.strip_prefix(".\n").map(|rest| ("", rest)))
        .ok_or_else(|| ExecError::Poll {
            detail: format!("unexpected poll answer: {:?}", r.stderr.trim()),
        })?;
    let decode = |s: &str| -> Result<Vec<u8>, ExecError> {
        let clean: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        base64::engine::general_purpose::STANDARD
            .decode(clean)
            .map_err(|e| ExecError::Poll {
                detail: e.to_string(),
            })
    };
    let (o, e) = (complete_utf8(decode(a)?), complete_utf8(decode(b)?));
    *off_out += o.len();
    *off_err += e.len();
    deliver(
        sink,
        &String::from_utf8_lossy(&o),
        &String::from_utf8_lossy(&e),
    );
    Ok(o.len() + e.len())
}

/// Drop a multi-byte character cut at the end of a read: the next poll reads
/// it whole (the offset only advances past what is returned).
fn complete_utf8(mut bytes: Vec<u8>) -> Vec<u8> {
    if let Err(e) = std::str::from_utf8(&bytes) {
        if e.error_len().is_none() {
            bytes.truncate(e.valid_up_to());
        }
    }
    bytes
}

/// The most one poll reads of each stream: its base64 answer stays well
/// under any provider's output cap (the local provider keeps 1 MiB).
const POLL_READ: usize = 256 * 1024;
