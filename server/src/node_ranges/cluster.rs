//! A network's ranges from a cluster pool (`ranges_from = "cluster"`): the pool's CIDRs, one
//! range set per family, read from the store at start and every minute after. The addresses
//! themselves come from the blocks this node claims ([`crate::cluster::source`]); the ranges
//! only say which CIDRs those blocks are carved from.
//!
//! [`ClusterNetworks`] is cluster mode on a node, wired as ipoold runs it (and as the
//! simulation does): the sources of its cluster networks, the heartbeat, the pools followed,
//! the blocks of unused pools given back, and the clean stop.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;

use super::{Feed, Seen};
use crate::cluster::ippool::PoolSpec;
use crate::cluster::node::{ClusterNode, Identity};
use crate::cluster::source::ClusterSource;
use crate::cluster::vocab::{Pool, PoolPhase};
use crate::config::DaemonConfig;
use crate::ipam::Ipam;
use crate::model::RouteSpec;
use crate::range::RangeSpec;
use crate::source::{LocalSource, Sources};

/// How often the pool is read again once known, where nothing watches it (`watch = false`);
/// with the watches, every `resync_secs` (jittered) and at once when it is written.
const REREAD: Duration = Duration::from_secs(60);

/// The pool's CIDRs as range sets: IPv4 first, then IPv6 (a CIDR on its way into the pool
/// not yet).
pub fn range_sets(spec: &PoolSpec) -> Vec<Vec<RangeSpec>> {
    let set = |v4: bool| -> Vec<RangeSpec> {
        spec.serving_cidrs()
            .filter(|c| c.addr().is_ipv4() == v4)
            .map(|c| RangeSpec {
                subnet: c.to_string(),
                range_start: None,
                range_end: None,
                gateway: None,
            })
            .collect()
    };
    [set(true), set(false)]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect()
}

/// The pool's range sets, and its name for each of their subnets (kept with the network: a
/// restart makes each set's source for its pool before any pool is read).
fn pool_sets(spec: &PoolSpec) -> (Vec<Vec<RangeSpec>>, BTreeMap<String, String>) {
    let sets = range_sets(spec);
    let named = sets
        .iter()
        .flatten()
        .map(|r| (r.subnet.clone(), spec.name.clone()))
        .collect();
    (sets, named)
}

/// How a network's pools are read again: after `resync_secs` (jittered) where the watches
/// run, else every minute, at once when the watch says a pool was written; the feed reminded
/// of why there are no ranges now and then.
struct Pace {
    written: tokio::sync::watch::Receiver<u64>,
    watched: bool,
    reread: Duration,
    last_remind: tokio::time::Instant,
}

impl Pace {
    fn new(node: &ClusterNode) -> Pace {
        let watched = node.settings().watch;
        Pace {
            written: node.heard().pool_changes(),
            watched,
            reread: match watched {
                true => Duration::from_secs(node.settings().resync_secs),
                false => REREAD,
            },
            last_remind: tokio::time::Instant::now(),
        }
    }

    /// A round of reads starts: a pool written from now on is read again at once.
    fn round(&mut self) {
        self.written.mark_unchanged();
    }

    /// The pause after the ranges were handed over (`applied`: the engine took them).
    fn after_apply(&self, applied: bool) -> Duration {
        match (applied, self.watched) {
            (true, true) => crate::cluster::jitter(self.reread),
            (true, false) => self.reread,
            (false, _) => Duration::from_secs(1),
        }
    }

    /// Waits `pause`, or until a pool is written.
    async fn wait(&mut self, feed: &mut Feed, pause: Duration) {
        if self.last_remind.elapsed() >= super::REMIND_EVERY {
            feed.remind();
            self.last_remind = tokio::time::Instant::now();
        }
        if !self.watched {
            tokio::time::sleep(pause).await;
            return;
        }
        // A pool written (as the watch says) is read at once.
        tokio::select! {
            biased;
            _ = self.written.changed() => {}
            _ = tokio::time::sleep(pause) => {}
        }
    }
}

