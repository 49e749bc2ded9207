//! Giving back the blocks of a node that is gone (`ipoolctl cluster release-node`): the store
//! must show the node away, by its own clock, past `absent_for` and past the node's fence (plus
//! a renewal's slack), and its name not held; a store that cannot tell (no Lease where one was
//! looked for) refuses. `force` gives the blocks back anyway, and says what it overrode.
//! The writes are the store's own ([`NameStore::release_node`]): each give-back conditioned on
//! the block as listed and, unless forced, on the node still being away; the node's holds on
//! pins end, each conditioned the same way; its record goes last, only while it is the one
//! judged. A block a pin was made in stays (its pinned addresses are kept there for their
//! owners), and with it the node's record.
//!
//! [`NameStore::release_node`]: super::datastore::NameStore::release_node

use super::datastore::{Datastore, Release};
use super::pin::{holds_of, keeps_block, Pin, PinRead};
use super::vocab::{Block, ClusterError, MalformedKey, NodeState};

/// What a release did.
#[derive(Clone, Debug)]
pub struct Released {
    /// The blocks given back.
    pub blocks: Vec<Block>,
    /// Blocks kept because a pin was made in them (`ipoolctl cluster unpin` ends it).
    pub pinned: Vec<Block>,
    /// Pins the node held, released (the node dropped from their holders).
    pub unheld: Vec<Pin>,
    /// The node's blocks as listed (given back or not: another owner re-created some).
    pub listed: usize,
    /// What `force` overrode: why the release would have been refused.
    pub forced: Vec<String>,
    /// Entries of the store that name no owner, seen in the node's listing.
    pub malformed: Vec<MalformedKey>,
}

/// Releases `node`'s blocks from `store` (`place`: the store, as messages name it) once it has
/// been away `absent_for` seconds and past its fence, or at once with `force`. The store's
/// pins are read after the node's blocks: the blocks they were made in stay, and the node's
/// holds on them end. (Read here, not by the caller: a release that did not know the pins
/// gave back a block whose pinned address another node served, and the block's next owner
/// handed it out; the simulation found it.)
pub async fn release_node(
    store: &dyn Datastore,
    place: &str,
    node: &str,
    absent_for: u64,
    force: bool,
) -> Result<Released, ClusterError> {
    release_node_pinned(store, place, node, absent_for, force, None).await
}

/// [`release_node`], with the store's pins as the caller knows them (`Some`: none there, say,
/// in a simulated run that makes none), or read after the node's blocks (`None`).
pub async fn release_node_pinned(
    store: &dyn Datastore,
    place: &str,
    node: &str,
    absent_for: u64,
    force: bool,
    known: Option<Vec<PinRead>>,
) -> Result<Released, ClusterError> {
    let mut forced = Vec::new();
    let state = match store.node_state(node).await {
        Err(e @ ClusterError::Malformed { .. }) if force => {
            forced.push(e.to_string());
            let blocks = store.blocks_of_node(node).await?;
            NodeState {
                blocks,
                ..NodeState::default()
            }
        }
        r => r?,
    };
    let blocks = &state.blocks.blocks;
    // No block, no heartbeat, no record: a node the store does not know, unless it holds pins
    // (an etcd restored from a backup older than the node, on which another node re-made a
    // pin it had held). Its holds are what there is to release.
    let unrecorded = blocks.is_empty() && state.alive.is_none() && state.seen.is_none();
    let gone = || {
        ClusterError::NotFound(format!(
            "node {node:?} owns no block, holds no pin and has no heartbeat in {place}"
        ))
    };
    if unrecorded && crate::bugs::on(crate::bugs::Bug::UnrecordedHolderUnknown) {
        return Err(gone());
    }
    let refusal = not_gone(&state, place, node, absent_for);
    if let Some(why) = refusal.as_ref().filter(|_| !force && !unrecorded) {
        return Err(ClusterError::Refused(format!(
            "{why}; its {} block(s) stay (--force gives them back anyway)",
            blocks.len()
        )));
    }
    let pins: Vec<PinRead> = match known {
        Some(pins) => pins,
        None if crate::bugs::on(crate::bugs::Bug::ReleaseIgnoresPins) => Vec::new(),
        None => store.pins(None).await?,
    };
    // A block with a pin made in it stays: its pinned addresses are kept there for their
    // owners (and may be held on other nodes), and would be handed out by its next owner.
    let (pinned, free): (Vec<Block>, Vec<Block>) =
        blocks.iter().cloned().partition(|b| keeps_block(&pins, b));
    // Its holds on pins end with it: their owners' pods may take them elsewhere.
    let holds = holds_of(&pins, node);
    if unrecorded && holds.is_empty() {
        return Err(gone());
    }
    if let Some(why) = refusal {
        if !force {
            return Err(ClusterError::Refused(format!(
                "{why}; its {} hold(s) on pins stay (--force ends them anyway)",
                holds.len()
            )));
        }
        forced.push(why);
    }
    if free.is_empty() && holds.is_empty() && !pinned.is_empty() {
        // Only blocks pins keep: nothing to free, no Lease taken, no wait, no write.
        return Ok(Released {
            blocks: Vec::new(),
            pinned,
            unheld: Vec::new(),
            listed: blocks.len(),
            forced,
            malformed: state.blocks.malformed,
        });
    }
    let plan = Release {
        state: &state,
        blocks: &free,
        holds: &holds,
        force,
        keeps_blocks: !pinned.is_empty(),
    };
    let freed = store.release_node(node, &plan).await?;
    Ok(Released {
        blocks: freed.blocks,
        pinned,
        unheld: freed.unheld,
        listed: blocks.len(),
        forced,
        malformed: state.blocks.malformed,
    })
}

/// Why `node` cannot be judged gone from what the store says of it (`state`), if it cannot:
/// its daemon holds its name, or the store saw it within `absent_for` seconds or its fence (by
/// the store's clock), or the store cannot tell. None: gone.
pub fn not_gone(state: &NodeState, place: &str, node: &str, absent_for: u64) -> Option<String> {
    let clock = match place {
        "etcd" => "etcd's clock",
        _ => "the apiserver's clock",
    };
    match (&state.alive, &state.seen) {
        (None, _) if state.unproven.is_some() => state.unproven.clone(),
        (Some(a), _) => Some(format!(
            "node {node:?} is alive: its daemon (instance {}) keeps its heartbeat lease in {place}",
            a.instance
        )),
        (None, Some((seen, away))) => {
            // Past the fence, by more than a renewal's slack: the daemon, wherever it is, hands
            // nothing out any more.
            let fence = seen.fence_secs + seen.renew_secs + 1;
            let need = absent_for.max(fence);
            (*away < need as i64).then(|| {
                format!(
                    "node {node:?} was last seen {away} s ago by {clock}, less than {need} s (--absent-for {absent_for}, and its fence of {} s): it may be restarting or cut off from {place}",
                    seen.fence_secs
                )
            })
        }
        // No `seen` key: away longer than its lease (30 days), or it never ran a heartbeat.
        (None, None) => None,
    }
}
