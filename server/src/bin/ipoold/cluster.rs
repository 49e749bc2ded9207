//! ipoold's cluster-mode wiring: this node in etcd, the sources of the networks whose ranges
//! are blocks of a cluster pool, their pools followed, the heartbeat.

use std::sync::Arc;

use anyhow::Context;
use ipool_server::{
    cluster::{node::ClusterNode, source::ClusterSource},
    config::DaemonConfig,
    ipam::Ipam,
    metrics::Metrics,
    model::RouteSpec,
    node_ranges::{self, Feed},
    source::{LocalSource, Sources},
};

use crate::Args;

pub(crate) struct Cluster {
    node: Arc<ClusterNode>,
    /// (network, pool, routes)
    networks: Vec<(String, String, Vec<RouteSpec>)>,
}

/// The sources every network's range sets get: blocks of a cluster pool for the networks
/// that take their ranges from one, local ranges for the rest.
pub(crate) fn setup(
    args: &Args,
    config: &DaemonConfig,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<(Option<Cluster>, Sources)> {
    let Some(settings) = config.cluster.clone() else {
        return Ok((None, Sources::default()));
    };
    let name = match settings.node_name.clone().or_else(|| args.node_name.clone()) {
        Some(n) => n,
        None => anyhow::bail!(
            "[cluster]: this node owns blocks under its name: set [cluster] node_name, or give --node-name (NODE_NAME, from the downward API's spec.nodeName)"
        ),
    };
    let node = ClusterNode::new(settings, name, metrics.clone())
        .map_err(anyhow::Error::msg)
        .context("[cluster]")?;
    let networks = config.cluster_networks();
    let pools: std::collections::HashMap<String, String> = networks
        .iter()
        .map(|(n, p, _)| (n.clone(), p.clone()))
        .collect();
    let n = node.clone();
    let sources = Sources::new(move |def, ranges| match pools.get(&def.name) {
        Some(pool) => Box::new(ClusterSource::new(
            n.clone(),
            pool,
            &ranges,
            def.tuning.min_idle,
        )),
        None => Box::new(LocalSource::new(ranges)),
    });
    Ok((Some(Cluster { node, networks }), sources))
}

/// Starts the heartbeat and follows each cluster network's pool.
pub(crate) fn start(cluster: &Cluster, ipam: &Ipam) {
    tracing::info!(node = %cluster.node.name(), etcd = %cluster.node.settings().etcd_endpoints.join(","), networks = cluster.networks.len(), "cluster mode");
    tokio::spawn(cluster.node.clone().heartbeat());
    for (network, pool, routes) in &cluster.networks {
        let feed = Feed::new(ipam.clone(), network, routes.clone());
        tokio::spawn(node_ranges::cluster::follow(
            feed,
            cluster.node.clone(),
            pool.clone(),
        ));
    }
}
