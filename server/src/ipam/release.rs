//! Releasing attachments: DEL, CNI GC, and the same path for a reboot, a leak reclaim and an
//! operator's forced release.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use super::events::EventKind;
use super::state::State;
use super::{sticky, Ipam};
use crate::error::Error;
use crate::model::{AttachmentKey, Millis, Pod, Reservation, ReservationKey};
use crate::pool::Since;
use crate::store::{Change, Seq};

/// Why attachments are released; decides whether sticky pods keep their addresses and what
/// the log says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseBy {
    /// A CNI DEL.
    Del,
    /// A CNI GC: not in the runtime's list of valid attachments.
    Gc,
    /// The machine rebooted since the attachment was made: its network namespace is gone.
    Reboot,
    /// Its network namespace path was missing at two checks some time apart.
    Leak,
    /// An operator's forced release (`Ops.Release`).
    Operator,
    /// Its pod is gone from the apiserver: seen gone twice a grace apart, confirmed by a GET.
    PodGone,
}

impl ReleaseBy {
    pub fn reason(self) -> &'static str {
        match self {
            ReleaseBy::Del => "CNI DEL",
            ReleaseBy::Gc => "not in the runtime's cni.dev/valid-attachments (CNI GC)",
            ReleaseBy::Reboot => "the machine rebooted (boot ID changed)",
            ReleaseBy::Leak => "its network namespace is gone (seen missing twice)",
            ReleaseBy::Operator => "released by an operator",
            ReleaseBy::PodGone => {
                "its pod is gone from the apiserver (seen gone twice, confirmed by a GET)"
            }
        }
    }

    /// Whether a sticky pod's addresses become a reservation rather than idle.
    fn keeps_sticky(self) -> bool {
        !matches!(self, ReleaseBy::Leak | ReleaseBy::Operator)
    }

    /// The kind of event a release of this sort is.
    pub(super) fn event(self) -> EventKind {
        match self {
            ReleaseBy::Gc | ReleaseBy::Leak | ReleaseBy::PodGone => EventKind::Gc,
            _ => EventKind::Release,
        }
    }
}

/// One released attachment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    pub key: AttachmentKey,
    pub pod: Pod,
    pub addresses: Vec<IpAddr>,
    /// Set when the addresses became a reservation for the pod (a sticky pod): until when.
    pub reserved_until: Option<Millis>,
}

impl Released {
    pub fn log(&self, by: ReleaseBy) {
        let pod = format!("{}/{}", self.pod.namespace, self.pod.name);
        let address = super::join(&self.addresses);
        match self.reserved_until {
            Some(until) => {
                tracing::info!(network = %self.key.network, container = %self.key.container_id, ifname = %self.key.ifname, %pod, %address, reason = by.reason(), reserved_until_ms = until, "released; kept as a reservation for the sticky pod")
            }
            None => {
                tracing::info!(network = %self.key.network, container = %self.key.container_id, ifname = %self.key.ifname, %pod, %address, reason = by.reason(), "released")
            }
        }
    }
}

/// The moves a release makes in the pools: (network, range set, address).
#[derive(Default)]
struct Moves {
    to_idle: Vec<(String, usize, IpAddr)>,
    /// Back to the source, not idle (a retiring set's).
    vacated: Vec<(String, usize, IpAddr)>,
    to_reserved: Vec<(String, usize, IpAddr)>,
    unreserved: Vec<(String, usize, IpAddr)>,
    reservations: BTreeMap<ReservationKey, Reservation>,
}

impl Ipam {
    /// Releases the attachment's addresses (they go idle, cooling). Unknown keys succeed.
    /// Returns the addresses released.
    pub async fn del(&self, key: &AttachmentKey) -> Result<Vec<IpAddr>, Error> {
        super::validate_key(key)?;
        let (released, seq) = {
            let mut guard = self.lock();
            if !guard.attachments.contains_key(key) {
                return Ok(Vec::new());
            }
            self.release_attachments(&mut guard, std::slice::from_ref(key), ReleaseBy::Del)?
        };
        self.wait_durable(seq).await?;
        self.emit_released(&released, ReleaseBy::Del, ReleaseBy::Del.reason());
        self.shared.changed.notify_one();
        Ok(released.into_iter().flat_map(|r| r.addresses).collect())
    }

