//! The sled implementation of [`Store`].
//!
//! ## Atomic writes without sled transactions
//!
//! A sled transaction (or `Tree::apply_batch`) seals and writes the current log buffer twice
//! (`pin_log`: before and after its batch manifest), each write a `pwrite` plus a
//! `sync_file_range` on sled's I/O threads: under load that was most of ipoold's CPU, and a lone
//! request paid for it in its flush. So a request's changes are written as single-key
//! operations, made atomic by a journal of our own:
//!
//! 1. the whole change set goes into the `journal` tree as one value under a sequence number
//!    (one insert: atomic on its own);
//! 2. each change is applied to its tree (plain inserts and removes);
//! 3. the journal entry is removed.
//!
//! sled recovers a prefix of its log after a crash, and these three steps are issued in order
//! by one writer at a time. So a recovered store either lacks the entry and everything after
//! it, or has the entry with some of its changes applied; [`SledStore::open`] replays what the
//! journal holds (puts and removes are idempotent) before anything reads the trees.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use super::{AttachmentRecord, Change, Reservation, Snapshot, Store, StoreError, SCHEMA_VERSION};
use crate::config::NetworkDef;

pub struct SledStore {
    path: PathBuf,
    db: sled::Db,
    networks: sled::Tree,
    attachments: sled::Tree,
    idle: sled::Tree,
    cursors: sled::Tree,
    reservations: sled::Tree,
    meta: sled::Tree,
    /// Change sets in flight (see the module docs); empty except after a crash.
    journal: sled::Tree,
    /// The next journal sequence number.
    next_seq: AtomicU64,
    /// One writer at a time, so that each change set's three steps are contiguous in the log.
    writer: Mutex<()>,
    /// sled's data file, synced (fdatasync) after every flush: sled's own flush ends in
    /// `sync_file_range`, which survives a crash of the process but not a power loss.
    data_file: std::fs::File,
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
const DRAIN_PREFIX: &str = "drain\0";

/// How long opening waits for sled's file lock before it says another process holds it.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn is_lock_error(io: &std::io::Error) -> bool {
    io.kind() == std::io::ErrorKind::WouldBlock || io.to_string().contains("could not acquire lock")
}

fn ip_key(network: &str, ip: &IpAddr) -> Vec<u8> {
    format!("{network}\0{ip}").into_bytes()
}

impl SledStore {
    /// Opens (or creates) the database in `dir`. Refuses a store of a newer schema, or one it
    /// cannot read, naming the path.
    pub fn open(dir: &Path) -> Result<SledStore, StoreError> {
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
        // No background flusher: every durable write goes through our group commit (flush +
        // fdatasync), so what a reply acknowledged never depends on a timer.
        let config = sled::Config::new()
            .path(&path)
            .flush_every_ms(None)
            // sled's page cache defaults to 1 GiB and grows towards it with the data: about
            // 20 MiB at 65 536 attachments. Everything is read once at start and then kept in
            // the engine; writes need only the pages they touch, which the OS caches anyway.
            .cache_capacity(1 << 20);
        // The lock on sled's file is released when the last holder of the file lets go, and
        // sled's I/O threads may still hold it for a moment after a handle is dropped (a
        // reopen in the same process, as at start-up, can race them). Another ipoold holds it
        // for good: after LOCK_WAIT the error says so.
        let started = std::time::Instant::now();
        let db = loop {
            match config.open() {
                Ok(db) => break db,
                Err(sled::Error::Io(io)) if is_lock_error(&io) && started.elapsed() < LOCK_WAIT => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Err(e @ sled::Error::Corruption { .. }) => {
                    return Err(StoreError::Corrupt {
                        path: path.clone(),
                        msg: e.to_string(),
                    })
                }
                Err(other) => return Err(open_err(other)),
            }
        };
        let tree = |name: &str| db.open_tree(name).map_err(open_err);
        let meta = tree("meta")?;
        // sled 0.34 keeps everything in one file, `db`, inside its directory.
        let data_file = std::fs::File::open(path.join("db")).map_err(|e| StoreError::Open {
            path: path.join("db"),
            msg: e.to_string(),
        })?;
        let store = SledStore {
            networks: tree("networks")?,
            attachments: tree("attachments")?,
            idle: tree("idle")?,
            cursors: tree("cursors")?,
            reservations: tree("reservations")?,
            journal: tree("journal")?,
            next_seq: AtomicU64::new(0),
            writer: Mutex::new(()),
            meta: meta.clone(),
            data_file,
            db,
            path: path.clone(),
        };
        let write_version = || -> Result<(), StoreError> {
            meta.insert("schema_version", &SCHEMA_VERSION.to_be_bytes())
                .map_err(open_err)?;
            store.flush()
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
                    // 1 -> 2 -> 3 only add trees and meta keys; mark the store so an older
                    // ipoold (which would not see reservations, or would not replay the
                    // journal) refuses it.
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
        Ok(store)
    }

    /// Finishes the change sets a crash interrupted (module docs), in order, then empties the
    /// journal and flushes. Sets the next sequence number.
    fn replay_journal(&self) -> Result<(), StoreError> {
        let mut replayed = 0usize;
        let mut next = 0u64;
        for kv in self.journal.iter() {
            let (k, v) = kv.map_err(|e| self.io(e))?;
            let seq = <[u8; 8]>::try_from(k.as_ref())
                .map(u64::from_be_bytes)
                .map_err(|_| self.corrupt("journal key", &k, "not an 8-byte number"))?;
            let ops = decode_entry(&v).map_err(|e| self.corrupt("journal entry", &k, e))?;
            self.materialize(&ops)?;
            self.journal.remove(&k).map_err(|e| self.io(e))?;
            next = seq + 1;
            replayed += 1;
        }
        if replayed > 0 {
            tracing::warn!(
                change_sets = replayed,
                path = %self.path.display(),
                "finished change sets interrupted by a crash"
            );
            self.flush()?;
        }
        self.next_seq.store(next, Ordering::SeqCst);
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
        let _one_writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let key = self.next_seq.fetch_add(1, Ordering::SeqCst).to_be_bytes();
        self.journal.insert(key, entry).map_err(|e| self.io(e))?;
        // If a step below fails, sled itself is failing (its log cannot be written); the
        // entry stays, and the next start finishes the change set.
        self.materialize(&ops)?;
        self.journal.remove(key).map_err(|e| self.io(e))?;
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map_err(|e| self.io(e))?;
        self.data_file
            .sync_data()
            .map_err(|e| self.io(format!("fdatasync: {e}")))
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
        sled::Config::new()
            .path(dir.join("db"))
            .flush_every_ms(None)
            .open()
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
        // New entries continue after the replayed one.
        assert_eq!(s.next_seq.load(Ordering::SeqCst), 42);
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
