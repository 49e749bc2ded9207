use super::*;
use std::collections::HashSet;

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

#[test]
fn carves_blocks_and_finds_them_again() {
    let s = CidrSet::new(net("10.0.0.0/16"), 26).unwrap();
    assert_eq!(s.len(), 1024);
    assert_eq!(s.block(0), net("10.0.0.0/26"));
    assert_eq!(s.block(5), net("10.0.1.64/26"));
    assert_eq!(s.block(1023), net("10.0.255.192/26"));
    assert_eq!(s.index_of(net("10.0.1.64/26")), Some(5));
    assert_eq!(s.index_of(net("10.0.1.64/27")), None, "another size");
    assert_eq!(s.index_of(net("10.1.0.0/26")), None, "outside");
    let v6 = CidrSet::new(net("fd00::/112"), 122).unwrap();
    assert_eq!(v6.len(), 1024);
    assert_eq!(v6.block(1), net("fd00::40/122"));
    assert_eq!(v6.index_of(net("fd00::40/122")), Some(1));
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
fn allocate_rotates_and_skips_what_is_taken() {
    let mut s = CidrSet::new(net("10.0.0.0/24"), 26).unwrap();
    assert_eq!(s.occupy(net("10.0.0.64/26")), 1);
    assert_eq!(s.allocate_next(), Some(net("10.0.0.0/26")));
    assert_eq!(s.allocate_next(), Some(net("10.0.0.128/26")));
    assert!(s.release(net("10.0.0.0/26")));
    // The candidate rotates on: the released block comes after the rest.
    assert_eq!(s.allocate_next(), Some(net("10.0.0.192/26")));
    assert_eq!(s.allocate_next(), Some(net("10.0.0.0/26")));
    assert_eq!(s.allocate_next(), None);
    assert_eq!(s.used(), 4);
}

#[test]
fn an_excluded_range_occupies_every_block_it_touches() {
    let mut s = CidrSet::new(net("10.96.0.0/12"), 24).unwrap();
    // A service CIDR inside the pool, and one that spills past its end.
    assert_eq!(s.occupy(net("10.96.0.0/16")), 256);
    assert_eq!(s.occupy(net("10.111.255.128/25")), 1);
    assert_eq!(s.occupy(net("10.0.0.0/8")), s.len() - 257, "covers all");
    assert_eq!(s.allocate_next(), None);
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
