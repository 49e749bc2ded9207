//! [`ClusterSource`]: a range set's addresses from the blocks this node owns in a cluster
//! pool. Addresses are handed out from owned blocks with no etcd call; everything that talks
//! to etcd is a [`Claim`] the engine runs outside its lock ([`work`](super::work)):
//!
//! 1. first a full sync: this node's blocks of the pool, as etcd lists them (nothing is
//!    handed out or claimed before it);
//! 2. blocks the store recorded but etcd does not list as this node's, with addresses still in
//!    use, are claimed back one by one (another node owning one: it hands nothing more out);
//! 3. a new block when the free addresses fall below the threshold (`claim_ahead`, or the
//!    network's min_idle if higher);
//! 4. an empty block, after `block_hold_down_secs`, given back (not the last one, and not
//!    when that would bring the free addresses below the threshold).
//!
//! Each goes through the node's token bucket; a failure is retried with a backoff.
//! Each block is a host-local range: its first address is the gateway, the network (and for
//! IPv4 the broadcast) address is never handed out.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;

use super::node::ClusterNode;
use super::work::{Done, Outcome, Work};

mod land;
use crate::metrics::PoolFamilyLabels;
use crate::range::{Family, OccupyError, Range, RangeAllocator, RangeSpec};
use crate::source::{Claim, Landed, Next, Source};

/// The longest wait between retries after etcd failed.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long a pool with no free block is left alone before the next try.
const EXHAUSTED_RETRY: Duration = Duration::from_secs(10);

struct Owned {
    alloc: RangeAllocator,
    /// The store holds it.
    recorded: bool,
    /// The create revision of its key in etcd; None until etcd confirmed it is this node's.
    revision: Option<i64>,
    empty_since: Option<Instant>,
    /// Being given back: nothing is handed out from it.
    returning: bool,
    /// Another node owns it in etcd: nothing more is handed out from it.
    lost: Option<String>,
}

impl Owned {
    fn new(net: IpNet, recorded: bool, revision: Option<i64>) -> Result<Owned, String> {
        let range = Range::from_spec(&RangeSpec {
            subnet: net.to_string(),
            range_start: None,
            range_end: None,
            gateway: None,
        })
        .map_err(|e| format!("block {net}: {e}"))?;
        Ok(Owned {
            alloc: RangeAllocator::new(vec![range]),
            recorded,
            revision,
            empty_since: Some(Instant::now()),
            returning: false,
            lost: None,
        })
    }

    fn is_empty(&self) -> bool {
        self.alloc.free() == self.alloc.size()
    }
}

pub struct ClusterSource {
    node: Arc<ClusterNode>,
    pool: String,
    family: Family,
    cidrs: Vec<IpNet>,
    describe: String,
    threshold: usize,
    synced: bool,
    last_sync: Option<Instant>,
    /// By network address: handed out lowest block first.
    blocks: BTreeMap<IpAddr, Owned>,
    cursor: Option<IpAddr>,
    in_flight: bool,
    retry_at: Option<Instant>,
    backoff: Duration,
    failed: Option<String>,
    /// The pool had no free block (why, with its counts).
    exhausted: Option<String>,
    /// Recorded blocks given back, for the engine to strike from the store.
    forget: Vec<String>,
}

impl ClusterSource {
    /// The source of one range set (one family's CIDRs of the pool) of a network whose ranges
    /// come from cluster pool `pool`.
    pub fn new(
        node: Arc<ClusterNode>,
        pool: &str,
        ranges: &[Range],
        min_idle: usize,
    ) -> ClusterSource {
        let parts: Vec<String> = ranges.iter().map(|r| r.to_string()).collect();
        let threshold = node.settings().claim_ahead.max(min_idle);
        ClusterSource {
            node,
            pool: pool.to_string(),
            family: ranges.first().map_or(Family::V4, |r| r.family()),
            cidrs: ranges.iter().map(|r| r.subnet).collect(),
            describe: parts.join(","),
            threshold,
            synced: false,
            last_sync: None,
            blocks: BTreeMap::new(),
            cursor: None,
            in_flight: false,
            retry_at: None,
            backoff: Duration::from_secs(1),
            failed: None,
            exhausted: None,
            forget: Vec::new(),
        }
    }

