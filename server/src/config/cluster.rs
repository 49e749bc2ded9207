//! The `[cluster]` table of ipoold's config: the etcd this node claims address blocks from
//! (for networks with `ranges_from = "cluster"` and `cluster_pool`).

use std::path::PathBuf;

use serde::Deserialize;

use crate::model::Invalid;

/// How ipoold reaches etcd and claims blocks.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSettings {
    /// Where pools, blocks and node names live: `"etcd"` (an etcd ipool writes to, at
    /// `etcd_endpoints`) or `"kubernetes"` (custom resources and Leases in the cluster's own
    /// API: see `cluster::kube`).
    #[serde(default)]
    pub datastore: DatastoreKind,
    /// etcd's client URLs, e.g. ["https://10.0.0.10:2379"]. Hosts are IP addresses: the image
    /// has no resolver.
    #[serde(default)]
    pub etcd_endpoints: Vec<String>,
    /// `datastore = "kubernetes"`: the kubeconfig to reach the apiserver with; default:
    /// ipoold's `--kubeconfig`, else the pod's service account.
    pub kubeconfig: Option<PathBuf>,
    /// `datastore = "kubernetes"`: the namespace of the nodes' Leases.
    #[serde(default = "default_lease_namespace")]
    pub lease_namespace: String,
    /// The CA that signed etcd's server certificate (https endpoints).
    pub ca_file: Option<PathBuf>,
    /// This node's client certificate and key, when etcd asks for one.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// Where ipool's keys live in etcd.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// The name this node owns blocks under; default: `--node-name` (NODE_NAME, the
    /// Kubernetes node name).
    pub node_name: Option<String>,
    /// A new block is claimed in the background when a pool's free addresses in its owned
    /// blocks fall below this (or below the network's min_idle, if higher).
    #[serde(default = "default_claim_ahead")]
    pub claim_ahead: usize,
    /// A block empty this long is given back (a node keeps at least one).
    #[serde(default = "default_hold_down")]
    pub block_hold_down_secs: u64,
    /// A pin held by nobody whose owner is gone (its StatefulSet deleted or scaled below the
    /// ordinal, its VirtualMachine deleted) is deleted after this long, by the node whose block
    /// holds its address, or by the release of departed nodes where that node's daemon is gone
    /// (with `[kubernetes]`, which reads the owners).
    #[serde(default = "default_pin_ttl")]
    pub pin_ttl_secs: u64,
    /// How often this node's blocks (and its pools) are listed again, jittered: the safety net
    /// under the watches, which make the node act within a second of a change (a block given
    /// away by a forced release-node stops serving; a pool deleted or made anew is read).
    /// Without watches (`watch = false`) it is how late a node may learn of such a change.
    #[serde(default = "default_resync")]
    pub resync_secs: u64,
    /// Whether the node watches its blocks and the pools (an etcd watch on its index and the
    /// pools' prefix; a Kubernetes watch with its node's label selector and of the IPPools).
    /// Off: it polls every `resync_secs` (set it lower then, e.g. 60).
    #[serde(default = "default_watch")]
    pub watch: bool,
    /// This node's labels for the pools' nodeSelectors where ipoold has no `[kubernetes]`
    /// table (none: the node has no labels); with one, its Node's labels are watched and
    /// these are not used.
    #[serde(default)]
    pub node_labels: std::collections::BTreeMap<String, String>,
    /// Each call's deadline, to etcd or the apiserver (`etcd_timeout_ms`, its old name, is
    /// still read: deprecated).
    #[serde(default = "default_store_timeout", alias = "etcd_timeout_ms")]
    pub store_timeout_ms: u64,
    /// Calls to the store per second (claims, give-backs, syncs; heartbeats aside), and how
    /// many may come at once (`etcd_rate` and `etcd_burst`, their old names, are still read:
    /// deprecated).
    #[serde(default = "default_store_rate", alias = "etcd_rate")]
    pub store_rate: f64,
    #[serde(default = "default_store_burst", alias = "etcd_burst")]
    pub store_burst: u32,
    /// The heartbeat lease's TTL: while this node's daemon runs, its key
    /// `<prefix>/nodes/<node>/alive` lives (see `cluster::nodes`).
    #[serde(default = "default_heartbeat_ttl")]
    pub heartbeat_ttl_secs: u64,
    /// A daemon that could not renew its heartbeat for this long stops handing out new
    /// addresses until it has renewed and synced again; default: the heartbeat TTL (at most
    /// that: by the time the lease is gone and another may act on it, this node is fenced).
    pub fence_secs: Option<u64>,
    /// Nodes gone this long are released by themselves: a node whose Node object the
    /// apiserver no longer has (404, not merely NotReady) and whose name the store shows away
    /// past its fence and this many seconds gets its blocks given back exactly as `ipoolctl
    /// cluster release-node` (without --force) gives them. One daemon of the cluster does it
    /// at a time (it leads by a Lease, or an etcd lease). 0: off (an operator runs
    /// release-node). Needs `[kubernetes]` (the Nodes are asked); without it it stays off.
    #[serde(default)]
    pub release_departed_after_secs: u64,
}

