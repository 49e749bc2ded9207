use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

fn spec(subnet: &str) -> RangeSpec {
    RangeSpec {
        subnet: subnet.into(),
        range_start: None,
        range_end: None,
        gateway: None,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn alloc(specs: &[RangeSpec]) -> RangeAllocator {
    RangeAllocator::new(parse_set(specs).expect("valid test ranges"))
}

#[test]
fn host_local_defaults_v4() {
    let r = Range::from_spec(&spec("10.1.0.0/24")).expect("valid");
    assert_eq!(r.gateway, Some(ip("10.1.0.1")));
    assert_eq!(r.start, ip("10.1.0.1"));
    assert_eq!(r.end, ip("10.1.0.254"));
    // .1 is the gateway: 253 addresses are handed out, .2 to .254.
    assert_eq!(r.size(), 253);
    assert!(!r.allocatable(ip("10.1.0.1")));
    assert!(!r.allocatable(ip("10.1.0.0")));
    assert!(!r.allocatable(ip("10.1.0.255")));
    assert!(r.allocatable(ip("10.1.0.2")));
}

#[test]
fn host_local_defaults_v6_include_last_address() {
    let r = Range::from_spec(&spec("fd00::/120")).expect("valid");
    assert_eq!(r.end, ip("fd00::ff"));
    assert_eq!(r.size(), 254);
}

#[test]
fn first_addresses_follow_host_local() {
    let mut a = alloc(&[spec("10.1.0.0/24")]);
    let got: Vec<_> = (0..3).map(|_| a.allocate_next().expect("free")).collect();
    assert_eq!(got, vec![ip("10.1.0.2"), ip("10.1.0.3"), ip("10.1.0.4")]);
}

#[test]
fn range_start_end_and_custom_gateway() {
    let mut s = spec("10.2.0.0/24");
    s.range_start = Some("10.2.0.10".into());
    s.range_end = Some("10.2.0.12".into());
    s.gateway = Some("10.2.0.11".into());
    let mut a = alloc(&[s]);
    assert_eq!(a.size(), 2);
    assert_eq!(a.allocate_next(), Some(ip("10.2.0.10")));
    assert_eq!(a.allocate_next(), Some(ip("10.2.0.12")));
    assert_eq!(a.allocate_next(), None);
}

#[test]
fn released_address_is_not_reused_before_the_rest() {
    let mut a = alloc(&[spec("10.3.0.0/29")]); // .2 - .6
    let first = a.allocate_next().expect("free");
    assert!(a.release(first));
    let next: Vec<_> = (0..5).map(|_| a.allocate_next().expect("free")).collect();
    assert_eq!(
        next.last(),
        Some(&first),
        "wraps around to the released one last"
    );
    assert_eq!(a.allocate_next(), None);
}

#[test]
fn walks_several_ranges_in_order() {
    let mut s2 = spec("10.5.0.0/24");
    s2.range_start = Some("10.5.0.100".into());
    s2.range_end = Some("10.5.0.101".into());
    let mut a = alloc(&[spec("10.4.0.0/30"), s2]);
    // 10.4.0.0/30: .1 is gateway, .3 broadcast -> only .2.
    let got: Vec<_> = std::iter::from_fn(|| a.allocate_next()).collect();
    assert_eq!(
        got,
        vec![ip("10.4.0.2"), ip("10.5.0.100"), ip("10.5.0.101")]
    );
}

#[test]
fn routes_and_reserved_gateways_are_not_ranges() {
    for broad in ["0.0.0.0/0", "::/0", "10.0.0.0/7", "fd00::/15"] {
        let e = Range::from_spec(&spec(broad)).expect_err(broad);
        assert!(matches!(e, RangeError::TooBroad(_)), "{e}");
        assert!(e.to_string().contains(broad), "{e}");
    }
    assert!(Range::from_spec(&spec("10.0.0.0/8")).is_ok());
    assert!(Range::from_spec(&spec("fd00::/16")).is_ok());
    for (gw, what) in [("10.1.0.0", "network"), ("10.1.0.255", "broadcast")] {
        let mut s = spec("10.1.0.0/24");
        s.gateway = Some(gw.into());
        let e = Range::from_spec(&s).expect_err(gw);
        assert!(
            e.to_string().contains(&format!("the {what} address")),
            "{e}"
        );
    }
    let mut s = spec("fd00::/64");
    s.gateway = Some("fd00::".into());
    assert!(Range::from_spec(&s).is_err());
}

#[test]
fn bad_specs_are_named() {
    let e = Range::from_spec(&spec("10.1.0.5/24")).expect_err("host bits");
    assert!(e.to_string().contains("10.1.0.0"), "{e}");
    assert!(matches!(
        Range::from_spec(&spec("10.1.0.0/31")),
        Err(RangeError::TooSmall(_))
    ));
    assert!(matches!(
        Range::from_spec(&spec("nonsense")),
        Err(RangeError::Subnet(..))
    ));
    let mut s = spec("10.1.0.0/24");
    s.range_start = Some("10.9.0.1".into());
    assert!(matches!(
        Range::from_spec(&s),
        Err(RangeError::Outside {
            key: "rangeStart",
            ..
        })
    ));
    assert!(matches!(
        parse_set(&[spec("10.1.0.0/24"), spec("fd00::/64")]),
        Err(RangeError::MixedFamilies(..))
    ));
    assert!(matches!(
        parse_set(&[spec("10.1.0.0/24"), spec("10.1.0.0/25")]),
        Err(RangeError::Overlap(..))
    ));
    assert!(matches!(parse_set(&[]), Err(RangeError::EmptySet)));
}

#[test]
fn occupy_and_release() {
    let mut a = alloc(&[spec("10.6.0.0/24")]);
    a.occupy(ip("10.6.0.7")).expect("free");
    assert_eq!(
        a.occupy(ip("10.6.0.7")),
        Err(OccupyError::Taken(ip("10.6.0.7")))
    );
    assert_eq!(
        a.occupy(ip("10.6.0.1")),
        Err(OccupyError::NotInRange(ip("10.6.0.1")))
    );
    assert_eq!(a.free(), 252);
    assert!(a.release(ip("10.6.0.7")));
    assert!(!a.release(ip("10.6.0.7")));
}

#[test]
fn huge_v6_range_is_cheap() {
    let mut a = alloc(&[spec("fd00:1::/64")]);
    assert_eq!(a.size(), (1u128 << 64) - 2);
    assert_eq!(a.allocate_next(), Some(ip("fd00:1::2")));
}

fn arb_range() -> impl Strategy<Value = (RangeSpec, bool)> {
    // Small IPv4 and IPv6 subnets with optional start/end offsets and gateway.
    (
        any::<bool>(),
        24u8..=30,
        any::<u32>(),
        any::<u8>(),
        any::<u8>(),
        any::<Option<u8>>(),
    )
        .prop_map(|(v6, len, base, a, b, gw)| {
            let (net, bits) = if v6 {
                (
                    IpNet::new(IpAddr::V6(Ipv6Addr::from((base as u128) << 32)), len + 96)
                        .expect("prefix"),
                    32 - len as u32,
                )
            } else {
                (
                    IpNet::new(IpAddr::V4(Ipv4Addr::from(base)), len).expect("prefix"),
                    32 - len as u32,
                )
            };
            let net = net.trunc();
            let span = 1u128 << bits;
            let n = to_u128(net.network());
            let fam = Family::of(&net.addr());
            let (lo, hi) = ((a as u128) % span, (b as u128) % span);
            let (lo, hi) = (lo.min(hi).max(1), lo.max(hi).max(1));
            let s = RangeSpec {
                subnet: net.to_string(),
                range_start: Some(from_u128(fam, n + lo).to_string()),
                range_end: Some(from_u128(fam, n + hi).to_string()),
                gateway: gw.map(|g| from_u128(fam, n + (g as u128) % span).to_string()),
            };
            (s, v6)
        })
}

proptest! {
    /// Allocating until exhaustion hands out exactly `size()` distinct allocatable addresses.
    #[test]
    fn exhausts_exactly_and_never_hands_out_excluded((s, _v6) in arb_range()) {
        let ranges = match parse_set(std::slice::from_ref(&s)) {
            Ok(r) => r,
            Err(_) => return Ok(()), // e.g. rangeStart after a v4 broadcast-only end
        };
        let r = ranges[0].clone();
        let mut a = RangeAllocator::new(ranges);
        let mut seen = BTreeSet::new();
        while let Some(ip) = a.allocate_next() {
            prop_assert!(r.allocatable(ip), "{ip} not allocatable in {r}");
            prop_assert!(Some(ip) != r.gateway);
            prop_assert!(ip != r.subnet.network());
            prop_assert!(seen.insert(ip), "{ip} twice");
        }
        prop_assert_eq!(seen.len() as u128, r.size());
        prop_assert_eq!(a.free(), 0);
    }

    /// Random allocate/release sequences never hand out an address that is taken.
    #[test]
    fn never_hands_out_a_taken_address(ops in proptest::collection::vec(any::<(bool, u8)>(), 1..200)) {
        let mut a = alloc(&[spec("10.7.0.0/27")]);
        let mut held: Vec<IpAddr> = Vec::new();
        for (alloc_it, pick) in ops {
            if alloc_it || held.is_empty() {
                match a.allocate_next() {
                    Some(ip) => {
                        prop_assert!(!held.contains(&ip));
                        held.push(ip);
                    }
                    None => prop_assert_eq!(held.len() as u128, a.size()),
                }
            } else {
                let ip = held.swap_remove(pick as usize % held.len());
                prop_assert!(a.release(ip));
            }
            prop_assert_eq!(a.free(), a.size() - held.len() as u128);
        }
    }
}

proptest! {
    /// The chunked bitmap answers like a plain set: membership, counts, and the first free
    /// address of any span (across chunk boundaries, with full chunks, and up to u128::MAX).
    #[test]
    fn taken_is_a_set(
        ops in proptest::collection::vec((0u8..3, 0u128..2100), 1..400),
        spans in proptest::collection::vec((0u128..2100, 0u128..2100, 0u128..5), 1..20),
        high in proptest::collection::vec(0u128..600, 0..40),
    ) {
        let mut t = Taken::default();
        let mut model = BTreeSet::new();
        // A full chunk (512..1024) so that it is skipped whole.
        for v in 512..1024u128 {
            t.insert(v);
            model.insert(v);
        }
        for (op, v) in ops {
            match op {
                0 => prop_assert_eq!(t.insert(v), model.insert(v)),
                1 => prop_assert_eq!(t.remove(v), model.remove(&v)),
                _ => prop_assert_eq!(t.contains(v), model.contains(&v)),
            }
            prop_assert_eq!(t.len(), model.len() as u128);
        }
        for (a, b, m) in spans {
            let (from, to) = (a.min(b), a.max(b));
            // `ok` rejects multiples of m (when m > 1), like excluded addresses.
            let ok = |v: u128| m < 2 || !v.is_multiple_of(m);
            let want = (from..=to).find(|v| !model.contains(v) && ok(*v));
            prop_assert_eq!(t.first_free(from, to, ok), want);
        }
        // The top of the address space: no overflow.
        for d in high {
            t.insert(u128::MAX - d);
        }
        let top = t.first_free(u128::MAX - 700, u128::MAX, |_| true);
        prop_assert!(top.is_none_or(|v| !t.contains(v)));
    }
}

#[test]
fn peek_next_skipping_steps_over_held_back_stretches_and_stops_when_none_is_left() {
    let a = RangeAllocator::new(vec![Range::from_spec(&RangeSpec {
        subnet: "10.1.0.0/16".into(),
        range_start: None,
        range_end: None,
        gateway: None,
    })
    .unwrap()]);
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    // 10.1.0.0/17 held back (32 767 free addresses in it), and 10.1.128.1.
    let skip = |x: IpAddr| match x {
        IpAddr::V4(v) if u32::from(v) < u32::from(std::net::Ipv4Addr::new(10, 1, 128, 0)) => {
            Some(ip("10.1.127.255"))
        }
        x if x == ip("10.1.128.1") => Some(x),
        _ => None,
    };
    assert_eq!(
        a.peek_next_skipping(2, 4, skip),
        vec![ip("10.1.128.0"), ip("10.1.128.2")]
    );
    // Everything held back: nothing, after a bounded number of steps.
    assert!(a.peek_next_skipping(1, 4, Some).is_empty());
    assert!(a
        .peek_next_skipping(1, 4, |_| Some(ip("10.1.255.254")))
        .is_empty());
}
