//! A network's ranges changing while the daemon runs (a Node's podCIDRs that arrive late, a
//! flannel subnet.env that changes), and the claims of sources that get their addresses
//! asynchronously (see [`crate::source`]).
//!
//! New ranges take effect at once. A range set the new ranges no longer name *retires* when
//! attachments still hold addresses in it (outside every new set): DEL and CHECK keep working
//! for them, nothing new comes from it, and it goes (from memory and from the store) once the
//! last of them is released. Reservations, idle addresses and cursors outside the new ranges
//! end with the change. Capacity follows: each new set's pool holds at most what its ranges
//! hold.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use super::attachments::Attachments;
use super::events::{Event, EventKind};
use super::state::{Network, State};
use super::{Claiming, Ipam};
use crate::error::Error;
use crate::model::{
    check_apart, describe_sets, validate_ranges, Millis, NetworkDef, Origin, Reservation,
    ReservationKey, RouteSpec,
};
use crate::pool::Since;
use crate::range::{parse_set, RangeSpec};
use crate::source::BlockRefused;
use crate::store::Change;

/// What a change of a network's ranges did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangesChanged {
    /// The network's ranges now.
    pub ranges: String,
    /// Old range sets kept, retiring: attachments hold addresses in them.
    pub retiring: String,
    /// Reservations ended: they held addresses outside the new ranges.
    pub reservations_ended: usize,
    /// Idle addresses dropped: outside the new ranges.
    pub idle_dropped: usize,
}

/// A network rebuilt for new ranges, and the change set that says so.
struct Replan {
    net: Network,
    changes: Vec<Change>,
    ended: Vec<Reservation>,
    summary: RangesChanged,
}

impl Ipam {
    /// Gives `network` new ranges (none: everything it holds retires). Returns None when they
    /// are the ranges it has. Durable when it returns; ADDs waiting for ranges are woken. The
    /// network's ranges are then its runtime ones ([`Origin::Runtime`]): a CNI config that
    /// names others is refused. A network of ipoold's config file takes its ranges from there.
    pub async fn set_ranges(
        &self,
        network: &str,
        range_sets: Vec<Vec<RangeSpec>>,
    ) -> Result<Option<RangesChanged>, Error> {
        self.set_ranges_and_routes(network, range_sets, None).await
    }

    /// [`Ipam::set_ranges`], and the routes an ADD answers with (None: as they are).
    pub async fn set_ranges_and_routes(
        &self,
        network: &str,
        range_sets: Vec<Vec<RangeSpec>>,
        routes: Option<Vec<RouteSpec>>,
    ) -> Result<Option<RangesChanged>, Error> {
        self.set_pool_ranges(network, range_sets, routes, BTreeMap::new())
            .await
    }

