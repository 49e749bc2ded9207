//! ipoold's pod GC, in the runs that have it ([`crate::Options::pod_gc`]; issue 54, item 1),
//! and the container runtime's part:
//! - a pod's sandbox gone without a DEL (the runtime lost it, the machine rebooted: the
//!   kubelet never runs the DEL), its pod deleted from the apiserver or left there Failed;
//! - a pod force-deleted from the apiserver while its sandbox runs (`kubectl delete --force`,
//!   a node cut off): a StatefulSet's controller makes the ordinal's next pod at once, under
//!   the same name with another UID, and the old sandbox ends later, with its DEL or without;
//! - a check of a daemon's GC: `k8s::gc::check`, ipoold's own code, asking the apiserver (its
//!   watch cache of the node's pods, which may be behind, and a live GET, which may fail) and
//!   the runtime (its ready sandboxes; it may not answer) as the world has them.
//!
//! The checker holds an address in use while its pod's sandbox runs, whatever the apiserver
//! says; a pod gone without a DEL holds nothing from then on, and L1 wants its address back by
//! the end of the quiet. The sandboxes' network namespaces are never seen (they are under
//! [`crate::daemon::NETNS_DIR`], which no machine has), so the GC judges by the apiserver and
//! the runtime alone, the harder case.

use std::collections::BTreeMap;
use std::sync::Arc;

use ipool_server::cluster::pin::PinOwner;
use ipool_server::k8s::cri::{CriUnanswered, SandboxPod};
use ipool_server::k8s::gc::{PodLookup, Sandboxes};
use ipool_server::k8s::pods::PodGetFailed;
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};

use crate::world::World;

pub(crate) mod state;

/// The simulated pods' namespace.
const NAMESPACE: &str = "sim";

/// The grace the simulated GC checks with (ipoold's `[kubernetes] gc_grace_secs`; the
/// daemons here have no `[kubernetes]` table, so no sticky pod's reservation is made).
pub(crate) const GRACE_SECS: u64 = 4;

/// A pod object as the apiserver would serve it (what the GC reads of it).
fn object(name: &str, container: &str, node: &str, phase: &str) -> Pod {
    let mut p = Pod::default();
    p.metadata.namespace = Some(NAMESPACE.into());
    p.metadata.name = Some(name.into());
    p.metadata.uid = Some(format!("uid-{container}"));
    p.spec = Some(PodSpec {
        node_name: Some(node.into()),
        ..Default::default()
    });
    p.status = Some(PodStatus {
        phase: Some(phase.into()),
        ..Default::default()
    });
    p
}

/// A container's number (`c12`: 12), so that the newest pod of a name is the apiserver's.
fn number(container: &str) -> u64 {
    container[1..].parse().unwrap_or(0)
}

impl World {
    /// The pod name of `container`.
    fn pod_name(&self, container: &str) -> String {
        self.pod_gc
            .names
            .get(container)
            .cloned()
            .unwrap_or_else(|| container.to_string())
    }

    /// The pods as the apiserver has them now, by name: every pod that runs or whose ADD is
    /// on its way (but those force-deleted), and those left Failed; of two under one name,
    /// the newer.
    fn apiserver_pods(&self) -> BTreeMap<String, (u64, Arc<Pod>)> {
        let mut pods: BTreeMap<String, (u64, Arc<Pod>)> = BTreeMap::new();
        let mut put = |name: String, container: &str, node: &str, phase: &str| {
            let n = number(container);
            if pods.get(&name).is_none_or(|(m, _)| *m < n) {
                let obj = Arc::new(object(&name, container, node, phase));
                pods.insert(name, (n, obj));
            }
        };
        for (c, (name, node)) in &self.pod_gc.failed {
            put(name.clone(), c, node, "Failed");
        }
        let running = self.checker.pods.iter().map(|(c, p)| (c, p.slot));
        let adding = self.kubelet.adding.iter().map(|(c, a)| (c, a.slot));
        for (c, slot) in running.chain(adding) {
            if self.pod_gc.force_deleted.contains(c) {
                continue;
            }
            let node = self.setting.k8s_node(&self.slots[slot].name);
            put(self.pod_name(c), c, &node, "Running");
        }
        pods
    }

    /// The pods whose sandboxes run ready on slot `i`'s machine.
    fn ready_sandboxes(&self, i: usize) -> Vec<SandboxPod> {
        self.checker
            .pods
            .iter()
            .filter(|(_, p)| p.slot == i)
            .map(|(c, _)| SandboxPod {
                namespace: NAMESPACE.into(),
                name: self.pod_name(c),
                uid: format!("uid-{c}"),
            })
            .collect()
    }
}

/// The apiserver as one GC check of a node sees it.
struct ApiView {
    node: String,
    cache: BTreeMap<String, Arc<Pod>>,
    /// The live GET's answers, or its failure.
    live: Result<BTreeMap<String, Arc<Pod>>, String>,
}

