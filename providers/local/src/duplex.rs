//! Duplex byte channels into a sandbox: an interactive command on a pty
//! ([`LocalSandbox::open_pty`]) and a TCP stream to a port on the sandbox's
//! own loopback ([`LocalSandbox::connect_tcp`]).
//!
//! Each channel has its own connection to the sandbox's init, which relays
//! the bytes (see `init::duplex`). Every method takes `&self` and the type is
//! `Send + Sync`: put the channel in an `Arc`, read events on one thread (or
//! `tokio::task::spawn_blocking`) and write, resize, close input or kill from
//! any other. Output is read with [`PtyChannel::next_event`] (blocking),
//! [`PtyChannel::next_event_timeout`], or [`PtyChannel::wait_with`]
//! (a callback per chunk until the exit). The last event is always exactly
//! one [`ChannelEvent::Exit`]; later calls return it again.
//!
//! Dropping a channel closes its connection, and the init then kills what it
//! runs (a pty's whole session) or closes the TCP connection.
//!
//! [`LocalSandbox::open_pty`]: crate::LocalSandbox::open_pty
//! [`LocalSandbox::connect_tcp`]: crate::LocalSandbox::connect_tcp
use std::io::{ErrorKind, Read};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::error::LocalError;
use crate::proto::{self, ChanExit, ChanKill, ChanOpened, Fail, PtySpec, TcpSpec};
use crate::sandbox::{fail_to_error, LocalSandbox};

/// Bytes per data frame the host sends.
const WRITE_CHUNK: usize = 32 * 1024;
/// How long the init may take to answer an open request (a TCP connect is
/// given 10 s inside).
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// An interactive command on a pty inside the sandbox.
#[derive(Debug, Clone)]
pub struct PtyRequest {
    /// Program and arguments; the program is looked up in `PATH` when it has no `/`.
    pub argv: Vec<String>,
    /// Working directory inside the sandbox (default `/workspace`).
    pub cwd: Option<String>,
    /// Added to (and overriding) the default environment (PATH,
    /// HOME=/workspace, LANG=C.UTF-8, HOSTNAME, TERM=xterm-256color).
    pub env: Vec<(String, String)>,
    pub cols: u16,
    pub rows: u16,
}

impl PtyRequest {
    /// `argv` on an 80x24 terminal.
    pub fn new<S: Into<String>>(argv: impl IntoIterator<Item = S>) -> PtyRequest {
        PtyRequest {
            argv: argv.into_iter().map(Into::into).collect(),
            cwd: None,
            env: vec![],
            cols: 80,
            rows: 24,
        }
    }
}

/// What a channel produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelEvent {
    /// Output bytes (a pty's terminal output, or bytes the TCP peer sent).
    Data(Vec<u8>),
    /// TCP only: the peer ended its output (half-close); it may still read.
    OutputClosed,
    /// The channel ended; always the last event.
    Exit(ChannelExit),
}

/// How a channel ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChannelExit {
    /// Pty: the command's exit code, when it exited normally.
    pub exit_code: Option<i32>,
    /// Pty: the signal that killed the command.
    pub signal: Option<i32>,
    /// TCP: why the connection ended abnormally (`killed`, a reset, ...);
    /// `None` after a clean close in both directions.
    pub error: Option<String>,
}

impl From<ChanExit> for ChannelExit {
    fn from(e: ChanExit) -> Self {
        ChannelExit {
            exit_code: e.exit_code,
            signal: e.signal,
            error: e.error,
        }
    }
}

#[derive(Debug)]
struct Reader {
    stream: UnixStream,
    buf: Vec<u8>,
    exit: Option<ChannelExit>,
}

