//! The engine: networks, attachments, and the ADD/DEL/CHECK operations.
//!
//! A request takes the state lock, lets the pools decide, applies the resulting [`Change`]s to
//! the store as one atomic write (still under the lock, so the store sees changes in decision
//! order), releases the lock, and then waits for the store's group commit to make it durable
//! before it replies. If the store refuses a write, the pools are put back as they were:
//! nothing half-done stays behind.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;

use crate::clock::Clock;
use crate::config::{IpamSection, NetworkDef, RouteSpec, Tuning};
use crate::error::Error;
use crate::factory::LocalFactory;
use crate::pool::Millis;
use crate::range::Family;
use crate::store::{
    AttachmentKey, AttachmentRecord, Change, Committer, Pod, Reservation, ReservationKey,
};
use attachments::Attachments;
use family::{Acquired, ClaimError, FamilyPool, Origin};

mod attachments;
mod family;
mod gc;
mod leak;
mod maintain;
mod ops;
mod recover;
mod sticky;
pub use gc::{ReleaseBy, Released};
pub use leak::LeakSuspects;
pub use maintain::spawn_maintenance;
pub use ops::{Event, EventKind, Filter, ALL_NETWORKS};

/// How long an ADD may wait for the source's token bucket before it settles for what the pool
/// has (a cooling address) or fails with a retryable error.
const MAX_SOURCE_WAIT: Duration = Duration::from_secs(2);

/// Cheap-to-clone handle on the engine.
#[derive(Clone)]
pub struct Ipam {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    store: Committer,
    clock: Arc<dyn Clock>,
    /// Tuning for networks declared by a CNI `ipam` section.
    defaults: Tuning,
    /// Wakes the background loop after a change.
    changed: Notify,
    /// Time between leak checks; zero: none.
    leak_check: Duration,
    /// Allocation events, for `Watch`.
    events: tokio::sync::broadcast::Sender<Event>,
    /// True while every network is drained.
    all_drained: tokio::sync::watch::Sender<bool>,
    metrics: Arc<crate::metrics::Metrics>,
}

#[derive(Default)]
struct State {
    networks: BTreeMap<String, Network>,
    attachments: Attachments,
    reservations: BTreeMap<ReservationKey, Reservation>,
    /// Networks that take no new ADDs ([`ALL_NETWORKS`]: every one).
    drained: std::collections::BTreeSet<String>,
}

struct Network {
    def: NetworkDef,
    /// One per range set, in order.
    pools: Vec<FamilyPool>,
}

/// An address as a reply reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    pub ip: IpAddr,
    pub prefix_len: u8,
    pub gateway: Option<IpAddr>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddReply {
    pub leases: Vec<Lease>,
    pub routes: Vec<RouteSpec>,
}

#[derive(Clone, Debug)]
pub struct AddRequest {
    pub key: AttachmentKey,
    pub pod: Pod,
    pub netns: String,
    /// The CNI `ipam` section, if the request carried one.
    pub ipam: Option<IpamSection>,
    /// Static addresses asked for: at most one per range set; sets without one get a
    /// dynamic address (as host-local does).
    pub requested: Vec<IpAddr>,
}

/// A pool's numbers, for status reports.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolStatus {
    pub network: String,
    pub family: Family,
    pub ranges: String,
    pub capacity: usize,
    pub in_use: usize,
    pub idle: usize,
    pub cooling: usize,
    pub reserved: usize,
    pub drained: bool,
    /// When the pool last failed to serve, and why.
    pub last_error: Option<(Millis, String)>,
    pub source_calls: u64,
    pub source_errors: u64,
    pub bucket_waits: u64,
    pub free_in_source: u128,
    pub min_idle: usize,
    pub max_idle: usize,
    pub bucket_tokens: f64,
}

enum Step<T> {
    Done(T),
    /// The source's bucket is empty: try again after this many ms.
    Wait(Millis),
}