/// The store of cluster mode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatastoreKind {
    #[default]
    Etcd,
    Kubernetes,
}

/// The namespace of the nodes' Leases unless `lease_namespace` says otherwise (deploy/'s).
pub const DEFAULT_LEASE_NAMESPACE: &str = "ipool-system";

fn default_lease_namespace() -> String {
    DEFAULT_LEASE_NAMESPACE.to_string()
}

/// Where ipool's keys live in etcd unless `prefix` says otherwise.
pub const DEFAULT_PREFIX: &str = "/ipool/v1";

fn default_prefix() -> String {
    DEFAULT_PREFIX.to_string()
}
fn default_claim_ahead() -> usize {
    8
}
fn default_hold_down() -> u64 {
    600
}
fn default_pin_ttl() -> u64 {
    600
}
fn default_resync() -> u64 {
    600
}
fn default_watch() -> bool {
    true
}
fn default_store_timeout() -> u64 {
    2000
}
fn default_store_rate() -> f64 {
    50.0
}
fn default_store_burst() -> u32 {
    20
}
fn default_heartbeat_ttl() -> u64 {
    30
}

impl ClusterSettings {
    /// The fence, in seconds (see `fence_secs`).
    pub fn fence(&self) -> u64 {
        self.fence_secs.unwrap_or(self.heartbeat_ttl_secs)
    }

