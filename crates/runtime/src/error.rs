//! The runtime's error enum; codes are mapped once, in [`RuntimeError::code`].

use sandhost_contract::ErrorCode;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot open the state store at {path}: {source}")]
    StoreOpen {
        path: String,
        source: rusqlite::Error,
    },

    #[error("state store query failed while {doing}: {source}")]
    Store {
        doing: &'static str,
        source: rusqlite::Error,
    },

    #[error(
        "state store at {path} has schema version {found}, newer than this sandhost ({supported})"
    )]
    StoreTooNew {
        path: String,
        found: i64,
        supported: i64,
    },

    #[error("no {what} with id `{id}`")]
    NotFound { what: &'static str, id: String },

    #[error("cannot create the home directory {path}: {source}")]
    Home {
        path: String,
        source: std::io::Error,
    },
}

impl RuntimeError {
    pub fn code(&self) -> ErrorCode {
        ErrorCode(match self {
            Self::StoreOpen { .. } => "E5001",
            Self::Store { .. } => "E5002",
            Self::StoreTooNew { .. } => "E5003",
            Self::NotFound { .. } => "E5004",
            Self::Home { .. } => "E5005",
        })
    }

    pub(crate) fn store(doing: &'static str) -> impl FnOnce(rusqlite::Error) -> Self {
        move |source| Self::Store { doing, source }
    }
}
