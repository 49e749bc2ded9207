//! Configuration: the daemon's TOML (pool tuning and declared networks) and the CNI `ipam`
//! section, both turned into a [`NetworkDef`], the persisted definition of a network's pools.
//!
//! The `ipam` section accepts host-local's keys (`ranges`, or the single `subnet`,
//! `rangeStart`, `rangeEnd`, `gateway`; `routes`), so that switching a conflist from
//! `"type": "host-local"` to `"type": "ipool"` is the whole migration. Unknown keys are ignored,
//! as host-local ignores them.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::range::{parse_set, Range, RangeSpec};

/// The configuration ipoold runs on when no `--config` is given.
pub const EMBEDDED_DEFAULT: &str = include_str!("config/default.toml");

/// Pool tuning. Defaults come from [`EMBEDDED_DEFAULT`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tuning {
    pub min_idle: usize,
    pub max_idle: usize,
    /// Most addresses one pool (network and family) holds; absent: the size of its ranges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<usize>,
    pub cooldown_secs: u64,
    /// Calls per second into the address source, and how many may come at once.
    pub source_rate: f64,
    pub source_burst: u32,
    /// Which pods keep their addresses after a DEL (as a reservation for their namespace/name).
    #[serde(default)]
    pub sticky: Sticky,
    /// How long such a reservation lasts.
    #[serde(default = "default_sticky_ttl")]
    pub sticky_ttl_secs: u64,
}

fn default_sticky_ttl() -> u64 {
    600
}

/// Which pods are sticky: their address is reserved for their namespace/name when they go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sticky {
    /// Nobody (host-local's behaviour).
    #[default]
    None,
    /// Pods named like a StatefulSet's: `<name>-<ordinal>`.
    StatefulSet,
    /// Every pod with a name.
    All,
}

impl Sticky {
    /// Whether a pod called `name` keeps its address under this policy.
    pub fn applies_to(self, name: &str) -> bool {
        match self {
            Sticky::None => false,
            Sticky::All => !name.is_empty(),
            Sticky::StatefulSet => match name.rsplit_once('-') {
                Some((base, ordinal)) => {
                    !base.is_empty()
                        && !ordinal.is_empty()
                        && ordinal.bytes().all(|b| b.is_ascii_digit())
                        && (ordinal == "0" || !ordinal.starts_with('0'))
                }
                None => false,
            },
        }
    }
}

/// Per-network overrides of [`Tuning`] in the TOML.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TuningPatch {
    pub min_idle: Option<usize>,
    pub max_idle: Option<usize>,
    pub capacity: Option<usize>,
    pub cooldown_secs: Option<u64>,
    pub source_rate: Option<f64>,
    pub source_burst: Option<u32>,
    pub sticky: Option<Sticky>,
    pub sticky_ttl_secs: Option<u64>,
}

impl TuningPatch {
    fn apply(&self, base: &Tuning) -> Tuning {
        Tuning {
            min_idle: self.min_idle.unwrap_or(base.min_idle),
            max_idle: self.max_idle.unwrap_or(base.max_idle),
            capacity: self.capacity.or(base.capacity),
            cooldown_secs: self.cooldown_secs.unwrap_or(base.cooldown_secs),
            source_rate: self.source_rate.unwrap_or(base.source_rate),
            source_burst: self.source_burst.unwrap_or(base.source_burst),
            sticky: self.sticky.unwrap_or(base.sticky),
            sticky_ttl_secs: self.sticky_ttl_secs.unwrap_or(base.sticky_ttl_secs),
        }
    }
}

impl Tuning {
    pub fn validate(&self, what: &str) -> Result<(), Error> {
        let bad = |m: String| Err(Error::InvalidConfig(format!("{what}: {m}")));
        if self.max_idle < self.min_idle {
            return bad(format!(
                "max_idle ({}) is below min_idle ({})",
                self.max_idle, self.min_idle
            ));
        }
        if self.capacity == Some(0) {
            return bad("capacity must be at least 1".into());
        }
        if !(self.source_rate.is_finite() && self.source_rate > 0.0) {
            return bad(format!(
                "source_rate must be a positive number, not {}",
                self.source_rate
            ));
        }
        if self.source_burst == 0 {
            return bad("source_burst must be at least 1".into());
        }
        if self.sticky != Sticky::None && self.sticky_ttl_secs == 0 {
            return bad("sticky_ttl_secs must be at least 1 when sticky is on".into());
        }
        Ok(())
    }
}

/// A route as host-local writes it: `{"dst": "0.0.0.0/0", "gw": "10.1.0.1"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteSpec {
    pub dst: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<String>,
}

/// Where a network definition came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// The daemon's TOML.
    Config,
    /// The `ipam` section of a CNI ADD for a network the daemon did not know.
    Cni,
}

/// The persisted definition of a network: one pool per range set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NetworkDef {
    pub name: String,
    pub range_sets: Vec<Vec<RangeSpec>>,
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    pub tuning: Tuning,
    pub origin: Origin,
}

impl NetworkDef {
    /// The validated ranges, one list per range set.
    pub fn ranges(&self) -> Result<Vec<Vec<Range>>, Error> {
        validate_ranges(&self.name, &self.range_sets)
    }

