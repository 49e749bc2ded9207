//! The blocks of a cluster pool, carved as kube-controller-manager's nodeipam `cidrset` carves
//! node CIDRs: a bitmap over block indexes (`1 << (block prefix - pool prefix)` of them), and
//! `occupy` for any range (the excluded ranges, the blocks others own). IPv4 and IPv6 alike;
//! at most 2^16 blocks per pool CIDR, as cidrset.
//!
//! Which free block a node tries first is seeded by the node's name ([`CidrSet::order`]), so
//! nodes that start together rarely reach for the same one.

use std::net::IpAddr;

use ipnet::IpNet;

/// The most blocks one pool CIDR is carved into (cidrset's limit for IPv6).
pub const MAX_BLOCKS_BITS: u8 = 16;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CidrSet {
    cidr: IpNet,
    block_prefix: u8,
    /// Bit `i` set: block `i` is taken (owned, or overlapping an excluded range).
    taken: Vec<u64>,
    used: usize,
}

/// Why a pool CIDR cannot be carved.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CarveError {
    #[error("block size /{block} does not fit in {cidr} (it must be longer than /{})", .cidr.prefix_len())]
    BlockTooBig { cidr: IpNet, block: u8 },
    #[error("block size /{block} is longer than an {family} address")]
    BlockTooSmall { block: u8, family: &'static str },
    #[error("{cidr} in /{block} blocks is 2^{bits} blocks; at most 2^{MAX_BLOCKS_BITS} (use larger blocks or a smaller CIDR)")]
    TooManyBlocks { cidr: IpNet, block: u8, bits: u8 },
}

fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

fn from_u128(v4: bool, v: u128) -> IpAddr {
    match v4 {
        true => IpAddr::V4((v as u32).into()),
        false => IpAddr::V6(v.into()),
    }
}

fn max_prefix(cidr: &IpNet) -> u8 {
    match cidr {
        IpNet::V4(_) => 32,
        IpNet::V6(_) => 128,
    }
}

impl CidrSet {
    /// `cidr` (host bits are cleared) carved into blocks of `/block_prefix`.
    pub fn new(cidr: IpNet, block_prefix: u8) -> Result<CidrSet, CarveError> {
        let cidr = cidr.trunc();
        if block_prefix > max_prefix(&cidr) {
            return Err(CarveError::BlockTooSmall {
                block: block_prefix,
                family: if cidr.addr().is_ipv4() {
                    "IPv4"
                } else {
                    "IPv6"
                },
            });
        }
        if block_prefix <= cidr.prefix_len() {
            return Err(CarveError::BlockTooBig {
                cidr,
                block: block_prefix,
            });
        }
        if block_prefix - cidr.prefix_len() > MAX_BLOCKS_BITS {
            return Err(CarveError::TooManyBlocks {
                cidr,
                block: block_prefix,
                bits: block_prefix - cidr.prefix_len(),
            });
        }
        let n = 1usize << (block_prefix - cidr.prefix_len());
        Ok(CidrSet {
            cidr,
            block_prefix,
            taken: vec![0; n.div_ceil(64)],
            used: 0,
        })
    }

    pub fn cidr(&self) -> IpNet {
        self.cidr
    }

    /// How many blocks the CIDR holds.
    pub fn len(&self) -> usize {
        1usize << (self.block_prefix - self.cidr.prefix_len())
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// Blocks taken (owned or excluded).
    pub fn used(&self) -> usize {
        self.used
    }

    fn shift(&self) -> u32 {
        (max_prefix(&self.cidr) - self.block_prefix) as u32
    }

    /// Block `i`.
    pub fn block(&self, i: usize) -> IpNet {
        let base = to_u128(self.cidr.network()) + ((i as u128) << self.shift());
        IpNet::new(
            from_u128(self.cidr.addr().is_ipv4(), base),
            self.block_prefix,
        )
        .expect("a prefix no longer than the address")
    }

    pub fn is_taken(&self, i: usize) -> bool {
        self.taken[i / 64] & (1 << (i % 64)) != 0
    }

    fn take(&mut self, i: usize) {
        if !self.is_taken(i) {
            self.taken[i / 64] |= 1 << (i % 64);
            self.used += 1;
        }
    }

    /// Marks every block that overlaps `range` taken; returns how many it marked.
    pub fn occupy(&mut self, range: IpNet) -> usize {
        let Some((first, last)) = self.overlap(range) else {
            return 0;
        };
        let before = self.used;
        for i in first..=last {
            self.take(i);
        }
        self.used - before
    }

    /// The indexes of the blocks `range` overlaps.
    fn overlap(&self, range: IpNet) -> Option<(usize, usize)> {
        let range = range.trunc();
        if range.addr().is_ipv4() != self.cidr.addr().is_ipv4() {
            return None;
        }
        let (lo, hi) = (to_u128(self.cidr.network()), to_u128(self.cidr.broadcast()));
        let (rlo, rhi) = (to_u128(range.network()), to_u128(range.broadcast()));
        if rhi < lo || rlo > hi {
            return None;
        }
        let s = self.shift();
        Some((
            ((rlo.max(lo) - lo) >> s) as usize,
            ((rhi.min(hi) - lo) >> s) as usize,
        ))
    }

    /// Every block index, in the order a node named `seed` tries them: from a start and with
    /// an odd stride both drawn from the name (the count of blocks is a power of two, so an
    /// odd stride visits each once).
    pub fn order(&self, seed: &str) -> impl Iterator<Item = usize> {
        let n = self.len();
        let h = fnv1a(seed.as_bytes());
        let start = (h as usize) % n;
        let stride = (((h >> 32) as usize) % n.max(2)) | 1;
        (0..n).map(move |k| (start + k * stride) % n)
    }

    /// The free blocks, in `seed`'s order.
    pub fn free_in_order<'a>(&'a self, seed: &str) -> impl Iterator<Item = IpNet> + 'a {
        self.order(seed)
            .filter(|i| !self.is_taken(*i))
            .map(|i| self.block(i))
    }
}

/// FNV-1a, 64 bits: a stable hash (the order must not change between releases).
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests;
