//! What the layer above asks of the engine for pods with a fixed address (cluster pins, which
//! the engine knows nothing of): whether a network's addresses make one subnet across nodes,
//! where an address an ADD got lies (its pool and block), whether an address is in use here,
//! and whose fixed address an attachment holds.

use std::net::IpAddr;

use super::Ipam;
use crate::config::addressing::Addressing;
use crate::config::IpamSection;
use crate::model::AttachmentKey;

/// Where an address an ADD got lies: a block of a cluster pool of one subnet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixedSite {
    pub pool: String,
    pub address: IpAddr,
    /// The block, and its identity in the store (its creation revision).
    pub block: crate::source::BlockId,
}

/// The fixed address an attachment holds: its owner (as recorded), its pod and its
/// addresses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FixedHeld {
    pub owner: String,
    pub pod: String,
    pub uid: String,
    pub addresses: Vec<IpAddr>,
}

/// Whether the attachment of the pod of a uid holds an address here
/// ([`Ipam::holds_for_weakly`]).
pub type HoldsFor = std::sync::Arc<dyn Fn(IpAddr, &str) -> bool + Send + Sync>;

impl Ipam {
    /// Whether `network` (as the config names it, else as the CNI config `ipam` declares it)
    /// takes its addresses from cluster pools addressed as one subnet.
    pub fn one_subnet(&self, network: &str, ipam: Option<&IpamSection>) -> bool {
        let subnet = |a: Option<Addressing>| a == Some(Addressing::Subnet);
        match self.configured(network) {
            Some(n) => !n.cluster_pool_list().is_empty() && subnet(n.addressing),
            None => ipam.is_some_and(|s| s.cluster_pool.is_some() && subnet(s.addressing)),
        }
    }

    /// `network` as the daemon's config names it, if it does.
    fn configured(&self, network: &str) -> Option<&crate::config::NetworkSpec> {
        self.shared
            .config
            .networks
            .iter()
            .find(|n| n.name == network)
    }

    /// Of `addresses` (an ADD's on `network`), the first that lies in a confirmed block of a
    /// cluster pool of one subnet here.
    pub fn fixed_site(&self, network: &str, addresses: &[IpAddr]) -> Option<FixedSite> {
        let st = self.lock();
        let net = st.networks.get(network)?;
        addresses.iter().find_map(|ip| {
            let p = &net.pools[net.set_of(*ip)?];
            if !p.source.blocks().is_some_and(|b| b.one_subnet()) {
                return None;
            }
            Some(FixedSite {
                pool: p.source.blocks().and_then(|b| b.pool_name())?.to_string(),
                address: *ip,
                block: p.source.blocks().and_then(|b| b.block_holding(*ip))?,
            })
        })
    }

    /// The cluster pools of `network` (as the config names it, else as the CNI config's
    /// `ipam` declares it).
    pub fn network_pools(&self, network: &str, ipam: Option<&IpamSection>) -> Vec<String> {
        match self.configured(network) {
            Some(n) => n.cluster_pool_list(),
            None => ipam
                .and_then(|s| s.cluster_pool.clone())
                .into_iter()
                .collect(),
        }
    }

    /// Whether an attachment other than `key` holds `ip` here now, in any network (a pod's
    /// new sandbox holding the fixed address an old one's DEL releases).
    pub fn held_by_other(&self, key: &AttachmentKey, ip: IpAddr) -> bool {
        let st = self.lock();
        let other = st
            .attachments
            .iter()
            .any(|a| a.addresses().contains(&ip) && a.key() != *key);
        other
    }

    /// Whether an attachment of `network` holds `ip` here now.
    pub fn in_use(&self, network: &str, ip: IpAddr) -> bool {
        let st = self.lock();
        st.attachments.holder_of(network, ip).is_some()
    }

    /// The fixed address attachment `key` holds, if it holds one.
    pub fn fixed_held(&self, key: &AttachmentKey) -> Option<FixedHeld> {
        let st = self.lock();
        let a = st.attachments.get(key)?;
        let owner = a.k8s()?.fixed.clone()?;
        let pod = a.pod();
        Some(FixedHeld {
            owner,
            pod: format!("{}/{}", pod.namespace, pod.name),
            uid: pod.uid,
            addresses: a.addresses().to_vec(),
        })
    }

    /// Whether the attachment of the pod of uid `uid` holds `ip` here now, in any network.
    pub fn holds_for(&self, ip: IpAddr, uid: &str) -> bool {
        let st = self.lock();
        st.networks
            .keys()
            .filter_map(|n| st.attachments.holder_of(n, ip))
            .any(|a| a.pod().uid == uid)
    }

    /// [`Ipam::holds_for`], asked without keeping the engine alive: for the cluster node,
    /// which the engine's sources keep (a strong handle would make a cycle, and neither would
    /// ever be dropped). False once the engine is gone.
    pub fn holds_for_weakly(&self) -> HoldsFor {
        let weak = std::sync::Arc::downgrade(&self.shared);
        std::sync::Arc::new(move |ip, uid| {
            weak.upgrade()
                .is_some_and(|shared| Ipam { shared }.holds_for(ip, uid))
        })
    }

    /// Whether an attachment of a pod that is not of `owner` (the owner of a fixed address,
    /// as the pod's ADD named it: "VirtualMachine/ns/vm") holds `ip` here now, in any network.
    pub fn holds_for_another_owner(&self, ip: IpAddr, owner: &str) -> bool {
        let st = self.lock();
        st.networks
            .keys()
            .filter_map(|n| st.attachments.holder_of(n, ip))
            .any(|a| a.k8s().and_then(|k| k.fixed.as_deref()) != Some(owner))
    }

    /// Whether any attachment holds `ip` here now, in any network.
    pub fn holds_anywhere(&self, ip: IpAddr) -> bool {
        let st = self.lock();
        st.networks
            .keys()
            .any(|n| st.attachments.holder_of(n, ip).is_some())
    }

    /// The block of this node's that `ip` lies in, with its identity, in a source of one
    /// subnet of any network.
    pub fn block_holding(&self, ip: IpAddr) -> Option<crate::source::BlockId> {
        let st = self.lock();
        st.networks.values().find_map(|net| {
            net.pools
                .iter()
                .filter(|p| p.source.blocks().is_some_and(|b| b.one_subnet()))
                .find_map(|p| p.source.blocks().and_then(|b| b.block_holding(ip)))
        })
    }
}
