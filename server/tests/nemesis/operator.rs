//! The operator's faults of the randomized fault test: the pool grown, disabled and shrunk;
//! addresses reserved for a while; the pool deleted while nodes hold blocks (its listing held,
//! or failing) and deleted again when left Deleting; spare pools; release-node where the
//! daemons keep no names.

use super::*;

/// How long after `reserve` returned every node has taken the reservation in: its watch
/// hears the pool written within moments; without it, `resync_secs` (2) and a round trip.
/// A node that cannot hear the store meanwhile (its connection faulted, the store stopped)
/// has as long again from when it can.
pub(super) const RESERVATION_HEARD_SECS: f64 = 3.0;

/// By when `node` has heard what was written at `at`: [`RESERVATION_HEARD_SECS`] after, or
/// after the end of each time it could not hear the store that began before then.
pub(super) fn heard_by(unheard: &[(Option<String>, f64, f64)], node: &str, at: f64) -> f64 {
    let mut by = at + RESERVATION_HEARD_SECS;
    let mut times: Vec<(f64, f64)> = unheard
        .iter()
        .filter(|(who, _, until)| who.as_deref().is_none_or(|w| w == node) && *until > at)
        .map(|(_, from, until)| (*from, *until))
        .collect();
    times.sort_by(|a, b| a.0.total_cmp(&b.0));
    for (from, until) in times {
        if from < by {
            by = by.max(until + RESERVATION_HEARD_SECS);
        }
    }
    by
}

/// Says (in the run's problems) which of `ips`, handed out to `c` on `node` by an ADD that
/// began at `started`, were reserved long enough before for every node to know.
pub(super) fn reserved_handed_out(run: &Run, node: &str, c: &str, ips: &[IpAddr], started: f64) {
    let reserved = run.reserved.lock().unwrap();
    let unheard = run.unheard.lock().unwrap().clone();
    for ip in ips {
        let held = reserved.iter().find(|(net, from, until)| {
            net.contains(ip)
                && heard_by(&unheard, node, *from) < started
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
pub(super) fn pool_growth(run: &Run, pause: Duration) {
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
pub(super) fn reservation(run: &Run, which: (u32, bool), pause: Duration) {
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

pub(super) fn outcome(o: &std::process::Output) -> String {
    match o.status.success() {
        true => "done".into(),
        false => format!("refused ({})", stderr(o).trim()),
    }
}

/// An operator deletes the nemesis pool while nodes hold blocks of it: refused, the pool as it
/// was. On the apiserver the deletion's listing of the blocks is held meanwhile while node
/// `i` restarts (its first sync settles its blocks and reads the pool Deleting).
pub(super) fn pool_deletion(run: &Run, i: usize, pause: Duration) {
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
pub(super) fn again_if_left_deleting(run: &Run) {
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
pub(super) fn failing_pool_deletion(run: &Run) {
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
pub(super) fn check_ready(run: &Run, when: &str) {
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
pub(super) fn pool_phase(run: &Run) -> Option<Option<serde_json::Value>> {
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
pub(super) fn make_pool_again(run: &Run) {
    let args: Vec<&str> = run.pool_args.iter().map(String::as_str).collect();
    run.store.create_pool(&args);
}

/// A spare pool of other block sizes made and deleted (no node uses it): creations and
/// deletions interleaved with the nodes' claims.
pub(super) fn spare_pool(run: &Run, kind: u64) {
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
pub(super) fn release_elsewhere(run: &Run, name: &str) {
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