    /// True when both definitions hand out the same addresses. The same spelling (every ADD
    /// of an unchanged conflist) is answered without parsing anything.
    pub fn same_addresses(&self, other: &NetworkDef) -> bool {
        if self.range_sets == other.range_sets {
            return true;
        }
        match (self.ranges(), other.ranges()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    }

    pub fn describe_ranges(&self) -> String {
        let sets: Vec<String> = self
            .range_sets
            .iter()
            .map(|set| {
                let rs: Vec<String> = set.iter().map(|r| r.subnet.clone()).collect();
                format!("[{}]", rs.join(" "))
            })
            .collect();
        sets.join(" ")
    }
}

fn validate_ranges(network: &str, sets: &[Vec<RangeSpec>]) -> Result<Vec<Vec<Range>>, Error> {
    if sets.is_empty() {
        return Err(Error::InvalidConfig(format!(
            "network {network:?} declares no ranges (set ipam.ranges or ipam.subnet)"
        )));
    }
    let parsed = sets
        .iter()
        .enumerate()
        .map(|(i, set)| {
            parse_set(set)
                .map_err(|e| Error::InvalidConfig(format!("network {network:?}: ranges[{i}]: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let all: Vec<&Range> = parsed.iter().flatten().collect();
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            if a.subnet.contains(&b.subnet.network()) || b.subnet.contains(&a.subnet.network()) {
                return Err(Error::InvalidConfig(format!(
                    "network {network:?}: subnets {} and {} overlap",
                    a.subnet, b.subnet
                )));
            }
        }
    }
    Ok(parsed)
}

fn validate_routes(network: &str, routes: &[RouteSpec]) -> Result<(), Error> {
    for (i, r) in routes.iter().enumerate() {
        if r.dst.parse::<IpNet>().is_err() {
            return Err(Error::InvalidConfig(format!(
                "network {network:?}: routes[{i}].dst {:?} is not a CIDR",
                r.dst
            )));
        }
        if let Some(gw) = &r.gw {
            if gw.parse::<IpAddr>().is_err() {
                return Err(Error::InvalidConfig(format!(
                    "network {network:?}: routes[{i}].gw {gw:?} is not an IP address"
                )));
            }
        }
    }
    Ok(())
}

// === the CNI ipam section ===

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
        validate_ranges(name, &range_sets)?;
        validate_routes(name, &routes)?;
        Ok(Some(NetworkDef {
            name: name.to_string(),
            range_sets,
            routes,
            tuning: tuning.clone(),
            origin: Origin::Cni,
        }))
    }
}

// === the daemon's TOML ===

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    pub defaults: Tuning,
    #[serde(default)]
    pub leak_check: LeakCheck,
    #[serde(default, rename = "network")]
    pub networks: Vec<NetworkSpec>,
}

/// The `[leak_check]` table: release attachments whose network namespace is gone.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeakCheck {
    /// Seconds between checks (the first runs at start); 0: no checks.
    #[serde(default)]
    pub interval_secs: u64,
}

/// A `[[network]]` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetworkSpec {
    pub name: String,
    pub ranges: Vec<Vec<RangeSpec>>,
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    #[serde(flatten)]
    pub tuning: TuningPatch,
}

impl DaemonConfig {
    pub fn embedded() -> DaemonConfig {
        DaemonConfig::parse(EMBEDDED_DEFAULT).expect("the embedded default config is valid")
    }

    /// Parses a TOML file's text; keys it does not set fall back to the embedded default.
    pub fn parse(text: &str) -> Result<DaemonConfig, Error> {
        let mut doc: toml::Table =
            toml::from_str(text).map_err(|e| Error::InvalidConfig(e.to_string()))?;
        let base: toml::Table = toml::from_str(EMBEDDED_DEFAULT)
            .map_err(|e| Error::InvalidConfig(format!("embedded default: {e}")))?;
        if let Some(toml::Value::Table(base_defaults)) = base.get("defaults") {
            let entry = doc
                .entry("defaults")
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let toml::Value::Table(defaults) = entry else {
                return Err(Error::InvalidConfig("[defaults] must be a table".into()));
            };
            for (k, v) in base_defaults {
                defaults.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
        let cfg: DaemonConfig = toml::Value::Table(doc)
            .try_into()
            .map_err(|e: toml::de::Error| Error::InvalidConfig(e.to_string()))?;
        cfg.defaults.validate("[defaults]")?;
        let mut seen = std::collections::HashSet::new();
        for n in &cfg.networks {
            if !seen.insert(n.name.as_str()) {
                return Err(Error::InvalidConfig(format!(
                    "network {:?} is declared twice",
                    n.name
                )));
            }
            n.def(&cfg.defaults)?;
        }
        Ok(cfg)
    }

    pub fn network_defs(&self) -> Result<Vec<NetworkDef>, Error> {
        self.networks
            .iter()
            .map(|n| n.def(&self.defaults))
            .collect()
    }
}

impl NetworkSpec {
    fn def(&self, defaults: &Tuning) -> Result<NetworkDef, Error> {
        crate::ipam::validate_name("network name", &self.name).map_err(Error::InvalidConfig)?;
        let tuning = self.tuning.apply(defaults);
        tuning.validate(&format!("network {:?}", self.name))?;
        validate_ranges(&self.name, &self.ranges)?;
        validate_routes(&self.name, &self.routes)?;
        Ok(NetworkDef {
            name: self.name.clone(),
            range_sets: self.ranges.clone(),
            routes: self.routes.clone(),
            tuning,
            origin: Origin::Config,
        })
    }
}

#[cfg(test)]
mod tests;