/// What both channel kinds share: one connection, split into a writing and
/// a reading half, plus a way to reach the init again for a kill.
#[derive(Debug)]
struct Channel {
    sandbox: LocalSandbox,
    token: u64,
    writer: Mutex<UnixStream>,
    reader: Mutex<Reader>,
    input_closed: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Channel {
    /// Send the open request on a fresh connection and wait for the answer.
    fn open(
        sandbox: &LocalSandbox,
        kind: u8,
        spec: &impl serde::Serialize,
        on_fail: impl FnOnce(&Fail) -> Option<LocalError>,
    ) -> Result<(Channel, ChanOpened), LocalError> {
        let mut s = sandbox.connect()?;
        let gone = |_| LocalError::Gone(sandbox.id().to_string());
        let payload = serde_json::to_vec(spec).expect("serializable");
        proto::write_frame(&mut s, kind, &payload).map_err(gone)?;
        s.set_read_timeout(Some(OPEN_TIMEOUT)).map_err(gone)?;
        let (k, answer) = proto::read_frame(&mut s).map_err(gone)?;
        s.set_read_timeout(None).map_err(gone)?;
        let opened: ChanOpened = match k {
            proto::OK => serde_json::from_slice(&answer)
                .map_err(|e| LocalError::Protocol(format!("bad channel answer: {e}")))?,
            proto::FAIL => {
                let special = serde_json::from_slice::<Fail>(&answer)
                    .ok()
                    .and_then(|f| on_fail(&f));
                return Err(special.unwrap_or_else(|| fail_to_error(&answer)));
            }
            k => return Err(LocalError::Protocol(format!("unexpected frame {k}"))),
        };
        let reader = s.try_clone().map_err(gone)?;
        let ch = Channel {
            sandbox: sandbox.handle(),
            token: opened.token,
            writer: Mutex::new(s),
            reader: Mutex::new(Reader {
                stream: reader,
                buf: Vec::new(),
                exit: None,
            }),
            input_closed: AtomicBool::new(false),
        };
        Ok((ch, opened))
    }

    fn send(&self, kind: u8, payload: &[u8]) -> Result<(), LocalError> {
        let mut w = lock(&self.writer);
        proto::write_frame(&mut *w, kind, payload)
            .map_err(|e| LocalError::ChannelClosed(format!("the channel ended ({e})")))
    }

    fn write(&self, data: &[u8]) -> Result<(), LocalError> {
        if self.input_closed.load(Ordering::SeqCst) {
            return Err(LocalError::ChannelClosed("input was closed".into()));
        }
        for chunk in data.chunks(WRITE_CHUNK) {
            self.send(proto::CHAN_DATA, chunk)?;
        }
        Ok(())
    }

    fn close_input(&self) -> Result<(), LocalError> {
        if self.input_closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.send(proto::CHAN_EOF, &[])
    }

    /// Kill over a fresh connection: it works even while this channel's own
    /// connection is backlogged (a command that does not read its input).
    fn kill(&self) -> Result<(), LocalError> {
        let mut s = self.sandbox.connect()?;
        let gone = |_| LocalError::Gone(self.sandbox.id().to_string());
        let payload = serde_json::to_vec(&ChanKill { token: self.token }).expect("serializable");
        proto::write_frame(&mut s, proto::CHAN_KILL, &payload).map_err(gone)?;
        let (k, _) = proto::read_frame(&mut s).map_err(gone)?;
        match k {
            // FAIL = no such channel: it already ended.
            proto::OK | proto::FAIL => Ok(()),
            k => Err(LocalError::Protocol(format!("unexpected frame {k}"))),
        }
    }

    fn next_event(&self, timeout: Option<Duration>) -> Result<Option<ChannelEvent>, LocalError> {
        let mut r = lock(&self.reader);
        if let Some(exit) = &r.exit {
            return Ok(Some(ChannelEvent::Exit(exit.clone())));
        }
        let id = self.sandbox.id().to_string();
        // A zero timeout means "none" to the socket: use the smallest real one.
        let t = timeout.map(|t| t.max(Duration::from_millis(1)));
        r.stream
            .set_read_timeout(t)
            .map_err(|_| LocalError::Gone(id.clone()))?;
        loop {
            let frame = proto::take_frame(&mut r.buf)
                .map_err(|e| LocalError::Protocol(format!("bad channel frame: {e}")))?;
            if let Some((kind, payload)) = frame {
                let ev = match kind {
                    proto::CHAN_DATA => ChannelEvent::Data(payload),
                    proto::CHAN_EOF => ChannelEvent::OutputClosed,
                    proto::RESULT => {
                        let e: ChanExit = serde_json::from_slice(&payload)
                            .map_err(|e| LocalError::Protocol(format!("bad channel exit: {e}")))?;
                        let exit = ChannelExit::from(e);
                        r.exit = Some(exit.clone());
                        ChannelEvent::Exit(exit)
                    }
                    k => return Err(LocalError::Protocol(format!("unexpected frame {k}"))),
                };
                return Ok(Some(ev));
            }
            let mut tmp = [0u8; 64 * 1024];
            match r.stream.read(&mut tmp) {
                Ok(0) => {
                    return Err(LocalError::Gone(format!(
                        "{id} (channel connection closed without an exit)"
                    )))
                }
                Ok(n) => r.buf.extend_from_slice(&tmp[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    return Ok(None)
                }
                Err(_) => return Err(LocalError::Gone(id)),
            }
        }
    }

    fn wait_with(&self, mut on_data: impl FnMut(&[u8])) -> Result<ChannelExit, LocalError> {
        loop {
            match self.next_event(None)? {
                Some(ChannelEvent::Data(d)) => on_data(&d),
                Some(ChannelEvent::Exit(e)) => return Ok(e),
                _ => {}
            }
        }
    }
}

fn validate_argv(argv: &[String]) -> Result<(), LocalError> {
    if argv.is_empty() || argv[0].is_empty() {
        return Err(LocalError::InvalidRequest("empty argv".into()));
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(LocalError::InvalidRequest("NUL byte in argv".into()));
    }
    Ok(())
}

/// An interactive command on a pty inside the sandbox, in a new session whose
/// controlling terminal is the pty.
#[derive(Debug)]
pub struct PtyChannel {
    ch: Channel,
    pid: i32,
    tty: String,
}

impl PtyChannel {
    pub(crate) fn open(sandbox: &LocalSandbox, req: &PtyRequest) -> Result<PtyChannel, LocalError> {
        validate_argv(&req.argv)?;
        let cwd = req.cwd.clone().unwrap_or_else(|| "/workspace".into());
        if !cwd.starts_with('/') {
            return Err(LocalError::InvalidRequest(format!(
                "cwd must be absolute: {cwd:?}"
            )));
        }
        if req.cols == 0 || req.rows == 0 {
            return Err(LocalError::InvalidRequest(
                "a terminal needs at least one column and one row".into(),
            ));
        }
        let spec = PtySpec {
            argv: req.argv.clone(),
            cwd,
            env: req.env.clone(),
            cols: req.cols,
            rows: req.rows,
        };
        let (ch, opened) = Channel::open(sandbox, proto::PTY_OPEN, &spec, |_| None)?;
        Ok(PtyChannel {
            ch,
            pid: opened.pid.unwrap_or(0),
            tty: opened.tty.unwrap_or_default(),
        })
    }

    /// The command's pid inside the sandbox (it leads its own session).
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The terminal's path inside the sandbox (`/dev/pts/N`).
    pub fn tty(&self) -> &str {
        &self.tty
    }

    /// Send input bytes to the terminal (what a user would type). Blocks
    /// while the command does not read and the buffers on the way are full.
    pub fn write(&self, data: &[u8]) -> Result<(), LocalError> {
        self.ch.write(data)
    }

    /// Change the window size (TIOCSWINSZ; the command gets SIGWINCH).
    pub fn resize(&self, cols: u16, rows: u16) -> Result<(), LocalError> {
        if cols == 0 || rows == 0 {
            return Err(LocalError::InvalidRequest(
                "a terminal needs at least one column and one row".into(),
            ));
        }
        let mut p = cols.to_le_bytes().to_vec();
        p.extend_from_slice(&rows.to_le_bytes());
        self.ch.send(proto::CHAN_RESIZE, &p)
    }

    /// Close our input side: no more bytes are sent to the terminal (later
    /// writes fail with E6033). A pty has no end-of-file of its own, so the
    /// command keeps running and its output keeps flowing until it exits; to
    /// make a program that reads the terminal see end-of-file, write the
    /// terminal's EOF character (`^D`, `b"\x04"`) at the start of a line
    /// before closing the input.
    pub fn close_input(&self) -> Result<(), LocalError> {
        self.ch.close_input()
    }

    /// SIGKILL every process of the command's session. The exit event follows
    /// (signal 9). A no-op once the channel ended.
    pub fn kill(&self) -> Result<(), LocalError> {
        self.ch.kill()
    }

    /// The next event, blocking until there is one.
    pub fn next_event(&self) -> Result<ChannelEvent, LocalError> {
        Ok(self.ch.next_event(None)?.expect("no timeout"))
    }

    /// The next event, or `None` when nothing arrived within `timeout`.
    pub fn next_event_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<ChannelEvent>, LocalError> {
        self.ch.next_event(Some(timeout))
    }

    /// Hand every output chunk to `on_data` until the command exits.
    pub fn wait_with(&self, on_data: impl FnMut(&[u8])) -> Result<ChannelExit, LocalError> {
        self.ch.wait_with(on_data)
    }

    /// Discard output until the command exits.
    pub fn wait(&self) -> Result<ChannelExit, LocalError> {
        self.ch.wait_with(|_| {})
    }
}

/// A TCP connection to `127.0.0.1:PORT` inside the sandbox's network
/// namespace (the sandbox has no other network: this gives it none).
#[derive(Debug)]
pub struct TcpChannel {
    ch: Channel,
    port: u16,
}

impl TcpChannel {
    pub(crate) fn open(sandbox: &LocalSandbox, port: u16) -> Result<TcpChannel, LocalError> {
        if port == 0 {
            return Err(LocalError::InvalidRequest("port 0".into()));
        }
        let (ch, _) = Channel::open(sandbox, proto::TCP_OPEN, &TcpSpec { port }, |f| {
            (f.code == "connect").then(|| LocalError::PortConnect {
                port,
                reason: f.message.clone(),
            })
        })?;
        Ok(TcpChannel { ch, port })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Send bytes to the peer. Blocks while the peer does not read and the
    /// buffers on the way are full.
    pub fn write(&self, data: &[u8]) -> Result<(), LocalError> {
        self.ch.write(data)
    }

    /// Half-close: once everything written so far reached the peer, our
    /// write side is shut down (the peer reads end-of-file); the peer's
    /// output keeps flowing.
    pub fn close_input(&self) -> Result<(), LocalError> {
        self.ch.close_input()
    }

    /// Close the connection at once; the exit event follows (error `killed`).
    pub fn kill(&self) -> Result<(), LocalError> {
        self.ch.kill()
    }

    /// The next event, blocking until there is one. The channel exits once
    /// both directions are closed (our [`TcpChannel::close_input`] and the
    /// peer's end of output), or on an error.
    pub fn next_event(&self) -> Result<ChannelEvent, LocalError> {
        Ok(self.ch.next_event(None)?.expect("no timeout"))
    }

    /// The next event, or `None` when nothing arrived within `timeout`.
    pub fn next_event_timeout(
        &self,
        timeout: Duration,
    ) -> Result<Option<ChannelEvent>, LocalError> {
        self.ch.next_event(Some(timeout))
    }

    /// Hand every received chunk to `on_data` until the channel ends.
    pub fn wait_with(&self, on_data: impl FnMut(&[u8])) -> Result<ChannelExit, LocalError> {
        self.ch.wait_with(on_data)
    }
}
