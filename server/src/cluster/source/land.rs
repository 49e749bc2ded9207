//! What landed: a claim's outcome taken into the source, and how the source describes its
//! blocks.

use std::time::Duration;

use tokio::time::Instant;

use ipnet::IpNet;

use super::super::vocab::KeyRevision;
use super::super::work::{Done, Outcome, Synced, Work};
use super::{BlockState, ClusterSource, Owned, DOUBT_FIRST, EXHAUSTED_RETRY};
use crate::metrics::ClusterMetrics;
use crate::source::{Next, WorkFailed};
impl ClusterSource {
    /// Takes in what a claim did (or why it failed).
    pub(super) fn landed(&mut self, done: Done) -> Result<String, WorkFailed> {
        let outcome = match done.result {
            Ok(o) => o,
            Err(e) => {
                let why = e.to_string();
                match &done.work {
                    // The delete may have been applied or not: the next sync says.
                    Work::GiveBack(net, revision) => {
                        if let Some(b) = self.blocks.get_mut(net) {
                            b.state =
                                match crate::bugs::on(crate::bugs::Bug::UnansweredGiveBackServes) {
                                    // The bug, put back: back into service.
                                    true => BlockState::Confirmed(*revision),
                                    false => BlockState::Unsettled(*revision),
                                };
                        }
                    }
                    Work::Sync { .. } | Work::Claim { .. } | Work::Reclaim(_) => {}
                }
                self.failed_now(&done.work, why.clone());
                return Err(WorkFailed(why));
            }
        };
        self.failed = None;
        match &done.work {
            Work::Claim { .. } => {
                self.claim_backoff = Duration::from_secs(1);
                self.claim_retry_at = None;
            }
            _ => {
                self.backoff = Duration::from_secs(1);
                self.retry_at = None;
            }
        }
        let pool = self.pool.clone();
        let node = self.node.clone();
        let metrics = &node.metrics().cluster;
        match (done.work, outcome) {
            (Work::Sync { epoch, trusted, .. }, Outcome::Synced(listed)) => {
                Ok(self.synced_with(epoch, &trusted, listed))
            }
            (Work::Claim { .. }, Outcome::Claimed(b)) => {
                self.exhausted = None;
                let net = b.block;
                let r = self.add_block(net, false, BlockState::Confirmed(b.revision));
                r.map(|()| format!("claimed block {net} of cluster pool {pool:?}"))
                    .map_err(|e| WorkFailed(e.to_string()))
            }
            (_, Outcome::PoolFull(why)) => {
                self.exhausted = Some(why.clone());
                self.claim_retry_at = Some(Instant::now() + super::super::jitter(EXHAUSTED_RETRY));
                Err(WorkFailed(why))
            }
            (_, Outcome::PoolChanged) => Ok(format!(
                "cluster pool {pool:?} changed since it was read: read again before claiming"
            )),
            // Not Ready: nothing was claimed (a block being claimed back stays so): try again
            // after a wait, as after a failure, and say why meanwhile.
            (work, Outcome::PoolNotReady(why)) => {
                self.failed_now(&work, why.clone());
                Err(WorkFailed(why))
            }
            (Work::Reclaim(net), Outcome::Reclaimed(revision)) => {
                if let Some(b) = self.blocks.get_mut(&net) {
                    b.state = BlockState::Confirmed(revision);
                }
                self.confirmed_now(net);
                Ok(format!("claimed back block {net} of cluster pool {pool:?}, which holds addresses in use here"))
            }
            (Work::Reclaim(net), Outcome::Taken(holder)) => {
                let why = format!("block {net} of cluster pool {pool:?} holds addresses in use here, but {} says {holder} owns it: nothing more is handed out from it (a forced release-node?)", self.node.store_name());
                tracing::error!(%why, "block conflict");
                ClusterMetrics::conflict(&metrics.conflicts, &pool, "ownership", 1);
                if let Some(b) = self.blocks.get_mut(&net) {
                    b.state = BlockState::Lost(format!("{holder} owns it"));
                }
                Err(WorkFailed(why))
            }
            (Work::GiveBack(net, _), Outcome::GaveBack(ours)) => {
                if ours {
                    ClusterMetrics::pool_counter(&metrics.give_backs, &pool, 1);
                }
                let held_here = self.blocks.get(&net).is_some_and(|b| !b.is_empty());
                if held_here {
                    // Something was placed in it meanwhile (a quarantine): claim it back.
                    if let Some(b) = self.blocks.get_mut(&net) {
                        b.state = BlockState::Reclaiming;
                    }
                    return Err(WorkFailed(format!("block {net} of cluster pool {pool:?} was given back while an address of it came to be held here: claiming it back")));
                }
                self.drop_block(net);
                Ok(match ours {
                    true => format!("gave back empty block {net} of cluster pool {pool:?}"),
                    false => format!("block {net} of cluster pool {pool:?} was no longer this node's in {}; dropped", self.node.store_name()),
                })
            }
            (work, outcome) => Err(WorkFailed(format!("{work:?} cannot end in {outcome:?}"))),
        }
    }

