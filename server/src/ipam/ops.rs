//! What operators can see and steer: filtered lookups, operator reservations, forced releases,
//! draining.

use std::net::IpAddr;

use super::attachments::Attachment;
use super::events::{Event, EventKind};
use super::pick::pick_addresses;
use super::{Ipam, ReleaseBy, Released, Step};
use crate::error::Error;
use crate::model::{AttachmentKey, AttachmentRecord, Reservation, ReservationKey};
use crate::store::Change;

/// The drain entry that covers every network.
pub const ALL_NETWORKS: &str = "*";

/// An attachment ordered by its key (a max-heap of them keeps the smallest).
struct ByKey<'a>(Attachment<'a>);

impl PartialEq for ByKey<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for ByKey<'_> {}

impl PartialOrd for ByKey<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByKey<'_> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp_by_key(&other.0)
    }
}

/// Filters of `find`; empty fields match everything.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    pub network: Option<String>,
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub address: Option<IpAddr>,
    pub container_id: Option<String>,
    /// Only attachments whose key sorts after this one (paging).
    pub after: Option<AttachmentKey>,
    /// At most this many (0: all).
    pub limit: usize,
}

impl Filter {
    fn matches(&self, r: &Attachment<'_>) -> bool {
        let eq = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        eq(&self.network, r.network())
            && eq(&self.namespace, r.pod_namespace())
            && eq(&self.pod, r.pod_name())
            && eq(&self.container_id, r.container_id())
            && self.address.is_none_or(|a| r.addresses().contains(&a))
            && self.after.as_ref().is_none_or(|k| r.cmp_key(k).is_gt())
    }
}

