use super::*;
use serde_json::json;

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).expect("pod json")
}

#[test]
fn a_statefulset_pod_is_sticky_and_named_by_its_owner() {
    let p = pod(
        json!({"metadata": {"namespace": "db", "name": "web-0", "uid": "u1",
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web",
                             "uid": "o1", "controller": true}]}}),
    );
    let info = pod_info(&p, &[]).expect("info");
    assert_eq!(info.meta.owner, "StatefulSet/web");
    assert!(info.meta.sticky);
    assert_eq!(info.meta.sticky_ttl_secs, None);
    assert!(info.ips.is_empty());
}

#[test]
fn other_owners_are_not_sticky_unless_listed() {
    let p = pod(json!({"metadata": {"namespace": "a", "name": "x-1",
        "ownerReferences": [{"apiVersion": "apps.kruise.io/v1alpha1", "kind": "CloneSet",
                             "name": "x", "uid": "o1"}]}}));
    assert!(!pod_info(&p, &[]).unwrap().meta.sticky);
    let listed = pod_info(&p, &["CloneSet".to_string()]).unwrap();
    assert!(listed.meta.sticky);
    assert_eq!(listed.meta.owner, "CloneSet/x");
    // The name pattern means nothing here.
    let bare = pod(json!({"metadata": {"namespace": "a", "name": "web-0"}}));
    let info = pod_info(&bare, &[]).unwrap();
    assert!(!info.meta.sticky);
    assert_eq!(info.meta.owner, "");
}

#[test]
fn annotations_override() {
    let p = pod(
        json!({"metadata": {"namespace": "a", "name": "p", "annotations": {
        "ipool.io/sticky": "true", "ipool.io/sticky-ttl": "90",
        "ipool.io/ips": "10.244.1.7, fd00::7"}}}),
    );
    let info = pod_info(&p, &[]).unwrap();
    assert!(info.meta.sticky);
    assert_eq!(info.meta.sticky_ttl_secs, Some(90));
    assert_eq!(
        info.ips,
        vec![
            "10.244.1.7".parse::<IpAddr>().unwrap(),
            "fd00::7".parse().unwrap()
        ]
    );
    let off = pod(json!({"metadata": {"namespace": "a", "name": "web-0",
        "annotations": {"ipool.io/sticky": "false"},
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "o"}]}}));
    assert!(!pod_info(&off, &[]).unwrap().meta.sticky);
}

#[test]
fn malformed_annotations_are_named() {
    for (k, v, needle) in [
        ("ipool.io/sticky", "yes", "neither \"true\" nor \"false\""),
        ("ipool.io/sticky-ttl", "0", "at least 1"),
        ("ipool.io/sticky-ttl", "soon", "not a number of seconds"),
        ("ipool.io/sticky-ttl", "99999999999", "at most"),
        (
            "ipool.io/ips",
            "10.0.0.1,banana",
            "\"banana\" is not an IP address",
        ),
    ] {
        let p = pod(json!({"metadata": {"namespace": "a", "name": "p", "annotations": {k: v}}}));
        let e = pod_info(&p, &[]).expect_err(v);
        assert!(
            e.0.contains("pod a/p") && e.0.contains(k) && e.0.contains(needle),
            "{e}"
        );
    }
}

#[test]
fn pod_ips_skip_host_network_pods() {
    let p = pod(
        json!({"metadata": {"name": "p"}, "status": {"podIP": "10.1.0.5",
        "podIPs": [{"ip": "10.1.0.5"}, {"ip": "fd00::5"}]}}),
    );
    assert_eq!(pod_ips(&p).len(), 2);
    let old = pod(json!({"metadata": {"name": "p"}, "status": {"podIP": "10.1.0.5"}}));
    assert_eq!(pod_ips(&old), vec!["10.1.0.5".parse::<IpAddr>().unwrap()]);
    let done = pod(
        json!({"metadata": {"name": "job-x"}, "status": {"phase": "Succeeded",
        "podIPs": [{"ip": "10.1.0.6"}]}}),
    );
    assert!(
        pod_ips(&done).is_empty(),
        "a finished pod's DEL gave its address back"
    );
    let mirror = pod(json!({"metadata": {"name": "etcd-n1", "uid": "api-uid",
        "annotations": {"kubernetes.io/config.mirror": "hash-uid"}}}));
    assert!(same_pod(&mirror, "hash-uid") && same_pod(&mirror, "api-uid"));
    assert!(!same_pod(&mirror, "other") && same_pod(&mirror, ""));
    let host = pod(
        json!({"metadata": {"name": "p"}, "spec": {"hostNetwork": true, "containers": []},
        "status": {"podIPs": [{"ip": "192.168.1.10"}]}}),
    );
    assert!(pod_ips(&host).is_empty());
}
