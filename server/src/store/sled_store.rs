//! The sled implementation of [`Store`].
//!
//! ## A log of our own in front of sled
//!
//! A reply waits for its change set to be durable. sled makes writes durable with
//! `Db::flush`: it seals its log buffer and writes it with a `pwrite` and a `sync_file_range`,
//! which survives a crash of the process but not a power loss, so an `fdatasync` had to follow:
//! about 180 us per flush. (sled's transactions, which would make a change set atomic across
//! trees, seal and write the buffer twice.)
//!
//! So each change set is one record in a write-ahead log of our own ([`wal`](super::wal): two
//! preallocated files written in turn), and a flush writes the new records with one `pwrite`
//! and one `fdatasync` (about 90 us). Only then are the change sets handed to the applier thread
//! ([`applier`](super::applier)), which writes them into sled's trees as single-key puts and
//! removes, in order, and makes checkpoints: sled trails the log and never holds a change that
//! a failed flush rolled back.
//!
//! Opening ([`open`](super::open)) replays the log's records after the last durable checkpoint
//! and starts a new *epoch*: records of an older epoch are never replayed (after a restart the
//! files are written from their start again, and a stale record further on could otherwise
//! carry the next number by chance).
//!
//! ## Failures
//!
//! A failed `pwrite` or `fdatasync` of the log, or a failed write or flush of sled, fails the
//! store: nothing more is taken, and [`Store::reopen`] closes everything (without a
//! checkpoint) and opens it again, replaying the log only up to the last change set a flush made
//! durable. A retried `fdatasync` after an I/O error can report success for pages that never
//! reached the disk, so a failed one is never retried on the same handles.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use super::codec::{Op, ATTACHMENTS, BLOCKS, CURSORS, IDLE, META, NETWORKS, RESERVATIONS, TREES};
use super::live::Live;
use super::{AttachmentRecord, Change, Seq, Snapshot, Store, StoreError};

/// Bytes of records each log file holds before the log switches files. A bigger change set is
/// written whole: the file grows.
pub const WAL_CAPACITY: u64 = 1 << 20;

/// How a store is opened.
#[derive(Clone, Debug)]
pub struct StoreOptions {
    /// Bytes of records each log file holds, when the files are created.
    pub log_capacity: u64,
    /// How often the store makes a checkpoint on its own while change sets come in (None:
    /// only when a log file is full).
    pub checkpoint_every: Option<Duration>,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            log_capacity: WAL_CAPACITY,
            checkpoint_every: Some(Duration::from_secs(5)),
        }
    }
}

pub struct SledStore {
    dir: PathBuf,
    options: StoreOptions,
    /// The open store; None after a failure until a reopen succeeds.
    live: RwLock<Option<Arc<Live>>>,
    /// Set by a failure: where the next open continues.
    resume: Mutex<Option<Resume>>,
}

/// How a reopen continues after a failure.
#[derive(Clone, Copy, Debug)]
pub(super) struct Resume {
    /// The last change set a flush made durable: records after it are not replayed.
    pub durable: Seq,
    /// The last number handed out: numbering goes on above it.
    pub last: Seq,
}

impl SledStore {
    /// Opens (or creates) the store in `dir` (sled in `dir/db`, the log in `dir/wal-0` and
    /// `dir/wal-1`). Refuses a store of a newer schema, or one that is damaged, naming the path.
    pub fn open(dir: &Path) -> Result<SledStore, StoreError> {
        SledStore::open_with(dir, StoreOptions::default())
    }

    /// [`SledStore::open`] with log files of `capacity` bytes when it creates them (tests use
    /// small ones, to switch files often).
    pub fn open_with_log_capacity(dir: &Path, capacity: u64) -> Result<SledStore, StoreError> {
        SledStore::open_with(
            dir,
            StoreOptions {
                log_capacity: capacity,
                ..StoreOptions::default()
            },
        )
    }

