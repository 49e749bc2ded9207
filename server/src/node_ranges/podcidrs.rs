//! `ranges_from = "node"`: the node's ranges are its Node's `spec.podCIDRs` (given by
//! kube-controller-manager's nodeipam with `--allocate-node-cidrs`), one range set per
//! family, the gateway the first address (as host-local's default). The Node is watched:
//! podCIDRs that arrive late, or change (the Node deleted and re-created), take effect then.

use futures::StreamExt;
use ipnet::IpNet;
use ipool_proto::names::shown;
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};

use super::{Feed, Seen, REMIND_EVERY};
use crate::range::RangeSpec;

/// The ranges a Node gives `node`: its `spec.podCIDRs` (or the older single `spec.podCIDR`).
pub fn from_node(node: &str, obj: &Node) -> Seen {
    let spec = obj.spec.as_ref();
    let mut cidrs: Vec<String> = spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default();
    if cidrs.is_empty() {
        cidrs.extend(spec.and_then(|s| s.pod_cidr.clone()));
    }
    if cidrs.is_empty() {
        return Seen::Missing(format!(
            "node {node} has no podCIDRs yet (kube-controller-manager gives them with --allocate-node-cidrs)"
        ));
    }
    let mut nets = Vec::with_capacity(cidrs.len());
    for c in &cidrs {
        match c.trim().parse::<IpNet>() {
            Ok(net) if net.trunc() == net => nets.push(net),
            Ok(_) => {
                return Seen::Bad(format!(
                    "node {node}: podCIDR {} has host bits set",
                    shown(c)
                ))
            }
            Err(_) => return Seen::Bad(format!("node {node}: podCIDR {} is not a CIDR", shown(c))),
        }
    }
    nets.sort_by_key(|n| n.addr().is_ipv6());
    if nets
        .windows(2)
        .any(|w| w[0].addr().is_ipv6() == w[1].addr().is_ipv6())
    {
        return Seen::Bad(format!(
            "node {node}: podCIDRs {cidrs:?} name two of one family (one per family)"
        ));
    }
    let sets = nets
        .into_iter()
        .map(|net| {
            vec![RangeSpec {
                subnet: net.to_string(),
                range_start: None,
                range_end: None,
                gateway: None,
            }]
        })
        .collect();
    Seen::Ranges {
        sets,
        routes: Vec::new(),
    }
}

/// Watches Node `node` for `feed`'s network, forever (the watcher relists and reconnects
/// with backoff; the network keeps its ranges meanwhile).
pub async fn follow(
    mut feed: Feed,
    client: Client,
    node: String,
    read_timeout: std::time::Duration,
) {
    tracing::info!(network = feed.network(), node = %node, "ranges from the node's spec.podCIDRs");
    let api: Api<Node> = Api::all(client);
    let config = crate::k8s::watch_config(read_timeout).fields(&format!("metadata.name={node}"));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff());
    let mut remind = tokio::time::interval(REMIND_EVERY);
    remind.tick().await;
    let mut found = false;
    loop {
        tokio::select! {
            event = events.next() => match event {
                None => return,
                Some(Ok(watcher::Event::Init)) => found = false,
                Some(Ok(watcher::Event::InitApply(obj) | watcher::Event::Apply(obj))) => {
                    found = true;
                    let seen = from_node(&node, &obj);
                    while !feed.apply(seen.clone()).await {
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                }
                Some(Ok(watcher::Event::InitDone)) if !found => {
                    feed.apply(Seen::Missing(format!("node {node} does not exist (yet)"))).await;
                }
                Some(Ok(watcher::Event::InitDone)) => {}
                Some(Ok(watcher::Event::Delete(_))) => {
                    feed.apply(Seen::Missing(format!("node {node} was deleted"))).await;
                }
                Some(Err(e)) => feed.failed(&e),
            },
            _ = remind.tick() => feed.remind(),
        }
    }
}

#[cfg(test)]
mod tests;