    /// Releases, for `by`, the attachments `due` that are still the ones observed: the same key
    /// and creation time (one re-created since is left alone). Each is logged and emitted.
    pub(super) async fn release_unchanged(
        &self,
        due: &[(AttachmentKey, Millis)],
        by: ReleaseBy,
    ) -> Result<Vec<Released>, Error> {
        let (released, seq) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            let keys: Vec<AttachmentKey> = due
                .iter()
                .filter(|(k, created)| {
                    st.attachments
                        .get(k)
                        .is_some_and(|a| a.created_at_ms() == *created)
                })
                .map(|(k, _)| k.clone())
                .collect();
            if keys.is_empty() {
                return Ok(Vec::new());
            }
            self.release_attachments(st, &keys, by)?
        };
        self.wait_durable(seq).await?;
        for r in &released {
            r.log(by);
        }
        self.emit_released(&released, by, by.reason());
        self.shared.changed.notify_one();
        Ok(released)
    }

    /// Releases every attachment of `network` whose (container ID, ifname) is not in `valid`.
    /// Attachments younger than `[cni] gc_grace_secs` are spared: the runtime builds its list
    /// before it calls GC, and an ADD that finished in between is not on it. Returns what was
    /// released; each release is logged with its reason.
    pub async fn gc(
        &self,
        network: &str,
        valid: &HashSet<(String, String)>,
    ) -> Result<Vec<Released>, Error> {
        super::validate_network(network)?;
        let now = self.now();
        let grace = self.shared.config.cni.gc_grace_secs.saturating_mul(1000);
        let (released, seq) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            let stale: Vec<AttachmentKey> = st
                .attachments
                .iter()
                .filter(|a| {
                    a.network() == network
                        && !valid.contains(&(a.container_id().to_string(), a.ifname().to_string()))
                        && a.created_at_ms().saturating_add(grace) <= now
                })
                .map(|a| a.key())
                .collect();
            if stale.is_empty() {
                return Ok(Vec::new());
            }
            self.release_attachments(st, &stale, ReleaseBy::Gc)?
        };
        self.wait_durable(seq).await?;
        for r in &released {
            r.log(ReleaseBy::Gc);
        }
        self.emit_released(&released, ReleaseBy::Gc, ReleaseBy::Gc.reason());
        self.shared.changed.notify_one();
        Ok(released)
    }

    /// Releases `keys` in one change set: in use -> idle (cooling from now), or, for a sticky
    /// pod, -> a reservation for its namespace/name (replacing an older one, whose addresses
    /// go idle). Shared by DEL, GC, reboot, leak reclaim and operators.
    pub(super) fn release_attachments(
        &self,
        st: &mut State,
        keys: &[AttachmentKey],
        by: ReleaseBy,
    ) -> Result<(Vec<Released>, Seq), Error> {
        let now = self.now();
        let (changes, moves, out) = plan_release(st, keys, by, now);
        let seq = self.commit(st, &changes, |st| {
            for (net, set, ip) in &moves.unreserved {
                if let Some(p) = st.pool(net, *set) {
                    p.pool.unreserve(*ip, now);
                }
            }
            for (net, set, ip) in &moves.to_idle {
                if let Some(p) = st.pool(net, *set) {
                    p.pool.put_idle(*ip, now);
                }
            }
            for (net, set, ip) in &moves.vacated {
                if let Some(p) = st.pool(net, *set) {
                    p.pool.put_idle(*ip, now);
                    p.pool.evict(*ip);
                    p.source.vacate(*ip);
                }
            }
            for (net, set, ip) in &moves.to_reserved {
                if let Some(p) = st.pool(net, *set) {
                    p.pool.reserve(*ip).map_err(|e| e.to_string())?;
                }
            }
            st.reservations.extend(moves.reservations);
            for r in &out {
                st.attachments.remove(&r.key);
            }
            Ok(())
        })?;
        Ok((out, seq))
    }
}

