//! Pods and nodes choosing among a network's cluster pools, with the real
//! daemon and plugin on either store (the fake apiserver always; a real etcd where installed),
//! and `[kubernetes]` for the pods, namespaces and the Node: the network's pools tried in
//! order (a later one claimed from only once the earlier are full), a namespace's annotation,
//! a pod's over it, a pool the network does not list, and a pool's nodeSelector as the Node's
//! labels change.

use std::collections::BTreeMap;

use crate::common::backend::Backend;
use crate::common::fake_api::FakeApi;
use crate::common::*;
use ipnet::IpNet;
use serde_json::json;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

/// Whether the address `r` got is in `cidr`.
fn inside(cidr: &str, r: &Run) -> bool {
    let ip: std::net::IpAddr = ip_of(r).parse().unwrap();
    net(cidr).contains(&ip)
}

/// Each block's pool, as `ipoolctl cluster blocks` lists them.
fn blocks_by_pool(store: &Backend) -> BTreeMap<String, Vec<IpNet>> {
    let o = store.ctl(&["-o", "json", "blocks"]);
    assert!(o.status.success(), "blocks: {}", stderr(&o));
    let mut out: BTreeMap<String, Vec<IpNet>> = BTreeMap::new();
    for b in json(&o).as_array().unwrap() {
        out.entry(b["pool"].as_str().unwrap().to_string())
            .or_default()
            .push(net(b["block"].as_str().unwrap()));
    }
    out
}

fn node(labels: serde_json::Value) -> serde_json::Value {
    json!({"metadata": {"name": "n1", "labels": labels}})
}

