//! Group commit: many requests, one flush.
//!
//! Every [`Committer::apply`] numbers the write it made (a sequence number, in the order the
//! engine applied them: it applies under its state lock). A request that needs its write to be
//! durable calls [`Committer::durable`], which waits until a flush has covered the newest
//! sequence number at the time of the call. One flusher thread runs the flushes: when it
//! starts one, it covers everything applied so far, so requests that arrive while a flush runs
//! share the next one. Under load a flush covers many requests; alone, a request pays one
//! flush and nothing more (no timer, no batching delay).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{Change, Store, StoreError};

/// What the flusher has done so far.
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
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    applied: AtomicU64,
    /// The highest sequence number somebody waits for, and whether to stop.
    wanted: Mutex<(u64, bool)>,
    wake: Condvar,
    done: watch::Sender<Flushed>,
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
        let shared = Arc::new(Shared {
            applied: AtomicU64::new(0),
            wanted: Mutex::new((0, false)),
            wake: Condvar::new(),
            done: watch::Sender::new(Flushed::default()),
        });
        let thread = {
            let (store, shared) = (store.clone(), shared.clone());
            std::thread::Builder::new()
                .name("ipool-flush".into())
                .spawn(move || flusher(&*store, &shared, flush_seconds))
                .expect("spawning the store flusher thread")
        };
        Committer {
            store,
            shared,
            thread: Some(thread),
        }
    }

    pub fn store(&self) -> &dyn Store {
        &*self.store
    }

    /// Applies `changes` atomically (see [`Store::apply`]); not yet durable.
    pub fn apply(&self, changes: &[Change]) -> Result<(), StoreError> {
        self.store.apply(changes)?;
        self.shared.applied.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Waits until every write applied before this call is durable. Requests waiting at the
    /// same time share one flush.
    pub async fn durable(&self) -> Result<(), StoreError> {
        let target = self.shared.applied.load(Ordering::SeqCst);
        let mut rx = self.shared.done.subscribe();
        if rx.borrow().stats.durable >= target {
            return Ok(());
        }
        {
            let mut w = lock(&self.shared.wanted);
            if w.0 < target {
                w.0 = target;
                self.shared.wake.notify_one();
            }
        }
        let flushed = rx
            .wait_for(|f| f.attempted >= target)
            .await
            .map_err(|_| StoreError::Io {
                path: "flusher".into(),
                msg: "the flusher thread stopped".into(),
            })?
            .clone();
        if flushed.stats.durable >= target {
            return Ok(());
        }
        Err(StoreError::Io {
            path: "flush".into(),
            msg: flushed
                .stats
                .last_error
                .unwrap_or_else(|| "flush failed".into()),
        })
    }

    /// Flushes now, on the calling thread (start-up, before anything is served).
    pub fn flush_now(&self) -> Result<(), StoreError> {
        let target = self.shared.applied.load(Ordering::SeqCst);
        self.store.flush()?;
        self.shared.done.send_modify(|f| {
            f.stats.durable = f.stats.durable.max(target);
            f.attempted = f.attempted.max(target);
        });
        Ok(())
    }

    pub fn stats(&self) -> CommitStats {
        let mut s = self.shared.done.borrow().stats.clone();
        s.applied = self.shared.applied.load(Ordering::SeqCst);
        s
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        lock(&self.shared.wanted).1 = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn flusher(
    store: &dyn Store,
    shared: &Shared,
    flush_seconds: Option<prometheus_client::metrics::histogram::Histogram>,
) {
    loop {
        {
            let mut w = lock(&shared.wanted);
            loop {
                if w.1 {
                    return;
                }
                if w.0 > shared.done.borrow().attempted {
                    break;
                }
                w = shared.wake.wait(w).unwrap_or_else(|p| p.into_inner());
            }
        }
        // Everything applied up to here is covered by this flush.
        let target = shared.applied.load(Ordering::SeqCst);
        let started = Instant::now();
        let result = store.flush();
        let took = started.elapsed();
        if let Some(h) = &flush_seconds {
            h.observe(took.as_secs_f64());
        }
        shared.done.send_modify(|f| {
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
        });
        if let Err(e) = result {
            tracing::error!(error = %e, "store flush failed; the requests waiting for it fail");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;

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
        fn load(&self) -> Result<crate::store::Snapshot, StoreError> {
            self.inner.load()
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
}
