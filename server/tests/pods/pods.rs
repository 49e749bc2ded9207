//! The node's pods as the source of truth: the real ipoold with `[kubernetes]`,
//! reading a fake apiserver over real HTTP, driven through the real plugin.

use std::time::{Duration, Instant};

use crate::common::fake_api::FakeApi;
use crate::common::*;
use serde_json::{json, Value};

const GRACE_SECS: u64 = 2;

fn pod(ns: &str, name: &str, uid: &str) -> Value {
    json!({"metadata": {"namespace": ns, "name": name, "uid": uid},
           "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}})
}

fn with_owner(mut p: Value, kind: &str, name: &str) -> Value {
    p["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind,
        "name": name, "uid": "owner-uid", "controller": true}]);
    p
}

fn with_annotations(mut p: Value, a: Value) -> Value {
    p["metadata"]["annotations"] = a;
    p
}

fn with_ips(mut p: Value, ips: &[&str]) -> Value {
    let list: Vec<Value> = ips.iter().map(|i| json!({"ip": i})).collect();
    p["status"] = json!({"phase": "Running", "podIP": ips[0], "podIPs": list});
    p
}

/// ipoold with `[kubernetes]` (grace GRACE_SECS) and network "k8s" on `subnet`.
fn daemon(api: &FakeApi, subnet: &str, extra: &[&str]) -> Daemon {
    daemon_with(
        api,
        &format!("ranges = [[{{ subnet = \"{subnet}\" }}]]"),
        extra,
    )
}

/// ipoold with `[kubernetes]` and network "k8s" whose ranges are `ranges` (a TOML line), as
/// node n1 (put in the apiserver if it is not there: ipoold checks it exists); no container
/// runtime asked (whatever this machine runs: `cri.rs` has the runtime's part).
fn daemon_with(api: &FakeApi, ranges: &str, extra: &[&str]) -> Daemon {
    if !api.has("nodes", "", "n1") {
        api.put("nodes", json!({"metadata": {"name": "n1"}}));
    }
    let mut d = Daemon::prepare_with_config(&format!(
        "[cni]\nadd_wait_ms = 300\n[kubernetes]\ngc_grace_secs = {GRACE_SECS}\ncri_socket = \"\"\n[[network]]\nname = \"k8s\"\n{ranges}\n"
    ));
    let kubeconfig = api.kubeconfig(d.dir.path());
    d.add_args(&["--kubeconfig", &kubeconfig.display().to_string()]);
    d.add_args(&["--node-name", "n1"]);
    d.add_args(extra);
    d.spawn();
    d
}

/// A CNI call for pod ns/name (uid "" leaves K8S_POD_UID out; name "" leaves the pod out).
fn pod_cni(cmd: &str, container: &str, pod: (&str, &str, &str), conf: &str) -> Run {
    let mut args = "IgnoreUnknown=1".to_string();
    if !pod.1.is_empty() {
        args += &format!(";K8S_POD_NAMESPACE={};K8S_POD_NAME={}", pod.0, pod.1);
    }
    if !pod.2.is_empty() {
        args += &format!(";K8S_POD_UID={}", pod.2);
    }
    cni_with_args(cmd, container, &args, conf)
}

fn details(r: &Run) -> String {
    r.json["details"].as_str().unwrap_or_default().to_string()
}

/// `ipoolctl list -o json`, by container ID.
fn allocations(d: &Daemon) -> Vec<Value> {
    let v = json(&d.ctl(&["list", "-o", "json"]));
    v.as_array().cloned().unwrap_or_default()
}

fn holds(d: &Daemon, container: &str) -> bool {
    allocations(d).iter().any(|a| a["containerID"] == container)
}

