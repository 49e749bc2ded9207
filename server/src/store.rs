//! Durable state. The engine describes each change as a list of [`Change`]s that a [`Store`]
//! takes as one atomic change set ([`Store::append`]); [`Store::flush`] makes every change set
//! appended so far durable. The engine replies only once a flush has covered its change set.
//!
//! A failed flush fails the store: the change sets it did not make durable never become
//! durable, every later call fails, and the store serves again only after
//! [`Store::reopen`], which keeps exactly what was durable (the engine then rebuilds its state
//! from it).
//!
//! What is stored (sled trees):
//! - `networks`: network name -> [`NetworkDef`] (JSON)
//! - `attachments`: network \0 container ID \0 ifname -> [`AttachmentRecord`] (JSON); the
//!   addresses in use are exactly those named by attachments
//! - `idle`: network \0 address -> release time (engine ms, u64 big-endian); 0 = never used
//! - `cursors`: network \0 range-set id (its ranges; an index before schema 5) -> last address
//!   handed out by the source
//! - `reservations`: network \0 namespace \0 pod name -> [`Reservation`] (JSON)
//! - `meta`: `schema_version` (u32 big-endian), `store_id` (16 bytes, also in the log files'
//!   headers), `boot_id` (the machine's boot ID at the last start, text), `clock` (the engine
//!   clock's anchor, JSON), `host-local\0<network>` (host-local's allocations taken over),
//!   `drain\0<network>` (present while the network is drained; `*` =
//!   all), `wal_checkpoint` and `wal_epoch` (u64 big-endian: how far sled's trees are known
//!   durable, and which log records may need replaying; see `sled_store`)
//!
//! Schema history: 1 = networks, attachments, idle, cursors; 2 = adds reservations and boot_id
//! (a version-1 store is read as is and marked 2 at open); 3 = the journal tree; 4 = the
//! write-ahead log (`wal-0`, `wal-1`); 5 = the log files have a header with the store's id,
//! records carry their flush's batch, and sled takes a change set only once it is durable.
//! An older store opens and is migrated.
//!
//! # Layout
//! - `applier`: the thread that writes durable change sets into sled's trees, and makes
//!   checkpoints;
//! - `codec`: change sets as bytes;
//! - `commit`: group commit;
//! - `live`: one open store;
//! - `mem`: the in-memory twin of [`SledStore`], for tests of the engine;
//! - `open`: opening a store;
//! - `sled_store`: the sled implementation of [`Store`];
//! - `trees`: sled's database and its trees, opened (waiting out another holder of its lock) and
//!   shared by the store (opening, loading), its live state and its applier thread;
//! - `wal`: the write-ahead log in front of sled.

use std::net::IpAddr;
use std::path::PathBuf;

pub use crate::model::{
    AttachmentKey, AttachmentRecord, ClockAnchor, Millis, NetworkDef, Pod, Reservation,
    ReservationKey,
};

mod applier;
mod codec;
mod commit;
mod live;
mod mem;
mod open;
mod sled_store;
mod trees;
mod wal;
pub use commit::{CommitStats, Committer};
pub use mem::MemStore;
pub use sled_store::{SledStore, StoreOptions};
pub(crate) use trees::Trees;

/// 1: the first release. 2: reservations, boot ID, drains. 3: the write journal (an older
/// ipoold would not finish a change set a crash interrupted, so it must refuse the store).
/// 4: the write-ahead log files `wal-0` and `wal-1` next to `db` (an older ipoold would not
/// replay them). 5: log files with a header and batches (an older ipoold could not read them).
/// 6: claimed blocks (a seventh tree) and retiring range sets (an older ipoold would call the
/// log damaged, or drop the retiring sets and then the attachments in them). 7: networks of
/// cluster pools that say so in their definition (each set's pool, the pools a CNI config
/// named, one subnet's gateway and exclusions: an older ipoold would drop them and serve the
/// pool's CIDRs as local ranges, addresses of other nodes' blocks).
pub const SCHEMA_VERSION: u32 = 7;

/// A change set's number: the order in which the store took them.
pub type Seq = u64;

