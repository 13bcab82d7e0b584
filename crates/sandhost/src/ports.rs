//! The `ports` capability: a port inside the sandbox, reachable from the host
//! as a TCP listener on 127.0.0.1. Each accepted connection opens its own
//! duplex channel to the port on the sandbox's own loopback; the sandbox gets
//! no network for it.

use std::net::SocketAddr;

use sandhost_contract::CommandCapability;
use sandhost_runtime::context::LeaseContext;
use sandhost_runtime::duplex::{DuplexChannel, DuplexEvent};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::{Error, Sandbox};

/// Forwards ports of one sandbox.
#[derive(Debug, Clone)]
pub struct Ports {
    sandbox: Sandbox,
}

/// A running forward; dropping it stops accepting (open connections end
/// with their channels).
#[derive(Debug)]
pub struct PortForward {
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl PortForward {
    /// Where to connect on the host.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

impl Drop for PortForward {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Ports {
    pub(crate) fn new(sandbox: Sandbox) -> Self {
        Self { sandbox }
    }

    /// Listen on 127.0.0.1 (an ephemeral port) and forward each connection
    /// to `port` inside the sandbox.
    pub async fn forward(&self, port: u16) -> Result<PortForward, Error> {
        self.sandbox.gate(CommandCapability::Ports)?;
        let listener = TcpListener::bind(("127.0.0.1", 0))
            .await
            .map_err(|source| Error::Io {
                doing: "listening on 127.0.0.1",
                source,
            })?;
        let local = listener.local_addr().map_err(|source| Error::Io {
            doing: "reading the listener address",
            source,
        })?;
        let ctx = self.sandbox.runtime().ctx.clone();
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    if let Err(e) = pump(&ctx, conn, port).await {
                        tracing::debug!("port forward connection ended: {e}");
                    }
                });
            }
        });
        Ok(PortForward { local, task })
    }
}

async fn pump(ctx: &LeaseContext, conn: TcpStream, port: u16) -> Result<(), Error> {
    let mut channel = match DuplexChannel::tcp(ctx, port).await {
        Ok(c) => c,
        Err(e) => return Err(e.into()), // dropping `conn` refuses the client
    };
    let (mut rd, mut wr) = conn.into_split();
    let mut buf = vec![0u8; 32 * 1024];
    let mut host_open = true;
    loop {
        tokio::select! {
            n = rd.read(&mut buf), if host_open => match n {
                Ok(0) | Err(_) => { host_open = false; channel.stop().await?; }
                Ok(n) => channel.write(&buf[..n]).await?,
            },
            ev = channel.next() => match ev {
                Some(DuplexEvent::Data(d)) => {
                    if wr.write_all(&d).await.is_err() { break; }
                }
                Some(DuplexEvent::Exit { .. }) | None => { let _ = wr.shutdown().await; break; }
            },
        }
    }
    Ok(())
}