/// ADD for a pod, retried while ipoold waits for the pods' list, their quarantine or the
/// node's ranges.
fn add_pod(container: &str, pod: (&str, &str, &str), conf: &str) -> Run {
    eventually(10, &format!("ADD {container}"), || {
        let r = pod_cni("ADD", container, pod, conf);
        let waiting = [
            "not listed yet",
            "checking the addresses",
            "no ranges yet",
            "waiting for the pods",
        ];
        match r.ok {
            true => Ok(r),
            false if waiting.iter().any(|w| details(&r).contains(w)) => Err(r),
            false => panic!("ADD {container}: {r:?}"),
        }
    })
}

#[test]
fn an_add_takes_its_pod_from_the_apiserver_and_fails_retryably_without_it() {
    let api = FakeApi::start();
    api.put(
        "pods",
        with_owner(pod("app", "a", "u-a"), "ReplicaSet", "a-7d9"),
    );
    api.put(
        "pods",
        with_annotations(
            pod("app", "fixed", "u-f"),
            json!({"ipool.io/ips": "10.246.1.77"}),
        ),
    );
    api.put(
        "pods",
        with_annotations(
            pod("app", "bad", "u-b"),
            json!({"ipool.io/sticky": "maybe"}),
        ),
    );
    let d = daemon(&api, "10.246.1.0/24", &[]);
    let conf = d.conf("1.1.0", "k8s", "");
    add_pod("c-a", ("app", "a", "u-a"), &conf);
    let a = allocations(&d);
    let rec = a
        .iter()
        .find(|x| x["containerID"] == "c-a")
        .expect("listed");
    assert_eq!(rec["owner"], "ReplicaSet/a-7d9", "{rec}");
    assert_eq!(rec["podUID"], "u-a", "{rec}");
    assert_eq!(rec["sticky"], false, "{rec}");

    let fixed = pod_cni("ADD", "c-f", ("app", "fixed", "u-f"), &conf);
    assert_eq!(ip_of(&fixed), "10.246.1.77", "{fixed:?}");
    // The runtime's own request wins over the annotation.
    let mut env_ip = d.conf("1.1.0", "k8s", "");
    env_ip = env_ip.replacen('{', r#"{"runtimeConfig":{"ips":["10.246.1.88/24"]},"#, 1);
    let r = pod_cni("ADD", "c-f2", ("app", "fixed", "u-f"), &env_ip);
    assert_eq!(ip_of(&r), "10.246.1.88", "{r:?}");

    let bad = pod_cni("ADD", "c-b", ("app", "bad", "u-b"), &conf);
    assert_eq!(bad.code(), 7, "{bad:?}");
    assert!(details(&bad).contains("ipool.io/sticky"), "{bad:?}");
    let ghost = pod_cni("ADD", "c-g", ("app", "ghost", "u-g"), &conf);
    assert_eq!(ghost.code(), 11, "{ghost:?}");
    assert!(
        details(&ghost).contains("pod app/ghost is not in the apiserver"),
        "{ghost:?}"
    );
    let stale = pod_cni("ADD", "c-s", ("app", "a", "u-old"), &conf);
    assert_eq!(stale.code(), 11, "{stale:?}");
    assert!(
        details(&stale).contains("u-a") && details(&stale).contains("u-old"),
        "{stale:?}"
    );
    assert!(
        api.requests()
            .iter()
            .any(|r| r.contains("/namespaces/app/pods/ghost")),
        "a pod missing from the cache is asked for"
    );
    for c in ["c-b", "c-g", "c-s"] {
        assert!(!holds(&d, c), "{c} failed and holds nothing");
    }

    // Down: a pod not in the cache cannot be described; the ADD fails with 11, naming why.
    api.set_down(true);
    let down = pod_cni("ADD", "c-g2", ("app", "ghost2", ""), &conf);
    assert_eq!(down.code(), 11, "{down:?}");
    assert!(details(&down).contains("apiserver"), "{down:?}");

    // Not a pod (no K8S_POD_NAME): served as without Kubernetes, left alone by the pod GC.
    let podman = pod_cni("ADD", "c-podman", ("", "", ""), &conf);
    assert!(podman.ok, "{podman:?}");
    api.set_down(false);
    // Relists (an expired resourceVersion) and dropped watches do not make a pod look gone.
    api.compact();
    std::thread::sleep(Duration::from_secs(GRACE_SECS));
    api.drop_watches();
    api.fail_next(&[500]);
    std::thread::sleep(Duration::from_secs(2 * GRACE_SECS));
    assert!(holds(&d, "c-podman"));
    assert!(holds(&d, "c-a"), "a pod that exists is never released");
}

#[test]
fn a_force_deleted_pod_is_released_after_two_observations_a_grace_apart() {
    let api = FakeApi::start();
    api.put("pods", pod("app", "a", "u-a"));
    api.put("pods", pod("app", "keep", "u-k"));
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let d = daemon(&api, "10.246.2.0/24", &["--metrics-listen", &listen]);
    let conf = d.conf("1.1.0", "k8s", "");
    add_pod("c-a", ("app", "a", "u-a"), &conf);
    add_pod("c-k", ("app", "keep", "u-k"), &conf);
    assert!(
        api.delete("pods", "app", "a"),
        "force-deleted: no DEL comes"
    );
    let gone_at = Instant::now();
    eventually(20, "c-a released", || match holds(&d, "c-a") {
        false => Ok(()),
        true => Err(()),
    });
    assert!(
        gone_at.elapsed() >= Duration::from_secs(GRACE_SECS),
        "released {:?} after the pod went: before the grace",
        gone_at.elapsed()
    );
    assert!(holds(&d, "c-k"));
    d.wait_log(&["released", "its pod is gone from the apiserver"]);
    assert!(
        api.requests()
            .iter()
            .any(|r| r.starts_with("GET /api/v1/namespaces/app/pods/a")),
        "a live GET confirms: {:?}",
        api.requests()
    );
    let metrics = eventually(5, "the metric", || {
        let out = std::process::Command::new("curl")
            .args(["-s", &format!("http://{listen}/metrics")])
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        match text.contains("ipool_pod_gc_total{action=\"released\"} 1") {
            true => Ok(text),
            false => Err(text),
        }
    });
    assert!(metrics.contains("ipool_apiserver_reachable 1"), "{metrics}");
}

#[test]
fn a_pod_recreated_under_its_name_releases_only_the_old_attachment() {
    let api = FakeApi::start();
    api.put("pods", pod("db", "web-0", "u1"));
    let d = daemon(&api, "10.246.3.0/24", &[]);
    let conf = d.conf("1.1.0", "k8s", "");
    add_pod("c1", ("db", "web-0", "u1"), &conf);
    // Deleted and re-created at once, without the old one's DEL.
    api.delete("pods", "db", "web-0");
    api.put("pods", pod("db", "web-0", "u2"));
    add_pod("c2", ("db", "web-0", "u2"), &conf);
    eventually(20, "c1 released", || match holds(&d, "c1") {
        false => Ok(()),
        true => Err(()),
    });
    std::thread::sleep(Duration::from_secs(2 * GRACE_SECS));
    assert!(holds(&d, "c2"), "the new pod's attachment stays");
}

#[test]
fn an_apiserver_outage_keeps_cached_pods_working_and_releases_nothing() {
    let api = FakeApi::start();
    api.put("pods", pod("app", "a", "u-a"));
    api.put("pods", pod("app", "b", "u-b"));
    api.put("pods", pod("app", "gone", "u-g"));
    let d = daemon(&api, "10.246.4.0/24", &[]);
    let conf = d.conf("1.1.0", "k8s", "");
    add_pod("c-a", ("app", "a", "u-a"), &conf);
    add_pod("c-g", ("app", "gone", "u-g"), &conf);
    api.set_down(true);
    // The pod is deleted while ipoold cannot see it.
    api.delete("pods", "app", "gone");
    let b = pod_cni("ADD", "c-b", ("app", "b", "u-b"), &conf);
    assert!(b.ok, "a cached pod's ADD works during the outage: {b:?}");
    assert!(pod_cni("DEL", "c-a", ("app", "a", "u-a"), &conf).ok);
    d.wait_log(&["the apiserver does not answer"]);
    std::thread::sleep(Duration::from_secs(3 * GRACE_SECS));
    assert!(
        holds(&d, "c-g"),
        "nothing is released while the apiserver is down"
    );
    d.wait_log(&["pod GC paused"]);
    api.set_down(false);
    d.wait_log(&["the apiserver answers again"]);
    eventually(
        20,
        "c-g released once the apiserver answers",
        || match holds(&d, "c-g") {
            false => Ok(()),
            true => Err(()),
        },
    );
    assert!(holds(&d, "c-b"));
}

#[test]
fn a_statefulset_pod_keeps_its_address_and_annotations_override() {
    let api = FakeApi::start();
    api.put(
        "pods",
        with_owner(pod("db", "web-0", "u1"), "StatefulSet", "web"),
    );
    api.put(
        "pods",
        with_annotations(
            with_owner(pod("db", "web-1", "u3"), "StatefulSet", "web"),
            json!({"ipool.io/sticky": "false"}),
        ),
    );
    let d = daemon(&api, "10.246.5.0/24", &[]);
    let conf = d.conf("1.1.0", "k8s", "");
    let first = add_pod("c1", ("db", "web-0", "u1"), &conf);
    add_pod("c3", ("db", "web-1", "u3"), &conf);
    let rec = allocations(&d);
    let web0 = rec.iter().find(|a| a["containerID"] == "c1").unwrap();
    assert_eq!(
        (web0["owner"].as_str(), web0["sticky"].as_bool()),
        (Some("StatefulSet/web"), Some(true))
    );
    api.delete("pods", "db", "web-0");
    api.delete("pods", "db", "web-1");
    eventually(20, "both released", || {
        match holds(&d, "c1") || holds(&d, "c3") {
            false => Ok(()),
            true => Err(allocations(&d)),
        }
    });
    let rs = json(&d.ctl(&["reservations", "-o", "json"]));
    let pods: Vec<&str> = rs
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["pod"].as_str())
        .collect();
    assert_eq!(pods, ["web-0"], "{rs}");
    api.put(
        "pods",
        with_owner(pod("db", "web-0", "u2"), "StatefulSet", "web"),
    );
    let again = add_pod("c2", ("db", "web-0", "u2"), &conf);
    assert_eq!(ip_of(&again), ip_of(&first));
}

