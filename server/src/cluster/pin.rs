//! Fixed addresses that follow a workload from node to node: a pin is one address of a
//! subnet-addressed pool, kept for one owner (a StatefulSet's ordinal, or a KubeVirt VM) and
//! held by the node (or, during a VM's live migration, the two nodes) whose pod uses it.
//! Shared by both stores ([`PinStore`](super::datastore::PinStore)) and `ipoolctl cluster
//! pins`; neither store owns it.
//!
//! The rules that keep a pinned address on one pod (docs/cluster-mode.md, "Fixed addresses"):
//! - a pin is created only by the node that owns the block its address lies in, for an
//!   address that node has just handed to the owner's pod, and records which block (by the
//!   block's identity, [`KeyRevision::create`]) it was made in; or, for an address its owner
//!   chose (`ipool.io/ips-by-ordinal`), which must lie in one of its pool's excluded ranges
//!   (no block is ever claimed over one, so no node hands it out), by any node, in the pool
//!   as it stands (`set_aside`; the pool is not deleted, nor loses the CIDR holding it, while
//!   the pin stands, and a pin is served only while its pool would let it be made);
//! - a pin counts only while that block stands as it was when the pin was made: a pin whose
//!   block is gone or was claimed anew is void (a create that reached the store late, after
//!   its node was fenced and its blocks released, pins nothing);
//! - a block with a pin is never given back, and the node that owns it never hands a pinned
//!   address out;
//! - a node takes a pin over only when no one holds it ([`Verdict`]), or when every holder is
//!   gone as release-node judges a node gone, with a write conditioned on the pin as read.
//!
//! # Layout
//! - [`hold`]: what a pod's ADD and DEL do with its pin (the service runs these around the
//!   engine's ADD and DEL).

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::vocab::{Block, KeyRevision};

/// Whose address a pin keeps.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PinOwner {
    /// Ordinal `ordinal` of StatefulSet `namespace/name`.
    StatefulSet {
        namespace: String,
        name: String,
        ordinal: u32,
    },
    /// KubeVirt VirtualMachine (or VirtualMachineInstance) `namespace/name`.
    VirtualMachine { namespace: String, name: String },
}

impl PinOwner {
    /// A StatefulSet's pod's owner: `pod` is `<statefulset>-<ordinal>`, as the StatefulSet
    /// controller names them. None: the pod's name does not say an ordinal of `statefulset`.
    pub fn of_statefulset_pod(namespace: &str, statefulset: &str, pod: &str) -> Option<PinOwner> {
        let ordinal = pod.strip_prefix(statefulset)?.strip_prefix('-')?;
        // The controller writes the ordinal in decimal, without leading zeros.
        if ordinal.is_empty() || (ordinal.len() > 1 && ordinal.starts_with('0')) {
            return None;
        }
        Some(PinOwner::StatefulSet {
            namespace: namespace.to_string(),
            name: statefulset.to_string(),
            ordinal: ordinal.parse().ok()?,
        })
    }

    /// True for a VM's: its launcher pods may hold its pin on two nodes during a migration.
    pub fn is_vm(&self) -> bool {
        matches!(self, PinOwner::VirtualMachine { .. })
    }

    /// Its namespace.
    pub fn namespace(&self) -> &str {
        match self {
            PinOwner::StatefulSet { namespace, .. }
            | PinOwner::VirtualMachine { namespace, .. } => namespace,
        }
    }

    /// `StatefulSet/ns/web/3` or `VirtualMachine/ns/vm1` back to an owner.
    pub fn parse(s: &str) -> Result<PinOwner, MalformedOwner> {
        let parts: Vec<&str> = s.split('/').collect();
        let bad = || MalformedOwner(s.to_string());
        let named = |ns: &str, name: &str| !ns.is_empty() && !name.is_empty();
        match parts.as_slice() {
            ["StatefulSet", ns, name, ordinal] if named(ns, name) => Ok(PinOwner::StatefulSet {
                namespace: ns.to_string(),
                name: name.to_string(),
                ordinal: ordinal.parse().map_err(|_| bad())?,
            }),
            ["VirtualMachine", ns, name] if named(ns, name) => Ok(PinOwner::VirtualMachine {
                namespace: ns.to_string(),
                name: name.to_string(),
            }),
            _ => Err(bad()),
        }
    }
}

