//! The write-ahead log in front of sled (sled_store's module docs): crashes, damage, failures.

use super::*;

/// Copies a live store's files: what a crash of the process at this moment leaves on disk
/// (sled's unflushed writes are in its memory, not in the files).
pub(super) fn crash_copy(from: &Path, to: &Path) {
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
        m.append(c).expect("append");
    }
    m.flush().expect("flush");
    canonical(m.load().expect("load"))
}

/// A log file of a crash copy, opened to damage it.
fn open_log(path: &Path) -> std::fs::File {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open the log file")
}

fn write_at(path: &Path, bytes: &[u8], at: u64) {
    std::os::unix::fs::FileExt::write_all_at(&open_log(path), bytes, at).expect("write");
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
        k8s: None,
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
                set: "10.0.0.1-10.0.0.254".into(),
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
    /// holds exactly what was flushed, and nothing appended after the last flush.
    #[test]
    fn a_crash_after_a_flush_loses_nothing_and_replays_nothing_stale(
        steps in proptest::collection::vec(
            (0u32..1000, 1u32..6, proptest::bool::weighted(0.15), proptest::bool::weighted(0.3),
             proptest::bool::weighted(0.2)),
            20..120,
        ),
    ) {
        let root = tempfile::tempdir().expect("tempdir");
        let mut generation = 0;
        let mut dir = root.path().join("g0");
        let mut store = SledStore::open_with_log_capacity(&dir, 700).expect("open");
        let model = MemStore::new();
        for (i, (pick, sets, crash, hold, trailing)) in steps.into_iter().enumerate() {
            // Held, the applier leaves sled behind: a crash then needs the log's records
            // after the last durable checkpoint, in both files.
            store.pause_applier(hold);
            for k in 0..sets {
                let changes = random_change_set(pick.wrapping_mul(31).wrapping_add(k), i as u32);
                store.append(&changes).expect("append");
                model.append(&changes).expect("append");
            }
            store.flush().expect("flush");
            model.flush().expect("flush");
            if trailing {
                // Appended, never flushed: never acknowledged, so never durable.
                store.append(&random_change_set(pick ^ 0x55, 9)).expect("append");
            }
            if crash {
                generation += 1;
                let next = root.path().join(format!("g{generation}"));
                crash_copy(&dir, &next);
                store.pause_applier(false);
                drop(store);
                store = SledStore::open_with_log_capacity(&next, 700).expect("open after the crash");
                dir = next;
                proptest::prop_assert_eq!(
                    canonical(store.load().expect("load")),
                    canonical(model.load().expect("load"))
                );
            } else if trailing {
                // The live store: flush the trailing one, as the engine would, in both.
                store.flush().expect("flush");
                model.append(&random_change_set(pick ^ 0x55, 9)).expect("append");
                model.flush().expect("flush");
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
    s.append(&sample()).expect("append");
    s.flush().expect("flush");
    crash_copy(&live, &root.path().join("crashed"));
    // Not flushed: a crash now loses it (and its reply never went out).
    s.append(&[Change::PutBootId("unflushed".into())])
        .expect("append");
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

/// sled trails the log: a change set that no flush made durable never reaches sled's files,
/// not even when a checkpoint (which flushes sled) runs after it was appended. (Before, change
/// sets went into sled's trees as they were applied, a checkpoint flushed them, and a crash
/// then kept writes whose replies never went out, or had said they failed.)
#[test]
fn a_checkpoint_never_makes_an_unflushed_change_set_durable() {
    let root = tempfile::tempdir().expect("tempdir");
    let live = root.path().join("live");
    let s = SledStore::open_with_log_capacity(&live, 600).expect("open");
    s.pause_applier(true);
    let mut flushed = Vec::new();
    // Fill the first log file: the log then wants a checkpoint, which the applier (held
    // back) has not made yet.
    for i in 0u32.. {
        let c = random_change_set(i * 3, i);
        s.append(&c).expect("append");
        s.flush().expect("flush");
        flushed.push(c);
        if s.log_position().1 >= wal::HEADER_LEN + 600 {
            break;
        }
    }
    s.append(&[Change::PutBootId("never-flushed".into())])
        .expect("append");
    // The applier catches up and checkpoints: sled is flushed.
    s.pause_applier(false);
    crash_copy(&live, &root.path().join("crashed"));
    let crashed = SledStore::open_with_log_capacity(&root.path().join("crashed"), 600)
        .expect("open the copy");
    let refs: Vec<&[Change]> = flushed.iter().map(Vec::as_slice).collect();
    assert_eq!(canonical(crashed.load().expect("load")), model_of(&refs));
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
    s.append(&first).expect("append");
    s.flush().expect("flush");
    let end_of_first = s.log_position().1;
    s.append(&second).expect("append");
    s.flush().expect("flush");
    let crashed = root.path().join("crashed");
    crash_copy(&live, &crashed);
    // Tear the second record: its last byte never reached the disk.
    let end_of_second = s.log_position().1;
    write_at(&crashed.join("wal-0"), &[0xff], end_of_second - 1);
    assert!(end_of_second > end_of_first);
    let opened = SledStore::open(&crashed).expect("open the copy");
    assert_eq!(canonical(opened.load().expect("load")), model_of(&[&first]));
}

/// A power loss in the middle of a flush's write may leave any of its records on disk: a
/// damaged record followed by whole ones of the same (last) flush is a torn write, and none of
/// that flush is replayed.
#[test]
fn a_torn_last_flush_with_a_later_record_intact_is_left_out() {
    let root = tempfile::tempdir().expect("tempdir");
    let live = root.path().join("live");
    let s = SledStore::open(&live).expect("open");
    let first = random_change_set(0, 1);
    s.append(&first).expect("append");
    s.flush().expect("flush");
    let start_of_batch = s.log_position().1;
    // Three change sets in one flush.
    for i in 0..3 {
        s.append(&random_change_set(3 * i + 1, i)).expect("append");
    }
    s.flush().expect("flush");
    let crashed = root.path().join("crashed");
    crash_copy(&live, &crashed);
    // The batch's first record lost a byte; the two after it reached the disk whole.
    write_at(&crashed.join("wal-0"), &[0xff; 4], start_of_batch + 40);
    let opened = SledStore::open(&crashed).expect("a torn last flush is tolerated");
    assert_eq!(canonical(opened.load().expect("load")), model_of(&[&first]));
}

/// Damage in the middle of the log, with whole records of later flushes after it, means
/// acknowledged change sets are lost: the start is refused, naming the file. (Before, the
/// daemon started with what came before the damage, and handed out addresses that live pods
/// held.)
#[test]
fn damage_followed_by_later_flushes_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let live = root.path().join("live");
    let s = SledStore::open(&live).expect("open");
    let mut middle = 0;
    for i in 0..30u32 {
        s.append(&random_change_set(i * 3, i)).expect("append");
        s.flush().expect("flush");
        if i == 10 {
            middle = s.log_position().1;
        }
    }
    let crashed = root.path().join("crashed");
    crash_copy(&live, &crashed);
    write_at(&crashed.join("wal-0"), &[0x5a], middle + 50);
    let e = SledStore::open(&crashed)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("corrupt") && e.contains("damaged"), "{e}");
    assert!(
        e.contains(&crashed.join("wal-0").display().to_string()),
        "{e}"
    );
}

/// A log that skips change sets after the checkpoint (acknowledged writes lost) stops the start,
/// naming the log.
#[test]
fn a_hole_in_the_log_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let live = root.path().join("live");
    let s = SledStore::open(&live).expect("open");
    s.pause_applier(true);
    let mut ends = Vec::new();
    for i in 0..3 {
        s.append(&random_change_set(i, i)).expect("append");
        s.flush().expect("flush");
        ends.push(s.log_position().1);
    }
    let crashed = root.path().join("crashed");
    crash_copy(&live, &crashed);
    s.pause_applier(false);
    // Move records 2 and 3 into wal-1, and zero wal-0's records: 2 and 3 follow the
    // checkpoint without 1.
    let bytes = std::fs::read(live.join("wal-0")).expect("read");
    let header = wal::HEADER_LEN as usize;
    let moved = &bytes[ends[0] as usize..ends[2] as usize];
    write_at(&crashed.join("wal-1"), moved, wal::HEADER_LEN);
    write_at(
        &crashed.join("wal-0"),
        &vec![0u8; ends[2] as usize - header],
        wal::HEADER_LEN,
    );
    let e = SledStore::open(&crashed)
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("wal-") && e.contains("corrupt"), "{e}");
    assert!(e.contains(&crashed.display().to_string()), "{e}");
}

