//! Pods with fixed addresses for the randomized fault test: four ordinals of a
//! StatefulSet and two KubeVirt VMs, their objects on the fake apiserver, and Kubernetes' part
//! as it runs them: at most one pod of an ordinal (a new one once the old one's DEL was called
//! or its node is gone), one launcher pod of a VM, and two during a live migration, on two
//! nodes.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde_json::json;

use super::fake_api::FakeApi;

pub const NAMESPACE: &str = "db";
/// The range the nemesis pool sets aside (`--exclude`): StatefulSet `kv`'s ordinals choose
/// their addresses there (`ipool.io/ips-by-ordinal`), from its second address on.
pub const SET_ASIDE: &str = "10.80.1.240/28";
const CHOSEN: &str = "10.80.1.241,10.80.1.242,10.80.1.243,10.80.1.244";
/// Ordinals 0 and 1 are StatefulSet `web`'s (an address as any pod's, then pinned), 2 and 3
/// `kv`'s (chosen).
const ORDINALS: u64 = 4;
const VMS: u64 = 2;
/// How many owners a pick chooses from.
pub const OWNERS: u64 = ORDINALS + VMS;

/// A pod to add: its owner, its node, its CNI_ARGS.
pub struct FixedAdd {
    pub owner: String,
    pub node: usize,
    pub args: String,
}

/// Each owner's pods that run (node, container), and whether an ADD of one is on its way.
/// An owner's pods that run (node, container), and whether an ADD of one is on its way.
type Owned = (Vec<(usize, String)>, bool);

#[derive(Default)]
pub struct FixedPods {
    owners: Mutex<BTreeMap<String, Owned>>,
    /// Each owner's node of its last pod answered.
    last: Mutex<BTreeMap<String, usize>>,
    /// ADDs answered: in all, on another node than the owner's last pod, a VM's second
    /// launcher (a migration).
    pub counts: Mutex<FixedCounts>,
}

#[derive(Clone, Debug, Default)]
pub struct FixedCounts {
    pub added: usize,
    pub moved: usize,
    pub migrated: usize,
    /// Of those added, served the address their owner chose.
    pub chosen: usize,
}

impl FixedPods {
    /// The owners made on `api` (the StatefulSet, the VMs, their namespace), and the `nodes`.
    pub fn new(api: &FakeApi, nodes: &[String]) -> FixedPods {
        for n in nodes {
            api.put("nodes", json!({"metadata": {"name": n}}));
        }
        api.put("namespaces", json!({"metadata": {"name": NAMESPACE}}));
        for (name, uid) in [("web", "s1"), ("kv", "s2")] {
            api.put(
                "statefulsets",
                json!({"apiVersion": "apps/v1", "metadata": {"namespace": NAMESPACE, "name": name, "uid": uid},
                       "spec": {"replicas": ORDINALS}}),
            );
        }
        for v in 0..VMS {
            api.put(
                "virtualmachines",
                json!({"apiVersion": "kubevirt.io/v1", "metadata": {"namespace": NAMESPACE, "name": format!("vm{v}")}}),
            );
        }
        FixedPods::default()
    }

