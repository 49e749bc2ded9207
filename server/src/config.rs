//! Configuration: the daemon's TOML (pool tuning and declared networks) and the CNI `ipam`
//! section, both turned into a [`NetworkDef`], the persisted definition of a network's pools.
//!
//! The `ipam` section accepts host-local's keys (`ranges`, or the single `subnet`,
//! `rangeStart`, `rangeEnd`, `gateway`; `routes`), so that switching a conflist from
//! `"type": "host-local"` to `"type": "ipool"` is the whole migration. Unknown keys are ignored,
//! as host-local ignores them.
//!
//! # Layout
//! - [`addressing`]: `addressing` of a cluster pool's network, as the daemon's `[[network]]` and
//!   the CNI `ipam` section say it;
//! - [`cluster`]: the `[cluster]` table of ipoold's config;
//! - `ipam_section`: the CNI config's `ipam` section.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;

use crate::error::Error;
use crate::model::{
    check_apart, validate_ranges, Invalid, NetworkDef, Origin, RouteSpec, Sticky, Tuning,
};
use crate::range::RangeSpec;

/// The configuration ipoold runs on when no `--config` is given.
pub const EMBEDDED_DEFAULT: &str = include_str!("config/default.toml");

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

/// Each route's `dst` a CIDR, its `gw` (when set) an address.
pub fn validate_routes(network: &str, routes: &[RouteSpec]) -> Result<(), Error> {
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

pub use cluster::ClusterSettings;
pub use ipam_section::IpamSection;

// === the daemon's TOML ===

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    pub defaults: Tuning,
    #[serde(default)]
    pub cni: CniSettings,
    #[serde(default)]
    pub leak_check: LeakCheck,
    #[serde(default)]
    pub store: StoreSettings,
    /// Present: the pods on this node, as the apiserver lists them, are the source of truth.
    pub kubernetes: Option<KubernetesSettings>,
    /// Cluster mode: the etcd that networks with `ranges_from = "cluster"` claim blocks from.
    pub cluster: Option<ClusterSettings>,
    #[serde(default, rename = "network")]
    pub networks: Vec<NetworkSpec>,
}

/// The `[cni]` table: how ipoold answers the runtime's calls.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CniSettings {
    /// CNI GC spares attachments younger than this (the runtime builds its list of valid
    /// attachments before it calls GC; an ADD that finished in between is not on it).
    #[serde(default = "default_gc_grace")]
    pub gc_grace_secs: u64,
    /// How long an ADD waits for addresses on their way (the source's rate limit, a block
    /// being claimed, a network's ranges not known yet) before it settles for a cooling address
    /// or fails with a retryable error (CNI 11). Keep it below the plugin's `ipam.timeoutMs`.
    #[serde(default = "default_add_wait")]
    pub add_wait_ms: u64,
}

/// The longest `[cni] add_wait_ms`: the plugin waits at most this long too (`ipam.timeoutMs`).
const MAX_ADD_WAIT_MS: u64 = 600_000;

pub use crate::model::{at_most, MAX_SECS};

fn default_add_wait() -> u64 {
    2000
}

fn default_gc_grace() -> u64 {
    60
}

impl Default for CniSettings {
    fn default() -> Self {
        CniSettings {
            gc_grace_secs: default_gc_grace(),
            add_wait_ms: default_add_wait(),
        }
    }
}

/// The `[store]` table: how the state on disk is kept.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreSettings {
    /// Seconds between checkpoints while changes come in (sled flushed, the log before it no
    /// longer needed); 0: only when a log file is full.
    #[serde(default = "default_checkpoint_secs")]
    pub checkpoint_secs: u64,
}

fn default_checkpoint_secs() -> u64 {
    5
}

impl Default for StoreSettings {
    fn default() -> Self {
        StoreSettings {
            checkpoint_secs: default_checkpoint_secs(),
        }
    }
}

impl StoreSettings {
    /// The store's options: default log files, checkpoints as configured.
    pub fn options(&self) -> crate::store::StoreOptions {
        crate::store::StoreOptions {
            checkpoint_every: (self.checkpoint_secs > 0)
                .then(|| std::time::Duration::from_secs(self.checkpoint_secs)),
            ..crate::store::StoreOptions::default()
        }
    }
}

