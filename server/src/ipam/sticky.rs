//! Sticky addresses: reservations that keep a pod's addresses for its namespace/name while it
//! is away (after OpenKruise's reserved IPs and Terway's StatefulSet stickiness).
//!
//! A DEL (or GC, or a reboot) of a pod the network's `sticky` policy selects turns its addresses
//! into a reservation that lasts `sticky_ttl_secs`; the next ADD for the same namespace/name
//! gets them back, whatever its container ID. An expired or cancelled reservation's addresses go
//! idle, cooling from that moment. The pools count reserved addresses against their capacity and
//! never hand them to anyone else.

use std::net::IpAddr;

use super::events::{Event, EventKind};
use super::state::State;
use super::Ipam;
use crate::error::Error;
use crate::model::{Millis, Pod, Reservation, ReservationKey};
use crate::pool::Since;
use crate::store::{Change, Seq};

/// The reservation key of a pod in a network; None for an unnamed pod.
pub(super) fn identity(network: &str, pod: &Pod) -> Option<ReservationKey> {
    (!pod.name.is_empty()).then(|| ReservationKey {
        network: network.to_string(),
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
    })
}

impl Ipam {
    /// Live reservations, optionally of one network, in key order.
    pub fn reservations(&self, network: Option<&str>) -> Vec<Reservation> {
        self.lock()
            .reservations
            .values()
            .filter(|r| network.is_none_or(|n| n == r.key.network))
            .cloned()
            .collect()
    }

    /// Ends a reservation now: its addresses go idle (cooling). Returns it.
    pub async fn cancel_reservation(&self, key: &ReservationKey) -> Result<Reservation, Error> {
        let (r, seq) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            let Some(r) = st.reservations.get(key).cloned() else {
                return Err(Error::NotFound(format!(
                    "no reservation for pod {}/{} in network {:?}",
                    key.namespace, key.name, key.network
                )));
            };
            let seq = self.end_reservations(st, std::slice::from_ref(&r))?;
            (r, seq)
        };
        self.wait_durable(seq).await?;
        tracing::info!(network = %key.network, pod = %format!("{}/{}", key.namespace, key.name), address = %super::join(&r.addresses), reason = "cancelled", "reservation ended");
        self.emit(|| {
            Event::of_reservation(EventKind::Release, self.now(), &r, "reservation cancelled")
        });
        self.shared.changed.notify_one();
        Ok(r)
    }

    /// Ends every reservation whose TTL has passed at `now`. Returns them.
    pub(super) fn expire_reservations(
        &self,
        st: &mut State,
        now: Millis,
    ) -> Result<Vec<Reservation>, Error> {
        if st.reservations.is_empty() {
            return Ok(Vec::new());
        }
        let expired: Vec<Reservation> = st
            .reservations
            .values()
            .filter(|r| r.expires_at_ms <= now)
            .cloned()
            .collect();
        if expired.is_empty() {
            return Ok(expired);
        }
        self.end_reservations(st, &expired)?;
        for r in &expired {
            self.emit(|| Event::of_reservation(EventKind::Expire, now, r, "TTL passed"));
            tracing::info!(network = %r.key.network, pod = %format!("{}/{}", r.key.namespace, r.key.name), address = %super::join(&r.addresses), reason = "TTL passed", "reservation ended");
        }
        Ok(expired)
    }

    /// Reservations -> their addresses idle, stamped now, in one change set.
    pub(super) fn end_reservations(
        &self,
        st: &mut State,
        ended: &[Reservation],
    ) -> Result<Seq, Error> {
        let now = self.now();
        let mut changes = Vec::new();
        let mut moves: Vec<(String, usize, IpAddr)> = Vec::new();
        for r in ended {
            changes.push(Change::DeleteReservation(r.key.clone()));
            let Some(net) = st.networks.get(&r.key.network) else {
                continue;
            };
            for ip in &r.addresses {
                if let Some(set) = net
                    .set_of(*ip)
                    .filter(|s| net.pools[*s].pool.is_reserved(*ip))
                {
                    moves.push((r.key.network.clone(), set, *ip));
                    changes.push(Change::PutIdle {
                        network: r.key.network.clone(),
                        ip: *ip,
                        released_at: Since::At(now).to_stored(),
                    });
                }
            }
        }
        self.commit(st, &changes, |st| {
            for (net, set, ip) in &moves {
                if let Some(p) = st.pool(net, *set) {
                    p.pool.unreserve(*ip, now);
                }
            }
            for r in ended {
                st.reservations.remove(&r.key);
            }
            Ok(())
        })
    }
}