#[async_trait::async_trait]
impl PodLookup for ApiView {
    fn node(&self) -> &str {
        &self.node
    }

    fn grace_secs(&self) -> u64 {
        GRACE_SECS
    }

    fn cached(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        (namespace == NAMESPACE)
            .then(|| self.cache.get(name).cloned())
            .flatten()
    }

    async fn get_live(&self, namespace: &str, name: &str) -> Result<Option<Pod>, PodGetFailed> {
        match &self.live {
            Ok(pods) if namespace == NAMESPACE => Ok(pods.get(name).map(|p| (**p).clone())),
            Ok(_) => Ok(None),
            Err(e) => Err(PodGetFailed(e.clone())),
        }
    }
}

/// The runtime as one GC check sees it.
struct RuntimeView(Result<Vec<SandboxPod>, String>);

#[async_trait::async_trait]
impl Sandboxes for RuntimeView {
    async fn ready_sandboxes(&self) -> Result<Vec<SandboxPod>, CriUnanswered> {
        self.0.clone().map_err(CriUnanswered)
    }
}

/// A check of slot `i`'s pod GC. `faults`: its watch cache may be behind (kept as it was, one
/// time in two), and its GET and the runtime may not answer (one time in eight each).
pub(crate) fn check_on(w: &mut World, i: usize, faults: bool) -> Result<(), String> {
    let Some(d) = w.slots[i].daemon.as_ref() else {
        return Ok(());
    };
    let id = d.id;
    // What the GC's last check let go of: never a pod's whose sandbox runs.
    w.checker.held_by(i, &d.held())?;
    let node = w.setting.k8s_node(&w.slots[i].name);
    let pods = w.apiserver_pods();
    let behind = faults && w.choices.pick(2) == 0 && w.pod_gc.caches.contains_key(&id);
    if !behind {
        let mine = pods
            .iter()
            .filter(|(_, (_, p))| ipool_server::k8s::meta::node_of(p) == node)
            .map(|(n, (_, p))| (n.clone(), p.clone()))
            .collect();
        w.pod_gc.caches.insert(id, mine);
    }
    let get_fails = faults && w.choices.pick(8) == 0;
    let runtime_silent = faults && w.choices.pick(8) == 0;
    let live = match get_fails {
        true => Err("simulated: the apiserver does not answer".to_string()),
        false => Ok(pods.into_iter().map(|(n, (_, p))| (n, p)).collect()),
    };
    let runtime = match runtime_silent {
        true => Err("simulated: the runtime does not answer".to_string()),
        false => Ok(w.ready_sandboxes(i)),
    };
    w.note(format!(
        "{}'s pod GC checks (its cache {}{}{})",
        w.slots[i].name,
        match behind {
            true => "behind",
            false => "caught up",
        },
        match get_fails {
            true => ", its GET unanswered",
            false => "",
        },
        match runtime_silent {
            true => ", the runtime silent",
            false => "",
        },
    ));
    let view = ApiView {
        node,
        cache: w.pod_gc.caches.get(&id).cloned().unwrap_or_default(),
        live,
    };
    if let Some(d) = w.slots[i].daemon.as_mut() {
        d.collect(Arc::new(view), Arc::new(RuntimeView(runtime)));
    }
    Ok(())
}

/// A pod that runs, not being deleted, on a slot picked among those that have one.
fn live_pod(w: &mut World, force_deleted: bool) -> Option<(String, usize)> {
    let pods: Vec<(String, usize)> = w
        .checker
        .pods
        .iter()
        .filter(|(c, _)| w.pod_gc.force_deleted.contains(*c) == force_deleted)
        // A VM's launcher is force-deleted only with its VMI made again (`remake_vmi`): the
        // world's KubeVirt would take the next launcher of the same instance for a
        // migration's target.
        .filter(|(c, _)| force_deleted || !w.pod_name(c).starts_with("virt-launcher-"))
        .filter(|(c, _)| !w.kubelet.dels.contains_key(*c) && !w.kubelet.owed.contains_key(*c))
        .map(|(c, p)| (c.clone(), p.slot))
        .collect();
    match pods.len() {
        0 => None,
        n => Some(pods[w.choices.pick(n as u32) as usize].clone()),
    }
}

/// `c`'s sandbox on `slot` is gone without a DEL: nothing runs there any more, and nobody
/// will ask its daemon to let go. Its pod is deleted, or (one time in two) left Failed.
fn vanish(w: &mut World, c: &str, slot: usize) {
    let failed = !w.pod_gc.force_deleted.remove(c) && w.choices.pick(2) == 0;
    let node = w.setting.k8s_node(&w.slots[slot].name);
    w.note(format!(
        "{c}'s sandbox on {} gone without a DEL{}",
        w.slots[slot].name,
        match failed {
            true => ", its pod left Failed",
            false => "",
        }
    ));
    if failed {
        let name = w.pod_name(c);
        w.pod_gc.failed.insert(c.to_string(), (name, node));
    }
    w.checker.deleting(c);
}

