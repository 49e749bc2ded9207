//! Group commit: many requests, one flush.
//!
//! [`Committer::append`] hands a change set to the store and returns its number; a request that
//! needs it durable calls [`Committer::durable`] with that number, which returns once a flush
//! has covered it.
//!
//! There is no flusher thread: the first waiter that finds no flush running becomes the leader
//! and runs the flush itself, inline, covering everything appended when the flush starts. The
//! flush blocks the thread for one `pwrite` and one `fdatasync` of the write-ahead log (about
//! 0.1 ms): ipoold runs on one thread, and requests that arrive meanwhile wait in their sockets,
//! are appended as soon as it returns, and share the next flush. Alone, a request pays one
//! flush and no thread hand-off (handing the flush to another thread and being woken back cost
//! more than the flush: docs/performance.md).
//!
//! A failed flush fails the store (see [`Store`]): the numbers it did not make durable are
//! lost for good, and their waiters get its error, also after the store is reopened (the
//! reopened store's numbers go on above them). A waiter for a number no flush has tried leads
//! a new flush.

use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{Change, Seq, Store, StoreError};

/// Most times a leader yields to let concurrent requests append before it flushes.
const GATHER_YIELDS: usize = 16;

/// What the flushes have done so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommitStats {
    /// Change sets appended.
    pub applied: u64,
    /// Change sets made durable, counted by the flush that started after they were appended.
    /// A change set appended while a flush runs may be made durable by it (its waiter returns
    /// at once) and is counted by the next flush: the count lags by at most those.
    pub durable: u64,
    /// Flushes run, failed ones included.
    pub flushes: u64,
    /// Time spent in flushes.
    pub flush_time: Duration,
    /// The last flush error, if the last flush failed.
    pub last_error: Option<String>,
}

pub struct Committer {
    store: Arc<dyn Store>,
    /// The newest number appended.
    appended: AtomicU64,
    /// Change sets appended so far.
    appends: AtomicU64,
    /// Set while a leader runs a flush; cleared in the same `send_modify` that publishes the
    /// flush's outcome, so a woken waiter never sees the outcome with the flag still set.
    flushing: AtomicBool,
    done: watch::Sender<Flushed>,
    flush_seconds: Option<prometheus_client::metrics::histogram::Histogram>,
}

#[derive(Clone, Debug, Default)]
struct Flushed {
    /// Every number up to this one is durable (or lost).
    durable: Seq,
    /// Numbers a failed flush left behind (never durable), and the failure.
    lost: Vec<(RangeInclusive<Seq>, StoreError)>,
    /// Appends accounted for in the stats (made durable, or lost).
    counted: u64,
    stats: CommitStats,
}

impl Committer {
    /// `flush_seconds`, when given, observes every flush's duration.
    pub fn new(
        store: Arc<dyn Store>,
        flush_seconds: Option<prometheus_client::metrics::histogram::Histogram>,
    ) -> Committer {
        Committer {
            store,
            appended: AtomicU64::new(0),
            appends: AtomicU64::new(0),
            flushing: AtomicBool::new(false),
            done: watch::Sender::new(Flushed::default()),
            flush_seconds,
        }
    }

    pub fn store(&self) -> &dyn Store {
        &*self.store
    }

    /// Hands `changes` to the store as one change set (see [`Store::append`]); not yet
    /// durable. Returns its number.
    pub fn append(&self, changes: &[Change]) -> Result<Seq, StoreError> {
        let seq = self.store.append(changes)?;
        self.appended.fetch_max(seq, Ordering::SeqCst);
        self.appends.fetch_add(1, Ordering::SeqCst);
        Ok(seq)
    }

    /// The newest number appended (waiting for it covers everything appended so far).
    /// Why the store has failed, if it has ([`Store::failure`]).
    pub fn failure(&self) -> Option<String> {
        self.store.failure()
    }

    pub fn last_appended(&self) -> Seq {
        self.appended.load(Ordering::SeqCst)
    }

