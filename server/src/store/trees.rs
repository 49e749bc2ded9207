//! sled's database and its trees, opened (waiting out another holder of its lock) and shared
//! by the store (opening, loading), its live state and its applier thread.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::codec::{Op, ATTACHMENTS, BLOCKS, CURSORS, IDLE, META, NETWORKS, RESERVATIONS, TREES};
use super::StoreError;

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
    pub(super) fn materialize(&self, ops: &[Op]) -> Result<(), SledFailed> {
        for op in ops {
            let done = match op {
                Op::Put(idx, k, v) => self.tree(*idx).insert(k.as_slice(), v.as_slice()),
                Op::Del(idx, k) => self.tree(*idx).remove(k.as_slice()),
            };
            done.map_err(|e| {
                SledFailed(format!("writing into sled at {}: {e}", self.path.display()))
            })?;
        }
        release_garbage();
        Ok(())
    }

    /// Flushes sled and syncs its data file: everything in its trees is durable.
    pub(super) fn sync(&self) -> Result<(), SledFailed> {
        self.db
            .flush()
            .map_err(|e| SledFailed(format!("flushing sled at {}: {e}", self.path.display())))?;
        release_garbage();
        self.data_file.sync_data().map_err(|e| {
            SledFailed(format!(
                "fdatasync of sled's file in {}: {e}",
                self.path.display()
            ))
        })
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

/// sled failed (a write into its trees, a flush, a sync): what, and where. The applier stops
/// on it, and every waiter is told.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(super) struct SledFailed(pub String);
