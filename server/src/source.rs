//! Where a pool's addresses come from. Every call is made by the engine behind the pool's
//! token bucket. [`LocalSource`] (ranges from the daemon config or the CNI `ipam` section) is
//! the embedded default; `cluster::source::ClusterSource` (blocks claimed from the cluster's
//! store) is the second impl.
//!
//! The engine first *looks* (`next`, `can_occupy`: nothing changes), writes what it decided
//! to the store, and only then *takes* (`take_next`, `occupy`): a write the store refuses
//! leaves the source as it was.
//!
//! A source that gets its addresses from elsewhere, in blocks, asynchronously (a cluster
//! pool's) has a second part, [`BlockSource`] (`source::blocks`), which the engine asks for
//! ([`Source::blocks`]) where blocks matter: claims and their landing, the blocks recorded in
//! the store, addresses withheld where a block does not serve, fixed addresses.

use std::net::IpAddr;
use std::sync::Arc;

use crate::error::Refusal;
use crate::model::NetworkDef;
use crate::range::{OccupyError, Range, RangeAllocator};

mod blocks;
pub use blocks::{BlockId, BlockRefused, BlockSource, Claim, Landing, NotListedYet, WorkFailed};

/// Makes the source of a network's range set (given its ranges): where the network's
/// addresses come from. The default makes a [`LocalSource`] for every set.
#[derive(Clone)]
pub struct Sources(Arc<MakeSource>);

type MakeSource = dyn Fn(&NetworkDef, Vec<Range>) -> Box<dyn Source> + Send + Sync;

impl Sources {
    pub fn new(
        make: impl Fn(&NetworkDef, Vec<Range>) -> Box<dyn Source> + Send + Sync + 'static,
    ) -> Sources {
        Sources(Arc::new(make))
    }

    pub fn make(&self, def: &NetworkDef, ranges: Vec<Range>) -> Box<dyn Source> {
        let mut source = (self.0)(def, ranges);
        let has_blocks = source.blocks().is_some();
        debug_assert_eq!(
            has_blocks,
            source.blocks_mut().is_some(),
            "a source's blocks() and blocks_mut() must agree"
        );
        source
    }
}

impl Default for Sources {
    fn default() -> Self {
        Sources::new(|_, ranges| Box::new(LocalSource::new(ranges)))
    }
}

/// What a source can hand out now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// This address, next.
    Ready(IpAddr),
    /// Nothing left, and nothing more to come.
    Exhausted,
    /// Nothing now; more is on its way (a claim in flight, or one the source wants to start).
    /// Says what is awaited.
    Pending(String),
    /// Nothing now, and the source cannot get more at the moment (say, its backend is
    /// unreachable). Says why.
    Unavailable(String),
    /// Nothing now, for a reason an operator can act on (the pool disabled, the node fenced):
    /// [`Next::Unavailable`], with the reason an ADD refused for it is recorded on the pod by.
    Refused(Refusal, String),
}

impl Next {
    /// Why nothing is handed out, and what an operator can act on in it: for
    /// [`Next::Pending`], [`Next::Unavailable`] and [`Next::Refused`].
    pub fn why_not(self) -> Option<(Option<Refusal>, String)> {
        match self {
            Next::Pending(why) | Next::Unavailable(why) => Some((None, why)),
            Next::Refused(r, why) => Some((Some(r), why)),
            Next::Ready(_) | Next::Exhausted => None,
        }
    }
}

pub trait Source: Send {
    /// The ranges, for status and error messages (e.g. "10.1.0.1-10.1.0.254").
    fn describe(&self) -> String;
    /// What `take_next` would hand out next.
    fn next(&self) -> Next;
    /// The next `n` addresses in handing-out order (fewer if fewer are left).
    fn peek_next_n(&self, n: usize) -> Vec<IpAddr>;
    /// Hands out `ip`, one `next` gave, and continues after it. The block it came from counts
    /// as recorded from now on (the engine wrote `unrecorded(ip)` with it).
    fn take_next(&mut self, ip: IpAddr) -> Result<(), OccupyError>;
    /// Whether `occupy(ip)` would succeed for a request to hand `ip` out (an address asked for
    /// by name).
    fn can_occupy(&self, ip: IpAddr) -> Result<(), OccupyError>;
    /// Whether `ip` could be taken from the source to be *kept* from everyone (a quarantine):
    /// wherever the source holds it, even where it hands nothing out now.
    fn can_hold(&self, ip: IpAddr) -> Result<(), OccupyError> {
        self.can_occupy(ip)
    }
    /// Hands out a given address (a static request, or rebuilding after a restart). As with
    /// `take_next`, its block counts as recorded from now on.
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
    /// All addresses the source can hand out (a claiming source: including those it may still
    /// claim). The pool's capacity is at most this.
    fn size(&self) -> u128;
    /// Where the next search starts (persisted so that a restart continues the sequence).
    fn cursor(&self) -> Option<IpAddr>;
    fn set_cursor(&mut self, cursor: Option<IpAddr>);

    /// The block-specific part ([`BlockSource`]), for a source that claims its addresses in
    /// blocks from elsewhere: the engine asks for it where blocks matter. None: a source of
    /// ranges, whose every address serves while it does.
    fn blocks(&self) -> Option<&dyn BlockSource> {
        None
    }
    /// As [`Source::blocks`], to change it.
    fn blocks_mut(&mut self) -> Option<&mut dyn BlockSource> {
        None
    }
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
    fn next(&self) -> Next {
        match self.alloc.peek_next() {
            Some(ip) => Next::Ready(ip),
            None => Next::Exhausted,
        }
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
