//! Rivals provoked (issue 54, item 4): in the runs of [`crate::Options::provoke`], a write
//! parked for a rival (`crate::rivals`) does not wait for one to come by: the step that parks
//! it starts, there and then, a command or fault whose writes touch what the parked write is
//! conditioned on. Which one follows from the key:
//! - a pool's: a pool command of the operator's (deleted, made again, moved, grown, shrunk,
//!   disabled, an address reserved), or of a second operator's while the first's is under way
//!   (whose lost update `crate::told` judges);
//! - a node's (its Lease or `alive`, `seen`, its index of blocks): release-node of that node
//!   (`--absent-for 0`, with `--force` or without), its daemon killed and started again (the
//!   new instance takes the name back while the old one's write is on its way), or a look of
//!   the release of departed nodes;
//! - a block's: the same of the node that owns it, or an ADD on another node asking for an
//!   address in it;
//! - a pin's: two times in three, one of its own owner's (its pod's DEL, its VM's migration,
//!   its next pod's ADD, a keeper's turn where it is held); else a pin keeper's turn, a VM's
//!   migration, a pod of a fixed address added, or (in runs with departures) an owner gone or
//!   back.
//!
//! A rival that cannot be made now (one operator command at a time, a node down) leaves the
//! write parked until its time, as in the other race runs.

use std::net::IpAddr;

use ipnet::IpNet;
use ipool_server::cluster::pin::PinOwner;

use crate::rivals::Keys;
use crate::world::World;

/// What a conditioned write's key names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Pool,
    /// A node, by its name in the store.
    Node(String),
    /// A block: its last key part or object name (`10.70.0.16-28`, `10-70-0-16-28`).
    Block(String),
    /// A pin, a mark of its or its owner's record: the key, which names its address or owner.
    Pin(String),
}

/// What the keys of a conditioned write name: etcd's (`/ipool/v1/nodes/n1/alive`) or the
/// apiserver's object paths (`/apis/coordination.k8s.io/v1/namespaces/ipool/leases/ipool-n1`).
pub fn targets(on: &Keys) -> Vec<Target> {
    let mut out: Vec<Target> = Vec::new();
    for (key, _) in &on.0 {
        let key = String::from_utf8_lossy(key);
        let parts: Vec<&str> = key.trim_matches('/').split('/').collect();
        let t = match parts.as_slice() {
            ["ipool", "v1", "pools", ..] => Some(Target::Pool),
            // A node's index of its blocks: an entry names its block, a prefix its pool.
            ["ipool", "v1", "nodes", node, "blocks", .., block] => match block.contains('-') {
                true => Some(Target::Block(block.to_string())),
                false => Some(Target::Node(node.to_string())),
            },
            ["ipool", "v1", "nodes", node, ..] => Some(Target::Node(node.to_string())),
            ["ipool", "v1", "blocks", .., block] => Some(Target::Block(block.to_string())),
            ["ipool", "v1", "pins" | "pin-owners" | "pins-gone", ..] => {
                Some(Target::Pin(key.to_string()))
            }
            [.., "ippools", _] => Some(Target::Pool),
            [.., "ipblocks", name] => Some(Target::Block(name.to_string())),
            [.., "ippins", _] => Some(Target::Pin(key.to_string())),
            [.., "leases", name] => name
                .strip_prefix("ipool-")
                .map(|n| Target::Node(n.to_string())),
            _ => None,
        };
        if let Some(t) = t.filter(|t| !out.contains(t)) {
            out.push(t);
        }
    }
    out
}

/// The block a key part or object name names, among `blocks`.
pub fn block_named(name: &str, blocks: &[IpNet]) -> Option<IpNet> {
    blocks.iter().copied().find(|b| {
        name == ipool_server::cluster::etcd::block_key_part(b)
            || name == ipool_server::cluster::kube::block_name(b)
    })
}

