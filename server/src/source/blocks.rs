//! The block-specific part of a source ([`BlockSource`]): a source that gets its addresses
//! from elsewhere, in blocks, asynchronously (a cluster pool's). It says [`super::Next::Pending`]
//! while it has none ready, and hands the engine a [`Claim`] (`start_claim`): a future the
//! engine runs outside its state lock. When the claim is done, the engine gives its result back
//! under the lock (`land`) and wakes the ADDs that wait. A landed block is written to the store
//! in the same change set as the first address taken from it (`unrecorded`), and given back at
//! start (`restore_block`); a block the source gave back is struck from the store by the
//! background loop (`forget`). The engine asks a source for this part ([`Source::blocks`])
//! where blocks matter; a source of ranges has none.

use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;

use ipnet::IpNet;

use super::{Next, Source};
use crate::range::OccupyError;

/// Work a source needs done outside the engine's lock (claiming a block, say). It leaves its
/// result with the source that started it, which takes it in when the engine, the work done,
/// calls [`BlockSource::land`] under the lock: a result of a source since replaced (the range set
/// rebuilt) goes with that source.
pub type Claim = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What a source took in when the engine called [`BlockSource::land`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Landing {
    /// No work of its own had finished (the work done was a source's it replaced).
    Nothing,
    /// Its work's result taken in; what it did, for the log (a block that lands is not
    /// recorded yet).
    Took(String),
}

/// Why a source does not take a block in (one the store holds for it, at start; one its work
/// brought).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BlockRefused {
    /// The source claims no blocks (a range set of ranges).
    #[error("the store holds block {0}, but this range set's source claims no blocks")]
    NotClaiming(String),
    /// What names the block is no block CIDR.
    #[error("{0:?} is not a block CIDR")]
    Malformed(String),
    /// The block lies outside what the source serves, or holds nothing it could hand out.
    #[error("{0}")]
    Outside(String),
}

/// Why a claiming source does not know yet which addresses it holds.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotListedYet(pub String);

/// A source's work that failed: why, for the log and the set's last error. The source
/// decides when to try again.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WorkFailed(pub String);

/// A block as its source knows it: its CIDR, and its identity in the store (the revision it
/// was created at: a block deleted and made again over the same CIDR is another).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockId {
    pub net: IpNet,
    pub created: i64,
}