    /// A new pod of owner `pick` (below [`OWNERS`]) for container `c`, on a node `spot` picks
    /// among those it may run on, put on `api`; None when its owner may not have one now (a
    /// StatefulSet's ordinal that has a pod, a VM with two, or an ADD of it on its way).
    pub fn next(
        &self,
        api: &FakeApi,
        pick: u64,
        spot: u64,
        nodes: &[String],
        c: &str,
    ) -> Option<FixedAdd> {
        let vm = pick >= ORDINALS;
        let set = if pick < 2 { "web" } else { "kv" };
        let owner = match vm {
            false => format!("StatefulSet/{NAMESPACE}/{set}/{pick}"),
            true => format!("VirtualMachine/{NAMESPACE}/vm{}", pick - ORDINALS),
        };
        let (node, migration) = {
            let mut owners = self.owners.lock().unwrap();
            let (pods, adding) = owners.entry(owner.clone()).or_default();
            let allowed: Vec<usize> = match (vm, pods.as_slice()) {
                (_, _) if *adding => return None,
                (_, []) => (0..nodes.len()).collect(),
                // A live migration: to another node.
                (true, [(from, _)]) => (0..nodes.len()).filter(|n| n != from).collect(),
                _ => return None,
            };
            if allowed.is_empty() {
                return None;
            }
            *adding = true;
            (
                allowed[(spot % allowed.len() as u64) as usize],
                !pods.is_empty(),
            )
        };
        let uid = format!("uid-{c}");
        let (name, meta) = match vm {
            false if set == "web" => (
                format!("web-{pick}"),
                json!({"annotations": {"ipool.io/fixed": "true"},
                       "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "s1", "controller": true}]}),
            ),
            false => (
                format!("kv-{pick}"),
                json!({"annotations": {"ipool.io/fixed": "true", "ipool.io/ips-by-ordinal": CHOSEN},
                       "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "kv", "uid": "s2", "controller": true}]}),
            ),
            true => {
                let vm = format!("vm{}", pick - ORDINALS);
                let mut labels = json!({"vm.kubevirt.io/name": vm});
                if migration {
                    // KubeVirt's migration, and its target pod labelled with it.
                    let uid = format!("mig-{vm}-{c}");
                    api.put(
                        "virtualmachineinstancemigrations",
                        json!({"apiVersion": "kubevirt.io/v1",
                               "metadata": {"namespace": NAMESPACE, "name": format!("{vm}-{c}"), "uid": uid},
                               "spec": {"vmiName": vm}, "status": {"phase": "Scheduling"}}),
                    );
                    labels["kubevirt.io/migrationJobUID"] = json!(uid);
                }
                (
                    format!("virt-launcher-{vm}-{c}"),
                    json!({"annotations": {"ipool.io/fixed": "true"}, "labels": labels,
                           "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": vm, "uid": format!("vmi-{vm}"), "controller": true}]}),
                );
                (
                    format!("virt-launcher-{vm}-{c}"),
                    json!({"annotations": {"ipool.io/fixed": "true"}, "labels": {"vm.kubevirt.io/name": vm},
                           "ownerReferences": [{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance", "name": vm, "uid": format!("vmi-{vm}"), "controller": true}]}),
                )
            }
        };
        let mut m = json!({"namespace": NAMESPACE, "name": name, "uid": uid});
        for (k, v) in meta.as_object().unwrap() {
            m[k] = v.clone();
        }
        api.put(
            "pods",
            json!({"metadata": m, "spec": {"nodeName": nodes[node], "containers": [{"name": "c", "image": "x"}]}}),
        );
        Some(FixedAdd {
            owner,
            node,
            args: format!("K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME={name};K8S_POD_UID={uid}"),
        })
    }

    /// The address `owner` chose, if it chose one (StatefulSet `kv`'s ordinals).
    pub fn chosen_for(owner: &str) -> Option<std::net::IpAddr> {
        let ordinal: usize = owner
            .strip_prefix(&format!("StatefulSet/{NAMESPACE}/kv/"))?
            .parse()
            .ok()?;
        CHOSEN.split(',').nth(ordinal)?.parse().ok()
    }

    /// The ADD of `owner`'s pod `c` on `node` was answered (`ok`: it runs).
    pub fn answered(&self, owner: &str, node: usize, c: &str, ok: bool) {
        let mut owners = self.owners.lock().unwrap();
        let (pods, adding) = owners.entry(owner.to_string()).or_default();
        *adding = false;
        if ok {
            let mut counts = self.counts.lock().unwrap();
            counts.added += 1;
            counts.migrated += usize::from(!pods.is_empty());
            let last = self.last.lock().unwrap().insert(owner.to_string(), node);
            counts.moved += usize::from(last.is_some_and(|l| l != node));
            pods.push((node, c.to_string()));
        }
    }

    /// The first DEL of `c` was called: its owner may have another pod from now.
    pub fn deleting(&self, c: &str) {
        for (pods, _) in self.owners.lock().unwrap().values_mut() {
            pods.retain(|(_, x)| x != c);
        }
    }

    /// Node `node` was wiped: its pods are gone with it.
    pub fn wiped(&self, node: usize) {
        for (pods, _) in self.owners.lock().unwrap().values_mut() {
            pods.retain(|(n, _)| *n != node);
        }
    }
}
