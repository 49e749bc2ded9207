use super::*;

fn ok(
    addressing: Option<Addressing>,
    gw: Option<Gateways>,
    exclude: &[&str],
) -> Result<Option<SubnetMode>, Invalid> {
    let exclude: Vec<String> = exclude.iter().map(|s| s.to_string()).collect();
    subnet_mode("n", addressing, gw.as_ref(), &exclude, Spelling::Toml)
}

#[test]
fn a_cni_configs_errors_name_its_keys_as_it_writes_them() {
    let e = subnet_mode(
        "n",
        None,
        Some(&Gateways::One("10.0.0.1".into())),
        &[],
        Spelling::Cni,
    )
    .unwrap_err();
    assert!(
        e.0.contains("ipam.gateway and ipam.exclude go with \"addressing\": \"subnet\""),
        "{e}"
    );
    let e = subnet_mode(
        "n",
        Some(Addressing::Subnet),
        None,
        &["x".into()],
        Spelling::Cni,
    )
    .unwrap_err();
    assert!(e.0.contains("ipam.exclude \"x\""), "{e}");
}

/// While a network holds addresses of a family, that family's gateways stay exactly as
/// they are (their order too: of two in one CIDR the first is used); a family it holds
/// none of takes or drops one.
#[test]
fn gateways_change_only_in_the_families_held_nowhere() {
    use crate::range::Family;
    let mode = |g: &[&str]| SubnetMode {
        gateways: g.iter().map(|g| g.parse().unwrap()).collect(),
        exclude: Vec::new(),
    };
    let v4: std::collections::BTreeSet<Family> = [Family::V4].into();
    let keeps =
        |a: &[&str], b: &[&str]| SubnetMode::keeps_gateways(Some(&mode(a)), Some(&mode(b)), &v4);
    assert!(keeps(&["10.0.0.1"], &["10.0.0.1", "fd00::1"]), "IPv6 added");
    assert!(
        keeps(&["10.0.0.1", "fd00::1"], &["10.0.0.1"]),
        "IPv6 dropped"
    );
    assert!(!keeps(&["10.0.0.1"], &["10.0.0.254"]), "IPv4 moved");
    assert!(
        !keeps(&["10.0.0.1", "10.0.0.2"], &["10.0.0.2", "10.0.0.1"]),
        "IPv4 reordered"
    );
    assert!(
        !keeps(&["10.0.0.1"], &["10.0.0.1", "10.0.1.1"]),
        "IPv4 added"
    );
    assert!(!SubnetMode::keeps_gateways(None, Some(&mode(&[])), &v4));
    assert!(SubnetMode::keeps_gateways(None, None, &v4));
}

#[test]
fn block_addressing_takes_no_gateway_or_exclude() {
    assert_eq!(ok(None, None, &[]), Ok(None));
    assert_eq!(ok(Some(Addressing::Block), None, &[]), Ok(None));
    let e = ok(None, Some(Gateways::One("10.0.0.1".into())), &[]).unwrap_err();
    assert!(e.0.contains("go with addressing = \"subnet\""), "{e}");
    let e = ok(Some(Addressing::Block), None, &["10.0.0.1"]).unwrap_err();
    assert!(e.0.contains("go with addressing"), "{e}");
}

#[test]
fn subnet_addressing_reads_gateways_and_exclusions() {
    let m = ok(
        Some(Addressing::Subnet),
        Some(Gateways::Many(vec![
            "192.168.2.1".into(),
            "fd00:2::1".into(),
        ])),
        &["192.168.2.229/30", "192.168.2.7", "fd00:2::/120"],
    )
    .unwrap()
    .unwrap();
    assert_eq!(m.gateways.len(), 2);
    assert_eq!(
        m.exclude,
        vec![
            "192.168.2.228/30".parse::<IpNet>().unwrap(),
            "192.168.2.7/32".parse().unwrap(),
            "fd00:2::/120".parse().unwrap(),
        ]
    );
    let cidr: IpNet = "192.168.2.0/24".parse().unwrap();
    assert_eq!(m.gateway_in(&cidr), Some("192.168.2.1".parse().unwrap()));
    let other: IpNet = "192.168.3.0/24".parse().unwrap();
    assert_eq!(m.gateway_in(&other), None);
    // No gateway at all is fine: an L2 network without a router.
    assert_eq!(
        ok(Some(Addressing::Subnet), None, &[]),
        Ok(Some(SubnetMode::default()))
    );
}

#[test]
fn what_does_not_fit_the_pools_cidrs_is_named() {
    let m = ok(
        Some(Addressing::Subnet),
        Some(Gateways::Many(vec![
            "10.0.0.1".into(),
            "10.0.0.2".into(),
            "10.9.0.1".into(),
        ])),
        &["10.0.0.64/30", "10.8.0.0/24"],
    )
    .unwrap()
    .unwrap();
    let cidrs: Vec<IpNet> = vec!["10.0.0.0/24".parse().unwrap()];
    let misfits = m.misfits(&cidrs);
    assert_eq!(misfits.len(), 3, "{misfits:?}");
    assert!(
        misfits[0].contains("gateway 10.9.0.1 is in none"),
        "{misfits:?}"
    );
    assert!(misfits[1].contains("gateways 10.0.0.1, 10.0.0.2 are all in 10.0.0.0/24"));
    assert!(misfits[2].contains("exclude 10.8.0.0/24 is in none"));
    let fine = ok(
        Some(Addressing::Subnet),
        Some(Gateways::One("10.0.0.1".into())),
        &[],
    )
    .unwrap()
    .unwrap();
    assert!(fine.misfits(&cidrs).is_empty());
}

#[test]
fn bad_values_are_named() {
    let e = ok(
        Some(Addressing::Subnet),
        Some(Gateways::One("10.0.0.300".into())),
        &[],
    )
    .unwrap_err();
    assert!(
        e.0.contains("gateway \"10.0.0.300\" is not an IP address"),
        "{e}"
    );
    let e = ok(
        Some(Addressing::Subnet),
        Some(Gateways::Many(vec!["10.0.0.1".into(), "10.0.0.1".into()])),
        &[],
    )
    .unwrap_err();
    assert!(e.0.contains("listed twice"), "{e}");
    let e = ok(Some(Addressing::Subnet), None, &["10.0.0.0/33"]).unwrap_err();
    assert!(e.0.contains("exclude \"10.0.0.0/33\": not a CIDR"), "{e}");
}
