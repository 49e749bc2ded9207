//! The runtime-side check: Debian's real `bridge` CNI plugin execs `ipool` as its IPAM plugin
//! in two network namespaces; the addresses must be configured inside them, the namespaces
//! must ping each other, CHECK must pass and DEL must be idempotent.
//!
//! Needs root, ip(8), ping(8) and containernetworking-plugins: ignored by the plain `cargo
//! test` (CI runs as root, installs them and runs it with `--include-ignored`).

use std::path::Path;
use std::process::Command;

use crate::common::netns::{require_netns, runtime, Link, Netns};
use crate::common::*;

fn bridge(cmd: &str, ns: &Netns, conf: &str, plugin_dir: &Path) -> Run {
    runtime("/usr/lib/cni/bridge", cmd, ns, conf, plugin_dir)
}

fn run_bridge_check(version: &str, subnet: &str, tag: &str) {
    require_netns();
    let d = Daemon::start();
    let plugin_dir = plugin_bin().parent().expect("dir").to_path_buf();
    let pid = std::process::id();
    let br = Link(format!("ipt{tag}{}", pid % 100_000));
    let conf = |extra: &str| {
        format!(
            r#"{{"cniVersion":"{version}","name":"br-{tag}","type":"bridge","bridge":"{}","isGateway":true,"ipMasq":false,"ipam":{{"type":"ipool","socket":"{}","subnet":"{subnet}"}}{extra}}}"#,
            br.0,
            d.socket.display()
        )
    };
    let a = Netns::new(format!("ipool-{tag}-a-{pid}"));
    let b = Netns::new(format!("ipool-{tag}-b-{pid}"));

    let ra = bridge("ADD", &a, &conf(""), &plugin_dir);
    assert!(ra.ok, "ADD a: {ra:?}\n{}", d.log());
    let rb = bridge("ADD", &b, &conf(""), &plugin_dir);
    assert!(rb.ok, "ADD b: {rb:?}\n{}", d.log());
    let addr = |r: &Run| {
        r.json["ips"][0]["address"]
            .as_str()
            .expect("address")
            .to_string()
    };
    let (addr_a, addr_b) = (addr(&ra), addr(&rb));
    assert_ne!(addr_a, addr_b);

    for (ns, want) in [(&a, &addr_a), (&b, &addr_b)] {
        let out = Command::new("ip")
            .args(["-n", &ns.0, "-o", "addr", "show", "dev", "eth0"])
            .output()
            .expect("ip addr");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!(" {want} ")),
            "{want} not on eth0 in {}: {text}",
            ns.0
        );
    }
    let peer = addr_b.split('/').next().expect("ip");
    let ping = Command::new("ip")
        .args(["netns", "exec", &a.0, "ping", "-c", "1", "-W", "2", peer])
        .output()
        .expect("ping");
    assert!(
        ping.status.success(),
        "ping {} -> {peer}: {}",
        a.0,
        String::from_utf8_lossy(&ping.stdout)
    );

    if !version.starts_with("0.3.") {
        for (ns, r) in [(&a, &ra), (&b, &rb)] {
            let check = bridge(
                "CHECK",
                ns,
                &conf(&format!(",\"prevResult\":{}", r.stdout.trim())),
                &plugin_dir,
            );
            assert!(check.ok, "CHECK {}: {check:?}", ns.0);
        }
    }
    for ns in [&a, &b] {
        for i in 1..=2 {
            let del = bridge("DEL", ns, &conf(""), &plugin_dir);
            assert!(del.ok, "DEL #{i} {}: {del:?}", ns.0);
        }
    }
    let status = d.ctl(&["-o", "json", "status"]);
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).expect("json");
    assert_eq!(status[0]["inUse"], 0, "both DELs released their address");
}

#[test]
#[ignore = "needs root, ip(8), ping(8) and containernetworking-plugins; CI runs it with --include-ignored"]
fn bridge_in_two_namespaces_v1_0_0() {
    run_bridge_check("1.0.0", "10.201.0.0/24", "a");
}

#[test]
#[ignore = "needs root, ip(8), ping(8) and containernetworking-plugins; CI runs it with --include-ignored"]
fn bridge_in_two_namespaces_v0_4_0() {
    run_bridge_check("0.4.0", "10.202.0.0/24", "b");
}

#[test]
#[ignore = "needs root, ip(8), ping(8) and containernetworking-plugins; CI runs it with --include-ignored"]
fn bridge_in_two_namespaces_v0_3_1() {
    run_bridge_check("0.3.1", "10.203.0.0/24", "c");
}
