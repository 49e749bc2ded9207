//! The randomized fault test's faults of nodes and of the store: the store stopped; a node's
//! store connection delayed, answered into the void, cut, or held past its timeout and
//! delivered late; daemons killed, wiped (with or without release-node), doubled; a node gone
//! with its Node, released by the daemon that leads that; and, through `operator`, what an
//! operator does.

use super::*;

/// Takes node `i` for a fault: false if another fault holds it.
pub(super) fn take(run: &Run, i: usize) -> bool {
    !run.nodes[i].busy.swap(true, Ordering::SeqCst)
}

pub(super) fn release(run: &Run, i: usize) {
    run.nodes[i].busy.store(false, Ordering::SeqCst);
}

/// How long a message sent under `mode` may be held after the mode ends, in seconds.
fn held_for(mode: Mode) -> f64 {
    match mode {
        Mode::Delay(d) => d.as_secs_f64(),
        _ => 0.0,
    }
}

/// Says that `node` (None: every node) cannot hear the store from now on, until [`heard`]
/// says otherwise; returns which entry of `run.unheard` that is.
fn unheard(run: &Run, node: Option<&str>) -> usize {
    let mut all = run.unheard.lock().unwrap();
    all.push((node.map(str::to_string), run.now(), f64::INFINITY));
    all.len() - 1
}

/// Says that what entry `which` of `run.unheard` said ends `held` seconds from now.
fn heard(run: &Run, which: usize, held: f64) {
    let until = run.now() + held;
    run.unheard.lock().unwrap()[which].2 = until;
}

/// One fault, chosen by `rng`, run to its end (faults of different nodes overlap: each runs on
/// a thread of its own).
pub(super) fn fault(run: &Arc<Run>, rng: &mut Rng) -> Option<std::thread::JoinHandle<()>> {
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
            let which = unheard(&run, None);
            run.store.stop();
            std::thread::sleep(pause);
            run.store.start();
            log_fault(&run, format!("{} started", run.store.name()));
            heard(&run, which, 0.0);
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
                let which = unheard(&run, Some(&name));
                node.proxy.set(mode);
                std::thread::sleep(window);
                node.proxy.set(Mode::Pass);
                heard(&run, which, held_for(mode));
            }
            12..=45 => {
                log_fault(
                    &run,
                    format!("{name}: store connection {mode:?} for {pause:?}"),
                );
                let which = unheard(&run, Some(&name));
                node.proxy.set(mode);
                std::thread::sleep(pause);
                node.proxy.set(Mode::Pass);
                node.proxy.cut();
                heard(&run, which, held_for(mode));
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
                wipe(&run, i, &mut d);
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
                wipe(&run, i, &mut d);
                d.spawn();
                log_fault(&run, format!("{name}: restarted with a wiped store"));
            }
            91..=95 if run.subnet => departed(&run, i, pause),
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

/// Node `i`'s daemon `d` killed and its store wiped: its pods are gone with it.
fn wipe(run: &Run, i: usize, d: &mut Daemon) {
    d.kill9();
    let at = run.now();
    let name = &run.nodes[i].name;
    run.history.lock().unwrap().wiped(name, at);
    if let Some(f) = &run.fixed {
        f.wiped(i);
    }
    std::fs::remove_dir_all(&d.state).expect("wipe the store");
}

/// Node `i` departs: its daemon killed, its store wiped (its pods gone with it) and its Node
/// deleted. The daemon that leads the release of departed nodes gives its blocks back once it
/// has been away past its fence and the threshold (2 s); then it comes back, Node and all.
fn departed(run: &Run, i: usize, pause: Duration) {
    let Some(api) = run.api() else {
        return;
    };
    let name = run.nodes[i].name.clone();
    let node = &run.nodes[i];
    let mut d = node.daemon.lock().unwrap();
    wipe(run, i, &mut d);
    api.delete("nodes", "", &name);
    log_fault(
        run,
        format!("{name}: departed (killed, store wiped, Node deleted)"),
    );
    // Blocks of its a pin was made in stay (release-node keeps them for the pins' owners).
    let owns = |run: &Run| {
        let o = run.store.ctl(&["-o", "json", "blocks", "--node", &name]);
        let p = run.store.ctl(&["-o", "json", "pins"]);
        if !o.status.success() || !p.status.success() {
            return true;
        }
        let pinned: BTreeSet<String> = json(&p)
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|pin| pin["block"].as_str().map(str::to_string))
            .collect();
        json(&o).as_array().is_some_and(|a| {
            a.iter()
                .any(|b| !b["block"].as_str().is_some_and(|b| pinned.contains(b)))
        })
    };
    // The fence (5 s), a renewal and the threshold; on the Kubernetes API the release's own
    // watch of the Lease as long again; a leader that was this node handed over (15 s).
    let deadline = Instant::now() + Duration::from_secs(45);
    while owns(run) && Instant::now() < deadline && !run.stop.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(500));
    }
    let released = !owns(run);
    log_fault(
        run,
        format!(
            "{name}: {} by the daemon that leads, back in {pause:?}",
            if released {
                "released"
            } else {
                "not released within 45 s"
            }
        ),
    );
    std::thread::sleep(pause.min(Duration::from_secs(3)));
    api.put("nodes", serde_json::json!({"metadata": {"name": name}}));
    d.spawn();
    log_fault(run, format!("{name}: back with an empty store"));
}
