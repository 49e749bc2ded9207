//! Releasing attachments (shared by DEL, CNI GC, reboot and leak reclaim), CNI GC itself, and
//! CNI STATUS (can an ADD be served).

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

use super::{sticky, Ipam, State};
use crate::config::NetworkDef;
use crate::error::Error;
use crate::pool::{Millis, Pool};
use crate::store::{AttachmentKey, Change, Reservation, ReservationKey};

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
}

impl ReleaseBy {
    pub fn reason(self) -> &'static str {
        match self {
            ReleaseBy::Del => "CNI DEL",
            ReleaseBy::Gc => "not in the runtime's cni.dev/valid-attachments (CNI GC)",
            ReleaseBy::Reboot => "the machine rebooted (boot ID changed)",
            ReleaseBy::Leak => "its network namespace is gone (seen missing twice)",
            ReleaseBy::Operator => "released by an operator",
        }
    }

    /// Whether a sticky pod's addresses become a reservation rather than idle.
    fn keeps_sticky(self) -> bool {
        !matches!(self, ReleaseBy::Leak | ReleaseBy::Operator)
    }
}

/// One released attachment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    pub key: AttachmentKey,
    pub pod: crate::store::Pod,
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

impl Ipam {
    /// Releases every attachment of `network` whose (container ID, ifname) is not in `valid`.
    /// Returns what was released. Each release is logged with its reason.
    pub async fn gc(
        &self,
        network: &str,
        valid: &HashSet<(String, String)>,
    ) -> Result<Vec<Released>, Error> {
        crate::ipam::validate_name("network name", network).map_err(Error::InvalidRequest)?;
        let released = {
            let mut guard = self.lock();
            let st = &mut *guard;
            let stale: Vec<AttachmentKey> = st
                .attachments
                .iter()
                .filter(|a| {
                    a.network() == network
                        && !valid.contains(&(a.container_id().to_string(), a.ifname().to_string()))
                })
                .map(|a| a.key())
                .collect();
            if stale.is_empty() {
                return Ok(Vec::new());
            }
            self.release_all(st, &stale, ReleaseBy::Gc)?
        };
        self.flush().await?;
        for r in &released {
            r.log(ReleaseBy::Gc);
        }
        self.emit_released(&released, ReleaseBy::Gc, ReleaseBy::Gc.reason());
        self.shared.changed.notify_one();
        Ok(released)
    }

    /// Releases `keys` in one atomic store write: in use -> idle (cooling from now), or, for a
    /// sticky pod, -> a reservation for its namespace/name (replacing an older one, whose
    /// addresses go idle). The changes are worked out first, written, and only then made in
    /// memory: on a store error nothing changes. Shared by DEL, GC, reboot and leak reclaim.
    pub(super) fn release_all(
        &self,
        st: &mut State,
        keys: &[AttachmentKey],
        by: ReleaseBy,
    ) -> Result<Vec<Released>, Error> {
        let now = self.now();
        let mut changes = Vec::new();
        // (network, set, ip) moving in use -> idle, in use -> reserved, reserved -> idle.
        let mut to_idle: Vec<(String, usize, IpAddr)> = Vec::new();
        let mut to_reserved: Vec<(String, usize, IpAddr)> = Vec::new();
        let mut unreserved: Vec<(String, usize, IpAddr)> = Vec::new();
        let mut new_res: BTreeMap<ReservationKey, Reservation> = BTreeMap::new();
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
            let sticky = sticky::identity(&key.network, &pod)
                .filter(|_| by.keeps_sticky() && net.def.tuning.sticky.applies_to(&pod.name));
            let held: Vec<(usize, IpAddr)> = record
                .addresses()
                .iter()
                .filter_map(|ip| {
                    let set = net.set_of(*ip)?;
                    net.pools[set].pool.is_in_use(*ip).then_some((set, *ip))
                })
                .collect();
            let mut reserved_until = None;
            match sticky {
                Some(rkey) if !held.is_empty() => {
                    let until =
                        now.saturating_add(net.def.tuning.sticky_ttl_secs.saturating_mul(1000));
                    if let Some(old) = st
                        .reservations
                        .get(&rkey)
                        .filter(|_| !new_res.contains_key(&rkey))
                    {
                        for ip in &old.addresses {
                            if let Some(set) = net.set_of(*ip) {
                                unreserved.push((key.network.clone(), set, *ip));
                                changes.push(Change::PutIdle {
                                    network: key.network.clone(),
                                    ip: *ip,
                                    released_at: now,
                                });
                            }
                        }
                    }
                    let r = new_res.entry(rkey.clone()).or_insert_with(|| Reservation {
                        key: rkey,
                        addresses: Vec::new(),
                        created_at_ms: now,
                        expires_at_ms: until,
                        reason: format!("sticky pod released: {}", by.reason()),
                    });
                    for (set, ip) in &held {
                        r.addresses.push(*ip);
                        to_reserved.push((key.network.clone(), *set, *ip));
                    }
                    reserved_until = Some(until);
                }
                _ => {
                    for (set, ip) in &held {
                        to_idle.push((key.network.clone(), *set, *ip));
                        changes.push(Change::PutIdle {
                            network: key.network.clone(),
                            ip: *ip,
                            released_at: now,
                        });
                    }
                }
            }
            out.push(Released {
                key: key.clone(),
                pod,
                addresses: record.addresses().to_vec(),
                reserved_until,
            });
        }
        changes.extend(new_res.values().cloned().map(Change::PutReservation));
        self.shared.store.apply(&changes)?;

        fn pool<'a>(st: &'a mut State, net: &str, set: usize) -> Option<&'a mut Pool<()>> {
            st.networks.get_mut(net).map(|n| &mut n.pools[set].pool)
        }
        for (net, set, ip) in unreserved {
            if let Some(p) = pool(st, &net, set) {
                p.unreserve(ip, now);
            }
        }
        for (net, set, ip) in to_idle {
            if let Some(p) = pool(st, &net, set) {
                p.release(ip, now);
            }
        }
        for (net, set, ip) in to_reserved {
            if let Some(p) = pool(st, &net, set) {
                let _ = p.reserve(ip);
            }
        }
        for (k, r) in new_res {
            st.reservations.insert(k, r);
        }
        for r in &out {
            st.attachments.remove(&r.key);
        }
        Ok(out)
    }

    /// Ok when an ADD on `network` could be served now; else the reason.
    /// `declared` is the network a CNI config would declare if the daemon does not know it.
    pub fn status(&self, network: &str, declared: Option<&NetworkDef>) -> Result<(), String> {
        let st = self.lock();
        let now = self.now();
        let Some(net) = st.networks.get(network) else {
            return match declared {
                Some(_) => Ok(()),
                None => Err(format!(
                    "network {network:?} is unknown to ipoold and the config declares no ranges"
                )),
            };
        };
        if let Some(d) = declared {
            if !net.def.same_addresses(d) && st.attachments.iter().any(|a| a.network() == network) {
                return Err(format!(
                    "network {network:?} is defined with ranges {}, the config asks for {}",
                    net.def.describe_ranges(),
                    d.describe_ranges()
                ));
            }
        }
        for p in &net.pools {
            let dry = p.factory.free() == 0;
            if let Err(e) = p.pool.plan(now, dry) {
                return Err(format!(
                    "pool {network:?} IPv{} ({}) cannot serve an ADD: {e}",
                    p.family.as_str(),
                    p.factory.describe()
                ));
            }
        }
        Ok(())
    }
}
