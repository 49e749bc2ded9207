//! The write-ahead log in front of sled: two preallocated files, `wal-0` and `wal-1`, written in
//! turn.
//!
//! Each file starts with a header block ([`HEADER_LEN`] bytes):
//!
//! ```text
//! magic "ipoolwal" | format u32 | capacity u64 | store id (16 bytes) | crc32 u32
//! ```
//!
//! The store id is the database's (sled's `meta` holds it too), so a log is never replayed into
//! a database it does not belong to. Records follow the header, back to back:
//!
//! ```text
//! length u32 | crc32 u32 | epoch u64 | sequence u64 | batch u64 | payload (`length` bytes)
//! ```
//!
//! all big-endian; the CRC covers epoch, sequence, batch and payload. `batch` is the sequence
//! number of the first record of the flush that wrote this one: a flush writes its records with
//! one `pwrite` and one `fdatasync`, and a power loss in the middle may leave any of its
//! sectors on disk, so a damaged record followed by whole ones of the *same, last* batch is a
//! torn write (nothing of it was acknowledged), while whole records of a later batch after a
//! damaged one mean acknowledged records were lost.
//!
//! The files are filled with zeros when they are created, so a flush overwrites blocks that
//! exist and `fdatasync` has no file size to record (87 us against 118 us for an append on this
//! project's test machine).
//!
//! What is read back ([`scan`]) is, per file, a *run*: the records from the start while each is
//! whole, of the epoch asked for, and numbered one after the other; and the *strays*: whole
//! records of that epoch after the run's end numbered above it, which only damage or a torn
//! last batch leave (a new cycle overwrites a file from its start, so what follows its run is
//! older).

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bytes of the header block at the start of each file.
pub(super) const HEADER_LEN: u64 = 4096;
/// Bytes before a record's payload.
pub(super) const RECORD_HEADER: usize = 32;
const MAGIC: &[u8; 8] = b"ipoolwal";
const FORMAT: u32 = 1;

/// A store's identity: written in sled's `meta` and in both log files' headers.
pub type StoreId = [u8; 16];

/// Why a log's header cannot be taken: not an ipool log, damaged, or of another format.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadHeader(pub String);

/// What a log file's header says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Header {
    /// Bytes of records the file was created to hold.
    pub capacity: u64,
    pub store_id: StoreId,
}

impl Header {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(40);
        b.extend_from_slice(MAGIC);
        b.extend_from_slice(&FORMAT.to_be_bytes());
        b.extend_from_slice(&self.capacity.to_be_bytes());
        b.extend_from_slice(&self.store_id);
        let sum = crc32fast::hash(&b);
        b.extend_from_slice(&sum.to_be_bytes());
        b
    }

    /// Reads the header of `file`; the error says what is wrong with it.
    pub(super) fn read(file: &File) -> Result<Header, BadHeader> {
        let mut b = [0u8; 40];
        file.read_exact_at(&mut b, 0)
            .map_err(|e| BadHeader(format!("its header cannot be read: {e}")))?;
        if &b[..8] != MAGIC {
            return Err(BadHeader(
                "it has no write-ahead log header (not an ipool log, or damaged)".into(),
            ));
        }
        let sum = u32::from_be_bytes(b[36..40].try_into().expect("4 bytes"));
        if crc32fast::hash(&b[..36]) != sum {
            return Err(BadHeader(
                "its header is damaged (checksum mismatch)".into(),
            ));
        }
        let format = u32::from_be_bytes(b[8..12].try_into().expect("4 bytes"));
        if format != FORMAT {
            return Err(BadHeader(format!(
                "its format is {format}; this ipoold reads format {FORMAT}"
            )));
        }
        Ok(Header {
            capacity: u64::from_be_bytes(b[12..20].try_into().expect("8 bytes")),
            store_id: b[20..36].try_into().expect("16 bytes"),
        })
    }
}