    fn usable(&self) -> impl Iterator<Item = &Owned> + '_ {
        let synced = self.synced;
        self.blocks
            .values()
            .filter(move |b| synced && !b.returning && b.lost.is_none())
    }

    fn block_of(&self, ip: IpAddr) -> Option<&Owned> {
        self.blocks
            .range(..=ip)
            .next_back()
            .map(|(_, b)| b)
            .filter(|b| b.alloc.ranges()[0].subnet.contains(&ip))
    }

    fn block_of_mut(&mut self, ip: IpAddr) -> Option<&mut Owned> {
        self.blocks
            .range_mut(..=ip)
            .next_back()
            .map(|(_, b)| b)
            .filter(|b| b.alloc.ranges()[0].subnet.contains(&ip))
    }

    fn usable_free(&self) -> u128 {
        self.usable().map(|b| b.alloc.free()).sum()
    }

    fn add_block(
        &mut self,
        net: IpNet,
        recorded: bool,
        revision: Option<i64>,
    ) -> Result<(), String> {
        if !self.cidrs.iter().any(|c| c.contains(&net)) {
            return Err(format!(
                "block {net} is in none of cluster pool {:?}'s {} CIDRs ({})",
                self.pool,
                match self.family {
                    Family::V4 => "IPv4",
                    Family::V6 => "IPv6",
                },
                self.describe
            ));
        }
        match self.blocks.get_mut(&net.network()) {
            Some(b) => {
                b.recorded |= recorded;
                if revision.is_some() {
                    b.revision = revision;
                }
            }
            None => {
                self.blocks
                    .insert(net.network(), Owned::new(net, recorded, revision)?);
            }
        }
        Ok(())
    }

    fn net_of(b: &Owned) -> IpNet {
        b.alloc.ranges()[0].subnet
    }

    /// Drops a block (given back, or found not to be this node's while empty).
    fn drop_block(&mut self, net: IpNet) {
        if let Some(b) = self.blocks.remove(&net.network()) {
            if b.recorded {
                self.forget.push(net.to_string());
            }
        }
    }

    fn count_blocks(&self) {
        let n = self.blocks.values().filter(|b| b.lost.is_none()).count();
        self.node
            .metrics()
            .cluster
            .blocks_owned
            .get_or_create(&PoolFamilyLabels {
                pool: self.pool.clone(),
                family: self.family.as_str().into(),
            })
            .set(n as i64);
    }

    /// What to do next against etcd, if anything.
    fn next_work(&mut self) -> Option<Work> {
        let resync = Duration::from_secs(self.node.settings().resync_secs);
        if !self.synced || self.last_sync.is_none_or(|t| t.elapsed() >= resync) {
            return Some(Work::Sync);
        }
        if let Some(b) = self
            .blocks
            .values()
            .find(|b| b.revision.is_none() && b.lost.is_none())
        {
            return Some(Work::Reclaim(Self::net_of(b)));
        }
        let free = self.usable_free();
        if free < self.threshold.max(1) as u128 && self.exhausted.is_none() {
            return Some(Work::Claim);
        }
        let hold_down = Duration::from_secs(self.node.settings().block_hold_down_secs);
        let usable = self.usable().count();
        let giving = self.usable().find(|b| {
            b.is_empty()
                && b.revision.is_some()
                && b.empty_since.is_some_and(|t| t.elapsed() >= hold_down)
                && free - b.alloc.free() >= self.threshold as u128
        });
        match giving {
            Some(b) if usable > 1 => Some(Work::GiveBack(Self::net_of(b))),
            _ => None,
        }
    }

    fn failed_now(&mut self, why: String) {
        self.failed = Some(why);
        self.retry_at = Some(Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
    }
}

