//! Departed nodes released by themselves (`[cluster] release_departed_after_secs`): one daemon
//! of the cluster at a time (the lead of [`ROLE`], [`LeadStore`](super::datastore::LeadStore))
//! looks now and then at the nodes that own blocks. A node whose Node object the apiserver no
//! longer has (a 404 on a read of it, not merely missing from a list, and never NotReady) and
//! whose name the store shows away past its fence and `release_departed_after_secs` gets its
//! blocks given back by [`release_node`] without `force`: the same judgement, the same
//! conditioned writes as `ipoolctl cluster release-node`, so a node that comes back meanwhile
//! keeps its blocks. The lead saves work; it is not what keeps a release safe.
//!
//! A node is judged by the Node its daemon recorded with its name in the store
//! ([`NodeSeen::k8s_node`]: the names may differ); one whose daemon recorded none is left to
//! the operator. The blocks a release keeps because pins were made in them go back once those
//! pins end: [`pins`] ends the pins nobody holds whose owner has been gone `pin_ttl_secs`, in
//! the blocks of every node whose daemon does not hold its name (a live node's own keeper
//! ends those of its blocks).
//!
//! The Nodes and the pins' owners come from a [`Directory`] (ipoold's: the apiserver,
//! `k8s::nodes`): cluster mode knows nothing of Kubernetes' client.
//!
//! # Layout
//! - [`pins`]: the pins that keep a departed node's blocks.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::datastore::Datastore;
use super::node::ClusterNode;
use super::pin::PinOwner;
use super::release::{not_gone, release_node, Released};
use super::vocab::{ClusterError, LookupFailed, NodeSeen};

pub mod pins;

/// The lead's role: `leaders/release-departed` in etcd, Lease `ipool.release-departed`.
pub const ROLE: &str = "release-departed";

/// Where the cluster's Nodes and the pins' owners are (the apiserver).
#[async_trait::async_trait]
pub trait Directory: Send + Sync {
    /// The Nodes' names now (one list).
    async fn names(&self) -> Result<BTreeSet<String>, LookupFailed>;
    /// Whether Node `name` exists now (a read of it: false only when it is not found).
    async fn exists(&self, name: &str) -> Result<bool, LookupFailed>;
    /// Why `owner` (a StatefulSet's ordinal, a VM) is gone, if it is; None: it is there.
    async fn owner_gone(&self, owner: &PinOwner) -> Result<Option<String>, LookupFailed>;
}

/// How a look judges: the release's threshold, and how long a pin's owner stays gone before
/// the pin ends.
#[derive(Clone, Copy, Debug)]
pub struct Thresholds {
    /// `release_departed_after_secs`.
    pub after: u64,
    /// `pin_ttl_secs`.
    pub pin_ttl: u64,
}

/// What a look found of one node that owns blocks and whose Node is gone.
#[derive(Debug)]
pub enum Outcome {
    /// Blocks were given back, or holds ended.
    Released(Released),
    /// Nothing was freed: every block it owns holds a pin (they go back once their pins
    /// end: see what the look said of the pins).
    Kept(Released),
    /// Not yet: the store does not show it away long enough (why).
    Waiting(String),
    /// release-node refused (it came back, the store cannot tell): why.
    Refused(String),
    /// A read or write failed: tried again at the next look.
    Failed(String),
    /// Its daemon recorded no Node name: whether it is gone cannot be told (why).
    Unknown(String),
}

