//! Address math: host-local-compatible ranges and the set of addresses a range set can still
//! hand out.
//!
//! Semantics follow the `host-local` IPAM plugin, so that its configs mean the same here:
//! a range is a `subnet` with optional `rangeStart`, `rangeEnd` and `gateway`. The gateway
//! defaults to the subnet's first address; `rangeStart` defaults to the first address after the
//! network address, `rangeEnd` to the last address (the one before broadcast for IPv4).
//! The network address, the IPv4 broadcast address and the gateway are never handed out.
//! A range set (one per address family) is a list of non-overlapping ranges walked in order;
//! allocation continues after the last address handed out and wraps around, as host-local does.
//!
//! # Layout
//! - `peek`: looking ahead without taking.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// One range as written in a host-local `ipam` section (and in ipoold's TOML).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RangeSpec {
    pub subnet: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_start: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range_end: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
}

/// A range that passed validation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    pub subnet: IpNet,
    pub start: IpAddr,
    pub end: IpAddr,
    pub gateway: Option<IpAddr>,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    #[error("invalid subnet {0:?}: {1}")]
    Subnet(String, String),
    #[error("subnet {given} has host bits set; the network address is {network}")]
    HostBits { given: String, network: IpAddr },
    #[error("subnet {0} is too small to allocate from (a /31, /32, /127 or /128)")]
    TooSmall(IpNet),
    #[error("subnet {0} is too broad to be a pod range (at most a /{MIN_PREFIX_V4} for IPv4, a /{MIN_PREFIX_V6} for IPv6)")]
    TooBroad(IpNet),
    #[error("gateway {gateway} is the {what} address of subnet {subnet}")]
    GatewayReserved {
        gateway: IpAddr,
        what: &'static str,
        subnet: IpNet,
    },
    #[error("{key} {value:?} is not an IP address")]
    Address { key: &'static str, value: String },
    #[error("{key} {addr} is not in subnet {subnet}")]
    Outside {
        key: &'static str,
        addr: IpAddr,
        subnet: IpNet,
    },
    #[error("rangeStart {start} is after rangeEnd {end}")]
    Reversed { start: IpAddr, end: IpAddr },
    #[error("a range set must not be empty")]
    EmptySet,
    #[error("a range set mixes IPv4 and IPv6 ({0} and {1}); put each family in its own set")]
    MixedFamilies(IpNet, IpNet),
    #[error("ranges {0} and {1} overlap")]
    Overlap(String, String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(ip: &IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
    /// "4" or "6", as CNI results before 1.0.0 and the Ops API write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Family::V4 => "4",
            Family::V6 => "6",
        }
    }
}

// === address <-> integer ===

pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u32::from(a) as u128,
        IpAddr::V6(a) => u128::from(a),
    }
}

pub fn from_u128(family: Family, v: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(v as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(v)),
    }
}

fn parse_addr(key: &'static str, value: &str) -> Result<IpAddr, RangeError> {
    value.trim().parse().map_err(|_| RangeError::Address {
        key,
        value: value.to_string(),
    })
}

/// The broadest subnet a range may have: broader ones are routes (`0.0.0.0/0`), not pod
/// ranges, and their sizes overflow the counts.
pub const MIN_PREFIX_V4: u8 = 8;
pub const MIN_PREFIX_V6: u8 = 16;

// === impl Range ===

