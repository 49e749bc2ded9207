//! What a pool, as the node read it, says of handing out: nothing before it was read, no
//! reserved address by any path, nothing new while it is disabled; a read sent before the
//! last one applied never undoes it.

use std::sync::Arc;
use std::time::Duration;

use super::tests::*;
use crate::cluster::node::ClusterNode;
use crate::config::ClusterSettings;
use crate::source::BlockSource;
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

/// `ipool_cluster_pool_capacity_blocks`: the blocks of the pool's CIDRs by family, as read,
/// its excluded ranges and CIDRs on their way in left out.
#[test]
fn a_pools_capacity_in_blocks_is_exported_as_read() {
    let n = node("");
    let capacity = |n: &ClusterNode| {
        let mut text = String::new();
        let mut r = prometheus_client::registry::Registry::default();
        r.register(
            "capacity",
            "",
            n.metrics().cluster.pool_capacity_blocks.clone(),
        );
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        text
    };
    let mut p = pool_p(&[]);
    n.as_read("p", Some(&p));
    // A /24 in /26 blocks: 4; no IPv6 CIDR.
    let text = capacity(&n);
    assert!(
        text.contains("capacity{pool=\"p\",family=\"4\"} 4"),
        "{text}"
    );
    assert!(
        text.contains("capacity{pool=\"p\",family=\"6\"} 0"),
        "{text}"
    );
    p.spec.cidrs.push(net("fd00::/120"));
    p.spec.cidrs.push(net("10.0.1.0/24"));
    p.spec.adding.push(net("10.0.1.0/24"));
    p.spec.exclude.push(net("10.0.0.0/28"));
    n.as_read("p", Some(&p));
    let text = capacity(&n);
    assert!(
        text.contains("capacity{pool=\"p\",family=\"4\"} 3"),
        "{text}"
    );
    assert!(
        text.contains("capacity{pool=\"p\",family=\"6\"} 4"),
        "{text}"
    );
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
        Some(Next::Refused(crate::error::Refusal::PoolDisabled, why)) => {
            assert!(why.contains("disabled"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert!(s.withheld(ip("10.0.0.9")).is_some());
    // Its only block, empty, goes back (the hold-down is 0 here); no claim follows.
    assert!(matches!(next_work(&mut s), Some(super::Work::GiveBack(..))));
    n.as_read("p", Some(&pool_p(&[])));
    assert_eq!(s.held_back(), None);
}

#[test]
fn a_node_its_pools_selector_does_not_match_claims_nothing_and_gives_its_empty_blocks_back() {
    let n = node("");
    let mut s = source(&n);
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    let mut gpu = pool_p(&[]);
    gpu.spec.node_selector = Some("gpu=true".into());
    n.as_read("p", Some(&gpu));
    // The labels not known yet: nothing handed out, nothing claimed, nothing refused.
    match s.held_back() {
        Some(Next::Pending(why)) => assert!(why.contains("labels are not known"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.refused(), None);
    let selected = |n: &ClusterNode| {
        let mut text = String::new();
        let mut r = prometheus_client::registry::Registry::default();
        r.register(
            "selected",
            "",
            n.metrics().cluster.pool_node_selected.clone(),
        );
        prometheus_client::encoding::text::encode(&mut text, &r).expect("encode");
        text
    };
    assert!(
        selected(&n).contains("selected{pool=\"p\"} 0"),
        "{}",
        selected(&n)
    );
    // Not matching: refused naming the selector; its idle addresses leave; its only block,
    // empty, goes back.
    n.set_labels([("zone".to_string(), "a".to_string())].into());
    let why = s.refused().expect("refused");
    assert!(
        why.contains("nodeSelector") && why.contains("gpu=true"),
        "{why}"
    );
    assert_eq!(s.held_back(), None);
    assert!(s.withheld(ip("10.0.0.9")).is_some());
    // Unavailable (retried): the engine refuses such a node before, by `refused`.
    assert!(matches!(s.next(), Next::Unavailable(_)));
    assert!(s.peek_next_n(2).is_empty(), "nothing fetched into idle");
    assert!(matches!(next_work(&mut s), Some(super::Work::GiveBack(..))));
    assert!(
        selected(&n).contains("selected{pool=\"p\"} 0"),
        "{}",
        selected(&n)
    );
    // Labelled: it may.
    n.set_labels([("gpu".to_string(), "true".to_string())].into());
    assert_eq!(s.refused(), None);
    // (Its block is on its way back: the source claims anew.)
    assert!(
        !matches!(s.next(), Next::Unavailable(_) | Next::Refused(..)),
        "{:?}",
        s.next()
    );
    assert!(
        selected(&n).contains("selected{pool=\"p\"} 1"),
        "{}",
        selected(&n)
    );
}

#[test]
fn a_networks_later_pool_claims_its_first_block_only_once_an_add_wants_one() {
    let n = node("");
    let mut s = source(&n).on_demand(true);
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[]);
    n.as_read("p", Some(&pool_p(&[])));
    assert!(next_work(&mut s).is_none(), "no claim ahead of need");
    s.demand();
    assert!(matches!(next_work(&mut s), Some(super::Work::Claim { .. })));
}

/// A pool read and found gone is no pool on its way: its source is unavailable, saying so, so
/// that an ADD passes on to the network's next pool (found by the simulation's rule L4, seed
/// 100 176: the first of a network's two pools deleted, every ADD then waited for it to be
/// read, and the second pool, which claims only when an ADD gets to it, was never asked).
#[test]
fn a_pool_read_and_found_gone_is_unavailable_not_awaited() {
    let n = node("");
    let mut s = source(&n);
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.0/28", 7)]);
    n.as_read("p", Some(&pool_p(&[])));
    assert_eq!(s.next(), Next::Ready(ip("10.0.0.2")));
    n.as_read("p", None);
    match s.next() {
        Next::Unavailable(why) => assert!(why.contains("does not exist"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Made again: it serves once read.
    n.as_read("p", Some(&pool_p(&[])));
    assert_eq!(s.next(), Next::Ready(ip("10.0.0.2")));
}
