//! The CNI service: what the plugin calls (ADD, DEL, CHECK, GC, STATUS), for root (and
//! ipoold's own uid) only, checked with the Unix socket's peer credentials.

use std::time::Instant;

use ipool_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::{key_of, parse_ips};
use crate::cluster::pin::hold::Holds;
use crate::config::IpamSection;
use crate::ipam::{AddRequest, Ipam};
use crate::k8s::Pods;
use crate::store::Pod;

pub struct CniService {
    ipam: Ipam,
    /// Peer uids allowed besides root: the daemon's own (it owns the socket anyway).
    own_uid: Option<u32>,
    /// The pods of this node (Kubernetes only): an ADD for a pod takes its metadata.
    pods: Option<Pods>,
    /// The pins of this node's pods (cluster mode): fixed addresses.
    holds: Option<Holds>,
    /// host-local's allocations, taken over when a network is first served.
    takeover: super::host_local::Takeover,
}

impl CniService {
    pub fn new(
        ipam: Ipam,
        own_uid: Option<u32>,
        pods: Option<Pods>,
        holds: Option<Holds>,
    ) -> CniService {
        CniService {
            ipam,
            own_uid,
            pods,
            holds,
            takeover: Default::default(),
        }
    }

    /// Only root (and the daemon's own user) may call the CNI service: the runtime runs
    /// plugins as root. Checked with the Unix socket's peer credentials.
    fn check_peer<T>(&self, req: &Request<T>) -> Result<(), Status> {
        let cred = req
            .extensions()
            .get::<tonic::transport::server::UdsConnectInfo>()
            .and_then(|i| i.peer_cred);
        match cred {
            Some(c) if c.uid() == 0 || Some(c.uid()) == self.own_uid => Ok(()),
            Some(c) => Err(Status::permission_denied(format!(
                "the CNI service accepts only uid 0 (root){}; this caller runs as uid {} (container runtimes run CNI plugins as root; operators use the Ops service)",
                self.own_uid
                    .filter(|u| *u != 0)
                    .map(|u| format!(" and ipoold's own uid {u}"))
                    .unwrap_or_default(),
                c.uid()
            ))),
            // Not over the Unix socket (the service is only served there): nothing to check.
            None => Ok(()),
        }
    }
}

