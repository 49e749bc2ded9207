//! Pods with fixed addresses, in the runs whose swarm has pins: four ordinals of
//! one StatefulSet and two VMs own them, and their ADDs and DELs take the pins' path as
//! ipoold's do (`ipool_server::service::fixed`). Kubernetes' part is played as it runs them:
//! a StatefulSet has at most one pod of an ordinal (a new one once the old one's DEL was
//! called, its node is gone, or it was force-deleted: `crate::pod_gc`); a VM has one launcher pod, and two during a live migration,
//! on two nodes. The checker lets two pods hold one address only when they are two launchers
//! of one VM; it checks every fixed address handed out against the pins in the store.

use std::net::IpAddr;

use ipool_server::cluster::pin::{Pin, PinOwner};

use crate::nodes::{add, add_pod, del_pod};
use crate::owners::{owner, GoneOwners, ORDINALS, VMS};
use crate::world::World;

/// Why `owner` is gone, if it is (its StatefulSet scaled down past its ordinal, its VM
/// deleted), as the apiserver would say.
pub(crate) fn owner_gone(w: &World, owner: &PinOwner) -> Option<String> {
    w.owners_gone.get(&owner.to_string()).cloned()
}

/// The controllers' part: an owner goes (its StatefulSet scaled down below the ordinal, its
/// VM deleted; its pods deleted, each DEL made as the kubelet makes it), or one gone comes
/// back (scaled up, made again: its next pod takes the pinned address if its pin stands).
pub(crate) fn owner_goes_or_comes(w: &mut World) {
    let o = owner(w.choices.pick(ORDINALS + VMS));
    let shown = o.to_string();
    if w.owners_gone.remove(&shown).is_some() {
        w.note(format!("{o} is back"));
        return;
    }
    let why = match &o {
        PinOwner::StatefulSet { ordinal, .. } => {
            format!("StatefulSet sim/db scaled to {ordinal} replicas")
        }
        PinOwner::VirtualMachine { .. } => format!("{o} and its instance are deleted"),
    };
    w.note(format!("{o} is gone: {why}"));
    w.owners_gone.insert(shown.clone(), why);
    let pods: Vec<(String, usize)> = w
        .checker
        .pods
        .iter()
        .filter(|(_, p)| p.owner.as_deref() == Some(shown.as_str()))
        .map(|(c, p)| (c.clone(), p.slot))
        .collect();
    for (c, slot) in pods {
        match w.slots[slot].daemon.is_some() {
            true => crate::nodes::del_pod(w, &c, slot),
            // Its node's daemon is down: the kubelet makes the DEL once it is back.
            false => {
                w.checker.deleting(&c);
                w.kubelet.owed.insert(c, slot);
            }
        }
    }
}

/// A turn of a running daemon's pin keeper.
pub(crate) fn keep_pins(w: &mut World) {
    let live: Vec<usize> = (0..w.slots.len())
        .filter(|i| w.slots[*i].daemon.is_some())
        .collect();
    if live.is_empty() {
        return;
    }
    let i = live[w.choices.pick(live.len() as u32) as usize];
    keep_pins_on(w, i);
}

/// A turn of slot `i`'s pin keeper.
pub(crate) fn keep_pins_on(w: &mut World, i: usize) {
    let owners = GoneOwners(w.owners_gone.clone());
    if let Some(d) = w.slots[i].daemon.as_mut() {
        d.keep_pins(owners);
    }
}

/// The slots of `owner`'s pods that run (answered, not excused) and of those on their way.
pub(crate) fn pods_of(w: &World, owner: &PinOwner) -> (Vec<usize>, usize) {
    let shown = owner.to_string();
    let live = w
        .checker
        .pods
        .iter()
        .filter(|(c, p)| {
            p.owner.as_deref() == Some(shown.as_str())
                && p.excused.is_none()
                && !w.pod_gc.replaced(c)
        })
        .map(|(_, p)| p.slot)
        .collect();
    let adding = w
        .kubelet
        .adding
        .values()
        .filter(|a| a.owner.as_ref() == Some(owner))
        .count();
    (live, adding)
}

/// An ADD on slot `i` of a new pod of an owner (picked) that has none and is not gone; a
/// plain one else.
pub(crate) fn add_fixed(w: &mut World, i: usize) {
    let o = owner(w.choices.pick(ORDINALS + VMS));
    match pods_of(w, &o) {
        (live, 0) if live.is_empty() && owner_gone(w, &o).is_none() => {
            add_pod(w, i, Vec::new(), Some(o))
        }
        _ => add(w, i),
    }
}

/// A VM's live migration: a second launcher pod on another node while the first runs.
pub(crate) fn migrate(w: &mut World) {
    let o = owner(ORDINALS + w.choices.pick(VMS));
    migrate_owner(w, o);
}

