//! Group commit: many requests, one flush.
//!
//! Every [`Committer::apply`] numbers the write it made (a sequence number, in the order the
//! engine applied them: it applies under its state lock). A request that needs its write to be
//! durable calls [`Committer::durable`], which returns once a flush has covered the newest
//! sequence number at the time of the call.
//!
//! There is no flusher thread: the first waiter that finds no flush running becomes the leader
//! and runs the flush itself, inline, covering everything applied when the flush starts. The
//! flush blocks the thread for one `pwrite` and one `fdatasync` of the write-ahead log (about
//! 0.1 ms): ipoold runs on one thread, and requests that arrive meanwhile wait in their sockets,
//! are applied as soon as it returns, and share the next flush. Alone, a request pays one
//! flush and no thread hand-off (handing the flush to another thread and being woken back cost
//! more than the flush: docs/performance.md).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{Change, Store, StoreError};

/// Most times a leader yields to let concurrent requests apply before it flushes.
const GATHER_YIELDS: usize = 16;

/// What the flushes have done so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CommitStats {
    /// Writes applied (the newest sequence number).
    pub applied: u64,
    /// Every write up to this sequence number is durable.
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
    applied: AtomicU64,
    /// Set while a leader runs a flush; cleared in the same `send_modify` that publishes the
    /// flush's outcome, so a woken waiter never sees the outcome with the flag still set.
    flushing: AtomicBool,
    done: watch::Sender<Flushed>,
    flush_seconds: Option<prometheus_client::metrics::histogram::Histogram>,
}

