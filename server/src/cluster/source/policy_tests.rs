//! What a pool, as the node read it, says of handing out: nothing before it was read, no
//! reserved address by any path, nothing new while it is disabled; a read sent before the
//! last one applied never undoes it.

use std::sync::Arc;
use std::time::Duration;

use super::tests::*;
use crate::cluster::node::ClusterNode;
use crate::config::ClusterSettings;
use crate::source::{Next, Source};

#[test]
fn nothing_is_handed_out_before_the_pool_was_read() {
    let settings: ClusterSettings = toml::from_str(
        "etcd_endpoints = [\"http://127.0.0.1:1\"]\nheartbeat_ttl_secs = 10\nclaim_ahead = 1\n",
    )
    .expect("settings");
    let n = ClusterNode::new(settings, "n1".into(), "inst-1".into(), Arc::default()).expect("node");
    let mut s = source(&n);
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    match s.held_back() {
        Some(Next::Pending(why)) => assert!(why.contains("reading cluster pool"), "{why}"),
        other => panic!("{other:?}"),
    }
    n.as_read("p", Some(&pool_p(&[])));
    assert_eq!(s.held_back(), None);
    assert_eq!(s.next(), Next::Ready(ip("10.0.0.2")));
}

#[test]
fn a_reserved_address_is_handed_out_by_no_path_and_an_older_read_never_undoes_it() {
    let n = node("");
    let mut s = source(&n);
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    assert_eq!(s.next(), Next::Ready(ip("10.0.0.2")));
    assert_eq!(s.free(), 13);
    n.as_read("p", Some(&pool_p(&["10.0.0.2/31", "10.0.0.7/32"])));
    assert_eq!(s.next(), Next::Ready(ip("10.0.0.4")));
    assert_eq!(
        s.peek_next_n(4),
        vec![
            ip("10.0.0.4"),
            ip("10.0.0.5"),
            ip("10.0.0.6"),
            ip("10.0.0.8")
        ]
    );
    assert_eq!(s.free(), 10, "13 less the 3 reserved");
    assert!(s
        .withheld(ip("10.0.0.3"))
        .is_some_and(|w| w.contains("reserved")));
    assert!(s.can_occupy(ip("10.0.0.7")).is_err());
    assert!(s.withheld(ip("10.0.0.9")).is_none());
    // A read sent before the last one applied, answered after it: not applied.
    n.took_in("p", 0, Some(&pool_p(&[])));
    assert_eq!(s.next(), Next::Ready(ip("10.0.0.4")));
    // The block wholly reserved: nothing to hand out, and none counted free (a claim comes).
    n.as_read("p", Some(&pool_p(&["10.0.0.0/28"])));
    assert_eq!(s.free(), 0);
    assert!(!matches!(s.next(), Next::Ready(_)));
    assert!(matches!(next_work(&mut s), Some(super::Work::Claim { .. })));
}

#[test]
fn a_disabled_pool_hands_nothing_new_out_and_claims_nothing() {
    let n = node("");
    let mut s = source(&n);
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    let mut off = pool_p(&[]);
    off.spec.disabled = true;
    n.as_read("p", Some(&off));
    match s.held_back() {
        Some(Next::Unavailable(why)) => assert!(why.contains("disabled"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(s.withheld(ip("10.0.0.9")).is_some());
    // Its only block, empty, goes back (the hold-down is 0 here); no claim follows.
    assert!(matches!(next_work(&mut s), Some(super::Work::GiveBack(..))));
    n.as_read("p", Some(&pool_p(&[])));
    assert_eq!(s.held_back(), None);
}
