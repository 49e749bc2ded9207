//! The owners of fixed addresses as the simulation's controllers play them: four ordinals of
//! one StatefulSet and two VMs, the address an ordinal chose, which pods may share one (two
//! launchers of one VM), and what the apiserver and KubeVirt tell the nodes of them. Pure
//! rules, no step: `crate::fixed` makes the pods.

use std::net::IpAddr;

use ipool_server::cluster::pin::{Pin, PinOwner};
use ipool_server::cluster::vocab::LookupFailed;

/// How many owners there are: the StatefulSet's ordinals, then the VMs.
pub(crate) const ORDINALS: u32 = 4;
pub(crate) const VMS: u32 = 2;

/// Owner `k` of the run's.
pub(crate) fn owner(k: u32) -> PinOwner {
    match k < ORDINALS {
        true => PinOwner::StatefulSet {
            namespace: "sim".into(),
            name: "db".into(),
            ordinal: k,
        },
        false => PinOwner::VirtualMachine {
            namespace: "sim".into(),
            name: format!("vm{}", k - ORDINALS),
        },
    }
}

/// The owners gone as the apiserver shows them when a keeper's turn or a look begins.
pub(crate) struct GoneOwners(pub std::collections::BTreeMap<String, String>);

#[async_trait::async_trait]
impl ipool_server::k8s::pin_keeper::Owners for GoneOwners {
    async fn gone(&self, owner: &PinOwner) -> Result<Option<String>, LookupFailed> {
        Ok(self.0.get(&owner.to_string()).cloned())
    }
}

/// The name of `owner`'s pod whose sandbox is `container`, as its controller names it.
pub(crate) fn pod_name(owner: &PinOwner, container: &str) -> String {
    match owner {
        PinOwner::StatefulSet { name, ordinal, .. } => format!("{name}-{ordinal}"),
        PinOwner::VirtualMachine { name, .. } => format!("virt-launcher-{name}-{container}"),
    }
}

/// The address `owner` chose (`ipool.io/ips-by-ordinal`) in a run whose pool sets
/// [`crate::SET_ASIDE`] aside: the StatefulSet's first [`crate::CHOSEN`] ordinals, each the
/// range's next address from its second.
pub(crate) fn chosen(owner: &PinOwner, set_aside: bool) -> Option<IpAddr> {
    let PinOwner::StatefulSet { ordinal, .. } = owner else {
        return None;
    };
    if !set_aside || *ordinal >= crate::CHOSEN {
        return None;
    }
    let range: ipnet::Ipv4Net = crate::SET_ASIDE.parse().expect("a CIDR");
    Some(IpAddr::V4(
        (u32::from(range.network()) + 1 + ordinal).into(),
    ))
}

/// Whether `ip` lies in the range the pool sets aside (`crate::SET_ASIDE`).
pub(crate) fn set_aside(ip: IpAddr) -> bool {
    let range: ipnet::IpNet = crate::SET_ASIDE.parse().expect("a CIDR");
    range.contains(&ip)
}

/// The addresses of `ips` that the store's `pins` keep for `owner` with `node`'s pod `uid`
/// among their holders (an ADD of that pod answered with them, served where they are).
pub(crate) fn pinned_for(
    pins: &[Pin],
    owner: &PinOwner,
    node: &str,
    uid: &str,
    ips: &[IpAddr],
) -> Vec<IpAddr> {
    ips.iter()
        .copied()
        .filter(|ip| {
            pins.iter().any(|p| {
                p.address == *ip
                    && p.owner == *owner
                    && p.holders.iter().any(|h| h.node == node && h.uid == uid)
            })
        })
        .collect()
}

/// Whether two pods of these owners, of these VM instances, may hold one address: two
/// launchers of one VM's instance (a live migration; an instance made again under the VM's
/// name is another VM as far as its address goes, until the old launcher is gone).
pub(crate) fn may_share(
    (a, a_instance): (Option<&str>, Option<&str>),
    (b, b_instance): (Option<&str>, Option<&str>),
) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => {
            a == b && a.starts_with("VirtualMachine/") && a_instance == b_instance
        }
        _ => false,
    }
}

/// A VM's instance (its VirtualMachineInstance's uid): the first one's, or, once KubeVirt
/// made it again under the VM's name `made_again` times (`crate::pod_gc::remake_vmi`), that
/// one's.
pub(crate) fn instance(owner: &PinOwner, made_again: u32) -> Option<String> {
    match (owner, made_again) {
        (PinOwner::VirtualMachine { name, .. }, 0) => Some(format!("vmi-{name}")),
        (PinOwner::VirtualMachine { name, .. }, n) => Some(format!("vmi-{name}-{n}")),
        (PinOwner::StatefulSet { .. }, _) => None,
    }
}

/// KubeVirt as the simulation plays it: a second launcher pod of a VM's instance is made only
/// by `crate::fixed::migrate`, so each is the target of a migration KubeVirt shows (every
/// launcher carries the label; the first one's ADD never asks). A launcher of an instance
/// made again is no migration's: the label does not make it one, its instance's uid differs.
pub(crate) struct Migrating;

#[async_trait::async_trait]
impl ipool_server::cluster::pin::hold::Migrations for Migrating {
    async fn under_way(&self, _owner: &PinOwner, _migration: &str) -> Result<bool, LookupFailed> {
        Ok(true)
    }
}
