//! Duplex channels through exec instances.
//!
//! - `pty`: an exec with `Tty: true` running the command under the pid-file
//!   wrapper; resize through the exec resize endpoint; stop writes `^D` and
//!   closes the input side; close kills the command's process group.
//! - `tcp`: an exec of `nc 127.0.0.1 PORT` inside the container, its stdio
//!   carrying the TCP stream: the container keeps `network_mode: none` (only
//!   loopback) and the host never opens a port. Needs `nc` in the image.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bollard::exec::StartExecResults;
use bollard::query_parameters::ResizeExecOptions;
use bollard::Docker;
use futures_util::StreamExt;
use sandhost_protocol::{
    DuplexChannelParams, DuplexExitParams, DuplexOpenParams, DuplexOpenResult, DuplexPurpose,
    DuplexResizeParams, DuplexWriteParams,
};
use sandhost_provider::{async_trait, DuplexOps, ProviderResult, RequestContext};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;

use crate::config::valid_env_name;
use crate::error::DockerError;
use crate::exec;
use crate::provider::DockerProvider;

type Input = Pin<Box<dyn AsyncWrite + Send>>;

struct Channel {
    lease_id: String,
    container: String,
    exec_id: String,
    token: String,
    tty: bool,
    docker: Docker,
    input: Mutex<Option<Input>>,
    reader: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl std::fmt::Debug for Channel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Channel")
            .field("lease_id", &self.lease_id)
            .field("exec_id", &self.exec_id)
            .finish()
    }
}

/// The open channels of this worker.
#[derive(Debug, Default)]
pub struct Channels {
    map: Mutex<HashMap<String, Arc<Channel>>>,
}

impl Channels {
    async fn get(&self, id: &str) -> Result<Arc<Channel>, DockerError> {
        self.map
            .lock()
            .await
            .get(id)
            .cloned()
            .ok_or_else(|| DockerError::ChannelNotFound(id.to_string()))
    }

    async fn kill(&self, id: &str) -> Result<(), DockerError> {
        let ch = self.get(id).await?;
        *ch.input.lock().await = None;
        exec::kill_token(&ch.docker, &ch.container, &ch.token).await?;
        // the reader sends the exit when the stream ends; give it a moment
        let handle = ch.reader.lock().await.take();
        if let Some(h) = handle {
            if tokio::time::timeout(Duration::from_secs(3), h)
                .await
                .is_err()
            {
                tracing::warn!(channel = id, "reader did not end after the kill");
            }
        }
        self.map.lock().await.remove(id);
        Ok(())
    }

    pub async fn close_lease(&self, lease_id: &str) {
        let ids: Vec<String> = self
            .map
            .lock()
            .await
            .iter()
            .filter(|(_, c)| c.lease_id == lease_id)
            .map(|(k, _)| k.clone())
            .collect();
        for id in ids {
            let _ = self.kill(&id).await;
        }
    }

    pub async fn close_all(&self) {
        let ids: Vec<String> = self.map.lock().await.keys().cloned().collect();
        for id in ids {
            let _ = self.kill(&id).await;
        }
    }
}

