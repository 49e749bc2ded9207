//! One open store: the log's writer, the applier thread, and reading sled back.

use std::fs::File;
use std::net::IpAddr;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::applier::{self, Applier};
use super::codec::{self, Op, BOOT_ID, CLOCK, DRAIN_PREFIX, TAKEN_OVER_PREFIX};
use super::trees::Trees;
use super::wal::{self, HEADER_LEN};
use super::{AttachmentRecord, Change, NetworkDef, Reservation, Seq, Snapshot, StoreError};

pub(super) struct Live {
    pub(super) dir: PathBuf,
    pub(super) trees: Trees,
    /// The two log files and their paths.
    pub(super) wal: [(File, PathBuf); 2],
    /// Bytes of records each file holds before the log switches files.
    pub(super) capacity: u64,
    /// The epoch this handle writes its records in.
    pub(super) epoch: u64,
    pub(super) writer: Mutex<Writer>,
    /// One flush at a time.
    pub(super) flushing: Mutex<()>,
    pub(super) applier: Applier,
    /// Why the store failed, once it has: nothing more is taken or written.
    pub(super) failure: Failure,
    /// Tests make the next log write fail.
    #[cfg(test)]
    pub(super) inject: AtomicBool,
}

/// The log's write position and what is waiting to be written.
pub(super) struct Writer {
    /// Records appended and not written yet, and their change sets.
    pub(super) pending: Vec<u8>,
    pub(super) sets: Vec<(Seq, Vec<Op>)>,
    /// The last number handed out.
    pub(super) last: Seq,
    /// The last change set a flush made durable.
    pub(super) durable: Seq,
    /// The file written now (0 or 1) and where its next record goes (after the header).
    pub(super) active: usize,
    pub(super) offset: u64,
    /// The last change set written to each file in this epoch (0: none).
    pub(super) last_in: [Seq; 2],
}

/// A store's failure: set once, read on every call.
#[derive(Default)]
pub(super) struct Failure {
    set: AtomicBool,
    why: Mutex<Option<String>>,
}

impl Failure {
    pub(super) fn set(&self, why: String) {
        let mut w = self.why.lock().unwrap_or_else(|p| p.into_inner());
        if w.is_none() {
            tracing::error!(error = %why, "the store failed: it serves nothing until it is reopened");
            *w = Some(why);
        }
        self.set.store(true, Ordering::SeqCst);
    }

