use super::*;
use ipool_server::cluster::pin::{Holder, PinOwner};

fn net(s: &str) -> IpNet {
    s.parse().expect("a CIDR")
}

fn settled() -> Picture {
    Picture {
        blocks: vec![(net("10.70.0.0/28"), "n0".into(), "p".into())],
        serving: BTreeMap::from([
            ("n0".into(), BTreeSet::from([net("10.70.0.0/28")])),
            ("n1".into(), BTreeSet::new()),
        ]),
        held: vec![("n0".into(), "c1".into(), vec!["10.70.0.1".parse().unwrap()])],
        pods: BTreeSet::from(["c1".to_string()]),
        ..Picture::default()
    }
}

#[test]
fn a_settled_cluster_keeps_every_rule() {
    let p = settled();
    stranded(&p).expect("nothing stranded");
    pins_of_gone_owners(&p).expect("no pin");
    void_pins_kept(&p).expect("no void pin");
    stuck_deleting(&p).expect("no deletion");
    idle_writes(&[], 20_000).expect("nothing written");
    add_refused("n0", "exhausted", None).expect("no room, refused rightly");
}

#[test]
fn a_block_of_a_gone_node_is_stranded() {
    let mut p = settled();
    p.serving.remove("n0");
    p.held.clear();
    let e = stranded(&p).expect_err("n0 is gone");
    assert!(e.starts_with("L2:") && e.contains("10.70.0.0/28"), "{e}");
}

#[test]
fn a_block_of_a_gone_node_kept_by_a_pin_of_a_live_owner_is_not_stranded() {
    let mut p = settled();
    p.serving.remove("n0");
    p.held.clear();
    p.pins.push((pin(), None));
    stranded(&p).expect("kept for the owner's next pod");
    p.pins[0].1 = Some("StatefulSet sim/db is deleted".into());
    let e = stranded(&p).expect_err("its owner is gone");
    assert!(e.starts_with("L2:"), "{e}");
}

#[test]
fn a_block_its_live_node_does_not_serve_is_stranded() {
    let mut p = settled();
    p.blocks
        .push((net("10.70.0.16/28"), "n1".into(), "p".into()));
    let e = stranded(&p).expect_err("n1 serves nothing");
    assert!(e.starts_with("L1:") && e.contains("10.70.0.16/28"), "{e}");
}

#[test]
fn a_block_its_node_holds_pods_in_is_not_stranded() {
    let mut p = settled();
    p.serving.insert("n0".into(), BTreeSet::new());
    stranded(&p).expect("c1 runs there: the block goes back once it is gone");
    p.held.clear();
    p.pods.clear();
    let e = stranded(&p).expect_err("nothing holds it");
    assert!(e.starts_with("L1:"), "{e}");
}

#[test]
fn an_address_held_for_a_pod_that_does_not_run_is_stranded() {
    let mut p = settled();
    p.pods.clear();
    let e = stranded(&p).expect_err("c1 does not run");
    assert!(e.starts_with("L1:") && e.contains("c1"), "{e}");
}

fn pin() -> Pin {
    Pin {
        pool: "p".into(),
        address: "10.70.0.5".parse().unwrap(),
        owner: PinOwner::StatefulSet {
            namespace: "sim".into(),
            name: "db".into(),
            ordinal: 0,
        },
        block: net("10.70.0.0/28"),
        block_id: 1,
        set_aside: false,
        holders: Vec::<Holder>::new(),
    }
}

#[test]
fn a_pin_of_a_gone_owner_fails() {
    let mut p = settled();
    let pin = pin();
    p.pins.push((pin.clone(), None));
    pins_of_gone_owners(&p).expect("its owner is there");
    p.pins
        .push((pin, Some("StatefulSet sim/db is deleted".into())));
    let e = pins_of_gone_owners(&p).expect_err("its owner is gone");
    assert!(e.starts_with("L3:") && e.contains("10.70.0.5"), "{e}");
}

#[test]
fn a_void_pin_a_live_node_keeps_in_its_block_fails() {
    let mut p = settled();
    void_pins_kept(&p).expect("no void pin");
    let mut void = pin();
    void.holders.clear();
    p.void_known.push(("n0".into(), void));
    let e = void_pins_kept(&p).expect_err("kept for nothing");
    assert!(
        e.starts_with("L3:") && e.contains("void") && e.contains("n0"),
        "{e}"
    );
}

#[test]
fn a_refused_add_with_a_free_block_fails() {
    let free = net("10.70.0.32/28");
    let e = add_refused("n0", "exhausted", Some(&free)).expect_err("room");
    assert!(e.starts_with("L4:") && e.contains("10.70.0.32/28"), "{e}");
}

#[test]
fn a_pool_left_deleting_fails() {
    let mut p = settled();
    p.deleting.push("p".into());
    let e = stuck_deleting(&p).expect_err("stuck");
    assert!(e.starts_with("L5:"), "{e}");
}

#[test]
fn an_idle_write_fails() {
    let e = idle_writes(&["txn [put blocks/p/10.70.0.0-28]".into()], 20_000).expect_err("a write");
    assert!(e.starts_with("L6:") && e.contains("blocks/p"), "{e}");
}

#[test]
fn free_blocks_are_those_nothing_overlaps() {
    let blocks = vec![(net("10.70.0.0/28"), "n0".to_string(), "p".to_string())];
    let free = free_blocks(
        &[net("10.70.0.0/26"), net("fd00:70::/123")],
        (28, 124),
        &blocks,
        &[net("10.70.0.40/32"), net("fd00:70::5/128")],
    );
    assert_eq!(
        free,
        vec![
            net("10.70.0.16/28"),
            net("10.70.0.48/28"),
            net("fd00:70::10/124")
        ]
    );
}
