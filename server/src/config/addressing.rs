//! `addressing` of a cluster pool's network, as the daemon's `[[network]]` and the CNI `ipam`
//! section say it: `"block"` (the default: each node's blocks routed to it, a pod given its
//! block's prefix and first address as gateway) or `"subnet"` (each pool CIDR one L2 subnet
//! across the nodes, with its `gateway` and `exclude`): a [`SubnetMode`].

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;

use crate::model::SubnetMode;

/// `addressing`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Addressing {
    #[default]
    Block,
    Subnet,
}

/// `gateway`: one address, or one per pool CIDR (`["192.168.2.1", "fd00:2::1"]`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Gateways {
    One(String),
    Many(Vec<String>),
}

impl Gateways {
    fn list(&self) -> Vec<&str> {
        match self {
            Gateways::One(g) => vec![g.as_str()],
            Gateways::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// The most excluded entries a network may list.
pub const MAX_EXCLUDED: usize = 1024;

/// Where the keys were written, for the messages: the daemon's TOML (`addressing =
/// "subnet"`) or a CNI config's `ipam` section (`"addressing": "subnet"`, keys named
/// `ipam.gateway`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spelling {
    Toml,
    Cni,
}

impl Spelling {
    fn key(self, k: &str) -> String {
        match self {
            Spelling::Toml => k.to_string(),
            Spelling::Cni => format!("ipam.{k}"),
        }
    }

    fn subnet(self) -> &'static str {
        match self {
            Spelling::Toml => "addressing = \"subnet\"",
            Spelling::Cni => "\"addressing\": \"subnet\"",
        }
    }
}

/// The subnet mode `addressing`, `gateway` and `exclude` say for network `network`; None for
/// block addressing, which takes neither a gateway nor excluded addresses. An excluded entry is
/// a CIDR (its host bits dropped, as Whereabouts reads `192.168.2.229/30`) or one address.
pub fn subnet_mode(
    network: &str,
    addressing: Option<Addressing>,
    gateway: Option<&Gateways>,
    exclude: &[String],
    spelling: Spelling,
) -> Result<Option<SubnetMode>, String> {
    let (gw_key, ex_key) = (spelling.key("gateway"), spelling.key("exclude"));
    if addressing.unwrap_or_default() == Addressing::Block {
        if gateway.is_some() || !exclude.is_empty() {
            return Err(format!(
                "network {network:?}: {gw_key} and {ex_key} go with {} (with block addressing each block's first address is its gateway)",
                spelling.subnet()
            ));
        }
        return Ok(None);
    }
    let mut gateways: Vec<IpAddr> = Vec::new();
    for g in gateway.map(Gateways::list).unwrap_or_default() {
        let ip: IpAddr = g
            .trim()
            .parse()
            .map_err(|_| format!("network {network:?}: {gw_key} {g:?} is not an IP address"))?;
        if gateways.contains(&ip) {
            return Err(format!(
                "network {network:?}: {gw_key} {ip} is listed twice"
            ));
        }
        gateways.push(ip);
    }
    if exclude.len() > MAX_EXCLUDED {
        return Err(format!(
            "network {network:?}: {ex_key} lists {} entries, at most {MAX_EXCLUDED}",
            exclude.len()
        ));
    }
    let exclude = exclude
        .iter()
        .map(|x| excluded(x).map_err(|e| format!("network {network:?}: {ex_key} {x:?}: {e}")))
        .collect::<Result<Vec<IpNet>, String>>()?;
    Ok(Some(SubnetMode { gateways, exclude }))
}

/// One excluded entry: a CIDR, or an address.
fn excluded(x: &str) -> Result<IpNet, String> {
    let x = x.trim();
    if let Ok(net) = x.parse::<IpNet>() {
        return Ok(net.trunc());
    }
    x.parse::<IpAddr>()
        .map(IpNet::from)
        .map_err(|_| "not a CIDR or an IP address".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(
        addressing: Option<Addressing>,
        gw: Option<Gateways>,
        exclude: &[&str],
    ) -> Result<Option<SubnetMode>, String> {
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
            e.contains("ipam.gateway and ipam.exclude go with \"addressing\": \"subnet\""),
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
        assert!(e.contains("ipam.exclude \"x\""), "{e}");
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
        let keeps = |a: &[&str], b: &[&str]| {
            SubnetMode::keeps_gateways(Some(&mode(a)), Some(&mode(b)), &v4)
        };
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
        assert!(e.contains("go with addressing = \"subnet\""), "{e}");
        let e = ok(Some(Addressing::Block), None, &["10.0.0.1"]).unwrap_err();
        assert!(e.contains("go with addressing"), "{e}");
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
            e.contains("gateway \"10.0.0.300\" is not an IP address"),
            "{e}"
        );
        let e = ok(
            Some(Addressing::Subnet),
            Some(Gateways::Many(vec!["10.0.0.1".into(), "10.0.0.1".into()])),
            &[],
        )
        .unwrap_err();
        assert!(e.contains("listed twice"), "{e}");
        let e = ok(Some(Addressing::Subnet), None, &["10.0.0.0/33"]).unwrap_err();
        assert!(e.contains("exclude \"10.0.0.0/33\": not a CIDR"), "{e}");
    }
}
