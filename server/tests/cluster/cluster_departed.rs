//! Departed nodes released by themselves, with the real daemons and plugin
//! on either store (the fake apiserver always; a real etcd where installed) and the Nodes on
//! the fake apiserver: a node whose daemon stopped keeps its blocks while its Node is there;
//! once the Node is gone and the daemon has been away past its fence and
//! `release_departed_after_secs`, exactly one of the daemons racing to lead gives them back;
//! a daemon that comes back first keeps them; `ipoolctl cluster nodes` shows what each node
//! is and who leads; without `[kubernetes]` it stays off, and says so.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use crate::common::backend::Backend;
use crate::common::fake_api::FakeApi;
use crate::common::*;
use serde_json::json;

const TUNING: &str =
    "heartbeat_ttl_secs = 6\nresync_secs = 1\nclaim_ahead = 1\nrelease_departed_after_secs = 3\n";

/// A daemon of node `n` on `store`, its Nodes read from `api`, its metrics at the address
/// returned.
fn daemon(store: &Backend, api: &FakeApi, n: &str) -> (Daemon, String) {
    let extra = format!("{TUNING}[kubernetes]\ngc_grace_secs = 600\n");
    let mut d = Daemon::prepare_with_config(&store.daemon_config(n, "p", &extra, &store.addr()));
    let kubeconfig = api.kubeconfig(d.dir.path());
    let metrics = format!("127.0.0.1:{}", free_port());
    d.add_args(&["--kubeconfig", &kubeconfig.display().to_string()]);
    d.add_args(&["--node-name", n, "--metrics-listen", &metrics]);
    d.spawn();
    (d, metrics)
}

