//! The CNI result of an IPAM plugin (the abbreviated form: no `interfaces`), in the requested
//! version's format: before 1.0.0 every IP carries `"version": "4"|"6"`.

use ipool_proto::v1 as pb;
use serde_json::{json, Map, Value};

/// The version errors are printed in when the config's own is unknown or unsupported.
pub const FALLBACK_VERSION: &str = "1.0.0";

/// The `dns` object of a result from a resolv.conf file's text, as host-local reads it:
/// `nameserver`, `domain`, `search`, `options`; `#` and `;` start comments.
pub fn dns_from_resolv_conf(text: &str) -> Value {
    let (mut ns, mut search, mut options) = (Vec::new(), Vec::new(), Vec::new());
    let mut domain = None;
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or_default();
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => ns.extend(words.map(String::from)),
            Some("domain") => domain = words.next().map(String::from),
            Some("search") => search.extend(words.map(String::from)),
            Some("options") => options.extend(words.map(String::from)),
            _ => {}
        }
    }
    let mut o = Map::new();
    if !ns.is_empty() {
        o.insert("nameservers".into(), json!(ns));
    }
    if let Some(d) = domain {
        o.insert("domain".into(), json!(d));
    }
    if !search.is_empty() {
        o.insert("search".into(), json!(search));
    }
    if !options.is_empty() {
        o.insert("options".into(), json!(options));
    }
    Value::Object(o)
}

pub fn add_result(version: &str, reply: &pb::AddResponse, dns: &Value) -> String {
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
    out.insert("dns".into(), dns.clone());
    Value::Object(out).to_string()
}

pub fn version_result(version: &str) -> String {
    json!({"cniVersion": version, "supportedVersions": crate::SUPPORTED_VERSIONS}).to_string()
}

#[cfg(test)]
mod tests;
