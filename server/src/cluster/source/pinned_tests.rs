//! Pinned addresses in a source of one subnet: kept from everyone on every path, served to
//! their pod while this node holds the pin, hosted outside the node's blocks; no block with a
//! pinned address given back.

use std::time::Duration;

use super::tests::*;
use crate::cluster::pin::{Holder, Pin, PinOwner};
use crate::model::SubnetMode;
use crate::source::BlockSource;
use crate::source::{Next, Source};

fn subnet() -> Option<SubnetMode> {
    Some(SubnetMode {
        gateways: vec![ip("10.0.0.1")],
        exclude: Vec::new(),
    })
}

fn pin(address: &str, block: &str, id: i64, holder: Option<&str>) -> Pin {
    Pin {
        pool: "p".into(),
        address: ip(address),
        owner: PinOwner::StatefulSet {
            namespace: "db".into(),
            name: "web".into(),
            ordinal: 0,
        },
        block: net(block),
        block_id: id,
        set_aside: false,
        holders: holder
            .map(|n| Holder {
                node: n.into(),
                pod: "db/web-0".into(),
                uid: "u1".into(),
                since_ms: 1,
                instance: None,
            })
            .into_iter()
            .collect(),
    }
}

#[test]
fn a_pinned_address_goes_to_its_pod_only_and_its_block_stays() {
    let n = node("");
    let mut s = source(&n).subnet_mode(subnet());
    n.pretend_renewed(Duration::ZERO);
    synced(
        &mut s,
        &n,
        &[block("10.0.0.0/28", 7), block("10.0.0.16/28", 8)],
    );
    let a = ip("10.0.0.5");
    n.pin_known(&pin("10.0.0.5", "10.0.0.0/28", 7, None));
    // Nobody holds it here: no path hands it out, not even to its pod.
    assert!(!s.peek_next_n(40).contains(&a));
    assert_ne!(s.next(), Next::Ready(a));
    let why = s.withheld(a).expect("withheld");
    assert!(
        why.contains("pinned") && why.contains("StatefulSet/db/web/0"),
        "{why}"
    );
    assert!(s.can_occupy(a).is_err());
    assert!(s.can_occupy_fixed(a).is_err(), "not held here");
    assert_eq!(s.free(), 14 + 16 - 1, "less the pinned one");
    // Held here: its pod gets it, nobody else.
    n.pin_known(&pin("10.0.0.5", "10.0.0.0/28", 7, Some("n1")));
    assert!(s.can_occupy_fixed(a).is_ok());
    assert!(s.withheld_fixed(a).is_none());
    assert!(s.withheld(a).is_some() && s.can_occupy(a).is_err());
    assert_eq!(
        s.block_holding(a),
        Some(crate::source::BlockId {
            net: net("10.0.0.0/28"),
            created: 7,
        })
    );
    // Both blocks empty, the hold-down past: the pinned one is not given back.
    match next_work(&mut s) {
        Some(crate::cluster::work::Work::GiveBack(b, _)) => assert_eq!(b, net("10.0.0.16/28")),
        other => panic!("expected the unpinned block's give-back: {other:?}"),
    }
}

#[test]
fn a_pinned_address_outside_the_nodes_blocks_is_hosted_for_its_pod() {
    let n = node("");
    let mut s = source(&n).subnet_mode(subnet());
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    let a = ip("10.0.0.40");
    assert!(!s.contains(a));
    // Pinned elsewhere, held by another node: not this node's to serve.
    n.pin_known(&pin("10.0.0.40", "10.0.0.32/28", 9, Some("n2")));
    assert!(s.can_occupy_fixed(a).is_err());
    // Held here.
    n.pin_known(&pin("10.0.0.40", "10.0.0.32/28", 9, Some("n1")));
    assert!(s.can_occupy_fixed(a).is_ok());
    s.occupy_fixed(a).expect("hosted");
    assert!(s.contains(a) && s.hosts(a));
    assert_eq!(s.interface_of(a), Some((24, Some(ip("10.0.0.1")))));
    assert!(s.can_occupy_fixed(a).is_err(), "hosted once");
    assert!(s.withheld(a).is_some(), "from anyone else");
    assert!(s.withheld_fixed(a).is_none());
    assert_eq!(s.block_holding(a), None);
    assert!(s.vacate(a));
    assert!(!s.contains(a) && !s.hosts(a));
    // The subnet's broadcast and gateway are never hosted, pinned or not.
    for x in ["10.0.0.255", "10.0.0.1"] {
        n.pin_known(&pin(x, "10.0.0.240/28", 10, Some("n1")));
        assert!(s.can_occupy_fixed(ip(x)).is_err(), "{x}");
    }
}

