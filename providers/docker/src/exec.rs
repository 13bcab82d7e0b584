//! Commands in a lease through exec instances.
//!
//! Every command runs under a tiny `sh` wrapper that records its pid in
//! `/tmp/.sandhost/<token>.pid` (the exec process leads its own process group
//! and session inside the container), because the Engine API cannot signal an
//! exec. A timeout kills that group from a second exec (`kill -KILL -PID`).
//!
//! Sessions: see [`session_script`]. The persistent session's state (cwd and
//! exported variables) lives in files inside the container, so any worker
//! process reaches the same session.

use std::time::Duration;

use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::Docker;
use futures_util::StreamExt;
use sandhost_protocol::LogStream;
use sandhost_provider::ExecuteSink;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use crate::error::{DockerError, Result};

/// Where pid files live inside the container.
pub const STATE_DIR: &str = "/tmp/.sandhost";
/// Default cap of captured bytes per stream.
pub const DEFAULT_OUTPUT_CAP: usize = 4 << 20;
/// How long draining may go on after a timeout kill.
const KILL_GRACE: Duration = Duration::from_secs(3);

/// One command to run.
#[derive(Debug, Clone, Default)]
pub struct ExecSpec {
    /// The full argv given to the engine (wrapper included).
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub stdin: Option<Vec<u8>>,
    pub timeout: Option<Duration>,
    /// The pid-file token, when the argv is a wrapper that writes one.
    pub token: Option<String>,
    pub output_cap: usize,
    pub user: Option<String>,
}

/// What a command did.
#[derive(Debug, Clone, Default)]
pub struct ExecOutcome {
    pub exit_code: Option<i64>,
    pub timed_out: bool,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub stdout_dropped: u64,
    pub stderr_dropped: u64,
}

/// A fresh token for pid files and temp names.
pub fn token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Quote for a POSIX shell.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// A one-shot wrapper: `$0` token, `$1` cwd, then the argv.
const ONESHOT: &str = r#"__p=/tmp/.sandhost/$0.pid
mkdir -p /tmp/.sandhost 2>/dev/null; echo $$ > "$__p" 2>/dev/null
cd -- "$1" || { rm -f "$__p"; exit 126; }
shift
"$@"
__rc=$?
rm -f "$__p"
exit $__rc"#;

/// argv of a one-shot command.
pub fn oneshot_argv(token: &str, cwd: &str, argv: &[String]) -> Vec<String> {
    let mut v = vec![
        "sh".to_string(),
        "-c".to_string(),
        ONESHOT.to_string(),
        token.to_string(),
        cwd.to_string(),
    ];
    v.extend(argv.iter().cloned());
    v
}

/// The session wrapper. `$0` token, `$1` default dir, `$2` requested cwd (or
/// empty), `$3` the body, then `K=V` pairs of the request env.
///
/// The state lives in `/tmp/.sandhost/session/{cwd,env}`: the wrapper sources
/// the saved exports, enters the saved directory, applies the request env for
/// this command only, `eval`s the body in the wrapper shell itself (so `cd`
/// and `export` act on the session) and, from an EXIT trap (which also runs on
/// `exit N`), restores the request env and saves `pwd` and `export -p`
/// atomically (temp file + `mv`). A command given an explicit cwd runs there
/// without moving the session: its directory changes are not saved.
const SESSION: &str = r#"__sandhost_s=/tmp/.sandhost/session
__sandhost_p=/tmp/.sandhost/$0.pid
mkdir -p "$__sandhost_s" 2>/dev/null; echo $$ > "$__sandhost_p" 2>/dev/null
if [ -f "$__sandhost_s/env" ]; then . "$__sandhost_s/env"; fi
__sandhost_d=$1
if [ -f "$__sandhost_s/cwd" ]; then IFS= read -r __sandhost_d < "$__sandhost_s/cwd" || __sandhost_d=$1; fi
cd -- "$__sandhost_d" 2>/dev/null || cd -- "$1" 2>/dev/null
__sandhost_cwd=$2
__sandhost_body=$3
shift 3
__sandhost_keys=
for __sandhost_kv in "$@"; do
  __sandhost_k=${__sandhost_kv%%=*}
  eval "__sandhost_had_$__sandhost_k=\${$__sandhost_k+x}; __sandhost_old_$__sandhost_k=\${$__sandhost_k-}"
  export "$__sandhost_kv"
  __sandhost_keys="$__sandhost_keys $__sandhost_k"