/// Reads pool `pool` until the task is aborted, handing its CIDRs to `feed`.
pub async fn follow(mut feed: Feed, node: Arc<ClusterNode>, pool: String) {
    let mut wait = Duration::from_secs(1);
    let mut pace = Pace::new(&node);
    loop {
        pace.round();
        let store = node.store_name();
        let pause = match node.read_pool(&pool).await {
            Ok(Some(p)) if p.phase != PoolPhase::Ready => {
                // Its ranges stay as they are: a deletion may yet be refused, a creation is on
                // its way; the sources claim nothing from it meanwhile.
                let why = match p.phase {
                    PoolPhase::Deleting => format!(
                        "cluster pool {pool:?} is being deleted in {store}: no block is claimed from it until the deletion is done or refused (if no `ipoolctl cluster pool delete` runs, running it again finishes the deletion or makes the pool Ready)"
                    ),
                    _ => format!(
                        "cluster pool {pool:?} is being created in {store} ({}): nothing is claimed from it before it is Ready",
                        p.phase.as_str()
                    ),
                };
                feed.apply(Seen::Missing(why)).await;
                Duration::from_secs(2)
            }
            Ok(Some(Pool { spec, .. })) => {
                wait = Duration::from_secs(1);
                let (sets, set_pools) = pool_sets(&spec);
                let seen = Seen::Ranges {
                    sets,
                    routes: Vec::new(),
                };
                pace.after_apply(feed.apply_pools(seen, set_pools).await)
            }
            Ok(None) => {
                feed.apply(Seen::Missing(format!(
                    "cluster pool {pool:?} does not exist in {store} (create it: ipoolctl cluster pool create {pool} --cidr CIDR)"
                )))
                .await;
                Duration::from_secs(5)
            }
            Err(e) => {
                feed.failed(&e);
                feed.why_none(&format!(
                    "cannot read cluster pool {pool:?} from {store}: {e}"
                ));
                wait = (wait * 2).min(Duration::from_secs(30));
                wait
            }
        };
        pace.wait(&mut feed, pause).await;
    }
}

/// Reads the pools of a network with several (`cluster_pools`) until the task is aborted,
/// handing `feed` their CIDRs in the list's order, each range set named with its pool. A pool
/// that cannot be read, or is being created or deleted, keeps the CIDRs it last had here; one
/// that does not exist has none.
pub async fn follow_all(mut feed: Feed, node: Arc<ClusterNode>, pools: Vec<String>) {
    let mut wait = Duration::from_secs(1);
    let mut pace = Pace::new(&node);
    // Each pool's spec as last read Ready here.
    let mut known: std::collections::HashMap<String, PoolSpec> = Default::default();
    loop {
        pace.round();
        let store = node.store_name();
        let mut missing = Vec::new();
        let mut failed = None;
        let mut unknown_failed = false;
        for pool in &pools {
            match node.read_pool(pool).await {
                Ok(Some(Pool {
                    spec,
                    phase: PoolPhase::Ready,
                    ..
                })) => {
                    known.insert(pool.clone(), spec);
                }
                Ok(Some(p)) => {
                    // One being deleted, not read Ready since the start: the ranges stay as
                    // they are until the deletion is done or refused.
                    unknown_failed |= p.phase == PoolPhase::Deleting && !known.contains_key(pool);
                    missing.push(format!(
                        "cluster pool {pool:?} is {} in {store}",
                        p.phase.as_str()
                    ))
                }
                Ok(None) => {
                    known.remove(pool);
                    missing.push(format!(
                        "cluster pool {pool:?} does not exist in {store} (create it: ipoolctl cluster pool create {pool} --cidr CIDR)"
                    ));
                }
                Err(e) => {
                    feed.failed(&e);
                    failed = Some(format!(
                        "cannot read cluster pool {pool:?} from {store}: {e}"
                    ));
                    // Not read since the start: the ranges stay as they are (a partial set
                    // would retire this pool's range sets).
                    unknown_failed |= !known.contains_key(pool);
                }
            }
        }
        let (mut sets, mut set_pools) = (Vec::new(), BTreeMap::new());
        for pool in pools.iter() {
            let Some(spec) = known.get(pool) else {
                continue;
            };
            let (more, named) = pool_sets(spec);
            sets.extend(more);
            set_pools.extend(named);
        }
        let pause = match (&failed, sets.is_empty() || unknown_failed) {
            (Some(why), true) => {
                feed.why_none(why);
                wait = (wait * 2).min(Duration::from_secs(30));
                wait
            }
            (_, true) => {
                feed.apply(Seen::Missing(missing.join("; "))).await;
                Duration::from_secs(2)
            }
            (_, false) => {
                if failed.is_none() {
                    wait = Duration::from_secs(1);
                }
                let seen = Seen::Ranges {
                    sets,
                    routes: Vec::new(),
                };
                match (feed.apply_pools(seen, set_pools).await, &failed) {
                    (true, Some(_)) => {
                        wait = (wait * 2).min(Duration::from_secs(30));
                        wait
                    }
                    (applied, _) => pace.after_apply(applied),
                }
            }
        };
        pace.wait(&mut feed, pause).await;
    }
}