/// The `[kubernetes]` table: the node's pods, watched through the apiserver, decide when an
/// address is free, and give each ADD its pod's metadata.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSettings {
    /// An attachment whose pod is gone is released only when it was seen gone at two checks
    /// at least this far apart, and it is at least this old.
    #[serde(default = "default_gc_grace")]
    pub gc_grace_secs: u64,
    /// Owner kinds (besides StatefulSet) whose pods keep their addresses as a reservation
    /// when they go, e.g. ["CloneSet"].
    #[serde(default)]
    pub sticky_kinds: Vec<String>,
    /// How long an ADD waits for the apiserver when its pod is not in the watch cache.
    #[serde(default = "default_pod_get_ms")]
    pub pod_get_timeout_ms: u64,
    /// The longest wait for the apiserver's next byte on any request (lists included); a watch
    /// is ended by the apiserver before it (every `read_timeout_secs - 5`) and made again.
    #[serde(default = "default_read_timeout")]
    pub read_timeout_secs: u64,
    /// The node's container runtime's CRI socket: the pod GC lets an address go, and a
    /// quarantine ends, only when the runtime has no ready sandbox of its pod (a runtime that
    /// does not answer keeps it). Unset: the first of containerd's
    /// (/run/containerd/containerd.sock) and CRI-O's (/var/run/crio/crio.sock) that exists;
    /// "": never asked.
    #[serde(default)]
    pub cri_socket: Option<String>,
}

fn default_pod_get_ms() -> u64 {
    2000
}

/// The apiserver's read deadline unless `[kubernetes] read_timeout_secs` says otherwise (and
/// without `[kubernetes]`: the Node watched for `ranges_from = "node"`).
pub const DEFAULT_READ_TIMEOUT_SECS: u64 = 30;

fn default_read_timeout() -> u64 {
    DEFAULT_READ_TIMEOUT_SECS
}

impl Default for KubernetesSettings {
    fn default() -> Self {
        KubernetesSettings {
            gc_grace_secs: default_gc_grace(),
            sticky_kinds: Vec::new(),
            pod_get_timeout_ms: default_pod_get_ms(),
            read_timeout_secs: default_read_timeout(),
            cri_socket: None,
        }
    }
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
    /// Fixed ranges; or none, with `ranges_from`.
    #[serde(default)]
    pub ranges: Vec<Vec<RangeSpec>>,
    /// Where the node's ranges come from, instead of `ranges`.
    pub ranges_from: Option<RangesFrom>,
    /// flannel's subnet file (`ranges_from = "flannel"`).
    pub subnet_file: Option<std::path::PathBuf>,
    /// The cluster pool in the store (`ranges_from = "cluster"`).
    pub cluster_pool: Option<String>,
    /// Several cluster pools, tried in this order when the node needs a block (instead of
    /// `cluster_pool`); a pod may choose among them.
    #[serde(default)]
    pub cluster_pools: Vec<String>,
    /// How a cluster pool's network gives its addresses: by block (routed), or as one subnet
    /// across the nodes, with its `gateway` and `exclude` ([`addressing`]).
    pub addressing: Option<addressing::Addressing>,
    pub gateway: Option<addressing::Gateways>,
    #[serde(default)]
    pub exclude: Vec<String>,
    #[serde(default)]
    pub routes: Vec<RouteSpec>,
    #[serde(flatten)]
    pub tuning: TuningPatch,
}

/// `ranges_from`: where a network's ranges on this node come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RangesFrom {
    /// This node's Node object: `spec.podCIDRs` (kube-controller-manager's nodeipam).
    Node,
    /// flannel's subnet file (`/run/flannel/subnet.env`).
    Flannel,
    /// Blocks this node claims from a cluster pool in etcd (`cluster_pool`, `[cluster]`).
    Cluster,
}

/// Where flannel writes this node's subnet.
pub const DEFAULT_SUBNET_FILE: &str = "/run/flannel/subnet.env";