    /// This node's blocks of the pool as the store listed them, in serving epoch `epoch`:
    /// those not in `trusted` were settled by the sync (which leaves out any that could not
    /// be), and those of a pool being deleted or gone are set apart.
    fn synced_with(
        &mut self,
        epoch: u64,
        trusted: &[(IpNet, KeyRevision)],
        listed: Synced,
    ) -> String {
        let mut mine = Vec::new();
        let any_doubt = !listed.in_doubt.is_empty();
        let apart = listed
            .in_doubt
            .into_iter()
            .map(|b| (b.block, BlockState::Doubt(b.revision)))
            .chain(
                listed
                    .orphaned
                    .into_iter()
                    .map(|b| (b.block, BlockState::Orphaned(b.revision))),
            );
        for (net, state) in apart {
            match &state {
                BlockState::Doubt(_) => {
                    tracing::warn!(pool = %self.pool, block = %net, "this node's block is in doubt: its pool is being deleted; it is neither served from nor given back until the deletion is done or refused")
                }
                _ => {
                    tracing::warn!(pool = %self.pool, block = %net, "this node's block belongs to a pool that is gone (or made anew) since it was claimed: never served again, given back once nothing in it is in use")
                }
            }
            match self.add_block(net, false, state) {
                Ok(()) => mine.push(net),
                Err(e) => {
                    tracing::warn!(pool = %self.pool, error = %e, "a listed block cannot be used")
                }
            }
        }
        for b in listed.mine {
            if !self.cidrs.iter().any(|c| c.contains(&b.block)) {
                continue;
            }
            // A block that came to be in doubt after the sync started (trusted then) was not
            // settled by it: it stays in doubt until the next.
            let doubt = self.blocks.get(&b.block).is_some_and(|o| {
                !matches!(o.state, BlockState::Confirmed(_) | BlockState::Lost(_))
            });
            if doubt && trusted.iter().any(|(n, _)| *n == b.block) {
                mine.push(b.block);
                continue;
            }
            match self.add_block(b.block, false, BlockState::Confirmed(b.revision)) {
                Ok(()) => mine.push(b.block),
                Err(e) => {
                    tracing::warn!(pool = %self.pool, error = %e, "a listed block cannot be used")
                }
            }
        }
        let mut dropped = Vec::new();
        for (k, b) in self.blocks.iter_mut() {
            if mine.contains(k) {
                continue;
            }
            match (&b.state, b.is_empty()) {
                (_, true) => dropped.push(b.net()),
                (BlockState::Lost(_), false) => {}
                (_, false) => {
                    tracing::warn!(pool = %self.pool, block = %b.net(), store = %self.node.store_name(), "a block holding addresses here is not this node's in the store: claiming it back; nothing is handed out from it meanwhile");
                    b.state = BlockState::Reclaiming;
                }
            }
        }
        for net in dropped {
            tracing::info!(pool = %self.pool, block = %net, store = %self.node.store_name(), "a block that is not this node's in the store holds nothing here: dropped");
            self.drop_block(net);
        }
        let first = self.synced.is_none();
        self.synced = Some(epoch);
        self.node
            .metrics()
            .cluster
            .synced(&self.pool, self.family.as_str());
        let resync = Duration::from_secs(self.node.settings().resync_secs);
        // Blocks in doubt are looked at again soon (sooner than a resync, at first).
        let wait = match any_doubt {
            true => {
                let w = self.doubt_wait.min(resync);
                self.doubt_wait = (self.doubt_wait * 2).min(resync);
                w
            }
            false => {
                self.doubt_wait = DOUBT_FIRST;
                resync
            }
        };
        self.next_sync = Some(Instant::now() + super::super::jitter(wait));
        if first {
            tracing::info!(pool = %self.pool, family = self.family.as_str(), blocks = mine.len(), "this node's blocks listed: serving");
        }
        format!(
            "this node owns {} block(s) of cluster pool {:?} ({})",
            mine.len(),
            self.pool,
            self.family.as_str()
        )
    }

