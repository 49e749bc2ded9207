//! The checker, asked after every step of a run:
//!
//! 1. no address handed out while another pod (on any node) holds it: a pod holds its
//!    addresses from its ADD's answer until its first DEL is called, or its node is wiped;
//! 2. every acknowledged pod is held by its node's daemon until its DEL (asked whenever a
//!    daemon starts, and at the end);
//! 3. the store never has two blocks over one address (each block one owner is the store's
//!    own key rule; two blocks of different sizes over one range would be two owners);
//! 4. every address a node hands out lies in a block the store shows as that node's when the
//!    answer comes (the store changes only when the simulation delivers a request, so that is
//!    when it was handed out);
//! 5. no block is given back (gone from the store) while a pod of its owner holds an address
//!    in it, unless an operator's `--force` did it.
//!
//! The operator's documented errors are not the code's: after `release-node --force` on a node
//! whose daemon runs, its pods of before are excused, and so is what it hands out from the
//! released blocks until its next sync could have run (`resync_secs` and its jitter); after a
//! release without `--force` on a node that was cut off past its fence while its pods ran,
//! its pods of before are excused (docs/cluster-mode.md: release-node is for nodes that are gone); after etcd
//! is restored from an older backup, the pods of before are excused (docs/cluster-mode.md: "What an
//! operator must never do"), but not a pod whose fixed address its block's node knew pinned
//! ([`kept`]: the nodes keep such pins and make them again). Each excuse is in the trace.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use ipnet::IpNet;

mod kept;
#[cfg(test)]
mod tests;
pub use kept::Kept;

/// A pod as the kubelet knows it.
#[derive(Clone, Debug)]
pub struct Pod {
    /// The daemon slot that answered its ADD.
    pub slot: usize,
    /// The node name it runs under.
    pub node: String,
    pub ips: Vec<IpAddr>,
    /// Simulated milliseconds at its ADD's answer.
    pub at: u64,
    /// Its conflicts are the operator's doing (see the module).
    pub excused: Option<String>,
    /// The owner of its fixed address (`crate::fixed`), if it has one.
    pub owner: Option<String>,
    /// A VM launcher's instance (its VMI's uid).
    pub instance: Option<String>,
}

/// A block as the store lists it: its CIDR, its owner, its pool.
pub type StoreBlock = (IpNet, String, String);

#[derive(Default)]
pub struct Checker {
    /// Live pods by container.
    pub pods: BTreeMap<String, Pod>,
    /// Pods of before an etcd restore whose pinned addresses their nodes keep, until their
    /// pins are back in the store (`kept`).
    pub kept: Vec<Kept>,
    /// Pods excused by an etcd restore whose addresses no pod of another owner may get.
    pub protected: BTreeSet<String>,
}

impl Checker {
    /// Who holds `ip` now, besides `container` and the pods that may share it with a pod of
    /// `owner` of VM instance `instance` (two launchers of one VM's instance, migrating).
    fn holders(
        &self,
        ip: IpAddr,
        container: &str,
        (owner, instance): (Option<&str>, Option<&str>),
    ) -> Vec<(&String, &Pod)> {
        self.pods
            .iter()
            .filter(|(c, p)| c.as_str() != container && p.ips.contains(&ip))
            .filter(|(_, p)| {
                !crate::owners::may_share(
                    (owner, instance),
                    (p.owner.as_deref(), p.instance.as_deref()),
                )
            })
            .collect()
    }

    /// An ADD of `container` on slot `slot` (node `node`) answered with `ips` at `at`, the
    /// store's blocks as they are; `excuse` says why a hand-out of an address is the
    /// operator's doing, if it is, and `excused` why the pod's addresses are (see the module).
    /// A pod with a fixed address (`owner`, with its VM instance if it is a launcher) may be
    /// served those of `hosted` outside its node's
    /// blocks (the store's pins keep them for it, held here), and outside every block if the
    /// pool sets them aside.
    #[allow(clippy::too_many_arguments)]
    pub fn added(
        &mut self,
        slot: usize,
        node: &str,
        container: &str,
        ips: Vec<IpAddr>,
        at: u64,
        blocks: &[StoreBlock],
        excuse: impl Fn(IpAddr) -> Option<String>,
        mut excused: Option<String>,
        owned: Option<(String, Option<String>)>,
        hosted: &[IpAddr],
        set_aside: bool,
    ) -> Result<(), String> {
        let (owner, instance) = owned.unzip();
        let instance = instance.flatten();
        for ip in &ips {
            let window = excuse(*ip);
            for (c, p) in self.holders(*ip, container, (owner.as_deref(), instance.as_deref())) {
                if !self.may_take(c, p.excused.is_some(), owner.as_deref()) && window.is_none() {
                    return Err(format!(
                        "{ip} handed out to {container} on {node} (slot {slot}) while {c} on {} (slot {}) holds it since {} ms",
                        p.node, p.slot, p.at
                    ));
                }
            }
            // A block of this node's over it (on the Kubernetes API a block made for a pool as
            // it was may stand a while over a block of the pool as it is: it is never served,
            // and what a pod holds is checked against the other pods above).
            let owner = blocks
                .iter()
                .filter(|(b, _, _)| b.contains(ip))
                .find(|(_, o, _)| o == node)
                .or_else(|| blocks.iter().find(|(b, _, _)| b.contains(ip)));
            match (owner, &window) {
                (Some((_, o, _)), _) if o == node => {}
                (_, Some(_)) => {}
                (Some(_), None) if hosted.contains(ip) => {}
                // Set aside by the pool: in no block, ever (rule 13 checks it is its chooser's).
                (None, None) if set_aside && hosted.contains(ip) && crate::owners::set_aside(*ip) => {}
                (Some((b, o, _)), None) => {
                    return Err(format!(
                        "{ip} handed out to {container} on {node} (slot {slot}) from block {b}, which the store shows as {o}'s"
                    ))
                }
                (None, None) => {
                    return Err(format!(
                        "{ip} handed out to {container} on {node} (slot {slot}) from no block the store has"
                    ))
                }
            }
            excused = excused.or(window);
        }
        self.pods.insert(
            container.to_string(),
            Pod {
                slot,
                node: node.to_string(),
                ips,
                at,
                excused,
                owner,
                instance,
            },
        );
        Ok(())
    }

