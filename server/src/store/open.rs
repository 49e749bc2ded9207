//! Opening a store: the files are checked against each other, an older schema is migrated, and
//! the log's records after the last checkpoint are replayed into sled.
//!
//! What refuses the start, naming the file: a log without its database (db/ deleted) or a
//! database without its log (a log file deleted); a log file that belongs to another store, has
//! a damaged header or is shorter than it was created; a damaged record followed by whole ones
//! of a later flush (acknowledged change sets lost); a hole in the numbers after the checkpoint.
//! A torn last flush (a power loss in the middle of its write) is tolerated: none of it was
//! acknowledged, and none of it is replayed.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::applier::{Applier, WAL_CHECKPOINT};
use super::codec::{decode_entry, decode_record, Op};
use super::live::{Failure, Live, Writer};
use super::sled_store::{Resume, StoreOptions};
use super::trees::Trees;
use super::wal::{self, Header, Record, StoreId, HEADER_LEN};
use super::{Seq, StoreError, SCHEMA_VERSION};

/// In `meta`: the epoch of the log records that may need replaying (u64 big-endian).
const WAL_EPOCH: &str = "wal_epoch";
const SCHEMA: &str = "schema_version";
const STORE_ID: &str = "store_id";

fn corrupt(path: &Path, msg: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        path: path.to_path_buf(),
        msg: msg.into(),
    }
}

fn open_err(path: &Path, e: impl std::fmt::Display) -> StoreError {
    StoreError::Open {
        path: path.to_path_buf(),
        msg: e.to_string(),
    }
}

fn hex(id: &StoreId) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

fn new_store_id() -> Result<StoreId, std::io::Error> {
    let mut id = [0u8; 16];
    File::open("/dev/urandom")?.read_exact(&mut id)?;
    Ok(id)
}

impl Live {
    /// Opens the store in `dir`; `resume` after a failure (see [`Resume`]).
    pub(super) fn open(
        dir: &Path,
        options: &StoreOptions,
        resume: Option<Resume>,
    ) -> Result<Live, StoreError> {
        let capacity = options.log_capacity;
        std::fs::create_dir_all(dir).map_err(|e| open_err(dir, e))?;
        let db_path = dir.join("db");
        let wal_paths = [dir.join("wal-0"), dir.join("wal-1")];
        if !db_path.exists() {
            for p in wal_paths.iter().filter(|p| p.exists()) {
                if log_has_records(p)? {
                    return Err(corrupt(
                        &db_path,
                        format!(
                            "the database is missing, but the write-ahead log {} beside it holds records: the state dir lost its database",
                            p.display()
                        ),
                    ));
                }
            }
        }
        let trees = Trees::open(&db_path)?;
        let schema = read_schema(&trees)?;
        match schema {
            Some(v) if v > SCHEMA_VERSION => {
                return Err(StoreError::NewerSchema {
                    path: db_path,
                    found: v,
                })
            }
            Some(SCHEMA_VERSION) => {}
            // The same log; what is new are records an older ipoold must not read.
            Some(5 | 6) => mark_current(&trees)?,
            Some(old) => migrate(&trees, old, &wal_paths, capacity)?,
            None => {
                if trees.has_data() {
                    return Err(corrupt(&db_path, "it holds data but no schema_version"));
                }
                for p in wal_paths.iter().filter(|p| p.exists()) {
                    if log_has_records(p)? {
                        return Err(corrupt(
                            p,
                            format!(
                                "it holds records, but the database beside it ({}) is new: the log belongs to a database that is gone",
                                db_path.display()
                            ),
                        ));
                    }
                }
                create(&trees, &wal_paths, capacity, 0)?;
            }
        }
        let (wal, capacity) = open_logs(&trees, &wal_paths)?;
        let epoch = trees.meta_u64(WAL_EPOCH)?;
        let checkpoint = trees.meta_u64(WAL_CHECKPOINT)?;
        let limit = resume.map(|r| r.durable);
        let last = replay(&trees, &wal, epoch, checkpoint, limit)?;
        // Numbers go on above every number handed out before a failure: the change sets a
        // failed flush left behind are covered by this checkpoint, and are nowhere.
        let checkpoint = resume.map_or(last, |r| r.last.max(last));
        let meta = trees.meta();
        let put = |k: &str, v: u64| {
            meta.insert(k, &v.to_be_bytes())
                .map(|_| ())
                .map_err(|e| trees.io(e))
        };
        put(WAL_CHECKPOINT, checkpoint)?;
        put(WAL_EPOCH, epoch + 1)?;
        trees.sync().map_err(|e| trees.io(e))?;
        let applier = Applier::start(trees.clone(), checkpoint, options.checkpoint_every)
            .map_err(|e| trees.io(format!("starting the applier thread: {e}")))?;
        Ok(Live {
            dir: dir.to_path_buf(),
            trees,
            wal,
            capacity,
            epoch: epoch + 1,
            writer: Mutex::new(Writer {
                pending: Vec::new(),
                sets: Vec::new(),
                last: checkpoint,
                // After a reopen, the numbers between these were handed out and dropped: a
                // flush reports them not durable.
                durable: last,
                active: 0,
                offset: 0,
                last_in: [0, 0],
            }),
            flushing: Mutex::new(()),
            applier,
            failure: Failure::default(),
            #[cfg(test)]
            inject: Default::default(),
        })
    }
}

