//! Claiming a node's next block, in either store: the node's view of a pool's blocks, kept
//! between claims.
//!
//! The view is read in pages (no answer grows with the pool). A claim tries the free blocks of
//! the view in the node's order, one claim each ([`BlockStore::claim`]: etcd's create-if-absent
//! transaction, the apiserver's create), conditioned on the pool as it was read: the store
//! decides, so a stale view
//! costs a lost candidate, never a second owner, and a pool created anew (other block sizes)
//! is read again before anything is claimed from it. The view is read again only when it is
//! older than [`VIEW_MAX_AGE`], after [`STALE_LOSSES`] candidates in a row were lost, or before
//! the pool is said to have no free block; so a claim is usually one transaction, however many
//! blocks the pool has.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::cidrset::CidrSet;
use super::datastore::BlockStore;
use super::ippool::PoolSpec;
use super::vocab::{Block, Claimed, ClusterError, MalformedKey};

/// A view older than this is listed again before a claim.
const VIEW_MAX_AGE: Duration = Duration::from_secs(60);
/// Lost candidates in a row that make a kept view list again.
const STALE_LOSSES: usize = 4;

/// Views by (pool, IPv4?, node).
pub type Views = Arc<Mutex<HashMap<(String, bool, String), View>>>;

/// What a node knows of one family of a pool's blocks.
pub struct View {
    spec: PoolSpec,
    /// The pool key's revision the spec was read at: every claim is conditioned on it.
    revision: i64,
    sets: Vec<CidrSet>,
    listed_at: Instant,
    excluded: usize,
    owned_here: usize,
    owned_elsewhere: usize,
    malformed: Vec<MalformedKey>,
}

impl View {
    fn occupy(&mut self, block: ipnet::IpNet) {
        for s in self.sets.iter_mut() {
            s.occupy(block);
        }
    }
}

/// What [`claim_next`] found and got.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimOutcome {
    /// The block won, if any.
    pub block: Option<Block>,
    /// Candidates another node won first.
    pub lost: usize,
    /// The pool is no longer as it was read (deleted, or created anew): nothing was claimed;
    /// read it again.
    pub pool_changed: bool,
    /// Keys of the pool that name no owner (counted as occupied), from the last listing.
    pub malformed: Vec<MalformedKey>,
    /// The pool's blocks of the family, and of them: touched by an excluded range, owned by
    /// other nodes, by this node (as this node knows them; from a fresh listing when no block
    /// was won).
    pub blocks: usize,
    pub excluded: usize,
    pub owned_elsewhere: usize,
    pub owned_here: usize,
}

enum Try {
    Won(Block),
    /// The pool changed since it was read.
    PoolChanged,
    /// Too many candidates lost: the view is stale.
    Stale,
    /// No free block in the view.
    Full,
}

/// Claims the first free block of `pool` (read at `revision`) in `node`'s order (see
/// [`CidrSet::free_in_order`]), for the CIDRs of one family (`v4`): blocks others won
/// meanwhile are skipped. No block in the outcome: the pool has no free block of that
/// family (checked on a fresh listing), or it changed since it was read (`pool_changed`).
pub async fn claim_next<S: BlockStore + ?Sized>(
    store: &S,
    views: &Views,
    pool: &PoolSpec,
    revision: i64,
    v4: bool,
    node: &str,
) -> Result<ClaimOutcome, ClusterError> {
    let key = (pool.name.clone(), v4, node.to_string());
    let kept = views
        .lock()
        .expect("views mutex poisoned")
        .remove(&key)
        .filter(|v| {
            v.spec == *pool && v.revision == revision && v.listed_at.elapsed() < VIEW_MAX_AGE
        });
    let (mut view, mut fresh) = match kept {
        Some(v) => (v, false),
        None => (view_of(store, pool, revision, v4, node).await?, true),
    };
    let mut lost = 0;
    let mut pool_changed = false;
    let won = loop {
        match try_view(store, &mut view, node, fresh, &mut lost).await? {
            Try::Won(b) => break Some(b),
            Try::PoolChanged => {
                pool_changed = true;
                break None;
            }
            Try::Full if fresh => break None,
            Try::Stale | Try::Full => {
                view = view_of(store, pool, revision, v4, node).await?;
                fresh = true;
            }
        }
    };
    let out = ClaimOutcome {
        block: won,
        lost,
        pool_changed,
        malformed: view.malformed.clone(),
        blocks: view.sets.iter().map(|s| s.len()).sum(),
        excluded: view.excluded,
        owned_elsewhere: view.owned_elsewhere,
        owned_here: view.owned_here,
    };
    if !pool_changed {
        views
            .lock()
            .expect("views mutex poisoned")
            .insert(key, view);
    }
    Ok(out)
}

