//! The sled implementation of [`Store`].
//!
//! ## Durability through a log of our own
//!
//! A reply waits for its change set to be durable. sled makes writes durable with
//! `Db::flush`: it seals its log buffer and writes it on one of its I/O threads with a `pwrite`
//! and a `sync_file_range`, which survives a crash of the process but not a power loss, so an
//! `fdatasync` had to follow. That was about 180 us per flush, and a lone request paid all of
//! it. (sled's transactions were dropped earlier for the same reason: each seals and writes the
//! log buffer twice.)
//!
//! So each change set is written twice: as one record in a write-ahead log of our own ([`wal`],
//! two preallocated files written in turn), and as plain single-key inserts and removes in the
//! sled trees, in the same order, one writer at a time. A flush writes the new log records with
//! one `pwrite` and one `fdatasync` (about 90 us); sled's trees are flushed only at a
//! *checkpoint*:
//!
//! - When the active log file is full, the writer lock records `wal_checkpoint` = the newest
//!   sequence number in the `meta` tree (after every change it covers, in sled's log order),
//!   switches to the other file, and sled is flushed (and its file synced). The other file is
//!   not written before that flush has succeeded: until then its records may be needed.
//! - On a clean close (drop) the same, without the switch.
//!
//! sled recovers a prefix of its log after a crash. [`SledStore::open`] reads `wal_checkpoint`
//! and `wal_epoch` from what sled recovered, replays every log record of that epoch numbered
//! after the checkpoint (puts and removes are idempotent, and replaying them in order on top of
//! any prefix of the same writes gives the state after the last one), then writes a new
//! checkpoint, bumps the epoch and flushes sled. Records of an older epoch are never replayed:
//! after a restart the files are written from the start again, and a stale record further on
//! could otherwise carry the next number by chance.
//!
//! Before schema 4 the atomicity came from a `journal` tree (entry, single-key writes, entry
//! removed); a store from then may hold an entry a crash left, and opening finishes it.

use std::net::IpAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use super::wal;
use super::{AttachmentRecord, Change, Reservation, Snapshot, Store, StoreError, SCHEMA_VERSION};
use crate::config::NetworkDef;

/// Each log file's size when created; a file is full (and the log switches files) once the
/// records written to it reach this. A bigger change set is written whole: the file grows.
pub const WAL_CAPACITY: u64 = 1 << 20;

pub struct SledStore {
    path: PathBuf,
    db: sled::Db,
    networks: sled::Tree,
    attachments: sled::Tree,
    idle: sled::Tree,
    cursors: sled::Tree,
    reservations: sled::Tree,
    meta: sled::Tree,
    /// Change sets a schema-3 store left after a crash (module docs); replayed, then empty.
    journal: sled::Tree,
    /// One writer at a time: the log records and sled's writes are in the same order.
    writer: Mutex<Writer>,
    /// One flush at a time.
    flushing: Mutex<()>,
    /// The two log files and their paths.
    wal: [(std::fs::File, PathBuf); 2],
    /// The epoch this handle writes its log records in (module docs).
    epoch: u64,
    wal_capacity: u64,
    /// sled's data file, synced (fdatasync) after every sled flush: sled's own flush ends in
    /// `sync_file_range`, which survives a crash of the process but not a power loss.
    data_file: std::fs::File,
    checkpoints: Shared<Checkpoints>,
    /// Flushes sled for each checkpoint, off the request path.
    checkpointer: Option<std::thread::JoinHandle<()>>,
}

/// The log's write position and what is waiting to be written.
struct Writer {
    /// Records applied and not written to the log yet.
    pending: Vec<u8>,
    /// The sequence number of the next change set.
    next_seq: u64,
    /// The log file written now (0 or 1) and where its next record goes.
    active: usize,
    offset: u64,
}

/// Checkpoints, counted: recorded at each switch of log files, made durable by a sled flush on
/// the checkpoint thread (or inline, at the next switch, if that thread has not got there).
#[derive(Default)]
struct Checkpoints {
    recorded: u64,
    /// The newest checkpoint the thread has tried to make durable.
    attempted: u64,
    durable: u64,
    closing: bool,
    /// The thread is flushing sled.
    busy: bool,
    /// Tests hold the thread back, to see what a crash before its flush leaves.
    paused: bool,
}

