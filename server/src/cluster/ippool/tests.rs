use super::*;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn pool() -> PoolSpec {
    PoolSpec {
        name: "p".into(),
        cidrs: vec![net("10.0.0.0/24"), net("10.1.0.0/24")],
        block_v4: 26,
        block_v6: 122,
        exclude: vec![net("10.1.0.0/28")],
        ..PoolSpec::default()
    }
}

#[test]
fn a_familys_block_size_is_set_only_while_the_pool_has_no_cidr_of_it() {
    let v6 = |prefix| PoolChange::SetBlockSize {
        family: Family::V6,
        prefix,
    };
    let sized = pool().changed(&v6(116)).expect("no IPv6 CIDR yet");
    assert_eq!(sized.block_v6, 116);
    // A /100 in /116 blocks is 2^16 of them: the most a CIDR holds.
    let dual = sized
        .changed(&PoolChange::AddCidr(net("fd00::/100")))
        .expect("carved at /116");
    let e = dual.changed(&v6(120)).unwrap_err();
    assert!(
        e.0.contains("IPv6 blocks are /116") && e.0.contains("fd00::/100"),
        "{e}"
    );
    assert_eq!(
        dual.changed(&v6(116)).expect("the size it has").block_v6,
        116
    );
    let e = pool()
        .changed(&PoolChange::SetBlockSize {
            family: Family::V4,
            prefix: 28,
        })
        .unwrap_err();
    assert!(e.0.contains("IPv4 blocks are /26"), "{e}");
    assert!(pool()
        .changed(&v6(127))
        .unwrap_err()
        .0
        .contains("at most /126"));
}

#[test]
fn a_change_is_checked_and_applied() {
    let p = pool();
    let grown = p.changed(&PoolChange::AddCidr(net("10.2.0.0/24"))).unwrap();
    assert_eq!(grown.cidrs.len(), 3);
    for (change, needle) in [
        (
            PoolChange::AddCidr(net("10.0.0.0/24")),
            "has CIDR 10.0.0.0/24 already",
        ),
        (PoolChange::AddCidr(net("10.0.0.128/25")), "overlap"),
        (PoolChange::AddCidr(net("10.3.0.1/24")), "host bits"),
        (
            PoolChange::RemoveCidr(net("10.9.0.0/24")),
            "has no CIDR 10.9.0.0/24",
        ),
    ] {
        let e = p.changed(&change).unwrap_err();
        assert!(e.0.contains(needle), "{change}: {e}");
    }
    // A CIDR removed takes its excluded ranges along; the last one stays.
    let shrunk = p
        .changed(&PoolChange::RemoveCidr(net("10.1.0.0/24")))
        .unwrap();
    assert_eq!((shrunk.cidrs.len(), shrunk.exclude.len()), (1, 0));
    let e = shrunk
        .changed(&PoolChange::RemoveCidr(net("10.0.0.0/24")))
        .unwrap_err();
    assert!(e.0.contains("only CIDR"), "{e}");
    // Reserved: an address or a range, inside the pool; ended by its exact range; a
    // CIDR removed takes its reservations along.
    let r = |c: &str, why: &str| {
        PoolChange::Reserve(Reserved {
            cidr: net(c),
            reason: why.into(),
        })
    };
    let held = p.changed(&r("10.0.0.5/32", "a legacy host")).unwrap();
    assert!(held.is_reserved("10.0.0.5".parse().unwrap()));
    assert!(!held.is_reserved("10.0.0.6".parse().unwrap()));
    let again = held
        .changed(&r("10.0.0.5/32", "the load balancer"))
        .unwrap();
    assert_eq!(again.reserved.len(), 1);
    assert_eq!(again.reserved[0].reason, "the load balancer");
    let e = p.changed(&r("10.9.0.5/32", "")).unwrap_err();
    assert!(e.0.contains("in none of its CIDRs"), "{e}");
    let e = p.changed(&r("10.0.0.5/32", &"x".repeat(300))).unwrap_err();
    assert!(e.0.contains("at most 256"), "{e}");
    let e = held
        .changed(&PoolChange::Unreserve(net("10.0.0.4/30")))
        .unwrap_err();
    assert!(e.0.contains("no reservation of 10.0.0.4/30"), "{e}");
    let ended = held
        .changed(&PoolChange::Unreserve(net("10.0.0.5/32")))
        .unwrap();
    assert!(ended.reserved.is_empty());
    let wide = p.changed(&r("10.1.0.128/25", "")).unwrap();
    assert!(wide.is_reserved("10.1.0.200".parse().unwrap()));
    let gone = wide
        .changed(&PoolChange::RemoveCidr(net("10.1.0.0/24")))
        .unwrap();
    assert!(gone.reserved.is_empty());
    let off = p.changed(&PoolChange::Disable).unwrap();
    assert!(off.disabled);
    assert!(!off.changed(&PoolChange::Enable).unwrap().disabled);
}

#[test]
fn nothing_is_claimed_in_a_cidr_on_its_way_in_or_out() {
    let mut p = pool();
    assert!(p.claimable(&net("10.1.0.64/26")));
    assert!(!p.claimable(&net("10.5.0.0/26")));
    p.removing = vec![net("10.1.0.0/24")];
    p.validate().unwrap();
    assert!(!p.claimable(&net("10.1.0.64/26")));
    assert!(p.claimable(&net("10.0.0.64/26")));
    // Not of the pool's block size (claimed from a spec read before it changed).
    assert!(!p.claimable(&net("10.0.0.64/27")));
    assert!(!p.claimable(&net("10.0.0.0/25")));
    let free: usize = p
        .carve()
        .unwrap()
        .iter()
        .map(|s| s.free_in_order("n").count())
        .sum();
    assert_eq!(free, 4, "only 10.0.0.0/24's four blocks");
    // On its way out it still serves (its removal is refused while a block holds it);
    // on its way in, not yet.
    assert_eq!(p.serving_cidrs().count(), 2);
    p.adding = std::mem::take(&mut p.removing);
    assert_eq!(p.serving_cidrs().count(), 1);
    p.adding = vec![net("10.7.0.0/24")];
    assert!(p.validate().unwrap_err().0.contains("none of its CIDRs"));
}