fn pods_choose_among_the_networks_pools(store: Backend) {
    // "first": two /30 blocks of one address each; then "second"; "tenant" for a namespace;
    // "gpu" for nodes labelled gpu=true.
    store.create_pool(&["first", "--cidr", "10.76.0.0/29", "--block-size", "30"]);
    store.create_pool(&["second", "--cidr", "10.76.1.0/28", "--block-size", "29"]);
    store.create_pool(&["tenant", "--cidr", "10.76.2.0/28", "--block-size", "29"]);
    store.create_pool(&["nad", "--cidr", "10.76.4.0/28", "--block-size", "29"]);
    store.create_pool(&[
        "gpu",
        "--cidr",
        "10.76.3.0/28",
        "--block-size",
        "29",
        "--node-selector",
        "gpu=true",
    ]);
    // The pods, namespaces and the Node: on the same fake apiserver where it is the store.
    let own_api;
    let api = match store.api() {
        Some(api) => api,
        None => {
            own_api = FakeApi::start();
            &own_api
        }
    };
    api.put("nodes", node(json!({"zone": "a"})));
    api.put("namespaces", json!({"metadata": {"name": "app"}}));
    api.put(
        "namespaces",
        json!({"metadata": {"name": "team-a", "annotations": {"ipool.io/pool": "tenant"}}}),
    );
    let tuning = "heartbeat_ttl_secs = 6\nclaim_ahead = 1\nblock_hold_down_secs = 1\n[kubernetes]\ngc_grace_secs = 60\n";
    let toml = store
        .daemon_config("n1", "first", tuning, &store.addr())
        .replace(
            "cluster_pool = \"first\"",
            "cluster_pools = [\"first\", \"second\", \"tenant\", \"gpu\"]",
        )
        + "[[network]]\nname = \"side\"\nranges = [[{ subnet = \"10.78.0.0/24\" }]]\n";
    let mut d = Daemon::prepare_with_config(&toml);
    let kubeconfig = api.kubeconfig(d.dir.path());
    d.add_args(&["--kubeconfig", &kubeconfig.display().to_string()]);
    d.add_args(&["--node-name", "n1"]);
    d.spawn();
    let conf = d.conf("1.1.0", "pods", "");
    let mut uid = 0;
    let mut pod = |ns: &str, name: &str, annotations: serde_json::Value| -> String {
        uid += 1;
        let u = format!("u{uid}");
        api.put(
            "pods",
            json!({"metadata": {"namespace": ns, "name": name, "uid": u, "annotations": annotations},
                   "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}}),
        );
        format!("K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_UID={u}")
    };
    let add = |container: &str, args: &str| -> Run {
        eventually(30, &format!("ADD {container}"), || {
            let r = cni_with_args("ADD", container, args, &conf);
            match r.ok {
                true => Ok(r),
                false => Err(r),
            }
        })
    };

    // The network's first pool serves; its later ones claim nothing ahead of need.
    let a1 = pod("app", "a1", json!({}));
    let r = add("c1", &a1);
    assert!(inside("10.76.0.0/29", &r), "{:?}", r.json);
    let pools = blocks_by_pool(&store);
    assert_eq!(
        pools.keys().collect::<Vec<_>>(),
        ["first"],
        "only the first pool is claimed from: {pools:?}\n{}",
        d.log()
    );
    let a2 = pod("app", "a2", json!({}));
    let r = add("c2", &a2);
    assert!(inside("10.76.0.0/29", &r), "{:?}", r.json);
    // Full: the next pool in the network's order.
    let a3 = pod("app", "a3", json!({}));
    let r = add("c3", &a3);
    assert!(inside("10.76.1.0/28", &r), "{:?}\n{}", r.json, d.log());
    // CNI STATUS judges the network: its first pool full and gpu not this node's, it still
    // serves an ADD, so it is ready.
    let status = plugin(&[("CNI_COMMAND", "STATUS")], &conf);
    assert!(status.ok, "{:?}\n{}", status.json, d.log());

    // A namespace's annotation; a pod's own over it.
    let t1 = pod("team-a", "t1", json!({}));
    let r = add("c4", &t1);
    assert!(inside("10.76.2.0/28", &r), "{:?}", r.json);
    // A network of no cluster pool: a choice of pools does not count there (a pod of an
    // annotated namespace, or with an annotation no pool could have, is served as any).
    let side = d.conf("1.1.0", "side", "");
    let r = cni_with_args("ADD", "c4", &t1, &side);
    assert!(r.ok && inside("10.78.0.0/24", &r), "{:?}", r.json);
    let bad = pod("team-a", "bad", json!({"ipool.io/pool": "a,b"}));
    let r = cni_with_args("ADD", "c10", &bad, &side);
    assert!(r.ok, "{:?}", r.json);
    let r = cni_with_args("ADD", "c10", &bad, &conf);
    assert!(
        !r.ok && r.json.to_string().contains("ipool.io/pool"),
        "{:?}",
        r.json
    );
    let t2 = pod("team-a", "t2", json!({"ipool.io/pools": "second,first"}));
    let r = add("c5", &t2);
    assert!(inside("10.76.1.0/28", &r), "{:?}", r.json);

    // A pool the network does not list, and one the node may not use: error 7, naming them.
    let x = pod("app", "x", json!({"ipool.io/pool": "elsewhere"}));
    let r = cni_with_args("ADD", "c6", &x, &conf);
    assert!(!r.ok && r.code() == 7, "{:?}", r.json);
    let msg = r.json.to_string();
    assert!(
        msg.contains("\\\"elsewhere\\\"") && msg.contains("does not list"),
        "{msg}"
    );
    // A NetworkAttachmentDefinition's network of one pool (ipam.clusterPool): the same rules
    // (before, a pod's choice did not count there, and "elsewhere" was served from "nad").
    let nad = d.conf("1.1.0", "sec", r#""clusterPool":"nad""#);
    let r = cni_with_args("ADD", "c6", &x, &nad);
    assert!(!r.ok && r.code() == 7, "{:?}", r.json);
    assert!(
        r.json.to_string().contains("\\\"elsewhere\\\""),
        "{:?}",
        r.json
    );
    let n1 = pod("app", "n1", json!({"ipool.io/pool": "nad"}));
    let r = eventually(30, "ADD on the NAD's network", || {
        let r = cni_with_args("ADD", "c11", &n1, &nad);
        match r.ok {
            true => Ok(r),
            false => Err(r),
        }
    });
    assert!(inside("10.76.4.0/28", &r), "{:?}", r.json);
    let g = pod("app", "g", json!({"ipool.io/pool": "gpu"}));
    let r = cni_with_args("ADD", "c7", &g, &conf);
    assert!(!r.ok && r.code() == 7, "{:?}", r.json);
    let msg = r.json.to_string();
    assert!(
        msg.contains("nodeSelector") && msg.contains("gpu=true"),
        "{msg}"
    );
    // Recorded on the pod: what the node lacks, and what to do.
    let event = eventually(10, "pod g's event", || {
        api.objects("events")
            .into_iter()
            .find(|e| e["regarding"]["name"] == "g")
            .ok_or(())
    });
    assert_eq!(event["reason"], "NoPoolForNode", "{event}");
    assert!(
        event["note"]
            .as_str()
            .unwrap_or_default()
            .contains("label the node"),
        "{event}"
    );
    assert!(
        !blocks_by_pool(&store).contains_key("gpu"),
        "no block of gpu claimed"
    );

    // Labelled, the node may: the pod gets an address of gpu.
    api.put("nodes", node(json!({"zone": "a", "gpu": "true"})));
    let r = add("c7", &g);
    assert!(inside("10.76.3.0/28", &r), "{:?}", r.json);
    // The label gone: what is in use stays; once released, the node gives gpu's block back
    // (the last one too) and claims none again.
    api.put("nodes", node(json!({"zone": "a"})));
    let g2 = pod("app", "g2", json!({"ipool.io/pool": "gpu"}));
    eventually(20, "the node no longer uses gpu", || {
        let r = cni_with_args("ADD", "c8", &g2, &conf);
        match !r.ok && r.code() == 7 {
            true => Ok(()),
            false => Err(r),
        }
    });
    let check = cni_with_args("CHECK", "c7", &g, &with_prev(&conf, &r.json));
    assert!(check.ok, "c7 keeps its address: {:?}", check.json);
    assert!(cni_with_args("DEL", "c7", &g, &conf).ok);
    eventually(
        20,
        "gpu's emptied block given back",
        || match blocks_by_pool(&store).get("gpu") {
            None => Ok(()),
            Some(b) => Err(b.clone()),
        },
    );
    // The network's other pools serve on.
    let a4 = pod("app", "a4", json!({}));
    assert!(add("c9", &a4).ok);

    // The selector changed by the operator: a bad one is refused naming it; --all-nodes lets
    // this node use the pool again.
    let o = store.ctl(&["pool", "set-node-selector", "gpu", "zone in (a"]);
    assert_eq!(code(&o), 64, "{}", stderr(&o));
    assert!(stderr(&o).contains("zone in (a"), "{}", stderr(&o));
    let o = store.ctl(&["pool", "set-node-selector", "gpu", "--all-nodes"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let listed = store.ctl(&["-o", "json", "pool", "list"]);
    let gpu = json(&listed)
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "gpu")
        .cloned()
        .unwrap();
    assert_eq!(gpu["nodeSelector"], serde_json::Value::Null, "{gpu}");
    let r = add("c8", &g2);
    assert!(inside("10.76.3.0/28", &r), "{:?}", r.json);
}

#[test]
fn pods_choose_among_the_networks_pools_on_the_kubernetes_api() {
    pods_choose_among_the_networks_pools(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn pods_choose_among_the_networks_pools_on_etcd() {
    pods_choose_among_the_networks_pools(Backend::etcd());
}

/// The requests for pools and blocks the fake apiserver served while a node with `n` pools in
/// its network (the first one used) claimed blocks for `adds` ADDs, each needing one.
fn claim_cost(n: usize, adds: usize) -> usize {
    let store = Backend::kube();
    let names: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        // Blocks of /30: one address each.
        let cidr = format!("10.77.{i}.0/24");
        store.create_pool(&[name, "--cidr", &cidr, "--block-size", "30"]);
    }
    let list: Vec<String> = names.iter().map(|p| format!("\"{p}\"")).collect();
    let toml = store
        .daemon_config("n1", "p0", "claim_ahead = 1\n", &store.addr())
        .replace(
            "cluster_pool = \"p0\"",
            &format!("cluster_pools = [{}]", list.join(", ")),
        );
    let mut d = Daemon::prepare_with_config(&toml);
    d.spawn();
    let conf = d.conf("1.0.0", "pods", "");
    assert!(add_within(20, "the first ADD", "c0", &conf).ok);
    let api = store.api().unwrap();
    let counted = || {
        api.requests()
            .iter()
            .filter(|r| r.contains("/ippools") || r.contains("/ipblocks"))
            .count()
    };
    let settled = |want: usize| {
        eventually(20, "blocks claimed ahead", || {
            let owned: usize = blocks_by_pool(&store).values().map(Vec::len).sum();
            match owned >= want {
                true => Ok(()),
                false => Err(owned),
            }
        });
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    settled(2);
    let before = counted();
    for i in 1..=adds {
        assert!(add_within(20, "an ADD", &format!("c{i}"), &conf).ok);
    }
    settled(adds + 2);
    let cost = counted() - before;
    // Only the first pool was claimed from.
    let pools = blocks_by_pool(&store);
    assert_eq!(pools.keys().collect::<Vec<_>>(), ["p0"], "{pools:?}");
    cost
}

/// A claim costs the store the same with eight pools in the network as with one: the later
/// pools are read when the pools change, not at each claim.
#[test]
fn a_claim_costs_no_more_reads_with_eight_pools_than_with_one() {
    let one = claim_cost(1, 4);
    let eight = claim_cost(8, 4);
    eprintln!("pool and block requests for 4 claims: {one} with 1 pool, {eight} with 8");
    assert!(one > 0);
    assert!(
        eight <= one,
        "pool and block requests for 4 claims: {eight} with 8 pools, {one} with 1"
    );
}