type Shared<T> = std::sync::Arc<(Mutex<T>, std::sync::Condvar)>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A change turned into bytes: a put or a removal in one tree.
#[derive(Debug, PartialEq)]
enum Op {
    Put(usize, Vec<u8>, Vec<u8>),
    Del(usize, Vec<u8>),
}

const NETWORKS: usize = 0;
const ATTACHMENTS: usize = 1;
const IDLE: usize = 2;
const CURSORS: usize = 3;
const RESERVATIONS: usize = 4;
const META: usize = 5;

const BOOT_ID: &str = "boot_id";
/// In `meta`: every change set up to this sequence number is in sled's trees (u64 big-endian).
const WAL_CHECKPOINT: &str = "wal_checkpoint";
/// In `meta`: the epoch of the log records that may need replaying (u64 big-endian).
const WAL_EPOCH: &str = "wal_epoch";
const DRAIN_PREFIX: &str = "drain\0";

/// How long opening waits for sled's file lock before it says another process holds it.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn is_lock_error(io: &std::io::Error) -> bool {
    io.kind() == std::io::ErrorKind::WouldBlock || io.to_string().contains("could not acquire lock")
}

/// Flushes sled and syncs its data file (sled's flush ends in `sync_file_range`, which does not
/// survive a power loss): everything in its trees is durable.
fn sync_sled(db: &sled::Db, data_file: &std::fs::File) -> Result<(), String> {
    db.flush().map_err(|e| e.to_string())?;
    release_garbage();
    data_file.sync_data().map_err(|e| format!("fdatasync: {e}"))
}

/// Hands this thread's deferred frees to crossbeam-epoch's global queue and lets it run the
/// expired ones. sled retires old page versions, paged-out nodes and sealed 512 KiB I/O
/// buffers through epoch-deferred drops, which wait in a per-thread bag until 64 of them have
/// gathered; with one thread writing, that held ~20 I/O buffers and their pages (~14 MiB at
/// 65 536 attachments). Called after each change set is applied and after each sled flush:
/// one pin and a queue push, about 0.1 us.
fn release_garbage() {
    crossbeam_epoch::pin().flush();
}

/// Opens sled, waiting up to [`LOCK_WAIT`] for its file lock. The lock is released when the last
/// holder of the file lets go, and sled's I/O threads may still hold it for a moment after a
/// handle is dropped (a reopen in the same process, as at start-up, can race them). Another
/// ipoold holds it for good: after LOCK_WAIT the error says so.
pub(super) fn open_waiting(config: &sled::Config) -> sled::Result<sled::Db> {
    let started = std::time::Instant::now();
    loop {
        match config.open() {
            Err(sled::Error::Io(io)) if is_lock_error(&io) && started.elapsed() < LOCK_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            other => return other,
        }
    }
}

fn ip_key(network: &str, ip: &IpAddr) -> Vec<u8> {
    format!("{network}\0{ip}").into_bytes()
}

impl SledStore {
    /// Opens (or creates) the database in `dir`. Refuses a store of a newer schema, or one it
    /// cannot read, naming the path.
    pub fn open(dir: &Path) -> Result<SledStore, StoreError> {
        SledStore::open_with_log_capacity(dir, WAL_CAPACITY)
    }

