//! What operators can see and steer: filtered lookups, operator reservations, forced releases,
//! draining, and the stream of allocation events.

use std::net::IpAddr;

use tokio::sync::broadcast;

use super::attachments::Attachment;
use super::{Ipam, ReleaseBy, Released, Step};
use crate::error::Error;
use crate::pool::Millis;
use crate::store::{AttachmentKey, AttachmentRecord, Change, Pod, Reservation, ReservationKey};

/// How many events a watcher may fall behind before it is told it lagged.
pub(super) const EVENT_BUFFER: usize = 4096;

/// The drain entry that covers every network.
pub const ALL_NETWORKS: &str = "*";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Add,
    Release,
    Reserve,
    Expire,
    Gc,
}

/// One allocation event, as `Watch` streams it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: EventKind,
    pub at_ms: Millis,
    pub network: String,
    pub container_id: String,
    pub ifname: String,
    pub namespace: String,
    pub pod: String,
    pub addresses: Vec<IpAddr>,
    pub reason: String,
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

impl Event {
    /// `key`: the attachment, if the event is about one (a reservation's events have none).
    #[allow(clippy::too_many_arguments)]
    fn new(
        kind: EventKind,
        at_ms: Millis,
        network: &str,
        key: Option<&AttachmentKey>,
        namespace: &str,
        pod: &str,
        addresses: &[IpAddr],
        reason: &str,
    ) -> Event {
        Event {
            kind,
            at_ms,
            network: network.to_string(),
            container_id: key.map(|k| k.container_id.clone()).unwrap_or_default(),
            ifname: key.map(|k| k.ifname.clone()).unwrap_or_default(),
            namespace: namespace.to_string(),
            pod: pod.to_string(),
            addresses: addresses.to_vec(),
            reason: reason.to_string(),
        }
    }

    pub(super) fn of_record(
        kind: EventKind,
        at_ms: Millis,
        r: &AttachmentRecord,
        reason: &str,
    ) -> Event {
        Event::of_attachment(kind, at_ms, &r.key, &r.pod, &r.addresses, reason)
    }

    /// An event about the attachment `key` of `pod`.
    fn of_attachment(
        kind: EventKind,
        at_ms: Millis,
        key: &AttachmentKey,
        pod: &Pod,
        addresses: &[IpAddr],
        reason: &str,
    ) -> Event {
        Event::new(
            kind,
            at_ms,
            &key.network,
            Some(key),
            &pod.namespace,
            &pod.name,
            addresses,
            reason,
        )
    }

    pub(super) fn of_reservation(
        kind: EventKind,
        at_ms: Millis,
        r: &Reservation,
        reason: &str,
    ) -> Event {
        let k = &r.key;
        Event::new(
            kind,
            at_ms,
            &k.network,
            None,
            &k.namespace,
            &k.name,
            &r.addresses,
            reason,
        )
    }
}

impl Ipam {
    /// Sends an event to every watcher; never blocks (a slow watcher lags instead). The event
    /// is only built when somebody watches: the ADD path pays nothing otherwise.
    pub(super) fn emit(&self, e: impl FnOnce() -> Event) {
        if self.shared.events.receiver_count() > 0 {
            let _ = self.shared.events.send(e());
        }
    }

    pub(super) fn emit_released(&self, released: &[Released], by: ReleaseBy, reason: &str) {
        let now = self.now();
        let kind = match by {
            ReleaseBy::Gc | ReleaseBy::Leak => EventKind::Gc,
            _ => EventKind::Release,
        };
        for r in released {
            let (k, p) = (&r.key, &r.pod);
            self.emit(|| Event::of_attachment(kind, now, k, p, &r.addresses, reason));
            if let Some(until) = r.reserved_until {
                self.emit(|| {
                    let why = format!("sticky pod; until {until} (Unix ms)");
                    Event::new(
                        EventKind::Reserve,
                        now,
                        &k.network,
                        None,
                        &p.namespace,
                        &p.name,
                        &r.addresses,
                        &why,
                    )
                });
            }
        }
    }