/// A full listing of `pool`'s blocks of one family, as `node` sees them.
async fn view_of<S: BlockStore + ?Sized>(
    store: &S,
    pool: &PoolSpec,
    revision: i64,
    v4: bool,
    node: &str,
) -> Result<View, ClusterError> {
    let mut sets = pool.carve().map_err(ClusterError::from)?;
    sets.retain(|s| s.cidr().addr().is_ipv4() == v4);
    let listed_at = Instant::now();
    // Read in pages: no answer grows with the pool.
    let listed = store.list_blocks(Some(&pool.name), None).await?;
    let mut view = View {
        spec: pool.clone(),
        revision,
        excluded: sets.iter().map(|s| s.used()).sum(),
        sets,
        listed_at,
        owned_here: 0,
        owned_elsewhere: 0,
        malformed: Vec::new(),
    };
    // A key that names a block but no owner: occupied by someone nobody can name.
    for m in listed.malformed {
        if let Some(b) = m.block {
            if view.sets.iter().any(|s| s.cidr().contains(&b)) {
                view.occupy(b);
                view.owned_elsewhere += 1;
            }
        }
        view.malformed.push(m);
    }
    for b in listed.blocks {
        if !view.sets.iter().any(|s| s.cidr().contains(&b.block)) {
            continue;
        }
        view.occupy(b.block);
        match b.owner.node == node {
            true => view.owned_here += 1,
            false => view.owned_elsewhere += 1,
        }
    }
    Ok(view)
}

/// Tries the view's free blocks in `node`'s order; what was lost or won is recorded in
/// the view. A kept (not `fresh`) view gives up after [`STALE_LOSSES`] losses.
async fn try_view<S: BlockStore + ?Sized>(
    store: &S,
    view: &mut View,
    node: &str,
    fresh: bool,
    lost: &mut usize,
) -> Result<Try, ClusterError> {
    let mut losses = Vec::new();
    let mut result = Try::Full;
    'sets: for s in &view.sets {
        for block in s.free_in_order(node) {
            match store
                .claim(&view.spec.name, view.revision, &block, node)
                .await?
            {
                Claimed::Won(b) | Claimed::Mine(b) => {
                    result = Try::Won(b);
                    break 'sets;
                }
                Claimed::Lost(_) => {
                    *lost += 1;
                    losses.push(block);
                    if !fresh && losses.len() >= STALE_LOSSES {
                        result = Try::Stale;
                        break 'sets;
                    }
                }
                Claimed::NoPool => {
                    return Err(ClusterError::NotFound(format!(
                        "pool {:?} was deleted",
                        view.spec.name
                    )))
                }
                // Read again before anything more is claimed (and then seen as not Ready).
                Claimed::PoolChanged | Claimed::PoolDeleting => {
                    result = Try::PoolChanged;
                    break 'sets;
                }
            }
        }
    }
    view.owned_elsewhere += losses.len();
    for b in losses {
        view.occupy(b);
    }
    if let Try::Won(b) = &result {
        view.occupy(b.block);
        view.owned_here += 1;
    }
    Ok(result)
}
