//! What can be read without changing anything: CNI CHECK, CNI STATUS, the pools' numbers.

use std::net::IpAddr;

use super::Ipam;
use crate::error::Error;
use crate::model::{AttachmentKey, Millis, NetworkDef};
use crate::range::Family;
use crate::source::Next;

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
    /// Of `reserved`, those held by quarantines.
    pub quarantined: usize,
    pub drained: bool,
    /// The network's ranges no longer name this set: it hands nothing out, and goes when what
    /// it holds is released.
    pub retiring: bool,
    /// When the pool last failed to serve, and why.
    pub last_error: Option<(Millis, String)>,
    pub source_calls: u64,
    pub source_errors: u64,
    pub bucket_waits: u64,
    pub free_in_source: u128,
    /// The source claims more when it runs low ([`crate::source::BlockSource::grows`]).
    pub grows: bool,
    pub min_idle: usize,
    pub max_idle: usize,
    pub bucket_tokens: f64,
    /// The source's [`crate::source::BlockSource::degraded`].
    pub degraded: Option<String>,
    /// The source's [`crate::source::BlockSource::detail`].
    pub detail: Option<String>,
}

impl PoolStatus {
    /// Addresses a new ADD could still get without the source growing: the idle ones (the
    /// cooling ones last) and what the source has left, within the pool's capacity.
    pub fn available(&self) -> u128 {
        let held = (self.in_use + self.idle + self.reserved) as u128;
        let room = (self.capacity as u128).saturating_sub(held);
        self.idle as u128 + self.free_in_source.min(room)
    }
}

/// Why an ADD on a network could not be served now (CNI STATUS, and the daemon's readiness).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotReady(pub String);

impl Ipam {
    /// Confirms the attachment exists and holds every address in `addresses`.
    pub fn check(&self, key: &AttachmentKey, addresses: &[IpAddr]) -> Result<(), Error> {
        super::validate_key(key)?;
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
                    super::join(record.addresses())
                )));
            }
        }
        Ok(())
    }

    /// Ok when an ADD on `network` could be served now; else the reason.
    /// `declared` is the network a CNI config would declare if the daemon does not know it.
    pub fn status(&self, network: &str, declared: Option<&NetworkDef>) -> Result<(), NotReady> {
        let mut st = self.lock();
        self.notice_store_failure(&mut st);
        self.serving(&st).map_err(|e| NotReady(e.to_string()))?;
        if let Some(why) = self.gate_closed() {
            return Err(NotReady(why));
        }
        let now = self.now();
        let Some(net) = st.networks.get(network) else {
            return match declared {
                Some(_) => Ok(()),
                None => Err(NotReady(format!(
                    "network {network:?} is unknown to ipoold and the config declares no ranges"
                ))),
            };
        };
        if let Some(d) = declared {
            let fixed = net.def.origin.ranges_at_runtime();
            let held = st.attachments.iter().any(|a| a.network() == network);
            if !net.def.same_addresses(d) && (fixed || held) {
                return Err(NotReady(format!(
                    "network {network:?} is defined with ranges {}, the config asks for {}",
                    net.def.describe_ranges(),
                    d.describe_ranges()
                )));
            }
        }
        if let Some(why) = net.no_ranges() {
            return Err(NotReady(why));
        }
        // The network serves an ADD when each group of range sets it takes an address from
        // (a set of no cluster pool alone; a family of its cluster pools, tried in order) has
        // one that serves: a pool this node may not use, or one full while the next serves,
        // does not make the network unready.
        for sets in super::pick::groups(net, None) {
            let mut why = Vec::new();
            for set in sets {
                match set_ready(&net.pools[set], network, now) {
                    Ok(()) => {
                        why.clear();
                        break;
                    }
                    Err(w) => why.push(w.0),
                }
            }
            if !why.is_empty() {
                return Err(NotReady(why.join("; ")));
            }
        }
        Ok(())
    }

    /// True if anything here holds an address of `net`: an attachment, a reservation, an
    /// idle address (a block of a pool no network uses any more is given back only when not).
    pub fn holds_in(&self, net: &ipnet::IpNet) -> bool {
        let st = self.lock();
        st.attachments
            .iter()
            .any(|a| a.addresses().iter().any(|ip| net.contains(ip)))
            || st
                .reservations
                .values()
                .any(|r| r.addresses.iter().any(|ip| net.contains(ip)))
            || st.networks.values().any(|n| {
                n.pools
                    .iter()
                    .any(|p| p.pool.idle_addresses().any(|(ip, _)| net.contains(&ip)))
            })
    }

    pub fn pool_status(&self, network: Option<&str>) -> Vec<PoolStatus> {
        let st = self.lock();
        let st = &*st;
        let now = self.now();
        st.networks
            .values()
            .filter(|n| network.is_none_or(|w| w == n.def.name))
            .flat_map(|n| {
                let drained = st.is_drained(&n.def.name);
                n.pools.iter().map(move |p| PoolStatus {
                    network: n.def.name.clone(),
                    family: p.family,
                    ranges: p.source.describe(),
                    capacity: p.pool.config().capacity,
                    in_use: p.pool.in_use(),
                    idle: p.pool.idle(),
                    cooling: p.pool.cooling(now),
                    reserved: p.pool.reserved(),
                    quarantined: st
                        .reservations
                        .values()
                        .filter(|r| r.pod_uid.is_some() && r.key.network == n.def.name)
                        .flat_map(|r| &r.addresses)
                        .filter(|ip| p.source.contains(**ip))
                        .count(),
                    drained,
                    retiring: p.retiring,
                    last_error: p.last_error.clone(),
                    source_calls: p.source_calls,
                    source_errors: p.source_errors,
                    bucket_waits: p.bucket_waits,
                    free_in_source: p.source.free(),
                    grows: p.source.blocks().is_some_and(|b| b.grows()),
                    min_idle: p.pool.config().min_idle,
                    max_idle: p.pool.config().max_idle,
                    bucket_tokens: p.bucket.level(now),
                    degraded: p.source.blocks().and_then(|b| b.degraded()),
                    detail: p.source.blocks().and_then(|b| b.detail()),
                })
            })
            .collect()
    }
}

/// Ok when range set `p` of `network` could serve an ADD now; else why not.
fn set_ready(
    p: &super::range_set::RangeSetPool,
    network: &str,
    now: Millis,
) -> Result<(), NotReady> {
    if let Some(why) = p.source.blocks().and_then(|b| b.refused()) {
        return Err(NotReady(format!(
            "{} cannot serve an ADD: {why}",
            p.describe(network)
        )));
    }
    if let Some((_, why)) = p
        .source
        .blocks()
        .and_then(|b| b.held_back())
        .and_then(Next::why_not)
    {
        return Err(NotReady(format!(
            "{} cannot serve an ADD: {why}",
            p.describe(network)
        )));
    }
    let next = p.source.next();
    let usable = |ip| p.source.blocks().and_then(|b| b.withheld(ip)).is_none();
    if let Next::Unavailable(why) | Next::Refused(_, why) = &next {
        if p.pool.fallback(usable).is_err() {
            return Err(NotReady(format!(
                "{} cannot serve an ADD: {why}",
                p.describe(network)
            )));
        }
    }
    p.pool
        .plan(now, next == Next::Exhausted, usable)
        .map(|_| ())
        .map_err(|e| NotReady(format!("{} cannot serve an ADD: {e}", p.describe(network))))
}
