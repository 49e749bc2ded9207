//! The network definitions a start runs with: the stored ones brought to the config's, and
//! none that would hand out what another network holds.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::attachments::Attachments;
use crate::config::DaemonConfig;
use crate::error::Error;
use crate::model::{NetworkDef, Origin, SubnetMode};
use crate::range::Family;
use crate::store::{Change, Snapshot};

/// The network definitions to run with: the stored ones, brought to the config's. Networks
/// that CNI configs declared follow the daemon's current [defaults]; a config network replaces
/// a stored one with other ranges only when nothing holds an address of it (returned in
/// `reset`: its idle addresses and cursors are dropped).
pub(super) fn reconcile_defs(
    snap: &Snapshot,
    attachments: &Attachments,
    config: &DaemonConfig,
    changes: &mut Vec<Change>,
) -> Result<(BTreeMap<String, NetworkDef>, Vec<String>), Error> {
    let mut live: HashMap<&str, usize> = HashMap::new();
    // The families each network holds addresses of.
    let mut held: HashMap<&str, BTreeSet<Family>> = HashMap::new();
    for a in attachments.iter() {
        *live.entry(a.network()).or_default() += 1;
        let families = held.entry(a.network()).or_default();
        families.extend(a.addresses().iter().map(Family::of));
    }
    for r in &snap.reservations {
        *live.entry(r.key.network.as_str()).or_default() += 1;
        let families = held.entry(r.key.network.as_str()).or_default();
        families.extend(r.addresses.iter().map(Family::of));
    }
    let none = BTreeSet::new();
    let mut defs: BTreeMap<String, NetworkDef> = snap
        .networks
        .iter()
        .map(|d| (d.name.clone(), d.clone()))
        .collect();
    let mut reset = Vec::new();
    for def in defs.values_mut() {
        if !def.origin.from_config() && def.tuning != config.defaults {
            def.tuning = config.defaults.clone();
            changes.push(Change::PutNetwork(def.clone()));
        }
    }
    let named: Vec<String> = config.network_defs()?.into_iter().map(|d| d.name).collect();
    for mut def in config.network_defs()? {
        if let Some(old) = defs.get(&def.name) {
            // Sets retiring at runtime stay until nothing holds them.
            def.retiring = old.retiring.clone();
            if def.origin == Origin::Node {
                // The node's ranges as last seen stand until its source says otherwise (and
                // a change then retires them as `set_ranges` does).
                def.range_sets = old.range_sets.clone();
                def.set_pools = old.set_pools.clone();
                if old.origin == Origin::Node {
                    def.routes = old.routes.clone();
                }
            }
        }
        let live_here = live.get(def.name.as_str()).copied().unwrap_or(0);
        match defs.get(&def.name) {
            Some(old) if old == &def => continue,
            // An address in use keeps the prefix and gateway it was given: the addressing
            // changes only while the network holds nothing (an address handed out by block
            // may be the subnet's gateway now, and the other way round), a family's gateway
            // only while it holds no address of that family (a family added to the pool).
            Some(old)
                if live_here > 0
                    && !SubnetMode::keeps_gateways(
                        old.subnet_mode.as_ref(),
                        def.subnet_mode.as_ref(),
                        held.get(def.name.as_str()).unwrap_or(&none),
                    ) =>
            {
                return Err(Error::InvalidConfig(format!(
                    "network {:?}: the config changes its addressing or gateway, but the store holds {live_here} attachment(s) or reservation(s) of it (restore the old setting, or release them first)",
                    def.name
                )));
            }
            Some(old) if old.same_addresses(&def) => {}
            Some(old) => {
                let n = live.get(def.name.as_str()).copied().unwrap_or(0);
                if n > 0 {
                    return Err(Error::InvalidConfig(format!(
                        "network {:?}: the config now says ranges {}, but the store holds {n} attachment(s) or reservation(s) in its ranges {} (restore the old ranges, or release them first)",
                        def.name,
                        def.describe_ranges(),
                        old.describe_ranges()
                    )));
                }
                tracing::warn!(network = %def.name, old = %old.describe_ranges(), new = %def.describe_ranges(), "network ranges changed in the config; it had no attachments");
                reset.push(def.name.clone());
            }
            None => {}
        }
        changes.push(Change::PutNetwork(def.clone()));
        defs.insert(def.name.clone(), def);
    }
    for gone in unnamed_overlaps(&defs, &named, &live)? {
        tracing::warn!(network = %gone, "a network the config no longer names overlaps one it does and holds no address: its definition is dropped");
        defs.remove(&gone);
        changes.push(Change::DeleteNetwork(gone));
    }
    let cluster = config.cluster.is_some();
    let configured = config.cluster_networks();
    let mut dropped = Vec::new();
    for (name, def) in defs.iter_mut().filter(|(n, _)| !named.contains(n)) {
        // The bug, put back: left as stored, its sets served by sources over the whole pools.
        if !stale_cluster_network(def, cluster)
            || crate::bugs::on(crate::bugs::Bug::StaleNetworkServes)
        {
            continue;
        }
        let n = live.get(name.as_str()).copied().unwrap_or(0);
        if n == 0 {
            tracing::warn!(network = %name, "a network of cluster pools the config no longer names holds no address: its definition is dropped");
            dropped.push(name.clone());
            continue;
        }
        // A pool it holds addresses of that a network of the config takes: both would hold
        // the node's blocks of it.
        let taken = configured.iter().find_map(|(other, pools, _)| {
            def.pools_taken()
                .find(|p| pools.contains(p))
                .map(|p| (other, p))
        });
        if let Some((other, pool)) = taken {
            return Err(Error::InvalidConfig(format!(
                "network {name:?} is not in the config any more (renamed?), but the store holds {n} attachment(s) or reservation(s) of it in cluster pool {pool:?}, which the config gives network {other:?}: a node's blocks of a pool belong to one network (name it as before until its pods are gone, or release them first)"
            )));
        }
        // Nothing new from it: its sets retire, and are dropped once their last address is
        // released (DEL and CHECK work meanwhile).
        tracing::warn!(network = %name, ranges = %def.describe_ranges(), "a network of cluster pools the config no longer names still holds addresses: it hands out nothing new, and its ranges are dropped once they are released");
        let current = std::mem::take(&mut def.range_sets);
        def.retiring.extend(current);
        changes.push(Change::PutNetwork(def.clone()));
    }
    for gone in dropped {
        defs.remove(&gone);
        changes.push(Change::DeleteNetwork(gone));
    }
    Ok((defs, reset))
}