/// Follows the pools of the networks CNI configs declare (`ipam.clusterPool`): those stored
/// at start, and each one declared since (a network declared anew with another pool follows
/// that one). Its tasks end with it.
pub async fn follow_pool_networks(node: Arc<ClusterNode>, ipam: Ipam) {
    let mut changes = ipam.pool_network_changes();
    let mut followed: BTreeMap<String, (crate::ipam::PoolNetwork, tokio::task::AbortHandle)> =
        BTreeMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        changes.mark_unchanged();
        let now = ipam.pool_networks();
        // A network gone, or declared anew (its pools, routes or addressing): its follower
        // ends (what it may still apply of another pool is refused, see `set_pool_ranges`).
        followed.retain(|network, (was, task)| {
            let same = now.iter().any(|n| n == was);
            if !same {
                tracing::info!(%network, "no longer following its cluster pool as declared before");
                task.abort();
            }
            same
        });
        for n in now {
            if followed.contains_key(&n.network) {
                continue;
            }
            tracing::info!(network = %n.network, pool = %n.pools.join(", "), "following the cluster pool of a network a CNI config declared");
            let feed = Feed::new(ipam.clone(), &n.network, n.routes.clone());
            let task = match &n.pools[..] {
                [pool] => tasks.spawn(follow(feed, node.clone(), pool.clone())),
                _ => tasks.spawn(follow_all(feed, node.clone(), n.pools.clone())),
            };
            followed.insert(n.network.clone(), (n, task));
        }
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            // Reaps the tasks aborted above.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
        }
    }
}

