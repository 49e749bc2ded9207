//! What happens to the nodes: pods added and deleted, daemons killed and restarted with their
//! state dir kept, or wiped (the node and its pods gone), store connections cut and healed, a
//! second daemon started under a node's name.

use ipool_server::cluster::pin::PinOwner;

use crate::world::World;

/// A random running daemon's slot.
pub(crate) fn running(w: &mut World) -> Option<usize> {
    let up: Vec<usize> = (0..w.slots.len())
        .filter(|i| w.slots[*i].daemon.is_some())
        .collect();
    match up.len() {
        0 => None,
        n => Some(up[w.choices.pick(n as u32) as usize]),
    }
}

/// A slot of the nodes proper (not a twin).
pub(crate) fn node_slot(w: &mut World) -> usize {
    w.choices.pick(w.opts.nodes as u32) as usize
}

/// A node's Node object deleted while its machine runs (an operator's `kubectl delete node`,
/// a cloud controller that thought the machine gone), or made again under its name: the
/// release of departed nodes then finds the Node gone while the daemon may hold its name.
pub(crate) fn delete_or_remake_node(w: &mut World) {
    let i = node_slot(w);
    let name = w.slots[i].name.clone();
    let node = w.setting.k8s_node(&name);
    match w.nodes_deleted.remove(&name) {
        true => w.note(format!("the Node {node} of {name} made again")),
        false => {
            w.nodes_deleted.insert(name.clone());
            w.note(format!(
                "the Node {node} of {name} deleted while its machine runs"
            ));
        }
    }
}

/// An ADD of a new pod on slot `i`.
pub(crate) fn add(w: &mut World, i: usize) {
    add_asking(w, i, Vec::new());
}

/// An ADD of a new pod on slot `i`, asking for `requested` (a static address: CNI args' `IP=`).
pub(crate) fn add_asking(w: &mut World, i: usize, requested: Vec<std::net::IpAddr>) {
    add_pod(w, i, requested, None);
}

/// An ADD of a new pod on slot `i`, asking for `requested`; `owner`: its address is fixed for
/// that owner (see `crate::fixed`).
pub(crate) fn add_pod(
    w: &mut World,
    i: usize,
    requested: Vec<std::net::IpAddr>,
    owner: Option<PinOwner>,
) {
    w.kubelet.next_container += 1;
    let c = format!("c{}", w.kubelet.next_container);
    let syncs = w.pool_sync_counts(i).unwrap_or([0; 4]);
    let instance = owner.as_ref().and_then(|o| w.pod_gc.instance(o));
    w.kubelet.adding.insert(
        c.clone(),
        crate::kubelet::Adding {
            slot: i,
            syncs,
            owner: owner.clone(),
            instance: instance.clone(),
        },
    );
    let done = w.done.clone();
    if !requested.is_empty() {
        w.note(format!(
            "ADD {c} on {} asks for {requested:?}",
            w.slots[i].name
        ));
    }
    let fixed = owner.map(|o| {
        w.note(format!(
            "ADD {c} on {}: a pod of {o}, its address fixed",
            w.slots[i].name
        ));
        let pod = crate::owners::pod_name(&o, &c);
        w.pod_gc.name(&c, &pod);
        // The controller deleted a pod of that name left Failed before it made this one.
        w.pod_gc.failed.retain(|_, (name, _)| *name != pod);
        (o, pod, instance)
    });
    if let Some(d) = w.slots[i].daemon.as_mut() {
        d.add(&c, requested, fixed, &done);
    }
}

/// A DEL of the oldest live pod whose daemon runs (the exhaustive walk's).
pub(crate) fn del_oldest(w: &mut World) {
    let oldest = w
        .checker
        .pods
        .iter()
        .filter(|(_, p)| w.slots[p.slot].daemon.is_some())
        .min_by_key(|(_, p)| p.at)
        .map(|(c, p)| (c.clone(), p.slot));
    if let Some((c, slot)) = oldest {
        del(w, &c, slot);
    }
}

/// A DEL of `c` on slot `slot`: its addresses may go to others from now.
/// A DEL of pod `c` on `slot` (its pod deleted).
pub(crate) fn del_pod(w: &mut World, c: &str, slot: usize) {
    del(w, c, slot);
}

fn del(w: &mut World, c: &str, slot: usize) {
    w.kubelet.owed.remove(c);
    w.kubelet.dels.insert(c.to_string(), slot);
    w.checker.deleting(c);
    w.note(format!("DEL {c} on {}", w.slots[slot].name));
    let done = w.done.clone();
    if let Some(d) = w.slots[slot].daemon.as_mut() {
        d.del(c, &done);
    }
}

/// A DEL: one owed first (the kubelet retries them), else a random live pod's.
pub(crate) fn del_some(w: &mut World) {
    let owed: Vec<(String, usize)> = w
        .kubelet
        .owed
        .iter()
        .filter(|(_, s)| w.slots[**s].daemon.is_some())
        .map(|(c, s)| (c.clone(), *s))
        .collect();
    let (c, slot) = match owed.len() {
        0 => {
            let live: Vec<(String, usize)> = w
                .checker
                .pods
                .iter()
                .filter(|(_, p)| w.slots[p.slot].daemon.is_some())
                .map(|(c, p)| (c.clone(), p.slot))
                .collect();
            if live.is_empty() {
                return;
            }
            live[w.choices.pick(live.len() as u32) as usize].clone()
        }
        n => owed[w.choices.pick(n as u32) as usize].clone(),
    };
    del(w, &c, slot);
}

