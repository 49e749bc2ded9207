use super::*;
use crate::config::{DaemonConfig, IpamSection};

fn net(name: &str) -> NetworkDef {
    IpamSection::parse(r#"{"subnet":"10.0.0.0/24"}"#)
        .expect("valid")
        .expect("present")
        .network_def(name, &DaemonConfig::embedded().defaults)
        .expect("valid")
        .expect("declares")
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

fn sample() -> Vec<Change> {
    let key = AttachmentKey {
        network: "n".into(),
        container_id: "c1".into(),
        ifname: "eth0".into(),
    };
    vec![
        Change::PutNetwork(net("n")),
        Change::PutAttachment(AttachmentRecord {
            key,
            pod: Pod {
                namespace: "default".into(),
                name: "web-0".into(),
                uid: "u".into(),
            },
            netns: "/var/run/netns/x".into(),
            addresses: vec![ip("10.0.0.2")],
            created_at_ms: 7,
        }),
        Change::PutIdle {
            network: "n".into(),
            ip: ip("10.0.0.3"),
            released_at: 99,
        },
        Change::PutCursor {
            network: "n".into(),
            set: 0,
            cursor: Some(ip("10.0.0.3")),
        },
        Change::PutReservation(reservation()),
        Change::PutBootId("b-1".into()),
        Change::PutDrain {
            network: "n".into(),
            drained: true,
        },
    ]
}

fn reservation() -> Reservation {
    Reservation {
        key: ReservationKey {
            network: "n".into(),
            namespace: "db".into(),
            name: "web-1".into(),
        },
        addresses: vec![ip("10.0.0.4")],
        created_at_ms: 5,
        expires_at_ms: 600_005,
        reason: "sticky pod released: CNI DEL".into(),
    }
}

fn check_roundtrip(store: &dyn Store) {
    store.apply(&sample()).expect("apply");
    store.flush().expect("flush");
    let snap = store.load().expect("load");
    assert_eq!(snap.networks, vec![net("n")]);
    assert_eq!(snap.attachments.len(), 1);
    assert_eq!(snap.attachments[0].pod.name, "web-0");
    assert_eq!(snap.idle, vec![("n".to_string(), ip("10.0.0.3"), 99)]);
    assert_eq!(snap.cursors, vec![("n".to_string(), 0, ip("10.0.0.3"))]);
    assert_eq!(snap.reservations, vec![reservation()]);
    assert_eq!(snap.boot_id.as_deref(), Some("b-1"));
    assert_eq!(snap.drained, vec!["n".to_string()]);
    // The streaming load hands out the same attachments and leaves them out of the snapshot.
    let mut streamed = Vec::new();
    let rest = store
        .load_with(&mut |a| streamed.push(a))
        .expect("load_with");
    assert_eq!(streamed, snap.attachments);
    assert_eq!(
        rest,
        Snapshot {
            attachments: Vec::new(),
            ..snap.clone()
        }
    );
    let key = snap.attachments[0].key.clone();
    store
        .apply(&[
            Change::DeleteAttachment(key),
            Change::DeleteIdle {
                network: "n".into(),
                ip: ip("10.0.0.3"),
            },
            Change::PutCursor {
                network: "n".into(),
                set: 0,
                cursor: None,
            },
            Change::DeleteReservation(reservation().key),
            Change::PutBootId("b-2".into()),
            Change::PutDrain {
                network: "n".into(),
                drained: false,
            },
        ])
        .expect("apply");
    let snap = store.load().expect("load");
    assert!(snap.attachments.is_empty() && snap.idle.is_empty() && snap.cursors.is_empty());
    assert!(snap.reservations.is_empty() && snap.drained.is_empty());
    assert_eq!(snap.boot_id.as_deref(), Some("b-2"));
}

#[test]
fn sled_store_reads_a_version_1_store_and_marks_it_current() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let db = raw_sled(dir.path()).expect("open");
        db.open_tree("meta")
            .expect("tree")
            .insert("schema_version", &1u32.to_be_bytes())
            .expect("insert");
        db.open_tree("idle")
            .expect("tree")
            .insert("n\u{0}10.0.0.9", &42u64.to_be_bytes())
            .expect("insert");
        db.flush().expect("flush");
    }
    let s = SledStore::open(dir.path()).expect("a version-1 store opens");
    let snap = s.load().expect("load");
    assert_eq!(snap.idle, vec![("n".to_string(), ip("10.0.0.9"), 42)]);
    assert_eq!(snap.boot_id, None);
    drop(s);
    let db = raw_sled(dir.path()).expect("raw open");
    let v = db
        .open_tree("meta")
        .expect("tree")
        .get("schema_version")
        .expect("get")
        .expect("present");
    assert_eq!(v.as_ref(), &SCHEMA_VERSION.to_be_bytes());
}

