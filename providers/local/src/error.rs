//! Errors of the local provider, each with a stable `E6xxx` code.
use std::io;

/// Every failure of the local provider. Codes are stable: see [`LocalError::code`].
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("user namespaces are not available: {0}")]
    NoUserNamespaces(String),
    #[error("cgroup controller {0} is not available")]
    NoCgroupController(String),
    #[error("seccomp is not available: {0}")]
    NoSeccomp(String),
    #[error("the local provider needs root on the host (CAP_SYS_ADMIN): {0}")]
    NotPrivileged(String),
    #[error("the sandhost-init binary was not found: {0}")]
    InitBinaryNotFound(String),
    #[error("invalid sandbox configuration: {0}")]
    InvalidConfig(String),
    #[error("cgroup setup failed: {0}")]
    Cgroup(String),
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    #[error("no sandbox {0} in the state directory")]
    NotFound(String),
    #[error("sandbox identity mismatch: {0}")]
    IdentityMismatch(String),
    #[error("sandbox {0} is gone (its init no longer answers)")]
    Gone(String),
    #[error("invalid exec request: {0}")]
    InvalidRequest(String),
    #[error("command could not be started: {0}")]
    Spawn(String),
    #[error("cannot connect to port {port} inside the sandbox: {reason}")]
    PortConnect { port: u16, reason: String },
    #[error("channel is closed: {0}")]
    ChannelClosed(String),
    #[error("protocol error talking to the sandbox init: {0}")]
    Protocol(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl LocalError {
    /// The stable code of this error (the one place where codes are assigned).
    pub fn code(&self) -> &'static str {
        match self {
            LocalError::NoUserNamespaces(_) => "E6001",
            LocalError::NoCgroupController(_) => "E6002",
            LocalError::NoSeccomp(_) => "E6003",
            LocalError::NotPrivileged(_) => "E6004",
            LocalError::InitBinaryNotFound(_) => "E6005",
            LocalError::InvalidConfig(_) => "E6010",
            LocalError::Cgroup(_) => "E6011",
            LocalError::Setup(_) => "E6012",
            LocalError::NotFound(_) => "E6020",
            LocalError::IdentityMismatch(_) => "E6021",
            LocalError::Gone(_) => "E6022",
            LocalError::InvalidRequest(_) => "E6030",
            LocalError::Spawn(_) => "E6031",
            LocalError::PortConnect { .. } => "E6032",
            LocalError::ChannelClosed(_) => "E6033",
            LocalError::Protocol(_) => "E6040",
            LocalError::Io { .. } => "E6050",
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        LocalError::Io {
            context: context.into(),
            source,
        }
    }
}

pub(crate) trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, LocalError>;
}

impl<T> IoContext<T> for io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, LocalError> {
        self.map_err(|e| LocalError::io(context(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_and_messages_follow_the_style() {
        let all = [
            LocalError::NoUserNamespaces("x".into()),
            LocalError::NoCgroupController("x".into()),
            LocalError::NoSeccomp("x".into()),
            LocalError::NotPrivileged("x".into()),
            LocalError::InitBinaryNotFound("x".into()),
            LocalError::InvalidConfig("x".into()),
            LocalError::Cgroup("x".into()),
            LocalError::Setup("x".into()),
            LocalError::NotFound("x".into()),
            LocalError::IdentityMismatch("x".into()),
            LocalError::Gone("x".into()),
            LocalError::InvalidRequest("x".into()),
            LocalError::Spawn("x".into()),
            LocalError::PortConnect {
                port: 1,
                reason: "x".into(),
            },
            LocalError::ChannelClosed("x".into()),
            LocalError::Protocol("x".into()),
            LocalError::io("x", io::Error::from(io::ErrorKind::NotFound)),
        ];
        let mut codes: Vec<_> = all.iter().map(LocalError::code).collect();
        assert!(codes.iter().all(|c| c.len() == 5 && c.starts_with("E6")));
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
        for e in &all {
            let m = e.to_string();
            assert!(!m.ends_with('.'), "{m}");
            assert!(!m.starts_with(|c: char| c.is_uppercase()), "{m}");
        }
    }
}
