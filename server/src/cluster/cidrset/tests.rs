use super::*;
use std::collections::HashSet;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

#[test]
fn carves_blocks_and_occupies_them() {
    let mut s = CidrSet::new(net("10.0.0.0/16"), 26).unwrap();
    assert_eq!(s.len(), 1024);
    assert_eq!(s.block(0), net("10.0.0.0/26"));
    assert_eq!(s.block(5), net("10.0.1.64/26"));
    assert_eq!(s.block(1023), net("10.0.255.192/26"));
    assert_eq!(s.occupy(net("10.0.1.64/26")), 1);
    assert!(s.is_taken(5));
    assert_eq!(
        s.occupy(net("10.0.1.64/27")),
        0,
        "within a block taken already"
    );
    assert_eq!(s.occupy(net("10.1.0.0/26")), 0, "outside");
    assert_eq!(s.used(), 1);
    let mut v6 = CidrSet::new(net("fd00::/112"), 122).unwrap();
    assert_eq!(v6.len(), 1024);
    assert_eq!(v6.block(1), net("fd00::40/122"));
    assert_eq!(v6.occupy(net("fd00::40/122")), 1);
    assert!(v6.is_taken(1));
}

#[test]
fn bad_carvings_are_named() {
    for (cidr, block, needle) in [
        ("10.0.0.0/24", 24, "does not fit"),
        ("10.0.0.0/24", 33, "longer than an IPv4 address"),
        ("fd00::/64", 122, "at most 2^16"),
    ] {
        let e = CidrSet::new(net(cidr), block).unwrap_err().to_string();
        assert!(e.contains(needle), "{cidr} /{block}: {e}");
    }
}

#[test]
fn the_free_blocks_in_a_nodes_order_skip_what_is_taken() {
    let mut s = CidrSet::new(net("10.0.0.0/24"), 26).unwrap();
    assert_eq!(s.occupy(net("10.0.0.64/26")), 1);
    let free: Vec<IpNet> = s.free_in_order("node-a").collect();
    assert_eq!(free.len(), 3);
    assert!(!free.contains(&net("10.0.0.64/26")));
    let order: Vec<IpNet> = s.order("node-a").map(|i| s.block(i)).collect();
    let kept: Vec<IpNet> = order
        .into_iter()
        .filter(|b| *b != net("10.0.0.64/26"))
        .collect();
    assert_eq!(free, kept, "in the node's order");
    s.occupy(net("10.0.0.0/24"));
    assert_eq!(s.free_in_order("node-a").next(), None);
    assert_eq!(s.used(), 4);
}

#[test]
fn an_excluded_range_occupies_every_block_it_touches() {
    let mut s = CidrSet::new(net("10.96.0.0/12"), 24).unwrap();
    // A service CIDR inside the pool, and one that spills past its end.
    assert_eq!(s.occupy(net("10.96.0.0/16")), 256);
    assert_eq!(s.occupy(net("10.111.255.128/25")), 1);
    assert_eq!(s.occupy(net("10.0.0.0/8")), s.len() - 257, "covers all");
    assert_eq!(s.free_in_order("x").next(), None);
    assert_eq!(s.occupy(net("192.168.0.0/16")), 0);
    assert_eq!(s.occupy(net("fd00::/8")), 0, "another family");
}

#[test]
fn each_seed_visits_every_block_once_and_seeds_differ() {
    let s = CidrSet::new(net("10.0.0.0/16"), 26).unwrap();
    let a: Vec<usize> = s.order("node-a").collect();
    assert_eq!(a.iter().copied().collect::<HashSet<_>>().len(), s.len());
    let firsts: HashSet<usize> = (0..100)
        .map(|i| s.order(&format!("node-{i}")).next().unwrap())
        .collect();
    assert!(
        firsts.len() > 90,
        "100 nodes start at {} blocks",
        firsts.len()
    );
    assert_eq!(
        a,
        s.order("node-a").collect::<Vec<_>>(),
        "stable for a name"
    );
    let one = CidrSet::new(net("10.0.0.0/26"), 27).unwrap();
    assert_eq!(one.order("x").collect::<HashSet<_>>().len(), 2);
}
