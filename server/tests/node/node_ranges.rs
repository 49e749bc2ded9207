//! A network's ranges from the node: the Node's spec.podCIDRs (from a fake apiserver over real
//! HTTP) and flannel's subnet.env, through the real ipoold and the real plugin.

use crate::common::fake_api::FakeApi;
use crate::common::*;
use serde_json::{json, Value};

fn node(name: &str, cidrs: &[&str]) -> Value {
    match cidrs.is_empty() {
        true => json!({"metadata": {"name": name}, "spec": {}}),
        false => json!({"metadata": {"name": name},
                        "spec": {"podCIDR": cidrs[0], "podCIDRs": cidrs}}),
    }
}

/// ipoold with network "k8s" on node n1's podCIDRs, reading `api`.
fn on_node(api: &FakeApi) -> Daemon {
    let mut d = Daemon::prepare_with_config(
        "[cni]\nadd_wait_ms = 300\n[[network]]\nname = \"k8s\"\nranges_from = \"node\"\n",
    );
    let kubeconfig = api.kubeconfig(d.dir.path());
    d.add_args(&["--kubeconfig", &kubeconfig.display().to_string()]);
    d.add_args(&["--node-name", "n1"]);
    d.spawn();
    d
}

fn status(conf: &str) -> Run {
    plugin(&[("CNI_COMMAND", "STATUS")], conf)
}

fn details(r: &Run) -> String {
    r.json["details"].as_str().unwrap_or_default().to_string()
}

/// ADD of `container` until it succeeds with an address in `prefix` (e.g. "10.244.3.").
fn add_in(container: &str, conf: &str, prefix: &str) -> Run {
    eventually(10, &format!("ADD {container} from {prefix}"), || {
        let r = cni("ADD", container, conf);
        match r.ok && r.addresses().iter().any(|a| a.starts_with(prefix)) {
            true => Ok(r),
            false => {
                if r.ok {
                    cni("DEL", container, conf);
                }
                Err(r)
            }
        }
    })
}