    /// [`Ipam::set_ranges_and_routes`] for a network with several cluster pools: `set_pools`
    /// names the pool of each range's subnet (see
    /// [`NetworkDef::set_pools`]). Empty for any other network.
    pub async fn set_pool_ranges(
        &self,
        network: &str,
        range_sets: Vec<Vec<RangeSpec>>,
        routes: Option<Vec<RouteSpec>>,
        set_pools: BTreeMap<String, String>,
    ) -> Result<Option<RangesChanged>, Error> {
        super::validate_network(network)?;
        if let Some(routes) = &routes {
            crate::config::validate_routes(network, routes)?;
        }
        let parsed = match range_sets.is_empty() {
            true => Vec::new(),
            false => validate_ranges(network, &range_sets)?,
        };
        let now = self.now();
        let (summary, seq, ended) = {
            let mut guard = self.lock();
            let st = &mut *guard;
            self.serving(st)?;
            let old = st
                .networks
                .get(network)
                .ok_or_else(|| Error::NotFound(format!("network {network:?} is unknown")))?;
            if old.def.origin == Origin::Config {
                return Err(Error::InvalidConfig(format!(
                    "network {network:?} takes its ranges from ipoold's config file ({}); change them there",
                    old.def.describe_ranges()
                )));
            }
            // A pool's ranges only for a network of that pool (a follower of a network since
            // declared anew may still be on its way).
            let foreign = match old.def.cluster_pools.is_empty() {
                true => (old.def.origin != Origin::Node)
                    .then(|| set_pools.values().next())
                    .flatten(),
                false => set_pools
                    .values()
                    .find(|p| !old.def.cluster_pools.contains(p)),
            };
            if let Some(pool) = foreign {
                return Err(Error::InvalidConfig(format!(
                    "network {network:?} does not take its addresses from cluster pool {pool:?} (it was declared anew)"
                )));
            }
            check_apart(network, &parsed, st.networks.values().map(|n| &n.def))?;
            let same = match (old.def.range_sets.is_empty(), range_sets.is_empty()) {
                (true, true) => true,
                (false, false) => old.def.same_addresses(&NetworkDef {
                    range_sets: range_sets.clone(),
                    ..old.def.clone()
                }),
                _ => false,
            };
            let same_routes = routes.as_ref().is_none_or(|r| *r == old.def.routes);
            let same_pools = set_pools
                .iter()
                .all(|(k, v)| old.def.set_pools.get(k) == Some(v));
            if same && same_routes && same_pools && old.def.origin.ranges_at_runtime() {
                return Ok(None);
            }
            // One subnet's gateways and exclusions that fit none of the new CIDRs: said once
            // per change of the ranges (a typo would give pods no gateway, or exclude nothing).
            if let Some(mode) = &old.def.subnet_mode {
                let subnets: Vec<ipnet::IpNet> =
                    parsed.iter().flatten().map(|r| r.subnet).collect();
                for misfit in mode.misfits(&subnets) {
                    tracing::warn!(network, %misfit, "the network's addressing does not fit its cluster pool's CIDRs");
                }
            }
            let Replan {
                net,
                changes,
                ended,
                summary,
            } = self.replan(
                old,
                range_sets,
                routes,
                set_pools,
                &st.attachments,
                &st.reservations,
                now,
            )?;
            // Before the new ranges serve: whoever checks against them sees they changed.
            self.ranges_moved();
            let seq = self.commit(st, &changes, |st| {
                for r in &ended {
                    st.reservations.remove(&r.key);
                }
                st.networks.insert(network.to_string(), net);
                Ok(())
            })?;
            (summary, seq, ended)
        };
        self.wait_durable(seq).await?;
        tracing::warn!(network, ranges = %summary.ranges, retiring = %summary.retiring, reservations_ended = summary.reservations_ended, idle_dropped = summary.idle_dropped, "network ranges changed");
        for r in &ended {
            self.emit(|| {
                Event::of_reservation(
                    EventKind::Release,
                    now,
                    r,
                    "its addresses are outside the network's new ranges",
                )
            });
        }
        self.shared.landed.notify_waiters();
        self.shared.changed.notify_one();
        Ok(Some(summary))
    }

    /// Says why `network` has no ranges yet ("node n1 has no podCIDRs yet"): ADD and STATUS
    /// answer with it while it has none. Kept in memory only; the source says it again.
    pub fn await_ranges(&self, network: &str, why: &str) -> Result<(), Error> {
        let mut st = self.lock();
        let net = st
            .networks
            .get_mut(network)
            .ok_or_else(|| Error::NotFound(format!("network {network:?} is unknown")))?;
        net.awaiting = Some(why.to_string());
        Ok(())
    }

    /// Why `network` cannot serve an ADD for want of ranges; None when it has ranges (or is
    /// unknown).
    pub fn awaiting(&self, network: &str) -> Option<String> {
        self.lock()
            .networks
            .get(network)
            .and_then(Network::no_ranges)
    }