/// A pin owner's name that names none.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("pin owner {0:?} is neither StatefulSet/<namespace>/<name>/<ordinal> nor VirtualMachine/<namespace>/<name>")]
pub struct MalformedOwner(pub String);

/// A write of a pin that would change what never changes: what differs.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a pin's pool, address, owner and block never change ({0})")]
pub struct PinChanged(pub String);

/// The store refuses such a write.
impl From<PinChanged> for super::vocab::ClusterError {
    fn from(e: PinChanged) -> super::vocab::ClusterError {
        super::vocab::ClusterError::Refused(e.to_string())
    }
}

impl std::fmt::Display for PinOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PinOwner::StatefulSet {
                namespace,
                name,
                ordinal,
            } => write!(f, "StatefulSet/{namespace}/{name}/{ordinal}"),
            PinOwner::VirtualMachine { namespace, name } => {
                write!(f, "VirtualMachine/{namespace}/{name}")
            }
        }
    }
}

impl Serialize for PinOwner {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PinOwner {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<PinOwner, D::Error> {
        let s = String::deserialize(d)?;
        PinOwner::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A node holding a pin: the node, and the pod there that uses the address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    pub node: String,
    /// `namespace/name` of the pod.
    pub pod: String,
    /// The pod's UID.
    pub uid: String,
    /// When the node took it, Unix milliseconds (its clock; shown, never compared).
    #[serde(rename = "sinceMs")]
    pub since_ms: u64,
    /// A VM's: the uid of the VirtualMachineInstance its pod runs (its launcher's controller).
    /// Two launchers share the pin only as two of one instance, during a migration KubeVirt
    /// shows; an instance made again under the VM's name is another, and waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
}

impl Holder {
    /// This hold of the pin of `address`, as its node confirms it
    /// ([`NodeState::confirms`](crate::cluster::vocab::NodeState::confirms)): the address,
    /// the pod's uid and when the hold was taken (two creations of one pod's pin, one of them
    /// sent by an ADD that gave up, are two holds).
    pub fn key(&self, address: IpAddr) -> String {
        format!("{address} {} {}", self.uid, self.since_ms)
    }
}

/// A pin, as stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    pub pool: String,
    pub address: IpAddr,
    pub owner: PinOwner,
    /// The block the address lies in, and that block's identity when the pin was made
    /// ([`KeyRevision::create`]): the pin counts only while that block stands. For an address
    /// set aside (`set_aside`): the pool's excluded range it lies in, and the pool's identity.
    pub block: IpNet,
    #[serde(rename = "blockId")]
    pub block_id: i64,
    /// An address the pool sets aside (one of its `exclude` ranges, which no block is ever
    /// claimed over), chosen by the owner (`ipool.io/ips-by-ordinal`): no node hands it out
    /// but to its owner, so any node may pin it; the pin counts while the pool (as made,
    /// `block_id`) still excludes it.
    #[serde(
        rename = "setAside",
        default,
        skip_serializing_if = "std::ops::Not::not"
    )]
    pub set_aside: bool,
    /// Who holds it now: none (released), one, or two (a VM's migration).
    pub holders: Vec<Holder>,
}

impl Pin {
    /// True while the block `b` (as listed) is the one this pin was made in (never for an
    /// address set aside: it lies in no block).
    pub fn made_in(&self, block: &IpNet, revision: &KeyRevision) -> bool {
        !self.set_aside && self.block == *block && self.block_id == revision.create
    }

