//! The CNI error: printed as `{"cniVersion", "code", "msg", "details"}` on stdout.

use serde_json::json;

/// One variant per CNI error code this plugin can return.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CniError {
    /// 1: the config's cniVersion is not one this plugin speaks.
    IncompatibleVersion(String),
    /// 3: the container (attachment) is unknown.
    UnknownContainer(String),
    /// 4: a missing or invalid CNI_* environment variable.
    InvalidEnv(String),
    /// 5: reading stdin failed.
    Io(String),
    /// 6: stdin is not valid JSON.
    Decode(String),
    /// 7: the network config is invalid (the message names the key).
    InvalidConfig(String),
    /// 11: the daemon is unreachable or did not answer in time; try again later.
    TryAgainLater(String),
    /// 50: STATUS: the plugin cannot serve an ADD now (the reason says why).
    NotAvailable(String),
    /// 100: the pool has no address left.
    PoolExhausted(String),
    /// 101: the daemon failed in a way that is not the caller's fault.
    Daemon(String),
    /// 102: the attachment holds other addresses than the caller says (CHECK).
    AddressNotHeld(String),
    /// 103: the daemon refused the caller.
    PermissionDenied(String),
    /// 104: a requested static address is held by another attachment.
    AddressInUse(String),
}

impl CniError {
    pub fn code(&self) -> u32 {
        match self {
            CniError::IncompatibleVersion(_) => 1,
            CniError::UnknownContainer(_) => 3,
            CniError::InvalidEnv(_) => 4,
            CniError::Io(_) => 5,
            CniError::Decode(_) => 6,
            CniError::InvalidConfig(_) => 7,
            CniError::TryAgainLater(_) => 11,
            CniError::NotAvailable(_) => 50,
            CniError::PoolExhausted(_) => 100,
            CniError::Daemon(_) => 101,
            CniError::AddressNotHeld(_) => 102,
            CniError::PermissionDenied(_) => 103,
            CniError::AddressInUse(_) => 104,
        }
    }

    /// The short message; the full text goes to `details`.
    fn msg(&self) -> &'static str {
        match self {
            CniError::IncompatibleVersion(_) => "incompatible CNI version",
            CniError::UnknownContainer(_) => "container unknown",
            CniError::InvalidEnv(_) => "invalid environment variables",
            CniError::Io(_) => "I/O failure",
            CniError::Decode(_) => "failed to decode content",
            CniError::InvalidConfig(_) => "invalid network config",
            CniError::TryAgainLater(_) => "try again later",
            CniError::NotAvailable(_) => "plugin not available",
            CniError::PoolExhausted(_) => "address pool exhausted",
            CniError::Daemon(_) => "ipoold failed",
            CniError::AddressNotHeld(_) => "address not held by this container",
            CniError::PermissionDenied(_) => "permission denied",
            CniError::AddressInUse(_) => "requested address in use",
        }
    }

    pub fn details(&self) -> &str {
        match self {
            CniError::IncompatibleVersion(d)
            | CniError::UnknownContainer(d)
            | CniError::InvalidEnv(d)
            | CniError::Io(d)
            | CniError::Decode(d)
            | CniError::InvalidConfig(d)
            | CniError::TryAgainLater(d)
            | CniError::NotAvailable(d)
            | CniError::AddressInUse(d)
            | CniError::PoolExhausted(d)
            | CniError::Daemon(d)
            | CniError::AddressNotHeld(d)
            | CniError::PermissionDenied(d) => d,
        }
    }

    /// Attaches the cniVersion to print with the error.
    pub fn with_version(self, version: &str) -> VersionedError {
        VersionedError {
            version: version.to_string(),
            error: self,
        }
    }

    /// The error as printed when the config's version is not known (yet).
    pub fn to_json(&self) -> String {
        self.clone()
            .with_version(crate::result::FALLBACK_VERSION)
            .to_json()
    }

    /// The one place where a gRPC status from ipoold becomes a CNI error. (A call that got
    /// no status at all is mapped in `client`.)
    pub fn from_grpc(code: i32, message: String) -> CniError {
        use tonic::Code;
        let m = message;
        let code = Code::from_i32(code);
        match code {
            Code::InvalidArgument | Code::OutOfRange => CniError::InvalidConfig(m),
            Code::NotFound => CniError::UnknownContainer(m),
            Code::FailedPrecondition => CniError::AddressNotHeld(m),
            Code::AlreadyExists => CniError::AddressInUse(m),
            Code::ResourceExhausted => CniError::PoolExhausted(m),
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
                CniError::TryAgainLater(format!("ipoold: {m}"))
            }
            Code::PermissionDenied | Code::Unauthenticated => CniError::PermissionDenied(m),
            Code::Ok | Code::Unknown | Code::Internal | Code::DataLoss | Code::Unimplemented => {
                CniError::Daemon(format!("{code:?}: {m}"))
            }
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VersionedError {
    pub version: String,
    pub error: CniError,
}

impl VersionedError {
    pub fn to_json(&self) -> String {
        json!({
            "cniVersion": self.version,
            "code": self.error.code(),
            "msg": self.error.msg(),
            "details": self.error.details(),
        })
        .to_string()
    }
}

impl From<CniError> for VersionedError {
    fn from(e: CniError) -> Self {
        e.with_version(crate::result::FALLBACK_VERSION)
    }
}

#[cfg(test)]
mod tests;
