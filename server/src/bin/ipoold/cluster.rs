//! ipoold's cluster-mode wiring: this node in etcd, the sources of the networks whose ranges
//! are blocks of a cluster pool, their pools followed, the heartbeat.

use std::sync::Arc;

use anyhow::Context;
use ipool_server::{
    cluster::node::ClusterNode,
    config::{cluster::DatastoreKind, DaemonConfig},
    ipam::Ipam,
    metrics::Metrics,
    node_ranges::cluster::ClusterNetworks,
    source::Sources,
};

use crate::Args;

pub(crate) type Cluster = ClusterNetworks;

/// The sources every network's range sets get: blocks of a cluster pool for the networks
/// that take their ranges from one, local ranges for the rest.
pub(crate) fn setup(
    args: &Args,
    config: &DaemonConfig,
    metrics: &Arc<Metrics>,
) -> anyhow::Result<(Option<Cluster>, Sources)> {
    let Some(mut settings) = config.cluster.clone() else {
        return Ok((None, Sources::default()));
    };
    if settings.datastore == DatastoreKind::Kubernetes && settings.kubeconfig.is_none() {
        settings.kubeconfig = args.kubeconfig.clone();
    }
    let name = match settings.node_name.clone().or_else(|| args.node_name.clone()) {
        Some(n) => n,
        None => anyhow::bail!(
            "[cluster]: this node owns blocks under its name: set [cluster] node_name, or give --node-name (NODE_NAME, from the downward API's spec.nodeName)"
        ),
    };
    if let (Some(configured), Some(given)) = (&settings.node_name, &args.node_name) {
        if configured != given {
            tracing::warn!(node_name = %configured, flag = %given, "[cluster] node_name differs from --node-name (NODE_NAME): blocks are owned under the config's name; one ConfigMap with a node_name on every node makes every node the same one in etcd (only one of them serves)");
        }
    }
    let instance = instance_id(&args.state_dir).context("[cluster]: this daemon's instance id")?;
    let node = ClusterNode::new(settings, name, instance, metrics.clone())
        .map_err(anyhow::Error::msg)
        .context("[cluster]")?;
    // The Node's name (the downward API's spec.nodeName), recorded with the node's name in the
    // store: whether the node is gone is whether that Node is, whatever its name in the store.
    if let Some(n) = &args.node_name {
        node.set_k8s_node(n);
    }
    let (cluster, sources) = ClusterNetworks::new(node, config);
    Ok((Some(cluster), sources))
}

/// This daemon's instance in etcd: the id of its state dir, made at its first start (a
/// restart on the same state dir is the same instance; another machine, or a wiped state dir,
/// is another).
fn instance_id(state_dir: &std::path::Path) -> anyhow::Result<String> {
    let path = state_dir.join("cluster-instance");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let id = std::fs::read_to_string("/proc/sys/kernel/random/uuid")
        .map(|u| u.trim().to_string())
        .unwrap_or_else(|_| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            format!("{:x}-{:x}", t.as_nanos(), std::process::id())
        });
    ipool_server::install::install_bytes(&path, id.as_bytes(), 0o600)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(id)
}

/// Starts the heartbeat and follows each cluster network's pool.
pub(crate) fn start(cluster: &Cluster, ipam: &Ipam) {
    let node = cluster.node();
    tracing::info!(node = %node.name(), instance = %node.instance(), store = node.store_name(), networks = cluster.networks(), "cluster mode");
    cluster.start(ipam);
    // The holds of pins this node confirms at each renewal are those its engine holds.
    node.set_attachments(ipam.holds_for_weakly());
    tokio::spawn(report_in_use(node.clone(), ipam.clone()));
}

/// Reports the node's addresses in use to the store for `ipoolctl cluster nodes`: every
/// `resync_secs`, when the count changed since the last report (an idle node writes nothing;
/// on the Kubernetes API the next Lease renewal carries it).
async fn report_in_use(node: Arc<ClusterNode>, ipam: Ipam) {
    let every = std::time::Duration::from_secs(node.settings().resync_secs);
    let mut last = None;
    loop {
        tokio::time::sleep(ipool_server::cluster::jitter(every)).await;
        let in_use: u64 = ipam.pool_status(None).iter().map(|p| p.in_use as u64).sum();
        if last == Some(in_use) {
            continue;
        }
        match node.report_in_use(in_use).await {
            Ok(()) => last = Some(in_use),
            Err(e) => {
                tracing::debug!(error = %e, "reporting the addresses in use failed (tried again)")
            }
        }
    }
}

/// Departed nodes released by themselves (`[cluster] release_departed_after_secs`), where
/// the Nodes can be asked (`client`: `[kubernetes]`); said at start when it stays off.
pub(crate) fn release_departed(cluster: &Cluster, client: Option<&kube::Client>) {
    let node = cluster.node();
    let after = node.settings().release_departed_after_secs;
    match (after, client) {
        (0, _) => {}
        (_, None) => {
            tracing::warn!(after_secs = after, "[cluster] release_departed_after_secs is set but there is no [kubernetes] table: whether a node is gone is its Node's absence from the apiserver, which cannot be asked, so departed nodes are not released by themselves (ipoolctl cluster release-node does it)");
        }
        (_, Some(c)) => {
            if node.settings().datastore == DatastoreKind::Kubernetes {
                tracing::warn!(after_secs = after, "[cluster] release_departed_after_secs on the Kubernetes API store: deploy/cluster-kubernetes's admission policy lets a daemon write only its own node's blocks and Lease, so there the releases are refused; that variant runs `ipoolctl cluster release-departed` as a CronJob instead");
            }
            let nodes = std::sync::Arc::new(ipool_server::k8s::nodes::Nodes::new(c.clone()));
            tokio::spawn(ipool_server::cluster::departed::run(node.clone(), nodes));
        }
    }
}
