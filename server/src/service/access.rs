//! Who may call what on an Ops listener: `Access` (the Unix socket, or TCP with a token or
//! mTLS) and its check of each request.

use std::sync::Arc;

use tonic::{Request, Status};

/// Who may call what on a listener.
#[derive(Clone, Debug)]
pub enum Access {
    /// The Unix socket: only root can connect (0600); every call is allowed.
    Local,
    /// TCP. Read-only calls from loopback are open; everything else needs the bearer token, or
    /// a client certificate (with mTLS every connection has one, checked by the TLS layer).
    Tcp { token: Option<Arc<str>>, mtls: bool },
}

impl Access {
    pub(super) fn check<T>(
        &self,
        req: &Request<T>,
        call: &str,
        mutating: bool,
    ) -> Result<(), Status> {
        let Access::Tcp { token, mtls } = self else {
            return Ok(());
        };
        if *mtls {
            return Ok(());
        }
        let loopback = req.remote_addr().is_some_and(|a| a.ip().is_loopback());
        if !mutating && loopback {
            return Ok(());
        }
        let Some(token) = token else {
            return Err(Status::permission_denied(format!(
                "{call} over TCP needs authentication, and ipoold has none configured: start it with --ops-token-file or --tls-client-ca, or use the Unix socket"
            )));
        };
        let sent = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match sent {
            Some(s) if same_secret(s.as_bytes(), token.as_bytes()) => Ok(()),
            Some(_) => Err(Status::unauthenticated(format!(
                "{call}: the bearer token is wrong"
            ))),
            None => Err(Status::unauthenticated(format!(
                "{call} needs the header 'authorization: Bearer <token>' (ipoolctl --token-file)"
            ))),
        }
    }
}

/// Compares without stopping at the first difference.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
