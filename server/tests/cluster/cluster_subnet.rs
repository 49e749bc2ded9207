//! A cluster pool's network addressed as one subnet (`addressing = "subnet"`, ),
//! with the real daemons and plugin on either store (the fake apiserver always; a real etcd
//! where installed): three nodes share one /21, 1 000 concurrent ADDs across them give no
//! address twice, each with the /21's prefix and the configured gateway, never an excluded
//! address nor the subnet's own, blocks' first and last addresses handed out as any other, and
//! the store written per block claimed, never per ADD.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::common::backend::Backend;
use crate::common::*;
use ipnet::IpNet;

const POOL: &str = "10.79.0.0/21";
const GATEWAY: &str = "10.79.0.1";
/// What each node runs with: addressing by subnet, the gateway, a range excluded by address.
const ADDRESSING: &str = "addressing = \"subnet\"\ngateway = \"10.79.0.1\"\nexclude = [\"10.79.0.2/31\", \"10.79.0.64/30\", \"10.79.7.254\"]\n";

fn excluded(ip: IpAddr) -> bool {
    ["10.79.0.2/31", "10.79.0.64/30", "10.79.7.254/32"]
        .iter()
        .any(|x| x.parse::<IpNet>().unwrap().contains(&ip))
}

fn one_subnet_across_three_nodes(store: Backend) {
    store.create_pool(&["l2", "--cidr", POOL, "--block-size", "26"]);
    let tuning = "heartbeat_ttl_secs = 6\nclaim_ahead = 16\n";
    let daemons: Vec<Daemon> = ["n1", "n2", "n3"]
        .iter()
        .map(|n| {
            let toml = store
                .daemon_config(n, "l2", tuning, &store.addr())
                .replace(
                    "cluster_pool = \"l2\"\n",
                    &format!("cluster_pool = \"l2\"\n{ADDRESSING}"),
                )
                .replace("routes = [{ dst = \"0.0.0.0/0\" }]\n", "");
            let mut d = Daemon::prepare_with_config(&toml);
            d.spawn();
            d
        })
        .collect();
    let confs: Vec<String> = daemons
        .iter()
        .map(|d| d.conf("1.1.0", "pods", ""))
        .collect();
    // Each node serves before the count starts (its first block claimed).
    for (i, conf) in confs.iter().enumerate() {
        let r = eventually(30, "a first ADD", || {
            let r = cni("ADD", &format!("warm{i}"), conf);
            match r.ok {
                true => Ok(r),
                false => Err(r),
            }
        });
        assert_eq!(r.json["ips"][0]["gateway"], GATEWAY, "{:?}", r.json);
    }
    let writes_before = store.block_writes();

    const ADDS: usize = 1000;
    const THREADS: usize = 24;
    let results: Vec<Run> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let confs = &confs;
                s.spawn(move || {
                    (t..ADDS)
                        .step_by(THREADS)
                        .map(|i| cni("ADD", &format!("c{i}"), &confs[i % 3]))
                        .collect::<Vec<Run>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("an ADD thread"))
            .collect()
    });
    let writes = store.block_writes() - writes_before;
    let mut seen = BTreeSet::new();
    let mut block_edges = 0;
    for r in &results {
        assert!(r.ok, "{:?} {}", r.json, r.stderr);
        let ip = &r.json["ips"][0];
        let (address, gateway) = (ip["address"].as_str().unwrap(), &ip["gateway"]);
        let (addr, prefix) = address.split_once('/').unwrap();
        assert_eq!(prefix, "21", "the pool CIDR's prefix: {:?}", r.json);
        assert_eq!(gateway, GATEWAY, "{:?}", r.json);
        let addr: IpAddr = addr.parse().unwrap();
        assert!(POOL.parse::<IpNet>().unwrap().contains(&addr));
        assert!(!excluded(addr), "{addr} is excluded");
        assert!(
            ![GATEWAY, "10.79.0.0", "10.79.7.255"].contains(&addr.to_string().as_str()),
            "{addr} is the subnet's"
        );
        let IpAddr::V4(v4) = addr else { panic!() };
        if matches!(v4.octets()[3] % 64, 0 | 63) {
            block_edges += 1;
        }
        assert!(seen.insert(addr), "{addr} handed out twice");
    }
    assert_eq!(seen.len(), ADDS);
    assert!(
        block_edges > 0,
        "blocks' first and last addresses are hosts of the /21 and handed out"
    );
    // 1 000 addresses are 16 blocks of 64 at least: the writes are the claims (a create, and
    // on the apiserver perhaps a settle each), not one per ADD.
    let blocks = store.owners().len();
    println!(
        "{}: {ADDS} ADDs on 3 nodes, {blocks} blocks owned, {writes} block writes",
        store.name()
    );
    assert!(
        (writes as usize) < ADDS / 10,
        "{writes} block writes for {ADDS} ADDs: the store is written per ADD"
    );
    drop(daemons);
}