done
__sandhost_save() {
  __sandhost_rc=$?
  for __sandhost_k in $__sandhost_keys; do
    eval "if [ -n \"\$__sandhost_had_$__sandhost_k\" ]; then export $__sandhost_k=\"\$__sandhost_old_$__sandhost_k\"; else unset $__sandhost_k; fi"
  done
  if [ -z "$__sandhost_cwd" ]; then pwd > "$__sandhost_s/cwd.$$" 2>/dev/null && mv -f "$__sandhost_s/cwd.$$" "$__sandhost_s/cwd"; fi
  export -p > "$__sandhost_s/env.$$" 2>/dev/null && mv -f "$__sandhost_s/env.$$" "$__sandhost_s/env"
  rm -f "$__sandhost_p"
  exit $__sandhost_rc
}
trap __sandhost_save EXIT
if [ -n "$__sandhost_cwd" ]; then cd -- "$__sandhost_cwd" || exit 126; fi
set --
eval "$__sandhost_body""#;

/// argv of a session command.
pub fn session_argv(
    token: &str,
    workdir: &str,
    cwd: Option<&str>,
    body: &str,
    env: &[(String, String)],
) -> Vec<String> {
    let mut v = vec![
        "sh".to_string(),
        "-c".to_string(),
        SESSION.to_string(),
        token.to_string(),
        workdir.to_string(),
        cwd.unwrap_or("").to_string(),
        body.to_string(),
    ];
    v.extend(env.iter().map(|(k, val)| format!("{k}={val}")));
    v
}

/// The session body of a command: the script of `sh -c SCRIPT`, else the
/// quoted argv.
pub fn session_body(command: &str, args: &[String]) -> String {
    let is_sh = matches!(command, "sh" | "/bin/sh");
    if is_sh && args.len() == 2 && args[0] == "-c" {
        return args[1].clone();
    }
    std::iter::once(command)
        .chain(args.iter().map(String::as_str))
        .map(sh_quote)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Decodes a byte stream into UTF-8 chunks without splitting a character.
#[derive(Debug, Default)]
pub struct Utf8Chunker {
    pending: Vec<u8>,
}

impl Utf8Chunker {
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let rest = self.pending.split_off(valid);
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending = rest;
        out
    }

    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

/// Create and start an attached exec; returns its id and the attached ends.
pub async fn start(
    docker: &Docker,
    container: &str,
    argv: Vec<String>,
    env: Vec<String>,
    stdin: bool,
    tty: bool,
    user: Option<String>,
) -> Result<(String, StartExecResults)> {
    let created = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdin: Some(stdin),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                tty: Some(tty),
                env: Some(env),
                cmd: Some(argv),
                user,
                ..Default::default()
            },
        )
        .await
        .map_err(DockerError::engine("create exec"))?;
    let started = docker
        .start_exec(
            &created.id,
            Some(StartExecOptions {
                detach: false,
                tty,
                output_capacity: Some(64 * 1024),
            }),
        )
        .await
        .map_err(DockerError::engine("start exec"))?;
    Ok((created.id, started))
}