/// Appends one record to `out`, unsealed: its batch and checksum are set by [`seal`] when a
/// flush takes it (the batch is known only then).
pub(super) fn encode_record(out: &mut Vec<u8>, epoch: u64, seq: u64, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("a change set under 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&epoch.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    out.extend_from_slice(payload);
}

/// Sets the batch of every record in `records` (encoded back to back by [`encode_record`]) to
/// `batch`, and their checksums.
pub(super) fn seal(records: &mut [u8], batch: u64) {
    let mut at = 0;
    while at + RECORD_HEADER <= records.len() {
        let len = u32::from_be_bytes(records[at..at + 4].try_into().expect("4 bytes")) as usize;
        let end = at + RECORD_HEADER + len;
        let (epoch, seq) = (be64(&records[at + 8..]), be64(&records[at + 16..]));
        records[at + 24..at + 32].copy_from_slice(&batch.to_be_bytes());
        let sum = crc(epoch, seq, batch, &records[at + RECORD_HEADER..end]);
        records[at + 4..at + 8].copy_from_slice(&sum.to_be_bytes());
        at = end;
    }
}

fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b[..8].try_into().expect("8 bytes"))
}

fn crc(epoch: u64, seq: u64, batch: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&epoch.to_be_bytes());
    h.update(&seq.to_be_bytes());
    h.update(&batch.to_be_bytes());
    h.update(payload);
    h.finalize()
}

/// One whole record found in a file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Record {
    pub seq: u64,
    pub batch: u64,
    /// Where it starts in the file.
    pub offset: u64,
    pub payload: Vec<u8>,
}

/// What one file holds for one epoch (module docs).
#[derive(Debug, Default)]
pub(super) struct Scan {
    pub run: Vec<Record>,
    /// Where the run ends (the next record would go here).
    pub run_end: u64,
    /// Whole records of the epoch after the run, numbered above both the run and `floor`.
    pub strays: Vec<Record>,
    /// The highest batch of any whole record of the epoch in the file.
    pub last_batch: u64,
}

/// The record at `at` in `bytes`, if it is whole and of `epoch`. Epochs and numbers start at
/// 1: zeros are never a record.
fn record_at(bytes: &[u8], at: usize, epoch: u64) -> Option<Record> {
    let h = bytes.get(at..at + RECORD_HEADER)?;
    if epoch == 0 || be64(&h[8..]) != epoch || be64(&h[16..]) == 0 {
        return None;
    }
    let len = u32::from_be_bytes(h[..4].try_into().expect("4 bytes")) as usize;
    let payload = bytes.get(at + RECORD_HEADER..at + RECORD_HEADER + len)?;
    let sum = u32::from_be_bytes(h[4..8].try_into().expect("4 bytes"));
    let (seq, batch) = (be64(&h[16..]), be64(&h[24..]));
    (crc(epoch, seq, batch, payload) == sum).then(|| Record {
        seq,
        batch,
        offset: at as u64,
        payload: payload.to_vec(),
    })
}

/// Reads `file` whole and finds its run and strays of `epoch`. Strays numbered at or below
/// `floor` (records a checkpoint already covers: an older cycle's) are left out.
pub(super) fn scan(file: &File, epoch: u64, floor: u64) -> io::Result<Scan> {
    let mut bytes = Vec::new();
    FromStart { file, at: 0 }.read_to_end(&mut bytes)?;
    let start = HEADER_LEN as usize;
    let mut s = Scan {
        run_end: HEADER_LEN,
        ..Scan::default()
    };
    let mut at = start;
    while let Some(r) = record_at(&bytes, at, epoch) {
        if s.run
            .last()
            .is_some_and(|p| Some(r.seq) != p.seq.checked_add(1))
        {
            break;
        }
        at += RECORD_HEADER + r.payload.len();
        s.last_batch = s.last_batch.max(r.batch);
        s.run.push(r);
    }
    s.run_end = at as u64;
    let above = s.run.last().map_or(0, |r| r.seq).max(floor);
    // Past the run, look at every offset where the epoch appears as a header's would: a
    // damaged length must not hide what follows it.
    let pattern = epoch.to_be_bytes();
    let finder = memchr::memmem::Finder::new(&pattern);
    let mut probe = at;
    while probe + RECORD_HEADER <= bytes.len() {
        let Some(found) = finder.find(&bytes[probe + 8..]) else {
            break;
        };
        let candidate = probe + found;
        match record_at(&bytes, candidate, epoch) {
            Some(r) => {
                probe = candidate + RECORD_HEADER + r.payload.len();
                if r.seq > above {
                    s.last_batch = s.last_batch.max(r.batch);
                    s.strays.push(r);
                }
            }
            None => probe = candidate + 1,
        }
    }
    Ok(s)
}

