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

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

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