#[test]
fn a_deleted_state_dir_quarantines_the_live_pods_addresses() {
    let api = FakeApi::start();
    api.put("pods", pod("app", "a", "u-a"));
    let mut d = daemon(&api, "10.246.6.0/29", &[]);
    let conf = d.conf("1.1.0", "k8s", "");
    let a = add_pod("c-a", ("app", "a", "u-a"), &conf);
    let ip = ip_of(&a);
    api.put("pods", with_ips(pod("app", "a", "u-a"), &[&ip]));
    d.terminate();
    std::fs::remove_dir_all(&d.state).unwrap();
    d.spawn();
    d.wait_log(&["quarantined", &ip]);
    api.put("pods", pod("app", "b", "u-b"));
    let b = add_pod("c-b", ("app", "b", "u-b"), &conf);
    assert_ne!(
        ip_of(&b),
        ip,
        "a live pod's address is not handed out again"
    );
    let st = String::from_utf8_lossy(&d.ctl(&["status"]).stdout).into_owned();
    assert!(st.contains("(1 quarantined)"), "{st}");
    let rs = json(&d.ctl(&["reservations", "-o", "json"]));
    assert_eq!(rs[0]["podUID"], "u-a", "{rs}");
    // The pod goes: so does the quarantine (after the grace, confirmed).
    api.delete("pods", "app", "a");
    d.wait_log(&["quarantine ended"]);
    let st = String::from_utf8_lossy(&d.ctl(&["status"]).stdout).into_owned();
    assert!(!st.contains("quarantined"), "{st}");
}