/// Gives back, every `resync_secs` (jittered) while the node serves, this node's blocks of the pools no
/// network here takes its ranges from any more (a network removed, or given another
/// `cluster_pool`), and those outside their pool's CIDRs, once nothing here holds an address
/// of them. Runs until aborted.
pub async fn give_back_unused(node: Arc<ClusterNode>, ipam: crate::ipam::Ipam, used: Vec<String>) {
    let every = Duration::from_secs(node.settings().resync_secs);
    loop {
        // Jittered where it is the long safety net of the watches (nodes started together do
        // not list together ten minutes on).
        let pause = match node.settings().watch {
            true => crate::cluster::jitter(every),
            false => every,
        };
        tokio::time::sleep(pause).await;
        if node.serving().is_err() {
            continue;
        }
        let me = node.name().to_string();
        let listed = match node
            .call("list_blocks", |s| async move {
                s.list_own_blocks(None, &me).await
            })
            .await
        {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "cannot list this node's blocks of unused pools");
                continue;
            }
        };
        // The pools of the networks CNI configs declared (`ipam.clusterPool`) too, as they
        // stand now.
        let declared: Vec<String> = ipam
            .pool_networks()
            .into_iter()
            .flat_map(|n| n.pools)
            .collect();
        for b in listed.blocks {
            if ipam.holds_in(&b.block) {
                continue;
            }
            let used = |pool: &String| used.contains(pool) || declared.contains(pool);
            // A block of a pool in use is its source's, unless it lies outside the pool's
            // CIDRs as read (a claim that landed as its CIDR was removed and whose give-back
            // never came: never served, and no sync of the shrunk ranges lists it), or its
            // pool is gone (a claim that landed after the pool's deletion: no source serves a
            // pool that cannot be read, and the block would keep the pool from being made
            // again in its CIDRs for good).
            if used(&b.pool) {
                match node.pool(&b.pool).await {
                    Ok(Some(p)) if !p.spec.cidrs.iter().any(|c| c.contains(&b.block)) => {}
                    Ok(None) if !crate::bugs::on(crate::bugs::Bug::GonePoolBlockKept) => {}
                    _ => continue,
                }
            }
            let (given, block) = (b.clone(), b.block);
            match node
                .call("give_back", |s| async move { s.give_back(&given).await })
                .await
            {
                Ok(true) => {
                    tracing::info!(pool = %b.pool, %block, "gave back a block of a pool no network here uses any more, or outside its pool's CIDRs");
                    crate::metrics::ClusterMetrics::pool_counter(
                        &node.metrics().cluster.give_backs,
                        &b.pool,
                        1,
                    );
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(pool = %b.pool, %block, error = %e, "cannot give back a block of an unused pool")
                }
            }
        }
    }
}