#[test]
fn mem_store_roundtrip() {
    check_roundtrip(&MemStore::new());
}

#[test]
fn sled_store_roundtrip_and_reopen() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let s = SledStore::open(dir.path()).expect("open");
        check_roundtrip(&s);
        s.apply(&sample()).expect("apply");
        s.flush().expect("flush");
    }
    let s = SledStore::open(dir.path()).expect("reopen");
    let snap = s.load().expect("load");
    assert_eq!(snap.attachments.len(), 1);
    assert_eq!(snap.idle.len(), 1);
}

#[test]
fn sled_store_refuses_newer_schema_naming_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let db = raw_sled(dir.path()).expect("open");
        db.open_tree("meta")
            .expect("tree")
            .insert("schema_version", &(SCHEMA_VERSION + 1).to_be_bytes())
            .expect("insert");
        db.flush().expect("flush");
    }
    let e = SledStore::open(dir.path())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains(&format!("schema version {}", SCHEMA_VERSION + 1)),
        "{e}"
    );
    assert!(e.contains(&dir.path().display().to_string()), "{e}");
}

#[test]
fn sled_store_refuses_undecodable_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    drop(SledStore::open(dir.path()).expect("open"));
    {
        let db = raw_sled(dir.path()).expect("raw open");
        db.open_tree("attachments")
            .expect("tree")
            .insert("n\0c\0eth0", "not json")
            .expect("insert");
        db.flush().expect("flush");
    }
    let s = SledStore::open(dir.path()).expect("open");
    let e = s.load().expect_err("corrupt").to_string();
    assert!(e.contains("corrupt") && e.contains("attachment"), "{e}");
}

/// sled opened directly, as an older or a foreign writer would. No background flusher: its
/// thread could still hold the file lock after the handle is dropped.
fn raw_sled(dir: &Path) -> sled::Result<sled::Db> {
    sled_store::open_waiting(
        &sled::Config::new()
            .path(dir.join("db"))
            .flush_every_ms(None),
    )
}

/// Drop and reopen at once, many times, as ipoold's start-up does (read through one handle,
/// serve through the next): sled's I/O threads may hold its file, and so its lock, for a moment
/// after a handle is dropped; opening waits for them instead of failing.
#[test]
fn sled_store_reopens_right_after_a_drop() {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..200u64 {
        let s = SledStore::open(dir.path()).expect("reopen right after a drop");
        s.apply(&[Change::PutIdle {
            network: "n".into(),
            ip: ip("10.0.0.9"),
            released_at: i,
        }])
        .expect("apply");
        s.flush().expect("flush");
    }
    let s = SledStore::open(dir.path()).expect("open");
    assert_eq!(
        s.load().expect("load").idle,
        vec![("n".to_string(), ip("10.0.0.9"), 199)]
    );
}

// === The write-ahead log (sled_store's module docs) ===