    /// [`SledStore::open`] with log files of `wal_capacity` bytes (tests use small ones, to
    /// switch files often).
    pub fn open_with_log_capacity(dir: &Path, wal_capacity: u64) -> Result<SledStore, StoreError> {
        let path = dir.join("db");
        let open_err = |e: sled::Error| StoreError::Open {
            path: path.clone(),
            msg: match e {
                sled::Error::Io(io) if is_lock_error(&io) => {
                    format!("it is locked by another process (is another ipoold running on this state dir?): {io}")
                }
                other => other.to_string(),
            },
        };
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Open {
            path: dir.to_path_buf(),
            msg: e.to_string(),
        })?;
        // No background flusher: what a reply acknowledged is in our log, and sled is flushed at
        // checkpoints (module docs).
        let config = sled::Config::new()
            .path(&path)
            .flush_every_ms(None)
            // sled's page cache defaults to 1 GiB and grows towards it with the data: about
            // 20 MiB at 65 536 attachments. Everything is read once at start and then kept in
            // the engine; writes need only the pages they touch, which the OS caches anyway.
            .cache_capacity(1 << 20);
        let db = match open_waiting(&config) {
            Ok(db) => db,
            Err(e @ sled::Error::Corruption { .. }) => {
                return Err(StoreError::Corrupt {
                    path: path.clone(),
                    msg: e.to_string(),
                })
            }
            Err(other) => return Err(open_err(other)),
        };
        let tree = |name: &str| db.open_tree(name).map_err(open_err);
        let meta = tree("meta")?;
        // sled 0.34 keeps everything in one file, `db`, inside its directory.
        let data_file = std::fs::File::open(path.join("db")).map_err(|e| StoreError::Open {
            path: path.join("db"),
            msg: e.to_string(),
        })?;
        let wal_file = |i: usize| {
            let p = dir.join(format!("wal-{i}"));
            wal::open_file(&p, wal_capacity)
                .map(|f| (f, p.clone()))
                .map_err(|e| StoreError::Open {
                    path: p,
                    msg: e.to_string(),
                })
        };
        let store = SledStore {
            networks: tree("networks")?,
            attachments: tree("attachments")?,
            idle: tree("idle")?,
            cursors: tree("cursors")?,
            reservations: tree("reservations")?,
            journal: tree("journal")?,
            writer: Mutex::new(Writer {
                pending: Vec::new(),
                next_seq: 1,
                active: 0,
                offset: 0,
            }),
            flushing: Mutex::new(()),
            wal: [wal_file(0)?, wal_file(1)?],
            epoch: 0,
            wal_capacity,
            meta: meta.clone(),
            data_file,
            checkpoints: Default::default(),
            checkpointer: None,
            db,
            path: path.clone(),
        };
        let write_version = || -> Result<(), StoreError> {
            meta.insert("schema_version", &SCHEMA_VERSION.to_be_bytes())
                .map_err(open_err)?;
            store.sync_sled()
        };
        match meta.get("schema_version").map_err(open_err)? {
            Some(v) => {
                let found = <[u8; 4]>::try_from(v.as_ref())
                    .map(u32::from_be_bytes)
                    .map_err(|_| StoreError::Corrupt {
                        path: path.clone(),
                        msg: "schema_version is not a 4-byte number".into(),
                    })?;
                if found > SCHEMA_VERSION {
                    return Err(StoreError::NewerSchema { path, found });
                }
                if found < SCHEMA_VERSION {
                    // 1 -> 2 -> 3 -> 4 only add trees, meta keys and the log files; mark the
                    // store so an older ipoold (which would not see reservations, or would not
                    // replay the journal or the log) refuses it.
                    write_version()?;
                }
            }
            None => {
                let has_data = [
                    &store.networks,
                    &store.attachments,
                    &store.idle,
                    &store.cursors,
                    &store.reservations,
                ]
                .iter()
                .any(|t| !t.is_empty());
                if has_data {
                    return Err(StoreError::Corrupt {
                        path,
                        msg: "it holds data but no schema_version".into(),
                    });
                }
                write_version()?;
            }
        }
        store.replay_journal()?;
        let mut store = store;
        store.replay_log()?;
        store.checkpointer = Some(store.spawn_checkpointer()?);
        Ok(store)
    }

    /// The thread that flushes sled when a checkpoint is recorded, so that no request waits for
    /// it (a sled flush writes everything since the last one: milliseconds).
    fn spawn_checkpointer(&self) -> Result<std::thread::JoinHandle<()>, StoreError> {
        let db = self.db.clone();
        let data_file = self.data_file.try_clone().map_err(|e| self.io(e))?;
        let shared = self.checkpoints.clone();
        let path = self.path.clone();
        std::thread::Builder::new()
            .name("ipool-checkpoint".into())
            .spawn(move || {
                let (m, cv) = &*shared;
                loop {
                    let target = {
                        let mut c = lock(m);
                        while (c.attempted >= c.recorded || c.paused) && !c.closing {
                            c = cv.wait(c).unwrap_or_else(|p| p.into_inner());
                        }
                        if c.closing {
                            return;
                        }
                        c.attempted = c.recorded;
                        c.busy = true;
                        c.recorded
                    };
                    let synced = sync_sled(&db, &data_file);
                    let mut c = lock(m);
                    c.busy = false;
                    cv.notify_all();
                    match synced {
                        Ok(()) => c.durable = c.durable.max(target),
                        Err(e) => tracing::warn!(
                            error = %e,
                            path = %path.display(),
                            "checkpoint: sled flush failed; retried when the log switches files"
                        ),
                    }
                }
            })
            .map_err(|e| self.io(format!("starting the checkpoint thread: {e}")))
    }

    /// Finishes the change sets a crash interrupted in a schema-3 store (module docs), in
    /// order, then empties the journal and flushes.
    fn replay_journal(&self) -> Result<(), StoreError> {
        let mut replayed = 0usize;
        for kv in self.journal.iter() {
            let (k, v) = kv.map_err(|e| self.io(e))?;
            let ops = decode_entry(&v).map_err(|e| self.corrupt("journal entry", &k, e))?;
            self.materialize(&ops)?;
            self.journal.remove(&k).map_err(|e| self.io(e))?;
            replayed += 1;
        }
        if replayed > 0 {
            tracing::warn!(
                change_sets = replayed,
                path = %self.path.display(),
                "finished change sets interrupted by a crash"
            );
            self.sync_sled()?;
        }
        Ok(())
    }

    fn meta_u64(&self, key: &str) -> Result<u64, StoreError> {
        match self.meta.get(key).map_err(|e| self.io(e))? {
            None => Ok(0),
            Some(v) => <[u8; 8]>::try_from(v.as_ref())
                .map(u64::from_be_bytes)
                .map_err(|_| self.corrupt("meta", key.as_bytes(), "not an 8-byte number")),
        }
    }

    /// Replays the log records sled may lack (module docs), then records a checkpoint after
    /// them and a new epoch for this handle's records, and flushes sled.
    fn replay_log(&mut self) -> Result<(), StoreError> {
        let epoch = self.meta_u64(WAL_EPOCH)?;
        let checkpoint = self.meta_u64(WAL_CHECKPOINT)?;
        let mut records: Vec<(u64, Vec<u8>)> = Vec::new();
        for (file, path) in &self.wal {
            wal::read_run(file, epoch, &mut |seq, payload| {
                if seq > checkpoint {
                    records.push((seq, payload));
                }
            })
            .map_err(|e| StoreError::Io {
                path: path.clone(),
                msg: format!("reading the write-ahead log: {e}"),
            })?;
        }
        records.sort_unstable_by_key(|r| r.0);
        // What follows the checkpoint must be every change set after it, none missing: a hole
        // means acknowledged writes are gone, and starting would hand their addresses out again.
        for (i, (seq, _)) in records.iter().enumerate() {
            if *seq != checkpoint + 1 + i as u64 {
                return Err(StoreError::Corrupt {
                    path: self.wal[0].1.with_file_name("wal-*"),
                    msg: format!(
                        "the write-ahead log continues checkpoint {checkpoint} with change set \
                         {seq} where {} was expected",
                        checkpoint + 1 + i as u64
                    ),
                });
            }
        }
        let last = records.last().map_or(checkpoint, |r| r.0);
        for (seq, payload) in &records {
            let ops = decode_entry(payload).map_err(|e| StoreError::Corrupt {
                path: self.wal[0].1.with_file_name("wal-*"),
                msg: format!("log record {seq}: {e}"),
            })?;
            self.materialize(&ops)?;
        }
        if !records.is_empty() {
            tracing::warn!(
                change_sets = records.len(),
                path = %self.path.display(),
                "replayed change sets from the write-ahead log that sled had not made durable"
            );
        }
        self.meta
            .insert(WAL_CHECKPOINT, &last.to_be_bytes())
            .map_err(|e| self.io(e))?;
        self.epoch = epoch + 1;
        self.meta
            .insert(WAL_EPOCH, &self.epoch.to_be_bytes())
            .map_err(|e| self.io(e))?;
        self.sync_sled()?;
        let w = self.writer.get_mut().unwrap_or_else(|p| p.into_inner());
        w.next_seq = last + 1;
        Ok(())
    }

    /// Holds the checkpoint thread back (or lets it go), and waits until it is not flushing.
    #[cfg(test)]
    pub(super) fn pause_checkpoints(&self, paused: bool) {
        let (m, cv) = &*self.checkpoints;
        let mut c = lock(m);
        c.paused = paused;
        cv.notify_all();
        while c.busy || (!paused && c.attempted < c.recorded) {
            c = cv.wait(c).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Where the next log record goes in the active file.
    #[cfg(test)]
    pub(super) fn log_offset(&self) -> u64 {
        self.lock_writer().offset
    }

    fn lock_writer(&self) -> MutexGuard<'_, Writer> {
        lock(&self.writer)
    }

    /// Flushes sled and syncs its data file: everything in its trees is durable.
    fn sync_sled(&self) -> Result<(), StoreError> {
        sync_sled(&self.db, &self.data_file).map_err(|e| self.io(e))
    }

    /// Records a checkpoint at the newest change set in sled's `meta` tree (module docs).
    fn record_checkpoint(&self, w: &Writer) -> Result<(), StoreError> {
        let newest = w.next_seq - 1;
        self.meta
            .insert(WAL_CHECKPOINT, &newest.to_be_bytes())
            .map_err(|e| self.io(e))
            .map(|_| ())
    }

    /// Moves the log to its other file, recording a checkpoint that the checkpoint thread makes
    /// durable. The other file holds the records from before the last switch: it is written
    /// only once the checkpoint recorded then is durable (normally long since; if not, sled is
    /// flushed here).
    fn switch_files(&self) -> Result<(), StoreError> {
        let (m, cv) = &*self.checkpoints;
        let (previous, durable) = {
            let c = lock(m);
            (c.recorded, c.durable)
        };
        if durable < previous {
            self.sync_sled()?;
            let mut c = lock(m);
            c.durable = c.durable.max(previous);
        }
        {
            let mut w = self.lock_writer();
            self.record_checkpoint(&w)?;
            w.active ^= 1;
            w.offset = 0;
        }
        lock(m).recorded += 1;
        cv.notify_one();
        Ok(())
    }

    /// Writes the pending log records to the active file and syncs it.
    fn write_log(&self) -> Result<(), StoreError> {
        let (records, file, at) = {
            let mut w = self.lock_writer();
            if w.pending.is_empty() {
                return Ok(());
            }
            let records = std::mem::take(&mut w.pending);
            let at = w.offset;
            w.offset += records.len() as u64;
            (records, w.active, at)
        };
        let (f, path) = &self.wal[file];
        if let Err(e) = f.write_all_at(&records, at).and_then(|()| f.sync_data()) {
            // Put the records back, in front of any applied meanwhile, to be written again at
            // the same place: a hole in the log would end its run there.
            let mut w = self.lock_writer();
            let mut back = records;
            back.append(&mut w.pending);
            w.pending = back;
            w.offset = at;
            return Err(StoreError::Io {
                path: path.clone(),
                msg: format!("writing the write-ahead log: {e}"),
            });
        }
        Ok(())
    }

    fn tree(&self, idx: usize) -> &sled::Tree {
        match idx {
            NETWORKS => &self.networks,
            ATTACHMENTS => &self.attachments,
            IDLE => &self.idle,
            CURSORS => &self.cursors,
            RESERVATIONS => &self.reservations,
            _ => &self.meta,
        }
    }

    /// Applies `ops` to their trees, one single-key operation each.
    fn materialize(&self, ops: &[Op]) -> Result<(), StoreError> {
        for op in ops {
            match op {
                Op::Put(idx, k, v) => {
                    self.tree(*idx)
                        .insert(k.as_slice(), v.as_slice())
                        .map_err(|e| self.io(e))?;
                }
                Op::Del(idx, k) => {
                    self.tree(*idx)
                        .remove(k.as_slice())
                        .map_err(|e| self.io(e))?;
                }
            }
        }
        release_garbage();
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn corrupt(&self, what: &str, key: &[u8], e: impl std::fmt::Display) -> StoreError {
        StoreError::Corrupt {
            path: self.path.clone(),
            msg: format!("{what} {:?}: {e}", String::from_utf8_lossy(key)),
        }
    }

    fn io(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Io {
            path: self.path.clone(),
            msg: e.to_string(),
        }
    }

    fn encode(&self, changes: &[Change]) -> Result<Vec<Op>, StoreError> {
        let json = |v: &dyn erased::Json| v.to_vec().map_err(|e| self.io(e));
        changes
            .iter()
            .map(|c| {
                Ok(match c {
                    Change::PutNetwork(d) => {
                        Op::Put(NETWORKS, d.name.as_bytes().to_vec(), json(d)?)
                    }
                    Change::DeleteNetwork(n) => Op::Del(NETWORKS, n.as_bytes().to_vec()),
                    Change::PutAttachment(a) => Op::Put(ATTACHMENTS, a.key.encode(), json(a)?),
                    Change::DeleteAttachment(k) => Op::Del(ATTACHMENTS, k.encode()),
                    Change::PutIdle {
                        network,
                        ip,
                        released_at,
                    } => Op::Put(
                        IDLE,
                        ip_key(network, ip),
                        released_at.to_be_bytes().to_vec(),
                    ),
                    Change::DeleteIdle { network, ip } => Op::Del(IDLE, ip_key(network, ip)),
                    Change::PutCursor {
                        network,
                        set,
                        cursor,
                    } => {
                        let k = format!("{network}\0{set}").into_bytes();
                        match cursor {
                            Some(ip) => Op::Put(CURSORS, k, ip.to_string().into_bytes()),
                            None => Op::Del(CURSORS, k),
                        }
                    }
                    Change::PutReservation(r) => Op::Put(RESERVATIONS, r.key.encode(), json(r)?),
                    Change::DeleteReservation(k) => Op::Del(RESERVATIONS, k.encode()),
                    Change::PutBootId(id) => {
                        Op::Put(META, BOOT_ID.as_bytes().to_vec(), id.as_bytes().to_vec())
                    }
                    Change::PutDrain { network, drained } => {
                        let k = format!("{DRAIN_PREFIX}{network}").into_bytes();
                        if *drained {
                            Op::Put(META, k, b"1".to_vec())
                        } else {
                            Op::Del(META, k)
                        }
                    }
                })
            })
            .collect()
    }
}

/// serde_json behind a trait object, so `encode` can take any record.
mod erased {
    pub trait Json {
        fn to_vec(&self) -> serde_json::Result<Vec<u8>>;
    }
    impl<T: serde::Serialize> Json for T {
        fn to_vec(&self) -> serde_json::Result<Vec<u8>> {
            serde_json::to_vec(self)
        }
    }
}

fn split2(key: &[u8]) -> Option<(String, String)> {
    let s = std::str::from_utf8(key).ok()?;
    let (a, b) = s.split_once('\0')?;
    Some((a.to_string(), b.to_string()))
}

impl Store for SledStore {
    fn load_with(
        &self,
        each_attachment: &mut dyn FnMut(AttachmentRecord),
    ) -> Result<Snapshot, StoreError> {
        let mut snap = Snapshot::default();
        for kv in self.networks.iter() {
            let (k, v) = kv.map_err(|e| self.io(e))?;
            let d: NetworkDef =
                serde_json::from_slice(&v).map_err(|e| self.corrupt("network", &k, e))?;
            snap.networks.push(d);
        }
        for kv in self.attachments.iter() {
            let (k, v) = kv.map_err(|e| self.io(e))?;
            let a: AttachmentRecord =
                serde_json::from_slice(&v).map_err(|e| self.corrupt("attachment", &k, e))?;
            each_attachment(a);
        }
        for kv in self.idle.iter() {
            let (k, v) = kv.map_err(|e| self.io(e))?;
            let (net, ip) = split2(&k).ok_or_else(|| self.corrupt("idle key", &k, "bad key"))?;
            let ip: IpAddr = ip.parse().map_err(|e| self.corrupt("idle key", &k, e))?;
            let at = <[u8; 8]>::try_from(v.as_ref())
                .map(u64::from_be_bytes)
                .map_err(|e| self.corrupt("idle value", &k, e))?;
            snap.idle.push((net, ip, at));
        }
        for kv in self.cursors.iter() {
            let (k, v) = kv.map_err(|e| self.io(e))?;
            let (net, set) = split2(&k).ok_or_else(|| self.corrupt("cursor key", &k, "bad key"))?;
            let set: usize = set.parse().map_err(|e| self.corrupt("cursor key", &k, e))?;
            let ip: IpAddr = std::str::from_utf8(&v)
                .map_err(|e| self.corrupt("cursor", &k, e))?
                .parse()
                .map_err(|e| self.corrupt("cursor", &k, e))?;
            snap.cursors.push((net, set, ip));
        }
        for kv in self.reservations.iter() {
            let (k, v) = kv.map_err(|e| self.io(e))?;
            let r: Reservation =
                serde_json::from_slice(&v).map_err(|e| self.corrupt("reservation", &k, e))?;
            snap.reservations.push(r);
        }
        if let Some(v) = self.meta.get(BOOT_ID).map_err(|e| self.io(e))? {
            let id =
                std::str::from_utf8(&v).map_err(|e| self.corrupt("meta", BOOT_ID.as_bytes(), e))?;
            snap.boot_id = Some(id.to_string());
        }
        for kv in self.meta.scan_prefix(DRAIN_PREFIX) {
            let (k, _) = kv.map_err(|e| self.io(e))?;
            let net = std::str::from_utf8(&k[DRAIN_PREFIX.len()..])
                .map_err(|e| self.corrupt("meta", &k, e))?;
            snap.drained.push(net.to_string());
        }
        Ok(snap)
    }

    fn apply(&self, changes: &[Change]) -> Result<(), StoreError> {
        let ops = self.encode(changes)?;
        if ops.is_empty() {
            return Ok(());
        }
        let entry = encode_entry(&ops);
        let mut w = self.lock_writer();
        let seq = w.next_seq;
        w.next_seq += 1;
        wal::encode_record(&mut w.pending, self.epoch, seq, &entry);
        // If this fails, sled itself is failing (its log cannot be written); the record is in
        // the log's queue, and the next start finishes the change set.
        self.materialize(&ops)
    }

    fn flush(&self) -> Result<(), StoreError> {
        let _one = lock(&self.flushing);
        self.write_log()?;
        if self.lock_writer().offset >= self.wal_capacity {
            // What this flush wrote is durable in the log already. If the switch fails, the log
            // stays in this file (it grows) and the next flush tries again.
            if let Err(e) = self.switch_files() {
                tracing::warn!(error = %e, "switching write-ahead log files failed; retried at the next flush");
            }
        }
        Ok(())
    }
}

impl Drop for SledStore {
    /// Stops the checkpoint thread. A clean close leaves nothing to replay: a checkpoint at the
    /// newest change set, made durable here.
    fn drop(&mut self) {
        {
            let (m, cv) = &*self.checkpoints;
            lock(m).closing = true;
            cv.notify_all();
        }
        if let Some(t) = self.checkpointer.take() {
            let _ = t.join();
        }
        let _one = lock(&self.flushing);
        let closed = self
            .record_checkpoint(&self.lock_writer())
            .and_then(|()| self.sync_sled());
        if let Err(e) = closed {
            tracing::warn!(error = %e, path = %self.path.display(), "closing the store: checkpoint failed; the next start replays the log");
        }
    }
}

/// A journal entry: for each op, a tag (0 put, 1 remove), the tree index, the key's length
/// (u32, big-endian) and the key, and for a put the value's length and the value.
fn encode_entry(ops: &[Op]) -> Vec<u8> {
    fn part(out: &mut Vec<u8>, p: &[u8]) {
        let len = u32::try_from(p.len()).expect("a store key or value under 4 GiB");
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(p);
    }
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Put(idx, k, v) => {
                out.extend_from_slice(&[0, tree_byte(*idx)]);
                part(&mut out, k);
                part(&mut out, v);
            }
            Op::Del(idx, k) => {
                out.extend_from_slice(&[1, tree_byte(*idx)]);
                part(&mut out, k);
            }
        }
    }
    out
}

