//! The check's judgement over a state of each kind, and over a clean one.

use super::*;
use crate::cluster::ippool::PoolSpec;
use crate::cluster::pin::{Holder, Pin, PinOwner};
use crate::cluster::vocab::{KeyRevision, MalformedKey, Owner, Pool, PoolPhase};

fn block(pool: &str, cidr: &str, node: &str) -> Block {
    Block {
        pool: pool.into(),
        block: cidr.parse().unwrap(),
        owner: Owner {
            node: node.into(),
            claimed_at_ms: 0,
        },
        revision: KeyRevision {
            create: 1,
            modified: 1,
            write: None,
        },
    }
}

fn pools() -> Pools {
    Pools {
        pools: vec![Pool {
            spec: PoolSpec {
                name: "p".into(),
                cidrs: vec!["10.1.0.0/24".parse().unwrap()],
                block_v4: 28,
                block_v6: 122,
                ..PoolSpec::default()
            },
            revision: 1,
            phase: PoolPhase::Ready,
        }],
        malformed: Vec::new(),
        revision: 1,
    }
}

fn alive(node: &str) -> NodeSeen {
    NodeSeen {
        node: node.into(),
        alive: Some("i".into()),
        away_secs: None,
        fence_secs: 30,
        in_use: None,
        k8s_node: Some(node.into()),
    }
}

fn pod(name: &str, node: &str, ip: &str) -> PodIps {
    PodIps {
        pod: format!("ns/{name}"),
        node: node.into(),
        ips: vec![ip.parse().unwrap()],
        vm: None,
    }
}

fn kinds(r: &Report) -> Vec<Kind> {
    r.findings.iter().map(|f| f.kind).collect()
}

#[test]
fn a_consistent_cluster_has_no_finding() {
    let blocks = Listing {
        blocks: vec![
            block("p", "10.1.0.0/28", "n1"),
            block("p", "10.1.0.16/28", "n2"),
        ],
        malformed: Vec::new(),
    };
    let pools = pools();
    let nodes = [alive("n1"), alive("n2")];
    let s = Stored {
        pools: &pools,
        blocks: &blocks,
        nodes: &nodes,
        pins: &[],
    };
    let api = Apiserver {
        nodes: ["n1".into(), "n2".into()].into(),
        // An address outside every pool (hostNetwork's, another IPAM's) is not ipool's.
        pods: vec![
            pod("a", "n1", "10.1.0.2"),
            pod("b", "n2", "10.1.0.18"),
            pod("h", "n2", "192.168.0.5"),
        ],
    };
    let r = check(&s, Some(&api));
    assert_eq!(r.findings, Vec::new());
    assert!(r.apiserver);
    assert_eq!((r.blocks, r.nodes, r.pods), (2, 2, 3));
}

