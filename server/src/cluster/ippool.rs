//! A cluster pool: its CIDRs, block sizes and excluded ranges, checked and carved; whether it
//! gives new blocks (`disabled`); and the changes an operator makes to a pool while it runs
//! ([`PoolChange`]: a CIDR added or removed, the pool disabled or enabled).

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use super::cidrset::CidrSet;
use crate::range::Family;

/// A cluster pool.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolSpec {
    pub name: String,
    /// IPv4 and/or IPv6 CIDRs.
    pub cidrs: Vec<IpNet>,
    pub block_v4: u8,
    pub block_v6: u8,
    /// Never handed out (the service CIDR, say): every block they touch is occupied.
    #[serde(default)]
    pub exclude: Vec<IpNet>,
    /// Gives no new block (its blocks in use keep serving; empty ones are given back).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
    /// CIDRs of `cidrs` on their way in, and on their way out: no block is claimed in them
    /// meanwhile (the Kubernetes API's two-step change of a pool's CIDRs, see `kube::pools`;
    /// always empty on etcd, where a change is one transaction).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub adding: Vec<IpNet>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removing: Vec<IpNet>,
    /// Addresses (or ranges) no node hands out (`ipoolctl cluster reserve`): a block holding
    /// them is still claimed and serves its other addresses; one in use when it was reserved
    /// stays in use, and is not handed out again once released.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reserved: Vec<Reserved>,
    /// The nodes that may claim from the pool: a Kubernetes label selector over the Node's
    /// labels (`zone=a,rack in (r1,r2)`, see [`crate::selector`]). None: every node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<String>,
}

/// Why an address cannot be pinned as one its pool sets aside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotSetAside {
    /// Not as the pool is made (a configuration error).
    Never(String),
    /// Not while the pool changes (being created or deleted, a CIDR on its way): try again.
    NotNow(String),
}

impl std::fmt::Display for NotSetAside {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotSetAside::Never(why) | NotSetAside::NotNow(why) => f.write_str(why),
        }
    }
}

/// An address or range of a pool that no node hands out, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reserved {
    pub cidr: IpNet,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// The most reservations a pool holds (the pool is one object: etcd's value, the apiserver's
/// object, read by every node).
pub const MAX_RESERVED: usize = 1024;
/// The longest reason of a reservation, in characters.
pub const MAX_REASON: usize = 256;

/// A change to a pool while it runs (`ipoolctl cluster pool add-cidr|remove-cidr|disable|enable`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PoolChange {
    /// The pool grows by a CIDR (checked for overlap as a creation is).
    AddCidr(IpNet),
    /// A CIDR leaves the pool (refused while a block of it is owned).
    RemoveCidr(IpNet),
    Disable,
    Enable,
    /// An address or range kept from every node from now on (replacing the reason of the same
    /// range reserved before).
    Reserve(Reserved),
    /// A reservation of exactly this range ended.
    Unreserve(IpNet),
    /// The nodes that may claim from the pool from now on (None: every node).
    SetNodeSelector(Option<String>),
    /// The prefix length of the blocks of a family the pool has no CIDR of yet (refused once
    /// it has one: its blocks are claimed at the size they were carved at).
    SetBlockSize {
        family: Family,
        prefix: u8,
    },
}

impl std::fmt::Display for PoolChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolChange::AddCidr(c) => write!(f, "add CIDR {c}"),
            PoolChange::RemoveCidr(c) => write!(f, "remove CIDR {c}"),
            PoolChange::Disable => write!(f, "disable"),
            PoolChange::Enable => write!(f, "enable"),
            PoolChange::Reserve(r) => write!(f, "reserve {}", r.cidr),
            PoolChange::Unreserve(c) => write!(f, "unreserve {c}"),
            PoolChange::SetNodeSelector(Some(sel)) => write!(f, "node selector {sel}"),
            PoolChange::SetNodeSelector(None) => write!(f, "no node selector"),
            PoolChange::SetBlockSize { family, prefix } => {
                write!(f, "IPv{} blocks of /{prefix}", family.as_str())
            }
        }
    }
}

/// Why a pool, or a change of one, is refused: what to fix, in words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidPool(pub String);

/// A name or selector that Kubernetes' rules refuse, said as the pool's.
impl From<String> for InvalidPool {
    fn from(why: String) -> InvalidPool {
        InvalidPool(why)
    }
}

impl PoolSpec {
    /// The block size for `cidr`'s family.
    pub fn block_for(&self, cidr: &IpNet) -> u8 {
        match cidr {
            IpNet::V4(_) => self.block_v4,
            IpNet::V6(_) => self.block_v6,
        }
    }