fn tree_byte(idx: usize) -> u8 {
    u8::try_from(idx).expect("tree indexes are below 6")
}

fn decode_entry(mut b: &[u8]) -> Result<Vec<Op>, String> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
        if b.len() < n {
            return Err(format!("truncated: wanted {n} bytes, {} left", b.len()));
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Ok(head)
    }
    fn bytes(b: &mut &[u8]) -> Result<Vec<u8>, String> {
        let len = take(b, 4)?;
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        Ok(take(b, len)?.to_vec())
    }
    let mut ops = Vec::new();
    while !b.is_empty() {
        let h = take(&mut b, 2)?;
        let idx = usize::from(h[1]);
        if idx > META {
            return Err(format!("unknown tree index {idx}"));
        }
        match h[0] {
            0 => {
                let k = bytes(&mut b)?;
                ops.push(Op::Put(idx, k, bytes(&mut b)?));
            }
            1 => ops.push(Op::Del(idx, bytes(&mut b)?)),
            t => return Err(format!("unknown op tag {t}")),
        }
    }
    Ok(ops)
}

#[cfg(test)]
mod journal_tests {
    use super::*;
    use crate::store::{AttachmentKey, AttachmentRecord, Pod};
    use proptest::prelude::*;

    fn raw(dir: &Path) -> sled::Db {
        open_waiting(
            &sled::Config::new()
                .path(dir.join("db"))
                .flush_every_ms(None),
        )
        .expect("raw open")
    }

