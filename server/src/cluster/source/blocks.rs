//! A cluster pool's source, its block-specific part ([`BlockSource`]): claims and syncs run
//! as work outside the engine's lock and landed under it, the blocks recorded in the node's
//! state dir, addresses withheld where a block does not serve, fixed addresses (pins) taken
//! and hosted, and the pool's policy (disabled, nodeSelector, on demand).

use std::net::IpAddr;

use ipnet::IpNet;
use tokio::time::Instant;

use super::{BlockState, ClusterSource};
use crate::cluster::work::{self, Work};
use crate::error::Refusal;
use crate::range::OccupyError;
use crate::source::{
    BlockId, BlockRefused, BlockSource, Claim, Landing, Next, NotListedYet, WorkFailed,
};

impl BlockSource for ClusterSource {
    fn can_occupy_fixed(&self, ip: IpAddr) -> Result<(), OccupyError> {
        self.can_take_fixed(ip)
    }
    fn occupy_fixed(&mut self, ip: IpAddr) -> Result<(), OccupyError> {
        self.take_fixed(ip)
    }
    fn withheld_fixed(&self, ip: IpAddr) -> Option<String> {
        self.withheld_fixed_why(ip)
    }
    fn block_holding(&self, ip: IpAddr) -> Option<BlockId> {
        self.block_of(ip).and_then(|b| match b.state {
            BlockState::Confirmed(r) => Some(BlockId {
                net: b.net(),
                created: r.create,
            }),
            _ => None,
        })
    }
    fn one_subnet(&self) -> bool {
        self.subnet.is_some()
    }
    fn hosts(&self, ip: IpAddr) -> bool {
        self.hosted.contains(&ip)
    }
    fn may_withhold(&self) -> bool {
        true
    }
    fn grows(&self) -> bool {
        true
    }
    fn withheld(&self, ip: IpAddr) -> Option<String> {
        self.withheld_why(ip)
    }

    fn start_claim(&mut self) -> Option<Claim> {
        // The watches' news stop a block serving at once, work on its way or not.
        self.take_in_watched();
        self.report_reserved();
        if self.in_flight {
            return None;
        }
        let now = Instant::now();
        if self.exhausted.is_some() && self.claim_retry_at.is_none_or(|t| now >= t) {
            // Past the exhaustion's wait: look at the pool again.
            self.exhausted = None;
        }
        let work = self.next_work()?;
        let wait = match work {
            // The bug, put back: a claim's wait held back every kind of work.
            _ if crate::bugs::on(crate::bugs::Bug::ClaimWaitDelaysSync) => {
                self.retry_at.max(self.claim_retry_at)
            }
            Work::Claim { .. } => self.claim_retry_at,
            _ => self.retry_at,
        };
        if wait.is_some_and(|t| now < t) {
            return None;
        }
        if let Work::Sync { .. } = work {
            // This sync looks at what the watches said.
            self.watched_sync = false;
        }
        if let Work::GiveBack(net, revision) = &work {
            if let Some(b) = self.blocks.get_mut(net) {
                b.state = BlockState::Returning(*revision);
            }
            self.count_blocks();
        }
        self.in_flight = true;
        Some(work::run(
            self.node.clone(),
            self.pool.clone(),
            self.family,
            self.cidrs.clone(),
            self.inbox.clone(),
            work,
        ))
    }
    fn land(&mut self) -> Result<Landing, WorkFailed> {
        let Some(done) = self.inbox.lock().expect("inbox").take() else {
            return Ok(Landing::Nothing);
        };
        self.in_flight = false;
        // What the watches said meanwhile comes first: a block they say is gone, listed by a
        // sync that started before, stays unconfirmed (see `synced_with`); and one the result
        // adds (a claim won, or listed, before the news) is unconfirmed after it.
        let mut gone = std::mem::take(&mut self.gone_in_flight);
        gone.extend(self.take_in_watched());
        let result = self.landed(done);
        for net in gone {
            self.heard_gone(net);
        }
        self.count_blocks();
        result.map(Landing::Took)
    }
    fn unrecorded(&self, ip: IpAddr) -> Option<IpNet> {
        self.block_of(ip).filter(|b| !b.recorded).map(|b| b.net())
    }
    fn restore_block(&mut self, block: IpNet) -> Result<(), BlockRefused> {
        self.add_block(block, true, BlockState::Unconfirmed)
    }
    fn recorded_blocks(&self) -> Vec<IpNet> {
        self.blocks
            .values()
            .filter(|b| b.recorded)
            .map(|b| b.net())
            .collect()
    }
    fn forget(&mut self) -> Vec<IpNet> {
        std::mem::take(&mut self.forget)
    }
    fn record(&mut self) -> Vec<IpNet> {
        std::mem::take(&mut self.record)
    }
    fn held_back(&self) -> Option<Next> {
        self.not_serving()
            .or_else(|| {
                self.disabled()
                    .map(|why| Next::Refused(Refusal::PoolDisabled, why))
            })
            .or_else(|| self.node.pool_awaits_labels(&self.pool).map(Next::Pending))
    }
    fn pool_name(&self) -> Option<&str> {
        Some(&self.pool)
    }
    fn refused(&self) -> Option<String> {
        self.node.pool_refused(&self.pool)
    }
    fn demand(&mut self) {
        self.demanded = true;
    }
    fn knows_its_addresses(&self) -> Result<(), NotListedYet> {
        match self.synced {
            Some(_) => Ok(()),
            None => Err(NotListedYet(format!(
                "this node's blocks of cluster pool {:?} are not listed yet",
                self.pool
            ))),
        }
    }
    fn degraded(&self) -> Option<String> {
        self.node.degraded()
    }
    fn detail(&self) -> Option<String> {
        Some(self.describe_blocks())
    }
}