impl Source for ClusterSource {
    fn describe(&self) -> String {
        self.describe.clone()
    }
    fn next(&self) -> Next {
        if let Some(ip) = self.usable().find_map(|b| b.alloc.peek_next()) {
            return Next::Ready(ip);
        }
        let pool = &self.pool;
        match (&self.failed, &self.exhausted) {
            (Some(why), _) if !self.in_flight => Next::Unavailable(match self.synced {
                false => format!(
                    "cannot list this node's blocks of cluster pool {pool:?} in etcd (nothing is handed out before): {why}"
                ),
                true => format!(
                    "no free address in this node's blocks of cluster pool {pool:?}, and claiming one failed: {why}"
                ),
            }),
            (None, Some(_)) if !self.in_flight => Next::Exhausted,
            _ if !self.synced => Next::Pending(format!(
                "listing this node's blocks of cluster pool {pool:?} in etcd"
            )),
            _ => Next::Pending(format!("claiming a block of cluster pool {pool:?}")),
        }
    }
    fn peek_next_n(&self, n: usize) -> Vec<IpAddr> {
        let mut out = Vec::new();
        for b in self.usable() {
            if out.len() >= n {
                break;
            }
            out.extend(b.alloc.peek_next_n(n - out.len()));
        }
        out
    }
    fn take_next(&mut self, ip: IpAddr) -> Result<(), OccupyError> {
        let b = self.block_of_mut(ip).ok_or(OccupyError::NotInRange(ip))?;
        b.alloc.take_next(ip)?;
        b.recorded = true;
        b.empty_since = None;
        self.cursor = Some(ip);
        Ok(())
    }
    fn can_occupy(&self, ip: IpAddr) -> Result<(), OccupyError> {
        match self.block_of(ip) {
            Some(b) if b.lost.is_none() => b.alloc.can_occupy(ip),
            _ => Err(OccupyError::NotInRange(ip)),
        }
    }
    fn occupy(&mut self, ip: IpAddr) -> Result<(), OccupyError> {
        let b = self.block_of_mut(ip).ok_or(OccupyError::NotInRange(ip))?;
        b.alloc.occupy(ip)?;
        b.recorded = true;
        b.empty_since = None;
        Ok(())
    }
    fn vacate(&mut self, ip: IpAddr) -> bool {
        let Some(b) = self.block_of_mut(ip) else {
            return false;
        };
        let vacated = b.alloc.release(ip);
        if vacated && b.is_empty() {
            b.empty_since = Some(Instant::now());
        }
        vacated
    }
    fn contains(&self, ip: IpAddr) -> bool {
        self.block_of(ip).is_some_and(|b| b.alloc.contains(ip))
    }
    fn covers(&self, ip: IpAddr) -> bool {
        self.cidrs.iter().any(|c| c.contains(&ip))
    }
    fn interface_of(&self, ip: IpAddr) -> Option<(u8, Option<IpAddr>)> {
        self.block_of(ip)
            .and_then(|b| b.alloc.range_of(ip))
            .map(|r| (r.subnet.prefix_len(), r.gateway))
    }
    fn free(&self) -> u128 {
        self.usable_free()
    }
    fn size(&self) -> u128 {
        // Every address of the pool's CIDRs could come to this node: the pool's capacity.
        self.cidrs
            .iter()
            .map(|c| 1u128 << (c.max_prefix_len() - c.prefix_len()).min(127))
            .fold(0u128, u128::saturating_add)
    }
    fn cursor(&self) -> Option<IpAddr> {
        self.cursor
    }
    fn set_cursor(&mut self, cursor: Option<IpAddr>) {
        self.cursor = cursor;
        if let Some(ip) = cursor {
            if let Some(b) = self.block_of_mut(ip) {
                b.alloc.set_cursor(Some(ip));
            }
        }
    }

