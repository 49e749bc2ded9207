//! With `[kubernetes]`, the pods are the source of truth, and no live pod's address is released
//! nor a finished pod's kept: each way found to break that, with the real daemon and plugin
//! against the fake apiserver (real HTTP on loopback).

use std::time::Duration;

use crate::common::fake_api::FakeApi;
use crate::common::*;
use serde_json::{json, Value};

const GRACE_SECS: u64 = 2;

fn node(name: &str, cidrs: &[&str]) -> Value {
    json!({"metadata": {"name": name}, "spec": {"podCIDRs": cidrs}})
}

fn pod(name: &str, uid: &str, node: &str) -> Value {
    json!({"metadata": {"namespace": "app", "name": name, "uid": uid},
           "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]}})
}

fn running(mut p: Value, ip: &str) -> Value {
    p["status"] = json!({"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]});
    p
}

fn phase(mut p: Value, phase: &str, ip: &str) -> Value {
    p["status"] = json!({"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}]});
    p
}

/// ipoold as node `node_name`, with `[kubernetes]` (grace GRACE_SECS) and network "k8s".
fn daemon(api: &FakeApi, node_name: &str, network: &str, extra_toml: &str) -> Daemon {
    let mut d = Daemon::prepare_with_config(&format!(
        "[cni]\nadd_wait_ms = 300\n[kubernetes]\ngc_grace_secs = {GRACE_SECS}\ncri_socket = \"\"\n{extra_toml}\n[[network]]\nname = \"k8s\"\n{network}\n"
    ));
    let kubeconfig = api.kubeconfig(d.dir.path());
    d.add_args(&["--kubeconfig", &kubeconfig.display().to_string()]);
    d.add_args(&["--node-name", node_name]);
    d.spawn();
    d
}

/// A CNI call for pod app/`name` with `uid` ("" leaves K8S_POD_UID out) and `netns`.
fn call(cmd: &str, container: &str, name: &str, uid: &str, netns: &str, conf: &str) -> Run {
    let mut args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=app;K8S_POD_NAME={name}");
    if !uid.is_empty() {
        args += &format!(";K8S_POD_UID={uid}");
    }
    plugin(
        &[
            ("CNI_COMMAND", cmd),
            ("CNI_CONTAINERID", container),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
            ("CNI_ARGS", &args),
        ],
        conf,
    )
}

fn add(container: &str, name: &str, uid: &str, conf: &str) -> Run {
    eventually(15, &format!("ADD {container}"), || {
        let r = call("ADD", container, name, uid, "/var/run/netns/x", conf);
        match r.ok {
            true => Ok(r),
            false => Err(r),
        }
    })
}

fn details(r: &Run) -> String {
    r.json["details"].as_str().unwrap_or_default().to_string()
}

fn attachments(d: &Daemon) -> Vec<Value> {
    json(&d.ctl(&["list", "-o", "json"]))
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn holds(d: &Daemon, container: &str) -> bool {
    attachments(d).iter().any(|a| a["containerID"] == container)
}

/// Item 1: a lost store, the node's podCIDRs arriving after its pods were listed, an ADD
/// waiting for them: the ADD is served only after the live pods' addresses were quarantined
/// against the new ranges.
#[test]
fn an_add_waiting_for_ranges_never_gets_a_running_pods_address() {
    let api = FakeApi::start();
    api.put("nodes", node("n1", &[]));
    api.put("pods", running(pod("a", "u-a", "n1"), "10.250.0.2"));
    api.put("pods", pod("b", "u-b", "n1"));
    let d = daemon(&api, "n1", "ranges_from = \"node\"", "");
    // add_wait_ms = 300 is short: the ADD below waits through a longer config.
    let conf = d.conf("1.1.0", "k8s", "");
    let waiting = std::thread::spawn({
        let conf = conf.clone();
        move || {
            eventually(20, "ADD b", || {
                let r = call("ADD", "c-b", "b", "u-b", "/var/run/netns/b", &conf);
                match r.ok {
                    true => Ok(r),
                    false => Err(r),
                }
            })
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    api.put("nodes", node("n1", &["10.250.0.0/24"]));
    let b = waiting.join().expect("the ADD's thread");
    assert_ne!(ip_of(&b), "10.250.0.2", "a running pod's address: {b:?}");
    d.wait_log(&["quarantined", "10.250.0.2"]);
}

/// A network a CNI config declares after the first list (ipoold's config does not name it, and
/// the store was lost: it is new): the live pods' addresses in its ranges are quarantined
/// before anything is handed out of them.
#[test]
fn a_network_a_cni_config_declares_never_hands_out_a_running_pods_address() {
    let api = FakeApi::start();
    api.put("nodes", node("n1", &[]));
    api.put("pods", running(pod("a", "u-a", "n1"), "10.252.0.2"));
    api.put("pods", pod("b", "u-b", "n1"));
    let d = daemon(
        &api,
        "n1",
        "ranges = [[{ subnet = \"10.253.0.0/24\" }]]",
        "",
    );
    d.wait_log(&["pods listed"]);
    let conf = d.conf("1.1.0", "declared", r#""subnet": "10.252.0.0/29""#);
    let b = add("c-b", "b", "u-b", &conf);
    assert_ne!(ip_of(&b), "10.252.0.2", "a running pod's address: {b:?}");
    d.wait_log(&["quarantined", "10.252.0.2"]);
}

/// Item 2: a --node-name the apiserver does not know serves nothing and releases nothing; a
/// pod bound to another node is refused, naming both.
#[test]
fn a_node_name_the_apiserver_does_not_know_serves_and_releases_nothing() {
    let api = FakeApi::start();
    api.put("nodes", node("node-a.internal", &[]));
    api.put(
        "pods",
        running(pod("a", "u-a", "node-a.internal"), "10.251.0.2"),
    );
    let mut right = daemon(
        &api,
        "node-a.internal",
        "ranges = [[{ subnet = \"10.251.0.0/24\" }]]",
        "",
    );
    let conf = right.conf("1.1.0", "k8s", "");
    let a = add("c-a", "a", "u-a", &conf);
    assert_eq!(ip_of(&a), "10.251.0.2");
    // Bound to another node: refused, naming both.
    api.put("pods", pod("far", "u-far", "node-b"));
    let r = call("ADD", "c-far", "far", "u-far", "/var/run/netns/far", &conf);
    assert!(!r.ok, "{r:?}");
    assert!(
        details(&r).contains("\"node-b\"") && details(&r).contains("\"node-a.internal\""),
        "{r:?}"
    );
    right.terminate();
    // The same state under a wrong name: nothing served, nothing released.
    let mut wrong = Daemon::prepare_with_config(
        &std::fs::read_to_string(right.dir.path().join("ipoold.toml")).unwrap(),
    );
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&right.state)
        .arg(&wrong.state)
        .status()
        .unwrap();
    assert!(copied.success());
    let kubeconfig = api.kubeconfig(wrong.dir.path());
    wrong.add_args(&["--kubeconfig", &kubeconfig.display().to_string()]);
    wrong.add_args(&["--node-name", "node-a"]);
    wrong.spawn();
    let conf = wrong.conf("1.1.0", "k8s", "");
    // Refused: the pod is bound to another node, or this one is not known (whichever is
    // found first), both naming the names.
    let r = eventually(10, "the ADD refused", || {
        let r = call("ADD", "c-b", "a", "u-a", "/var/run/netns/b", &conf);
        let d = details(&r);
        let named = d.contains("\"node-a\"")
            && (d.contains("does not exist in the apiserver") || d.contains("\"node-a.internal\""));
        match !r.ok && named {
            true => Ok(r),
            false => Err(r),
        }
    });
    assert!(!r.ok, "{r:?}");
    std::thread::sleep(Duration::from_secs(3 * GRACE_SECS));
    assert!(holds(&wrong, "c-a"), "a live pod's address released");
    wrong.wait_log(&["node \"node-a\" does not exist in the apiserver"]);
}

/// Item 3: a pod force-deleted while its sandbox (network namespace) still exists keeps its
/// address until the namespace is gone.
#[test]
fn a_sandbox_that_still_exists_keeps_its_address() {
    let api = FakeApi::start();
    api.put("nodes", node("n1", &[]));
    api.put("pods", pod("a", "u-a", "n1"));
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut d = Daemon::prepare_with_config(&format!(
        "[cni]\nadd_wait_ms = 300\n[kubernetes]\ngc_grace_secs = {GRACE_SECS}\n[[network]]\nname = \"k8s\"\nranges = [[{{ subnet = \"10.252.0.0/24\" }}]]\n"
    ));
    let kubeconfig = api.kubeconfig(d.dir.path());
    d.add_args(&["--kubeconfig", &kubeconfig.display().to_string()]);
    d.add_args(&["--node-name", "n1", "--metrics-listen", &metrics]);
    d.spawn();
    let conf = d.conf("1.1.0", "k8s", "");
    // The sandbox's network namespace: a file the test removes when the sandbox goes.
    let netns = d.dir.path().join("netns-a");
    std::fs::write(&netns, "").unwrap();
    let netns = netns.display().to_string();
    let r = eventually(15, "ADD a", || {
        let r = call("ADD", "c-a", "a", "u-a", &netns, &conf);
        match r.ok {
            true => Ok(r),
            false => Err(r),
        }
    });
    assert!(r.ok);
    api.delete("pods", "app", "a");
    d.wait_log(&["its network namespace still exists"]);
    std::thread::sleep(Duration::from_secs(2 * GRACE_SECS));
    assert!(holds(&d, "c-a"), "released while its sandbox exists");
    let (_, body) = http_get(&metrics, "/metrics");
    assert!(
        samples(&body)
            .get(r#"ipool_pod_gc_total{action="kept_netns_exists"}"#)
            .is_some_and(|v| *v >= 1.0),
        "{body}"
    );
    std::fs::remove_file(&netns).unwrap();
    eventually(10, "released once the namespace is gone", || {
        match holds(&d, "c-a") {
            false => Ok(()),
            true => Err(()),
        }
    });
}

/// Item 4: a pod that finished (Succeeded, Failed) and whose DEL never came gives its address
/// back after the grace, while the pod object stays.
#[test]
fn a_finished_pod_whose_del_never_came_gives_its_address_back() {
    let api = FakeApi::start();
    api.put("nodes", node("n1", &[]));
    api.put("pods", pod("job", "u-job", "n1"));
    api.put("pods", pod("bad", "u-bad", "n1"));
    let d = daemon(
        &api,
        "n1",
        "ranges = [[{ subnet = \"10.253.0.0/24\" }]]",
        "",
    );
    let conf = d.conf("1.1.0", "k8s", "");
    let job = add("c-job", "job", "u-job", &conf);
    let bad = add("c-bad", "bad", "u-bad", &conf);
    api.put(
        "pods",
        phase(pod("job", "u-job", "n1"), "Succeeded", &ip_of(&job)),
    );
    api.put(
        "pods",
        phase(pod("bad", "u-bad", "n1"), "Failed", &ip_of(&bad)),
    );
    eventually(20, "both released", || {
        match holds(&d, "c-job") || holds(&d, "c-bad") {
            false => Ok(()),
            true => Err(attachments(&d)),
        }
    });
}

/// Item 5: a quarantine ends only when its pod is gone or an operator ends it, never with a
/// config change; a static pod is quarantined under the UID the runtime knows it by.
#[test]
fn quarantines_outlive_a_config_change_and_static_pods_keep_their_runtime_uid() {
    let api = FakeApi::start();
    api.put("nodes", node("n1", &[]));
    let mut mirror = running(pod("etcd-n1", "mirror-uid", "n1"), "10.254.0.9");
    mirror["metadata"]["annotations"] = json!({"kubernetes.io/config.mirror": "runtime-uid"});
    api.put("pods", mirror);
    let net = "ranges = [[{ subnet = \"10.254.0.0/24\" }]]";
    let mut d = daemon(&api, "n1", net, "");
    d.wait_log(&["quarantined", "10.254.0.9"]);
    let rs = json(&d.ctl(&["reservations", "-o", "json"]));
    assert_eq!(rs[0]["podUID"], "runtime-uid", "{rs}");
    // The static pod's own ADD (the runtime's UID) gets its address back.
    let conf = d.conf("1.1.0", "k8s", "");
    let r = add("c-static", "etcd-n1", "runtime-uid", &conf);
    assert_eq!(ip_of(&r), "10.254.0.9");
    api.compact();
    std::thread::sleep(Duration::from_secs(1));
    assert!(!d.log().contains("one address on two pods"), "{}", d.log());
    // Another quarantine, then a config without [kubernetes]: it stays.
    assert!(call("DEL", "c-static", "etcd-n1", "runtime-uid", "", &conf).ok);
    // Quarantines are made after a full list: the pod is put while the watch hears nothing, so
    // that the watch resumes from before it, finds that history gone (410) and relists. (Heard
    // first, the watch would resume after it and never relist.)
    api.freeze_watches(true);
    api.put("pods", running(pod("other", "u-o", "n1"), "10.254.0.20"));
    api.compact();
    api.freeze_watches(false);
    eventually(30, "the second quarantine", || {
        let log = d.log();
        match log
            .lines()
            .any(|l| l.contains("quarantined") && l.contains("10.254.0.20"))
        {
            true => Ok(()),
            false => Err(log.lines().count()),
        }
    });
    d.terminate();
    std::fs::write(
        d.dir.path().join("ipoold.toml"),
        format!("[[network]]\nname = \"k8s\"\n{net}\n"),
    )
    .unwrap();
    d.spawn();
    let rs = json(&d.ctl(&["reservations", "-o", "json"]));
    let kept: Vec<&str> = rs
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["podUID"].as_str())
        .collect();
    assert!(kept.contains(&"u-o"), "{rs}");
    // An operator ends it.
    let o = d.ctl(&[
        "unreserve",
        "--network",
        "k8s",
        "--namespace",
        "app",
        "--pod",
        "other",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
}

/// Item 6: an ADD without K8S_POD_UID takes the UID from a live GET, not from the cache, which
/// may hold an earlier pod of that name.
#[test]
fn an_add_without_a_uid_takes_it_from_the_apiserver_not_the_cache() {
    let api = FakeApi::start();
    api.put("nodes", node("n1", &[]));
    api.put("pods", pod("web-0", "u-old", "n1"));
    let d = daemon(
        &api,
        "n1",
        "ranges = [[{ subnet = \"10.249.0.0/24\" }]]",
        "",
    );
    let conf = d.conf("1.1.0", "k8s", "");
    // The cache has web-0 (u-old); the watch then hears nothing more, and web-0 is made anew.
    add("c-first", "web-0", "u-old", &conf);
    api.freeze_watches(true);
    api.delete("pods", "app", "web-0");
    api.put("pods", pod("web-0", "u-new", "n1"));
    let r = add("c-new", "web-0", "", &conf);
    assert!(r.ok);
    let a = attachments(&d);
    let new = a.iter().find(|a| a["containerID"] == "c-new").unwrap();
    assert_eq!(new["podUID"], "u-new", "{a:?}");
}

/// Item 7: every request but the watches has a read deadline (a black-holed list fails and is
/// made again), and the reachability probe is `GET /version`.
#[test]
fn a_black_holed_list_is_given_up_and_the_probe_is_cheap() {
    let api = FakeApi::start();
    api.put("nodes", node("n1", &[]));
    api.put("pods", pod("a", "u-a", "n1"));
    // The first request other than a watch goes unanswered.
    api.hang_next(1);
    let d = daemon(
        &api,
        "n1",
        "ranges = [[{ subnet = \"10.248.0.0/24\" }]]",
        "read_timeout_secs = 10",
    );
    let conf = d.conf("1.1.0", "k8s", "");
    let r = eventually(40, "ADD a", || {
        let r = call("ADD", "c-a", "a", "u-a", "/var/run/netns/a", &conf);
        match r.ok {
            true => Ok(r),
            false => Err(r),
        }
    });
    assert!(r.ok);
    assert!(
        api.requests().iter().any(|r| r.ends_with("(unanswered)")),
        "{:?}",
        api.requests()
    );
    // An outage: the GC probes with GET /version.
    api.set_down(true);
    std::thread::sleep(Duration::from_secs(2 * GRACE_SECS));
    api.set_down(false);
    eventually(20, "a probe", || {
        let reqs = api.requests();
        match reqs.iter().any(|r| r.starts_with("GET /version")) {
            true => Ok(()),
            false => Err(reqs),
        }
    });
    assert!(
        !api.requests().iter().any(|r| r.contains("limit=1")),
        "a list used as a probe: {:?}",
        api.requests()
    );
}

/// Item 8: flannel's networks may be lists.
#[test]
fn flannel_networks_may_be_lists() {
    let dir = tempfile::tempdir().unwrap();
    let env = dir.path().join("subnet.env");
    std::fs::write(
        &env,
        "FLANNEL_NETWORK=10.244.0.0/16,10.245.0.0/16\nFLANNEL_SUBNET=10.244.3.1/24\nFLANNEL_MTU=1450\n",
    )
    .unwrap();
    let d = Daemon::with_config(&format!(
        "[[network]]\nname = \"fl\"\nranges_from = \"flannel\"\nsubnet_file = \"{}\"\n",
        env.display()
    ));
    let conf = d.conf("1.1.0", "fl", "");
    let r = add_within(10, "ADD", "f0", &conf);
    let routes: Vec<&str> = r.json["routes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["dst"].as_str())
        .collect();
    assert_eq!(routes, ["10.244.0.0/16", "10.245.0.0/16"], "{r:?}");
}

/// The main thread's voluntary context switches so far (the daemon's runtime runs its tasks
/// there): each time it went to sleep waiting for something.
fn wakeups(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/status")).expect("status");
    s.lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("voluntary_ctxt_switches")
}

/// Item 9: the pod GC and the quarantine run on events and timers; an idle daemon with pods
/// to watch (one attached, one quarantined) does not wake ten times a second to look. A count,
/// not a time: with the two 100 ms pollers the main thread went to sleep ~105 times in the
/// 5 s; on events and timers (the maintenance pass once a second, say), under 20.
#[test]
fn an_idle_daemon_with_pods_to_watch_does_not_poll() {
    let api = FakeApi::start();
    api.put("nodes", node("n1", &[]));
    api.put("pods", pod("a", "u-a", "n1"));
    api.put("pods", running(pod("b", "u-b", "n1"), "10.254.0.77"));
    let d = daemon(
        &api,
        "n1",
        "ranges = [[{ subnet = \"10.254.0.0/24\" }]]",
        "",
    );
    let conf = d.conf("1.1.0", "k8s", "");
    add("c-a", "a", "u-a", &conf);
    std::thread::sleep(Duration::from_secs(2 * GRACE_SECS + 1));
    let before = wakeups(d.pid());
    std::thread::sleep(Duration::from_secs(5));
    let woke = wakeups(d.pid()) - before;
    eprintln!("the main thread woke {woke} times in 5 s");
    assert!(
        woke < 50,
        "the main thread woke {woke} times in 5 s idle: something polls"
    );
}
