//! [`ClusterSource`]: a range set's addresses from the blocks this node owns in a cluster
//! pool. Addresses are handed out from owned blocks with no store call; everything that talks
//! to the store is a [`Claim`](crate::source::Claim) the engine runs outside its lock ([`work`](super::work)).
//!
//! Each block has a state ([`BlockState`]); only a *confirmed* block (the store listed it as this
//! node's at the last sync, or this node just claimed it) hands anything out, by any path:
//! a new address, an idle or cooling one, a requested one, a sticky pod's. And the source as a
//! whole hands out nothing while the node does not serve (its name not held, or fenced:
//! [`ClusterNode::serving`]) or before it synced in the node's current serving epoch.
//!
//! 1. a sync (this node's blocks of the pool, as the store lists them) before anything else, again
//!    every `resync_secs`, after each new epoch, and after a give-back whose outcome is not
//!    known; every block it lists that is not confirmed here as listed (restored from the
//!    store, a give-back not answered, or not known here: a give-back of it may still reach
//!    the store) is settled by it, its key written again, so that such a give-back cannot apply
//!    once it serves;
//! 2. blocks the store holds but does not list as this node's, with addresses still held
//!    here, are claimed back one by one (another node owning one: it is lost, and hands
//!    nothing more out);
//! 3. a new block when the free addresses fall below the threshold (`claim_ahead`, or the
//!    network's min_idle if higher);
//! 4. an empty block, after `block_hold_down_secs`, given back (not the last one, and not
//!    when that would bring the free addresses below the threshold); nothing can be placed in
//!    it meanwhile, and one found holding something when the give-back lands is claimed back.
//!
//! Each store request goes through the node's limiter (`store_rate`); a failure is retried with a
//! jittered backoff, and the resyncs are jittered too.
//! By block (the default), each block is a host-local range: its first address is the gateway,
//! the network (and for IPv4 the broadcast) address is never handed out. As one subnet
//! (`subnet_mode`), a block hands out every address but its pool CIDR's network, broadcast and
//! gateway addresses and the network's excluded ones (`block::block_range`).
//!
//! # Layout
//! - `block`: a block this node holds, and where it stands between this node and the store;
//! - `land`: a store call's outcome taken in (claims, syncs, give-backs);
//! - `pinned`: fixed addresses in a source of one subnet (see [`crate::cluster::pin`]);
//! - `reserved`: a pool's reservations in a node's blocks (`ipoolctl cluster reserve`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use tokio::time::Instant;

use super::heard::Cursor;
use super::node::{ClusterNode, NotServing};
use super::vocab::KeyRevision;
use super::work::Work;

mod block;
mod blocks;
mod land;
mod pinned;
mod reserved;
use crate::error::Refusal;
use crate::metrics::BlockStateLabels;
use crate::model::SubnetMode;
use crate::range::{Family, OccupyError, Range};
use crate::source::{BlockRefused, BlockSource, Next, Source};
pub use block::BlockState;
use block::Owned;