    /// A receiver of every event from now on.
    pub fn watch(&self) -> broadcast::Receiver<Event> {
        self.shared.events.subscribe()
    }

    /// Attachments matching `f`, in key order.
    pub fn find(&self, f: &Filter) -> Vec<AttachmentRecord> {
        let st = self.lock();
        let mut v: Vec<AttachmentRecord> = st
            .attachments
            .iter()
            .filter(|r| f.matches(r))
            .map(|r| r.to_record())
            .collect();
        v.sort_by(|a, b| a.key.cmp(&b.key));
        if f.limit > 0 {
            v.truncate(f.limit);
        }
        v
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
        super::validate_name("network name", &key.network).map_err(Error::InvalidRequest)?;
        if key.name.is_empty() {
            return Err(Error::InvalidRequest(
                "a reservation needs a pod name".into(),
            ));
        }
        if ttl_secs == 0 {
            return Err(Error::InvalidRequest("ttl_secs must be at least 1".into()));
        }
        let r = {
            let mut guard = self.lock();
            let st = &mut *guard;
            if !st.networks.contains_key(&key.network) {
                return Err(Error::NotFound(format!(
                    "network {:?} is unknown",
                    key.network
                )));
            }
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
            // `take_addresses` looks only at the key's network; the rest names the reservation
            // in case a message ever shows it.
            let owner = AttachmentKey {
                network: key.network.clone(),
                container_id: format!("reservation-{}-{}", key.namespace, key.name),
                ifname: "-".into(),
            };
            let got = match self.take_addresses(st, &owner, &addresses, None, now, false)? {
                Step::Done(got) => got,
                Step::Wait(ms) => {
                    return Err(Error::Busy(format!(
                        "the address source is rate-limited; try again in {ms} ms"
                    )))
                }
            };
            let net = st
                .networks
                .get_mut(&key.network)
                .ok_or_else(|| Error::NotFound(format!("network {:?} is gone", key.network)))?;
            let r = Reservation {
                key: key.clone(),
                addresses: got.iter().map(|a| a.ip).collect(),
                created_at_ms: now,
                expires_at_ms: now.saturating_add(ttl_secs.saturating_mul(1000)),
                reason: format!("operator: {reason}"),
            };
            let mut changes = vec![Change::PutReservation(r.clone())];
            changes.extend(super::source_changes(&key.network, net, &got));
            if let Err(e) = self.shared.store.apply(&changes) {
                for a in got.iter().rev() {
                    net.pools[a.set].unwind(a);
                }
                return Err(e.into());
            }
            for a in &got {
                let _ = net.pools[a.set].pool.reserve(a.ip);
            }
            st.reservations.insert(key.clone(), r.clone());
            r
        };
        self.flush().await?;
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
        let released = {
            let mut guard = self.lock();
            if !guard.attachments.contains_key(key) {
                return Err(Error::NotFound(format!("no attachment {key}")));
            }
            self.release_all(&mut guard, std::slice::from_ref(key), ReleaseBy::Operator)?
        };
        self.flush().await?;
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
        let now_drained = {
            let mut st = self.lock();
            if name != ALL_NETWORKS && !st.networks.contains_key(&name) {
                return Err(Error::NotFound(format!("network {name:?} is unknown")));
            }
            if st.drained.contains(&name) != drain {
                self.shared.store.apply(&[Change::PutDrain {
                    network: name.clone(),
                    drained: drain,
                }])?;
                if drain {
                    st.drained.insert(name.clone());
                } else {
                    st.drained.remove(&name);
                }
            }
            let _ = self
                .shared
                .all_drained
                .send(st.drained.contains(ALL_NETWORKS));
            st.drained.iter().cloned().collect()
        };
        self.flush().await?;
        tracing::warn!(network = %name, drain, "drain changed by an operator");
        Ok(now_drained)
    }

    /// Whether every network is drained (health reports NOT_SERVING then).
    pub fn drained_all(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shared.all_drained.subscribe()
    }
}
