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
mod tests;
