use super::*;
use crate::cluster::ippool::PoolSpec;

#[test]
fn block_keys_round_trip() {
    let b: IpNet = "10.0.1.64/26".parse().unwrap();
    assert_eq!(block_key_part(&b), "10.0.1.64-26");
    assert_eq!(parse_block_part("10.0.1.64-26"), Some(b));
    let v6: IpNet = "fd00::40/122".parse().unwrap();
    assert_eq!(parse_block_part(&block_key_part(&v6)), Some(v6));
    assert_eq!(parse_block_part("nonsense"), None);
}

#[test]
fn pools_are_checked() {
    let net = |s: &str| s.parse::<IpNet>().unwrap();
    let ok = PoolSpec {
        name: "a".into(),
        cidrs: vec![net("10.0.0.0/16"), net("fd00::/112")],
        block_v4: 26,
        block_v6: 122,
        exclude: vec![net("10.0.0.0/24")],
        ..PoolSpec::default()
    };
    ok.validate().unwrap();
    for (bad, needle) in [
        (
            PoolSpec {
                cidrs: vec![],
                ..ok.clone()
            },
            "no CIDR",
        ),
        (
            PoolSpec {
                cidrs: vec![net("10.0.0.0/16"), net("10.0.5.0/24")],
                ..ok.clone()
            },
            "overlap",
        ),
        (
            PoolSpec {
                exclude: vec![net("192.168.0.0/24")],
                ..ok.clone()
            },
            "in none of its CIDRs",
        ),
        (
            PoolSpec {
                block_v4: 8,
                ..ok.clone()
            },
            "does not fit",
        ),
        (
            PoolSpec {
                name: "a b".into(),
                ..ok.clone()
            },
            "pool name",
        ),
        (
            PoolSpec {
                block_v4: 31,
                ..ok.clone()
            },
            "IPv4 blocks of /31 leave no address",
        ),
        (
            PoolSpec {
                block_v6: 127,
                ..ok.clone()
            },
            "at most /126",
        ),
    ] {
        let e = bad.validate().unwrap_err();
        assert!(e.0.contains(needle), "{e}");
    }
}
