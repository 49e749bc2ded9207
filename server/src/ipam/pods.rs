//! The engine's side of Kubernetes (driven by the `k8s` module, which it knows nothing of): the
//! attachments of pods for the pod GC to judge, their release once their pod is gone, and
//! quarantines: addresses a live pod reports that the store did not hold for it, kept as a
//! reservation for that pod (never handed to another) until the pod is gone.

use std::net::IpAddr;

use super::events::{Event, EventKind};
use super::{Ipam, ReleaseBy, Released};
use crate::error::Error;
use crate::model::{Millis, Pod, Reservation, ReservationKey};
use crate::store::{AttachmentKey, Change};

/// An attachment of a pod (made by an ADD that named one), as the pod GC judges it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodAttachment {
    pub key: AttachmentKey,
    pub pod: Pod,
    pub created_at_ms: Millis,
    /// Its network namespace as the runtime gave it (CNI_NETNS), "" if none.
    pub netns: String,
}

/// A pod the apiserver lists as running here, with the addresses it reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LivePod {
    pub pod: Pod,
    pub ips: Vec<IpAddr>,
}

/// A quarantine: the reservation, and the UID of the pod it waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Quarantine {
    pub key: ReservationKey,
    pub uid: String,
    pub created_at_ms: Millis,
}

impl Ipam {
    /// Every attachment made for a named pod.
    pub fn pod_attachments(&self) -> Vec<PodAttachment> {
        let st = self.lock();
        st.attachments
            .iter()
            .filter(|a| !a.pod_name().is_empty())
            .map(|a| PodAttachment {
                key: a.key(),
                pod: a.pod(),
                created_at_ms: a.created_at_ms(),
                netns: a.netns().to_string(),
            })
            .collect()
    }

    /// Every quarantine.
    pub fn quarantines(&self) -> Vec<Quarantine> {
        let st = self.lock();
        st.reservations
            .values()
            .filter_map(|r| {
                Some(Quarantine {
                    key: r.key.clone(),
                    uid: r.pod_uid.clone()?,
                    created_at_ms: r.created_at_ms,
                })
            })
            .collect()
    }

    /// Releases the attachments `due` (key and creation time: one re-created since is left
    /// alone) whose pod is gone. A sticky pod's addresses become its reservation.
    pub async fn release_pods_gone(
        &self,
        due: &[(AttachmentKey, Millis)],
    ) -> Result<Vec<Released>, Error> {
        self.release_unchanged(due, ReleaseBy::PodGone).await
    }