impl Ipam {
    /// Attachments matching `f`, in key order. With a limit, the work under the lock is one
    /// pass that keeps the `limit` first matches (a heap), and only those are copied: a page
    /// of a large node costs the ADDs waiting for the lock little.
    pub fn find(&self, f: &Filter) -> Vec<AttachmentRecord> {
        let st = self.lock();
        let matching = st.attachments.iter().filter(|r| f.matches(r));
        let mut v: Vec<Attachment<'_>> = if f.limit == 0 {
            matching.collect()
        } else {
            let mut first = std::collections::BinaryHeap::with_capacity(f.limit + 1);
            for r in matching {
                first.push(ByKey(r));
                if first.len() > f.limit {
                    first.pop();
                }
            }
            first.into_iter().map(|k| k.0).collect()
        };
        v.sort_by(|a, b| a.cmp_by_key(b));
        v.into_iter().map(|r| r.to_record()).collect()
    }

    /// Whether ipoold has network `name` (declared by a CNI config or its config file).
    pub fn knows_network(&self, name: &str) -> bool {
        self.lock().networks.contains_key(name)
    }

    /// Whether host-local's allocations of `network` are still to be looked for (not taken
    /// over yet; a network an older ipoold served counts as taken over from its start).
    pub fn host_local_due(&self, network: &str) -> bool {
        !self.lock().taken_over.contains(network)
    }

    /// Records that host-local's allocations of `network` were taken over (never again).
    pub async fn host_local_done(&self, network: &str) -> Result<(), Error> {
        let seq = {
            let mut guard = self.lock();
            let st = &mut *guard;
            if st.taken_over.contains(network) {
                return Ok(());
            }
            self.commit(st, &[Change::PutTakenOver(network.to_string())], |st| {
                st.taken_over.insert(network.to_string());
                Ok(())
            })?
        };
        self.wait_durable(seq).await
    }

    /// Every attachment (of `network`), in key order.
    pub fn attachments(&self, network: Option<&str>) -> Vec<AttachmentRecord> {
        self.find(&Filter {
            network: network.map(str::to_string),
            ..Filter::default()
        })
    }

    /// The attachment that holds `ip` in `network`.
    pub fn holder_of(&self, network: &str, ip: IpAddr) -> Option<AttachmentRecord> {
        self.lock()
            .attachments
            .holder_of(network, ip)
            .map(|r| r.to_record())
    }

    pub fn get(&self, key: &AttachmentKey) -> Option<AttachmentRecord> {
        self.lock().attachments.get(key).map(|r| r.to_record())
    }

    /// Reserves addresses of `key.network` for the pod identity `key` for `ttl_secs`: the
    /// `addresses` asked for (at most one per range set; each must be idle or free), or, when
    /// none are given, one per range set chosen as an ADD would. The pod's next ADD gets them.
    pub async fn reserve(
        &self,
        key: ReservationKey,
        addresses: Vec<IpAddr>,
        ttl_secs: u64,
        reason: &str,
    ) -> Result<Reservation, Error> {
        super::validate_network(&key.network)?;
        if key.name.is_empty() {
            return Err(Error::InvalidRequest(
                "a reservation needs a pod name".into(),
            ));
        }
        if ttl_secs == 0 {
            return Err(Error::InvalidRequest("ttl_secs must be at least 1".into()));
        }
        let (r, seq) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            self.serving(st)?;
            if let Some(old) = st.reservations.get(&key) {
                return Err(Error::InUse(format!(
                    "pod {}/{} already has a reservation in network {:?} ({}); unreserve it first",
                    key.namespace,
                    key.name,
                    key.network,
                    super::join(&old.addresses)
                )));
            }
            let now = self.now();
            // `pick_addresses` looks only at the key's network; the rest names the reservation
            // in case a message ever shows it.
            let owner = AttachmentKey {
                network: key.network.clone(),
                container_id: format!("reservation-{}-{}", key.namespace, key.name),
                ifname: "-".into(),
            };
            let net = st
                .networks
                .get_mut(&key.network)
                .ok_or_else(|| Error::NotFound(format!("network {:?} is unknown", key.network)))?;
            let picks = match pick_addresses(
                net,
                &st.attachments,
                &st.reservations,
                &owner,
                &addresses,
                None,
                None,
                false,
                now,
                false,
            )? {
                Step::Done(p) => p,
                Step::Wait(ms) => {
                    return Err(Error::Busy(format!(
                        "the address source is rate-limited; try again in {ms} ms"
                    )))
                }
                Step::Pending(p) => return Err(Error::Busy(p.why)),
            };
            let r = Reservation {
                key: key.clone(),
                addresses: picks.iter().map(|p| p.ip).collect(),
                created_at_ms: now,
                expires_at_ms: now.saturating_add(ttl_secs.saturating_mul(1000)),
                reason: format!("operator: {reason}"),
                pod_uid: None,
            };
            let mut changes = vec![Change::PutReservation(r.clone())];
            for p in &picks {
                net.pools[p.set].store_changes(&key.network, p, &mut changes);
            }
            let seq = self.commit(st, &changes, |st| {
                for p in &picks {
                    let pool = st
                        .pool(&key.network, p.set)
                        .ok_or_else(|| format!("network {:?} is gone", key.network))?;
                    pool.take(p)?;
                    pool.pool.reserve(p.ip).map_err(|e| e.to_string())?;
                }
                st.reservations.insert(key.clone(), r.clone());
                Ok(())
            })?;
            (r, seq)
        };
        self.wait_durable(seq).await?;
        tracing::info!(network = %key.network, pod = %format!("{}/{}", key.namespace, key.name), address = %super::join(&r.addresses), expires_at_ms = r.expires_at_ms, %reason, "reserved by an operator");
        self.emit(|| Event::of_reservation(EventKind::Reserve, r.created_at_ms, &r, &r.reason));
        self.shared.changed.notify_one();
        Ok(r)
    }

    /// Releases an attachment on an operator's word: its addresses go idle (cooling), even for
    /// a sticky pod. `reason` is logged. An unknown key is an error (unlike DEL).
    pub async fn force_release(
        &self,
        key: &AttachmentKey,
        reason: &str,
    ) -> Result<Released, Error> {
        super::validate_key(key)?;
        if reason.trim().is_empty() {
            return Err(Error::InvalidRequest(
                "say why: a forced release needs a reason (it is logged)".into(),
            ));
        }
        let (released, seq) = {
            let mut guard = self.lock();
            if !guard.attachments.contains_key(key) {
                return Err(Error::NotFound(format!("no attachment {key}")));
            }
            self.release_attachments(&mut guard, std::slice::from_ref(key), ReleaseBy::Operator)?
        };
        self.wait_durable(seq).await?;
        let r = released
            .into_iter()
            .next()
            .ok_or_else(|| Error::NotFound(format!("no attachment {key}")))?;
        tracing::warn!(network = %key.network, container = %key.container_id, ifname = %key.ifname, pod = %format!("{}/{}", r.pod.namespace, r.pod.name), address = %super::join(&r.addresses), %reason, "released by an operator");
        self.emit_released(
            std::slice::from_ref(&r),
            ReleaseBy::Operator,
            &format!("operator: {reason}"),
        );
        self.shared.changed.notify_one();
        Ok(r)
    }

    /// Drains (no new ADDs) or undrains `network`, or every network with None. Returns the
    /// drained networks afterwards ("*" stands for all).
    pub async fn drain(&self, network: Option<&str>, drain: bool) -> Result<Vec<String>, Error> {
        let name = network.unwrap_or(ALL_NETWORKS).to_string();
        let (now_drained, seq) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            if name != ALL_NETWORKS && !st.networks.contains_key(&name) {
                return Err(Error::NotFound(format!("network {name:?} is unknown")));
            }
            let seq = if st.drained.contains(&name) != drain {
                let change = Change::PutDrain {
                    network: name.clone(),
                    drained: drain,
                };
                Some(self.commit(st, &[change], |st| {
                    if drain {
                        st.drained.insert(name.clone());
                    } else {
                        st.drained.remove(&name);
                    }
                    Ok(())
                })?)
            } else {
                None
            };
            let all = st.drained.contains(ALL_NETWORKS);
            self.shared.health.send_if_modified(|h| {
                let changed = h.all_drained != all;
                h.all_drained = all;
                changed
            });
            (st.drained.iter().cloned().collect::<Vec<_>>(), seq)
        };
        if let Some(seq) = seq {
            self.wait_durable(seq).await?;
        }
        tracing::warn!(network = %name, drain, "drain changed by an operator");
        Ok(now_drained)
    }
}
