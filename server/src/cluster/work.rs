//! The etcd work a [`ClusterSource`](super::source::ClusterSource) hands the engine as a
//! [`Claim`]: run outside the engine's lock, its [`Done`] lands back in the source.

use std::sync::Arc;

use ipnet::IpNet;

use super::etcd::{Block, Claimed, ClusterError};
use super::node::ClusterNode;
use crate::range::Family;
use crate::source::{Claim, Landed};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    /// List this node's blocks of the pool.
    Sync,
    /// Claim the next free block.
    Claim,
    /// Claim back a block the store holds but etcd does not list as this node's.
    Reclaim(IpNet),
    /// Give back an empty block.
    GiveBack(IpNet),
}

#[derive(Debug)]
pub enum Outcome {
    Synced(Vec<Block>),
    Claimed(Block),
    /// No free block: why, with the pool's counts.
    PoolFull(String),
    /// Claimed back, with its create revision.
    Reclaimed(i64),
    /// Another node owns it.
    Taken(String),
    /// Given back (false: the key was no longer the one this node created).
    GaveBack(bool),
}

/// What lands.
pub struct Done {
    pub work: Work,
    pub result: Result<Outcome, String>,
}

/// The claim that does `work` for `node`'s range set of `pool` (one family).
pub fn run(
    node: Arc<ClusterNode>,
    pool: String,
    family: Family,
    work: Work,
    revision: Option<i64>,
) -> Claim {
    Box::pin(async move {
        let result = execute(&node, &pool, family, &work, revision)
            .await
            .map_err(|e| e.to_string());
        Box::new(Done { work, result }) as Landed
    })
}

async fn execute(
    node: &ClusterNode,
    pool: &str,
    family: Family,
    work: &Work,
    revision: Option<i64>,
) -> Result<Outcome, ClusterError> {
    let me = node.name().to_string();
    let metrics = &node.metrics().cluster;
    match work {
        Work::Sync => sync(node, pool).await,
        Work::Claim => {
            let spec = node.pool(pool).await?.ok_or_else(|| {
                ClusterError::Refused(format!(
                    "cluster pool {pool:?} does not exist in etcd (ipoolctl cluster pool create)"
                ))
            })?;
            let v4 = family == Family::V4;
            let (s2, n) = (spec.clone(), me.clone());
            let out = node
                .call("claim", |s| async move { s.claim_next(&s2, v4, &n).await })
                .await;
            let out = match out {
                Ok(o) => o,
                Err(e) => {
                    metrics.claim(pool, "error");
                    return Err(e);
                }
            };
            crate::metrics::ClusterMetrics::pool_counter(&metrics.conflicts, pool, out.lost as u64);
            match out.block {
                Some(b) => {
                    metrics.claim(pool, "won");
                    Ok(Outcome::Claimed(b))
                }
                None => {
                    metrics.claim(pool, "exhausted");
                    let block = match family {
                        Family::V4 => spec.block_v4,
                        Family::V6 => spec.block_v6,
                    };
                    Ok(Outcome::PoolFull(format!(
                        "cluster pool {pool:?} has no free IPv{} block: {} block(s) of /{block}, {} owned by other nodes, {} by this node, {} touched by excluded ranges",
                        family.as_str(),
                        out.blocks,
                        out.owned_elsewhere,
                        out.owned_here,
                        out.excluded
                    )))
                }
            }
        }
        Work::Reclaim(net) => {
            let (p, n, b) = (pool.to_string(), me.clone(), *net);
            let claimed = node
                .call("claim", |s| async move { s.claim(&p, &b, &n).await })
                .await?;
            match claimed {
                Claimed::Won(b) => Ok(Outcome::Reclaimed(b.create_revision)),
                // Listed meanwhile: ours after all.
                Claimed::Lost(owner) if owner.node == me => sync(node, pool).await,
                Claimed::Lost(owner) => {
                    crate::metrics::ClusterMetrics::pool_counter(&metrics.conflicts, pool, 1);
                    Ok(Outcome::Taken(owner.node))
                }
                Claimed::NoPool => Err(ClusterError::Refused(format!(
                    "cluster pool {pool:?} was deleted"
                ))),
            }
        }
        Work::GiveBack(net) => {
            let block = Block {
                pool: pool.to_string(),
                block: *net,
                owner: super::etcd::Owner {
                    node: me.clone(),
                    claimed_at_ms: 0,
                },
                create_revision: revision.unwrap_or_default(),
            };
            let ours = node
                .call("give_back", |s| async move { s.give_back(&block).await })
                .await?;
            Ok(Outcome::GaveBack(ours))
        }
    }
}

/// This node's blocks of `pool`, as etcd lists them.
async fn sync(node: &ClusterNode, pool: &str) -> Result<Outcome, ClusterError> {
    let (p, n) = (pool.to_string(), node.name().to_string());
    let listed = node
        .call("list_blocks", |s| async move {
            s.list_blocks(Some(&p), Some(&n)).await
        })
        .await?;
    Ok(Outcome::Synced(listed))
}
