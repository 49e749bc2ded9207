//! Cluster mode with a real interface plugin: Debian's `ptp` execs `ipool` for pods in network
//! namespaces, more pods than one block holds, so the node claims a second block while they
//! start; every pod gets its address on eth0 from one of the node's blocks and reaches its
//! gateway. Needs root, ip(8), ping(8), containernetworking-plugins and etcd-server: ignored by
//! the plain `cargo test` (CI has them and runs it with `--include-ignored`).

use std::process::Command;

use crate::common::etcd::Etcd;
use crate::common::netns::{require_netns, runtime, Netns};
use crate::common::*;
use ipnet::IpNet;

#[test]
#[ignore = "needs root, ip(8), ping(8), containernetworking-plugins and etcd-server; CI runs it with --include-ignored"]
fn ptp_pods_get_addresses_from_two_claimed_blocks_and_reach_their_gateway() {
    require_netns();
    let etcd = Etcd::start();
    // Blocks of /28: 13 pod addresses each (network, gateway, broadcast excluded).
    let o = etcd.ctl(&[
        "pool",
        "create",
        "ptp",
        "--cidr",
        "10.32.0.0/24",
        "--block-size",
        "28",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let mut d =
        Daemon::prepare_with_config(&etcd.daemon_config("node-ptp", "ptp", "claim_ahead = 2"));
    d.spawn();
    let conf = format!(
        r#"{{"cniVersion":"1.0.0","name":"pods","type":"ptp","ipMasq":false,"ipam":{{"type":"ipool","socket":"{}"}}}}"#,
        d.socket.display()
    );
    let plugin_dir = plugin_bin().parent().expect("dir").to_path_buf();
    let pid = std::process::id();
    let pods: Vec<Netns> = (0..16)
        .map(|i| Netns::new(format!("ipool-ptp{i}-{pid}")))
        .collect();
    let ptp = |cmd: &str, ns: &Netns| runtime("/usr/lib/cni/ptp", cmd, ns, &conf, &plugin_dir);
    let mut addrs = Vec::new();
    for ns in &pods {
        let r = eventually(15, "a ptp ADD", || {
            let r = ptp("ADD", ns);
            match r.ok {
                true => Ok(r),
                false => Err(r),
            }
        });
        let ip = &r.json["ips"][0];
        let (addr, gw) = (
            ip["address"].as_str().expect("address").to_string(),
            ip["gateway"].as_str().expect("gateway").to_string(),
        );
        let shown = Command::new("ip")
            .args(["-n", &ns.0, "-o", "addr", "show", "dev", "eth0"])
            .output()
            .expect("ip addr");
        let shown = String::from_utf8_lossy(&shown.stdout);
        assert!(shown.contains(&format!(" {addr} ")), "{addr}: {shown}");
        let ping = Command::new("ip")
            .args(["netns", "exec", &ns.0, "ping", "-c", "1", "-W", "2", &gw])
            .output()
            .expect("ping");
        assert!(
            ping.status.success(),
            "{} -> {gw}: {}",
            ns.0,
            String::from_utf8_lossy(&ping.stdout)
        );
        addrs.push(addr.parse::<IpNet>().expect("a CIDR"));
    }
    let blocks: serde_json::Value =
        serde_json::from_slice(&etcd.ctl(&["-o", "json", "blocks"]).stdout)
            .expect("blocks as JSON");
    let blocks: Vec<IpNet> = blocks
        .as_array()
        .expect("a list")
        .iter()
        .map(|b| {
            assert_eq!(b["node"], "node-ptp");
            b["block"].as_str().expect("block").parse().expect("CIDR")
        })
        .collect();
    for a in &addrs {
        assert_eq!(a.prefix_len(), 28, "{a}: the block's prefix");
        assert!(blocks.iter().any(|b| b.contains(&a.addr())), "{a}");
    }
    let used: std::collections::BTreeSet<IpNet> = addrs.iter().map(|a| a.trunc()).collect();
    assert!(used.len() >= 2, "16 pods in one /28? {addrs:?}");
    let unique: std::collections::BTreeSet<_> = addrs.iter().map(|a| a.addr()).collect();
    assert_eq!(unique.len(), addrs.len(), "{addrs:?}");
    for ns in &pods {
        let r = ptp("DEL", ns);
        assert!(r.ok, "DEL {}: {r:?}", ns.0);
    }
    let status: serde_json::Value =
        serde_json::from_slice(&d.ctl(&["-o", "json", "status"]).stdout).expect("status");
    let in_use: u64 = status
        .as_array()
        .expect("a list")
        .iter()
        .map(|p| p["inUse"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(in_use, 0, "{status}");
}
