//! `ipoolctl cluster nodes`: every node the store knows (a heartbeat, or a block it owns):
//! alive (the daemon instance holding its name) or away for how long, its blocks and the
//! addresses they hold, the addresses in use as its daemon last reported them, and which
//! daemon leads the release of departed nodes.

use std::collections::BTreeMap;

use ipool_server::cluster::datastore::Datastore;
use ipool_server::cluster::departed::ROLE;
use ipool_server::cluster::vocab::{ClusterError, NodeSeen};

use crate::cluster_out::warn_malformed;
use crate::Output;

/// A node as listed: as last heard, and its blocks.
struct Row {
    seen: NodeSeen,
    blocks: Vec<String>,
    addresses: u128,
}

fn state(s: &NodeSeen) -> String {
    match (&s.alive, s.away_secs) {
        (Some(i), _) => format!("alive ({i})"),
        (None, Some(a)) => format!("away {a} s"),
        // Its blocks remain, but no heartbeat: away longer than etcd keeps one (30 days),
        // released, or never run.
        (None, None) => "no heartbeat".into(),
    }
}

pub(crate) async fn list(
    store: &dyn Datastore,
    place: &str,
    out: Output,
) -> Result<(), ClusterError> {
    let seen = store.nodes_seen().await?;
    let blocks = store.list_blocks(None, None).await?;
    warn_malformed(place, &blocks.malformed);
    let leader = store.leader(ROLE).await?;
    let mut rows: BTreeMap<String, Row> = seen
        .into_iter()
        .map(|s| {
            let row = Row {
                seen: s.clone(),
                blocks: Vec::new(),
                addresses: 0,
            };
            (s.node, row)
        })
        .collect();
    for b in &blocks.blocks {
        let row = rows.entry(b.owner.node.clone()).or_insert_with(|| Row {
            seen: NodeSeen {
                node: b.owner.node.clone(),
                ..NodeSeen::default()
            },
            blocks: Vec::new(),
            addresses: 0,
        });
        row.blocks.push(b.block.to_string());
        let bits = b.block.max_prefix_len() - b.block.prefix_len();
        row.addresses += 1u128 << bits.min(127);
    }
    let who = who_releases(place, leader.as_deref());
    if out == Output::Json {
        let v: Vec<serde_json::Value> = rows
            .values()
            .map(|r| {
                serde_json::json!({
                    "node": r.seen.node, "alive": r.seen.alive.is_some(),
                    "instance": r.seen.alive, "awaySecs": r.seen.away_secs,
                    "fenceSecs": r.seen.fence_secs, "blocks": r.blocks,
                    "addresses": r.addresses.to_string(),
                    "inUse": r.seen.in_use.map(|u| u.in_use),
                    "inUseReportedAtMs": r.seen.in_use.map(|u| u.at_ms),
                })
            })
            .collect();
        outln!(
            "{}",
            serde_json::json!({"nodes": v, "releaseDepartedLeader": leader, "releaseDeparted": who})
        );
        return Ok(());
    }
    let table = rows
        .values()
        .map(|r| {
            vec![
                r.seen.node.clone(),
                state(&r.seen),
                r.blocks.len().to_string(),
                r.addresses.to_string(),
                r.seen
                    .in_use
                    .map_or("-".to_string(), |u| u.in_use.to_string()),
            ]
        })
        .collect();
    crate::print::table(&["NODE", "STATE", "BLOCKS", "ADDRESSES", "IN-USE"], table);
    outln!("{who}");
    Ok(())
}

/// Who releases departed nodes on the store `place` names, `leader` leading that work.
fn who_releases(place: &str, leader: Option<&str>) -> String {
    match (leader, place) {
        (Some(l), _) => format!(
            "departed nodes are released by {l} (it leads; [cluster] release_departed_after_secs)"
        ),
        // deploy/cluster-kubernetes's admission policy keeps each daemon to its own Lease: no
        // daemon can take the lead there.
        (None, "etcd") => "no daemon leads the release of departed nodes: [cluster] release_departed_after_secs is 0, or [kubernetes] missing, on every daemon that runs (or none runs); `ipoolctl cluster release-departed` releases them once".into(),
        (None, _) => "no daemon leads the release of departed nodes: on the Kubernetes API store deploy/cluster-kubernetes's CronJob ipool-release-departed does it every 10 minutes (kubectl -n ipool-system get cronjob ipool-release-departed; its jobs' logs say what each run released)".into(),
    }
}