    /// Each CIDR carved, the excluded ranges occupied, and every block of a CIDR on its way in
    /// or out too: nothing is claimed there.
    pub fn carve(&self) -> Result<Vec<CidrSet>, InvalidPool> {
        self.cidrs
            .iter()
            .map(|c| {
                let mut set = CidrSet::new(*c, self.block_for(c))
                    .map_err(|e| InvalidPool(format!("pool {:?}: {e}", self.name)))?;
                for x in self.exclude.iter().chain(self.changing()) {
                    set.occupy(*x);
                }
                Ok(set)
            })
            .collect()
    }

    /// The excluded range that sets `ip` aside for a fixed address chosen by its owner (no
    /// block is ever claimed over an excluded range, so no node hands it out), or why `ip`
    /// cannot be one.
    pub fn set_aside_range(&self, ip: std::net::IpAddr) -> Result<IpNet, NotSetAside> {
        let never = NotSetAside::Never;
        let Some(cidr) = self.cidrs.iter().find(|c| c.contains(&ip)) else {
            return Err(never(format!(
                "{ip} lies in none of pool {:?}'s CIDRs",
                self.name
            )));
        };
        if self.changing().any(|c| c.contains(&ip)) {
            return Err(NotSetAside::NotNow(format!(
                "{ip} lies in CIDR {cidr} of pool {:?}, which is on its way in or out",
                self.name
            )));
        }
        let first_or_last = |c: &IpNet| {
            c.addr().is_ipv4() && c.prefix_len() < 31 && (ip == c.network() || ip == c.broadcast())
        };
        if first_or_last(cidr) {
            return Err(never(format!(
                "{ip} is the network or broadcast address of pool {:?}'s CIDR {cidr}",
                self.name
            )));
        }
        self.exclude.iter().find(|x| x.contains(&ip)).copied().ok_or_else(|| {
            never(format!(
                "{ip} is not set aside in pool {:?}: an address a pod's owner chooses must lie in one of the pool's excluded ranges ({}), which no node claims a block over (create the pool with --exclude covering it)",
                self.name,
                match self.exclude.is_empty() {
                    true => "it has none".to_string(),
                    false => self.exclude.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(", "),
                }
            ))
        })
    }

    /// Whether `ip` is reserved (no node hands it out).
    pub fn is_reserved(&self, ip: std::net::IpAddr) -> bool {
        self.reserved.iter().any(|r| r.cidr.contains(&ip))
    }