/// Copies a live store's files: what a crash of the process at this moment leaves on disk
/// (sled's unflushed writes are in its memory, not in the files).
fn crash_copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.file_type().expect("type").is_dir() {
            crash_copy(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).expect("copy");
        }
    }
}

/// What a store holds after `change_sets`, in canonical order (the model: a MemStore).
fn model_of(change_sets: &[&[Change]]) -> Snapshot {
    let m = MemStore::new();
    for c in change_sets {
        m.apply(c).expect("apply");
    }
    canonical(m.load().expect("load"))
}

/// A log file of a crash copy, opened to damage it.
fn open_log(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open the log file")
}

/// A snapshot in a canonical order, to compare stores that list things differently.
fn canonical(mut s: Snapshot) -> Snapshot {
    s.networks.sort_by(|a, b| a.name.cmp(&b.name));
    s.attachments.sort_by(|a, b| a.key.cmp(&b.key));
    s.idle.sort();
    s.cursors.sort();
    s.reservations.sort_by(|a, b| a.key.cmp(&b.key));
    s.drained.sort();
    s
}

fn attachment(container: &str, addr: IpAddr) -> AttachmentRecord {
    AttachmentRecord {
        key: AttachmentKey {
            network: "n".into(),
            container_id: container.into(),
            ifname: "eth0".into(),
        },
        pod: Pod::default(),
        netns: "/var/run/netns/x".into(),
        addresses: vec![addr],
        created_at_ms: 1,
    }
}

/// A change set like an Add's or a Del's, chosen by `pick`.
fn random_change_set(pick: u32, i: u32) -> Vec<Change> {
    let addr = IpAddr::from([10, 0, (pick % 7) as u8, (pick % 200) as u8 + 1]);
    let container = format!("c{}", pick % 40);
    match pick % 3 {
        0 | 1 => vec![
            Change::PutAttachment(attachment(&container, addr)),
            Change::DeleteIdle {
                network: "n".into(),
                ip: addr,
            },
            Change::PutCursor {
                network: "n".into(),
                set: 0,
                cursor: Some(addr),
            },
        ],
        _ => vec![
            Change::DeleteAttachment(attachment(&container, addr).key),
            Change::PutIdle {
                network: "n".into(),
                ip: addr,
                released_at: u64::from(i),
            },
        ],
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(12))]

    /// Crashes at random moments, with log files small enough to switch every few flushes, and
    /// the store that recovered from one crash going on to the next: after each, the store
    /// holds exactly what was flushed (here, everything applied: every crash follows a flush).
    #[test]
    fn a_crash_after_a_flush_loses_nothing_and_replays_nothing_stale(
        steps in proptest::collection::vec(
            (0u32..1000, 1u32..6, proptest::bool::weighted(0.15), proptest::bool::weighted(0.3)),
            20..120,
        ),
    ) {
        let root = tempfile::tempdir().expect("tempdir");
        let mut generation = 0;
        let mut dir = root.path().join("g0");
        let mut store = SledStore::open_with_log_capacity(&dir, 700).expect("open");
        let model = MemStore::new();
        for (i, (pick, sets, crash, hold)) in steps.into_iter().enumerate() {
            // Held, the checkpoint thread leaves sled unflushed: a crash then needs the log's
            // records after the last durable checkpoint, in both files.
            store.pause_checkpoints(hold);
            for k in 0..sets {
                let changes = random_change_set(pick.wrapping_mul(31).wrapping_add(k), i as u32);
                store.apply(&changes).expect("apply");
                model.apply(&changes).expect("apply");
            }
            store.flush().expect("flush");
            if crash {
                generation += 1;
                let next = root.path().join(format!("g{generation}"));
                crash_copy(&dir, &next);
                drop(store);
                store = SledStore::open_with_log_capacity(&next, 700).expect("open after the crash");
                dir = next;
                proptest::prop_assert_eq!(
                    canonical(store.load().expect("load")),
                    canonical(model.load().expect("load"))
                );
            }
        }
    }
}

