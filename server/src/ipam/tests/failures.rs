//! The store failing under the engine: a refused write, a failed flush, a failure the store
//! meets on its own; what is served meanwhile, and the rebuild once it is reopened.

use super::*;

#[tokio::test]
async fn failed_store_write_changes_nothing() {
    let rig = Rig::new("");
    rig.ipam.add(req("n", "a", V4)).await.expect("add");
    rig.store.fail_writes(true);
    assert!(matches!(
        rig.ipam.add(req("n", "b", V4)).await,
        Err(Error::Store(_))
    ));
    assert!(matches!(
        rig.ipam.del(&key("n", "a")).await,
        Err(Error::Store(_))
    ));
    let st = &rig.ipam.pool_status(None)[0];
    assert_eq!((st.in_use, st.idle), (1, 0));
    rig.ipam
        .check(&key("n", "a"), &[ip("10.1.0.2")])
        .expect("still held");
    rig.store.fail_writes(false);
    let b = ips(&rig.ipam.add(req("n", "b", V4)).await.expect("add"))[0];
    assert_eq!(
        b,
        ip("10.1.0.3"),
        "the failed ADD did not move the source's cursor"
    );
}

/// A failed flush fails the store: the ADD waiting for it is answered with an error and is not
/// held; nothing changes until the store is reopened (STATUS and health say why); after the
/// rebuild, what was durable is served and the failed ADD's address is free again.
#[tokio::test]
async fn a_failed_flush_stops_changes_until_the_store_is_reopened() {
    let rig = Rig::new("");
    let health = rig.ipam.health();
    rig.ipam.add(req("n", "a", V4)).await.expect("add");
    rig.store.fail_flushes(true);
    let e = rig
        .ipam
        .add(req("n", "b", V4))
        .await
        .expect_err("not durable");
    assert!(
        matches!(e, Error::Store(crate::store::StoreError::Failed { .. })),
        "{e}"
    );
    let status = tonic::Status::from(e);
    assert_eq!(
        status.code(),
        tonic::Code::Unavailable,
        "retryable: {status}"
    );
    let why = rig.ipam.status("n", None).expect_err("STATUS says why");
    assert!(why.0.contains("store"), "{why}");
    assert!(!health.borrow().serving(), "health is NOT_SERVING");
    let del = rig.ipam.del(&key("n", "a")).await.expect_err("no change");
    assert_eq!(tonic::Status::from(del).code(), tonic::Code::Unavailable);
    // Still failing: the reopen fails too, and nothing changed.
    assert!(rig.ipam.recover_store().await.is_err());
    rig.store.fail_flushes(false);
    rig.ipam.recover_store().await.expect("reopened");
    assert!(health.borrow().serving());
    rig.ipam.status("n", None).expect("serving again");
    rig.ipam
        .check(&key("n", "a"), &[ip("10.1.0.2")])
        .expect("the durable one is held");
    assert!(
        rig.ipam.get(&key("n", "b")).is_none(),
        "the failed ADD is not"
    );
    let b = rig.ipam.add(req("n", "b", V4)).await.expect("add");
    assert_eq!(ips(&b), vec![ip("10.1.0.3")]);
}

/// A failure the store meets in its background work (sled's writes, a checkpoint) is seen by
/// STATUS, health and the next change, before any write of the engine's fails.
#[tokio::test]
async fn a_failure_the_store_meets_on_its_own_is_noticed() {
    let rig = Rig::new("");
    let health = rig.ipam.health();
    rig.ipam.add(req("n", "a", V4)).await.expect("add");
    rig.store.fail_now("flushing sled: No space left on device");
    let why = rig.ipam.status("n", None).expect_err("STATUS says why");
    assert!(why.0.contains("No space left on device"), "{why}");
    assert!(!health.borrow().serving());
    let (_, reason) = rig.ipam.store_failure().expect("a failure");
    assert!(reason.contains("No space"), "{reason}");
    rig.ipam.recover_store().await.expect("reopened");
    rig.ipam.status("n", None).expect("serving again");
    assert!(health.borrow().serving());
}
