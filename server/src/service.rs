//! The tonic services: `Cni` (what the plugin calls) and `Ops` (operators). They translate
//! between protobuf and the engine, log one line per request, and map errors with
//! `From<Error> for Status`.

use std::net::IpAddr;
use std::time::Instant;

use ipool_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::config::IpamSection;
use crate::error::Error;
use crate::ipam::{AddRequest, Ipam};
use crate::store::{AttachmentKey, Pod};

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

// === impl CniService ===

pub struct CniService {
    ipam: Ipam,
}

impl CniService {
    pub fn new(ipam: Ipam) -> CniService {
        CniService { ipam }
    }
}

#[tonic::async_trait]
impl pb::cni_server::Cni for CniService {
    async fn add(&self, req: Request<pb::AddRequest>) -> Result<Response<pb::AddResponse>, Status> {
        let started = Instant::now();
        let r = req.into_inner();
        let key = key_of(r.key)?;
        let pod = r.pod.map(|p| Pod {
            namespace: p.namespace,
            name: p.name,
            uid: p.uid,
        });
        let result = async {
            let ipam = IpamSection::parse(&r.ipam_json)?;
            let requested = parse_ips(&r.requested_ips)?;
            self.ipam
                .add(AddRequest {
                    key: key.clone(),
                    pod: pod.clone().unwrap_or_default(),
                    netns: r.netns,
                    ipam,
                    requested,
                })
                .await
        }
        .await;
        let pod = pod.unwrap_or_default();
        match result {
            Ok(reply) => {
                let ips: Vec<String> = reply.leases.iter().map(|l| l.ip.to_string()).collect();
                tracing::info!(op = "ADD", network = %key.network, container = %key.container_id, ifname = %key.ifname, pod = %format!("{}/{}", pod.namespace, pod.name), address = %ips.join(","), us = started.elapsed().as_micros() as u64, outcome = "ok");
                Ok(Response::new(pb::AddResponse {
                    ips: reply
                        .leases
                        .iter()
                        .map(|l| pb::IpConfig {
                            address: format!("{}/{}", l.ip, l.prefix_len),
                            gateway: l.gateway.map(|g| g.to_string()).unwrap_or_default(),
                        })
                        .collect(),
                    routes: reply
                        .routes
                        .into_iter()
                        .map(|r| pb::Route {
                            dst: r.dst,
                            gw: r.gw.unwrap_or_default(),
                        })
                        .collect(),
                }))
            }
            Err(e) => {
                tracing::warn!(op = "ADD", network = %key.network, container = %key.container_id, ifname = %key.ifname, pod = %format!("{}/{}", pod.namespace, pod.name), outcome = "error", error = %e);
                Err(e.into())
            }
        }
    }

    async fn del(&self, req: Request<pb::DelRequest>) -> Result<Response<pb::DelResponse>, Status> {
        let key = key_of(req.into_inner().key)?;
        match self.ipam.del(&key).await {
            Ok(released) => {
                let ips: Vec<String> = released.iter().map(|i| i.to_string()).collect();
                tracing::info!(op = "DEL", network = %key.network, container = %key.container_id, ifname = %key.ifname, address = %ips.join(","), outcome = if ips.is_empty() { "unknown key" } else { "released" });
                Ok(Response::new(pb::DelResponse { released: ips }))
            }
            Err(e) => {
                tracing::warn!(op = "DEL", network = %key.network, container = %key.container_id, ifname = %key.ifname, outcome = "error", error = %e);
                Err(e.into())
            }
        }
    }

    async fn check(
        &self,
        req: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let r = req.into_inner();
        let key = key_of(r.key)?;
        let result = parse_ips(&r.addresses).and_then(|ips| self.ipam.check(&key, &ips));
        match result {
            Ok(()) => {
                tracing::info!(op = "CHECK", network = %key.network, container = %key.container_id, ifname = %key.ifname, outcome = "ok");
                Ok(Response::new(pb::CheckResponse {}))
            }
            Err(e) => {
                tracing::warn!(op = "CHECK", network = %key.network, container = %key.container_id, ifname = %key.ifname, outcome = "error", error = %e);
                Err(e.into())
            }
        }
    }

