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

mod common;

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
use ipnet::IpNet;

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
        true => {
            toml.replace(
                &format!("cluster_pool = \"{POOL}\"\n"),
                &format!("cluster_pool = \"{POOL}\"\n{SUBNET}"),
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

/// A failed ADD, counted by its code and message.
fn add_failed(run: &Run, r: &common::Run) {
    let why = format!(
        "{} {}",
        r.json["msg"].as_str().unwrap_or(&r.stderr),
        r.json["details"].as_str().unwrap_or_default()
    );
    run.history.lock().unwrap().add_failed(r.code(), &why);
}

/// An ADD of a pod without a fixed address. Where the daemons read pods from the apiserver,
/// it names none (as podman's ADD does): served as it comes.
fn plain_add(run: &Run, c: &str, conf: &str) -> common::Run {
    match run.fixed.is_some() {
        true => cni_with_args("ADD", c, "IgnoreUnknown=1", conf),
        false => cni("ADD", c, conf),
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

/// An ADD of a new pod with a fixed address, as the worker's next ADD (`c`): its owner picked
/// by `rng` among those that may have one now. None when the pick's owner may not.
fn fixed_add(run: &Run, rng: &mut Rng, c: &str) -> Option<(usize, bool)> {
    let (fixed, api) = (run.fixed.as_ref()?, run.api()?);
    let names: Vec<String> = run.nodes.iter().map(|n| n.name.clone()).collect();
    let add = fixed.next(api, rng.below(fixed_pods::OWNERS), rng.next(), &names, c)?;
    let node = &run.nodes[add.node];
    let r = cni_with_args("ADD", c, &add.args, &node.conf);
    let at = run.now();
    fixed.answered(&add.owner, add.node, c, r.ok);
    match r.ok {
        true => {
            let ips: Vec<IpAddr> = r.addresses().iter().map(|a| addr(a)).collect();
            run.history
                .lock()
                .unwrap()
                .acked_owned(&node.name, c, &ips, at, Some(&add.owner));
        }
        false => add_failed(run, &r),
    }
    Some((add.node, r.ok))
}

fn addr(cidr: &str) -> IpAddr {
    cidr.split('/').next().unwrap().parse().unwrap()
}

/// A worker: ADDs and DELs through the real plugin on random nodes, as a kubelet would (a
/// failed ADD is followed by a DEL; a DEL is called until it succeeds).
fn worker(run: Arc<Run>, id: usize) {
    let mut rng = Rng::new(run.seed ^ (id as u64 + 1).wrapping_mul(0x1234_5678_9abc));
    let mut pods: Vec<(usize, String)> = Vec::new();
    let mut to_delete: Vec<(usize, String)> = Vec::new();
    let mut n = 0u64;
    while !run.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(20 + rng.below(40)));
        // Pending DELs first.
        to_delete.retain(|(i, c)| !cni("DEL", c, &run.nodes[*i].conf).ok);
        let del = !pods.is_empty() && (pods.len() > 60 || rng.chance(0.45));
        if del {
            let (i, c) = pods.swap_remove(rng.below(pods.len() as u64) as usize);
            let node = &run.nodes[i];
            let at = run.now();
            run.history.lock().unwrap().deleting(&node.name, &c, at);
            if let Some(f) = &run.fixed {
                f.deleting(&c);
            }
            if !cni("DEL", &c, &node.conf).ok {
                to_delete.push((i, c));
            }
            continue;
        }
        n += 1;
        let c = format!("w{id}-{n}");
        // A quarter of the ADDs of a run with fixed addresses: a pod of a StatefulSet's
        // ordinal or a VM's launcher.
        if run.fixed.is_some() && rng.chance(0.25) {
            match fixed_add(&run, &mut rng, &c) {
                Some((i, true)) => pods.push((i, c)),
                Some((i, false)) => to_delete.push((i, c)),
                None => {}
            }
            continue;
        }
        let i = rng.below(run.nodes.len() as u64) as usize;
        let node = &run.nodes[i];
        let started = run.now();
        let r = plain_add(&run, &c, &node.conf);
        let at = run.now();
        match r.ok {
            true => {
                let ips: Vec<IpAddr> = r.addresses().iter().map(|a| addr(a)).collect();
                reserved_handed_out(&run, &node.name, &c, &ips, started);
                if let Some(ip) = ips.iter().find(|ip| run.subnet && never_in_subnet(**ip)) {
                    run.problems.lock().unwrap().push(format!(
                        "{ip} handed out to {c} on {}: the subnet's gateway, excluded, or its network or broadcast address",
                        node.name
                    ));
                }
                run.history
                    .lock()
                    .unwrap()
                    .acked_all(&node.name, &c, &ips, at);
                pods.push((i, c));
            }
            false => {
                add_failed(&run, &r);
                to_delete.push((i, c));
            }
        }
    }
    // The end: every DEL still owed is made (the nemesis healed everything first).
    let deadline = Instant::now() + Duration::from_secs(60);
    while !to_delete.is_empty() && Instant::now() < deadline {
        to_delete.retain(|(i, c)| !cni("DEL", c, &run.nodes[*i].conf).ok);
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        to_delete.is_empty(),
        "seed {}: DELs that never succeeded: {to_delete:?}",
        run.seed
    );
}

/// How long after `reserve` returned every node has taken the reservation in: its watch
/// hears the pool written within moments; without it, `resync_secs` (2) and a round trip.
const RESERVATION_HEARD_SECS: f64 = 3.0;

/// Says (in the run's problems) which of `ips`, handed out to `c` on `node` by an ADD that
/// began at `started`, were reserved long enough before for every node to know.
fn reserved_handed_out(run: &Run, node: &str, c: &str, ips: &[IpAddr], started: f64) {
    let reserved = run.reserved.lock().unwrap();
    for ip in ips {
        let held = reserved.iter().find(|(net, from, until)| {
            net.contains(ip)
                && from + RESERVATION_HEARD_SECS < started
                && until.is_none_or(|u| started < u)
        });
        if let Some((net, from, _)) = held {
            run.problems.lock().unwrap().push(format!(
                "{ip} handed out to {c} on {node} by an ADD begun at {started:.2}s, though {net} was reserved at {from:.2}s"
            ));
        }
    }
}

/// The pool grows by a CIDR, is disabled for a moment and enabled, and the CIDR is removed
/// again (refused while a node owns a block of it: it stays until the next time).
fn pool_growth(run: &Run, pause: Duration) {
    let grown = run.store.ctl(&["pool", "add-cidr", POOL, "10.80.4.0/26"]);
    log_fault(
        run,
        format!("pool {POOL}: add-cidr 10.80.4.0/26: {}", outcome(&grown)),
    );
    std::thread::sleep(pause);
    let off = run.store.ctl(&["pool", "disable", POOL]);
    log_fault(run, format!("pool {POOL}: disabled: {}", outcome(&off)));
    std::thread::sleep(pause.min(Duration::from_secs(2)));
    // Enabled whatever happens (the rest of the run needs addresses); a pool a deletion left
    // Deleting meanwhile (its store failing under it) is deleted again first, as ipoolctl says.
    eventually(60, "the pool enabled again", || {
        let on = run.store.ctl(&["pool", "enable", POOL]);
        match on.status.success() {
            true => Ok(()),
            false if stderr(&on).contains("is Deleting") => {
                again_if_left_deleting(run);
                Err(stderr(&on))
            }
            false => Err(stderr(&on)),
        }
    });
    log_fault(run, format!("pool {POOL}: enabled"));
    let shrunk = run
        .store
        .ctl(&["pool", "remove-cidr", POOL, "10.80.4.0/26"]);
    log_fault(
        run,
        format!(
            "pool {POOL}: remove-cidr 10.80.4.0/26: {}",
            outcome(&shrunk)
        ),
    );
}

/// An address of the pool (`which`: its offset, and whether alone or its /30) reserved for a
/// while, then unreserved.
fn reservation(run: &Run, which: (u32, bool), pause: Duration) {
    let base = u32::from(std::net::Ipv4Addr::new(10, 80, 0, 0)) + which.0;
    let net = match which.1 {
        true => IpNet::new(std::net::Ipv4Addr::from(base).into(), 32),
        false => IpNet::new(std::net::Ipv4Addr::from(base).into(), 30).map(|n| n.trunc()),
    }
    .expect("a CIDR");
    let r = run
        .store
        .ctl(&["reserve", POOL, &net.to_string(), "--reason", "nemesis"]);
    let at = run.now();
    log_fault(run, format!("reserve {net}: {}", outcome(&r)));
    if !r.status.success() {
        return;
    }
    run.reserved.lock().unwrap().push((net, at, None));
    std::thread::sleep(pause);
    let until = run.now();
    // The pool holds one reservation of a CIDR: another thread's reserve of the same one
    // (a "done" too) ends with this unreserve.
    for r in run.reserved.lock().unwrap().iter_mut() {
        if r.0 == net && r.2.is_none() {
            r.2 = Some(until);
        }
    }
    eventually(30, "the reservation ended", || {
        let o = run.store.ctl(&["unreserve", POOL, &net.to_string()]);
        match o.status.success() || stderr(&o).contains("no reservation") {
            true => Ok(()),
            false => Err(stderr(&o)),
        }
    });
    log_fault(run, format!("unreserve {net}"));
}

fn outcome(o: &std::process::Output) -> String {
    match o.status.success() {
        true => "done".into(),
        false => format!("refused ({})", stderr(o).trim()),
    }
}

/// Takes node `i` for a fault: false if another fault holds it.
fn take(run: &Run, i: usize) -> bool {
    !run.nodes[i].busy.swap(true, Ordering::SeqCst)
}

fn release(run: &Run, i: usize) {
    run.nodes[i].busy.store(false, Ordering::SeqCst);
}

fn log_fault(run: &Run, what: String) {
    let at = run.now();
    eprintln!("nemesis {at:7.2}s: {what}");
    run.history.lock().unwrap().fault(at, what);
}

/// One fault, chosen by `rng`, run to its end (faults of different nodes overlap: each runs on
/// a thread of its own).
fn fault(run: &Arc<Run>, rng: &mut Rng) -> Option<std::thread::JoinHandle<()>> {
    let i = rng.below(run.nodes.len() as u64) as usize;
    let pause = Duration::from_millis(500 + rng.below(7000));
    let kind = rng.below(132);
    let name = run.nodes[i].name.clone();
    // What a reservation fault reserves: an address of the pool, alone or its /30.
    let reserve = (rng.below(512) as u32, rng.chance(0.5));
    if kind < 12 {
        // The store itself: stopped, then started.
        if run.store_busy.swap(true, Ordering::SeqCst) {
            return None;
        }
        let run = run.clone();
        return Some(std::thread::spawn(move || {
            log_fault(&run, format!("{} stopped for {pause:?}", run.store.name()));
            run.store.stop();
            std::thread::sleep(pause);
            run.store.start();
            log_fault(&run, format!("{} started", run.store.name()));
            run.store_busy.store(false, Ordering::SeqCst);
        }));
    }
    if !take(run, i) {
        return None;
    }
    let run = run.clone();
    let mode = match rng.below(5) {
        0 => Mode::Delay(Duration::from_millis(50 + rng.below(400))),
        1 => Mode::DropReplies,
        2 => Mode::Blackhole,
        3 => Mode::Refuse,
        // Longer than the daemons' etcd timeout (500 ms): see `late` below.
        _ => Mode::Delay(Duration::from_millis(1500 + rng.below(2000))),
    };
    // Requests held past the timeout for a moment, then the connection passes again without
    // a cut: what was held reaches etcd late, after the daemon gave up on it (a write whose
    // outcome it does not know) and went on with other calls on a new connection.
    let late = matches!(mode, Mode::Delay(d) if d > Duration::from_secs(1));
    let window = Duration::from_millis(300 + rng.below(500));
    Some(std::thread::spawn(move || {
        let node = &run.nodes[i];
        match kind {
            12..=45 if late => {
                log_fault(
                    &run,
                    format!(
                        "{name}: store requests held {mode:?} for {window:?}, then delivered late"
                    ),
                );
                node.proxy.set(mode);
                std::thread::sleep(window);
                node.proxy.set(Mode::Pass);
            }
            12..=45 => {
                log_fault(
                    &run,
                    format!("{name}: store connection {mode:?} for {pause:?}"),
                );
                node.proxy.set(mode);
                std::thread::sleep(pause);
                node.proxy.set(Mode::Pass);
                node.proxy.cut();
            }
            46..=70 => {
                log_fault(&run, format!("{name}: killed (-9), back in {pause:?}"));
                node.daemon.lock().unwrap().kill9();
                std::thread::sleep(pause.min(Duration::from_secs(3)));
                node.daemon.lock().unwrap().spawn();
                log_fault(&run, format!("{name}: restarted"));
            }
            71..=80 => {
                // The node and its pods are gone: its store wiped, its blocks released.
                let mut d = node.daemon.lock().unwrap();
                d.kill9();
                let at = run.now();
                run.history.lock().unwrap().wiped(&name, at);
                if let Some(f) = &run.fixed {
                    f.wiped(i);
                }
                std::fs::remove_dir_all(&d.state).expect("wipe the store");
                let released = run.store.ctl(&["release-node", &name, "--force"]);
                log_fault(
                    &run,
                    format!(
                        "{name}: retired (store wiped, release-node --force: {}), back in {pause:?}",
                        if released.status.success() { "done" } else { "failed" }
                    ),
                );
                drop(d);
                std::thread::sleep(pause.min(Duration::from_secs(3)));
                node.daemon.lock().unwrap().spawn();
                log_fault(&run, format!("{name}: started with an empty store"));
            }
            81..=90 => {
                // Its store wiped without a release: it comes back to its blocks, its pods gone.
                let mut d = node.daemon.lock().unwrap();
                d.kill9();
                let at = run.now();
                run.history.lock().unwrap().wiped(&name, at);
                if let Some(f) = &run.fixed {
                    f.wiped(i);
                }
                std::fs::remove_dir_all(&d.state).expect("wipe the store");
                d.spawn();
                log_fault(&run, format!("{name}: restarted with a wiped store"));
            }
            100..=107 => pool_deletion(&run, i, pause),
            108..=111 => failing_pool_deletion(&run),
            112..=115 => spare_pool(&run, kind),
            116..=119 => release_elsewhere(&run, &name),
            120..=125 => pool_growth(&run, pause),
            126..=131 => reservation(&run, reserve, pause),
            _ => {
                // A second daemon under the same node name, for a while: it must hold back.
                let toml = node_config(&run.store, &name, &run.store.addr(), run.subnet);
                let mut twin = daemon_of(&toml, &name, run.api());
                twin.spawn();
                log_fault(
                    &run,
                    format!("{name}: a second daemon started under its name"),
                );
                let conf = twin.conf("1.0.0", "pods", "");
                let twin_name = format!("{name}#twin");
                let deadline = Instant::now() + pause;
                let mut k = 0;
                while Instant::now() < deadline {
                    k += 1;
                    let c = format!("twin-{}-{k}", run.now() as u64);
                    let r = plain_add(&run, &c, &conf);
                    if r.ok {
                        let at = run.now();
                        let ips: Vec<IpAddr> = r.addresses().iter().map(|a| addr(a)).collect();
                        run.history
                            .lock()
                            .unwrap()
                            .acked_all(&twin_name, &c, &ips, at);
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                twin.kill9();
                let at = run.now();
                run.history.lock().unwrap().wiped(&twin_name, at);
                log_fault(&run, format!("{name}: the second daemon stopped"));
            }
        }
        release(&run, i);
    }))
}

/// An operator deletes the nemesis pool while nodes hold blocks of it: refused, the pool as it
/// was. On the apiserver the deletion's listing of the blocks is held meanwhile while node
/// `i` restarts (its first sync settles its blocks and reads the pool Deleting).
fn pool_deletion(run: &Run, i: usize, pause: Duration) {
    let node = &run.nodes[i];
    let held = run
        .store
        .api()
        .map(|api| api.hold(&format!("labelSelector=ipool.io%2Fpool%3D{POOL}&limit")));
    log_fault(
        run,
        format!(
            "pool {POOL} deleted while nodes hold blocks{}",
            match held {
                Some(_) => format!(" (its listing held while {} restarts)", node.name),
                None => String::new(),
            }
        ),
    );
    let deleted = std::thread::scope(|s| {
        let deleting = s.spawn(|| run.store.ctl_within(30, &["pool", "delete", POOL]));
        if let Some(h) = &held {
            // A claim's own listing may be the one held: either way something waits.
            let deadline = Instant::now() + Duration::from_secs(5);
            while h.caught().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            node.daemon.lock().unwrap().kill9();
            std::thread::sleep(pause.min(Duration::from_secs(2)));
            node.daemon.lock().unwrap().spawn();
            std::thread::sleep(Duration::from_millis(500));
            h.release();
        }
        deleting.join().expect("ipoolctl")
    });
    let outcome = match code(&deleted) {
        0 => {
            // No block was left (every node retired at once): the pool is made again.
            make_pool_again(run);
            "deleted (no block was owned) and made again".to_string()
        }
        c => format!("refused ({c}): {}", stderr(&deleted).trim()),
    };
    log_fault(run, format!("pool {POOL} deletion {outcome}"));
    if code(&deleted) != 0 {
        again_if_left_deleting(run);
    }
    check_ready(run, "after a deletion");
}

/// A deletion the store failed under may leave the pool Deleting when even making it Ready
/// again (or reading it back) failed, and ipoolctl says so: the operator runs it again, as the
/// message says, until it is refused (Ready again) or done (made again here). Logged: a pool
/// left Deleting with the store answering is seen in the faults.
fn again_if_left_deleting(run: &Run) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        match pool_phase(run) {
            Some(phase) if phase == Some(serde_json::json!("Deleting")) => {}
            Some(_) => return,
            // The store not answering now (another fault): asked again.
            None => {
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
        }
        let again = run.store.ctl_within(30, &["pool", "delete", POOL]);
        log_fault(
            run,
            format!(
                "pool {POOL} left Deleting: deleted again, exit {}",
                code(&again)
            ),
        );
        if code(&again) == 0 {
            make_pool_again(run);
            return;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// An operator's deletion whose listing of the blocks fails (the apiserver answers 500): the
/// pool is Ready again. (etcd's deletion is one transaction: a plain refused deletion.)
fn failing_pool_deletion(run: &Run) {
    if let Some(api) = run.store.api() {
        api.fail_matching(
            &format!("labelSelector=ipool.io%2Fpool%3D{POOL}&limit"),
            500,
        );
    }
    let o = run.store.ctl(&["pool", "delete", POOL]);
    log_fault(
        run,
        format!(
            "pool {POOL} deleted with its listing failing: exit {}",
            code(&o)
        ),
    );
    if code(&o) == 0 {
        make_pool_again(run);
    }
    again_if_left_deleting(run);
    check_ready(run, "after a deletion that could not list the blocks");
}

/// The nemesis pool must be listed Ready (a deletion that stopped must leave it so).
fn check_ready(run: &Run, when: &str) {
    // The store itself may be down (another fault): nothing to judge.
    let Some(phase) = pool_phase(run) else {
        return;
    };
    if phase != Some(serde_json::json!("Ready")) {
        run.problems
            .lock()
            .unwrap()
            .push(format!("pool {POOL} is {phase:?} {when}"));
    }
}

/// The nemesis pool's phase as `ipoolctl cluster pool list` says (None inside: no such pool);
/// None when the store did not answer.
fn pool_phase(run: &Run) -> Option<Option<serde_json::Value>> {
    let o = run.store.ctl(&["-o", "json", "pool", "list"]);
    if !o.status.success() {
        return None;
    }
    Some(
        json(&o)
            .as_array()
            .and_then(|a| a.iter().find(|p| p["name"] == POOL).cloned())
            .map(|p| p["phase"].clone()),
    )
}

/// The nemesis pool made again after a deletion went through (no block was owned).
fn make_pool_again(run: &Run) {
    let args: Vec<&str> = run.pool_args.iter().map(String::as_str).collect();
    run.store.create_pool(&args);
}

/// A spare pool of other block sizes made and deleted (no node uses it): creations and
/// deletions interleaved with the nodes' claims.
fn spare_pool(run: &Run, kind: u64) {
    let name = format!("spare-{kind}");
    let cidr = format!("10.81.{}.0/24", kind - 112);
    let o = run.store.ctl(&[
        "pool",
        "create",
        &name,
        "--cidr",
        &cidr,
        "--block-size",
        "27",
    ]);
    let made = code(&o);
    let d = run.store.ctl(&["pool", "delete", &name]);
    log_fault(
        run,
        format!(
            "spare pool {name} made (exit {made}) and deleted (exit {})",
            code(&d)
        ),
    );
}

/// release-node, without --force, looking for a live node's name where the daemons do not
/// keep it: it must give nothing back.
fn release_elsewhere(run: &Run, name: &str) {
    let [flag, value] = run.store.elsewhere();
    let o = run
        .store
        .ctl(&["release-node", name, flag, value, "--absent-for", "0"]);
    log_fault(
        run,
        format!(
            "{name}: release-node {flag} {value} (no --force): exit {}",
            code(&o)
        ),
    );
    if code(&o) == 0 && String::from_utf8_lossy(&o.stdout).contains("released") {
        run.problems.lock().unwrap().push(format!(
            "release-node {name} {flag} {value} gave back blocks of a live node: {}",
            String::from_utf8_lossy(&o.stdout)
        ));
    }
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
    let mut pool_args: Vec<String> = [POOL, "--cidr", "10.80.0.0/23", "--block-size", "28"]
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
            counts.added > 5,
            "seed {seed}: too few pods with fixed addresses ran to prove anything: {counts:?}"
        );
    }
    let problems = run.problems.lock().unwrap().clone();
    assert!(
        problems.is_empty(),
        "seed {seed}: {}\nfaults:\n{}",
        problems.join("\n"),
        faults_text(&history)
    );
    let overlaps = history.overlaps();
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
