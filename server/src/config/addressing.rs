//! `addressing` of a cluster pool's network, as the daemon's `[[network]]` and the CNI `ipam`
//! section say it: `"block"` (the default: each node's blocks routed to it, a pod given its
//! block's prefix and first address as gateway) or `"subnet"` (each pool CIDR one L2 subnet
//! across the nodes, with its `gateway` and `exclude`): a [`SubnetMode`].

use std::net::IpAddr;

use ipnet::IpNet;
use serde::Deserialize;

use crate::model::{Invalid, SubnetMode};

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
) -> Result<Option<SubnetMode>, Invalid> {
    let (gw_key, ex_key) = (spelling.key("gateway"), spelling.key("exclude"));
    if addressing.unwrap_or_default() == Addressing::Block {
        if gateway.is_some() || !exclude.is_empty() {
            return Err(Invalid(format!(
                "network {network:?}: {gw_key} and {ex_key} go with {} (with block addressing each block's first address is its gateway)",
                spelling.subnet()
            )));
        }
        return Ok(None);
    }
    let mut gateways: Vec<IpAddr> = Vec::new();
    for g in gateway.map(Gateways::list).unwrap_or_default() {
        let ip: IpAddr = g.trim().parse().map_err(|_| {
            Invalid(format!(
                "network {network:?}: {gw_key} {g:?} is not an IP address"
            ))
        })?;
        if gateways.contains(&ip) {
            return Err(Invalid(format!(
                "network {network:?}: {gw_key} {ip} is listed twice"
            )));
        }
        gateways.push(ip);
    }
    if exclude.len() > MAX_EXCLUDED {
        return Err(Invalid(format!(
            "network {network:?}: {ex_key} lists {} entries, at most {MAX_EXCLUDED}",
            exclude.len()
        )));
    }
    let exclude = exclude
        .iter()
        .map(|x| {
            excluded(x).ok_or_else(|| {
                Invalid(format!(
                    "network {network:?}: {ex_key} {x:?}: not a CIDR or an IP address"
                ))
            })
        })
        .collect::<Result<Vec<IpNet>, Invalid>>()?;
    Ok(Some(SubnetMode { gateways, exclude }))
}

/// One excluded entry: a CIDR, or an address (None: neither).
fn excluded(x: &str) -> Option<IpNet> {
    let x = x.trim();
    if let Ok(net) = x.parse::<IpNet>() {
        return Some(net.trunc());
    }
    x.parse::<IpAddr>().map(IpNet::from).ok()
}

#[cfg(test)]
mod tests;
