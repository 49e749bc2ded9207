//! The metrics deploy/monitoring names (the alerts of rules.yaml, the Grafana dashboard's
//! queries) are the ones `/metrics` exports.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::registry;
use crate::clock::ManualClock;
use crate::config::DaemonConfig;
use crate::ipam::Ipam;
use crate::metrics::{BlockStateLabels, ClusterMetrics};
use crate::store::MemStore;

/// The sample names `/metrics` can carry, with Kubernetes and cluster mode on: a counter's
/// `_total`, a histogram's `_bucket`, `_sum` and `_count`, a gauge's own name.
async fn exported() -> BTreeSet<String> {
    let config = DaemonConfig::parse(
        "[[network]]\nname = \"n\"\nranges = [[{ subnet = \"10.1.0.0/24\" }]]\n",
    )
    .expect("config");
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let ipam = Ipam::open(Arc::new(MemStore::new()), clock, &config, Some("boot-1")).expect("open");
    // A family with no series yet is not written at all: one of each.
    let m = ipam.metrics();
    m.observe("ADD", None, Duration::from_millis(1));
    m.pod_gc("released", 1);
    let c = &m.cluster;
    c.claim("p", "won");
    ClusterMetrics::conflict(&c.conflicts, "p", "ownership", 1);
    ClusterMetrics::pool_counter(&c.give_backs, "p", 1);
    c.synced("p", "4");
    c.pool_read("p", true, 2, [("4", 16), ("6", 0)]);
    c.store_call("txn", Duration::from_millis(1), true);
    c.blocks
        .get_or_create(&BlockStateLabels {
            pool: "p".into(),
            family: "4".into(),
            state: "confirmed".into(),
        })
        .set(1);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry(&ipam, true, true))
        .expect("encode");
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
        match kind {
            "counter" => names.insert(format!("{name}_total")),
            "histogram" => {
                for s in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{s}"));
                }
                true
            }
            _ => names.insert(name.to_string()),
        };
    }
    names
}

/// Every `ipool_...` name in `text`.
fn named(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("ipool_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

fn monitoring(file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/monitoring")
        .join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test]
async fn every_alert_names_metrics_ipoold_exports() {
    let exported = exported().await;
    let rules = monitoring("rules.yaml");
    let exprs: String = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr:"))
        .collect::<Vec<_>>()
        .join("\n");
    let used = named(&exprs);
    assert!(used.len() >= 10, "the alerts name {used:?}");
    let missing: Vec<_> = used.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "rules.yaml names {missing:?}, which /metrics never exports (it does: {exported:?})"
    );
}

#[tokio::test]
async fn every_dashboard_query_names_metrics_ipoold_exports() {
    let exported = exported().await;
    let dashboard: serde_json::Value =
        serde_json::from_str(&monitoring("dashboard.json")).expect("dashboard.json is JSON");
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().into_iter().flatten() {
            queries.push((
                panel["title"].to_string(),
                t["expr"].as_str().expect("expr"),
            ));
        }
    }
    assert!(queries.len() >= 10, "{queries:?}");
    for (title, expr) in queries {
        let used = named(expr);
        assert!(
            !used.is_empty(),
            "panel {title}: {expr} names no ipool metric"
        );
        let missing: Vec<_> = used.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "panel {title}: {expr} names {missing:?}, which /metrics never exports"
        );
    }
}