/// Starts a rival of a write parked on `on`, if one can be made now.
pub(crate) fn rival(w: &mut World, on: &Keys) -> Result<(), String> {
    let targets = targets(on);
    if targets.is_empty() {
        return Ok(());
    }
    let t = targets[w.choices.pick(targets.len() as u32) as usize].clone();
    match t {
        // One operator's command at a time; a second operator's beside it.
        Target::Pool => {
            w.note("a rival provoked: a pool command".into());
            match w.operator.running.is_some() {
                true => crate::operator::pool_op_beside(w),
                false => crate::operator::pool_op(w),
            }
            Ok(())
        }
        Target::Node(name) => match slot_of(w, &name) {
            Some(i) => of_node(w, i),
            None => Ok(()),
        },
        Target::Block(name) => {
            let blocks = w.shared.blocks();
            let nets: Vec<IpNet> = blocks.iter().map(|(n, _, _)| *n).collect();
            let Some(net) = block_named(&name, &nets) else {
                return Ok(());
            };
            let owner = blocks.iter().find(|(n, _, _)| *n == net).map(|(_, o, _)| o);
            let Some(i) = owner.and_then(|o| slot_of(w, o)) else {
                return Ok(());
            };
            match w.choices.pick(3) {
                0 => asked_elsewhere(w, i, net),
                _ => of_node(w, i),
            }
        }
        // A pool's deletion is conditioned on its set-aside pins in every run; pods of fixed
        // addresses are added only where the run's daemons serve them.
        Target::Pin(_) if !w.swarm.pins => Ok(()),
        Target::Pin(key) => {
            // The pin's own owner, two times in three where the store has it: its pod's DEL,
            // a migration, its next pod's ADD, a keeper's turn where it is held.
            let owner = pin_owner(&w.shared.pins(), &key);
            if let Some(o) = owner.filter(|_| w.choices.pick(3) > 0) {
                w.note(format!("a rival provoked: {o}'s pin"));
                return crate::fixed::rival_of_owner(w, &o);
            }
            w.note("a rival provoked: a pin's".into());
            match w.choices.pick(4) {
                0 => crate::fixed::keep_pins(w),
                1 => crate::fixed::migrate(w),
                2 if w.swarm.departures => crate::fixed::owner_goes_or_comes(w),
                _ => {
                    if let Some(i) = crate::nodes::running(w) {
                        crate::fixed::add_fixed(w, i);
                    }
                }
            }
            Ok(())
        }
    }
}

/// The owner of the pin `key` names (by its address, or its owner's record), among `pins`.
pub fn pin_owner(pins: &[ipool_server::cluster::pin::Pin], key: &str) -> Option<PinOwner> {
    use ipool_server::cluster::pin::address_name;
    let last = key.rsplit('/').next().unwrap_or_default();
    pins.iter()
        .find(|p| {
            last == p.address.to_string()
                || last.ends_with(&address_name(&p.address))
                || key.ends_with(&format!("/{}", p.owner))
        })
        .map(|p| p.owner.clone())
}

/// The slot of the node named `name` in the store (not a second daemon under its name).
fn slot_of(w: &World, name: &str) -> Option<usize> {
    (0..w.opts.nodes).find(|i| w.slots[*i].name == name && w.slots[*i].twin_of.is_none())
}

/// A rival of a write about slot `i`'s node: release-node of it, or its daemon restarted, or a
/// look of the release of departed nodes.
fn of_node(w: &mut World, i: usize) -> Result<(), String> {
    let name = w.slots[i].name.clone();
    match w.choices.pick(4) {
        0 | 1 if w.operator.running.is_none() => {
            let force = w.choices.chance(1, 2);
            w.note(format!("a rival provoked: release-node {name}"));
            crate::operator::release_one(w, i, force);
            Ok(())
        }
        2 if w.swarm.departures => {
            w.note("a rival provoked: a look for departed nodes".into());
            crate::departed::departed(w);
            Ok(())
        }
        _ if w.slots[i].daemon.is_some() => {
            w.note(format!(
                "a rival provoked: {name} killed (-9) and started again"
            ));
            w.kill(i);
            w.start(i)
        }
        _ => Ok(()),
    }
}

/// An ADD on a node other than slot `i`'s asking for an address in `i`'s block `net`.
fn asked_elsewhere(w: &mut World, i: usize, net: IpNet) -> Result<(), String> {
    let others: Vec<usize> = (0..w.slots.len())
        .filter(|t| *t != i && w.slots[*t].daemon.is_some())
        .collect();
    if others.is_empty() {
        return Ok(());
    }
    let t = others[w.choices.pick(others.len() as u32) as usize];
    let ip = match net {
        IpNet::V4(n) => {
            let hosts = 1u32 << (32 - u32::from(n.prefix_len()));
            IpAddr::V4((u32::from(n.network()) + w.choices.pick(hosts)).into())
        }
        IpNet::V6(n) => {
            let hosts = 1u128 << (128 - u32::from(n.prefix_len())).min(16);
            IpAddr::V6((u128::from(n.network()) + u128::from(w.choices.pick(hosts as u32))).into())
        }
    };
    w.note(format!(
        "a rival provoked: an ADD on {} asking for {ip}, in {}'s block {net}",
        w.slots[t].name, w.slots[i].name
    ));
    crate::nodes::add_asking(w, t, vec![ip]);
    Ok(())
}

#[cfg(test)]
mod tests;
