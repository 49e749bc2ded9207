use super::*;

#[test]
fn embedded_default_parses() {
    let c = DaemonConfig::embedded();
    assert_eq!(c.defaults.cooldown_secs, 130);
    assert!(c.networks.is_empty());
}

#[test]
fn file_overrides_only_what_it_sets() {
    let c = DaemonConfig::parse(
        r#"
        [defaults]
        min_idle = 2
        [[network]]
        name = "pods"
        ranges = [[{ subnet = "10.10.0.0/24", rangeStart = "10.10.0.10" }]]
        routes = [{ dst = "0.0.0.0/0" }]
        max_idle = 9
        "#,
    )
    .expect("valid");
    assert_eq!(c.defaults.min_idle, 2);
    assert_eq!(c.defaults.cooldown_secs, 130);
    let defs = c.network_defs().expect("valid");
    assert_eq!(defs[0].tuning.max_idle, 9);
    assert_eq!(defs[0].tuning.min_idle, 2);
    assert_eq!(defs[0].origin, Origin::Config);
    assert_eq!(
        defs[0].range_sets[0][0].range_start.as_deref(),
        Some("10.10.0.10")
    );
}

#[test]
fn bad_toml_is_named() {
    for (text, needle) in [
        ("[defaults]\nmin_idl = 1", "min_idl"),
        ("[defaults]\nmin_idle = 5\nmax_idle = 1", "max_idle"),
        (
            "[[network]]\nname = \"a\"\nranges = [[{ subnet = \"10.0.0.1/24\" }]]",
            "host bits",
        ),
        (
            "[[network]]\nname = \"a\"\nranges = [[{ subnet = \"10.0.0.0/24\" }]]\n[[network]]\nname = \"a\"\nranges = [[{ subnet = \"10.1.0.0/24\" }]]",
            "twice",
        ),
        ("[[network]]\nname = \"a b\"\nranges = []", "network name"),
        (
            "[[network]]\nname = \"a\"\nranges = [[{ subnet = \"0.0.0.0/0\" }]]",
            "too broad",
        ),
        (
            "[[network]]\nname = \"a\"\nranges = [[{ subnet = \"10.0.0.0/16\" }]]\n[[network]]\nname = \"b\"\nranges = [[{ subnet = \"10.0.5.0/24\" }]]",
            "overlaps subnet 10.0.0.0/16 of network \"a\"",
        ),
        (
            "[leak_check]\ninterval_secs = 9223372036854775807",
            "[leak_check] interval_secs must be at most 31536000",
        ),
        ("[cni]\ngc_grace_secs = 99999999999", "gc_grace_secs"),
        ("[cni]\nadd_wait_ms = 600001", "add_wait_ms"),
        ("[store]\ncheckpoint_secs = 99999999999", "checkpoint_secs"),
        ("[defaults]\ncooldown_secs = 99999999999", "[defaults]: cooldown_secs"),
        ("[defaults]\nsticky_ttl_secs = 99999999999", "sticky_ttl_secs"),
        ("[defaults]\nmax_idle = 99999999999", "max_idle"),
        ("[defaults]\nsource_rate = inf", "source_rate"),
        (
            "[[network]]\nname = \"a\"\nranges = [[{ subnet = \"10.0.0.0/24\" }]]\ncooldown_secs = 99999999999",
            "network \"a\": cooldown_secs",
        ),
        ("[[network]]\nname = \"a\"", "has no ranges (set ranges, or ranges_from"),
        (
            "[[network]]\nname = \"a\"\nranges_from = \"node\"\nranges = [[{ subnet = \"10.0.0.0/24\" }]]",
            "both ranges and ranges_from",
        ),
        (
            "[[network]]\nname = \"a\"\nranges_from = \"node\"\nsubnet_file = \"/x\"",
            "subnet_file goes with ranges_from = \"flannel\"",
        ),
        ("[[network]]\nname = \"a\"\nranges_from = \"aws\"", "ranges_from"),
        ("[kubernetes]\npod_get_timeout_ms = 0", "pod_get_timeout_ms must be at least 100"),
        (
            "[[network]]\nname = \"a\"\nranges_from = \"cluster\"",
            "ranges_from = \"cluster\" needs cluster_pool",
        ),
        (
            "[[network]]\nname = \"a\"\nranges_from = \"cluster\"\ncluster_pool = \"p\"",
            "add a [cluster] table",
        ),
        (
            "[[network]]\nname = \"a\"\nranges = [[{ subnet = \"10.0.0.0/24\" }]]\ncluster_pool = \"p\"",
            "cluster_pool goes with ranges_from = \"cluster\"",
        ),
        (
            "[[network]]\nname = \"a\"\nranges_from = \"node\"\ncluster_pool = \"p\"",
            "cluster_pool goes with ranges_from = \"cluster\"",
        ),
        (
            "[[network]]\nname = \"a\"\nranges_from = \"cluster\"\ncluster_pool = \"a/b\"",
            "cluster_pool \"a/b\"",
        ),
        ("[cluster]\netcd_endpoints = []", "etcd_endpoints is empty"),
        (
            "[cluster]\netcd_endpoints = [\"http://10.0.0.1:2379\"]\n[[network]]\nname = \"a\"\nranges_from = \"cluster\"\ncluster_pool = \"p\"\n[[network]]\nname = \"b\"\nranges_from = \"cluster\"\ncluster_pool = \"p\"",
            "networks \"a\" and \"b\" both take their ranges from cluster pool \"p\"",
        ),
        (
            "[cluster]\netcd_endpoints = [\"http://10.0.0.1:2379\"]\nheartbeat_ttl_secs = 10\nfence_secs = 11",
            "fence_secs must be within 1..=heartbeat_ttl_secs (10)",
        ),
        (
            "[cluster]\netcd_endpoints = [\"https://etcd.local:2379\"]",
            "etcd endpoint \"https://etcd.local:2379\": the host must be an IP address",
        ),
        ("[cluster]\netcd_endpoints = [\"10.0.0.1:2379\"]", "give a URL"),
        (
            "[cluster]\ndatastore = \"kubernetes\"\netcd_endpoints = [\"http://10.0.0.1:2379\"]",
            "etcd_endpoints are for datastore = \"etcd\"",
        ),
        (
            "[cluster]\netcd_endpoints = [\"http://10.0.0.1:2379\"]\nkubeconfig = \"/k\"",
            "kubeconfig is for datastore = \"kubernetes\"",
        ),
        ("[cluster]\ndatastore = \"consul\"", "unknown variant `consul`"),
        (
            "[cluster]\ndatastore = \"kubernetes\"\nlease_namespace = \"Bad_NS\"",
            "lease_namespace",
        ),
        (
            "[cluster]\netcd_endpoints = [\"https://10.0.0.1:2379\"]\ncert_file = \"/c\"",
            "cert_file and key_file go together",
        ),
        (
            "[cluster]\netcd_endpoints = [\"http://10.0.0.1:2379\"]\nca_file = \"/c\"",
            "are for https://",
        ),
        (
            "[cluster]\netcd_endpoints = [\"http://10.0.0.1:2379\"]\nprefix = \"ipool\"",
            "prefix \"ipool\" must start with '/'",
        ),
        (
            "[cluster]\netcd_endpoints = [\"http://10.0.0.1:2379\"]\nstore_rate = 0.0",
            "store_rate must be above 0",
        ),
        (
            "[cluster]\netcd_endpoints = [\"http://10.0.0.1:2379\"]\nheartbeat_ttl_secs = 1",
            "heartbeat_ttl_secs must be within 5..=3600",
        ),
        (
            "[cluster]\netcd_endpoints = [\"http://10.0.0.1:2379\"]\nnode_name = \"a/b\"",
            "[cluster] node_name: node name \"a/b\"",
        ),
        (
            "[cluster]\netcd_endpoints = [\"http://10.0.0.1:2379\"]\nclaim_ahaed = 3",
            "unknown field `claim_ahaed`",
        ),
    ] {
        let e = DaemonConfig::parse(text).expect_err(text).to_string();
        assert!(e.contains(needle), "{text:?}: {e}");
    }
}