pub use ipool_proto::names::check_name as validate_name;

pub fn validate_key(key: &AttachmentKey) -> Result<(), Error> {
    validate_name("network name", &key.network)
        .and_then(|_| validate_name("container ID", &key.container_id))
        .and_then(|_| ipool_proto::names::check_ifname("interface name", &key.ifname))
        .map_err(Error::InvalidRequest)
}

impl Network {
    fn new(def: NetworkDef, now: Millis) -> Result<Network, Error> {
        let pools = def
            .ranges()?
            .into_iter()
            .map(|set| {
                let family = set[0].family();
                FamilyPool::new(family, Box::new(LocalFactory::new(set)), &def.tuning, now)
            })
            .collect();
        Ok(Network { def, pools })
    }

    /// The pool (range-set index) whose ranges hand out `ip`.
    fn set_of(&self, ip: IpAddr) -> Option<usize> {
        self.pools.iter().position(|p| p.factory.contains(ip))
    }
}

// === impl Ipam ===

impl Ipam {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied store write (the store
        // is atomic); the pools may be off, so recovering the guard is the lesser evil
        // compared with refusing every later request.
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn now(&self) -> Millis {
        self.shared.clock.now_ms()
    }

    /// Waits until every change applied so far is durable (shared with concurrent requests).
    async fn flush(&self) -> Result<(), Error> {
        Ok(self.shared.store.durable().await?)
    }

    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.shared.metrics
    }

    /// The store's group-commit counters.
    pub fn commit_stats(&self) -> crate::store::CommitStats {
        self.shared.store.stats()
    }

    /// Allocates one address per range set of the network, or returns the attachment's
    /// addresses if it exists (ADD is idempotent). Replies only once the allocation is durable.
    pub async fn add(&self, req: AddRequest) -> Result<AddReply, Error> {
        validate_key(&req.key)?;
        let declared = match &req.ipam {
            Some(s) => s.network_def(&req.key.network, &self.shared.defaults)?,
            None => None,
        };
        let routes_override = req.ipam.as_ref().and_then(|s| s.routes.clone());
        let started = tokio::time::Instant::now();
        loop {
            let may_wait = started.elapsed() < MAX_SOURCE_WAIT;
            let step = self.try_add(&req, declared.as_ref(), may_wait)?;
            match step {
                Step::Done(mut reply) => {
                    self.flush().await?;
                    if let Some(r) = &routes_override {
                        reply.routes = r.clone();
                    }
                    self.shared.changed.notify_one();
                    return Ok(reply);
                }
                Step::Wait(ms) => {
                    let left = MAX_SOURCE_WAIT.saturating_sub(started.elapsed());
                    tokio::time::sleep(Duration::from_millis(ms).min(left)).await;
                }
            }
        }
    }

    fn try_add(
        &self,
        req: &AddRequest,
        declared: Option<&NetworkDef>,
        may_wait: bool,
    ) -> Result<Step<AddReply>, Error> {
        let mut guard = self.lock();
        let st = &mut *guard;
        if let Some(existing) = st.attachments.get(&req.key) {
            let net = st
                .networks
                .get(&req.key.network)
                .ok_or_else(|| Error::NotFound(format!("network {:?} is gone", req.key.network)))?;
            return Ok(Step::Done(reply_for(net, existing.addresses())));
        }
        if st.drained.contains(ALL_NETWORKS) || st.drained.contains(&req.key.network) {
            return Err(Error::Busy(format!(
                "network {:?} is drained by an operator: no new addresses until it is undrained (ipoolctl drain --undo)",
                req.key.network
            )));
        }
        let now = self.now();
        let existed = st.networks.contains_key(&req.key.network);
        self.ensure_network(st, &req.key.network, declared, now)?;
        // Most nodes hold no reservation: then no key is built on the ADD path.
        let reservation = (!st.reservations.is_empty())
            .then(|| sticky::identity(&req.key.network, &req.pod))
            .flatten()
            .and_then(|k| st.reservations.get(&k))
            .filter(|r| r.expires_at_ms > now)
            .cloned();
        let result = self.allocate(st, req, reservation.as_ref(), now, may_wait);
        if result.is_err() && !existed {
            // The request that declared the network failed: declare nothing.
            if self
                .shared
                .store
                .apply(&[Change::DeleteNetwork(req.key.network.clone())])
                .is_ok()
            {
                st.networks.remove(&req.key.network);
            }
        }
        result
    }

