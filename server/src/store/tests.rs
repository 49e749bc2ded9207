use super::*;
use crate::model::{Origin, Sticky, Tuning};
use crate::range::RangeSpec;
use std::path::Path;

mod log;
mod migrate;

fn net(name: &str) -> NetworkDef {
    NetworkDef {
        name: name.into(),
        range_sets: vec![vec![RangeSpec {
            subnet: "10.0.0.0/24".into(),
            range_start: None,
            range_end: None,
            gateway: None,
        }]],
        routes: Vec::new(),
        tuning: Tuning {
            min_idle: 0,
            max_idle: 64,
            capacity: None,
            cooldown_secs: 130,
            source_rate: 1000.0,
            source_burst: 256,
            sticky: Sticky::default(),
            sticky_ttl_secs: 600,
        },
        origin: Origin::Cni,
        set_pools: Default::default(),
        subnet_mode: None,
        cluster_pools: Vec::new(),
        retiring: Vec::new(),
    }
}

pub(super) fn ip(s: &str) -> IpAddr {
    s.parse().expect("test address")
}

pub(super) fn sample() -> Vec<Change> {
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
            k8s: Some(crate::model::PodMeta {
                owner: "StatefulSet/web".into(),
                sticky: true,
                sticky_ttl_secs: Some(30),
                fixed: None,
            }),
        }),
        Change::PutIdle {
            network: "n".into(),
            ip: ip("10.0.0.3"),
            released_at: 99,
        },
        Change::PutCursor {
            network: "n".into(),
            set: "10.0.0.1-10.0.0.254".into(),
            cursor: Some(ip("10.0.0.3")),
        },
        Change::PutReservation(reservation()),
        Change::PutBootId("b-1".into()),
        Change::PutDrain {
            network: "n".into(),
            drained: true,
        },
        Change::PutTakenOver("n".into()),
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
        pod_uid: Some("u9".into()),
        reason: "sticky pod released: CNI DEL".into(),
    }
}

fn check_roundtrip(store: &dyn Store) {
    store.append(&sample()).expect("append");
    store.flush().expect("flush");
    let snap = store.load().expect("load");
    assert_eq!(snap.networks, vec![net("n")]);
    assert_eq!(snap.attachments.len(), 1);
    assert_eq!(snap.attachments[0].pod.name, "web-0");
    assert_eq!(snap.idle, vec![("n".to_string(), ip("10.0.0.3"), 99)]);
    assert_eq!(
        snap.cursors,
        vec![(
            "n".to_string(),
            "10.0.0.1-10.0.0.254".to_string(),
            ip("10.0.0.3")
        )]
    );
    assert_eq!(snap.reservations, vec![reservation()]);
    assert_eq!(snap.boot_id.as_deref(), Some("b-1"));
    assert_eq!(snap.drained, vec!["n".to_string()]);
    assert_eq!(snap.taken_over, vec!["n".to_string()]);
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
        .append(&[
            Change::DeleteAttachment(key),
            Change::DeleteIdle {
                network: "n".into(),
                ip: ip("10.0.0.3"),
            },
            Change::PutCursor {
                network: "n".into(),
                set: "10.0.0.1-10.0.0.254".into(),
                cursor: None,
            },
            Change::DeleteReservation(reservation().key),
            Change::PutBootId("b-2".into()),
            Change::PutDrain {
                network: "n".into(),
                drained: false,
            },
        ])
        .expect("append");
    store.flush().expect("flush");
    let snap = store.load().expect("load");
    assert!(snap.attachments.is_empty() && snap.idle.is_empty() && snap.cursors.is_empty());
    assert!(snap.reservations.is_empty() && snap.drained.is_empty());
    assert_eq!(snap.boot_id.as_deref(), Some("b-2"));
    assert_eq!(snap.taken_over, vec!["n".to_string()], "for good");
}