    /// Builds `old` anew for `range_sets` (see the module docs). A set the new ranges name
    /// again keeps its source's blocks, cursor, bucket and counters.
    #[allow(clippy::too_many_arguments)]
    fn replan(
        &self,
        old: &Network,
        range_sets: Vec<Vec<RangeSpec>>,
        routes: Option<Vec<RouteSpec>>,
        set_pools: BTreeMap<String, String>,
        attachments: &Attachments,
        reservations: &BTreeMap<ReservationKey, Reservation>,
        now: Millis,
    ) -> Result<Replan, Error> {
        let name = old.def.name.clone();
        let sources = &self.shared.sources;
        let new_sets: Vec<_> = range_sets
            .iter()
            .filter_map(|s| parse_set(s).ok())
            .collect();
        // Every set the network had, but those the new ranges name again, may have to retire.
        let candidates: Vec<Vec<RangeSpec>> = old
            .def
            .range_sets
            .iter()
            .chain(&old.def.retiring)
            .filter(|s| !parse_set(s).is_ok_and(|r| new_sets.contains(&r)))
            .cloned()
            .collect();
        // Each set's pool: as said now, else as it was (a retiring set's).
        let mut pools = old.def.set_pools.clone();
        pools.extend(set_pools);
        let mut def = NetworkDef {
            range_sets,
            retiring: candidates,
            set_pools: pools,
            routes: routes.unwrap_or_else(|| old.def.routes.clone()),
            // A network of the config file stays one: its tuning still comes from there.
            origin: match old.def.origin {
                Origin::Node => Origin::Node,
                _ => Origin::Runtime,
            },
            ..old.def.clone()
        };
        let held: Vec<(IpAddr, String, bool)> = attachments
            .iter()
            .filter(|a| a.network() == name)
            .flat_map(|a| {
                let key = a.key().to_string();
                let fixed = a.k8s().is_some_and(|m| m.fixed.is_some());
                a.addresses()
                    .iter()
                    .map(move |ip| (*ip, key.clone(), fixed))
            })
            .collect();
        let mut probe = Network::new(def.clone(), sources, now)?;
        inherit(&mut probe, old)?;
        let mut used = vec![false; probe.pools.len()];
        for (ip, _, _) in &held {
            if let Some(set) = probe.set_of(*ip) {
                used[set] = true;
            }
        }
        def.retiring = std::mem::take(&mut def.retiring)
            .into_iter()
            .enumerate()
            .filter(|(i, _)| used[probe.current + i])
            .map(|(_, s)| s)
            .collect();
        let named: Vec<String> = def
            .range_sets
            .iter()
            .chain(&def.retiring)
            .flatten()
            .map(|r| r.subnet.clone())
            .collect();
        def.set_pools.retain(|subnet, _| named.contains(subnet));
        let mut net = Network::new(def, sources, now)?;
        net.awaiting = old.awaiting.clone();
        let moved = inherit(&mut net, old)?;
        let mut changes = vec![Change::PutNetwork(net.def.clone())];
        for (ip, key, fixed) in &held {
            net.restore_in_use(*ip, key, *fixed)
                .map_err(|e| Error::InvalidConfig(e.0))?;
        }
        let mut ended = Vec::new();
        for r in reservations.values().filter(|r| r.key.network == name) {
            let stays = r
                .addresses
                .iter()
                .all(|ip| net.set_of(*ip).is_some_and(|s| net.is_current(s)));
            if stays {
                for ip in &r.addresses {
                    net.restore_reserved(*ip, &r.key)
                        .map_err(|e| Error::InvalidConfig(e.0))?;
                }
            } else {
                // Its addresses in the new ranges go idle, cooling, as when it expires.
                for ip in &r.addresses {
                    if carry_idle(&mut net, *ip, Since::At(now)) {
                        changes.push(Change::PutIdle {
                            network: name.clone(),
                            ip: *ip,
                            released_at: Since::At(now).to_stored(),
                        });
                    }
                }
                changes.push(Change::DeleteReservation(r.key.clone()));
                ended.push(r.clone());
            }
        }
        let mut idle_dropped = 0;
        for p in &old.pools {
            for (ip, since) in p.pool.idle_addresses() {
                if !carry_idle(&mut net, ip, since) {
                    idle_dropped += 1;
                    changes.push(Change::DeleteIdle {
                        network: name.clone(),
                        ip,
                    });
                }
            }
            if net.pool_by_id(&p.id).is_none() {
                changes.extend(forget_set(&name, p));
            }
        }
        // Recorded under the set they moved to, and no longer under the old one (which may
        // still retire: a restart would restore the block into both).
        for (from, to, block) in moved {
            changes.push(Change::PutBlock {
                network: name.clone(),
                set: from,
                block: block.clone(),
                held: false,
            });
            changes.push(Change::PutBlock {
                network: name.clone(),
                set: to,
                block,
                held: true,
            });
        }
        let summary = RangesChanged {
            ranges: net.def.describe_ranges(),
            retiring: describe_sets(&net.def.retiring),
            reservations_ended: ended.len(),
            idle_dropped,
        };
        Ok(Replan {
            net,
            changes,
            ended,
            summary,
        })
    }

