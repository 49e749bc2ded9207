//! A cluster pool: its CIDRs, block sizes and excluded ranges, checked and carved.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::cidrset::CidrSet;

/// A cluster pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSpec {
    pub name: String,
    /// IPv4 and/or IPv6 CIDRs.
    pub cidrs: Vec<IpNet>,
    pub block_v4: u8,
    pub block_v6: u8,
    /// Never handed out (the service CIDR, say): every block they touch is occupied.
    #[serde(default)]
    pub exclude: Vec<IpNet>,
}

impl PoolSpec {
    /// The block size for `cidr`'s family.
    pub fn block_for(&self, cidr: &IpNet) -> u8 {
        match cidr {
            IpNet::V4(_) => self.block_v4,
            IpNet::V6(_) => self.block_v6,
        }
    }

    /// Each CIDR carved, the excluded ranges occupied.
    pub fn carve(&self) -> Result<Vec<CidrSet>, String> {
        self.cidrs
            .iter()
            .map(|c| {
                let mut set = CidrSet::new(*c, self.block_for(c))
                    .map_err(|e| format!("pool {:?}: {e}", self.name))?;
                for x in &self.exclude {
                    set.occupy(*x);
                }
                Ok(set)
            })
            .collect()
    }

    /// Checks the pool on its own: a name, CIDRs that carve, no two overlapping, excluded
    /// ranges inside them.
    pub fn validate(&self) -> Result<(), String> {
        ipool_proto::names::check_name("pool name", &self.name)?;
        if self.cidrs.is_empty() {
            return Err(format!("pool {:?} has no CIDR", self.name));
        }
        for (block, max, family) in [(self.block_v4, 30, "IPv4"), (self.block_v6, 126, "IPv6")] {
            if block > max {
                return Err(format!(
                    "pool {:?}: {family} blocks of /{block} leave no address to hand out (the network, gateway and broadcast addresses are not): at most /{max}",
                    self.name
                ));
            }
        }
        self.carve()?;
        for (i, a) in self.cidrs.iter().enumerate() {
            for b in &self.cidrs[i + 1..] {
                if a.contains(b) || b.contains(a) {
                    return Err(format!("pool {:?}: CIDRs {a} and {b} overlap", self.name));
                }
            }
        }
        for x in &self.exclude {
            if !self.cidrs.iter().any(|c| c.contains(x) || x.contains(c)) {
                return Err(format!(
                    "pool {:?}: excluded range {x} is in none of its CIDRs",
                    self.name
                ));
            }
        }
        Ok(())
    }
}
