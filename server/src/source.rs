//! Where a pool's addresses come from. Every call is made by the engine behind the pool's
//! token bucket. `local` (ranges from the daemon config or the CNI `ipam` section) is the
//! embedded default; the cluster mode (blocks claimed from etcd) will be a second impl.
//!
//! The engine first *looks* (`peek_next`, `can_occupy`: nothing changes), writes what it decided
//! to the store, and only then *takes* (`take_next`, `occupy`): a write the store refuses
//! leaves the source as it was.

use std::net::IpAddr;

use crate::range::{OccupyError, Range, RangeAllocator};

pub trait Source: Send {
    /// The ranges, for status and error messages (e.g. "10.1.0.1-10.1.0.254").
    fn describe(&self) -> String;
    /// The address `take_next` would hand out next; None when the source has nothing left.
    fn peek_next(&self) -> Option<IpAddr>;
    /// The next `n` addresses in handing-out order (fewer if fewer are left).
    fn peek_next_n(&self, n: usize) -> Vec<IpAddr>;
    /// Hands out `ip`, one `peek_next` gave, and continues after it.
    fn take_next(&mut self, ip: IpAddr) -> Result<(), OccupyError>;
    /// Whether `occupy(ip)` would succeed.
    fn can_occupy(&self, ip: IpAddr) -> Result<(), OccupyError>;
    /// Hands out a given address (a static request, or rebuilding after a restart).
    fn occupy(&mut self, ip: IpAddr) -> Result<(), OccupyError>;
    /// Takes an address back. False if it was not handed out.
    fn vacate(&mut self, ip: IpAddr) -> bool;
    /// True if `ip` is an address this source may hand out.
    fn contains(&self, ip: IpAddr) -> bool;
    /// True if `ip` is in one of the source's subnets (handed out or not: gateway, network...).
    fn covers(&self, ip: IpAddr) -> bool;
    /// The prefix length and gateway to report with `ip`.
    fn interface_of(&self, ip: IpAddr) -> Option<(u8, Option<IpAddr>)>;
    /// Addresses the source could still hand out.
    fn free(&self) -> u128;
    /// All addresses the source can hand out.
    fn size(&self) -> u128;
    /// Where the next search starts (persisted so that a restart continues the sequence).
    fn cursor(&self) -> Option<IpAddr>;
    fn set_cursor(&mut self, cursor: Option<IpAddr>);
}

/// Addresses from local ranges with host-local semantics.
pub struct LocalSource {
    alloc: RangeAllocator,
}

impl LocalSource {
    pub fn new(ranges: Vec<Range>) -> LocalSource {
        LocalSource {
            alloc: RangeAllocator::new(ranges),
        }
    }
}

impl Source for LocalSource {
    fn describe(&self) -> String {
        let parts: Vec<String> = self.alloc.ranges().iter().map(|r| r.to_string()).collect();
        parts.join(",")
    }
    fn peek_next(&self) -> Option<IpAddr> {
        self.alloc.peek_next()
    }
    fn peek_next_n(&self, n: usize) -> Vec<IpAddr> {
        self.alloc.peek_next_n(n)
    }
    fn take_next(&mut self, ip: IpAddr) -> Result<(), OccupyError> {
        self.alloc.take_next(ip)
    }
    fn can_occupy(&self, ip: IpAddr) -> Result<(), OccupyError> {
        self.alloc.can_occupy(ip)
    }
    fn occupy(&mut self, ip: IpAddr) -> Result<(), OccupyError> {
        self.alloc.occupy(ip)
    }
    fn vacate(&mut self, ip: IpAddr) -> bool {
        self.alloc.release(ip)
    }
    fn contains(&self, ip: IpAddr) -> bool {
        self.alloc.contains(ip)
    }
    fn covers(&self, ip: IpAddr) -> bool {
        self.alloc.ranges().iter().any(|r| r.subnet.contains(&ip))
    }
    fn interface_of(&self, ip: IpAddr) -> Option<(u8, Option<IpAddr>)> {
        self.alloc
            .range_of(ip)
            .map(|r| (r.subnet.prefix_len(), r.gateway))
    }
    fn free(&self) -> u128 {
        self.alloc.free()
    }
    fn size(&self) -> u128 {
        self.alloc.size()
    }
    fn cursor(&self) -> Option<IpAddr> {
        self.alloc.cursor()
    }
    fn set_cursor(&mut self, cursor: Option<IpAddr>) {
        self.alloc.set_cursor(cursor)
    }
}