    /// [`SledStore::open`] with `options`.
    pub fn open_with(dir: &Path, options: StoreOptions) -> Result<SledStore, StoreError> {
        let live = Live::open(dir, &options, None)?;
        Ok(SledStore {
            dir: dir.to_path_buf(),
            options,
            live: RwLock::new(Some(Arc::new(live))),
            resume: Mutex::new(None),
        })
    }

    /// The sled database's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join("db")
    }

    fn live(&self) -> Result<Arc<Live>, StoreError> {
        let slot = self.live.read().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some(l) => Ok(l.clone()),
            None => Err(StoreError::Failed {
                path: self.dir.clone(),
                msg: "it is closed after a failure and not reopened yet".into(),
            }),
        }
    }

    /// Holds the applier thread back (or lets it go), and waits until it is idle.
    #[cfg(test)]
    pub(super) fn pause_applier(&self, paused: bool) {
        if let Ok(l) = self.live() {
            l.pause_applier(paused);
        }
    }

    /// Where the next log record goes in the active file, and which file that is.
    #[cfg(test)]
    pub(super) fn log_position(&self) -> (usize, u64) {
        self.live().map(|l| l.log_position()).unwrap_or((0, 0))
    }

    /// The newest durable checkpoint.
    #[cfg(test)]
    pub(super) fn checkpointed(&self) -> u64 {
        self.live().map(|l| l.checkpointed()).unwrap_or(0)
    }

    /// Makes the next log write fail, as an I/O error would.
    #[cfg(test)]
    pub(super) fn inject_log_error(&self) {
        if let Ok(l) = self.live() {
            l.inject_log_error();
        }
    }
}

impl Store for SledStore {
    fn load_with(
        &self,
        each_attachment: &mut dyn FnMut(AttachmentRecord),
    ) -> Result<Snapshot, StoreError> {
        self.live()?.load_with(each_attachment)
    }

    fn append(&self, changes: &[Change]) -> Result<Seq, StoreError> {
        self.live()?.append(changes)
    }

    fn flush(&self) -> Result<Seq, StoreError> {
        self.live()?.flush()
    }

    fn failure(&self) -> Option<String> {
        match self.live() {
            Ok(l) => l.failure_now(),
            Err(e) => Some(e.to_string()),
        }
    }

    fn reopen(&self) -> Result<(), StoreError> {
        let mut slot = self.live.write().unwrap_or_else(|p| p.into_inner());
        let mut resume = self.resume.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(live) = slot.take() {
            let (durable, last) = live.abandon();
            *resume = Some(Resume { durable, last });
            // Calls that cloned the handle before the write lock finish on their own; sled's
            // file lock goes with the last one (and opening waits a moment for it).
            drop(live);
        }
        let live = Live::open(&self.dir, &self.options, *resume)?;
        tracing::warn!(path = %self.dir.display(), "store reopened after a failure");
        *resume = None;
        *slot = Some(Arc::new(live));
        Ok(())
    }
}

// === impl Trees ===

/// sled's database and trees, shared by the store (opening, loading) and its applier thread.
#[derive(Clone)]
pub(crate) struct Trees {
    pub(super) path: PathBuf,
    pub(super) db: sled::Db,
    trees: [sled::Tree; 7],
    /// sled's data file, synced after every sled flush: sled's own flush ends in
    /// `sync_file_range`, which survives a crash of the process but not a power loss.
    data_file: Arc<File>,
}

/// How long opening waits for sled's file lock before it says another process holds it.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

