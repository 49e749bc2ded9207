use super::*;
use proptest::prelude::*;

const ID: StoreId = [7; 16];

/// A log file of `capacity` with `records` written after its header.
fn file_with(records: &[u8], capacity: u64) -> (tempfile::TempDir, File) {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = create(
        &dir.path().join("wal-0"),
        Header {
            capacity,
            store_id: ID,
        },
    )
    .expect("create");
    f.write_all_at(records, HEADER_LEN).expect("write");
    (dir, f)
}

/// Records `seqs` of `epoch`, sealed as one flush each when `batch` is None, else as one flush
/// starting at `batch`.
fn records(epoch: u64, seqs: &[u64], batch: Option<u64>) -> Vec<u8> {
    let mut out = Vec::new();
    for s in seqs {
        let mut one = Vec::new();
        encode_record(&mut one, epoch, *s, format!("payload {s}").as_bytes());
        seal(&mut one, batch.unwrap_or(*s));
        out.extend_from_slice(&one);
    }
    out
}

fn seqs(v: &[Record]) -> Vec<u64> {
    v.iter().map(|r| r.seq).collect()
}

#[test]
fn a_new_file_has_its_header_and_no_records() {
    let (_d, f) = file_with(&[], 100_000);
    assert_eq!(f.metadata().expect("meta").len(), HEADER_LEN + 100_000);
    assert_eq!(
        Header::read(&f),
        Ok(Header {
            capacity: 100_000,
            store_id: ID
        })
    );
    assert!(!has_records(&f).expect("read"));
    let s = scan(&f, 1, 0).expect("scan");
    assert!(s.run.is_empty() && s.strays.is_empty());
}

#[test]
fn a_damaged_or_missing_header_is_named() {
    let (_d, f) = file_with(&[], 4096);
    f.write_all_at(b"X", 30).expect("write");
    assert!(Header::read(&f).expect_err("damaged").0.contains("damaged"));
    f.write_all_at(&[0; 8], 0).expect("write");
    assert!(Header::read(&f)
        .expect_err("no header")
        .0
        .contains("no write-ahead log header"));
}

#[test]
fn a_run_stops_at_a_torn_record_a_gap_or_another_epoch() {
    let mut b = records(3, &[10, 11], None);
    let whole = b.len();
    b.extend(records(3, &[12], None));
    let (_d, f) = file_with(&b, 4096);
    assert_eq!(seqs(&scan(&f, 3, 0).expect("scan").run), [10, 11, 12]);
    assert!(
        scan(&f, 2, 0).expect("scan").run.is_empty(),
        "another epoch"
    );
    assert!(has_records(&f).expect("read"));
    // Torn: a byte of the third payload lost.
    f.write_all_at(b"X", HEADER_LEN + (whole + RECORD_HEADER) as u64)
        .expect("write");
    let s = scan(&f, 3, 0).expect("scan");
    assert_eq!(seqs(&s.run), [10, 11]);
    assert_eq!(s.run_end, HEADER_LEN + whole as u64);
    assert!(s.strays.is_empty());
    // A new cycle over an old one: what follows the new run is older, not a stray.
    let mut b = records(3, &[20], None);
    b.extend(records(3, &[7, 8], None));
    let (_d, f) = file_with(&b, 4096);
    let s = scan(&f, 3, 0).expect("scan");
    assert_eq!(seqs(&s.run), [20]);
    assert!(s.strays.is_empty());
}

#[test]
fn whole_records_after_damage_are_strays_with_their_batch() {
    let mut b = records(5, &[1, 2], None);
    let at = b.len();
    b.extend(records(5, &[3, 4, 5], Some(3)));
    b.extend(records(5, &[6], None));
    let (_d, f) = file_with(&b, 4096);
    // Damage the length of record 3: the scan must still find what follows it.
    f.write_all_at(&[0xff, 0xff], HEADER_LEN + at as u64)
        .expect("write");
    let s = scan(&f, 5, 0).expect("scan");
    assert_eq!(seqs(&s.run), [1, 2]);
    assert_eq!(seqs(&s.strays), [4, 5, 6]);
    assert_eq!(
        s.strays.iter().map(|r| r.batch).collect::<Vec<_>>(),
        [3, 3, 6]
    );
    assert_eq!(s.last_batch, 6);
    // Records a checkpoint covers are no strays.
    assert_eq!(seqs(&scan(&f, 5, 5).expect("scan").strays), [6]);
}

#[test]
fn a_length_past_the_end_of_the_file_ends_the_run() {
    let mut b = Vec::new();
    encode_record(&mut b, 1, 1, &[7u8; 100]);
    seal(&mut b, 1);
    b.truncate(RECORD_HEADER + 50);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("short");
    let mut bytes = vec![0u8; HEADER_LEN as usize];
    bytes.extend_from_slice(&b);
    std::fs::write(&path, &bytes).expect("write");
    let f = File::open(&path).expect("open");
    assert!(scan(&f, 1, 0).expect("scan").run.is_empty());
}

#[test]
fn a_v4_log_reads_back() {
    let mut b = Vec::new();
    v4::encode_record(&mut b, 2, 10, b"a");
    v4::encode_record(&mut b, 2, 11, b"b");
    v4::encode_record(&mut b, 1, 12, b"old epoch");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("wal-0");
    std::fs::write(&path, &b).expect("write");
    let f = File::open(&path).expect("open");
    assert_eq!(
        v4::read_run(&f, 2).expect("read"),
        vec![(10, b"a".to_vec()), (11, b"b".to_vec())]
    );
}

proptest! {
    #[test]
    fn records_read_back_as_written(payloads in prop::collection::vec(
        prop::collection::vec(any::<u8>(), 0..300), 0..20), first in 1u64..1_000_000) {
        let mut b = Vec::new();
        for (i, p) in payloads.iter().enumerate() {
            encode_record(&mut b, 9, first + i as u64, p);
        }
        seal(&mut b, first);
        let (_d, f) = file_with(&b, 16 << 10);
        let s = scan(&f, 9, 0).expect("scan");
        prop_assert_eq!(s.run.len(), payloads.len());
        prop_assert!(s.strays.is_empty());
        for (i, r) in s.run.into_iter().enumerate() {
            prop_assert_eq!(r.seq, first + i as u64);
            prop_assert_eq!(r.batch, first);
            prop_assert_eq!(&r.payload, &payloads[i]);
        }
    }

    #[test]
    fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..5000)) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("g");
        std::fs::write(&path, &bytes).expect("write");
        let f = File::open(&path).expect("open");
        let epoch = u64::from(bytes.first().copied().unwrap_or(0));
        let _ = scan(&f, epoch, 0);
        let _ = has_records(&f);
        let _ = Header::read(&f);
        let _ = v4::read_run(&f, epoch);
    }
}
