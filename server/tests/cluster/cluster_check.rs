//! `ipoolctl cluster check` and `release-node --from-check`, with the real
//! daemons, plugin and ipoolctl on either store (the fake apiserver always; a real etcd where
//! installed), the Nodes and pods on the fake apiserver: a clean cluster passes (exit 0); a
//! store seeded with each kind of inconsistency gives a finding of each kind (exit 1), each
//! with what to do; the report's departed nodes are released from it, each checked again.

use std::collections::BTreeSet;

use crate::common::backend::{with_datastore, Backend};
use crate::common::fake_api::FakeApi;
use crate::common::*;
use serde_json::json;

const TUNING: &str = "heartbeat_ttl_secs = 6\nfence_secs = 1\nclaim_ahead = 1\n";

fn address(r: &Run) -> String {
    r.addresses()[0].split('/').next().unwrap().to_string()
}

fn running(api: &FakeApi, name: &str, node: &str, ip: &str) {
    api.put(
        "pods",
        json!({"metadata": {"namespace": "test", "name": name, "uid": format!("uid-{name}")},
               "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
               "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}),
    );
}

fn kinds(report: &serde_json::Value) -> BTreeSet<String> {
    report["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| f["kind"].as_str().unwrap().to_string())
        .collect()
}

fn check_and_release(store: Backend) {
    store.create_pool(&["p", "--cidr", "10.61.0.0/24", "--block-size", "28"]);
    let own = store.own_api();
    let api = store.apiserver(&own);
    let dir = tempfile::tempdir().unwrap();
    // With etcd the apiserver is named apart; on the Kubernetes API it is the store's.
    let ctl = |args: &[&str]| store.ctl_with_api(api, dir.path(), 10, args);
    for n in ["n1", "sleeper"] {
        api.put("nodes", json!({"metadata": {"name": n}}));
    }
    let start = |n: &str| Daemon::with_config(&store.daemon_config(n, "p", TUNING, &store.addr()));
    let n1 = start("n1");
    let a1 = address(&add_within(
        20,
        "n1's ADD",
        "a",
        &n1.conf("1.0.0", "pods", ""),
    ));
    running(api, "a", "n1", &a1);

    // Clean: exit 0, and says what it checked.
    let o = ctl(&["check"]);
    assert_eq!(
        code(&o),
        0,
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        stderr(&o)
    );
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        text.contains("0 finding(s)") && text.contains("1 pods"),
        "{text}"
    );

    // Each kind of inconsistency.
    // A node whose Node is gone, and one whose daemon is away past its fence (each with a
    // block, their daemons stopped).
    let mut ghost = start("ghost");
    let mut sleeper = start("sleeper");
    add_within(20, "ghost's ADD", "g", &ghost.conf("1.0.0", "pods", ""));
    let s = address(&add_within(
        20,
        "sleeper's ADD",
        "s",
        &sleeper.conf("1.0.0", "pods", ""),
    ));
    assert!(ghost.terminate().success());
    assert!(sleeper.terminate().success());
    // A pod on n1 with an address of sleeper's block; one in no block; two with one address.
    running(api, "stray", "n1", &s);
    let owned: Vec<ipnet::IpNet> = store.owners().into_keys().collect();
    let free = (0..16u8)
        .map(|k| format!("10.61.0.{}", k * 16 + 5))
        .find(|ip| {
            !owned
                .iter()
                .any(|b| b.contains(&ip.parse::<std::net::IpAddr>().unwrap()))
        })
        .expect("a block nobody owns");
    running(api, "lost", "n1", &free);
    running(api, "twin", "n1", &a1);
    // A block of a pool deleted behind ipool's back, and an entry that names no owner.
    store.create_pool(&["old", "--cidr", "10.62.0.0/24", "--block-size", "28"]);
    with_datastore(&store, |st| async move {
        let pool = st.get_pool("old").await.unwrap().expect("pool old");
        let block = "10.62.0.0/28".parse().unwrap();
        st.claim("old", pool.revision, &block, "n1").await.unwrap();
    });
    store.drop_pool("old");
    store.put_malformed_block("p");
    std::thread::sleep(std::time::Duration::from_secs(2));

    let o = ctl(&["-o", "json", "check"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).expect("the report");
    let want: BTreeSet<String> = [
        "node-gone",
        "node-away",
        "pod-in-another-nodes-block",
        "pod-in-no-block",
        "address-on-two-pods",
        "block-outside-pool",
        "malformed",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(kinds(&report), want, "{report:#}");
    let finding = |kind: &str| {
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["kind"] == kind)
            .cloned()
            .unwrap()
    };
    assert_eq!(finding("node-gone")["node"], "ghost");
    assert_eq!(finding("node-away")["node"], "sleeper");
    assert!(finding("pod-in-another-nodes-block")["what"]
        .as_str()
        .unwrap()
        .contains("test/stray"));
    assert!(report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| !f["fix"].as_str().unwrap().is_empty()));
    // The table says the same, with what to do.
    let o = ctl(&["check"]);
    assert_eq!(code(&o), 1);
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        text.contains("node-gone (ghost)") && text.contains("do: "),
        "{text}"
    );

    // release-node --from-check: ghost (its Node still gone, away past its fence and a
    // renewal) is released; sleeper, whose Node is there (its daemon may be crashlooping
    // while its pods run), is left alone (exit 1) until its Node is deleted; n1's blocks stay.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let file = dir.path().join("report.json");
    std::fs::write(&file, serde_json::to_vec(&report).unwrap()).unwrap();
    let file = file.display().to_string();
    let o = ctl(&["release-node", "--from-check", &file, "--absent-for", "0"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(code(&o), 1, "{out}\n{}", stderr(&o));
    assert!(
        out.contains("node sleeper: its Node is there: left alone"),
        "{out}"
    );
    let owners: BTreeSet<String> = store.owners().into_values().collect();
    assert!(
        !owners.contains("ghost") && owners.contains("sleeper"),
        "{owners:?}"
    );
    assert!(api.delete("nodes", "", "sleeper"));
    let o = ctl(&["release-node", "--from-check", &file, "--absent-for", "0"]);
    let owners: BTreeSet<String> = store.owners().into_values().collect();
    assert!(!owners.contains("sleeper"), "{owners:?}\n{}", stderr(&o));
    assert!(owners.contains("n1"));
    // A report whose node came back (its Node made again) is left alone.
    api.put("nodes", json!({"metadata": {"name": "ghost"}}));
    let o = ctl(&["release-node", "--from-check", &file, "--absent-for", "0"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        out.contains("node ghost: its Node is back"),
        "{out}\n{}",
        stderr(&o)
    );
    // A file that is not a report: usage, naming it.
    std::fs::write(dir.path().join("bad.json"), "[]").unwrap();
    let bad = dir.path().join("bad.json").display().to_string();
    let o = ctl(&["release-node", "--from-check", &bad]);
    assert_eq!(code(&o), 64, "{}", stderr(&o));
    assert!(stderr(&o).contains("bad.json"), "{}", stderr(&o));
    // On etcd without an apiserver to read the Nodes from: usage, saying so.
    if store.api().is_none() {
        let o = store.ctl(&["release-node", "--from-check", &file]);
        assert_eq!(code(&o), 64, "{}", stderr(&o));
        assert!(stderr(&o).contains("--kubeconfig"), "{}", stderr(&o));
    }
    drop(n1);
}

#[test]
fn cluster_check_finds_each_inconsistency_and_release_node_takes_its_report_on_the_kubernetes_api()
{
    check_and_release(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn cluster_check_finds_each_inconsistency_and_release_node_takes_its_report_on_etcd() {
    check_and_release(Backend::etcd());
}