/// Missing or foreign files never mean a silent empty start.
#[test]
fn missing_or_foreign_files_are_refused_naming_them() {
    let root = tempfile::tempdir().expect("tempdir");
    let live = root.path().join("live");
    {
        let s = SledStore::open(&live).expect("open");
        s.append(&sample()).expect("append");
        s.flush().expect("flush");
    }
    let case = |name: &str, damage: &dyn Fn(&Path)| -> String {
        let dir = root.path().join(name);
        crash_copy(&live, &dir);
        damage(&dir);
        SledStore::open(&dir)
            .err()
            .unwrap_or_else(|| panic!("{name}: the start was not refused"))
            .to_string()
    };
    let e = case("no-wal", &|d| {
        std::fs::remove_file(d.join("wal-0")).expect("rm")
    });
    assert!(e.contains("wal-0") && e.contains("missing"), "{e}");
    let e = case("no-db", &|d| {
        std::fs::remove_dir_all(d.join("db")).expect("rm")
    });
    assert!(
        e.contains("database is missing") && e.contains("wal-"),
        "{e}"
    );
    let e = case("empty-db", &|d| {
        std::fs::remove_dir_all(d.join("db")).expect("rm");
        drop(raw_sled(d).expect("a new, empty database"));
    });
    assert!(e.contains("belongs to a database that is gone"), "{e}");
    let e = case("truncated", &|d| {
        let f = open_log(&d.join("wal-1"));
        f.set_len(wal::HEADER_LEN + 100).expect("truncate");
    });
    assert!(e.contains("wal-1") && e.contains("truncated"), "{e}");
    let e = case("zeroed-header", &|d| {
        write_at(&d.join("wal-0"), &[0u8; 64], 0)
    });
    assert!(e.contains("wal-0") && e.contains("header"), "{e}");
    let other = root.path().join("other");
    drop(SledStore::open(&other).expect("another store"));
    let e = case("foreign", &|d| {
        std::fs::copy(other.join("wal-1"), d.join("wal-1")).expect("copy");
    });
    assert!(e.contains("wal-1") && e.contains("belongs to store"), "{e}");
    // A state dir that never held anything starts empty, as it should.
    let fresh = SledStore::open(&root.path().join("fresh")).expect("a new store");
    assert_eq!(fresh.load().expect("load"), Snapshot::default());
}