#[test]
fn each_kind_of_inconsistency_is_one_finding() {
    let mut pools = pools();
    pools.malformed.push(MalformedKey {
        key: "pools/bad".into(),
        why: "not JSON".into(),
        block: None,
    });
    let blocks = Listing {
        blocks: vec![
            block("p", "10.1.0.0/28", "n1"),
            block("p", "10.1.0.16/28", "n2"),
            block("p", "10.1.0.32/28", "ghost"),
            block("p", "10.1.0.48/28", "sleeper"),
            block("gone", "10.2.0.0/28", "n1"),
            block("p", "10.1.0.64/27", "n2"),
        ],
        malformed: Vec::new(),
    };
    let nodes = [
        alive("n1"),
        alive("n2"),
        NodeSeen {
            node: "sleeper".into(),
            alive: None,
            away_secs: Some(600),
            fence_secs: 30,
            in_use: None,
            k8s_node: Some("sleeper".into()),
        },
    ];
    let holder = |node: &str| Holder {
        node: node.into(),
        pod: "ns/x".into(),
        uid: "u".into(),
        since_ms: 0,
        instance: None,
    };
    let vm = PinRead {
        pin: Pin {
            pool: "p".into(),
            address: "10.1.0.9".parse().unwrap(),
            owner: PinOwner::VirtualMachine {
                namespace: "ns".into(),
                name: "vm1".into(),
            },
            block: "10.1.0.0/28".parse().unwrap(),
            block_id: 1,
            set_aside: false,
            holders: vec![holder("n1"), holder("n2")],
        },
        version: "1".into(),
    };
    let pins = [
        vm,
        PinRead {
            pin: Pin {
                pool: "p".into(),
                address: "10.1.0.5".parse().unwrap(),
                owner: PinOwner::StatefulSet {
                    namespace: "ns".into(),
                    name: "web".into(),
                    ordinal: 0,
                },
                block: "10.1.0.0/28".parse().unwrap(),
                block_id: 1,
                set_aside: false,
                holders: vec![holder("n2")],
            },
            version: "1".into(),
        },
    ];
    let s = Stored {
        pools: &pools,
        blocks: &blocks,
        nodes: &nodes,
        pins: &pins,
    };
    let api = Apiserver {
        nodes: ["n1".into(), "n2".into(), "sleeper".into()].into(),
        pods: vec![
            // On n2 with an address of n1's block.
            pod("stray", "n2", "10.1.0.3"),
            // In no block.
            pod("lost", "n1", "10.1.0.200"),
            // Two pods, one address (n1's block).
            pod("one", "n1", "10.1.0.7"),
            pod("two", "n1", "10.1.0.7"),
            // Pinned for n2, in n1's block: fine.
            pod("web-0", "n2", "10.1.0.5"),
            // A VM's two launchers during its migration, its pin held by both nodes: fine.
            PodIps {
                vm: Some("ns/vm1".into()),
                ..pod("virt-launcher-a", "n1", "10.1.0.9")
            },
            PodIps {
                vm: Some("ns/vm1".into()),
                ..pod("virt-launcher-b", "n2", "10.1.0.9")
            },
        ],
    };
    let r = check(&s, Some(&api));
    assert_eq!(
        kinds(&r),
        vec![
            Kind::NodeGone,
            Kind::NodeAway,
            Kind::PodInAnotherNodesBlock,
            Kind::PodInNoBlock,
            Kind::AddressOnTwoPods,
            Kind::BlockOutsidePool,
            Kind::BlockOutsidePool,
            Kind::Malformed,
        ],
        "{:#?}",
        r.findings
    );
    let gone = &r.findings[0];
    assert_eq!(gone.node.as_deref(), Some("ghost"));
    assert!(gone.fix.contains("release-node ghost"), "{}", gone.fix);
    assert_eq!(r.findings[1].node.as_deref(), Some("sleeper"));
    assert!(r.findings[4].what.contains("ns/one") && r.findings[4].what.contains("ns/two"));
    assert!(r.findings.iter().all(|f| !f.fix.is_empty()));
    // Without the apiserver: no Node nor pod is judged; the node away still is.
    let r = check(&s, None);
    assert!(!r.apiserver);
    assert!(!kinds(&r).contains(&Kind::NodeGone));
    assert!(!kinds(&r).contains(&Kind::PodInNoBlock));
    assert!(kinds(&r).contains(&Kind::NodeAway));
    // The report reads back as written (what release-node --from-check takes).
    let text = serde_json::to_string(&r).unwrap();
    let back: Report = serde_json::from_str(&text).unwrap();
    assert_eq!(back.findings, r.findings);
}

/// A node is judged by the Node its daemon recorded: "n3-store", whose
/// Node is "n3", is not gone while n3 is there, and is once it is not; a gone node whose every
/// block holds a pin is told as such (a release frees nothing there).
#[test]
fn nodes_are_judged_by_their_recorded_node_and_pinned_ones_said_so() {
    let pools = pools();
    let blocks = Listing {
        blocks: vec![
            block("p", "10.1.0.0/28", "n3-store"),
            block("p", "10.1.0.16/28", "pinned"),
        ],
        malformed: Vec::new(),
    };
    let away = |node: &str, k8s: &str| NodeSeen {
        node: node.into(),
        alive: None,
        away_secs: Some(5),
        fence_secs: 30,
        in_use: None,
        k8s_node: Some(k8s.into()),
    };
    let nodes = [away("n3-store", "n3"), away("pinned", "pinned")];
    let pin = PinRead {
        pin: Pin {
            pool: "p".into(),
            address: "10.1.0.20".parse().unwrap(),
            owner: PinOwner::StatefulSet {
                namespace: "ns".into(),
                name: "web".into(),
                ordinal: 1,
            },
            block: "10.1.0.16/28".parse().unwrap(),
            block_id: 1,
            set_aside: false,
            holders: Vec::new(),
        },
        version: "1".into(),
    };
    let pins = [pin];
    let s = Stored {
        pools: &pools,
        blocks: &blocks,
        nodes: &nodes,
        pins: &pins,
    };
    let with = |names: &[&str]| Apiserver {
        nodes: names.iter().map(|n| n.to_string()).collect(),
        pods: Vec::new(),
    };
    let r = check(&s, Some(&with(&["n3"])));
    assert_eq!(kinds(&r), vec![Kind::NodeGonePinned], "{:#?}", r.findings);
    assert!(r.findings[0].fix.contains("unpin"), "{}", r.findings[0].fix);
    let r = check(&s, Some(&with(&[])));
    assert_eq!(kinds(&r), vec![Kind::NodeGone, Kind::NodeGonePinned]);
    assert_eq!(r.findings[0].node.as_deref(), Some("n3-store"));
    assert!(
        r.findings[0].what.contains("\"n3\""),
        "{}",
        r.findings[0].what
    );
}