/// A step of the pods' part: a GC check (half the time), a sandbox gone without its DEL, a
/// pod force-deleted while its sandbox runs, or the sandbox of one force-deleted ending; in
/// the runs that make VMs' instances again, one step in four that.
pub(crate) fn step(w: &mut World) -> Result<(), String> {
    if w.opts.remade_vmis && w.choices.pick(4) == 0 {
        remake_vmi(w);
        return Ok(());
    }
    match w.choices.pick(8) {
        0..=3 => {
            if let Some(i) = crate::nodes::running(w) {
                check_on(w, i, true)?;
            }
        }
        4 => {
            if let Some((c, slot)) = live_pod(w, false) {
                vanish(w, &c, slot);
            }
        }
        5 => {
            if let Some((c, slot)) = live_pod(w, false) {
                w.note(format!(
                    "{c} on {} force-deleted from the apiserver while its sandbox runs",
                    w.slots[slot].name
                ));
                w.pod_gc.force_deleted.insert(c);
            }
        }
        _ => {
            if let Some((c, slot)) = live_pod(w, true) {
                end_sandbox(w, &c, slot, true)?;
            }
        }
    }
    Ok(())
}

/// KubeVirt makes a VM's instance again under its name: its launcher pod (picked among the
/// VMs' that run alone, their VMs not gone) is force-deleted while its sandbox runs (a node
/// cut off, a remediation), the VirtualMachineInstance goes with it, and the VM's controller
/// makes a new one (another uid) with a launcher the scheduler puts on a node it picks
/// (possibly the same), whose ADD is sent now. That launcher is no migration's target: it may
/// not share the address with the old one, which still runs (the checker: `may_share`).
pub(crate) fn remake_vmi(w: &mut World) {
    let launchers: Vec<(String, usize, PinOwner)> = w
        .checker
        .pods
        .iter()
        .filter(|(c, p)| {
            p.excused.is_none()
                && !w.pod_gc.force_deleted.contains(*c)
                && !w.kubelet.dels.contains_key(*c)
                && !w.kubelet.owed.contains_key(*c)
        })
        .filter_map(|(c, p)| {
            let owner = PinOwner::parse(p.owner.as_deref()?).ok()?;
            owner.is_vm().then(|| (c.clone(), p.slot, owner))
        })
        .filter(|(_, _, o)| crate::fixed::owner_gone(w, o).is_none())
        .filter(|(_, _, o)| crate::fixed::pods_of(w, o).0.len() == 1)
        .collect();
    if launchers.is_empty() {
        return;
    }
    let (c, slot, owner) = launchers[w.choices.pick(launchers.len() as u32) as usize].clone();
    let Some(i) = crate::nodes::running(w) else {
        return;
    };
    w.note(format!(
        "{c}, {owner}'s launcher on {}, force-deleted while its sandbox runs: KubeVirt makes its instance again, with a launcher on {}",
        w.slots[slot].name, w.slots[i].name
    ));
    w.pod_gc.force_deleted.insert(c);
    *w.pod_gc.vmis.entry(owner.to_string()).or_default() += 1;
    crate::nodes::add_pod(w, i, Vec::new(), Some(owner));
}

/// The sandbox of `c` (force-deleted) ends: the kubelet's DEL, or (`may_vanish`, one time in
/// two) none.
fn end_sandbox(w: &mut World, c: &str, slot: usize, may_vanish: bool) -> Result<(), String> {
    // Its address was kept while the sandbox ran, whatever the apiserver said.
    if let Some(d) = &w.slots[slot].daemon {
        w.checker.held_by(slot, &d.held())?;
    }
    if may_vanish && w.choices.pick(2) == 0 {
        vanish(w, c, slot);
        return Ok(());
    }
    w.pod_gc.force_deleted.remove(c);
    match w.slots[slot].daemon.is_some() {
        true => crate::nodes::del_pod(w, c, slot),
        false => {
            w.checker.deleting(c);
            w.kubelet.owed.insert(c.to_string(), slot);
        }
    }
    Ok(())
}

/// The wind-down: the kubelet ends the sandboxes of the pods force-deleted, with their DELs
/// (it kills a sandbox whose pod the apiserver no longer has).
pub(crate) fn wind_down(w: &mut World) -> Result<(), String> {
    let pods: Vec<(String, usize)> = w
        .pod_gc
        .force_deleted
        .iter()
        .filter_map(|c| Some((c.clone(), w.checker.pods.get(c)?.slot)))
        .collect();
    for (c, slot) in pods {
        end_sandbox(w, &c, slot, false)?;
    }
    w.pod_gc.force_deleted.clear();
    Ok(())
}

/// The quiet's turn: a check of every running daemon's GC, its cache caught up.
pub(crate) fn quiet_turn(w: &mut World) -> Result<(), String> {
    for i in 0..w.slots.len() {
        check_on(w, i, false)?;
    }
    Ok(())
}