impl Range {
    pub fn from_spec(spec: &RangeSpec) -> Result<Range, RangeError> {
        let given: IpNet = spec
            .subnet
            .trim()
            .parse()
            .map_err(|e: ipnet::AddrParseError| {
                RangeError::Subnet(spec.subnet.clone(), e.to_string())
            })?;
        let subnet = given.trunc();
        if subnet.addr() != given.addr() {
            return Err(RangeError::HostBits {
                given: spec.subnet.clone(),
                network: subnet.addr(),
            });
        }
        if subnet.prefix_len() + 2 > subnet.max_prefix_len() {
            return Err(RangeError::TooSmall(subnet));
        }
        let min_prefix = match subnet {
            IpNet::V4(_) => MIN_PREFIX_V4,
            IpNet::V6(_) => MIN_PREFIX_V6,
        };
        if subnet.prefix_len() < min_prefix {
            return Err(RangeError::TooBroad(subnet));
        }
        let net = to_u128(subnet.network());
        let family = Family::of(&subnet.addr());
        let inside = |key, addr: IpAddr| {
            if subnet.contains(&addr) {
                Ok(addr)
            } else {
                Err(RangeError::Outside { key, addr, subnet })
            }
        };
        let gateway = match &spec.gateway {
            Some(g) if !g.trim().is_empty() => Some(inside("gateway", parse_addr("gateway", g)?)?),
            _ => Some(from_u128(family, net + 1)),
        };
        if let Some(gateway) = gateway {
            let what = if gateway == subnet.network() {
                Some("network")
            } else if family == Family::V4 && gateway == subnet.broadcast() {
                Some("broadcast")
            } else {
                None
            };
            if let Some(what) = what {
                return Err(RangeError::GatewayReserved {
                    gateway,
                    what,
                    subnet,
                });
            }
        }
        let start = match &spec.range_start {
            Some(s) if !s.trim().is_empty() => inside("rangeStart", parse_addr("rangeStart", s)?)?,
            _ => from_u128(family, net + 1),
        };
        let last = to_u128(subnet.broadcast());
        let default_end = match family {
            Family::V4 => last - 1,
            Family::V6 => last,
        };
        let end = match &spec.range_end {
            Some(s) if !s.trim().is_empty() => inside("rangeEnd", parse_addr("rangeEnd", s)?)?,
            _ => from_u128(family, default_end),
        };
        if to_u128(start) > to_u128(end) {
            return Err(RangeError::Reversed { start, end });
        }
        Ok(Range {
            subnet,
            start,
            end,
            gateway,
        })
    }

    pub fn family(&self) -> Family {
        Family::of(&self.start)
    }

    /// True for an address this range may hand out.
    pub fn allocatable(&self, ip: IpAddr) -> bool {
        Family::of(&ip) == self.family()
            && (to_u128(self.start)..=to_u128(self.end)).contains(&to_u128(ip))
            && !self.excluded(to_u128(ip))
    }

    fn excluded(&self, v: u128) -> bool {
        v == to_u128(self.subnet.network())
            || (self.family() == Family::V4 && v == to_u128(self.subnet.broadcast()))
            || self.gateway.map(to_u128) == Some(v)
    }

    /// How many addresses this range can hand out.
    pub fn size(&self) -> u128 {
        let (s, e) = (to_u128(self.start), to_u128(self.end));
        let excluded = [
            Some(to_u128(self.subnet.network())),
            (self.family() == Family::V4).then(|| to_u128(self.subnet.broadcast())),
            self.gateway.map(to_u128),
        ];
        let mut seen = Vec::new();
        for v in excluded.into_iter().flatten() {
            if (s..=e).contains(&v) && !seen.contains(&v) {
                seen.push(v);
            }
        }
        (e - s + 1) - seen.len() as u128
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.start, self.end)
    }
}

/// Validates one range set: non-empty, one family, no overlaps.
pub fn parse_set(specs: &[RangeSpec]) -> Result<Vec<Range>, RangeError> {
    let ranges = specs
        .iter()
        .map(Range::from_spec)
        .collect::<Result<Vec<_>, _>>()?;
    let first = ranges.first().ok_or(RangeError::EmptySet)?;
    for r in &ranges {
        if r.family() != first.family() {
            return Err(RangeError::MixedFamilies(first.subnet, r.subnet));
        }
    }
    for (i, a) in ranges.iter().enumerate() {
        for b in &ranges[i + 1..] {
            if to_u128(a.start) <= to_u128(b.end) && to_u128(b.start) <= to_u128(a.end) {
                return Err(RangeError::Overlap(a.to_string(), b.to_string()));
            }
        }
    }
    Ok(ranges)
}

