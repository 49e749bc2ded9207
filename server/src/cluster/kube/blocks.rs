//! Blocks on the apiserver: listed by label (a node's own, a pool's), claimed with a create
//! and then checked against the pool, given back with a delete on the uid and resourceVersion
//! listed, settled with an update on the resourceVersion listed.

use ipnet::IpNet;
use kube::api::{DeleteParams, ListParams, Preconditions};
use serde_json::json;

use super::objects::{self, hash, new_block, parse_block};
use super::{api_code, KubeStore, NODE_LABEL, PAGE, POOL_LABEL};
use crate::cluster::datastore::BlockStore;
use crate::cluster::vocab::{now_ms, Block, Claimed, ClusterError, Listing, PoolPhase, Settled};

/// A block's pool, read again.
enum PoolNow {
    /// Ready, the one the block was claimed from, and the block may be claimed there.
    Same,
    /// Being deleted, or the block's CIDR on its way in or out of the pool: in doubt (the
    /// deletion or removal may yet be refused).
    Deleting,
    /// Deleted.
    Gone,
    /// Made anew (another uid), or not Ready.
    Changed,
    /// The same pool, but the block lies in none of its CIDRs now.
    Outside,
}

/// Creates that find the block taken and then gone again before they can read its owner.
const CLAIM_ATTEMPTS: usize = 3;

impl KubeStore {
    /// Pool `pool` now, against the one whose uid hashes to `revision`, for `block`.
    async fn pool_verdict(
        &self,
        pool: &str,
        revision: i64,
        block: &IpNet,
    ) -> Result<PoolNow, ClusterError> {
        self.token().await;
        let now = self.pools.get_opt(pool).await?;
        Ok(match now.as_ref().map(|p| (objects::parse_pool(p), p)) {
            None => PoolNow::Gone,
            Some((Ok((spec, phase)), p))
                if hash(p.metadata.uid.as_deref().unwrap_or("")) == revision =>
            {
                match phase {
                    PoolPhase::Ready if spec.claimable(block) => PoolNow::Same,
                    PoolPhase::Ready if spec.cidrs.iter().any(|c| c.contains(block)) => {
                        PoolNow::Deleting
                    }
                    PoolPhase::Ready => PoolNow::Outside,
                    PoolPhase::Deleting => PoolNow::Deleting,
                    // Never back to Pending once Ready: not the pool it was claimed from.
                    PoolPhase::Pending => PoolNow::Changed,
                }
            }
            Some(_) => PoolNow::Changed,
        })
    }
}

#[async_trait::async_trait]
impl BlockStore for KubeStore {
    /// Blocks carry their node's label from their creation: nothing to index.
    async fn ensure_index(&self, _node: &str) -> Result<usize, ClusterError> {
        Ok(0)
    }

    /// Owned blocks, of one pool and/or one node (by their labels), read in pages.
    async fn list_blocks(
        &self,
        pool: Option<&str>,
        node: Option<&str>,
    ) -> Result<Listing, ClusterError> {
        self.list_labelled(pool, node, false).await
    }

    /// From the apiserver's watch cache (`resourceVersion=0`): see the trait.
    async fn list_own_blocks(
        &self,
        pool: Option<&str>,
        node: &str,
    ) -> Result<Listing, ClusterError> {
        self.list_labelled(pool, Some(node), true).await
    }

    /// Claims `block` of `pool` for `node`: created if no one has it, then kept only while the
    /// pool is still Ready and the one read at `pool_revision` (else given back at once).
    async fn claim(
        &self,
        pool: &str,
        pool_revision: i64,
        block: &IpNet,
        node: &str,
    ) -> Result<Claimed, ClusterError> {
        let obj = new_block(pool, pool_revision, block, node, now_ms());
        let mut claimed = None;
        for _ in 0..CLAIM_ATTEMPTS {
            self.token().await;
            match self.blocks.create(&self.post(), &obj).await {
                Ok(created) => {
                    claimed = Some(Claimed::Won(parse_block(&created).map_err(|m| {
                        ClusterError::Malformed {
                            what: "block, as created",
                            key: m.key,
                            why: m.why,
                        }
                    })?));
                    break;
                }
                Err(e) if api_code(&e) == Some(409) => {}
                Err(e) => return Err(e.into()),
            }
            self.token().await;
            let Some(theirs) = self.blocks.get_opt(&objects::block_name(block)).await? else {
                // Given back between the create and the read: try again.
                continue;
            };
            claimed = Some(match parse_block(&theirs) {
                Ok(b) if b.owner.node == node && b.pool == pool => match self.settle(&b).await? {
                    Settled::Mine(revision) => Claimed::Mine(Block { revision, ..b }),
                    Settled::PoolDeleting(_) => return Ok(Claimed::PoolDeleting),
                    Settled::PoolGone(_) => return Ok(Claimed::NoPool),
                    Settled::Changed => continue,
                },
                Ok(b) => Claimed::Lost(b.owner.node),
                Err(m) => Claimed::Lost(format!("a malformed block ({m})")),
            });
            break;
        }
        let claimed = claimed.unwrap_or_else(|| {
            Claimed::Lost("another node (the block kept changing hands)".into())
        });
        let (Claimed::Won(_) | Claimed::Mine(_)) = &claimed else {
            return Ok(claimed);
        };
        // The pool, read after the create: a deletion that listed no block before it finds the
        // pool Deleting now, a pool made anew has another uid.
        if crate::bugs::on(crate::bugs::Bug::ClaimOnStalePool) {
            return Ok(claimed);
        }
        let verdict = match self.pool_verdict(pool, pool_revision, block).await? {
            PoolNow::Same => return Ok(claimed),
            PoolNow::Deleting => Claimed::PoolDeleting,
            PoolNow::Gone => Claimed::NoPool,
            PoolNow::Changed | PoolNow::Outside => Claimed::PoolChanged,
        };
        // A block created now holds nothing: given back at once. One that was this node's
        // already may hold addresses in use: left as it is (its node's syncs settle it).
        if let Claimed::Won(b) = &claimed {
            self.give_back(b).await?;
        }
        Ok(verdict)
    }