fn read_schema(trees: &Trees) -> Result<Option<u32>, StoreError> {
    match trees.meta().get(SCHEMA).map_err(|e| trees.io(e))? {
        None => Ok(None),
        Some(v) => <[u8; 4]>::try_from(v.as_ref())
            .map(|b| Some(u32::from_be_bytes(b)))
            .map_err(|_| corrupt(&trees.path, "schema_version is not a 4-byte number")),
    }
}

/// True if the file at `path` holds any whole log record (of this format).
fn log_has_records(path: &Path) -> Result<bool, StoreError> {
    let f = File::open(path).map_err(|e| open_err(path, e))?;
    wal::has_records(&f).map_err(|e| open_err(path, e))
}

/// Makes a new store's files: both logs (with a new store id), then the database's `meta`,
/// which names the same id. The logs come first: a crash before the database is marked leaves
/// logs without records, which the next start takes for an unfinished creation.
fn create(
    trees: &Trees,
    paths: &[PathBuf; 2],
    capacity: u64,
    checkpoint: Seq,
) -> Result<(), StoreError> {
    let store_id =
        new_store_id().map_err(|e| open_err(&trees.path, format!("reading /dev/urandom: {e}")))?;
    for p in paths {
        wal::create(p, Header { capacity, store_id }).map_err(|e| open_err(p, e))?;
    }
    let meta = trees.meta();
    let io = |e: sled::Error| trees.io(e);
    meta.insert(STORE_ID, &store_id[..]).map_err(io)?;
    meta.insert(WAL_CHECKPOINT, &checkpoint.to_be_bytes())
        .map_err(io)?;
    meta.insert(SCHEMA, &SCHEMA_VERSION.to_be_bytes())
        .map_err(io)?;
    trees.sync().map_err(|e| trees.io(e))
}

/// Marks the store as of the current schema.
fn mark_current(trees: &Trees) -> Result<(), StoreError> {
    trees
        .meta()
        .insert(SCHEMA, &SCHEMA_VERSION.to_be_bytes())
        .map_err(|e| trees.io(e))?;
    trees.sync().map_err(|e| trees.io(e))?;
    tracing::info!(to = SCHEMA_VERSION, path = %trees.path.display(), "store marked with the new schema");
    Ok(())
}