/// Cluster mode on a node: its [`ClusterNode`] and the networks whose ranges are blocks of a
/// cluster pool.
pub struct ClusterNetworks {
    node: Arc<ClusterNode>,
    /// (network, pools in order, routes)
    networks: Vec<(String, Vec<String>, Vec<RouteSpec>)>,
    /// The heartbeat's task, once started: stopped before the name is given up.
    heartbeat: Mutex<Option<JoinHandle<()>>>,
    /// The other tasks started (the pools followed, the identity watched, unused pools).
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl ClusterNetworks {
    /// The cluster networks of `config` on `node`, and the sources every network's range sets
    /// get: blocks of a cluster pool for those, local ranges for the rest.
    pub fn new(node: Arc<ClusterNode>, config: &DaemonConfig) -> (ClusterNetworks, Sources) {
        let networks = config.cluster_networks();
        let pools: std::collections::HashMap<String, Vec<String>> = networks
            .iter()
            .map(|(n, p, _)| (n.clone(), p.clone()))
            .collect();
        let n = node.clone();
        let sources = Sources::new(move |def, ranges| {
            match pools
                .get(&def.name)
                .or(Some(&def.cluster_pools).filter(|p| !p.is_empty()))
            {
                Some(list) => {
                    // A set's pool as its ranges were read (several pools), else the one pool.
                    let pool = ranges
                        .iter()
                        .find_map(|r| def.set_pools.get(&r.subnet.to_string()))
                        .unwrap_or(&list[0]);
                    // A pool after one of the same family claims only once an ADD needs it.
                    let rank = |p: &String| list.iter().position(|x| x == p);
                    let v4 = ranges.first().is_some_and(|r| r.subnet.addr().is_ipv4());
                    let first = !def
                        .range_sets
                        .iter()
                        .filter_map(|s| s.first())
                        .filter(|r| {
                            r.subnet
                                .parse::<ipnet::IpNet>()
                                .is_ok_and(|n| n.addr().is_ipv4() == v4)
                        })
                        .filter_map(|r| def.set_pools.get(&r.subnet))
                        .any(|p| rank(p) < rank(pool));
                    let min_idle = if first { def.tuning.min_idle } else { 0 };
                    Box::new(
                        ClusterSource::new(n.clone(), pool, &ranges, min_idle)
                            .on_demand(!first)
                            .subnet_mode(def.subnet_mode.clone()),
                    )
                }
                None => Box::new(LocalSource::new(ranges)),
            }
        });
        let me = ClusterNetworks {
            node,
            networks,
            heartbeat: Mutex::new(None),
            tasks: Mutex::new(Vec::new()),
        };
        (me, sources)
    }

    pub fn node(&self) -> &Arc<ClusterNode> {
        &self.node
    }

    /// How many networks take their ranges from a cluster pool.
    pub fn networks(&self) -> usize {
        self.networks.len()
    }

    /// Starts the heartbeat, follows each cluster network's pool, watches the node's name for
    /// health, watches its blocks and the pools (`watch`), and gives back the blocks of pools
    /// no network uses.
    pub fn start(&self, ipam: &Ipam) {
        *self.heartbeat.lock().expect("heartbeat lock") =
            Some(tokio::spawn(self.node.clone().heartbeat()));
        let mut tasks = self.tasks.lock().expect("tasks lock");
        // Health follows whether this daemon holds the node's name.
        let (node, health) = (self.node.clone(), ipam.clone());
        let mut changes = node.watch_identity();
        tasks.push(tokio::spawn(async move {
            loop {
                let taken = match &*changes.borrow_and_update() {
                    Identity::Taken { .. } => node.serving().err().map(|n| n.why),
                    _ => None,
                };
                health.set_name_taken(taken);
                // The sources sync (and serve) once the name is held: at once, not at the next
                // tick of the background loop.
                health.nudge();
                if changes.changed().await.is_err() {
                    return;
                }
            }
        }));
        if self.node.settings().watch {
            tasks.push(tokio::spawn(crate::cluster::node::watching::keep_watching(
                self.node.clone(),
            )));
            // What the watches say is acted on at once, not at the next tick.
            let (mut heard, ipam) = (self.node.heard().changes(), ipam.clone());
            tasks.push(tokio::spawn(async move {
                while heard.changed().await.is_ok() {
                    ipam.nudge();
                }
            }));
        }
        let used = self
            .networks
            .iter()
            .flat_map(|(_, p, _)| p.iter().cloned())
            .collect();
        tasks.push(tokio::spawn(give_back_unused(
            self.node.clone(),
            ipam.clone(),
            used,
        )));
        tasks.push(tokio::spawn(follow_pool_networks(
            self.node.clone(),
            ipam.clone(),
        )));
        for (network, pools, routes) in &self.networks {
            let feed = Feed::new(ipam.clone(), network, routes.clone());
            let node = self.node.clone();
            tasks.push(match &pools[..] {
                [pool] => tokio::spawn(follow(feed, node, pool.clone())),
                _ => tokio::spawn(follow_all(feed, node, pools.clone())),
            });
        }
    }

    /// A clean stop, once nothing more is served: the heartbeat stops and the node's name is
    /// given up (a replacement daemon takes it at once; release-node sees the node away from
    /// now). Bounded by twice the store's timeout; a store that does not answer leaves the name
    /// to lapse with its lease.
    pub async fn stop(&self) {
        self.abort_tasks();
        let task = self.heartbeat.lock().expect("heartbeat lock").take();
        if let Some(task) = task {
            task.abort();
            let _ = task.await;
        }
        let within = Duration::from_millis(self.node.settings().store_timeout_ms) * 2;
        match tokio::time::timeout(within, self.node.give_up_name()).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot give up the node's name: it lapses with its lease")
            }
            Err(_) => {
                tracing::warn!("giving up the node's name took too long: it lapses with its lease")
            }
        }
    }

    /// Every task ended at once, the name kept (what a kill leaves behind: the name lapses
    /// with its lease).
    pub fn abort(&self) {
        self.abort_tasks();
        if let Some(task) = self.heartbeat.lock().expect("heartbeat lock").take() {
            task.abort();
        }
    }

    fn abort_tasks(&self) {
        for t in self.tasks.lock().expect("tasks lock").drain(..) {
            t.abort();
        }
    }
}
