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
mod tests {
    use super::*;

    fn gone(pool: &str, block: &str) -> Watched {
        Watched::BlockGone {
            pool: pool.into(),
            block: block.parse().unwrap(),
        }
    }

    #[test]
    fn each_source_takes_in_its_pools_blocks_once_and_a_restart_once() {
        let h = Heard::default();
        let (mut a, mut b) = (h.now(), h.now());
        h.hear(gone("p", "10.0.0.0/26"));
        h.hear(gone("q", "10.1.0.0/26"));
        let news = h.since("p", &mut a);
        assert_eq!(news.gone, vec!["10.0.0.0/26".parse::<IpNet>().unwrap()]);
        assert!(!news.restarted);
        assert_eq!(h.since("p", &mut a), News::default(), "taken in once");
        assert_eq!(
            h.since("q", &mut b).gone.len(),
            1,
            "another source, its own pace"
        );
        h.hear(Watched::Restarted);
        assert!(h.since("p", &mut a).restarted);
        assert!(!h.since("p", &mut a).restarted);
    }

    #[test]
    fn a_source_fallen_behind_what_is_kept_syncs_everything() {
        let h = Heard::default();
        let mut c = h.now();
        for i in 0..(KEPT + 2) {
            h.hear(gone("q", &format!("10.{}.{}.0/24", i / 256, i % 256)));
        }
        assert!(h.since("p", &mut c).restarted);
        assert!(!h.since("p", &mut c).restarted);
    }

    #[test]
    fn a_pool_written_wakes_the_followers_and_the_engine() {
        let h = Heard::default();
        let (mut pools, mut changes) = (h.pool_changes(), h.changes());
        h.hear(Watched::Pool("p".into()));
        assert!(pools.has_changed().unwrap() && changes.has_changed().unwrap());
        pools.mark_unchanged();
        changes.mark_unchanged();
        h.hear(gone("p", "10.0.0.0/26"));
        assert!(!pools.has_changed().unwrap() && changes.has_changed().unwrap());
    }

    #[test]
    fn a_pool_written_is_news_for_its_sources_only() {
        let h = Heard::default();
        let (mut a, mut b) = (h.now(), h.now());
        h.hear(Watched::Pool("p".into()));
        assert!(h.since("p", &mut a).pool_written);
        assert!(!h.since("p", &mut a).pool_written, "once");
        assert!(!h.since("q", &mut b).pool_written);
    }
}