#[test]
fn sled_store_reads_a_version_1_store_and_marks_it_current() {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let db = old_store(dir.path(), 1, &[]);
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

/// A crash keeps what was flushed and loses what was only appended.
#[test]
fn a_crashed_mem_store_holds_what_was_durable() {
    let s = MemStore::new();
    s.append(&[Change::PutNetwork(net("a"))]).unwrap();
    s.flush().unwrap();
    s.append(&[Change::PutNetwork(net("b"))]).unwrap();
    let after = s.crashed();
    let names: Vec<String> = after
        .load()
        .unwrap()
        .networks
        .into_iter()
        .map(|n| n.name)
        .collect();
    assert_eq!(names, vec!["a".to_string()]);
    // It goes on from there.
    let seq = after.append(&[Change::PutNetwork(net("c"))]).unwrap();
    assert_eq!(after.flush().unwrap(), seq);
    assert_eq!(after.load().unwrap().networks.len(), 2);
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
        s.append(&sample()).expect("append");
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
        let db = old_store(dir.path(), SCHEMA_VERSION + 1, &[]);
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
pub(super) fn raw_sled(dir: &Path) -> sled::Result<sled::Db> {
    trees::open_waiting(
        &sled::Config::new()
            .path(dir.join("db"))
            .flush_every_ms(None),
    )
}

/// A store as an older (or newer) ipoold left it: sled opened directly with its schema version
/// and these u64 `meta` keys set. The caller adds what else it needs, then flushes.
pub(super) fn old_store(dir: &Path, schema: u32, meta: &[(&str, u64)]) -> sled::Db {
    let db = raw_sled(dir).expect("raw open");
    let tree = db.open_tree("meta").expect("tree");
    tree.insert("schema_version", &schema.to_be_bytes())
        .expect("insert");
    for (k, v) in meta {
        tree.insert(k, &v.to_be_bytes()).expect("insert");
    }
    db
}

/// Drop and reopen at once, many times, as ipoold's start-up does (read through one handle,
/// serve through the next): sled's I/O threads may hold its file, and so its lock, for a moment
/// after a handle is dropped; opening waits for them instead of failing.
#[test]
fn sled_store_reopens_right_after_a_drop() {
    let dir = tempfile::tempdir().expect("tempdir");
    for i in 0..200u64 {
        let s = SledStore::open(dir.path()).expect("reopen right after a drop");
        s.append(&[Change::PutIdle {
            network: "n".into(),
            ip: ip("10.0.0.9"),
            released_at: i,
        }])
        .expect("append");
        s.flush().expect("flush");
    }
    let s = SledStore::open(dir.path()).expect("open");
    assert_eq!(
        s.load().expect("load").idle,
        vec![("n".to_string(), ip("10.0.0.9"), 199)]
    );
}

/// Schema-5 and schema-6 stores are read as they are (the log is the same) and marked with the
/// current schema, so that an older ipoold refuses them by their schema (a 5 reader would call
/// the log damaged, a 6 reader drop what a cluster pool's network says of its pools).
#[test]
fn schema_5_and_6_stores_open_and_are_marked_current() {
    for old in [5u32, 6] {
        let dir = tempfile::tempdir().expect("tempdir");
        {
            let s = SledStore::open(dir.path()).expect("open");
            s.append(&[Change::PutNetwork(net("n"))]).expect("append");
            s.flush().expect("flush");
        }
        {
            let db = raw_sled(dir.path()).expect("raw open");
            db.open_tree("meta")
                .expect("tree")
                .insert("schema_version", &old.to_be_bytes())
                .expect("insert");
            db.flush().expect("flush");
        }
        let s = SledStore::open(dir.path()).expect("reopen");
        assert_eq!(s.load().expect("load").networks, vec![net("n")]);
        drop(s);
        let db = raw_sled(dir.path()).expect("raw open");
        let v = db
            .open_tree("meta")
            .expect("tree")
            .get("schema_version")
            .expect("get");
        assert_eq!(v.as_deref(), Some(&SCHEMA_VERSION.to_be_bytes()[..]));
    }
}