// === impl RangeAllocator ===

/// The addresses of one range set, and which of them are handed out.
///
/// `taken` is a bitmap kept in chunks only where something is taken ([`Taken`]), so a /64 costs
/// no more than a /24; the cursor makes allocation continue after the last address handed out,
/// like host-local's `last_reserved_ip`.
#[derive(Clone, Debug)]
pub struct RangeAllocator {
    ranges: Vec<Range>,
    taken: Taken,
    /// The last address handed out by `allocate_next`; the next search starts after it.
    cursor: Option<IpAddr>,
    size: u128,
}

impl RangeAllocator {
    pub fn new(ranges: Vec<Range>) -> RangeAllocator {
        let size = ranges.iter().map(Range::size).sum();
        RangeAllocator {
            ranges,
            taken: Taken::default(),
            cursor: None,
            size,
        }
    }

    pub fn ranges(&self) -> &[Range] {
        &self.ranges
    }

    pub fn family(&self) -> Family {
        self.ranges[0].family()
    }

    pub fn size(&self) -> u128 {
        self.size
    }

    pub fn free(&self) -> u128 {
        self.size - self.taken.len()
    }

    pub fn cursor(&self) -> Option<IpAddr> {
        self.cursor
    }

    pub fn set_cursor(&mut self, cursor: Option<IpAddr>) {
        self.cursor = cursor.filter(|ip| self.range_of(*ip).is_some());
    }

    /// The range that contains `ip` (between its start and end), allocatable or not.
    pub fn range_of(&self, ip: IpAddr) -> Option<&Range> {
        let v = to_u128(ip);
        self.ranges.iter().find(|r| {
            r.family() == Family::of(&ip) && (to_u128(r.start)..=to_u128(r.end)).contains(&v)
        })
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.range_of(ip).is_some_and(|r| r.allocatable(ip))
    }

    pub fn is_taken(&self, ip: IpAddr) -> bool {
        self.taken.contains(to_u128(ip))
    }

    /// Hands out the next free address after the cursor, wrapping around the set.
    pub fn allocate_next(&mut self) -> Option<IpAddr> {
        let ip = self.peek_next()?;
        self.taken.insert(to_u128(ip));
        self.cursor = Some(ip);
        Some(ip)
    }

    /// Hands out `ip` (one `peek_next` gave) and continues after it.
    pub fn take_next(&mut self, ip: IpAddr) -> Result<(), OccupyError> {
        self.occupy(ip)?;
        self.cursor = Some(ip);
        Ok(())
    }

    /// The first free address after `after` (or from the start), wrapping around the set.
    fn next_free_after(&self, after: Option<IpAddr>) -> Option<IpAddr> {
        if self.free() == 0 {
            return None;
        }
        let n = self.ranges.len();
        let (first, after) = match after.and_then(|c| {
            let v = to_u128(c);
            self.ranges
                .iter()
                .position(|r| (to_u128(r.start)..=to_u128(r.end)).contains(&v))
                .map(|i| (i, v))
        }) {
            Some((i, v)) => (i, Some(v)),
            None => (0, None),
        };
        // Walk: the rest of the cursor's range, the other ranges, then the cursor's range's head.
        for step in 0..=n {
            let idx = (first + step) % n;
            let r = &self.ranges[idx];
            let (lo, hi) = (to_u128(r.start), to_u128(r.end));
            let from = match (step, after) {
                (0, Some(v)) if v >= hi => continue,
                (0, Some(v)) => v + 1,
                _ => lo,
            };
            let to = match (step, after) {
                (s, Some(v)) if s == n => v,
                _ => hi,
            };
            if let Some(v) = self.first_free(r, from, to) {
                return Some(from_u128(r.family(), v));
            }
        }
        None
    }

