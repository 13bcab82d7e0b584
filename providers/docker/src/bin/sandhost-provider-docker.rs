//! The Docker provider worker: JSON-RPC on stdin/stdout, logs on stderr.
#![forbid(unsafe_code)]

use std::sync::Arc;

use sandhost_provider_docker::DockerProvider;

#[tokio::main]
async fn main() {
    sandhost_provider::init_stderr_logging();
    if let Err(e) = sandhost_provider::serve_stdio(Arc::new(DockerProvider::new())).await {
        tracing::error!(code = e.code(), "worker stopped: {e}");
        std::process::exit(1);
    }
}