#[derive(Clone, Debug, Default)]
struct Flushed {
    /// The highest sequence number a flush has tried to cover.
    attempted: u64,
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
            applied: AtomicU64::new(0),
            flushing: AtomicBool::new(false),
            done: watch::Sender::new(Flushed::default()),
            flush_seconds,
        }
    }

    pub fn store(&self) -> &dyn Store {
        &*self.store
    }

    /// Applies `changes` atomically (see [`Store::apply`]); not yet durable.
    pub fn apply(&self, changes: &[Change]) -> Result<(), StoreError> {
        self.store.apply(changes)?;
        self.applied.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Waits until every write applied before this call is durable. Requests waiting at the
    /// same time share one flush.
    pub async fn durable(&self) -> Result<(), StoreError> {
        let target = self.applied.load(Ordering::SeqCst);
        let mut rx = self.done.subscribe();
        loop {
            {
                let f = rx.borrow_and_update();
                if f.attempted >= target {
                    if f.stats.durable >= target {
                        return Ok(());
                    }
                    return Err(StoreError::Io {
                        path: "flush".into(),
                        msg: f
                            .stats
                            .last_error
                            .clone()
                            .unwrap_or_else(|| "flush failed".into()),
                    });
                }
            }
            if !self.flushing.swap(true, Ordering::SeqCst) {
                self.lead_flush().await;
                continue;
            }
            // A flush is running: its outcome (published with `flushing` cleared) wakes us.
            rx.changed().await.map_err(|_| StoreError::Io {
                path: "flush".into(),
                msg: "the committer was dropped".into(),
            })?;
        }
    }

    /// Runs one flush as the leader, covering everything applied so far, and publishes the
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
        // Gather: while other requests are still applying writes (their tasks are ready to
        // run), let them, so that this flush covers them too. A lone request sees no new
        // write after one yield and flushes at once.
        let mut seen = self.applied.load(Ordering::SeqCst);
        for _ in 0..GATHER_YIELDS {
            tokio::task::yield_now().await;
            let now = self.applied.load(Ordering::SeqCst);
            if now == seen {
                break;
            }
            seen = now;
        }
        let target = self.applied.load(Ordering::SeqCst);
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
            f.attempted = f.attempted.max(target);
            f.stats.flushes += 1;
            f.stats.flush_time += took;
            match &result {
                Ok(()) => {
                    f.stats.durable = f.stats.durable.max(target);
                    f.stats.last_error = None;
                }
                Err(e) => f.stats.last_error = Some(e.to_string()),
            }
            self.flushing.store(false, Ordering::SeqCst);
        });
        guard.0 = None;
    }

    /// Flushes now, on the calling thread (start-up, before anything is served).
    pub fn flush_now(&self) -> Result<(), StoreError> {
        let target = self.applied.load(Ordering::SeqCst);
        self.store.flush()?;
        self.done.send_modify(|f| {
            f.stats.durable = f.stats.durable.max(target);
            f.attempted = f.attempted.max(target);
        });
        Ok(())
    }

    pub fn stats(&self) -> CommitStats {
        let mut s = self.done.borrow().stats.clone();
        s.applied = self.applied.load(Ordering::SeqCst);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

    use std::future::Future;

    fn boot_change(i: u64) -> Vec<Change> {
        vec![Change::PutBootId(format!("b{i}"))]
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_waiters_share_flushes_and_all_become_durable() {
        let mem = Arc::new(MemStore::new());
        let c = Arc::new(Committer::new(mem.clone(), None));
        let mut tasks = Vec::new();
        for i in 0..200u64 {
            let c = c.clone();
            tasks.push(tokio::spawn(async move {
                c.apply(&boot_change(i)).expect("apply");
                c.durable().await.expect("durable");
            }));
        }
        for t in tasks {
            t.await.expect("task");
        }
        let s = c.stats();
        assert_eq!(s.applied, 200);
        assert_eq!(s.durable, 200);
        assert_eq!(s.flushes, mem.flushes());
        assert!(s.flushes >= 1 && s.flushes <= 200, "{s:?}");
        // Nothing new applied: no flush needed.
        c.durable().await.expect("durable");
        assert_eq!(c.stats().flushes, s.flushes);
    }

    /// A store whose flush fails on demand.
    struct Flaky {
        inner: MemStore,
        fail: std::sync::atomic::AtomicBool,
    }

    impl Store for Flaky {
        fn load_with(
            &self,
            each: &mut dyn FnMut(crate::store::AttachmentRecord),
        ) -> Result<crate::store::Snapshot, StoreError> {
            self.inner.load_with(each)
        }
        fn apply(&self, changes: &[Change]) -> Result<(), StoreError> {
            self.inner.apply(changes)
        }
        fn flush(&self) -> Result<(), StoreError> {
            if self.fail.load(Ordering::SeqCst) {
                return Err(StoreError::Io {
                    path: "test".into(),
                    msg: "disk on fire".into(),
                });
            }
            self.inner.flush()
        }
    }

    #[tokio::test]
    async fn a_failed_flush_fails_its_waiters_and_a_later_one_recovers() {
        let flaky = Arc::new(Flaky {
            inner: MemStore::new(),
            fail: true.into(),
        });
        let c = Committer::new(flaky.clone(), None);
        c.apply(&boot_change(1)).expect("apply");
        let err = c.durable().await.expect_err("the flush fails");
        assert!(err.to_string().contains("disk on fire"), "{err}");
        assert_eq!(c.stats().durable, 0);
        flaky.fail.store(false, Ordering::SeqCst);
        c.apply(&boot_change(2)).expect("apply");
        c.durable().await.expect("durable now");
        assert_eq!(c.stats().durable, 2);
        assert_eq!(c.stats().last_error, None);
    }

    /// A store whose flush takes a while.
    struct Slow(MemStore);

    impl Store for Slow {
        fn load_with(
            &self,
            each: &mut dyn FnMut(crate::store::AttachmentRecord),
        ) -> Result<crate::store::Snapshot, StoreError> {
            self.0.load_with(each)
        }
        fn apply(&self, changes: &[Change]) -> Result<(), StoreError> {
            self.0.apply(changes)
        }
        fn flush(&self) -> Result<(), StoreError> {
            std::thread::sleep(Duration::from_millis(100));
            self.0.flush()
        }
    }

    #[tokio::test]
    async fn a_leader_dropped_before_its_flush_does_not_strand_the_others() {
        let c = Committer::new(Arc::new(Slow(MemStore::new())), None);
        c.apply(&boot_change(1)).expect("apply");
        // This waiter becomes the leader, yields to gather writes, and is dropped there.
        {
            let mut leader = std::pin::pin!(c.durable());
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
        c.apply(&boot_change(2)).expect("apply");
        tokio::time::timeout(Duration::from_secs(10), c.durable())
            .await
            .expect("a later waiter is not stranded")
            .expect("durable");
        assert_eq!(c.stats().durable, 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn waiters_during_a_flush_are_covered_by_the_next_one() {
        let c = Arc::new(Committer::new(Arc::new(Slow(MemStore::new())), None));
        c.apply(&boot_change(1)).expect("apply");
        let first = tokio::spawn({
            let c = c.clone();
            async move { c.durable().await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Applied while the first flush runs: that flush does not cover it.
        let mut later = Vec::new();
        for i in 2..10 {
            c.apply(&boot_change(i)).expect("apply");
            let c = c.clone();
            later.push(tokio::spawn(async move { c.durable().await }));
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
