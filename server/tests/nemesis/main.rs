//! The randomized fault test of cluster mode (a nemesis, as etcd's functional tester and Jepsen
//! have): 3 to 5 real daemons on one store (a real etcd; or, `datastore = "kubernetes"`, the
//! fake apiserver over real HTTP), each through a TCP proxy of the test's own;
//! pods added and deleted through the real plugin by worker threads, while the nemesis kills
//! and restarts daemons, stops and starts the store, delays, drops or cuts a daemon's store
//! connection, holds a daemon's requests past its etcd timeout and delivers them late (after
//! it gave up on them and went on), starts a second daemon under a node's name, and retires
//! nodes (store wiped,
//! blocks force-released: the node and its pods are gone), deletes the pool while nodes hold
//! blocks (on the apiserver: its listing held while a node restarts, or failing), creates and
//! deletes spare pools of other block sizes, and runs release-node where the daemons keep no
//! names (another Lease namespace, another etcd prefix), grows the pool by a CIDR, disables and
//! enables it and removes the CIDR again, and reserves addresses for a while (none may be handed
//! out once every node could know). The pool is dual-stack for half the seeds. Half the seeds
//! address the network as one subnet, and a quarter of their ADDs are of pods with fixed
//! addresses (`common::fixed_pods`: a StatefulSet's ordinals, VMs' launchers that migrate),
//! whose pins move between nodes through the same faults; two launchers of one VM may share
//! its address, nobody else. The checker (`common::history`)
//! then proves that no address was ever held by two pods at once, that every acknowledged
//! attachment is still held unless a DEL released it, and that every held address lies in a
//! block the store says its node owns.
//!
//! Seeded: the fault schedule follows from `IPOOL_NEMESIS_SEED` (printed; random when unset).
//! It runs `IPOOL_NEMESIS_SECS` seconds (default 100: CI's bounded run; set more to search
//! longer).

#[path = "../common/mod.rs"]
mod common;
mod faults;
mod operator;
mod worker;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::backend::Backend;
use common::fake_api::FakeApi;
use common::fixed_pods::{self, FixedPods};
use common::history::{History, Hold, Rng};
use common::proxy::{Mode, Proxy};
use common::*;
use faults::*;
use ipnet::IpNet;
use operator::*;
use worker::*;

const POOL: &str = "nemesis";
/// The daemons' settings: short leases and fences, quick give-backs, so that blocks move.
const TUNING: &str = "heartbeat_ttl_secs = 5\nresync_secs = 2\nblock_hold_down_secs = 1\nclaim_ahead = 2\n[defaults]\ncooldown_secs = 0\nmax_idle = 2\n";

struct Node {
    name: String,
    daemon: Mutex<Daemon>,
    proxy: Proxy,
    conf: String,
    /// A fault of the nemesis is on this node now.
    busy: AtomicBool,
}

struct Run {
    store: Backend,
    /// The nemesis pool's `pool create` arguments (to make it again if a deletion went through).
    pool_args: Vec<String>,
    /// What an operator command did that it must not have (a release that gave back a live
    /// node's blocks, a deletion that left the pool Deleting).
    problems: Mutex<Vec<String>>,
    /// A fault of the store is on (one at a time).
    store_busy: AtomicBool,
    nodes: Vec<Node>,
    /// Reservations made by the nemesis: the range, when its command returned, when its
    /// unreserve began (None: still reserved).
    reserved: Mutex<Vec<(IpNet, f64, Option<f64>)>>,
    /// When a node could not hear the store in time: (the node, or None for every node: the
    /// store stopped; from, until the last message held then got through).
    unheard: Mutex<Vec<(Option<String>, f64, f64)>>,
    history: Mutex<History>,
    stop: AtomicBool,
    seed: u64,
    /// The network addressed as one subnet (half the seeds): [`SUBNET`].
    subnet: bool,
    /// In the runs addressed as one subnet: pods with fixed addresses (a StatefulSet's, VMs'
    /// that migrate), read by the daemons from the fake apiserver (`[kubernetes]`).
    fixed: Option<FixedPods>,
    /// The fake apiserver of the pods when the store is etcd.
    own_api: Option<FakeApi>,
}

/// What a node's network says in the runs addressed as one subnet (`addressing = "subnet"`):
/// the /23's gateway and excluded addresses, inside blocks that serve the rest.
const SUBNET: &str = "addressing = \"subnet\"\ngateway = [\"10.80.0.1\", \"fd00:80::1\"]\nexclude = [\"10.80.0.16/30\", \"10.80.1.100\", \"fd00:80::20/126\"]\n";

