use super::*;

fn p() -> &'static Path {
    Path::new("/run/flannel/subnet.env")
}

fn set(subnet: &str, gw: &str) -> Vec<RangeSpec> {
    vec![RangeSpec {
        subnet: subnet.into(),
        range_start: None,
        range_end: None,
        gateway: Some(gw.into()),
    }]
}

fn route(dst: &str) -> RouteSpec {
    RouteSpec {
        dst: dst.into(),
        gw: None,
    }
}

#[test]
fn flannel_writes_the_first_usable_address() {
    let text = "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n";
    assert_eq!(
        parse(p(), text),
        Seen::Ranges {
            sets: vec![set("10.244.1.0/24", "10.244.1.1")],
            routes: vec![route("10.244.0.0/16")],
        }
    );
}

#[test]
fn dual_stack_puts_ipv4_first() {
    let text = "FLANNEL_IPV6_SUBNET=fd00:10:244:1::1/64\nFLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.7.1/24\n";
    assert_eq!(
        parse(p(), text),
        Seen::Ranges {
            sets: vec![
                set("10.244.7.0/24", "10.244.7.1"),
                set("fd00:10:244:1::/64", "fd00:10:244:1::1")
            ],
            routes: vec![route("fd00:10:244::/56"), route("10.244.0.0/16")],
        }
    );
}

#[test]
fn ipv6_only() {
    let Seen::Ranges { sets, .. } = parse(p(), "FLANNEL_IPV6_SUBNET=fd00::1/64\n") else {
        panic!()
    };
    assert_eq!(sets, vec![set("fd00::/64", "fd00::1")]);
}

#[test]
fn malformed_files_are_named() {
    for (text, needle) in [
        (
            "FLANNEL_SUBNET=10.244.1.0/33\n",
            "FLANNEL_SUBNET=\"10.244.1.0/33\" is not",
        ),
        ("FLANNEL_SUBNET=10.244.1.0/24\n", "first usable address"),
        ("FLANNEL_SUBNET=fd00::1/64\n", "is not an IPv4 one"),
        ("FLANNEL_IPV6_SUBNET=10.0.0.1/24\n", "is not an IPv6 one"),
        (
            "FLANNEL_SUBNET=10.1.0.1/24\nFLANNEL_NETWORK=banana\n",
            "FLANNEL_NETWORK",
        ),
        (
            "FLANNEL_SUBNET=10.1.0.1/24\nFLANNEL_SUBNET=10.2.0.1/24\n",
            "twice",
        ),
        ("garbage\n", "line 1"),
    ] {
        match parse(p(), text) {
            Seen::Bad(why) => assert!(why.contains(needle), "{text:?}: {why}"),
            other => panic!("{text:?}: {other:?}"),
        }
    }
}

#[test]
fn no_subnet_yet_is_missing() {
    assert!(matches!(
        parse(p(), "FLANNEL_NETWORK=10.244.0.0/16\n"),
        Seen::Missing(_)
    ));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("subnet.env");
    match look(&file) {
        Seen::Missing(why) => assert!(why.contains("is missing"), "{why}"),
        other => panic!("{other:?}"),
    }
    std::fs::create_dir(&file).unwrap();
    assert!(matches!(look(&file), Seen::Bad(why) if why.contains("not a regular file")));
}

#[test]
fn network_lists_become_one_route_each() {
    let text = "FLANNEL_NETWORK=10.244.0.0/16,10.245.0.0/16\nFLANNEL_IPV6_NETWORK=fd00:10:244::/56, fd00:10:245::/56\nFLANNEL_SUBNET=10.244.1.1/24\n";
    let Seen::Ranges { routes, .. } = parse(p(), text) else {
        panic!("{:?}", parse(p(), text))
    };
    assert_eq!(
        routes,
        vec![
            route("10.244.0.0/16"),
            route("10.245.0.0/16"),
            route("fd00:10:244::/56"),
            route("fd00:10:245::/56")
        ]
    );
    let bad = parse(
        p(),
        "FLANNEL_NETWORK=10.244.0.0/16,nope\nFLANNEL_SUBNET=10.244.1.1/24\n",
    );
    assert!(
        matches!(&bad, Seen::Bad(e) if e.contains("comma-separated list")),
        "{bad:?}"
    );
}

#[test]
fn a_change_applies_only_once_two_reads_agree() {
    let full = parse(p(), "FLANNEL_SUBNET=10.244.1.1/24\n");
    let half = parse(p(), "FLANNEL_SUBNET=10.244.1.1/2\n");
    let mut s = Settle::default();
    assert_eq!(
        s.read(full.clone()),
        None,
        "a first read waits for a second"
    );
    assert!(s.waiting());
    assert_eq!(s.read(full.clone()), Some(full.clone()));
    s.applied(full.clone());
    assert!(!s.waiting());
    assert_eq!(s.read(full.clone()), None, "nothing new");
    // Read half written once, then whole again: never applied.
    assert_eq!(s.read(half.clone()), None);
    assert_eq!(s.read(full.clone()), None);
    assert!(!s.waiting());
    // A real change: applied on its second read.
    let moved = parse(p(), "FLANNEL_SUBNET=10.244.9.1/24\n");
    assert_eq!(s.read(moved.clone()), None);
    assert_eq!(s.read(half), None, "a different second read starts over");
    assert_eq!(s.read(moved.clone()), None);
    assert_eq!(s.read(moved.clone()), Some(moved));
}
