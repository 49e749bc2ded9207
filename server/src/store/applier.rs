//! The thread that writes durable change sets into sled's trees, and makes checkpoints.
//!
//! sled trails the log: a change set reaches sled only after the flush that wrote its log
//! record has returned, so sled never holds a change that could still be rolled back (a failed
//! flush), and replaying the log's records after the last checkpoint, in order, over whatever
//! part of them sled had written, gives the state after the last one (puts and removes are
//! idempotent; every key a replayed record touches ends with that record's last write).
//!
//! A *checkpoint* records in sled's `meta` tree that every change set up to a sequence number is
//! in the trees, and flushes sled (and syncs its file). The log asks for one when it leaves a
//! file full; the file is written again only once a checkpoint covers its records. The thread
//! also makes one when the last is older than the store's `checkpoint_every` and something
//! was applied since: a start has less to replay, and a disk that can no longer take sled's
//! writes (full, read-only) is found within that time rather than when the log wraps.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::codec::{Op, META};
use super::trees::SledFailed;
use super::Trees;

/// In `meta`: every change set up to this sequence number is in sled's trees (u64 big-endian).
pub(super) const WAL_CHECKPOINT: &str = "wal_checkpoint";

#[derive(Default)]
pub(super) struct Progress {
    /// Durable change sets waiting to be written into the trees, in order.
    queue: VecDeque<(u64, Vec<Op>)>,
    /// Every change set up to this one is in the trees (not yet durable there).
    pub applied: u64,
    /// A checkpoint covering at least this is wanted.
    wanted: u64,
    /// The newest checkpoint that is durable.
    pub checkpointed: u64,
    /// Why sled failed, if it did: the store has failed with it.
    pub failed: Option<SledFailed>,
    closing: bool,
    /// The thread is between taking work and reporting it done.
    busy: bool,
    /// Tests hold the thread back, to see what a crash before its work leaves.
    paused: bool,
    /// When the last checkpoint was made (or the thread started).
    last_checkpoint: Option<Instant>,
    /// Checkpoint at least this often while change sets are applied (None: only on request).
    every: Option<Duration>,
}

pub(super) type Shared = Arc<(Mutex<Progress>, Condvar)>;

pub(super) fn lock(s: &Shared) -> MutexGuard<'_, Progress> {
    s.0.lock().unwrap_or_else(|p| p.into_inner())
}

fn wait<'a>(s: &'a Shared, g: MutexGuard<'a, Progress>) -> MutexGuard<'a, Progress> {
    s.1.wait(g).unwrap_or_else(|p| p.into_inner())
}

