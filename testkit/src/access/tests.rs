use super::*;

fn attrs(method: &str, path: &str) -> Attributes {
    Attributes::of(method, path, &BTreeMap::new()).expect("a resource path")
}

fn operator() -> UserInfo {
    UserInfo::service_account("ipool-system", "ipool-operator")
}

fn daemon(node: &str) -> UserInfo {
    UserInfo::pod_on_node("ipool-system", "ipool", "ipool-x", node)
}

#[test]
fn requests_are_read_as_the_authorizer_reads_them() {
    let a = attrs(
        "GET",
        "/apis/coordination.k8s.io/v1/namespaces/ipool-system/leases",
    );
    assert_eq!(
        (
            a.verb.as_str(),
            a.group.as_str(),
            a.resource.as_str(),
            a.namespace.as_str()
        ),
        ("list", "coordination.k8s.io", "leases", "ipool-system")
    );
    let a = attrs("DELETE", "/apis/ipool.io/v1/ipblocks/10-0-0-0-28");
    assert_eq!(
        (a.verb.as_str(), a.name.as_str()),
        ("delete", "10-0-0-0-28")
    );
    let a = attrs("GET", "/api/v1/nodes/n1");
    assert_eq!((a.verb.as_str(), a.group.as_str()), ("get", ""));
    let mut q = BTreeMap::new();
    q.insert("watch".to_string(), "true".to_string());
    let a = Attributes::of("GET", "/api/v1/pods", &q).unwrap();
    assert_eq!(a.verb, "watch");
    assert!(Attributes::of("GET", "/version", &q).is_none());
}

/// The shipped operator role reads what `ipoolctl cluster nodes` and `check` read: the
/// Leases of its namespace listed ("cannot list resource leases").
#[test]
fn the_shipped_operator_role_lists_the_leases_and_no_more() {
    let access = Access::cluster_kubernetes();
    let ops = operator();
    for (m, p) in [
        (
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/ipool-system/leases",
        ),
        (
            "GET",
            "/apis/coordination.k8s.io/v1/namespaces/ipool-system/leases/ipool-n1",
        ),
        ("GET", "/apis/ipool.io/v1/ippools"),
        ("POST", "/apis/ipool.io/v1/ippools"),
        ("GET", "/api/v1/nodes"),
        ("GET", "/api/v1/pods"),
    ] {
        let r = access.authorize(&ops, &attrs(m, p));
        assert!(r.is_ok(), "{m} {p}: {r:?}");
    }
    // Not in another namespace, nor blocks created by hand.
    let e = access
        .authorize(
            &ops,
            &attrs(
                "GET",
                "/apis/coordination.k8s.io/v1/namespaces/default/leases",
            ),
        )
        .unwrap_err();
    assert_eq!(e.status, 403);
    let msg = e.body["message"].as_str().unwrap();
    assert!(
        msg.contains("cannot list resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"default\""),
        "{msg}"
    );
    let e = access
        .authorize(&ops, &attrs("POST", "/apis/ipool.io/v1/ipblocks"))
        .unwrap_err();
    assert!(e.body["message"]
        .as_str()
        .unwrap()
        .contains("at the cluster scope"));
    // An admin passes; another ServiceAccount has nothing.
    assert!(access
        .authorize(
            &UserInfo::admin(),
            &attrs("DELETE", "/apis/ipool.io/v1/ippools/p")
        )
        .is_ok());
    let nobody = UserInfo::service_account("default", "app");
    assert!(access
        .authorize(&nobody, &attrs("GET", "/apis/ipool.io/v1/ippools"))
        .is_err());
}

fn block(name: &str, node: &str) -> Value {
    json!({"apiVersion": "ipool.io/v1", "kind": "IPBlock",
           "metadata": {"name": name, "labels": {"ipool.io/node": node, "ipool.io/pool": "p"}},
           "spec": {"node": node, "pool": "p", "cidr": "10.0.0.0/28"}})
}

/// The shipped admission policies keep each daemon to its own node's blocks and Lease.
#[test]
fn the_shipped_policies_keep_a_daemon_to_its_own_node() {
    let access = Access::cluster_kubernetes();
    let n1 = daemon("n1");
    let create = attrs("POST", "/apis/ipool.io/v1/ipblocks");
    assert!(access
        .admit(&n1, &create, Some(&block("b", "n1")), None)
        .is_ok());
    let e = access
        .admit(&n1, &create, Some(&block("b", "n2")), None)
        .unwrap_err();
    assert_eq!(e.status, 422);
    let msg = e.body["message"].as_str().unwrap();
    assert!(
        msg.contains("ipool-own-node-blocks") && msg.contains("writes only its own node's blocks"),
        "{msg}"
    );
    let delete = attrs("DELETE", "/apis/ipool.io/v1/ipblocks/b");
    assert!(access
        .admit(&n1, &delete, None, Some(&block("b", "n2")))
        .is_err());
    // The operator is not held to a node.
    assert!(access
        .admit(&operator(), &delete, None, Some(&block("b", "n2")))
        .is_ok());
    let lease =
        |name: &str| json!({"metadata": {"name": name, "namespace": "ipool-system"}, "spec": {}});
    let update = |name: &str| {
        attrs(
            "PUT",
            &format!("/apis/coordination.k8s.io/v1/namespaces/ipool-system/leases/{name}"),
        )
    };
    let own = lease("ipool-n1");
    assert!(access
        .admit(&n1, &update("ipool-n1"), Some(&own), Some(&own))
        .is_ok());
    let lead = lease("ipool.release-departed");
    assert!(access
        .admit(
            &n1,
            &update("ipool.release-departed"),
            Some(&lead),
            Some(&lead)
        )
        .is_err());
    // A token that names no node.
    let bare = UserInfo::service_account("ipool-system", "ipool");
    let e = access
        .admit(&bare, &create, Some(&block("b", "n1")), None)
        .unwrap_err();
    assert!(e.body["message"].as_str().unwrap().contains("names none"));
}