impl CniService {
    async fn add_inner(
        &self,
        req: Request<pb::AddRequest>,
    ) -> Result<Response<pb::AddResponse>, Status> {
        self.check_peer(&req)?;
        let started = Instant::now();
        let r = req.into_inner();
        let key = key_of(r.key)?;
        let mut pod = r.pod.map(|p| Pod {
            namespace: p.namespace,
            name: p.name,
            uid: p.uid,
        });
        let result = async {
            let ipam = IpamSection::parse(&r.ipam_json)?;
            self.takeover
                .network(&self.ipam, self.pods.as_ref(), &key.network, ipam.as_ref())
                .await?;
            let mut requested = parse_ips(&r.requested_ips)?;
            // A pod's ADD (K8S_POD_NAME given) takes the pod's metadata from the apiserver;
            // any other (podman, `ctr run --cni`) is served as it comes.
            let info = match (&self.pods, &mut pod) {
                (Some(pods), Some(p)) if !p.name.is_empty() => {
                    let info = pods.info_for(p).await?;
                    if p.uid.is_empty() {
                        p.uid = info.uid.clone();
                    }
                    Some(info)
                }
                _ => None,
            };
            // The runtime's own static addresses win over the pod's annotation.
            if requested.is_empty() {
                requested = info.as_ref().map(|i| i.ips.clone()).unwrap_or_default();
            }
            // A pod's choice of cluster pools (its own, else its namespace's) counts on a
            // network of cluster pools only.
            let pools = match (&info, &self.pods) {
                (Some(i), Some(pods))
                    if self.ipam.takes_cluster_pools(&key.network, ipam.as_ref()) =>
                {
                    match &i.pools {
                        Err(why) => return Err(crate::error::Error::InvalidRequest(why.0.clone())),
                        Ok(Some(c)) => Some(c.clone()),
                        Ok(None) => {
                            let ns = pod.as_ref().map(|p| p.namespace.as_str()).unwrap_or("");
                            pods.namespace_choice(ns).await?
                        }
                    }
                }
                _ => None,
            };
            let fixed = super::fixed::fixed_for(
                &self.ipam,
                self.holds.as_ref(),
                &key.network,
                ipam.as_ref(),
                info.as_ref(),
            )?;
            let req = AddRequest {
                key: key.clone(),
                pod: pod.clone().unwrap_or_default(),
                netns: r.netns,
                ipam,
                requested,
                k8s: info.map(|i| i.meta),
                pools,
                fixed: false,
            };
            match (fixed, &self.holds) {
                (Some(fixed), Some(holds)) => {
                    super::fixed::add(&self.ipam, holds, req, fixed).await
                }
                _ => self.ipam.add(req).await,
            }
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
                if let (Some(pods), crate::error::Error::Refused { refusal, message }) =
                    (&self.pods, &e)
                {
                    pods.refused(&pod, *refusal, message);
                }
                Err(e.into())
            }
        }
    }

    async fn del_inner(
        &self,
        req: Request<pb::DelRequest>,
    ) -> Result<Response<pb::DelResponse>, Status> {
        self.check_peer(&req)?;
        let r = req.into_inner();
        let key = key_of(r.key)?;
        let result = async {
            // A container host-local addressed: taken over first, so that its DEL finds it.
            let ipam = IpamSection::parse(&r.ipam_json)?;
            self.takeover
                .network(&self.ipam, self.pods.as_ref(), &key.network, ipam.as_ref())
                .await?;
            super::fixed::del(&self.ipam, self.holds.as_ref(), &key).await
        }
        .await;
        match result {
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

    async fn check_inner(
        &self,
        req: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        self.check_peer(&req)?;
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

    async fn gc_inner(
        &self,
        req: Request<pb::GcRequest>,
    ) -> Result<Response<pb::GcResponse>, Status> {
        self.check_peer(&req)?;
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

    async fn status_inner(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        self.check_peer(&req)?;
        let r = req.into_inner();
        let declared = IpamSection::parse(&r.ipam_json)
            .and_then(|s| match s {
                Some(s) => s.network_def(&r.network, self.ipam.defaults()),
                None => Ok(None),
            })
            .map_err(Status::from)?;
        let (available, reason) = match self.ipam.status(&r.network, declared.as_ref()) {
            Ok(()) => (true, String::new()),
            Err(why) => (false, why.0),
        };
        tracing::debug!(op = "STATUS", network = %r.network, available, reason = %reason);
        Ok(Response::new(pb::StatusResponse { available, reason }))
    }
}

#[tonic::async_trait]
impl pb::cni_server::Cni for CniService {
    async fn add(&self, req: Request<pb::AddRequest>) -> Result<Response<pb::AddResponse>, Status> {
        let started = Instant::now();
        let result = self.add_inner(req).await;
        self.ipam
            .metrics()
            .observe("ADD", result.as_ref().err(), started.elapsed());
        result
    }

    async fn del(&self, req: Request<pb::DelRequest>) -> Result<Response<pb::DelResponse>, Status> {
        let started = Instant::now();
        let result = self.del_inner(req).await;
        self.ipam
            .metrics()
            .observe("DEL", result.as_ref().err(), started.elapsed());
        result
    }

    async fn check(
        &self,
        req: Request<pb::CheckRequest>,
    ) -> Result<Response<pb::CheckResponse>, Status> {
        let started = Instant::now();
        let result = self.check_inner(req).await;
        self.ipam
            .metrics()
            .observe("CHECK", result.as_ref().err(), started.elapsed());
        result
    }

    async fn gc(&self, req: Request<pb::GcRequest>) -> Result<Response<pb::GcResponse>, Status> {
        let started = Instant::now();
        let result = self.gc_inner(req).await;
        self.ipam
            .metrics()
            .observe("GC", result.as_ref().err(), started.elapsed());
        result
    }

    async fn status(
        &self,
        req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let started = Instant::now();
        let result = self.status_inner(req).await;
        self.ipam
            .metrics()
            .observe("STATUS", result.as_ref().err(), started.elapsed());
        result
    }
}