/// The longest prefix of `ip`'s family.
fn max_prefix(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// The longest wait between retries after the store failed.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// How long a pool with no free block is left alone before the next try.
const EXHAUSTED_RETRY: Duration = Duration::from_secs(10);
/// The first wait before a sync looks again at blocks in doubt.
const DOUBT_FIRST: Duration = Duration::from_secs(1);

pub struct ClusterSource {
    /// Where its work leaves its result (its own: work another source started, the one this
    /// replaced when the range set was rebuilt, is never taken here).
    inbox: super::work::Inbox,
    /// The pool's reservations as last looked at (each new one held here is reported once).
    reserved_seen: Arc<Vec<crate::cluster::ippool::Reserved>>,
    /// The network addressed as one subnet (`addressing = "subnet"`), else by block.
    subnet: Option<SubnetMode>,
    /// The network's excluded addresses (one subnet's `exclude`), never handed out.
    excluded: Vec<crate::cluster::ippool::Reserved>,
    node: Arc<ClusterNode>,
    pool: String,
    family: Family,
    cidrs: Vec<IpNet>,
    describe: String,
    threshold: usize,
    /// The serving epoch of the last sync (see `ClusterNode::serving`); None: never synced.
    synced: Option<u64>,
    /// When the next resync is due (`resync_secs`, jittered).
    next_sync: Option<Instant>,
    /// What it took in so far of what the store's watches said (see `cluster::heard`).
    heard: Cursor,
    /// The watches said something that a sync must look at (a block of this source's gone,
    /// or a watch started over): the next work is a sync.
    watched_sync: bool,
    /// Blocks the watches said are gone while work was on its way: what lands may add one.
    gone_in_flight: Vec<IpNet>,
    /// By CIDR (network address, then prefix): handed out lowest block first.
    blocks: BTreeMap<IpNet, Owned>,
    /// The shortest prefix of a block held so far (lookups look back that far).
    widest: u8,
    cursor: Option<IpAddr>,
    in_flight: bool,
    /// After a failure of work other than a claim (the store did not answer a sync, say):
    /// no such work before then.
    retry_at: Option<Instant>,
    backoff: Duration,
    /// After a claim that failed or found the pool full: no claim before then. A sync never
    /// waits for it (a block forced away is found at the next sync, whatever the claims do).
    claim_retry_at: Option<Instant>,
    claim_backoff: Duration,
    /// How soon the next sync looks again at blocks in doubt (their pool being deleted):
    /// doubles from a second up to `resync_secs` while they stay in doubt.
    doubt_wait: Duration,
    failed: Option<String>,
    /// A network's later pool: its first block is claimed only once an ADD wants one
    /// (`demanded`), not ahead of need.
    on_demand: bool,
    demanded: bool,
    /// The pool had no free block (why, with its counts).
    exhausted: Option<String>,
    /// Recorded blocks dropped, for the engine to strike from the store.
    forget: Vec<IpNet>,
    /// Blocks that took over addresses held here, for the engine to write as held.
    record: Vec<IpNet>,
    /// Pinned addresses outside this node's blocks, in use here by the pods they are pinned
    /// for (see `pinned`).
    hosted: std::collections::BTreeSet<IpAddr>,
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
        let heard = node.heard().now();
        ClusterSource {
            inbox: super::work::Inbox::default(),
            reserved_seen: Arc::default(),
            subnet: None,
            excluded: Vec::new(),
            node,
            pool: pool.to_string(),
            family: ranges.first().map_or(Family::V4, |r| r.family()),
            cidrs: ranges.iter().map(|r| r.subnet).collect(),
            describe: parts.join(","),
            threshold,
            synced: None,
            next_sync: None,
            heard,
            watched_sync: false,
            gone_in_flight: Vec::new(),
            blocks: BTreeMap::new(),
            widest: 128,
            cursor: None,
            in_flight: false,
            retry_at: None,
            backoff: Duration::from_secs(1),
            claim_retry_at: None,
            claim_backoff: Duration::from_secs(1),
            doubt_wait: DOUBT_FIRST,
            failed: None,
            on_demand: false,
            demanded: false,
            exhausted: None,
            forget: Vec::new(),
            record: Vec::new(),
            hosted: Default::default(),
        }
    }

    /// Why nothing at all is handed out now: the node does not serve, or this source has not
    /// synced in the node's serving epoch.
    fn not_serving(&self) -> Option<Next> {
        let epoch = match self.node.serving() {
            Ok(e) => e,
            Err(n) if n.pending => return Some(Next::Pending(n.why)),
            Err(NotServing {
                why, fenced: true, ..
            }) => return Some(Next::Refused(Refusal::NodeFenced, why)),
            Err(n) => return Some(Next::Unavailable(n.why)),
        };
        let pool = &self.pool;
        let store = self.node.store_name();
        if self.synced == Some(epoch) {
            // Not before the pool was read: its reservations and whether it is disabled. One
            // read and found gone is no pool on its way: an ADD passes on to the network's
            // next pool (which claims only once an ADD gets to it).
            if self.node.pool_known(pool) {
                return None;
            }
            if self.node.pool_gone(pool) && !crate::bugs::on(crate::bugs::Bug::GonePoolAwaited) {
                return Some(Next::Unavailable(format!(
                    "cluster pool {pool:?} does not exist in {store}"
                )));
            }
            return Some(Next::Pending(format!(
                "reading cluster pool {pool:?} in {store} (its reservations)"
            )));
        }
        Some(match (&self.failed, self.in_flight) {
            (Some(why), false) => Next::Unavailable(format!(
                "cannot list this node's blocks of cluster pool {pool:?} in {store} (nothing is handed out before): {why}"
            )),
            _ => Next::Pending(format!(
                "listing this node's blocks of cluster pool {pool:?} in {store}"
            )),
        })
    }

    /// Why nothing new is handed out: the pool is disabled (as last read). What is in use stays;
    /// idle addresses leave the pool, and blocks left empty go back after the hold-down.
    fn disabled(&self) -> Option<String> {
        self.node
            .pool_disabled(&self.pool)
            .then(|| crate::cluster::node::pools::disabled_why(&self.pool))
    }

    /// A source of a network's later pool (`yes`): it claims its first block only once an
    /// ADD wants an address of it.
    pub fn on_demand(mut self, yes: bool) -> ClusterSource {
        self.on_demand = yes;
        self
    }

    /// A network addressed as one subnet (`mode`: its gateways and excluded addresses), not by
    /// block.
    pub fn subnet_mode(mut self, mode: Option<SubnetMode>) -> ClusterSource {
        self.excluded = mode
            .iter()
            .flat_map(|m| &m.exclude)
            .map(|x| crate::cluster::ippool::Reserved {
                cidr: *x,
                reason: reserved::EXCLUDED.to_string(),
            })
            .collect();
        self.subnet = mode;
        self
    }

    /// The blocks that hand out (when the source serves).
    fn usable(&self) -> impl Iterator<Item = &Owned> + '_ {
        self.blocks.values().filter(|b| b.confirmed())
    }

    /// The block that `ip` belongs to here: the one holding it, else a confirmed one that can
    /// hand it out, else any that can, else any over it (blocks of different sizes overlap only after the pool was made
    /// anew with other block sizes while a block of the old one still held addresses here:
    /// see `take_over`).
    fn key_of(&self, ip: IpAddr) -> Option<IpNet> {
        // No block starts further below `ip` than the widest one spans.
        let floor = IpNet::new(ip, self.widest).map_or(ip, |n| n.network());
        let (lo, hi) = (
            IpNet::new(floor, 0).ok()?,
            IpNet::new(ip, max_prefix(ip)).ok()?,
        );
        let mut over = self
            .blocks
            .range(lo..=hi)
            .rev()
            .filter(|(k, _)| k.contains(&ip));
        let first = over.next()?;
        if first.1.alloc.is_taken(ip) {
            return Some(*first.0);
        }
        let others: Vec<(&IpNet, &Owned)> = over.collect();
        if others.is_empty() {
            return Some(*first.0);
        }
        let all = || std::iter::once(first).chain(others.iter().copied());
        all()
            .find(|(_, b)| b.alloc.is_taken(ip))
            .or_else(|| all().find(|(_, b)| b.confirmed() && b.alloc.contains(ip)))
            .or_else(|| all().find(|(_, b)| b.alloc.contains(ip)))
            .or(Some(first))
            .map(|(k, _)| *k)
    }

    fn block_of(&self, ip: IpAddr) -> Option<&Owned> {
        self.key_of(ip).and_then(|k| self.blocks.get(&k))
    }

    fn block_of_mut(&mut self, ip: IpAddr) -> Option<&mut Owned> {
        self.key_of(ip).and_then(|k| self.blocks.get_mut(&k))
    }

    /// Free addresses of the blocks that hand out, less those reserved.
    fn usable_free(&self) -> u128 {
        let reserved = self.kept_out();
        self.usable()
            .map(|b| b.alloc.free() - reserved::free_in(b, &reserved))
            .sum()
    }

    fn add_block(
        &mut self,
        net: IpNet,
        recorded: bool,
        state: BlockState,
    ) -> Result<(), BlockRefused> {
        if !self.cidrs.iter().any(|c| c.contains(&net)) {
            return Err(BlockRefused::Outside(format!(
                "block {net} is in none of cluster pool {:?}'s {} CIDRs ({})",
                self.pool,
                match self.family {
                    Family::V4 => "IPv4",
                    Family::V6 => "IPv6",
                },
                self.describe
            )));
        }
        match self.blocks.get_mut(&net) {
            Some(b) => {
                b.recorded |= recorded;
                b.state = state;
            }
            None => {
                let cidr = self.cidrs.iter().find(|c| c.contains(&net)).copied();
                let cidr = cidr.unwrap_or(net);
                let range = block::block_range(net, &cidr, self.subnet.as_ref())?;
                self.blocks
                    .insert(net, Owned::new(net, range, recorded, state));
                self.widest = self.widest.min(net.prefix_len());
                // Dropped, then this node's again before the engine struck it from the store:
                // striking it now would strike the record its addresses are about to get.
                self.forget.retain(|b| *b != net);
            }
        }
        self.confirmed_now(net);
        Ok(())
    }

    /// Block `net` may have come to be confirmed: it takes over what blocks of other sizes
    /// over it hold here (see `take_over`), and the addresses in it hosted here.
    fn confirmed_now(&mut self, net: IpNet) {
        if !self.blocks.get(&net).is_some_and(|b| b.confirmed()) {
            return;
        }
        if !crate::bugs::on(crate::bugs::Bug::OverlapNotTakenOver) {
            self.take_over(net);
        }
        if !crate::bugs::on(crate::bugs::Bug::HostedNotTakenOver) {
            self.take_over_hosted(net);
        }
    }

    /// Addresses hosted here (fixed addresses outside this node's blocks) that block `net`,
    /// this node's now, covers: the pin's block was given back or released (a pin the
    /// store no longer has, as after etcd's restore from an older backup), and claimed here.
    /// `net` holds them from now on, so that it never hands one out again.
    fn take_over_hosted(&mut self, net: IpNet) {
        let inside: Vec<IpAddr> = self
            .hosted
            .range(net.network()..=net.broadcast())
            .copied()
            .collect();
        let Some(block) = self.blocks.get_mut(&net) else {
            return;
        };
        let mut moved = 0;
        for ip in inside {
            if block.alloc.occupy(ip).is_ok() {
                block.empty_since = None;
                self.hosted.remove(&ip);
                moved += 1;
            }
        }
        if moved > 0 {
            if !block.recorded {
                block.recorded = true;
                self.record.push(net);
            }
            tracing::warn!(pool = %self.pool, block = %net, moved, "a block of this node's over fixed addresses hosted here: the block holds them from now on");
        }
    }

    /// Blocks of another size over the addresses of `net`, confirmed as this node's: the
    /// pool was made anew with other block sizes while a block of the old one (gone from the
    /// store: lost, or being claimed back) still held addresses here. `net` takes over every
    /// address of theirs it can hold, so that it never hands one out again; one left holding
    /// nothing goes.
    fn take_over(&mut self, net: IpNet) {
        let over: Vec<IpNet> = self
            .blocks
            .keys()
            .filter(|k| **k != net && (k.contains(&net.network()) || net.contains(&k.network())))
            .copied()
            .collect();
        for k in over {
            let held = self.blocks.get(&k).map(|b| b.held()).unwrap_or_default();
            let mut moved = Vec::new();
            if let Some(block) = self.blocks.get_mut(&net) {
                for ip in held {
                    if block.alloc.occupy(ip).is_ok() {
                        block.empty_since = None;
                        moved.push(ip);
                    }
                }
                if !moved.is_empty() && !block.recorded {
                    // Written as held before the other is struck (one change set).
                    block.recorded = true;
                    self.record.push(net);
                }
            }
            tracing::warn!(pool = %self.pool, block = %net, other = %k, moved = moved.len(), "a block of another size over addresses held here (the pool made anew with other block sizes?): this node's block takes over what it can hold");
            let Some(old) = self.blocks.get_mut(&k) else {
                continue;
            };
            for ip in moved {
                old.alloc.release(ip);
            }
            if matches!(old.state, BlockState::Orphaned(_) | BlockState::Doubt(_)) {
                // Still this node's in the store, and serving nothing already: a block of a
                // pool gone goes back once empty, one in doubt waits for its pool's deletion.
                // Dropped here, it would be found again at the next sync, for good.
                continue;
            }
            if old.is_empty() {
                self.drop_block(k);
            } else if !matches!(old.state, BlockState::Lost(_))
                && !crate::bugs::on(crate::bugs::Bug::OverlapBothServe)
            {
                // What it still holds lies outside `net` or cannot be held there; `net`, read
                // since, is this node's: the older block serves nothing more (its free addresses
                // are `net`'s now), and goes once what it holds is released.
                old.state = BlockState::Lost(format!(
                    "block {net} of this node's, confirmed since, lies over it"
                ));
            }
        }
    }

    /// Drops a block (given back, or found not to be this node's while empty).
    fn drop_block(&mut self, net: IpNet) {
        if let Some(b) = self.blocks.remove(&net) {
            if b.recorded {
                self.forget.push(net);
            }
        }
    }

    fn count_blocks(&self) {
        let metrics = &self.node.metrics().cluster;
        for state in BlockState::ALL {
            let n = self
                .blocks
                .values()
                .filter(|b| b.state.name() == state)
                .count();
            metrics
                .blocks
                .get_or_create(&BlockStateLabels {
                    pool: self.pool.clone(),
                    family: self.family.as_str().into(),
                    state: state.into(),
                })
                .set(n as i64);
        }
    }

    /// Takes in what the store's watches said since the last look: a block of this source's
    /// that is no longer this node's stops serving at once (unconfirmed: the sync that comes
    /// next says whose it is); a watch that started over makes the next work a sync. Returns
    /// the blocks heard of as gone (for `land`: a result landing after the news may add one).
    fn take_in_watched(&mut self) -> Vec<IpNet> {
        let news = self.node.heard().since(&self.pool, &mut self.heard);
        self.watched_sync |= news.restarted;
        // The pool written (its deletion done or refused): blocks in doubt are looked at now.
        self.watched_sync |= news.pool_written
            && self
                .blocks
                .values()
                .any(|b| matches!(b.state, BlockState::Doubt(_) | BlockState::Orphaned(_)));
        for net in &news.gone {
            self.heard_gone(*net);
        }
        if self.in_flight {
            self.gone_in_flight.extend(news.gone.iter().copied());
        }
        news.gone
    }

    /// The watch said block `net` is no longer this node's.
    fn heard_gone(&mut self, net: IpNet) {
        let Some(b) = self.blocks.get_mut(&net) else {
            return;
        };
        match b.state {
            BlockState::Confirmed(_) => {
                tracing::warn!(pool = %self.pool, block = %net, store = self.node.store_name(), "the store's watch says this node's block is no longer its own (a forced release-node?): nothing more is handed out from it; syncing");
                b.state = BlockState::Unconfirmed;
                self.watched_sync = true;
                self.count_blocks();
            }
            BlockState::Doubt(_) | BlockState::Orphaned(_) => self.watched_sync = true,
            // Its own give-back (Returning), or already not served.
            _ => {}
        }
    }

    /// What to do next against the store, if anything: nothing while the node does not serve.
    fn next_work(&mut self) -> Option<Work> {
        let epoch = self.node.serving().ok()?;
        self.take_in_watched();
        let unsettled = self
            .blocks
            .values()
            .any(|b| matches!(b.state, BlockState::Unsettled(_)));
        if self.synced != Some(epoch)
            || unsettled
            || self.watched_sync
            || self.next_sync.is_none_or(|t| Instant::now() >= t)
        {
            // The sync settles every other block it lists before it serves: a give-back of it
            // may be on its way (unanswered, or sent before a restart). The first sync of an
            // epoch (the name taken again, a fence lifted, the store reset) trusts none: while
            // this node was away, release-node may have listed its blocks, and its give-backs,
            // conditioned on what it listed, may still arrive (on the Kubernetes API nothing
            // else stops them).
            let first =
                self.synced != Some(epoch) && !crate::bugs::on(crate::bugs::Bug::FirstSyncTrusts);
            // The blocks held in a state, with their keys as last read or written (none at
            // the first sync of an epoch, which trusts nothing).
            let held_as = |state: fn(&BlockState) -> Option<KeyRevision>| match first {
                true => Vec::new(),
                false => self
                    .blocks
                    .values()
                    .filter_map(|b| state(&b.state).map(|r| (b.net(), r)))
                    .collect::<Vec<(IpNet, KeyRevision)>>(),
            };
            let trusted = held_as(|s| match s {
                BlockState::Confirmed(r) => Some(*r),
                _ => None,
            });
            let orphaned = held_as(|s| match s {
                BlockState::Orphaned(r) => Some(*r),
                _ => None,
            });
            // One subnet's pins: listed at the first sync of an epoch (the node may have
            // been away, or restarted knowing none), and at each while the pool has any.
            let pins = self.subnet.is_some() && (first || self.node.pool_has_pins(&self.pool));
            return Some(Work::Sync {
                epoch,
                trusted,
                pins,
                orphaned,
            });
        }
        if let Some(b) = self
            .blocks
            .values()
            .find(|b| b.state == BlockState::Reclaiming)
        {
            return Some(Work::Reclaim(b.net()));
        }
        // A block of a pool that is gone: given back as soon as nothing in it is in use (no
        // hold-down; it was never going to serve again).
        if let Some((net, revision)) = self.blocks.values().find_map(|b| match b.state {
            BlockState::Orphaned(r) if b.is_empty() => Some((b.net(), r)),
            _ => None,
        }) {
            return Some(Work::GiveBack(net, revision));
        }
        let free = self.usable_free();
        // A disabled pool claims nothing more, nor one whose nodeSelector this node does
        // not match (both give their empty blocks back), nor one waiting for the node's labels.
        let disabled = self.node.pool_stopped(&self.pool).is_some();
        let awaited = !self.on_demand || self.demanded || !self.blocks.is_empty();
        let may_claim = awaited && self.node.pool_awaits_labels(&self.pool).is_none();
        if free < self.threshold.max(1) as u128
            && self.exhausted.is_none()
            && !disabled
            && may_claim
        {
            return Some(Work::Claim {
                cidrs: self.cidrs.clone(),
            });
        }
        let hold_down = Duration::from_secs(self.node.settings().block_hold_down_secs);
        let usable = self.usable().count();
        // What a block's give-back takes from `free`: its free addresses less those kept out
        // (reserved, excluded), as `free` counts them.
        let kept = self.kept_out();
        let counted = |b: &Owned| b.alloc.free() - reserved::free_in(b, &kept);
        // A disabled pool's empty blocks all go back (the last one too).
        // Nor one holding a pinned address: another node may serve it, and the block's next
        // owner would hand it out.
        let giving = self.usable().find_map(|b| match b.state {
            BlockState::Confirmed(revision)
                if b.is_empty()
                    && (!self.node.pinned_in(&self.pool, &b.net())
                        || crate::bugs::on(crate::bugs::Bug::PinnedBlockGivenBack))
                    && b.empty_since.is_some_and(|t| t.elapsed() >= hold_down)
                    && (disabled || free.saturating_sub(counted(b)) >= self.threshold as u128) =>
            {
                Some((b.net(), revision))
            }
            _ => None,
        });
        match giving {
            Some((net, revision)) if usable > 1 || disabled => Some(Work::GiveBack(net, revision)),
            _ => None,
        }
    }

    /// `work` failed: that kind of work waits (a claim's wait holds back claims only).
    fn failed_now(&mut self, work: &Work, why: String) {
        self.failed = Some(why);
        let (at, backoff) = match work {
            Work::Claim { .. } => (&mut self.claim_retry_at, &mut self.claim_backoff),
            _ => (&mut self.retry_at, &mut self.backoff),
        };
        *at = Some(Instant::now() + super::jitter(*backoff));
        *backoff = (*backoff * 2).min(BACKOFF_MAX);
    }
}

