//! The network an ADD declares: a CNI config's `ipam` section for a network ipoold does not
//! know (or a new definition of one that holds nothing), and the networks it takes the place
//! of.

use super::ranges::{carry_idle, forget_set};
use super::state::{Network, State};
use super::Ipam;
use crate::error::Error;
use crate::model::{check_apart, Millis, NetworkDef, Origin};
use crate::store::Change;

/// A network an ADD declares: the network, the changes that write it, and the networks whose
/// definitions it replaces ([`displaced_by`]).
pub(super) type Declaration = (Network, Vec<Change>, Vec<String>);

impl Ipam {
    /// Writes `declaration` of network `name` on its own (before any attachment of it), in
    /// place of the networks it displaces.
    pub(super) fn declare_now(
        &self,
        st: &mut State,
        name: &str,
        declaration: Declaration,
    ) -> Result<(), Error> {
        let (net, changes, displaced) = declaration;
        self.commit(st, &changes, |st| {
            for gone in &displaced {
                st.networks.remove(gone);
            }
            st.networks.insert(name.to_string(), net);
            Ok(())
        })?;
        // A network of a cluster pool declared, or one declared anew: its follower sees it.
        self.pool_network_declared();
        Ok(())
    }

    /// The network an ADD needs, when it is not the known one: declared by the CNI config (a
    /// new network, or a new definition of one without attachments), with the changes that
    /// write it. None: the known network serves as it is.
    ///
    /// A redefinition keeps the old network's addresses that are still cooling, where the new
    /// ranges hold them: handing a just-released address to a new pod is what the cooldown
    /// is for.
    pub(super) fn plan_network(
        &self,
        st: &State,
        name: &str,
        declared: Option<&NetworkDef>,
        now: Millis,
    ) -> Result<Option<Declaration>, Error> {
        if let Some(d) = declared.filter(|d| !d.cluster_pools.is_empty()) {
            return self.plan_pool_network(st, name, d, now);
        }
        let known = st.networks.get(name);
        let d = match (known, declared) {
            (Some(_), None) => return Ok(None),
            (Some(known), Some(d)) if known.def.same_addresses(d) => return Ok(None),
            (Some(known), Some(d)) if known.def.origin.ranges_at_runtime() => {
                let now = match known.no_ranges() {
                    Some(why) => format!("none yet: {why}"),
                    None => known.def.describe_ranges(),
                };
                return Err(Error::InvalidConfig(format!(
                    "network {name:?} takes its ranges {} (now {now}); the CNI config asks for {} (drop the ranges from the CNI config)",
                    match known.def.origin {
                        Origin::Node => "from the node",
                        _ => "at runtime",
                    },
                    d.describe_ranges()
                )))
            }
            (Some(known), Some(d)) => {
                let live = st.attachments.iter().filter(|a| a.network() == name).count()
                    + st.reservations.keys().filter(|k| k.network == name).count();
                if live > 0 {
                    return Err(Error::InvalidConfig(format!(
                        "network {name:?} is already defined (by {}) with ranges {}; this config asks for {}, but {live} attachment(s) or reservation(s) still hold addresses of the old ranges (delete them first, or use a new network name)",
                        known.def.origin.describe(),
                        known.def.describe_ranges(),
                        d.describe_ranges()
                    )));
                }
                if known.def.origin == Origin::Config {
                    return Err(Error::InvalidConfig(format!(
                        "network {name:?} is defined in ipoold's config file with ranges {}; the CNI config asks for {} (change one of them so they agree, or drop the ranges from the CNI config)",
                        known.def.describe_ranges(),
                        d.describe_ranges()
                    )));
                }
                tracing::warn!(network = name, old = %known.def.describe_ranges(), new = %d.describe_ranges(), "network redefined by a CNI config; it had no attachments");
                d
            }
            (None, Some(d)) => d,
            (None, None) => {
                return Err(Error::InvalidConfig(format!(
                    "network {name:?} is unknown to ipoold and the CNI config's ipam section declares no ranges (set ipam.ranges or ipam.subnet, or declare the network in ipoold's config)"
                )))
            }
        };
        let sets = d.ranges()?;
        let displaced = displaced_by(st, name, d);
        check_apart(
            name,
            &sets,
            st.networks
                .values()
                .filter(|n| !displaced.contains(&n.def.name))
                .map(|n| &n.def),
        )
        .map_err(|e| Error::InvalidConfig(e.0))?;
        let mut net = Network::new(d.clone(), &self.shared.sources, now)?;
        let mut changes = vec![Change::PutNetwork(d.clone())];
        for other in displaced.iter().filter_map(|n| st.networks.get(n)) {
            let gone = &other.def.name;
            tracing::warn!(network = name, displaced = %gone, ranges = %other.def.describe_ranges(), "a CNI config declares ranges that overlap those of another network a CNI config declared, which holds no address: that network's definition is dropped (its next ADD declares it again)");
            changes.push(Change::DeleteNetwork(gone.clone()));
            for p in &other.pools {
                for (ip, since) in p.pool.idle_addresses() {
                    changes.push(Change::DeleteIdle {
                        network: gone.clone(),
                        ip,
                    });
                    // Still cooling: it stays so, in the network that takes its subnet.
                    if !p.pool.cooled(since, now) && carry_idle(&mut net, ip, since) {
                        changes.push(Change::PutIdle {
                            network: name.to_string(),
                            ip,
                            released_at: since.to_stored(),
                        });
                    }
                }
                changes.extend(forget_set(gone, p));
            }
        }
        if let Some(old) = known {
            for p in &old.pools {
                for (ip, since) in p.pool.idle_addresses() {
                    let kept = !p.pool.cooled(since, now) && carry_idle(&mut net, ip, since);
                    if !kept {
                        changes.push(Change::DeleteIdle {
                            network: name.to_string(),
                            ip,
                        });
                    }
                }
                changes.extend(forget_set(name, p));
            }
        }
        Ok(Some((net, changes, displaced)))
    }
}

/// The networks a CNI config's declaration of `name` as `d` takes the place of: other
/// networks that CNI configs declared, whose ranges overlap `d`'s, and that hold no address
/// (no attachment, no reservation). A CNI-declared network is only a cached declaration: its
/// next ADD declares it again (and is refused if `d`'s network holds addresses by then). Test
/// suites and runtimes reuse one subnet under several network names this way.
fn displaced_by(st: &State, name: &str, d: &NetworkDef) -> Vec<String> {
    let Ok(mine) = d.ranges() else {
        return Vec::new();
    };
    st.networks
        .values()
        .filter(|n| n.def.name != name && n.def.origin == Origin::Cni)
        .filter(|n| check_apart(name, &mine, [&n.def]).is_err())
        .filter(|n| {
            !st.attachments.iter().any(|a| a.network() == n.def.name)
                && !st.reservations.keys().any(|k| k.network == n.def.name)
        })
        .map(|n| n.def.name.clone())
        .collect()
}
