//! Stores of older schemas open and are brought to the current one, losing nothing.

use super::*;
use crate::store::codec;

fn record(container: &str, addr: &str) -> AttachmentRecord {
    AttachmentRecord {
        key: AttachmentKey {
            network: "n".into(),
            container_id: container.into(),
            ifname: "eth0".into(),
        },
        pod: Pod {
            namespace: "default".into(),
            name: container.into(),
            uid: String::new(),
        },
        netns: "/var/run/netns/x".into(),
        addresses: vec![ip(addr)],
        created_at_ms: 1,
        k8s: None,
    }
}

fn ops(changes: &[Change]) -> Vec<codec::Op> {
    codec::encode(changes).expect("encode")
}

/// A schema-4 store's log position: epoch 3, checkpoint 5.
const V4_META: &[(&str, u64)] = &[("wal_epoch", 3), ("wal_checkpoint", 5)];

fn schema_of(dir: &Path) -> Vec<u8> {
    raw_sled(dir)
        .expect("raw open")
        .open_tree("meta")
        .expect("tree")
        .get("schema_version")
        .expect("get")
        .expect("present")
        .to_vec()
}

/// A crash in a schema-3 store after the journal entry and part of its changes: the next
/// open finishes the change set, in order, and the store is marked current.
#[test]
fn a_schema_3_store_finishes_a_change_set_a_crash_interrupted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let change_set = [
        Change::PutAttachment(record("c1", "10.0.0.2")),
        Change::DeleteIdle {
            network: "n".into(),
            ip: ip("10.0.0.2"),
        },
        Change::DeleteAttachment(record("old", "10.0.0.9").key),
    ];
    {
        let db = old_store(dir.path(), 3, &[]);
        let tree = |n: &str| db.open_tree(n).expect("tree");
        for op in ops(&[
            Change::PutAttachment(record("old", "10.0.0.9")),
            Change::PutIdle {
                network: "n".into(),
                ip: ip("10.0.0.2"),
                released_at: 5,
            },
        ]) {
            let codec::Op::Put(idx, k, v) = op else {
                panic!("puts")
            };
            tree(codec::TREES[idx]).insert(k, v).expect("insert");
        }
        let ops = ops(&change_set);
        tree("journal")
            .insert(41u64.to_be_bytes(), codec::encode_entry(&ops))
            .expect("insert");
        // The crash came right after the first of the three changes.
        let codec::Op::Put(idx, k, v) = &ops[0] else {
            panic!("first op is a put")
        };
        tree(codec::TREES[*idx])
            .insert(k.as_slice(), v.as_slice())
            .expect("insert");
        db.flush().expect("flush");
    }
    let s = SledStore::open(dir.path()).expect("open");
    let snap = s.load().expect("load");
    let containers: Vec<&str> = snap
        .attachments
        .iter()
        .map(|a| a.key.container_id.as_str())
        .collect();
    assert_eq!(containers, ["c1"]);
    assert!(snap.idle.is_empty(), "{:?}", snap.idle);
    drop(s);
    assert_eq!(schema_of(dir.path()), SCHEMA_VERSION.to_be_bytes());
    let db = raw_sled(dir.path()).expect("raw open");
    assert!(db.open_tree("journal").expect("tree").is_empty());
}

#[test]
fn a_corrupt_journal_entry_is_refused_naming_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let db = old_store(dir.path(), 3, &[]);
        db.open_tree("journal")
            .expect("tree")
            .insert(0u64.to_be_bytes(), vec![7u8, 0, 0])
            .expect("insert");
        db.flush().expect("flush");
    }
    let e = SledStore::open(dir.path())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("journal") && e.contains(&dir.path().display().to_string()),
        "{e}"
    );
}

