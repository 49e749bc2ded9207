use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn each_kind_of_requirement_matches_as_kubernetes_does() {
    let node = labels(&[("zone", "a"), ("rack", "r2"), ("kubernetes.io/os", "linux")]);
    let yes = [
        "zone=a",
        "zone==a",
        "zone!=b",
        "gpu!=yes",
        "rack in (r1,r2)",
        "rack notin (r3)",
        "gpu notin (yes)",
        "zone",
        "!gpu",
        "kubernetes.io/os=linux",
        "zone=a, rack in (r1, r2),!gpu",
    ];
    for s in yes {
        assert!(NodeSelector::parse(s).unwrap().matches(&node), "{s}");
    }
    let no = [
        "zone=b",
        "zone!=a",
        "rack in (r1,r3)",
        "rack notin (r2)",
        "gpu",
        "gpu in (yes)",
        "!zone",
        "zone=a,gpu",
    ];
    for s in no {
        assert!(!NodeSelector::parse(s).unwrap().matches(&node), "{s}");
    }
    assert!(!NodeSelector::parse("zone=a")
        .unwrap()
        .matches(&BTreeMap::new()));
}

#[test]
fn bad_selectors_are_refused_naming_what_is_wrong() {
    for (s, says) in [
        ("", "empty"),
        ("zone=a,,rack=b", "empty requirement"),
        ("zone in (a", "without its ')'"),
        ("zone in a,b", "parentheses"),
        ("zone=a b", "label value"),
        ("-zone=a", "label key"),
        (
            "zone=this-value-is-much-too-long-for-a-kubernetes-label-value-by-far-and-then-some",
            "label value",
        ),
        ("zone in ()", "at least one value"),
        ("zone between (a)", "not a requirement"),
        ("Bad_Prefix/x=1", "label key prefix"),
    ] {
        let e = NodeSelector::parse(s).unwrap_err();
        assert!(e.0.contains(says), "{s}: {e}");
    }
}

#[test]
fn the_normal_form_parses_back_to_the_same_selector() {
    let s = NodeSelector::parse(" zone = a , rack in (r2,r1), !gpu,ssd").unwrap();
    assert_eq!(s.to_string(), "zone=a,rack in (r1,r2),!gpu,ssd");
    assert_eq!(NodeSelector::parse(&s.to_string()).unwrap(), s);
}