    /// Why nothing is handed out from block `b`.
    pub(super) fn why_withheld(&self, b: &Owned) -> String {
        let net = b.net();
        let pool = &self.pool;
        let store = self.node.store_name();
        match &b.state {
            BlockState::Confirmed(_) => String::new(),
            BlockState::Unconfirmed => format!(
                "block {net} of cluster pool {pool:?} is not yet confirmed as this node's by {store}"
            ),
            BlockState::Reclaiming => format!(
                "block {net} of cluster pool {pool:?} is not this node's in {store} and is being claimed back"
            ),
            BlockState::Returning(_) => {
                format!("block {net} of cluster pool {pool:?} is being given back")
            }
            BlockState::Unsettled(_) => format!(
                "block {net} of cluster pool {pool:?} was being given back and {store} did not answer: the next sync says whose it is"
            ),
            BlockState::Lost(why) => format!(
                "block {net} of cluster pool {pool:?} is not this node's: {why}"
            ),
            BlockState::Doubt(_) => format!(
                "block {net} of cluster pool {pool:?} is in doubt: the pool is being deleted (until the deletion is done or refused)"
            ),
            BlockState::Orphaned(_) => format!(
                "block {net} belongs to cluster pool {pool:?} as it was, which is gone or made anew since: never served again"
            ),
        }
    }

    /// The blocks and their states, for status.
    pub(super) fn describe_blocks(&self) -> String {
        let owned: Vec<String> = self
            .blocks
            .values()
            .map(|b| {
                let net: IpNet = b.net();
                let used = b.alloc.size() - b.alloc.free();
                match &b.state {
                    BlockState::Confirmed(_) => format!("{net} ({used} used)"),
                    BlockState::Lost(why) => format!("{net} (CONFLICT: {why}; {used} held here)"),
                    other => format!("{net} ({}, {used} held here)", other.name().to_uppercase()),
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
        if let Some((_, why)) = self.not_serving().and_then(Next::why_not) {
            s.push_str("; not serving: ");
            s.push_str(&why);
        }
        if let Some(why) = &self.exhausted {
            s.push_str("; ");
            s.push_str(why);
        }
        if let Some(note) = self.node.rate_note() {
            s.push_str("; ");
            s.push_str(&note);
        }
        let malformed = self.node.malformed();
        if !malformed.is_empty() {
            s.push_str(&format!(
                "; {} malformed key(s) in {}, counted as occupied: {}",
                malformed.len(),
                self.node.store_name(),
                malformed.join(", ")
            ));
        }
        s
    }
}
