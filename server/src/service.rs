//! The tonic services: `Cni` (what the plugin calls) and `Ops` (operators). They translate
//! between protobuf and the engine, log one line per request, and map errors with
//! `From<Error> for Status`.
//!
//! - `cni`: `CniService` and its peer-uid check.
//! - `ops`: `OpsService`.
//! - `access`: `Access`, who may call what on an Ops listener.
//! - `limits`: how many Ops reads and watchers run at once, per listener and per TCP peer.

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