/// A schema-4 store (log files without a header) replays the records its checkpoint does not
/// cover, then gets log files of the current format; a record of an older epoch stays out.
#[test]
fn a_schema_4_store_replays_its_log_and_gets_new_log_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let db = old_store(dir.path(), 4, V4_META);
        db.open_tree("idle")
            .expect("tree")
            .insert("n\u{0}10.0.0.7", &9u64.to_be_bytes())
            .expect("insert");
        db.flush().expect("flush");
    }
    let mut log = Vec::new();
    let entry = |c: &[Change]| codec::encode_entry(&ops(c));
    wal::v4::encode_record(&mut log, 3, 5, &entry(&[Change::PutBootId("old".into())]));
    wal::v4::encode_record(
        &mut log,
        3,
        6,
        &entry(&[Change::PutAttachment(record("x", "10.0.0.7"))]),
    );
    wal::v4::encode_record(
        &mut log,
        3,
        7,
        &entry(&[Change::DeleteIdle {
            network: "n".into(),
            ip: ip("10.0.0.7"),
        }]),
    );
    std::fs::write(dir.path().join("wal-0"), &log).expect("write");
    let mut stale = Vec::new();
    wal::v4::encode_record(
        &mut stale,
        2,
        8,
        &entry(&[Change::PutBootId("stale".into())]),
    );
    std::fs::write(dir.path().join("wal-1"), &stale).expect("write");

    let s = SledStore::open(dir.path()).expect("a schema-4 store opens");
    let snap = s.load().expect("load");
    assert_eq!(snap.attachments.len(), 1);
    assert!(snap.idle.is_empty(), "{:?}", snap.idle);
    assert_eq!(
        snap.boot_id, None,
        "5 is covered by the checkpoint, 8 is stale"
    );
    drop(s);
    assert_eq!(schema_of(dir.path()), SCHEMA_VERSION.to_be_bytes());
    for f in ["wal-0", "wal-1"] {
        let file = std::fs::File::open(dir.path().join(f)).expect("open");
        wal::Header::read(&file).unwrap_or_else(|e| panic!("{f}: {e}"));
    }
    // And it keeps working in the new format across a restart.
    let s = SledStore::open(dir.path()).expect("reopen");
    s.append(&[Change::PutBootId("new".into())])
        .expect("append");
    s.flush().expect("flush");
    drop(s);
    let s = SledStore::open(dir.path()).expect("reopen");
    let snap = s.load().expect("load");
    assert_eq!(snap.boot_id.as_deref(), Some("new"));
    assert_eq!(snap.attachments.len(), 1);
}

/// A schema-4 migration that fails after its first new log file (here: the second cannot be
/// created) and is run again: the change sets it replayed stay, and the old file's older
/// records are not replayed over them (the replay's checkpoint is stored with it).
#[test]
fn a_schema_4_migration_interrupted_between_its_new_files_keeps_every_change_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let db = old_store(dir.path(), 4, V4_META);
        db.flush().expect("flush");
    }
    let entry = |c: &[Change]| codec::encode_entry(&ops(c));
    // The older cycle in wal-1, the newer in wal-0: x is attached, then detached.
    let mut older = Vec::new();
    wal::v4::encode_record(
        &mut older,
        3,
        6,
        &entry(&[Change::PutAttachment(record("x", "10.0.0.7"))]),
    );
    std::fs::write(dir.path().join("wal-1"), &older).expect("write");
    let mut newer = Vec::new();
    wal::v4::encode_record(
        &mut newer,
        3,
        7,
        &entry(&[Change::DeleteAttachment(record("x", "10.0.0.7").key)]),
    );
    std::fs::write(dir.path().join("wal-0"), &newer).expect("write");
    // wal-1's new file cannot be made: the migration stops after wal-0's.
    let obstacle = dir.path().join("wal-1.new");
    std::fs::create_dir(&obstacle).expect("mkdir");
    assert!(SledStore::open(dir.path()).is_err());
    std::fs::remove_dir(&obstacle).expect("rmdir");
    let s = SledStore::open(dir.path()).expect("the migration finishes");
    let snap = s.load().expect("load");
    assert!(
        snap.attachments.is_empty(),
        "change set 6 replayed over 7: {:?}",
        snap.attachments
    );
}
