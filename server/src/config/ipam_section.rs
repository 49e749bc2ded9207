//! The CNI config's `ipam` section: host-local's keys, turned into a [`NetworkDef`].

use crate::error::Error;
use crate::model::{validate_ranges, NetworkDef, Origin, Tuning};
use crate::range::RangeSpec;
use serde::Deserialize;

use super::addressing::{subnet_mode, Addressing, Gateways, Spelling};
use super::validate_routes;
use crate::model::RouteSpec;

/// The keys of a CNI `ipam` section that ipool reads; others are ignored.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpamSection {
    #[serde(default)]
    pub ranges: Vec<Vec<RangeSpec>>,
    pub subnet: Option<String>,
    pub range_start: Option<String>,
    pub range_end: Option<String>,
    /// host-local's gateway of the `subnet` form; with `clusterPool` and subnet addressing,
    /// the pool CIDRs' gateways (one, or a list).
    pub gateway: Option<Gateways>,
    pub routes: Option<Vec<RouteSpec>>,
    /// The cluster pool the network's addresses come from (a NetworkAttachmentDefinition
    /// naming its pool; ipoold in cluster mode), instead of ranges.
    pub cluster_pool: Option<String>,
    /// With `clusterPool`: `"block"` (the default) or `"subnet"` (see [`super::addressing`]).
    pub addressing: Option<Addressing>,
    /// With subnet addressing: addresses (or CIDRs) never handed out, one by one.
    #[serde(default)]
    pub exclude: Vec<String>,
    /// host-local's `dataDir`: where ipoold finds the allocations host-local made for the
    /// network, taken over when it first serves it (`service::host_local`).
    pub data_dir: Option<String>,
}

impl IpamSection {
    /// Parses the JSON of an `ipam` object. Empty input means "no section".
    pub fn parse(json: &str) -> Result<Option<IpamSection>, Error> {
        if json.trim().is_empty() {
            return Ok(None);
        }
        serde_json::from_str(json)
            .map(Some)
            .map_err(|e| Error::InvalidConfig(format!("ipam: {e}")))
    }

    /// host-local's range sets: the single `subnet` form is prepended as a set of its own.
    pub fn range_sets(&self) -> Vec<Vec<RangeSpec>> {
        let mut sets = Vec::new();
        if let Some(subnet) = &self.subnet {
            sets.push(vec![RangeSpec {
                subnet: subnet.clone(),
                range_start: self.range_start.clone(),
                range_end: self.range_end.clone(),
                gateway: match &self.gateway {
                    Some(Gateways::One(g)) => Some(g.clone()),
                    _ => None,
                },
            }]);
        }
        sets.extend(self.ranges.iter().cloned());
        sets
    }

    /// The network this section declares, or None when it declares no ranges.
    pub fn network_def(&self, name: &str, tuning: &Tuning) -> Result<Option<NetworkDef>, Error> {
        // host-local's rangeStart and rangeEnd bound its `subnet`; alone (or beside a
        // clusterPool, whose blocks say what is handed out) they would bound nothing.
        if self.subnet.is_none() && (self.range_start.is_some() || self.range_end.is_some()) {
            return Err(Error::InvalidConfig(format!(
                "network {name:?}: ipam.rangeStart and ipam.rangeEnd go with ipam.subnet{}",
                match self.cluster_pool.is_some() {
                    true => " (with ipam.clusterPool the pool's blocks say what is handed out; ipam.exclude keeps addresses out)",
                    false => " (or give them in ipam.ranges)",
                }
            )));
        }
        if let Some(pool) = &self.cluster_pool {
            return self.pool_network(name, pool, tuning).map(Some);
        }
        if self.addressing.is_some() || !self.exclude.is_empty() {
            return Err(Error::InvalidConfig(format!(
                "network {name:?}: ipam.addressing and ipam.exclude go with ipam.clusterPool"
            )));
        }
        if let Some(Gateways::Many(_)) = &self.gateway {
            return Err(Error::InvalidConfig(format!(
                "network {name:?}: ipam.gateway is one address with ipam.subnet (a list goes with ipam.clusterPool)"
            )));
        }
        let range_sets = self.range_sets();
        if range_sets.is_empty() {
            return Ok(None);
        }
        let routes = self.routes.clone().unwrap_or_default();
        validate_ranges(name, &range_sets)?;
        validate_routes(name, &routes)?;
        Ok(Some(NetworkDef {
            name: name.to_string(),
            range_sets,
            retiring: Vec::new(),
            routes,
            tuning: tuning.clone(),
            origin: Origin::Cni,
            set_pools: Default::default(),
            subnet_mode: None,
            cluster_pools: Vec::new(),
        }))
    }

    /// The network of a cluster pool (`clusterPool`): its ranges not known yet (they come from
    /// the pool once ipoold reads it), its addressing, gateway and excluded addresses.
    fn pool_network(&self, name: &str, pool: &str, tuning: &Tuning) -> Result<NetworkDef, Error> {
        if !self.range_sets().is_empty() {
            return Err(Error::InvalidConfig(format!(
                "network {name:?}: ipam.clusterPool takes the network's ranges from the pool (drop ipam.ranges and ipam.subnet)"
            )));
        }
        ipool_proto::names::check_name("ipam.clusterPool", pool)
            .map_err(|e| Error::InvalidConfig(format!("network {name:?}: {e}")))?;
        let routes = self.routes.clone().unwrap_or_default();
        validate_routes(name, &routes)?;
        let mode = subnet_mode(
            name,
            self.addressing,
            self.gateway.as_ref(),
            &self.exclude,
            Spelling::Cni,
        )?;
        Ok(NetworkDef {
            name: name.to_string(),
            range_sets: Vec::new(),
            retiring: Vec::new(),
            routes,
            tuning: tuning.clone(),
            origin: Origin::Cni,
            set_pools: Default::default(),
            subnet_mode: mode,
            cluster_pools: vec![pool.to_string()],
        })
    }
}