/// What one look did.
#[derive(Debug, Default)]
pub struct Look {
    /// Each node that owns blocks and is not alive, judged.
    pub nodes: Vec<(String, Outcome)>,
    /// Each pin nobody holds in the blocks of a node that is not alive.
    pub pins: Vec<pins::PinOutcome>,
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
/// cluster release-departed`): the pins nobody holds in the blocks of nodes not alive, ended
/// once their owners are gone long enough; then each node that owns a block and whose Node is
/// gone, judged and, when gone long enough, released.
pub async fn sweep(
    store: &dyn Datastore,
    place: &str,
    me: Option<&str>,
    limits: Thresholds,
    dir: &dyn Directory,
) -> Result<Look, ClusterError> {
    let listing = store.list_blocks(None, None).await?;
    let pins = store.pins(None).await?;
    // The nodes that own blocks, and those that hold pins (an address set aside lies in no
    // block; a pod's address may lie in another node's block): a departed node's holds end
    // with its release, or the pins of owners gone since would never end.
    let holders = pins
        .iter()
        .flat_map(|p| p.pin.holders.iter().map(|h| h.node.clone()))
        .filter(|_| !crate::bugs::on(crate::bugs::Bug::HoldersNotDeparted));
    let owners: BTreeSet<String> = listing
        .blocks
        .iter()
        .map(|b| b.owner.node.clone())
        .chain(holders)
        .filter(|n| Some(n.as_str()) != me)
        .collect();
    let mut look = Look::default();
    let seen: BTreeMap<String, NodeSeen> = match owners.is_empty() {
        true => BTreeMap::new(),
        false => store
            .nodes_seen()
            .await?
            .into_iter()
            .map(|s| (s.node.clone(), s))
            .collect(),
    };
    // Nodes whose daemon holds their name are not looked at (their keepers keep their pins).
    let away: BTreeSet<&String> = owners
        .iter()
        .filter(|n| seen.get(*n).is_none_or(|s| s.alive.is_none()))
        .collect();
    // Pins of addresses set aside lie in no block, and only a node that held one knows it:
    // every look judges those nobody holds, away nodes or not.
    look.pins = pins::end_gone(store, pins, &listing.blocks, &away, limits.pin_ttl, dir).await;
    if away.is_empty() {
        return Ok(look);
    }
    let known = dir
        .names()
        .await
        .map_err(|e| ClusterError::Refused(format!("the Nodes could not be listed: {e}")))?;
    for node in away {
        let Some(k8s) = seen.get(node).and_then(|s| s.k8s_node.clone()) else {
            look.nodes.push((
                node.clone(),
                Outcome::Unknown(format!(
                    "node {node:?}'s daemon recorded no Node name in {place} (an ipoold without --node-name, or one older than the record; or away longer than the store keeps its record): whether it is gone is not judged here; ipoolctl cluster release-node releases it"
                )),
            ));
            continue;
        };
        if known.contains(&k8s) {
            continue;
        }
        // Listed before the blocks were, say: a read of it decides.
        match dir.exists(&k8s).await {
            Ok(false) => {}
            Ok(true) => continue,
            Err(e) => {
                look.nodes.push((
                    node.clone(),
                    Outcome::Failed(format!("reading its Node {k8s:?}: {e}")),
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
                .map(|state| not_gone(&state, place, node, limits.after)),
        };
        let outcome = match waiting {
            Err(e) => Outcome::Failed(e.to_string()),
            Ok(Some(why)) => Outcome::Waiting(why),
            Ok(None) => {
                let released =
                    release_node(&*store.releasing(), place, node, limits.after, false).await;
                match released {
                    Ok(r) if r.blocks.is_empty() && r.unheld.is_empty() => Outcome::Kept(r),
                    Ok(r) => Outcome::Released(r),
                    Err(ClusterError::Refused(why)) => Outcome::Refused(why),
                    Err(e) => Outcome::Failed(e.to_string()),
                }
            }
        };
        look.nodes.push((node.clone(), outcome));
    }
    Ok(look)
}

/// ipoold's part: leads when it can, looks every [`every`] (jittered), until the daemon
/// stops. Each node released is logged and counted (`ipool_cluster_nodes_released_total`),
/// as is each pin ended for want of its owner.
pub async fn run(node: Arc<ClusterNode>, dir: Arc<dyn Directory>) {
    let limits = Thresholds {
        after: node.settings().release_departed_after_secs,
        pin_ttl: node.settings().pin_ttl_secs,
    };
    let every = every(limits.after);
    let ttl = lead_ttl(every);
    let place = node.store_name();
    tracing::info!(after_secs = limits.after, every_secs = every.as_secs(), "departed nodes are released by themselves: a node whose Node is gone and whose daemon has been away this long (and past its fence) gets its blocks given back by whichever daemon leads");
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
        match sweep(&*store, place, Some(node.name()), limits, &*dir).await {
            Err(e) => {
                tracing::warn!(error = %e, "release of departed nodes: the look failed (tried again)")
            }
            Ok(look) => report(&node, look, &mut told),
        }
    }
}

/// Logs what a look did (each wait and each kept node once, until it changes) and counts
/// the releases.
fn report(node: &ClusterNode, look: Look, told: &mut HashSet<String>) {
    let now: HashSet<String> = look
        .nodes
        .iter()
        .map(|(n, _)| n.clone())
        .chain(look.pins.iter().map(|p| p.pin().address.to_string()))
        .collect();
    told.retain(|n| now.contains(n));
    for p in &look.pins {
        let pin = p.pin();
        match p {
            pins::PinOutcome::Ended { why, .. } => {
                node.metrics().cluster.pins_ended.inc();
                tracing::info!(owner = %pin.owner, address = %pin.address, block = %pin.block, why = %why, "a pin in a departed node's block ended: its owner is gone");
            }
            pins::PinOutcome::Waiting { why, .. } if told.insert(pin.address.to_string()) => {
                tracing::info!(owner = %pin.owner, address = %pin.address, block = %pin.block, why = %why, "a pin keeps a departed node's block");
            }
            pins::PinOutcome::Waiting { .. } => {}
            pins::PinOutcome::Failed { why, .. } => {
                tracing::warn!(owner = %pin.owner, address = %pin.address, error = %why, "a pin in a departed node's block: its owner could not be judged (tried again at the next look)");
            }
        }
    }
    for (departed, outcome) in &look.nodes {
        match outcome {
            Outcome::Released(r) => {
                node.metrics().cluster.nodes_released.inc();
                told.remove(departed);
                let blocks: Vec<String> = r.blocks.iter().map(|b| b.block.to_string()).collect();
                tracing::info!(departed = %departed, given_back = ?blocks, kept_pinned = r.pinned.len(), holds_ended = r.unheld.len(), "released a departed node: its Node is gone and its daemon away past the threshold");
            }
            Outcome::Kept(r) if told.insert(departed.clone()) => {
                let blocks: Vec<String> = r.pinned.iter().map(|b| b.block.to_string()).collect();
                tracing::info!(departed = %departed, kept = ?blocks, "a departed node keeps only blocks pins were made in: they go back once those pins end (their owners gone for pin_ttl_secs, or ipoolctl cluster unpin)");
            }
            Outcome::Waiting(why) | Outcome::Unknown(why) if told.insert(departed.clone()) => {
                tracing::info!(departed = %departed, why = %why, "a node that owns blocks is not released yet");
            }
            Outcome::Kept(_) | Outcome::Waiting(_) | Outcome::Unknown(_) => {}
            Outcome::Refused(why) => {
                tracing::info!(departed = %departed, why = %why, "a departed node's release was refused (tried again at the next look)");
            }
            Outcome::Failed(why) => {
                tracing::warn!(departed = %departed, error = %why, "a departed node's release failed (tried again at the next look)");
            }
        }
    }
}
