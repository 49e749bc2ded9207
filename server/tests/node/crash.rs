//! Crash safety under load: concurrent ADDs and DELs through the real plugin, `kill -9` of the
//! daemon in the middle, a restart, and the rest of the run. Nothing a reply acknowledged may
//! be lost, nothing may be held twice, and the pool's counts must add up.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{cni, with_prev, Daemon, Run};
use serde_json::Value;

const WORKERS: usize = 8;
const PER_WORKER: usize = 30;
/// Every other container is deleted again.
const OPS: usize = WORKERS * PER_WORKER * 3 / 2;
/// 10.77.0.0/22 minus network, broadcast and gateway (.1).
const RANGE_SIZE: u64 = 1021;

/// Runs a plugin call until it gets an answer other than "try again" (the daemon is down
/// or was killed mid-call: the outcome is unknown, and the call is repeated, as kubelet does).
/// Returns the answer and how many tries it took.
fn until_answered(cmd: &str, container: &str, conf: &str) -> (Run, usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for tries in 1.. {
        let run = cni(cmd, container, conf);
        if run.ok || run.code() != 11 {
            return (run, tries);
        }
        assert!(
            Instant::now() < deadline,
            "{cmd} {container} kept failing: {}",
            run.stdout
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    unreachable!("the loop returns or panics")
}

#[derive(Default)]
struct Outcome {
    /// Container -> the ADD result it was last given, while not deleted.
    live: BTreeMap<String, Value>,
    /// Container -> the addresses it had when its DEL succeeded.
    deleted: BTreeMap<String, Vec<String>>,
    /// Calls that needed a retry (the kill hit them, or they came while the daemon was down).
    retried: usize,
}

fn run_with_kills_at(kills: &'static [usize]) {
    let daemon = Arc::new(Mutex::new(Daemon::start()));
    let conf = daemon
        .lock()
        .expect("daemon")
        .conf("1.0.0", "crash", r#""subnet":"10.77.0.0/22""#);
    let done = Arc::new(AtomicUsize::new(0));
    let outcome = Arc::new(Mutex::new(Outcome::default()));

    let killer = {
        let (daemon, done) = (daemon.clone(), done.clone());
        std::thread::spawn(move || {
            for &kill_after in kills {
                while done.load(Ordering::SeqCst) < kill_after {
                    std::thread::sleep(Duration::from_micros(100));
                }
                let mut d = daemon.lock().expect("daemon");
                d.kill9();
                // Calls arriving now find no daemon and are retried.
                std::thread::sleep(Duration::from_millis(50));
                d.spawn();
            }
        })
    };
    let workers: Vec<_> = (0..WORKERS)
        .map(|w| {
            let (conf, done, outcome) = (conf.clone(), done.clone(), outcome.clone());
            std::thread::spawn(move || {
                for i in 0..PER_WORKER {
                    let c = format!("crash-{w}-{i}");
                    let (add, tries) = until_answered("ADD", &c, &conf);
                    assert!(add.ok, "ADD {c}: {}", add.stdout);
                    done.fetch_add(1, Ordering::SeqCst);
                    {
                        let mut o = outcome.lock().expect("outcome");
                        o.retried += usize::from(tries > 1);
                        o.live.insert(c.clone(), add.json.clone());
                    }
                    if i % 2 == 0 {
                        let (del, tries) = until_answered("DEL", &c, &conf);
                        assert!(del.ok, "DEL {c}: {}", del.stdout);
                        done.fetch_add(1, Ordering::SeqCst);
                        let mut o = outcome.lock().expect("outcome");
                        o.retried += usize::from(tries > 1);
                        o.live.remove(&c);
                        o.deleted.insert(c, add.addresses());
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
    killer.join().expect("killer");
    assert_eq!(done.load(Ordering::SeqCst), OPS);

    let daemon = daemon.lock().expect("daemon");
    let outcome = outcome.lock().expect("outcome");
    let ctx = format!("(kills after {kills:?} of {OPS} calls)\n{}", daemon.log());

    // 1. Every address a successful ADD returned is still held by that attachment.
    for (c, result) in &outcome.live {
        let check = cni("CHECK", c, &with_prev(&conf, result));
        assert!(
            check.ok,
            "CHECK {c} after the crash: {} {ctx}",
            check.stdout
        );
    }

    // 2. The daemon holds exactly the live attachments, with their addresses, none twice.
    let list = daemon.ctl(&["list", "-o", "json"]);
    assert!(list.status.success(), "ipoolctl list: {list:?}");
    let list: Value = serde_json::from_slice(&list.stdout).expect("list json");
    let mut held: HashMap<String, String> = HashMap::new();
    let mut attached: HashMap<String, Vec<String>> = HashMap::new();
    for a in list.as_array().expect("array") {
        let c = a["containerID"].as_str().expect("containerID").to_string();
        let ips: Vec<String> = a["addresses"]
            .as_array()
            .expect("addresses")
            .iter()
            .map(|ip| ip.as_str().expect("address").to_string())
            .collect();
        for ip in &ips {
            if let Some(other) = held.insert(ip.clone(), c.clone()) {
                panic!("{ip} is held by {other} and {c} {ctx}");
            }
        }
        attached.insert(c, ips);
    }
    let live: HashSet<&String> = outcome.live.keys().collect();
    let listed: HashSet<&String> = attached.keys().collect();
    assert_eq!(
        live, listed,
        "live attachments differ from what ADD/DEL said {ctx}"
    );
    for (c, result) in &outcome.live {
        let want: Vec<String> = result["ips"]
            .as_array()
            .expect("ips")
            .iter()
            .map(|ip| {
                let cidr = ip["address"].as_str().expect("address");
                cidr.split('/').next().expect("ip").to_string()
            })
            .collect();
        assert_eq!(attached[c], want, "{c} {ctx}");
    }

    // 3. Every address whose DEL succeeded is free or cooling: nobody holds it.
    for (c, ips) in &outcome.deleted {
        for cidr in ips {
            let ip = cidr.split('/').next().expect("ip");
            assert!(
                !held.contains_key(ip),
                "{ip}, released by {c}, is held by {} {ctx}",
                held[ip]
            );
        }
    }

    // 4. The counts add up.
    let status = daemon.ctl(&["status", "-o", "json"]);
    assert!(status.status.success(), "ipoolctl status: {status:?}");
    let status: Value = serde_json::from_slice(&status.stdout).expect("status json");
    let p = &status[0];
    let n = |k: &str| p[k].as_u64().unwrap_or_else(|| panic!("{k} in {p}"));
    assert_eq!(n("inUse"), outcome.live.len() as u64, "{p} {ctx}");
    assert_eq!(
        n("inUse") + n("idle") + n("reserved") + n("freeInSource"),
        RANGE_SIZE,
        "every address is in exactly one place: {p} {ctx}"
    );
    assert!(
        n("inUse") + n("idle") + n("reserved") <= n("capacity"),
        "{p}"
    );
    // Released addresses cool for 130 s: each released one is idle and cooling, none reused.
    assert_eq!(n("cooling"), outcome.deleted.len() as u64, "{p} {ctx}");
    assert_eq!(n("idle"), n("cooling"), "{p} {ctx}");
    eprintln!(
        "kills after {kills:?} of {OPS}: {} live, {} deleted, {} calls retried",
        outcome.live.len(),
        outcome.deleted.len(),
        outcome.retried
    );
}

#[test]
fn kill_9_under_concurrent_load_loses_and_duplicates_nothing() {
    // Kills early, in the middle and near the end, three per run, in three runs. Each kill
    // follows an acknowledged call by well under a millisecond: if replies went out before
    // their writes were durable, these are the moments that would show it.
    run_with_kills_at(&[OPS / 10, OPS * 4 / 10, OPS * 7 / 10]);
    run_with_kills_at(&[OPS / 4, OPS * 11 / 20, OPS * 9 / 10]);
    run_with_kills_at(&[OPS / 6, OPS / 2, OPS * 5 / 6]);
}
