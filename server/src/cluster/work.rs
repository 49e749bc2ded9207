//! The store work a [`ClusterSource`](super::source::ClusterSource) hands the engine as a
//! [`Claim`]: run outside the engine's lock, its [`Done`] left in the source's [`Inbox`],
//! which the source takes in when the engine calls its `land`.

use std::sync::Arc;

use ipnet::IpNet;

use super::node::pins::holds_kept;
use super::node::ClusterNode;
use super::pin::{Pin, PinCreated};
use super::vocab::{Block, Claimed, ClusterError, KeyRevision, Owner, Pool, PoolPhase, Settled};
use crate::metrics::ClusterMetrics;
use crate::range::Family;
use crate::source::Claim;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Work {
    /// List this node's blocks of the pool, in serving epoch `epoch`, and settle each one
    /// listed that is not in `trusted` as listed: the blocks the source holds as confirmed,
    /// with their keys as it last read or wrote them. Any other (restored after a restart,
    /// given back with no answer, or not known here at all) may have a give-back of it on its
    /// way, sent before, that the store could still apply.
    Sync {
        epoch: u64,
        trusted: Vec<(IpNet, KeyRevision)>,
        /// List the pool's pins too (a pool addressed as one subnet).
        pins: bool,
        /// The blocks the source holds as of a pool that is gone (or made anew), with their
        /// keys as it last read or wrote them: listed so again, they are not settled again
        /// (their settle found the pool gone, which it stays; a write at every resync for as
        /// long as their pods run would be all an idle node writes).
        orphaned: Vec<(IpNet, KeyRevision)>,
    },
    /// Claim the next free block, inside the source's ranges.
    Claim { cidrs: Vec<IpNet> },
    /// Claim back a block the store holds but does not list as this node's.
    Reclaim(IpNet),
    /// Give back an empty block (its key as last read or written).
    GiveBack(IpNet, KeyRevision),
}

/// What a sync found: this node's blocks (of the source's CIDRs), by where they stand.
#[derive(Debug, Default)]
pub struct Synced {
    /// This node's, as listed (settled where they were not trusted).
    pub mine: Vec<Block>,
    /// This node's, but their pool is being deleted: in doubt.
    pub in_doubt: Vec<Block>,
    /// This node's, but their pool is gone or made anew: never served again.
    pub orphaned: Vec<Block>,
}

#[derive(Debug)]
pub enum Outcome {
    Synced(Synced),
    Claimed(Block),
    /// No free block: why, with the pool's counts.
    PoolFull(String),
    /// The pool changed since it was read: nothing was claimed.
    PoolChanged,
    /// The pool is not Ready (being created, or being deleted): nothing was claimed; why.
    PoolNotReady(String),
    /// Claimed back: its key now.
    Reclaimed(KeyRevision),
    /// Someone else holds it (a node, or what stands in its key).
    Taken(String),
    /// Given back (false: the key was no longer the one this node created).
    GaveBack(bool),
}

/// What lands.
pub struct Done {
    pub work: Work,
    pub result: Result<Outcome, ClusterError>,
}

/// Where a source's work leaves its [`Done`] (one piece of work at a time per source): the
/// source's own, so that a source replaced meanwhile (its range set rebuilt) takes its
/// work's result with it, and the source that replaced it never takes it for its own (their
/// store calls may have raced; the next sync says what holds).
pub type Inbox = Arc<std::sync::Mutex<Option<Done>>>;

/// The claim that does `work` for `node`'s range set of `pool` (one family, its `cidrs`),
/// its result left in `inbox`.
pub fn run(
    node: Arc<ClusterNode>,
    pool: String,
    family: Family,
    cidrs: Vec<IpNet>,
    inbox: Inbox,
    work: Work,
) -> Claim {
    Box::pin(async move {
        let result = execute(&node, &pool, family, &cidrs, &work).await;
        *inbox.lock().expect("inbox") = Some(Done { work, result });
    })
}

