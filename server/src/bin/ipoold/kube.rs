//! ipoold's Kubernetes wiring: the node's name and the client, the networks whose ranges come
//! from the node, and what --rebuild-from-pods does to the store.

use std::path::PathBuf;

use anyhow::Context;
use ipool_server::{
    config::NodeRanges,
    ipam::Ipam,
    k8s,
    model::RouteSpec,
    node_ranges::{self, Feed},
};

use crate::Args;

/// Moves a refused state dir aside; returns where.
pub(crate) fn set_aside(state_dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let mut aside = state_dir.as_os_str().to_owned();
    aside.push(format!(".refused-{secs}"));
    let aside = PathBuf::from(aside);
    std::fs::rename(state_dir, &aside).with_context(|| {
        format!(
            "moving the refused state dir {} to {}",
            state_dir.display(),
            aside.display()
        )
    })?;
    Ok(aside)
}

/// True when opening failed because the store is damaged (what --rebuild-from-pods replaces).
pub(crate) fn refused_as_damaged(e: &anyhow::Error) -> bool {
    use ipool_server::{error::Error, store::StoreError};
    matches!(
        e.downcast_ref::<Error>(),
        Some(Error::Store(StoreError::Corrupt { .. }))
    )
}

pub(crate) fn node_name(args: &Args, why: &str) -> anyhow::Result<String> {
    args.node_name.clone().with_context(|| {
        format!("{why}: give --node-name (or NODE_NAME, from the downward API's spec.nodeName)")
    })
}

/// The Kubernetes client, made once; every request answered within `read_timeout`.
pub(crate) async fn kube_client(
    args: &Args,
    read_timeout: std::time::Duration,
    client: &mut Option<kube::Client>,
) -> anyhow::Result<kube::Client> {
    if client.is_none() {
        *client = Some(k8s::client(args.kubeconfig.as_deref(), read_timeout).await?);
    }
    Ok(client.clone().expect("made above"))
}

/// Starts following the node's ranges for the networks that take them from there.
pub(crate) async fn follow_node_ranges(
    args: &Args,
    networks: &[(String, NodeRanges, Vec<RouteSpec>)],
    ipam: &Ipam,
    read_timeout: std::time::Duration,
    client: &mut Option<kube::Client>,
) -> anyhow::Result<()> {
    for (network, from, routes) in networks {
        let feed = Feed::new(ipam.clone(), network, routes.clone());
        match from {
            NodeRanges::Flannel(path) => {
                tokio::spawn(node_ranges::flannel::follow(feed, path.clone()));
            }
            NodeRanges::PodCidrs => {
                let node = node_name(
                    args,
                    &format!("network {network:?} takes its ranges from the node's spec.podCIDRs"),
                )?;
                let c = kube_client(args, read_timeout, client).await?;
                tokio::spawn(node_ranges::podcidrs::follow(feed, c, node, read_timeout));
            }
        }
    }
    Ok(())
}
