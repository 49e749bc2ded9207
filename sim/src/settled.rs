//! The liveness rules: what must hold once the faults have stopped and the cluster has been
//! quiet for longer than every documented timer (see `crate::quiet`). Safety says no address
//! is on two pods; these say no address is lost: one nobody uses comes back.
//!
//! Each rule is a function of a [`Picture`] of the settled cluster (or of what it did while
//! idle), so that a hand-made picture that breaks it shows the rule fails (the tests below).
//! docs/simulation.md numbers them L1 to L6:
//! - L1 (stranded): every block the store holds is served by a daemon of its node (so its
//!   free addresses go to that node's next pods), or holds addresses of that node's pods (it
//!   goes back once they are gone), and every address a daemon holds is a pod's that runs;
//! - L2 (a node gone): no block belongs to a node no daemon holds the name of, but one a pin
//!   of an owner that is not gone keeps;
//! - L3 (a pin of a gone owner): no pin remains whose owner is gone, nor a void pin nobody
//!   holds that a live node keeps in a block of its own, nor an owner's second pin, nor a pin
//!   held by a live node alone whose address it gives another pod;
//! - L4 (a stuck ADD): an ADD on every live node succeeds while its pool has a free block;
//! - L5 (a pool half made, half deleted or half changed): no pool stays Pending, marked
//!   Deleting or with a CIDR marked on its way in or out once the operator ran the command
//!   that left it so again, as its error says;
//! - L6 (an idle cluster's writes): nothing but renewals is written while nothing happens.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;
use ipool_server::cluster::pin::Pin;

use crate::check::StoreBlock;

/// The cluster once settled.
#[derive(Default)]
pub struct Picture {
    /// The store's blocks.
    pub blocks: Vec<StoreBlock>,
    /// Each node name a running daemon holds in the store, with the blocks its daemons serve
    /// (confirmed as theirs).
    pub serving: BTreeMap<String, BTreeSet<IpNet>>,
    /// What the running daemons hold: node, container, addresses.
    pub held: Vec<(String, String, Vec<IpAddr>)>,
    /// The containers of the pods that run.
    pub pods: BTreeSet<String>,
    /// The store's pins, each with why its owner is gone, if it is.
    pub pins: Vec<(Pin, Option<String>)>,
    /// The store's pins nobody holds that a live node knows, void in a block of its own (made
    /// in the block its address lay in before the node claimed it): node, pin.
    pub void_known: Vec<(String, Pin)>,
    /// The pools the store shows Pending, marked Deleting, or with a CIDR marked on its way in
    /// or out.
    pub deleting: Vec<String>,
    /// The store's pins held by a live node alone whose daemon holds their address for a pod
    /// none of their holds is of: node, the pin, that pod's container.
    pub misheld: Vec<(String, Pin, String)>,
}

/// L1 and L2: no block of a gone node, none its node does not serve, no address held for a
/// pod that does not run.
pub fn stranded(p: &Picture) -> Result<(), String> {
    for (block, node, pool) in &p.blocks {
        let Some(served) = p.serving.get(node) else {
            // A pin of an owner that is not gone keeps the block for the owner's next pod
            // (its other addresses wait with it: docs/simulation.md, L2).
            let pinned = p
                .pins
                .iter()
                .any(|(pin, gone)| gone.is_none() && !pin.set_aside && pin.block == *block);
            if pinned {
                continue;
            }
            return Err(format!(
                "L2: block {block} of pool {pool:?} still belongs to {node}, which is gone (no daemon holds its name): its addresses are stranded"
            ));
        };
        // A block it does not serve but holds addresses in (of a pool as it was, or of
        // another size, another node's now) goes back once its pods are gone.
        let holds_in = p
            .held
            .iter()
            .any(|(n, _, ips)| n == node && ips.iter().any(|ip| block.contains(ip)));
        if !served.contains(block) && !holds_in {
            return Err(format!(
                "L1: block {block} of pool {pool:?} is {node}'s in the store, but no daemon of {node} serves it (it serves {served:?}): its free addresses are stranded"
            ));
        }
    }
    for (node, container, ips) in &p.held {
        if !p.pods.contains(container) {
            return Err(format!(
                "L1: {node} holds {ips:?} for {container}, which no pod runs (its DEL was made, or its node wiped): stranded"
            ));
        }
    }
    Ok(())
}

/// L3: no pin of an owner that is gone.
pub fn pins_of_gone_owners(p: &Picture) -> Result<(), String> {
    match p.pins.iter().find(|(_, gone)| gone.is_some()) {
        Some((pin, Some(why))) => Err(format!(
            "L3: the pin of {} for {} remains, though its owner is gone ({why}; holders {:?}): its address is stranded",
            pin.address,
            pin.owner,
            pin.holders.iter().map(|h| &h.node).collect::<Vec<_>>()
        )),
        _ => Ok(()),
    }
}

