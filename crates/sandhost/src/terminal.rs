//! The `terminal` capability: a process on a PTY, with input and resize,
//! carried by a duplex channel of the provider.

use std::collections::BTreeMap;

use sandhost_contract::CommandCapability;
use sandhost_runtime::duplex::{DuplexChannel, DuplexEvent, PtySpec};

use crate::{Error, Sandbox};

/// How to start a terminal.
#[derive(Debug, Clone)]
pub struct TerminalOptions {
    /// The program; default `sh`.
    pub argv: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub cols: u16,
    pub rows: u16,
}

impl Default for TerminalOptions {
    fn default() -> Self {
        Self {
            argv: vec!["sh".into()],
            cwd: None,
            env: BTreeMap::new(),
            cols: 80,
            rows: 24,
        }
    }
}

/// What a terminal sends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminalEvent {
    Output(Vec<u8>),
    Exit {
        exit_code: Option<i32>,
        signal: Option<String>,
        error: Option<String>,
    },
}

/// Opens terminals in one sandbox.
#[derive(Debug, Clone)]
pub struct Terminals {
    sandbox: Sandbox,
}

impl Terminals {
    pub(crate) fn new(sandbox: Sandbox) -> Self {
        Self { sandbox }
    }

    pub async fn open(&self, opts: TerminalOptions) -> Result<Terminal, Error> {
        self.sandbox.gate(CommandCapability::Terminal)?;
        let spec = PtySpec {
            argv: opts.argv,
            cwd: opts.cwd,
            env: opts.env,
            cols: opts.cols,
            rows: opts.rows,
        };
        let channel = DuplexChannel::pty(&self.sandbox.runtime().ctx, &spec).await?;
        Ok(Terminal {
            sandbox: self.sandbox.clone(),
            channel,
        })
    }
}

/// A live terminal. Dropping it closes the channel (the process is ended).
#[derive(Debug)]
pub struct Terminal {
    sandbox: Sandbox,
    channel: DuplexChannel,
}

impl Terminal {
    /// Type bytes into the terminal.
    pub async fn write(&self, data: &[u8]) -> Result<(), Error> {
        self.sandbox.gate(CommandCapability::Terminal)?;
        Ok(self.channel.write(data).await?)
    }

    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), Error> {
        self.sandbox.gate(CommandCapability::Terminal)?;
        Ok(self.channel.resize(cols, rows).await?)
    }

    /// The next output or the exit; `None` afterwards.
    pub async fn next(&mut self) -> Option<TerminalEvent> {
        self.channel.next().await.map(|e| match e {
            DuplexEvent::Data(d) => TerminalEvent::Output(d),
            DuplexEvent::Exit {
                exit_code,
                signal,
                error,
            } => TerminalEvent::Exit {
                exit_code,
                signal,
                error,
            },
        })
    }

    /// Read output until `needle` appears (or the terminal ends); returns all
    /// output read.
    pub async fn read_until(&mut self, needle: &[u8]) -> Vec<u8> {
        let mut seen = Vec::new();
        while let Some(ev) = self.next().await {
            match ev {
                TerminalEvent::Output(d) => {
                    seen.extend_from_slice(&d);
                    if seen.windows(needle.len().max(1)).any(|w| w == needle) {
                        break;
                    }
                }
                TerminalEvent::Exit { .. } => break,
            }
        }
        seen
    }

    /// End the terminal now.
    pub async fn close(self) -> Result<(), Error> {
        Ok(self.channel.close().await?)
    }
}
