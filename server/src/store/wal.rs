//! The write-ahead log in front of sled: two preallocated files, written in turn.
//!
//! A record is one change set:
//!
//! ```text
//! length u32 | crc32 u32 | epoch u64 | sequence u64 | payload (`length` bytes)
//! ```
//!
//! all big-endian; the CRC covers epoch, sequence and payload. Records are written back to back
//! from the start of the active file; a flush writes the records applied since the last one
//! with one `pwrite` and one `fdatasync`. The files are filled with zeros when they are created,
//! so a flush overwrites blocks that exist and `fdatasync` has no file size to record: on this
//! project's test machine 87 us against 118 us for an append, and against 180 us for sled's own
//! flush (a `pwrite` and a `sync_file_range` on sled's I/O threads) plus the `fdatasync` it
//! needs to survive a power loss.
//!
//! What is read back is a *run*: the records from the start of a file while each is whole (its
//! CRC matches), of the epoch asked for, and numbered one after the other. A torn record ends
//! the run, and so do the older records that a new cycle has not overwritten yet (their numbers
//! are lower, or their epoch is older).

use std::fs::{File, OpenOptions};
use std::io::{self, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bytes before a record's payload.
pub(super) const HEADER: usize = 24;

/// Appends one record to `out`.
pub(super) fn encode_record(out: &mut Vec<u8>, epoch: u64, seq: u64, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("a change set under 4 GiB");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&crc(epoch, seq, payload).to_be_bytes());
    out.extend_from_slice(&epoch.to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    out.extend_from_slice(payload);
}

fn crc(epoch: u64, seq: u64, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&epoch.to_be_bytes());
    h.update(&seq.to_be_bytes());
    h.update(payload);
    h.finalize()
}

/// Reads the run at the start of `file` (module docs): records of `epoch`, each numbered one
/// more than the one before, handed to `each` as (sequence, payload) in file order.
pub(super) fn read_run(
    file: &File,
    epoch: u64,
    each: &mut dyn FnMut(u64, Vec<u8>),
) -> io::Result<()> {
    let mut left = file.metadata()?.len();
    let mut r = BufReader::with_capacity(64 << 10, FromStart { file, at: 0 });
    let mut prev: Option<u64> = None;
    let mut header = [0u8; HEADER];
    loop {
        if left < HEADER as u64 {
            return Ok(());
        }
        r.read_exact(&mut header)?;
        left -= HEADER as u64;
        let word = |at: usize| u32::from_be_bytes(header[at..at + 4].try_into().expect("4 bytes"));
        let long = |at: usize| u64::from_be_bytes(header[at..at + 8].try_into().expect("8 bytes"));
        let (len, sum, rec_epoch, seq) = (u64::from(word(0)), word(4), long(8), long(16));
        if len > left || rec_epoch != epoch || prev.is_some_and(|p| Some(seq) != p.checked_add(1)) {
            return Ok(());
        }
        let mut payload = vec![0u8; usize::try_from(len).expect("a length that fits the file")];
        r.read_exact(&mut payload)?;
        left -= len;
        if crc(rec_epoch, seq, &payload) != sum {
            return Ok(());
        }
        prev = Some(seq);
        each(seq, payload);
    }
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

/// Opens the log file at `path`, creating it as `capacity` zero bytes (synced, with its
/// directory) if it does not exist.
pub(super) fn open_file(path: &Path, capacity: u64) -> io::Result<File> {
    match OpenOptions::new().read(true).write(true).open(path) {
        Ok(f) => return Ok(f),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // Written under a temporary name and renamed, so a crash never leaves a short file that a
    // later start would take for a log.
    let tmp = path.with_extension("new");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)?;
    let zeros = vec![0u8; 64 << 10];
    let mut at = 0u64;
    while at < capacity {
        let n = zeros
            .len()
            .min(usize::try_from(capacity - at).unwrap_or(usize::MAX));
        f.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(file: &File, epoch: u64) -> Vec<(u64, Vec<u8>)> {
        let mut got = Vec::new();
        read_run(file, epoch, &mut |s, p| got.push((s, p))).expect("read");
        got
    }

    fn file_with(bytes: &[u8], capacity: u64) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = open_file(&dir.path().join("wal-0"), capacity).expect("create");
        f.write_all_at(bytes, 0).expect("write");
        (dir, f)
    }

    #[test]
    fn a_new_file_is_zeros_and_holds_no_run() {
        let (_d, f) = file_with(&[], 100_000);
        assert_eq!(f.metadata().expect("meta").len(), 100_000);
        assert!(run(&f, 1).is_empty());
        assert!(run(&f, 0).is_empty(), "zeros are not a record of epoch 0");
    }

    #[test]
    fn a_run_stops_at_a_torn_record_a_gap_or_another_epoch() {
        let mut b = Vec::new();
        encode_record(&mut b, 3, 10, b"ten");
        encode_record(&mut b, 3, 11, b"eleven");
        let whole = b.len();
        encode_record(&mut b, 3, 12, b"twelve");
        let (_d, f) = file_with(&b, 4096);
        assert_eq!(run(&f, 3).len(), 3);
        assert!(run(&f, 2).is_empty(), "another epoch");
        // Torn: a byte of the third payload lost.
        f.write_all_at(b"X", (whole + HEADER) as u64)
            .expect("write");
        assert_eq!(
            run(&f, 3),
            vec![(10, b"ten".to_vec()), (11, b"eleven".to_vec())]
        );
        // A gap: a stale record from an earlier cycle after the new ones.
        let mut b = Vec::new();
        encode_record(&mut b, 3, 20, b"new");
        encode_record(&mut b, 3, 7, b"stale");
        let (_d, f) = file_with(&b, 4096);
        assert_eq!(run(&f, 3), vec![(20, b"new".to_vec())]);
    }

    #[test]
    fn a_length_past_the_end_of_the_file_ends_the_run() {
        let mut b = Vec::new();
        encode_record(&mut b, 1, 1, &[7u8; 100]);
        b.truncate(HEADER + 50);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("short");
        std::fs::write(&path, &b).expect("write");
        let f = File::open(&path).expect("open");
        assert!(run(&f, 1).is_empty());
    }

    proptest! {
        #[test]
        fn records_read_back_as_written(payloads in prop::collection::vec(
            prop::collection::vec(any::<u8>(), 0..300), 0..20), first in 1u64..1_000_000) {
            let mut b = Vec::new();
            for (i, p) in payloads.iter().enumerate() {
                encode_record(&mut b, 9, first + i as u64, p);
            }
            let (_d, f) = file_with(&b, 16 << 10);
            let got = run(&f, 9);
            prop_assert_eq!(got.len(), payloads.len());
            for (i, (s, p)) in got.into_iter().enumerate() {
                prop_assert_eq!(s, first + i as u64);
                prop_assert_eq!(&p, &payloads[i]);
            }
        }

        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("g");
            std::fs::write(&path, &bytes).expect("write");
            let f = File::open(&path).expect("open");
            let _ = run(&f, u64::from_be_bytes([0, 0, 0, 0, 0, 0, 0, bytes.first().copied().unwrap_or(0)]));
        }
    }
}
