//! What nodes at steady state cost their store (the budget), counted at the store
//! (the fake apiserver's requests; a real etcd's own counters), with the real daemons: three
//! nodes, heartbeats every 2 s (`heartbeat_ttl_secs = 6`), `resync_secs` at its default.
//! Counts, not times: in a 12 s window each node renews its name at most 8 times (every
//! 2 s, give or take a fifth) and does nothing else, idle or with pods coming and going (10 ADD
//! and DEL a minute), single- or dual-stack alike: no read of its Lease, no list, no read of its
//! pool, no watch made again; on etcd, no write at all (the keep-alives and the check that
//! the name is still on its lease aside).

use std::time::Duration;

use crate::common::backend::Backend;
use crate::common::*;

const NODES: usize = 3;
const WINDOW: Duration = Duration::from_secs(12);
/// Renewals of one node in the window at most: every 2 s less a fifth, and one at its start.
const RENEWALS: u64 = 8;

fn steady_state(store: Backend, dual: bool, churn: bool) {
    let mut pool = vec!["p", "--cidr", "10.56.0.0/20", "--block-size", "26"];
    if dual {
        pool.extend(["--cidr", "fd00:56::/112", "--block-size-v6", "120"]);
    }
    store.create_pool(&pool);
    let tuning = "heartbeat_ttl_secs = 6\n";
    let daemons: Vec<Daemon> = (0..NODES)
        .map(|i| {
            let config = store.daemon_config(&format!("n{i}"), "p", tuning, &store.addr());
            let mut d = Daemon::prepare_with_config(&config);
            d.spawn();
            d
        })
        .collect();
    let confs: Vec<String> = daemons
        .iter()
        .map(|d| d.conf("1.0.0", "pods", ""))
        .collect();
    for (i, conf) in confs.iter().enumerate() {
        let r = add_within(20, "a node's first ADD", &format!("first{i}"), conf);
        assert_eq!(r.addresses().len(), if dual { 2 } else { 1 }, "{r:?}");
    }
    // The first syncs, the claims and the watches made: from here on, the steady state.
    std::thread::sleep(Duration::from_secs(3));
    let before = store.load();
    let start = std::time::Instant::now();
    let mut k = 0;
    while start.elapsed() < WINDOW {
        if churn && k < 2 {
            for (i, conf) in confs.iter().enumerate() {
                let id = format!("churn{i}-{k}");
                assert!(cni("ADD", &id, conf).ok, "ADD {id}");
                assert!(cni("DEL", &id, conf).ok, "DEL {id}");
            }
            k += 1;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let used = store.load() - before;
    let n = NODES as u64;
    eprintln!(
        "{} ({}, {}): per node in {} s: {:.1} requests, {:.1} writes, {:.1} renewals, {:.1} reads, {:.1} gets, {:.1} watches, {} bytes",
        store.name(),
        if dual { "dual-stack" } else { "IPv4" },
        if churn { "10 ADD/DEL a minute" } else { "idle" },
        WINDOW.as_secs(),
        used.requests as f64 / n as f64,
        used.writes as f64 / n as f64,
        used.renewals as f64 / n as f64,
        used.reads as f64 / n as f64,
        used.gets as f64 / n as f64,
        used.watches as f64 / n as f64,
        used.bytes / n
    );
    let why = format!("{used:?} for {NODES} nodes in {} s", WINDOW.as_secs());
    assert_eq!(used.watches, 0, "no watch made again: {why}");
    assert_eq!(used.gets, 0, "no read of a Lease or a pool: {why}");
    match &store {
        Backend::Kube { .. } => {
            assert_eq!(used.reads, 0, "no list: {why}");
            assert_eq!(
                used.writes, used.renewals,
                "nothing written but Leases: {why}"
            );
            assert!(used.renewals <= RENEWALS * n, "renewals: {why}");
            assert!(used.renewals >= n, "each node renewed: {why}");
        }
        Backend::Etcd(_) => {
            assert_eq!(used.writes, 0, "nothing written: {why}");
            // Two leases kept alive per renewal, and no read: the name's key is watched.
            assert!(used.renewals <= 2 * RENEWALS * n, "keep-alives: {why}");
            assert_eq!(used.reads, 0, "no read (the name's key watched): {why}");
            assert!(used.renewals >= 2 * n, "each node renewed: {why}");
        }
    }
    drop(daemons);
}

#[test]
fn idle_nodes_cost_the_apiserver_their_lease_renewals_and_nothing_else() {
    steady_state(Backend::kube(), false, false);
}

#[test]
fn dual_stack_nodes_with_pods_coming_and_going_cost_the_apiserver_the_same() {
    steady_state(Backend::kube(), true, true);
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn idle_nodes_cost_etcd_their_keep_alives_and_nothing_else() {
    steady_state(Backend::etcd(), false, false);
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn dual_stack_nodes_with_pods_coming_and_going_cost_etcd_the_same() {
    steady_state(Backend::etcd(), true, true);
}