    /// The first DEL of `container` was called: its addresses may go to others from now.
    pub fn deleting(&mut self, container: &str) {
        self.pods.remove(container);
        self.protected.remove(container);
    }

    /// Slot `slot`'s node was wiped: its pods are gone with it.
    pub fn wiped(&mut self, slot: usize) {
        self.pods.retain(|_, p| p.slot != slot);
        let pods = &self.pods;
        self.protected.retain(|c| pods.contains_key(c));
    }

    /// The pods `containers` are the operator's doing (`why`).
    pub fn excuse_pods(&mut self, containers: &[String], why: &str) {
        for c in containers {
            if let Some(p) = self.pods.get_mut(c) {
                p.excused.get_or_insert_with(|| why.to_string());
            }
            self.protected.remove(c);
            self.kept.retain(|k| &k.container != c);
        }
    }

    /// The pods of `node` until now are the operator's doing (`why`).
    pub fn excuse(&mut self, node: &str, why: &str) {
        self.excuse_where(|p| p.node == node, why);
    }

    /// The pods of slot `slot` until now are the operator's doing (`why`).
    pub fn excuse_slot(&mut self, slot: usize, why: &str) {
        self.excuse_where(|p| p.slot == slot, why);
    }

    /// The pods of slot `slot` that got their addresses by `at` (simulated ms) are excused.
    pub fn excuse_slot_before(&mut self, slot: usize, at: u64, why: &str) {
        self.excuse_where(|p| p.slot == slot && p.at <= at, why);
    }

    /// The pods `which` picks are excused (`why`), protected from other owners no more.
    fn excuse_where(&mut self, which: impl Fn(&Pod) -> bool, why: &str) {
        for (c, p) in self.pods.iter_mut().filter(|(_, p)| which(p)) {
            p.excused.get_or_insert_with(|| why.to_string());
            self.protected.remove(c);
            self.kept.retain(|k| &k.container != c);
        }
    }

    /// The daemon of slot `slot` (re)started holding `held`: every live pod it answered for
    /// must be there.
    pub fn held_by(&self, slot: usize, held: &[(String, Vec<IpAddr>)]) -> Result<(), String> {
        for (c, p) in self.pods.iter().filter(|(_, p)| p.slot == slot) {
            let there = held.iter().any(|(hc, ips)| hc == c && ips == &p.ips);
            if !there {
                return Err(format!(
                    "{c} ({:?} on {}, acknowledged at {} ms) is no longer held, and no DEL released it",
                    p.ips, p.node, p.at
                ));
            }
        }
        Ok(())
    }

    /// The store went from `before` to `after` by a request of `by` (a node's name, or the
    /// operator's: the pods of the slots `excused` names are the operator's to judge).
    /// `overlaps`: blocks may stand over one another a while (the Kubernetes API: a claim is
    /// a create, checked against its pool after it), as long as no address is handed out
    /// from two. A block a pin was made in stays whatever the operator forces (release-node
    /// keeps it), unless `doubtful` (the writer's name in doubt after etcd's restore).
    pub fn store_changed(
        &self,
        before: &[StoreBlock],
        after: &[StoreBlock],
        by: &str,
        excused: impl Fn(usize) -> bool,
        overlaps: bool,
        doubtful: bool,
    ) -> Result<(), String> {
        for (i, (a, ao, _)) in after.iter().enumerate().filter(|_| !overlaps) {
            for (b, bo, _) in &after[i + 1..] {
                if a.contains(&b.network()) || b.contains(&a.network()) {
                    return Err(format!(
                        "the store has blocks {a} ({ao}'s) and {b} ({bo}'s) over one range"
                    ));
                }
            }
        }
        let now: BTreeSet<(IpNet, &String)> = after.iter().map(|(b, o, _)| (*b, o)).collect();
        for (block, owner, _) in before {
            if now.contains(&(*block, owner)) {
                continue;
            }
            let used = self.pods.iter().find(|(_, p)| {
                &p.node == owner
                    && p.excused.is_none()
                    && !excused(p.slot)
                    && p.ips.iter().any(|ip| {
                        // In it, and in no other block of its node's (one of another size may
                        // stand over it, and hold the address).
                        block.contains(ip)
                            && !after.iter().any(|(b, o, _)| o == owner && b.contains(ip))
                    })
            });
            if let Some((c, p)) = used {
                return Err(format!(
                    "block {block} of {owner} given back (by {by}) while {c} holds {:?} in it",
                    p.ips
                ));
            }
            // Nor while a pod on another node holds a fixed address in it (its next owner
            // would hand the address out).
            let hosted = self.pods.iter().find(|(_, p)| {
                p.owner.is_some()
                    && &p.node != owner
                    && p.excused.is_none()
                    && !doubtful
                    && p.ips.iter().any(|ip| {
                        block.contains(ip) && !after.iter().any(|(b, _, _)| b.contains(ip))
                    })
            });
            if let Some((c, p)) = hosted {
                return Err(format!(
                    "block {block} of {owner} given back (by {by}) while {c} on {} holds the fixed {:?} in it",
                    p.node, p.ips
                ));
            }
        }
        Ok(())
    }
}
