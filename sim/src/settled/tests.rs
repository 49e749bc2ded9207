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
    second_pins(&p).expect("no pin");
    misheld_pins(&p).expect("no pin");
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
fn an_owners_second_pin_fails() {
    let mut p = settled();
    let first = pin();
    p.pins.push((first.clone(), None));
    second_pins(&p).expect("one pin");
    let mut other = pin();
    other.owner = PinOwner::StatefulSet {
        namespace: "sim".into(),
        name: "web".into(),
        ordinal: 0,
    };
    other.address = "10.70.0.6".parse().unwrap();
    p.pins.push((other, None));
    second_pins(&p).expect("another owner's pin");
    let mut second = first.clone();
    second.address = "10.70.0.9".parse().unwrap();
    second.holders.clear();
    // Both held: two of its pods run (an operator's error), each ends with its pod.
    let held = |mut p: Pin| {
        p.holders = vec![Holder {
            node: "n0".into(),
            pod: "sim/db-0".into(),
            uid: "uid-c1".into(),
            since_ms: 1,
            instance: None,
        }];
        p
    };
    let mut both = settled();
    both.pins.push((held(first), None));
    both.pins.push((held(second.clone()), None));
    second_pins(&both).expect("both held");
    p.pins.push((second.clone(), Some("gone".into())));
    second_pins(&p).expect("a gone owner's pins are L3's other rule");
    p.pins.push((second, None));
    let e = second_pins(&p).expect_err("two pins of one owner");
    assert!(
        e.starts_with("L3:") && e.contains("10.70.0.5") && e.contains("10.70.0.9"),
        "{e}"
    );
}

#[test]
fn a_pin_held_for_a_pod_whose_address_another_has_fails() {
    let mut p = settled();
    misheld_pins(&p).expect("no pin");
    p.misheld.push(("n0".into(), pin(), "c1".into()));
    let e = misheld_pins(&p).expect_err("misheld");
    assert!(
        e.starts_with("L3:") && e.contains("10.70.0.5") && e.contains("c1"),
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