/// Whether stored network `def`, which the config does not name, took its addresses from
/// cluster pools and can no longer be served by them: a network of the config file's (its
/// sets named with their pools), or one a CNI config declared with `ipam.clusterPool` while
/// ipoold now runs without `[cluster]`. Its sets would otherwise get local sources over the
/// pools' CIDRs, and hand out addresses of blocks other nodes own.
fn stale_cluster_network(def: &NetworkDef, cluster: bool) -> bool {
    match def.cluster_pools.is_empty() {
        true => def.origin == Origin::Node && !def.set_pools.is_empty(),
        false => !cluster,
    }
}

/// The stored networks the config does not name (renamed, or declared by a CNI config) whose
/// ranges overlap a config network's, to drop: both would hand out the same addresses. One
/// that still holds an address (`live`: attachments and reservations by network) refuses the
/// start instead, naming both.
fn unnamed_overlaps(
    defs: &BTreeMap<String, NetworkDef>,
    named: &[String],
    live: &HashMap<&str, usize>,
) -> Result<Vec<String>, Error> {
    let mut dropped = Vec::new();
    for def in defs.values().filter(|d| named.contains(&d.name)) {
        let Ok((current, retiring)) = def.all_ranges() else {
            continue;
        };
        let sets: Vec<_> = current.into_iter().chain(retiring).collect();
        for other in defs.values().filter(|d| !named.contains(&d.name)) {
            let Err(why) = crate::model::check_apart(&def.name, &sets, [other]) else {
                continue;
            };
            match live.get(other.name.as_str()).copied().unwrap_or(0) {
                0 => dropped.push(other.name.clone()),
                n => {
                    return Err(Error::InvalidConfig(format!(
                        "{why}: network {:?} is not in the config any more (renamed?), but the store holds {n} attachment(s) or reservation(s) of it (name it as before until its pods are gone, or release them first)",
                        other.name
                    )))
                }
            }
        }
    }
    dropped.sort();
    dropped.dedup();
    Ok(dropped)
}
