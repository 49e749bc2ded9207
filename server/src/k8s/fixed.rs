//! `ipool.io/fixed`: a pod whose address follows it from node to node (a cluster pin, see
//! [`crate::cluster::pin`]). Set on a StatefulSet's pod template (the address keyed by the
//! StatefulSet and the pod's ordinal) or on a KubeVirt VirtualMachine's launcher pod (keyed by
//! the VM, its `vm.kubevirt.io/name` label). `"true"`: every network of the pod that ipool
//! serves from cluster pools; else the networks it names (`"macvlan-a,macvlan-b"`), for a pod
//! that also has a routed network whose addresses cannot follow it.

use ipool_proto::names::{check_name, shown};
use k8s_openapi::api::core::v1::Pod;

use super::annotation::BadAnnotation;
use crate::cluster::pin::hold::Migrations;
use crate::cluster::pin::PinOwner;

pub const FIXED: &str = "ipool.io/fixed";
/// On a StatefulSet's pod template beside [`FIXED`]: the address of each ordinal, in order
/// (`"10.0.0.240,10.0.0.241,10.0.0.242"`: ordinal 0 gets the first). They must lie in an
/// excluded range of the pool (set aside: no node hands them out but to their ordinal).
pub const IPS_BY_ORDINAL: &str = "ipool.io/ips-by-ordinal";
/// KubeVirt's label on a VM's launcher pods: the VirtualMachine (instance) they run.
pub const VM_LABEL: &str = "vm.kubevirt.io/name";
/// KubeVirt's label on a migration's target launcher pod: the migration's uid.
pub const MIGRATION_LABEL: &str = "kubevirt.io/migrationJobUID";

/// A pod's fixed address, as its annotation asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fixed {
    pub owner: PinOwner,
    /// The networks it is for; None: every network of cluster pools.
    pub networks: Option<Vec<String>>,
    /// The address its owner chose ([`IPS_BY_ORDINAL`]); None: the first ADD's.
    pub address: Option<std::net::IpAddr>,
    /// A VM launcher's: the uid of the VirtualMachineInstance that controls it.
    pub instance: Option<String>,
    /// A VM launcher's that is a migration's target: the uid of that
    /// VirtualMachineInstanceMigration ([`MIGRATION_LABEL`], set by KubeVirt).
    pub migration: Option<String>,
}

impl Fixed {
    /// Whether the pod's address on `network` is fixed.
    pub fn covers(&self, network: &str) -> bool {
        self.networks
            .as_ref()
            .is_none_or(|n| n.iter().any(|x| x == network))
    }
}

/// The fixed address `pod`'s annotation asks for (`who` names the pod in errors): None without
/// the annotation or with "false"; an error for a value that is neither "true", "false" nor a
/// list of network names, or for a pod that is neither a StatefulSet's nor a VM's.
pub fn fixed(pod: &Pod, who: &str) -> Result<Option<Fixed>, BadAnnotation> {
    let md = &pod.metadata;
    let Some(value) = md.annotations.as_ref().and_then(|a| a.get(FIXED)) else {
        return Ok(None);
    };
    let networks = match value.trim() {
        "false" => return Ok(None),
        "true" => None,
        list => {
            let names: Vec<String> = list
                .split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(str::to_string)
                .collect();
            let bad = |why: String| {
                BadAnnotation(format!(
                    "{who}: annotation {FIXED}={} is neither \"true\", \"false\" nor a list of network names: {why}",
                    shown(value)
                ))
            };
            if names.is_empty() {
                return Err(bad("it names no network".into()));
            }
            for n in &names {
                check_name("a network name", n).map_err(bad)?;
            }
            Some(names)
        }
    };
    let namespace = md.namespace.as_deref().unwrap_or_default();
    let name = md.name.as_deref().unwrap_or_default();
    let owners = md.owner_references.as_deref().unwrap_or_default();
    // Its controller: a StatefulSet, or (a launcher pod) the VirtualMachineInstance its VM
    // label names.
    let controller = owners.iter().find(|o| o.controller == Some(true));
    let statefulset = controller.filter(|o| o.kind == "StatefulSet");
    let vm = md
        .labels
        .as_ref()
        .and_then(|l| l.get(VM_LABEL))
        .filter(|v| !v.is_empty())
        .filter(|v| {
            controller.is_some_and(|o| {
                // (The pods' cache keeps no owner's apiVersion.)
                o.kind == "VirtualMachineInstance" && o.name == **v
            })
        });
    let owner = match (statefulset, vm) {
        (Some(s), _) => PinOwner::of_statefulset_pod(namespace, &s.name, name).ok_or_else(|| {
            BadAnnotation(format!(
                "{who}: annotation {FIXED}: the pod's name is not its StatefulSet {:?}'s name and an ordinal",
                s.name
            ))
        })?,
        (None, Some(vm)) => PinOwner::VirtualMachine {
            namespace: namespace.to_string(),
            name: vm.clone(),
        },
        (None, None) => {
            return Err(BadAnnotation(format!(
                "{who}: annotation {FIXED} is for a StatefulSet's pods and a KubeVirt VM's launcher pods (label {VM_LABEL}, controlled by that VirtualMachineInstance); this pod is neither"
            )))
        }
    };
    let address = match md.annotations.as_ref().and_then(|a| a.get(IPS_BY_ORDINAL)) {
        None => None,
        Some(list) => Some(by_ordinal(&owner, list, who)?),
    };
    let (instance, migration) = match owner.is_vm() {
        true => (
            controller.map(|o| o.uid.clone()).filter(|u| !u.is_empty()),
            md.labels
                .as_ref()
                .and_then(|l| l.get(MIGRATION_LABEL))
                .filter(|u| !u.is_empty())
                .cloned(),
        ),
        false => (None, None),
    };
    Ok(Some(Fixed {
        owner,
        networks,
        address,
        instance,
        migration,
    }))
}