    /// Drops every retiring range set that holds nothing any more.
    pub(super) fn drop_retired(&self, st: &mut State) -> Result<(), Error> {
        let mut changes = Vec::new();
        for net in st.networks.values() {
            changes.extend(net.retired_changes());
        }
        if changes.is_empty() {
            return Ok(());
        }
        self.commit(st, &changes, |st| {
            for net in st.networks.values_mut() {
                net.drop_retired();
            }
            Ok(())
        })?;
        Ok(())
    }

    /// How long an ADD waits for addresses on their way (`[cni] add_wait_ms`).
    pub(super) fn add_wait(&self) -> Duration {
        Duration::from_millis(self.shared.config.cni.add_wait_ms)
    }

    /// Runs each claim outside the lock; its result lands in its source.
    pub(super) fn run_claims(&self, claims: Vec<Claiming>) {
        for c in claims {
            let ipam = self.clone();
            tokio::spawn(async move {
                c.claim.await;
                ipam.land(&c.network, &c.set);
            });
        }
    }

    /// A claim's result, back under the lock: the source takes it, and waiting ADDs wake.
    fn land(&self, network: &str, set: &str) {
        let now = self.now();
        let mut st = self.lock();
        let Some(p) = st.networks.get_mut(network).and_then(|n| n.pool_by_id(set)) else {
            drop(st);
            tracing::warn!(network, set, "a claim landed for a range set that is gone");
            self.shared.landed.notify_waiters();
            return;
        };
        // A claim started before the set was rebuilt (new ranges, a store recovery) lands in
        // the set's new source, which decides whether to take it (a cluster source takes only
        // its own: the next sync says what the other's call did).
        let knew = p
            .source
            .blocks()
            .map_or(Ok(()), |b| b.knows_its_addresses())
            .is_ok();
        let result = p
            .source
            .blocks_mut()
            .map_or(Ok(crate::source::Landing::Nothing), |b| b.land());
        if !knew
            && p.source
                .blocks()
                .map_or(Ok(()), |b| b.knows_its_addresses())
                .is_ok()
        {
            // Its addresses are known now: what was checked against the ranges is checked
            // again (before anything is handed out from them).
            self.ranges_moved();
        }
        let landed = match result {
            Ok(crate::source::Landing::Took(what)) => {
                tracing::info!(network, set, %what, "claim landed");
                true
            }
            Ok(crate::source::Landing::Nothing) => {
                tracing::info!(
                    network,
                    set,
                    "the work of a source since replaced finished: the next sync says what holds"
                );
                true
            }
            Err(e) => {
                tracing::warn!(network, set, error = %e, "a claim failed");
                p.source_errors += 1;
                p.last_error = Some((now, format!("claiming failed: {e}")));
                false
            }
        };
        drop(st);
        self.shared.landed.notify_waiters();
        if landed {
            // The background loop may fill the idle set from the new block.
            self.shared.changed.notify_one();
        }
    }
}

impl Network {
    /// The retiring sets that hold nothing any more (indexes into `pools`).
    fn retired(&self) -> Vec<usize> {
        (self.current..self.pools.len())
            .filter(|i| {
                let p = &self.pools[*i].pool;
                p.in_use() == 0 && p.reserved() == 0
            })
            .collect()
    }

    /// The changes that drop the sets [`Network::retired`] names.
    pub(super) fn retired_changes(&self) -> Vec<Change> {
        let gone = self.retired();
        if gone.is_empty() {
            return Vec::new();
        }
        let mut def = self.def.clone();
        def.retiring = kept_retiring(&self.def, self.current, &gone);
        let mut changes = vec![Change::PutNetwork(def)];
        for i in &gone {
            let p = &self.pools[*i];
            changes.extend(p.pool.idle_addresses().map(|(ip, _)| Change::DeleteIdle {
                network: self.def.name.clone(),
                ip,
            }));
            changes.extend(forget_set(&self.def.name, p));
        }
        changes
    }