fn is_lock_error(io: &std::io::Error) -> bool {
    io.kind() == std::io::ErrorKind::WouldBlock || io.to_string().contains("could not acquire lock")
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

/// Hands this thread's deferred frees to crossbeam-epoch's global queue and lets it run the
/// expired ones. sled retires old page versions, paged-out nodes and sealed 512 KiB I/O
/// buffers through epoch-deferred drops, which wait in a per-thread bag until 64 of them have
/// gathered; with one thread writing, that held ~20 I/O buffers and their pages (~14 MiB at
/// 65 536 attachments). Called after each batch of change sets and each sled flush: one pin and
/// a queue push, about 0.1 us.
fn release_garbage() {
    crossbeam_epoch::pin().flush();
}

impl Trees {
    /// Opens sled in `path` (a directory).
    pub(super) fn open(path: &Path) -> Result<Trees, StoreError> {
        let open_err = |e: sled::Error| {
            match e {
            e @ sled::Error::Corruption { .. } => StoreError::Corrupt {
                path: path.to_path_buf(),
                msg: e.to_string(),
            },
            sled::Error::Io(io) if is_lock_error(&io) => StoreError::Open {
                path: path.to_path_buf(),
                msg: format!("it is locked by another process (is another ipoold running on this state dir?): {io}"),
            },
            other => StoreError::Open {
                path: path.to_path_buf(),
                msg: other.to_string(),
            },
        }
        };
        // No background flusher: what a reply acknowledged is in our log, and sled is flushed
        // at checkpoints. sled's page cache defaults to 1 GiB and grows towards it with the
        // data: everything is read once at start and then kept in the engine; writes need only
        // the pages they touch, which the OS caches anyway.
        let config = sled::Config::new()
            .path(path)
            .flush_every_ms(None)
            .cache_capacity(1 << 20);
        let db = open_waiting(&config).map_err(open_err)?;
        let tree = |name: &str| db.open_tree(name).map_err(open_err);
        let trees = [
            tree(TREES[0])?,
            tree(TREES[1])?,
            tree(TREES[2])?,
            tree(TREES[3])?,
            tree(TREES[4])?,
            tree(TREES[5])?,
            tree(TREES[6])?,
        ];
        // sled 0.34 keeps everything in one file, `db`, inside its directory.
        let data_file = File::open(path.join("db")).map_err(|e| StoreError::Open {
            path: path.join("db"),
            msg: e.to_string(),
        })?;
        Ok(Trees {
            path: path.to_path_buf(),
            db,
            trees,
            data_file: Arc::new(data_file),
        })
    }

    pub(super) fn tree(&self, idx: usize) -> &sled::Tree {
        &self.trees[idx.min(TREES.len() - 1)]
    }

    pub(super) fn meta(&self) -> &sled::Tree {
        &self.trees[META]
    }

    /// True if any tree but `meta` holds something.
    pub(super) fn has_data(&self) -> bool {
        [NETWORKS, ATTACHMENTS, IDLE, CURSORS, RESERVATIONS, BLOCKS]
            .iter()
            .any(|i| !self.trees[*i].is_empty())
    }

    pub(super) fn io(&self, e: impl std::fmt::Display) -> StoreError {
        StoreError::Io {
            path: self.path.clone(),
            msg: e.to_string(),
        }
    }

    /// Applies `ops` to their trees, one single-key operation each.
    pub(super) fn materialize(&self, ops: &[Op]) -> Result<(), String> {
        for op in ops {
            let done = match op {
                Op::Put(idx, k, v) => self.tree(*idx).insert(k.as_slice(), v.as_slice()),
                Op::Del(idx, k) => self.tree(*idx).remove(k.as_slice()),
            };
            done.map_err(|e| format!("writing into sled at {}: {e}", self.path.display()))?;
        }
        release_garbage();
        Ok(())
    }

    /// Flushes sled and syncs its data file: everything in its trees is durable.
    pub(super) fn sync(&self) -> Result<(), String> {
        self.db
            .flush()
            .map_err(|e| format!("flushing sled at {}: {e}", self.path.display()))?;
        release_garbage();
        self.data_file
            .sync_data()
            .map_err(|e| format!("fdatasync of sled's file in {}: {e}", self.path.display()))
    }

    /// A u64 in `meta` (0 when absent).
    pub(super) fn meta_u64(&self, key: &str) -> Result<u64, StoreError> {
        match self.meta().get(key).map_err(|e| self.io(e))? {
            None => Ok(0),
            Some(v) => <[u8; 8]>::try_from(v.as_ref())
                .map(u64::from_be_bytes)
                .map_err(|_| StoreError::Corrupt {
                    path: self.path.clone(),
                    msg: format!("meta key {key} is not an 8-byte number"),
                }),
        }
    }
}
