//! Reaching ipoold: the channel over the Unix socket or TCP (with TLS or mTLS), and the
//! bearer token on each request.

use std::time::Duration;

use pb::ops_client::OpsClient;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status};

use crate::{pb, read, Args, Command};

pub(super) async fn connect(args: &Args) -> Result<OpsClient<Channel>, String> {
    Ok(OpsClient::new(channel(args).await?))
}

/// A channel to ipoold (socket or TCP).
pub(super) async fn channel(args: &Args) -> Result<Channel, String> {
    let watching = matches!(args.command, Command::Watch { .. });
    let endpoint = match &args.addr {
        None => Endpoint::from_shared(format!("unix://{}", args.socket.display()))
            .map_err(|e| format!("bad socket path {}: {e}", args.socket.display()))?,
        Some(addr) => {
            let scheme = if args.tls_ca.is_some() {
                "https"
            } else {
                "http"
            };
            let mut ep = Endpoint::from_shared(format!("{scheme}://{addr}"))
                .map_err(|e| format!("bad --addr {addr:?} (want HOST:PORT): {e}"))?;
            if let Some(ca) = &args.tls_ca {
                let mut tls = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(read(ca, "--tls-ca")?));
                if let (Some(c), Some(k)) = (&args.tls_cert, &args.tls_key) {
                    tls = tls.identity(Identity::from_pem(
                        read(c, "--tls-cert")?,
                        read(k, "--tls-key")?,
                    ));
                }
                if let Some(name) = &args.tls_server_name {
                    tls = tls.domain_name(name.clone());
                }
                ep = ep
                    .tls_config(tls)
                    .map_err(|e| format!("TLS settings: {e}"))?;
            }
            ep
        }
    };
    let mut endpoint = endpoint.connect_timeout(Duration::from_secs(3));
    if !watching {
        endpoint = endpoint.timeout(Duration::from_secs(10));
    }
    let target = match &args.addr {
        Some(a) => a.clone(),
        None => args.socket.display().to_string(),
    };
    let channel = endpoint.connect().await.map_err(|e| {
        let cause = std::error::Error::source(&e)
            .map(|s| s.to_string())
            .unwrap_or_else(|| e.to_string());
        format!(
            "cannot reach ipoold at {target}: {cause} (is it running? is --socket / --addr right?)"
        )
    })?;
    Ok(channel)
}

/// Wraps a message, adding the bearer token when there is one.
pub(super) fn request<T>(msg: T, token: &Option<String>) -> Result<Request<T>, Status> {
    let mut r = Request::new(msg);
    if let Some(t) = token {
        let v = MetadataValue::try_from(format!("Bearer {t}")).map_err(|_| {
            Status::invalid_argument("the token file holds characters a header cannot carry")
        })?;
        r.metadata_mut().insert("authorization", v);
    }
    Ok(r)
}
