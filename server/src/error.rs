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
    /// An ADD refused for a reason an operator can act on: recorded on the pod too (an Event).
    #[error("{message}")]
    Refused { refusal: Refusal, message: String },
}

impl From<crate::model::Invalid> for Error {
    fn from(e: crate::model::Invalid) -> Error {
        Error::InvalidConfig(e.0)
    }
}

/// Why an ADD was refused, where an operator can act on it (an Event's `reason` on the pod).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// No address left in the pool, and no block to claim.
    PoolExhausted,
    /// The node may use none of the pools the pod could take an address from (their
    /// nodeSelectors).
    NoPoolForNode,
    /// The pool is disabled (`ipoolctl cluster pool disable`).
    PoolDisabled,
    /// The pod's fixed address is held by a pod on another node.
    FixedAddressElsewhere,
    /// The node has not renewed its heartbeat in the store within its fence.
    NodeFenced,
}

impl Refusal {
    /// The Event's `reason` (CamelCase, as Kubernetes' own reasons).
    pub fn reason(self) -> &'static str {
        match self {
            Refusal::PoolExhausted => "PoolExhausted",
            Refusal::NoPoolForNode => "NoPoolForNode",
            Refusal::PoolDisabled => "PoolDisabled",
            Refusal::FixedAddressElsewhere => "FixedAddressElsewhere",
            Refusal::NodeFenced => "NodeFenced",
        }
    }

    /// What an operator does about it, said after the ADD's error on the pod.
    pub fn remedy(self) -> &'static str {
        match self {
            Refusal::PoolExhausted => "give the pool more addresses (a cluster pool: ipoolctl cluster pool add-cidr; a network's ranges: its config), or free some; `ipoolctl status` and `ipoolctl cluster pool list` show how full each pool is",
            Refusal::NoPoolForNode => "label the node so that a pool's nodeSelector matches it, or change the pool's (ipoolctl cluster pool set-node-selector), or choose another pool for the pod (annotation ipool.io/pools)",
            Refusal::PoolDisabled => "enable the pool (ipoolctl cluster pool enable), or choose another pool for the pod (annotation ipool.io/pools)",
            Refusal::FixedAddressElsewhere => "the pod's previous instance still holds its address on another node: it comes free when that pod is gone (delete it, or release the node if it is down: ipoolctl cluster release-node)",
            Refusal::NodeFenced => "check the node's connection to the cluster store (ipoolctl status; the daemon's log): ADDs resume once its heartbeat is renewed",
        }
    }

    fn code(self) -> Code {
        match self {
            Refusal::PoolExhausted => Code::ResourceExhausted,
            Refusal::NoPoolForNode => Code::InvalidArgument,
            // Retried by the runtime (CNI error 11): each passes without a change here.
            Refusal::PoolDisabled | Refusal::FixedAddressElsewhere | Refusal::NodeFenced => {
                Code::Unavailable
            }
        }
    }
}

impl Error {
    /// A transient condition: the same call may succeed later without a change of config.
    pub fn is_busy(&self) -> bool {
        match self {
            Error::Busy(_) => true,
            Error::Refused { refusal, .. } => refusal.code() == Code::Unavailable,
            _ => false,
        }
    }
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
            Error::Refused { refusal, .. } => refusal.code(),
        };
        Status::new(code, e.to_string())
    }
}
