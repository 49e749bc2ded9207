//! A network addressed as one subnet (`addressing = "subnet"`): every address of a block is
//! handed out but the pool CIDR's network, broadcast and gateway addresses and the network's
//! excluded ones, each with the CIDR's prefix and gateway; by block, as before.

use std::time::Duration;

use super::tests::*;
use crate::model::SubnetMode;
use crate::source::BlockSource;
use crate::source::{Next, Source};

fn mode(gateway: Option<&str>, exclude: &[&str]) -> Option<SubnetMode> {
    Some(SubnetMode {
        gateways: gateway.map(ip).into_iter().collect(),
        exclude: exclude.iter().map(|x| net(x)).collect(),
    })
}

#[test]
fn a_block_inside_the_subnet_hands_out_its_network_and_broadcast_addresses() {
    let n = node("");
    let mut s = source(&n).subnet_mode(mode(Some("10.0.0.1"), &[]));
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.64/28", 7)]);
    // 10.0.0.64 is the block's network address, an ordinary host of the /24.
    assert_eq!(s.next(), Next::Ready(ip("10.0.0.64")));
    assert_eq!(s.free(), 16, "every address of the /28");
    assert_eq!(
        s.interface_of(ip("10.0.0.79")),
        Some((24, Some(ip("10.0.0.1"))))
    );
    assert!(s.can_occupy(ip("10.0.0.79")).is_ok());
}

#[test]
fn the_subnets_network_broadcast_and_gateway_addresses_are_never_handed_out() {
    let n = node("");
    let mut s = source(&n).subnet_mode(mode(Some("10.0.0.254"), &[]));
    n.pretend_renewed(Duration::ZERO);
    synced(
        &mut s,
        &n,
        &[block("10.0.0.0/28", 7), block("10.0.0.240/28", 8)],
    );
    assert_eq!(
        s.next(),
        Next::Ready(ip("10.0.0.1")),
        "10.0.0.0 is the /24's"
    );
    assert_eq!(
        s.free(),
        15 + 14,
        "less the network, the broadcast and the gateway"
    );
    assert!(s.can_occupy(ip("10.0.0.0")).is_err());
    assert!(s.can_occupy(ip("10.0.0.254")).is_err());
    assert!(s.can_occupy(ip("10.0.0.255")).is_err());
    assert!(s.can_occupy(ip("10.0.0.253")).is_ok());
    assert_eq!(
        s.interface_of(ip("10.0.0.5")),
        Some((24, Some(ip("10.0.0.254"))))
    );
}

#[test]
fn excluded_addresses_are_kept_out_one_by_one_and_no_gateway_is_none() {
    let n = node("");
    let mut s = source(&n).subnet_mode(mode(None, &["10.0.0.64/30", "10.0.0.70/32"]));
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.64/28", 7)]);
    assert_eq!(s.next(), Next::Ready(ip("10.0.0.68")));
    assert_eq!(
        s.peek_next_n(3),
        vec![ip("10.0.0.68"), ip("10.0.0.69"), ip("10.0.0.71")]
    );
    assert_eq!(s.free(), 16 - 5);
    let why = s.withheld(ip("10.0.0.65")).expect("excluded");
    assert!(
        why.contains("excluded by the network's exclude (10.0.0.64/30)"),
        "{why}"
    );
    assert!(s.can_occupy(ip("10.0.0.70")).is_err());
    assert_eq!(s.interface_of(ip("10.0.0.68")), Some((24, None)));
}

#[test]
fn by_block_each_block_is_a_range_of_its_own() {
    let n = node("");
    let mut s = source(&n).subnet_mode(None);
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.64/28", 7)]);
    assert_eq!(
        s.next(),
        Next::Ready(ip("10.0.0.66")),
        "64 network, 65 gateway"
    );
    assert_eq!(
        s.interface_of(ip("10.0.0.70")),
        Some((28, Some(ip("10.0.0.65"))))
    );
    assert!(s.can_occupy(ip("10.0.0.79")).is_err());
}

#[test]
fn an_empty_block_with_excluded_addresses_is_weighed_for_give_back_without_overflow() {
    // The only block, empty past its hold-down, a quarter of it excluded: its give-back is
    // weighed on the addresses it can hand out (it once took 16 from 12).
    let n = node("");
    let mut s = source(&n).subnet_mode(mode(None, &["10.0.0.64/30"]));
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.64/28", 7)]);
    assert_eq!(s.free(), 12);
    assert!(
        !matches!(next_work(&mut s), Some(super::Work::GiveBack(..))),
        "the last block stays"
    );
}

#[test]
fn an_excluded_range_larger_than_a_search_is_stepped_over_whole() {
    // A /16 pool in /18 blocks, the first /19 of it excluded (8 191 free addresses of the
    // block, past the subnet's network address): the block's next address is the first after
    // it. Before, the search gave up after 4 096 excluded addresses, and the source, counting
    // thousands free, claimed nothing and had nothing to hand out: ADDs waited.
    let n = node("");
    let mut pool = pool_p(&[]);
    pool.spec.cidrs = vec![net("10.0.0.0/16")];
    pool.spec.block_v4 = 18;
    n.as_read("p", Some(&pool));
    let range = crate::range::Range::from_spec(&crate::range::RangeSpec {
        subnet: "10.0.0.0/16".into(),
        range_start: None,
        range_end: None,
        gateway: None,
    })
    .expect("range");
    let mut s = super::ClusterSource::new(n.clone(), "p", &[range], 0)
        .subnet_mode(mode(Some("10.0.255.254"), &["10.0.0.0/19", "10.0.32.1/32"]));
    n.pretend_renewed(Duration::ZERO);
    synced(&mut s, &n, &[block("10.0.0.0/18", 7)]);
    assert_eq!(s.next(), Next::Ready(ip("10.0.32.0")));
    assert_eq!(
        s.peek_next_n(3),
        vec![ip("10.0.32.0"), ip("10.0.32.2"), ip("10.0.32.3")]
    );
    assert_eq!(s.free(), 16384 - 8192 - 1);
}
