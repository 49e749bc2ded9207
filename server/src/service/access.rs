//! Who may call what on an Ops listener: `Access` (the Unix socket, or TCP with a token or
//! mTLS) and its check of each request.

use std::sync::Arc;

use tonic::{Request, Status};

/// Who may call what on a listener.
#[derive(Clone, Debug)]
pub enum Access {
    /// The Unix socket (0600, or 0660 with `--socket-group`): read-only calls are open to
    /// whoever can connect; mutating calls need uid 0, ipoold's own uid or, when given, the
    /// group's gid, by the socket's peer credentials (a socket whose mode was loosened does not
    /// let anyone release or drain).
    Local {
        own_uid: Option<u32>,
        group: Option<u32>,
    },
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
        let (token, mtls) = match self {
            Access::Local { own_uid, group } => {
                return match mutating {
                    true => check_local(req, call, *own_uid, *group),
                    false => Ok(()),
                }
            }
            Access::Tcp { token, mtls } => (token, mtls),
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

/// A mutating call on the Unix socket: root, ipoold's own uid, or the socket's group.
fn check_local<T>(
    req: &Request<T>,
    call: &str,
    own_uid: Option<u32>,
    group: Option<u32>,
) -> Result<(), Status> {
    let cred = req
        .extensions()
        .get::<tonic::transport::server::UdsConnectInfo>()
        .and_then(|i| i.peer_cred);
    let Some(c) = cred else {
        return Err(Status::permission_denied(format!(
            "{call}: the caller's credentials are unknown, and mutating calls need them"
        )));
    };
    if c.uid() == 0 || Some(c.uid()) == own_uid || (group.is_some() && Some(c.gid()) == group) {
        return Ok(());
    }
    let mut allowed = vec!["uid 0 (root)".to_string()];
    allowed.extend(
        own_uid
            .filter(|u| *u != 0)
            .map(|u| format!("ipoold's uid {u}")),
    );
    allowed.extend(group.map(|g| format!("gid {g} (--socket-group)")));
    Err(Status::permission_denied(format!(
        "{call} changes ipoold's state and needs {}; this caller runs as uid {} gid {}",
        allowed.join(" or "),
        c.uid(),
        c.gid()
    )))
}

/// Compares without stopping at the first difference.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
