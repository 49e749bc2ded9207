//! The tonic services: `Cni` (what the plugin calls) and `Ops` (operators). They translate
//! between protobuf and the engine, log one line per request, and map errors with
//! `From<Error> for Status`.
//!
//! # Layout
//! - `access`: `Access`, who may call what on an Ops listener (the Unix socket, or TCP with a
//!   token or mTLS);
//! - `cni`: `CniService`, what the plugin calls, and its peer-uid check;
//! - [`fixed`]: pods with a fixed address, decided around the engine's ADD and DEL;
//! - [`host_local`]: host-local's allocations taken over in place;
//! - `limits`: how many Ops reads and watchers run at once, per listener and per TCP peer, so
//!   that operators' reads never starve the CNI path;
//! - `ops`: `OpsService`, what operators call.

use std::net::IpAddr;

use ipool_proto::v1 as pb;

use crate::error::Error;
use crate::store::AttachmentKey;

mod access;
mod cni;
pub mod fixed;
pub mod host_local;
mod limits;
mod ops;

pub use access::Access;
pub use cni::CniService;
pub use ops::OpsService;
pub use pb::cni_server::CniServer;
pub use pb::ops_server::OpsServer;

fn key_of(k: Option<pb::AttachmentKey>) -> Result<AttachmentKey, Error> {
    let k = k.ok_or_else(|| Error::InvalidRequest("the attachment key is missing".into()))?;
    Ok(AttachmentKey {
        network: k.network,
        container_id: k.container_id,
        ifname: k.ifname,
    })
}

fn parse_ips(v: &[String]) -> Result<Vec<IpAddr>, Error> {
    v.iter()
        .map(|s| {
            let bare = s.split('/').next().unwrap_or(s);
            bare.parse()
                .map_err(|_| Error::InvalidRequest(format!("{s:?} is not an IP address")))
        })
        .collect()
}
