//! Races and restarts found by reading the engine: each was a way to lose
//! or leak an address.

use super::*;

/// The runtime builds its list of valid attachments before it calls GC: an ADD that finished
/// in between is not on it, and must survive (`[cni] gc_grace_secs`, 60 s by default).
#[tokio::test]
async fn gc_spares_attachments_younger_than_the_grace() {
    let rig = Rig::new("");
    rig.ipam.add(req("g", "old", V4)).await.expect("add");
    rig.clock.advance(59_000);
    rig.ipam.add(req("g", "new", V4)).await.expect("add");
    let none = std::collections::HashSet::new();
    assert!(
        rig.ipam.gc("g", &none).await.expect("gc").is_empty(),
        "both are younger than 60 s"
    );
    rig.clock.advance(1_000);
    let released = rig.ipam.gc("g", &none).await.expect("gc");
    let keys: Vec<&str> = released
        .iter()
        .map(|r| r.key.container_id.as_str())
        .collect();
    assert_eq!(keys, ["old"], "only the one older than the grace");
    rig.clock.advance(59_000);
    assert_eq!(rig.ipam.gc("g", &none).await.expect("gc").len(), 1);
    assert!(rig.ipam.attachments(Some("g")).is_empty());
}

/// `capacity` lowered below what a pool already holds: the restart keeps every attachment
/// (they are real pods), and new ADDs wait until the pool is back under the capacity.
#[tokio::test]
async fn a_capacity_lowered_below_what_is_held_does_not_refuse_the_restart() {
    let rig = Rig::new("");
    for c in ["a", "b", "c"] {
        rig.ipam.add(req("n", c, V4)).await.expect("add");
    }
    let lowered = DaemonConfig::parse("[defaults]\ncapacity = 2").expect("config");
    let ipam = Ipam::open(
        rig.store.clone(),
        rig.clock.clone(),
        &lowered,
        Some("boot-1"),
    )
    .expect("the restart keeps what is held");
    for (c, addr) in [("a", "10.1.0.2"), ("b", "10.1.0.3"), ("c", "10.1.0.4")] {
        ipam.check(&key("n", c), &[ip(addr)]).expect("still held");
    }
    let full = ipam
        .add(req("n", "d", V4))
        .await
        .expect_err("over capacity");
    assert!(
        matches!(
            full,
            Error::Refused {
                refusal: crate::error::Refusal::PoolExhausted,
                ..
            }
        ),
        "{full}"
    );
    ipam.del(&key("n", "a")).await.expect("del");
    ipam.del(&key("n", "b")).await.expect("del");
    ipam.add(req("n", "d", V4))
        .await
        .expect("under the capacity again");
}

/// A network redefined (its ranges changed while nothing is attached) keeps the addresses that
/// are still cooling, where the new ranges still cover them: they are not handed out again
/// before their cooldown.
#[tokio::test]
async fn redefining_a_network_keeps_its_cooling_addresses() {
    let rig = Rig::new("");
    let first = ips(&rig.ipam.add(req("n", "a", V4)).await.expect("add"))[0];
    rig.ipam.del(&key("n", "a")).await.expect("del");
    let narrower = r#"{"subnet":"10.1.0.0/24","rangeEnd":"10.1.0.20"}"#;
    let b = ips(&rig.ipam.add(req("n", "b", narrower)).await.expect("add"))[0];
    assert_ne!(b, first, "the cooling address was handed out again");
    let st = &rig.ipam.pool_status(Some("n"))[0];
    assert_eq!((st.in_use, st.cooling), (1, 1), "{st:?}");
}

/// A source's cursor is stored under its range set's id (its ranges), not its position among
/// the network's sets; one stored by position (before schema 5) is read and moved to the id.
#[tokio::test]
async fn a_cursor_is_kept_by_its_range_sets_id_and_old_positions_move_to_it() {
    let rig = Rig::new("");
    rig.ipam.add(req("n", "a", V4)).await.expect("add");
    let cursors = || rig.store.load().expect("load").cursors;
    let id = "10.1.0.1-10.1.0.254".to_string();
    assert_eq!(cursors(), vec![("n".into(), id.clone(), ip("10.1.0.2"))]);
    // As a schema-4 store would hold it: by position.
    rig.store
        .append(&[
            Change::PutCursor {
                network: "n".into(),
                set: id.clone(),
                cursor: None,
            },
            Change::PutCursor {
                network: "n".into(),
                set: "0".into(),
                cursor: Some(ip("10.1.0.9")),
            },
        ])
        .expect("append");
    rig.store.flush().expect("flush");
    let ipam = rig.reopen().expect("reopen");
    assert_eq!(
        cursors(),
        vec![("n".into(), id.clone(), ip("10.1.0.9"))],
        "the position's cursor moved to the id"
    );
    let next = ipam.add(req("n", "b", V4)).await.expect("add");
    assert_eq!(ips(&next), vec![ip("10.1.0.10")]);
}
