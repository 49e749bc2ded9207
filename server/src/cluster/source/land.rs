//! What landed: a claim's outcome taken into the source.

use std::time::Instant;

use ipnet::IpNet;

use super::super::etcd::Block;
use super::super::work::{Outcome, Work};
use super::{ClusterSource, EXHAUSTED_RETRY};

impl ClusterSource {
    pub(super) fn synced_with(&mut self, listed: Vec<Block>) -> Result<String, String> {
        let mut mine = Vec::new();
        for b in listed {
            if self.cidrs.iter().any(|c| c.contains(&b.block)) {
                self.add_block(b.block, false, Some(b.create_revision))?;
                mine.push(b.block.network());
            }
        }
        let stale: Vec<IpNet> = self
            .blocks
            .iter()
            .filter(|(k, b)| !mine.contains(k) && b.is_empty())
            .map(|(_, b)| Self::net_of(b))
            .collect();
        for net in stale {
            tracing::info!(pool = %self.pool, block = %net, "a block the store recorded is no longer this node's in etcd and holds nothing: dropped");
            self.drop_block(net);
        }
        for b in self.blocks.values_mut() {
            if !mine.contains(&Self::net_of(b).network()) {
                b.revision = None;
            }
        }
        self.synced = true;
        self.last_sync = Some(Instant::now());
        Ok(format!(
            "this node owns {} block(s) of cluster pool {:?} ({})",
            mine.len(),
            self.pool,
            self.family.as_str()
        ))
    }

    pub(super) fn landed(&mut self, work: Work, outcome: Outcome) -> Result<String, String> {
        let pool = self.pool.clone();
        match (work, outcome) {
            (_, Outcome::Synced(listed)) => self.synced_with(listed),
            (_, Outcome::Claimed(b)) => {
                self.exhausted = None;
                self.add_block(b.block, false, Some(b.create_revision))?;
                Ok(format!(
                    "claimed block {} of cluster pool {pool:?}",
                    b.block
                ))
            }
            (_, Outcome::PoolFull(why)) => {
                self.exhausted = Some(why.clone());
                self.retry_at = Some(Instant::now() + EXHAUSTED_RETRY);
                Err(why)
            }
            (Work::Reclaim(net), Outcome::Reclaimed(revision)) => {
                if let Some(b) = self.blocks.get_mut(&net.network()) {
                    b.revision = Some(revision);
                }
                Ok(format!("claimed back block {net} of cluster pool {pool:?}, which still holds addresses in use here"))
            }
            (Work::Reclaim(net), Outcome::Taken(owner)) => {
                let why = format!("block {net} of cluster pool {pool:?} holds addresses in use here, but etcd says node {owner:?} owns it: nothing more is handed out from it (a forced release-node?)");
                tracing::error!(%why, "block conflict");
                if let Some(b) = self.blocks.get_mut(&net.network()) {
                    b.lost = Some(why.clone());
                }
                Err(why)
            }
            (Work::GiveBack(net), Outcome::GaveBack(ours)) => {
                self.drop_block(net);
                crate::metrics::ClusterMetrics::pool_counter(
                    &self.node.metrics().cluster.give_backs,
                    &pool,
                    ours as u64,
                );
                Ok(match ours {
                    true => format!("gave back empty block {net} of cluster pool {pool:?}"),
                    false => format!("block {net} of cluster pool {pool:?} was no longer this node's key in etcd; dropped"),
                })
            }
            (work, outcome) => Err(format!("{work:?} cannot end in {outcome:?}")),
        }
    }
}
