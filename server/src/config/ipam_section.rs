//! The CNI config's `ipam` section: host-local's keys, turned into a [`NetworkDef`].

use crate::error::Error;
use crate::model::{validate_ranges, NetworkDef, Origin, Tuning};
use crate::range::RangeSpec;
use serde::Deserialize;

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
    pub gateway: Option<String>,
    pub routes: Option<Vec<RouteSpec>>,
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
                gateway: self.gateway.clone(),
            }]);
        }
        sets.extend(self.ranges.iter().cloned());
        sets
    }

    /// The network this section declares, or None when it declares no ranges.
    pub fn network_def(&self, name: &str, tuning: &Tuning) -> Result<Option<NetworkDef>, Error> {
        let range_sets = self.range_sets();
        if range_sets.is_empty() {
            return Ok(None);
        }
        let routes = self.routes.clone().unwrap_or_default();
        validate_ranges(name, &range_sets).map_err(Error::InvalidConfig)?;
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
        }))
    }
}
