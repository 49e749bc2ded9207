//! The CNI result of an IPAM plugin (the abbreviated form: no `interfaces`), in the requested
//! version's format: before 1.0.0 every IP carries `"version": "4"|"6"`.

use ipool_proto::v1 as pb;
use serde_json::{json, Map, Value};

/// The version errors are printed in when the config's own is unknown or unsupported.
pub const FALLBACK_VERSION: &str = "1.0.0";

pub fn add_result(version: &str, reply: &pb::AddResponse) -> String {
    let legacy = version.starts_with("0.");
    let ips: Vec<Value> = reply
        .ips
        .iter()
        .map(|ip| {
            let mut o = Map::new();
            if legacy {
                let v6 = ip.address.contains(':');
                o.insert("version".into(), json!(if v6 { "6" } else { "4" }));
            }
            o.insert("address".into(), json!(ip.address));
            if !ip.gateway.is_empty() {
                o.insert("gateway".into(), json!(ip.gateway));
            }
            Value::Object(o)
        })
        .collect();
    let routes: Vec<Value> = reply
        .routes
        .iter()
        .map(|r| {
            if r.gw.is_empty() {
                json!({"dst": r.dst})
            } else {
                json!({"dst": r.dst, "gw": r.gw})
            }
        })
        .collect();
    let mut out = Map::new();
    out.insert("cniVersion".into(), json!(version));
    out.insert("ips".into(), Value::Array(ips));
    if !routes.is_empty() {
        out.insert("routes".into(), Value::Array(routes));
    }
    out.insert("dns".into(), json!({}));
    Value::Object(out).to_string()
}

pub fn version_result(version: &str) -> String {
    json!({"cniVersion": version, "supportedVersions": crate::SUPPORTED_VERSIONS}).to_string()
}

#[cfg(test)]
mod tests {
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
            let r: Value = serde_json::from_str(&add_result(v, &reply())).expect("json");
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
}