async fn execute(
    node: &ClusterNode,
    pool: &str,
    family: Family,
    cidrs: &[IpNet],
    work: &Work,
) -> Result<Outcome, ClusterError> {
    let me = node.name().to_string();
    let metrics = &node.metrics().cluster;
    match work {
        Work::Sync {
            trusted,
            pins,
            orphaned,
            ..
        } => sync(node, pool, cidrs, trusted, orphaned, *pins).await,
        Work::Claim { cidrs } => {
            let Pool {
                spec,
                revision,
                phase,
            } = node.pool(pool).await?.ok_or_else(|| {
                ClusterError::NotFound(format!(
                    "cluster pool {pool:?} does not exist in {} (ipoolctl cluster pool create)",
                    node.store_name()
                ))
            })?;
            if phase != PoolPhase::Ready {
                metrics.claim(pool, "not_ready");
                return Ok(Outcome::PoolNotReady(not_ready(node, pool, phase)));
            }
            if spec.disabled {
                // As a full pool: looked at again after the exhaustion's wait (the pool as
                // kept, read again when it is written).
                metrics.claim(pool, "disabled");
                return Ok(Outcome::PoolFull(format!(
                    "cluster pool {pool:?} is disabled: no new block is claimed from it (ipoolctl cluster pool enable {pool})"
                )));
            }
            let v4 = family == Family::V4;
            let (s2, n, views) = (spec.clone(), me.clone(), node.views().clone());
            let out = node
                .call("claim", |s| async move {
                    super::claim::claim_next(&*s, &views, &s2, revision, v4, &n).await
                })
                .await;
            let out = match out {
                Ok(o) => o,
                Err(e) => {
                    metrics.claim(pool, "error");
                    return Err(e);
                }
            };
            node.malformed_seen(pool, true, &out.malformed);
            ClusterMetrics::conflict(&metrics.conflicts, pool, "candidate", out.lost as u64);
            if out.pool_changed {
                node.forget_pool(pool);
                metrics.claim(pool, "pool_changed");
                return Ok(Outcome::PoolChanged);
            }
            match out.block {
                Some(b) if !cidrs.iter().any(|c| c.contains(&b.block)) => {
                    // The pool's CIDRs are not (yet) this network's ranges: not a block this
                    // source can use. Given back at once.
                    let given = b.clone();
                    node.call("give_back", |s| async move { s.give_back(&given).await })
                        .await?;
                    node.forget_pool(pool);
                    metrics.claim(pool, "pool_changed");
                    Ok(Outcome::PoolChanged)
                }
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
            let Some(Pool {
                spec,
                revision,
                phase,
            }) = node.pool(pool).await?
            else {
                return Ok(Outcome::Taken(format!(
                    "nobody (cluster pool {pool:?} no longer exists)"
                )));
            };
            if phase != PoolPhase::Ready {
                return Ok(Outcome::PoolNotReady(not_ready(node, pool, phase)));
            }
            let size = match family {
                Family::V4 => spec.block_v4,
                Family::V6 => spec.block_v6,
            };
            if net.prefix_len() != size || !spec.cidrs.iter().any(|c| c.contains(net)) {
                return Ok(Outcome::Taken(format!(
                    "nobody: it is not a block of cluster pool {pool:?} (its blocks are /{size} of {}; the network's pool changed?)",
                    spec.cidrs.iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
                )));
            }
            let (p, n, b) = (pool.to_string(), me.clone(), *net);
            let claimed = node
                .call(
                    "claim",
                    |s| async move { s.claim(&p, revision, &b, &n).await },
                )
                .await?;
            match claimed {
                // Won, or ours all along (claimed before the index: its entry written now).
                Claimed::Won(b) | Claimed::Mine(b) => Ok(Outcome::Reclaimed(b.revision)),
                Claimed::Lost(owner) => Ok(Outcome::Taken(format!("node {owner:?}"))),
                Claimed::PoolChanged => {
                    node.forget_pool(pool);
                    Ok(Outcome::PoolChanged)
                }
                Claimed::NoPool => Ok(Outcome::Taken(format!(
                    "nobody (cluster pool {pool:?} was deleted)"
                ))),
                Claimed::PoolDeleting => {
                    node.forget_pool(pool);
                    Ok(Outcome::PoolNotReady(not_ready(
                        node,
                        pool,
                        PoolPhase::Deleting,
                    )))
                }
            }
        }
        Work::GiveBack(net, revision) => {
            let block = Block {
                pool: pool.to_string(),
                block: *net,
                owner: Owner {
                    node: me.clone(),
                    claimed_at_ms: 0,
                },
                revision: *revision,
            };
            let ours = node
                .call("give_back", |s| async move { s.give_back(&block).await })
                .await?;
            Ok(Outcome::GaveBack(ours))
        }
    }
}

/// This node's blocks of `pool` in `cidrs` (one family's: the source's own), as the store
/// lists them (etcd: its index, each entry checked; malformed keys reported). Those not in
/// `trusted` as listed are settled (written again, conditioned on the write listed): one whose
/// key changed since it was listed is left out, not this node's. Blocks outside `cidrs` are
/// not this source's: another family's source settles its own (settling them here would
/// write every one of them at every resync, and move the revision that source holds).
async fn sync(
    node: &ClusterNode,
    pool: &str,
    cidrs: &[IpNet],
    trusted: &[(IpNet, KeyRevision)],
    orphaned: &[(IpNet, KeyRevision)],
    pins: bool,
) -> Result<Outcome, ClusterError> {
    node.ensure_index().await?;
    if pins {
        // Before the blocks: a block listed is served only with its pins known.
        let listing = node.pins_listing();
        let p = pool.to_string();
        let found = node
            .call("pins", |s| async move { s.pins(Some(&p)).await })
            .await?;
        node.pins_listed(pool, listing, found.into_iter().map(|r| r.pin).collect());
    }
    let (p, n) = (pool.to_string(), node.name().to_string());
    // A sync that trusts nothing (the first of an epoch: the node was away, or the store was
    // reset) reads the store itself; any other reads where the store reads cheapest (on the
    // Kubernetes API the watch cache, where the watch's news come from too). What it does not
    // trust it settles, conditioned on the write listed.
    let routine = !trusted.is_empty();
    let listed = node
        .call("list_blocks", |s| async move {
            match routine {
                true => s.list_own_blocks(Some(&p), &n).await,
                false => s.list_blocks(Some(&p), Some(&n)).await,
            }
        })
        .await?;
    node.malformed_seen(pool, false, &listed.malformed);
    let mut out = Synced::default();
    for mut b in listed.blocks {
        if !cidrs.iter().any(|c| c.contains(&b.block)) {
            continue;
        }
        if orphaned.contains(&(b.block, b.revision))
            && !crate::bugs::on(crate::bugs::Bug::OrphanedResettled)
        {
            out.orphaned.push(b);
            continue;
        }
        if !trusted.contains(&(b.block, b.revision)) && !crate::bugs::on(crate::bugs::Bug::NoSettle)
        {
            let read = b.clone();
            match node
                .call("settle", |s| async move { s.settle(&read).await })
                .await?
            {
                Settled::Mine(now) => b.revision = now,
                Settled::Changed => {
                    tracing::warn!(pool, block = %b.block, store = node.store_name(), "a block in doubt changed in the store since it was listed (a give-back applied late?): not this node's");
                    continue;
                }
                Settled::PoolDeleting(now) => {
                    b.revision = now;
                    out.in_doubt.push(b);
                    continue;
                }
                Settled::PoolGone(now) => {
                    b.revision = now;
                    out.orphaned.push(b);
                    continue;
                }
            }
        }
        out.mine.push(b);
    }
    if pins {
        // Pins known here from before the store was reset (restored from an older backup)
        // that it lacks now, or lacks this node's holds in: made again, as they were, before
        // the blocks serve (a pin in a block of this node's claimed anew since, in it as it
        // stands).
        // Only those it hosts or holds (`ClusterNode::pins_to_assert_here`).
        for pin in node.pins_to_assert_here(pool, &out.mine) {
            assert_pin(node, pin, &out.mine).await?;
        }
    }
    Ok(Outcome::Synced(out))
}

/// Makes `pin`, known here from before the store was reset, again as it was (its holders; in
/// the block of `mine`, this node's as listed, that holds its address, else in the block it
/// names); one the store has again since, for the same owner, gets this node's holds back.
/// A pin this node cannot make (the store has another there, or its block is no longer the
/// one it names and not this node's) is left to the listings, which show what the node
/// whose block it is made.
async fn assert_pin(node: &ClusterNode, pin: Pin, mine: &[Block]) -> Result<(), ClusterError> {
    // Its answers count only if the store is not found reset again meanwhile.
    let resets = node.pins_resets();
    let site = mine
        .iter()
        .find(|b| !pin.set_aside && b.block.contains(&pin.address));
    let want = match site {
        Some(b) => Pin {
            block: b.block,
            block_id: b.revision.create,
            ..pin.clone()
        },
        None => pin.clone(),
    };
    let w = want.clone();
    let created = node
        .call("create_pin", |s| async move { s.create_pin(&w).await })
        .await?;
    match created {
        PinCreated::Created(read) => {
            tracing::warn!(owner = %pin.owner, address = %pin.address, holders = %pin.holders_shown(), "a pin the store lost (reset) made again");
            node.pin_asserted(&read.pin, resets);
        }
        PinCreated::OwnerHas(read) | PinCreated::AddressTaken(read)
            if read.pin.owner == pin.owner && read.pin.address == pin.address =>
        {
            if holds_kept(&pin, &read.pin, node.name()) {
                node.pin_asserted(&read.pin, resets);
                return Ok(());
            }
            // Made again by another node, from what it knew: this node's holds put back.
            let mut held = read.pin.clone();
            for h in pin.holders.iter().filter(|h| h.node == node.name()) {
                if !held
                    .holders
                    .iter()
                    .any(|x| x.node == h.node && x.uid == h.uid)
                {
                    held.holders.push(h.clone());
                }
            }
            let (r, p) = (read.clone(), held);
            let written = node
                .call("write_pin", |s| async move { s.write_pin(&r, &p).await })
                .await?;
            // Not written (changed since): the next sync tries again.
            if let Some(written) = written {
                tracing::warn!(owner = %pin.owner, address = %pin.address, "a pin the store lost (reset), made again elsewhere, holds this node's pod again");
                node.pin_asserted(&written.pin, resets);
            }
        }
        PinCreated::OwnerHas(read) | PinCreated::AddressTaken(read) => {
            tracing::warn!(owner = %pin.owner, address = %pin.address, theirs = %read.pin.owner, their_address = %read.pin.address, "a pin known from before the store's reset conflicts with one the store has now: the store's stands");
            node.pin_unasserted_since(&pin, resets);
        }
        PinCreated::BlockChanged => {
            tracing::warn!(owner = %pin.owner, address = %pin.address, block = %pin.block, "a pin known from before the store's reset names a block that is no longer the one it was made in, nor this node's: left to the node whose block it is");
            node.pin_unasserted_since(&pin, resets);
        }
    }
    Ok(())
}

/// Why nothing is claimed from pool `pool` in `phase`.
fn not_ready(node: &ClusterNode, pool: &str, phase: PoolPhase) -> String {
    match phase {
        PoolPhase::Deleting => format!(
            "cluster pool {pool:?} is being deleted (in {}): no block is claimed from it until the deletion is done or refused",
            node.store_name()
        ),
        _ => format!(
            "cluster pool {pool:?} is being created (in {}, {}): no block is claimed from it before it is Ready",
            node.store_name(),
            phase.as_str()
        ),
    }
}