/// The log alone carries what sled had not flushed: a crash copy right after a flush opens with
/// it, and a clean close leaves nothing to replay.
#[test]
fn the_log_carries_writes_sled_has_not_flushed() {
    let root = tempfile::tempdir().expect("tempdir");
    let live = root.path().join("live");
    let s = SledStore::open(&live).expect("open");
    s.apply(&sample()).expect("apply");
    s.flush().expect("flush");
    crash_copy(&live, &root.path().join("crashed"));
    // Not flushed: a crash now loses it (and its reply never went out).
    s.apply(&[Change::PutBootId("unflushed".into())])
        .expect("apply");
    crash_copy(&live, &root.path().join("crashed-later"));
    let crashed = SledStore::open(&root.path().join("crashed")).expect("open the copy");
    assert_eq!(
        canonical(crashed.load().expect("load")),
        model_of(&[&sample()])
    );
    let later = SledStore::open(&root.path().join("crashed-later")).expect("open the copy");
    assert_eq!(
        later.load().expect("load").boot_id.as_deref(),
        Some("b-1"),
        "an unflushed write is not replayed"
    );
    drop(s);
    let raw = raw_sled(&live).expect("raw open");
    let boot = raw
        .open_tree("meta")
        .expect("tree")
        .get("boot_id")
        .expect("get")
        .expect("present");
    assert_eq!(boot.as_ref(), b"unflushed", "a clean close flushes sled");
}

/// A change set whose record was torn by the crash is not replayed at all (its reply never went
/// out: the flush did not finish), and the ones before it are.
#[test]
fn a_torn_record_is_left_out_whole() {
    let root = tempfile::tempdir().expect("tempdir");
    let live = root.path().join("live");
    let s = SledStore::open(&live).expect("open");
    let first = random_change_set(0, 1);
    let second = random_change_set(4, 2);
    s.apply(&first).expect("apply");
    s.flush().expect("flush");
    let end_of_first = s.log_offset();
    s.apply(&second).expect("apply");
    s.flush().expect("flush");
    let crashed = root.path().join("crashed");
    crash_copy(&live, &crashed);
    // Tear the second record: its last byte never reached the disk.
    let wal = open_log(&crashed.join("wal-0"));
    let end_of_second = s.log_offset();
    std::os::unix::fs::FileExt::write_all_at(&wal, &[0xff], end_of_second - 1).expect("tear");
    assert!(end_of_second > end_of_first);
    let opened = SledStore::open(&crashed).expect("open the copy");
    assert_eq!(canonical(opened.load().expect("load")), model_of(&[&first]));
}

/// A log that skips change sets after the checkpoint (acknowledged writes lost) stops the start,
/// naming the log.
#[test]
fn a_hole_in_the_log_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let live = root.path().join("live");
    let s = SledStore::open(&live).expect("open");
    for i in 0..3 {
        s.apply(&random_change_set(i, i)).expect("apply");
        s.flush().expect("flush");
    }
    let crashed = root.path().join("crashed");
    crash_copy(&live, &crashed);
    // Zero the first record's header: records 2 and 3 follow a checkpoint at 0 without 1.
    let wal = open_log(&crashed.join("wal-0"));
    std::os::unix::fs::FileExt::write_all_at(&wal, &[0u8; 24], 0).expect("zero");
    // The run of wal-0 now ends at once; move records 2 and 3 into wal-1 as the other run.
    let bytes = std::fs::read(live.join("wal-0")).expect("read");
    let first_len = 24 + u32::from_be_bytes(bytes[0..4].try_into().expect("4")) as usize;
    let end = s.log_offset() as usize;
    std::fs::write(crashed.join("wal-1"), &bytes[first_len..end]).expect("write wal-1");
    let e = SledStore::open(&crashed)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("wal-") && e.contains("corrupt"), "{e}");
    assert!(e.contains(&crashed.display().to_string()), "{e}");
}
