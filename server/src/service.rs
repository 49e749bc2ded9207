//! The tonic services: `Cni` (what the plugin calls) and `Ops` (operators). They translate
//! between protobuf and the engine, log one line per request, and map errors with
//! `From<Error> for Status`.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use ipool_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::config::IpamSection;
use crate::error::Error;
use crate::ipam::{AddRequest, Event, EventKind, Filter, Ipam};
use crate::store::{AttachmentKey, AttachmentRecord, Pod, Reservation, ReservationKey};

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
    /// Peer uids allowed besides root: the daemon's own (it owns the socket anyway).
    own_uid: Option<u32>,
}

impl CniService {
    pub fn new(ipam: Ipam, own_uid: Option<u32>) -> CniService {
        CniService { ipam, own_uid }
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

    async fn del_inner(
        &self,
        req: Request<pb::DelRequest>,
    ) -> Result<Response<pb::DelResponse>, Status> {
        self.check_peer(&req)?;
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
            Err(why) => (false, why),
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

// === impl OpsService ===

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
    fn check<T>(&self, req: &Request<T>, call: &str, mutating: bool) -> Result<(), Status> {
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

pub struct OpsService {
    ipam: Ipam,
    access: Access,
}

impl OpsService {
    pub fn new(ipam: Ipam, access: Access) -> OpsService {
        OpsService { ipam, access }
    }
}

fn filter(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

fn owned(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn one_ip(s: &str, what: &str) -> Result<Option<IpAddr>, Error> {
    if s.is_empty() {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|_| Error::InvalidRequest(format!("{what} {s:?} is not an IP address")))
}

fn ifname_or_default(s: String) -> String {
    if s.is_empty() {
        "eth0".into()
    } else {
        s
    }
}

fn allocation_pb(a: AttachmentRecord) -> pb::Allocation {
    pb::Allocation {
        network: a.key.network,
        container_id: a.key.container_id,
        ifname: a.key.ifname,
        pod_namespace: a.pod.namespace,
        pod_name: a.pod.name,
        pod_uid: a.pod.uid,
        addresses: a.addresses.iter().map(|i| i.to_string()).collect(),
        netns: a.netns,
        created_at_ms: a.created_at_ms,
    }
}

fn reservation_pb(r: Reservation) -> pb::Reservation {
    pb::Reservation {
        network: r.key.network,
        namespace: r.key.namespace,
        name: r.key.name,
        addresses: r.addresses.iter().map(|i| i.to_string()).collect(),
        created_at_ms: r.created_at_ms,
        expires_at_ms: r.expires_at_ms,
        reason: r.reason,
    }
}

fn event_pb(e: Event) -> pb::Event {
    use pb::event::Kind;
    let kind = match e.kind {
        EventKind::Add => Kind::Add,
        EventKind::Release => Kind::Release,
        EventKind::Reserve => Kind::Reserve,
        EventKind::Expire => Kind::Expire,
        EventKind::Gc => Kind::Gc,
    };
    pb::Event {
        kind: kind as i32,
        at_ms: e.at_ms,
        network: e.network,
        container_id: e.container_id,
        ifname: e.ifname,
        namespace: e.namespace,
        pod: e.pod,
        addresses: e.addresses.iter().map(|i| i.to_string()).collect(),
        reason: e.reason,
    }
}

/// Page tokens are the last key of the previous page: network/container/ifname (none of the
/// three may contain '/').
fn page_token(k: &AttachmentKey) -> String {
    format!("{}/{}/{}", k.network, k.container_id, k.ifname)
}

fn parse_page_token(t: &str) -> Result<Option<AttachmentKey>, Error> {
    if t.is_empty() {
        return Ok(None);
    }
    let mut parts = t.splitn(3, '/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(n), Some(c), Some(i)) => Ok(Some(AttachmentKey {
            network: n.into(),
            container_id: c.into(),
            ifname: i.into(),
        })),
        _ => Err(Error::InvalidRequest(format!(
            "page_token {t:?} is not one this daemon gave out"
        ))),
    }
}

type EventStream =
    std::pin::Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::Event, Status>> + Send>>;

#[tonic::async_trait]
impl pb::ops_server::Ops for OpsService {
    async fn pool_status(
        &self,
        req: Request<pb::PoolStatusRequest>,
    ) -> Result<Response<pb::PoolStatusResponse>, Status> {
        self.access.check(&req, "PoolStatus", false)?;
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
                drained: p.drained,
                last_source_error: p
                    .last_error
                    .map(|(at, e)| format!("{e} (at {at} ms, ipoold's clock)"))
                    .unwrap_or_default(),
                free_in_source: u64::try_from(p.free_in_source).unwrap_or(u64::MAX),
                min_idle: p.min_idle as u64,
                max_idle: p.max_idle as u64,
                bucket_tokens: p.bucket_tokens,
            })
            .collect();
        let store_error = self
            .ipam
            .store_failure()
            .map(|(ago, why)| format!("{why} ({} s ago)", ago.as_secs()))
            .unwrap_or_default();
        Ok(Response::new(pb::PoolStatusResponse { pools, store_error }))
    }

    async fn list_allocations(
        &self,
        req: Request<pb::ListAllocationsRequest>,
    ) -> Result<Response<pb::ListAllocationsResponse>, Status> {
        self.access.check(&req, "ListAllocations", false)?;
        let r = req.into_inner();
        let f = Filter {
            address: one_ip(&r.address, "address")?,
            after: parse_page_token(&r.page_token)?,
            network: owned(r.network),
            namespace: owned(r.namespace),
            pod: owned(r.pod),
            container_id: owned(r.container_id),
            limit: r.page_size as usize,
        };
        let found = self.ipam.find(&f);
        let next_page_token = match found.last() {
            Some(last) if f.limit > 0 && found.len() == f.limit => page_token(&last.key),
            _ => String::new(),
        };
        let allocations = found.into_iter().map(allocation_pb).collect();
        Ok(Response::new(pb::ListAllocationsResponse {
            allocations,
            next_page_token,
        }))
    }

    async fn get_allocation(
        &self,
        req: Request<pb::GetAllocationRequest>,
    ) -> Result<Response<pb::Allocation>, Status> {
        self.access.check(&req, "GetAllocation", false)?;
        let r = req.into_inner();
        if r.network.is_empty() {
            return Err(Error::InvalidRequest("network is required".into()).into());
        }
        let found = match (one_ip(&r.address, "address")?, r.container_id.is_empty()) {
            (Some(ip), true) => self.ipam.holder_of(&r.network, ip).ok_or_else(|| {
                Error::NotFound(format!("{ip} is not held in network {:?}", r.network))
            })?,
            (None, false) => {
                let key = AttachmentKey {
                    network: r.network,
                    container_id: r.container_id,
                    ifname: ifname_or_default(r.ifname),
                };
                self.ipam
                    .get(&key)
                    .ok_or_else(|| Error::NotFound(format!("no attachment {key}")))?
            }
            _ => {
                return Err(Error::InvalidRequest(
                    "give either container_id (and ifname) or address".into(),
                )
                .into())
            }
        };
        Ok(Response::new(allocation_pb(found)))
    }

    async fn list_reservations(
        &self,
        req: Request<pb::ListReservationsRequest>,
    ) -> Result<Response<pb::ListReservationsResponse>, Status> {
        self.access.check(&req, "ListReservations", false)?;
        let r = req.into_inner();
        let reservations = self
            .ipam
            .reservations(filter(&r.network))
            .into_iter()
            .map(reservation_pb)
            .collect();
        Ok(Response::new(pb::ListReservationsResponse { reservations }))
    }

    async fn reserve(
        &self,
        req: Request<pb::ReserveRequest>,
    ) -> Result<Response<pb::Reservation>, Status> {
        self.access.check(&req, "Reserve", true)?;
        let r = req.into_inner();
        let key = ReservationKey {
            network: r.network,
            namespace: r.namespace,
            name: r.name,
        };
        let reason = if r.reason.is_empty() {
            "no reason given".to_string()
        } else {
            r.reason
        };
        let res = self
            .ipam
            .reserve(key, parse_ips(&r.addresses)?, r.ttl_secs, &reason)
            .await
            .inspect_err(|e| tracing::warn!(op = "Reserve", error = %e, outcome = "error"))?;
        Ok(Response::new(reservation_pb(res)))
    }

    async fn unreserve(
        &self,
        req: Request<pb::UnreserveRequest>,
    ) -> Result<Response<pb::Reservation>, Status> {
        self.access.check(&req, "Unreserve", true)?;
        let r = req.into_inner();
        let key = ReservationKey {
            network: r.network,
            namespace: r.namespace,
            name: r.name,
        };
        let res = self.ipam.cancel_reservation(&key).await?;
        Ok(Response::new(reservation_pb(res)))
    }

    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        self.access.check(&req, "Release", true)?;
        let r = req.into_inner();
        let key = AttachmentKey {
            network: r.network,
            container_id: r.container_id,
            ifname: ifname_or_default(r.ifname),
        };
        let released = self.ipam.force_release(&key, &r.reason).await?;
        Ok(Response::new(pb::ReleaseResponse {
            released: released.addresses.iter().map(|i| i.to_string()).collect(),
        }))
    }

    async fn drain(
        &self,
        req: Request<pb::DrainRequest>,
    ) -> Result<Response<pb::DrainResponse>, Status> {
        self.access.check(&req, "Drain", true)?;
        let r = req.into_inner();
        let drained = self.ipam.drain(filter(&r.network), r.drain).await?;
        Ok(Response::new(pb::DrainResponse { drained }))
    }

    type WatchStream = EventStream;

    async fn watch(
        &self,
        req: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        use tokio_stream::wrappers::{errors::BroadcastStreamRecvError, BroadcastStream};
        use tokio_stream::StreamExt;
        self.access.check(&req, "Watch", false)?;
        let network = req.into_inner().network;
        let stream = BroadcastStream::new(self.ipam.watch()).filter_map(move |item| match item {
            Ok(e) if network.is_empty() || e.network == network => Some(Ok(event_pb(e))),
            Ok(_) => None,
            Err(BroadcastStreamRecvError::Lagged(n)) => Some(Ok(pb::Event {
                kind: pb::event::Kind::Lagged as i32,
                reason: format!("{n} events missed: this watcher fell behind"),
                ..Default::default()
            })),
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