    /// Takes one address per range set of `key.network` for `key`: a requested address where
    /// one is given, else the reservation's, else one from the pool; all or nothing (on an
    /// error or a wait, what was taken is put back). The pools change; the store does not.
    fn take_addresses(
        &self,
        st: &mut State,
        key: &AttachmentKey,
        requested: &[IpAddr],
        reservation: Option<&Reservation>,
        now: Millis,
        may_wait: bool,
    ) -> Result<Step<Vec<Acquired>>, Error> {
        let net = st
            .networks
            .get_mut(&key.network)
            .ok_or_else(|| Error::NotFound(format!("network {:?} is unknown", key.network)))?;

        let mut wanted: Vec<Option<IpAddr>> = vec![None; net.pools.len()];
        for ip in requested {
            let set = net.pools.iter().position(|p| p.factory.covers(*ip));
            let set = set.ok_or_else(|| {
                Error::InvalidConfig(format!(
                    "requested address {ip} is outside every range of network {:?} ({})",
                    key.network,
                    net.def.describe_ranges()
                ))
            })?;
            if let Some(other) = wanted[set].replace(*ip) {
                return Err(Error::InvalidConfig(format!(
                    "requested addresses {other} and {ip} fall in the same range set of network {:?}; ask for one address per range set",
                    key.network
                )));
            }
        }
        let mut got: Vec<Acquired> = Vec::with_capacity(net.pools.len());
        let unwind = |net: &mut Network, got: &[Acquired]| {
            for a in got.iter().rev() {
                net.pools[a.set].unwind(a);
            }
        };
        for (set, want) in wanted.iter().enumerate() {
            // The pod's reservation, unless the request names another address.
            let kept = reservation.and_then(|r| {
                r.addresses.iter().copied().find(|ip| {
                    want.is_none_or(|w| w == *ip) && net.pools[set].pool.is_reserved(*ip)
                })
            });
            if let Some(ip) = kept {
                if let Some(a) = net.pools[set].take_reserved(set, ip) {
                    got.push(a);
                    continue;
                }
            }
            if let Some(ip) = *want {
                match net.pools[set].claim(set, ip) {
                    Ok(a) => {
                        got.push(a);
                        continue;
                    }
                    Err(e) => {
                        unwind(net, &got);
                        return Err(match e {
                            ClaimError::Held => {
                                // The pools do not record holders: find it (a scan, on this
                                // error path only).
                                let holder = st.attachments.holder_of(&key.network, ip);
                                let who = holder
                                    .map(|r| format!(" by attachment {}", r.key()))
                                    .unwrap_or_default();
                                let pod = holder
                                    .filter(|r| !r.pod_name().is_empty())
                                    .map(|r| format!(" (pod {}/{})", r.pod_namespace(), r.pod_name()))
                                    .unwrap_or_default();
                                Error::InUse(format!(
                                    "requested address {ip} is already held{who}{pod}"
                                ))
                            }
                            ClaimError::Reserved => {
                                let whose = st
                                    .reservations
                                    .values()
                                    .find(|r| {
                                        r.key.network == key.network && r.addresses.contains(&ip)
                                    })
                                    .map(|r| format!(" for pod {}/{} until {} (Unix ms)", r.key.namespace, r.key.name, r.expires_at_ms))
                                    .unwrap_or_default();
                                Error::InUse(format!(
                                    "requested address {ip} is reserved{whose}; cancel the reservation to use it elsewhere"
                                ))
                            }
                            ClaimError::NotHandedOut(why) => Error::InvalidConfig(format!(
                                "requested address {ip}: {why} (network, broadcast and gateway addresses are never handed out)"
                            )),
                            ClaimError::Pool(e) => Error::Exhausted(format!(
                                "requested address {ip} of network {:?}: {e}",
                                key.network
                            )),
                        });
                    }
                }
            }
            match net.pools[set].acquire(set, now, may_wait) {
                Ok(Step::Done(a)) => got.push(a),
                Ok(Step::Wait(ms)) => {
                    unwind(net, &got);
                    return Ok(Step::Wait(ms));
                }
                Err(e) => {
                    unwind(net, &got);
                    let p = &mut net.pools[set];
                    let msg = format!(
                        "pool {:?} IPv{} ({}) is exhausted: {e}; {} idle, {} cooling, {} reserved for sticky pods",
                        key.network,
                        p.family.as_str(),
                        p.factory.describe(),
                        p.pool.idle(),
                        p.pool.cooling(now),
                        p.pool.reserved()
                    );
                    p.last_error = Some((now, msg.clone()));
                    return Err(Error::Exhausted(msg));
                }
            }
        }
        Ok(Step::Done(got))
    }