#[async_trait]
impl DuplexOps for DockerProvider {
    async fn open(
        &self,
        ctx: &RequestContext,
        params: DuplexOpenParams,
    ) -> ProviderResult<DuplexOpenResult> {
        let (docker, info) = self.lease_of(&params.scope, &params.lease).await?;
        let token = exec::token();
        let (argv, env, tty, size) = match &params.purpose {
            DuplexPurpose::Pty {
                command,
                args,
                cwd,
                env,
                cols,
                rows,
            } => {
                let mut full = vec![command.clone()];
                full.extend(args.clone().unwrap_or_default());
                let cwd = match cwd.as_deref() {
                    Some(c) if c.starts_with('/') => c.to_string(),
                    Some(c) => format!("{}/{c}", info.workdir),
                    None => info.workdir.clone(),
                };
                let mut e = vec!["TERM=xterm-256color".to_string()];
                for (k, v) in env.clone().unwrap_or_default() {
                    if !valid_env_name(&k) {
                        return Err(
                            DockerError::InvalidParams(format!("invalid env name `{k}`")).into(),
                        );
                    }
                    e.push(format!("{k}={v}"));
                }
                (
                    exec::oneshot_argv(&token, &cwd, &full),
                    e,
                    true,
                    Some((*cols, *rows)),
                )
            }
            DuplexPurpose::Tcp { port } => {
                let full = vec!["nc".to_string(), "127.0.0.1".to_string(), port.to_string()];
                (
                    exec::oneshot_argv(&token, &info.workdir, &full),
                    vec![],
                    false,
                    None,
                )
            }
        };
        let (exec_id, started) =
            exec::start(&docker, &info.container_id, argv, env, true, tty, None).await?;
        let StartExecResults::Attached { mut output, input } = started else {
            return Err(DockerError::ExecFailed("the engine detached the exec".into()).into());
        };
        if let Some((cols, rows)) = size {
            let _ = docker
                .resize_exec(
                    &exec_id,
                    ResizeExecOptions {
                        w: cols.into(),
                        h: rows.into(),
                    },
                )
                .await;
        }
        let channel_id = format!("docker-{token}");
        let notifier = ctx.notifier().clone();
        let reader_docker = docker.clone();
        let reader_exec = exec_id.clone();
        let reader_id = channel_id.clone();
        let reader = tokio::spawn(async move {
            let mut error = None;
            while let Some(item) = output.next().await {
                match item {
                    Ok(bollard::container::LogOutput::StdOut { message })
                    | Ok(bollard::container::LogOutput::Console { message }) => {
                        if notifier
                            .duplex_data(&reader_id, message.to_vec())
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                    Ok(bollard::container::LogOutput::StdErr { message }) => {
                        tracing::debug!(channel = %reader_id, "stderr: {}", String::from_utf8_lossy(&message));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        error = Some(e.to_string());
                        break;
                    }
                }
            }
            let code = exec::exit_code(&reader_docker, &reader_exec)
                .await
                .ok()
                .flatten();
            let _ = notifier
                .duplex_exit(DuplexExitParams {
                    channel_id: reader_id,
                    exit_code: code.map(|c| c as i32),
                    signal: None,
                    error,
                })
                .await;
        });
        let ch = Arc::new(Channel {
            lease_id: info.lease_id.clone(),
            container: info.container_id.clone(),
            exec_id,
            token,
            tty,
            docker,
            input: Mutex::new(Some(input)),
            reader: Mutex::new(Some(reader)),
        });
        self.channels
            .map
            .lock()
            .await
            .insert(channel_id.clone(), ch);
        Ok(DuplexOpenResult { channel_id })
    }

    async fn write(&self, params: DuplexWriteParams) -> ProviderResult<()> {
        let ch = self.channels.get(&params.channel_id).await?;
        let mut input = ch.input.lock().await;
        let Some(w) = input.as_mut() else {
            return Err(DockerError::InvalidParams("the channel's input is closed".into()).into());
        };
        w.write_all(&params.data.0).await?;
        w.flush().await?;
        Ok(())
    }

    async fn resize(&self, params: DuplexResizeParams) -> ProviderResult<()> {
        let ch = self.channels.get(&params.channel_id).await?;
        if !ch.tty {
            return Err(
                DockerError::InvalidParams("a tcp channel cannot be resized".into()).into(),
            );
        }
        ch.docker
            .resize_exec(
                &ch.exec_id,
                ResizeExecOptions {
                    w: params.cols.into(),
                    h: params.rows.into(),
                },
            )
            .await
            .map_err(DockerError::engine("resize exec"))?;
        Ok(())
    }

    async fn stop(&self, params: DuplexChannelParams) -> ProviderResult<()> {
        let ch = self.channels.get(&params.channel_id).await?;
        let mut input = ch.input.lock().await;
        if let Some(mut w) = input.take() {
            if ch.tty {
                // EOF on a terminal is ^D at the start of a line.
                let _ = w.write_all(b"\n\x04").await;
                let _ = w.flush().await;
            }
            let _ = w.shutdown().await;
            // keep the write half open for the tty: closing it may hang up early
            *input = Some(w);
        }
        Ok(())
    }

    async fn close(&self, params: DuplexChannelParams) -> ProviderResult<()> {
        self.channels.kill(&params.channel_id).await?;
        Ok(())
    }
}