#[test]
fn a_routed_source_keeps_no_pins() {
    let n = node("");
    let mut s = source(&n);
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    n.pin_known(&pin("10.0.0.5", "10.0.0.0/28", 7, Some("n1")));
    assert!(s.peek_next_n(20).contains(&ip("10.0.0.5")));
    assert!(!s.one_subnet());
}

#[test]
fn a_listing_never_undoes_a_pin_written_after_it_was_sent_or_still_on_its_way() {
    let n = node("");
    let p = pin("10.0.0.5", "10.0.0.0/28", 7, Some("n1"));
    let a = ip("10.0.0.5");
    let before = n.pins_listing();
    n.pin_writing(&p);
    n.pins_listed("p", before, Vec::new());
    assert!(
        n.pin_at("p", a).is_some(),
        "a listing sent before the write"
    );
    let meanwhile = n.pins_listing();
    n.pins_listed("p", meanwhile, Vec::new());
    assert!(n.pin_at("p", a).is_some(), "the write not answered yet");
    assert_eq!(n.pool_pinned("p").len(), 1);
    n.pin_known(&p);
    let after = n.pins_listing();
    n.pins_listed("p", after, Vec::new());
    assert!(n.pin_at("p", a).is_none(), "gone from the store since");
    assert!(!n.pool_has_pins("p"));
}

/// A block of this node's over an address it hosts (the pin's block given back or released,
/// as after etcd's restore from an older backup, and claimed here): the block takes the
/// address over as held, and never offers it (found by the simulation: its source offered
/// the hosted address, which the engine refused with an internal error).
#[test]
fn a_block_claimed_over_a_hosted_address_takes_it_over() {
    let n = node("");
    let mut s = source(&n).subnet_mode(subnet());
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    let a = ip("10.0.0.40");
    n.pin_known(&pin("10.0.0.40", "10.0.0.32/28", 9, Some("n1")));
    s.occupy_fixed(a).expect("hosted");
    // The pin is gone from the store (etcd restored), and the block over it is this node's.
    n.pins_listed("p", n.pins_listing(), Vec::new());
    synced(
        &mut s,
        &n,
        &[block("10.0.0.0/28", 7), block("10.0.0.32/28", 11)],
    );
    assert!(!s.peek_next_n(40).contains(&a), "never offered");
    assert!(s.can_occupy(a).is_err(), "held");
    assert!(!s.hosts(a), "in its block now");
    assert_eq!(
        s.block_holding(a),
        Some(crate::source::BlockId {
            net: net("10.0.0.32/28"),
            created: 11,
        })
    );
    assert_eq!(s.free(), 14 + 16 - 1, "less the one held");
    assert!(s.vacate(a));
    assert!(s.can_occupy(a).is_ok(), "released into its block");
    assert_eq!(s.free(), 14 + 16);
}