    /// Allocates for `req` in its (existing) network: requested addresses first, then one
    /// address for every other range set; all or nothing.
    fn allocate(
        &self,
        st: &mut State,
        req: &AddRequest,
        reservation: Option<&Reservation>,
        now: Millis,
        may_wait: bool,
    ) -> Result<Step<AddReply>, Error> {
        let got =
            match self.take_addresses(st, &req.key, &req.requested, reservation, now, may_wait)? {
                Step::Done(got) => got,
                Step::Wait(ms) => return Ok(Step::Wait(ms)),
            };
        let net = st
            .networks
            .get_mut(&req.key.network)
            .ok_or_else(|| Error::NotFound(format!("network {:?} is unknown", req.key.network)))?;
        let unwind = |net: &mut Network, got: &[Acquired]| {
            for a in got.iter().rev() {
                net.pools[a.set].unwind(a);
            }
        };
        let record = AttachmentRecord {
            key: req.key.clone(),
            pod: req.pod.clone(),
            netns: req.netns.clone(),
            addresses: got.iter().map(|a| a.ip).collect(),
            created_at_ms: now,
        };
        let mut changes = vec![Change::PutAttachment(record.clone())];
        changes.extend(source_changes(&req.key.network, net, &got));
        // A used reservation ends; its addresses the pod did not get back go idle, cooling.
        let used = reservation.filter(|_| got.iter().any(|a| matches!(a.origin, Origin::Reserved)));
        let leftover: Vec<(usize, IpAddr)> = match used {
            Some(r) => {
                changes.push(Change::DeleteReservation(r.key.clone()));
                r.addresses
                    .iter()
                    .filter(|ip| !record.addresses.contains(ip))
                    .filter_map(|ip| net.set_of(*ip).map(|set| (set, *ip)))
                    .collect()
            }
            _ => Vec::new(),
        };
        for (_, ip) in &leftover {
            changes.push(Change::PutIdle {
                network: req.key.network.clone(),
                ip: *ip,
                released_at: now,
            });
        }
        if let Err(e) = self.shared.store.apply(&changes) {
            unwind(net, &got);
            return Err(e.into());
        }
        for (set, ip) in leftover {
            net.pools[set].pool.unreserve(ip, now);
        }
        if let Some(r) = used {
            st.reservations.remove(&r.key);
            tracing::info!(network = %req.key.network, pod = %format!("{}/{}", r.key.namespace, r.key.name), container = %req.key.container_id, address = %join(&record.addresses), "sticky pod back: its reservation is used");
        }
        let reply = reply_for(net, &record.addresses);
        let reason = if used.is_some() {
            "sticky pod back"
        } else {
            "CNI ADD"
        };
        self.emit(|| Event::of_record(EventKind::Add, now, &record, reason));
        st.attachments.insert(&record);
        Ok(Step::Done(reply))
    }