    /// Ends the quarantine `q` (its pod is gone): its addresses go idle, cooling. None when it
    /// is no longer there as it was.
    pub async fn end_quarantine(&self, q: &Quarantine) -> Result<Option<Reservation>, Error> {
        let (r, seq) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            let Some(r) = st
                .reservations
                .get(&q.key)
                .filter(|r| r.pod_uid.as_deref() == Some(q.uid.as_str()))
                .cloned()
            else {
                return Ok(None);
            };
            let seq = self.end_reservations(st, std::slice::from_ref(&r))?;
            (r, seq)
        };
        self.wait_durable(seq).await?;
        let why = "the quarantined pod is gone from the apiserver";
        tracing::info!(network = %q.key.network, pod = %format!("{}/{}", q.key.namespace, q.key.name), uid = %q.uid, address = %super::join(&r.addresses), reason = why, "quarantine ended");
        self.emit(|| Event::of_reservation(EventKind::Release, self.now(), &r, why));
        self.shared.changed.notify_one();
        Ok(Some(r))
    }

    /// Quarantines every address a live pod reports, in a network's current ranges, that the
    /// store holds for no one: each pod's become a reservation for it (its own next ADD gets
    /// them back), lasting until the pod is gone. An address the store holds for another pod
    /// is logged (two pods cannot be helped from here). Returns the new quarantines.
    pub async fn quarantine(&self, pods: &[LivePod]) -> Result<Vec<Reservation>, Error> {
        let (made, seq) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            self.serving(st)?;
            // A source that does not know yet which addresses it holds (a cluster pool's
            // blocks before the first sync) would find the live pods' addresses in none: wait.
            for net in st.networks.values() {
                for p in &net.pools[..net.current] {
                    if let Err(why) = p
                        .source
                        .blocks()
                        .map_or(Ok(()), |b| b.knows_its_addresses())
                    {
                        return Err(Error::Busy(format!(
                            "the live pods' addresses are quarantined once {why}"
                        )));
                    }
                }
            }
            let now = self.now();
            let mut made: Vec<(Reservation, Vec<super::range_set::Pick>)> = Vec::new();
            let mut chosen = std::collections::HashSet::new();
            // Addresses claimed from each pool's source in this batch: each takes a capacity
            // token, and a batch must not take more than the pool has.
            let mut claimed: std::collections::HashMap<(String, usize), usize> = Default::default();
            let mut outside = 0usize;
            for live in pods.iter().filter(|p| !p.pod.name.is_empty()) {
                let pod = &live.pod;
                let who = format!("{}/{}", pod.namespace, pod.name);
                for ip in &live.ips {
                    let found = st
                        .networks
                        .iter()
                        .find_map(|(n, net)| net.set_of(*ip).map(|s| (n.clone(), s)));
                    let Some((network, set)) = found else {
                        outside += 1;
                        continue;
                    };
                    let key = ReservationKey {
                        network: network.clone(),
                        namespace: pod.namespace.clone(),
                        name: pod.name.clone(),
                    };
                    if let Some(a) = st.attachments.holder_of(&network, *ip) {
                        let same = a.pod_namespace() == pod.namespace
                            && a.pod_name() == pod.name
                            && (a.pod().uid.is_empty() || a.pod().uid == pod.uid);
                        if !same {
                            tracing::error!(%network, %ip, pod = %who, uid = %pod.uid, holder = %a.key(), "a live pod reports an address the store holds for another attachment: one address on two pods (delete one of them)");
                        }
                        continue;
                    }
                    if let Some(r) = st.reservations.values().find(|r| r.addresses.contains(ip)) {
                        if r.key != key {
                            tracing::error!(%network, %ip, pod = %who, reserved_for = %r.key, "a live pod reports an address reserved for another pod");
                        }
                        continue;
                    }
                    let Some(net) = st.networks.get_mut(&network) else {
                        continue;
                    };
                    if !net.is_current(set) {
                        continue;
                    }
                    if st.reservations.contains_key(&key) {
                        tracing::warn!(%network, %ip, pod = %who, "a live pod reports an address the store does not hold, and the pod has a reservation already: not quarantined");
                        continue;
                    }
                    let pick = match net.pools[set].pick_quarantined(set, *ip) {
                        Ok(p) => p,
                        Err(e) => {
                            tracing::warn!(%network, %ip, pod = %who, error = ?e, "cannot quarantine a live pod's address");
                            continue;
                        }
                    };
                    if pick.from == super::range_set::From::Claimed {
                        let n = claimed.entry((network.clone(), set)).or_default();
                        if *n >= net.pools[set].pool.tokens() {
                            tracing::error!(%network, %ip, pod = %who, "cannot quarantine a live pod's address: the pool is at its capacity");
                            continue;
                        }
                        *n += 1;
                    }
                    if !chosen.insert(*ip) {
                        tracing::error!(%network, %ip, pod = %who, "two live pods report the same address: one address on two pods (delete one of them)");
                        continue;
                    }
                    let i = match made.iter().position(|(r, _)| r.key == key) {
                        Some(i) => i,
                        None => {
                            made.push((
                                Reservation {
                                    key: key.clone(),
                                    addresses: Vec::new(),
                                    created_at_ms: now,
                                    expires_at_ms: Millis::MAX,
                                    reason: format!(
                                        "quarantined: live pod {who} (uid {}) reports it; the store did not hold it",
                                        pod.uid
                                    ),
                                    pod_uid: Some(pod.uid.clone()),
                                },
                                Vec::new(),
                            ));
                            made.len() - 1
                        }
                    };
                    made[i].0.addresses.push(*ip);
                    made[i].1.push(pick);
                }
            }
            if outside > 0 {
                tracing::debug!(addresses = outside, "live pods' addresses outside every network's ranges (not ipool's, or ranges not known yet)");
            }
            if made.is_empty() {
                return Ok(Vec::new());
            }
            let mut changes = Vec::new();
            for (r, picks) in &made {
                changes.push(Change::PutReservation(r.clone()));
                for p in picks {
                    if let Some(pool) = st.pool(&r.key.network, p.set) {
                        pool.store_changes(&r.key.network, p, &mut changes);
                    }
                }
            }
            let seq = self.commit(st, &changes, |st| {
                for (r, picks) in &made {
                    for p in picks {
                        let pool = st
                            .pool(&r.key.network, p.set)
                            .ok_or_else(|| format!("network {:?} is gone", r.key.network))?;
                        pool.take(p)?;
                        pool.pool.reserve(p.ip).map_err(|e| e.to_string())?;
                    }
                    st.reservations.insert(r.key.clone(), r.clone());
                }
                Ok(())
            })?;
            (made, seq)
        };
        self.wait_durable(seq).await?;
        let made: Vec<Reservation> = made.into_iter().map(|(r, _)| r).collect();
        for r in &made {
            tracing::warn!(network = %r.key.network, pod = %format!("{}/{}", r.key.namespace, r.key.name), uid = r.pod_uid.as_deref().unwrap_or_default(), address = %super::join(&r.addresses), "quarantined: a live pod reports this address and the store did not hold it; it is not handed out until that pod is gone");
            self.emit(|| Event::of_reservation(EventKind::Reserve, r.created_at_ms, r, &r.reason));
        }
        self.shared.changed.notify_one();
        Ok(made)
    }
}
