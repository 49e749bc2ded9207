//! The container runtime asked before an address goes, against the real
//! containerd (Debian's, its CRI plugin on a socket of the test's own) and the real daemon and
//! plugin, the pods on the fake apiserver: a pod force-deleted while its sandbox runs keeps its
//! address, an attachment's and a quarantine's alike, for as long as the sandbox runs; once it
//! is gone, the address is let go; a runtime that does not answer keeps it.

use crate::common::containerd::{self, Containerd};
use crate::common::fake_api::FakeApi;
use crate::common::*;
use serde_json::json;

fn pod(name: &str, uid: &str, ips: &[&str]) -> serde_json::Value {
    let mut p = json!({"metadata": {"namespace": "app", "name": name, "uid": uid},
                       "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x"}]}});
    if !ips.is_empty() {
        let list: Vec<serde_json::Value> = ips.iter().map(|i| json!({"ip": i})).collect();
        p["status"] = json!({"phase": "Running", "podIP": ips[0], "podIPs": list});
    }
    p
}

fn add(container: &str, name: &str, uid: &str, conf: &str) -> String {
    let args =
        format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=app;K8S_POD_NAME={name};K8S_POD_UID={uid}");
    let r = eventually(15, &format!("ADD {container}"), || {
        let r = cni_with_args("ADD", container, &args, conf);
        match r.ok {
            true => Ok(r),
            false => Err(r),
        }
    });
    ip_of(&r)
}

fn holds(d: &Daemon, container: &str) -> bool {
    let v = json(&d.ctl(&["list", "-o", "json"]));
    v.as_array()
        .is_some_and(|a| a.iter().any(|x| x["containerID"] == container))
}

fn quarantined(d: &Daemon) -> bool {
    String::from_utf8_lossy(&d.ctl(&["status"]).stdout).contains("quarantined")
}

fn gc_count(metrics: &str, action: &str) -> f64 {
    let (_, body) = http_get(metrics, "/metrics");
    samples(&body)
        .get(&format!("ipool_pod_gc_total{{action=\"{action}\"}}"))
        .copied()
        .unwrap_or(0.0)
}

#[test]
#[ignore = "needs root, containerd, podman and gcc (CI installs them and runs it with --include-ignored)"]
fn a_running_sandbox_keeps_its_address_after_its_pod_is_force_deleted() {
    if let Some(m) = containerd::missing() {
        panic!("this test needs {m}");
    }
    let ctd = Containerd::start();
    let api = FakeApi::start();
    api.put("nodes", json!({"metadata": {"name": "n1"}}));
    api.put("pods", pod("a", "u-a", &[]));
    // Pod q: its sandbox runs with an address the store does not hold (a lost state dir, say):
    // quarantined once the daemon has listed the pods.
    let sandbox_q = ctd.run_sandbox("app", "q", "u-q");
    api.put("pods", pod("q", "u-q", &["10.247.0.200"]));
    let metrics = format!("127.0.0.1:{}", free_port());
    let mut d = Daemon::prepare_with_config(&format!(
        "[cni]\nadd_wait_ms = 300\n[kubernetes]\ngc_grace_secs = 1\ncri_socket = \"{}\"\n[[network]]\nname = \"k8s\"\nranges = [[{{ subnet = \"10.247.0.0/24\" }}]]\n",
        ctd.socket.display()
    ));
    let kubeconfig = api.kubeconfig(d.dir.path());
    d.add_args(&["--kubeconfig", &kubeconfig.display().to_string()]);
    d.add_args(&["--node-name", "n1", "--metrics-listen", &metrics]);
    d.spawn();
    d.wait_log(&["the container runtime is asked", "containerd.sock"]);
    let conf = d.conf("1.1.0", "k8s", "");

    // Pod a: its sandbox runs, its address held by an attachment.
    let sandbox_a = ctd.run_sandbox("app", "a", "u-a");
    let a = add("c-a", "a", "u-a", &conf);
    api.put("pods", pod("a", "u-a", &[&a]));
    d.wait_log(&["quarantined", "10.247.0.200"]);
    assert_eq!(ctd.ready().len(), 2, "{:?}", ctd.ready());

    // Both force-deleted from the apiserver (no DEL comes); their sandboxes still run: well
    // past the grace (1 s, two observations), both addresses stay.
    api.delete("pods", "app", "a");
    api.delete("pods", "app", "q");
    eventually(20, "the GC keeping both for their sandboxes", || {
        match gc_count(&metrics, "kept_sandbox_ready") >= 4.0 {
            true => Ok(()),
            false => Err(d.log()),
        }
    });
    assert!(holds(&d, "c-a"), "a running sandbox's address was let go");
    assert!(quarantined(&d), "a running sandbox's quarantine ended");
    d.wait_log(&["still runs its sandbox", "app/a"]);
    d.wait_log(&["still runs its sandbox", "app/q"]);

    // The sandboxes gone: the attachment released, the quarantine ended.
    ctd.stop_sandbox(&sandbox_a);
    ctd.stop_sandbox(&sandbox_q);
    eventually(
        20,
        "c-a released once its sandbox is gone",
        || match holds(&d, "c-a") {
            false => Ok(()),
            true => Err(()),
        },
    );
    eventually(
        20,
        "the quarantine ended once its sandbox is gone",
        || match quarantined(&d) {
            false => Ok(()),
            true => Err(()),
        },
    );

    // A runtime that does not answer keeps the address.
    api.put("pods", pod("b", "u-b", &[]));
    ctd.run_sandbox("app", "b", "u-b");
    add("c-b", "b", "u-b", &conf);
    ctd.freeze(true);
    api.delete("pods", "app", "b");
    eventually(20, "the GC keeping c-b, the runtime silent", || {
        match gc_count(&metrics, "kept_runtime_unanswered") >= 2.0 {
            true => Ok(()),
            false => Err(()),
        }
    });
    assert!(holds(&d, "c-b"));
    d.wait_log(&["container runtime does not answer"]);
    ctd.freeze(false);
    drop(d);
}