    /// Every value usable; each error names the key and the bad value.
    pub fn validate(&self) -> Result<(), Invalid> {
        for (k, v) in &self.node_labels {
            crate::selector::NodeSelector::parse(&format!("{k}={v}"))
                .map_err(|e| Invalid(format!("[cluster] node_labels: {e}")))?;
        }
        match self.datastore {
            DatastoreKind::Etcd if self.etcd_endpoints.is_empty() => {
                return Err(Invalid("[cluster] etcd_endpoints is empty: name at least one etcd client URL, e.g. \"https://10.0.0.10:2379\" (or set datastore = \"kubernetes\")".into()));
            }
            DatastoreKind::Kubernetes if !self.etcd_endpoints.is_empty() => {
                return Err(Invalid("[cluster] etcd_endpoints are for datastore = \"etcd\"; with datastore = \"kubernetes\" pools and blocks live in the cluster's API".into()));
            }
            DatastoreKind::Etcd if self.kubeconfig.is_some() => {
                return Err(Invalid(
                    "[cluster] kubeconfig is for datastore = \"kubernetes\"".into(),
                ));
            }
            _ => {}
        }
        let ns = &self.lease_namespace;
        let dns_label = !ns.is_empty()
            && ns.len() <= 63
            && ns
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !ns.starts_with('-')
            && !ns.ends_with('-');
        if self.datastore == DatastoreKind::Kubernetes && !dns_label {
            return Err(Invalid(format!(
                "[cluster] lease_namespace {ns:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
            )));
        }
        for e in &self.etcd_endpoints {
            check_endpoint(e)?;
        }
        let https = self
            .etcd_endpoints
            .iter()
            .any(|e| e.starts_with("https://"));
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(Invalid(
                "[cluster] cert_file and key_file go together".into(),
            ));
        }
        if !https && (self.ca_file.is_some() || self.cert_file.is_some()) {
            return Err(Invalid(
                "[cluster] ca_file/cert_file are for https:// etcd endpoints; these are http://"
                    .into(),
            ));
        }
        if !self.prefix.starts_with('/') || self.prefix.len() < 2 {
            return Err(Invalid(format!(
                "[cluster] prefix {:?} must start with '/' and name something",
                self.prefix
            )));
        }
        if let Some(n) = &self.node_name {
            ipool_proto::names::check_name("node name", n)
                .map_err(|e| Invalid(format!("[cluster] node_name: {e}")))?;
        }
        if !(self.store_timeout_ms >= 100 && self.store_timeout_ms <= 60_000) {
            return Err(Invalid(format!(
                "[cluster] store_timeout_ms must be within 100..=60000 (it is {})",
                self.store_timeout_ms
            )));
        }
        if !(self.store_rate.is_finite() && self.store_rate > 0.0) || self.store_burst == 0 {
            return Err(Invalid(format!(
                "[cluster] store_rate must be above 0 and store_burst at least 1 (they are {} and {})",
                self.store_rate, self.store_burst
            )));
        }
        if !(1..=86_400).contains(&self.resync_secs) {
            return Err(Invalid(format!(
                "[cluster] resync_secs must be within 1..=86400 (it is {})",
                self.resync_secs
            )));
        }
        if !(5..=3600).contains(&self.heartbeat_ttl_secs) {
            return Err(Invalid(format!(
                "[cluster] heartbeat_ttl_secs must be within 5..=3600 (it is {})",
                self.heartbeat_ttl_secs
            )));
        }
        if let Some(f) = self.fence_secs {
            if !(1..=self.heartbeat_ttl_secs).contains(&f) {
                return Err(Invalid(format!(
                    "[cluster] fence_secs must be within 1..=heartbeat_ttl_secs ({}): a node must stop handing out before its lease can be gone (it is {f})",
                    self.heartbeat_ttl_secs
                )));
            }
        }
        if self.pin_ttl_secs > crate::model::MAX_SECS {
            return Err(Invalid(format!(
                "[cluster] pin_ttl_secs is at most a year (it is {})",
                self.pin_ttl_secs
            )));
        }
        if self.release_departed_after_secs > crate::model::MAX_SECS {
            return Err(Invalid(format!(
                "[cluster] release_departed_after_secs is at most a year (it is {})",
                self.release_departed_after_secs
            )));
        }
        if self.block_hold_down_secs > crate::model::MAX_SECS {
            return Err(Invalid(format!(
                "[cluster] block_hold_down_secs is at most a year (it is {})",
                self.block_hold_down_secs
            )));
        }
        Ok(())
    }
}

/// `http(s)://IP:PORT`: etcd's client URL with an address, not a host name (a static binary
/// in a scratch image cannot resolve names).
pub fn check_endpoint(e: &str) -> Result<(), Invalid> {
    let rest = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
        .ok_or_else(|| {
            Invalid(format!(
                "etcd endpoint {e:?}: give a URL, http://IP:PORT or https://IP:PORT"
            ))
        })?;
    let rest = rest.trim_end_matches('/');
    if rest.parse::<std::net::SocketAddr>().is_err() {
        return Err(Invalid(format!(
            "etcd endpoint {e:?}: the host must be an IP address with a port (e.g. https://10.0.0.10:2379 or https://[fd00::10]:2379); names cannot be resolved in ipool's image"
        )));
    }
    Ok(())
}
