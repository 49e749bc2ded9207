use super::*;

#[test]
fn block_names_are_one_per_block_and_valid_object_names() {
    let cases = [
        ("10.0.0.0/26", "10-0-0-0-26"),
        ("10.0.0.64/26", "10-0-0-64-26"),
        ("fd00::/122", "fd00-0-0-0-0-0-0-0-122"),
        ("fd00::40/122", "fd00-0-0-0-0-0-0-40-122"),
    ];
    for (cidr, name) in cases {
        let net: IpNet = cidr.parse().unwrap();
        assert_eq!(block_name(&net), name);
        let obj = new_block("p", 1, &net, "n1", 5);
        let back = parse_block(&obj).unwrap();
        assert_eq!((back.block, back.owner.node.as_str()), (net, "n1"));
    }
}

#[test]
fn a_block_whose_name_is_not_its_cidr_is_malformed_and_occupied() {
    let mut obj = new_block("p", 1, &"10.0.0.0/26".parse().unwrap(), "n1", 5);
    obj.metadata.name = Some("10-0-0-64-26".into());
    let m = parse_block(&obj).unwrap_err();
    assert_eq!(m.block, Some("10.0.0.0/26".parse().unwrap()));
    assert!(m.why.contains("not the block its name"), "{}", m.why);
}

#[test]
fn a_block_being_deleted_is_nobodys_and_occupied() {
    let mut obj = new_block("p", 1, &"10.0.0.0/26".parse().unwrap(), "n1", 5);
    obj.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    let m = parse_block(&obj).unwrap_err();
    assert_eq!(m.block, Some("10.0.0.0/26".parse().unwrap()));
}

#[test]
fn pools_round_trip_with_their_phase() {
    let spec = PoolSpec {
        name: "p".into(),
        cidrs: vec![
            "10.0.0.0/16".parse().unwrap(),
            "fd00::/112".parse().unwrap(),
        ],
        block_v4: 26,
        block_v6: 122,
        exclude: vec!["10.0.1.0/24".parse().unwrap()],
        ..PoolSpec::default()
    };
    let obj = with_phase(&new_pool(&spec, PoolPhase::Pending), PoolPhase::Deleting);
    assert_eq!(
        parse_pool(&obj).unwrap(),
        (spec.clone(), PoolPhase::Deleting)
    );
    // Disabled, a CIDR on its way in: both read back.
    let changed = PoolSpec {
        cidrs: vec![
            "10.0.0.0/16".parse().unwrap(),
            "fd00::/112".parse().unwrap(),
            "10.1.0.0/16".parse().unwrap(),
        ],
        adding: vec!["10.1.0.0/16".parse().unwrap()],
        removing: vec!["fd00::/112".parse().unwrap()],
        reserved: vec![
            Reserved {
                cidr: "10.0.0.5/32".parse().unwrap(),
                reason: "a legacy host".into(),
            },
            Reserved {
                cidr: "10.0.2.0/28".parse().unwrap(),
                reason: String::new(),
            },
        ],
        disabled: true,
        ..spec
    };
    let obj = with_spec(&obj, &changed);
    assert_eq!(parse_pool(&obj).unwrap(), (changed, PoolPhase::Deleting));
}

/// A real apiserver drops the fields a CRD's schema does not declare: every field ipool
/// writes is declared in deploy/crds.
#[test]
fn every_field_written_is_in_the_crds() {
    let blocks = include_str!("../../../../../deploy/crds/ipblocks.yaml");
    let pools = include_str!("../../../../../deploy/crds/ippools.yaml");
    let block = new_block("p", 1, &"10.0.0.0/26".parse().unwrap(), "n", 1);
    let spec = PoolSpec {
        name: "p".into(),
        cidrs: vec!["10.0.0.0/16".parse().unwrap()],
        block_v4: 26,
        block_v6: 122,
        exclude: vec![],
        disabled: true,
        adding: vec!["10.0.0.0/16".parse().unwrap()],
        removing: vec!["10.0.0.0/16".parse().unwrap()],
        reserved: vec![Reserved {
            cidr: "10.0.0.5/32".parse().unwrap(),
            reason: "r".into(),
        }],
        node_selector: Some("zone=a".into()),
    };
    let pool = new_pool(&spec, PoolPhase::Ready);
    let mut written: Vec<(&str, String)> = Vec::new();
    for k in block.data["spec"].as_object().unwrap().keys() {
        written.push((blocks, k.clone()));
    }
    written.push((blocks, "settledAtMs".into()));
    for part in ["spec", "status"] {
        for k in pool.data[part].as_object().unwrap().keys() {
            written.push((pools, k.clone()));
        }
    }
    for (crd, field) in written {
        assert!(
            crd.lines().any(|l| l.trim_start() == format!("{field}:")),
            "{field} is not declared in deploy/crds"
        );
    }
}
