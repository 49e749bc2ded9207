//! A network's ranges from a cluster pool (`ranges_from = "cluster"`): the pool's CIDRs, one
//! range set per family, read from etcd at start and every minute after. The addresses
//! themselves come from the blocks this node claims ([`crate::cluster::source`]); the ranges
//! only say which CIDRs those blocks are carved from.

use std::sync::Arc;
use std::time::Duration;

use super::{Feed, Seen};
use crate::cluster::model::{Pool, PoolPhase};
use crate::cluster::node::ClusterNode;
use crate::cluster::pool::PoolSpec;
use crate::range::RangeSpec;

/// How often the pool is read again once known.
const REREAD: Duration = Duration::from_secs(60);

/// The pool's CIDRs as range sets: IPv4 first, then IPv6.
pub fn range_sets(spec: &PoolSpec) -> Vec<Vec<RangeSpec>> {
    let set = |v4: bool| -> Vec<RangeSpec> {
        spec.cidrs
            .iter()
            .filter(|c| c.addr().is_ipv4() == v4)
            .map(|c| RangeSpec {
                subnet: c.to_string(),
                range_start: None,
                range_end: None,
                gateway: None,
            })
            .collect()
    };
    [set(true), set(false)]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect()
}

/// Reads pool `pool` until the task is aborted, handing its CIDRs to `feed`.
pub async fn follow(mut feed: Feed, node: Arc<ClusterNode>, pool: String) {
    let mut wait = Duration::from_secs(1);
    let mut last_remind = tokio::time::Instant::now();
    loop {
        let store = node.store_name();
        let pause = match node.read_pool(&pool).await {
            Ok(Some(p)) if p.phase != PoolPhase::Ready => {
                // Its ranges stay as they are: a deletion may yet be refused, a creation is on
                // its way; the sources claim nothing from it meanwhile.
                let why = match p.phase {
                    PoolPhase::Deleting => format!(
                        "cluster pool {pool:?} is being deleted in {store}: no block is claimed from it until the deletion is done or refused (if no `ipoolctl cluster pool delete` runs, running it again finishes the deletion or makes the pool Ready)"
                    ),
                    _ => format!(
                        "cluster pool {pool:?} is being created in {store} ({}): nothing is claimed from it before it is Ready",
                        p.phase.as_str()
                    ),
                };
                feed.apply(Seen::Missing(why)).await;
                Duration::from_secs(2)
            }
            Ok(Some(Pool { spec, .. })) => {
                wait = Duration::from_secs(1);
                let seen = Seen::Ranges {
                    sets: range_sets(&spec),
                    routes: Vec::new(),
                };
                match feed.apply(seen).await {
                    true => REREAD,
                    false => Duration::from_secs(1),
                }
            }
            Ok(None) => {
                feed.apply(Seen::Missing(format!(
                    "cluster pool {pool:?} does not exist in {store} (create it: ipoolctl cluster pool create {pool} --cidr CIDR)"
                )))
                .await;
                Duration::from_secs(5)
            }
            Err(e) => {
                feed.failed(&e);
                feed.why_none(&format!(
                    "cannot read cluster pool {pool:?} from {store}: {e}"
                ));
                wait = (wait * 2).min(Duration::from_secs(30));
                wait
            }
        };
        if last_remind.elapsed() >= super::REMIND_EVERY {
            feed.remind();
            last_remind = tokio::time::Instant::now();
        }
        tokio::time::sleep(pause).await;
    }
}

/// Gives back, every `resync_secs` while the node serves, this node's blocks of the pools no
/// network here takes its ranges from any more (a network removed, or given another
/// `cluster_pool`) once nothing here holds an address of them. Runs until aborted.
pub async fn give_back_unused(node: Arc<ClusterNode>, ipam: crate::ipam::Ipam, used: Vec<String>) {
    let every = Duration::from_secs(node.settings().resync_secs);
    loop {
        tokio::time::sleep(every).await;
        if node.serving().is_err() {
            continue;
        }
        let me = node.name().to_string();
        let listed = match node
            .call("list_blocks", |s| async move {
                s.list_blocks(None, Some(&me)).await
            })
            .await
        {
            Ok(l) => l,
            Err(e) => {
                tracing::debug!(error = %e, "cannot list this node's blocks of unused pools");
                continue;
            }
        };
        for b in listed.blocks {
            if used.contains(&b.pool) || ipam.holds_in(&b.block) {
                continue;
            }
            let (given, block) = (b.clone(), b.block);
            match node
                .call("give_back", |s| async move { s.give_back(&given).await })
                .await
            {
                Ok(true) => {
                    tracing::info!(pool = %b.pool, %block, "gave back a block of a pool no network here uses any more");
                    crate::metrics::ClusterMetrics::pool_counter(
                        &node.metrics().cluster.give_backs,
                        &b.pool,
                        1,
                    );
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(pool = %b.pool, %block, error = %e, "cannot give back a block of an unused pool")
                }
            }
        }
    }
}
