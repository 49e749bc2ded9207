use super::*;

fn reply() -> pb::AddResponse {
    pb::AddResponse {
        ips: vec![
            pb::IpConfig {
                address: "10.1.0.2/24".into(),
                gateway: "10.1.0.1".into(),
            },
            pb::IpConfig {
                address: "fd00::2/64".into(),
                gateway: String::new(),
            },
        ],
        routes: vec![pb::Route {
            dst: "0.0.0.0/0".into(),
            gw: String::new(),
        }],
    }
}

#[test]
fn version_field_only_before_1_0() {
    for (v, legacy) in [
        ("0.3.0", true),
        ("0.3.1", true),
        ("0.4.0", true),
        ("1.0.0", false),
    ] {
        let r: Value = serde_json::from_str(&add_result(v, &reply(), &json!({}))).expect("json");
        assert_eq!(r["cniVersion"], v);
        assert_eq!(r["ips"][0]["address"], "10.1.0.2/24");
        assert_eq!(r["ips"][0]["gateway"], "10.1.0.1");
        assert!(r["ips"][1].get("gateway").is_none());
        assert!(r.get("interfaces").is_none());
        assert_eq!(r["routes"][0], json!({"dst": "0.0.0.0/0"}));
        if legacy {
            assert_eq!(r["ips"][0]["version"], "4");
            assert_eq!(r["ips"][1]["version"], "6");
        } else {
            assert!(r["ips"][0].get("version").is_none());
        }
    }
}

#[test]
fn resolv_conf_like_host_local() {
    let dns = dns_from_resolv_conf(
        "# generated\nnameserver 10.96.0.10\nnameserver fd00::10 ; v6\nsearch default.svc.cluster.local svc.cluster.local\ndomain cluster.local\noptions ndots:5 edns0\n",
    );
    assert_eq!(
        dns,
        json!({"nameservers": ["10.96.0.10", "fd00::10"], "domain": "cluster.local",
               "search": ["default.svc.cluster.local", "svc.cluster.local"],
               "options": ["ndots:5", "edns0"]})
    );
    assert_eq!(dns_from_resolv_conf(""), json!({}));
}
