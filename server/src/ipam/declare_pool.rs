//! A network a CNI config declares with `ipam.clusterPool` (a NetworkAttachmentDefinition
//! naming its pool, no daemon config change): declared with no ranges, which come from the
//! pool once the node's cluster mode reads it ([`Ipam::pool_networks`], followed by
//! `node_ranges::cluster`); its ADDs wait for them.

use super::declare::Declaration;
use super::ranges::forget_set;
use super::state::{Network, State};
use super::Ipam;
use crate::error::Error;
use crate::model::{Millis, NetworkDef, RouteSpec, SubnetMode};
use crate::store::Change;

/// A network declared with `ipam.clusterPool`: its name, pools, routes and addressing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolNetwork {
    pub network: String,
    pub pools: Vec<String>,
    pub routes: Vec<RouteSpec>,
    pub subnet_mode: Option<SubnetMode>,
}

impl Ipam {
    /// The networks CNI configs declared with `ipam.clusterPool`, for cluster mode to follow
    /// their pools.
    pub fn pool_networks(&self) -> Vec<PoolNetwork> {
        self.lock()
            .networks
            .values()
            .filter(|n| !n.def.cluster_pools.is_empty())
            .map(|n| PoolNetwork {
                network: n.def.name.clone(),
                pools: n.def.cluster_pools.clone(),
                routes: n.def.routes.clone(),
                subnet_mode: n.def.subnet_mode.clone(),
            })
            .collect()
    }

    /// Bumped each time a CNI config declares a network of a cluster pool.
    pub fn pool_network_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.pool_networks.subscribe()
    }

    pub(super) fn pool_network_declared(&self) {
        self.shared.pool_networks.send_modify(|v| *v += 1);
    }

    /// The declaration of network `name` as `d` (a cluster pool's, `d.cluster_pools`), when
    /// it is not the known one. Refused without cluster mode, for a pool another network of
    /// this node takes its addresses from (a node's blocks of a pool belong to one network),
    /// and in place of a network that holds addresses or that the config file defines.
    pub(super) fn plan_pool_network(
        &self,
        st: &State,
        name: &str,
        d: &NetworkDef,
        now: Millis,
    ) -> Result<Option<Declaration>, Error> {
        let pools = d.cluster_pools.join(", ");
        let Some(cluster) = &self.shared.config.cluster else {
            return Err(Error::InvalidConfig(format!(
                "network {name:?}: ipam.clusterPool {pools:?} needs ipoold in cluster mode (a [cluster] table in its config)"
            )));
        };
        if cluster.datastore == crate::config::cluster::DatastoreKind::Kubernetes {
            for p in &d.cluster_pools {
                ipool_proto::names::check_kube_name(
                    "ipam.clusterPool",
                    p,
                    ipool_proto::names::MAX_KUBE_LABELLED_NAME,
                )
                .map_err(|e| Error::InvalidConfig(format!("network {name:?}: {e}")))?;
            }
        }
        // Asked on every ADD of such a network: names cloned only on a hit.
        let wanted = |p: &String| d.cluster_pools.contains(p);
        let taken_by = self
            .shared
            .config
            .cluster_networks()
            .into_iter()
            .find(|(n, p, _)| n != name && p.iter().any(wanted))
            .map(|(n, _, _)| n)
            .or_else(|| {
                st.networks
                    .values()
                    .find(|n| n.def.name != name && n.def.pools_taken().any(wanted))
                    .map(|n| n.def.name.clone())
            });
        if let Some(other) = taken_by {
            return Err(Error::InvalidConfig(format!(
                "network {name:?}: cluster pool {pools:?} already gives network {other:?} its addresses on this node (a node's blocks of a pool belong to one network: give each network its own pool)"
            )));
        }
        let known = st.networks.get(name);
        if let Some(known) = known {
            if known.def.cluster_pools == d.cluster_pools && known.def.subnet_mode == d.subnet_mode
            {
                return Ok(None);
            }
            if known.def.origin.from_config() {
                return Err(Error::InvalidConfig(format!(
                    "network {name:?} is defined in ipoold's config file; the CNI config's ipam.clusterPool {pools:?} does not count for it (drop it, or use another network name)"
                )));
            }
            let live = st
                .attachments
                .iter()
                .filter(|a| a.network() == name)
                .count()
                + st.reservations.keys().filter(|k| k.network == name).count();
            // Only the excluded addresses differ (a NetworkAttachmentDefinition edited while
            // its pods run): the declaration in force stays until the network holds nothing
            // here, and its ADDs go on. (A gateway added is refused while it holds addresses:
            // kept, the declaration in force would serve the new family without it.)
            let same_addresses = known.def.cluster_pools == d.cluster_pools
                && known.def.subnet_mode.is_some() == d.subnet_mode.is_some()
                && SubnetMode::same_gateways(
                    known.def.subnet_mode.as_ref(),
                    d.subnet_mode.as_ref(),
                );
            if live > 0 && same_addresses {
                tracing::debug!(network = name, kept = %describe(&known.def), asked = %describe(d), "a CNI config declares other excluded addresses while the network holds addresses: the declaration in force stays until it holds none");
                return Ok(None);
            }
            if live > 0 {
                return Err(Error::InvalidConfig(format!(
                    "network {name:?} is already declared with {} and holds {live} attachment(s) or reservation(s); this CNI config declares it with {} (delete them first, or use a new network name)",
                    describe(&known.def),
                    describe(d)
                )));
            }
            tracing::warn!(network = name, old = %describe(&known.def), new = %describe(d), "network redeclared by a CNI config; it had no attachments");
        }
        let net = Network::new(d.clone(), &self.shared.sources, now)?;
        let mut changes = vec![Change::PutNetwork(d.clone())];
        for p in known.iter().flat_map(|k| &k.pools) {
            for (ip, _) in p.pool.idle_addresses() {
                changes.push(Change::DeleteIdle {
                    network: name.to_string(),
                    ip,
                });
            }
            changes.extend(forget_set(name, p));
        }
        Ok(Some((net, changes, Vec::new())))
    }
}

/// "cluster pool \"l2\" as one subnet (gateway 10.1.0.1, exclude 10.1.0.2/31)", "ranges [..]".
fn describe(d: &NetworkDef) -> String {
    if d.cluster_pools.is_empty() {
        return format!("ranges {}", d.describe_ranges());
    }
    let mut s = format!("cluster pool {:?}", d.cluster_pools.join(", "));
    if let Some(m) = &d.subnet_mode {
        let g: Vec<String> = m.gateways.iter().map(|g| g.to_string()).collect();
        let x: Vec<String> = m.exclude.iter().map(|x| x.to_string()).collect();
        s += &format!(
            " as one subnet (gateway {}, exclude {})",
            if g.is_empty() {
                "none".into()
            } else {
                g.join(" ")
            },
            if x.is_empty() {
                "none".into()
            } else {
                x.join(" ")
            }
        );
    }
    s
}
