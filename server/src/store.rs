//! Durable state. The engine describes each change as a list of [`Change`]s that a [`Store`]
//! applies atomically; `flush` makes everything applied so far durable. The engine replies only
//! after `flush` returns.
//!
//! What is stored (sled trees):
//! - `networks`: network name -> [`NetworkDef`] (JSON)
//! - `attachments`: network \0 container ID \0 ifname -> [`AttachmentRecord`] (JSON); the
//!   addresses in use are exactly those named by attachments
//! - `idle`: network \0 address -> release time (Unix ms, u64 big-endian); 0 = never used
//! - `cursors`: network \0 range-set index -> last address handed out by the source
//! - `reservations`: network \0 namespace \0 pod name -> [`Reservation`] (JSON)
//! - `meta`: `schema_version` (u32 big-endian), `boot_id` (the machine's boot ID at the last
//!   start, text), `drain\0<network>` (present while the network is drained; `*` = all)
//!
//! - `meta` also holds `wal_checkpoint` and `wal_epoch` (u64 big-endian): how far sled's trees
//!   are known durable, and which log records may need replaying (see `sled_store`)
//!
//! Schema history: 1 = networks, attachments, idle, cursors; 2 = adds reservations and boot_id
//! (a version-1 store is read as is and marked 2 at open); 3 = the journal tree; 4 = the
//! write-ahead log (`wal-0`, `wal-1`). An older store opens and is marked current.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::config::NetworkDef;
use crate::pool::Millis;

mod commit;
mod sled_store;
mod wal;
pub use commit::{CommitStats, Committer};
pub use sled_store::SledStore;

/// 1: the first release. 2: reservations, boot ID, drains. 3: the write journal (an older
/// ipoold would not finish a change set a crash interrupted, so it must refuse the store).
/// 4: the write-ahead log files `wal-0` and `wal-1` next to `db` (an older ipoold would not
/// replay them).
pub const SCHEMA_VERSION: u32 = 4;

/// The key of an attachment: (network name, CNI_CONTAINERID, CNI_IFNAME).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct AttachmentKey {
    pub network: String,
    pub container_id: String,
    pub ifname: String,
}

impl AttachmentKey {
    /// Store key. The parts never contain NUL (they are validated before they get here).
    pub fn encode(&self) -> Vec<u8> {
        format!("{}\0{}\0{}", self.network, self.container_id, self.ifname).into_bytes()
    }
}

impl std::fmt::Display for AttachmentKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.network, self.container_id, self.ifname)
    }
}

/// The pod behind an attachment (from K8S_POD_* in CNI_ARGS); empty strings when unknown.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachmentRecord {
    pub key: AttachmentKey,
    #[serde(default)]
    pub pod: Pod,
    #[serde(default)]
    pub netns: String,
    /// One per range set of the network, in range-set order.
    pub addresses: Vec<IpAddr>,
    pub created_at_ms: Millis,
}

/// Whose a reservation is: a pod identity within a network.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReservationKey {
    pub network: String,
    pub namespace: String,
    pub name: String,
}

impl ReservationKey {
    pub fn encode(&self) -> Vec<u8> {
        format!("{}\0{}\0{}", self.network, self.namespace, self.name).into_bytes()
    }
}

impl std::fmt::Display for ReservationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}/{}", self.network, self.namespace, self.name)
    }
}

/// Addresses kept for a pod identity (a sticky pod that went away) until `expires_at_ms`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub key: ReservationKey,
    /// At most one per range set of the network.
    pub addresses: Vec<IpAddr>,
    pub created_at_ms: Millis,
    pub expires_at_ms: Millis,
    /// Why it exists, for operators: "sticky pod deleted", "reboot", ...
    #[serde(default)]
    pub reason: String,
}

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
    PutCursor {
        network: String,
        set: usize,
        cursor: Option<IpAddr>,
    },
    PutReservation(Reservation),
    DeleteReservation(ReservationKey),
    PutBootId(String),
    /// A network ("*": every network) is drained, or no longer.
    PutDrain {
        network: String,
        drained: bool,
    },
}

/// Everything in a store, as loaded at start.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub networks: Vec<NetworkDef>,
    pub attachments: Vec<AttachmentRecord>,
    pub idle: Vec<(String, IpAddr, Millis)>,
    pub cursors: Vec<(String, usize, IpAddr)>,
    pub reservations: Vec<Reservation>,
    /// The boot ID recorded at the last start (None in a new or a version-1 store).
    pub boot_id: Option<String>,
    /// Drained networks ("*": all).
    pub drained: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot open the store at {path}: {msg}")]
    Open { path: PathBuf, msg: String },
    #[error("the store at {path} was written by schema version {found}; this ipoold reads version {SCHEMA_VERSION} (run the newer ipoold, or move the state dir away to start empty)")]
    NewerSchema { path: PathBuf, found: u32 },
    #[error("the store at {path} is corrupt: {msg} (repair or move it away; ipoold will not start empty over old data)")]
    Corrupt { path: PathBuf, msg: String },
    #[error("store I/O at {path}: {msg}")]
    Io { path: PathBuf, msg: String },
}

