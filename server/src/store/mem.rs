//! The in-memory twin of [`SledStore`](super::SledStore), for tests of the engine: the same
//! contract (change sets durable only once flushed, a failed flush fails the store until it is
//! reopened), with failures on demand.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use super::{
    AttachmentKey, AttachmentRecord, Change, ClockAnchor, Millis, NetworkDef, Reservation,
    ReservationKey, Seq, Snapshot, Store, StoreError,
};

#[derive(Debug, Default)]
pub struct MemStore {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    durable: Tables,
    /// Appended, not yet flushed.
    pending: Vec<(Seq, Vec<Change>)>,
    last_seq: Seq,
    durable_seq: Seq,
    /// Set when a flush failed, until `reopen`.
    failed: Option<String>,
    flushes: u64,
    /// When set, `append` refuses (nothing is taken).
    fail_appends: bool,
    /// Durable change sets, kept once a test asks for them.
    history: Option<Vec<Vec<Change>>>,
    /// When set, `flush` fails (and fails the store) and `reopen` fails.
    fail_flushes: bool,
}

#[derive(Clone, Debug, Default)]
struct Tables {
    networks: BTreeMap<String, NetworkDef>,
    attachments: BTreeMap<AttachmentKey, AttachmentRecord>,
    idle: BTreeMap<(String, IpAddr), Millis>,
    cursors: BTreeMap<(String, String), IpAddr>,
    blocks: BTreeSet<(String, String, String)>,
    reservations: BTreeMap<ReservationKey, Reservation>,
    boot_id: Option<String>,
    clock: Option<ClockAnchor>,
    drained: BTreeSet<String>,
    taken_over: BTreeSet<String>,
}

impl Tables {
    fn apply(&mut self, changes: &[Change]) {
        for c in changes {
            match c.clone() {
                Change::PutNetwork(d) => {
                    self.networks.insert(d.name.clone(), d);
                }
                Change::DeleteNetwork(n) => {
                    self.networks.remove(&n);
                }
                Change::PutAttachment(a) => {
                    self.attachments.insert(a.key.clone(), a);
                }
                Change::DeleteAttachment(k) => {
                    self.attachments.remove(&k);
                }
                Change::PutIdle {
                    network,
                    ip,
                    released_at,
                } => {
                    self.idle.insert((network, ip), released_at);
                }
                Change::DeleteIdle { network, ip } => {
                    self.idle.remove(&(network, ip));
                }
                Change::PutCursor {
                    network,
                    set,
                    cursor,
                } => match cursor {
                    Some(ip) => {
                        self.cursors.insert((network, set), ip);
                    }
                    None => {
                        self.cursors.remove(&(network, set));
                    }
                },
                Change::PutBlock {
                    network,
                    set,
                    block,
                    held,
                } => {
                    if held {
                        self.blocks.insert((network, set, block));
                    } else {
                        self.blocks.remove(&(network, set, block));
                    }
                }
                Change::PutReservation(r) => {
                    self.reservations.insert(r.key.clone(), r);
                }
                Change::DeleteReservation(k) => {
                    self.reservations.remove(&k);
                }
                Change::PutBootId(id) => self.boot_id = Some(id),
                Change::PutClock(a) => self.clock = Some(a),
                Change::PutDrain { network, drained } => {
                    if drained {
                        self.drained.insert(network);
                    } else {
                        self.drained.remove(&network);
                    }
                }
                Change::PutTakenOver(network) => {
                    self.taken_over.insert(network);
                }
            }
        }
    }
}

fn failed(msg: impl Into<String>) -> StoreError {
    StoreError::Failed {
        path: PathBuf::from("memory"),
        msg: msg.into(),
    }
}

impl MemStore {
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// While set, `append` refuses: a write that fails before anything is taken.
    pub fn fail_writes(&self, fail: bool) {
        self.lock().fail_appends = fail;
    }