/// Whether `ip` is one no node hands out in a run addressed as one subnet: a gateway, an
/// excluded address, the /23's network or broadcast address.
fn never_in_subnet(ip: IpAddr) -> bool {
    [
        "10.80.0.1/32",
        "fd00:80::1/128",
        "10.80.0.16/30",
        "10.80.1.100/32",
        "fd00:80::20/126",
        "10.80.0.0/32",
        "10.80.1.255/32",
        "fd00:80::/128",
    ]
    .iter()
    .any(|x| x.parse::<IpNet>().unwrap().contains(&ip))
}

/// Node `name`'s daemon config, its store reached through `via`.
/// In a run addressed as one subnet it has pods with fixed addresses, read from the
/// apiserver (never collected: the test deletes no pod object).
fn node_config(store: &Backend, name: &str, via: &str, subnet: bool) -> String {
    let toml = store.daemon_config(name, POOL, TUNING, via);
    match subnet {
        // With the Nodes on the apiserver: departed nodes released by the daemon that leads.
        true => {
            toml.replace(
                &format!("cluster_pool = \"{POOL}\"\n"),
                &format!("cluster_pool = \"{POOL}\"\n{SUBNET}"),
            )
            .replacen(
                "[cluster]\n",
                "[cluster]\nrelease_departed_after_secs = 2\n",
                1,
            ) + "\n[kubernetes]\ngc_grace_secs = 86400\n"
        }
        false => toml,
    }
}

impl Run {
    fn now(&self) -> f64 {
        self.history.lock().unwrap().now()
    }

    /// The apiserver the daemons read pods from, in a run with fixed addresses.
    fn api(&self) -> Option<&FakeApi> {
        self.store.api().or(self.own_api.as_ref())
    }
}

/// A daemon of node `name` on `toml`, reading pods from `api` if given (`--kubeconfig`).
fn daemon_of(toml: &str, name: &str, api: Option<&FakeApi>) -> Daemon {
    let mut d = Daemon::prepare_with_config(toml);
    if let Some(api) = api {
        let kubeconfig = api.kubeconfig(d.dir.path());
        d.add_args(&["--kubeconfig", &kubeconfig.display().to_string()]);
        d.add_args(&["--node-name", name]);
    }
    d
}

/// Each daemon's log, kept where a failed run can be read after (the daemons' directories go
/// with the run): `target/tmp/nemesis/<seed>-<store>/<node>.log`.
fn keep_logs(run: &Run) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("nemesis")
        .join(format!("{}-{}", run.seed, run.store.name()));
    let kept = std::fs::create_dir_all(&dir).and_then(|()| {
        run.nodes.iter().try_for_each(|n| {
            let log = n.daemon.lock().unwrap_or_else(|e| e.into_inner()).log();
            std::fs::write(dir.join(format!("{}.log", n.name)), log)
        })
    });
    match kept {
        Ok(()) => eprintln!("nemesis: the daemons' logs are kept in {}", dir.display()),
        Err(e) => eprintln!(
            "nemesis: the daemons' logs could not be kept in {}: {e}",
            dir.display()
        ),
    }
}

fn log_fault(run: &Run, what: String) {
    let at = run.now();
    eprintln!("nemesis {at:7.2}s: {what}");
    run.history.lock().unwrap().fault(at, what);
}