/// A failed write of the log fails the store: the change sets it did not make durable never
/// become durable (not by a later flush, not by a reopen), every call fails until the store is
/// reopened, and the reopened store holds exactly what was durable. (Before, the records were
/// queued again and a later flush made writes durable whose replies had said they failed.)
#[test]
fn a_failed_log_write_keeps_nothing_it_did_not_make_durable() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("s");
    let s = SledStore::open(&dir).expect("open");
    let durable = random_change_set(0, 1);
    s.append(&durable).expect("append");
    let first = s.flush().expect("flush");
    let lost = random_change_set(4, 2);
    let lost_seq = s.append(&lost).expect("append");
    assert!(lost_seq > first);
    s.inject_log_error();
    let e = s.flush().expect_err("the write fails").to_string();
    assert!(e.contains("failed") && e.contains("wal-0"), "{e}");
    // A crash before the reopen: the failed flush's records were erased, not replayed.
    let crashed = root.path().join("crashed");
    crash_copy(&dir, &crashed);
    let c = SledStore::open(&crashed).expect("open the copy");
    assert_eq!(canonical(c.load().expect("load")), model_of(&[&durable]));
    drop(c);
    // Failed: nothing more is taken or flushed.
    assert!(s.append(&random_change_set(7, 3)).is_err());
    assert!(s.flush().is_err());
    s.reopen().expect("reopen");
    assert_eq!(canonical(s.load().expect("load")), model_of(&[&durable]));
    // Numbers go on above the lost one; new change sets are durable as usual.
    let next = random_change_set(9, 4);
    assert!(s.append(&next).expect("append") > lost_seq);
    s.flush().expect("flush");
    drop(s);
    // A restart (the lost record may be whole on disk: the write failed, not the disk)
    // still does not bring it back.
    let again = SledStore::open(&dir).expect("open");
    assert_eq!(
        canonical(again.load().expect("load")),
        model_of(&[&durable, &next])
    );
}