/// The exit code of a finished exec (waits briefly for the engine to notice).
pub async fn exit_code(docker: &Docker, exec_id: &str) -> Result<Option<i64>> {
    for _ in 0..100 {
        let i = docker
            .inspect_exec(exec_id)
            .await
            .map_err(DockerError::engine("inspect exec"))?;
        if i.running != Some(true) {
            return Ok(i.exit_code);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(None)
}

/// Kill the process group recorded under `token`, from a second exec.
pub async fn kill_token(docker: &Docker, container: &str, token: &str) -> Result<()> {
    let script = r#"f=/tmp/.sandhost/$0.pid; i=0
while [ ! -s "$f" ] && [ $i -lt 40 ]; do sleep 0.05; i=$((i+1)); done
p=$(cat "$f" 2>/dev/null) || exit 0
[ -n "$p" ] || exit 0
kill -KILL -"$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null
rm -f "$f"; exit 0"#;
    let argv = vec!["sh".into(), "-c".into(), script.into(), token.into()];
    let (_, started) = start(docker, container, argv, vec![], false, false, None).await?;
    if let StartExecResults::Attached { mut output, .. } = started {
        let drain = async { while output.next().await.is_some() {} };
        let _ = tokio::time::timeout(Duration::from_secs(10), drain).await;
    }
    Ok(())
}

/// Run a command to completion, streaming output to `sink` when given.
pub async fn run(
    docker: &Docker,
    container: &str,
    spec: ExecSpec,
    sink: Option<&ExecuteSink>,
) -> Result<ExecOutcome> {
    let cap = if spec.output_cap == 0 {
        DEFAULT_OUTPUT_CAP
    } else {
        spec.output_cap
    };
    let (exec_id, started) = start(
        docker,
        container,
        spec.argv.clone(),
        spec.env.clone(),
        spec.stdin.is_some(),
        false,
        spec.user.clone(),
    )
    .await?;
    let StartExecResults::Attached {
        mut output,
        mut input,
    } = started
    else {
        return Err(DockerError::ExecFailed(
            "the engine detached the exec".into(),
        ));
    };
    let writer = match spec.stdin.clone() {
        Some(bytes) => Some(tokio::spawn(async move {
            let _ = input.write_all(&bytes).await;
            let _ = input.flush().await;
            let _ = input.shutdown().await;
            // keep the write half alive until the output ends
            input
        })),
        None => {
            drop(input);
            None
        }
    };
    let mut out = ExecOutcome::default();
    let mut chunk_out = Utf8Chunker::default();
    let mut chunk_err = Utf8Chunker::default();
    let mut deadline = spec.timeout.map(|t| Instant::now() + t);
    let mut killed = false;
    loop {
        let next = match deadline {
            Some(d) => match tokio::time::timeout_at(d, output.next()).await {
                Ok(n) => n,
                Err(_) => {
                    if killed {
                        tracing::warn!(exec = %exec_id, "output did not end after the kill");
                        break;
                    }
                    killed = true;
                    out.timed_out = true;
                    deadline = Some(Instant::now() + KILL_GRACE);
                    if let Some(t) = &spec.token {
                        if let Err(e) = kill_token(docker, container, t).await {
                            tracing::warn!("cannot kill timed-out command: {e}");
                        }
                    }
                    continue;
                }
            },
            None => output.next().await,
        };
        let Some(item) = next else { break };
        let item = match item {
            Ok(i) => i,
            Err(e) => {
                tracing::debug!("exec stream ended: {e}");
                break;
            }
        };
        let (stream, bytes) = match item {
            bollard::container::LogOutput::StdOut { message }
            | bollard::container::LogOutput::Console { message } => (LogStream::Stdout, message),
            bollard::container::LogOutput::StdErr { message } => (LogStream::Stderr, message),
            bollard::container::LogOutput::StdIn { .. } => continue,
        };
        let (buf, dropped, chunker) = match stream {
            LogStream::Stdout => (&mut out.stdout, &mut out.stdout_dropped, &mut chunk_out),
            LogStream::Stderr => (&mut out.stderr, &mut out.stderr_dropped, &mut chunk_err),
        };
        let room = cap.saturating_sub(buf.len());
        let take = room.min(bytes.len());
        buf.extend_from_slice(&bytes[..take]);
        *dropped += (bytes.len() - take) as u64;
        if let (Some(sink), true) = (sink, take > 0) {
            let text = chunker.push(&bytes[..take]);
            if !text.is_empty() {
                let _ = sink.log(stream, text).await;
            }
        }
    }
    if let Some(sink) = sink {
        let rest = chunk_out.finish();
        if !rest.is_empty() {
            let _ = sink.stdout(rest).await;
        }
        let rest = chunk_err.finish();
        if !rest.is_empty() {
            let _ = sink.stderr(rest).await;
        }
    }
    if let Some(w) = writer {
        w.abort();
    }
    out.exit_code = exit_code(docker, &exec_id).await?;
    if out.timed_out {
        out.exit_code = None;
    }
    Ok(out)
}

/// Run `sh -c script args...` (no wrapper) and require exit 0; its stdout.
pub async fn sh_ok(
    docker: &Docker,
    container: &str,
    script: &str,
    args: &[&str],
) -> Result<String> {
    let mut argv = vec![
        "sh".to_string(),
        "-c".to_string(),
        script.to_string(),
        "sh".to_string(),
    ];
    argv.extend(args.iter().map(|s| s.to_string()));
    let out = run(
        docker,
        container,
        ExecSpec {
            argv,
            timeout: Some(Duration::from_secs(60)),
            ..Default::default()
        },
        None,
    )
    .await?;
    if out.exit_code != Some(0) {
        return Err(DockerError::SyncFailed(format!(
            "in-container step exited {:?}: {}",
            out.exit_code,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_chunks_never_split_a_character() {
        let mut c = Utf8Chunker::default();
        let s = "é€";
        let b = s.as_bytes();
        let mut got = c.push(&b[..1]);
        got += &c.push(&b[1..3]);
        got += &c.push(&b[3..]);
        got += &c.finish();
        assert_eq!(got, s);
    }

    #[test]
    fn session_body_unwraps_sh_c() {
        assert_eq!(session_body("sh", &["-c".into(), "cd /x".into()]), "cd /x");
        assert_eq!(session_body("echo", &["a b".into()]), "'echo' 'a b'");
    }
}