#[test]
fn rebuild_from_pods_replaces_a_refused_store() {
    let api = FakeApi::start();
    api.put("pods", with_ips(pod("app", "a", "u-a"), &["10.246.7.2"]));
    let mut d = daemon(&api, "10.246.7.0/29", &[]);
    d.terminate();
    // A store ipoold refuses: its log files are gone.
    for f in ["wal-0", "wal-1"] {
        std::fs::remove_file(d.state.join(f)).unwrap();
    }
    let refused = d.run_expecting_failure();
    assert!(refused.contains("wal"), "{refused}");
    d.add_args(&["--rebuild-from-pods"]);
    d.spawn();
    d.wait_log(&["--rebuild-from-pods", "kept aside"]);
    d.wait_log(&["quarantined", "10.246.7.2"]);
    let aside = std::fs::read_dir(d.dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("state.refused-")
        });
    assert!(aside, "the refused store is kept aside");
    let conf = d.conf("1.1.0", "k8s", "");
    api.put("pods", pod("app", "b", "u-b"));
    let b = add_pod("c-b", ("app", "b", "u-b"), &conf);
    assert_ne!(ip_of(&b), "10.246.7.2");
}

#[test]
fn rebuild_from_pods_keeps_a_store_it_cannot_open_for_other_reasons() {
    let api = FakeApi::start();
    let first = daemon(&api, "10.246.9.0/29", &[]);
    // A second ipoold on the same state dir: the store is locked, not damaged.
    let mut second = Daemon::prepare(&["--rebuild-from-pods"]);
    second.state = first.state.clone();
    let config = second.dir.path().join("ipoold.toml");
    std::fs::write(
        &config,
        "[kubernetes]\n[[network]]\nname = \"k8s\"\nranges = [[{ subnet = \"10.246.9.0/29\" }]]\n",
    )
    .unwrap();
    second.add_args(&["--config", &config.display().to_string()]);
    let err = second.run_expecting_failure();
    assert!(!err.is_empty());
    let parent = first.state.parent().unwrap();
    let aside = std::fs::read_dir(parent)
        .unwrap()
        .filter_map(|e| e.ok())
        .any(|e| e.file_name().to_string_lossy().contains("refused"));
    assert!(!aside, "a locked store is not moved aside: {err}");
    assert!(first.state.join("db").exists());
}

