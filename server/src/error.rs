//! The daemon's error type, and the one place that maps it to gRPC status codes.
//! (The plugin maps those codes to CNI error codes in one place too.)

use tonic::{Code, Status};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A request field that is missing or malformed (not the network config).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The network config (the `ipam` section or the daemon's TOML) is invalid, or it
    /// conflicts with what the daemon already holds for that network.
    #[error("invalid network config: {0}")]
    InvalidConfig(String),
    /// The attachment or network is not known.
    #[error("{0}")]
    NotFound(String),
    /// The state differs from what the caller expects (CHECK with a foreign address).
    #[error("{0}")]
    Mismatch(String),
    /// A requested static address is held by another attachment.
    #[error("{0}")]
    InUse(String),
    /// No address left in a pool.
    #[error("{0}")]
    Exhausted(String),
    /// A transient condition: retry later.
    #[error("{0}")]
    Busy(String),
    /// The store refused or failed; nothing of the request took effect.
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
}

impl From<Error> for Status {
    fn from(e: Error) -> Status {
        let code = match &e {
            Error::InvalidRequest(_) | Error::InvalidConfig(_) => Code::InvalidArgument,
            Error::NotFound(_) => Code::NotFound,
            Error::Mismatch(_) => Code::FailedPrecondition,
            Error::InUse(_) => Code::AlreadyExists,
            Error::Exhausted(_) => Code::ResourceExhausted,
            Error::Busy(_) => Code::Unavailable,
            // Until the store is reopened: the runtime retries (CNI error 11).
            Error::Store(crate::store::StoreError::Failed { .. }) => Code::Unavailable,
            Error::Store(_) => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}