    /// The store, shared (a reopen runs on a thread of its own).
    pub fn shared_store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// Waits until change set `seq` is durable. Requests waiting at the same time share one
    /// flush.
    pub async fn durable(&self, seq: Seq) -> Result<(), StoreError> {
        let mut rx = self.done.subscribe();
        loop {
            {
                let f = rx.borrow_and_update();
                if let Some((_, e)) = f.lost.iter().find(|(r, _)| r.contains(&seq)) {
                    return Err(e.clone());
                }
                if f.durable >= seq {
                    return Ok(());
                }
            }
            if !self.flushing.swap(true, Ordering::SeqCst) {
                self.lead_flush().await;
                continue;
            }
            // A flush is running: its outcome (published with `flushing` cleared) wakes us.
            rx.changed().await.map_err(|_| StoreError::Failed {
                path: "log".into(),
                msg: "the committer was dropped".into(),
            })?;
        }
    }

    /// Runs one flush as the leader, covering everything appended so far, and publishes the
    /// outcome. The caller has set `flushing`.
    async fn lead_flush(&self) {
        // If this future is dropped before it publishes (while it yields to gather writes), the
        // flag must not stay set: the guard clears it and wakes the waiters, who retry.
        struct Abandoned<'a>(Option<&'a Committer>);
        impl Drop for Abandoned<'_> {
            fn drop(&mut self) {
                if let Some(c) = self.0 {
                    c.done
                        .send_modify(|_| c.flushing.store(false, Ordering::SeqCst));
                }
            }
        }
        let mut guard = Abandoned(Some(self));
        // Gather: while other requests are still appending (their tasks are ready to run), let
        // them, so that this flush covers them too. A lone request sees no new change set
        // after one yield and flushes at once.
        let mut seen = self.appended.load(Ordering::SeqCst);
        for _ in 0..GATHER_YIELDS {
            tokio::task::yield_now().await;
            let now = self.appended.load(Ordering::SeqCst);
            if now == seen {
                break;
            }
            seen = now;
        }
        let covered = self.appends.load(Ordering::SeqCst);
        let target = self.appended.load(Ordering::SeqCst);
        let started = Instant::now();
        let result = self.store.flush();
        let took = started.elapsed();
        if let Some(h) = &self.flush_seconds {
            h.observe(took.as_secs_f64());
        }
        if let Err(e) = &result {
            tracing::error!(error = %e, "store flush failed; the requests waiting for it fail");
        }
        self.done.send_modify(|f| {
            f.stats.flushes += 1;
            f.stats.flush_time += took;
            match &result {
                Ok(durable) => {
                    if *durable < target {
                        // Appended, and dropped by a reopen of the store before any flush.
                        let from = f.durable.max(*durable) + 1;
                        if from <= target {
                            f.lost.push((
                                from..=target,
                                StoreError::Failed {
                                    path: "log".into(),
                                    msg: "the store was reopened before this change set was flushed; it was dropped".into(),
                                },
                            ));
                        }
                        f.durable = f.durable.max(target);
                    }
                    f.stats.durable += covered.saturating_sub(f.counted);
                    f.counted = f.counted.max(covered);
                    f.durable = f.durable.max(*durable);
                    f.stats.last_error = None;
                }
                Err(e) => {
                    if target > f.durable {
                        f.lost.push((f.durable + 1..=target, e.clone()));
                    }
                    f.durable = f.durable.max(target);
                    f.counted = f.counted.max(covered);
                    f.stats.last_error = Some(e.to_string());
                }
            }
            self.flushing.store(false, Ordering::SeqCst);
        });
        guard.0 = None;
    }

    /// Flushes now, on the calling thread (start-up, before anything is served).
    pub fn flush_now(&self) -> Result<(), StoreError> {
        let covered = self.appends.load(Ordering::SeqCst);
        let durable = self.store.flush()?;
        self.done.send_modify(|f| {
            f.stats.durable += covered.saturating_sub(f.counted);
            f.counted = f.counted.max(covered);
            f.durable = f.durable.max(durable);
        });
        Ok(())
    }

    pub fn stats(&self) -> CommitStats {
        let mut s = self.done.borrow().stats.clone();
        s.applied = self.appends.load(Ordering::SeqCst);
        s
    }
}

#[cfg(test)]
mod tests {
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
}