#[test]
fn one_subnet_across_three_nodes_on_the_kubernetes_api() {
    one_subnet_across_three_nodes(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn one_subnet_across_three_nodes_on_etcd() {
    one_subnet_across_three_nodes(Backend::etcd());
}

/// Runs `ip` with `args`, failing the test if it fails.
fn ip_cmd(args: &[&str]) {
    let o = std::process::Command::new("ip")
        .args(args)
        .output()
        .expect("ip");
    assert!(
        o.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Two nodes (network namespaces, each with its own bridge and daemon) on one L2 segment (a
/// veth between the bridges): Debian's `bridge` plugin execs `ipool` on each, the pods get
/// addresses of one /24 from their nodes' own /28 blocks, with the /24's prefix and gateway,
/// and reach each other across the nodes with no route (one subnet).
#[test]
#[ignore = "needs root, ip(8), ping(8) and containernetworking-plugins; CI runs it with --include-ignored"]
fn pods_on_two_nodes_share_one_l2_subnet_and_ping_each_other() {
    use crate::common::netns::{require_netns, runtime_on, Netns};
    require_netns();
    let store = Backend::kube();
    store.create_pool(&["l2", "--cidr", "10.81.0.0/24", "--block-size", "28"]);
    let pid = std::process::id() % 100_000;
    let nodes = [
        Netns::new(format!("ipl2-n1-{pid}")),
        Netns::new(format!("ipl2-n2-{pid}")),
    ];
    for n in &nodes {
        ip_cmd(&["-n", &n.0, "link", "add", "l2br", "type", "bridge"]);
        ip_cmd(&["-n", &n.0, "link", "set", "l2br", "up"]);
    }
    // The segment: a veth from one node's bridge to the other's.
    let (a, b) = (format!("ipl2a{pid}"), format!("ipl2b{pid}"));
    ip_cmd(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
    for (end, n) in [(&a, &nodes[0]), (&b, &nodes[1])] {
        ip_cmd(&["link", "set", end, "netns", &n.0]);
        ip_cmd(&["-n", &n.0, "link", "set", end, "master", "l2br", "up"]);
    }
    let daemons: Vec<Daemon> = ["n1", "n2"]
        .iter()
        .map(|n| {
            let toml = store
                .daemon_config(n, "l2", "heartbeat_ttl_secs = 6\n", &store.addr())
                .replace(
                    "cluster_pool = \"l2\"\n",
                    "cluster_pool = \"l2\"\naddressing = \"subnet\"\ngateway = \"10.81.0.254\"\n",
                )
                .replace("routes = [{ dst = \"0.0.0.0/0\" }]\n", "");
            let mut d = Daemon::prepare_with_config(&toml);
            d.spawn();
            d
        })
        .collect();
    let plugin_dir = plugin_bin().parent().expect("dir").to_path_buf();
    let pods: Vec<Netns> = (0..4)
        .map(|i| Netns::new(format!("ipl2-p{i}-{pid}")))
        .collect();
    let mut addrs = Vec::new();
    for (i, pod) in pods.iter().enumerate() {
        let (node, d) = (&nodes[i % 2], &daemons[i % 2]);
        let conf = format!(
            r#"{{"cniVersion":"1.0.0","name":"pods","type":"bridge","bridge":"l2br","isGateway":false,"ipMasq":false,"ipam":{{"type":"ipool","socket":"{}"}}}}"#,
            d.socket.display()
        );
        let r = eventually(30, "a bridge ADD", || {
            let r = runtime_on(node, "/usr/lib/cni/bridge", "ADD", pod, &conf, &plugin_dir);
            match r.ok {
                true => Ok(r),
                false => Err(r),
            }
        });
        let ip = &r.json["ips"][0];
        let address = ip["address"].as_str().expect("address").to_string();
        assert!(
            address.ends_with("/24"),
            "the subnet's prefix: {:?}",
            r.json
        );
        assert_eq!(ip["gateway"], "10.81.0.254", "{:?}", r.json);
        let shown = std::process::Command::new("ip")
            .args(["-n", &pod.0, "-o", "addr", "show", "dev", "eth0"])
            .output()
            .expect("ip addr");
        assert!(
            String::from_utf8_lossy(&shown.stdout).contains(&address),
            "{address} on eth0"
        );
        addrs.push(address.split('/').next().unwrap().to_string());
    }
    // Each node's pods are in its own blocks: n1's and n2's addresses are in different /28s.
    let block = |a: &str| a.parse::<std::net::Ipv4Addr>().unwrap().octets()[3] / 16;
    assert_ne!(block(&addrs[0]), block(&addrs[1]), "{addrs:?}");
    // Across the nodes, with no route: one L2 subnet.
    for (from, to) in [(0, 1), (1, 0), (2, 3), (3, 0)] {
        let o = std::process::Command::new("ip")
            .args([
                "netns",
                "exec",
                &pods[from].0,
                "ping",
                "-c",
                "1",
                "-W",
                "3",
                &addrs[to],
            ])
            .output()
            .expect("ping");
        assert!(
            o.status.success(),
            "pod {from} ({}) cannot reach pod {to} ({}): {}",
            addrs[from],
            addrs[to],
            String::from_utf8_lossy(&o.stdout)
        );
    }
    drop(daemons);
}

/// A NetworkAttachmentDefinition's network: the CNI config names its cluster pool
/// (`ipam.clusterPool`, with subnet addressing, gateway and exclude) and ipoold, in cluster
/// mode with no such network in its config, declares it, follows the pool, and serves it on
/// two nodes; again after a restart. A pool another network takes, a second pool for a network
/// holding addresses, and ranges beside the pool are refused by name.
fn a_cni_config_names_its_cluster_pool(store: Backend) {
    store.create_pool(&["pods", "--cidr", "10.83.0.0/24", "--block-size", "28"]);
    store.create_pool(&["nad", "--cidr", "10.82.0.0/24", "--block-size", "28"]);
    store.create_pool(&["other", "--cidr", "10.84.0.0/24", "--block-size", "28"]);
    let mut daemons: Vec<Daemon> = ["n1", "n2"]
        .iter()
        .map(|n| {
            let toml = store.daemon_config(n, "pods", "heartbeat_ttl_secs = 6\n", &store.addr());
            let mut d = Daemon::prepare_with_config(&toml);
            d.spawn();
            d
        })
        .collect();
    let nad = r#""clusterPool":"nad","addressing":"subnet","gateway":"10.82.0.1","exclude":["10.82.0.2/31"]"#;
    let add = |d: &Daemon, c: &str, name: &str, ipam: &str| -> Run {
        let conf = d.conf("1.1.0", name, ipam);
        eventually(30, &format!("ADD {c}"), || {
            let r = cni("ADD", c, &conf);
            match r.ok {
                true => Ok(r),
                false => Err(r),
            }
        })
    };
    let mut seen = BTreeSet::new();
    for (i, d) in daemons.iter().enumerate() {
        for k in 0..3 {
            let r = add(d, &format!("m{i}-{k}"), "macvlan-a", nad);
            let ip = &r.json["ips"][0];
            let address = ip["address"].as_str().unwrap();
            assert!(address.ends_with("/24"), "{:?}", r.json);
            assert_eq!(ip["gateway"], "10.82.0.1", "{:?}", r.json);
            let addr: IpAddr = address.split('/').next().unwrap().parse().unwrap();
            assert!("10.82.0.0/24".parse::<IpNet>().unwrap().contains(&addr));
            assert!(!["10.82.0.1", "10.82.0.2", "10.82.0.3"].contains(&addr.to_string().as_str()));
            assert!(seen.insert(addr), "{addr} twice");
        }
    }
    // Each node its own blocks of the pool.
    let owners = store.owners();
    let nad_blocks: Vec<_> = owners
        .iter()
        .filter(|(b, _)| "10.82.0.0/24".parse::<IpNet>().unwrap().contains(*b))
        .collect();
    let nodes: BTreeSet<&String> = nad_blocks.iter().map(|(_, n)| *n).collect();
    assert_eq!(nodes.len(), 2, "{nad_blocks:?}");

    let d = &daemons[0];
    // Refused with error 7, the plugin's output naming why.
    let refused = |container: &str, network: &str, ipam: &str, why: &str| {
        let r = cni("ADD", container, &d.conf("1.1.0", network, ipam));
        assert!(
            !r.ok && r.code() == 7 && r.stdout.contains(why),
            "{}",
            r.stdout
        );
    };
    // A pool another network of the node takes.
    refused(
        "x1",
        "macvlan-b",
        r#""clusterPool":"pods""#,
        r#"already gives network \"pods\""#,
    );
    // Another pool for the network, while it holds addresses.
    refused(
        "x2",
        "macvlan-a",
        r#""clusterPool":"other""#,
        "holds 3 attachment(s)",
    );
    // Other excluded addresses while it holds addresses (the NAD edited): its ADDs go on, by
    // the declaration in force.
    let edited = nad.replace("10.82.0.2/31", "10.82.0.2/31\",\"10.82.0.100");
    let r = add(d, "m0-edit", "macvlan-a", &edited);
    let addr: IpAddr = ip_of(&r).parse().unwrap();
    assert!(seen.insert(addr), "{addr} twice");
    // Ranges beside the pool.
    refused(
        "x3",
        "macvlan-c",
        r#""clusterPool":"other","subnet":"10.85.0.0/24""#,
        "drop ipam.ranges and ipam.subnet",
    );
    // Exclude without a pool.
    refused(
        "x4",
        "side",
        r#""subnet":"10.86.0.0/24","exclude":["10.86.0.5"]"#,
        "go with ipam.clusterPool",
    );

    // A gateway in none of the pool's CIDRs (a typo): no gateway in the result, and said.
    let r = add(
        d,
        "w1",
        "macvlan-w",
        r#""clusterPool":"other","addressing":"subnet","gateway":"10.99.0.1""#,
    );
    assert!(r.json["ips"][0]["gateway"].is_null(), "{:?}", r.json);
    d.wait_log(&["gateway 10.99.0.1 is in none of the CIDRs"]);

    // After a restart the declared network is followed from the store: a new pod is served,
    // the old one's CHECK passes.
    daemons[0].terminate();
    daemons[0].spawn();
    let d = &daemons[0];
    let r = add(d, "m0-after", "macvlan-a", nad);
    let addr: IpAddr = ip_of(&r).parse().unwrap();
    assert!(seen.insert(addr), "{addr} twice");
    let conf = d.conf("1.1.0", "macvlan-a", nad);
    let prev = add(d, "m0-0", "macvlan-a", nad).json;
    let check = cni("CHECK", "m0-0", &with_prev(&conf, &prev));
    assert!(check.ok, "{:?}", check.json);
    drop(daemons);
}

#[test]
fn a_cni_config_names_its_cluster_pool_on_the_kubernetes_api() {
    a_cni_config_names_its_cluster_pool(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_cni_config_names_its_cluster_pool_on_etcd() {
    a_cni_config_names_its_cluster_pool(Backend::etcd());
}

/// A family added to a network addressed as one subnet: with IPv4 pods
/// running, the config gains the IPv6 gateway (the network holds no IPv6 address: accepted at
/// the restart, where a change of the IPv4 gateway is still refused), then the pool its IPv6
/// CIDR; new pods get both families, the IPv6 address with its gateway, the running pods
/// keep theirs.
fn a_family_is_added_with_its_gateway(store: Backend) {
    store.create_pool(&["l2", "--cidr", "10.83.0.0/24", "--block-size", "28"]);
    let config = |gateways: &str| {
        store
            .daemon_config("n1", "l2", "heartbeat_ttl_secs = 6\n", &store.addr())
            .replace(
                "cluster_pool = \"l2\"\n",
                &format!("cluster_pool = \"l2\"\naddressing = \"subnet\"\ngateway = {gateways}\n"),
            )
            .replace("routes = [{ dst = \"0.0.0.0/0\" }]\n", "")
    };
    let mut d = Daemon::prepare_with_config(&config("\"10.83.0.1\""));
    d.spawn();
    let conf = d.conf("1.1.0", "pods", "");
    let old = add_within(30, "ADD c0", "c0", &conf);
    assert_eq!(old.json["ips"][0]["gateway"], "10.83.0.1", "{:?}", old.json);
    d.terminate();
    let path = d.dir.path().join("ipoold.toml");
    // The IPv4 gateway moved while an IPv4 address is in use: refused.
    std::fs::write(&path, config("\"10.83.0.254\"")).unwrap();
    let said = d.run_expecting_failure();
    assert!(said.contains("changes its addressing or gateway"), "{said}");
    // The IPv6 one added: served.
    std::fs::write(&path, config("[\"10.83.0.1\", \"fd00:83::1\"]")).unwrap();
    d.spawn();
    let grown = store.ctl(&[
        "pool",
        "add-cidr",
        "l2",
        "fd00:83::/120",
        "--block-size",
        "124",
    ]);
    assert!(grown.status.success(), "add-cidr: {}", stderr(&grown));
    let both = add_until_both_families(&d, &conf);
    assert_eq!(
        both.json["ips"][0]["gateway"], "10.83.0.1",
        "{:?}",
        both.json
    );
    assert_eq!(
        both.json["ips"][1]["gateway"], "fd00:83::1",
        "{:?}",
        both.json
    );
    assert!(
        both.json["ips"][1]["address"]
            .as_str()
            .is_some_and(|a| a.starts_with("fd00:83::") && !a.starts_with("fd00:83::1/")),
        "{:?}",
        both.json
    );
    let check = cni("CHECK", "c0", &with_prev(&conf, &old.json));
    assert!(check.ok, "c0 keeps its address: {:?}", check.json);
}

#[test]
fn a_family_is_added_with_its_gateway_on_the_kubernetes_api() {
    a_family_is_added_with_its_gateway(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_family_is_added_with_its_gateway_on_etcd() {
    a_family_is_added_with_its_gateway(Backend::etcd());
}
