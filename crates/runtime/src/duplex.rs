//! Duplex byte channels on a lease: a PTY process (what the terminal
//! capability rides on) or a TCP connection to a port inside the sandbox
//! (what ports ride on). Bytes travel base64-encoded in the worker protocol;
//! output arrives as `duplexChannel.data` notifications routed to the one
//! channel they name, and exactly one `duplexChannel.exit` ends it.

use std::collections::BTreeMap;
use std::sync::Arc;

use sandhost_protocol::{
    methods, Bytes, DuplexChannelParams, DuplexOpenParams, DuplexPurpose, DuplexResizeParams,
    DuplexWriteParams, Notification,
};
use tokio::sync::mpsc;

use crate::context::LeaseContext;
use crate::worker::{Worker, WorkerError};

/// What a channel delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DuplexEvent {
    Data(Vec<u8>),
    Exit {
        exit_code: Option<i32>,
        signal: Option<String>,
        error: Option<String>,
    },
}

/// One open channel. Dropping it closes the channel.
#[derive(Debug)]
pub struct DuplexChannel {
    worker: Arc<Worker>,
    id: String,
    rx: mpsc::UnboundedReceiver<Notification>,
    closed: bool,
}

/// A PTY process to start.
#[derive(Debug, Clone, Default)]
pub struct PtySpec {
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub cols: u16,
    pub rows: u16,
}

impl DuplexChannel {
    async fn open(ctx: &LeaseContext, purpose: DuplexPurpose) -> Result<Self, WorkerError> {
        let params = DuplexOpenParams {
            scope: ctx.scope.clone(),
            lease: ctx.lease.clone(),
            purpose,
        };
        let opened = ctx.worker.call::<methods::DuplexOpen>(&params).await?;
        let rx = ctx.worker.subscribe_channel(&opened.channel_id);
        Ok(Self {
            worker: ctx.worker.clone(),
            id: opened.channel_id,
            rx,
            closed: false,
        })
    }

    /// Start a process on a PTY.
    pub async fn pty(ctx: &LeaseContext, spec: &PtySpec) -> Result<Self, WorkerError> {
        let (command, args) = spec
            .argv
            .split_first()
            .map(|(c, a)| (c.clone(), a.to_vec()))
            .unwrap_or_default();
        let purpose = DuplexPurpose::Pty {
            command,
            args: (!args.is_empty()).then_some(args),
            cwd: spec.cwd.clone(),
            env: (!spec.env.is_empty()).then(|| spec.env.clone()),
            cols: spec.cols,
            rows: spec.rows,
        };
        Self::open(ctx, purpose).await
    }

    /// Connect to `port` on the sandbox's own loopback.
    pub async fn tcp(ctx: &LeaseContext, port: u16) -> Result<Self, WorkerError> {
        Self::open(ctx, DuplexPurpose::Tcp { port }).await
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// Send bytes to the far end.
    pub async fn write(&self, data: &[u8]) -> Result<(), WorkerError> {
        let p = DuplexWriteParams {
            channel_id: self.id.clone(),
            data: Bytes(data.to_vec()),
        };
        self.worker
            .call::<methods::DuplexWrite>(&p)
            .await
            .map(|_| ())
    }

    /// Resize a PTY.
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), WorkerError> {
        let p = DuplexResizeParams {
            channel_id: self.id.clone(),
            cols,
            rows,
        };
        self.worker
            .call::<methods::DuplexResize>(&p)
            .await
            .map(|_| ())
    }

    /// Close our sending side; output keeps flowing until the far end ends.
    pub async fn stop(&self) -> Result<(), WorkerError> {
        let p = DuplexChannelParams {
            channel_id: self.id.clone(),
        };
        self.worker
            .call::<methods::DuplexStop>(&p)
            .await
            .map(|_| ())
    }

    /// Tear the channel down now.
    pub async fn close(mut self) -> Result<(), WorkerError> {
        self.closed = true;
        let p = DuplexChannelParams {
            channel_id: self.id.clone(),
        };
        let r = self
            .worker
            .call::<methods::DuplexClose>(&p)
            .await
            .map(|_| ());
        self.drain_exit();
        r
    }

    /// Keep the subscription until the channel's last notification (its
    /// exit) arrives, then drop it, so nothing is left held for a channel
    /// nobody reads. Bounded in time.
    fn drain_exit(&mut self) {
        let (worker, id) = (self.worker.clone(), self.id.clone());
        let mut rx = std::mem::replace(&mut self.rx, mpsc::unbounded_channel().1);
        let drain = async move {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                while let Some(n) = rx.recv().await {
                    if n.method == "duplexChannel.exit" {
                        break;
                    }
                }
            })
            .await;
            worker.unsubscribe_channel(&id);
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(drain);
            }
            Err(_) => self.worker.unsubscribe_channel(&self.id),
        }
    }

    /// The next event; `None` once the channel has ended (after `Exit`) or
    /// the worker is gone.
    pub async fn next(&mut self) -> Option<DuplexEvent> {
        loop {
            let n = self.rx.recv().await?;
            match n.method.as_str() {
                "duplexChannel.data" => {
                    if let Ok(p) = n.params_as::<methods::DuplexData>() {
                        return Some(DuplexEvent::Data(p.data.0));
                    }
                }
                "duplexChannel.exit" => {
                    if let Ok(p) = n.params_as::<methods::DuplexExit>() {
                        self.closed = true;
                        self.worker.unsubscribe_channel(&self.id);
                        return Some(DuplexEvent::Exit {
                            exit_code: p.exit_code,
                            signal: p.signal,
                            error: p.error,
                        });
                    }
                }
                _ => {}
            }
        }
    }
}

impl Drop for DuplexChannel {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        let (worker, id) = (self.worker.clone(), self.id.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = worker
                    .call::<methods::DuplexClose>(&DuplexChannelParams { channel_id: id })
                    .await;
            });
        }
        self.drain_exit();
    }
}
