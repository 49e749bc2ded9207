//! The node's budget of store requests (`store_rate`, `store_burst`): a token bucket every
//! request to either store goes through, the heartbeat's excepted from waiting, and what it
//! last made a request wait (`ipoolctl status`, the store-rate log line).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::pool::TokenBucket;

/// Store requests per second for a node (`store_rate`, `store_burst`): a token bucket every
/// request goes through, and what it last made a request wait.
pub struct Limiter {
    bucket: Mutex<TokenBucket>,
    started: Instant,
    /// The last wait: when, how long, and the total so far.
    last_wait: Mutex<Option<(Instant, Duration)>>,
    waited_ms: AtomicU64,
}

impl Limiter {
    pub fn new(rate: f64, burst: u32) -> Limiter {
        Limiter {
            bucket: Mutex::new(TokenBucket::new(rate, burst, 0)),
            started: Instant::now(),
            last_wait: Mutex::new(None),
            waited_ms: AtomicU64::new(0),
        }
    }

    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// A token, waiting for it unless `urgent`.
    pub(crate) async fn acquire(&self, urgent: bool) {
        let started = Instant::now();
        loop {
            let wait = {
                let mut b = self.bucket.lock().expect("bucket lock");
                if urgent {
                    b.take_now(self.now());
                    return;
                }
                match b.try_take(self.now()) {
                    Ok(()) => break,
                    Err(ms) => ms,
                }
            };
            tokio::time::sleep(Duration::from_millis(wait)).await;
        }
        let waited = started.elapsed();
        if waited >= Duration::from_millis(1) {
            self.waited_ms
                .fetch_add(waited.as_millis() as u64, Ordering::Relaxed);
            *self.last_wait.lock().expect("wait lock") = Some((Instant::now(), waited));
        }
    }

    /// The last wait for a token, when it was within `recent`: how long ago, how long.
    pub fn last_wait(&self, recent: Duration) -> Option<(Duration, Duration)> {
        let w = *self.last_wait.lock().expect("wait lock");
        w.filter(|(at, _)| at.elapsed() <= recent)
            .map(|(at, took)| (at.elapsed(), took))
    }

    /// Milliseconds requests waited for tokens so far.
    pub fn waited_ms(&self) -> u64 {
        self.waited_ms.load(Ordering::Relaxed)
    }

    pub fn rate(&self) -> (f64, f64) {
        let b = self.bucket.lock().expect("bucket lock");
        (b.rate(), b.burst())
    }
}

#[cfg(test)]
mod tests;