    fn start_claim(&mut self) -> Option<Claim> {
        if self.in_flight || self.retry_at.is_some_and(|t| Instant::now() < t) {
            return None;
        }
        if self.exhausted.is_some() && self.retry_at.is_some() {
            // Past the exhaustion's wait: look at the pool again.
            self.exhausted = None;
        }
        let work = self.next_work()?;
        if !self.node.try_call() {
            return None;
        }
        if let Work::GiveBack(net) = &work {
            if let Some(b) = self.blocks.get_mut(&net.network()) {
                b.returning = true;
            }
        }
        self.in_flight = true;
        let revision = match &work {
            Work::GiveBack(net) => self.blocks.get(&net.network()).and_then(|b| b.revision),
            _ => None,
        };
        Some(super::work::run(
            self.node.clone(),
            self.pool.clone(),
            self.family,
            work,
            revision,
        ))
    }
    fn land(&mut self, landed: Landed) -> Result<String, String> {
        let done = *landed
            .downcast::<Done>()
            .map_err(|_| "a claim of another kind of source landed here".to_string())?;
        self.in_flight = false;
        let result = match done.result {
            Ok(outcome) => {
                self.failed = None;
                self.backoff = Duration::from_secs(1);
                let full = matches!(outcome, Outcome::PoolFull(_));
                // Answers, not failures: the pool is full (it waits of its own), a block is
                // another node's (it is set aside, and a new one claimed at once).
                let answer = full || matches!(outcome, Outcome::Taken(_));
                if !full {
                    self.retry_at = None;
                }
                let r = self.landed(done.work, outcome);
                if let (Err(why), false) = (&r, answer) {
                    // A block that cannot be used: not claimed again at once.
                    self.failed_now(why.clone());
                }
                r
            }
            Err(why) => {
                if let Work::GiveBack(net) = &done.work {
                    if let Some(b) = self.blocks.get_mut(&net.network()) {
                        b.returning = false;
                    }
                }
                self.failed_now(why.clone());
                Err(why)
            }
        };
        self.count_blocks();
        result
    }
    fn unrecorded(&self, ip: IpAddr) -> Option<String> {
        self.block_of(ip)
            .filter(|b| !b.recorded)
            .map(|b| Self::net_of(b).to_string())
    }
    fn restore_block(&mut self, block: &str) -> Result<(), String> {
        let net: IpNet = block
            .parse()
            .map_err(|_| format!("{block:?} is not a block CIDR"))?;
        self.add_block(net, true, None)
    }
    fn recorded_blocks(&self) -> Vec<String> {
        self.blocks
            .values()
            .filter(|b| b.recorded)
            .map(|b| Self::net_of(b).to_string())
            .collect()
    }
    fn forget(&mut self) -> Vec<String> {
        std::mem::take(&mut self.forget)
    }
    fn held_back(&self) -> Option<Next> {
        (!self.synced).then(|| self.next())
    }
    fn degraded(&self) -> Option<String> {
        self.node.degraded()
    }
    fn detail(&self) -> Option<String> {
        let owned: Vec<String> = self
            .blocks
            .values()
            .map(|b| {
                let net = Self::net_of(b);
                let used = b.alloc.size() - b.alloc.free();
                match (&b.lost, b.returning) {
                    (Some(_), _) => format!("{net} (CONFLICT: another node owns it)"),
                    (None, true) => format!("{net} (giving back)"),
                    (None, false) => format!("{net} ({used} used)"),
                }
            })
            .collect();
        let mut s = format!(
            "cluster pool {:?}: {} block(s) here{}{}",
            self.pool,
            owned.len(),
            if owned.is_empty() { "" } else { ": " },
            owned.join(", ")
        );
        if !self.synced {
            s.push_str("; not yet synced with etcd");
        }
        if let Some(why) = &self.exhausted {
            s.push_str("; ");
            s.push_str(why);
        }
        Some(s)
    }
}
