//! The duplex channel family of the worker (`duplexChannelOpen`, `Write`,
//! `Resize`, `Stop`, `Close`) on the library's [`PtyChannel`] and
//! [`TcpChannel`].
//!
//! - **Table**: open channels live in a table keyed by a worker-chosen
//!   `channelId` (`pty-<pid>-<n>` / `tcp-<pid>-<n>`, unique within the
//!   worker process); later calls name only the channel. The lease in the
//!   open params picks the sandbox, as for `environmentExecute`. A channel
//!   belongs to the worker process that opened it: when the worker exits its
//!   connections to the init close, and the init kills every channel.
//! - **Pump**: each channel has a dedicated thread reading its events
//!   (blocking) and sending `duplexChannel.data`, then exactly one
//!   `duplexChannel.exit`, through the request's [`Notifier`]; awaiting the
//!   notifier gives backpressure (a slow host stops the reader, and the init
//!   then stops reading the command or peer). The channel leaves the table
//!   before its exit is sent, so after `duplexChannel.exit` its id is unknown.
//!   A host that went away (the notifier is closed) kills the channel.
//! - **pty**: `command` + `args` on a `cols` x `rows` terminal; a relative
//!   `cwd` is under `/workspace`, the default is `config.workdir` (else
//!   `/workspace`); `env` goes over `config.env`. `exitCode` / `signal` (a
//!   name) come from the command.
//!   `duplexChannelStop` is "end of file to the pty": a terminal has no EOF
//!   of its own, so the worker types the EOF character twice (`^D ^D`: the
//!   first ends a partially typed line, the second is end-of-file for a
//!   reader in canonical mode, as `cat` or `sh` at a prompt) and then closes
//!   the input; later writes fail with E6033. A program in raw mode sees two
//!   `0x04` bytes and decides for itself. Stop is idempotent, and not an
//!   error when the far end ended meanwhile.
//! - **tcp**: `127.0.0.1:port` on the sandbox's own loopback; nothing
//!   listening -> E6032. `duplexChannelStop` half-closes (what the host wrote
//!   is delivered, then the peer reads end-of-file); the peer's output keeps
//!   flowing. The protocol has no "the far end ended its output" message,
//!   and a host forwarding a connection (the `ports` capability) waits for
//!   the exit to end its own client's stream, so when the *peer* ends its
//!   output the worker ends the channel: everything the peer sent has
//!   already gone out as data, our input side is closed (bytes the host
//!   wrote are flushed to the peer first), and once the init reports both
//!   directions done — at most [`TCP_LINGER`] later, else the connection is
//!   killed — `duplexChannel.exit` follows with no `exitCode` and no error.
//!   A reset or a kill ends it with `error` set.
//! - **close**: kills now (a pty's whole session gets SIGKILL, a TCP
//!   connection is closed); the exit follows (`signal: SIGKILL` / `error:
//!   killed`). Closing a channel that already ended is not an error.
//! - Resize of a tcp channel and unknown channel ids are -32602 (E6030,
//!   E6077).
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use sandhost_protocol::{
    DuplexChannelParams, DuplexExitParams, DuplexOpenParams, DuplexOpenResult, DuplexPurpose,
    DuplexResizeParams, DuplexWriteParams,
};
use sandhost_provider::{async_trait, DuplexOps, Notifier, ProviderResult, RequestContext};

use super::{blocking, lease_id, parsed_config, signal_name, LocalProvider, WorkerError};
use crate::duplex::{ChannelEvent, ChannelExit, PtyChannel, PtyRequest, TcpChannel};
use crate::error::LocalError;
use crate::sandbox::LocalSandbox;

/// How long a TCP channel waits, after the peer ended its output, for the
/// bytes the host wrote to be flushed to the peer before it is killed.
pub const TCP_LINGER: Duration = Duration::from_secs(5);

/// What `duplexChannelStop` types into a pty (see the module docs).
const PTY_EOF: &[u8] = b"\x04\x04";

/// One open channel of either kind.
#[derive(Debug)]
enum Chan {
    Pty(PtyChannel),
    Tcp(TcpChannel),
}

