//! A pool's reservations in a node's blocks (`ipoolctl cluster reserve`): never handed out,
//! by any path; an address held here when it was reserved stays with its holder, is reported
//! once, and is not handed out again once released. Reserved addresses stay free in their
//! block's allocator: a block holding nothing else is empty (given back as any other).

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;

use super::block::Owned;
use super::ClusterSource;
use crate::cluster::ippool::Reserved;

/// The largest reserved range whose addresses are counted one by one; a larger one counts
/// every free address of the blocks it touches (claims come sooner, never later).
const COUNTED: u128 = 1 << 16;

fn overlaps(block: &IpNet, r: &Reserved) -> bool {
    r.cidr.contains(&block.network()) || block.contains(&r.cidr.network())
}

/// Every address of `net`, from its network address to its last.
fn addresses(net: &IpNet) -> impl Iterator<Item = IpAddr> {
    let (first, count): (u128, u128) = match net {
        IpNet::V4(n) => (
            u32::from(n.network()) as u128,
            1u128 << (32 - n.prefix_len()),
        ),
        IpNet::V6(n) => (
            u128::from(n.network()),
            1u128
                .checked_shl(128 - u32::from(n.prefix_len()))
                .unwrap_or(u128::MAX),
        ),
    };
    let v4 = net.addr().is_ipv4();
    (0..count).map(move |i| match v4 {
        true => IpAddr::V4(((first + i) as u32).into()),
        false => IpAddr::V6((first + i).into()),
    })
}

/// How many of `b`'s free addresses are reserved.
pub(super) fn free_in(b: &Owned, reserved: &[Reserved]) -> u128 {
    let net = b.net();
    let mut seen = BTreeSet::new();
    for r in reserved.iter().filter(|r| overlaps(&net, r)) {
        let size = 1u128
            .checked_shl(u32::from(r.cidr.max_prefix_len() - r.cidr.prefix_len()))
            .unwrap_or(u128::MAX);
        if r.cidr.contains(&net) || size > COUNTED {
            return b.alloc.free();
        }
        seen.extend(
            addresses(&r.cidr).filter(|ip| b.alloc.contains(*ip) && !b.alloc.is_taken(*ip)),
        );
    }
    (seen.len() as u128).min(b.alloc.free())
}

/// The last address of `net`.
fn last_of(net: &IpNet) -> IpAddr {
    net.broadcast()
}

/// The next `n` addresses `b` hands out that are not reserved: each reserved range met is
/// stepped over whole, whatever its size (twice each at most: once more after the search
/// wraps around the block).
pub(super) fn peek_next_n(b: &Owned, reserved: &[Reserved], n: usize) -> Vec<IpAddr> {
    let net = b.net();
    let over: Vec<&Reserved> = reserved.iter().filter(|r| overlaps(&net, r)).collect();
    if over.is_empty() {
        return b.alloc.peek_next_n(n);
    }
    b.alloc.peek_next_skipping(n, 2 * over.len() + 2, |ip| {
        over.iter()
            .filter(|r| r.cidr.contains(&ip))
            .map(|r| last_of(&r.cidr))
            .max()
    })
}

/// The next address `b` hands out that is not reserved.
pub(super) fn peek_next(b: &Owned, reserved: &[Reserved]) -> Option<IpAddr> {
    peek_next_n(b, reserved, 1).into_iter().next()
}

/// The reason of a network's excluded address (one subnet's `exclude`).
pub(super) const EXCLUDED: &str = "excluded by the network's exclude";

impl ClusterSource {
    /// What is never handed out here: the pool's reservations (as this node last read the
    /// pool), the network's excluded addresses, and the pool's pinned addresses (handed out
    /// to their owners' pods only, by another path: see `pinned`).
    pub(super) fn kept_out(&self) -> std::sync::Arc<Vec<Reserved>> {
        let pool = self.node.pool_reserved(&self.pool);
        // Pins are kept by one subnet's sources only (a routed pool takes none).
        let pinned = match self.subnet {
            Some(_) if !crate::bugs::on(crate::bugs::Bug::PinnedHandedOut) => {
                self.node.pool_pinned(&self.pool)
            }
            _ => std::sync::Arc::default(),
        };
        if self.excluded.is_empty() && pinned.is_empty() {
            return pool;
        }
        std::sync::Arc::new(
            pool.iter()
                .chain(&self.excluded)
                .chain(pinned.iter())
                .cloned()
                .collect(),
        )
    }

    /// Why `ip` is not handed out: excluded from the network, or reserved in the pool (as this
    /// node last read it).
    pub(super) fn reserved_why(&self, ip: IpAddr) -> Option<String> {
        if let Some(x) = self.excluded.iter().find(|r| r.cidr.contains(&ip)) {
            return Some(format!("{ip} is {EXCLUDED} ({})", x.cidr));
        }
        let reserved = self.node.pool_reserved(&self.pool);
        let r = reserved.iter().find(|r| r.cidr.contains(&ip))?;
        Some(match r.reason.is_empty() {
            true => format!(
                "{ip} is reserved in cluster pool {:?} ({})",
                self.pool, r.cidr
            ),
            false => format!(
                "{ip} is reserved in cluster pool {:?} ({}: {})",
                self.pool, r.cidr, r.reason
            ),
        })
    }

    /// Says once, for each reservation new to this source, which of its addresses are held
    /// here (in use, idle or kept for a pod): they stay with their holder, and are not handed
    /// out again once released.
    pub(super) fn report_reserved(&mut self) {
        let now = self.node.pool_reserved(&self.pool);
        if std::sync::Arc::ptr_eq(&now, &self.reserved_seen) {
            return;
        }
        for r in now.iter().filter(|r| !self.reserved_seen.contains(r)) {
            for b in self.blocks.values().filter(|b| overlaps(&b.net(), r)) {
                for ip in b.held().into_iter().filter(|ip| r.cidr.contains(ip)) {
                    tracing::warn!(pool = %self.pool, %ip, reserved = %r.cidr, reason = %r.reason, "a reserved address is held here: it stays with its holder, and is not handed out again once released");
                }
            }
        }
        self.reserved_seen = now;
    }
}
