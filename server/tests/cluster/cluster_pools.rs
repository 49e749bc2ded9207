//! Pools an operator changes while they run, on either store (the fake
//! apiserver always; a real etcd where installed): a CIDR added while a node serves, one
//! removed only once no block of it is owned, a pool disabled with blocks in use; and, at the
//! store, a claim decided on the pool as it was read never landing outside its CIDRs as they
//! are after the change.

use std::time::{Duration, Instant};

use crate::common::backend::{with_datastore, Backend};
use crate::common::*;
use ipnet::IpNet;
use ipool_server::cluster::ippool::{PoolChange, PoolSpec};
use ipool_server::cluster::vocab::{Claimed, ClusterError};

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn refused(r: Result<PoolSpec, ClusterError>, needle: &str) {
    match r {
        Err(ClusterError::Refused(why)) => assert!(why.contains(needle), "{why}"),
        other => panic!("expected a refusal saying {needle:?}, got {other:?}"),
    }
}

/// Whatever a claim decided on the pool before a change got, no block stands outside the
/// pool's CIDRs as they are after it.
fn claims_decided_before_a_change_stay_inside(store: Backend) {
    with_datastore(&store, |s| async move {
        let spec = PoolSpec {
            name: "p".into(),
            cidrs: vec![net("10.70.0.0/24"), net("10.71.0.0/24")],
            block_v4: 26,
            block_v6: 122,
            ..PoolSpec::default()
        };
        s.create_pool(&spec).await.unwrap();
        let read = s.get_pool("p").await.unwrap().unwrap().revision;
        let won = match s
            .claim("p", read, &net("10.71.0.0/26"), "n1")
            .await
            .unwrap()
        {
            Claimed::Won(b) => b,
            other => panic!("{other:?}"),
        };
        // Owned: the CIDR stays, and the refusal names the node.
        let r = s
            .change_pool("p", &PoolChange::RemoveCidr(net("10.71.0.0/24")))
            .await;
        refused(r, "owned by node \"n1\"");
        assert!(s.give_back(&won).await.unwrap());
        // Read before the removal; claimed after it.
        let read = s.get_pool("p").await.unwrap().unwrap().revision;
        let now = s
            .change_pool("p", &PoolChange::RemoveCidr(net("10.71.0.0/24")))
            .await
            .unwrap();
        assert_eq!(now.cidrs, vec![net("10.70.0.0/24")]);
        let late = s
            .claim("p", read, &net("10.71.0.64/26"), "n1")
            .await
            .unwrap();
        assert!(
            !matches!(late, Claimed::Won(_) | Claimed::Mine(_)),
            "a claim in a removed CIDR: {late:?}"
        );
        // Grown: a claim decided on the pool before it lands only where the pool is now.
        let read = s.get_pool("p").await.unwrap().unwrap().revision;
        s.change_pool("p", &PoolChange::AddCidr(net("10.72.0.0/24")))
            .await
            .unwrap();
        for b in ["10.72.0.0/26", "10.71.0.128/26", "10.70.0.0/26"] {
            let _ = s.claim("p", read, &net(b), "n2").await.unwrap();
        }
        let pool = s.get_pool("p").await.unwrap().unwrap().spec;
        assert_eq!(pool.cidrs.len(), 2);
        let listed = s.list_blocks(Some("p"), None).await.unwrap();
        for b in &listed.blocks {
            assert!(
                pool.claimable(&b.block),
                "block {} stands outside pool p's CIDRs {:?}",
                b.block,
                pool.cidrs
            );
        }
        // Overlaps, within the pool and with another pool, are refused as at creation.
        refused(
            s.change_pool("p", &PoolChange::AddCidr(net("10.70.0.0/25")))
                .await,
            "overlap",
        );
        let q = PoolSpec {
            name: "q".into(),
            cidrs: vec![net("10.80.0.0/24")],
            ..spec.clone()
        };
        s.create_pool(&q).await.unwrap();
        refused(
            s.change_pool("p", &PoolChange::AddCidr(net("10.80.0.0/25")))
                .await,
            "overlaps 10.80.0.0/24 of pool \"q\"",
        );
        refused(
            s.change_pool("p", &PoolChange::RemoveCidr(net("10.99.0.0/24")))
                .await,
            "has no CIDR",
        );
        match s.change_pool("nope", &PoolChange::Disable).await {
            Err(ClusterError::NotFound(_)) => {}
            other => panic!("{other:?}"),
        }
        let off = s.change_pool("p", &PoolChange::Disable).await.unwrap();
        assert!(off.disabled);
        assert!(s.get_pool("p").await.unwrap().unwrap().spec.disabled);
        s.change_pool("p", &PoolChange::Enable).await.unwrap();
        assert!(!s.get_pool("p").await.unwrap().unwrap().spec.disabled);
    });
}