/// Opens both log files and checks them against the database: present, a good header, the
/// database's store id, as long as they were created. Returns them and their capacity.
fn open_logs(
    trees: &Trees,
    paths: &[PathBuf; 2],
) -> Result<([(File, PathBuf); 2], u64), StoreError> {
    let id: StoreId = match trees.meta().get(STORE_ID).map_err(|e| trees.io(e))? {
        Some(v) => v
            .as_ref()
            .try_into()
            .map_err(|_| corrupt(&trees.path, "its store_id is not 16 bytes"))?,
        None => return Err(corrupt(&trees.path, "it has no store_id")),
    };
    let one = |p: &PathBuf| -> Result<(File, u64), StoreError> {
        if !p.exists() {
            return Err(corrupt(
                p,
                format!(
                    "it is missing: the write-ahead log of the database {} (store id {}) is gone, and with it change sets the database may not have",
                    trees.path.display(),
                    hex(&id)
                ),
            ));
        }
        let f = wal::open(p).map_err(|e| open_err(p, e))?;
        let h = Header::read(&f).map_err(|e| corrupt(p, e.0))?;
        if h.store_id != id {
            return Err(corrupt(
                p,
                format!(
                    "it belongs to store {}, not to the database beside it ({}, store {})",
                    hex(&h.store_id),
                    trees.path.display(),
                    hex(&id)
                ),
            ));
        }
        let len = f.metadata().map_err(|e| open_err(p, e))?.len();
        if len < HEADER_LEN + h.capacity {
            return Err(corrupt(
                p,
                format!(
                    "it is {len} bytes, but it was created with {}: it was truncated",
                    HEADER_LEN + h.capacity
                ),
            ));
        }
        Ok((f, h.capacity))
    };
    let (f0, c0) = one(&paths[0])?;
    let (f1, c1) = one(&paths[1])?;
    Ok(([(f0, paths[0].clone()), (f1, paths[1].clone())], c0.min(c1)))
}

/// Replays the records of `epoch` numbered after `checkpoint` (and up to `limit`) into the
/// trees; returns the last one replayed (or the checkpoint).
fn replay(
    trees: &Trees,
    wal: &[(File, PathBuf); 2],
    epoch: u64,
    checkpoint: Seq,
    limit: Option<Seq>,
) -> Result<Seq, StoreError> {
    let mut scans = Vec::new();
    for (f, p) in wal {
        let s = wal::scan(f, epoch, checkpoint).map_err(|e| StoreError::Io {
            path: p.clone(),
            msg: format!("reading the write-ahead log: {e}"),
        })?;
        scans.push(s);
    }
    let mut records: Vec<(&Record, &PathBuf)> = scans
        .iter()
        .zip(wal.iter().map(|(_, p)| p))
        .flat_map(|(s, p)| {
            s.run
                .iter()
                .filter(|r| r.seq > checkpoint)
                .map(move |r| (r, p))
        })
        .collect();
    records.sort_unstable_by_key(|(r, _)| r.seq);
    // What follows the checkpoint must be every change set after it, none missing: a hole
    // means acknowledged writes are gone, and starting would hand their addresses out again.
    for (i, (r, p)) in records.iter().enumerate() {
        let want = checkpoint + 1 + i as u64;
        if r.seq != want {
            return Err(corrupt(
                p,
                format!(
                    "the write-ahead log continues checkpoint {checkpoint} with change set {} where {want} was expected (change sets are missing)",
                    r.seq
                ),
            ));
        }
    }
    let end = records.last().map_or(checkpoint, |(r, _)| r.seq);
    // Whole records past a damaged one: the torn last flush, or lost acknowledged ones.
    let last_batch = scans.iter().map(|s| s.last_batch).max().unwrap_or(0);
    let mut torn = 0usize;
    for (s, (_, p)) in scans.iter().zip(wal.iter()) {
        for stray in &s.strays {
            if stray.batch == last_batch && end + 1 >= last_batch {
                torn += 1;
                continue;
            }
            return Err(corrupt(
                p,
                format!(
                    "the record at offset {} is damaged, and whole records follow it (change set {} at offset {}): change sets that were acknowledged are lost",
                    s.run_end, stray.seq, stray.offset
                ),
            ));
        }
    }
    if torn > 0 {
        tracing::warn!(records = torn, "the log's last flush was torn (a crash during its write); it was never acknowledged and is not replayed");
    }
    let mut replayed = 0usize;
    let mut last = checkpoint;
    for (r, p) in &records {
        if limit.is_some_and(|l| r.seq > l) {
            break;
        }
        let ops = decode_record(p, r.seq, &r.payload)?;
        trees.materialize(&ops).map_err(|e| trees.io(e))?;
        last = r.seq;
        replayed += 1;
    }
    let dropped = records.len() - replayed;
    if dropped > 0 {
        tracing::warn!(
            change_sets = dropped,
            "dropped change sets whose flush failed (they were never acknowledged)"
        );
    }
    if replayed > 0 {
        tracing::warn!(change_sets = replayed, path = %trees.path.display(), "replayed change sets from the write-ahead log that sled had not made durable");
    }
    Ok(last)
}

