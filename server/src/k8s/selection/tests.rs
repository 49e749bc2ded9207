use super::*;

fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn the_pods_choice_comes_before_its_namespaces_and_either_before_the_networks() {
    let pod = chosen(Some(&ann(&[(POOL, "gold")])), "pod a/p").unwrap();
    let ns = chosen(Some(&ann(&[(POOLS, "tenant-a, shared")])), "namespace a").unwrap();
    assert_eq!(ns.as_ref().unwrap().pools, ["tenant-a", "shared"]);
    let both = most_specific(pod.clone(), ns.clone()).unwrap();
    assert_eq!(both.pools, ["gold"]);
    assert!(
        both.from.contains("pod a/p") && both.from.contains(POOL),
        "{}",
        both.from
    );
    let only_ns = most_specific(None, ns).unwrap();
    assert_eq!(only_ns.pools, ["tenant-a", "shared"]);
    assert!(only_ns.from.contains("namespace a"), "{}", only_ns.from);
    assert_eq!(most_specific(None, None), None);
    // Other annotations choose nothing.
    assert_eq!(
        chosen(Some(&ann(&[("ipool.io/sticky", "true")])), "pod").unwrap(),
        None
    );
    assert_eq!(chosen(None, "pod").unwrap(), None);
}

#[test]
fn an_annotation_that_cannot_name_pools_is_refused_saying_why() {
    for (pairs, says) in [
        (&[(POOL, "a"), (POOLS, "b")][..], "keep one"),
        (&[(POOL, "a,b")][..], "2 pools"),
        (&[(POOLS, " , ")][..], "no pool"),
        (&[(POOLS, "a,a")][..], "twice"),
        (&[(POOL, "bad/name")][..], "pool name"),
    ] {
        let e = chosen(Some(&ann(pairs)), "pod a/p").unwrap_err();
        assert!(
            e.0.contains(says) && e.0.contains("pod a/p"),
            "{pairs:?}: {e}"
        );
    }
}
