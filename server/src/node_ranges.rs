//! A network's ranges from the node it runs on (`ranges_from` in the config): the Node's
//! `spec.podCIDRs` ([`podcidrs`]), flannel's subnet file ([`flannel`]) or a cluster pool's
//! CIDRs in etcd ([`cluster`]). Each source watches
//! its input and hands what it sees to a [`Feed`], which gives the engine the ranges
//! (`Ipam::set_ranges_and_routes`), or the reason there are none yet (`Ipam::await_ranges`:
//! ADD and STATUS say it), and logs every change once, and the wait every 30 s.
//!
//! # Layout
//! - [`cluster`]: a network's ranges from a cluster pool (`ranges_from = "cluster"`);
//! - [`flannel`]: `ranges_from = "flannel"`: flannel's subnet.env;
//! - [`podcidrs`]: `ranges_from = "node"`: the Node's `spec.podCIDRs`, watched.

pub mod cluster;
pub mod flannel;
pub mod podcidrs;

use std::time::Duration;

use crate::ipam::Ipam;
use crate::model::RouteSpec;
use crate::range::RangeSpec;

/// How often a network still without ranges says so in the log.
pub const REMIND_EVERY: Duration = Duration::from_secs(30);

/// What a source saw.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// The node's ranges (one set per family) and the routes they bring.
    Ranges {
        sets: Vec<Vec<RangeSpec>>,
        routes: Vec<RouteSpec>,
    },
    /// No ranges there yet ("node n1 has no podCIDRs yet"): ranges already known stay.
    Missing(String),
    /// Ranges there, but unusable: nothing changes.
    Bad(String),
}

/// Hands one network's ranges to the engine.
pub struct Feed {
    ipam: Ipam,
    network: String,
    /// The routes of the network's `[[network]]` table; a source's own come after them.
    routes: Vec<RouteSpec>,
    /// The last thing seen, so that each change is logged once.
    last: Option<Seen>,
    /// The source's input failing (the apiserver unreachable, ...), as last logged.
    failing: bool,
}

impl Feed {
    pub fn new(ipam: Ipam, network: &str, routes: Vec<RouteSpec>) -> Feed {
        Feed {
            ipam,
            network: network.to_string(),
            routes,
            last: None,
            failing: false,
        }
    }

    pub fn network(&self) -> &str {
        &self.network
    }

    /// Applies what the source saw. False when the engine could not take it now (its store
    /// failed, ...): the source tries again.
    pub async fn apply(&mut self, seen: Seen) -> bool {
        self.apply_pools(seen, std::collections::BTreeMap::new())
            .await
    }

    /// [`Feed::apply`], with the cluster pool of each range's subnet (a network with several
    /// pools).
    pub async fn apply_pools(
        &mut self,
        seen: Seen,
        set_pools: std::collections::BTreeMap<String, String>,
    ) -> bool {
        let mut applied = true;
        self.recovered();
        let network = self.network.as_str();
        let changed = self.last.as_ref() != Some(&seen);
        match &seen {
            Seen::Ranges { sets, routes } => {
                let mut all = self.routes.clone();
                all.extend(routes.iter().filter(|r| !self.routes.contains(r)).cloned());
                match self
                    .ipam
                    .set_pool_ranges(network, sets.clone(), Some(all), set_pools)
                    .await
                {
                    Ok(Some(c)) => {
                        tracing::info!(network, ranges = %c.ranges, retiring = %c.retiring, "network ranges from the node")
                    }
                    Ok(None) => {}
                    Err(e) => {
                        if changed {
                            tracing::error!(network, error = %e, "the node's ranges cannot be used; nothing changed");
                        }
                        let why = format!("the node's ranges cannot be used: {e}");
                        let _ = self.ipam.await_ranges(network, &why);
                        applied = matches!(e, crate::error::Error::InvalidConfig(_));
                    }
                }
            }
            Seen::Missing(why) | Seen::Bad(why) => {
                if let Err(e) = self.ipam.await_ranges(network, why) {
                    tracing::error!(network, error = %e, "cannot note why the network has no ranges");
                }
                let has = self.ipam.awaiting(network).is_none();
                match (&seen, changed, has) {
                    (Seen::Bad(_), true, _) => {
                        tracing::error!(network, error = %why, "the node's ranges cannot be used; nothing changed")
                    }
                    (Seen::Missing(_), true, true) => {
                        tracing::warn!(network, why = %why, "the node's ranges are gone from their source; the network keeps the ones it has")
                    }
                    (Seen::Missing(_), true, false) => {
                        tracing::warn!(network, why = %why, "the network has no ranges yet: ADDs wait for them")
                    }
                    _ => {}
                }
            }
        }
        self.last = Some(seen);
        applied
    }

    /// Logs, while the network has no ranges, why (every [`REMIND_EVERY`]).
    pub fn remind(&self) {
        if let Some(why) = self.ipam.awaiting(&self.network) {
            tracing::warn!(network = %self.network, why = %why, "still no ranges: ADDs wait, STATUS answers 50");
        }
    }

    /// Why the network has no ranges, if it has none (ranges it has stay).
    pub fn why_none(&self, why: &str) {
        if let Err(e) = self.ipam.await_ranges(&self.network, why) {
            tracing::error!(network = %self.network, error = %e, "cannot note why the network has no ranges");
        }
    }

    /// The source's input fails (logged once until it recovers).
    pub fn failed(&mut self, error: &dyn std::fmt::Display) {
        if !self.failing {
            tracing::warn!(network = %self.network, error = %error, "cannot read the node's ranges; retrying (the network keeps the ones it has)");
            self.failing = true;
        }
    }

    fn recovered(&mut self) {
        if std::mem::take(&mut self.failing) {
            tracing::info!(network = %self.network, "reading the node's ranges again");
        }
    }
}