pub(crate) fn kill_or_restart(w: &mut World) -> Result<(), String> {
    // A stopped one started half the time: daemons are down for seconds, not minutes.
    let down: Vec<usize> = (0..w.slots.len())
        .filter(|i| w.slots[*i].daemon.is_none() && w.slots[*i].twin_of.is_none())
        .collect();
    let i = match (down.len(), w.choices.pick(2)) {
        (0, _) | (_, 0) => w.choices.pick(w.slots.len() as u32) as usize,
        (n, _) => down[w.choices.pick(n as u32) as usize],
    };
    if w.slots[i].twin_of.is_some() && w.slots[i].daemon.is_none() {
        return Ok(());
    }
    match w.slots[i].daemon.is_some() {
        true => {
            w.note(format!("{} killed (-9)", w.slots[i].name));
            w.kill(i);
            Ok(())
        }
        false => {
            // Now and then with its network renamed in the config, or named as before again.
            let renames = w.swarm.renames && w.choices.pick(3) == 0;
            if !renames {
                return w.start(i);
            }
            let name_of = |renamed| match renamed {
                true => crate::daemon::RENAMED,
                false => crate::daemon::NETWORK,
            };
            w.slots[i].renamed = !w.slots[i].renamed;
            w.note(format!(
                "{} starts with its network named {:?} in the config",
                w.slots[i].name,
                name_of(w.slots[i].renamed)
            ));
            match w.start(i) {
                // The pool given to a network of another name while the old one holds
                // addresses of it: refused (docs/cluster-mode.md), and started as before.
                Err(e) if e.contains("is not in the config any more") => {
                    w.slots[i].renamed = !w.slots[i].renamed;
                    w.note(format!(
                        "refused ({e}): started with its network named {:?} again",
                        name_of(w.slots[i].renamed)
                    ));
                    w.start(i)
                }
                r => r,
            }
        }
    }
}

/// A node's daemon killed and its state dir wiped: the node and its pods are gone (until it
/// starts again, as a new instance).
pub(crate) fn wipe(w: &mut World) -> Result<(), String> {
    let i = node_slot(w);
    if w.slots[i].daemon.is_none() && w.slots[i].gone {
        return w.start(i);
    }
    w.note(format!(
        "{} killed and its state dir wiped: gone",
        w.slots[i].name
    ));
    w.kill(i);
    w.slots[i].disk = std::sync::Arc::new(ipool_server::store::MemStore::new());
    w.slots[i].instance += 1;
    w.slots[i].gone = true;
    w.checker.wiped(i);
    w.kubelet.owed.retain(|_, s| *s != i);
    w.kubelet.dels.retain(|_, s| *s != i);
    Ok(())
}

pub(crate) fn cut_or_heal(w: &mut World) {
    // One time in six the store is cut off from every node at once (etcd down, the
    // apiserver's load balancer gone), or back for all.
    if w.choices.pick(6) == 5 {
        let cut = !(0..w.slots.len()).any(|i| w.net.is_cut(i));
        w.note(format!(
            "the store {} every node",
            if cut { "cut off from" } else { "back for" }
        ));
        for i in 0..w.slots.len() {
            w.net.set_cut(i, cut);
        }
        return;
    }
    // A cut one healed half the time: cuts last seconds, not minutes.
    let cut_ones: Vec<usize> = (0..w.slots.len()).filter(|i| w.net.is_cut(*i)).collect();
    let i = match (cut_ones.len(), w.choices.pick(2)) {
        (0, _) | (_, 0) => w.choices.pick(w.slots.len() as u32) as usize,
        (n, _) => cut_ones[w.choices.pick(n as u32) as usize],
    };
    cut_or_heal_one(w, i);
}

/// Slot `i`'s store connection cut, or healed if it was.
pub(crate) fn cut_or_heal_one(w: &mut World, i: usize) {
    let cut = w.net.is_cut(i);
    w.net.set_cut(i, !cut);
    w.note(format!(
        "{}'s store connection {}",
        w.slots[i].name,
        if cut { "healed" } else { "cut" }
    ));
}

/// A second daemon under a running node's name for a while (it must hold back), or stopped.
pub(crate) fn twin(w: &mut World) -> Result<(), String> {
    if let Some(t) = (0..w.slots.len()).find(|t| w.slots[*t].twin_of.is_some()) {
        if w.slots[t].daemon.is_some() {
            w.note(format!(
                "the second daemon under {}'s name stopped",
                w.slots[t].name
            ));
            w.kill(t);
            w.checker.wiped(t);
            w.kubelet.owed.retain(|_, s| *s != t);
            return Ok(());
        }
        return Ok(());
    }
    let i = node_slot(w);
    if w.slots[i].daemon.is_none() {
        return Ok(());
    }
    let name = w.slots[i].name.clone();
    let instance = 1000 + w.slots.len() as u64;
    w.slots.push(crate::world::Slot::new(
        name.clone(),
        std::sync::Arc::new(ipool_server::store::MemStore::new()),
        instance,
        Some(i),
    ));
    let t = w.slots.len() - 1;
    w.note(format!(
        "a second daemon started under {name}'s name (slot {t})"
    ));
    w.start(t)
}