/// A source that claims its addresses in blocks (see the module).
pub trait BlockSource: Source {
    /// A claim to run, if the source wants more addresses now and has no claim in flight. The
    /// engine asks when an ADD finds nothing ready and on every pass of its background loop
    /// (after every change, at least once a second): after a failed claim, the source decides
    /// when to try again (its backend's backoff).
    fn start_claim(&mut self) -> Option<Claim> {
        None
    }
    /// Takes in the result its work left, back under the engine's lock (see [`Claim`]).
    fn land(&mut self) -> Result<Landing, WorkFailed> {
        Ok(Landing::Nothing)
    }
    /// The block `ip` comes from when the store does not hold it yet: the change set that takes
    /// `ip` records it.
    fn unrecorded(&self, _ip: IpAddr) -> Option<IpNet> {
        None
    }
    /// Gives back a block the store holds, at start.
    fn restore_block(&mut self, block: IpNet) -> Result<(), BlockRefused> {
        Err(BlockRefused::NotClaiming(block.to_string()))
    }
    /// The blocks the store holds for this source (dropped with it).
    fn recorded_blocks(&self) -> Vec<IpNet> {
        Vec::new()
    }
    /// Why nothing may be handed out now, not even an address the source handed out before
    /// (an idle one): a claiming source not yet sure its blocks are still its own, or one
    /// whose node is fenced. The answer is [`Next::Pending`], [`Next::Unavailable`] or
    /// [`Next::Refused`]. None:
    /// the pool serves as usual.
    fn held_back(&self) -> Option<Next> {
        None
    }
    /// Why `ip`, which the source handed out before (idle, cooling, reserved), may not be
    /// handed out again now, though the source serves: where it is (a block) does not serve.
    /// Asked on every path that hands out an address the pool holds.
    fn withheld(&self, _ip: IpAddr) -> Option<String> {
        None
    }
    /// Whether [`BlockSource::withheld`] may say Some for any address. A source that never
    /// withholds (ranges: every address serves while the source does) says false, and the
    /// engine's maintenance skips the walk over the idle set that looks for withheld ones.
    fn may_withhold(&self) -> bool {
        false
    }
    /// Whether the source claims more addresses when it runs low (a cluster pool's blocks):
    /// then [`Source::free`] is what it holds now, not what it could ever hand out, and a pool
    /// with no free address is not exhausted.
    fn grows(&self) -> bool {
        false
    }
    /// Ok once the source knows which addresses it holds (a claiming source: after its first
    /// sync); a quarantine of live pods' addresses waits for it.
    fn knows_its_addresses(&self) -> Result<(), NotListedYet> {
        Ok(())
    }
    /// Recorded blocks the source no longer has (it gave them back): from now on they count as
    /// unrecorded, and the engine writes them as not held.
    fn forget(&mut self) -> Vec<IpNet> {
        Vec::new()
    }
    /// Blocks that came to hold addresses without one being taken from them (another block's,
    /// taken over): the engine writes them as held, before what [`BlockSource::forget`] returns.
    fn record(&mut self) -> Vec<IpNet> {
        Vec::new()
    }
    /// Why the source works in a reduced way now (its backend unreachable: it serves what it
    /// holds), for status and metrics. None: all is well.
    fn degraded(&self) -> Option<String> {
        None
    }
    /// What the source holds and could get (its blocks, its backend's counts), for status and
    /// for the error when it is exhausted.
    fn detail(&self) -> Option<String> {
        None
    }
    /// The cluster pool the source's addresses come from, where a network has several (an
    /// ADD may choose among them). None: the source is the only one of its family.
    fn pool_name(&self) -> Option<&str> {
        None
    }
    /// Why this node may not take new addresses from the source's pool at all (its labels do
    /// not match the pool's nodeSelector): an ADD that names the pool is refused saying so, one
    /// that does not is served from the network's next pool. None: it may.
    fn refused(&self) -> Option<String> {
        None
    }
    /// An ADD wants an address of this source now: a source that claims only on demand (a
    /// network's later pool, tried once the earlier ones are full) claims its first block.
    fn demand(&mut self) {}

    /// Fixed addresses: an address the layer above holds for one pod alone (a cluster pin
    /// this node holds for it, see `cluster::pin`), which the source keeps from everyone else.
    /// Whether `ip` may be handed out to that pod: as `can_occupy`, but an address kept for it
    /// is not withheld, and one outside what the source holds may be hosted here. Default:
    /// `can_occupy` (a source that keeps nothing for pods).
    fn can_occupy_fixed(&self, ip: IpAddr) -> Result<(), OccupyError> {
        self.can_occupy(ip)
    }
    /// Hands out `ip` to the pod it is fixed for (or rebuilds its attachment after a restart:
    /// the record says it was). Default: `occupy`.
    fn occupy_fixed(&mut self, ip: IpAddr) -> Result<(), OccupyError> {
        self.occupy(ip)
    }
    /// As `withheld`, for the pod `ip` is fixed for. Default: `withheld`.
    fn withheld_fixed(&self, ip: IpAddr) -> Option<String> {
        self.withheld(ip)
    }
    /// Where `ip` lies in the source's backend, for a record kept there (a pin names its
    /// block): the block and the block's identity (the store's creation revision). None: in no
    /// block of the source's.
    fn block_holding(&self, _ip: IpAddr) -> Option<BlockId> {
        None
    }
    /// Whether the source's addresses make one subnet across nodes (an address can be served
    /// on any node: a fixed address can follow its pod).
    fn one_subnet(&self) -> bool {
        false
    }
    /// Whether `ip` is hosted here: a fixed address outside what the source holds, in use by
    /// its pod. Released, it goes back at once (never idle, never kept for a sticky pod: it
    /// is not this source's to hand out again).
    fn hosts(&self, _ip: IpAddr) -> bool {
        false
    }
}