/// A network whose ranges come from the node, as the daemon must watch them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeRanges {
    /// The Node's `spec.podCIDRs`.
    PodCidrs,
    /// flannel's subnet file.
    Flannel(std::path::PathBuf),
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
        cfg.check_bounds()?;
        if let Some(c) = &cfg.cluster {
            c.validate()?;
        }
        let mut seen = std::collections::HashSet::new();
        for n in &cfg.networks {
            if !seen.insert(n.name.as_str()) {
                return Err(Error::InvalidConfig(format!(
                    "network {:?} is declared twice",
                    n.name
                )));
            }
            n.def(&cfg.defaults)?;
            if n.ranges_from == Some(RangesFrom::Cluster) && cfg.cluster.is_none() {
                return Err(Error::InvalidConfig(format!(
                    "network {:?} takes its ranges from cluster pool {:?}: add a [cluster] table (etcd_endpoints = [...])",
                    n.name,
                    n.cluster_pool.as_deref().unwrap_or_default()
                )));
            }
        }
        let mut pools = std::collections::HashMap::new();
        let each = cfg
            .cluster_networks()
            .into_iter()
            .flat_map(|(network, pools, _)| pools.into_iter().map(move |p| (network.clone(), p)));
        for (network, pool) in each {
            if cfg
                .cluster
                .as_ref()
                .is_some_and(|c| c.datastore == cluster::DatastoreKind::Kubernetes)
            {
                ipool_proto::names::check_kube_name(
                    "cluster_pool",
                    &pool,
                    ipool_proto::names::MAX_KUBE_LABELLED_NAME,
                )
                .map_err(|e| Error::InvalidConfig(format!("network {network:?}: {e}")))?;
            }
            if let Some(other) = pools.insert(pool.clone(), network.clone()) {
                return Err(Error::InvalidConfig(format!(
                    "networks {other:?} and {network:?} both take their ranges from cluster pool {pool:?}: a node's blocks of a pool belong to one network (give each its own pool)"
                )));
            }
        }
        let defs = cfg.network_defs()?;
        for (i, d) in defs.iter().enumerate() {
            let sets = d.current_ranges()?;
            check_apart(&d.name, &sets, &defs[..i])?;
        }
        Ok(cfg)
    }

    /// Every duration within what timers and clocks can add without overflowing.
    fn check_bounds(&self) -> Result<(), Invalid> {
        let secs = [
            ("[cni] gc_grace_secs", self.cni.gc_grace_secs),
            ("[store] checkpoint_secs", self.store.checkpoint_secs),
            ("[leak_check] interval_secs", self.leak_check.interval_secs),
        ];
        for (what, v) in secs {
            at_most(what, v, MAX_SECS, "a year")?;
        }
        if let Some(k) = &self.kubernetes {
            if k.pod_get_timeout_ms < 100 {
                return Err(Invalid(format!(
                    "[kubernetes] pod_get_timeout_ms must be at least 100 (it is {})",
                    k.pod_get_timeout_ms
                )));
            }
            at_most(
                "[kubernetes] gc_grace_secs",
                k.gc_grace_secs,
                MAX_SECS,
                "a year",
            )?;
            at_most(
                "[kubernetes] pod_get_timeout_ms",
                k.pod_get_timeout_ms,
                MAX_ADD_WAIT_MS,
                "10 minutes",
            )?;
            if !(10..=600).contains(&k.read_timeout_secs) {
                return Err(Invalid(format!(
                    "[kubernetes] read_timeout_secs must be within 10..=600 (it is {})",
                    k.read_timeout_secs
                )));
            }
        }
        at_most(
            "[cni] add_wait_ms",
            self.cni.add_wait_ms,
            MAX_ADD_WAIT_MS,
            "10 minutes",
        )
    }

    /// The networks whose ranges come from the node, and from where.
    pub fn node_ranges(&self) -> Vec<(String, NodeRanges, Vec<RouteSpec>)> {
        self.networks
            .iter()
            .filter_map(|n| {
                let from = match n.ranges_from? {
                    RangesFrom::Cluster => return None,
                    RangesFrom::Node => NodeRanges::PodCidrs,
                    RangesFrom::Flannel => NodeRanges::Flannel(
                        n.subnet_file
                            .clone()
                            .unwrap_or_else(|| DEFAULT_SUBNET_FILE.into()),
                    ),
                };
                Some((n.name.clone(), from, n.routes.clone()))
            })
            .collect()
    }

    /// The networks whose ranges are blocks of cluster pools: (network, pools in order,
    /// routes).
    pub fn cluster_networks(&self) -> Vec<(String, Vec<String>, Vec<RouteSpec>)> {
        self.networks
            .iter()
            .filter(|n| n.ranges_from == Some(RangesFrom::Cluster))
            .map(|n| (n.name.clone(), n.cluster_pool_list(), n.routes.clone()))
            .filter(|(_, pools, _)| !pools.is_empty())
            .collect()
    }

    pub fn network_defs(&self) -> Result<Vec<NetworkDef>, Error> {
        self.networks
            .iter()
            .map(|n| n.def(&self.defaults))
            .collect()
    }
}

