//! Cluster mode on the Kubernetes API under faults, with the real daemon and plugin: the
//! apiserver down and back, and a daemon killed (-9) while it claims blocks.

use std::collections::BTreeSet;
use std::net::IpAddr;

use crate::common::backend::Backend;
use crate::common::*;

fn addr(r: &Run) -> IpAddr {
    r.addresses()[0].split('/').next().unwrap().parse().unwrap()
}

const TUNING: &str = "heartbeat_ttl_secs = 6\nresync_secs = 2\nclaim_ahead = 1\n";

#[test]
fn with_the_apiserver_down_a_node_serves_its_blocks_and_claims_again_once_it_is_back() {
    let store = Backend::kube();
    // /28 blocks: 13 addresses each (network, gateway, broadcast aside).
    store.create_pool(&["p", "--cidr", "10.50.0.0/24", "--block-size", "28"]);
    let mut d = Daemon::prepare_with_config(&store.daemon_config("n1", "p", TUNING, &store.addr()));
    d.spawn();
    let conf = d.conf("1.0.0", "pods", "");
    let first = add_within(20, "the first ADD", "c0", &conf);
    let mut held = BTreeSet::from([addr(&first)]);
    let blocks_before = store.owners().len();

    store.stop();
    // What the owned blocks hold is handed out; past it, ADDs fail with "try again later".
    let mut failed = None;
    for k in 1..40 {
        let r = cni("ADD", &format!("down-{k}"), &conf);
        if !r.ok {
            failed = Some(r);
            break;
        }
        assert!(held.insert(addr(&r)), "{} twice", addr(&r));
    }
    let failed = failed.expect("the owned blocks run out while the apiserver is down");
    assert_eq!(failed.code(), 11, "{failed:?}");
    eventually(10, "status saying degraded", || {
        let s = pool_status(&d);
        match s[0]["degraded"]
            .as_str()
            .unwrap_or_default()
            .contains("the Kubernetes API unreachable")
        {
            true => Ok(()),
            false => Err(s),
        }
    });

    store.start();
    for k in 0..20 {
        let r = add_within(
            30,
            "ADDs once the apiserver is back",
            &format!("up-{k}"),
            &conf,
        );
        assert!(held.insert(addr(&r)), "{} twice", addr(&r));
    }
    assert!(store.owners().len() > blocks_before, "claimed again");
    for (block, owner) in store.owners() {
        assert_eq!(owner, "n1", "{block}");
    }
    for a in &held {
        assert!(
            store.owners().keys().any(|b| b.contains(a)),
            "{a} is in no block of n1"
        );
    }
}

#[test]
fn a_daemon_killed_while_it_claims_comes_back_to_its_blocks_and_hands_out_nothing_twice() {
    let store = Backend::kube();
    store.create_pool(&["p", "--cidr", "10.51.0.0/24", "--block-size", "28"]);
    let mut d = Daemon::prepare_with_config(&store.daemon_config("n1", "p", TUNING, &store.addr()));
    d.spawn();
    let conf = d.conf("1.0.0", "pods", "");
    add_within(20, "the first ADD", "c0", &conf);
    let mut acked: Vec<(String, IpAddr)> = Vec::new();
    for round in 0..4 {
        // ADDs from 3 threads (each one that needs a block makes the daemon claim), a kill -9
        // in the middle of them.
        let results: Vec<(String, Run)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3)
                .map(|t| {
                    let conf = &conf;
                    s.spawn(move || {
                        (0..6)
                            .map(|k| {
                                let c = format!("r{round}-t{t}-{k}");
                                let r = cni("ADD", &c, conf);
                                (c, r)
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_millis(40 + 30 * round));
            d.kill9();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("thread"))
                .collect()
        });
        acked.extend(
            results
                .iter()
                .filter(|(_, r)| r.ok)
                .map(|(c, r)| (c.clone(), addr(r))),
        );
        d.spawn();
        add_within(
            30,
            "an ADD after the restart",
            &format!("after-{round}"),
            &conf,
        );
    }
    // Every acknowledged ADD is still held, each address once, each in a block of n1.
    let o = d.ctl(&["-o", "json", "list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let listed: Vec<(String, IpAddr)> = json(&o)
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["containerID"].as_str().unwrap().to_string(),
                a["addresses"][0]
                    .as_str()
                    .unwrap()
                    .split('/')
                    .next()
                    .unwrap()
                    .parse()
                    .unwrap(),
            )
        })
        .collect();
    let mut seen = BTreeSet::new();
    for (c, a) in &listed {
        assert!(seen.insert(*a), "{a} held twice: {listed:?}");
        let _ = c;
    }
    for (c, a) in &acked {
        assert!(
            listed.contains(&(c.clone(), *a)),
            "acknowledged {c} {a} is gone: {listed:?}\n{}",
            d.log()
        );
    }
    eventually(20, "every held address in a block of n1", || {
        let owners = store.owners();
        let stray: Vec<_> = listed
            .iter()
            .filter(|(_, a)| !owners.iter().any(|(b, n)| b.contains(a) && n == "n1"))
            .collect();
        match stray.is_empty() {
            true => Ok(()),
            false => Err(format!("{stray:?} in no block of n1: {owners:?}")),
        }
    });
}

#[test]
fn a_node_cut_off_from_the_apiserver_past_its_fence_hands_out_nothing_new() {
    let store = Backend::kube();
    store.create_pool(&["p", "--cidr", "10.52.0.0/24", "--block-size", "26"]);
    let tuning = "heartbeat_ttl_secs = 6\nfence_secs = 2\nclaim_ahead = 1\n";
    let mut d = Daemon::prepare_with_config(&store.daemon_config("n1", "p", tuning, &store.addr()));
    d.spawn();
    let conf = d.conf("1.0.0", "pods", "");
    add_within(20, "the first ADD", "c0", &conf);
    store.stop();
    // Its block has 60 more addresses, but past the fence none is handed out.
    std::thread::sleep(std::time::Duration::from_secs(4));
    let r = cni("ADD", "fenced", &conf);
    assert_eq!(r.code(), 11, "{r:?}");
    assert!(r.stdout.contains("fenced"), "{r:?}");
    store.start();
    add_within(30, "an ADD once it renewed", "after", &conf);
}