/// A rival of a write of `o`'s pin (`crate::provoke`), which writes that pin too: one of its
/// pods deleted (its hold let go), a VM's migration (a second hold), an ADD of its next pod
/// on a node (the pin taken over), or a pin keeper's turn on a node.
pub(crate) fn rival_of_owner(w: &mut World, o: &PinOwner) -> Result<(), String> {
    let shown = o.to_string();
    let pods: Vec<(String, usize)> = (w.checker.pods.iter())
        .filter(|(_, p)| p.owner.as_deref() == Some(shown.as_str()) && p.excused.is_none())
        .map(|(c, p)| (c.clone(), p.slot))
        .filter(|(c, slot)| w.slots[*slot].daemon.is_some() && !w.kubelet.dels.contains_key(c))
        .collect();
    match w.choices.pick(3) {
        0 if !pods.is_empty() => {
            let (c, slot) = pods[w.choices.pick(pods.len() as u32) as usize].clone();
            del_pod(w, &c, slot);
        }
        1 if o.is_vm() => migrate_owner(w, o.clone()),
        1 | 2 if pods_of(w, o) == (Vec::new(), 0) && owner_gone(w, o).is_none() => {
            if let Some(i) = crate::nodes::running(w) {
                add_pod(w, i, Vec::new(), Some(o.clone()));
            }
        }
        _ => keep_pins(w),
    }
    Ok(())
}

/// `o`'s live migration, if it is a VM with one launcher pod running.
fn migrate_owner(w: &mut World, o: PinOwner) {
    let (live, adding) = pods_of(w, &o);
    let ([from], 0) = (live.as_slice(), adding) else {
        return;
    };
    if owner_gone(w, &o).is_some() {
        return;
    }
    let source = w.slots[*from].name.clone();
    let targets: Vec<usize> = (0..w.slots.len())
        .filter(|t| w.slots[*t].daemon.is_some() && w.slots[*t].name != source)
        .collect();
    if targets.is_empty() {
        return;
    }
    let t = targets[w.choices.pick(targets.len() as u32) as usize];
    w.note(format!("{o} migrates from {source} to {}", w.slots[t].name));
    add_pod(w, t, Vec::new(), Some(o));
}

/// etcd's backup lacks a pin (made since) whose holder is not the node of the block it lies
/// in: a pod that moved, which a restore from the backup leaves on an address only the nodes'
/// memory keeps (docs/cluster-mode.md, a store reset).
pub(crate) fn moved_since_backup(w: &World) -> bool {
    let crate::store::Shared::Etcd(e) = &w.shared else {
        return false;
    };
    let blocks = w.shared.blocks();
    e.keys()
        .filter(|(k, _)| k.starts_with(b"/ipool/v1/pins/"))
        .filter(|(k, _)| e.backed_up(k) == Some(false))
        .filter_map(|(_, kv)| serde_json::from_slice::<Pin>(&kv.value).ok())
        .any(|pin| {
            let node = blocks
                .iter()
                .find(|(b, _, _)| b.contains(&pin.address))
                .map(|(_, o, _)| o);
            pin.holders.iter().any(|h| Some(&h.node) != node)
        })
}

/// etcd was restored from an older backup, its blocks `before`: the pods of before are
/// excused, but those whose pinned addresses their blocks' nodes knew (`check::Kept`).
pub(crate) fn restored(w: &mut World, before: &[crate::check::StoreBlock]) {
    let (after, slots) = (w.shared.blocks(), &w.slots);
    // A pin the node of its block knew, its daemon the name's only one.
    let knows = |node: &str, pool: &str, ip, owner: &str| {
        let mut d = slots
            .iter()
            .filter(|s| s.name == node)
            .filter_map(|s| s.daemon.as_ref());
        match (d.next(), d.next()) {
            (Some(d), None) => d
                .node
                .pin_at(pool, ip)
                .is_some_and(|p| p.owner.to_string() == owner),
            _ => false,
        }
    };
    w.checker
        .restored("etcd restored from an older backup", before, &after, knows);
}

/// A daemon of slot `i`'s name stopped or started: the pins its node kept since a restore
/// and not yet made again are the restore's doing (`check::Kept`).
pub(crate) fn node_changed(w: &mut World, i: usize) {
    if !w.checker.kept.is_empty() {
        let pins = w.shared.pins();
        w.checker.kept_node_changed(&w.slots[i].name, &pins);
    }
}

/// An IPv4 address of a block of slot `i`'s node's (as the store has them) that a pod with
/// a fixed address holds on another node (picked), if there is one.
pub(crate) fn hosted_elsewhere(w: &mut World, i: usize) -> Option<IpAddr> {
    let me = &w.slots[i].name;
    let mine: Vec<ipnet::IpNet> = w
        .shared
        .blocks()
        .into_iter()
        .filter(|(_, o, _)| o == me)
        .map(|(b, _, _)| b)
        .collect();
    let held: Vec<IpAddr> = w
        .checker
        .pods
        .values()
        .filter(|p| p.owner.is_some() && &p.node != me)
        .flat_map(|p| p.ips.iter().copied())
        .filter(|ip| ip.is_ipv4() && mine.iter().any(|b| b.contains(ip)))
        .collect();
    match held.len() {
        0 => None,
        n => Some(held[w.choices.pick(n as u32) as usize]),
    }
}