/// The applier of one open store.
pub(super) struct Applier {
    shared: Shared,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Applier {
    /// Starts the thread; `applied` is what the trees already hold (a checkpoint); `every`: how
    /// often it checkpoints on its own while it applies change sets.
    pub(super) fn start(
        trees: Trees,
        applied: u64,
        every: Option<Duration>,
    ) -> std::io::Result<Applier> {
        let shared: Shared = Arc::new((
            Mutex::new(Progress {
                applied,
                checkpointed: applied,
                wanted: applied,
                last_checkpoint: Some(Instant::now()),
                every,
                ..Progress::default()
            }),
            Condvar::new(),
        ));
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ipool-apply".into())
            .spawn(move || run(&s, &trees))?;
        Ok(Applier {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    pub(super) fn shared(&self) -> &Shared {
        &self.shared
    }

    /// Hands over change sets that are durable in the log.
    pub(super) fn push(&self, sets: Vec<(u64, Vec<Op>)>) {
        if sets.is_empty() {
            return;
        }
        lock(&self.shared).queue.extend(sets);
        self.shared.1.notify_all();
    }

    /// Asks for a checkpoint covering `seq` (made once everything up to it is applied).
    pub(super) fn want_checkpoint(&self, seq: u64) {
        let mut p = lock(&self.shared);
        p.wanted = p.wanted.max(seq);
        drop(p);
        self.shared.1.notify_all();
    }

    /// Waits until a checkpoint covers `seq`; the error is sled's failure.
    pub(super) fn wait_checkpoint(&self, seq: u64) -> Result<(), SledFailed> {
        self.want_checkpoint(seq);
        self.wait_for(|p| (p.checkpointed >= seq).then_some(()))
    }

    /// Waits until every change set handed over is in the trees (or sled failed).
    pub(super) fn drain(&self) -> Result<u64, SledFailed> {
        self.wait_for(|p| (p.queue.is_empty() && !p.busy).then_some(p.applied))
    }

    /// Waits until `done` has an answer, or sled failed. A test's hold on the thread ends
    /// here: whoever waits needs its work (the log cannot go on, a load or a close needs the
    /// trees complete).
    fn wait_for<T>(&self, done: impl Fn(&Progress) -> Option<T>) -> Result<T, SledFailed> {
        let mut p = lock(&self.shared);
        p.paused = false;
        self.shared.1.notify_all();
        loop {
            if let Some(e) = &p.failed {
                return Err(e.clone());
            }
            if let Some(t) = done(&p) {
                return Ok(t);
            }
            p = wait(&self.shared, p);
        }
    }

    /// Holds the thread back (or lets it go), and waits until it is idle.
    #[cfg(test)]
    pub(super) fn pause(&self, paused: bool) {
        let mut p = lock(&self.shared);
        p.paused = paused;
        self.shared.1.notify_all();
        while p.busy || (!paused && !p.queue.is_empty()) {
            p = wait(&self.shared, p);
        }
    }

    /// Stops the thread, leaving queued work undone.
    pub(super) fn stop(&self) {
        lock(&self.shared).closing = true;
        self.shared.1.notify_all();
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }
}

impl Drop for Applier {
    fn drop(&mut self) {
        self.stop();
    }
}

fn run(s: &Shared, trees: &Trees) {
    loop {
        let batch = {
            let mut p = lock(s);
            loop {
                if p.closing || p.failed.is_some() {
                    return;
                }
                if !p.paused && (!p.queue.is_empty() || p.checkpoint_due()) {
                    break;
                }
                p = match p.next_periodic() {
                    Some(at) if !p.paused => {
                        let left = at.saturating_duration_since(Instant::now());
                        s.1.wait_timeout(p, left)
                            .unwrap_or_else(|e| e.into_inner())
                            .0
                    }
                    _ => wait(s, p),
                };
            }
            p.busy = true;
            p.queue.drain(..).collect::<Vec<_>>()
        };
        let mut outcome = Ok(());
        for (seq, ops) in &batch {
            if let Err(e) = trees.materialize(ops) {
                outcome = Err(e);
                break;
            }
            lock(s).applied = *seq;
        }
        let due = outcome.is_ok() && lock(s).checkpoint_due();
        let mut checkpointed = None;
        if due {
            let at = lock(s).applied;
            match checkpoint_at(trees, at) {
                Ok(c) => checkpointed = Some(c),
                Err(e) => outcome = Err(e),
            }
        }
        let mut p = lock(s);
        p.busy = false;
        if let Some(c) = checkpointed {
            p.checkpointed = p.checkpointed.max(c);
            p.last_checkpoint = Some(Instant::now());
        }
        if let Err(e) = outcome {
            tracing::error!(error = %e, "writing durable change sets into sled failed; the store stops serving and is reopened");
            p.failed = Some(e);
        }
        drop(p);
        s.1.notify_all();
    }
}

impl Progress {
    /// A checkpoint is wanted and everything it must cover is in the trees, or the periodic
    /// one is due.
    fn checkpoint_due(&self) -> bool {
        let wanted = self.wanted > self.checkpointed && self.applied >= self.wanted;
        wanted || self.next_periodic().is_some_and(|at| at <= Instant::now())
    }

    /// When the next periodic checkpoint is due: only with something applied since the last.
    fn next_periodic(&self) -> Option<Instant> {
        if self.applied <= self.checkpointed {
            return None;
        }
        Some(self.last_checkpoint? + self.every?)
    }
}

/// Records a checkpoint at `seq` (everything up to it is in the trees) and makes it durable.
pub(super) fn checkpoint_at(trees: &Trees, seq: u64) -> Result<u64, SledFailed> {
    trees
        .materialize(&[Op::Put(
            META,
            WAL_CHECKPOINT.as_bytes().to_vec(),
            seq.to_be_bytes().to_vec(),
        )])
        .and_then(|()| trees.sync())
        .map(|()| seq)
}