    /// Refused: `new` is not a change of this pin's holders (a pin's pool, address, owner and
    /// block never change).
    pub fn check_change(&self, new: &Pin) -> Result<(), PinChanged> {
        let same = self.pool == new.pool
            && self.address == new.address
            && self.owner == new.owner
            && self.block == new.block
            && self.block_id == new.block_id
            && self.set_aside == new.set_aside;
        match same {
            true => Ok(()),
            false => Err(PinChanged(format!(
                "{} of {} is not {} of {}",
                new.address, new.owner, self.address, self.owner
            ))),
        }
    }

    /// `n1 (ns/web-0)`, `n1 (ns/virt-launcher-a), n2 (...)`, or `nobody`.
    pub fn holders_shown(&self) -> String {
        match self.holders.is_empty() {
            true => "nobody".into(),
            false => self
                .holders
                .iter()
                .map(|h| format!("{} ({})", h.node, h.pod))
                .collect::<Vec<_>>()
                .join(", "),
        }
    }
}

/// A pin as read, with the write a change of it is conditioned on (opaque: etcd's mod
/// revision, the apiserver's resourceVersion).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinRead {
    pub pin: Pin,
    pub version: String,
}

/// What a pin's creation found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PinCreated {
    Created(PinRead),
    /// The owner has a pin already (this one).
    OwnerHas(PinRead),
    /// The address is pinned already (for this owner).
    AddressTaken(PinRead),
    /// The block the pin was to be made in is no longer the one named (given back, released,
    /// claimed anew).
    BlockChanged,
}

/// Who may take a pin, for a pod of its owner on `node`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Held by this pod already (an ADD retried, a restart).
    Held,
    /// Nobody holds it: take it.
    Free,
    /// A VM's second launcher pod, of the same instance as the first, which runs elsewhere:
    /// hold it with that one if KubeVirt shows the instance migrating to this node.
    Migration,
    /// Held by these, on other nodes or by other pods: not until they release it or their
    /// nodes are judged gone.
    HeldBy(Vec<Holder>),
}

/// The verdict on `pin` for the owner's pod `uid` on `node`, a VM's running `instance` (its
/// VirtualMachineInstance's uid). At most two hold a VM's pin, both of one instance; one a
/// StatefulSet ordinal's.
pub fn verdict(pin: &Pin, node: &str, uid: &str, instance: Option<&str>) -> Verdict {
    if pin.holders.iter().any(|h| h.node == node && h.uid == uid) {
        return Verdict::Held;
    }
    match pin.holders.as_slice() {
        [] => Verdict::Free,
        [one]
            if pin.owner.is_vm()
                && one.node != node
                && instance.is_some()
                && one.instance.as_deref() == instance =>
        {
            Verdict::Migration
        }
        held => Verdict::HeldBy(held.to_vec()),
    }
}

/// Whether a pin of `pins` was made in block `b` (as listed): such a block is never given
/// back, its pinned addresses kept there for their owners.
pub fn keeps_block(pins: &[PinRead], b: &Block) -> bool {
    pins.iter()
        .any(|p| p.pin.pool == b.pool && p.pin.made_in(&b.block, &b.revision))
}

/// The pins `node` holds, each as read and as it is to be written without its hold (a
/// release of the node ends them).
pub fn holds_of(pins: &[PinRead], node: &str) -> Vec<(PinRead, Pin)> {
    pins.iter()
        .filter(|p| p.pin.holders.iter().any(|h| h.node == node))
        .map(|read| {
            let mut pin = read.pin.clone();
            pin.holders.retain(|h| h.node != node);
            (read.clone(), pin)
        })
        .collect()
}

/// `10.1.2.3` as an object name: `10-1-2-3`; `fd00::5`: every group in hex,
/// `fd00-0-0-0-0-0-0-5` (one name per address; addresses of pools never overlap, so one
/// name per pin).
pub fn address_name(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => a.to_string().replace('.', "-"),
        IpAddr::V6(a) => a
            .segments()
            .iter()
            .map(|g| format!("{g:x}"))
            .collect::<Vec<_>>()
            .join("-"),
    }
}

pub mod hold;

#[cfg(test)]
mod tests;
