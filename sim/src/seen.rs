//! The store as the checker last saw it (its version and blocks), as it was before (a
//! snapshot at each change, so that an ADD is judged against the store as it was when its
//! addresses were picked), each block's last write, and the names held as the trace last said.

use std::collections::{BTreeMap, VecDeque};

use tokio::time::Instant;

use crate::check::StoreBlock;
use crate::store::Holder;

/// How many snapshots are kept: enough for any ADD's pick to lie within them.
const SNAPSHOTS: usize = 512;

/// The store as it was from `at` on (until the next): its blocks and its names' holders.
pub(crate) struct Snapshot {
    pub at: Instant,
    pub blocks: Vec<StoreBlock>,
    pub holders: Vec<Holder>,
    /// The Kubernetes API's blocks' records of their pool, and the pool's now.
    pub pool_revisions: Option<crate::store::PoolRevisions>,
    /// Each pool's CIDRs.
    pub pool_cidrs: BTreeMap<String, Vec<ipnet::IpNet>>,
}

/// What the checker saw of the store.
#[derive(Default)]
pub(crate) struct Seen {
    /// The store's version at the last look.
    pub version: u64,
    /// Its blocks then.
    pub blocks: Vec<StoreBlock>,
    /// The store as it was, from the oldest kept on.
    snapshots: VecDeque<Snapshot>,
    /// Each block's revision, and when it was last written.
    pub written: BTreeMap<ipnet::IpNet, (u64, Instant)>,
    /// The names held, as the trace last said.
    pub last_names: Option<String>,
    /// The daemon instance that last held each node name in the store.
    pub holders: BTreeMap<String, String>,
}

impl Seen {
    /// Keeps `s`, the store as it is now (the oldest dropped past [`SNAPSHOTS`]).
    pub fn keep(&mut self, s: Snapshot) {
        if self.snapshots.len() == SNAPSHOTS {
            self.snapshots.pop_front();
        }
        self.snapshots.push_back(s);
    }

    /// The store as it was at `t` (the oldest kept, if `t` is older).
    pub fn at(&self, t: Instant) -> &Snapshot {
        self.snapshots
            .iter()
            .rev()
            .find(|s| s.at <= t)
            .or(self.snapshots.front())
            .expect("a snapshot from the start")
    }
}