fn seed() -> u64 {
    match std::env::var("IPOOL_NEMESIS_SEED") {
        Ok(s) => s.parse().expect("IPOOL_NEMESIS_SEED: a number"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    }
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn no_address_is_ever_held_twice_whatever_the_faults() {
    nemesis(Backend::etcd());
}

/// The same, the store the Kubernetes API (`datastore = "kubernetes"`).
#[test]
fn no_address_is_ever_held_twice_whatever_the_faults_on_the_kubernetes_api() {
    nemesis(Backend::kube());
}

fn nemesis(store: Backend) {
    let seed = seed();
    let secs: u64 = std::env::var("IPOOL_NEMESIS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let mut rng = Rng::new(seed);
    let count = 3 + rng.below(3) as usize;
    eprintln!(
        "nemesis: seed {seed}, {count} nodes, {secs} s, on {} (IPOOL_NEMESIS_SEED={seed} replays the schedule)",
        store.name()
    );
    // Dual-stack for half the seeds: each family's source syncs and claims on its own.
    let dual = rng.chance(0.5);
    // Its last block set aside: StatefulSet kv's ordinals choose their addresses there.
    let mut pool_args: Vec<String> = [
        POOL,
        "--cidr",
        "10.80.0.0/23",
        "--block-size",
        "28",
        "--exclude",
        common::fixed_pods::SET_ASIDE,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if dual {
        pool_args.extend(
            ["--cidr", "fd00:80::/119", "--block-size-v6", "124"]
                .iter()
                .map(|s| s.to_string()),
        );
    }
    eprintln!(
        "nemesis: pool {POOL}: {}",
        if dual { "dual-stack" } else { "IPv4" }
    );
    let args: Vec<&str> = pool_args.iter().map(String::as_str).collect();
    store.create_pool(&args);
    // Addressed as one subnet for half the seeds: the blocks' first and last addresses too.
    let subnet = rng.chance(0.5);
    eprintln!(
        "nemesis: addressing by {}",
        if subnet { "subnet" } else { "block" }
    );
    let store_addr = store.addr();
    // Pods with fixed addresses in the runs addressed as one subnet, on the store's apiserver
    // or one of their own.
    let own_api = (subnet && store.api().is_none()).then(FakeApi::start);
    let api = store.api().or(own_api.as_ref()).filter(|_| subnet);
    let names: Vec<String> = (0..count).map(|i| format!("node-{i}")).collect();
    let fixed = api.map(|api| FixedPods::new(api, &names));
    let nodes: Vec<Node> = (0..count)
        .map(|i| {
            let name = format!("node-{i}");
            let proxy = Proxy::start(&store_addr);
            let via = proxy.url.trim_start_matches("http://").to_string();
            let toml = node_config(&store, &name, &via, subnet);
            let mut d = daemon_of(&toml, &name, api);
            d.spawn();
            let conf = d.conf("1.0.0", "pods", "");
            Node {
                name,
                daemon: Mutex::new(d),
                proxy,
                conf,
                busy: AtomicBool::new(false),
            }
        })
        .collect();
    let run = Arc::new(Run {
        store,
        pool_args,
        problems: Mutex::new(Vec::new()),
        store_busy: AtomicBool::new(false),
        nodes,
        reserved: Mutex::new(Vec::new()),
        unheard: Mutex::new(Vec::new()),
        history: Mutex::new(History::new()),
        stop: AtomicBool::new(false),
        seed,
        subnet,
        fixed,
        own_api,
    });
    let workers: Vec<_> = (0..4)
        .map(|id| {
            let run = run.clone();
            std::thread::spawn(move || worker(run, id))
        })
        .collect();
    let end = Instant::now() + Duration::from_secs(secs);
    let mut faults = Vec::new();
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(300 + rng.below(1500)));
        faults.retain(|f: &std::thread::JoinHandle<()>| !f.is_finished());
        if faults.len() < 2 {
            faults.extend(fault(&run, &mut rng));
        }
    }
    for f in faults {
        f.join().expect("a fault's thread panicked");
    }
    log_fault(&run, "healed: every fault over".into());
    run.stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.join().expect("a worker panicked");
    }

    let history = run.history.lock().unwrap();
    eprintln!("nemesis: seed {seed}: {}", history.summary());
    if let Some(f) = &run.fixed {
        let counts = f.counts.lock().unwrap().clone();
        eprintln!("nemesis: seed {seed}: pods with fixed addresses: {counts:?}");
        assert!(
            // (A third of them kv's, with chosen addresses: none in 30 is no chance.)
            counts.added > 5 && (counts.chosen > 0 || counts.added < 30),
            "seed {seed}: too few pods with fixed addresses ran to prove anything: {counts:?}"
        );
    }
    let problems = run.problems.lock().unwrap().clone();
    let overlaps = history.overlaps();
    if !problems.is_empty() || !overlaps.is_empty() {
        keep_logs(&run);
    }
    assert!(
        problems.is_empty(),
        "seed {seed}: {}\nfaults:\n{}",
        problems.join("\n"),
        faults_text(&history)
    );
    assert!(
        overlaps.is_empty(),
        "seed {seed}: one address held twice at once:\n{}\nfaults:\n{}",
        describe(&overlaps),
        faults_text(&history)
    );
    // The end: what each daemon lists against what the history says it holds.
    let mut listed: BTreeMap<String, BTreeSet<(String, IpAddr)>> = BTreeMap::new();
    for node in &run.nodes {
        let d = node.daemon.lock().unwrap();
        let o = d.ctl(&["-o", "json", "list"]);
        assert!(
            o.status.success(),
            "seed {seed}: {}: {}",
            node.name,
            stderr(&o)
        );
        let set = json(&o)
            .as_array()
            .expect("a list")
            .iter()
            .flat_map(|a| {
                let c = a["containerID"].as_str().unwrap_or_default().to_string();
                a["addresses"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .map(move |ip| (c.clone(), ip.as_str().unwrap_or_default().parse().unwrap()))
            })
            .collect();
        listed.insert(node.name.clone(), set);
    }
    let problems = history.check_end(&listed);
    assert!(
        problems.is_empty(),
        "seed {seed}:\n{}\nfaults:\n{}",
        problems.join("\n"),
        faults_text(&history)
    );
    // Every held address lies in a block the store says its node owns (once the nodes synced).
    // A fixed address may lie outside them where a pin keeps it for its pod, held there.
    let fixed: BTreeSet<(String, String)> = history
        .open()
        .iter()
        .filter(|h| h.owner.is_some())
        .map(|h| (h.node.clone(), h.container.clone()))
        .collect();
    eventually(30, "every held address in a block of its own node", || {
        let owners = run.store.owners();
        let pinned = match fixed.is_empty() {
            true => BTreeSet::new(),
            false => pinned_holders(&run.store),
        };
        let wrong: Vec<String> = listed
            .iter()
            .flat_map(|(node, l)| l.iter().map(move |(c, ip)| (node, c, *ip)))
            .filter(|(node, c, ip)| {
                !(fixed.contains(&(node.to_string(), c.to_string()))
                    && pinned.contains(&(*ip, node.to_string())))
            })
            .filter(|(node, _, ip)| {
                owners
                    .iter()
                    .find(|(b, _): &(&IpNet, &String)| b.contains(ip))
                    .is_none_or(|(_, owner)| owner != *node)
            })
            .map(|(node, c, ip)| format!("{node} holds {c} {ip}, in a block not its own"))
            .collect();
        match wrong.is_empty() {
            true => Ok(()),
            false => Err(format!("seed {seed}: {wrong:?}")),
        }
    });
    assert!(
        history.adds_ok > 50 && history.faults.len() > 5,
        "seed {seed}: the run did too little to prove anything: {}",
        history.summary()
    );
}

/// The store's pins as `ipoolctl cluster pins` lists them: (address, a node holding it).
fn pinned_holders(store: &Backend) -> BTreeSet<(IpAddr, String)> {
    let o = store.ctl(&["--output", "json", "pins"]);
    assert!(o.status.success(), "pins: {}", stderr(&o));
    json(&o)
        .as_array()
        .expect("a list")
        .iter()
        .flat_map(|p| {
            let ip: IpAddr = p["address"].as_str().unwrap().parse().unwrap();
            p["holders"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |h| (ip, h["node"].as_str().unwrap_or_default().to_string()))
        })
        .collect()
}

fn describe(overlaps: &[(Hold, Hold)]) -> String {
    overlaps
        .iter()
        .map(|(a, b)| format!("{a:?}\n  and {b:?}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn faults_text(h: &History) -> String {
    h.faults
        .iter()
        .map(|(at, w)| format!("{at:7.2}s {w}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The checker finds what it must: an overlap of two holds of one address (on one node and
/// across nodes), an acknowledged attachment gone without a DEL, a leak, and an address listed
/// twice; and a clean history passes.
#[test]
fn the_checker_finds_duplicates_losses_and_leaks() {
    let ip = |s: &str| -> IpAddr { s.parse().unwrap() };
    let mut h = History::new();
    h.acked("n1", "a", ip("10.0.0.2"), 1.0);
    h.deleting("n1", "a", 2.0);
    h.acked("n2", "b", ip("10.0.0.2"), 2.5);
    assert!(h.overlaps().is_empty(), "one after the other");
    h.acked("n3", "c", ip("10.0.0.2"), 3.0);
    assert_eq!(h.overlaps().len(), 1, "across nodes");
    h.acked("n2", "d", ip("10.0.0.3"), 3.0);
    h.acked("n2", "e", ip("10.0.0.3"), 4.0);
    assert_eq!(h.overlaps().len(), 2, "on one node");
    // Two launchers of one VM may share its address (a migration); nobody else may.
    let vm = Some("VirtualMachine/db/vm0");
    h.acked_owned("n1", "l1", &[ip("10.0.0.4")], 5.0, vm);
    h.acked_owned("n2", "l2", &[ip("10.0.0.4")], 6.0, vm);
    assert_eq!(h.overlaps().len(), 2, "a migration");
    h.acked_owned(
        "n3",
        "l3",
        &[ip("10.0.0.4")],
        6.5,
        Some("VirtualMachine/db/vm1"),
    );
    h.acked_owned(
        "n3",
        "s0",
        &[ip("10.0.0.4")],
        7.0,
        Some("StatefulSet/db/web/0"),
    );
    assert_eq!(h.overlaps().len(), 2 + 5, "another VM's, a StatefulSet's");
    // A wiped node's holds end with it; an answer recorded after the wipe but acknowledged
    // before it ends there too.
    let mut w = History::new();
    w.acked("n1", "a", ip("10.0.0.9"), 1.0);
    w.wiped("n1", 2.0);
    w.acked("n2", "b", ip("10.0.0.9"), 2.5);
    w.acked("n1", "late", ip("10.0.0.8"), 1.5);
    w.acked("n2", "c", ip("10.0.0.8"), 2.6);
    assert!(w.overlaps().is_empty(), "{:?}", w.overlaps());
    assert!(w.open().iter().all(|h| h.node == "n2"));

    let mut end = History::new();
    end.acked("n1", "a", ip("10.0.0.2"), 1.0);
    end.acked("n2", "b", ip("10.0.0.3"), 1.0);
    let mut listed: BTreeMap<String, BTreeSet<(String, IpAddr)>> = BTreeMap::new();
    listed
        .entry("n1".into())
        .or_default()
        .insert(("a".into(), ip("10.0.0.2")));
    listed
        .entry("n2".into())
        .or_default()
        .insert(("b".into(), ip("10.0.0.3")));
    assert!(end.check_end(&listed).is_empty());
    let mut lost = listed.clone();
    lost.get_mut("n2").unwrap().clear();
    assert!(end.check_end(&lost)[0].contains("no longer held"));
    let mut leaked = listed.clone();
    leaked
        .get_mut("n2")
        .unwrap()
        .insert(("z".into(), ip("10.0.0.2")));
    let p = end.check_end(&leaked);
    assert!(p.iter().any(|p| p.contains("a leak")), "{p:?}");
    assert!(
        p.iter().any(|p| p.contains("held on n1 and on n2")),
        "{p:?}"
    );
    // Two launchers of one VM, listed on two nodes mid-migration: no problem.
    let vm = Some("VirtualMachine/db/vm0");
    end.acked_owned("n1", "l1", &[ip("10.0.0.4")], 2.0, vm);
    end.acked_owned("n2", "l2", &[ip("10.0.0.4")], 3.0, vm);
    let mut migrating = listed.clone();
    migrating
        .get_mut("n1")
        .unwrap()
        .insert(("l1".into(), ip("10.0.0.4")));
    migrating
        .get_mut("n2")
        .unwrap()
        .insert(("l2".into(), ip("10.0.0.4")));
    assert!(end.check_end(&migrating).is_empty());
}

/// A reservation must be heard within moments, but a node that cannot hear the store has as
/// long again from when it can (the seed 3434 that failed: node-4's connection delayed from
/// just after the reserve for six seconds); a fault of another node, or one over before the
/// reservation, changes nothing.
#[test]
fn a_node_that_cannot_hear_the_store_has_longer_to_hear_a_reservation() {
    let n4 = Some("node-4".to_string());
    let quiet: Vec<(Option<String>, f64, f64)> = vec![];
    assert_eq!(operator::heard_by(&quiet, "node-4", 5.5), 8.5);
    let delayed = vec![(n4.clone(), 5.66, 12.36)];
    assert_eq!(operator::heard_by(&delayed, "node-4", 5.5), 15.36);
    assert_eq!(operator::heard_by(&delayed, "node-1", 5.5), 8.5);
    let before = vec![(n4.clone(), 1.0, 5.0)];
    assert_eq!(operator::heard_by(&before, "node-4", 5.5), 8.5);
    let after = vec![(n4.clone(), 9.0, 20.0)];
    assert_eq!(operator::heard_by(&after, "node-4", 5.5), 8.5);
    // The store stopped counts for every node; one fault after another, each begun in time.
    let chained = vec![(None, 6.0, 7.0), (n4.clone(), 9.5, 11.0)];
    assert_eq!(operator::heard_by(&chained, "node-4", 5.5), 14.0);
    // Still on: never heard yet.
    let on = vec![(n4, 6.0, f64::INFINITY)];
    assert!(operator::heard_by(&on, "node-4", 5.5).is_infinite());
}