/// After the store was found reset, the pins known here stay whatever listings say until the
/// store has them again with this node's holds (the first listing after an
/// etcd restored from a backup older than the pin dropped it, and the block's node handed its
/// address out while the pin's holder served it); the address stays out meanwhile.
#[test]
fn pins_known_before_a_reset_stay_until_the_store_has_them_with_this_nodes_holds() {
    let n = node("");
    let mut s = source(&n).subnet_mode(subnet());
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    let a = ip("10.0.0.5");
    let held = pin("10.0.0.5", "10.0.0.0/28", 7, Some("n1"));
    n.pin_known(&held);
    n.pins_reset();
    n.pins_listed("p", n.pins_listing(), Vec::new());
    assert!(
        n.pin_at("p", a).is_some(),
        "kept through a listing that lacks it"
    );
    assert!(!s.peek_next_n(20).contains(&a), "its address stays out");
    assert_eq!(n.pins_to_assert("p"), vec![held.clone()]);
    // Made again elsewhere without this node's hold: not yet as the store says.
    let unheld = pin("10.0.0.5", "10.0.0.0/28", 7, None);
    n.pins_listed("p", n.pins_listing(), vec![unheld.clone()]);
    assert_eq!(n.pins_to_assert("p"), vec![held.clone()]);
    // With it: as the store says from now on.
    n.pins_listed("p", n.pins_listing(), vec![held.clone()]);
    assert!(n.pins_to_assert("p").is_empty());
    // One it cannot make again is left to the listings.
    n.pins_reset();
    n.pin_unasserted(&held);
    n.pins_listed("p", n.pins_listing(), Vec::new());
    assert!(n.pin_at("p", a).is_none());
}

/// The answer to a pin's making again, begun before a second reset and answered after it,
/// tells of the store before that reset: the pin stays to be made again, and a listing of the
/// store restored a second time does not drop it (found by the simulation,
/// `asserted-before-reset`, seed 123 000 322 364).
#[test]
fn a_making_again_answered_after_a_second_reset_leaves_the_pin_to_be_made_again() {
    let n = node("");
    let mut s = source(&n).subnet_mode(subnet());
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    let a = ip("10.0.0.5");
    let held = pin("10.0.0.5", "10.0.0.0/28", 7, Some("n1"));
    n.pin_known(&held);
    n.pins_reset();
    let begun = n.pins_resets();
    n.pins_reset();
    n.pin_asserted(&held, begun);
    n.pin_unasserted_since(&held, begun);
    n.pins_listed("p", n.pins_listing(), Vec::new());
    assert!(n.pin_at("p", a).is_some(), "kept through the second reset");
    assert_eq!(n.pins_to_assert("p"), vec![held.clone()]);
    assert!(!s.peek_next_n(20).contains(&a), "its address stays out");
    // Begun after the last reset: as it says.
    n.pin_asserted(&held, n.pins_resets());
    assert!(n.pins_to_assert("p").is_empty());
}

/// After a reset, a node makes again only the pins it hosts or holds: one it knew from a
/// listing alone (in another node's block, held by another node) it leaves to the listings.
/// Made again, it raced the hand-outs of the block's node, started afresh after a wipe and
/// knowing nothing of it: that node gave the address to a pod, and the pin's owner took it on
/// a third node (found by the simulation, `others-pins-reasserted`, seed 34 000 006 924).
#[test]
fn after_a_reset_only_the_pins_hosted_or_held_here_are_made_again() {
    let n = node("");
    let mut s = source(&n).subnet_mode(subnet());
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    let held_here = pin("10.0.0.40", "10.0.0.32/28", 9, Some("n1"));
    let hosted = pin("10.0.0.5", "10.0.0.0/28", 7, Some("n2"));
    let elsewhere = pin("10.0.0.50", "10.0.0.48/28", 12, Some("n3"));
    for p in [&held_here, &hosted, &elsewhere] {
        n.pin_known(p);
    }
    n.pins_reset();
    let mine = [block("10.0.0.0/28", 7)];
    let mut made = n.pins_to_assert_here("p", &mine);
    made.sort_by_key(|p| p.address);
    assert_eq!(made, vec![hosted.clone(), held_here.clone()]);
    assert!(
        !n.pins_to_assert("p").contains(&elsewhere),
        "left to the listings"
    );
}
