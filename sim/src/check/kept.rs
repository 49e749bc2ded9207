//! What an etcd restored from an older backup excuses, and what it does not: the pods of
//! before are excused (restoring while nodes claim is an operator's error, docs/cluster-mode.md),
//! but not a pod whose fixed address the node of its block knew pinned. Every node keeps the
//! pins it knew whatever a listing of the restored etcd says, and makes again those the store
//! lacks before the pool's blocks serve (the same page), so no other pod gets that address
//! while the first runs. The promise lasts until the pin is back in the store, and holds only
//! while that node's daemon lives, under its name alone, with the block: a daemon of the name
//! killed or started, or the block taken from the node by anyone but the node, before the pin
//! is back, excuses the pod again (a daemon restarted meanwhile knows only what the store
//! says).

use std::net::IpAddr;

use ipnet::IpNet;
use ipool_server::cluster::pin::Pin;

use super::{Checker, StoreBlock};

/// A pod of before a restore whose fixed address its block's node knew pinned.
#[derive(Clone, Debug, PartialEq)]
pub struct Kept {
    pub container: String,
    pub ip: IpAddr,
    pub pool: String,
    /// The pin's owner, as `PinOwner` shows it.
    pub owner: String,
    /// The node whose block holds the address, whose daemon knew the pin.
    pub node: String,
}

impl Kept {
    /// The store has the pin again.
    fn back(&self, pins: &[Pin]) -> bool {
        pins.iter().any(|p| {
            p.pool == self.pool && p.address == self.ip && p.owner.to_string() == self.owner
        })
    }
}

impl Checker {
    /// etcd was restored from an older backup: its blocks were `before` and are `after`.
    /// Every pod of before is excused (`why`), as far as the world goes (its controllers take
    /// an excused pod for gone, as before); but a pod with a fixed address whose every
    /// address lies in a block the restore kept as its node's, whose node's one daemon
    /// `knows(node, pool, ip, owner)` pinned for the pod's owner, is `protected`: no pod of
    /// another owner may get its address.
    pub fn restored(
        &mut self,
        why: &str,
        before: &[StoreBlock],
        after: &[StoreBlock],
        knows: impl Fn(&str, &str, IpAddr, &str) -> bool,
    ) {
        let mut kept = Vec::new();
        let candidates = self
            .pods
            .iter()
            .filter(|(c, p)| p.excused.is_none() || self.protected.contains(*c));
        for (c, p) in candidates {
            let Some(owner) = &p.owner else { continue };
            let each: Option<Vec<Kept>> = p
                .ips
                .iter()
                .map(|ip| {
                    let (net, node, pool) = after.iter().find(|(b, _, _)| b.contains(ip))?;
                    before
                        .iter()
                        .any(|(b, o, _)| b == net && o == node)
                        .then_some(())?;
                    knows(node, pool, *ip, owner).then(|| Kept {
                        container: c.clone(),
                        ip: *ip,
                        pool: pool.clone(),
                        owner: owner.clone(),
                        node: node.clone(),
                    })
                })
                .collect();
            kept.extend(each.unwrap_or_default());
        }
        for p in self.pods.values_mut() {
            p.excused.get_or_insert_with(|| why.to_string());
        }
        self.protected = kept.iter().map(|k| k.container.clone()).collect();
        self.kept = kept;
    }

    /// Whether a pod of `owner` may get an address `holder` holds: `holder` is excused, and
    /// not protected from other owners (a pod of its own owner is one its controller made
    /// because the simulation takes an excused pod for gone).
    pub(super) fn may_take(&self, holder: &str, excused: bool, owner: Option<&str>) -> bool {
        let of_holder = self.pods.get(holder).and_then(|p| p.owner.as_deref());
        excused && (!self.protected.contains(holder) || of_holder == owner)
    }

    /// The pods kept whose pins are not back in the store (`pins`) and that `lost` says are
    /// no longer kept are excused (`why`); those whose pins are back need no keeping.
    fn unkeep(&mut self, pins: &[Pin], lost: impl Fn(&Kept) -> bool, why: &str) {
        self.kept.retain(|k| !k.back(pins));
        let (gone, kept): (Vec<Kept>, Vec<Kept>) =
            std::mem::take(&mut self.kept).into_iter().partition(&lost);
        self.kept = kept;
        for k in gone {
            if let Some(p) = self.pods.get_mut(&k.container) {
                p.excused.get_or_insert_with(|| why.to_string());
            }
            // Its other addresses are excused with it.
            self.kept.retain(|o| o.container != k.container);
            self.protected.remove(&k.container);
        }
    }

    /// A daemon under `node`'s name was killed or started: what it knew of pins since the
    /// restore is lost, or not its own.
    pub fn kept_node_changed(&mut self, node: &str, pins: &[Pin]) {
        self.unkeep(
            pins,
            |k| k.node == node,
            "etcd restored from an older backup: the daemon that knew the pin stopped, or another started under its name, before the pin was made again",
        );
    }

    /// The store went from `before` to `after` by a request of `by` (a daemon's shows as
    /// `<node> (slot <i>)`): a block taken from its node by anyone else (a release, the
    /// operator) before the pin was made again goes with what the node knew of it.
    pub fn kept_blocks_gone(
        &mut self,
        before: &[StoreBlock],
        after: &[StoreBlock],
        by: &str,
        pins: &[Pin],
    ) {
        if self.kept.is_empty() {
            return;
        }
        let by = by.split_once(" (slot ").map_or(by, |(node, _)| node);
        let gone: Vec<IpNet> = before
            .iter()
            .filter(|(b, o, _)| o != by && !after.iter().any(|(a, ao, _)| a == b && ao == o))
            .map(|(b, _, _)| *b)
            .collect();
        self.unkeep(
            pins,
            |k| gone.iter().any(|b| b.contains(&k.ip)),
            "etcd restored from an older backup: the block of a pin not made again yet taken from its node",
        );
    }
}

#[cfg(test)]
mod tests;
