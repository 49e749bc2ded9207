//! ipoold's cluster-mode wiring: this node in etcd, the sources of the networks whose ranges
//! are blocks of a cluster pool, their pools followed, the heartbeat.

use std::sync::Arc;

use anyhow::Context;
use ipool_server::{
    cluster::{
        node::{ClusterNode, Identity},
        source::ClusterSource,
    },
    config::{cluster::DatastoreKind, DaemonConfig},
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
    /// The heartbeat's task, once started: stopped before the name is given up.
    heartbeat: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

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
    Ok((
        Some(Cluster {
            node,
            networks,
            heartbeat: std::sync::Mutex::new(None),
        }),
        sources,
    ))
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
    tracing::info!(node = %cluster.node.name(), instance = %cluster.node.instance(), etcd = %cluster.node.settings().etcd_endpoints.join(","), networks = cluster.networks.len(), "cluster mode");
    *cluster.heartbeat.lock().expect("heartbeat lock") =
        Some(tokio::spawn(cluster.node.clone().heartbeat()));
    // Health follows whether this daemon holds the node's name.
    let (node, health) = (cluster.node.clone(), ipam.clone());
    let mut changes = node.watch_identity();
    tokio::spawn(async move {
        loop {
            let taken = match &*changes.borrow_and_update() {
                Identity::Taken { .. } => node.serving().err().map(|n| n.why),
                _ => None,
            };
            health.set_name_taken(taken);
            // The sources sync (and serve) once the name is held: at once, not at the next
            // tick of the background loop.
            health.nudge();
            if changes.changed().await.is_err() {
                return;
            }
        }
    });
    let used = cluster.networks.iter().map(|(_, p, _)| p.clone()).collect();
    tokio::spawn(node_ranges::cluster::give_back_unused(
        cluster.node.clone(),
        ipam.clone(),
        used,
    ));
    for (network, pool, routes) in &cluster.networks {
        let feed = Feed::new(ipam.clone(), network, routes.clone());
        tokio::spawn(node_ranges::cluster::follow(
            feed,
            cluster.node.clone(),
            pool.clone(),
        ));
    }
}

/// A clean stop, once nothing more is served: the heartbeat stops and the node's name is
/// given up (a replacement daemon takes it at once; release-node sees the node away from
/// now). Bounded by the store's timeout; a store that does not answer leaves the name to lapse
/// with its lease.
pub(crate) async fn stop(cluster: &Cluster) {
    let task = cluster.heartbeat.lock().expect("heartbeat lock").take();
    if let Some(task) = task {
        task.abort();
        let _ = task.await;
    }
    let within = std::time::Duration::from_millis(cluster.node.settings().etcd_timeout_ms) * 2;
    match tokio::time::timeout(within, cluster.node.give_up_name()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot give up the node's name: it lapses with its lease")
        }
        Err(_) => {
            tracing::warn!("giving up the node's name took too long: it lapses with its lease")
        }
    }
}
