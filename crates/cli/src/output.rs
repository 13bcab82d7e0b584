//! How the CLI reports failures: the code, the message, the offending key or
//! token, and a suggestion, on stderr; `--json` prints the same as one object.

use sandhost_contract::ContractError;
use serde_json::json;

/// Exit status for invalid input (a manifest, template or scenario).
pub const EXIT_INVALID: u8 = 2;
/// Exit status when sandhost itself failed (docker's convention).
pub const EXIT_TOOL_FAILED: u8 = 125;

/// A failure the CLI reports and exits on.
#[derive(Debug)]
pub enum Failure {
    /// Bad input: exit 2, naming the offending key or token.
    Invalid(ContractError),
    /// Something sandhost could not do (an unreadable file, ...): exit 125.
    Tool {
        code: &'static str,
        message: String,
        suggestion: Option<String>,
    },
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Invalid(_) => EXIT_INVALID,
            Self::Tool { .. } => EXIT_TOOL_FAILED,
        }
    }

    pub fn read(what: &str, err: std::io::Error) -> Self {
        Self::Tool {
            code: "E9001",
            message: format!("cannot read {what}: {err}"),
            suggestion: Some("check the path and its permissions".into()),
        }
    }
}

impl From<ContractError> for Failure {
    fn from(e: ContractError) -> Self {
        Self::Invalid(e)
    }
}

pub fn print_failure(f: &Failure, json: bool) {
    let (code, message, key, path, suggestion) = match f {
        Failure::Invalid(e) => (
            e.code().as_str().to_string(),
            e.to_string(),
            e.offending().map(str::to_string),
            e.json_path().map(str::to_string),
            match e {
                ContractError::CapabilityNotSupported(g) => Some(g.suggestion.clone()),
                _ => None,
            },
        ),
        Failure::Tool {
            code,
            message,
            suggestion,
        } => (
            code.to_string(),
            message.clone(),
            None,
            None,
            suggestion.clone(),
        ),
    };
    if json {
        let v = json!({"error": {"code": code, "message": message, "key": key, "path": path, "suggestion": suggestion}});
        eprintln!("{v}");
        return;
    }
    eprintln!("error[{code}]: {message}");
    if let Some(k) = key {
        eprintln!("  offending: {k}");
    }
    if let Some(p) = path {
        eprintln!("  at: {p}");
    }
    if let Some(s) = suggestion {
        eprintln!("  suggestion: {s}");
    }
}