#[test]
fn claims_decided_before_a_change_stay_inside_on_the_kubernetes_api() {
    claims_decided_before_a_change_stay_inside(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn claims_decided_before_a_change_stay_inside_on_etcd() {
    claims_decided_before_a_change_stay_inside(Backend::etcd());
}

/// Two pools grown at once by overlapping CIDRs, and a pool created over one of them
/// meanwhile: never two of them hold one range, however the writes interleave.
fn overlapping_changes_at_once_never_both_land(store: Backend) {
    with_datastore(&store, |s| async move {
        let pool = |name: &str, cidr: &str| PoolSpec {
            name: name.into(),
            cidrs: vec![net(cidr)],
            block_v4: 26,
            block_v6: 122,
            ..PoolSpec::default()
        };
        s.create_pool(&pool("a", "10.90.0.0/24")).await.unwrap();
        s.create_pool(&pool("b", "10.91.0.0/24")).await.unwrap();
        for round in 0..12u8 {
            let (x, y) = (
                net(&format!("10.92.{round}.0/24")),
                net(&format!("10.92.{round}.128/25")),
            );
            let third = pool(&format!("c{round}"), &format!("10.92.{round}.0/26"));
            let (grow_a, grow_b) = (PoolChange::AddCidr(x), PoolChange::AddCidr(y));
            let (ra, rb, rc) = tokio::join!(
                s.change_pool("a", &grow_a),
                s.change_pool("b", &grow_b),
                s.create_pool(&third),
            );
            // x overlaps y and the third pool's CIDR (those two do not overlap each other).
            assert!(
                !(ra.is_ok() && (rb.is_ok() || rc.is_ok())),
                "round {round}: overlapping ranges both landed: {ra:?} {rb:?} {rc:?}"
            );
            // Whatever was refused left no mark behind.
            for p in s.pools().await.unwrap().pools {
                assert!(
                    p.spec.adding.is_empty() && p.spec.removing.is_empty(),
                    "round {round}: {:?}",
                    p.spec
                );
            }
        }
    });
}

#[test]
fn overlapping_changes_at_once_never_both_land_on_the_kubernetes_api() {
    overlapping_changes_at_once_never_both_land(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn overlapping_changes_at_once_never_both_land_on_etcd() {
    overlapping_changes_at_once_never_both_land(Backend::etcd());
}

fn ok(o: &std::process::Output, what: &str) {
    assert!(o.status.success(), "{what}: {}", stderr(o));
}

fn pool_json(store: &Backend) -> serde_json::Value {
    let o = store.ctl(&["-o", "json", "pool", "list"]);
    ok(&o, "pool list");
    json(&o)
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "p")
        .cloned()
        .expect("pool p listed")
}

/// Waits up to `secs` for `cond`, saying `what` when it does not come.
fn until(secs: u64, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < Duration::from_secs(secs), "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A node serving a small pool until it is full; grown by a CIDR while it runs, it serves
/// from the new one; that CIDR is not removed while the node owns a block of it; disabled, the
/// pool keeps what is in use, gives back its empty blocks, claims nothing more; then the CIDR
/// goes.
fn a_pool_grows_and_retires_under_a_serving_node(store: Backend) {
    // Two blocks of /30, one address each to hand out (network, gateway, broadcast are not).
    store.create_pool(&["p", "--cidr", "10.75.0.0/29", "--block-size", "30"]);
    let tuning = "heartbeat_ttl_secs = 6\nclaim_ahead = 1\nblock_hold_down_secs = 1\n";
    let mut d = Daemon::prepare_with_config(&store.daemon_config("n1", "p", tuning, &store.addr()));
    d.spawn();
    let conf = d.conf("1.0.0", "pods", "");
    let first: Vec<Run> = (0..2)
        .map(|i| add_within(20, "an ADD in the first CIDR", &format!("c{i}"), &conf))
        .collect();
    for r in &first {
        assert!(r.addresses()[0].starts_with("10.75.0."), "{:?}", r.json);
    }
    let full = cni("ADD", "c2", &conf);
    assert!(!full.ok, "the pool is full: {:?}", full.json);

    let o = store.ctl(&["pool", "add-cidr", "p", "10.75.1.0/29"]);
    ok(&o, "add-cidr");
    assert!(String::from_utf8_lossy(&o.stdout).contains("add CIDR 10.75.1.0/29 done"));
    let grown = add_within(20, "an ADD once the pool grew", "c2", &conf);
    assert!(
        grown.addresses()[0].starts_with("10.75.1."),
        "{:?}\n{}",
        grown.json,
        d.log()
    );
    let p = pool_json(&store);
    assert_eq!(p["cidrs"].as_array().unwrap().len(), 2, "{p}");
    let owned = p["blocksOwned"].as_u64().unwrap();
    assert!(owned >= 3, "{p}");
    assert_eq!(p["freeAddresses"], ((4 - owned) * 4).to_string(), "{p}");
    assert_eq!(
        (p["blocks"].as_u64(), p["blocksFree"].as_u64()),
        (Some(4), Some(4 - owned)),
        "{p}"
    );

    let o = store.ctl(&["pool", "remove-cidr", "p", "10.75.1.0/29"]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("owned by node \"n1\""),
        "{}",
        stderr(&o)
    );

    ok(&store.ctl(&["pool", "disable", "p"]), "disable");
    assert_eq!(pool_json(&store)["disabled"], true);
    // What is in use stays; the blocks emptied go back after the hold-down, the last of the
    // pool's though they are.
    let check = cni("CHECK", "c0", &with_prev(&conf, &first[0].json));
    assert!(check.ok, "c0 keeps its address: {:?}", check.json);
    assert!(cni("DEL", "c2", &conf).ok);
    until(
        20,
        "the emptied blocks of a disabled pool given back",
        || {
            !store
                .owners()
                .keys()
                .any(|b| net("10.75.1.0/29").contains(b))
        },
    );
    let refused = cni("ADD", "c3", &conf);
    assert!(!refused.ok, "{:?}", refused.json);
    let msg = refused.json.to_string();
    assert!(
        msg.contains("disabled"),
        "the error says the pool is disabled: {msg}"
    );
    ok(
        &store.ctl(&["pool", "remove-cidr", "p", "10.75.1.0/29"]),
        "remove-cidr once given back",
    );
    let p = pool_json(&store);
    assert_eq!(p["cidrs"], serde_json::json!(["10.75.0.0/29"]), "{p}");
    ok(&store.ctl(&["pool", "enable", "p"]), "enable");
    assert_eq!(pool_json(&store)["disabled"], false);
    let check = cni("CHECK", "c1", &with_prev(&conf, &first[1].json));
    assert!(check.ok, "c1 keeps its address: {:?}", check.json);
}

#[test]
fn a_pool_grows_and_retires_under_a_serving_node_on_the_kubernetes_api() {
    a_pool_grows_and_retires_under_a_serving_node(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_pool_grows_and_retires_under_a_serving_node_on_etcd() {
    a_pool_grows_and_retires_under_a_serving_node(Backend::etcd());
}

/// A family added to a running cluster: a single-stack pool gains an IPv6
/// CIDR while its node serves; new pods get both families, the running ones keep the one they
/// have (CHECK, a retried ADD, DEL), and so after a restart of the daemon. The new family's
/// block size is given with its first CIDR (`add-cidr --block-size`), and fixed from then on.
fn a_family_is_added_under_a_serving_node(store: Backend) {
    store.create_pool(&["p", "--cidr", "10.76.0.0/27", "--block-size", "28"]);
    let tuning = "heartbeat_ttl_secs = 6\nblock_hold_down_secs = 1\n";
    let mut d = Daemon::prepare_with_config(&store.daemon_config("n1", "p", tuning, &store.addr()));
    d.spawn();
    let conf = d.conf("1.0.0", "pods", "");
    let old: Vec<Run> = (0..2)
        .map(|i| add_within(20, "an IPv4 ADD", &format!("c{i}"), &conf))
        .collect();
    for r in &old {
        assert_eq!(r.addresses().len(), 1, "{:?}", r.json);
    }
    ok(
        &store.ctl(&[
            "pool",
            "add-cidr",
            "p",
            "fd00:76::/120",
            "--block-size",
            "124",
        ]),
        "add-cidr",
    );
    // Set with the family's first CIDR, the size stays.
    let other = store.ctl(&[
        "pool",
        "add-cidr",
        "p",
        "fd00:77::/120",
        "--block-size",
        "126",
    ]);
    assert!(!other.status.success(), "another IPv6 block size");
    let said = String::from_utf8_lossy(&other.stderr).to_string();
    assert!(said.contains("IPv6 blocks are /124"), "{said}");
    // Once the node has heard of it, an ADD gets an address of each family.
    let both = add_until_both_families(&d, &conf);
    assert!(
        both.addresses()[0].starts_with("10.76.0."),
        "{:?}",
        both.json
    );
    assert!(
        both.addresses()[1].starts_with("fd00:76::"),
        "{:?}",
        both.json
    );
    assert_eq!(
        block_of(&store, &both.addresses()[1]).prefix_len(),
        124,
        "claimed at the size add-cidr gave"
    );
    let kept = |d: &Daemon, i: usize| {
        let check = cni("CHECK", &format!("c{i}"), &with_prev(&conf, &old[i].json));
        assert!(
            check.ok,
            "c{i} keeps its one address: {:?}\n{}",
            check.json,
            d.log()
        );
        let again = cni("ADD", &format!("c{i}"), &conf);
        assert_eq!(
            again.addresses(),
            old[i].addresses(),
            "a retried ADD of c{i}"
        );
    };
    kept(&d, 0);
    kept(&d, 1);
    assert!(cni("DEL", "c0", &conf).ok);
    d.terminate();
    d.spawn();
    kept(&d, 1);
    let after = add_within(20, "an ADD after the restart", "after", &conf);
    assert_eq!(after.addresses().len(), 2, "{:?}", after.json);
    // The node's blocks: one of each family at least.
    let owners = store.owners();
    assert!(owners.keys().any(|b| b.addr().is_ipv4()), "{owners:?}");
    assert!(owners.keys().any(|b| b.addr().is_ipv6()), "{owners:?}");
}

#[test]
fn a_family_is_added_under_a_serving_node_on_the_kubernetes_api() {
    a_family_is_added_under_a_serving_node(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_family_is_added_under_a_serving_node_on_etcd() {
    a_family_is_added_under_a_serving_node(Backend::etcd());
}

/// The block `ip` lies in, as the store lists it.
fn block_of(store: &Backend, ip: &str) -> IpNet {
    let ip: std::net::IpAddr = ip.split('/').next().unwrap().parse().unwrap();
    store
        .owners()
        .into_keys()
        .find(|b| b.contains(&ip))
        .expect("the block listed")
}

/// A range reserved at runtime: the address in use in it stays with its pod; no ADD gets one
/// of it, not even once that address is released; a block of nothing else is still the
/// pool's; unreserved, it serves again.
fn reserved_addresses_are_never_handed_out(store: Backend) {
    // Two blocks of /28, 13 addresses each to hand out.
    store.create_pool(&["p", "--cidr", "10.76.0.0/27", "--block-size", "28"]);
    let tuning = "heartbeat_ttl_secs = 6\nclaim_ahead = 1\n";
    let mut d = Daemon::prepare_with_config(&store.daemon_config("n1", "p", tuning, &store.addr()));
    d.spawn();
    let conf = d.conf("1.0.0", "pods", "");
    let first = add_within(20, "the first ADD", "c0", &conf);
    let a0 = first.addresses()[0].split('/').next().unwrap().to_string();
    let b = block_of(&store, &a0);
    let o = store.ctl(&[
        "reserve",
        "p",
        &b.to_string(),
        "--reason",
        "the load balancer",
    ]);
    ok(&o, "reserve");
    let said = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(said.contains(&format!("{b} (node n1)")), "{said}");
    let o = store.ctl(&["-o", "json", "reservations"]);
    ok(&o, "reservations");
    let listed = json(&o);
    assert_eq!(listed[0]["cidr"], b.to_string(), "{listed}");
    assert_eq!(listed[0]["reason"], "the load balancer", "{listed}");
    // The node reports the address in use in it once it has read the reservation.
    until(20, "the node reports the reserved address it holds", || {
        d.log().contains("a reserved address is held here") && d.log().contains(&a0)
    });
    let mut handed = Vec::new();
    for i in 1..13 {
        let r = add_within(20, "an ADD beside the reservation", &format!("c{i}"), &conf);
        handed.push(r.addresses()[0].clone());
    }
    assert!(cni("DEL", "c0", &conf).ok);
    let r = add_within(20, "the last unreserved address", "c13", &conf);
    handed.push(r.addresses()[0].clone());
    for a in &handed {
        let ip: std::net::IpAddr = a.split('/').next().unwrap().parse().unwrap();
        assert!(!b.contains(&ip), "{a} of the reserved {b} handed out");
    }
    // Nothing left but what is reserved: refused, not waited on for ever.
    let full = cni("ADD", "c14", &conf);
    assert!(!full.ok, "{:?}", full.json);
    // A reserved address asked for by name is refused too.
    let asked = cni_with_args("ADD", "c15", &format!("IP={a0}"), &conf);
    assert!(!asked.ok, "{:?}", asked.json);
    assert!(
        asked.json.to_string().contains("reserved"),
        "{:?}",
        asked.json
    );
    // A block holding nothing but reserved addresses is still the pool's, and the node's.
    assert_eq!(store.owners().get(&b).map(String::as_str), Some("n1"));
    ok(&store.ctl(&["unreserve", "p", &b.to_string()]), "unreserve");
    let r = add_within(20, "an ADD once unreserved", "c14", &conf);
    let ip: std::net::IpAddr = r.addresses()[0].split('/').next().unwrap().parse().unwrap();
    assert!(b.contains(&ip), "{:?}", r.json);
    let o = store.ctl(&["unreserve", "p", &b.to_string()]);
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("no reservation"), "{}", stderr(&o));
}

#[test]
fn reserved_addresses_are_never_handed_out_on_the_kubernetes_api() {
    reserved_addresses_are_never_handed_out(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn reserved_addresses_are_never_handed_out_on_etcd() {
    reserved_addresses_are_never_handed_out(Backend::etcd());
}

/// On the Kubernetes API, a CIDR change stopped in the middle (its mark written, the answer
/// lost) leaves the CIDR on its way in, claimable by no one; backing it out with a removal
/// whose check fails leaves it so (never a CIDR of the pool whose overlap check did not
/// pass), and nothing is reserved in it meanwhile.
#[test]
fn a_cidr_change_stopped_in_the_middle_never_makes_an_unchecked_cidr_claimable() {
    let store = Backend::kube();
    let api = store.api().expect("the fake apiserver");
    store.create_pool(&["a", "--cidr", "10.93.0.0/24"]);
    api.lose_answer("PUT /apis/ipool.io/v1/ippools/a");
    with_datastore(&store, |s| async move {
        let x = net("10.93.1.0/24");
        assert!(s.change_pool("a", &PoolChange::AddCidr(x)).await.is_err());
        let p = s.get_pool("a").await.unwrap().unwrap().spec;
        assert_eq!(p.adding, vec![x], "{p:?}");
        assert!(!p.claimable(&net("10.93.1.0/26")));
        let r = s
            .change_pool(
                "a",
                &PoolChange::Reserve(ipool_server::cluster::ippool::Reserved {
                    cidr: net("10.93.1.5/32"),
                    reason: String::new(),
                }),
            )
            .await;
        refused(r, "still being added");
    });
    api.fail_matching("GET /apis/ipool.io/v1/ipblocks?", 500);
    with_datastore(&store, |s| async move {
        let x = net("10.93.1.0/24");
        assert!(s
            .change_pool("a", &PoolChange::RemoveCidr(x))
            .await
            .is_err());
        let p = s.get_pool("a").await.unwrap().unwrap().spec;
        assert!(
            !p.cidrs.contains(&x) || p.adding.contains(&x),
            "an unchecked CIDR became the pool's: {p:?}"
        );
        // The removal again, the store answering: gone.
        let p = s
            .change_pool("a", &PoolChange::RemoveCidr(x))
            .await
            .unwrap();
        assert_eq!(p.cidrs, vec![net("10.93.0.0/24")]);
        assert!(p.adding.is_empty() && p.removing.is_empty(), "{p:?}");
    });
}

/// On the Kubernetes API a claim can land in a CIDR as it is removed and its give-back never
/// come (its daemon killed): that block, outside its pool's CIDRs, is never served, and its
/// node gives it back once nothing holds it (else it would stand there for ever, and every
/// pool that grows into that CIDR would be refused).
#[test]
fn a_block_left_outside_its_pools_cidrs_is_given_back_by_its_node() {
    let store = Backend::kube();
    let api = store.api().expect("the fake apiserver");
    store.create_pool(&["p", "--cidr", "10.94.0.0/24", "--cidr", "10.94.1.0/24"]);
    let stray = net("10.94.1.64/26");
    let obj = with_datastore(&store, |s| async move {
        let read = s.get_pool("p").await.unwrap().unwrap().revision;
        let won = match s.claim("p", read, &stray, "n1").await.unwrap() {
            Claimed::Won(b) => b,
            other => panic!("{other:?}"),
        };
        let obj = api.get("ipblocks", "", "10-94-1-64-26").expect("the block");
        assert!(s.give_back(&won).await.unwrap());
        s.change_pool("p", &PoolChange::RemoveCidr(net("10.94.1.0/24")))
            .await
            .unwrap();
        obj
    });
    // What the late create leaves behind.
    let mut obj = obj;
    obj["metadata"]
        .as_object_mut()
        .unwrap()
        .retain(|k, _| k == "name" || k == "labels");
    api.put_custom("ipblocks", obj);
    assert_eq!(store.owners().get(&stray).map(String::as_str), Some("n1"));
    let tuning = "heartbeat_ttl_secs = 6\nclaim_ahead = 1\nresync_secs = 1\n";
    let mut d = Daemon::prepare_with_config(&store.daemon_config("n1", "p", tuning, &store.addr()));
    d.spawn();
    let conf = d.conf("1.0.0", "pods", "");
    let r = add_within(20, "an ADD", "c0", &conf);
    assert!(r.addresses()[0].starts_with("10.94.0."), "{:?}", r.json);
    until(20, "the block outside the pool's CIDRs given back", || {
        !store.owners().contains_key(&stray)
    });
    ok(
        &store.ctl(&["pool", "add-cidr", "p", "10.94.1.0/24"]),
        "the CIDR added again",
    );
}
