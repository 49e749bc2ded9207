//! The plugin against a real daemon: every version x verb, GC, STATUS, static addresses,
//! dual-stack, resolvConf, and the same address sequence as the real host-local plugin.

use std::path::Path;

use crate::common::*;
use serde_json::{json, Value};

const VERSIONS: [&str; 5] = ["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

fn set(conf: &str, key: &str, v: Value) -> String {
    let mut c: Value = serde_json::from_str(conf).expect("conf");
    c[key] = v;
    c.to_string()
}

#[test]
fn every_version_and_verb() {
    let d = Daemon::start();
    for (i, v) in VERSIONS.iter().enumerate() {
        let net = format!("m{i}");
        let conf = d.conf(v, &net, &format!(r#""subnet":"10.{}.0.0/24""#, 60 + i));
        let cid = format!("c{i}");
        let add = cni("ADD", &cid, &conf);
        assert!(add.ok, "{v} ADD: {add:?}");
        assert_eq!(add.json["cniVersion"], *v);
        let legacy = v.starts_with("0.");
        assert_eq!(
            add.json["ips"][0].get("version").is_some(),
            legacy,
            "{v}: {}",
            add.stdout
        );

        let check = cni("CHECK", &cid, &with_prev(&conf, &add.json));
        if v.starts_with("0.3.") {
            assert_eq!(check.code(), 1, "{v} CHECK is not defined: {check:?}");
        } else {
            assert!(check.ok && check.stdout.is_empty(), "{v} CHECK: {check:?}");
        }

        let gc_conf = set(
            &conf,
            "cni.dev/valid-attachments",
            json!([{"containerID": cid, "ifname": "eth0"}]),
        );
        let gc = plugin(
            &[("CNI_COMMAND", "GC"), ("CNI_PATH", "/usr/lib/cni")],
            &gc_conf,
        );
        let status = plugin(
            &[("CNI_COMMAND", "STATUS"), ("CNI_PATH", "/usr/lib/cni")],
            &conf,
        );
        if *v == "1.1.0" {
            assert!(gc.ok && gc.stdout.is_empty(), "{v} GC: {gc:?}");
            assert!(
                status.ok && status.stdout.is_empty(),
                "{v} STATUS: {status:?}"
            );
            assert!(
                cni("CHECK", &cid, &with_prev(&conf, &add.json)).ok,
                "GC kept the listed one"
            );
        } else {
            assert_eq!(gc.code(), 1, "{v} GC: {gc:?}");
            assert_eq!(status.code(), 1, "{v} STATUS: {status:?}");
        }

        let ver = plugin(&[("CNI_COMMAND", "VERSION")], &conf);
        assert_eq!(ver.json["cniVersion"], *v);

        for _ in 0..2 {
            let del = cni("DEL", &cid, &conf);
            assert!(del.ok && del.stdout.is_empty(), "{v} DEL: {del:?}");
        }
    }
}

/// By default, attachments younger than `[cni] gc_grace_secs` (60 s) survive a GC that does not
/// list them: the runtime built its list before their ADD finished.
#[test]
fn gc_spares_attachments_made_within_the_grace() {
    let d = Daemon::start();
    let conf = d.conf("1.1.0", "gcfresh", r#""subnet":"10.72.0.0/24""#);
    let a = cni("ADD", "a", &conf);
    assert!(a.ok, "{a:?}");
    let gc_conf = set(&conf, "cni.dev/valid-attachments", json!([]));
    let gc = plugin(
        &[("CNI_COMMAND", "GC"), ("CNI_PATH", "/usr/lib/cni")],
        &gc_conf,
    );
    assert!(gc.ok, "{gc:?}");
    assert!(cni("CHECK", "a", &with_prev(&conf, &a.json)).ok);
}

#[test]
fn gc_releases_unlisted_attachments() {
    let d = Daemon::with_config(NO_GC_GRACE);
    let conf = d.conf("1.1.0", "gc", r#""subnet":"10.70.0.0/24""#);
    let adds: Vec<Run> = ["a", "b", "c"]
        .iter()
        .map(|c| cni("ADD", c, &conf))
        .collect();
    let gc_conf = set(
        &conf,
        "cni.dev/valid-attachments",
        json!([{"containerID": "b", "ifname": "eth0"}]),
    );
    let gc = plugin(
        &[("CNI_COMMAND", "GC"), ("CNI_PATH", "/usr/lib/cni")],
        &gc_conf,
    );
    assert!(gc.ok, "{gc:?}");
    assert_eq!(
        cni("CHECK", "a", &with_prev(&conf, &adds[0].json)).code(),
        3
    );
    assert!(cni("CHECK", "b", &with_prev(&conf, &adds[1].json)).ok);
    assert_eq!(
        cni("CHECK", "c", &with_prev(&conf, &adds[2].json)).code(),
        3
    );
    // The release is logged.
    d.wait_log(&["GC", "valid-attachments"]);
    // A GC without the list is refused rather than releasing everything.
    let bad = plugin(&[("CNI_COMMAND", "GC")], &conf);
    assert_eq!(bad.code(), 7, "{bad:?}");
    assert!(cni("CHECK", "b", &with_prev(&conf, &adds[1].json)).ok);
}

/// A runtime with thousands of containers sends a GC list far over HTTP/2's initial 64 KiB
/// window: the plugin waits for the daemon's window updates, in 16 KiB frames.
#[test]
fn a_gc_list_bigger_than_the_initial_window() {
    let d = Daemon::with_config(NO_GC_GRACE);
    let conf = d.conf("1.1.0", "gcbig", r#""subnet":"10.71.0.0/24""#);
    let a = cni("ADD", "a", &conf);
    let b = cni("ADD", "b", &conf);
    assert!(a.ok && b.ok, "{a:?} {b:?}");
    let mut valid: Vec<Value> = (0..3000)
        .map(|i| json!({"containerID": format!("{i:064x}"), "ifname": "eth0"}))
        .collect();
    valid.push(json!({"containerID": "b", "ifname": "eth0"}));
    let gc_conf = set(&conf, "cni.dev/valid-attachments", Value::Array(valid));
    assert!(gc_conf.len() > 200_000, "{}", gc_conf.len());
    let gc = plugin(
        &[("CNI_COMMAND", "GC"), ("CNI_PATH", "/usr/lib/cni")],
        &gc_conf,
    );
    assert!(gc.ok, "{gc:?}");
    assert_eq!(cni("CHECK", "a", &with_prev(&conf, &a.json)).code(), 3);
    assert!(cni("CHECK", "b", &with_prev(&conf, &b.json)).ok);
}

#[test]
fn status_is_50_with_the_reason() {
    let d = Daemon::start();
    let tiny = d.conf("1.1.0", "st", r#""subnet":"10.71.0.0/30""#);
    let status = || plugin(&[("CNI_COMMAND", "STATUS")], &tiny);
    assert!(status().ok, "a network that would be declared can serve");
    assert!(cni("ADD", "a", &tiny).ok);
    let r = status();
    assert_eq!(r.code(), 50, "{r:?}");
    assert!(
        r.json["details"]
            .as_str()
            .is_some_and(|m| m.contains("st") && m.contains("1 in use")),
        "{r:?}"
    );
}

#[test]
fn static_addresses_from_cni_args_args_and_runtime_config() {
    let d = Daemon::start();
    let conf = d.conf("1.0.0", "static", r#""subnet":"10.72.0.0/24""#);
    let by_env = |cid: &str, ip: &str| {
        plugin(
            &[
                ("CNI_COMMAND", "ADD"),
                ("CNI_CONTAINERID", cid),
                ("CNI_NETNS", "/var/run/netns/x"),
                ("CNI_IFNAME", "eth0"),
                (
                    "CNI_ARGS",
                    &format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME={cid};IP={ip}"),
                ),
            ],
            &conf,
        )
    };
    let a = by_env("a", "10.72.0.50");
    assert_eq!(a.addresses(), vec!["10.72.0.50/24"], "{a:?}");
    let args = set(&conf, "args", json!({"cni": {"ips": ["10.72.0.51/24"]}}));
    assert_eq!(cni("ADD", "b", &args).addresses(), vec!["10.72.0.51/24"]);
    let rc = set(&args, "runtimeConfig", json!({"ips": ["10.72.0.52"]}));
    assert_eq!(
        cni("ADD", "c", &rc).addresses(),
        vec!["10.72.0.52/24"],
        "runtimeConfig wins"
    );

    let taken = by_env("d", "10.72.0.50");
    assert_eq!(taken.code(), 104, "{taken:?}");
    let details = taken.json["details"].as_str().unwrap_or_default();
    assert!(
        details.contains("10.72.0.50") && details.contains("ns/a"),
        "{details}"
    );
    let outside = by_env("d", "10.99.0.1");
    assert_eq!(outside.code(), 7, "{outside:?}");
    assert!(outside.json["details"]
        .as_str()
        .is_some_and(|m| m.contains("10.99.0.1")));
    // Dynamic allocation skips the claimed addresses.
    let e = cni("ADD", "e", &conf);
    assert_eq!(e.addresses(), vec!["10.72.0.2/24"]);
}

#[test]
fn dual_stack_result_and_resolv_conf() {
    let d = Daemon::start();
    let resolv = d.dir.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 10.96.0.10\nsearch svc.cluster.local\noptions ndots:5\n",
    )
    .expect("write");
    let extra = format!(
        r#""ranges":[[{{"subnet":"10.73.0.0/24"}}],[{{"subnet":"fd73::/64"}}]],"resolvConf":"{}""#,
        resolv.display()
    );
    for v in ["0.4.0", "1.1.0"] {
        let conf = d.conf(v, "ds", &extra);
        let r = cni("ADD", &format!("ds-{}", v.replace('.', "")), &conf);
        assert!(r.ok, "{r:?}");
        let ips = r.json["ips"].as_array().expect("ips");
        assert_eq!(ips.len(), 2);
        assert!(ips[1]["address"]
            .as_str()
            .is_some_and(|a| a.starts_with("fd73::")));
        if v == "0.4.0" {
            assert_eq!(ips[1]["version"], "6");
        }
        assert_eq!(r.json["dns"]["nameservers"], json!(["10.96.0.10"]));
        assert_eq!(r.json["dns"]["options"], json!(["ndots:5"]));
    }
    let missing = d.conf("1.0.0", "ds", r#""resolvConf":"/nonexistent/resolv.conf""#);
    let r = cni("ADD", "ds-x", &missing);
    assert_eq!(r.code(), 7, "{r:?}");
    assert!(
        cni("CHECK", "ds-x", &with_prev(&missing, &json!({"ips": []}))).code() == 3,
        "a bad resolvConf allocated nothing"
    );
}

/// Runs the real host-local with `ipam` (plus a private dataDir).
fn host_local(cmd: &str, cid: &str, ipam: &Value, data_dir: &Path) -> Run {
    host_local_on("parity", cmd, cid, ipam, data_dir)
}

#[test]
#[ignore = "needs /usr/lib/cni/host-local (apt-get install containernetworking-plugins); CI runs it with --include-ignored"]
fn same_address_sequence_as_host_local() {
    require(
        Path::new("/usr/lib/cni/host-local").exists(),
        "needs /usr/lib/cni/host-local (apt-get install containernetworking-plugins)",
    );
    let d = Daemon::start();
    let cases = [
        json!({"subnet": "10.80.0.0/24"}),
        json!({"subnet": "10.81.0.0/28", "rangeStart": "10.81.0.5", "rangeEnd": "10.81.0.9", "gateway": "10.81.0.7"}),
        json!({"ranges": [[{"subnet": "10.82.0.0/29"}, {"subnet": "10.82.1.0/30"}]]}),
        json!({"ranges": [[{"subnet": "10.83.0.0/24", "rangeStart": "10.83.0.250"}], [{"subnet": "fd83::/120", "rangeStart": "fd83::fd"}]]}),
    ];
    // ADD x6 (exhausting the small ranges), DEL one, ADD two more.
    let script: Vec<(&str, &str)> = vec![
        ("ADD", "a"),
        ("ADD", "b"),
        ("ADD", "c"),
        ("DEL", "b"),
        ("ADD", "d"),
        ("ADD", "e"),
        ("ADD", "f"),
        ("ADD", "g"),
        ("ADD", "h"),
    ];
    for (i, ipam) in cases.iter().enumerate() {
        let data = tempfile::tempdir().expect("tempdir");
        let mut ours = ipam.clone();
        ours["type"] = json!("ipool");
        ours["socket"] = json!(d.socket);
        let conf = json!({"cniVersion": "1.0.0", "name": format!("parity{i}"), "type": "bridge", "ipam": ours}).to_string();
        let mut seq_hl = Vec::new();
        let mut seq_ip = Vec::new();
        for (cmd, cid) in &script {
            let hl = host_local(cmd, cid, ipam, data.path());
            let ip = cni(cmd, cid, &conf);
            if *cmd == "ADD" {
                let fmt = |r: &Run| {
                    if r.ok {
                        r.addresses().join(",")
                    } else {
                        "error".to_string()
                    }
                };
                seq_hl.push(fmt(&hl));
                seq_ip.push(fmt(&ip));
            } else {
                assert!(hl.ok && ip.ok);
            }
        }
        println!("case {i}: {seq_hl:?}");
        assert_eq!(seq_ip, seq_hl, "case {i} {ipam}: ipool vs host-local");
    }
}

/// Switching a node from host-local in place: 50 addresses handed out by the
/// real host-local, the conflist's type switched, ipoold started on the same range. Its 200
/// ADDs get none of the 50; a DEL of an old container frees its address; a restart imports
/// nothing twice; host-local's files are left as they were; `ipoolctl list` shows the
/// attachments taken over.
#[test]
#[ignore = "needs /usr/lib/cni/host-local (apt-get install containernetworking-plugins); CI runs it with --include-ignored"]
fn host_locals_allocations_are_taken_over_in_place() {
    require(
        Path::new("/usr/lib/cni/host-local").exists(),
        "needs /usr/lib/cni/host-local (apt-get install containernetworking-plugins)",
    );
    let data = tempfile::tempdir().expect("tempdir");
    let range = json!({"ranges": [[{"subnet": "10.86.0.0/24"}], [{"subnet": "fd86::/120"}]]});
    let mut old = std::collections::BTreeMap::new();
    for i in 0..50 {
        let cid = format!("hl{i}");
        let r = host_local_on("moving", "ADD", &cid, &range, data.path());
        assert!(r.ok, "host-local ADD {cid}: {}", r.stdout);
        old.insert(cid, r.addresses());
    }
    let files = |d: &Path| {
        let mut v: Vec<_> = std::fs::read_dir(d.join("moving"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        v.sort();
        v
    };
    let before = files(data.path());
    let mut d = Daemon::start();
    let mut ours = range.clone();
    ours["type"] = json!("ipool");
    ours["socket"] = json!(d.socket);
    ours["dataDir"] = json!(data.path());
    let conf = json!({"cniVersion": "1.0.0", "name": "moving", "type": "bridge", "ipam": ours})
        .to_string();
    // The first call is a DEL of a container host-local addressed: it is taken over first, then
    // released (not taken over after its DEL, and held for good).
    assert!(cni("DEL", "hl9", &conf).ok);
    old.remove("hl9");
    let taken: std::collections::BTreeSet<String> = old.values().flatten().cloned().collect();
    // Eight runtimes' ADDs at once (as kubelet starts pods): those that come while the first
    // takes host-local's allocations over wait for it to finish.
    std::thread::scope(|s| {
        for t in 0..8 {
            let (conf, taken) = (&conf, &taken);
            s.spawn(move || {
                for i in (t..200).step_by(8) {
                    let r = cni("ADD", &format!("new{i}"), conf);
                    assert!(r.ok, "ADD new{i}: {}", r.stdout);
                    for a in r.addresses() {
                        assert!(!taken.contains(&a), "new{i} got {a}, host-local's");
                    }
                }
            });
        }
    });
    let list = d.ctl(&["list", "--network", "moving"]);
    let listed = String::from_utf8_lossy(&list.stdout).into_owned();
    assert!(
        listed.contains("hl7") && listed.contains("hl49"),
        "{listed}"
    );
    let held: Vec<String> = json(&d.ctl(&["-o", "json", "list", "--network", "moving"]))
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["containerID"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !held.contains(&"hl9".to_string()),
        "hl9's DEL came: {held:?}"
    );
    // The old container's DEL frees its addresses (the runtime's DEL now goes to ipool).
    assert!(cni("DEL", "hl7", &conf).ok);
    let freed: Vec<String> = old["hl7"]
        .iter()
        .map(|a| a.split('/').next().unwrap().to_string())
        .collect();
    // A restart finds the network known: nothing taken over twice (hl7 stays released).
    d.terminate();
    d.spawn();
    let again = cni_with_args(
        "ADD",
        "after",
        &format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=test;K8S_POD_NAME=after;IP={}",
            freed.join(",")
        ),
        &conf,
    );
    assert!(again.ok, "hl7's addresses are free again: {}", again.stdout);
    assert_eq!(again.addresses(), old["hl7"]);
    // An address host-local still has for a container is still refused by name.
    let held = old["hl8"][0].split('/').next().unwrap().to_string();
    let refused = cni_with_args(
        "ADD",
        "thief",
        &format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=test;K8S_POD_NAME=thief;IP={held}"),
        &conf,
    );
    assert!(!refused.ok, "{}", refused.stdout);
    assert_eq!(
        files(data.path()),
        before,
        "host-local's files are left as they were"
    );
    let log = d.log();
    assert_eq!(
        log.matches("host-local's allocation taken over").count(),
        50,
        "once each (hl9 too, before its DEL), the restart included: {log}"
    );
}

/// The same for a network of ipoold's config file (as deploy/ declares its network, the
/// conflist naming no ranges): taken over at its first ADD, once, recorded in the store.
#[test]
#[ignore = "needs /usr/lib/cni/host-local (apt-get install containernetworking-plugins); CI runs it with --include-ignored"]
fn host_locals_allocations_of_a_config_file_network_are_taken_over() {
    require(
        Path::new("/usr/lib/cni/host-local").exists(),
        "needs /usr/lib/cni/host-local (apt-get install containernetworking-plugins)",
    );
    let data = tempfile::tempdir().expect("tempdir");
    let range = json!({"subnet": "10.87.0.0/24"});
    let old: Vec<String> = (0..10)
        .map(|i| {
            let r = host_local_on("cfgnet", "ADD", &format!("hl{i}"), &range, data.path());
            assert!(r.ok, "host-local ADD hl{i}: {}", r.stdout);
            r.addresses()[0].clone()
        })
        .collect();
    let mut d = Daemon::with_config(
        "[[network]]\nname = \"cfgnet\"\nranges = [[{ subnet = \"10.87.0.0/24\" }]]\n",
    );
    let ours = json!({"type": "ipool", "socket": d.socket, "dataDir": data.path()});
    let conf = json!({"cniVersion": "1.0.0", "name": "cfgnet", "type": "bridge", "ipam": ours})
        .to_string();
    for i in 0..20 {
        let r = cni("ADD", &format!("new{i}"), &conf);
        assert!(r.ok, "ADD new{i}: {}", r.stdout);
        assert!(
            !old.contains(&r.addresses()[0]),
            "new{i}: {:?}",
            r.addresses()
        );
    }
    // Their DELs come; restarted, ipoold takes nothing over again: every one is free.
    for i in 0..10 {
        assert!(cni("DEL", &format!("hl{i}"), &conf).ok);
    }
    d.terminate();
    d.spawn();
    let first = old[0].split('/').next().unwrap();
    let again = cni_with_args(
        "ADD",
        "after",
        &format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=test;K8S_POD_NAME=after;IP={first}"),
        &conf,
    );
    assert!(again.ok, "{first} is free: {}", again.stdout);
    let log = d.log();
    assert_eq!(
        log.matches("host-local's allocation taken over").count(),
        10,
        "{log}"
    );
}
