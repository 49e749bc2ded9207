//! The randomized fault test's workers: pods added and deleted through the real plugin, as a
//! kubelet would, plain or with fixed addresses (`common::fixed_pods`).

use super::*;

/// A failed ADD, counted by its code and message.
pub(super) fn add_failed(run: &Run, r: &common::Run) {
    let why = format!(
        "{} {}",
        r.json["msg"].as_str().unwrap_or(&r.stderr),
        r.json["details"].as_str().unwrap_or_default()
    );
    run.history.lock().unwrap().add_failed(r.code(), &why);
}

/// An ADD of a pod without a fixed address. Where the daemons read pods from the apiserver,
/// it names none (as podman's ADD does): served as it comes.
pub(super) fn plain_add(run: &Run, c: &str, conf: &str) -> common::Run {
    match run.fixed.is_some() {
        true => cni_with_args("ADD", c, "IgnoreUnknown=1", conf),
        false => cni("ADD", c, conf),
    }
}

/// An ADD of a new pod with a fixed address, as the worker's next ADD (`c`): its owner picked
/// by `rng` among those that may have one now. None when the pick's owner may not.
pub(super) fn fixed_add(run: &Run, rng: &mut Rng, c: &str) -> Option<(usize, bool)> {
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
            if let Some(want) = fixed_pods::FixedPods::chosen_for(&add.owner) {
                assert!(
                    ips.contains(&want),
                    "ADD {c} of {} on {} answered with {ips:?}, though its pod chose {want}",
                    add.owner,
                    node.name
                );
                fixed.counts.lock().unwrap().chosen += 1;
            }
            run.history
                .lock()
                .unwrap()
                .acked_owned(&node.name, c, &ips, at, Some(&add.owner));
        }
        false => add_failed(run, &r),
    }
    Some((add.node, r.ok))
}

pub(super) fn addr(cidr: &str) -> IpAddr {
    cidr.split('/').next().unwrap().parse().unwrap()
}

/// A worker: ADDs and DELs through the real plugin on random nodes, as a kubelet would (a
/// failed ADD is followed by a DEL; a DEL is called until it succeeds).
pub(super) fn worker(run: Arc<Run>, id: usize) {
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
