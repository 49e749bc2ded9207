use super::*;
use crate::store::{MemStore, Snapshot};

use std::future::Future;

fn boot_change(i: u64) -> Vec<Change> {
    vec![Change::PutBootId(format!("b{i}"))]
}

/// A change set appended and then dropped by a reopen of the store (before any flush) is
/// reported lost to its waiter, never durable, and its waiter does not spin.
#[tokio::test]
async fn a_change_set_dropped_by_a_reopen_is_lost_not_durable() {
    let mem = Arc::new(MemStore::new());
    let c = Committer::new(mem.clone(), None);
    let kept = c.append(&boot_change(1)).expect("append");
    c.durable(kept).await.expect("durable");
    let dropped = c.append(&boot_change(2)).expect("append");
    mem.reopen().expect("reopen");
    let waited = tokio::time::timeout(Duration::from_secs(10), c.durable(dropped))
        .await
        .expect("the waiter is answered");
    let e = waited.expect_err("dropped, not durable");
    assert!(e.to_string().contains("reopened"), "{e}");
    assert_eq!(mem.load().expect("load").boot_id.as_deref(), Some("b1"));
    let next = c.append(&boot_change(3)).expect("append");
    c.durable(next).await.expect("later ones are durable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_waiters_share_flushes_and_all_become_durable() {
    let mem = Arc::new(MemStore::new());
    let c = Arc::new(Committer::new(mem.clone(), None));
    let mut tasks = Vec::new();
    for i in 0..200u64 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let seq = c.append(&boot_change(i)).expect("append");
            c.durable(seq).await.expect("durable");
            seq
        }));
    }
    let mut last = 0;
    for t in tasks {
        last = last.max(t.await.expect("task"));
    }
    let s = c.stats();
    assert_eq!(s.applied, 200);
    // One appended while a flush ran can be made durable by it and counted by the next.
    assert!(s.durable <= 200, "{s:?}");
    assert_eq!(s.flushes, mem.flushes());
    assert!(s.flushes >= 1 && s.flushes <= 200, "{s:?}");
    // Nothing new appended: no flush needed.
    c.durable(last).await.expect("durable");
    assert_eq!(c.stats().flushes, s.flushes);
    // The next flush counts every one of them.
    let seq = c.append(&boot_change(200)).expect("append");
    c.durable(seq).await.expect("durable");
    let s = c.stats();
    assert_eq!((s.applied, s.durable), (201, 201), "{s:?}");
}

/// A store whose flush fails on demand (and fails the store until it is reopened).
struct Flaky {
    inner: MemStore,
    fail: AtomicBool,
}

impl Store for Flaky {
    fn load_with(
        &self,
        each: &mut dyn FnMut(crate::store::AttachmentRecord),
    ) -> Result<Snapshot, StoreError> {
        self.inner.load_with(each)
    }
    fn append(&self, changes: &[Change]) -> Result<Seq, StoreError> {
        self.inner.append(changes)
    }
    fn flush(&self) -> Result<Seq, StoreError> {
        if self.fail.load(Ordering::SeqCst) {
            self.inner.fail_flushes(true);
            let e = self.inner.flush().expect_err("failing");
            return Err(StoreError::Failed {
                path: "test".into(),
                msg: format!("disk on fire ({e})"),
            });
        }
        self.inner.flush()
    }
    fn reopen(&self) -> Result<(), StoreError> {
        self.inner.fail_flushes(self.fail.load(Ordering::SeqCst));
        self.inner.reopen()
    }
    fn failure(&self) -> Option<String> {
        self.inner.failure()
    }
}

/// A failed flush fails its waiters for good: their change sets are never made durable,
/// not by a later flush and not after the store is reopened. A waiter for a newer change
/// set leads a new flush of its own.
#[tokio::test]
async fn a_failed_flush_fails_its_waiters_and_a_later_one_recovers() {
    let flaky = Arc::new(Flaky {
        inner: MemStore::new(),
        fail: true.into(),
    });
    let c = Committer::new(flaky.clone(), None);
    let first = c.append(&boot_change(1)).expect("append");
    let err = c.durable(first).await.expect_err("the flush fails");
    assert!(err.to_string().contains("disk on fire"), "{err}");
    assert_eq!(c.stats().durable, 0);
    // Until the store is reopened, nothing more is taken.
    assert!(c.append(&boot_change(9)).is_err());
    flaky.fail.store(false, Ordering::SeqCst);
    flaky.reopen().expect("reopen");
    let second = c.append(&boot_change(2)).expect("append");
    assert!(second > first);
    c.durable(second).await.expect("durable now");
    assert_eq!(c.stats().durable, 1, "the failed change set is not counted");
    assert_eq!(c.stats().last_error, None);
    let again = c.durable(first).await.expect_err("still lost");
    assert!(again.to_string().contains("disk on fire"), "{again}");
    assert_eq!(
        flaky.load().expect("load").boot_id.as_deref(),
        Some("b2"),
        "only the second change set is durable"
    );
}

/// A store whose flush takes a while.
struct Slow(MemStore);

impl Store for Slow {
    fn load_with(
        &self,
        each: &mut dyn FnMut(crate::store::AttachmentRecord),
    ) -> Result<Snapshot, StoreError> {
        self.0.load_with(each)
    }
    fn append(&self, changes: &[Change]) -> Result<Seq, StoreError> {
        self.0.append(changes)
    }
    fn flush(&self) -> Result<Seq, StoreError> {
        // Takes what is appended when it starts, then takes its time (as a write and an
        // fdatasync do).
        let durable = self.0.flush();
        std::thread::sleep(Duration::from_millis(100));
        durable
    }
    fn reopen(&self) -> Result<(), StoreError> {
        self.0.reopen()
    }
    fn failure(&self) -> Option<String> {
        self.0.failure()
    }
}

#[tokio::test]
async fn a_leader_dropped_before_its_flush_does_not_strand_the_others() {
    let c = Committer::new(Arc::new(Slow(MemStore::new())), None);
    let first = c.append(&boot_change(1)).expect("append");
    // This waiter becomes the leader, yields to gather writes, and is dropped there.
    {
        let mut leader = std::pin::pin!(c.durable(first));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(
            leader.as_mut().poll(&mut cx).is_pending(),
            "the leader yields before it flushes"
        );
        assert!(c.flushing.load(Ordering::SeqCst), "it took the lead");
    }
    assert!(
        !c.flushing.load(Ordering::SeqCst),
        "dropping it let go of the lead"
    );
    let second = c.append(&boot_change(2)).expect("append");
    tokio::time::timeout(Duration::from_secs(10), c.durable(second))
        .await
        .expect("a later waiter is not stranded")
        .expect("durable");
    assert_eq!(c.stats().durable, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_during_a_flush_are_covered_by_the_next_one() {
    let c = Arc::new(Committer::new(Arc::new(Slow(MemStore::new())), None));
    let seq = c.append(&boot_change(1)).expect("append");
    let first = tokio::spawn({
        let c = c.clone();
        async move { c.durable(seq).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    // Appended while the first flush runs: that flush does not cover it.
    let mut later = Vec::new();
    for i in 2..10 {
        let seq = c.append(&boot_change(i)).expect("append");
        let c = c.clone();
        later.push(tokio::spawn(async move { c.durable(seq).await }));
    }
    first.await.expect("task").expect("durable");
    for t in later {
        t.await.expect("task").expect("durable");
    }
    let s = c.stats();
    assert_eq!(s.durable, 9);
    // One flush for the first, one shared by the eight that came during it.
    assert_eq!(s.flushes, 2, "{s:?}");
}
