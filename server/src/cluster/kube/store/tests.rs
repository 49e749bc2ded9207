use crate::cluster::node::ClusterNode;
use crate::config::ClusterSettings;

/// Malformed objects reported by a listing clear when the next listing of the same kind
/// no longer finds them, whatever the store calls its keys (on the
/// Kubernetes API they never cleared).
#[test]
fn malformed_findings_clear_when_the_next_listing_no_longer_has_them() {
    use crate::cluster::vocab::MalformedKey;
    let settings: ClusterSettings = toml::from_str("datastore = \"kubernetes\"").expect("settings");
    let n = ClusterNode::new(settings, "n1".into(), "i".into(), Default::default()).expect("node");
    let bad = MalformedKey {
        key: "ipblocks/10-0-0-0-26".into(),
        why: "spec.pool or spec.node is missing".into(),
        block: Some("10.0.0.0/26".parse().unwrap()),
    };
    n.malformed_seen("p", true, std::slice::from_ref(&bad));
    n.malformed_seen("p", false, std::slice::from_ref(&bad));
    assert_eq!(n.malformed().len(), 1);
    n.malformed_seen("q", true, &[]);
    assert_eq!(
        n.malformed().len(),
        1,
        "another pool's listing says nothing of p's"
    );
    n.malformed_seen("p", false, &[]);
    assert_eq!(
        n.malformed().len(),
        1,
        "a sync's listing says nothing of the whole pool"
    );
    n.malformed_seen("p", true, &[]);
    assert_eq!(n.malformed(), Vec::<String>::new());
}

#[test]
fn a_node_name_too_long_for_a_label_is_refused_at_start_naming_the_way_out() {
    let settings: ClusterSettings = toml::from_str("datastore = \"kubernetes\"").expect("settings");
    let long = format!("{}.compute.internal", "n".repeat(50));
    let e = ClusterNode::new(settings.clone(), long, "i".into(), Default::default())
        .err()
        .expect("refused");
    assert!(
        e.0.contains("at most 63") && e.0.contains("node_name"),
        "{e}"
    );
    assert!(ClusterNode::new(settings, "n1".into(), "i".into(), Default::default()).is_ok());
}