#[test]
fn podcidrs_that_arrive_late_are_served_without_a_restart() {
    let api = FakeApi::start();
    api.put("nodes", node("n1", &[]));
    let d = on_node(&api);
    let conf = d.conf("1.1.0", "k8s", "");
    let r = eventually(10, "STATUS naming the missing podCIDRs", || {
        let r = status(&conf);
        match r.code() == 50 && details(&r).contains("node n1 has no podCIDRs yet") {
            true => Ok(r),
            false => Err(r),
        }
    });
    assert!(!r.ok);
    let add = cni("ADD", "c1", &conf);
    assert_eq!(add.code(), 11, "{add:?}");
    assert!(
        details(&add).contains("node n1 has no podCIDRs yet"),
        "{add:?}"
    );
    d.wait_log(&["has no ranges yet", "node n1 has no podCIDRs yet"]);
    let other = d.conf("1.1.0", "k8s", r#""subnet":"10.99.0.0/24""#);
    let refused = cni("ADD", "c2", &other);
    assert_eq!(refused.code(), 7, "{refused:?}");
    assert!(details(&refused).contains("10.99.0.0/24"), "{refused:?}");

    api.put("nodes", node("n1", &["10.244.3.0/24"]));
    let add = add_in("c1", &conf, "10.244.3.");
    assert_eq!(add.json["ips"][0]["gateway"], "10.244.3.1", "{add:?}");
    assert!(status(&conf).ok);
    let refused = cni("ADD", "c2", &other);
    assert_eq!(refused.code(), 7, "{refused:?}");
    let msg = details(&refused);
    assert!(
        msg.contains("10.99.0.0/24") && msg.contains("10.244.3.0/24"),
        "{refused:?}"
    );
    d.wait_log(&["network ranges from the node", "10.244.3.0/24"]);
}

#[test]
fn dual_stack_podcidrs_give_one_address_per_family() {
    let api = FakeApi::start();
    api.put(
        "nodes",
        node("n1", &["10.244.4.0/24", "fd00:10:244:4::/64"]),
    );
    let d = on_node(&api);
    let conf = d.conf("1.1.0", "k8s", "");
    let add = add_in("c1", &conf, "10.244.4.");
    let ips = add.addresses();
    assert_eq!(ips.len(), 2, "{add:?}");
    assert!(ips[1].starts_with("fd00:10:244:4::"), "{add:?}");
}

#[test]
fn a_recreated_node_with_other_podcidrs_retires_the_old_range() {
    let api = FakeApi::start();
    api.put("nodes", node("n1", &["10.244.5.0/24"]));
    let d = on_node(&api);
    let conf = d.conf("1.1.0", "k8s", "");
    add_in("c1", &conf, "10.244.5.");
    assert!(api.delete("nodes", "", "n1"));
    api.put("nodes", node("n1", &["10.244.6.0/24"]));
    add_in("c2", &conf, "10.244.6.");
    let st = d.ctl(&["status"]);
    let text = String::from_utf8_lossy(&st.stdout);
    assert!(
        text.lines()
            .any(|l| l.contains("10.244.5.1-") && l.contains("(retiring)")),
        "{text}"
    );
    assert!(cni("DEL", "c1", &conf).ok);
    let st = d.ctl(&["status"]);
    let text = String::from_utf8_lossy(&st.stdout).into_owned();
    assert!(!text.contains("10.244.5."), "{text}");

    // A malformed podCIDR is named in the log and changes nothing.
    api.put("nodes", node("n1", &["10.244.7.1/24"]));
    d.wait_log(&["cannot be used", "host bits"]);
    add_in("c3", &conf, "10.244.6.");
}

#[test]
fn the_node_watch_survives_drops_errors_and_expiry_and_a_restart_without_apiserver() {
    let api = FakeApi::start();
    api.put("nodes", node("n1", &["10.244.8.0/24"]));
    let mut d = on_node(&api);
    let conf = d.conf("1.1.0", "k8s", "");
    add_in("c1", &conf, "10.244.8.");
    api.drop_watches();
    api.compact();
    api.fail_next(&[500, 503]);
    api.put("nodes", node("n1", &["10.244.9.0/24"]));
    add_in("c2", &conf, "10.244.9.");
    let watches = api
        .requests()
        .iter()
        .filter(|r| r.contains("watch=true"))
        .count();
    assert!(watches >= 2, "{:?}", api.requests());

    // Down, and ipoold restarted: the stored ranges serve.
    api.set_down(true);
    d.terminate();
    d.spawn();
    add_in("c3", &conf, "10.244.9.");
    d.wait_log(&["cannot read the node's ranges"]);
    assert!(cni("DEL", "c1", &conf).ok);
    api.set_down(false);
    d.wait_log(&["reading the node's ranges again"]);
}

#[test]
fn a_missing_node_name_is_refused_at_start() {
    let api = FakeApi::start();
    let mut d =
        Daemon::prepare_with_config("[[network]]\nname = \"k8s\"\nranges_from = \"node\"\n");
    let kubeconfig = api.kubeconfig(d.dir.path());
    d.add_args(&["--kubeconfig", &kubeconfig.display().to_string()]);
    let err = d.run_expecting_failure();
    assert!(err.contains("--node-name") && err.contains("k8s"), "{err}");
}

/// Writes `text` to `path` as flannel does: a temp file renamed over it.
fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn a_flannel_subnet_file_that_appears_and_changes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("subnet.env");
    let d = Daemon::with_config(&format!(
        "[cni]\nadd_wait_ms = 300\n[[network]]\nname = \"fl\"\nranges_from = \"flannel\"\nsubnet_file = \"{}\"\n",
        file.display()
    ));
    let conf = d.conf("1.0.0", "fl", "");
    eventually(10, "STATUS naming the missing file", || {
        let r = status(&d.conf("1.1.0", "fl", ""));
        match r.code() == 50 && details(&r).contains("is missing") {
            true => Ok(()),
            false => Err(r),
        }
    });
    let add = cni("ADD", "c1", &conf);
    assert_eq!(add.code(), 11, "{add:?}");

    write_atomically(
        &file,
        "FLANNEL_NETWORK=10.245.0.0/16\nFLANNEL_SUBNET=10.245.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
    );
    let add = add_in("c1", &conf, "10.245.1.");
    assert_eq!(add.json["ips"][0]["gateway"], "10.245.1.1", "{add:?}");
    let routes = add.json["routes"].to_string();
    assert!(routes.contains("10.245.0.0/16"), "{add:?}");

    write_atomically(
        &file,
        "FLANNEL_NETWORK=10.245.0.0/16\nFLANNEL_SUBNET=10.245.2.1/24\nFLANNEL_MTU=1450\n",
    );
    let t = std::time::Instant::now();
    add_in("c2", &conf, "10.245.2.");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(6),
        "{:?}",
        t.elapsed()
    );

    write_atomically(&file, "FLANNEL_SUBNET=10.245.3.0/33\n");
    d.wait_log(&["cannot be used", "FLANNEL_SUBNET"]);
    add_in("c3", &conf, "10.245.2.");
}