/// L3, void pins: no pin nobody holds stays known to a live node, void in a block of its
/// own: the node keeps its address out, and the block from going back, for nothing.
pub fn void_pins_kept(p: &Picture) -> Result<(), String> {
    match p.void_known.first() {
        Some((node, pin)) => Err(format!(
            "L3: the pin of {} for {}, void (made in block {} as it no longer stands), held by nobody, stays in {node}'s block: its address and the block are kept for nothing",
            pin.address, pin.owner, pin.block
        )),
        None => Ok(()),
    }
}

/// L3, second pins: no owner that is not gone has two pins that count, one of them held by
/// nobody. Its pods take one (an owner has one address); the other keeps its address out, and
/// its block from going back, for nothing, for as long as the owner lives. (Two held: two of
/// its pods run, each on its own, as after an operator's error; each ends with its pod.)
pub fn second_pins(p: &Picture) -> Result<(), String> {
    let mut seen: BTreeMap<String, &Pin> = BTreeMap::new();
    for (pin, _) in p.pins.iter().filter(|(_, gone)| gone.is_none()) {
        let Some(first) = seen.insert(pin.owner.to_string(), pin) else {
            continue;
        };
        if !first.holders.is_empty() && !pin.holders.is_empty() {
            continue;
        }
        return Err(format!(
            "L3: {} has two pins, {} (block {}, held by {:?}) and {} (block {}, held by {:?}): the one its pods do not take keeps its address out for nothing",
            pin.owner,
            first.address,
            first.block,
            first.holders.iter().map(|h| &h.node).collect::<Vec<_>>(),
            pin.address,
            pin.block,
            pin.holders.iter().map(|h| &h.node).collect::<Vec<_>>()
        ));
    }
    Ok(())
}

/// L3, misheld pins: no pin held by a live node alone stays while its address is another
/// pod's there (a creation that landed after its ADD had failed): the owner's pods are refused
/// everywhere for as long as that pod runs.
pub fn misheld_pins(p: &Picture) -> Result<(), String> {
    match p.misheld.first() {
        Some((node, pin, container)) => Err(format!(
            "L3: the pin of {} for {} stays held by {node} for {:?}, though {node} gives the address to {container}: the owner's pods are refused for as long as {container} runs",
            pin.address,
            pin.owner,
            pin.holders.iter().map(|h| &h.uid).collect::<Vec<_>>()
        )),
        None => Ok(()),
    }
}

/// L4: an ADD on `node` refused (`why`) while its pools had a free block of each family it
/// asks for (`room`: one of them, if any).
pub fn add_refused(node: &str, why: &str, room: Option<&IpNet>) -> Result<(), String> {
    match room {
        Some(free) => Err(format!(
            "L4: an ADD on {node} failed ({why}) though block {free} of its pool is free (and one of each family it asks for)"
        )),
        None => Ok(()),
    }
}

/// L5: no pool stuck Pending, marked Deleting, or with a CIDR marked on its way in or out.
pub fn stuck_deleting(p: &Picture) -> Result<(), String> {
    match p.deleting.first() {
        Some(pool) => Err(format!(
            "L5: pool {pool:?} is still Pending, marked Deleting or changing a CIDR once the operator ran its command again and the cluster was quiet: nodes claim nothing from it, and nothing finishes it"
        )),
        None => Ok(()),
    }
}

/// L6: what was written while the cluster was idle (each write in a few words), renewals
/// aside.
pub fn idle_writes(writes: &[String], quiet_ms: u64) -> Result<(), String> {
    match writes {
        [] => Ok(()),
        [first, ..] => Err(format!(
            "L6: an idle cluster wrote {} time(s) in {quiet_ms} ms besides its renewals, first: {first}",
            writes.len()
        )),
    }
}

/// The free blocks of a pool: block-sized ranges of `cidrs` (at its IPv4 or IPv6 block size,
/// `prefixes`) that no block of the store and nothing kept out (`kept_out`: excluded,
/// reserved) overlaps.
pub fn free_blocks(
    cidrs: &[IpNet],
    prefixes: (u8, u8),
    blocks: &[StoreBlock],
    kept_out: &[IpNet],
) -> Vec<IpNet> {
    let overlaps = |a: &IpNet, b: &IpNet| a.contains(&b.network()) || b.contains(&a.network());
    let prefix = |c: &IpNet| match c {
        IpNet::V4(_) => prefixes.0,
        IpNet::V6(_) => prefixes.1,
    };
    cidrs
        .iter()
        .filter(|c| c.prefix_len() <= prefix(c))
        .flat_map(|c| c.subnets(prefix(c)).into_iter().flatten())
        .filter(|b| !blocks.iter().any(|(o, _, _)| overlaps(o, b)))
        .filter(|b| !kept_out.iter().any(|k| overlaps(k, b)))
        .collect()
}

#[cfg(test)]
mod tests;