    /// Gives `b` back if it is still the write `b.revision` names (read, then deleted on its
    /// uid and resourceVersion: a delete that arrives late finds another resourceVersion).
    async fn give_back(&self, b: &Block) -> Result<bool, ClusterError> {
        let name = objects::block_name(&b.block);
        self.token().await;
        let Some(now) = self.blocks.get_opt(&name).await? else {
            return Ok(false);
        };
        if objects::revision(&now.metadata) != b.revision {
            return Ok(false);
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: now.metadata.uid.clone(),
                // The bug, put back: the block's creation (its uid) alone.
                resource_version: match crate::bugs::on(crate::bugs::Bug::GiveBackOnCreation) {
                    true => None,
                    false => now.metadata.resource_version.clone(),
                },
            }),
            ..DeleteParams::default()
        };
        self.token().await;
        match self.blocks.delete(&name, &params).await {
            Ok(_) => Ok(true),
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes `b` again (its `settledAtMs`), on the resourceVersion listed, then reads its
    /// pool (see [`Settled`]).
    async fn settle(&self, b: &Block) -> Result<Settled, ClusterError> {
        let name = objects::block_name(&b.block);
        self.token().await;
        let Some(mut now) = self.blocks.get_opt(&name).await? else {
            return Ok(Settled::Changed);
        };
        if objects::revision(&now.metadata) != b.revision {
            return Ok(Settled::Changed);
        }
        // A write that changes nothing is not a write: the apiserver keeps the resourceVersion.
        let last = now.data["spec"]["settledAtMs"].as_u64().unwrap_or(0);
        now.data["spec"]["settledAtMs"] = json!(now_ms().max(last + 1));
        self.token().await;
        let written = match self.blocks.replace(&name, &self.post(), &now).await {
            Ok(w) => w,
            Err(e) if matches!(api_code(&e), Some(404 | 409)) => return Ok(Settled::Changed),
            Err(e) => return Err(e.into()),
        };
        let revision = objects::revision(&written.metadata);
        // Its pool, read after the write: a block left behind by a claim whose pool was being
        // deleted (its give-back failed, its daemon was killed, its create arrived late) is
        // never served (a deletion that listed no block saw none of it). A pool being deleted
        // is in doubt: the deletion may still see this block and be refused.
        if crate::bugs::on(crate::bugs::Bug::BlockOutlivesPool) {
            return Ok(Settled::Mine(revision));
        }
        let from = objects::pool_revision_of(&written).unwrap_or(0);
        Ok(match self.pool_verdict(&b.pool, from, &b.block).await? {
            PoolNow::Same => Settled::Mine(revision),
            // The bug, put back: a pool being deleted counted as gone, and the store gave the block
            // back there and then.
            PoolNow::Deleting if crate::bugs::on(crate::bugs::Bug::DeletingIsGone) => {
                self.give_back(&Block {
                    revision,
                    ..b.clone()
                })
                .await?;
                Settled::Changed
            }
            PoolNow::Deleting => Settled::PoolDeleting(revision),
            PoolNow::Gone | PoolNow::Changed | PoolNow::Outside => Settled::PoolGone(revision),
        })
    }
}

impl KubeStore {
    /// Blocks by their labels (pool, node), read in pages; `cached`: from the apiserver's
    /// watch cache (`resourceVersion=0`, not older than any: one answer, no etcd read).
    async fn list_labelled(
        &self,
        pool: Option<&str>,
        node: Option<&str>,
        cached: bool,
    ) -> Result<Listing, ClusterError> {
        let mut selector = Vec::new();
        if let Some(p) = pool {
            selector.push(format!("{POOL_LABEL}={p}"));
        }
        if let Some(n) = node {
            selector.push(format!("{NODE_LABEL}={n}"));
        }
        // From the watch cache in one answer (it does not page; a node's own blocks are few),
        // else from etcd in pages.
        let mut params = match cached {
            true => ListParams::default().match_any(),
            false => ListParams::default().limit(PAGE),
        };
        if !selector.is_empty() {
            params = params.labels(&selector.join(","));
        }
        let mut out = Listing::default();
        loop {
            self.token().await;
            let page = self.blocks.list(&params).await?;
            for obj in &page.items {
                match parse_block(obj) {
                    Ok(b) => out.blocks.push(b),
                    Err(m) => out.malformed.push(m),
                }
            }
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(next) => {
                    // A continued list names no resourceVersion (the token carries it).
                    params = params.continue_token(&next);
                    params.resource_version = None;
                    params.version_match = None;
                }
                None => return Ok(out),
            }
        }
    }
}