impl NetworkSpec {
    /// The cluster pools the network takes its ranges from, in order (`cluster_pool`, or
    /// `cluster_pools`); none for a network of another kind.
    pub fn cluster_pool_list(&self) -> Vec<String> {
        match &self.cluster_pool {
            Some(p) => vec![p.clone()],
            None => self.cluster_pools.clone(),
        }
    }

    fn def(&self, defaults: &Tuning) -> Result<NetworkDef, Error> {
        ipool_proto::names::check_name("network name", &self.name).map_err(Error::InvalidConfig)?;
        let tuning = self.tuning.apply(defaults);
        tuning.validate(&format!("network {:?}", self.name))?;
        let origin = match (self.ranges_from, self.ranges.is_empty()) {
            (Some(from), true) => {
                if self.subnet_file.is_some() && from != RangesFrom::Flannel {
                    return Err(Error::InvalidConfig(format!(
                        "network {:?}: subnet_file goes with ranges_from = \"flannel\"",
                        self.name
                    )));
                }
                if self.cluster_pool.is_some() && !self.cluster_pools.is_empty() {
                    return Err(Error::InvalidConfig(format!(
                        "network {:?} sets both cluster_pool and cluster_pools (keep one: cluster_pools = [...] for several)",
                        self.name
                    )));
                }
                let pools = self.cluster_pool_list();
                match (pools.first(), from) {
                    (Some(_), RangesFrom::Cluster) => {
                        let mut seen = std::collections::HashSet::new();
                        for pool in &pools {
                            ipool_proto::names::check_name("cluster_pool", pool).map_err(|e| {
                                Error::InvalidConfig(format!("network {:?}: {e}", self.name))
                            })?;
                            if !seen.insert(pool) {
                                return Err(Error::InvalidConfig(format!(
                                    "network {:?}: cluster_pools names {pool:?} twice",
                                    self.name
                                )));
                            }
                        }
                    }
                    (None, RangesFrom::Cluster) => {
                        return Err(Error::InvalidConfig(format!(
                            "network {:?}: ranges_from = \"cluster\" needs cluster_pool (the pool's name in the store) or cluster_pools",
                            self.name
                        )))
                    }
                    (Some(_), _) => {
                        return Err(Error::InvalidConfig(format!(
                            "network {:?}: cluster_pool goes with ranges_from = \"cluster\"",
                            self.name
                        )))
                    }
                    (None, _) => {}
                }
                Origin::Node
            }
            (Some(_), false) => {
                return Err(Error::InvalidConfig(format!(
                    "network {:?} sets both ranges and ranges_from (keep one)",
                    self.name
                )))
            }
            (None, true) => {
                return Err(Error::InvalidConfig(format!(
                "network {:?} has no ranges (set ranges, or ranges_from = \"node\", \"flannel\" or \"cluster\")",
                self.name
            )))
            }
            (None, false) => {
                if self.cluster_pool.is_some() || !self.cluster_pools.is_empty() {
                    return Err(Error::InvalidConfig(format!(
                        "network {:?}: cluster_pool goes with ranges_from = \"cluster\"",
                        self.name
                    )));
                }
                if self.subnet_file.is_some() {
                    return Err(Error::InvalidConfig(format!(
                        "network {:?}: subnet_file goes with ranges_from = \"flannel\"",
                        self.name
                    )));
                }
                validate_ranges(&self.name, &self.ranges)?;
                Origin::Config
            }
        };
        validate_routes(&self.name, &self.routes)?;
        if self.addressing.is_some() && self.ranges_from != Some(RangesFrom::Cluster) {
            return Err(Error::InvalidConfig(format!(
                "network {:?}: addressing goes with ranges_from = \"cluster\" (a cluster pool's network)",
                self.name
            )));
        }
        let subnet_mode = addressing::subnet_mode(
            &self.name,
            self.addressing,
            self.gateway.as_ref(),
            &self.exclude,
            addressing::Spelling::Toml,
        )?;
        Ok(NetworkDef {
            name: self.name.clone(),
            range_sets: self.ranges.clone(),
            retiring: Vec::new(),
            routes: self.routes.clone(),
            tuning,
            origin,
            set_pools: Default::default(),
            subnet_mode,
            cluster_pools: Vec::new(),
        })
    }
}

pub mod addressing;
pub mod cluster;
mod ipam_section;
#[cfg(test)]
mod tests;
