//! The one gRPC call to ipoold over its Unix socket, bounded by a deadline: a daemon that is
//! absent or does not answer is CNI error 11 (try again later), never a hang.

use std::future::Future;

use ipool_proto::v1 as pb;
use pb::cni_client::CniClient;
use tonic::transport::{Channel, Endpoint};

use crate::error::CniError;
use crate::invocation::{Call, Command};
use crate::result::{add_result, dns_from_resolv_conf, version_result};

/// Executes the call; returns what to print on success.
pub fn execute(call: &Call) -> Result<String, CniError> {
    if call.command == Command::Version {
        return Ok(version_result(&call.version));
    }
    // One thread is enough for one call, and starts fastest.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CniError::Daemon(format!("cannot start the async runtime: {e}")))?;
    let out = rt.block_on(within_deadline(call, rpc(call)));
    if call.command == Command::Status {
        // STATUS reports every failure, the daemon's absence included, as "cannot serve ADD".
        return out.map_err(|e| match e {
            CniError::NotAvailable(_) => e,
            other => CniError::NotAvailable(other.details().to_string()),
        });
    }
    out
}

/// The result's `dns`: the `resolvConf` file's contents, else `ipam.dns`, else empty.
fn result_dns(call: &Call) -> Result<serde_json::Value, CniError> {
    if let Some(path) = &call.resolv_conf {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CniError::InvalidConfig(format!("ipam.resolvConf {path:?} cannot be read: {e}"))
        })?;
        return Ok(dns_from_resolv_conf(&text));
    }
    Ok(call.dns.clone().unwrap_or_else(|| serde_json::json!({})))
}

async fn within_deadline<F>(call: &Call, f: F) -> Result<String, CniError>
where
    F: Future<Output = Result<String, CniError>>,
{
    match tokio::time::timeout(call.timeout, f).await {
        Ok(r) => r,
        Err(_) => Err(CniError::TryAgainLater(format!(
            "ipoold at {} did not answer within {} ms (set ipam.timeoutMs to wait longer)",
            call.socket,
            call.timeout.as_millis()
        ))),
    }
}

async fn connect(call: &Call) -> Result<CniClient<Channel>, CniError> {
    let endpoint = Endpoint::from_shared(format!("unix://{}", call.socket)).map_err(|e| {
        CniError::InvalidConfig(format!("ipam.socket {:?} is not usable: {e}", call.socket))
    })?;
    let channel = endpoint
        .connect_timeout(call.timeout)
        .connect()
        .await
        .map_err(|e| {
            let cause = std::error::Error::source(&e)
                .map(|s| s.to_string())
                .unwrap_or_else(|| e.to_string());
            CniError::TryAgainLater(format!(
                "cannot reach ipoold at {}: {cause} (is the ipool daemon running on this node?)",
                call.socket
            ))
        })?;
    Ok(CniClient::new(channel))
}

fn key(call: &Call) -> Option<pb::AttachmentKey> {
    Some(pb::AttachmentKey {
        network: call.network.clone(),
        container_id: call.container_id.clone(),
        ifname: call.ifname.clone(),
    })
}

async fn rpc(call: &Call) -> Result<String, CniError> {
    // Read the local dns source first: a bad resolvConf must not leave an allocation behind.
    let dns = match call.command {
        Command::Add => result_dns(call)?,
        _ => serde_json::Value::Null,
    };
    let mut client = connect(call).await?;
    let status = |s: tonic::Status| CniError::from_status(&s);
    match call.command {
        Command::Add => {
            let reply = client
                .add(pb::AddRequest {
                    key: key(call),
                    pod: Some(pb::PodIdentity {
                        namespace: call.pod.namespace.clone(),
                        name: call.pod.name.clone(),
                        uid: call.pod.uid.clone(),
                    }),
                    ipam_json: call.ipam_json.clone(),
                    netns: call.netns.clone(),
                    requested_ips: call.requested_ips.clone(),
                })
                .await
                .map_err(status)?;
            Ok(add_result(&call.version, reply.get_ref(), &dns))
        }
        Command::Del => {
            client
                .del(pb::DelRequest {
                    key: key(call),
                    ipam_json: call.ipam_json.clone(),
                })
                .await
                .map_err(status)?;
            Ok(String::new())
        }
        Command::Check => {
            client
                .check(pb::CheckRequest {
                    key: key(call),
                    ipam_json: call.ipam_json.clone(),
                    addresses: call.prev_addresses.clone(),
                })
                .await
                .map_err(status)?;
            Ok(String::new())
        }
        Command::Gc => {
            client
                .gc(pb::GcRequest {
                    network: call.network.clone(),
                    valid: call
                        .valid_attachments
                        .iter()
                        .map(|(c, i)| pb::AttachmentRef {
                            container_id: c.clone(),
                            ifname: i.clone(),
                        })
                        .collect(),
                })
                .await
                .map_err(status)?;
            Ok(String::new())
        }
        Command::Status => {
            let r = client
                .status(pb::StatusRequest {
                    network: call.network.clone(),
                    ipam_json: call.ipam_json.clone(),
                })
                .await
                .map_err(status)?
                .into_inner();
            if r.available {
                Ok(String::new())
            } else {
                Err(CniError::NotAvailable(r.reason))
            }
        }
        Command::Version => Ok(version_result(&call.version)),
    }
}
