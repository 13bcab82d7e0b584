//! What every capability path needs to act on one lease: the live worker,
//! the common params, the provider's lease object, and the frozen snapshot
//! that decides which path runs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sandhost_protocol::{EnvironmentScope, ExecuteLogParams, ExecuteParams, ExecuteResult, Lease};

use crate::snapshot::CapabilitySnapshot;
use crate::worker::{Worker, WorkerError};

/// One lease of one worker, as the paths see it.
#[derive(Debug, Clone)]
pub struct LeaseContext {
    pub worker: Arc<Worker>,
    pub scope: EnvironmentScope,
    pub lease: Lease,
    pub snapshot: CapabilitySnapshot,
}

/// One `environmentExecute` call, before the path decides session or not.
#[derive(Debug, Clone, Default)]
pub struct RawExec {
    pub command: String,
    pub args: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub stdin: Option<String>,
    pub timeout: Option<Duration>,
    /// true = one-shot, never the persistent session
    pub bypass_session: bool,
}

/// Slack on top of a command's own timeout before the host gives up on the
/// worker's answer (the worker enforces the command timeout itself).
pub const WORKER_SLACK: Duration = Duration::from_secs(30);

impl LeaseContext {
    /// Run one `environmentExecute` on this lease, handing `execute.log`
    /// chunks to `on_log` as they arrive.
    pub async fn execute(
        &self,
        req: &RawExec,
        on_log: impl FnMut(ExecuteLogParams) + Send,
    ) -> Result<ExecuteResult, WorkerError> {
        let params = ExecuteParams {
            scope: self.scope.clone(),
            lease: self.lease.clone(),
            command: req.command.clone(),
            args: (!req.args.is_empty()).then(|| req.args.clone()),
            cwd: req.cwd.clone(),
            env: (!req.env.is_empty()).then(|| req.env.clone()),
            stdin: req.stdin.clone(),
            timeout_ms: req.timeout.map(|t| t.as_millis() as u64),
            bypass_session: Some(req.bypass_session),
        };
        let deadline = req.timeout.unwrap_or(Duration::from_secs(3600)) + WORKER_SLACK;
        self.worker.execute(&params, deadline, on_log).await
    }

    /// A one-shot shell snippet (`sh -c SCRIPT`) with no streaming: what the
    /// fallback paths use for their control commands.
    pub async fn sh(
        &self,
        script: &str,
        stdin: Option<String>,
    ) -> Result<ExecuteResult, WorkerError> {
        let req = RawExec {
            command: "sh".into(),
            args: vec!["-c".into(), script.into()],
            stdin,
            timeout: Some(Duration::from_secs(300)),
            bypass_session: true,
            ..RawExec::default()
        };
        self.execute(&req, |_| {}).await
    }
}

/// Quote one word for a POSIX shell: every path handed to a shell goes
/// through this.
pub fn shell_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}