    /// Drops the sets [`Network::retired`] names (what [`Network::retired_changes`] wrote).
    pub(super) fn drop_retired(&mut self) {
        let gone = self.retired();
        if gone.is_empty() {
            return;
        }
        tracing::info!(network = %self.def.name, ranges = %describe_sets(&gone.iter().map(|i| self.def.retiring[i - self.current].clone()).collect::<Vec<_>>()), "retired ranges dropped: nothing holds an address of them any more");
        self.def.retiring = kept_retiring(&self.def, self.current, &gone);
        for i in gone.into_iter().rev() {
            self.pools.remove(i);
        }
    }
}

/// What the sets of `net` that `old` had too carry over: the blocks their sources hold (before
/// any address is put back: the addresses are in them), cursor, bucket and counters.
/// What `net`'s sets take over from `old`'s: cursors, buckets, counts by set id; and blocks.
/// A block goes to the current set of the same id, else to the current set of a claiming
/// source whose ranges cover it (the pool's ranges grew or shrank: the block and what it holds
/// go along, so that no two sources ever hold one block, and the old set need not retire for
/// it), else to the set of the same id that retires. Returns the blocks that changed sets, as
/// (the old set's id, the new one's, the block), for the store.
fn inherit(net: &mut Network, old: &Network) -> Result<Vec<(String, String, String)>, Error> {
    let mut moved = Vec::new();
    for p in &old.pools {
        let same = net.pools.iter().position(|n| n.id == p.id);
        for block in p
            .source
            .blocks()
            .map(|b| b.recorded_blocks())
            .unwrap_or_default()
        {
            let covering = |n: &super::range_set::RangeSetPool| {
                n.source.blocks().is_some_and(|b| b.grows()) && n.source.covers(block.network())
            };
            let current = same.filter(|i| net.is_current(*i));
            let target = match current {
                Some(i) => Some(i),
                // The bug, put back: a block stayed with its set, retiring, while a new set
                // covering it claimed it anew.
                None if crate::bugs::on(crate::bugs::Bug::BlockStaysInOldSet) => same,
                None => net.pools[..net.current].iter().position(covering).or(same),
            };
            let Some(t) = target else {
                continue;
            };
            match net.pools[t].source.blocks_mut() {
                Some(b) => b.restore_block(block),
                None => Err(BlockRefused::NotClaiming(block.to_string())),
            }
            .map_err(|e| Error::InvalidConfig(e.to_string()))?;
            if Some(t) != same {
                moved.push((p.id.clone(), net.pools[t].id.clone(), block.to_string()));
            }
        }
        let Some(n) = net.pool_by_id(&p.id) else {
            continue;
        };
        n.source.set_cursor(p.source.cursor());
        n.bucket = p.bucket.clone();
        n.last_error = p.last_error.clone();
        n.source_calls = p.source_calls;
        n.source_errors = p.source_errors;
        n.bucket_waits = p.bucket_waits;
    }
    Ok(moved)
}

/// `def.retiring` without the sets at pool indexes `gone`.
fn kept_retiring(def: &NetworkDef, current: usize, gone: &[usize]) -> Vec<Vec<RangeSpec>> {
    def.retiring
        .iter()
        .enumerate()
        .filter(|(i, _)| !gone.contains(&(current + i)))
        .map(|(_, s)| s.clone())
        .collect()
}

/// The changes that forget a range set's cursor and blocks.
pub(super) fn forget_set(network: &str, p: &super::range_set::RangeSetPool) -> Vec<Change> {
    let mut changes = vec![Change::PutCursor {
        network: network.to_string(),
        set: p.id.clone(),
        cursor: None,
    }];
    changes.extend(
        p.source
            .blocks()
            .map(|b| b.recorded_blocks())
            .unwrap_or_default()
            .into_iter()
            .map(|block| Change::PutBlock {
                network: network.to_string(),
                set: p.id.clone(),
                block: block.to_string(),
                held: false,
            }),
    );
    changes
}

/// Puts an idle address (from the store, or from the network's old definition) into the current
/// set of `net` that holds it, whatever the capacity (the pool trims it later); false if none
/// does.
pub(super) fn carry_idle(net: &mut Network, ip: IpAddr, since: Since) -> bool {
    let Some(set) = net.set_of(ip).filter(|s| net.is_current(*s)) else {
        return false;
    };
    let p = &mut net.pools[set];
    if p.source.occupy(ip).is_err() {
        return false;
    }
    if p.pool.restore_idle(ip, since).is_err() {
        p.source.vacate(ip);
        return false;
    }
    true
}