    /// Makes sure the network exists, declaring it from the CNI config if it is new.
    /// A declaration that hands out other addresses than the known one is an error while the
    /// network has attachments; without attachments it replaces the old definition.
    fn ensure_network(
        &self,
        st: &mut State,
        name: &str,
        declared: Option<&NetworkDef>,
        now: Millis,
    ) -> Result<(), Error> {
        match (st.networks.get(name), declared) {
            (Some(_), None) => return Ok(()),
            (Some(known), Some(d)) if known.def.same_addresses(d) => return Ok(()),
            (Some(known), Some(d)) => {
                let live = st.attachments.iter().filter(|a| a.network() == name).count()
                    + st.reservations.keys().filter(|k| k.network == name).count();
                if live > 0 {
                    return Err(Error::InvalidConfig(format!(
                        "network {name:?} is already defined (by {}) with ranges {}; this config asks for {}, but {live} attachment(s) or reservation(s) still hold addresses of the old ranges (delete them first, or use a new network name)",
                        match known.def.origin {
                            crate::config::Origin::Config => "ipoold's config file",
                            crate::config::Origin::Cni => "an earlier CNI config",
                        },
                        known.def.describe_ranges(),
                        d.describe_ranges()
                    )));
                }
                if known.def.origin == crate::config::Origin::Config {
                    return Err(Error::InvalidConfig(format!(
                        "network {name:?} is defined in ipoold's config file with ranges {}; the CNI config asks for {} (change one of them so they agree, or drop the ranges from the CNI config)",
                        known.def.describe_ranges(),
                        d.describe_ranges()
                    )));
                }
                tracing::warn!(network = name, old = %known.def.describe_ranges(), new = %d.describe_ranges(), "network redefined by a CNI config; it had no attachments");
            }
            (None, Some(_)) => {}
            (None, None) => {
                return Err(Error::InvalidConfig(format!(
                    "network {name:?} is unknown to ipoold and the CNI config's ipam section declares no ranges (set ipam.ranges or ipam.subnet, or declare the network in ipoold's config)"
                )))
            }
        }
        let def = declared
            .cloned()
            .ok_or_else(|| Error::InvalidConfig(format!("network {name:?}: no definition")))?;
        let net = Network::new(def.clone(), now)?;
        let mut changes = vec![Change::PutNetwork(def)];
        if let Some(old) = st.networks.get(name) {
            for (set, p) in old.pools.iter().enumerate() {
                for (ip, _) in p.pool.idle_addresses() {
                    changes.push(Change::DeleteIdle {
                        network: name.to_string(),
                        ip,
                    });
                }
                changes.push(Change::PutCursor {
                    network: name.to_string(),
                    set,
                    cursor: None,
                });
            }
        }
        self.shared.store.apply(&changes)?;
        tracing::info!(network = name, ranges = %net.def.describe_ranges(), "network declared by CNI config");
        st.networks.insert(name.to_string(), net);
        Ok(())
    }

    /// Releases the attachment's addresses (they go idle, cooling). Unknown keys succeed.
    /// Returns the addresses released.
    pub async fn del(&self, key: &AttachmentKey) -> Result<Vec<IpAddr>, Error> {
        validate_key(key)?;
        let released = {
            let mut guard = self.lock();
            if !guard.attachments.contains_key(key) {
                return Ok(Vec::new());
            }
            self.release_all(&mut guard, std::slice::from_ref(key), ReleaseBy::Del)?
        };
        self.flush().await?;
        self.emit_released(&released, ReleaseBy::Del, ReleaseBy::Del.reason());
        self.shared.changed.notify_one();
        Ok(released.into_iter().flat_map(|r| r.addresses).collect())
    }