    fn first_free(&self, r: &Range, from: u128, to: u128) -> Option<u128> {
        self.taken.first_free(from, to, |v| !r.excluded(v))
    }

    /// Whether [`RangeAllocator::occupy`] would take `ip`.
    pub fn can_occupy(&self, ip: IpAddr) -> Result<(), OccupyError> {
        if !self.contains(ip) {
            return Err(OccupyError::NotInRange(ip));
        }
        if self.taken.contains(to_u128(ip)) {
            return Err(OccupyError::Taken(ip));
        }
        Ok(())
    }

    /// Marks a given address as handed out (static request, or rebuilding after a restart).
    pub fn occupy(&mut self, ip: IpAddr) -> Result<(), OccupyError> {
        self.can_occupy(ip)?;
        self.taken.insert(to_u128(ip));
        Ok(())
    }

    /// Returns an address to the free set. False if it was not handed out.
    pub fn release(&mut self, ip: IpAddr) -> bool {
        self.taken.remove(to_u128(ip))
    }
}

/// Addresses (as integers) handed out: a bitmap in chunks of 512, each kept only while
/// something in it is taken. 65 536 addresses in use cost 128 chunks (about 12 KiB); a B-tree
/// of integers cost about 1.5 MiB.
#[derive(Clone, Debug, Default)]
struct Taken {
    chunks: BTreeMap<u128, Box<[u64; 8]>>,
    len: u128,
}

impl Taken {
    /// (chunk, word in the chunk, bit in the word)
    fn place(v: u128) -> (u128, usize, u64) {
        (v >> 9, ((v >> 6) & 7) as usize, 1u64 << (v & 63))
    }

    fn len(&self) -> u128 {
        self.len
    }

    fn contains(&self, v: u128) -> bool {
        let (c, w, bit) = Taken::place(v);
        self.chunks.get(&c).is_some_and(|words| words[w] & bit != 0)
    }

    /// False if it was taken already.
    fn insert(&mut self, v: u128) -> bool {
        let (c, w, bit) = Taken::place(v);
        let words = self.chunks.entry(c).or_insert_with(|| Box::new([0; 8]));
        if words[w] & bit != 0 {
            return false;
        }
        words[w] |= bit;
        self.len += 1;
        true
    }

    /// False if it was not taken.
    fn remove(&mut self, v: u128) -> bool {
        let (c, w, bit) = Taken::place(v);
        let Some(words) = self.chunks.get_mut(&c) else {
            return false;
        };
        if words[w] & bit == 0 {
            return false;
        }
        words[w] &= !bit;
        self.len -= 1;
        if words.iter().all(|x| *x == 0) {
            self.chunks.remove(&c);
        }
        true
    }

    /// The first address in `from..=to` that is not taken and that `ok` accepts. Full chunks
    /// are skipped whole; chunks with nothing taken are not stored, so a sparse /64 is walked
    /// only as far as `ok` needs.
    fn first_free(&self, from: u128, to: u128, ok: impl Fn(u128) -> bool) -> Option<u128> {
        let mut v = from;
        while v <= to {
            let (c, w, bit) = Taken::place(v);
            match self.chunks.get(&c) {
                Some(words) if words.iter().all(|x| *x == u64::MAX) => {
                    v = (c + 1).checked_mul(512)?;
                    continue;
                }
                Some(words) if words[w] & bit != 0 => {}
                _ if ok(v) => return Some(v),
                _ => {}
            }
            v = v.checked_add(1)?;
        }
        None
    }
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OccupyError {
    #[error("{0} is not an address these ranges hand out")]
    NotInRange(IpAddr),
    #[error("{0} is already handed out")]
    Taken(IpAddr),
    /// The source holds it but hands nothing out from where it is now: why.
    #[error("{0} cannot be handed out now: {1}")]
    Withheld(IpAddr, String),
}

mod peek;

#[cfg(test)]
mod tests;