    fn record(container: &str, ip: &str) -> AttachmentRecord {
        AttachmentRecord {
            key: AttachmentKey {
                network: "n".into(),
                container_id: container.into(),
                ifname: "eth0".into(),
            },
            pod: Pod {
                namespace: "default".into(),
                name: container.into(),
                uid: String::new(),
            },
            netns: "/var/run/netns/x".into(),
            addresses: vec![ip.parse().expect("ip")],
            created_at_ms: 1,
        }
    }

    proptest! {
        #[test]
        fn entries_roundtrip(ops in prop::collection::vec(
            (any::<bool>(), 0usize..=META, prop::collection::vec(any::<u8>(), 0..40),
             prop::collection::vec(any::<u8>(), 0..80)),
            0..12,
        )) {
            let ops: Vec<Op> = ops
                .into_iter()
                .map(|(put, idx, k, v)| if put { Op::Put(idx, k, v) } else { Op::Del(idx, k) })
                .collect();
            prop_assert_eq!(decode_entry(&encode_entry(&ops)).expect("decodes"), ops);
        }

        #[test]
        fn decoding_garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_entry(&bytes);
        }
    }

    #[test]
    fn a_write_leaves_the_journal_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = SledStore::open(dir.path()).expect("open");
        s.apply(&[Change::PutAttachment(record("c1", "10.0.0.2"))])
            .expect("apply");
        assert!(s.journal.is_empty());
        assert_eq!(s.load().expect("load").attachments.len(), 1);
    }

    /// A crash after the journal entry and part of its changes: the next open finishes the
    /// change set, in order, and empties the journal.
    #[test]
    fn open_finishes_a_change_set_a_crash_interrupted() {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let s = SledStore::open(dir.path()).expect("open");
            s.apply(&[
                Change::PutAttachment(record("old", "10.0.0.9")),
                Change::PutIdle {
                    network: "n".into(),
                    ip: "10.0.0.2".parse().expect("ip"),
                    released_at: 5,
                },
            ])
            .expect("apply");
            s.flush().expect("flush");
        }
        let change_set = [
            Change::PutAttachment(record("c1", "10.0.0.2")),
            Change::DeleteIdle {
                network: "n".into(),
                ip: "10.0.0.2".parse().expect("ip"),
            },
            Change::DeleteAttachment(record("old", "10.0.0.9").key),
        ];
        {
            // What a crash right after the first of the three changes leaves on disk.
            let s = SledStore::open(dir.path()).expect("open");
            let ops = s.encode(&change_set).expect("encode");
            drop(s);
            let db = raw(dir.path());
            db.open_tree("journal")
                .expect("tree")
                .insert(41u64.to_be_bytes(), encode_entry(&ops))
                .expect("insert");
            let Op::Put(idx, k, v) = &ops[0] else {
                panic!("first op is a put")
            };
            assert_eq!(*idx, ATTACHMENTS);
            db.open_tree("attachments")
                .expect("tree")
                .insert(k.as_slice(), v.as_slice())
                .expect("insert");
            db.flush().expect("flush");
        }
        let s = SledStore::open(dir.path()).expect("reopen");
        let snap = s.load().expect("load");
        let containers: Vec<&str> = snap
            .attachments
            .iter()
            .map(|a| a.key.container_id.as_str())
            .collect();
        assert_eq!(containers, ["c1"]);
        assert!(snap.idle.is_empty(), "{:?}", snap.idle);
        assert!(s.journal.is_empty());
    }

    #[test]
    fn a_corrupt_journal_entry_is_refused_naming_the_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        drop(SledStore::open(dir.path()).expect("open"));
        {
            let db = raw(dir.path());
            db.open_tree("journal")
                .expect("tree")
                .insert(0u64.to_be_bytes(), vec![7u8, 0, 0])
                .expect("insert");
            db.flush().expect("flush");
        }
        let e = SledStore::open(dir.path())
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains("journal") && e.contains(&dir.path().display().to_string()),
            "{e}"
        );
    }
}