    /// Confirms the attachment exists and holds every address in `addresses`.
    pub fn check(&self, key: &AttachmentKey, addresses: &[IpAddr]) -> Result<(), Error> {
        validate_key(key)?;
        let st = self.lock();
        let record = st.attachments.get(key).ok_or_else(|| {
            Error::NotFound(format!(
                "no attachment {key} in ipoold: the container holds no address of this network"
            ))
        })?;
        for ip in addresses {
            if !record.addresses().contains(ip) {
                let holder = st
                    .attachments
                    .holder_of(&key.network, *ip)
                    .map(|r| format!("held by {}", r.key()))
                    .unwrap_or_else(|| "not held by anyone".into());
                return Err(Error::Mismatch(format!(
                    "{ip} is not held by attachment {key} ({holder}); it holds {}",
                    join(record.addresses())
                )));
            }
        }
        Ok(())
    }

    /// Tuning for networks that CNI configs declare.
    pub fn defaults(&self) -> &Tuning {
        &self.shared.defaults
    }

    pub fn pool_status(&self, network: Option<&str>) -> Vec<PoolStatus> {
        let st = self.lock();
        let now = self.now();
        let drained = &st.drained;
        st.networks
            .values()
            .filter(|n| network.is_none_or(|w| w == n.def.name))
            .flat_map(|n| {
                let drained = drained.contains(ALL_NETWORKS) || drained.contains(&n.def.name);
                n.pools.iter().map(move |p| PoolStatus {
                    network: n.def.name.clone(),
                    family: p.family,
                    ranges: p.factory.describe(),
                    capacity: p.pool.config().capacity,
                    in_use: p.pool.in_use(),
                    idle: p.pool.idle(),
                    cooling: p.pool.cooling(now),
                    reserved: p.pool.reserved(),
                    drained,
                    last_error: p.last_error.clone(),
                    source_calls: p.source_calls,
                    source_errors: p.source_errors,
                    bucket_waits: p.bucket_waits,
                    free_in_source: p.factory.free(),
                    min_idle: p.pool.config().min_idle,
                    max_idle: p.pool.config().max_idle,
                    bucket_tokens: p.bucket.level(now),
                })
            })
            .collect()
    }

    pub fn attachments(&self, network: Option<&str>) -> Vec<AttachmentRecord> {
        let st = self.lock();
        let mut v: Vec<AttachmentRecord> = st
            .attachments
            .iter()
            .filter(|r| network.is_none_or(|w| w == r.network()))
            .map(|r| r.to_record())
            .collect();
        v.sort_by(|a, b| a.key.cmp(&b.key));
        v
    }
}

/// What taking `got` changed outside the attachment: idle entries gone, source cursors moved.
fn source_changes(network: &str, net: &Network, got: &[Acquired]) -> Vec<Change> {
    got.iter()
        .filter_map(|a| match a.origin {
            Origin::Idle { .. } => Some(Change::DeleteIdle {
                network: network.to_string(),
                ip: a.ip,
            }),
            Origin::Source { .. } => Some(Change::PutCursor {
                network: network.to_string(),
                set: a.set,
                cursor: net.pools[a.set].factory.cursor(),
            }),
            Origin::Claimed | Origin::Reserved => None,
        })
        .collect()
}

fn reply_for(net: &Network, addresses: &[IpAddr]) -> AddReply {
    let leases = addresses
        .iter()
        .map(|ip| match net.set_of(*ip) {
            Some(set) => net.pools[set].lease(*ip),
            None => Lease {
                ip: *ip,
                prefix_len: if ip.is_ipv4() { 32 } else { 128 },
                gateway: None,
            },
        })
        .collect();
    AddReply {
        leases,
        routes: net.def.routes.clone(),
    }
}

fn join(ips: &[IpAddr]) -> String {
    let v: Vec<String> = ips.iter().map(|i| i.to_string()).collect();
    v.join(", ")
}

#[cfg(test)]
mod tests;