    /// The CIDRs on their way in or out.
    pub fn changing(&self) -> impl Iterator<Item = &IpNet> + '_ {
        self.adding.iter().chain(&self.removing)
    }

    /// Whether a block may be claimed at `block` now: of its family's block size, inside one
    /// of its CIDRs, none of them on its way in or out. (The size: a family's is set with its
    /// first CIDR, so a node that read the pool before a CIDR of another size replaced one
    /// taken out may claim a block no longer carved so; on the Kubernetes API such a claim's
    /// condition is the pool's uid alone.)
    pub fn claimable(&self, block: &IpNet) -> bool {
        let sized = block.prefix_len() == self.block_for(block)
            || crate::bugs::on(crate::bugs::Bug::ClaimOfAnySize);
        sized
            && self.cidrs.iter().any(|c| c.contains(block))
            && !self
                .changing()
                .any(|c| c.contains(block) || block.contains(c))
    }

    /// The CIDRs a node's network takes as its ranges: all but those on their way in (one on
    /// its way out may still hold blocks: its removal is refused then).
    pub fn serving_cidrs(&self) -> impl Iterator<Item = &IpNet> + '_ {
        self.cidrs.iter().filter(|c| !self.adding.contains(c))
    }

    /// The pool after `change`, checked on its own ([`PoolSpec::validate`]); an error names
    /// what is wrong. A CIDR removed takes the excluded ranges inside it along. Overlaps with
    /// other pools and blocks standing in a CIDR are the store's to check.
    pub fn changed(&self, change: &PoolChange) -> Result<PoolSpec, InvalidPool> {
        let mut next = self.clone();
        let name = &self.name;
        match change {
            PoolChange::AddCidr(c) => {
                if c.trunc() != *c {
                    return Err(InvalidPool(format!(
                        "pool {name:?}: {c} has host bits set (did you mean {}?)",
                        c.trunc()
                    )));
                }
                if self.cidrs.contains(c) {
                    return Err(InvalidPool(format!("pool {name:?} has CIDR {c} already")));
                }
                next.cidrs.push(*c);
            }
            PoolChange::RemoveCidr(c) => {
                if !self.cidrs.contains(c) {
                    let has: Vec<String> = self.cidrs.iter().map(|c| c.to_string()).collect();
                    return Err(InvalidPool(format!(
                        "pool {name:?} has no CIDR {c} (its CIDRs: {})",
                        has.join(", ")
                    )));
                }
                if self.cidrs.len() == 1 {
                    return Err(InvalidPool(format!(
                        "pool {name:?}: {c} is its only CIDR (add another first, or delete the pool)"
                    )));
                }
                next.cidrs.retain(|x| x != c);
                next.exclude.retain(|x| !c.contains(x));
                next.adding.retain(|x| x != c);
                next.removing.retain(|x| x != c);
                next.reserved.retain(|r| !c.contains(&r.cidr));
            }
            PoolChange::Disable => next.disabled = true,
            PoolChange::Enable => next.disabled = false,
            PoolChange::Reserve(r) => {
                if r.reason.chars().count() > MAX_REASON {
                    return Err(InvalidPool(format!(
                        "pool {name:?}: the reason of a reservation is at most {MAX_REASON} characters"
                    )));
                }
                let cidr = r.cidr.trunc();
                next.reserved.retain(|x| x.cidr != cidr);
                next.reserved.push(Reserved {
                    cidr,
                    reason: r.reason.clone(),
                });
            }
            PoolChange::SetNodeSelector(sel) => {
                // Kept in its normal form.
                next.node_selector = match sel {
                    Some(s) => Some(
                        crate::selector::NodeSelector::parse(s)
                            .map_err(|e| InvalidPool(e.0))?
                            .to_string(),
                    ),
                    None => None,
                };
            }
            PoolChange::SetBlockSize { family, prefix } => {
                let (now, of) = match family {
                    Family::V4 => (&mut next.block_v4, "IPv4"),
                    Family::V6 => (&mut next.block_v6, "IPv6"),
                };
                let has = self.cidrs.iter().find(|c| Family::of(&c.addr()) == *family);
                match has {
                    Some(c) if *now != *prefix => {
                        return Err(InvalidPool(format!(
                            "pool {name:?}: its {of} blocks are /{now} and stay so while it has {of} CIDRs ({c}: blocks are claimed in it at that size); a block size is set for a family the pool has no CIDR of yet"
                        )))
                    }
                    _ => *now = *prefix,
                }
            }
            PoolChange::Unreserve(c) => {
                let before = next.reserved.len();
                next.reserved.retain(|x| x.cidr != c.trunc());
                if next.reserved.len() == before {
                    return Err(InvalidPool(format!(
                        "pool {name:?} has no reservation of {c}"
                    )));
                }
            }
        }
        next.validate()?;
        Ok(next)
    }

    /// Checks the pool on its own: a name, CIDRs that carve, no two overlapping, excluded
    /// ranges inside them.
    pub fn validate(&self) -> Result<(), InvalidPool> {
        ipool_proto::names::check_name("pool name", &self.name)?;
        if self.cidrs.is_empty() {
            return Err(InvalidPool(format!("pool {:?} has no CIDR", self.name)));
        }
        for (block, max, family) in [(self.block_v4, 30, "IPv4"), (self.block_v6, 126, "IPv6")] {
            if block > max {
                return Err(InvalidPool(format!(
                    "pool {:?}: {family} blocks of /{block} leave no address to hand out (the network, gateway and broadcast addresses are not): at most /{max}",
                    self.name
                )));
            }
        }
        self.carve()?;
        for (i, a) in self.cidrs.iter().enumerate() {
            for b in &self.cidrs[i + 1..] {
                if a.contains(b) || b.contains(a) {
                    return Err(InvalidPool(format!(
                        "pool {:?}: CIDRs {a} and {b} overlap",
                        self.name
                    )));
                }
            }
        }
        if let Some(x) = self.changing().find(|x| !self.cidrs.contains(x)) {
            return Err(InvalidPool(format!(
                "pool {:?}: CIDR {x} is marked changing but is none of its CIDRs",
                self.name
            )));
        }
        if self.reserved.len() > MAX_RESERVED {
            return Err(InvalidPool(format!(
                "pool {:?}: at most {MAX_RESERVED} reservations (reserve a range rather than its addresses one by one)",
                self.name
            )));
        }
        for r in &self.reserved {
            if let Some(a) = self.adding.iter().find(|a| a.contains(&r.cidr)) {
                return Err(InvalidPool(format!(
                    "pool {:?}: reserved {} lies in CIDR {a}, which is still being added",
                    self.name, r.cidr
                )));
            }
            if !self.cidrs.iter().any(|c| c.contains(&r.cidr)) {
                return Err(InvalidPool(format!(
                    "pool {:?}: reserved {} is in none of its CIDRs",
                    self.name, r.cidr
                )));
            }
        }
        if let Some(sel) = &self.node_selector {
            crate::selector::NodeSelector::parse(sel)
                .map_err(|e| format!("pool {:?}: {e}", self.name))?;
        }
        for x in &self.exclude {
            if !self.cidrs.iter().any(|c| c.contains(x) || x.contains(c)) {
                return Err(InvalidPool(format!(
                    "pool {:?}: excluded range {x} is in none of its CIDRs",
                    self.name
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