/// Brings a store of schema `old` to the current one: a schema-3 store's journal is finished,
/// a schema-4 store's log (no header) is replayed, and new log files are made.
fn migrate(trees: &Trees, old: u32, paths: &[PathBuf; 2], capacity: u64) -> Result<(), StoreError> {
    let mut checkpoint = trees.meta_u64(WAL_CHECKPOINT)?;
    if old <= 3 {
        finish_journal(trees)?;
    }
    if old == 4 {
        checkpoint = replay_v4(trees, paths, checkpoint)?;
    }
    create(trees, paths, capacity, checkpoint)?;
    tracing::info!(from = old, to = SCHEMA_VERSION, path = %trees.path.display(), "store migrated");
    Ok(())
}

/// Finishes the change sets a crash interrupted in a schema-3 store (each an entry in the
/// `journal` tree), in order, then empties the journal.
fn finish_journal(trees: &Trees) -> Result<(), StoreError> {
    let journal = trees.db.open_tree("journal").map_err(|e| trees.io(e))?;
    let mut replayed = 0usize;
    for kv in journal.iter() {
        let (k, v) = kv.map_err(|e| trees.io(e))?;
        let ops: Vec<Op> = decode_entry(&v).map_err(|e| {
            corrupt(
                &trees.path,
                format!("journal entry {:?}: {e}", String::from_utf8_lossy(&k)),
            )
        })?;
        trees.materialize(&ops).map_err(|e| trees.io(e))?;
        journal.remove(&k).map_err(|e| trees.io(e))?;
        replayed += 1;
    }
    if replayed > 0 {
        tracing::warn!(change_sets = replayed, path = %trees.path.display(), "finished change sets interrupted by a crash");
    }
    trees.sync().map_err(|e| trees.io(e))
}

/// Replays a schema-4 log (records of the stored epoch after the checkpoint) and makes it
/// durable in sled; returns the last change set.
fn replay_v4(trees: &Trees, paths: &[PathBuf; 2], checkpoint: Seq) -> Result<Seq, StoreError> {
    let epoch = trees.meta_u64(WAL_EPOCH)?;
    let mut records = Vec::new();
    for p in paths.iter().filter(|p| p.exists()) {
        let f = File::open(p).map_err(|e| open_err(p, e))?;
        let run = wal::v4::read_run(&f, epoch).map_err(|e| open_err(p, e))?;
        records.extend(run.into_iter().filter(|(s, _)| *s > checkpoint));
    }
    records.sort_unstable_by_key(|r| r.0);
    let log = paths[0].with_file_name("wal-*");
    for (i, (seq, payload)) in records.iter().enumerate() {
        if *seq != checkpoint + 1 + i as u64 {
            return Err(corrupt(
                &log,
                format!(
                    "the write-ahead log continues checkpoint {checkpoint} with change set {seq} where {} was expected",
                    checkpoint + 1 + i as u64
                ),
            ));
        }
        let ops = decode_record(&log, *seq, payload)?;
        trees.materialize(&ops).map_err(|e| trees.io(e))?;
    }
    // The checkpoint goes with the replayed change sets: a crash before the new log files
    // are in place must not replay the old files' older records over them.
    let last = records.last().map_or(checkpoint, |r| r.0);
    super::applier::checkpoint_at(trees, last).map_err(|e| trees.io(e))?;
    Ok(last)
}
