use std::net::IpAddr;

use ipool_server::cluster::pin::{Pin, PinOwner};

use crate::check::{Checker, StoreBlock};

const OWNER: &str = "StatefulSet/default/web/0";

fn ip(s: &str) -> IpAddr {
    s.parse().expect("an address")
}

fn block(cidr: &str, node: &str) -> StoreBlock {
    (cidr.parse().expect("a CIDR"), node.into(), "p".into())
}

fn pin(address: &str) -> Pin {
    Pin {
        pool: "p".into(),
        address: ip(address),
        owner: PinOwner::StatefulSet {
            namespace: "default".into(),
            name: "web".into(),
            ordinal: 0,
        },
        block: "10.0.0.0/28".parse().expect("a CIDR"),
        block_id: 7,
        set_aside: false,
        holders: Vec::new(),
    }
}

/// web-0 runs on n2 with 10.0.0.5, pinned in n1's block 10.0.0.0/28; a plain pod runs on n1.
/// etcd is restored; n1's daemon knew the pin if `knew`.
fn restored(knew: bool, after: &[StoreBlock]) -> Checker {
    let mut c = Checker::default();
    let before = [block("10.0.0.0/28", "n1")];
    let none = |_| None;
    c.added(
        1,
        "n2",
        "web-0",
        vec![ip("10.0.0.5")],
        10,
        &before,
        none,
        None,
        Some((OWNER.into(), None)),
        &[ip("10.0.0.5")],
        false,
    )
    .expect("hosted for its owner");
    c.added(
        0,
        "n1",
        "plain",
        vec![ip("10.0.0.2")],
        20,
        &before,
        none,
        None,
        None,
        &[],
        false,
    )
    .expect("from its node's block");
    c.restored("restored", &before, after, |node, pool, a, owner| {
        knew && node == "n1" && pool == "p" && a == ip("10.0.0.5") && owner == OWNER
    });
    c
}

/// A new pod on n1 handed `address` from n1's block.
fn hand_out(c: &mut Checker, container: &str, address: &str) -> Result<(), String> {
    let blocks = [block("10.0.0.0/28", "n1")];
    c.added(
        0,
        "n1",
        container,
        vec![ip(address)],
        30,
        &blocks,
        |_| None,
        None,
        None,
        &[],
        false,
    )
}

#[test]
fn a_restore_excuses_the_pods_of_before_but_a_pinned_address_its_node_knew() {
    let mut c = restored(true, &[block("10.0.0.0/28", "n1")]);
    assert!(
        hand_out(&mut c, "new-1", "10.0.0.2").is_ok(),
        "a plain pod of before is excused"
    );
    let e = hand_out(&mut c, "new-2", "10.0.0.5").expect_err("the pin's address is kept");
    assert!(e.contains("web-0"), "{e}");
}

#[test]
fn a_pin_its_node_did_not_know_or_whose_block_the_restore_lost_is_excused() {
    let mut c = restored(false, &[block("10.0.0.0/28", "n1")]);
    assert!(hand_out(&mut c, "new", "10.0.0.5").is_ok());
    // The backup had the block as another node's: the pin made in n1's was void.
    let mut c = restored(true, &[block("10.0.0.0/28", "n3")]);
    assert!(c.kept.is_empty());
    assert!(hand_out(&mut c, "new", "10.0.0.5").is_ok());
}

#[test]
fn the_node_that_knew_the_pin_restarted_before_it_was_made_again_excuses_it() {
    let mut c = restored(true, &[block("10.0.0.0/28", "n1")]);
    // Another node's daemon changes nothing.
    c.kept_node_changed("n2", &[]);
    assert_eq!(c.kept.len(), 1);
    c.kept_node_changed("n1", &[]);
    assert!(c.kept.is_empty());
    assert!(hand_out(&mut c, "new", "10.0.0.5").is_ok());
}

#[test]
fn once_the_pin_is_back_in_the_store_a_restart_excuses_nothing() {
    let mut c = restored(true, &[block("10.0.0.0/28", "n1")]);
    c.kept_node_changed("n1", &[pin("10.0.0.5")]);
    assert!(c.kept.is_empty(), "kept no longer: the store keeps it");
    assert!(hand_out(&mut c, "new", "10.0.0.5").is_err());
}

#[test]
fn the_block_taken_by_another_before_the_pin_is_back_excuses_it_and_given_back_by_its_node_not() {
    let before = [block("10.0.0.0/28", "n1")];
    let mut c = restored(true, &before);
    c.kept_blocks_gone(&before, &[], "n1 (slot 0)", &[]);
    assert_eq!(c.kept.len(), 1, "its own node's give-back is its own doing");
    c.kept_blocks_gone(&before, &[block("10.0.0.16/28", "n1")], "the operator", &[]);
    assert!(c.kept.is_empty());
    assert!(hand_out(&mut c, "new", "10.0.0.5").is_ok());
}

#[test]
fn a_pod_of_its_own_owner_may_take_it_as_the_world_takes_an_excused_pod_for_gone() {
    let mut c = restored(true, &[block("10.0.0.0/28", "n1")]);
    assert!(
        c.pods["web-0"].excused.is_some(),
        "excused as far as the world goes"
    );
    let blocks = [block("10.0.0.0/28", "n1")];
    let again = c.added(
        0,
        "n1",
        "web-0-again",
        vec![ip("10.0.0.5")],
        30,
        &blocks,
        |_| None,
        None,
        Some((OWNER.into(), None)),
        &[],
        false,
    );
    assert!(again.is_ok(), "{again:?}");
}

#[test]
fn a_later_excuse_of_the_pod_ends_its_protection() {
    let mut c = restored(true, &[block("10.0.0.0/28", "n1")]);
    c.excuse("n2", "release-node --force on a live node");
    assert!(c.protected.is_empty() && c.kept.is_empty());
    assert!(hand_out(&mut c, "new", "10.0.0.5").is_ok());
}
