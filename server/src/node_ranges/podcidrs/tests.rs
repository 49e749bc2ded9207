use super::*;
use k8s_openapi::api::core::v1::NodeSpec;

fn node(cidrs: &[&str]) -> Node {
    Node {
        spec: Some(NodeSpec {
            pod_cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn one_set_per_family_ipv4_first() {
    let Seen::Ranges { sets, routes } = from_node("n1", &node(&["fd00:1::/64", "10.244.3.0/24"]))
    else {
        panic!()
    };
    assert!(routes.is_empty());
    let subnets: Vec<_> = sets.iter().map(|s| s[0].subnet.as_str()).collect();
    assert_eq!(subnets, ["10.244.3.0/24", "fd00:1::/64"]);
    assert!(sets.iter().all(|s| s.len() == 1 && s[0].gateway.is_none()));
}

#[test]
fn none_yet_and_malformed() {
    assert!(
        matches!(from_node("n1", &Node::default()), Seen::Missing(w) if w.contains("node n1 has no podCIDRs yet"))
    );
    for (cidrs, needle) in [
        (&["10.244.3.1/24"][..], "host bits"),
        (&["10.244.3.0/40"][..], "is not a CIDR"),
        (&["10.1.0.0/24", "10.2.0.0/24"][..], "two of one family"),
    ] {
        match from_node("n1", &node(cidrs)) {
            Seen::Bad(why) => assert!(why.contains(needle), "{why}"),
            other => panic!("{cidrs:?}: {other:?}"),
        }
    }
}