    /// While set, `flush` fails (failing the store) and `reopen` fails.
    pub fn fail_flushes(&self, fail: bool) {
        self.lock().fail_flushes = fail;
    }

    /// Flushes so far.
    /// Fails the store as its background work would: nothing pending becomes durable, every
    /// call fails until a reopen.
    pub fn fail_now(&self, why: &str) {
        let mut m = self.lock();
        m.failed = Some(why.to_string());
        m.pending.clear();
    }

    /// From now on, keeps every change set that becomes durable, for [`MemStore::history`].
    pub fn keep_history(&self) {
        self.lock().history.get_or_insert_with(Vec::new);
    }

    /// The change sets made durable since [`MemStore::keep_history`], in order.
    pub fn history(&self) -> Vec<Vec<Change>> {
        self.lock().history.clone().unwrap_or_default()
    }

    pub fn flushes(&self) -> u64 {
        self.lock().flushes
    }

    /// What a start after a crash finds: a store holding what was durable, and nothing
    /// pending (as the state dir after kill -9).
    pub fn crashed(&self) -> MemStore {
        let m = self.lock();
        MemStore {
            inner: Mutex::new(Inner {
                durable: m.durable.clone(),
                last_seq: m.durable_seq,
                durable_seq: m.durable_seq,
                ..Inner::default()
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for MemStore {
    fn load_with(
        &self,
        each_attachment: &mut dyn FnMut(AttachmentRecord),
    ) -> Result<Snapshot, StoreError> {
        let m = self.lock();
        if let Some(why) = &m.failed {
            return Err(failed(why.clone()));
        }
        let t = &m.durable;
        t.attachments.values().cloned().for_each(each_attachment);
        Ok(Snapshot {
            networks: t.networks.values().cloned().collect(),
            attachments: Vec::new(),
            idle: t
                .idle
                .iter()
                .map(|((n, ip), at)| (n.clone(), *ip, *at))
                .collect(),
            cursors: t
                .cursors
                .iter()
                .map(|((n, s), ip)| (n.clone(), s.clone(), *ip))
                .collect(),
            blocks: t.blocks.iter().cloned().collect(),
            reservations: t.reservations.values().cloned().collect(),
            boot_id: t.boot_id.clone(),
            clock: t.clock.clone(),
            drained: t.drained.iter().cloned().collect(),
            taken_over: t.taken_over.iter().cloned().collect(),
        })
    }

    fn append(&self, changes: &[Change]) -> Result<Seq, StoreError> {
        let mut m = self.lock();
        if let Some(why) = &m.failed {
            return Err(failed(why.clone()));
        }
        if m.fail_appends {
            return Err(StoreError::Io {
                path: PathBuf::from("memory"),
                msg: "writes disabled by the test".into(),
            });
        }
        m.last_seq += 1;
        let seq = m.last_seq;
        m.pending.push((seq, changes.to_vec()));
        Ok(seq)
    }

    fn flush(&self) -> Result<Seq, StoreError> {
        let mut m = self.lock();
        if let Some(why) = &m.failed {
            return Err(failed(why.clone()));
        }
        m.flushes += 1;
        if m.fail_flushes {
            let why = "flush failed (injected by the test)".to_string();
            m.failed = Some(why.clone());
            m.pending.clear();
            return Err(failed(why));
        }
        let pending = std::mem::take(&mut m.pending);
        for (seq, changes) in pending {
            m.durable.apply(&changes);
            m.durable_seq = seq;
            if let Some(h) = &mut m.history {
                h.push(changes);
            }
        }
        Ok(m.durable_seq)
    }

    fn failure(&self) -> Option<String> {
        self.lock()
            .failed
            .as_ref()
            .map(|why| failed(why.clone()).to_string())
    }

    fn reopen(&self) -> Result<(), StoreError> {
        let mut m = self.lock();
        if m.fail_flushes {
            return Err(failed("still failing (injected by the test)"));
        }
        m.failed = None;
        m.pending.clear();
        Ok(())
    }
}
