//! What the store's watches told this node ([`Watched`]), kept for those who act on it, each
//! at its own pace: the sources (a block of theirs no longer this node's stops serving at once
//! and is synced; their pool written makes those with blocks in doubt sync; a watch that
//! started over makes every source sync) and the pools' followers (a pool written is read
//! again at once). `node::watching::keep_watching` runs the watches.
//!
//! A watch is only ever a reason to look again sooner: what a node serves is decided by its
//! syncs and their conditioned writes, which `resync_secs` still runs as a safety net.

use std::collections::VecDeque;
use std::sync::Mutex;

use ipnet::IpNet;

use super::datastore::Watched;

/// Blocks gone kept for sources that have not looked yet; one that falls further behind
/// syncs everything, as after a restart.
const KEPT: usize = 4096;

#[derive(Default)]
struct Log {
    /// Entries so far.
    seq: u64,
    /// (seq, pool, block): blocks the watch says are no longer this node's; block None: the
    /// pool itself was written.
    gone: VecDeque<(u64, String, Option<IpNet>)>,
    /// Watches started over so far.
    restarts: u64,
}

/// What a source has taken in so far (see [`Heard::since`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cursor {
    seq: u64,
    restarts: u64,
}

/// What a source had not taken in yet.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct News {
    /// A watch started over (or the source fell too far behind): sync everything.
    pub restarted: bool,
    /// The source's pool's blocks that are no longer this node's.
    pub gone: Vec<IpNet>,
    /// The source's pool was written (its phase, its spec) or deleted.
    pub pool_written: bool,
}

/// The log of what the watches said, and the signals that wake those who act on it.
pub struct Heard {
    log: Mutex<Log>,
    /// Moves on with every entry: the engine looks at its sources again.
    changes: tokio::sync::watch::Sender<u64>,
    /// Moves on when a pool was written or a watch started over: the followers read again.
    pools: tokio::sync::watch::Sender<u64>,
}

impl Default for Heard {
    fn default() -> Self {
        Heard {
            log: Mutex::default(),
            changes: tokio::sync::watch::Sender::new(0),
            pools: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl Heard {
    /// Takes in what a watch said.
    pub fn hear(&self, w: Watched) {
        let mut log = self.log.lock().expect("heard lock");
        let (pool, block) = match w {
            Watched::BlockGone { pool, block } => (pool, Some(block)),
            Watched::Pool(pool) => (pool, None),
            Watched::Restarted => {
                log.restarts += 1;
                drop(log);
                self.pools.send_modify(|n| *n += 1);
                self.changes.send_modify(|n| *n += 1);
                return;
            }
            // The node's name: the heartbeat's (see `ClusterNode::hear`).
            Watched::Name | Watched::NameWatch(_) => return,
        };
        log.seq += 1;
        let seq = log.seq;
        log.gone.push_back((seq, pool, block));
        if log.gone.len() > KEPT {
            log.gone.pop_front();
        }
        drop(log);
        if block.is_none() {
            self.pools.send_modify(|n| *n += 1);
        }
        self.changes.send_modify(|n| *n += 1);
    }

    /// Where the log stands now: a source made now has nothing to take in.
    pub fn now(&self) -> Cursor {
        let log = self.log.lock().expect("heard lock");
        Cursor {
            seq: log.seq,
            restarts: log.restarts,
        }
    }

    /// What was heard of pool `pool` since `cursor`, which moves on.
    pub fn since(&self, pool: &str, cursor: &mut Cursor) -> News {
        let log = self.log.lock().expect("heard lock");
        if cursor.seq == log.seq && cursor.restarts == log.restarts {
            // Nothing new (the usual case: every pass of every source, ADDs' included).
            return News::default();
        }
        let oldest = log.gone.front().map_or(log.seq + 1, |(s, _, _)| *s);
        let mut news = News {
            restarted: log.restarts != cursor.restarts,
            ..News::default()
        };
        for (_, _, block) in log
            .gone
            .iter()
            .filter(|(s, p, _)| *s > cursor.seq && p == pool)
        {
            match block {
                Some(b) => news.gone.push(*b),
                None => news.pool_written = true,
            }
        }
        // Fallen behind what is kept: everything is looked at again.
        news.restarted |= cursor.seq < log.seq && cursor.seq + 1 < oldest;
        *cursor = Cursor {
            seq: log.seq,
            restarts: log.restarts,
        };
        news
    }

    /// Moves on with every entry.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Moves on when a pool was written or a watch started over.
    pub fn pool_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.pools.subscribe()
    }
}

#[cfg(test)]
mod tests;