/// KubeVirt's word on a VM's live migration: the VirtualMachineInstanceMigration the target
/// launcher pod is labelled with ([`MIGRATION_LABEL`]), listed in the VM's namespace and found
/// by its uid, names the VM's instance and is not over (neither Succeeded nor Failed).
/// KubeVirt writes the instance's `status.migrationState` only once the target pod is ready,
/// after its network was set up: too late for the pod's ADD.
pub struct KubeVirt {
    client: kube::Client,
}

impl KubeVirt {
    pub fn new(client: kube::Client) -> KubeVirt {
        KubeVirt { client }
    }
}

#[async_trait::async_trait]
impl Migrations for KubeVirt {
    async fn under_way(
        &self,
        owner: &PinOwner,
        migration: &str,
    ) -> Result<bool, crate::cluster::vocab::LookupFailed> {
        let PinOwner::VirtualMachine { namespace, name } = owner else {
            return Ok(false);
        };
        let ar = kube::api::ApiResource {
            group: "kubevirt.io".into(),
            version: "v1".into(),
            api_version: "kubevirt.io/v1".into(),
            kind: "VirtualMachineInstanceMigration".into(),
            plural: "virtualmachineinstancemigrations".into(),
        };
        let api: kube::Api<kube::api::DynamicObject> =
            kube::Api::namespaced_with(self.client.clone(), namespace, &ar);
        let listed = api
            .list(&kube::api::ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        Ok(listed.items.iter().any(|m| under_way(m, migration, name)))
    }
}

/// Whether `m` is the migration of uid `migration`, of VM `vm`'s instance, not over.
fn under_way(m: &kube::api::DynamicObject, migration: &str, vm: &str) -> bool {
    let phase = m.data["status"]["phase"].as_str().unwrap_or("");
    m.metadata.uid.as_deref() == Some(migration)
        && m.data["spec"]["vmiName"].as_str() == Some(vm)
        && !matches!(phase, "Succeeded" | "Failed")
}

/// The address `list` ([`IPS_BY_ORDINAL`]) gives `owner`'s ordinal.
fn by_ordinal(owner: &PinOwner, list: &str, who: &str) -> Result<std::net::IpAddr, BadAnnotation> {
    let PinOwner::StatefulSet { ordinal, .. } = owner else {
        return Err(BadAnnotation(format!(
            "{who}: annotation {IPS_BY_ORDINAL} is for a StatefulSet's pods (a VM keeps the address its first launcher got)"
        )));
    };
    let bad = |why: String| {
        BadAnnotation(format!(
            "{who}: annotation {IPS_BY_ORDINAL}={}: {why}",
            shown(list)
        ))
    };
    let mut addresses: Vec<std::net::IpAddr> = Vec::new();
    for entry in list.split(',').map(str::trim) {
        let ip = entry
            .parse()
            .map_err(|_| bad(format!("{} is not an IP address", shown(entry))))?;
        if addresses.contains(&ip) {
            return Err(bad(format!("{ip} is listed twice")));
        }
        addresses.push(ip);
    }
    addresses.get(*ordinal as usize).copied().ok_or_else(|| {
        bad(format!(
            "it lists {} address(es), none for ordinal {ordinal} (list one per ordinal the StatefulSet may have)",
            addresses.len()
        ))
    })
}

#[cfg(test)]
mod tests;
