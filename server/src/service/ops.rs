//! The Ops service: what operators call (pool status, allocations, reservations, release,
//! drain, watch), each call checked against the listener's `Access`.

use std::net::IpAddr;

use ipool_proto::v1 as pb;
use tonic::{Request, Response, Status};

use super::limits::Limits;
use super::{parse_ips, Access};
use crate::error::Error;
use crate::ipam::{Event, EventKind, Filter, Ipam};
use crate::store::{AttachmentKey, AttachmentRecord, Reservation, ReservationKey};

pub struct OpsService {
    ipam: Ipam,
    access: Access,
    limits: Limits,
}

impl OpsService {
    pub fn new(ipam: Ipam, access: Access) -> OpsService {
        let limits = Limits::new(matches!(access, Access::Tcp { .. }));
        OpsService {
            ipam,
            access,
            limits,
        }
    }
}

/// The most allocations one `ListAllocations` call returns (`next_page_token` says if more).
pub const MAX_PAGE: usize = 1000;

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
        owner: a.k8s.as_ref().map(|m| m.owner.clone()).unwrap_or_default(),
        sticky: a.k8s.as_ref().is_some_and(|m| m.sticky),
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
        pod_uid: r.pod_uid.unwrap_or_default(),
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
        let _slot = self.limits.read(&req, "PoolStatus")?;
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
                retiring: p.retiring,
                quarantined: p.quarantined as u64,
                last_source_error: p
                    .last_error
                    .map(|(at, e)| format!("{e} (at {at} ms, ipoold's clock)"))
                    .unwrap_or_default(),
                free_in_source: u64::try_from(p.free_in_source).unwrap_or(u64::MAX),
                min_idle: p.min_idle as u64,
                max_idle: p.max_idle as u64,
                bucket_tokens: p.bucket_tokens,
                degraded: p.degraded.unwrap_or_default(),
                source_detail: p.detail.unwrap_or_default(),
            })
            .collect();
        let store_error = self
            .ipam
            .store_failure()
            .map(|(ago, why)| format!("{why} ({} s ago)", ago.as_secs()))
            .unwrap_or_default();
        Ok(Response::new(pb::PoolStatusResponse {
            pools,
            store_error,
            host_problems: self.ipam.host_problems(),
        }))
    }

    async fn list_allocations(
        &self,
        req: Request<pb::ListAllocationsRequest>,
    ) -> Result<Response<pb::ListAllocationsResponse>, Status> {
        self.access.check(&req, "ListAllocations", false)?;
        let _slot = self.limits.read(&req, "ListAllocations")?;
        self.limits.pace().await;
        let r = req.into_inner();
        let f = Filter {
            address: one_ip(&r.address, "address")?,
            after: parse_page_token(&r.page_token)?,
            network: owned(r.network),
            namespace: owned(r.namespace),
            pod: owned(r.pod),
            container_id: owned(r.container_id),
            // Bounded whatever the caller asks: a page is the work of one call.
            limit: match r.page_size as usize {
                0 => MAX_PAGE,
                n => n.min(MAX_PAGE),
            },
        };
        let limit = f.limit;
        // Off the runtime's thread, which serves the CNI calls meanwhile.
        let ipam = self.ipam.clone();
        let (allocations, next_page_token) = tokio::task::spawn_blocking(move || {
            let found = ipam.find(&f);
            let next = match found.last() {
                Some(last) if found.len() == limit => page_token(&last.key),
                _ => String::new(),
            };
            let page: Vec<pb::Allocation> = found.into_iter().map(allocation_pb).collect();
            (page, next)
        })
        .await
        .map_err(|e| Status::internal(format!("ListAllocations: {e}")))?;
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
        let _slot = self.limits.read(&req, "GetAllocation")?;
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
        let _slot = self.limits.read(&req, "ListReservations")?;
        self.limits.pace().await;
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
        // Held as long as the stream is open.
        let slot = self.limits.watch(&req)?;
        let network = req.into_inner().network;
        let stream = BroadcastStream::new(self.ipam.watch()).filter_map(move |item| {
            let _open = &slot;
            match item {
                Ok(e) if network.is_empty() || e.network == network => Some(Ok(event_pb(e))),
                Ok(_) => None,
                Err(BroadcastStreamRecvError::Lagged(n)) => Some(Ok(pb::Event {
                    kind: pb::event::Kind::Lagged as i32,
                    reason: format!("{n} events missed: this watcher fell behind"),
                    ..Default::default()
                })),
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }
}
