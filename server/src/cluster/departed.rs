//! Departed nodes released by themselves (`[cluster] release_departed_after_secs`): one daemon
//! of the cluster at a time (the lead of [`ROLE`], [`LeadStore`](super::datastore::LeadStore)) looks now and then at the
//! nodes that own blocks. A node whose Node object the apiserver no longer has (a 404 on a
//! read of it, not merely missing from a list, and never NotReady) and whose name the store
//! shows away past its fence and `release_departed_after_secs` gets its blocks given back by
//! [`release_node`] without `force`: the same judgement, the same conditioned writes as
//! `ipoolctl cluster release-node`, so a node that comes back meanwhile keeps its blocks. The
//! lead saves work; it is not what keeps a release safe.
//!
//! The Nodes come from a [`NodeDirectory`] (ipoold's: the apiserver, `k8s::nodes`): cluster
//! mode knows nothing of Kubernetes' client.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::datastore::Datastore;
use super::model::ClusterError;
use super::node::ClusterNode;
use super::release::{not_gone, release_node, Released};

/// The lead's role: `leaders/release-departed` in etcd, Lease `ipool.release-departed`.
pub const ROLE: &str = "release-departed";

/// Where the cluster's Nodes are (the apiserver).
#[async_trait::async_trait]
pub trait NodeDirectory: Send + Sync {
    /// The Nodes' names now (one list).
    async fn names(&self) -> Result<BTreeSet<String>, String>;
    /// Whether Node `name` exists now (a read of it: false only when it is not found).
    async fn exists(&self, name: &str) -> Result<bool, String>;
}

/// What a look found of one node that owns blocks and whose Node is gone.
#[derive(Debug)]
pub enum Outcome {
    /// Its blocks were given back.
    Released(Released),
    /// Not yet: the store does not show it away long enough (why).
    Waiting(String),
    /// release-node refused (it came back, the store cannot tell): why.
    Refused(String),
    /// A read or write failed: tried again at the next look.
    Failed(String),
}

/// How often the leader looks, for a threshold of `after` seconds: a sixth of it, between a
/// second and five minutes.
pub fn every(after: u64) -> Duration {
    Duration::from_secs((after / 6).clamp(1, 300))
}

/// How often, at most, a daemon that does not lead asks for the lead.
const CANDIDATE_EVERY: Duration = Duration::from_secs(30);

/// The lead's TTL: three looks, at least 15 s.
pub fn lead_ttl(every: Duration) -> u64 {
    (every.as_secs() * 3).max(15)
}

/// One look, by `me` (a daemon's node, never released by its own look; None: `ipoolctl
/// cluster release-departed`): each node that owns a block and whose Node is gone, judged
/// and, when gone long enough, released.
pub async fn sweep(
    store: &dyn Datastore,
    place: &str,
    me: Option<&str>,
    after: u64,
    nodes: &dyn NodeDirectory,
) -> Result<Vec<(String, Outcome)>, ClusterError> {
    let listing = store.list_blocks(None, None).await?;
    let owners: BTreeSet<String> = listing
        .blocks
        .iter()
        .map(|b| b.owner.node.clone())
        .filter(|n| Some(n.as_str()) != me)
        .collect();
    if owners.is_empty() {
        return Ok(Vec::new());
    }
    let known = nodes
        .names()
        .await
        .map_err(|e| ClusterError::Refused(format!("the Nodes could not be listed: {e}")))?;
    let mut found = Vec::new();
    for node in owners.difference(&known) {
        // Listed before the blocks were, say: a read of it decides.
        match nodes.exists(node).await {
            Ok(false) => {}
            Ok(true) => continue,
            Err(e) => {
                found.push((
                    node.clone(),
                    Outcome::Failed(format!("reading its Node: {e}")),
                ));
                continue;
            }
        }
        // A daemon reads first (its own Lease is its clock on the apiserver): a node away too
        // briefly costs no write. ipoolctl has no Lease: release-node's judgement alone.
        let waiting = match me {
            None => Ok(None),
            Some(me) => store
                .node_away(node, me)
                .await
                .map(|state| not_gone(&state, place, node, after)),
        };
        let outcome = match waiting {
            Err(e) => Outcome::Failed(e.to_string()),
            Ok(Some(why)) => Outcome::Waiting(why),
            Ok(None) => match release_node(&*store.releasing(), place, node, after, false).await {
                Ok(r) => Outcome::Released(r),
                Err(ClusterError::Refused(why)) => Outcome::Refused(why),
                Err(e) => Outcome::Failed(e.to_string()),
            },
        };
        found.push((node.clone(), outcome));
    }
    Ok(found)
}