    async fn gc(&self, req: Request<pb::GcRequest>) -> Result<Response<pb::GcResponse>, Status> {
        let r = req.into_inner();
        let valid = r
            .valid
            .into_iter()
            .map(|v| (v.container_id, v.ifname))
            .collect();
        match self.ipam.gc(&r.network, &valid).await {
            Ok(released) => {
                tracing::info!(op = "GC", network = %r.network, valid = valid.len(), released = released.len(), outcome = "ok");
                let released = released
                    .into_iter()
                    .map(|r| {
                        let ips: Vec<String> = r.addresses.iter().map(|i| i.to_string()).collect();
                        format!("{}/{}={}", r.key.container_id, r.key.ifname, ips.join(","))
                    })
                    .collect();
                Ok(Response::new(pb::GcResponse { released }))
            }
            Err(e) => {
                tracing::warn!(op = "GC", network = %r.network, outcome = "error", error = %e);
                Err(e.into())
            }
        }
    }

    async fn status(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let r = req.into_inner();
        let declared = IpamSection::parse(&r.ipam_json)
            .and_then(|s| match s {
                Some(s) => s.network_def(&r.network, self.ipam.defaults()),
                None => Ok(None),
            })
            .map_err(Status::from)?;
        let (available, reason) = match self.ipam.status(&r.network, declared.as_ref()) {
            Ok(()) => (true, String::new()),
            Err(why) => (false, why),
        };
        tracing::debug!(op = "STATUS", network = %r.network, available, reason = %reason);
        Ok(Response::new(pb::StatusResponse { available, reason }))
    }
}

// === impl OpsService ===

pub struct OpsService {
    ipam: Ipam,
}

impl OpsService {
    pub fn new(ipam: Ipam) -> OpsService {
        OpsService { ipam }
    }
}

fn filter(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

#[tonic::async_trait]
impl pb::ops_server::Ops for OpsService {
    async fn pool_status(
        &self,
        req: Request<pb::PoolStatusRequest>,
    ) -> Result<Response<pb::PoolStatusResponse>, Status> {
        let r = req.into_inner();
        let pools = self
            .ipam
            .pool_status(filter(&r.network))
            .into_iter()
            .map(|p| pb::FamilyPool {
                network: p.network,
                family: p.family.as_str().into(),
                ranges: p.ranges.split(',').map(String::from).collect(),
                capacity: p.capacity as u64,
                in_use: p.in_use as u64,
                idle: p.idle as u64,
                cooling: p.cooling as u64,
                reserved: p.reserved as u64,
                free_in_source: u64::try_from(p.free_in_source).unwrap_or(u64::MAX),
                min_idle: p.min_idle as u64,
                max_idle: p.max_idle as u64,
                bucket_tokens: p.bucket_tokens,
            })
            .collect();
        Ok(Response::new(pb::PoolStatusResponse { pools }))
    }

    async fn list_allocations(
        &self,
        req: Request<pb::ListAllocationsRequest>,
    ) -> Result<Response<pb::ListAllocationsResponse>, Status> {
        let r = req.into_inner();
        let allocations = self
            .ipam
            .attachments(filter(&r.network))
            .into_iter()
            .map(|a| pb::Allocation {
                network: a.key.network,
                container_id: a.key.container_id,
                ifname: a.key.ifname,
                pod_namespace: a.pod.namespace,
                pod_name: a.pod.name,
                pod_uid: a.pod.uid,
                addresses: a.addresses.iter().map(|i| i.to_string()).collect(),
                netns: a.netns,
                created_at_ms: a.created_at_ms,
            })
            .collect();
        Ok(Response::new(pb::ListAllocationsResponse { allocations }))
    }
}