#[test]
fn a_lost_store_with_ranges_from_the_node_hands_out_no_running_pods_address() {
    let api = FakeApi::start();
    api.put(
        "nodes",
        json!({"metadata": {"name": "n1"}, "spec": {"podCIDRs": ["10.246.10.0/29"]}}),
    );
    // Running, with the range's first address; this ipoold's store knows nothing of it.
    api.put("pods", with_ips(pod("app", "a", "u-a"), &["10.246.10.2"]));
    api.put("pods", pod("app", "b", "u-b"));
    let d = daemon_with(&api, "ranges_from = \"node\"", &[]);
    let conf = d.conf("1.1.0", "k8s", "");
    let b = add_pod("c-b", ("app", "b", "u-b"), &conf);
    assert_ne!(ip_of(&b), "10.246.10.2", "{b:?}");
    d.wait_log(&["quarantined", "10.246.10.2"]);
}

/// Switching from host-local with `[kubernetes]`: each of host-local's
/// allocations is taken over for the pod on the node that reports its address, and released by
/// the pod GC once that pod is gone; one no pod reports (a secondary network's, a pod whose
/// status is not written yet) is taken over for no pod, and held until its DEL or the
/// runtime's GC.
#[test]
#[ignore = "needs /usr/lib/cni/host-local (apt-get install containernetworking-plugins); CI runs it with --include-ignored"]
fn host_locals_allocations_are_taken_over_for_the_pods_that_report_them() {
    require(
        std::path::Path::new("/usr/lib/cni/host-local").exists(),
        "needs /usr/lib/cni/host-local (apt-get install containernetworking-plugins)",
    );
    let data = tempfile::tempdir().expect("tempdir");
    let range = json!({"subnet": "10.247.0.0/24"});
    let mut ips = Vec::new();
    for cid in ["c-run", "c-none", "c-later"] {
        let r = host_local_on("moved", "ADD", cid, &range, data.path());
        assert!(r.ok, "host-local ADD {cid}: {}", r.stdout);
        ips.push(r.addresses()[0].split('/').next().unwrap().to_string());
    }
    let api = FakeApi::start();
    api.put("nodes", json!({"metadata": {"name": "n1"}}));
    api.put("pods", with_ips(pod("app", "run", "u-run"), &[&ips[0]]));
    api.put("pods", with_ips(pod("app", "later", "u-later"), &[&ips[2]]));
    api.put("pods", pod("app", "new", "u-new"));
    let mut d = Daemon::prepare_with_config(&format!(
        "[cni]\nadd_wait_ms = 300\ngc_grace_secs = 0\n[kubernetes]\ngc_grace_secs = {GRACE_SECS}\ncri_socket = \"\"\n"
    ));
    let kubeconfig = api.kubeconfig(d.dir.path());
    d.add_args(&["--kubeconfig", &kubeconfig.display().to_string()]);
    d.add_args(&["--node-name", "n1"]);
    d.spawn();
    let mut ours = range.clone();
    ours["type"] = json!("ipool");
    ours["socket"] = json!(d.socket);
    ours["dataDir"] = json!(data.path());
    let conf =
        json!({"cniVersion": "1.1.0", "name": "moved", "type": "bridge", "ipam": ours}).to_string();
    let new = add_pod("c-new", ("app", "new", "u-new"), &conf);
    let got = new.addresses()[0].split('/').next().unwrap().to_string();
    assert!(got != ips[0] && got != ips[2], "{got}: a live pod's");
    let by_container = |d: &Daemon| {
        allocations(d)
            .iter()
            .map(|a| {
                let c = a["containerID"].as_str().unwrap_or_default().to_string();
                (c, a.to_string())
            })
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let now = by_container(&d);
    assert!(now["c-run"].contains("run"), "{now:?}");
    assert!(now["c-later"].contains("later"), "{now:?}");
    assert!(
        now["c-none"].contains("\"podName\":\"\""),
        "nobody reports it: held for no pod: {now:?}"
    );
    assert!(api.delete("pods", "app", "later"));
    eventually(
        20,
        "c-later released once its pod is gone",
        || match holds(&d, "c-later") {
            false => Ok(()),
            true => Err(()),
        },
    );
    assert!(holds(&d, "c-run") && holds(&d, "c-new") && holds(&d, "c-none"));
    // The runtime's GC, which lists what runs, releases the one no pod reported.
    let mut gc_conf: Value = serde_json::from_str(&conf).unwrap();
    gc_conf["cni.dev/valid-attachments"] = json!([
        {"containerID": "c-run", "ifname": "eth0"},
        {"containerID": "c-new", "ifname": "eth0"},
    ]);
    let gc = plugin(
        &[("CNI_COMMAND", "GC"), ("CNI_PATH", "/usr/lib/cni")],
        &gc_conf.to_string(),
    );
    assert!(gc.ok, "{gc:?}");
    assert!(!holds(&d, "c-none") && holds(&d, "c-run"));
}

/// Why an ADD was refused, on the pod: the pool full, the pod gets an Event
/// (events.k8s.io/v1, Warning, reason PoolExhausted) naming the pool and what to do; 200
/// refused ADDs of one pod (a crash loop) cost two writes at the apiserver, a create and its
/// series (client-go's aggregation), the rest counted by ipoold. The daemon runs as the
/// DaemonSet's pod, held to deploy/'s RBAC.
#[test]
fn a_refused_add_is_recorded_on_its_pod_and_a_crash_loop_costs_two_writes() {
    use ipool_testkit::access::{Access, UserInfo};
    let api = FakeApi::start();
    api.enforce(Access::cluster_kubernetes());
    api.put("nodes", json!({"metadata": {"name": "n1"}}));
    api.put("pods", pod("app", "a", "u-a"));
    api.put("pods", pod("app", "loop", "u-l"));
    let metrics = format!("127.0.0.1:{}", free_port());
    // 10.246.9.0/29: five addresses (.1 is the gateway).
    let mut d = Daemon::prepare_with_config(&format!(
        "[cni]\nadd_wait_ms = 300\n[kubernetes]\ngc_grace_secs = {GRACE_SECS}\ncri_socket = \"\"\n[[network]]\nname = \"k8s\"\nranges = [[{{ subnet = \"10.246.9.0/29\" }}]]\n"
    ));
    let user = UserInfo::pod_on_node("ipool-system", "ipool", "ipool-n1", "n1");
    let kc = api.kubeconfig_as(d.dir.path(), "ipoold", &api.addr.to_string(), user);
    d.add_args(&["--kubeconfig", &kc.display().to_string()]);
    d.add_args(&["--node-name", "n1", "--metrics-listen", &metrics]);
    d.spawn();
    let conf = d.conf("1.1.0", "k8s", "");
    add_pod("c-a0", ("app", "a", "u-a"), &conf);
    let mut filled = 1;
    while pod_cni("ADD", &format!("c-a{filled}"), ("app", "a", "u-a"), &conf).ok {
        filled += 1;
        assert!(filled < 10, "a /29 holds fewer");
    }
    let writes = || {
        api.requests()
            .iter()
            .filter(|r| {
                r.contains("/apis/events.k8s.io/v1/")
                    && (r.starts_with("POST") || r.starts_with("PATCH"))
            })
            .count()
    };
    // Pod a's own refusal made its event; pod loop's are counted from here.
    let before = eventually(10, "pod a's event", || match writes() {
        0 => Err(()),
        n => Ok(n),
    });
    let refused = pod_cni("ADD", "c-l0", ("app", "loop", "u-l"), &conf);
    assert!(!refused.ok, "{refused:?}");
    let event = eventually(10, "pod loop's event", || {
        api.objects("events")
            .into_iter()
            .find(|e| e["regarding"]["name"] == "loop")
            .ok_or(())
    });
    assert_eq!(event["metadata"]["namespace"], "app", "{event}");
    assert_eq!(event["type"], "Warning", "{event}");
    assert_eq!(event["reason"], "PoolExhausted", "{event}");
    assert_eq!(event["regarding"]["uid"], "u-l", "{event}");
    assert_eq!(event["reportingController"], "ipool.io/ipoold", "{event}");
    let note = event["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("pool \"k8s\"") && note.contains("To fix: give the pool more addresses"),
        "{note}"
    );
    for i in 1..200 {
        let r = pod_cni("ADD", &format!("c-l{i}"), ("app", "loop", "u-l"), &conf);
        assert!(!r.ok, "{r:?}");
    }
    let aggregated = |m: &str| {
        let (_, body) = http_get(m, "/metrics");
        samples(&body)
            .get("ipool_pod_events_total{reason=\"PoolExhausted\",write=\"aggregated\"}")
            .copied()
            .unwrap_or(0.0)
    };
    // Pod loop's 200 refusals are all in: the first created its event, the second made it a
    // series, the 198 others are only counted.
    eventually(10, "every refusal counted", || {
        match aggregated(&metrics) >= 198.0 {
            true => Ok(()),
            false => Err(aggregated(&metrics)),
        }
    });
    assert_eq!(writes() - before, 2, "{:?}", api.requests());
    let event = api
        .objects("events")
        .into_iter()
        .find(|e| e["regarding"]["name"] == "loop")
        .expect("still there");
    assert_eq!(event["series"]["count"], 2, "{event}");
    assert!(!holds(&d, "c-l0"), "nothing was held for a refused ADD");
}