/// An ADD on `d` (node `node`) of pod test/`name`, put on the apiserver first.
fn add(api: &FakeApi, d: &Daemon, node: &str, name: &str) {
    api.put(
        "pods",
        json!({"metadata": {"namespace": "test", "name": name, "uid": format!("uid-{name}")},
               "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}}),
    );
    add_within(
        30,
        &format!("ADD {name} on {node}"),
        name,
        &d.conf("1.0.0", "pods", ""),
    );
}

/// What the daemons logged of the release of departed nodes (for a failure's message).
fn departed_lines(daemons: &[(Daemon, String)]) -> Vec<String> {
    daemons
        .iter()
        .flat_map(|(d, _)| {
            d.log()
                .lines()
                .filter(|l| l.contains("departed") || l.contains("lead"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn metric(addr: &str, name: &str) -> f64 {
    let (_, body) = http_get(addr, "/metrics");
    samples(&body).get(name).copied().unwrap_or(0.0)
}

fn nodes_owning(store: &Backend) -> BTreeSet<String> {
    store.owners().into_values().collect()
}

fn departed_nodes_are_released(store: Backend) {
    store.create_pool(&["p", "--cidr", "10.59.0.0/24", "--block-size", "28"]);
    let own = store.own_api();
    let api = store.apiserver(&own);
    for n in ["n1", "n2", "n3"] {
        api.put("nodes", json!({"metadata": {"name": n}}));
    }
    let mut daemons: Vec<(Daemon, String)> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| daemon(&store, api, n))
        .collect();
    for (k, (d, _)) in daemons.iter().enumerate() {
        add(api, d, &format!("n{}", k + 1), &format!("c{k}"));
    }
    assert_eq!(
        nodes_owning(&store),
        BTreeSet::from(["n1".into(), "n2".into(), "n3".into()])
    );
    // Each daemon reports its addresses in use (resync_secs 1): `cluster nodes` shows them.
    eventually(20, "each node's addresses in use reported", || {
        let o = store.ctl(&["-o", "json", "nodes"]);
        let v = json(&o);
        let counts: Vec<serde_json::Value> = v["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| r["inUse"].clone())
            .collect();
        match counts == vec![json!(1), json!(1), json!(1)] {
            true => Ok(()),
            false => Err(v),
        }
    });

    // n3's daemon stops (a clean stop gives its name up: away from now on). Its Node is still
    // there: past the threshold and its fence, nothing is given back.
    assert!(daemons[2].0.terminate().success());
    std::thread::sleep(Duration::from_secs(14));
    assert!(
        nodes_owning(&store).contains("n3"),
        "a node whose Node is there was released"
    );

    // Its Node deleted: released, once, by the one daemon that leads.
    assert!(api.delete("nodes", "", "n3"));
    eventually(60, "n3's blocks given back", || {
        let owners = nodes_owning(&store);
        match owners.contains("n3") {
            false => Ok(()),
            true => Err((owners, departed_lines(&daemons[..2]))),
        }
    });
    let metrics: Vec<String> = daemons[..2].iter().map(|(_, m)| m.clone()).collect();
    let released_total = || -> f64 {
        metrics
            .iter()
            .map(|m| metric(m, "ipool_cluster_nodes_released_total"))
            .sum()
    };
    // (Counted once the look is done, after its release.)
    eventually(10, "n3's release counted", || match released_total() {
        1.0 => Ok(()),
        n => Err(n),
    });
    std::thread::sleep(Duration::from_secs(2));
    let released = released_total();
    assert_eq!(released, 1.0, "two daemons raced to lead: one released n3");
    let leaders: Vec<usize> = (0..2)
        .filter(|&k| metric(&metrics[k], "ipool_cluster_departed_leader") == 1.0)
        .collect();
    assert_eq!(leaders.len(), 1, "one leader: {leaders:?}");
    let leader = leaders[0];
    let log = daemons[leader].0.log();
    assert!(
        log.lines()
            .any(|l| l.contains("released a departed node") && l.contains("n3")),
        "{log}"
    );
    assert!(!daemons[1 - leader]
        .0
        .log()
        .contains("released a departed node"));

    // ipoolctl cluster nodes: who leads; n3 owns nothing; the others alive with a block.
    let o = store.ctl(&["-o", "json", "nodes"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    let lead_name = format!("n{}", leader + 1);
    assert_eq!(v["releaseDepartedLeader"], lead_name.as_str(), "{v}");
    let nodes = v["nodes"].as_array().expect("nodes");
    for n in ["n1", "n2"] {
        let row = nodes.iter().find(|r| r["node"] == n).expect("listed");
        assert_eq!(row["alive"], true, "{row}");
        assert!(!row["blocks"].as_array().unwrap().is_empty(), "{row}");
    }
    assert!(nodes
        .iter()
        .filter(|r| r["node"] == "n3")
        .all(|r| r["blocks"].as_array().unwrap().is_empty() && r["alive"] == false));
    let table = store.ctl(&["nodes"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains(&format!("released by {lead_name}")));

    // The follower stops, its Node is deleted, and it comes back before its blocks are
    // given back (on the Kubernetes API, while the leader watches its Lease before the
    // give-back; on etcd, before the threshold): it keeps them, and serves.
    let follower = 1 - leader;
    let follower_name = format!("n{}", follower + 1);
    assert!(daemons[follower].0.terminate().success());
    assert!(api.delete("nodes", "", &follower_name));
    if store.api().is_some() {
        eventually(60, "the leader watching the follower's Lease", || {
            let log = daemons[leader].0.log();
            match log
                .lines()
                .any(|l| l.contains("watching the node's Lease") && l.contains(&follower_name))
            {
                true => Ok(()),
                false => Err(()),
            }
        });
    }
    api.put("nodes", json!({"metadata": {"name": follower_name}}));
    daemons[follower].0.spawn();
    std::thread::sleep(Duration::from_secs(12));
    assert!(
        nodes_owning(&store).contains(&follower_name),
        "a node that came back was released"
    );
    assert_eq!(released_total(), 1.0);
    add(api, &daemons[follower].0, &follower_name, "back");
    if store.api().is_some() {
        let log = daemons[leader].0.log();
        assert!(
            log.lines()
                .any(|l| l.contains("release was refused") && l.contains(&follower_name)),
            "{log}"
        );
    }
}

#[test]
fn departed_nodes_are_released_by_one_daemon_on_the_kubernetes_api() {
    departed_nodes_are_released(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn departed_nodes_are_released_by_one_daemon_on_etcd() {
    departed_nodes_are_released(Backend::etcd());
}

/// Without `[kubernetes]` there are no Nodes to ask: the release stays off, said at start.
#[test]
fn without_kubernetes_departed_nodes_are_not_released_and_the_daemon_says_so() {
    let store = Backend::kube();
    store.create_pool(&["p", "--cidr", "10.60.0.0/24", "--block-size", "28"]);
    let d = Daemon::with_config(&store.daemon_config("n1", "p", TUNING, &store.addr()));
    d.wait_log(&["release_departed_after_secs is set but there is no [kubernetes] table"]);
}

/// `ipoolctl cluster release-departed`: one look, as the leader's, by the operator (or the
/// Kubernetes API variant's CronJob): a node whose Node is gone is released once its daemon
/// has been away long enough; one whose Node is there is not.
fn release_departed_by_ipoolctl(store: Backend) {
    store.create_pool(&["p", "--cidr", "10.63.0.0/24", "--block-size", "28"]);
    let own = store.own_api();
    let api = store.apiserver(&own);
    let dir = tempfile::tempdir().unwrap();
    let ctl = |args: &[&str]| store.ctl_with_api(api, dir.path(), 20, args);
    api.put("nodes", json!({"metadata": {"name": "stays"}}));
    let tuning = "heartbeat_ttl_secs = 6\nclaim_ahead = 1\n";
    let mut daemons: Vec<Daemon> = ["stays", "goes"]
        .iter()
        .map(|n| {
            let mut d =
                Daemon::prepare_with_config(&store.daemon_config(n, "p", tuning, &store.addr()));
            // Its Node's name, recorded with its name in the store (the DaemonSet's NODE_NAME).
            d.add_args(&["--node-name", n]);
            d.spawn();
            d
        })
        .collect();
    for (k, d) in daemons.iter().enumerate() {
        add_within(20, "an ADD", &format!("r{k}"), &d.conf("1.0.0", "pods", ""));
    }
    for d in daemons.iter_mut() {
        assert!(d.terminate().success());
    }
    // Too soon: its fence (6 s) and a renewal not past yet.
    let o = ctl(&["release-departed", "--after", "0"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("node goes: its Node is gone; not released"),
        "{out}"
    );
    assert!(!out.contains("node stays"), "{out}");
    std::thread::sleep(Duration::from_secs(9));
    let o = ctl(&["release-departed", "--after", "0"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("node goes: its Node is gone; released 1 block(s)"),
        "{out}"
    );
    assert_eq!(nodes_owning(&store), BTreeSet::from(["stays".to_string()]));
    // With etcd and no apiserver named: a usage error saying what it needs.
    if store.api().is_none() {
        let o = store.ctl(&["release-departed"]);
        assert_eq!(code(&o), 64, "{}", stderr(&o));
        assert!(stderr(&o).contains("--kubeconfig"), "{}", stderr(&o));
    }
}

#[test]
fn ipoolctl_releases_departed_nodes_on_the_kubernetes_api() {
    release_departed_by_ipoolctl(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn ipoolctl_releases_departed_nodes_on_etcd() {
    release_departed_by_ipoolctl(Backend::etcd());
}

/// The CNI config of the one-subnet network of pool l2 (fixed addresses need one).
const L2: &str = r#""clusterPool":"l2","addressing":"subnet","gateway":"10.93.0.1""#;

/// A departed node's blocks that hold a pin go back once the pin ends (items 1, 2
/// and 7): web-0's address, pinned in n1's block, moves to n2; n1 departs and is released,
/// its block kept for the pin (no release counted: nothing was freed); web-0's StatefulSet is
/// deleted, n2 lets go, and once the owner has been gone pin_ttl_secs the leader ends the pin
/// and gives the block back (on the Kubernetes API the node's Lease was kept for that second
/// release). A daemon whose name in the store is not its Node's (n3-store, Node n3) is judged
/// by the Node it recorded: kept while Node n3 is there, released once it is gone.
fn departed_pinned_blocks_go_back(store: Backend) {
    store.create_pool(&["l2", "--cidr", "10.93.0.0/24", "--block-size", "28"]);
    store.create_pool(&["p", "--cidr", "10.94.0.0/24", "--block-size", "28"]);
    let own = store.own_api();
    let api = store.apiserver(&own);
    for n in ["n1", "n2", "n3"] {
        api.put("nodes", json!({"metadata": {"name": n}}));
    }
    api.put("namespaces", json!({"metadata": {"name": "db"}}));
    api.put(
        "statefulsets",
        json!({"apiVersion": "apps/v1", "metadata": {"namespace": "db", "name": "web", "uid": "s1"},
               "spec": {"replicas": 1}}),
    );
    // n2 alone leads (the others' threshold 0 leaves the release off): its metrics count.
    let start = |store_name: &str, node: &str| -> (Daemon, String) {
        let tuning = match node {
            "n2" => TUNING.to_string(),
            _ => TUNING.replace(
                "release_departed_after_secs = 3",
                "release_departed_after_secs = 0",
            ),
        };
        let extra = format!("{tuning}pin_ttl_secs = 2\n[kubernetes]\ngc_grace_secs = 600\n");
        let mut d = Daemon::prepare_with_config(&store.daemon_config(
            store_name,
            "p",
            &extra,
            &store.addr(),
        ));
        let kubeconfig = api.kubeconfig(d.dir.path());
        let metrics = format!("127.0.0.1:{}", free_port());
        d.add_args(&["--kubeconfig", &kubeconfig.display().to_string()]);
        d.add_args(&["--node-name", node, "--metrics-listen", &metrics]);
        d.spawn();
        (d, metrics)
    };
    let mut daemons = [
        start("n1", "n1"),
        start("n2", "n2"),
        start("n3-store", "n3"),
    ];
    let pod = |node: &str, name: &str, uid: &str, meta: serde_json::Value| {
        common::fake_api::put_pod(api, node, name, uid, meta)
    };
    let cni = |d: &Daemon, cmd: &str, container: &str, args: &str| -> Run {
        cni_with_args(cmd, container, args, &d.conf("1.1.0", "l2net", L2))
    };
    let add = |d: &Daemon, container: &str, args: &str| -> Run {
        eventually(30, &format!("ADD {container}"), || {
            let r = cni(d, "ADD", container, args);
            match r.ok {
                true => Ok(r),
                false => Err(r),
            }
        })
    };
    let web0 = json!({"annotations": {"ipool.io/fixed": "true"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "s1", "controller": true}]});
    // web-0 on n1 (its address pinned in n1's block), a plain pod on n3.
    let args = pod("n1", "web-0", "w1", web0.clone());
    let r = add(&daemons[0].0, "w1", &args);
    let address = r.json["ips"][0]["address"].as_str().unwrap().to_string();
    let a: std::net::IpAddr = address.split('/').next().unwrap().parse().unwrap();
    let plain = pod("n3", "plain", "p3", json!({}));
    add(&daemons[2].0, "p3", &plain);
    let block_of_n1 = || {
        store
            .owners()
            .into_iter()
            .find(|(b, n)| n == "n1" && b.contains(&a))
            .map(|(b, _)| b)
    };
    let pinned = block_of_n1().expect("web-0's address in a block of n1's");
    // web-0 moves to n2.
    assert!(cni(&daemons[0].0, "DEL", "w1", &args).ok);
    let args2 = pod("n2", "web-0", "w2", web0);
    let moved = add(&daemons[1].0, "w2", &args2);
    assert_eq!(moved.json["ips"][0]["address"], address.as_str());

    // n1 departs: released (its block of p given back), its pinned block kept; the looks
    // after free nothing, and count nothing.
    assert!(daemons[0].0.terminate().success());
    assert!(api.delete("nodes", "", "n1"));
    eventually(60, "n1 released but for its pinned block", || {
        let log: String = daemons[1..].iter().map(|(d, _)| d.log()).collect();
        match log.contains("keeps only blocks pins were made in") {
            true => Ok(()),
            false => Err(departed_lines(&daemons[1..])),
        }
    });
    let leader = daemons[1].1.clone();
    let released_total = || metric(&leader, "ipool_cluster_nodes_released_total");
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(block_of_n1(), Some(pinned), "the pinned block stays n1's");
    assert_eq!(
        nodes_blocks(&store, "n1"),
        vec![pinned],
        "n1's other blocks given back"
    );
    assert_eq!(
        released_total(),
        1.0,
        "a release that freed nothing counted"
    );

    // n3-store's daemon stops; its Node n3 is there: kept, whatever its name in the store.
    assert!(daemons[2].0.terminate().success());
    std::thread::sleep(Duration::from_secs(14));
    assert!(
        nodes_owning(&store).contains("n3-store"),
        "a node whose Node is there was released: {:?}",
        departed_lines(&daemons[1..2])
    );

    // web-0's StatefulSet deleted, its pod's DEL on n2: once the owner has been gone
    // pin_ttl_secs, the pin ends and the block goes back.
    assert!(api.delete("statefulsets", "db", "web"));
    assert!(cni(&daemons[1].0, "DEL", "w2", &args2).ok);
    eventually(60, "n1's pinned block given back", || match block_of_n1() {
        None => Ok(()),
        Some(b) => Err((b, departed_lines(&daemons[1..2]))),
    });
    // (Said once the look is done: after its release.)
    daemons[1]
        .0
        .wait_log(&["a pin in a departed node's block ended"]);
    eventually(10, "the second release counted", || {
        match released_total() {
            2.0 => Ok(()),
            n => Err(n),
        }
    });

    // Node n3 gone: n3-store is released.
    assert!(api.delete("nodes", "", "n3"));
    eventually(60, "n3-store released", || {
        match nodes_owning(&store).contains("n3-store") {
            false => Ok(()),
            true => Err(departed_lines(&daemons[1..2])),
        }
    });
    eventually(10, "the third release counted", || match released_total() {
        3.0 => Ok(()),
        n => Err(n),
    });
}

/// `node`'s blocks, as `ipoolctl cluster blocks` lists them.
fn nodes_blocks(store: &Backend, node: &str) -> Vec<ipnet::IpNet> {
    store
        .owners()
        .into_iter()
        .filter(|(_, n)| n == node)
        .map(|(b, _)| b)
        .collect()
}

#[test]
fn departed_pinned_blocks_go_back_on_the_kubernetes_api() {
    departed_pinned_blocks_go_back(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn departed_pinned_blocks_go_back_on_etcd() {
    departed_pinned_blocks_go_back(Backend::etcd());
}