/// ipoold's part: leads when it can, looks every [`every`] (jittered), until the daemon
/// stops. Each node released is logged and counted (`ipool_cluster_nodes_released_total`).
pub async fn run(node: Arc<ClusterNode>, nodes: Arc<dyn NodeDirectory>) {
    let after = node.settings().release_departed_after_secs;
    let every = every(after);
    let ttl = lead_ttl(every);
    let place = node.store_name();
    tracing::info!(after_secs = after, every_secs = every.as_secs(), "departed nodes are released by themselves: a node whose Node is gone and whose daemon has been away this long (and past its fence) gets its blocks given back by whichever daemon leads");
    let mut leading = false;
    let mut told: HashSet<String> = HashSet::new();
    let mut lead_error: Option<String> = None;
    // The first look comes soon: daemons started together settle who leads.
    let mut first = true;
    loop {
        // A daemon that does not lead asks for the lead at most every 30 s: with thousands of
        // nodes and a short threshold, the store still sees few of these reads.
        let wait = match leading || std::mem::take(&mut first) {
            true => every,
            false => every.max(CANDIDATE_EVERY),
        };
        tokio::time::sleep(super::jitter(wait)).await;
        let store = match node.connection().await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "release of departed nodes: no store connection");
                continue;
            }
        };
        let leads = match store.lead(ROLE, node.name(), ttl).await {
            Ok(l) => {
                lead_error = None;
                l
            }
            Err(e) => {
                // Said once per kind of failure (a store that refuses the lead's writes, say).
                let e = e.to_string();
                if lead_error.as_ref() != Some(&e) {
                    tracing::warn!(error = %e, "release of departed nodes: the lead could not be taken or kept (tried again)");
                    lead_error = Some(e);
                }
                false
            }
        };
        if leads != leading {
            tracing::info!(node = %node.name(), leads, "the lead of the release of departed nodes");
            leading = leads;
            node.metrics().cluster.departed_leader.set(i64::from(leads));
        }
        if !leads {
            continue;
        }
        match sweep(&*store, place, Some(node.name()), after, &*nodes).await {
            Err(e) => {
                tracing::warn!(error = %e, "release of departed nodes: the look failed (tried again)")
            }
            Ok(found) => report(&node, found, &mut told),
        }
    }
}

fn report(node: &ClusterNode, found: Vec<(String, Outcome)>, told: &mut HashSet<String>) {
    let now: HashSet<&String> = found.iter().map(|(n, _)| n).collect();
    told.retain(|n| now.contains(n));
    for (departed, outcome) in &found {
        match outcome {
            Outcome::Released(r) => {
                node.metrics().cluster.nodes_released.inc();
                told.remove(departed);
                let blocks: Vec<String> = r.blocks.iter().map(|b| b.block.to_string()).collect();
                tracing::info!(departed = %departed, given_back = ?blocks, kept_pinned = r.pinned.len(), holds_ended = r.unheld.len(), "released a departed node: its Node is gone and its daemon away past the threshold");
            }
            Outcome::Waiting(why) if told.insert(departed.clone()) => {
                tracing::info!(departed = %departed, why = %why, "a node's Node is gone: its blocks are released once its daemon has been away long enough");
            }
            Outcome::Waiting(_) => {}
            Outcome::Refused(why) => {
                tracing::info!(departed = %departed, why = %why, "a departed node's release was refused (tried again at the next look)");
            }
            Outcome::Failed(why) => {
                tracing::warn!(departed = %departed, error = %why, "a departed node's release failed (tried again at the next look)");
            }
        }
    }
}