/// With `checkpoint_every`, the store checkpoints on its own while change sets come in: once
/// it has, sled holds them durably and the log records before it are no longer read (here,
/// wiped in the crash copy). Without it, nothing is checkpointed until a log file fills.
#[test]
fn the_store_checkpoints_on_its_own_every_interval() {
    let root = tempfile::tempdir().expect("tempdir");
    let open = |dir: &Path, every: Option<std::time::Duration>| {
        SledStore::open_with(
            dir,
            StoreOptions {
                checkpoint_every: every,
                ..StoreOptions::default()
            },
        )
        .expect("open")
    };
    let periodic = root.path().join("periodic");
    let never = root.path().join("never");
    let a = open(&periodic, Some(std::time::Duration::from_millis(50)));
    let b = open(&never, None);
    let changes = sample();
    for s in [&a, &b] {
        s.append(&changes).expect("append");
        s.flush().expect("flush");
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while a.checkpointed() < 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint in 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(b.checkpointed(), 0, "no checkpoint without an interval");
    let crashed = root.path().join("crashed");
    crash_copy(&periodic, &crashed);
    let (_, end) = a.log_position();
    write_at(
        &crashed.join("wal-0"),
        &vec![0; (end - wal::HEADER_LEN) as usize],
        wal::HEADER_LEN,
    );
    let opened = SledStore::open(&crashed).expect("open the copy");
    assert_eq!(
        canonical(opened.load().expect("load")),
        model_of(&[&changes])
    );
}

/// A reopen of a store that has not failed (the engine rebuilds after an internal error):
/// the change set appended but not flushed is dropped, the next flush says so (it reports the
/// last durable one), the close writes nothing, and what was durable stays.
#[test]
fn a_reopen_without_a_failure_drops_only_what_was_not_flushed() {
    let root = tempfile::tempdir().expect("tempdir");
    let s = SledStore::open(root.path()).expect("open");
    let kept = s.append(&sample()).expect("append");
    assert_eq!(s.flush().expect("flush"), kept);
    let dropped = s
        .append(&[Change::PutBootId("dropped".into())])
        .expect("append");
    s.reopen().expect("reopen");
    assert_eq!(s.flush().expect("flush"), kept, "{dropped} is not durable");
    let later = s
        .append(&[Change::PutBootId("later".into())])
        .expect("append");
    assert!(later > dropped, "numbers go on above the dropped one");
    assert_eq!(s.flush().expect("flush"), later);
    drop(s);
    let s = SledStore::open(root.path()).expect("reopen");
    let mut want = sample();
    want.push(Change::PutBootId("later".into()));
    assert_eq!(canonical(s.load().expect("load")), model_of(&[&want]));
}