pub trait Store: Send + Sync {
    /// Everything in the store, but the attachments are handed to `each_attachment` one at a
    /// time as they are read instead of collected (the returned snapshot has none): recovery
    /// keeps them in its own compact form, and tens of thousands of records at once would be
    /// the daemon's peak memory.
    fn load_with(
        &self,
        each_attachment: &mut dyn FnMut(AttachmentRecord),
    ) -> Result<Snapshot, StoreError>;
    /// Everything in the store, attachments included.
    fn load(&self) -> Result<Snapshot, StoreError> {
        let mut attachments = Vec::new();
        let snap = self.load_with(&mut |a| attachments.push(a))?;
        Ok(Snapshot {
            attachments,
            ..snap
        })
    }
    /// Applies all changes or none.
    fn apply(&self, changes: &[Change]) -> Result<(), StoreError>;
    /// Blocks until everything applied so far is durable.
    fn flush(&self) -> Result<(), StoreError>;
}

// === impl MemStore ===

/// The in-memory twin of [`SledStore`], for tests of the engine.
#[derive(Debug, Default)]
pub struct MemStore {
    inner: Mutex<MemInner>,
}

#[derive(Debug, Default)]
struct MemInner {
    networks: BTreeMap<String, NetworkDef>,
    attachments: BTreeMap<AttachmentKey, AttachmentRecord>,
    idle: BTreeMap<(String, IpAddr), Millis>,
    cursors: BTreeMap<(String, usize), IpAddr>,
    reservations: BTreeMap<ReservationKey, Reservation>,
    boot_id: Option<String>,
    drained: std::collections::BTreeSet<String>,
    /// Flushes so far.
    flushes: u64,
    /// When set, `apply` fails: lets tests check that a failed write changes nothing.
    fail_writes: bool,
}

impl MemStore {
    pub fn new() -> MemStore {
        MemStore::default()
    }

    pub fn fail_writes(&self, fail: bool) {
        self.lock().fail_writes = fail;
    }

    pub fn flushes(&self) -> u64 {
        self.lock().flushes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemInner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for MemStore {
    fn load_with(
        &self,
        each_attachment: &mut dyn FnMut(AttachmentRecord),
    ) -> Result<Snapshot, StoreError> {
        let m = self.lock();
        m.attachments.values().cloned().for_each(each_attachment);
        Ok(Snapshot {
            networks: m.networks.values().cloned().collect(),
            attachments: Vec::new(),
            idle: m
                .idle
                .iter()
                .map(|((n, ip), at)| (n.clone(), *ip, *at))
                .collect(),
            cursors: m
                .cursors
                .iter()
                .map(|((n, s), ip)| (n.clone(), *s, *ip))
                .collect(),
            reservations: m.reservations.values().cloned().collect(),
            boot_id: m.boot_id.clone(),
            drained: m.drained.iter().cloned().collect(),
        })
    }

    fn apply(&self, changes: &[Change]) -> Result<(), StoreError> {
        let mut m = self.lock();
        if m.fail_writes {
            return Err(StoreError::Io {
                path: Path::new("memory").into(),
                msg: "writes disabled by the test".into(),
            });
        }
        for c in changes {
            match c.clone() {
                Change::PutNetwork(d) => {
                    m.networks.insert(d.name.clone(), d);
                }
                Change::DeleteNetwork(n) => {
                    m.networks.remove(&n);
                }
                Change::PutAttachment(a) => {
                    m.attachments.insert(a.key.clone(), a);
                }
                Change::DeleteAttachment(k) => {
                    m.attachments.remove(&k);
                }
                Change::PutIdle {
                    network,
                    ip,
                    released_at,
                } => {
                    m.idle.insert((network, ip), released_at);
                }
                Change::DeleteIdle { network, ip } => {
                    m.idle.remove(&(network, ip));
                }
                Change::PutCursor {
                    network,
                    set,
                    cursor,
                } => match cursor {
                    Some(ip) => {
                        m.cursors.insert((network, set), ip);
                    }
                    None => {
                        m.cursors.remove(&(network, set));
                    }
                },
                Change::PutReservation(r) => {
                    m.reservations.insert(r.key.clone(), r);
                }
                Change::DeleteReservation(k) => {
                    m.reservations.remove(&k);
                }
                Change::PutBootId(id) => m.boot_id = Some(id),
                Change::PutDrain { network, drained } => {
                    if drained {
                        m.drained.insert(network);
                    } else {
                        m.drained.remove(&network);
                    }
                }
            }
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.lock().flushes += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