/// Works out a release (see [`Ipam::release_attachments`]): the change set, the moves in the
/// pools, and what is released.
fn plan_release(
    st: &State,
    keys: &[AttachmentKey],
    by: ReleaseBy,
    now: Millis,
) -> (Vec<Change>, Moves, Vec<Released>) {
    let stamp = Since::At(now).to_stored();
    let mut changes = Vec::new();
    let mut moves = Moves::default();
    let mut out = Vec::new();
    for key in keys {
        let Some(record) = st.attachments.get(key) else {
            continue;
        };
        changes.push(Change::DeleteAttachment(key.clone()));
        let Some(net) = st.networks.get(&key.network) else {
            continue;
        };
        let pod = record.pod();
        // The apiserver's word where there is one (owner, annotations), else the network's
        // policy on the pod's name.
        let (is_sticky, ttl_secs) = match record.k8s() {
            Some(m) => (
                m.sticky,
                m.sticky_ttl_secs.unwrap_or(net.def.tuning.sticky_ttl_secs),
            ),
            None => (
                net.def.tuning.sticky.applies_to(&pod.name),
                net.def.tuning.sticky_ttl_secs,
            ),
        };
        let sticky =
            sticky::identity(&key.network, &pod).filter(|_| by.keeps_sticky() && is_sticky);
        let held: Vec<(usize, IpAddr)> = record
            .addresses()
            .iter()
            .filter_map(|ip| {
                let set = net.set_of(*ip)?;
                net.pools[set].pool.is_in_use(*ip).then_some((set, *ip))
            })
            .collect();
        // A sticky pod keeps what it holds in current range sets; addresses of retiring ones
        // are not handed out again, not even to it.
        // A hosted address (a fixed one outside the source's blocks) goes back at once too,
        // and so does every address of a pod with a fixed address: its pin keeps the address
        // for its owner, and neither a sticky reservation nor an idle entry may name an
        // address whose block the store has not recorded (one that took over a hosted
        // address: a restart could not place it).
        let fixed = record.k8s().is_some_and(|m| m.fixed.is_some());
        let goes_back = |set: usize, ip: IpAddr| {
            fixed
                || !net.is_current(set)
                || net.pools[set].source.blocks().is_some_and(|b| b.hosts(ip))
        };
        let (kept, held): (Vec<_>, Vec<_>) = match sticky {
            Some(_) => held
                .into_iter()
                .partition(|(set, ip)| !goes_back(*set, *ip)),
            None => (Vec::new(), held),
        };
        for (set, ip) in &held {
            if goes_back(*set, *ip) {
                // Nothing comes from a retiring set again: the address goes back at once.
                moves.vacated.push((key.network.clone(), *set, *ip));
                continue;
            }
            moves.to_idle.push((key.network.clone(), *set, *ip));
            changes.push(Change::PutIdle {
                network: key.network.clone(),
                ip: *ip,
                released_at: stamp,
            });
        }
        let mut reserved_until = None;
        match sticky {
            Some(rkey) if !kept.is_empty() => {
                let until = now.saturating_add(ttl_secs.saturating_mul(1000));
                // An older reservation of the same pod ends: its addresses go idle.
                if let Some(old) = st
                    .reservations
                    .get(&rkey)
                    .filter(|_| !moves.reservations.contains_key(&rkey))
                {
                    for ip in &old.addresses {
                        if let Some(set) = net.set_of(*ip) {
                            moves.unreserved.push((key.network.clone(), set, *ip));
                            changes.push(Change::PutIdle {
                                network: key.network.clone(),
                                ip: *ip,
                                released_at: stamp,
                            });
                        }
                    }
                }
                let r = moves
                    .reservations
                    .entry(rkey.clone())
                    .or_insert_with(|| Reservation {
                        key: rkey,
                        addresses: Vec::new(),
                        created_at_ms: now,
                        expires_at_ms: until,
                        reason: format!("sticky pod released: {}", by.reason()),
                        pod_uid: None,
                    });
                for (set, ip) in &kept {
                    r.addresses.push(*ip);
                    moves.to_reserved.push((key.network.clone(), *set, *ip));
                }
                reserved_until = Some(until);
            }
            _ => {}
        }
        out.push(Released {
            key: key.clone(),
            pod,
            addresses: record.addresses().to_vec(),
            reserved_until,
        });
    }
    changes.extend(
        moves
            .reservations
            .values()
            .cloned()
            .map(Change::PutReservation),
    );
    (changes, moves, out)
}