#[derive(Clone, Debug, PartialEq)]
pub enum Change {
    PutNetwork(NetworkDef),
    DeleteNetwork(String),
    PutAttachment(AttachmentRecord),
    DeleteAttachment(AttachmentKey),
    PutIdle {
        network: String,
        ip: IpAddr,
        released_at: Millis,
    },
    DeleteIdle {
        network: String,
        ip: IpAddr,
    },
    /// The last address a range set's source handed out. `set` is the range set's id, its
    /// ranges as `first-last[,first-last...]`: stable when other sets come or go. (Stores
    /// before schema 5 keyed it by the set's position; recovery moves those to the id.)
    PutCursor {
        network: String,
        set: String,
        cursor: Option<IpAddr>,
    },
    /// A block of addresses a range set's source claimed (`held`), or gave back. `block` is
    /// written as the source writes it (see [`crate::source::BlockSource::unrecorded`]).
    PutBlock {
        network: String,
        set: String,
        block: String,
        held: bool,
    },
    PutReservation(Reservation),
    DeleteReservation(ReservationKey),
    PutBootId(String),
    /// Where the engine clock stood (see [`crate::clock`]).
    PutClock(ClockAnchor),
    /// A network ("*": every network) is drained, or no longer.
    PutDrain {
        network: String,
        drained: bool,
    },
    /// host-local's allocations of a network were looked for and taken over (once per
    /// network: `service::host_local`).
    PutTakenOver(String),
}

/// Everything in a store, as loaded at start.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub networks: Vec<NetworkDef>,
    pub attachments: Vec<AttachmentRecord>,
    pub idle: Vec<(String, IpAddr, Millis)>,
    pub cursors: Vec<(String, String, IpAddr)>,
    /// Claimed blocks: (network, range set id, block).
    pub blocks: Vec<(String, String, String)>,
    pub reservations: Vec<Reservation>,
    /// The boot ID recorded at the last start (None in a new or a version-1 store).
    pub boot_id: Option<String>,
    /// The engine clock's last recorded anchor.
    pub clock: Option<ClockAnchor>,
    /// Drained networks ("*": all).
    pub drained: Vec<String>,
    /// Networks whose host-local allocations were taken over.
    pub taken_over: Vec<String>,
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the store at {path}: {msg}")]
    Open { path: PathBuf, msg: String },
    #[error("the store at {path} was written by schema version {found}; this ipoold reads version {SCHEMA_VERSION} (run the newer ipoold, or move the state dir away to start empty)")]
    NewerSchema { path: PathBuf, found: u32 },
    #[error("the store at {path} is corrupt: {msg} (ipoold will not start over it; docs/operations.md, \"Damaged or missing state\", says how to recover)")]
    Corrupt { path: PathBuf, msg: String },
    #[error("store I/O at {path}: {msg}")]
    Io { path: PathBuf, msg: String },
    /// The store could not make a change set durable: it serves nothing until it is reopened.
    #[error("the store at {path} failed: {msg}; nothing not yet durable was kept, and ipoold reopens it until writes succeed")]
    Failed { path: PathBuf, msg: String },
}

pub trait Store: Send + Sync {
    /// Everything durable in the store, but the attachments are handed to `each_attachment`
    /// one at a time as they are read instead of collected (the returned snapshot has none):
    /// recovery keeps them in its own compact form, and tens of thousands of records at once
    /// would be the daemon's peak memory.
    fn load_with(
        &self,
        each_attachment: &mut dyn FnMut(AttachmentRecord),
    ) -> Result<Snapshot, StoreError>;
    /// Everything durable in the store, attachments included.
    fn load(&self) -> Result<Snapshot, StoreError> {
        let mut attachments = Vec::new();
        let snap = self.load_with(&mut |a| attachments.push(a))?;
        Ok(Snapshot {
            attachments,
            ..snap
        })
    }
    /// Takes `changes` as one change set (all or none of it becomes durable) and returns its
    /// number. Nothing is durable until a flush covers it. An error means nothing was taken.
    fn append(&self, changes: &[Change]) -> Result<Seq, StoreError>;
    /// Makes every change set appended so far durable; returns the newest durable number.
    /// An error fails the store (module docs).
    fn flush(&self) -> Result<Seq, StoreError>;
    /// After a failure: keeps what was durable, drops the rest, and serves again. Numbers go
    /// on from above every number handed out before.
    fn reopen(&self) -> Result<(), StoreError>;
    /// Why the store has failed, if it has, whether or not a call has met the failure yet
    /// (its background work, writing sled and checkpoints, can fail it between calls).
    fn failure(&self) -> Option<String>;
}

#[cfg(test)]
mod tests;