impl Source for ClusterSource {
    fn describe(&self) -> String {
        self.describe.clone()
    }
    fn next(&self) -> Next {
        if let Some(n) = self.not_serving() {
            return n;
        }
        // Nothing new from a disabled pool, nor one this node may not use (the background
        // loop fetches nothing into idle then, and its blocks empty).
        // (A node its pool's nodeSelector shuts out is refused before, by `refused`: one
        // that comes to be between the two waits, as it did.)
        match self.node.pool_stopped_for(&self.pool) {
            Some((Refusal::NoPoolForNode, why)) => return Next::Unavailable(why),
            Some((refusal, why)) => return Next::Refused(refusal, why),
            None => {}
        }
        let reserved = self.kept_out();
        if let Some(ip) = self
            .usable()
            .find_map(|b| reserved::peek_next(b, &reserved))
        {
            return Next::Ready(ip);
        }
        let pool = &self.pool;
        match (&self.failed, &self.exhausted) {
            (Some(why), _) if !self.in_flight => Next::Unavailable(format!(
                "no free address in this node's blocks of cluster pool {pool:?}, and claiming one failed: {why}"
            )),
            (None, Some(_)) if !self.in_flight => Next::Exhausted,
            _ => Next::Pending(format!("claiming a block of cluster pool {pool:?}")),
        }
    }
    fn peek_next_n(&self, n: usize) -> Vec<IpAddr> {
        if self.not_serving().is_some() || self.node.pool_stopped(&self.pool).is_some() {
            return Vec::new();
        }
        let reserved = self.kept_out();
        let mut out = Vec::new();
        for b in self.usable() {
            if out.len() >= n {
                break;
            }
            out.extend(reserved::peek_next_n(b, &reserved, n - out.len()));
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
        if let Some(why) = self.reserved_why(ip).or_else(|| self.pinned_why(ip)) {
            return Err(OccupyError::Withheld(ip, why));
        }
        if self.hosted.contains(&ip) {
            return Err(OccupyError::Taken(ip));
        }
        self.can_occupy_unpinned(ip)
    }
    fn can_hold(&self, ip: IpAddr) -> Result<(), OccupyError> {
        match self.block_of(ip) {
            Some(b) => b.alloc.can_occupy(ip),
            None => Err(OccupyError::NotInRange(ip)),
        }
    }
    fn occupy(&mut self, ip: IpAddr) -> Result<(), OccupyError> {
        self.occupy_in_block(ip)
    }
    fn vacate(&mut self, ip: IpAddr) -> bool {
        if self.hosted.remove(&ip) {
            return true;
        }
        let Some(b) = self.block_of_mut(ip) else {
            return false;
        };
        let vacated = b.alloc.release(ip);
        if vacated && b.is_empty() {
            b.empty_since = Some(Instant::now());
            // A block that is not this node's and holds nothing any more: nothing to claim
            // back or keep.
            if matches!(b.state, BlockState::Lost(_) | BlockState::Reclaiming) {
                let net = b.net();
                tracing::info!(pool = %self.pool, block = %net, "a block that is not this node's holds nothing here any more: dropped");
                self.drop_block(net);
                self.count_blocks();
            }
        }
        vacated
    }
    fn contains(&self, ip: IpAddr) -> bool {
        self.hosted.contains(&ip) || self.block_of(ip).is_some_and(|b| b.alloc.contains(ip))
    }
    fn covers(&self, ip: IpAddr) -> bool {
        self.cidrs.iter().any(|c| c.contains(&ip))
    }
    fn interface_of(&self, ip: IpAddr) -> Option<(u8, Option<IpAddr>)> {
        // Outside this node's blocks: a fixed address hosted here (or about to be), with its
        // subnet's prefix and gateway.
        self.block_of(ip)
            .and_then(|b| b.alloc.range_of(ip).cloned())
            .or_else(|| self.hosting_range(ip))
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
    fn blocks(&self) -> Option<&dyn BlockSource> {
        Some(self)
    }
    fn blocks_mut(&mut self) -> Option<&mut dyn BlockSource> {
        Some(self)
    }
}

impl ClusterSource {
    /// Whether `ip` may be handed out here, its pin aside: where it is (see `can_occupy`).
    fn can_occupy_unpinned(&self, ip: IpAddr) -> Result<(), OccupyError> {
        match self.block_of(ip) {
            Some(b) if b.confirmed() => b.alloc.can_occupy(ip),
            // The bug, put back: an address asked for by name placed in a block being given back.
            Some(b)
                if matches!(b.state, BlockState::Returning(_))
                    && crate::bugs::on(crate::bugs::Bug::RequestedInReturning) =>
            {
                b.alloc.can_occupy(ip)
            }
            Some(b) => Err(OccupyError::Withheld(ip, self.why_withheld(b))),
            None => Err(OccupyError::Withheld(
                ip,
                format!(
                    "it is in no block this node owns of cluster pool {:?}",
                    self.pool
                ),
            )),
        }
    }

    /// Takes `ip` in its block here.
    fn occupy_in_block(&mut self, ip: IpAddr) -> Result<(), OccupyError> {
        let b = self.block_of_mut(ip).ok_or(OccupyError::NotInRange(ip))?;
        b.alloc.occupy(ip)?;
        b.recorded = true;
        b.empty_since = None;
        Ok(())
    }

    /// A disabled pool, or one this node may not use (its idle addresses leave it, so that
    /// its emptied blocks go back), and reserved addresses.
    fn stopped_or_reserved(&self, ip: IpAddr) -> Option<String> {
        self.node
            .pool_stopped(&self.pool)
            .or_else(|| self.reserved_why(ip))
    }

    /// Why `ip` is withheld, its pin aside: the pool stopped, reserved, or where it is here.
    fn withheld_unpinned(&self, ip: IpAddr) -> Option<String> {
        if let Some(why) = self.stopped_or_reserved(ip) {
            return Some(why);
        }
        match self.block_of(ip) {
            Some(b) if b.confirmed() => None,
            Some(b) => Some(self.why_withheld(b)),
            None => Some(format!(
                "{ip} is in no block this node owns of cluster pool {:?}",
                self.pool
            )),
        }
    }

    /// Why `ip` is withheld from anyone.
    fn withheld_why(&self, ip: IpAddr) -> Option<String> {
        if let Some(why) = self.stopped_or_reserved(ip) {
            return Some(why);
        }
        if let Some(why) = self.pinned_why(ip) {
            return Some(why);
        }
        if self.hosted.contains(&ip) {
            return Some(format!(
                "{ip} is hosted here for the pod it is pinned for, and for it only"
            ));
        }
        self.withheld_unpinned(ip)
    }
}

#[cfg(test)]
mod landing_tests;
#[cfg(test)]
mod overlap_tests;
#[cfg(test)]
mod pinned_tests;
#[cfg(test)]
mod policy_tests;
#[cfg(test)]
mod subnet_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod watch_tests;