/// Reads a file from its start with `pread`, whatever its cursor.
struct FromStart<'a> {
    file: &'a File,
    at: u64,
}

impl Read for FromStart<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

/// Creates the log file at `path` (replacing one that is there): the header, then `capacity`
/// zero bytes; written under a temporary name, synced, renamed, and the directory synced, so a
/// crash never leaves a short file that a later start would take for a log.
pub(super) fn create(path: &Path, header: Header) -> io::Result<File> {
    let tmp = path.with_extension("new");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    let zeros = vec![0u8; 64 << 10];
    let end = HEADER_LEN + header.capacity;
    let mut at = 0u64;
    while at < end {
        let n = zeros
            .len()
            .min(usize::try_from(end - at).unwrap_or(usize::MAX));
        f.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    f.write_all_at(&header.encode(), 0)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(f)
}

/// Opens an existing log file for reading and writing.
pub(super) fn open(path: &Path) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(path)
}

/// True if `file` holds any whole record of any epoch: a log that has been written to.
pub(super) fn has_records(file: &File) -> io::Result<bool> {
    let mut bytes = Vec::new();
    FromStart { file, at: 0 }.read_to_end(&mut bytes)?;
    let mut at = HEADER_LEN as usize;
    while at + RECORD_HEADER <= bytes.len() {
        let epoch = be64(&bytes[at + 8..]);
        if record_at(&bytes, at, epoch).is_some() {
            return Ok(true);
        }
        at += 1;
    }
    Ok(false)
}

/// The log of schema 4 (no header; `length | crc | epoch | sequence | payload`, 24 bytes
/// before the payload), read once to migrate such a store.
pub(super) mod v4 {
    use super::*;

    const HEADER: usize = 24;

    fn crc(epoch: u64, seq: u64, payload: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new();
        h.update(&epoch.to_be_bytes());
        h.update(&seq.to_be_bytes());
        h.update(payload);
        h.finalize()
    }

    /// Appends one record in the old format (tests write old stores with it).
    #[cfg(test)]
    pub(in crate::store) fn encode_record(out: &mut Vec<u8>, epoch: u64, seq: u64, payload: &[u8]) {
        let len = u32::try_from(payload.len()).expect("small");
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&crc(epoch, seq, payload).to_be_bytes());
        out.extend_from_slice(&epoch.to_be_bytes());
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend_from_slice(payload);
    }

    /// The run at the start of `file`: records of `epoch`, numbered one after the other.
    pub(in crate::store) fn read_run(file: &File, epoch: u64) -> io::Result<Vec<(u64, Vec<u8>)>> {
        let mut bytes = Vec::new();
        FromStart { file, at: 0 }.read_to_end(&mut bytes)?;
        let mut out: Vec<(u64, Vec<u8>)> = Vec::new();
        let mut at = 0usize;
        while let Some(h) = bytes.get(at..at + HEADER) {
            let len = u32::from_be_bytes(h[..4].try_into().expect("4 bytes")) as usize;
            let sum = u32::from_be_bytes(h[4..8].try_into().expect("4 bytes"));
            let (rec_epoch, seq) = (be64(&h[8..]), be64(&h[16..]));
            let Some(payload) = bytes.get(at + HEADER..at + HEADER + len) else {
                break;
            };
            let next = out.last().map(|(p, _)| p.checked_add(1));
            if rec_epoch != epoch
                || next.is_some_and(|n| n != Some(seq))
                || crc(rec_epoch, seq, payload) != sum
            {
                break;
            }
            out.push((seq, payload.to_vec()));
            at += HEADER + len;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
