//! The one gRPC call to ipoold over its Unix socket ([`crate::grpc`]), bounded by a deadline: a
//! daemon that is absent or does not answer is CNI error 11 (try again later), never a hang.

use std::path::Path;
use std::time::Instant;

use ipool_proto::v1 as pb;

use crate::error::CniError;
use crate::grpc::{self, CallError};
use crate::input::read_resolv_conf;
use crate::invocation::{Call, Command};
use crate::result::{add_result, dns_from_resolv_conf, version_result};

/// Executes the call; returns what to print on success.
pub fn execute(call: &Call) -> Result<String, CniError> {
    if call.command == Command::Version {
        return Ok(version_result(&call.version));
    }
    let out = rpc(call, Instant::now() + call.timeout);
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
        return Ok(dns_from_resolv_conf(&read_resolv_conf(path)?));
    }
    Ok(call.dns.clone().unwrap_or_else(|| serde_json::json!({})))
}

/// Calls `Cni/<method>` on ipoold; every way it can fail becomes its CNI error here.
fn invoke<Req, Resp>(
    call: &Call,
    method: &str,
    request: &Req,
    deadline: Instant,
) -> Result<Resp, CniError>
where
    Req: prost::Message,
    Resp: prost::Message + Default,
{
    let path = format!("/ipool.v1.Cni/{method}");
    let reply = grpc::unary(
        Path::new(&call.socket),
        &path,
        &request.encode_to_vec(),
        deadline,
    )
    .map_err(|e| call_error(call, e))?;
    if reply.code != 0 {
        return Err(CniError::from_grpc(reply.code, reply.message));
    }
    Resp::decode(reply.body.as_slice())
        .map_err(|e| CniError::Daemon(format!("cannot decode ipoold's {method} reply: {e}")))
}

/// A call that got no gRPC status: the daemon is absent, slow, or the connection broke.
fn call_error(call: &Call, e: CallError) -> CniError {
    match e {
        CallError::Connect(e) if e.kind() == std::io::ErrorKind::InvalidInput => {
            CniError::InvalidConfig(format!("ipam.socket {:?} is not usable: {e}", call.socket))
        }
        CallError::Connect(e) => CniError::TryAgainLater(format!(
            "cannot reach ipoold at {}: {e} (is the ipool daemon running on this node?)",
            call.socket
        )),
        CallError::Deadline => CniError::TryAgainLater(format!(
            "ipoold at {} did not answer within {} ms (set ipam.timeoutMs to wait longer)",
            call.socket,
            call.timeout.as_millis()
        )),
        // The outcome is unknown and repeating the call is safe (ADD is idempotent, DEL
        // permissive), so: try again later.
        CallError::Broken(why) => CniError::TryAgainLater(format!(
            "the connection to ipoold broke during the call ({why}); it may or may not have taken effect, and repeating it is safe"
        )),
    }
}

fn key(call: &Call) -> Option<pb::AttachmentKey> {
    Some(pb::AttachmentKey {
        network: call.network.clone(),
        container_id: call.container_id.clone(),
        ifname: call.ifname.clone(),
    })
}

fn rpc(call: &Call, deadline: Instant) -> Result<String, CniError> {
    // Read the local dns source first: a bad resolvConf must not leave an allocation behind.
    let dns = match call.command {
        Command::Add => result_dns(call)?,
        _ => serde_json::Value::Null,
    };
    match call.command {
        Command::Add => {
            let reply: pb::AddResponse = invoke(
                call,
                "Add",
                &pb::AddRequest {
                    key: key(call),
                    pod: Some(pb::PodIdentity {
                        namespace: call.pod.namespace.clone(),
                        name: call.pod.name.clone(),
                        uid: call.pod.uid.clone(),
                    }),
                    ipam_json: call.ipam_json.clone(),
                    netns: call.netns.clone(),
                    requested_ips: call.requested_ips.clone(),
                },
                deadline,
            )?;
            Ok(add_result(&call.version, &reply, &dns))
        }
        Command::Del => {
            let _: pb::DelResponse = invoke(
                call,
                "Del",
                &pb::DelRequest {
                    key: key(call),
                    ipam_json: call.ipam_json.clone(),
                },
                deadline,
            )?;
            Ok(String::new())
        }
        Command::Check => {
            let _: pb::CheckResponse = invoke(
                call,
                "Check",
                &pb::CheckRequest {
                    key: key(call),
                    ipam_json: call.ipam_json.clone(),
                    addresses: call.prev_addresses.clone(),
                },
                deadline,
            )?;
            Ok(String::new())
        }
        Command::Gc => {
            let _: pb::GcResponse = invoke(
                call,
                "Gc",
                &pb::GcRequest {
                    network: call.network.clone(),
                    valid: call
                        .valid_attachments
                        .iter()
                        .map(|(c, i)| pb::AttachmentRef {
                            container_id: c.clone(),
                            ifname: i.clone(),
                        })
                        .collect(),
                },
                deadline,
            )?;
            Ok(String::new())
        }
        Command::Status => {
            let r: pb::StatusResponse = invoke(
                call,
                "Status",
                &pb::StatusRequest {
                    network: call.network.clone(),
                    ipam_json: call.ipam_json.clone(),
                },
                deadline,
            )?;
            if r.available {
                Ok(String::new())
            } else {
                Err(CniError::NotAvailable(r.reason))
            }
        }
        Command::Version => Ok(version_result(&call.version)),
    }
}
