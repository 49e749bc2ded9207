//! A cluster pool's network the config no longer names (renamed, or removed with `[cluster]`)
//! while it holds addresses: its stored definition must hand out nothing new. Before the fix,
//! its range sets got local sources over the whole pool, which handed out addresses of blocks
//! other nodes own. And a start whose config gives that pool to another network (the network
//! renamed, its pool kept) is refused while the old one holds addresses there: two networks of
//! one node would each hold the pool's blocks (before that fix the start went on; a later
//! start found the old network's addresses in no block and refused to start at all).

use crate::common::backend::Backend;
use crate::common::*;
use ipnet::IpNet;

#[test]
fn a_renamed_cluster_network_hands_out_nothing_of_other_nodes_blocks() {
    let store = Backend::kube();
    // Two blocks of /28: one for each node.
    store.create_pool(&["p", "--cidr", "10.88.0.0/27", "--block-size", "28"]);
    store.create_pool(&["q", "--cidr", "10.89.0.0/27", "--block-size", "28"]);
    let config = |node: &str| {
        store.daemon_config(
            node,
            "p",
            "heartbeat_ttl_secs = 6\nclaim_ahead = 1\nresync_secs = 2\n",
            &store.addr(),
        )
    };
    let mut n1 = Daemon::prepare_with_config(&config("n1"));
    n1.spawn();
    let c1 = add_within(30, "ADD c1 on n1", "c1", &n1.conf("1.1.0", "pods", ""));
    let mut n2 = Daemon::prepare_with_config(&config("n2"));
    n2.spawn();
    add_within(30, "ADD d1 on n2", "d1", &n2.conf("1.1.0", "pods", ""));
    let owners = store.owners();
    assert_eq!(owners.len(), 2, "{owners:?}");

    // n1 restarts with its network renamed, the pool kept: refused while "pods" holds c1
    // there, naming both networks and the pool.
    n1.terminate();
    let renamed = config("n1").replace("name = \"pods\"", "name = \"pods2\"");
    std::fs::write(n1.dir.path().join("ipoold.toml"), &renamed).expect("write config");
    let refused = n1.run_expecting_failure();
    assert!(
        refused.contains("\"pods\"")
            && refused.contains("\"pods2\"")
            && refused.contains("cluster pool \"p\""),
        "{refused}"
    );
    // Renamed and given pool q: "pods" is stored, no longer configured, its pool no other
    // network's.
    let moved = renamed.replace("cluster_pool = \"p\"", "cluster_pool = \"q\"");
    assert_ne!(moved, renamed);
    std::fs::write(n1.dir.path().join("ipoold.toml"), &moved).expect("write config");
    n1.spawn();
    let stale = n1.conf("1.1.0", "pods", "");
    let mine: Vec<IpNet> = owners
        .iter()
        .filter(|(_, n)| n.as_str() == "n1")
        .map(|(b, _)| *b)
        .collect();
    // Before the fix, local sources over the /27 handed out n2's 10.88.0.16/28 within a few
    // ADDs; now none is served (its ranges retired: each ADD waits `add_wait_ms`, then 11).
    for i in 0..3 {
        let r = cni("ADD", &format!("s{i}"), &stale);
        assert!(!r.ok && r.code() == 11, "{:?}", r.json);
        if r.ok {
            let ip: std::net::IpAddr = ip_of(&r).parse().unwrap();
            assert!(
                mine.iter().any(|b| b.contains(&ip)),
                "{ip} handed out on n1 for the network its config no longer names, in no block of n1's ({mine:?})\n{}",
                n1.log()
            );
        }
    }
    // Nor may a CNI config declare a network of pool p while "pods" holds p's blocks here.
    let nad = n1.conf("1.1.0", "sec", r#""clusterPool":"p""#);
    let r = cni("ADD", "n1", &nad);
    assert!(!r.ok && r.code() == 7, "{:?}", r.json);
    assert!(
        r.json["details"]
            .as_str()
            .unwrap_or("")
            .contains("\"pods\""),
        "{:?}",
        r.json
    );
    // What it holds is still released by its DEL; the renamed network hands out from q.
    assert!(cni("DEL", "c1", &stale).ok);
    let r = add_within(30, "ADD on pods2", "e1", &n1.conf("1.1.0", "pods2", ""));
    let ip: std::net::IpAddr = ip_of(&r).parse().unwrap();
    assert!(
        "10.89.0.0/27".parse::<IpNet>().unwrap().contains(&ip),
        "{ip}"
    );
    // Once "pods" holds nothing, the pool may go to a network of another name: "pods" is
    // dropped at the start that names p again.
    n1.terminate();
    std::fs::write(n1.dir.path().join("ipoold.toml"), &renamed).expect("write config");
    n1.spawn();
    let r = add_within(
        30,
        "ADD on pods2 from p",
        "e2",
        &n1.conf("1.1.0", "pods2", ""),
    );
    let ip: std::net::IpAddr = ip_of(&r).parse().unwrap();
    let owners = store.owners();
    let owner = owners.iter().find(|(b, _)| b.contains(&ip));
    assert!(
        matches!(owner, Some((_, n)) if n.as_str() == "n1"),
        "{ip} is in no block of n1's: {owners:?}"
    );
    drop((c1, n2));
}