impl Chan {
    fn write(&self, data: &[u8]) -> Result<(), LocalError> {
        match self {
            Chan::Pty(c) => c.write(data),
            Chan::Tcp(c) => c.write(data),
        }
    }

    fn close_input(&self) -> Result<(), LocalError> {
        match self {
            Chan::Pty(c) => c.close_input(),
            Chan::Tcp(c) => c.close_input(),
        }
    }

    fn kill(&self) -> Result<(), LocalError> {
        match self {
            Chan::Pty(c) => c.kill(),
            Chan::Tcp(c) => c.kill(),
        }
    }

    fn next_event(&self, timeout: Option<Duration>) -> Result<Option<ChannelEvent>, LocalError> {
        match (self, timeout) {
            (Chan::Pty(c), None) => c.next_event().map(Some),
            (Chan::Tcp(c), None) => c.next_event().map(Some),
            (Chan::Pty(c), Some(t)) => c.next_event_timeout(t),
            (Chan::Tcp(c), Some(t)) => c.next_event_timeout(t),
        }
    }
}

/// The channels this worker process has open, by `channelId`.
#[derive(Debug, Default)]
pub(crate) struct Channels {
    map: Mutex<HashMap<String, Arc<Chan>>>,
    next: AtomicU64,
}

impl Channels {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<Chan>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, id: &str) -> Result<Arc<Chan>, WorkerError> {
        self.lock()
            .get(id)
            .cloned()
            .ok_or_else(|| WorkerError::UnknownChannel(id.to_string()))
    }

    fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    fn new_id(&self, kind: &str) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{kind}-{}-{n}", std::process::id())
    }
}

/// The library's request for a `pty` purpose.
fn pty_request(
    cfg: &super::LocalConfig,
    command: String,
    args: Option<Vec<String>>,
    cwd: Option<String>,
    env: Option<std::collections::BTreeMap<String, String>>,
    cols: u16,
    rows: u16,
) -> Result<PtyRequest, WorkerError> {
    if command.is_empty() {
        return Err(LocalError::InvalidRequest("empty command".into()).into());
    }
    let mut argv = vec![command];
    argv.extend(args.unwrap_or_default());
    let mut req = PtyRequest::new(argv);
    req.cwd = cwd
        .map(|c| {
            if c.starts_with('/') {
                c
            } else {
                format!("/workspace/{c}")
            }
        })
        .or_else(|| cfg.workdir.clone());
    req.env = cfg.env.clone();
    for (k, v) in env.unwrap_or_default() {
        req.env.retain(|(ek, _)| *ek != k);
        req.env.push((k, v));
    }
    req.cols = cols;
    req.rows = rows;
    Ok(req)
}

fn exit_params(channel_id: &str, e: ChannelExit) -> DuplexExitParams {
    DuplexExitParams {
        channel_id: channel_id.to_string(),
        exit_code: e.exit_code,
        signal: e.signal.map(signal_name),
        error: e.error,
    }
}

/// The reading side of one channel, on its own thread: events become
/// notifications until the exit, which is sent last and exactly once.
fn pump(
    rt: tokio::runtime::Handle,
    channels: Arc<Channels>,
    id: String,
    chan: Arc<Chan>,
    notifier: Notifier,
) {
    // Set once the TCP peer ended its output: when to give up on a clean end.
    let mut linger_until: Option<Instant> = None;
    let exit = loop {
        let timeout = linger_until.map(|t| t.saturating_duration_since(Instant::now()));
        match chan.next_event(timeout) {
            Ok(Some(ChannelEvent::Data(d))) => {
                if rt.block_on(notifier.duplex_data(&id, d)).is_err() {
                    // the host is gone: nobody will read this channel again
                    let _ = chan.kill();
                    channels.remove(&id);
                    return;
                }
            }
            Ok(Some(ChannelEvent::OutputClosed)) => {
                // the peer is done sending; flush what the host wrote and end
                if chan.close_input().is_err() {
                    let _ = chan.kill();
                }
                linger_until = Some(Instant::now() + TCP_LINGER);
            }
            Ok(Some(ChannelEvent::Exit(e))) => break exit_params(&id, e),
            Ok(None) => {
                // the linger ran out: the peer does not take our last bytes
                tracing::debug!(channel = %id, "tcp linger expired, closing the connection");
                linger_until = None;
                let _ = chan.kill();
            }
            Err(e) => {
                let _ = chan.kill();
                break DuplexExitParams {
                    channel_id: id.clone(),
                    exit_code: None,
                    signal: None,
                    error: Some(format!("{} ({})", e, e.code())),
                };
            }
        }
    };
    channels.remove(&id);
    let _ = rt.block_on(notifier.duplex_exit(exit));
}