    pub(super) fn get(&self) -> Option<String> {
        if !self.set.load(Ordering::SeqCst) {
            return None;
        }
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Live {
    fn failed(&self, why: String) -> StoreError {
        StoreError::Failed {
            path: self.dir.clone(),
            msg: why,
        }
    }

    /// The store's failure: its own, or the applier's (sled's).
    fn check(&self) -> Result<(), StoreError> {
        if let Some(why) = applier::lock(self.applier.shared()).failed.clone() {
            self.failure.set(why.0);
        }
        match self.failure.get() {
            Some(why) => Err(self.failed(why)),
            None => Ok(()),
        }
    }

    /// Why the store failed, if it has (its own failure or the applier's).
    pub(super) fn failure_now(&self) -> Option<String> {
        self.check().err().map(|e| e.to_string())
    }

    /// (the last durable change set, the last number handed out)
    pub(super) fn numbers(&self) -> (Seq, Seq) {
        let w = lock(&self.writer);
        (w.durable, w.last)
    }

    pub(super) fn append(&self, changes: &[Change]) -> Result<Seq, StoreError> {
        let ops = codec::encode(changes).map_err(|e| self.trees.io(e))?;
        let entry = codec::encode_entry(&ops);
        self.check()?;
        let mut w = lock(&self.writer);
        if ops.is_empty() {
            return Ok(w.last);
        }
        w.last += 1;
        let seq = w.last;
        wal::encode_record(&mut w.pending, self.epoch, seq, &entry);
        w.sets.push((seq, ops));
        Ok(seq)
    }

    pub(super) fn flush(&self) -> Result<Seq, StoreError> {
        let _one = lock(&self.flushing);
        self.check()?;
        let (mut records, sets, file, at) = {
            let mut w = lock(&self.writer);
            if w.pending.is_empty() {
                return Ok(w.durable);
            }
            if w.offset >= self.capacity {
                self.switch_files(&mut w)?;
            }
            let records = std::mem::take(&mut w.pending);
            let sets = std::mem::take(&mut w.sets);
            let at = HEADER_LEN + w.offset;
            w.offset += records.len() as u64;
            (records, sets, w.active, at)
        };
        let (first, last) = match (sets.first(), sets.last()) {
            (Some(f), Some(l)) => (f.0, l.0),
            _ => return Ok(lock(&self.writer).durable),
        };
        wal::seal(&mut records, first);
        let (f, path) = &self.wal[file];
        if let Err(e) = self.write_at(f, &records, at) {
            let mut why = format!("writing the write-ahead log {}: {e}", path.display());
            // The records may have reached the file (a failed fdatasync): they must not be
            // replayed by a start after a crash, since their callers are told they failed.
            // Zeros over them, synced, end the log's run before them.
            let zeros = vec![0u8; records.len()];
            if let Err(e2) = f.write_all_at(&zeros, at).and_then(|()| f.sync_data()) {
                why.push_str(&format!(
                    "; erasing its records failed too ({e2}): if ipoold stops before the store is reopened, the next start may keep change sets {first}..={last}"
                ));
            }
            self.failure.set(why.clone());
            return Err(self.failed(why));
        }
        let full = {
            let mut w = lock(&self.writer);
            w.durable = last;
            w.last_in[file] = last;
            w.offset >= self.capacity
        };
        self.applier.push(sets);
        if full {
            // The next flush goes to the other file; this one's records are needed until a
            // checkpoint covers them: start it now.
            self.applier.want_checkpoint(last);
        }
        Ok(last)
    }

    fn write_at(&self, f: &File, records: &[u8], at: u64) -> std::io::Result<()> {
        f.write_all_at(records, at)?;
        // Tests: the records reached the file, and the fdatasync "failed".
        #[cfg(test)]
        if self.inject.swap(false, Ordering::SeqCst) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        f.sync_data()
    }

    /// Moves the log to its other file. That file's records are overwritten only once a
    /// checkpoint covers them (normally long since; else this waits for the applier).
    fn switch_files(&self, w: &mut Writer) -> Result<(), StoreError> {
        let other = w.active ^ 1;
        if w.last_in[other] > 0 {
            self.applier
                .wait_checkpoint(w.last_in[other])
                .map_err(|e| {
                    self.failure.set(e.0.clone());
                    self.failed(e.0)
                })?;
        }
        w.active = other;
        w.offset = 0;
        Ok(())
    }

    /// Everything durable: the applier is let finish first, so the trees hold it all.
    pub(super) fn load_with(
        &self,
        each_attachment: &mut dyn FnMut(AttachmentRecord),
    ) -> Result<Snapshot, StoreError> {
        self.check()?;
        self.applier.drain().map_err(|e| {
            self.failure.set(e.0.clone());
            self.failed(e.0)
        })?;
        read_trees(&self.trees, each_attachment)
    }

    /// Closes for a reopen: waits for a flush under way, fails the store (so that nothing more
    /// is written, not even by the close), stops the applier where it is, and returns
    /// (the last durable change set, the last number handed out).
    pub(super) fn abandon(&self) -> (Seq, Seq) {
        let _one = lock(&self.flushing);
        if self.failure.get().is_none() {
            self.failure
                .set("closed to be reopened (the engine rebuilds its state)".into());
        }
        let numbers = self.numbers();
        self.applier.stop();
        numbers
    }

    #[cfg(test)]
    pub(super) fn pause_applier(&self, paused: bool) {
        self.applier.pause(paused);
    }

    #[cfg(test)]
    pub(super) fn log_position(&self) -> (usize, u64) {
        let w = lock(&self.writer);
        (w.active, HEADER_LEN + w.offset)
    }

    #[cfg(test)]
    pub(super) fn checkpointed(&self) -> u64 {
        applier::lock(self.applier.shared()).checkpointed
    }

    #[cfg(test)]
    pub(super) fn inject_log_error(&self) {
        self.inject.store(true, Ordering::SeqCst);
    }
}

impl Drop for Live {
    /// A clean close: what is pending is flushed, the applier finishes, and a checkpoint at
    /// the last change set leaves nothing to replay. After a failure, nothing is written.
    fn drop(&mut self) {
        if self.failure.get().is_some() {
            self.applier.stop();
            return;
        }
        let closed = self
            .flush()
            .and_then(|_| self.applier.drain().map_err(|e| self.failed(e.0)));
        self.applier.stop();
        let closed = closed.and_then(|applied| {
            applier::checkpoint_at(&self.trees, applied)
                .map(|_| ())
                .map_err(|e| self.failed(e.0))
        });
        if let Err(e) = closed {
            tracing::warn!(error = %e, "closing the store: the final checkpoint failed; the next start replays the log");
        }
    }
}

fn split2(key: &[u8]) -> Option<(String, String)> {
    let s = std::str::from_utf8(key).ok()?;
    let (a, b) = s.split_once('\0')?;
    Some((a.to_string(), b.to_string()))
}

/// Reads every tree into a snapshot (the attachments through `each_attachment`).
pub(super) fn read_trees(
    t: &Trees,
    each_attachment: &mut dyn FnMut(AttachmentRecord),
) -> Result<Snapshot, StoreError> {
    use super::codec::{ATTACHMENTS, BLOCKS, CURSORS, IDLE, NETWORKS, RESERVATIONS};
    let corrupt = |what: &str, key: &[u8], e: &dyn std::fmt::Display| StoreError::Corrupt {
        path: t.path.clone(),
        msg: format!("{what} {:?}: {e}", String::from_utf8_lossy(key)),
    };
    let mut snap = Snapshot::default();
    for kv in t.tree(NETWORKS).iter() {
        let (k, v) = kv.map_err(|e| t.io(e))?;
        let d: NetworkDef = serde_json::from_slice(&v).map_err(|e| corrupt("network", &k, &e))?;
        snap.networks.push(d);
    }
    for kv in t.tree(ATTACHMENTS).iter() {
        let (k, v) = kv.map_err(|e| t.io(e))?;
        let a: AttachmentRecord =
            serde_json::from_slice(&v).map_err(|e| corrupt("attachment", &k, &e))?;
        each_attachment(a);
    }
    for kv in t.tree(IDLE).iter() {
        let (k, v) = kv.map_err(|e| t.io(e))?;
        let (net, ip) = split2(&k).ok_or_else(|| corrupt("idle key", &k, &"bad key"))?;
        let ip: IpAddr = ip.parse().map_err(|e| corrupt("idle key", &k, &e))?;
        let at = <[u8; 8]>::try_from(v.as_ref())
            .map(u64::from_be_bytes)
            .map_err(|e| corrupt("idle value", &k, &e))?;
        snap.idle.push((net, ip, at));
    }
    for kv in t.tree(CURSORS).iter() {
        let (k, v) = kv.map_err(|e| t.io(e))?;
        let (net, set) = split2(&k).ok_or_else(|| corrupt("cursor key", &k, &"bad key"))?;
        let ip: IpAddr = std::str::from_utf8(&v)
            .map_err(|e| corrupt("cursor", &k, &e))?
            .parse()
            .map_err(|e| corrupt("cursor", &k, &e))?;
        snap.cursors.push((net, set, ip));
    }
    for kv in t.tree(BLOCKS).iter() {
        let (k, _) = kv.map_err(|e| t.io(e))?;
        let (net, rest) = split2(&k).ok_or_else(|| corrupt("block key", &k, &"bad key"))?;
        let (set, block) = rest
            .split_once('\0')
            .ok_or_else(|| corrupt("block key", &k, &"bad key"))?;
        snap.blocks.push((net, set.to_string(), block.to_string()));
    }
    for kv in t.tree(RESERVATIONS).iter() {
        let (k, v) = kv.map_err(|e| t.io(e))?;
        let r: Reservation =
            serde_json::from_slice(&v).map_err(|e| corrupt("reservation", &k, &e))?;
        snap.reservations.push(r);
    }
    if let Some(v) = t.meta().get(BOOT_ID).map_err(|e| t.io(e))? {
        let id = std::str::from_utf8(&v).map_err(|e| corrupt("meta", BOOT_ID.as_bytes(), &e))?;
        snap.boot_id = Some(id.to_string());
    }
    if let Some(v) = t.meta().get(CLOCK).map_err(|e| t.io(e))? {
        snap.clock =
            Some(serde_json::from_slice(&v).map_err(|e| corrupt("meta", CLOCK.as_bytes(), &e))?);
    }
    for kv in t.meta().scan_prefix(DRAIN_PREFIX) {
        let (k, _) = kv.map_err(|e| t.io(e))?;
        let net =
            std::str::from_utf8(&k[DRAIN_PREFIX.len()..]).map_err(|e| corrupt("meta", &k, &e))?;
        snap.drained.push(net.to_string());
    }
    for kv in t.meta().scan_prefix(TAKEN_OVER_PREFIX) {
        let (k, _) = kv.map_err(|e| t.io(e))?;
        let net = std::str::from_utf8(&k[TAKEN_OVER_PREFIX.len()..])
            .map_err(|e| corrupt("meta", &k, &e))?;
        snap.taken_over.push(net.to_string());
    }
    Ok(snap)
}
