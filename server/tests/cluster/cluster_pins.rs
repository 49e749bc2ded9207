//! Pins (the store part) on either store (the fake apiserver always; a real
//! etcd where installed): a pin is created only in a block that stands as named, once per
//! address and once per owner; taken over, released and deleted only on the write read;
//! `ipoolctl cluster pins` lists them, `unpin` refuses one a live node holds and ends one
//! nobody holds; release-node keeps a block a pin was made in and ends the node's holds.

use crate::common::backend::{with_datastore, with_datastore_as, Backend};
use ipnet::IpNet;
use ipool_server::cluster::ippool::{NotSetAside, PoolSpec};
use ipool_server::cluster::pin::{Holder, Pin, PinCreated, PinOwner};
use ipool_server::cluster::release::release_node_pinned;
use ipool_server::cluster::vocab::{Acquired, Alive, Block, Claimed};

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn web(ordinal: u32) -> PinOwner {
    PinOwner::StatefulSet {
        namespace: "db".into(),
        name: "web".into(),
        ordinal,
    }
}

fn holder(node: &str, pod: &str) -> Holder {
    Holder {
        node: node.into(),
        pod: format!("db/{pod}"),
        uid: format!("uid-{pod}"),
        since_ms: 1,
        instance: None,
    }
}

fn pins_on_the_store(store: Backend) {
    let (n1_block, n1_id) = with_datastore(&store, |s| async move {
        let spec = PoolSpec {
            name: "l2".into(),
            cidrs: vec![net("10.80.0.0/24")],
            block_v4: 26,
            block_v6: 122,
            ..PoolSpec::default()
        };
        s.create_pool(&spec).await.unwrap();
        let rev = s.get_pool("l2").await.unwrap().unwrap().revision;
        let b1 = match s
            .claim("l2", rev, &net("10.80.0.0/26"), "n1")
            .await
            .unwrap()
        {
            Claimed::Won(b) => b,
            other => panic!("{other:?}"),
        };
        let b2 = match s
            .claim("l2", rev, &net("10.80.0.64/26"), "n2")
            .await
            .unwrap()
        {
            Claimed::Won(b) => b,
            other => panic!("{other:?}"),
        };
        let pin = Pin {
            pool: "l2".into(),
            address: "10.80.0.5".parse().unwrap(),
            owner: web(0),
            block: b1.block,
            block_id: b1.revision.create,
            set_aside: false,
            holders: vec![holder("n1", "web-0")],
        };
        // A block named by another identity (given back and claimed anew): nothing pinned,
        // nothing left behind.
        let stale = Pin {
            block_id: b1.revision.create + 1,
            ..pin.clone()
        };
        assert_eq!(
            s.create_pin(&stale).await.unwrap(),
            PinCreated::BlockChanged
        );
        assert!(s.pins(None).await.unwrap().is_empty());
        let created = match s.create_pin(&pin).await.unwrap() {
            PinCreated::Created(r) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(created.pin, pin);
        // Once per address, once per owner.
        let other_owner = Pin {
            owner: web(1),
            ..pin.clone()
        };
        assert!(matches!(
            s.create_pin(&other_owner).await.unwrap(),
            PinCreated::AddressTaken(r) if r.pin == pin
        ));
        let second_address = Pin {
            address: "10.80.0.6".parse().unwrap(),
            ..pin.clone()
        };
        assert!(matches!(
            s.create_pin(&second_address).await.unwrap(),
            PinCreated::OwnerHas(r) if r.pin == pin
        ));
        assert_eq!(s.pins(None).await.unwrap().len(), 1);
        assert_eq!(s.pin_of(&web(0)).await.unwrap().unwrap(), created);
        assert_eq!(s.pin_of(&web(1)).await.unwrap(), None);
        assert_eq!(s.pins(Some("l2")).await.unwrap(), vec![created.clone()]);
        assert!(s.pins(Some("other")).await.unwrap().is_empty());
        // Released, then taken over on n2: each write conditioned on the one read.
        let released = Pin {
            holders: vec![],
            ..pin.clone()
        };
        let r1 = s.write_pin(&created, &released).await.unwrap().unwrap();
        let on_n2 = Pin {
            holders: vec![holder("n2", "web-0")],
            ..pin.clone()
        };
        assert_eq!(
            s.write_pin(&created, &on_n2).await.unwrap(),
            None,
            "a stale write applied"
        );
        let r2 = s.write_pin(&r1, &on_n2).await.unwrap().unwrap();
        assert_eq!(s.pin_of(&web(0)).await.unwrap().unwrap(), r2);
        // What a pin is never changes.
        let moved = Pin {
            address: "10.80.0.7".parse().unwrap(),
            ..on_n2.clone()
        };
        let e = s.write_pin(&r2, &moved).await.unwrap_err().to_string();
        assert!(e.contains("never change"), "{e}");
        // Deleted only as read; the owner may be pinned again after.
        assert!(!s.delete_pin(&r1).await.unwrap());
        assert!(s.delete_pin(&r2).await.unwrap());
        assert_eq!(s.pin_of(&web(0)).await.unwrap(), None);
        let again = match s.create_pin(&second_address).await.unwrap() {
            PinCreated::Created(r) => r,
            other => panic!("{other:?}"),
        };
        assert_eq!(s.pin_of(&web(0)).await.unwrap().unwrap(), again);
        // Held on n2 for the next steps; n2's block b2 has no pin.
        let held = Pin {
            holders: vec![holder("n2", "web-0")],
            ..second_address.clone()
        };
        s.write_pin(&again, &held).await.unwrap().unwrap();
        // n2's daemon runs (its heartbeat holds its name for a minute).
        let me = Alive {
            instance: "i2".into(),
            at_ms: 0,
            fence_secs: 10,
            ..Alive::default()
        };
        assert!(matches!(
            s.start_heartbeat("n2", &me, 60, 5).await.unwrap(),
            Acquired::Held(_)
        ));
        let _ = b2;
        (b1.block, b1.revision.create)
    });
    // ipoolctl lists it.
    let listed = store.ctl(&["pins"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success(), "{listed:?}");
    assert!(
        text.contains("10.80.0.6")
            && text.contains("StatefulSet/db/web/0")
            && text.contains("n2 (db/web-0)")
            && text.contains("10.80.0.0/26"),
        "{text}"
    );
    let json = store.ctl(&["--output", "json", "pins", "--pool", "l2"]);
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("json");
    assert_eq!(v[0]["address"], "10.80.0.6", "{v}");
    assert_eq!(v[0]["blockId"], n1_id, "{v}");
    // n2 holds it and was never heard of as gone: unpin refuses, naming the holder.
    let refused = store.ctl(&["unpin", "10.80.0.6"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(err.contains("held by node n2 for pod db/web-0"), "{err}");
    let missing = store.ctl(&["unpin", "10.80.0.99"]);
    assert_eq!(missing.status.code(), Some(3), "{missing:?}");
    let bad = store.ctl(&["unpin", "10.80.0"]);
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("10.80.0"),
        "{bad:?}"
    );
    // release-node n1 (no heartbeat ever: gone; on the apiserver, forced, no Lease proving
    // it) keeps the block the pin was made in; release-node n2 (forced: it runs) ends n2's
    // hold.
    let forced: &[&str] = match &store {
        Backend::Etcd(_) => &[],
        Backend::Kube { .. } => &["--force"],
    };
    let r = store.ctl(&[&["release-node", "n1"], forced].concat());
    let out = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{r:?}");
    assert!(
        out.contains(&format!("kept {n1_block} of pool l2")),
        "{out}"
    );
    assert!(
        store.owners().contains_key(&n1_block),
        "the pinned block was given back"
    );
    let r = store.ctl(&["release-node", "n2", "--force"]);
    let out = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{r:?}");
    assert!(out.contains("released its hold on pin 10.80.0.6"), "{out}");
    assert!(!store.owners().contains_key(&net("10.80.0.64/26")));
    // Nobody holds it now: unpin ends it.
    let u = store.ctl(&["unpin", "10.80.0.6"]);
    assert!(u.status.success(), "{u:?}");
    assert!(String::from_utf8_lossy(&u.stdout).contains("unpinned 10.80.0.6"));
    let listed = store.ctl(&["--output", "json", "pins"]);
    assert_eq!(String::from_utf8_lossy(&listed.stdout).trim(), "[]");
}

#[test]
fn pins_on_the_apiserver() {
    pins_on_the_store(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn pins_on_etcd() {
    pins_on_the_store(Backend::etcd());
}

/// Addresses a pool sets aside (its excluded ranges, `ipool.io/ips-by-ordinal`'s): pinned by
/// any node, conditioned on the pool as made; the pool is neither deleted nor loses the CIDR
/// holding them while one is pinned; a pool made anew under the name voids the pin.
fn set_aside_pins_on_the_store(store: Backend) {
    let api = store.api();
    with_datastore(&store, |s| async move {
        let spec = PoolSpec {
            name: "fx".into(),
            cidrs: vec![net("10.81.0.0/24"), net("10.82.0.0/24")],
            block_v4: 28,
            block_v6: 122,
            exclude: vec![net("10.81.0.240/28"), net("10.82.0.16/28")],
            ..PoolSpec::default()
        };
        s.create_pool(&spec).await.unwrap();
        let ip = |a: &str| a.parse::<std::net::IpAddr>().unwrap();
        let (range, id) = s
            .set_aside_site("fx", ip("10.81.0.241"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(range, net("10.81.0.240/28"));
        let why = |r: Result<(IpNet, i64), NotSetAside>| match r {
            Err(NotSetAside::Never(why)) => why,
            other => panic!("{other:?}"),
        };
        let e = why(s.set_aside_site("fx", ip("10.81.0.5")).await.unwrap());
        assert!(
            e.contains("not set aside") && e.contains("10.81.0.240/28"),
            "{e}"
        );
        let e = why(s.set_aside_site("fx", ip("10.81.0.255")).await.unwrap());
        assert!(e.contains("broadcast"), "{e}");
        let e = why(s.set_aside_site("fx", ip("10.83.0.1")).await.unwrap());
        assert!(e.contains("none of pool"), "{e}");
        let e = why(s.set_aside_site("nope", ip("10.81.0.241")).await.unwrap());
        assert!(e.contains("no cluster pool"), "{e}");

        let pin = Pin {
            pool: "fx".into(),
            address: ip("10.81.0.241"),
            owner: web(0),
            block: range,
            block_id: id,
            set_aside: true,
            holders: vec![holder("n1", "web-0")],
        };
        let wrong = Pin {
            address: ip("10.81.0.242"),
            owner: web(1),
            block_id: id + 1,
            ..pin.clone()
        };
        assert_eq!(
            s.create_pin(&wrong).await.unwrap(),
            PinCreated::BlockChanged
        );
        let read = match s.create_pin(&pin).await.unwrap() {
            PinCreated::Created(r) => r,
            other => panic!("{other:?}"),
        };
        assert!(s.pin_block_stands(&pin).await.unwrap());
        assert!(s.set_aside_pinnable(&pin).await.unwrap());
        if let Some(api) = api {
            // Marked Deleting (a deletion under way, or one whose listing of the pins came
            // before this pin's create): the pin stands, but is not served meanwhile.
            let mut obj = api.get("ippools", "", "fx").expect("the pool");
            obj["status"]["phase"] = "Deleting".into();
            api.put_custom("ippools", obj.clone());
            assert!(s.pin_block_stands(&pin).await.unwrap());
            assert!(!s.set_aside_pinnable(&pin).await.unwrap());
            let now = s.set_aside_site("fx", ip("10.81.0.242")).await.unwrap();
            assert!(matches!(now, Err(NotSetAside::NotNow(_))), "{now:?}");
            obj["status"]["phase"] = "Ready".into();
            api.put_custom("ippools", obj);
            assert!(s.set_aside_pinnable(&pin).await.unwrap());
        }
        // Neither the pool nor the CIDR holding the pin goes; the other CIDR may.
        let e = s.delete_pool("fx").await.unwrap_err().to_string();
        assert!(e.contains("sets aside") && e.contains("unpin"), "{e}");
        use ipool_server::cluster::ippool::PoolChange;
        let e = s
            .change_pool("fx", &PoolChange::RemoveCidr(net("10.81.0.0/24")))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("sets aside"), "{e}");
        s.change_pool("fx", &PoolChange::RemoveCidr(net("10.82.0.0/24")))
            .await
            .unwrap();
        assert!(s.pin_block_stands(&pin).await.unwrap());
        // Unpinned, the pool goes; made again, the old pin would count for nothing.
        assert!(s.delete_pin(&read).await.unwrap());
        s.delete_pool("fx").await.unwrap();
        assert!(!s.pin_block_stands(&pin).await.unwrap());
        s.create_pool(&spec).await.unwrap();
        assert!(!s.pin_block_stands(&pin).await.unwrap());
        let (_, again) = s
            .set_aside_site("fx", ip("10.81.0.241"))
            .await
            .unwrap()
            .unwrap();
        assert_ne!(again, id);
    });
}

#[test]
fn set_aside_pins_on_the_apiserver() {
    set_aside_pins_on_the_store(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn set_aside_pins_on_etcd() {
    set_aside_pins_on_the_store(Backend::etcd());
}

/// A node the store has no record of (no block, no heartbeat, no record: an etcd restored from
/// a backup older than the node, on which another node re-made a pin it had held) that still
/// holds a pin: release-node ends its hold, as the look of departed nodes advises, rather than
/// saying the node is unknown; the pin of an owner gone since then ends as any other.
fn a_holder_with_no_record_is_released(store: Backend) {
    let (pin, read) = with_datastore(&store, |s| async move {
        let spec = PoolSpec {
            name: "fy".into(),
            cidrs: vec![net("10.84.0.0/24")],
            block_v4: 28,
            exclude: vec![net("10.84.0.240/28")],
            ..PoolSpec::default()
        };
        s.create_pool(&spec).await.unwrap();
        let ip: std::net::IpAddr = "10.84.0.241".parse().unwrap();
        let (range, id) = s.set_aside_site("fy", ip).await.unwrap().unwrap();
        let pin = Pin {
            pool: "fy".into(),
            address: ip,
            owner: web(1),
            block: range,
            block_id: id,
            set_aside: true,
            holders: vec![holder("gone", "web-1")],
        };
        let PinCreated::Created(read) = s.create_pin(&pin).await.unwrap() else {
            panic!("pinned")
        };
        (pin, read)
    });
    let out = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let o = store.ctl(&["release-node", "gone", "--absent-for", "0"]);
    if store.api().is_some() {
        // The apiserver keeps no record of a node's absence but its Lease: none proves nothing,
        // so only --force releases it.
        assert!(!o.status.success(), "{}", out(&o));
        assert!(out(&o).contains("--force"), "{}", out(&o));
        let o = store.ctl(&["release-node", "gone", "--force"]);
        assert!(o.status.success(), "{}", out(&o));
    } else {
        assert!(o.status.success(), "{}", out(&o));
        assert!(out(&o).contains("10.84.0.241"), "{}", out(&o));
    }
    let now = with_datastore(&store, |s| async move { s.pins(Some("fy")).await.unwrap() });
    assert_eq!(now.len(), 1, "{now:?}");
    assert!(now[0].pin.holders.is_empty(), "{now:?}");
    assert_eq!(now[0].pin.address, pin.address);
    assert_ne!(now[0].version, read.version, "the hold's end is a write");
    // Released again: nothing left of it, and it says so.
    let o = store.ctl(&["release-node", "gone", "--absent-for", "0", "--force"]);
    assert!(!o.status.success(), "{}", out(&o));
    assert!(out(&o).contains("no block"), "{}", out(&o));
}

#[test]
fn a_holder_with_no_record_is_released_on_the_apiserver() {
    a_holder_with_no_record_is_released(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_holder_with_no_record_is_released_on_etcd() {
    a_holder_with_no_record_is_released(Backend::etcd());
}

/// release-node reads the pins before it has seen the node past its fence (on the Kubernetes
/// API it waits for that afterwards, watching the node's Lease): a pin made in one of the
/// node's blocks meanwhile, by the node cut off but still within its fence, keeps that block
/// the node's. (Found by the simulation, seed 35 000 007 899: the apiserver's clock stepped
/// ahead just after the node renewed its Lease, the block went back under the pin, and its
/// next owner handed the address out while another node's pod used it.) The release here is
/// given the pins as read before the pin was made.
fn a_block_pinned_after_the_release_read_the_pins_stays(store: Backend) {
    let (pinned, other) = with_datastore_as(&store, "ipoold", |s| async move {
        let spec = PoolSpec {
            name: "pr".into(),
            cidrs: vec![net("10.85.0.0/24")],
            block_v4: 28,
            ..PoolSpec::default()
        };
        s.create_pool(&spec).await.unwrap();
        let rev = s.get_pool("pr").await.unwrap().unwrap().revision;
        let mut won = Vec::new();
        for b in ["10.85.0.0/28", "10.85.0.16/28"] {
            match s.claim("pr", rev, &net(b), "n2").await.unwrap() {
                Claimed::Won(b) => won.push(b),
                other => panic!("{other:?}"),
            }
        }
        let me = Alive {
            instance: "n2-a".into(),
            fence_secs: 1,
            ..Alive::default()
        };
        assert!(matches!(
            s.start_heartbeat("n2", &me, 2, 1).await.unwrap(),
            Acquired::Held(_)
        ));
        (won[0].clone(), won[1].clone())
    });
    // Away longer than its Lease and its fence with a renewal's slack (1 + 1 + 1 s).
    std::thread::sleep(std::time::Duration::from_secs(5));
    let (released, left) = with_datastore(&store, |s| async move {
        let pin = Pin {
            pool: "pr".into(),
            address: "10.85.0.3".parse().unwrap(),
            owner: web(3),
            block: pinned.block,
            block_id: pinned.revision.create,
            set_aside: false,
            holders: vec![holder("n1", "web-3")],
        };
        assert!(matches!(
            s.create_pin(&pin).await.unwrap(),
            PinCreated::Created(_)
        ));
        let released = release_node_pinned(&*s, "the store", "n2", 0, false, Some(Vec::new()))
            .await
            .unwrap();
        let left = s.blocks_of_node("n2").await.unwrap().blocks;
        (released, left)
    });
    let nets = |bs: &[Block]| bs.iter().map(|b| b.block).collect::<Vec<_>>();
    assert_eq!(nets(&released.blocks), vec![other.block], "{released:?}");
    assert_eq!(
        nets(&left),
        vec![pinned.block],
        "the pinned block stays n2's"
    );
}

#[test]
fn a_block_pinned_after_the_release_read_the_pins_stays_on_the_apiserver() {
    a_block_pinned_after_the_release_read_the_pins_stays(Backend::kube());
}

#[test]
#[ignore = "needs etcd-server (apt-get install etcd-server); CI runs it with --include-ignored"]
fn a_block_pinned_after_the_release_read_the_pins_stays_on_etcd() {
    a_block_pinned_after_the_release_read_the_pins_stays(Backend::etcd());
}