#[async_trait]
impl DuplexOps for LocalProvider {
    async fn open(
        &self,
        ctx: &RequestContext,
        params: DuplexOpenParams,
    ) -> ProviderResult<DuplexOpenResult> {
        let cfg = parsed_config(&params.scope.config)?;
        let lease = lease_id(&params.lease)?;
        let root = cfg.state_root();
        let (kind, chan) = match params.purpose {
            DuplexPurpose::Pty {
                command,
                args,
                cwd,
                env,
                cols,
                rows,
            } => {
                let req = pty_request(&cfg, command, args, cwd, env, cols, rows)?;
                let chan = blocking(move || {
                    let sb = LocalSandbox::open(&root, &lease)?;
                    Ok(Chan::Pty(sb.open_pty(&req)?))
                })
                .await?;
                ("pty", chan)
            }
            DuplexPurpose::Tcp { port } => {
                let chan = blocking(move || {
                    let sb = LocalSandbox::open(&root, &lease)?;
                    Ok(Chan::Tcp(sb.connect_tcp(port)?))
                })
                .await?;
                ("tcp", chan)
            }
        };
        let chan = Arc::new(chan);
        let id = self.channels.new_id(kind);
        self.channels.lock().insert(id.clone(), chan.clone());
        let (rt, channels, notifier) = (
            tokio::runtime::Handle::current(),
            self.channels.clone(),
            ctx.notifier().clone(),
        );
        let thread_id = id.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("duplex-{id}"))
            .spawn({
                let chan = chan.clone();
                move || pump(rt, channels, thread_id, chan, notifier)
            });
        if let Err(e) = spawned {
            self.channels.remove(&id);
            let _ = chan.kill();
            return Err(WorkerError::host_io("start a channel thread", e).into());
        }
        tracing::debug!(channel = %id, "duplex channel open");
        Ok(DuplexOpenResult { channel_id: id })
    }

    async fn write(&self, params: DuplexWriteParams) -> ProviderResult<()> {
        let chan = self.channels.get(&params.channel_id)?;
        let data = params.data.0;
        Ok(blocking(move || Ok(chan.write(&data)?)).await?)
    }

    async fn resize(&self, params: DuplexResizeParams) -> ProviderResult<()> {
        let chan = self.channels.get(&params.channel_id)?;
        let (cols, rows) = (params.cols, params.rows);
        Ok(blocking(move || match &*chan {
            Chan::Pty(p) => Ok(p.resize(cols, rows)?),
            Chan::Tcp(_) => {
                Err(LocalError::InvalidRequest("a tcp channel has no terminal size".into()).into())
            }
        })
        .await?)
    }

    async fn stop(&self, params: DuplexChannelParams) -> ProviderResult<()> {
        let chan = self.channels.get(&params.channel_id)?;
        Ok(blocking(move || {
            let eof = match &*chan {
                Chan::Pty(p) => p.write(PTY_EOF),
                Chan::Tcp(_) => Ok(()),
            };
            match eof.and_then(|()| chan.close_input()) {
                // stopped before, or the far end ended meanwhile (`cat` may
                // exit on the EOF before our input is closed): either way
                // nothing more goes in, and the pump reports the exit
                Ok(()) | Err(LocalError::ChannelClosed(_)) => Ok(()),
                Err(e) => Err(e.into()),
            }
        })
        .await?)
    }

    async fn close(&self, params: DuplexChannelParams) -> ProviderResult<()> {
        // a channel that already ended has left the table: nothing to tear down
        let Some(chan) = self.channels.lock().get(&params.channel_id).cloned() else {
            return Ok(());
        };
        Ok(blocking(move || Ok(chan.kill()?)).await?)
    }
}