#[test]
fn ipam_section_host_local_forms() {
    let t = DaemonConfig::embedded().defaults;
    let s = IpamSection::parse(
        r#"{"type":"ipool","subnet":"10.1.0.0/24","gateway":"10.1.0.254",
            "ranges":[[{"subnet":"fd00::/64"}]],"routes":[{"dst":"0.0.0.0/0"}],
            "somethingElse": {"x": 1}}"#,
    )
    .expect("valid")
    .expect("present");
    let def = s.network_def("net", &t).expect("valid").expect("declares");
    assert_eq!(def.range_sets.len(), 2);
    assert_eq!(def.range_sets[0][0].gateway.as_deref(), Some("10.1.0.254"));
    assert_eq!(def.routes.len(), 1);

    let none = IpamSection::parse(r#"{"type":"ipool"}"#)
        .expect("valid")
        .expect("present");
    assert!(none.network_def("net", &t).expect("valid").is_none());
    assert!(IpamSection::parse("").expect("empty is fine").is_none());
}

#[test]
fn ipam_section_errors_name_the_key() {
    let t = DaemonConfig::embedded().defaults;
    for (json, needle) in [
        (r#"{"subnet": 5}"#, "ipam"),
        (r#"{"subnet":"10.0.0.0/33"}"#, "10.0.0.0/33"),
        (
            r#"{"ranges":[[{"subnet":"10.0.0.0/24","rangeEnd":"10.1.0.9"}]]}"#,
            "rangeEnd",
        ),
        (
            r#"{"subnet":"10.0.0.0/16","ranges":[[{"subnet":"10.0.1.0/24"}]]}"#,
            "overlap",
        ),
        (
            r#"{"subnet":"10.0.0.0/24","routes":[{"dst":"x"}]}"#,
            "routes[0].dst",
        ),
        (
            r#"{"clusterPool":"l2","subnet":"10.0.0.0/24"}"#,
            "drop ipam.ranges and ipam.subnet",
        ),
        (r#"{"clusterPool":"L2!"}"#, "ipam.clusterPool"),
        (
            r#"{"clusterPool":"l2","addressing":"flat"}"#,
            "unknown variant `flat`",
        ),
        (
            r#"{"clusterPool":"l2","addressing":"subnet","exclude":["10.0.0.x"]}"#,
            "ipam.exclude \"10.0.0.x\"",
        ),
        (
            r#"{"subnet":"10.0.0.0/24","exclude":["10.0.0.5"]}"#,
            "go with ipam.clusterPool",
        ),
        (
            r#"{"subnet":"10.0.0.0/24","gateway":["10.0.0.1"]}"#,
            "a list goes with ipam.clusterPool",
        ),
    ] {
        let e = IpamSection::parse(json)
            .and_then(|s| s.expect("present").network_def("n", &t))
            .expect_err(json)
            .to_string();
        assert!(e.contains(needle), "{json}: {e}");
    }
}

#[test]
fn ipam_section_names_a_cluster_pool() {
    let t = DaemonConfig::embedded().defaults;
    let def = IpamSection::parse(
        r#"{"type":"ipool","clusterPool":"l2","addressing":"subnet","gateway":["192.168.2.1","fd00:2::1"],"exclude":["192.168.2.229/30"]}"#,
    )
    .expect("valid")
    .expect("present")
    .network_def("macvlan", &t)
    .expect("valid")
    .expect("declares");
    assert_eq!(def.cluster_pools, ["l2"]);
    assert!(def.range_sets.is_empty(), "ranges come from the pool");
    let mode = def.subnet_mode.expect("subnet");
    assert_eq!(mode.gateways.len(), 2);
    assert_eq!(
        mode.exclude,
        ["192.168.2.228/30".parse::<ipnet::IpNet>().unwrap()]
    );
    let block = IpamSection::parse(r#"{"clusterPool":"l2"}"#)
        .expect("valid")
        .expect("present")
        .network_def("routed", &t)
        .expect("valid")
        .expect("declares");
    assert_eq!(block.subnet_mode, None, "by block unless said");
    // host-local's rangeStart/rangeEnd bound a `subnet`: beside a clusterPool, or alone,
    // they would bound nothing, and are refused rather than ignored; a CNI config's errors
    // name its keys as it writes them.
    for (json, needle) in [
        (
            r#"{"clusterPool":"l2","rangeStart":"10.0.0.10"}"#,
            "ipam.rangeStart and ipam.rangeEnd go with ipam.subnet (with ipam.clusterPool",
        ),
        (
            r#"{"rangeEnd":"10.0.0.10"}"#,
            "ipam.rangeStart and ipam.rangeEnd go with ipam.subnet (or give them in ipam.ranges)",
        ),
        (
            r#"{"clusterPool":"l2","gateway":"10.0.0.1"}"#,
            r#"ipam.gateway and ipam.exclude go with "addressing": "subnet""#,
        ),
    ] {
        let e = IpamSection::parse(json)
            .expect("valid JSON")
            .expect("present")
            .network_def("n", &t)
            .expect_err(json)
            .to_string();
        assert!(e.contains(needle), "{json}: {e}");
    }
}

#[test]
fn a_config_network_of_one_subnet() {
    let base = "[cluster]\netcd_endpoints = [\"http://127.0.0.1:2379\"]\n[[network]]\nname = \"l2\"\nranges_from = \"cluster\"\ncluster_pool = \"l2\"\n";
    let c = DaemonConfig::parse(&format!(
        "{base}addressing = \"subnet\"\ngateway = \"10.9.0.1\"\nexclude = [\"10.9.0.2/31\"]\n"
    ))
    .expect("valid");
    let defs = c.network_defs().expect("defs");
    let mode = defs[0].subnet_mode.as_ref().expect("subnet");
    assert_eq!(
        mode.gateways,
        ["10.9.0.1".parse::<std::net::IpAddr>().unwrap()]
    );
    for (extra, needle) in [
        (
            "gateway = \"10.9.0.1\"\n",
            "go with addressing = \"subnet\"",
        ),
        (
            "addressing = \"subnet\"\ngateway = \"x\"\n",
            "gateway \"x\" is not an IP address",
        ),
    ] {
        let e = DaemonConfig::parse(&format!("{base}{extra}"))
            .expect_err(extra)
            .to_string();
        assert!(e.contains(needle), "{extra}: {e}");
    }
    let e = DaemonConfig::parse("[[network]]\nname = \"n\"\nranges = [[{ subnet = \"10.0.0.0/24\" }]]\naddressing = \"subnet\"\n")
        .expect_err("local")
        .to_string();
    assert!(e.contains("addressing goes with ranges_from"), "{e}");
}

#[test]
fn same_addresses_ignores_spelling() {
    let t = DaemonConfig::embedded().defaults;
    let a = IpamSection::parse(r#"{"subnet":"10.0.0.0/24"}"#)
        .expect("valid")
        .expect("present")
        .network_def("n", &t)
        .expect("valid")
        .expect("declares");
    let b = IpamSection::parse(r#"{"ranges":[[{"subnet":"10.0.0.0/24","gateway":"10.0.0.1"}]]}"#)
        .expect("valid")
        .expect("present")
        .network_def("n", &t)
        .expect("valid")
        .expect("declares");
    let c = IpamSection::parse(r#"{"subnet":"10.0.0.0/25"}"#)
        .expect("valid")
        .expect("present")
        .network_def("n", &t)
        .expect("valid")
        .expect("declares");
    assert!(a.same_addresses(&b));
    assert!(!a.same_addresses(&c));
}

#[test]
fn ranges_from_the_node() {
    let cfg = DaemonConfig::parse(
        "[[network]]\nname = \"pods\"\nranges_from = \"node\"\nroutes = [{ dst = \"0.0.0.0/0\" }]\nmin_idle = 2\n\
         [[network]]\nname = \"fl\"\nranges_from = \"flannel\"\n\
         [[network]]\nname = \"fl2\"\nranges_from = \"flannel\"\nsubnet_file = \"/tmp/s.env\"\n\
         [[network]]\nname = \"fixed\"\nranges = [[{ subnet = \"10.9.0.0/24\" }]]",
    )
    .unwrap();
    let defs = cfg.network_defs().unwrap();
    assert_eq!(defs[0].origin, Origin::Node);
    assert!(defs[0].range_sets.is_empty());
    assert_eq!(defs[0].tuning.min_idle, 2);
    assert_eq!(defs[3].origin, Origin::Config);
    let from = cfg.node_ranges();
    assert_eq!(from.len(), 3);
    assert_eq!(from[0].0, "pods");
    assert_eq!(from[0].1, NodeRanges::PodCidrs);
    assert_eq!(from[0].2.len(), 1);
    assert_eq!(from[1].1, NodeRanges::Flannel(DEFAULT_SUBNET_FILE.into()));
    assert_eq!(from[2].1, NodeRanges::Flannel("/tmp/s.env".into()));
}

#[test]
fn cluster_networks_and_their_table() {
    let c = DaemonConfig::parse(
        r#"
[cluster]
etcd_endpoints = ["https://10.0.0.1:2379", "https://[fd00::1]:2379"]
ca_file = "/etc/ipool/etcd-ca.pem"
cert_file = "/etc/ipool/etcd.pem"
key_file = "/etc/ipool/etcd-key.pem"
[[network]]
name = "pods"
ranges_from = "cluster"
cluster_pool = "main"
"#,
    )
    .expect("valid");
    let cluster = c.cluster.as_ref().expect("[cluster]");
    assert_eq!(cluster.prefix, "/ipool/v1");
    assert_eq!(cluster.block_hold_down_secs, 600);
    assert_eq!(cluster.claim_ahead, 8);
    assert_eq!(
        cluster.fence(),
        30,
        "the fence defaults to the heartbeat TTL"
    );
    assert_eq!(
        c.cluster_networks(),
        vec![("pods".to_string(), vec!["main".to_string()], Vec::new())]
    );
    assert!(c.node_ranges().is_empty(), "not watched on the node");
}

#[test]
fn cluster_mode_on_the_kubernetes_api_needs_no_etcd() {
    let c = DaemonConfig::parse(
        "[cluster]\ndatastore = \"kubernetes\"\n[[network]]\nname = \"pods\"\nranges_from = \"cluster\"\ncluster_pool = \"main\"",
    )
    .expect("valid");
    let cluster = c.cluster.as_ref().expect("[cluster]");
    assert_eq!(
        cluster.datastore,
        crate::config::cluster::DatastoreKind::Kubernetes
    );
    assert_eq!(cluster.lease_namespace, "ipool-system");
    assert!(cluster.etcd_endpoints.is_empty() && cluster.kubeconfig.is_none());
    let etcd = DaemonConfig::parse("[cluster]\netcd_endpoints = [\"http://10.0.0.1:2379\"]")
        .expect("valid");
    assert_eq!(
        etcd.cluster.expect("[cluster]").datastore,
        crate::config::cluster::DatastoreKind::Etcd,
        "etcd stays the default"
    );
}

#[test]
fn kubernetes_names_follow_dns_1123_subdomains_within_the_limit() {
    for ok in ["pods", "pods-b", "a.b-c.d9", "0", &"p".repeat(63)] {
        assert!(
            ipool_proto::names::check_kube_name("pool name", ok, 63).is_ok(),
            "{ok}"
        );
    }
    for bad in [
        "",
        "Pods",
        "pods_b",
        "-pods",
        "pods-",
        "pods.",
        ".pods",
        "a..b",
        "a.-b",
        "p o",
        &"p".repeat(64),
    ] {
        let e = ipool_proto::names::check_kube_name("pool name", bad, 63).expect_err(bad);
        assert!(e.contains("DNS-1123") && e.contains("63"), "{bad}: {e}");
    }
    assert!(ipool_proto::names::check_kube_name("x", &"p".repeat(64), 253).is_ok());
}

/// With datastore = "kubernetes" a network's cluster_pool names an object and a label value:
/// a name the apiserver cannot take is refused at start, naming the rule.
#[test]
fn a_cluster_pool_the_kubernetes_api_cannot_name_is_refused() {
    let net = |pool: &str, store: &str| {
        format!("[cluster]\n{store}\n[[network]]\nname = \"pods\"\nranges_from = \"cluster\"\ncluster_pool = \"{pool}\"\n")
    };
    let kube = "datastore = \"kubernetes\"";
    let etcd = "etcd_endpoints = [\"http://10.0.0.1:2379\"]";
    for bad in ["Pods", "pods_b", &"p".repeat(64)] {
        let e = DaemonConfig::parse(&net(bad, kube))
            .expect_err(bad)
            .to_string();
        assert!(e.contains("DNS-1123") && e.contains("cluster_pool"), "{e}");
        // etcd's keys take them.
        assert!(DaemonConfig::parse(&net(bad, etcd)).is_ok(), "{bad}");
    }
    assert!(DaemonConfig::parse(&net("pods-b.v4", kube)).is_ok());
}

/// The store's settings, under their names and their old ones (etcd_*,
/// deprecated: read as before); both at once is an error naming the key.
#[test]
fn the_stores_settings_are_read_under_their_names_and_their_old_ones() {
    let read = |keys: &str| {
        DaemonConfig::parse(&format!(
            "[cluster]\netcd_endpoints = [\"http://10.0.0.1:2379\"]\n{keys}"
        ))
    };
    for keys in [
        "store_timeout_ms = 900\nstore_rate = 7.5\nstore_burst = 3\n",
        "etcd_timeout_ms = 900\netcd_rate = 7.5\netcd_burst = 3\n",
    ] {
        let c = read(keys).expect("valid").cluster.expect("[cluster]");
        assert_eq!(
            (c.store_timeout_ms, c.store_rate, c.store_burst),
            (900, 7.5, 3),
            "{keys}"
        );
    }
    let e = read("store_rate = 2.0\netcd_rate = 3.0\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("store_rate"), "{e}");
}
